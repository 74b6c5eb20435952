// Package frontend is a training-data loader as the C boundary holds it
// behind one handle: a server of an opened pack (loader.Server), the
// batches it delivered and the caller has not yet taken (by ticket), the
// endpoint its DataLoader workers connect to (loader.Local), and, once it
// joins a cluster, its node (loader/dist). Each method is one call of the
// boundary; where a server and a node of a cluster differ (the epoch,
// state, restore, counters, the workers' batches) the method decides.
//
// A batch crosses in two calls. Get serves the requests (one GetBatch:
// the samples are delivered, and invalidated in the abstract memory, by
// that call) and keeps the samples under a ticket; the caller allocates
// one buffer per sample from their lengths, and Take copies each sample
// into its buffer and drops the ticket. The delivered sample is generally
// not the one asked for, so its length cannot be known before the first
// call. A ticket's bytes are outside the server's budget (they are the
// caller's, delivered); the caller takes every ticket it gets, or gives
// it back (GiveBack: loader.Server.Return).
package frontend

import (
	"fmt"
	"sync"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist"
)

// Loader is a server of a pack and what the boundary keeps about it: the
// batches got and not yet taken, the workers' endpoint, and its node of a
// cluster (DistListen), if any. Its methods are safe for concurrent use.
type Loader struct {
	srv    *loader.Server
	budget int64 // its share of the memory limit (loader.HoldBudget)

	mu      sync.Mutex
	closed  bool
	local   *loader.Local // the endpoint for workers, once listening
	node    *dist.Node    // a node of a cluster, or nil
	next    uint64
	tickets map[uint64][]loader.Sample
}

// Open opens the pack in dir (loader.OpenPack) and a server of it at
// epoch 0 with the options, and holds its budget in the Go runtime's
// memory limit until Close. It returns the pack's summary with the
// server's layout.
func Open(dir string, o loader.ServerOptions) (*Loader, Summary, error) {
	p, err := loader.OpenPack(dir)
	if err != nil {
		return nil, Summary{}, err
	}
	srv, err := loader.NewServer(p, o)
	if err != nil {
		return nil, Summary{}, err
	}
	lay := srv.Layout()
	loader.HoldBudget(o.Budget)
	return &Loader{srv: srv, budget: o.Budget, tickets: map[uint64][]loader.Sample{}}, Summarize(p, &lay), nil
}

// backend is what serves requests: the node of a cluster, or the server.
func (l *Loader) backend() loader.Backend {
	if n := l.distNode(); n != nil {
		return n
	}
	return l.srv
}

// distNode is the loader's node of a cluster, or nil.
func (l *Loader) distNode() *dist.Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.node
}

// needNode is the loader's node, or an error naming the call that needs
// one.
func (l *Loader) needNode(what string) (*dist.Node, error) {
	if n := l.distNode(); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("%w: loader: %s: the server is not a node of a cluster (pft_loader_dist_listen first)",
		gds.ErrInvalid, what)
}

// The loader is its workers' endpoint's backend (loader.Backend,
// loader.TurnBackend, loader.Resumable), so that a server that joins a
// cluster after listening serves them as a node.

// Len is the number of samples in the pack.
func (l *Loader) Len() int { return l.srv.Len() }

// Epoch is the server's epoch.
func (l *Loader) Epoch() uint64 { return l.srv.Epoch() }

// GetBatch serves the requests at positions is: the node's when the
// loader is one of a cluster, else the server's.
func (l *Loader) GetBatch(is []int) ([]loader.Sample, error) { return l.backend().GetBatch(is) }

// Return gives delivered samples back (their requests are asked again).
func (l *Loader) Return(samples []loader.Sample) { l.backend().Return(samples) }

// Release drops delivered samples the caller copied.
func (l *Loader) Release(samples []loader.Sample) { l.backend().Release(samples) }

// GetBatchInTurn serves a worker's batch: a server in the loader's order
// (loader.Server.GetBatchInTurn); a node of a cluster as they come
// (loader/dist orders nothing across nodes).
func (l *Loader) GetBatchInTurn(t loader.Turn, is []int, state bool, wait time.Duration,
	gone func() <-chan struct{}) (loader.InTurn, error) {
	if n := l.distNode(); n != nil {
		batch, err := n.GetBatch(is)
		return loader.InTurn{Samples: batch}, err
	}
	return l.srv.GetBatchInTurn(t, is, state, wait, gone)
}

// Head is what the server's state now is of.
func (l *Loader) Head() loader.StateHead { return l.srv.Head() }

// RestoreParts resumes the server from DataLoader workers' parts of a
// state; a node of a cluster does not resume so (ErrUnsupported).
func (l *Loader) RestoreParts(parts []loader.WorkerPart) error {
	if l.distNode() != nil {
		return fmt.Errorf("%w: loader: a distributed ChunkDataset resumes mid-epoch with num_workers=0 (its state_dict), "+
			"not from DataLoader workers' parts", gds.ErrUnsupported)
	}
	return l.srv.RestoreParts(parts)
}

// SetEpoch starts epoch e: the node's (dist.Node.SetEpoch) when the
// loader is one of a cluster, else the server's.
func (l *Loader) SetEpoch(e uint64) error {
	if n := l.distNode(); n != nil {
		return n.SetEpoch(e)
	}
	return l.srv.SetEpoch(e)
}

// Listen serves the loader to the node's other processes (DataLoader
// workers) on the Unix socket addr ("@name": Linux's abstract namespace),
// loader.ServeLocal, until Close. A loader listens on one address.
func (l *Loader) Listen(addr string, o loader.LocalOptions) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.local != nil {
		return fmt.Errorf("%w: loader: the server listens on %s already", gds.ErrInvalid, l.local.Addr())
	}
	lc, err := loader.ServeLocal(l, addr, o)
	if err != nil {
		return err
	}
	l.local = lc
	return nil
}

// Close closes the workers' endpoint, the node and the server, drops the
// batches not taken, and gives back the loader's budget. A loader closes
// once (loader.ErrClosed after).
func (l *Loader) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return loader.ErrClosed
	}
	l.closed = true
	local, node := l.local, l.node
	l.tickets = map[uint64][]loader.Sample{}
	l.mu.Unlock()
	defer loader.HoldBudget(-l.budget)
	// Every part closes whatever another's Close returned; the first error is reported.
	var errs []error
	if local != nil {
		errs = append(errs, local.Close())
	}
	if node != nil {
		_ = node.Close()
	}
	errs = append(errs, l.srv.Close())
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
