package transfer

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Files holds the files of one transfer: the same path opened once per
// engine asked for (lazily, as extents choose engines), and the bytes each
// engine actually moved. Safe for concurrent use.
//
// cuFile fallback: where the memory moved is host memory (HostMemory),
// cuFile failing on this file (gds.IsCuFileFailure: the engine unavailable
// on the machine or the filesystem, its registration refused, a transfer
// failed) is no error: from then on the CPU engine the default choice
// names for large transfers in the file's directory (direct where O_DIRECT
// works, else posix) serves what was asked of cufile, a failed transfer is
// redone through it, and Fallback says why. Without HostMemory cufile's
// errors are returned as they are: its memory may be device memory, which
// no CPU engine can touch (the Python side stages it through pinned memory
// instead).
type Files struct {
	path     string
	flag     int
	opts     gds.Options
	progress func(int64) // may be nil
	host     bool        // HostMemory

	mu       sync.Mutex
	files    map[string]gds.File // by engine opened
	alias    map[string]string   // engine asked for -> engine serving it instead
	engines  map[string]int64    // bytes by engine that served them
	fallback string              // why cufile is served by a CPU engine; "" when it is not
}

// NewFiles prepares to open path with flag through whichever engines the
// transfer's extents choose. progress, when not nil, is called with each
// count of bytes moved.
func NewFiles(path string, flag int, opts gds.Options, progress func(int64)) *Files {
	if name := ShownName(path); name != path {
		opts.Name = name // a pinned file's errors name its path, not /proc/self/fd/N
	}
	return &Files{path: path, flag: flag, opts: opts, progress: progress,
		files: map[string]gds.File{}, alias: map[string]string{}, engines: map[string]int64{}}
}

// HostMemory declares that every transfer through e moves host memory, so
// that cuFile failing falls back to a CPU engine (see Files). It returns e.
func (e *Files) HostMemory() *Files {
	e.host = true
	return e
}

// File returns the path opened through engine, opening it on first use.
func (e *Files) File(engine string) (gds.File, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f, err := e.openLocked(engine)
	if err != nil && engine == "cufile" && e.host && gds.IsCuFileFailure(err) {
		return e.fallBackLocked(err)
	}
	return f, err
}

// openLocked returns the file serving engine, opening it on first use.
// Called with e.mu held.
func (e *Files) openLocked(engine string) (gds.File, error) {
	if a, ok := e.alias[engine]; ok {
		engine = a
	}
	if f, ok := e.files[engine]; ok {
		return f, nil
	}
	eng, err := gds.New(engine, e.opts)
	if err != nil {
		return nil, err
	}
	f, err := eng.Open(e.path, e.flag, 0)
	if err != nil {
		return nil, err
	}
	e.files[engine] = f
	return f, nil
}

// fallBackLocked makes the CPU engine serve what is asked of cufile, for
// the failure cause, and returns its file. Called with e.mu held.
func (e *Files) fallBackLocked(cause error) (gds.File, error) {
	cpu := "posix"
	if dir, err := DirOf(e.path); err == nil && Probe(dir).Direct {
		cpu = "direct"
	}
	f, err := e.openLocked(cpu)
	if err != nil {
		return nil, errors.Join(cause, err)
	}
	if _, done := e.alias["cufile"]; !done {
		e.alias["cufile"] = cpu
		e.fallback = fmt.Sprintf("cuFile failed, %s serves the file instead: %v", cpu, cause)
	}
	return f, nil
}

// retry returns the file to redo a transfer through that failed with err on
// f: the CPU engine's where f is a cufile file, the failure is cuFile's and
// the memory host memory (see Files); nil otherwise.
func (e *Files) retry(f gds.File, err error) gds.File {
	if !e.host || f.Engine() != "cufile" || !gds.IsCuFileFailure(err) {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	g, ferr := e.fallBackLocked(err)
	if ferr != nil {
		return nil
	}
	return g
}

// Serving names the engine that serves what is asked of engine: engine,
// or the CPU engine cufile fell back to.
func (e *Files) Serving(engine string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if a, ok := e.alias[engine]; ok {
		return a
	}
	return engine
}

// Fallback says why cufile was served by a CPU engine, "" when it was not.
func (e *Files) Fallback() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fallback
}

// Count records n bytes moved by engine and reports them as progress.
func (e *Files) Count(engine string, n int64) {
	e.mu.Lock()
	e.engines[engine] += n
	e.mu.Unlock()
	if e.progress != nil {
		e.progress(n)
	}
}

// Engines returns the bytes moved per engine that served them.
func (e *Files) Engines() map[string]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int64, len(e.engines))
	for k, v := range e.engines {
		out[k] = v
	}
	return out
}

// Close closes every file opened.
func (e *Files) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	for _, f := range e.files {
		errs = append(errs, f.Close())
	}
	e.files = map[string]gds.File{}
	return errors.Join(errs...)
}

// Open opens the file through each engine now, not on first use: a file
// that is about to lose its name (the spill file, unlinked once open) must
// be open through every engine its chooser may name.
func (e *Files) Open(engines ...string) error {
	for _, name := range engines {
		if _, err := e.File(name); err != nil {
			return err
		}
	}
	return nil
}

// Each calls fn on every open file, in no order, stopping at an error.
// It must not run concurrently with transfers (gds.File forbids Truncate
// then).
func (e *Files) Each(fn func(engine string, f gds.File) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for name, f := range e.files {
		if err := fn(name, f); err != nil {
			return err
		}
	}
	return nil
}

// Move moves one extent between memory and the file through engine, on
// the caller's goroutine (the spill store runs many at once on its own
// workers), and reports its time to c. Memory that is not page-aligned
// goes in pieces of at most one engine task: the direct engine bounces
// unaligned memory through task-sized buffers, and a single transfer
// between one and two task sizes overflows them (see gds/direct.go
// piece). Piece boundaries stay aligned in the file since the task size
// is. A panic fails the move (gds.Recover).
func (e *Files) Move(op Op, engine string, c Chooser, ext Extent) (err error) {
	defer gds.Recover(&err)
	f, err := e.File(engine)
	if err != nil {
		return err
	}
	p := ext.Data
	step := len(p)
	if len(p) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(p)))%Alignment != 0 {
		step = int(max(Alignment, PieceSize(e.opts)&^(Alignment-1)))
	}
	start := time.Now()
	for lo := 0; lo < len(p); lo += step {
		hi := min(lo+step, len(p))
		move := func() error {
			if op == OpWrite {
				_, err := f.WriteAt(p[lo:hi], ext.Off+int64(lo))
				return err
			}
			_, err := f.ReadAt(p[lo:hi], ext.Off+int64(lo))
			return err
		}
		if err = move(); err != nil {
			if g := e.retry(f, err); g != nil {
				f = g
				err = move()
			}
		}
		if err != nil {
			return &ExtentError{Off: ext.Off + int64(lo), Err: err}
		}
	}
	e.Count(f.Engine(), int64(len(p)))
	if c != nil {
		c.Observe(op, int64(len(p)), engine, time.Since(start))
	}
	return nil
}
