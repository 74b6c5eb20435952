package loader

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Property: for any pack (sample count, chunk size with a short last
// chunk, sample sizes), budget (from the least to all of the data),
// request order (random, sorted, reversed), overflow share and batching, one epoch
// delivers every sample exactly once with its source's bytes and label,
// within the budget, reading and wasting what the stats say.
func TestPropertyExactlyOnceWithinBudget(t *testing.T) {
	seeds := 60
	if testing.Short() {
		seeds = 10
	}
	for seed := range uint64(seeds) {
		r := rand.New(rand.NewPCG(seed, 1))
		dir := t.TempDir()
		o := datasetOpts{n: 1 + r.IntN(160), classes: 1 + r.IntN(5), maxSize: []int{0, 50, 600, 5000}[r.IntN(4)], seed: seed}
		size := 1 + r.IntN(17)
		ds := makeDataset(t, dir, o)
		spec := ds.spec
		spec.ChunkSize, spec.Seed = size, seed
		_, err := Pack(spec, filepath.Join(dir, "out"), nil)
		require.NoError(t, err)
		p, err := OpenPack(filepath.Join(dir, "out"))
		require.NoError(t, err)
		var total int64
		for _, e := range p.Index.Samples {
			total += e.Length
		}
		lo, hi := minBudget(p), maxBudget(p)
		budgets := []int64{lo, hi, lo + r.Int64N(hi-lo+1), lo + r.Int64N(hi-lo+1)/8}
		sorted := make([]int, o.n)
		for i := range sorted {
			sorted[i] = i
		}
		reversed := slices.Clone(sorted)
		slices.Reverse(reversed)
		orders := [][]int{perm(o.n, seed), sorted, reversed}
		for _, budget := range budgets {
			for k, reqs := range orders {
				over := []float64{0, 0.3, DefaultOverflow}[r.IntN(3)]
				s, err := NewServer(p, ServerOptions{Budget: budget, Seed: seed, Overflow: over})
				require.NoError(t, err)
				got := serveAll(t, s, ds, reqs, 1+r.IntN(16))
				requireExactlyOnce(t, o.n, got)
				st := s.Stats()
				where := []any{"seed %d: n %d, chunk size %d, budget %d, overflow %v (layout %+v), order %d", seed, o.n, size, budget, over, s.Layout(), k}
				require.LessOrEqual(t, st.PeakBytes, budget, where...)
				require.EqualValues(t, o.n, st.Served, where...)
				require.Equal(t, total, st.BytesDelivered, where...)
				require.Equal(t, st.BytesDelivered, st.BytesRead-st.WastedBytes, where...)
				require.GreaterOrEqual(t, st.ChunkReads, int64(len(p.Index.Chunks)), where...)
				require.Zero(t, st.HeldBytes, where...)
				require.Zero(t, st.InFlightBytes, where...)
				if s.Layout().ChunksPerGroup == 1 {
					require.Equal(t, reqs, positions(got), "one chunk per group: each request gets its own sample")
					require.EqualValues(t, len(p.Index.Chunks), st.ChunkReads, "and each chunk is read once")
				}
			}
		}
	}
}

// The sample returned for position i is generally not sample i, as in the
// paper, yet the epoch's multiset is exact (requireExactlyOnce).
func TestPropertyReturnedIsNotRequested(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 600, classes: 4, maxSize: 100, seed: 61}, 8)
	for _, budget := range []int64{minBudget(p), minBudget(p) + (maxBudget(p)-minBudget(p))/5} {
		s := newServer(t, p, budget, 2)
		got := serveAll(t, s, ds, perm(600, 3), 32)
		requireExactlyOnce(t, 600, got)
		same := 0
		for _, smp := range got {
			if smp.Position == smp.Request {
				same++
			}
		}
		l := s.Layout()
		t.Logf("budget %d (%d chunks per abstract chunk): %d of 600 requests got the sample asked for", budget, l.ChunksPerGroup, same)
		assert.Less(t, same, 600/3, "G = %d", l.ChunksPerGroup)
	}
}

// labelEntropy is the mean over batches of b of the entropy (bits) of the
// labels in the batch.
func labelEntropy(labels []int, b int) float64 {
	var sum float64
	batches := 0
	for lo := 0; lo+b <= len(labels); lo += b {
		count := map[int]int{}
		for _, l := range labels[lo : lo+b] {
			count[l]++
		}
		var h float64
		for _, c := range count {
			q := float64(c) / float64(b)
			h -= q * math.Log2(q)
		}
		sum += h
		batches++
	}
	return sum / float64(batches)
}

// On a class-sorted dataset, the label entropy per batch of an epoch
// served from the least memory up is close to a full shuffle's.
func TestPropertyLabelEntropy(t *testing.T) {
	const n, classes, batch, size = 2000, 10, 64, 64
	ds, p := newPack(t, datasetOpts{n: n, classes: classes, maxSize: 8192, sorted: true, seed: 62}, size)
	sequential := make([]int, n)
	for i := range sequential {
		sequential[i] = ds.spec.Samples[i].Label
	}
	full := make([]int, n)
	for k, i := range perm(n, 7) {
		full[k] = sequential[i]
	}
	hFull, hSeq := labelEntropy(full, batch), labelEntropy(sequential, batch)
	t.Logf("label entropy per batch of %d, %d classes (max %.3f bits): full shuffle %.3f, unshuffled files %.3f",
		batch, classes, math.Log2(classes), hFull, hSeq)
	lo, hi := minBudget(p), maxBudget(p)
	sorted := make([]int, n)
	for i := range sorted {
		sorted[i] = i
	}
	for _, budget := range []int64{lo, lo + (hi-lo)/10, lo + (hi-lo)/2, hi} {
		for _, order := range []struct {
			name string
			reqs []int
		}{{"random", perm(n, 8)}, {"sorted", sorted}} {
			s := newServer(t, p, budget, 1)
			got := serveAll(t, s, ds, order.reqs, batch)
			labels := make([]int, n)
			chunks := 0
			for k, smp := range got {
				labels[k] = smp.Label
			}
			for lo := 0; lo+batch <= n; lo += batch {
				seen := map[int]bool{}
				for _, smp := range got[lo : lo+batch] {
					seen[smp.Position/size] = true
				}
				chunks += len(seen)
			}
			h := labelEntropy(labels, batch)
			st := s.Stats()
			t.Logf("budget %8d (%5.1f%% of the data; %2d chunks per abstract chunk), %s requests: entropy %.3f (%5.1f%% of full), "+
				"%4.1f chunks per batch, %4.1f reads per chunk, wasted %4.1f%% of %8d bytes read, peak %7d bytes",
				budget, 100*float64(budget)/float64(st.BytesDelivered), s.Layout().ChunksPerGroup, order.name, h, 100*h/hFull,
				float64(chunks)/float64(n/batch), float64(st.ChunkReads)/float64(len(p.Index.Chunks)),
				100*float64(st.WastedBytes)/float64(st.BytesRead), st.BytesRead, st.PeakBytes)
			assert.Greater(t, h, 0.95*hFull, "budget %d, %s requests", budget, order.name)
		}
	}
}
