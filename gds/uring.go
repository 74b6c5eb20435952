package gds

import (
	"fmt"
	"os"
)

// Uring is the io_uring engine: the direct (O_DIRECT) engine with its
// aligned middle submitted through io_uring instead of pread/pwrite on a
// pool of goroutines. Opening, the unaligned edges, size bookkeeping and the
// fallback for filesystems without O_DIRECT are the direct engine's
// (direct.go); only the middle differs (uringMiddle, in uring_batch.go).
//
// The middle is cut into task-sized pieces; each piece is one request, from
// the caller's memory when its address meets the O_DIRECT memory alignment
// and through a bounce buffer otherwise. Up to Options.QueueDepth requests
// are in flight per ring: the submitter fills as many SQEs as there are free
// slots, submits them all with one io_uring_enter, reaps whatever completed,
// refills, and so on. A short transfer is resubmitted for its remainder;
// -EINTR and -EAGAIN results are resubmitted with IOSQE_ASYNC (a kernel
// worker issues them and may block).
//
// Rings: a ring serves one goroutine at a time, while ReadAt and WriteAt are
// called from many. Each open file therefore owns a small pool of rings
// (ringPool), created on first use, at most Options.Threads of them; a
// transfer takes one ring for its whole middle and gives it back. A caller
// that finds every ring busy waits for one, so one file never has more than
// Threads × QueueDepth requests in flight. Close releases the rings.
// IORING_SETUP_SINGLE_ISSUER is not used: a ring passes from goroutine to
// goroutine, hence from thread to thread.
type Uring struct{ d *Direct }

var _ Engine = (*Uring)(nil)

// uringMaxDepth bounds Options.QueueDepth (the kernel allows 32768 SQ
// entries; deeper queues only cost memory).
const uringMaxDepth = 4096

// uringMaxIO is the most bytes one request asks for. The kernel moves at
// most about 2 GiB per read or write and an SQE's length is 32 bits, so a
// larger piece is issued as several requests. It is a multiple of every
// O_DIRECT alignment.
const uringMaxIO = 1 << 30

// uringBounceBytes bounds the bounce memory one transfer keeps in flight:
// with 8 MiB tasks and a depth of 32, bouncing every request would hold
// 256 MiB, far more than a disk needs to stay busy.
const uringBounceBytes = 64 << 20

// NewUring returns the io_uring engine with the given options, or an error
// wrapping ErrUnavailable with the reason when io_uring does not work here
// (see ProbeUring).
func NewUring(opts Options) (*Uring, error) {
	if ok, reason := ProbeUring(); !ok {
		return nil, fmt.Errorf("%w: uring: %s", ErrUnavailable, reason)
	}
	return &Uring{d: &Direct{name: "uring", opts: opts.withDefaults(), middle: uringMiddle}}, nil
}

func init() {
	register("uring", func(o Options) (Engine, error) {
		e, err := NewUring(o)
		if err != nil {
			return nil, err
		}
		return e, nil
	})
}

// Name implements Engine.
func (e *Uring) Name() string { return "uring" }

// Open implements Engine. A filesystem without O_DIRECT gets a posix file
// whose Fallback says why, as with the direct engine.
func (e *Uring) Open(path string, flag int, perm os.FileMode) (File, error) {
	f, err := e.d.Open(path, flag, perm)
	if df, ok := f.(*directFile); ok {
		df.ring = newRingPool(e.d.opts)
	}
	return f, err
}
