package loader

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A batch given back untaken (a worker that died holding it) is served
// again, from memory, to the requests asked again: the epoch still
// delivers every sample once.
func TestReturnServesTheSamplesAgain(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 60, classes: 3, maxSize: 300, seed: 61}, 6)
	for k, budget := range []int64{minBudget(p), 2 * minBudget(p), maxBudget(p), 3 * minBudget(p)} {
		over := []float64{0, 0, 0, DefaultOverflow}[k] // and with spares kept already
		// NoReadAhead: the reads counted are the requests' own (a read-ahead
		// lands whenever its read ends).
		s, err := NewServer(p, ServerOptions{Budget: budget, Seed: 3, Overflow: over, NoReadAhead: true})
		require.NoError(t, err)
		reqs := perm(60, 7)
		got := serveAll(t, s, ds, reqs[:20], 5)
		lost, err := s.GetBatch(reqs[20:28])
		require.NoError(t, err)
		reads := s.Stats().ChunkReads
		s.Return(lost)
		st := s.Stats()
		require.EqualValues(t, 8, st.Returned)
		require.EqualValues(t, 20, st.Served)

		again := serveAll(t, s, ds, reqs[20:28], 8)
		require.Equal(t, positions(lost), positions(again), "budget %d: the samples given back, in order", budget)
		require.Equal(t, reads, s.Stats().ChunkReads, "served from memory")
		got = append(got, again...)
		got = append(got, serveAll(t, s, ds, reqs[28:], 7)...)
		requireExactlyOnce(t, 60, got)
		require.LessOrEqual(t, s.Stats().PeakBytes, budget+int64(8*300), "over the budget by the batch given back at most")
	}
}

// Given-back samples are part of a state: a restored server reads their
// chunks again and delivers what the first server would have.
func TestReturnedSamplesSurviveStateAndRestore(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 48, classes: 4, maxSize: 200, seed: 62}, 4)
	budget := minBudget(p)
	a := newServer(t, p, budget, 5)
	reqs := perm(48, 8)
	first := serveAll(t, a, ds, reqs[:16], 4)
	lost, err := a.GetBatch(reqs[16:24])
	require.NoError(t, err)
	a.Return(lost)
	st, err := a.State()
	require.NoError(t, err)

	b := newServer(t, p, budget, 0)
	require.NoError(t, b.Restore(st))
	restAfter := serveAll(t, b, ds, reqs[16:], 6)
	restHere := serveAll(t, a, ds, reqs[16:], 6)
	require.Equal(t, positions(restHere), positions(restAfter))
	requireExactlyOnce(t, 48, append(first, restAfter...))
}

// A batch of an epoch that has ended is not given back into the next.
func TestReturnOfAnotherEpochIsDropped(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 30, classes: 3, maxSize: 100, seed: 63}, 5)
	s := newServer(t, p, minBudget(p), 1)
	old, err := s.GetBatch(perm(30, 1)[:10])
	require.NoError(t, err)
	require.NoError(t, s.SetEpoch(1))
	s.Return(old)
	require.Zero(t, s.Stats().Returned)
	requireExactlyOnce(t, 30, serveAll(t, s, ds, perm(30, 2), 10))

	// Nor twice, nor a sample not delivered.
	got, err := s.GetBatch(nil)
	require.NoError(t, err)
	require.Empty(t, got)
	require.NoError(t, s.SetEpoch(2))
	b, err := s.GetBatch([]int{0, 1})
	require.NoError(t, err)
	s.Return(b)
	s.Return(b)
	require.EqualValues(t, 2, s.Stats().Returned)
	reqs := []int{0, 1}
	for _, i := range perm(30, 3) {
		if i > 1 {
			reqs = append(reqs, i)
		}
	}
	requireExactlyOnce(t, 30, serveAll(t, s, ds, reqs, 10))
}
