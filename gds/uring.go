package gds

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Uring is the io_uring engine: the direct (O_DIRECT) engine with its
// aligned middle submitted through io_uring instead of pread/pwrite on a
// pool of goroutines. Opening, the unaligned edges, size bookkeeping and the
// fallback for filesystems without O_DIRECT are the direct engine's
// (direct.go); only the middle differs (uringMiddle below).
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

// ringPool is the rings of one open file (directFile.ring). Safe for
// concurrent use.
type ringPool struct {
	depth int // requests in flight per ring (Options.QueueDepth)
	max   int // rings at most (Options.Threads)
	// Limits, lowered by tests: bytes per request (uringMaxIO) and bounce
	// bytes in flight per transfer (uringBounceBytes).
	maxIO, bounceBytes int

	mu     sync.Mutex
	cond   sync.Cond // signalled when a ring is returned or discarded
	free   []*ioRing
	count  int // rings in existence, free or in use
	closed bool

	// Counters for tests and diagnostics.
	peak    atomic.Int32 // most requests in flight on one ring
	submits atomic.Int64 // io_uring_enter rounds (submit and wait)
}

func newRingPool(o Options) *ringPool {
	p := &ringPool{depth: min(max(o.QueueDepth, 1), uringMaxDepth), max: max(o.Threads, 1),
		maxIO: uringMaxIO, bounceBytes: uringBounceBytes}
	p.cond.L = &p.mu
	return p
}

// get takes a free ring, creates one while there are fewer than max, or
// waits for one to be returned.
func (p *ringPool) get() (*ioRing, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	createFailed := false
	for {
		if p.closed {
			return nil, ErrClosed
		}
		if n := len(p.free); n > 0 {
			r := p.free[n-1]
			p.free = p.free[:n-1]
			return r, nil
		}
		if p.count < p.max && !createFailed {
			p.count++
			p.mu.Unlock()
			r, err := newIORing(uint32(p.depth))
			p.mu.Lock()
			if err == nil {
				return r, nil
			}
			p.count--
			if p.count == 0 {
				return nil, err
			}
			createFailed = true // other rings exist (EMFILE, say): wait for one
		}
		p.cond.Wait()
	}
}

// put returns a ring after use. A broken ring, or any ring once the pool is
// closed, is closed instead.
func (p *ringPool) put(r *ioRing, broken bool) {
	p.mu.Lock()
	if p.closed || broken {
		p.count--
		p.mu.Unlock()
		r.Close()
	} else {
		p.free = append(p.free, r)
		p.mu.Unlock()
	}
	p.cond.Signal()
}

// Close releases every idle ring; a ring still in use (a transfer racing
// Close, which the File contract forbids) is released when it is returned.
// Later transfers get ErrClosed.
func (p *ringPool) Close() error {
	p.mu.Lock()
	p.closed = true
	free := p.free
	p.free = nil
	p.count -= len(free)
	p.mu.Unlock()
	p.cond.Broadcast()
	var errs []error
	for _, r := range free {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}

// uringMiddle is the uring engine's middleFunc: it moves the aligned middle
// p at off through one ring of the file's pool.
func uringMiddle(f *directFile, write bool, p []byte, off int64) (int, error) {
	pool := f.ring.(*ringPool)
	r, err := pool.get()
	if err != nil {
		return 0, err
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

// Availability.

var uringProbe struct {
	once   sync.Once
	ok     bool
	reason string
}

// ProbeUring reports whether io_uring works in this process and, when it
// does not, why in words. It sets up a ring and moves one byte through a
// memory file with IORING_OP_WRITE and IORING_OP_READ (Linux 5.6), once; the
// answer is cached.
func ProbeUring() (ok bool, reason string) {
	uringProbe.once.Do(func() {
		err := probeUring()
		uringProbe.ok = err == nil
		if err != nil {
			uringProbe.reason = err.Error()
		}
	})
	return uringProbe.ok, uringProbe.reason
}

func probeUring() error {
	r, err := newIORing(4)
	if err != nil {
		return explainSetup(err)
	}
	defer r.Close()

	fd, err := unix.MemfdCreate("pyfastensor-uring-probe", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("memfd_create for the io_uring probe: %w", err)
	}
	defer unix.Close(fd)

	one := func(op uint8, name string, buf []byte) error {
		r.prep(op, 0, fd, buf, 0, uint64(op))
		res, got := int32(0), false
		for !got {
			if err := r.submit(1); err != nil {
				return err
			}
			r.reap(func(_ uint64, rs int32) { res, got = rs, true })
		}
		switch {
		case res == -int32(unix.EINVAL) && op != ioringOpNop:
			return fmt.Errorf("io_uring %s: %w (the kernel predates Linux 5.6?)", name, unix.EINVAL)
		case res < 0:
			return fmt.Errorf("io_uring %s: %w", name, syscall.Errno(-res))
		case res != int32(len(buf)):
			return fmt.Errorf("io_uring %s moved %d bytes of %d", name, res, len(buf))
		}
		return nil
	}
	in, out := []byte{0x5a}, []byte{0}
	if err := one(ioringOpNop, "NOP", nil); err != nil {
		return err
	}
	if err := one(ioringOpWrite, "IORING_OP_WRITE", in); err != nil {
		return err
	}
	if err := one(ioringOpRead, "IORING_OP_READ", out); err != nil {
		return err
	}
	if out[0] != in[0] {
		return errors.New("io_uring read back a different byte than it wrote")
	}
	return nil
}

// explainSetup adds the likely cause to an io_uring_setup failure.
func explainSetup(err error) error {
	switch {
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%w (kernel without io_uring, or a seccomp filter answering ENOSYS)", err)
	case errors.Is(err, unix.EPERM):
		v, rerr := os.ReadFile("/proc/sys/kernel/io_uring_disabled")
		switch s := strings.TrimSpace(string(v)); {
		case rerr == nil && s == "2":
			return fmt.Errorf("%w (kernel.io_uring_disabled=2)", err)
		case rerr == nil && s == "1":
			return fmt.Errorf("%w (kernel.io_uring_disabled=1 and this process is not in kernel.io_uring_group)", err)
		}
		return fmt.Errorf("%w (a seccomp filter, such as a container runtime's, may block io_uring)", err)
	case errors.Is(err, unix.ENOMEM):
		return fmt.Errorf("%w (locked-memory limit too low? see ulimit -l)", err)
	}
	return err
}
