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
	data := dataBytes(p)
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

// A server of a cluster takes room for RefillReads chunk reads at once
// from the overflow share (a sixteenth of it at most), leaving the slots
// as they were; one node keeps the layout's read share.
func TestClusterReadsTakeRoomFromTheOverflow(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 3000, classes: 10, maxSize: 400, seed: 82}, 32)
	data := dataBytes(p)
	least := minBudget(p)
	for _, budget := range []int64{data / 2, data / 4} {
		cluster := 4 * budget
		over := min(int64(float64(cluster)*0.5), cluster-least)
		plan, err := PlanLayout(p.Index, cluster-over)
		require.NoError(t, err)
		extra := min(int64(RefillReads-1)*plan.MaxChunkBytes*4, over/16)

		four, err := NewServer(p, ServerOptions{Budget: budget, Overflow: 0.5, Rank: 1, World: 4})
		require.NoError(t, err)
		l := four.Layout()
		require.Positive(t, extra)
		require.Equal(t, plan.ChunksPerGroup, l.ChunksPerGroup, "budget %d: the slots as without the extra", budget)
		require.Equal(t, plan.SlotBytes, l.SlotBytes)
		require.Equal(t, plan.ReadBytes+extra, l.ReadBytes, "budget %d: the reads take the extra", budget)
		require.Equal(t, over-extra, l.OverflowBytes, "budget %d: from the overflow share", budget)
		require.Equal(t, cluster, l.SlotBytes+l.ReadBytes+l.OverflowBytes)
		require.Equal(t, max(l.ReadBytes/4, l.MaxChunkBytes), four.sem.cap)

		one, err := NewServer(p, ServerOptions{Budget: cluster, Overflow: 0.5})
		require.NoError(t, err)
		require.Equal(t, plan.ReadBytes, one.Layout().ReadBytes, "budget %d: one node keeps the layout's share", budget)
		require.Equal(t, over, one.Layout().OverflowBytes)
	}
	// At half the data, each server of the four reads more than one chunk at once.
	four, err := NewServer(p, ServerOptions{Budget: data / 2, Overflow: 0.5, World: 4})
	require.NoError(t, err)
	require.GreaterOrEqual(t, four.sem.cap, 2*four.Layout().MaxChunkBytes)
}

// Groups sized for the slots alone leave spares a random epoch's
// overflow share cannot hold, and each sample dropped for want of room
// costs its chunk a second read: the server widens them (widen) to the
// least G whose share holds the spares spareBytes predicts. Each chunk is
// then read once, the prediction stands beside the epoch's real peak, and
// the memory stays within the budget.
func TestWideGroupsHoldARandomEpochsSpares(t *testing.T) {
	const n = 30000
	ds, p := newPack(t, datasetOpts{n: n, classes: 10, maxSize: 256, fixedSize: true, seed: 83}, 64)
	data := dataBytes(p)
	reqs := perm(n, 6)
	for _, share := range []int64{10, 15} {
		budget := data * share / 100
		over := int64(float64(budget) * DefaultOverflow)
		narrow, err := PlanLayout(p.Index, budget-over)
		require.NoError(t, err)
		require.Greater(t, float64(spareBytes(p.Index, narrow.ChunksPerGroup, 0))*SpareMargin, float64(over),
			"budget %d%%: the groups sized for the slots alone need more than the share", share)

		s, err := NewServer(p, ServerOptions{Budget: budget, Seed: 1, Overflow: DefaultOverflow})
		require.NoError(t, err)
		lay := s.Layout()
		g := lay.ChunksPerGroup
		require.Greater(t, g, narrow.ChunksPerGroup, "budget %d%%: widened", share)
		require.Equal(t, budget, lay.SlotBytes+lay.OverflowBytes+lay.ReadBytes)
		require.Equal(t, slotBytes(p.Index, g), lay.SlotBytes)
		require.LessOrEqual(t, float64(spareBytes(p.Index, g, 0))*SpareMargin, float64(lay.OverflowBytes), "budget %d%%: the share holds the spares", share)
		wider := min(over, budget-slotBytes(p.Index, g-1)-narrow.ReadBytes)
		require.Greater(t, float64(spareBytes(p.Index, g-1, 0))*SpareMargin, float64(wider), "budget %d%%: the least G that does", share)

		requireExactlyOnce(t, n, serveAll(t, s, ds, reqs, 256))
		st := s.Stats()
		t.Logf("budget %d%%: G %d A %d reads %d peak %.2f%% slots %.2f%% over %.2f%% predicted %.2f%%", share, g, lay.AbstractChunks, st.ChunkReads,
			100*float64(st.PeakBytes)/float64(data), 100*float64(lay.SlotBytes)/float64(data), 100*float64(lay.OverflowBytes)/float64(data), 100*float64(spareBytes(p.Index, g, 0))/float64(data))
		require.EqualValues(t, lay.Chunks, st.ChunkReads, "budget %d%%: every chunk read once", share)
		require.Zero(t, st.WastedBytes)
		require.LessOrEqual(t, st.PeakBytes, budget)
		spares := float64(st.PeakBytes - lay.SlotBytes)
		predicted := float64(spareBytes(p.Index, g, 0))
		require.InDelta(t, 1, spares/predicted, 0.25, "budget %d%%: spares at their peak %.0f bytes, predicted %.0f", share, spares, predicted)
		t.Logf("budget %d%% of the data: G %d (slots alone: %d), %d abstract chunks, spares' peak %.1f%% of the data, predicted %.1f%%",
			share, g, narrow.ChunksPerGroup, lay.AbstractChunks, 100*spares/float64(data), 100*predicted/float64(data))
	}
}

// Below what a random epoch's spares need, the overflow share keeps a
// read's samples for the slots with the fewest spares first, so what it
// drops is for the slots whose requests are furthest off: the re-reads
// grow with the shortfall instead of at once. Kept in slot order, the
// same budget read each chunk about three times.
func TestShortOverflowKeepsTheSlotsWithFewestSpares(t *testing.T) {
	const n = 12000
	ds, p := newPack(t, datasetOpts{n: n, classes: 10, maxSize: 256, fixedSize: true, seed: 84}, 64)
	data := dataBytes(p)
	budget := data * 6 / 100
	s, err := NewServer(p, ServerOptions{Budget: budget, Seed: 1, Overflow: DefaultOverflow})
	require.NoError(t, err)
	lay := s.Layout()
	require.Equal(t, 1, lay.AbstractChunks, "the widest groups")
	require.Greater(t, float64(spareBytes(p.Index, lay.ChunksPerGroup, 0)), float64(lay.OverflowBytes), "short of the spares' need")
	requireExactlyOnce(t, n, serveAll(t, s, ds, perm(n, 7), 256))
	st := s.Stats()
	t.Logf("overflow %.1f%% of the data, spares' need %.1f%%: %d reads of %d chunks",
		100*float64(lay.OverflowBytes)/float64(data), 100*float64(spareBytes(p.Index, lay.ChunksPerGroup, 0))/float64(data), st.ChunkReads, lay.Chunks)
	require.Less(t, st.ChunkReads, int64(lay.Chunks)*13/10)
	require.LessOrEqual(t, st.PeakBytes, budget)

	// The layout says what budget would have read each chunk once.
	require.Greater(t, lay.EpochBudget, budget)
	enough, err := NewServer(p, ServerOptions{Budget: lay.EpochBudget, Seed: 1, Overflow: DefaultOverflow})
	require.NoError(t, err)
	require.LessOrEqual(t, float64(spareBytes(p.Index, enough.Layout().ChunksPerGroup, 0))*SpareMargin, float64(enough.Layout().OverflowBytes))
	requireExactlyOnce(t, n, serveAll(t, enough, ds, perm(n, 7), 256))
	require.EqualValues(t, lay.Chunks, enough.Stats().ChunkReads, "from the epoch budget: each chunk once")
}
