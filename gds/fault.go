package gds

import (
	"errors"
	"math/rand/v2"
	"sync"
)

// Faults are ordinary values, as in pebble's vfs/errorfs: an Injector sees
// each operation a file is about to do and returns the error to fail it
// with, or nil to let it run. Faulty (faulty.go) wraps any engine so that
// its files consult one, and RegisterFault puts such an engine in the
// registry, so code that picks engines by name can be pointed at it. No
// build tags: the failure paths are tested with the code that ships.

// OpKind names an operation of File, with the word OpError.Op uses for it.
type OpKind string

// The operations an injector can fail.
const (
	OpOpen     OpKind = "open"
	OpRead     OpKind = "read"
	OpWrite    OpKind = "write"
	OpSync     OpKind = "sync"
	OpTruncate OpKind = "truncate"
	OpSize     OpKind = "stat" // File.Size; engines report its failure as "stat"
	OpClose    OpKind = "close"
)

// FaultOp describes one operation about to run: its kind, the file's path
// (as File.Path reports it), and for reads and writes the byte range
// [Offset, Offset+Len). A truncate's Offset is the new size; other
// operations have neither offset nor length.
type FaultOp struct {
	Kind   OpKind
	Path   string
	Offset int64
	Len    int
}

// Injector decides which operations fail.
//
// MaybeError is called before each operation of a faulty file, from as
// many goroutines as use the file, so implementations are safe for
// concurrent use. It returns nil to let the operation run, or the error to
// fail it with: an errno (unix.ENOSPC, unix.EROFS, ...) is classified as
// the engines classify the real one, so errors.Is(err, ErrNoSpace) holds for
// an injected ENOSPC; the error is marked with ErrInjected either way.
type Injector interface {
	MaybeError(op FaultOp) error
}

// InjectorFunc adapts a function to Injector.
type InjectorFunc func(op FaultOp) error

// MaybeError implements Injector.
func (f InjectorFunc) MaybeError(op FaultOp) error { return f(op) }

// Never is the injector that fails nothing.
var Never Injector = InjectorFunc(func(FaultOp) error { return nil })

// ErrInjected is wrapped by every error an injector made up.
var ErrInjected = errors.New("injected fault")

// injectedErr marks an injector's chosen error with ErrInjected while
// keeping the chosen error (an errno, say) reachable for errors.Is and for
// classify.
type injectedErr struct{ cause error }

func (e *injectedErr) Error() string   { return "injected: " + e.cause.Error() }
func (e *injectedErr) Unwrap() []error { return []error{ErrInjected, e.cause} }

// injected marks err with ErrInjected unless it already is.
func injected(err error) error {
	if err == nil || errors.Is(err, ErrInjected) {
		return err
	}
	return &injectedErr{err}
}

// partialErr asks a faulty file to move the first half of a failed read or
// write before failing it, as a disk that fills up mid-write does.
type partialErr struct{ error }

func (e *partialErr) Unwrap() error { return e.error }

// Partial marks err so that a faulty file's read or write that fails with
// it moves the first half of its bytes first (a short write). Other
// operations fail whole.
func Partial(err error) error { return &partialErr{injected(err)} }

func isPartial(err error) bool {
	var p *partialErr
	return errors.As(err, &p)
}

// Fault is the injector the constructors below build. It fails the
// operations that pass every condition it has (kinds, an offset range, the
// n-th such operation, a random draw) with its error, ErrInjected unless
// WithError chose another.
//
// Conditions and the error are set up before the Fault is in use; from then
// on it is safe for concurrent use.
type Fault struct {
	kinds   []OpKind // empty: every kind
	ranged  bool     // lo, hi apply
	lo, hi  int64
	nth     int64   // > 0: only the nth operation that passes kinds and range
	prob    float64 // with random: the chance of each failure
	random  bool
	err     error
	partial bool

	mu    sync.Mutex
	rng   *rand.Rand // drawn from in call order, so a seed replays a run
	seen  int64      // operations that passed kinds and range
	fired int64
}

var _ Injector = (*Fault)(nil)

// Only fails every operation of the given kinds (of every kind when none
// is given).
func Only(kinds ...OpKind) *Fault { return &Fault{kinds: kinds, err: ErrInjected} }

// OnNth fails the n-th operation (counting from 1) of the given kinds (of
// any kind when none is given), and no other.
func OnNth(n int, kinds ...OpKind) *Fault {
	f := Only(kinds...)
	f.nth = int64(max(n, 1))
	return f
}

// Random fails each operation of the given kinds (of any kind when none is
// given) with probability p. The draws come from a generator seeded with
// seed, one per operation that passes the other conditions, in call order:
// the same sequence of operations fails at the same places on every run.
// (Concurrent callers make the sequence depend on scheduling.)
func Random(seed uint64, p float64, kinds ...OpKind) *Fault {
	f := Only(kinds...)
	f.random, f.prob = true, p
	f.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return f
}

// AtOffset fails every operation that touches [lo, hi) (see Fault.AtOffset).
func AtOffset(lo, hi int64) *Fault { return Only().AtOffset(lo, hi) }

// AtOffset narrows f to operations that touch [lo, hi): reads and writes
// whose range overlaps it, truncates to a size inside it. Operations
// without an offset (open, sync, size, close) never pass. Returns f.
func (f *Fault) AtOffset(lo, hi int64) *Fault {
	f.ranged, f.lo, f.hi = true, lo, hi
	return f
}

// WithError makes f fail operations with err instead of ErrInjected (nil
// keeps ErrInjected): an errno such as unix.ENOSPC or unix.EROFS is
// classified as the real one would be. Returns f.
func (f *Fault) WithError(err error) *Fault {
	if err != nil {
		f.err = err
	}
	return f
}

// Partial makes a read or write that f fails move the first half of its
// bytes before failing (a short write). Returns f.
func (f *Fault) Partial() *Fault {
	f.partial = true
	return f
}

// Fired returns how many operations f has failed so far.
func (f *Fault) Fired() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return int(f.fired)
}

// MaybeError implements Injector.
func (f *Fault) MaybeError(op FaultOp) error {
	if !f.matches(op) {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen++
	if f.nth > 0 && f.seen != f.nth {
		return nil
	}
	if f.random && f.rng.Float64() >= f.prob {
		return nil
	}
	f.fired++
	if f.partial {
		return Partial(f.err)
	}
	return injected(f.err)
}

// matches reports whether op passes f's kinds and offset range.
func (f *Fault) matches(op FaultOp) bool {
	if len(f.kinds) > 0 {
		found := false
		for _, k := range f.kinds {
			found = found || k == op.Kind
		}
		if !found {
			return false
		}
	}
	if !f.ranged {
		return true
	}
	switch op.Kind {
	case OpRead, OpWrite:
		// An empty transfer touches the byte at its offset, for this test.
		return op.Offset < f.hi && op.Offset+int64(max(op.Len, 1)) > f.lo
	case OpTruncate:
		return op.Offset >= f.lo && op.Offset < f.hi
	}
	return false
}

// Any combines injectors: every one of them sees every operation (so that
// their counts stay true), and the first error, in argument order, fails
// it.
func Any(injs ...Injector) Injector {
	return InjectorFunc(func(op FaultOp) error {
		var first error
		for _, inj := range injs {
			if err := inj.MaybeError(op); err != nil && first == nil {
				first = err
			}
		}
		return first
	})
}
