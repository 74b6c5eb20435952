package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/checkpoint"
	"github.com/pyfastensor/pyfastensor/gds"
)

// Checkpoints: write a whole archive in one call; open an archive (its
// validated central directory, as JSON) and read chosen records into caller
// memory. Python (pyfastensor/checkpoint) decides what the records hold.

// progressFunc adds to the caller's counter, which another thread may poll
// during the call.
func progressFunc(p *C.int64_t) func(int64) {
	if p == nil {
		return nil
	}
	return func(n int64) { atomic.AddInt64((*int64)(unsafe.Pointer(p)), n) }
}

// pft_ckpt_save_torch writes torch.save's zip archive at path
// (checkpoint.SaveTorch): records under prefix, the pickle (pklLen bytes
// at pkl), byteorder (NULL: no byteorder record), the serialization id,
// and n storages named by keys (separated by '\n') whose bytes are at
// addrs (sizes). The Go core lays the records out and aligns the storages.
// The memory is read during the call only. options (options.go): the
// engine choice (default, one engine for every record, or the
// dictionaries'), durable, the engine's tuning. progress: NULL, or a
// counter advanced by data bytes written. out: the stats, JSON.
//
//export pft_ckpt_save_torch
func pft_ckpt_save_torch(path, prefix, pkl *C.char, pklLen C.int64_t, byteorder, serial *C.char,
	n C.int64_t, keys *C.char, addrs *unsafe.Pointer, sizes *C.int64_t, options *C.char, progress *C.int64_t,
	out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		t, err := torchArchive(prefix, pkl, pklLen, byteorder, serial, int(n), keys, addrs, sizes, nil)
		if err != nil {
			return err
		}
		o, err := writeOptions(options, progress)
		if err != nil {
			return err
		}
		st, err := checkpoint.SaveTorch(C.GoString(path), t, o)
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}

// torchArchive turns pft_ckpt_save_torch's arguments into the archive
// they describe, over the caller's memory; staged as for torchStorages.
func torchArchive(prefix, pkl *C.char, pklLen C.int64_t, byteorder, serial *C.char,
	n int, keys *C.char, addrs *unsafe.Pointer, sizes *C.int64_t, staged []bool) (checkpoint.TorchArchive, error) {
	t := checkpoint.TorchArchive{Prefix: C.GoString(prefix), SerializationID: C.GoString(serial)}
	if byteorder != nil {
		t.ByteOrder = C.GoString(byteorder)
	}
	var err error
	if t.Pickle, err = memory(unsafe.Pointer(pkl), C.size_t(pklLen)); err != nil {
		return t, fmt.Errorf("data.pkl: %w", err)
	}
	t.Storages, err = torchStorages(n, keys, addrs, sizes, staged)
	return t, err
}

// torchStorages turns pft_ckpt_save_torch's C arrays into storages over
// the caller's memory; a storage marked in staged (nil: none) gets no
// memory (its bytes come later, pft_ckpt_stage_write).
func torchStorages(n int, keys *C.char, addrs *unsafe.Pointer, sizes *C.int64_t, staged []bool) ([]checkpoint.TorchStorage, error) {
	if n < 0 || (n > 0 && (keys == nil || addrs == nil || sizes == nil)) {
		return nil, fmt.Errorf("%w: %d storages with missing arrays", gds.ErrInvalid, n)
	}
	if n == 0 {
		return nil, nil
	}
	keyList := strings.Split(C.GoString(keys), "\n")
	if len(keyList) != n {
		return nil, fmt.Errorf("%w: %d keys for %d storages", gds.ErrInvalid, len(keyList), n)
	}
	as, ss := unsafe.Slice(addrs, n), unsafe.Slice(sizes, n)
	out := make([]checkpoint.TorchStorage, n)
	for i := range out {
		if staged != nil && staged[i] {
			out[i] = checkpoint.TorchStorage{Key: keyList[i]}
			continue
		}
		p, err := memory(as[i], C.size_t(ss[i]))
		if err != nil {
			return nil, fmt.Errorf("storage %q: %w", keyList[i], err)
		}
		out[i] = checkpoint.TorchStorage{Key: keyList[i], Data: p}
	}
	return out, nil
}

// pft_ckpt_open parses and validates the archive at path; out receives
// its description (checkpoint.Archive) as JSON and handle a handle for
// pft_ckpt_read.
//
//export pft_ckpt_open
func pft_ckpt_open(path *C.char, handle *C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		a, err := checkpoint.OpenArchive(C.GoString(path))
		if err != nil {
			return err
		}
		if err := putJSON(out, a); err != nil {
			return err
		}
		*handle = newHandle(a)
		return nil
	})
}

// pft_ckpt_load opens the file at path for a load (checkpoint.Load), with
// one open and one read of its end records: out receives its description
// (checkpoint.Archive: the fallback to torch.load and its reason, the
// entries with their planned memory, the plan, and the address of the
// mapping a cold file was read whole into, which the caller then owns)
// and handle a handle for pft_ckpt_read. parseOnly: the caller reads the
// records its own way (a mapped load, or one to a device). options
// (options.go): verify, the engine choice (one named rules out a whole
// read), the engine's tuning. progress: NULL, or a counter advanced by the
// bytes of a whole read.
//
//export pft_ckpt_load
func pft_ckpt_load(path *C.char, parseOnly C.int, options *C.char, progress *C.int64_t, handle *C.uint64_t,
	out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		o, err := readOptions(options, progress)
		if err != nil {
			return err
		}
		a, err := checkpoint.Load(C.GoString(path), checkpoint.LoadOptions{ParseOnly: parseOnly != 0, Read: o})
		if err != nil {
			return err
		}
		if err := putJSON(out, a); err != nil {
			a.Close()
			a.DropArena()
			return err
		}
		*handle = newHandle(a)
		return nil
	})
}

// pft_ckpt_resident returns, as a JSON list, the share of each record's
// data in the page cache (checkpoint.Archive.Resident), for inspection:
// a load takes its residency from pft_ckpt_load.
//
//export pft_ckpt_resident
func pft_ckpt_resident(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		a, err := lookup[*checkpoint.Archive](h)
		if err != nil {
			return err
		}
		r, err := a.Resident()
		if err != nil {
			return err
		}
		return putJSON(out, r)
	})
}

// pft_ckpt_read reads n records (indices into the archive's entries) into
// the caller's memory at addrs, whose sizes must be the records' sizes,
// checking CRC-32s with the options' verify. The memory is used during the
// call only.
//
//export pft_ckpt_read
func pft_ckpt_read(h C.uint64_t, n C.int64_t, indices *C.int64_t, addrs *unsafe.Pointer, sizes *C.int64_t,
	options *C.char, progress *C.int64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		o, err := readOptions(options, progress)
		if err != nil {
			return err
		}
		a, reqs, err := readRequests(h, n, indices, addrs, sizes)
		if err != nil {
			return err
		}
		st, err := a.Read(reqs, o)
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}

// pft_ckpt_verify checks n records whose bytes are already in the
// caller's memory at addrs (a mapping of the file, for a load with
// mmap=True): their CRC-32s against the central directory's
// (checkpoint.Archive.Verify). The memory is read during the call only.
//
//export pft_ckpt_verify
func pft_ckpt_verify(h C.uint64_t, n C.int64_t, indices *C.int64_t, addrs *unsafe.Pointer, sizes *C.int64_t,
	options *C.char, progress *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		o, err := parseOptions(options)
		if err != nil {
			return err
		}
		a, reqs, err := readRequests(h, n, indices, addrs, sizes)
		if err != nil {
			return err
		}
		return a.Verify(reqs, checkpoint.ReadOptions{Workers: o.Workers, Progress: progressFunc(progress)})
	})
}

// readRequests returns the archive of handle h and C arrays of its record
// indices, addresses and sizes as read requests over that memory.
func readRequests(h C.uint64_t, n C.int64_t, indices *C.int64_t, addrs *unsafe.Pointer, sizes *C.int64_t) (*checkpoint.Archive, []checkpoint.ReadRequest, error) {
	a, err := lookup[*checkpoint.Archive](h)
	if err != nil {
		return nil, nil, err
	}
	reqs, err := overMemory(int(n), indices, addrs, sizes, "records", func(index int64, p []byte) checkpoint.ReadRequest {
		return checkpoint.ReadRequest{Index: int(index), Dst: p}
	})
	return a, reqs, err
}

// overMemory turns n C triples (key, address, size) into build(key, the
// caller's memory at address); what names the triples in errors.
func overMemory[T any](n int, keys *C.int64_t, addrs *unsafe.Pointer, sizes *C.int64_t, what string,
	build func(key int64, p []byte) T) ([]T, error) {
	if n < 0 || (n > 0 && (keys == nil || addrs == nil || sizes == nil)) {
		return nil, fmt.Errorf("%w: %d %s with missing arrays", gds.ErrInvalid, n, what)
	}
	out := make([]T, n)
	if n == 0 {
		return out, nil
	}
	ks, as, ss := unsafe.Slice(keys, n), unsafe.Slice(addrs, n), unsafe.Slice(sizes, n)
	for i := range out {
		p, err := memory(as[i], C.size_t(ss[i]))
		if err != nil {
			return nil, err
		}
		out[i] = build(int64(ks[i]), p)
	}
	return out, nil
}

//export pft_ckpt_close
func pft_ckpt_close(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		a, err := release[*checkpoint.Archive](h)
		if err != nil {
			return err
		}
		return a.Close()
	})
}

// extents turns C arrays of offsets, addresses and sizes into extents over
// the caller's memory.
func extents(n int, offsets *C.int64_t, addrs *unsafe.Pointer, sizes *C.int64_t) ([]checkpoint.Extent, error) {
	return overMemory(n, offsets, addrs, sizes, "extents", func(off int64, p []byte) checkpoint.Extent {
		return checkpoint.Extent{Off: off, Data: p}
	})
}

// pft_raw_read fills n extents (offsets, addresses, sizes) from the file
// at path, in parallel.
//
//export pft_raw_read
func pft_raw_read(path *C.char, n C.int64_t, offsets *C.int64_t, addrs *unsafe.Pointer, sizes *C.int64_t,
	options *C.char, progress *C.int64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		o, err := readOptions(options, progress)
		if err != nil {
			return err
		}
		ext, err := extents(int(n), offsets, addrs, sizes)
		if err != nil {
			return err
		}
		st, err := checkpoint.ReadRaw(C.GoString(path), ext, o)
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}
