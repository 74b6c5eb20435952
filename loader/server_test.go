package loader

import (
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
)

func newServer(t testing.TB, p *Packed, budget int64, seed uint64) *Server {
	t.Helper()
	s, err := NewServer(p, ServerOptions{Budget: budget, Seed: seed})
	require.NoError(t, err)
	return s
}

// The paper's Figure 4, on one abstract chunk of 3 slots over 3 chunks:
// a valid sample is served whatever chunk the request names; an empty
// slot is refilled with the chunk of the highest fill rate, ties at
// random; a valid sample is never evicted.
func TestServerFillRatePolicy(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 9, classes: 3, maxSize: 50, seed: 41}, 3)
	s, err := NewServer(p, ServerOptions{Budget: minBudget(p), Seed: 1, NoReadAhead: true}) // counts reads per request
	require.NoError(t, err)
	require.Equal(t, 1, s.Layout().AbstractChunks)
	chunkOf := func(smp Sample) int { return smp.Position / 3 }

	var got []Sample
	get := func(i, reads int) {
		smp := serveAll(t, s, ds, []int{i}, 1)[0]
		require.Equal(t, i%3, smp.Position%3, "the sample of the request's slot")
		got = append(got, smp)
		require.EqualValues(t, reads, s.Stats().ChunkReads, "after request %d", i)
	}
	get(0, 1) // empty: every chunk fills 3 slots, a tie: chunk A
	a := chunkOf(got[0])
	get(3, 2) // slot 0 empty again: B and C fill 1 slot each, a tie: X
	x := chunkOf(got[1])
	require.NotEqual(t, a, x)
	get(1, 2) // A's, valid: no read
	get(2, 2)
	require.Equal(t, []int{a, x, a, a}, []int{chunkOf(got[0]), chunkOf(got[1]), chunkOf(got[2]), chunkOf(got[3])})
	get(4, 3) // all empty: X fills 2 slots (its slot 0 is delivered), Y 3: Y
	y := chunkOf(got[4])
	require.NotContains(t, []int{a, x}, y)
	get(6, 3) // Y's
	get(5, 3)
	get(7, 4) // only X has a sample at slot 1 left
	get(8, 4)
	require.Equal(t, []int{a, x, a, a, y, y, y, x, x}, func() (c []int) {
		for _, smp := range got {
			c = append(c, chunkOf(smp))
		}
		return
	}())
	requireExactlyOnce(t, 9, got)
	st := s.Stats()
	assert.EqualValues(t, 9, st.Served)
	assert.Equal(t, st.BytesRead-st.WastedBytes, st.BytesDelivered)
	assert.Zero(t, st.HeldBytes)
}

func TestServerRequestErrors(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 20, classes: 2, maxSize: 100, seed: 42}, 4)
	s := newServer(t, p, minBudget(p), 1)

	_, err := s.Get(20)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorIs(t, err, gds.ErrInvalid)
	require.ErrorContains(t, err, "position 20 outside the pack's 0..19")
	_, err = s.Get(-1)
	require.ErrorIs(t, err, ErrInvalid)

	// One group of 5 chunks: slot 1 has 5 samples. A batch asking for six
	// is refused whole, before any of it is served.
	_, err = s.GetBatch([]int{0, 1, 5, 9, 13, 17, 1})
	require.ErrorIs(t, err, ErrNotPermutation)
	require.ErrorContains(t, err, "position 1: slot 1 of abstract chunk 0 (chunks 0..4) has 5 undelivered samples left in epoch 0, and 6 requests ask for one")
	require.Zero(t, s.Stats().Served)

	got := serveAll(t, s, ds, []int{1, 5, 9, 13, 17}, 2)
	_, err = s.Get(1)
	require.ErrorIs(t, err, ErrNotPermutation)
	require.ErrorContains(t, err, "has 0 undelivered samples left")
	rest := slices.DeleteFunc(perm(20, 3), func(i int) bool { return i%4 == 1 })
	got = append(got, serveAll(t, s, ds, rest, 3)...)
	requireExactlyOnce(t, 20, got)

	_, err = s.Get(0)
	require.ErrorIs(t, err, ErrEpochDone)
	require.ErrorContains(t, err, "epoch 0 delivered all 20 samples; SetEpoch starts the next")
	require.NoError(t, s.SetEpoch(1))
	_, err = s.Get(0)
	require.NoError(t, err)

	require.NoError(t, s.Close())
	_, err = s.Get(1)
	require.ErrorIs(t, err, ErrClosed)
}

// The order is a function of (seed, epoch, request sequence): the same
// three give the same samples; another epoch or seed, others.
func TestServerEpochsDiffer(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 120, classes: 4, maxSize: 200, seed: 43}, 8)
	reqs := perm(120, 9)
	budget := (minBudget(p) + maxBudget(p)) / 3
	run := func(seed, epoch uint64) []int {
		s := newServer(t, p, budget, seed)
		require.Greater(t, s.Layout().ChunksPerGroup, 1)
		require.NoError(t, s.SetEpoch(epoch))
		got := serveAll(t, s, ds, reqs, 5)
		requireExactlyOnce(t, 120, got)
		return positions(got)
	}
	e0, e1 := run(1, 0), run(1, 1)
	assert.NotEqual(t, e0, e1, "two epochs, one request order: different samples")
	assert.Equal(t, e0, run(1, 0), "same seed, epoch and requests: same samples")
	assert.NotEqual(t, e0, run(2, 0), "another seed")

	// One server through two epochs gives what two fresh ones give.
	s := newServer(t, p, budget, 1)
	assert.Equal(t, e0, positions(serveAll(t, s, ds, reqs, 7)))
	require.NoError(t, s.SetEpoch(1))
	assert.Equal(t, e1, positions(serveAll(t, s, ds, reqs, 120)))
}

// The requests' batching and concurrent reads do not change which sample
// a request gets.
func TestServerBatchingDoesNotChangeTheOrder(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 200, classes: 4, maxSize: 300, seed: 44}, 6)
	reqs := perm(200, 1)
	budget := (minBudget(p) + maxBudget(p)) / 4
	var want []int
	for _, batch := range []int{1, 3, 16, 200} {
		s := newServer(t, p, budget, 5)
		got := positions(serveAll(t, s, ds, reqs, batch))
		if want == nil {
			want = got
		}
		require.Equal(t, want, got, "batches of %d", batch)
	}
}

func TestServerConcurrentCallers(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 400, classes: 5, maxSize: 2000, seed: 45}, 8)
	budget := minBudget(p) + (maxBudget(p)-minBudget(p))/5
	s := newServer(t, p, budget, 3)
	reqs := perm(400, 2)
	const callers = 4
	var wg sync.WaitGroup
	results := make([][]Sample, callers)
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lo := w * 8; lo < len(reqs); lo += callers * 8 {
				got, err := s.GetBatch(reqs[lo:min(lo+8, len(reqs))])
				assert.NoError(t, err)
				results[w] = append(results[w], got...)
			}
		}()
	}
	wg.Wait()
	var all []Sample
	for _, r := range results {
		all = append(all, r...)
	}
	requireExactlyOnce(t, 400, all)
	for _, smp := range all {
		require.Equal(t, ds.data[smp.Source], smp.Data)
	}
	st := s.Stats()
	assert.LessOrEqual(t, st.PeakBytes, budget)
	assert.Equal(t, st.BytesRead-st.WastedBytes, st.BytesDelivered)
}

func TestServerDamagedChunk(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 24, classes: 2, maxSize: 400, seed: 46}, 4)
	i := 9 // chunk 2's slot 1
	for p.Index.Samples[i].Length == 0 {
		i++
	}
	e := p.Index.Samples[i]
	damage(t, p.ChunkPath(e.Chunk), e.Offset)
	s := newServer(t, p, maxBudget(p), 1) // one chunk per group: request i gets sample i
	var err error
	for _, k := range perm(24, 1) {
		smp, gerr := s.Get(k)
		if gerr != nil {
			err = gerr
			require.Equal(t, i, k)
			continue
		}
		require.Equal(t, ds.data[smp.Source], smp.Data)
	}
	requireCorrupt(t, err, p.ChunkPath(e.Chunk), i, "CRC-32")

	// A chunk file gone after the pack was opened.
	require.NoError(t, s.SetEpoch(1))
	require.NoError(t, os.Remove(p.ChunkPath(5)))
	_, err = s.Get(21)
	requireCorrupt(t, err, p.ChunkPath(5), -1, "cannot read the chunk file")
	_, err = s.Get(22) // its fill failed: the same error
	requireCorrupt(t, err, p.ChunkPath(5), -1, "cannot read the chunk file")
}

// A request that leaves its abstract chunk empty starts the next refill
// then, before a request needs it; a sequential sampler's next chunk is
// read while the current one is consumed.
func TestServerReadsAhead(t *testing.T) {
	ds, p := newPack(t, datasetOpts{n: 40, classes: 2, maxSize: 300, seed: 46}, 8)
	s := newServer(t, p, minBudget(p), 2)
	require.Equal(t, 1, s.Layout().AbstractChunks)
	seq := make([]int, 40)
	for i := range seq {
		seq[i] = i
	}
	got := serveAll(t, s, ds, seq[:7], 7)
	require.EqualValues(t, 1, s.Stats().ChunkReads, "one chunk filled the slots asked for")
	got = append(got, serveAll(t, s, ds, seq[7:8], 1)...)
	require.Eventually(t, func() bool { return s.Stats().ChunkReads == 2 }, 5*time.Second, time.Millisecond,
		"the abstract chunk is empty: its next chunk is read with no request waiting")
	got = append(got, serveAll(t, s, ds, seq[8:], 8)...)
	requireExactlyOnce(t, 40, got)
	require.EqualValues(t, 5, s.Stats().ChunkReads, "one read per chunk: nothing wasted")
}

// With room in the overflow share, a request that leaves its slot with
// fewer than Layout.ReadAhead of its samples in memory starts the read
// its slot's next requests would make: with a random sampler nearly every
// read is made before a request needs it, and the reads are the same
// (each chunk once), the memory within the budget. Decided in request
// order, so the delivered order is still a function of the requests.
func TestServerReadsAheadOfARandomSampler(t *testing.T) {
	const n = 6000
	ds, p := newPack(t, datasetOpts{n: n, classes: 10, maxSize: 512, fixedSize: true, seed: 47}, 64)
	budget := dataBytes(p) * 3 / 10
	reqs := perm(n, 8)
	var orders [][]int
	for _, noAhead := range []bool{true, false} {
		s, err := NewServer(p, ServerOptions{Budget: budget, Seed: 1, Overflow: DefaultOverflow, NoReadAhead: noAhead})
		require.NoError(t, err)
		lay := s.Layout()
		got := serveAll(t, s, ds, reqs, 128)
		requireExactlyOnce(t, n, got)
		st := s.Stats()
		require.EqualValues(t, lay.Chunks, st.ChunkReads, "read ahead %v: each chunk once", !noAhead)
		require.LessOrEqual(t, st.PeakBytes, budget)
		t.Logf("read ahead %v: %d of %d reads ahead, peak %d of %d bytes", !noAhead, st.AheadReads, st.ChunkReads, st.PeakBytes, budget)
		if noAhead {
			require.Zero(t, lay.ReadAhead)
			require.Zero(t, st.AheadReads, "every read made by the request that needs it")
		} else {
			require.Equal(t, ReadAheadLevels, lay.ReadAhead, "the share has room for every level")
			require.Greater(t, st.AheadReads, st.ChunkReads*9/10, "read before a request needed them")
		}
		orders = append(orders, positions(got))
	}
	require.NotEqual(t, orders[0], orders[1], "reading ahead picks chunks earlier, for fewer empty slots")

	// The same requests in other batches: the same order.
	s, err := NewServer(p, ServerOptions{Budget: budget, Seed: 1, Overflow: DefaultOverflow})
	require.NoError(t, err)
	require.Equal(t, orders[1], positions(serveAll(t, s, ds, reqs, 7)))
}
