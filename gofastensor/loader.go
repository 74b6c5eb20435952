package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/loader"
	"github.com/pyfastensor/pyfastensor/loader/dist"
	"github.com/pyfastensor/pyfastensor/loader/frontend"
)

// The training-data loader (loader/, Brand) behind pyfastensor.data: pack
// and verify a directory, and a server over an opened pack as a handle (a
// frontend.Loader: each export below converts its C arguments, calls one
// of its methods and converts the result back).
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
		s, err := frontend.Verify(C.GoString(dir), progressPair(progress))
		if err != nil {
			return err
		}
		return putJSON(out, s)
	})
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
		l, s, err := frontend.Open(C.GoString(dir), o)
		if err != nil {
			return err
		}
		if err := putJSON(out, s); err != nil {
			_ = l.Close()
			return err
		}
		*handle = newHandle(l)
		return nil
	})
}

// pft_loader_set_epoch starts epoch e (loader.Server.SetEpoch; a node's of
// a cluster, dist.Node.SetEpoch).
//
//export pft_loader_set_epoch
func pft_loader_set_epoch(h C.uint64_t, e C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		l, err := lookup[*frontend.Loader](h)
		if err != nil {
			return err
		}
		return l.SetEpoch(uint64(e))
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
		l, err := lookup[*frontend.Loader](h)
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
		t, batch, err := l.Get(is)
		if err != nil {
			return err
		}
		m := unsafe.Slice(meta, int(n)*loaderMetaFields)
		for k, s := range batch {
			f := m[k*loaderMetaFields:]
			f[0], f[1], f[2], f[3] = C.int64_t(s.Position), C.int64_t(s.Source), C.int64_t(s.Label), C.int64_t(len(s.Data))
		}
		*ticket = C.uint64_t(t)
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
		l, err := lookup[*frontend.Loader](h)
		if err != nil {
			return err
		}
		if addrs == nil {
			return l.GiveBack(uint64(ticket))
		}
		return l.Take(uint64(ticket), int(n), func(k, size int) ([]byte, error) {
			return memory(unsafe.Slice(addrs, n)[k], C.size_t(size)) // n is the batch's length here
		})
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
		l, err := lookup[*frontend.Loader](h)
		if err != nil {
			return err
		}
		return l.Listen(C.GoString(addr), loader.LocalOptions{Status: func(err error) int32 { return int32(statusOf(err)) }})
	})
}

// pft_loader_state writes the server's state (loader.State; a node's of a
// cluster, dist.State), JSON, into out: take it between batches.
//
//export pft_loader_state
func pft_loader_state(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		l, err := lookup[*frontend.Loader](h)
		if err != nil {
			return err
		}
		st, err := l.State()
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}

// pft_loader_restore puts the server in the state (JSON, loader.State) a
// server of the same pack and layout wrote (loader.Server.Restore; a
// node's of a cluster, dist.Node.Restore).
//
//export pft_loader_restore
func pft_loader_restore(h C.uint64_t, state *C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		l, err := lookup[*frontend.Loader](h)
		if err != nil {
			return err
		}
		if state == nil {
			return fmt.Errorf("%w: loader: no state", gds.ErrInvalid)
		}
		return l.Restore([]byte(C.GoString(state)))
	})
}

// pft_loader_stats writes the server's counters (loader.Stats, with a
// node's dist.Stats under "dist"), JSON, into out.
//
//export pft_loader_stats
func pft_loader_stats(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		l, err := lookup[*frontend.Loader](h)
		if err != nil {
			return err
		}
		return putJSON(out, l.Stats())
	})
}

// pft_loader_close closes the server and releases its handle, with the
// bytes of batches not taken.
//
//export pft_loader_close
func pft_loader_close(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		l, err := release[*frontend.Loader](h)
		if err != nil {
			return err
		}
		return l.Close()
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
		l, err := lookup[*frontend.Loader](h)
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
		at, err := l.DistListen(C.GoString(addr), o.Options)
		if err != nil {
			return err
		}
		return putJSON(out, map[string]string{"address": at})
	})
}

// pft_loader_dist_connect connects the node to the others, at addrs (JSON:
// a list of "host:port" by rank), checking that each serves the same pack
// and layout (dist.Node.Connect).
//
//export pft_loader_dist_connect
func pft_loader_dist_connect(h C.uint64_t, addrs *C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		l, err := lookup[*frontend.Loader](h)
		if err != nil {
			return err
		}
		if addrs == nil {
			return fmt.Errorf("%w: loader: no addresses", gds.ErrInvalid)
		}
		var list []string
		if err := parseJSON(addrs, &list); err != nil {
			return err
		}
		return l.DistConnect(list)
	})
}

// pft_loader_dist_sequence gives the node the n positions its sampler
// asks for in epoch, in order (dist.Node.SetSequence): owners prefetch
// along it.
//
//export pft_loader_dist_sequence
func pft_loader_dist_sequence(h C.uint64_t, epoch C.uint64_t, n C.int64_t, positions *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		l, err := lookup[*frontend.Loader](h)
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
		return l.DistSequence(uint64(epoch), seq)
	})
}

// pft_loader_dist_drop gives the node's prefetched samples back to their
// owners (dist.Node.Drop): on every node before any takes its state.
//
//export pft_loader_dist_drop
func pft_loader_dist_drop(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		l, err := lookup[*frontend.Loader](h)
		if err != nil {
			return err
		}
		return l.DistDrop()
	})
}
