package gds

import (
	"errors"
	"io"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// uringMiddle is the uring engine's middleFunc: it moves the aligned middle
// p at off through one ring of the file's pool.
func uringMiddle(f *directFile, write bool, p []byte, off int64) (int, error) {
	pool := f.ring.(*ringPool)
	r, err := pool.get()
	if errors.Is(err, ErrClosed) {
		return 0, err
	}
	if err != nil {
		// No ring could be set up now (ENOMEM, EMFILE; the probe's ring
		// worked): the same O_DIRECT transfer on the threaded path.
		return threadedMiddle(f, write, p, off)
	}
	// The kernel completes a request as task work of the thread that
	// submitted it. Keeping the goroutine on one thread for the whole batch
	// lets its own io_uring_enter wait run that work, rather than the kernel
	// interrupting whichever thread submitted earlier.
	runtime.LockOSThread()
	b := &uringBatch{f: f, pool: pool, r: r, write: write, p: p, off: off}
	n, err := b.run()
	runtime.UnlockOSThread()
	pool.put(r, b.broken)
	return n, err
}

// uringReq is one request slot of a batch; its index is the SQE's user data.
type uringReq struct {
	lo     int      // where the piece starts in the batch's p
	user   []byte   // the caller's bytes of the piece
	buf    []byte   // the memory the kernel moves: user, or a bounce buffer
	bounce *hugeBuf // the pooled bounce buffer, when buf is one
	done   int      // bytes moved so far
	flags  uint8    // SQE flags for the next (re)submission
}

// uringBatch moves one middle through one ring. The reqs slice holds every
// buffer handed to the kernel, so they stay reachable until their CQEs are
// reaped (the SQEs hold bare addresses the garbage collector cannot see).
type uringBatch struct {
	f     *directFile
	pool  *ringPool
	r     *ioRing
	write bool
	p     []byte
	off   int64

	reqs     []uringReq
	free     []int // free slots
	inflight int   // slots in use: prepared, submitted or awaiting a retry
	bounced  int   // slots using a bounce buffer
	next     int   // where the next piece starts in p
	retry    []int // slots to resubmit after this reap
	aborting bool  // a submit failed: finish instead of resubmitting

	// The lowest-addressed failure: its piece start, the bytes it moved, why.
	failLo  int
	failN   int
	failErr error
	broken  bool // the ring failed and must not be reused
}

// run issues the pieces and reaps them until all are done or one failed and
// the rest in flight have completed. It returns the bytes moved before the
// lowest-addressed failure: every piece below it completed, since pieces are
// issued in order and all of them are reaped before returning.
func (b *uringBatch) run() (int, error) {
	depth := b.pool.depth
	b.reqs = make([]uringReq, depth)
	b.free = make([]int, depth)
	for i := range b.free {
		b.free[i] = depth - 1 - i
	}
	b.failLo = len(b.p)
	maxBounce := max(1, min(depth, b.pool.bounceBytes/int(b.f.task)))

	for {
		// Fill free slots with new pieces, unless a piece failed.
		for b.failErr == nil && b.next < len(b.p) && len(b.free) > 0 {
			piece := b.p[b.next:min(b.next+int(b.f.task), len(b.p))]
			straight := addrAligned(piece, b.f.memAlign)
			if !straight && b.bounced >= maxBounce {
				break
			}
			b.start(piece, straight)
		}
		if b.inflight == 0 {
			break
		}
		b.notePeak()
		b.pool.submits.Add(1)
		if err := b.r.submit(1); err != nil {
			b.abort(err)
			break
		}
		b.r.reap(b.complete)
		for _, i := range b.retry {
			b.issue(i)
		}
		b.retry = b.retry[:0]
	}
	runtime.KeepAlive(b.reqs)
	if b.failErr != nil {
		return b.failLo + b.failN, b.failErr
	}
	return len(b.p), nil
}

// start takes a free slot for piece and issues it.
func (b *uringBatch) start(piece []byte, straight bool) {
	i := b.free[len(b.free)-1]
	b.free = b.free[:len(b.free)-1]
	s := &b.reqs[i]
	*s = uringReq{lo: b.next, user: piece, buf: piece}
	if !straight {
		s.bounce = b.f.bounce.get()
		s.buf = s.bounce.b[:len(piece)]
		if b.write {
			copy(s.buf, piece)
		}
		b.bounced++
	}
	b.inflight++
	b.next += len(piece)
	b.issue(i)
}

// issue prepares the SQE for what remains of slot i, at most maxIO bytes.
// The SQ has room: it holds at most the requests in flight, which are at
// most depth, no more than the ring's entries.
func (b *uringBatch) issue(i int) {
	s := &b.reqs[i]
	rest := s.buf[s.done:]
	rest = rest[:min(len(rest), b.pool.maxIO)]
	op := uint8(ioringOpRead)
	if b.write {
		op = ioringOpWrite
	}
	b.r.prep(op, s.flags, b.f.fd, rest, b.off+int64(s.lo+s.done), uint64(i))
}

// complete handles one CQE: res is the bytes moved or a negated errno.
func (b *uringBatch) complete(userData uint64, res int32) {
	i := int(userData)
	s := &b.reqs[i]
	switch {
	case res == -int32(unix.EINTR) || res == -int32(unix.EAGAIN):
		// Interrupted, or the non-blocking attempt could not proceed:
		// again, this time from a kernel worker that may block.
		s.flags |= iosqeAsync
		b.again(i, syscall.Errno(-res))
	case res < 0:
		b.finish(i, syscall.Errno(-res))
	case res == 0 && b.write:
		b.finish(i, io.ErrShortWrite)
	case res == 0:
		b.finish(i, io.EOF) // end of file; ReadAt reports ErrEOF
	default:
		s.done += int(res)
		switch {
		case s.done == len(s.buf):
			b.finish(i, nil)
		case !b.write && (b.off+int64(s.lo+s.done))%int64(b.f.offAlign) != 0:
			// O_DIRECT moves whole blocks except at the end of the file:
			// a read that stopped inside a block stopped at the end.
			b.finish(i, io.EOF)
		default:
			b.again(i, io.ErrUnexpectedEOF) // short transfer: issue the remainder
		}
	}
}

// again schedules slot i for resubmission after the current reap, or
// finishes it with err when the batch is aborting.
func (b *uringBatch) again(i int, err error) {
	if b.aborting {
		b.finish(i, err)
		return
	}
	b.retry = append(b.retry, i)
}

// finish ends slot i: the bounce buffer's bytes go to the caller (reads),
// the buffer goes back to its pool, a failure is recorded if it is the
// lowest so far, and the slot is freed.
func (b *uringBatch) finish(i int, err error) {
	s := &b.reqs[i]
	if s.bounce != nil {
		if !b.write {
			copy(s.user, s.buf[:s.done])
		}
		b.f.bounce.put(s.bounce)
		b.bounced--
	}
	if err != nil && s.lo < b.failLo {
		b.failLo, b.failN, b.failErr = s.lo, s.done, err
	}
	*s = uringReq{}
	b.free = append(b.free, i)
	b.inflight--
}

// abort handles a failed io_uring_enter: SQEs the kernel never consumed are
// withdrawn and fail with err; requests already in the kernel's hands are
// waited for, since their memory must not be reused before they complete.
// The ring is not reused. If even waiting fails, their buffers are kept
// reachable for the life of the process (uringOrphans) instead of letting
// the kernel write into memory the garbage collector has handed out again.
func (b *uringBatch) abort(err error) {
	b.broken, b.aborting = true, true
	for _, ud := range b.r.retract() {
		b.finish(int(ud), err)
	}
	for b.inflight > 0 {
		if werr := b.r.submit(1); werr != nil {
			uringOrphans.Lock()
			uringOrphans.batches = append(uringOrphans.batches, b.reqs)
			uringOrphans.Unlock()
			// Nothing is known of the requests still out: count only what
			// lies below the lowest of them.
			for i := range b.reqs {
				if s := &b.reqs[i]; s.buf != nil && s.lo < b.failLo {
					b.failLo, b.failN, b.failErr = s.lo, 0, werr
				}
			}
			return
		}
		b.r.reap(b.complete)
	}
	// Everything issued has been reaped; pieces not yet started fail.
	if b.next < b.failLo {
		b.failLo, b.failN, b.failErr = b.next, 0, err
	}
}

// uringOrphans holds the buffers of requests a broken ring may still be
// moving. Never expected to be used.
var uringOrphans struct {
	sync.Mutex
	batches [][]uringReq
}

// notePeak records the requests in flight in the pool's peak counter.
func (b *uringBatch) notePeak() {
	for {
		old := b.pool.peak.Load()
		if int32(b.inflight) <= old || b.pool.peak.CompareAndSwap(old, int32(b.inflight)) {
			return
		}
	}
}
