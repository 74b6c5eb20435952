package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/checkpoint"
	"github.com/pyfastensor/pyfastensor/gds"
)

// Staged saves (checkpoint.TorchStaged): begin with torch's archive laid
// out, write the staged storages' data in parts, commit or abort. A save larger than
// the memory it is staged through (a CUDA state through a bounded pinned
// buffer) goes this way.

// pft_ckpt_stage_begin lays out torch.save's zip archive for a staged save
// at path, as pft_ckpt_save_torch lays it out (the records, their order
// and the storages' alignment decided here), and creates its temporary
// file; handle receives the save's handle. prefix, pkl, byteorder, serial,
// keys, addrs and sizes are pft_ckpt_save_torch's; staged[k] non-zero marks
// a storage whose sizes[k] bytes come later (pft_ckpt_stage_write; addrs[k]
// is then ignored). The pickle and every other storage's memory are read at
// pft_ckpt_stage_commit, so the caller keeps them alive until the commit or
// abort returns. Options as for pft_ckpt_save_torch.
//
//export pft_ckpt_stage_begin
func pft_ckpt_stage_begin(path, prefix, pkl *C.char, pklLen C.int64_t, byteorder, serial *C.char,
	n C.int64_t, keys *C.char, addrs *unsafe.Pointer, sizes *C.int64_t, staged *C.int, options *C.char,
	handle *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		count := int(n)
		if count > 0 && (staged == nil || sizes == nil) {
			return fmt.Errorf("%w: %d storages without their staged flags or sizes", gds.ErrInvalid, count)
		}
		flags, lens := make([]bool, max(count, 0)), make([]int64, max(count, 0))
		if count > 0 {
			st, ss := unsafe.Slice(staged, count), unsafe.Slice(sizes, count)
			for k := range flags {
				flags[k], lens[k] = st[k] != 0, -1
				if flags[k] {
					lens[k] = int64(ss[k])
				}
			}
		}
		t, err := torchArchive(prefix, pkl, pklLen, byteorder, serial, count, keys, addrs, sizes, flags)
		if err != nil {
			return err
		}
		o, err := writeOptions(options, nil)
		if err != nil {
			return err
		}
		s, err := checkpoint.BeginTorchStaged(C.GoString(path), t, flags, lens, o)
		if err != nil {
			return err
		}
		*handle = newHandle(s)
		return nil
	})
}

// pft_ckpt_stage_write writes nbytes at addr as the data of staged storage
// index (its place in pft_ckpt_stage_begin's keys) from offset off (parts
// of a storage in order). The memory is read during the call only.
//
//export pft_ckpt_stage_write
func pft_ckpt_stage_write(h C.uint64_t, index C.int64_t, off C.int64_t, addr unsafe.Pointer, nbytes C.int64_t,
	errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*checkpoint.TorchStaged](h)
		if err != nil {
			return err
		}
		p, err := memory(addr, C.size_t(nbytes))
		if err != nil {
			return err
		}
		return s.WriteStorage(int(index), int64(off), p)
	})
}

// pft_ckpt_stage_commit writes the rest and commits the save (out: its
// stats, JSON); the handle is released either way, and a failed commit
// leaves nothing new at the path.
//
//export pft_ckpt_stage_commit
func pft_ckpt_stage_commit(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := release[*checkpoint.TorchStaged](h)
		if err != nil {
			return err
		}
		st, err := s.Commit()
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}

// pft_ckpt_stage_abort drops the save (its temporary file removed) and
// releases the handle.
//
//export pft_ckpt_stage_abort
func pft_ckpt_stage_abort(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := release[*checkpoint.TorchStaged](h)
		if err != nil {
			return err
		}
		s.Abort()
		return nil
	})
}
