package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist"
)

// The training-data loader (loader/, Brand) behind pyfastensor.data: pack
// and verify a directory, and a server over an opened pack as a handle.
//
// A batch crosses in two calls. pft_loader_get serves the requests (one
// GetBatch: the samples are delivered, and invalidated in the abstract
// memory, by that call) and writes each sample's position, source, label
// and length into the caller's int64 array, keeping the bytes under a
// ticket; Python allocates one tensor per sample from the lengths, and
// pft_loader_take copies each sample into its tensor and drops the ticket.
// The delivered sample is generally not the one asked for, so its length
// cannot be known before the first call; two calls cost one copy per byte
// (Go's sample buffer into the tensor) where one C-allocated buffer would
// cost two (into the buffer, then into a tensor that owns its memory, since
// torch cannot free malloc'd memory when a tensor dies).
//
// A ticket's bytes are outside the server's budget (they are the caller's,
// delivered); Python takes every ticket it gets before its call returns,
// or gives it back (take with no addresses: loader.Server.Return).
//
// DataLoader workers do not call in: pft_loader_listen serves the same
// server to them over a Unix socket (loader.ServeLocal), the same two
// steps as requests of the local protocol, the bytes crossing into their
// shared memory.

// progressPair keeps the caller's two counters at (done, total); another
// thread may poll them during the call.
func progressPair(p *C.int64_t) func(done, total int64) {
	if p == nil {
		return nil
	}
	pair := unsafe.Slice((*int64)(unsafe.Pointer(p)), 2)
	return func(done, total int64) {
		atomic.StoreInt64(&pair[1], total)
		atomic.StoreInt64(&pair[0], done)
	}
}

// packSummary describes an opened pack without its index (which holds a
// record per sample).
type packSummary struct {
	Dir       string         `json:"dir"`
	Version   uint32         `json:"version"`
	Samples   int            `json:"samples"`
	Chunks    int            `json:"chunks"`
	ChunkSize int            `json:"chunk_size"`
	Seed      uint64         `json:"seed"` // of the pack's shuffle
	Classes   []string       `json:"classes"`
	DataBytes int64          `json:"data_bytes"`
	FileBytes int64          `json:"file_bytes"`
	Layout    *layoutSummary `json:"layout,omitempty"` // a server's; none for a pack alone
}

// layoutSummary is a server's layout without its list of owned abstract
// chunks (every one, on one node).
type layoutSummary struct {
	loader.Layout
	Owned []int `json:"owned,omitempty"` // nil: hides Layout.Owned
}

func summarize(p *loader.Packed, lay *loader.Layout) packSummary {
	ix := p.Index
	s := packSummary{Dir: p.Dir, Version: ix.Version, Samples: ix.Len(), Chunks: len(ix.Chunks),
		ChunkSize: ix.ChunkSize, Seed: ix.Seed, Classes: ix.Classes}
	for _, c := range ix.Chunks {
		s.DataBytes += c.DataLength
		s.FileBytes += c.Length
	}
	if lay != nil {
		s.Layout = &layoutSummary{Layout: *lay}
	}
	return s
}

// pft_loader_pack packs the samples of spec (JSON, loader.PackSpec: samples
// as {"path", "label"}, classes, chunk_size, seed) into the directory dir
// (loader.Pack: resumes or restarts an interrupted pack of it). progress:
// NULL, or two int64s kept at (samples packed, samples). out: the stats
// (loader.PackStats), JSON.
//
//export pft_loader_pack
func pft_loader_pack(spec, dir *C.char, progress *C.int64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		var s loader.PackSpec
		if spec == nil {
			return fmt.Errorf("%w: pack: no spec", gds.ErrInvalid)
		}
		if err := parseJSON(spec, &s); err != nil {
			return err
		}
		st, err := loader.Pack(s, C.GoString(dir), progressPair(progress))
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}

// pft_loader_verify re-reads every chunk file of the pack in dir and checks
// it against the index (loader.VerifyPack): stCorrupt names the first
// damaged chunk file and sample. progress: NULL, or two int64s kept at
// (chunk bytes checked, chunk bytes). out: the pack's summary, JSON.
//
//export pft_loader_verify
func pft_loader_verify(dir *C.char, progress *C.int64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		path := C.GoString(dir)
		if err := loader.VerifyPack(path, progressPair(progress)); err != nil {
			return err
		}
		p, err := loader.OpenPack(path)
		if err != nil {
			return err
		}
		return putJSON(out, summarize(p, nil))
	})
}

// loaderServer is a server's handle: the server and the batches got and
// not yet taken, by ticket.
type loaderServer struct {
	srv    *loader.Server
	budget int64 // its share of the memory limit (loader/memlimit.go)

	local *loader.Local // the endpoint for workers, once listening

	mu      sync.Mutex
	node    *dist.Node // a node of a cluster (pft_loader_dist_listen), or nil
	next    uint64
	tickets map[uint64][]loader.Sample
}

// backend is what serves requests: the node of a cluster, or the server.
func (ls *loaderServer) backend() loader.Backend {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.node != nil {
		return ls.node
	}
	return ls.srv
}

// The handle is the workers' endpoint's backend, so that a server that
// joins a cluster after listening serves them as a node.
func (ls *loaderServer) Len() int                                   { return ls.srv.Len() }
func (ls *loaderServer) Epoch() uint64                              { return ls.srv.Epoch() }
func (ls *loaderServer) GetBatch(is []int) ([]loader.Sample, error) { return ls.backend().GetBatch(is) }
func (ls *loaderServer) Return(samples []loader.Sample)             { ls.backend().Return(samples) }
func (ls *loaderServer) Release(samples []loader.Sample)            { ls.backend().Release(samples) }

// GetBatchInTurn makes the handle a loader.TurnBackend: a server serves
// its workers' batches in the loader's order; a node of a cluster serves
// them as they come (loader/dist orders nothing across nodes).
func (ls *loaderServer) GetBatchInTurn(t loader.Turn, is []int, state bool, wait time.Duration,
	gone func() <-chan struct{}) (loader.InTurn, error) {
	if n, _ := ls.distNode(); n != nil {
		batch, err := n.GetBatch(is)
		return loader.InTurn{Samples: batch}, err
	}
	return ls.srv.GetBatchInTurn(t, is, state, wait, gone)
}

// Head and RestoreParts make the handle a loader.Resumable: DataLoader
// workers resume a server from their parts of a state; a node of a
// cluster does not.
func (ls *loaderServer) Head() loader.StateHead { return ls.srv.Head() }

func (ls *loaderServer) RestoreParts(parts []loader.WorkerPart) error {
	if n, _ := ls.distNode(); n != nil {
		return fmt.Errorf("%w: loader: a distributed ChunkDataset resumes mid-epoch with num_workers=0 (its state_dict), "+
			"not from DataLoader workers' parts", gds.ErrUnsupported)
	}
	return ls.srv.RestoreParts(parts)
}

// distNode is the handle's node, or an error saying it has none.
func (ls *loaderServer) distNode() (*dist.Node, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.node == nil {
		return nil, fmt.Errorf("%w: loader: the server is not a node of a cluster (pft_loader_dist_listen first)", gds.ErrInvalid)
	}
	return ls.node, nil
}

// pft_loader_open opens the pack in dir (loader.OpenPack) and a server of
// it at epoch 0 with the options (JSON, loader.ServerOptions: budget in
// bytes, seed of the tie-breaks, overflow share, loader.DefaultOverflow
// when absent). handle: the server, for the calls below; out: the pack's
// summary and the server's layout, JSON.
//
//export pft_loader_open
func pft_loader_open(dir, options *C.char, handle *C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		o := loader.ServerOptions{Overflow: loader.DefaultOverflow}
		if options == nil {
			return fmt.Errorf("%w: loader: no options", gds.ErrInvalid)
		}
		if err := parseJSON(options, &o); err != nil {
			return err
		}
		p, err := loader.OpenPack(C.GoString(dir))
		if err != nil {
			return err
		}
		srv, err := loader.NewServer(p, o)
		if err != nil {
			return err
		}
		lay := srv.Layout()
		if err := putJSON(out, summarize(p, &lay)); err != nil {
			return err
		}
		loader.HoldBudget(o.Budget)
		*handle = newHandle(&loaderServer{srv: srv, budget: o.Budget, tickets: map[uint64][]loader.Sample{}})
		return nil
	})
}

// pft_loader_set_epoch starts epoch e (loader.Server.SetEpoch).
//
//export pft_loader_set_epoch
func pft_loader_set_epoch(h C.uint64_t, e C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		if n, _ := ls.distNode(); n != nil {
			return n.SetEpoch(uint64(e))
		}
		return ls.srv.SetEpoch(uint64(e))
	})
}

// loaderMetaFields is the int64s pft_loader_get writes per sample:
// position (in the pack's index), source (index in the pack's spec),
// label, length in bytes.
const loaderMetaFields = loader.LocalMetaFields

// pft_loader_get serves n requests for the positions at indices
// (loader.Server.GetBatch: all of them or none), writing
// loaderMetaFields int64s per sample into meta (4n of them) and the
// ticket of the batch's bytes into ticket, for pft_loader_take.
//
//export pft_loader_get
func pft_loader_get(h C.uint64_t, n C.int64_t, indices *C.int64_t, meta *C.int64_t, ticket *C.uint64_t,
	errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		if n < 0 || (n > 0 && (indices == nil || meta == nil)) || ticket == nil {
			return fmt.Errorf("%w: %d requests with missing arrays", gds.ErrInvalid, n)
		}
		is := make([]int, n)
		for k, v := range unsafe.Slice(indices, n) {
			is[k] = int(v)
		}
		batch, err := ls.GetBatch(is)
		if err != nil {
			return err
		}
		m := unsafe.Slice(meta, int(n)*loaderMetaFields)
		for k, s := range batch {
			f := m[k*loaderMetaFields:]
			f[0], f[1], f[2], f[3] = C.int64_t(s.Position), C.int64_t(s.Source), C.int64_t(s.Label), C.int64_t(len(s.Data))
		}
		ls.mu.Lock()
		defer ls.mu.Unlock()
		ls.next++
		ls.tickets[ls.next] = batch
		*ticket = C.uint64_t(ls.next)
		return nil
	})
}

// pft_loader_take copies the n samples of a pft_loader_get batch into the
// caller's memory at addrs (each the length get gave it; used during the
// call only) and drops the ticket. addrs NULL gives the batch back to the
// server instead (loader.Server.Return: the requests asked again get its
// samples), copying nothing.
//
//export pft_loader_take
func pft_loader_take(h C.uint64_t, ticket C.uint64_t, n C.int64_t, addrs *unsafe.Pointer, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		ls.mu.Lock()
		batch, ok := ls.tickets[uint64(ticket)]
		delete(ls.tickets, uint64(ticket))
		ls.mu.Unlock()
		switch {
		case !ok:
			return fmt.Errorf("%w: loader: no batch of ticket %d (taken already?)", gds.ErrInvalid, uint64(ticket))
		case addrs == nil:
			ls.Return(batch)
			return nil
		case int(n) != len(batch):
			return fmt.Errorf("%w: loader: %d addresses for the %d samples of ticket %d", gds.ErrInvalid, n, len(batch), uint64(ticket))
		}
		for k, a := range unsafe.Slice(addrs, n) {
			dst, err := memory(a, C.size_t(len(batch[k].Data)))
			if err != nil {
				return fmt.Errorf("loader: sample %d of ticket %d: %w", k, uint64(ticket), err)
			}
			copy(dst, batch[k].Data)
		}
		ls.Release(batch)
		return nil
	})
}

// pft_loader_listen serves the server to the node's other processes
// (DataLoader workers) on the Unix socket addr ("@name": Linux's abstract
// namespace), loader.ServeLocal, until pft_loader_close. Errors reach the
// clients with this ABI's status codes. A server listens on one address.
//
//export pft_loader_listen
func pft_loader_listen(h C.uint64_t, addr *C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		ls.mu.Lock()
		defer ls.mu.Unlock()
		if ls.local != nil {
			return fmt.Errorf("%w: loader: the server listens on %s already", gds.ErrInvalid, ls.local.Addr())
		}
		l, err := loader.ServeLocal(ls, C.GoString(addr), loader.LocalOptions{Status: func(err error) int32 { return int32(statusOf(err)) }})
		if err != nil {
			return err
		}
		ls.local = l
		return nil
	})
}

// pft_loader_state writes the server's state (loader.State), JSON, into
// out: take it between batches.
//
//export pft_loader_state
func pft_loader_state(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		if n, _ := ls.distNode(); n != nil {
			st, err := n.State()
			if err != nil {
				return err
			}
			return putJSON(out, st)
		}
		st, err := ls.srv.State()
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}

// pft_loader_restore puts the server in the state (JSON, loader.State) a
// server of the same pack and layout wrote (loader.Server.Restore).
//
//export pft_loader_restore
func pft_loader_restore(h C.uint64_t, state *C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		if state == nil {
			return fmt.Errorf("%w: loader: no state", gds.ErrInvalid)
		}
		if n, _ := ls.distNode(); n != nil {
			var st dist.State
			if err := parseJSON(state, &st); err != nil {
				return err
			}
			return n.Restore(st)
		}
		var st loader.State
		if err := parseJSON(state, &st); err != nil {
			return err
		}
		return ls.srv.Restore(st)
	})
}

// pft_loader_stats writes the server's counters (loader.Stats), JSON,
// into out.
//
//export pft_loader_stats
func pft_loader_stats(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		type stats struct {
			loader.Stats
			Dist *dist.Stats `json:"dist,omitempty"` // a node's
		}
		st := stats{Stats: ls.srv.Stats()}
		if n, _ := ls.distNode(); n != nil {
			d := n.Stats()
			st.Dist = &d
		}
		return putJSON(out, st)
	})
}

// pft_loader_close closes the server and releases its handle, with the
// bytes of batches not taken.
//
//export pft_loader_close
func pft_loader_close(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := release[*loaderServer](h)
		if err != nil {
			return err
		}
		defer loader.HoldBudget(-ls.budget)
		ls.mu.Lock()
		local, node := ls.local, ls.node
		ls.mu.Unlock()
		if local != nil {
			if err := local.Close(); err != nil {
				return err
			}
		}
		if node != nil {
			_ = node.Close()
		}
		return ls.srv.Close()
	})
}

// distOptions are pft_loader_dist_listen's options: dist.Options with the
// timeout in seconds.
type distOptions struct {
	dist.Options
	TimeoutS float64 `json:"timeout_s"`
}

// pft_loader_dist_listen makes the server, opened with the options' rank
// and world (pft_loader_open), a node of a cluster (dist.NewNode with the
// options, JSON: rank, world, token, remote_bytes, window, no_prefetch,
// timeout_s) serving the other nodes over gRPC on addr ("host:port", port
// 0 picks one). out: {"address": the address it listens on}, JSON.
//
//export pft_loader_dist_listen
func pft_loader_dist_listen(h C.uint64_t, addr, options *C.char, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		if options == nil || addr == nil {
			return fmt.Errorf("%w: loader: dist listen without options or address", gds.ErrInvalid)
		}
		var o distOptions
		if err := parseJSON(options, &o); err != nil {
			return err
		}
		if o.TimeoutS < 0 || o.TimeoutS > 1e6 {
			return fmt.Errorf("%w: loader: a timeout of %v s", gds.ErrInvalid, o.TimeoutS)
		}
		o.Timeout = time.Duration(o.TimeoutS * float64(time.Second))
		ls.mu.Lock()
		defer ls.mu.Unlock()
		if ls.node != nil {
			return fmt.Errorf("%w: loader: the server is a node of a cluster already", gds.ErrInvalid)
		}
		n, err := dist.NewNode(ls.srv, o.Options)
		if err != nil {
			return err
		}
		at, err := n.Listen(C.GoString(addr))
		if err != nil {
			_ = n.Close()
			return err
		}
		if err := putJSON(out, map[string]string{"address": at}); err != nil {
			_ = n.Close()
			return err
		}
		ls.node = n
		return nil
	})
}

// pft_loader_dist_connect connects the node to the others, at addrs (JSON:
// a list of "host:port" by rank), checking that each serves the same pack
// and layout (dist.Node.Connect).
//
//export pft_loader_dist_connect
func pft_loader_dist_connect(h C.uint64_t, addrs *C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		n, err := ls.distNode()
		if err != nil {
			return err
		}
		var list []string
		if addrs == nil {
			return fmt.Errorf("%w: loader: no addresses", gds.ErrInvalid)
		}
		if err := parseJSON(addrs, &list); err != nil {
			return err
		}
		return n.Connect(list)
	})
}

// pft_loader_dist_sequence gives the node the n positions its sampler
// asks for in epoch, in order (dist.Node.SetSequence): owners prefetch
// along it.
//
//export pft_loader_dist_sequence
func pft_loader_dist_sequence(h C.uint64_t, epoch C.uint64_t, n C.int64_t, positions *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		node, err := ls.distNode()
		if err != nil {
			return err
		}
		if n < 0 || (n > 0 && positions == nil) {
			return fmt.Errorf("%w: loader: a sequence of %d positions without them", gds.ErrInvalid, n)
		}
		seq := make([]int, n)
		for k, v := range unsafe.Slice(positions, n) {
			seq[k] = int(v)
		}
		return node.SetSequence(uint64(epoch), seq)
	})
}

// pft_loader_dist_drop gives the node's prefetched samples back to their
// owners (dist.Node.Drop): on every node before any takes its state.
//
//export pft_loader_dist_drop
func pft_loader_dist_drop(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		ls, err := lookup[*loaderServer](h)
		if err != nil {
			return err
		}
		n, err := ls.distNode()
		if err != nil {
			return err
		}
		return n.Drop()
	})
}
