package gds

import (
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Mmap is the read-only memory-mapped engine: the file is mapped once at
// open and reads copy out of the mapping, split across goroutines. Writes
// return ErrUnsupported. A file truncated by someone else while mapped gives
// an error, not a crash (SIGBUS becomes a recovered fault).
type Mmap struct{ opts Options }

// NewMmap returns the mmap engine with the given options.
func NewMmap(opts Options) *Mmap { return &Mmap{opts: opts.withDefaults()} }

func init() {
	register("mmap", func(o Options) (Engine, error) { return NewMmap(o), nil })
}

// Name implements Engine.
func (e *Mmap) Name() string { return "mmap" }

// Open implements Engine. The file is always opened read-only; the mapping
// covers its length at open.
func (e *Mmap) Open(path string, flag int, perm os.FileMode) (File, error) {
	name := e.opts.nameFor(path)
	if flag&(os.O_WRONLY|os.O_RDWR|os.O_CREATE|os.O_TRUNC) != 0 {
		return nil, opErr("mmap", "open", name, 0, 0, 0, fmt.Errorf("%w: mmap opens files for reading only", ErrUnsupported))
	}
	fd, err := openFD(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, opErr("mmap", "open", name, 0, 0, 0, err)
	}
	defer unix.Close(fd) // the mapping outlives the descriptor
	size, err := fdSize("mmap", fd, name)
	if err != nil {
		return nil, err
	}
	f := &mmapFile{path: name, opts: e.opts, size: size}
	if size > 0 {
		f.data, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return nil, opErr("mmap", "mmap", name, 0, int(size), 0, err)
		}
	}
	return f, nil
}

type mmapFile struct {
	path   string
	opts   Options
	data   []byte
	size   int64
	closed atomic.Bool
}

var _ File = (*mmapFile)(nil)

func (f *mmapFile) ReadAt(p []byte, off int64) (int, error) {
	if f.closed.Load() {
		return 0, opErr("mmap", "read", f.path, off, len(p), 0, ErrClosed)
	}
	if err := checkRange(p, off); err != nil {
		return 0, opErr("mmap", "read", f.path, off, len(p), 0, err)
	}
	n, err := readClamped(p, off, f.size, func(want []byte) (int, error) {
		return splitRun(len(want), f.opts.TaskSize, f.opts.Threads, func(lo, hi int) (int, error) {
			return f.copyOut(want[lo:hi], off+int64(lo))
		})
	})
	if err != nil {
		return n, opErr("mmap", "read", f.path, off, len(p), n, err)
	}
	return n, nil
}

// copyOut copies from the mapping. A fault (the file shrank under the
// mapping) is recovered and reported as a read past the end of the file.
func (f *mmapFile) copyOut(p []byte, off int64) (n int, err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			n, err = 0, fmt.Errorf("%w: fault in mapping (file truncated while mapped?): %v", ErrEOF, r)
		}
	}()
	return copy(p, f.data[off:off+int64(len(p))]), nil
}

func (f *mmapFile) WriteAt(p []byte, off int64) (int, error) {
	return 0, opErr("mmap", "write", f.path, off, len(p), 0, ErrUnsupported)
}

func (f *mmapFile) Sync() error {
	if f.closed.Load() {
		return opErr("mmap", "sync", f.path, 0, 0, 0, ErrClosed)
	}
	return nil
}

func (f *mmapFile) Size() (int64, error) {
	if f.closed.Load() {
		return 0, opErr("mmap", "stat", f.path, 0, 0, 0, ErrClosed)
	}
	return f.size, nil
}

func (f *mmapFile) Truncate(size int64) error {
	if f.closed.Load() {
		return opErr("mmap", "truncate", f.path, size, 0, 0, ErrClosed)
	}
	return opErr("mmap", "truncate", f.path, size, 0, 0, ErrUnsupported)
}

func (f *mmapFile) Close() error {
	if f.closed.Swap(true) {
		return opErr("mmap", "close", f.path, 0, 0, 0, ErrClosed)
	}
	if f.data != nil {
		if err := unix.Munmap(f.data); err != nil {
			return opErr("mmap", "munmap", f.path, 0, 0, 0, err)
		}
	}
	return nil
}

func (f *mmapFile) Path() string     { return f.path }
func (f *mmapFile) Engine() string   { return "mmap" }
func (f *mmapFile) Fallback() string { return "" }
