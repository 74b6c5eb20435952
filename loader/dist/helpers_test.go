package dist

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/loader"
)

const testToken = "job-secret"

// testOverflow is the servers' overflow share: below the default (0.9),
// which at these small budgets leaves the slots one or two abstract
// chunks, fewer than the nodes.
const testOverflow = 0.3

// testPack packs n files of random bytes (0..maxSize) in chunks of size
// and opens it; data holds each source's bytes.
type testPack struct {
	p    *loader.Packed
	data [][]byte
}

func newTestPack(t testing.TB, n, size, maxSize int, seed uint64) *testPack {
	t.Helper()
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(seed, 3))
	spec := loader.PackSpec{Classes: []string{"a", "b"}, ChunkSize: size, Seed: seed}
	tp := &testPack{data: make([][]byte, n)}
	for i := range n {
		b := make([]byte, r.IntN(maxSize+1))
		for k := range b {
			b[k] = byte(r.Uint32())
		}
		path := filepath.Join(dir, fmt.Sprintf("s%05d.bin", i))
		require.NoError(t, os.WriteFile(path, b, 0o644))
		tp.data[i] = b
		spec.Samples = append(spec.Samples, loader.SampleSpec{Path: path, Label: i % 2})
	}
	_, err := loader.Pack(spec, filepath.Join(dir, "out"), nil)
	require.NoError(t, err)
	tp.p, err = loader.OpenPack(filepath.Join(dir, "out"))
	require.NoError(t, err)
	return tp
}

// dataBytes is the pack's sample bytes.
func (tp *testPack) dataBytes() int64 {
	var total int64
	for _, d := range tp.data {
		total += int64(len(d))
	}
	return total
}

// minBudget is the least budget per node of a world of k.
func (tp *testPack) minBudget(k int) int64 {
	l, err := loader.PlanLayout(tp.p.Index, 1<<62)
	if err != nil {
		panic(err)
	}
	return (l.MinBudget + int64(k) - 1) / int64(k)
}

// cluster starts k nodes on loopback ports, each a server of budget bytes
// with o's remote options, connected to each other.
func cluster(t testing.TB, tp *testPack, k int, budget int64, o Options) []*Node {
	t.Helper()
	nodes := make([]*Node, k)
	addrs := make([]string, k)
	for r := range k {
		nodes[r], addrs[r] = startNode(t, tp, r, k, budget, o)
	}
	for _, n := range nodes {
		require.NoError(t, n.Connect(addrs))
	}
	return nodes
}

func startNode(t testing.TB, tp *testPack, r, k int, budget int64, o Options) (*Node, string) {
	t.Helper()
	srv, err := loader.NewServer(tp.p, loader.ServerOptions{Budget: budget, Seed: 5, Overflow: testOverflow, Rank: r, World: k})
	require.NoError(t, err)
	o.Rank, o.World = r, k
	if o.Token == "" {
		o.Token = testToken
	}
	n, err := NewNode(srv, o)
	require.NoError(t, err)
	addr, err := n.Listen("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Close(); _ = srv.Close() })
	return n, addr
}

// shares splits a random permutation of the pack's positions among k
// nodes as a DistributedSampler without padding: rank r gets perm[r::k].
func shares(n, k int, seed uint64) [][]int {
	perm := rand.New(rand.NewPCG(seed, 9)).Perm(n)
	out := make([][]int, k)
	for j, i := range perm {
		out[j%k] = append(out[j%k], i)
	}
	return out
}

// serveShares has every node request its share (seqs[r]) in batches of
// batch, workers goroutines per node taking batches in turn (DataLoader
// workers), all nodes at once; it returns what each node delivered.
func serveShares(t testing.TB, nodes []*Node, seqs [][]int, batch, workers int) [][]loader.Sample {
	t.Helper()
	out := make([][]loader.Sample, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for r, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mu sync.Mutex
			next := 0
			var inner sync.WaitGroup
			for range workers {
				inner.Add(1)
				go func() {
					defer inner.Done()
					for {
						mu.Lock()
						lo := next
						next += batch
						failed := errs[r] != nil
						mu.Unlock()
						if lo >= len(seqs[r]) || failed {
							return
						}
						got, err := n.GetBatch(seqs[r][lo:min(lo+batch, len(seqs[r]))])
						mu.Lock()
						if err != nil {
							errs[r] = err
						}
						out[r] = append(out[r], got...)
						mu.Unlock()
					}
				}()
			}
			inner.Wait()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "node %d", r)
	}
	return out
}

// requireExactlyOnce checks that the samples delivered over all nodes are
// every position once, each with its source's bytes and label.
func requireExactlyOnce(t testing.TB, tp *testPack, got [][]loader.Sample) {
	t.Helper()
	n := len(tp.data)
	seen := make([]int, n)
	total := 0
	for r, smps := range got {
		for _, s := range smps {
			require.GreaterOrEqual(t, s.Position, 0)
			require.Less(t, s.Position, n)
			require.Zero(t, seen[s.Position], "position %d delivered twice (again on node %d)", s.Position, r)
			seen[s.Position] = r + 1
			require.Equal(t, tp.p.Index.Samples[s.Position].Source, s.Source, "position %d", s.Position)
			require.Equal(t, tp.data[s.Source], s.Data, "bytes of position %d (source %d)", s.Position, s.Source)
			require.Equal(t, s.Source%2, s.Label)
			total++
		}
	}
	require.Equal(t, n, total, "every position once")
}

func sumStats(nodes []*Node) Stats {
	var s Stats
	for _, n := range nodes {
		st := n.Stats()
		s.LocalRequests += st.LocalRequests
		s.RemoteHits += st.RemoteHits
		s.RemoteMisses += st.RemoteMisses
		s.RemoteRequests += st.RemoteRequests
		s.Prefetched += st.Prefetched
		s.PrefetchSent += st.PrefetchSent
		s.ServedRemote += st.ServedRemote
		s.RemotePeakBytes = max(s.RemotePeakBytes, st.RemotePeakBytes)
	}
	return s
}
