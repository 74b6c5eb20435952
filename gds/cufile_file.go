package gds

import (
	"errors"
	"io"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cufileFile is an open file of the cufile engine.
type cufileFile struct {
	fd     int
	fh     uintptr // cuFile's handle for fd
	dev    uint64  // the filesystem's device number, for its cuFile verdict
	path   string
	opts   Options
	lib    *cufileLib
	closed atomic.Bool
}

var _ File = (*cufileFile)(nil)

func (f *cufileFile) Path() string     { return f.path }
func (f *cufileFile) Engine() string   { return "cufile" }
func (f *cufileFile) Fallback() string { return "" }

func (f *cufileFile) check(op string, p []byte, off int64) error {
	if f.closed.Load() {
		return opErr("cufile", op, f.path, off, len(p), 0, ErrClosed)
	}
	if err := checkRange(p, off); err != nil {
		return opErr("cufile", op, f.path, off, len(p), 0, err)
	}
	return nil
}

// ReadAt implements File. The read is clamped to the file's size first, so
// the count returned with ErrEOF is that of the bytes before the end.
func (f *cufileFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check("read", p, off); err != nil || len(p) == 0 {
		return 0, err
	}
	size, err := fdSize("cufile", f.fd, f.path)
	if err != nil {
		return 0, err
	}
	n, err := readClamped(p, off, size, func(want []byte) (int, error) { return f.transfer(false, want, off) })
	if err != nil {
		return n, f.failed(opErr("cufile", "read", f.path, off, len(p), n, err))
	}
	return n, nil
}

// WriteAt implements File.
func (f *cufileFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check("write", p, off); err != nil || len(p) == 0 {
		return 0, err
	}
	n, err := f.transfer(true, p, off)
	if err != nil {
		return n, f.failed(opErr("cufile", "write", f.path, off, len(p), n, err))
	}
	return n, nil
}

// failed records a cuFile status among a transfer's errors as the
// filesystem's verdict (cuFile does not work there), and returns err.
func (f *cufileFile) failed(err error) error {
	var ce *CuFileError
	if errors.As(err, &ce) {
		f.lib.fs.fail(f.dev, err.Error())
	}
	return err
}

// transfer moves p at off in task-sized pieces across the engine's
// threads. Every piece names the same buffer base, the start of p (or of
// the registered buffer holding p), and its own offset from it.
func (f *cufileFile) transfer(write bool, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	delta := f.lib.bufs.locate(p)
	base := unsafe.Add(unsafe.Pointer(unsafe.SliceData(p)), -delta)
	return splitRun(len(p), f.opts.TaskSize, f.opts.Threads, func(lo, hi int) (int, error) {
		return f.piece(write, base, delta+int64(lo), hi-lo, off+int64(lo))
	})
}

// piece moves n bytes between file offset off and base+bufOff, looping on
// short transfers until done.
func (f *cufileFile) piece(write bool, base unsafe.Pointer, bufOff int64, n int, off int64) (int, error) {
	call := "cuFileRead"
	if write {
		call = "cuFileWrite"
	}
	done := 0
	for done < n {
		r, errno := f.lib.shim.transfer(write, f.fh, base, n-done, off+int64(done), bufOff+int64(done))
		switch {
		case r > 0:
			done += int(r)
		case r == 0 && write:
			return done, io.ErrShortWrite // no progress: do not spin
		case r == 0:
			return done, ErrEOF // the file shrank under the read
		case r == -1 && errno == unix.EINTR:
		case r == -1:
			return done, errno
		case -r > cuFileOpErrBase:
			return done, &CuFileError{Call: call, Code: int(-r)}
		default: // a negated errno, which some paths of libcufile return
			return done, unix.Errno(-r)
		}
	}
	return done, nil
}

// Sync implements File: fsync of the descriptor.
func (f *cufileFile) Sync() error {
	if f.closed.Load() {
		return opErr("cufile", "sync", f.path, 0, 0, 0, ErrClosed)
	}
	if err := unix.Fsync(f.fd); err != nil {
		return opErr("cufile", "sync", f.path, 0, 0, 0, err)
	}
	return nil
}

// Size implements File.
func (f *cufileFile) Size() (int64, error) {
	if f.closed.Load() {
		return 0, opErr("cufile", "stat", f.path, 0, 0, 0, ErrClosed)
	}
	return fdSize("cufile", f.fd, f.path)
}

// Truncate implements File.
func (f *cufileFile) Truncate(size int64) error {
	if f.closed.Load() { // its descriptor number may be another file's now
		return opErr("cufile", "truncate", f.path, size, 0, 0, ErrClosed)
	}
	if err := unix.Ftruncate(f.fd, size); err != nil {
		return opErr("cufile", "truncate", f.path, size, 0, 0, err)
	}
	return nil
}

// Close implements File: the cuFile handle is deregistered, then the
// descriptor closed.
func (f *cufileFile) Close() error {
	if f.closed.Swap(true) {
		return opErr("cufile", "close", f.path, 0, 0, 0, ErrClosed)
	}
	f.lib.shim.handleDeregister(f.fh)
	if err := unix.Close(f.fd); err != nil {
		return opErr("cufile", "close", f.path, 0, 0, 0, err)
	}
	return nil
}
