package gds

import (
	"errors"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Posix is the buffered engine: pread/pwrite through the page cache, split
// across goroutines by task size.
type Posix struct{ opts Options }

// NewPosix returns the posix engine with the given options.
func NewPosix(opts Options) *Posix { return &Posix{opts: opts.withDefaults()} }

// Name implements Engine.
func (e *Posix) Name() string { return "posix" }

// Open implements Engine.
func (e *Posix) Open(path string, flag int, perm os.FileMode) (File, error) {
	fd, err := openFD(path, flag, uint32(perm.Perm()))
	if err != nil {
		return nil, opErr("posix", "open", e.opts.nameFor(path), 0, 0, 0, err)
	}
	return &posixFile{fd: fd, path: e.opts.nameFor(path), opts: e.opts}, nil
}

// posixFile is an open file of the posix engine. It also serves the direct
// and uring engines after they fall back (fallback says why).
type posixFile struct {
	fd       int
	path     string
	opts     Options
	fallback string
	closed   atomic.Bool
}

var _ File = (*posixFile)(nil)

func (f *posixFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check("read", p, off); err != nil {
		return 0, err
	}
	n, err := splitRun(len(p), f.opts.TaskSize, f.opts.Threads, func(lo, hi int) (int, error) {
		return preadFull(f.fd, p[lo:hi], off+int64(lo))
	})
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = ErrEOF
		}
		return n, opErr("posix", "read", f.path, off, len(p), n, err)
	}
	return n, nil
}

func (f *posixFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check("write", p, off); err != nil {
		return 0, err
	}
	n, err := splitRun(len(p), f.opts.TaskSize, f.opts.Threads, func(lo, hi int) (int, error) {
		return pwriteFull(f.fd, p[lo:hi], off+int64(lo))
	})
	if err != nil {
		return n, opErr("posix", "write", f.path, off, len(p), n, err)
	}
	return n, nil
}

func (f *posixFile) check(op string, p []byte, off int64) error {
	if f.closed.Load() {
		return opErr("posix", op, f.path, off, len(p), 0, ErrClosed)
	}
	if err := checkRange(p, off); err != nil {
		return opErr("posix", op, f.path, off, len(p), 0, err)
	}
	return nil
}

func (f *posixFile) Sync() error {
	if f.closed.Load() {
		return opErr("posix", "sync", f.path, 0, 0, 0, ErrClosed)
	}
	if err := unix.Fsync(f.fd); err != nil {
		return opErr("posix", "sync", f.path, 0, 0, 0, err)
	}
	return nil
}

func (f *posixFile) Size() (int64, error) {
	if f.closed.Load() { // its descriptor number may be another file's now
		return 0, opErr("posix", "stat", f.path, 0, 0, 0, ErrClosed)
	}
	return fdSize("posix", f.fd, f.path)
}

func (f *posixFile) Truncate(size int64) error {
	if f.closed.Load() {
		return opErr("posix", "truncate", f.path, size, 0, 0, ErrClosed)
	}
	if err := unix.Ftruncate(f.fd, size); err != nil {
		return opErr("posix", "truncate", f.path, size, 0, 0, err)
	}
	return nil
}

func (f *posixFile) Close() error {
	if f.closed.Swap(true) {
		return opErr("posix", "close", f.path, 0, 0, 0, ErrClosed)
	}
	if err := unix.Close(f.fd); err != nil {
		return opErr("posix", "close", f.path, 0, 0, 0, err)
	}
	return nil
}

func (f *posixFile) Path() string     { return f.path }
func (f *posixFile) Engine() string   { return "posix" }
func (f *posixFile) Fallback() string { return f.fallback }

// fdSize returns the length of the open file fd.
func fdSize(engine string, fd int, path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, opErr(engine, "stat", path, 0, 0, 0, err)
	}
	return st.Size, nil
}
