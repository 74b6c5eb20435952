//go:build pftdebug

package main

/*
#include <stddef.h>
*/
import "C"

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// Test-only exports, built only with -tags pftdebug: the shipped library
// has none. They let the Python tests reach states a test machine cannot
// otherwise produce: a Go panic at the boundary, a full disk, a read-only
// directory, a filesystem without O_DIRECT. The tests build their own
// library with the tag (tests/native_build.py, tests/conftest.py) and call
// them through _lib.call (conftest.py's inject fixture), declared from that
// build's cgo header.

//export pft_debug_panic
func pft_debug_panic(msg *C.char, errOut **C.char) C.int {
	// For tests of the panic path: panics inside call, which must recover
	// it and poison the library. msg (NULL: "pft_debug_panic called") is
	// the panic's value, as long as a test wants it.
	return call(errOut, func() error {
		if msg != nil {
			panic(C.GoString(msg))
		}
		panic("pft_debug_panic called")
	})
}

// pft_debug_inject installs process-wide faults, for tests only (the
// Go-side injection points: transfer.SetDefaultFS, gds.InjectDirectOpen,
// gds.RegisterFault). spec is a JSON object with any of three keys:
//
//	{
//	  "commit":      {"op": "reserve", "errno": 28, "after": 0},
//	  "direct_open": {"errno": 22},
//	  "engine":      {"name": "full-posix", "base": "posix", "op": "write",
//	                  "errno": 28, "after": 3, "partial": true}
//	}
//
// The keys:
//
//   - "commit" fails a step of the durable commit (transfer/commit.go) of
//     every write given no FS (every checkpoint save): op is one of
//     "create", "reserve", "sync", "rename", "syncdir", "remove". A full
//     disk is {"op": "reserve", "errno": 28} (the reservation is where a
//     real one shows), a read-only directory {"op": "create", "errno": 30}.
//   - "direct_open" fails every open with O_DIRECT by the direct and uring
//     engines and by the directory probe: errno 22 (EINVAL, the default)
//     plays a filesystem without O_DIRECT, which they fall back from. The
//     probe is cached per directory, so only directories not probed yet in
//     this process see it.
//   - "engine" registers, under name (which must be free), an engine that
//     opens files with the engine registered as base (default "posix") and
//     fails its op: one of "open", "read", "write", "sync", "truncate",
//     "stat", "close". Code that takes an engine name (a save's engine=, the
//     spill store's engine=, pft_file_open) can then be pointed at it.
//     partial makes a failed read or write move the first half of its
//     bytes first (a short write, as a disk filling up mid-write does).
//
// In each, errno (default 5, EIO; 22 for direct_open) is the error the
// operation fails with, classified as a real one would be (28, ENOSPC, is
// a NoSpaceError; 30, EROFS, a PermissionError), and after (default 0) is
// how many matching operations succeed before every later one fails: a
// spill store with "after": 3 fills up on its fourth write, as a small
// filesystem does.
//
// Each call first removes every injection earlier calls installed, then
// installs its own: {} removes them all. A call that fails leaves nothing
// installed: a spec with an unknown key, op or value fails with an
// invalid-argument status whose message names it, an engine name already
// registered (or an unknown base) likewise.
//
//export pft_debug_inject
func pft_debug_inject(spec *C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		var s injectSpec
		err := parseStrictJSON(spec, &s)
		if err == nil {
			err = s.check()
		}
		if err != nil {
			_ = injections.replace(injectSpec{})
			return err
		}
		return injections.replace(s)
	})
}

// injectSpec is pft_debug_inject's argument.
type injectSpec struct {
	Commit     *commitFault `json:"commit"`
	DirectOpen *errnoFault  `json:"direct_open"`
	Engine     *engineFault `json:"engine"`
}

// errnoFault is what every injection has: the errno and how many matching
// operations pass first.
type errnoFault struct {
	Errno *int `json:"errno"`
	After int  `json:"after"`
}

type commitFault struct {
	errnoFault
	Op string `json:"op"`
}

type engineFault struct {
	errnoFault
	Name    string `json:"name"`
	Base    string `json:"base"`
	Op      string `json:"op"`
	Partial bool   `json:"partial"`
}

// The ops each injection may name.
var (
	commitOps = []string{string(transfer.FSCreate), string(transfer.FSReserve), string(transfer.FSSync),
		string(transfer.FSRename), string(transfer.FSSyncDir), string(transfer.FSRemove)}
	engineOps = []string{string(gds.OpOpen), string(gds.OpRead), string(gds.OpWrite), string(gds.OpSync),
		string(gds.OpTruncate), string(gds.OpSize), string(gds.OpClose)}
)

// check refuses a spec replace could not install.
func (s *injectSpec) check() error {
	if s.Commit != nil {
		if err := s.Commit.check("commit", s.Commit.Op, commitOps); err != nil {
			return err
		}
	}
	if s.DirectOpen != nil {
		if err := s.DirectOpen.check("direct_open", "", nil); err != nil {
			return err
		}
	}
	if e := s.Engine; e != nil {
		if e.Name == "" {
			return fmt.Errorf("%w: pft_debug_inject: engine.name is missing", gds.ErrInvalid)
		}
		if err := e.check("engine", e.Op, engineOps); err != nil {
			return err
		}
	}
	return nil
}

// check validates op against ops (when ops is given), errno and after.
func (f *errnoFault) check(key, op string, ops []string) error {
	if ops != nil && !slices.Contains(ops, op) {
		return fmt.Errorf("%w: pft_debug_inject: %s.op %q: expected one of %s",
			gds.ErrInvalid, key, op, strings.Join(ops, ", "))
	}
	if f.Errno != nil && (*f.Errno <= 0 || *f.Errno > 4095) {
		return fmt.Errorf("%w: pft_debug_inject: %s.errno %d: expected an errno (1 to 4095)", gds.ErrInvalid, key, *f.Errno)
	}
	if f.After < 0 {
		return fmt.Errorf("%w: pft_debug_inject: %s.after %d: expected a count >= 0", gds.ErrInvalid, key, f.After)
	}
	return nil
}

// errno is the injection's error: its errno, or def.
func (f *errnoFault) errno(def syscall.Errno) syscall.Errno {
	if f.Errno == nil {
		return def
	}
	return syscall.Errno(*f.Errno)
}

// passer returns a function that counts one matching operation and
// reports whether it is still among the first After, which succeed.
func (f *errnoFault) passer() func() bool {
	var seen atomic.Int64
	return func() bool { return seen.Add(1) <= int64(f.After) }
}

// injections holds what pft_debug_inject installed, as the functions that
// remove it.
var injections injected

type injected struct {
	mu      sync.Mutex
	restore []func()
}

// replace removes every earlier injection, then installs s's. On error
// what s installed is removed too.
func (in *injected) replace(s injectSpec) (err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for i := len(in.restore) - 1; i >= 0; i-- {
		in.restore[i]()
	}
	in.restore = nil
	defer func() {
		if err != nil {
			for i := len(in.restore) - 1; i >= 0; i-- {
				in.restore[i]()
			}
			in.restore = nil
		}
	}()
	if c := s.Commit; c != nil {
		pass, errno := c.passer(), c.errno(syscall.EIO)
		in.restore = append(in.restore, transfer.SetDefaultFS(&transfer.FaultFS{
			Base: transfer.OS,
			Fail: func(op transfer.FSOp, _ string, _ int64) error {
				if string(op) != c.Op || pass() {
					return nil
				}
				return errno
			},
		}))
	}
	if d := s.DirectOpen; d != nil {
		in.restore = append(in.restore, gds.InjectDirectOpen(d.injector(gds.OpOpen, syscall.EINVAL, false)))
	}
	if e := s.Engine; e != nil {
		unregister, err := gds.RegisterFault(e.Name, cmp.Or(e.Base, "posix"),
			e.injector(gds.OpKind(e.Op), syscall.EIO, e.Partial))
		if err != nil {
			return fmt.Errorf("pft_debug_inject: engine %q: %w", e.Name, err)
		}
		in.restore = append(in.restore, unregister)
	}
	return nil
}

// injector fails every operation of kind after the first After with the
// errno (def when none was given), the first half moved when partial.
func (f *errnoFault) injector(kind gds.OpKind, def syscall.Errno, partial bool) gds.Injector {
	fault := gds.Only(kind).WithError(f.errno(def))
	if partial {
		fault.Partial()
	}
	pass := f.passer()
	return gds.InjectorFunc(func(op gds.FaultOp) error {
		if op.Kind != kind || pass() {
			return nil
		}
		return fault.MaybeError(op)
	})
}

// parseStrictJSON decodes s into v as parseJSON does, but refuses keys v
// has no field for (a misspelt injection must not pass silently), and
// NULL.
func parseStrictJSON(s *C.char, v any) error {
	if s == nil {
		return fmt.Errorf("%w: pft_debug_inject: spec is NULL (pass {} to remove every injection)", gds.ErrInvalid)
	}
	d := json.NewDecoder(bytes.NewReader([]byte(C.GoString(s))))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: pft_debug_inject: %v", gds.ErrInvalid, err)
	}
	if d.More() {
		return fmt.Errorf("%w: pft_debug_inject: text after the JSON object", gds.ErrInvalid)
	}
	return nil
}
