package gds

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime/debug"
	"syscall"
)

// Named errors. Every error an engine returns wraps one of these (where one
// applies) and an *OpError naming the engine, path and offset, so callers can
// test with errors.Is and still print a useful message.
var (
	// ErrInvalid: a bad argument (negative offset, offset+length overflow,
	// nil memory with non-zero length, unknown engine).
	ErrInvalid = errors.New("invalid argument")
	// ErrEOF: a read reached the end of the file before filling the buffer.
	ErrEOF = errors.New("read past end of file")
	// ErrNoSpace: the filesystem is full (ENOSPC or EDQUOT).
	ErrNoSpace = errors.New("no space left on device")
	// ErrNoDirectIO: the filesystem refuses O_DIRECT (EINVAL on open).
	ErrNoDirectIO = errors.New("filesystem does not support O_DIRECT")
	// ErrUnavailable: the engine cannot work on this machine (no io_uring,
	// no libcufile, no NVIDIA driver). The message says why.
	ErrUnavailable = errors.New("engine unavailable")
	// ErrUnsupported: the engine does not do this operation (mmap writes).
	ErrUnsupported = errors.New("operation not supported by this engine")
	// ErrInternal: a bug in pyfastensor (a recovered panic in a worker).
	ErrInternal = errors.New("internal error")
	// ErrClosed: the file was already closed.
	ErrClosed = errors.New("file already closed")
	// ErrCorrupt: data failed a check (a CRC-32, a format's structure).
	// No engine returns it; the formats above name their own corruption
	// as a kind of it (Named), so the C boundary maps every one alike.
	ErrCorrupt = errors.New("corrupt data")
)

// Named returns a named error of its own with text msg that errors.Is
// also matches to kind, one of the errors above: the packages above the
// engines define their named errors as kinds of these, and the C boundary
// maps them to a status without knowing them.
func Named(kind error, msg string) error { return &namedErr{kind, errors.New(msg)} }

// OpError records a failed transfer: which engine, which operation, on which
// path, at which offset, and how many bytes were done before the failure.
type OpError struct {
	Engine string // engine name, e.g. "direct"
	Op     string // "read", "write", "open", "sync", "truncate", ...
	Path   string
	Offset int64
	Len    int   // bytes asked for
	Done   int   // bytes transferred before the error
	Err    error // the cause; wraps a named error where one applies
}

func (e *OpError) Error() string {
	msg := fmt.Sprintf("%s: %s %s at %d: %v", e.Engine, e.Op, e.Path, e.Offset, e.Err)
	if e.Done > 0 && e.Done < e.Len {
		msg += fmt.Sprintf(" (partial %s: %d of %d bytes done)", e.Op, e.Done, e.Len)
	}
	return msg
}

func (e *OpError) Unwrap() error { return e.Err }

// namedErr pairs an OS error with the named error it maps to, so that both
// errors.Is(err, ErrNoSpace) and errors.Is(err, syscall.ENOSPC) hold while the
// message stays the operating system's.
type namedErr struct {
	named error
	cause error
}

func (e *namedErr) Error() string        { return e.cause.Error() }
func (e *namedErr) Unwrap() []error      { return []error{e.named, e.cause} }
func (e *namedErr) Is(target error) bool { return target == e.named }

// Classify maps operating-system errors to the named errors. This is the one
// place where errno values get meaning: ENOSPC and EDQUOT are ErrNoSpace;
// EROFS is fs.ErrPermission (a read-only mount makes a directory unwritable
// exactly as its mode bits would, and the caller sees a PermissionError
// either way). The message stays the operating system's; other errors pass
// unchanged.
func Classify(err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err
	}
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT:
		return &namedErr{ErrNoSpace, err}
	case syscall.EROFS:
		return &namedErr{fs.ErrPermission, err}
	}
	return err
}

func classify(err error) error { return Classify(err) }

// Recover is the one panic policy of every worker goroutine (engine pieces,
// transfer pools, the spill store's queue): deferred as
// `defer gds.Recover(&err)`, it turns a panic into an error wrapping
// ErrInternal, with the stack, for that call alone. A worker's panic would
// otherwise end the whole process, since the C boundary's recover only
// covers the calling goroutine; the state a worker touches is its own
// call's, so the library stays usable.
func Recover(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: panic in a worker goroutine: %v\n%s", ErrInternal, r, debug.Stack())
	}
}

// opErr builds an *OpError with the cause classified.
func opErr(engine, op, path string, off int64, n, done int, err error) error {
	return &OpError{Engine: engine, Op: op, Path: path, Offset: off, Len: n, Done: done, Err: classify(err)}
}

// IsNoSpace reports whether err means the filesystem is full.
func IsNoSpace(err error) bool { return errors.Is(err, ErrNoSpace) }

// checkRange validates a transfer's arguments: a non-negative offset, an end
// that does not overflow int64, and memory present when there is a length.
func checkRange(p []byte, off int64) error {
	if off < 0 {
		return fmt.Errorf("%w: negative offset %d", ErrInvalid, off)
	}
	if int64(len(p)) > (1<<63-1)-off {
		return fmt.Errorf("%w: offset %d + length %d overflows", ErrInvalid, off, len(p))
	}
	return nil
}

// readClamped reads p at off from a file of size bytes through read, which
// is given only the bytes before the end: a p that runs past the end reads
// those and returns their count with ErrEOF.
func readClamped(p []byte, off, size int64, read func(want []byte) (int, error)) (int, error) {
	want := p
	if avail := size - off; avail < int64(len(p)) {
		want = p[:max(avail, 0)]
	}
	n, err := read(want)
	if err == nil && len(want) < len(p) {
		err = ErrEOF
	}
	return n, err
}
