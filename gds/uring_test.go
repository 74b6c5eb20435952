package gds

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Tests of the io_uring engine beyond the contract (contract_test.go): queue
// depth, resubmission of short transfers, the ring pool, and release of the
// rings on Close.

// newUringOrSkip returns the uring engine, or skips the test with the
// reason io_uring does not work here.
func newUringOrSkip(t *testing.T, opts Options) *Uring {
	t.Helper()
	if ok, reason := ProbeUring(); !ok {
		t.Skipf("io_uring unavailable: %s", reason)
	}
	e, err := NewUring(opts)
	require.NoError(t, err)
	return e
}

// openUring opens path with e and returns the direct file behind it, or
// skips when the filesystem falls back to posix. The file is closed at the
// end of the test if the test did not close it.
func openUring(t *testing.T, e *Uring, path string, flag int) *directFile {
	t.Helper()
	f, err := e.Open(path, flag, 0o644)
	require.NoError(t, err)
	df, ok := f.(*directFile)
	if !ok {
		f.Close()
		t.Skipf("no O_DIRECT in %s: %s", filepath.Dir(path), f.Fallback())
	}
	t.Cleanup(func() { _ = df.Close() })
	return df
}

func poolOf(f *directFile) *ringPool { return f.ring.(*ringPool) }

// aligned returns a copy of p at a 4 KiB-aligned address.
func aligned(p []byte) []byte {
	buf := alignedBuf(len(p), 4096)
	copy(buf, p)
	return buf
}

// roundTrip writes want at off from src's kind of memory and reads it back
// into the same kind, checking every byte.
func roundTrip(t *testing.T, f *directFile, want []byte, off int64, memory func([]byte) []byte) {
	t.Helper()
	n, err := f.WriteAt(memory(want), off)
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	got := memory(make([]byte, len(want)))
	n, err = f.ReadAt(got, off)
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	require.True(t, bytes.Equal(want, got), "read back differs")
}

func TestProbeUring(t *testing.T) {
	ok, reason := ProbeUring()
	t.Logf("ProbeUring on this machine: ok=%v reason=%q", ok, reason)
	ok2, reason2 := ProbeUring()
	assert.Equal(t, ok, ok2, "the answer is cached")
	assert.Equal(t, reason, reason2)
	assert.Equal(t, ok, reason == "", "a reason exactly when unavailable")

	e, err := New("uring", Options{})
	if ok {
		require.NoError(t, err)
		assert.Equal(t, "uring", e.Name())
	} else {
		require.ErrorIs(t, err, ErrUnavailable)
		assert.Contains(t, err.Error(), reason)
	}

	v, _ := os.ReadFile("/proc/sys/kernel/io_uring_disabled")
	switch strings.TrimSpace(string(v)) {
	case "2":
		assert.False(t, ok)
		assert.Contains(t, reason, "io_uring_disabled=2")
	case "0":
		// Enabled by the kernel: only a seccomp filter can still refuse.
		if !ok {
			assert.Contains(t, reason, "seccomp")
		}
	}
}

func TestUringQueueDepthSmallerThanPieces(t *testing.T) {
	const pieces = 40
	for _, depth := range []int{2, 32} {
		t.Run(fmt.Sprintf("depth%d", depth), func(t *testing.T) {
			e := newUringOrSkip(t, Options{QueueDepth: depth, TaskSize: 64 << 10, Threads: 2})
			f := openUring(t, e, filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE)
			pool := poolOf(f)
			want := testutil.Pattern(pieces*int(f.task), uint64(depth))

			// Offset 0 and a whole number of tasks: all middle, no edges.
			before := pool.submits.Load()
			roundTrip(t, f, want, 0, aligned)
			rounds := pool.submits.Load() - before
			// The peak is taken just before io_uring_enter: depth SQEs went
			// to the kernel in one call, and never more.
			assert.Equal(t, int32(depth), pool.peak.Load(), "requests in flight reach the queue depth and never exceed it")
			// Each io_uring_enter round has at most depth requests out.
			assert.GreaterOrEqual(t, rounds, int64(2*pieces/depth), "write + read")
			// Through bounce buffers (memory 1 byte past alignment).
			roundTrip(t, f, want, 0, unaligned)
			// Unaligned offset: edges on the direct path, middle on the ring.
			roundTrip(t, f, want[:len(want)-5], 4099, unaligned)
		})
	}
}

func TestUringBounceBuffersInFlightAreBounded(t *testing.T) {
	e := newUringOrSkip(t, Options{QueueDepth: 8, TaskSize: 64 << 10, Threads: 1})
	f := openUring(t, e, filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE)
	pool := poolOf(f)
	pool.bounceBytes = 2 * int(f.task)
	want := testutil.Pattern(20*int(f.task), 9)

	roundTrip(t, f, want, 0, unaligned)
	assert.Equal(t, int32(2), pool.peak.Load(), "at most bounceBytes of bounce buffers in flight")
	roundTrip(t, f, want, 0, aligned)
	assert.Equal(t, int32(8), pool.peak.Load(), "aligned memory needs no bounce buffer")
}

func TestUringShortTransfersAreResubmitted(t *testing.T) {
	e := newUringOrSkip(t, Options{QueueDepth: 4, TaskSize: 64 << 10, Threads: 1})
	f := openUring(t, e, filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE)
	pool := poolOf(f)
	// One request moves at most one block: every piece takes many rounds.
	pool.maxIO = f.offAlign
	want := testutil.Pattern(8*int(f.task), 21)
	before := pool.submits.Load()
	roundTrip(t, f, want, 0, aligned)
	roundTrip(t, f, want, 0, unaligned)
	perPiece := int(f.task) / f.offAlign
	assert.GreaterOrEqual(t, pool.submits.Load()-before, int64(4*perPiece), "each piece's remainder was resubmitted")

	disk, err := os.ReadFile(f.path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, disk))
}

func TestUringShortReadAtEndOfFile(t *testing.T) {
	// ReadAt stops at the file's size, so the middle itself is called here
	// with a range that crosses the end: the piece holding the end comes
	// back short, and the read reports the bytes before it and io.EOF.
	e := newUringOrSkip(t, Options{QueueDepth: 4, TaskSize: 8192, Threads: 1})
	path := filepath.Join(t.TempDir(), "f")
	want := testutil.Pattern(10000, 4)
	require.NoError(t, os.WriteFile(path, want, 0o644))
	f := openUring(t, e, path, os.O_RDONLY)
	if f.offAlign > 8192 {
		t.Skipf("offset alignment %d leaves no block boundary before the end", f.offAlign)
	}
	for name, memory := range map[string]func([]byte) []byte{"aligned": aligned, "unaligned": unaligned} {
		t.Run(name, func(t *testing.T) {
			buf := memory(make([]byte, 4*int(f.task)))
			n, err := f.middle(f, false, buf, 0)
			require.ErrorIs(t, err, io.EOF)
			require.Equal(t, len(want), n)
			require.True(t, bytes.Equal(want, buf[:n]))
		})
	}
}

func TestUringRingPoolUnderConcurrentCallers(t *testing.T) {
	const callers, perCaller = 16, 4
	e := newUringOrSkip(t, Options{QueueDepth: 4, TaskSize: 64 << 10, Threads: 2})
	f := openUring(t, e, filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE)
	pool := poolOf(f)
	ext := perCaller * int(f.task)
	want := testutil.Pattern(callers*ext, 33)

	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Odd callers write from unaligned memory (bounce buffers).
			lo, hi := i*ext, (i+1)*ext
			src := aligned(want[lo:hi])
			if i%2 == 1 {
				src = unaligned(want[lo:hi])
			}
			_, err := f.WriteAt(src, int64(lo))
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	// Read back in extents shifted by 0..2 bytes, so that neighbours share
	// blocks and every reader has unaligned edges around its middle.
	got := make([]byte, len(want))
	bound := func(i int) int {
		if i == 0 || i == callers {
			return i * ext
		}
		return i*ext + i%3
	}
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lo, hi := bound(i), bound(i+1)
			_, err := f.ReadAt(got[lo:hi], int64(lo))
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	require.True(t, bytes.Equal(want, got))

	pool.mu.Lock()
	defer pool.mu.Unlock()
	assert.LessOrEqual(t, pool.count, 2, "no more rings than Threads")
	assert.Positive(t, pool.count)
	assert.Len(t, pool.free, pool.count, "every ring was given back")
}

// uringFDs counts this process's descriptors, and those that are io_uring
// instances.
func uringFDs(t *testing.T) (all, rings int) {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, d := range entries {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", d.Name())); err == nil && strings.Contains(target, "io_uring") {
			rings++
		}
	}
	return len(entries), rings
}

func TestUringCloseReleasesRings(t *testing.T) {
	e := newUringOrSkip(t, Options{QueueDepth: 4, TaskSize: 64 << 10, Threads: 4})
	path := filepath.Join(t.TempDir(), "f")
	uringFDs(t) // the first directory read may set up the runtime's poller
	allBefore, ringsBefore := uringFDs(t)

	f, err := e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	df, ok := f.(*directFile)
	if !ok {
		f.Close()
		t.Skipf("no O_DIRECT here: %s", f.Fallback())
	}
	want := testutil.Pattern(8*int(df.task), 8)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lo, hi := i*int(df.task), (i+1)*int(df.task)
			for range 5 {
				_, err := f.WriteAt(want[lo:hi], int64(lo))
				assert.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	pool := poolOf(df)
	pool.mu.Lock()
	rings := pool.count
	pool.mu.Unlock()
	require.Positive(t, rings)
	all, open := uringFDs(t)
	assert.Equal(t, ringsBefore+rings, open, "one descriptor per ring")
	assert.Equal(t, allBefore+1+rings, all, "the file and its rings")

	require.NoError(t, f.Close())
	all, open = uringFDs(t)
	assert.Equal(t, ringsBefore, open, "Close releases every ring")
	assert.Equal(t, allBefore, all, "no descriptor leaks")

	_, err = f.WriteAt(want, 0)
	require.ErrorIs(t, err, ErrClosed)
	_, err = pool.get()
	require.ErrorIs(t, err, ErrClosed, "the pool makes no rings after Close")
}

func TestUringCompletionErrorNamesEngine(t *testing.T) {
	// A write on a read-only descriptor fails in its CQE (-EBADF); the error
	// keeps the errno and names the engine, path and offset.
	e := newUringOrSkip(t, Options{QueueDepth: 4, TaskSize: 64 << 10, Threads: 1})
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, nil, 0o644))
	f := openUring(t, e, path, os.O_RDONLY)
	n, err := f.WriteAt(aligned(testutil.Pattern(4*int(f.task), 1)), 0)
	require.Error(t, err)
	assert.Equal(t, 0, n)
	require.ErrorIs(t, err, unix.EBADF)
	var op *OpError
	require.True(t, errors.As(err, &op))
	assert.Equal(t, "uring", op.Engine)
	assert.True(t, strings.HasPrefix(err.Error(), "uring: write "+path+" at 0: "), err.Error())
}

func TestUringSetupFailuresAreExplained(t *testing.T) {
	err := explainSetup(fmt.Errorf("io_uring_setup: %w", unix.ENOSYS))
	require.ErrorIs(t, err, unix.ENOSYS)
	assert.Equal(t, "io_uring_setup: function not implemented (kernel without io_uring, or a seccomp filter answering ENOSYS)", err.Error())

	err = explainSetup(fmt.Errorf("io_uring_setup: %w", unix.EPERM))
	require.ErrorIs(t, err, unix.EPERM)
	assert.True(t, strings.HasPrefix(err.Error(), "io_uring_setup: operation not permitted ("), err.Error())
	v, _ := os.ReadFile("/proc/sys/kernel/io_uring_disabled")
	if s := strings.TrimSpace(string(v)); s == "1" || s == "2" {
		assert.Contains(t, err.Error(), "kernel.io_uring_disabled="+s)
	} else {
		assert.Contains(t, err.Error(), "seccomp")
	}
}

func TestUringFailedSubmitWithdrawsRequests(t *testing.T) {
	// When io_uring_enter itself fails, the SQEs it did not take are
	// withdrawn, the transfer fails with nothing done, and the ring is
	// discarded rather than reused.
	e := newUringOrSkip(t, Options{QueueDepth: 4, TaskSize: 64 << 10, Threads: 1})
	f := openUring(t, e, filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE)
	pool := poolOf(f)
	r, err := pool.get()
	require.NoError(t, err)
	ringFD := r.fd
	r.fd = -1 // every io_uring_enter now fails with EBADF
	b := &uringBatch{f: f, pool: pool, r: r, write: true, p: aligned(testutil.Pattern(8*int(f.task), 2))}
	n, err := b.run()
	r.fd = ringFD
	require.ErrorIs(t, err, unix.EBADF)
	assert.Contains(t, err.Error(), "io_uring_enter")
	assert.Equal(t, 0, n)
	assert.True(t, b.broken)
	assert.Zero(t, b.inflight)
	assert.Zero(t, r.pending)
	assert.Equal(t, atomic.LoadUint32(r.sqHead), atomic.LoadUint32(r.sqTail), "the SQ is empty again")

	pool.put(r, b.broken)
	pool.mu.Lock()
	assert.Zero(t, pool.count, "a broken ring is closed, not pooled")
	pool.mu.Unlock()
	// The next transfer gets a fresh ring.
	roundTrip(t, f, testutil.Pattern(8*int(f.task), 3), 0, aligned)
}

func TestUringWaiterOfAFailedCreationRetriesOnceNoRingIsLeft(t *testing.T) {
	// A caller whose ring creation failed (EMFILE) while another ring was in
	// use waits for it; that ring then comes back broken and is discarded.
	// The waiter must create a ring (or fail), not wait for one that no
	// longer exists.
	if ok, reason := ProbeUring(); !ok {
		t.Skipf("io_uring unavailable: %s", reason)
	}
	p := newRingPool(Options{Threads: 2, QueueDepth: 4})
	defer p.Close()
	a, err := p.get()
	require.NoError(t, err)
	emfile := func(uint32) (*ioRing, error) { return nil, syscall.EMFILE }
	p.mu.Lock()
	p.open = emfile
	p.mu.Unlock()
	got := make(chan error, 1)
	go func() {
		r, err := p.get()
		if r != nil {
			p.put(r, false)
		}
		got <- err
	}()
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.waiting == 1
	}, 10*time.Second, time.Millisecond, "the second caller waits after its creation failed")
	p.mu.Lock()
	p.open = newIORing // descriptors free again
	p.mu.Unlock()
	p.put(a, true)
	select {
	case err := <-got:
		require.NoError(t, err, "the waiter created a ring once none was left")
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter still waits for a ring that was discarded")
	}
}

func TestUringTransfersWithoutARingGoThroughThreads(t *testing.T) {
	// No ring can be set up at the first transfer (EMFILE, ENOMEM under
	// pressure, though the probe's ring worked): the transfer still moves
	// its bytes, through the threaded O_DIRECT path.
	e := newUringOrSkip(t, Options{QueueDepth: 4, TaskSize: 64 << 10, Threads: 2})
	f := openUring(t, e, filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE)
	pool := poolOf(f)
	pool.mu.Lock()
	pool.open = func(uint32) (*ioRing, error) { return nil, syscall.EMFILE }
	pool.mu.Unlock()
	want := testutil.Pattern(300<<10+5, 9)
	n, err := f.WriteAt(want, 7)
	require.NoError(t, err)
	assert.Equal(t, len(want), n)
	got := make([]byte, len(want))
	n, err = f.ReadAt(got, 7)
	require.NoError(t, err)
	assert.Equal(t, len(want), n)
	assert.True(t, bytes.Equal(want, got))
	pool.mu.Lock()
	assert.Zero(t, pool.count, "no ring was made")
	pool.mu.Unlock()
}
