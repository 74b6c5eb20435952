package gds

import "os"

// Faulty returns an engine that opens files with base and fails the
// operations inj chooses (fault.go). Its Name is base's; its files report
// base's Engine and Fallback, so callers see the engine that really moves
// the bytes. A failed operation returns an *OpError naming that engine, the
// path and the offset, as a real failure does, with ErrInjected and the
// injector's error inside. An operation inj lets through is base's own.
//
// Safe for concurrent use, as base is.
func Faulty(base Engine, inj Injector) Engine {
	return &faultEngine{name: base.Name(), base: base, inj: inj}
}

type faultEngine struct {
	name string // registry name: base's, or the name RegisterFault gave
	base Engine
	inj  Injector
	opts Options // for the name errors give a path (Options.Name)
}

var _ Engine = (*faultEngine)(nil)

// Name implements Engine.
func (e *faultEngine) Name() string { return e.name }

// Unwrap returns the engine that opens the files.
func (e *faultEngine) Unwrap() Engine { return e.base }

// Open implements Engine. An injected open failure opens nothing.
func (e *faultEngine) Open(path string, flag int, perm os.FileMode) (File, error) {
	name := e.opts.nameFor(path)
	if err := e.inj.MaybeError(FaultOp{Kind: OpOpen, Path: name}); err != nil {
		return nil, opErr(e.base.Name(), string(OpOpen), name, 0, 0, 0, injected(err))
	}
	f, err := e.base.Open(path, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{base: f, inj: e.inj}, nil
}

// RegisterFault registers, under name, an engine that opens files with the
// engine registered as base (built with the same Options) and fails the
// operations inj chooses, as Faulty does. Any code that picks engines by
// name (a checkpoint saved with a fixed engine, the spill store's Engine)
// can then be pointed at it. unregister removes it again (it may be called
// more than once). A name already taken, or a base no engine is registered
// as, gives an error wrapping ErrInvalid.
//
// Safe for concurrent use with New, Names and other registrations.
func RegisterFault(name, base string, inj Injector) (unregister func(), err error) {
	return add(name, func(o Options) (Engine, error) {
		b, err := New(base, o)
		if err != nil {
			return nil, err
		}
		return &faultEngine{name: name, base: b, inj: inj, opts: o}, nil
	}, base)
}

// faultFile is a file of a faulty engine: each operation asks the injector
// first, then runs base's.
type faultFile struct {
	base File
	inj  Injector
}

var _ File = (*faultFile)(nil)

// Unwrap returns the file that moves the bytes.
func (f *faultFile) Unwrap() File { return f.base }

func (f *faultFile) Path() string     { return f.base.Path() }
func (f *faultFile) Engine() string   { return f.base.Engine() }
func (f *faultFile) Fallback() string { return f.base.Fallback() }

// fail returns the injected error for op, wrapped as the engine's own
// errors are, or nil when the injector lets op run.
func (f *faultFile) fail(op FaultOp) error {
	err := f.inj.MaybeError(op)
	if err == nil {
		return nil
	}
	return opErr(f.base.Engine(), string(op.Kind), f.base.Path(), op.Offset, op.Len, 0, injected(err))
}

// transfer runs a read or write through move unless the injector fails
// it; a failure marked Partial moves the first half of p first.
func (f *faultFile) transfer(kind OpKind, p []byte, off int64, move func([]byte, int64) (int, error)) (int, error) {
	op := FaultOp{Kind: kind, Path: f.base.Path(), Offset: off, Len: len(p)}
	err := f.inj.MaybeError(op)
	if err == nil {
		return move(p, off)
	}
	done := 0
	if isPartial(err) && len(p) > 1 {
		n, merr := move(p[:len(p)/2], off)
		if merr != nil {
			return n, merr // the real failure came first
		}
		done = n
	}
	return done, opErr(f.base.Engine(), string(kind), f.base.Path(), off, len(p), done, injected(err))
}

func (f *faultFile) ReadAt(p []byte, off int64) (int, error) {
	return f.transfer(OpRead, p, off, f.base.ReadAt)
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	return f.transfer(OpWrite, p, off, f.base.WriteAt)
}

func (f *faultFile) Sync() error {
	if err := f.fail(FaultOp{Kind: OpSync, Path: f.base.Path()}); err != nil {
		return err
	}
	return f.base.Sync()
}

func (f *faultFile) Size() (int64, error) {
	if err := f.fail(FaultOp{Kind: OpSize, Path: f.base.Path()}); err != nil {
		return 0, err
	}
	return f.base.Size()
}

func (f *faultFile) Truncate(size int64) error {
	if err := f.fail(FaultOp{Kind: OpTruncate, Path: f.base.Path(), Offset: size}); err != nil {
		return err
	}
	return f.base.Truncate(size)
}

// Close implements File. The base file is closed even when the injector
// fails the close, as close(2) releases the descriptor even when it
// reports an error: a test of a failed close leaks nothing.
func (f *faultFile) Close() error {
	ierr := f.fail(FaultOp{Kind: OpClose, Path: f.base.Path()})
	err := f.base.Close()
	if ierr != nil {
		return ierr
	}
	return err
}
