package loader

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Samples a chunk read brings for occupied slots, kept in the overflow
// share instead of left for a later read, cut the wasted reads of a
// random sampler under a budget smaller than the data; the memory stays
// within the budget and every sample is delivered once.
func TestOverflowCutsWastedReads(t *testing.T) {
	const n = 3000
	ds, p := newPack(t, datasetOpts{n: n, classes: 10, maxSize: 400, seed: 81}, 32)
	var data int64
	for _, c := range p.Index.Chunks {
		data += c.DataLength
	}
	reqs := perm(n, 5)
	for _, share := range []int64{10, 25, 50} {
		budget := data * share / 100
		wasted, reads := map[float64]float64{}, map[float64]int64{}
		for _, over := range []float64{0, 0.5, DefaultOverflow} {
			s, err := NewServer(p, ServerOptions{Budget: budget, Seed: 1, Overflow: over})
			require.NoError(t, err)
			requireExactlyOnce(t, n, serveAll(t, s, ds, reqs, 64))
			st := s.Stats()
			require.LessOrEqual(t, st.PeakBytes, budget)
			wasted[over], reads[over] = float64(st.WastedBytes)/float64(st.BytesRead), st.ChunkReads
			lay := s.Layout()
			require.Equal(t, st.BytesRead-st.WastedBytes, st.BytesDelivered, "every byte kept was delivered")
			t.Logf("budget %d%% of the data, overflow %.2f: %d abstract chunks of G=%d, %d chunk reads for %d chunks, %.0f%% of the bytes read wasted",
				share, over, lay.AbstractChunks, lay.ChunksPerGroup, st.ChunkReads, lay.Chunks, 100*wasted[over])
		}
		require.Less(t, reads[DefaultOverflow], reads[0]/2, "budget %d%%", share)
		if share >= 25 {
			require.EqualValues(t, len(p.Index.Chunks), reads[DefaultOverflow], "budget %d%%: every chunk read once", share)
		}

	}

	_, err := NewServer(p, ServerOptions{Budget: data, Overflow: 0.95})
	require.ErrorIs(t, err, ErrInvalid)
	// The least budget takes an overflow share: of nothing.
	s, err := NewServer(p, ServerOptions{Budget: minBudget(p) + 10, Overflow: 0.5})
	require.NoError(t, err)
	require.EqualValues(t, 10, s.Layout().OverflowBytes)
	requireExactlyOnce(t, n, serveAll(t, s, ds, reqs, 100))
}
