package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"encoding/json"
	"os"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Engine files: open a file through a named engine, move bytes between
// caller memory and the file, close it. Used by benchmarks and by Python
// code that moves raw bytes.

// pft_file_open opens the file at path (open(2)'s flags and mode) through
// the engine options names (its its threads, task_size, queue_depth
// and cufile_library tune it); out receives the file's handle.
//
//export pft_file_open
func pft_file_open(path *C.char, flags C.int, mode C.int, options *C.char, out *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		o, err := parseOptions(options)
		if err != nil {
			return err
		}
		e, err := gds.New(o.Engine, o.engine())
		if err != nil {
			return err
		}
		f, err := e.Open(C.GoString(path), int(flags), os.FileMode(mode))
		if err != nil {
			return err
		}
		*out = newHandle(f)
		return nil
	})
}

// fileIO is the shared body of pft_file_read and pft_file_write.
func fileIO(h C.uint64_t, addr unsafe.Pointer, n C.size_t, off C.int64_t, write bool, done *C.size_t) error {
	f, err := lookup[gds.File](h)
	if err != nil {
		return err
	}
	p, err := memory(addr, n)
	if err != nil {
		return err
	}
	var k int
	if write {
		k, err = f.WriteAt(p, int64(off))
	} else {
		k, err = f.ReadAt(p, int64(off))
	}
	if done != nil {
		*done = C.size_t(k)
	}
	return err
}

//export pft_file_read
func pft_file_read(h C.uint64_t, addr unsafe.Pointer, n C.size_t, off C.int64_t, done *C.size_t, errOut **C.char) C.int {
	return call(errOut, func() error { return fileIO(h, addr, n, off, false, done) })
}

//export pft_file_write
func pft_file_write(h C.uint64_t, addr unsafe.Pointer, n C.size_t, off C.int64_t, done *C.size_t, errOut **C.char) C.int {
	return call(errOut, func() error { return fileIO(h, addr, n, off, true, done) })
}

//export pft_file_sync
func pft_file_sync(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		f, err := lookup[gds.File](h)
		if err != nil {
			return err
		}
		return f.Sync()
	})
}

//export pft_file_size
func pft_file_size(h C.uint64_t, out *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		f, err := lookup[gds.File](h)
		if err != nil {
			return err
		}
		n, err := f.Size()
		*out = C.int64_t(n)
		return err
	})
}

//export pft_file_truncate
func pft_file_truncate(h C.uint64_t, size C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		f, err := lookup[gds.File](h)
		if err != nil {
			return err
		}
		return f.Truncate(int64(size))
	})
}

// pft_file_describe returns, as JSON, the engine serving the file and the
// reason for any fallback: {"engine": "posix", "fallback": "..."}.
//
//export pft_file_describe
func pft_file_describe(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		f, err := lookup[gds.File](h)
		if err != nil {
			return err
		}
		b, err := json.Marshal(map[string]string{"engine": f.Engine(), "fallback": f.Fallback(), "path": f.Path()})
		if err != nil {
			return err
		}
		*out = cstring(string(b))
		return nil
	})
}

//export pft_file_close
func pft_file_close(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		f, err := release[gds.File](h)
		if err != nil {
			return err
		}
		return f.Close()
	})
}
