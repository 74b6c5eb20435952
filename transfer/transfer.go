// Package transfer is the one place bytes move between memory and files
// above the engines. A transfer is a list of extents of one file (offset,
// memory, whether a CRC-32 is wanted); Read and Writer.Write execute them
// with one worker pool (Run), one panic policy (gds.Recover), one chooser
// per transfer (Chooser: a fixed engine, the adaptive dictionaries, or
// Default), and return per-extent results and CRC-32s. Writes land in a
// temporary file committed durably (commit.go). Every threshold lives in
// settings.go; the per-directory probe in probe.go.
//
// The package knows byte extents, not formats: checkpoint/ lays out zip
// and safetensors files, hooks/ allocates spill slots, and both move their
// bytes through here.
package transfer

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Extent is a run of bytes at a file offset.
type Extent struct {
	Off int64
	// Data is the memory to write from or read into, used during the call
	// only. The caller keeps it alive and, for reads, untouched until the
	// call returns.
	Data []byte
	// Build, for writes, fills p (Len bytes) with the extent's bytes when
	// its task runs, instead of Data (a run of small records composed with
	// their headers), and returns how many of them to report as progress.
	// p is borrowed for the task from the engines' pool of aligned buffers
	// (gds.Borrow), so a direct write moves it in place and a save's runs
	// reuse the same memory.
	Build func(p []byte) (counted int64)
	Len   int64
	// Sum asks for the CRC-32 of the extent's bytes (Result.CRC), computed
	// alongside the transfer, piece by piece.
	Sum bool
	// Pages receives the CRC-32 of every page of Data as it lands (reads)
	// or leaves (writes) (Pages.Data must be Data, Off a page boundary).
	Pages *PageSums
	// Engine names the engine for this extent; "" leaves it to the chooser.
	Engine string
	// Ready, for a streamed read into memory reused from extent to extent
	// (checkpoint.RingRead: the slots of a ring), is waited for before each
	// of the extent's pieces moves: it returns once Data may be written, or
	// with an error (which fails the extent) once failed is closed: another
	// piece of the transfer failed, and the transfer ends.
	Ready func(failed <-chan struct{}) error
	// Landed, when not nil, is called once all the extent's bytes have
	// moved, with their CRC-32 (0 without Sum), from the goroutine that
	// moved the last piece.
	Landed func(crc uint32)
}

// size returns the extent's length.
func (e *Extent) size() int64 {
	if e.Build != nil {
		return e.Len
	}
	return int64(len(e.Data))
}

// Result is what happened to one extent.
type Result struct {
	CRC    uint32 // with Extent.Sum
	Engine string // the engine asked for (the one that served it is in Stats)
}

// Stats describe a finished transfer.
type Stats struct {
	Bytes   int64            `json:"data_bytes"`
	Engines map[string]int64 `json:"engines"` // bytes per engine that served them
	Seconds float64          `json:"seconds"`
	// Fallback says why a CPU engine served what was asked of cufile
	// (Files); "" when nothing fell back.
	Fallback string `json:"fallback,omitempty"`
}

// Options tune a transfer. The zero value means the defaults.
type Options struct {
	// Chooser picks each extent's engine; nil means Default for the
	// file's directory.
	Chooser Chooser
	// Resident is each read extent's share in the page cache (0 to 1),
	// when the caller measured it already (a load plan); nil measures it
	// here, once, when the chooser is a ResidentChooser.
	Resident []float64
	// Engine holds the engines' options.
	Engine gds.Options
	// Workers is the number of tasks in flight; 0 means WriteWorkers for
	// writes and ReadWorkers for reads.
	Workers int
	// Progress, when not nil, is called with each count of bytes moved,
	// from several goroutines.
	Progress func(n int64)
}

// ExtentError is the failure of one extent: its index in the transfer and
// the file offset of the piece that failed. It wraps the engine's error
// (errors.Is sees gds.ErrEOF, gds.ErrNoSpace, ...).
type ExtentError struct {
	Ext int
	Off int64
	Err error
}

func (e *ExtentError) Error() string { return e.Err.Error() }
func (e *ExtentError) Unwrap() error { return e.Err }

// Read fills each extent's Data from the file at path, in parallel pieces
// through the engines the chooser names, and sums what Extent.Sum and
// Extent.Pages ask for. A file ending before an extent's end gives an
// ExtentError wrapping gds.ErrEOF.
func Read(path string, exts []Extent, o Options) ([]Result, Stats, error) {
	start := time.Now()
	if o.Chooser == nil {
		c, err := DefaultFor(path)
		if err != nil {
			return nil, Stats{}, err
		}
		o.Chooser = c
	}
	sizes := make([]int64, len(exts))
	for i := range exts {
		sizes[i] = exts[i].size()
	}
	if _, ok := o.Chooser.(ResidentChooser); ok && o.Resident == nil && len(exts) > 0 {
		offs := make([]int64, len(exts))
		for i := range exts {
			offs[i] = exts[i].Off
		}
		o.Resident, _ = gds.Resident(path, offs, sizes) // best effort: without it, Engine decides
	}
	engines := ReadEngines(o.Chooser, sizes, o.Resident)
	for i := range exts {
		if exts[i].Engine != "" {
			engines[i] = exts[i].Engine
		}
	}
	files := NewFiles(path, os.O_RDONLY, o.Engine, o.Progress)
	if o.hostMemory() {
		files.HostMemory()
	}
	res, err := run(files, exts, engines, OpRead, cmp.Or(o.Workers, ReadWorkers(engines)), o)
	if cerr := files.Close(); err == nil && cerr != nil {
		err = cerr
	}
	st := Stats{Engines: files.Engines(), Seconds: time.Since(start).Seconds(), Fallback: files.Fallback()}
	for _, n := range sizes {
		st.Bytes += n
	}
	return res, st, err
}

// run moves the extents in pieces through Run, each through its engine,
// summing what they ask for and telling the chooser each extent's time.
func run(files *Files, exts []Extent, engines []string, op Op, workers int, o Options) ([]Result, error) {
	ps := PieceSize(o.Engine)
	var tasks []Piece
	crcs := make([]*PieceCRCs, len(exts))
	left := make([]atomic.Int64, len(exts))
	started := make([]atomic.Int64, len(exts))
	for i := range exts {
		e := &exts[i]
		size := e.size()
		var p []Piece
		switch {
		case e.Build != nil:
			p = []Piece{{Ext: i, Hi: size}}
		case e.Pages != nil:
			p = Split(i, size, max(Page, ps&^(Page-1)))
		default:
			p = Split(i, size, ps)
		}
		if e.Sum {
			crcs[i] = NewPieceCRCs(len(p))
		}
		left[i].Store(int64(len(p)))
		tasks = append(tasks, p...)
	}
	failed := make(chan struct{}) // closed at the first task that fails: Ready returns
	var fail sync.Once
	task := func(t int) error {
		pc := tasks[t]
		e := &exts[pc.Ext]
		off := e.Off + pc.Lo
		if e.Ready != nil {
			if err := e.Ready(failed); err != nil {
				return &ExtentError{Ext: pc.Ext, Off: off, Err: err}
			}
		}
		started[pc.Ext].CompareAndSwap(0, time.Now().UnixNano())
		f, err := files.File(engines[pc.Ext])
		if err != nil {
			return &ExtentError{Ext: pc.Ext, Off: off, Err: err}
		}
		var p []byte
		counted := pc.Hi - pc.Lo
		if e.Build != nil {
			var giveBack func()
			p, giveBack = gds.Borrow(int(e.Len))
			defer giveBack()
			counted = e.Build(p)
		} else {
			p = e.Data[pc.Lo:pc.Hi]
		}
		crc, _, err := MoveSummed(f, op == OpWrite, p, off, e.Sum)
		if err != nil {
			if g := files.retry(f, err); g != nil { // cuFile failed on host memory: redo it on the CPU
				f = g
				crc, _, err = MoveSummed(f, op == OpWrite, p, off, e.Sum)
			}
		}
		if err != nil {
			return &ExtentError{Ext: pc.Ext, Off: off, Err: err}
		}
		if e.Sum {
			crcs[pc.Ext].Set(pc.Index, crc, int64(len(p)))
		}
		if e.Pages != nil {
			e.Pages.sumPages(p, pc.Lo)
		}
		if counted > 0 {
			files.Count(f.Engine(), counted)
		}
		if left[pc.Ext].Add(-1) == 0 {
			if e.Build == nil {
				d := time.Duration(time.Now().UnixNano() - started[pc.Ext].Load())
				o.Chooser.Observe(op, e.size(), engines[pc.Ext], d)
			}
			if e.Landed != nil {
				var crc uint32
				if crcs[pc.Ext] != nil {
					crc = crcs[pc.Ext].Total()
				}
				e.Landed(crc)
			}
		}
		return nil
	}
	err := Run(len(tasks), workers, func(t int) error {
		ok := false
		defer func() { // after a panic too (Run turns it into the task's error)
			if !ok {
				fail.Do(func() { close(failed) })
			}
		}()
		err := task(t)
		ok = err == nil
		return err
	})
	if err != nil {
		return nil, err
	}
	res := make([]Result, len(exts))
	for i := range exts {
		res[i].Engine = engines[i]
		if crcs[i] != nil {
			res[i].CRC = crcs[i].Total()
		}
	}
	return res, nil
}

// Writer is a write in progress: a temporary file beside the target, filled
// by Write, then committed (Commit) or dropped (Abort). See commit.go for
// the protocol.
type Writer struct {
	target  string // absolute, links resolved
	tmp     string
	durable bool
	o       Options
	fs      FS
	files   *Files
	start   time.Time
	bytes   int64
	done    bool
}

// Create starts a write of a new file of size bytes that will replace path
// on Commit. It removes temporary files that earlier writes to path left in
// processes that no longer exist, and creates this write's temporary file
// with size bytes reserved (so a full disk fails here, before any byte is
// written). With durable, Commit fsyncs the file and the directory.
// fsys nil means the real filesystem (or what SetDefaultFS installed).
func Create(path string, size int64, durable bool, fsys FS, o Options) (*Writer, error) {
	if fsys == nil {
		fsys = currentFS()
	}
	target, err := resolveTarget(path)
	if err != nil {
		return nil, err
	}
	if o.Chooser == nil {
		o.Chooser = Default(filepath.Dir(target))
	}
	CleanStale(target)
	tmp, err := createTemp(fsys, target, size)
	if err != nil {
		return nil, err
	}
	files := NewFiles(tmp, os.O_RDWR, o.Engine, o.Progress)
	if o.hostMemory() {
		files.HostMemory()
	}
	return &Writer{target: target, tmp: tmp, durable: durable, o: o, fs: fsys,
		files: files, start: time.Now()}, nil
}

// hostMemory says whether the transfer's memory is known to be host memory,
// so that cuFile failing falls back to a CPU engine (Files): always, but
// where the caller named cufile itself (Fixed("cufile")), whose memory may
// be device memory. Engines the chooser picks (the adaptive dictionaries)
// serve host memory.
func (o Options) hostMemory() bool {
	f, fixed := o.Chooser.(Fixed)
	return !fixed || f != "cufile"
}

// Write writes the extents, in parallel pieces, each through its engine,
// one engine after the other and posix last. Extents packed without
// alignment share blocks, and two engines must not write one block at
// once: direct patches an edge block by reading it, changing its part and
// writing it back, under a lock only its own writers take, so a page-cache
// write landing in between would be overwritten on the disk and dropped
// from the cache. Within one engine, writers sharing a block are
// serialized by that engine. Page-cache writes after the others find
// their bytes on the disk. It may be called several times before Commit.
func (w *Writer) Write(exts []Extent) ([]Result, error) {
	engines := make([]string, len(exts))
	var order []string
	for i := range exts {
		engines[i] = cmp.Or(exts[i].Engine, w.o.Chooser.Engine(OpWrite, exts[i].size()))
		if !slices.Contains(order, engines[i]) {
			order = append(order, engines[i])
		}
		w.bytes += exts[i].size()
	}
	slices.SortStableFunc(order, func(a, b string) int { return cmp.Compare(b2i(a == "posix"), b2i(b == "posix")) })
	res := make([]Result, len(exts))
	for _, eng := range order {
		var idx []int
		var group []Extent
		for i := range exts {
			if engines[i] == eng {
				idx, group = append(idx, i), append(group, exts[i])
			}
		}
		r, err := run(w.files, group, repeat(eng, len(group)), OpWrite, cmp.Or(w.o.Workers, WriteWorkers), w.o)
		if err != nil {
			var ee *ExtentError
			if errors.As(err, &ee) {
				ee.Ext = idx[ee.Ext]
			}
			return nil, err
		}
		for k, i := range idx {
			res[i] = r[k]
		}
	}
	return res, nil
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Commit closes the temporary file and puts it in the target's place:
// fsync, rename, directory fsync (durable), or the rename alone. On error
// the temporary file is removed and the target is as it was.
func (w *Writer) Commit() (Stats, error) {
	if w.done {
		return Stats{}, fmt.Errorf("%w: transfer: commit of %s after commit or abort", gds.ErrInvalid, w.target)
	}
	w.done = true
	err := w.files.Close()
	if err == nil {
		err = commit(w.fs, w.tmp, w.target, w.durable)
	}
	if err != nil {
		_ = w.fs.Remove(w.tmp)
		return Stats{}, err
	}
	return Stats{Bytes: w.bytes, Engines: w.files.Engines(), Seconds: time.Since(w.start).Seconds(), Fallback: w.files.Fallback()}, nil
}

// Abort drops the write: the temporary file is closed and removed, the
// target untouched. Abort after Commit does nothing.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	_ = w.files.Close()
	_ = w.fs.Remove(w.tmp)
}
