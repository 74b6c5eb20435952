package loader

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// dataset is a folder of sample files made for a test, and the spec that
// packs them.
type dataset struct {
	spec PackSpec
	data [][]byte // by source index
}

// datasetOpts shape a test dataset.
type datasetOpts struct {
	n, classes int
	maxSize    int  // sample sizes are 0..maxSize bytes, uniformly
	fixedSize  bool // every sample maxSize bytes
	sorted     bool // labels class-sorted by source index (else random)
	seed       uint64
}

// makeDataset writes o.n files of random bytes into dir/src.
func makeDataset(t testing.TB, dir string, o datasetOpts) *dataset {
	t.Helper()
	r := rand.New(rand.NewPCG(o.seed, 77))
	src := filepath.Join(dir, "src")
	require.NoError(t, os.MkdirAll(src, 0o755))
	ds := &dataset{data: make([][]byte, o.n)}
	for c := range o.classes {
		ds.spec.Classes = append(ds.spec.Classes, fmt.Sprintf("class-%02d", c))
	}
	for i := range o.n {
		size := o.maxSize
		if !o.fixedSize {
			size = r.IntN(o.maxSize + 1)
		}
		b := make([]byte, size)
		for k := range b {
			b[k] = byte(r.Uint32())
		}
		path := filepath.Join(src, fmt.Sprintf("s%05d.bin", i))
		require.NoError(t, os.WriteFile(path, b, 0o644))
		label := r.IntN(o.classes)
		if o.sorted {
			label = i * o.classes / o.n
		}
		ds.data[i] = b
		ds.spec.Samples = append(ds.spec.Samples, SampleSpec{Path: path, Label: label})
	}
	return ds
}

// pack packs ds into dir/out with chunk size and seed, and opens it.
func (ds *dataset) pack(t testing.TB, dir string, size int, seed uint64) *Packed {
	t.Helper()
	spec := ds.spec
	spec.ChunkSize, spec.Seed = size, seed
	out := filepath.Join(dir, "out")
	_, err := Pack(spec, out, nil)
	require.NoError(t, err)
	p, err := OpenPack(out)
	require.NoError(t, err)
	return p
}

// newPack makes a dataset and packs it: the common start of a test.
func newPack(t testing.TB, o datasetOpts, size int) (*dataset, *Packed) {
	t.Helper()
	dir := t.TempDir()
	ds := makeDataset(t, dir, o)
	return ds, ds.pack(t, dir, size, o.seed+1)
}

// dataBytes is the bytes of p's samples.
func dataBytes(p *Packed) int64 {
	var data int64
	for _, c := range p.Index.Chunks {
		data += c.DataLength
	}
	return data
}

// maxBudget is a budget that maps every chunk to its own abstract chunk.
func maxBudget(p *Packed) int64 {
	l, _ := PlanLayout(p.Index, 1<<62)
	return slotBytes(p.Index, 1) + l.MaxChunkBytes
}

// minBudget is the least budget p can be served from.
func minBudget(p *Packed) int64 {
	l, _ := PlanLayout(p.Index, 1<<62)
	return l.MinBudget
}

// perm returns a random permutation of 0..n-1.
func perm(n int, seed uint64) []int {
	return rand.New(rand.NewPCG(seed, 5)).Perm(n)
}

// serveAll serves requests in batches of batch and returns the samples in
// request order, checking each against its source.
func serveAll(t testing.TB, s *Server, ds *dataset, reqs []int, batch int) []Sample {
	t.Helper()
	var out []Sample
	for lo := 0; lo < len(reqs); lo += batch {
		got, err := s.GetBatch(reqs[lo:min(lo+batch, len(reqs))])
		require.NoError(t, err)
		out = append(out, got...)
	}
	for k, smp := range out {
		require.Equal(t, reqs[k], smp.Request)
		require.Equal(t, s.ix.Samples[smp.Position].Source, smp.Source)
		require.Equal(t, ds.spec.Samples[smp.Source].Label, smp.Label)
		require.Equal(t, ds.data[smp.Source], smp.Data, "sample at position %d (source %d)", smp.Position, smp.Source)
	}
	return out
}

// requireExactlyOnce checks that samples deliver every position once.
func requireExactlyOnce(t testing.TB, n int, samples []Sample) {
	t.Helper()
	require.Len(t, samples, n)
	seen := make([]bool, n)
	for _, smp := range samples {
		require.False(t, seen[smp.Position], "position %d delivered twice", smp.Position)
		seen[smp.Position] = true
	}
}

// positions returns the delivered positions of samples.
func positions(samples []Sample) []int {
	out := make([]int, len(samples))
	for k, smp := range samples {
		out[k] = smp.Position
	}
	return out
}
