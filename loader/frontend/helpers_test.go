package frontend

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/loader"
)

// testPack is a pack of n files of random bytes made for a test: its
// directory and each source's bytes.
type testPack struct {
	dir  string
	data [][]byte
}

func newTestPack(t testing.TB, n, chunkSize, maxSize int) *testPack {
	t.Helper()
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(uint64(n), 7))
	spec := loader.PackSpec{Classes: []string{"a", "b"}, ChunkSize: chunkSize, Seed: 3}
	tp := &testPack{dir: filepath.Join(dir, "out"), data: make([][]byte, n)}
	for i := range n {
		b := make([]byte, 1+r.IntN(maxSize))
		for k := range b {
			b[k] = byte(r.Uint32())
		}
		path := filepath.Join(dir, fmt.Sprintf("s%05d.bin", i))
		require.NoError(t, os.WriteFile(path, b, 0o644))
		tp.data[i] = b
		spec.Samples = append(spec.Samples, loader.SampleSpec{Path: path, Label: i % 2})
	}
	_, err := loader.Pack(spec, tp.dir, nil)
	require.NoError(t, err)
	return tp
}

// budget is a server's budget in a cluster of world: three quarters of
// the data over the cluster, at least the pack's least.
func (tp *testPack) budget(t testing.TB, world int) int64 {
	t.Helper()
	p, err := loader.OpenPack(tp.dir)
	require.NoError(t, err)
	l, err := loader.PlanLayout(p.Index, 1<<62)
	require.NoError(t, err)
	var total int64
	for _, d := range tp.data {
		total += int64(len(d))
	}
	w := int64(world)
	return max(total*3/4/w, (l.MinBudget+w-1)/w)
}

// open opens a loader of tp as rank of world, closed at the test's end
// when the test has not.
func (tp *testPack) open(t testing.TB, rank, world int) *Loader {
	t.Helper()
	l, _, err := Open(tp.dir, loader.ServerOptions{Budget: tp.budget(t, world), Seed: 5, Overflow: 0.3, Rank: rank, World: world})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// cluster opens world loaders of tp, each a node listening on loopback,
// connected to each other.
func (tp *testPack) cluster(t testing.TB, world int) []*Loader {
	t.Helper()
	ls := make([]*Loader, world)
	addrs := make([]string, world)
	for r := range world {
		ls[r] = tp.open(t, r, world)
		at, err := ls[r].DistListen("127.0.0.1:0", distOptions(r, world))
		require.NoError(t, err)
		addrs[r] = at
	}
	for _, l := range ls {
		require.NoError(t, l.DistConnect(addrs))
	}
	return ls
}

// take gets the positions is from l and takes them into fresh buffers.
func take(t testing.TB, l *Loader, is []int) []loader.Sample {
	t.Helper()
	ticket, batch, err := l.Get(is)
	require.NoError(t, err)
	out := make([]loader.Sample, len(batch))
	bufs := make([][]byte, len(batch))
	for k, s := range batch {
		out[k] = loader.Sample{Position: s.Position, Source: s.Source, Label: s.Label}
		bufs[k] = make([]byte, len(s.Data))
	}
	require.NoError(t, l.Take(ticket, len(batch), func(k, size int) ([]byte, error) {
		require.Len(t, bufs[k], size)
		return bufs[k], nil
	}))
	for k := range out {
		out[k].Data = bufs[k]
	}
	return out
}

// requireSource checks that each sample holds its source's bytes.
func (tp *testPack) requireSource(t testing.TB, got []loader.Sample) {
	t.Helper()
	for _, s := range got {
		require.Equal(t, tp.data[s.Source], s.Data, "bytes of position %d (source %d)", s.Position, s.Source)
		require.Equal(t, s.Source%2, s.Label)
	}
}
