package main

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Status codes returned by every exported function. pyfastensor/_lib.py maps
// each to a Python exception class; keep the two lists in step.
const (
	stOK          = 0
	stError       = 1  // any other failure
	stInvalid     = 2  // bad argument
	stEOF         = 3  // read past end of file
	stNoSpace     = 4  // filesystem full
	stUnavailable = 5  // engine cannot work here
	stNotFound    = 6  // no such file or directory
	stPermission  = 7  // permission denied
	stBadHandle   = 8  // unknown or already released handle
	stPanic       = 9  // a Go panic was recovered; the library is now poisoned
	stPoisoned    = 10 // refused: an earlier call panicked
	stUnsupported = 11 // the engine does not do this
	stCorrupt     = 12 // data failed a check (CRC, format)
	stInternal    = 13 // a bug caught without a panic at the boundary
	// stErrno plus an errno: another operating-system error (EIO, EISDIR,
	// ENAMETOOLONG, EROFS...), its errno carried for Python's OSError.
	stErrno = 1000
)

// errnoMax bounds the errnos stErrno carries (Linux's are below 134).
const errnoMax = 1000

// errBadHandle: a handle that is not (or no longer) in the table.
var errBadHandle = errors.New("unknown or released handle")

// statusOf maps an error to its status code; the first match wins.
func statusOf(err error) C.int {
	switch {
	case errors.Is(err, errBadHandle):
		return stBadHandle
	case errors.Is(err, gds.ErrCorrupt): // every format's corruption is a kind of it (gds.Named)
		return stCorrupt
	case errors.Is(err, gds.ErrInternal):
		return stInternal
	case errors.Is(err, gds.ErrInvalid), errors.Is(err, gds.ErrClosed):
		return stInvalid
	case errors.Is(err, gds.ErrEOF):
		return stEOF
	case errors.Is(err, gds.ErrNoSpace):
		return stNoSpace
	case errors.Is(err, gds.ErrUnavailable):
		return stUnavailable
	case errors.Is(err, gds.ErrUnsupported):
		return stUnsupported
	case errors.Is(err, fs.ErrNotExist):
		return stNotFound
	case errors.Is(err, fs.ErrPermission):
		return stPermission
	}
	if en := syscall.Errno(0); errors.As(err, &en) && en > 0 && en < errnoMax {
		return stErrno + C.int(en)
	}
	return stError
}

// poisoned is set by the first recovered panic. A panic may leave Go state
// half-updated (a lock held, a table inconsistent), so later calls are
// refused rather than trusted.
var poisoned atomic.Bool

// call runs fn as the body of an exported function: refuse when poisoned,
// recover a panic into stPanic, and turn an error into its status code with
// its whole message (a panic's with its stack) in *errOut, a C string the
// caller frees with pft_free. Every export takes errOut last; on success it
// is left as the caller set it (NULL).
func call(errOut **C.char, fn func() error) (status C.int) {
	if poisoned.Load() {
		setErr(errOut, "pyfastensor: the native library is unusable after an earlier internal error (Go panic); restart the process")
		return stPoisoned
	}
	defer func() {
		if r := recover(); r != nil {
			poisoned.Store(true)
			setErr(errOut, fmt.Sprintf("pyfastensor: internal error (Go panic): %v\n%s", r, debug.Stack()))
			status = stPanic
		}
	}()
	if err := fn(); err != nil {
		setErr(errOut, err.Error())
		return statusOf(err)
	}
	return stOK
}

// setErr hands msg to the caller as a C string (freed with pft_free); a
// NULL errOut drops it.
func setErr(errOut **C.char, msg string) {
	if errOut != nil {
		*errOut = cstring(msg)
	}
}

// memory turns a caller's address and length into a slice over that memory.
// The slice must not outlive the call that received it (or the operation
// the call's documentation names).
func memory(addr unsafe.Pointer, n C.size_t) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if addr == nil {
		return nil, fmt.Errorf("%w: null address with length %d", gds.ErrInvalid, n)
	}
	if uint64(n) > 1<<62 {
		return nil, fmt.Errorf("%w: length %d is too large", gds.ErrInvalid, uint64(n))
	}
	return unsafe.Slice((*byte)(addr), int(n)), nil
}

// handles maps integer handles to Go objects. Handle 0 is never issued.
var handles = struct {
	sync.Mutex
	next uint64
	m    map[uint64]any
}{m: map[uint64]any{}}

// newHandle registers v and returns its handle.
func newHandle(v any) C.uint64_t {
	handles.Lock()
	defer handles.Unlock()
	handles.next++
	handles.m[handles.next] = v
	return C.uint64_t(handles.next)
}

// lookup returns the object behind h, which must be a T.
func lookup[T any](h C.uint64_t) (T, error) {
	handles.Lock()
	v, ok := handles.m[uint64(h)]
	handles.Unlock()
	t, isT := v.(T)
	if !ok || !isT {
		var zero T
		return zero, fmt.Errorf("%w: %d", errBadHandle, uint64(h))
	}
	return t, nil
}

// release removes h from the table and returns what it held.
func release[T any](h C.uint64_t) (T, error) {
	handles.Lock()
	defer handles.Unlock()
	v, ok := handles.m[uint64(h)]
	t, isT := v.(T)
	if !ok || !isT {
		var zero T
		return zero, fmt.Errorf("%w: %d", errBadHandle, uint64(h))
	}
	delete(handles.m, uint64(h))
	return t, nil
}

// putJSON marshals v into a C string for the caller (freed with pft_free):
// the one way every export returns structured results.
func putJSON(out **C.char, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	*out = cstring(string(b))
	return nil
}

// parseJSON decodes the caller's JSON argument s into v (NULL leaves v
// as it is).
func parseJSON(s *C.char, v any) error {
	if s == nil {
		return nil
	}
	if err := json.Unmarshal([]byte(C.GoString(s)), v); err != nil {
		return fmt.Errorf("%w: %v", gds.ErrInvalid, err)
	}
	return nil
}

// cstring allocates a C copy of s for the caller, who frees it with pft_free.
func cstring(s string) *C.char { return C.CString(s) }

//export pft_free
func pft_free(p unsafe.Pointer) { C.free(p) }

//export pft_release_idle
func pft_release_idle(out *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		*out = C.int64_t(gds.ReleaseIdle())
		debug.FreeOSMemory() // the Go heap's free pages too (host-tier slots freed, say)
		return nil
	})
}

//export pft_handle_count
func pft_handle_count() C.int64_t {
	handles.Lock()
	defer handles.Unlock()
	return C.int64_t(len(handles.m))
}
