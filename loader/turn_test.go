package loader

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// batchesOf cuts reqs into batches of size.
func batchesOf(reqs []int, size int) [][]int {
	var out [][]int
	for lo := 0; lo < len(reqs); lo += size {
		out = append(out, reqs[lo:min(lo+size, len(reqs))])
	}
	return out
}

// serveInTurn serves batches first..len(batches)-1 as workers goroutines
// would, batch b by worker (b-first+start) % workers, each worker's
// requests made at random times; it returns each batch's answer.
func serveInTurn(t *testing.T, s *Server, batches [][]int, first, start, workers int, seed uint64) []InTurn {
	t.Helper()
	out := make([]InTurn, len(batches))
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for b := first; b < len(batches); b++ {
				if (b-first+start)%workers != w {
					continue
				}
				time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
				res, err := s.GetBatchInTurn(Turn{Worker: w, Workers: workers}, batches[b], true, 10*time.Second, nil)
				if err != nil {
					errs[w] = err
					return
				}
				out[b] = res
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return out
}

// Workers whose requests come in any order get the batches a single
// caller serving them in the loader's order gets, each batch numbered in
// turn and carrying the state after it.
func TestInTurnServesTheLoadersOrder(t *testing.T) {
	const n, batch, workers = 150, 7, 3
	ds, p := newPack(t, datasetOpts{n: n, classes: 3, maxSize: 400, seed: 71}, 7)
	reqs := perm(n, 8)
	batches := batchesOf(reqs, batch)
	for _, budget := range []int64{minBudget(p), (minBudget(p) + maxBudget(p)) / 3} {
		ref := newServer(t, p, budget, 4)
		want := make([][]int, len(batches))
		for b, is := range batches {
			want[b] = positions(serveAll(t, ref, ds, is, len(is)))
		}
		for seed := range uint64(3) {
			s := newServer(t, p, budget, 4)
			got := serveInTurn(t, s, batches, 0, 0, workers, seed)
			for b, res := range got {
				require.Equal(t, uint64(b), res.Batch)
				require.Equal(t, want[b], positions(res.Samples), "batch %d, budget %d", b, budget)
				require.NotNil(t, res.State)
				require.Equal(t, batch*b+len(batches[b]), res.State.Served)
			}
		}
	}
}

// The parts of the batches consumed (each worker's latest one with the
// state after it) restored into a new server: the rest of the epoch,
// served in turn from the worker after the last batch's, is the batches
// the first server would have served, at every cut.
func TestRestoreTurnPartsContinues(t *testing.T) {
	const n, batch, workers, prefetch = 150, 9, 2, 4
	ds, p := newPack(t, datasetOpts{n: n, classes: 3, maxSize: 400, seed: 72}, 7)
	reqs := perm(n, 9)
	batches := batchesOf(reqs, batch)
	budget := (minBudget(p) + maxBudget(p)) / 3
	ref := newServer(t, p, budget, 4)
	require.NoError(t, ref.SetEpoch(3))
	want := make([][]int, len(batches))
	for b, is := range batches {
		want[b] = positions(serveAll(t, ref, ds, is, len(is)))
	}
	for _, cut := range []int{0, 1, 2, 5, len(batches) - 1} {
		a := newServer(t, p, budget, 4)
		require.NoError(t, a.SetEpoch(3))
		got := serveInTurn(t, a, batches[:min(cut+prefetch, len(batches))], 0, 0, workers, uint64(cut))
		parts := make([]WorkerPart, workers)
		for w := range parts {
			parts[w] = WorkerPart{Kind: WorkerPartKind, Version: WorkerPartTurnVersion, StateHead: a.Head(), Worker: w, NumWorkers: workers}
		}
		for b := range cut { // each worker's latest consumed batch
			parts[b%workers].Batch, parts[b%workers].State = got[b].Batch+1, got[b].State
		}
		parts[0], parts[1] = parts[1], parts[0] // any order

		p2, err := OpenPack(p.Dir)
		require.NoError(t, err)
		b := newServer(t, p2, budget, 99)
		require.NoError(t, b.RestoreParts(parts))
		start := cut % workers // torchdata: the worker after the one of the last batch yielded
		rest := serveInTurn(t, b, batches, cut, start, workers, uint64(cut)+7)
		for k := cut; k < len(batches); k++ {
			require.Equal(t, uint64(k), rest[k].Batch)
			require.Equal(t, want[k], positions(rest[k].Samples), "batch %d after a cut at %d", k, cut)
		}
	}

	// Two parts of one batch, or a part of a batch without its state: refused.
	s := newServer(t, p, budget, 4)
	head := s.Head()
	st, err := s.State()
	require.NoError(t, err)
	two := []WorkerPart{
		{Kind: WorkerPartKind, Version: WorkerPartTurnVersion, StateHead: head, Worker: 0, NumWorkers: 2, Batch: 1, State: &st},
		{Kind: WorkerPartKind, Version: WorkerPartTurnVersion, StateHead: head, Worker: 1, NumWorkers: 2, Batch: 1, State: &st},
	}
	require.ErrorContains(t, s.RestoreParts(two), "workers 0 and 1 both hold batch 0")
	two[1].Batch, two[1].State = 2, nil
	require.ErrorContains(t, s.RestoreParts(two), "worker 1's part of batch 1 holds no state")
}

// A request out of turn waits for the batches before it: it times out
// naming the worker whose batch is due, ends when its requester is gone,
// and a request of a loader of another number of workers is refused.
func TestInTurnWaits(t *testing.T) {
	const n = 60
	_, p := newPack(t, datasetOpts{n: n, classes: 3, maxSize: 300, seed: 73}, 6)
	s := newServer(t, p, minBudget(p), 3)
	reqs := perm(n, 1)
	_, err := s.GetBatchInTurn(Turn{Worker: 1, Workers: 2}, reqs[:5], false, 20*time.Millisecond, nil)
	require.ErrorIs(t, err, ErrTurn)
	require.ErrorContains(t, err, "batch 0 of epoch 0, worker 0's, did not come")

	gone := make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := s.GetBatchInTurn(Turn{Worker: 1, Workers: 2}, reqs[:5], false, time.Minute,
			func() <-chan struct{} { return gone })
		done <- err
	}()
	close(gone)
	require.ErrorContains(t, <-done, "connection closed while it waited for its turn")

	_, err = s.GetBatchInTurn(Turn{Worker: 0, Workers: 3}, reqs[:5], false, time.Second, nil)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "go round robin to 2 workers")

	// SetEpoch starts the round robin again, at worker 0 of any number.
	require.NoError(t, s.SetEpoch(1))
	res, err := s.GetBatchInTurn(Turn{Worker: 0, Workers: 3}, reqs[:5], false, time.Second, nil)
	require.NoError(t, err)
	require.Zero(t, res.Batch)
	require.Nil(t, res.State)
}
