package loader

import (
	"fmt"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Serving a DataLoader's workers in the loader's order. torch's
// DataLoader (and torchdata's StatefulDataLoader) with in-order dispatch
// hands the epoch's batches to its workers round robin: batch b to worker
// b % workers, and after a StatefulDataLoader resumes, to the worker after
// the one whose batch was yielded last, and so on. The workers' requests
// reach the server in whatever order they run; served as they come, which
// sample answers which request would depend on that timing. A request in
// turn (GetBatchInTurn) says which worker of how many makes it, and is
// served only once the batches before it in the loader's order were:
// batch b is then decided on the state the batches 0..b-1 left, so the
// epoch's batches are a function of (seed, epoch, the sampler's requests,
// the number of workers), as with one process. A request that is ahead
// waits; the decisions are cheap (bookkeeping under the lock), the chunk
// reads of consecutive batches still overlap.

// ErrTurn: a DataLoader worker's request in turn waited too long for the
// batches before it (a worker that stopped, or a loader that does not
// dispatch round robin).
var ErrTurn = gds.Named(gds.ErrUnavailable, "DataLoader worker's turn did not come")

// Turn is a request's place in the round robin of a DataLoader's workers:
// worker Worker of Workers.
type Turn struct {
	Worker  int
	Workers int
}

// turnState is the round robin of the epoch's batches served in turn.
type turnState struct {
	batches uint64        // batches served in turn this epoch
	rot     int           // batch b is worker (b+rot) % workers's
	workers int           // the loader's workers; 0: no request in turn yet this epoch
	changed chan struct{} // closed (and replaced) when any of the above changes
}

// reset starts the round robin at batch batches, worker (batches+rot) %
// workers, waking the requests waiting.
func (t *turnState) reset(batches uint64, rot, workers int) {
	t.batches, t.rot, t.workers = batches, rot, workers
	t.signal()
}

func (t *turnState) signal() {
	if t.changed != nil {
		close(t.changed)
	}
	t.changed = make(chan struct{})
}

// InTurn is a batch served in turn.
type InTurn struct {
	Samples []Sample
	// Batch is its index among the epoch's batches served in turn.
	Batch uint64
	// State is the server's state right after the batch's decisions (the
	// state the batches 0..Batch left), when asked for: what a
	// WorkerPart carries, so that a resume continues as this server
	// would have.
	State *State
}

// GetBatchInTurn serves the batch is (GetBatch) of worker t.Worker of a
// loader of t.Workers workers once the batches before it in the loader's
// round robin were served: it waits, up to wait, while another worker's
// batch is due. With state, the answer carries the server's state after
// the batch. gone, when not nil, is called once the request has to wait;
// its channel closing (the requester died) ends the wait with an error.
// The round robin starts at worker 0 with each epoch (SetEpoch, Restore)
// and where RestoreParts says. A request of a loader of another number of
// workers than the epoch's first is an error wrapping ErrInvalid; a wait
// that times out, ErrTurn. The batch's own errors are GetBatch's; its
// turn passes either way.
func (s *Server) GetBatchInTurn(t Turn, is []int, state bool, wait time.Duration, gone func() <-chan struct{}) (InTurn, error) {
	if t.Workers < 1 || t.Worker < 0 || t.Worker >= t.Workers {
		return InTurn{}, fmt.Errorf("%w: a request of DataLoader worker %d of %d", ErrInvalid, t.Worker, t.Workers)
	}
	var timer *time.Timer
	var goneCh <-chan struct{}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	s.mu.Lock()
	for {
		tn := &s.turns
		if s.closed {
			s.mu.Unlock()
			return InTurn{}, ErrClosed
		}
		if len(is) > 0 && s.nDelivered == s.lay.Samples {
			break // admit says so, whoever's turn it is
		}
		if tn.workers == 0 {
			tn.workers = t.Workers
		}
		if tn.workers != t.Workers {
			err := fmt.Errorf("%w: a request of DataLoader worker %d of %d, while epoch %d's batches go round robin to %d workers",
				ErrInvalid, t.Worker, t.Workers, s.epoch, tn.workers)
			s.mu.Unlock()
			return InTurn{}, err
		}
		due := int((tn.batches + uint64(tn.rot)) % uint64(tn.workers))
		if due == t.Worker {
			break
		}
		ch, batch, epoch := tn.changed, tn.batches, s.epoch
		s.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
			if gone != nil {
				goneCh = gone()
			}
		}
		select {
		case <-ch:
		case <-goneCh:
			return InTurn{}, fmt.Errorf("loader: DataLoader worker %d's connection closed while it waited for its turn", t.Worker)
		case <-timer.C:
			return InTurn{}, fmt.Errorf("loader: %w: DataLoader worker %d of %d waited %v while batch %d of epoch %d, worker %d's, did not come "+
				"(a worker stopped, or a loader that does not hand batches to its workers round robin: keep in_order=True)",
				ErrTurn, t.Worker, t.Workers, wait, batch, epoch, due)
		}
		s.mu.Lock()
	}
	b, err := s.begin(is)
	out := InTurn{Batch: s.turns.batches}
	s.turns.batches++
	s.turns.signal()
	var parts stateParts
	if err == nil && state {
		parts = s.stateParts()
	}
	s.mu.Unlock()
	if err != nil {
		return InTurn{}, err
	}
	if state {
		st := parts.build()
		out.State = &st
	}
	out.Samples, err = s.finish(b)
	if err != nil {
		return InTurn{}, err
	}
	return out, nil
}
