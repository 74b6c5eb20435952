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

// Staged saves (checkpoint.TorchStaged, checkpoint.StagedRaw): begin with
// torch's archive (or a safetensors file, pft_safetensors_stage_begin)
// laid out, write the staged storages' (tensors') data in parts, commit or
// abort. A save larger than the memory it is staged through (a CUDA state
// through a bounded pinned buffer) goes this way.

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
		*handle = newHandle(stagedSave(torchStaged{s}))
		return nil
	})
}

// stagedSave is what pft_ckpt_stage_write, _commit and _abort take: a
// torch archive's staged save (parts by storage) or a safetensors file's
// (parts by tensor).
type stagedSave interface {
	write(parts []checkpoint.Part) error
	Commit() (checkpoint.Stats, error)
	Abort()
}

type torchStaged struct{ *checkpoint.TorchStaged }

func (s torchStaged) write(parts []checkpoint.Part) error { return s.WriteStorages(parts) }

type rawStaged struct{ *checkpoint.StagedRaw }

func (s rawStaged) write(parts []checkpoint.Part) error { return s.WriteParts(parts) }

// pft_ckpt_stage_write writes n parts of staged storages in one transfer
// (parallel pieces, as a whole save's): part j is sizes[j] bytes at
// addrs[j], the data of staged storage indices[j] (its place in
// pft_ckpt_stage_begin's keys, or in pft_safetensors_stage_begin's
// tensors) from offset offsets[j]. Parts of a storage come in order,
// within a call and from call to call. The memory is read during the call
// only.
//
//export pft_ckpt_stage_write
func pft_ckpt_stage_write(h C.uint64_t, n C.int64_t, indices, offsets *C.int64_t, addrs *unsafe.Pointer,
	sizes *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[stagedSave](h)
		if err != nil {
			return err
		}
		count := int(n)
		if count < 0 || (count > 0 && (indices == nil || offsets == nil || addrs == nil || sizes == nil)) {
			return fmt.Errorf("%w: %d parts with missing arrays", gds.ErrInvalid, count)
		}
		if count == 0 {
			return nil
		}
		is, offs, as, ss := unsafe.Slice(indices, count), unsafe.Slice(offsets, count), unsafe.Slice(addrs, count),
			unsafe.Slice(sizes, count)
		parts := make([]checkpoint.Part, count)
		for j := range parts {
			p, err := memory(as[j], C.size_t(ss[j]))
			if err != nil {
				return fmt.Errorf("part %d: %w", j, err)
			}
			parts[j] = checkpoint.Part{Rec: int(is[j]), Off: int64(offs[j]), Data: p}
		}
		return s.write(parts)
	})
}

// pft_ckpt_stage_commit writes the rest and commits the save (out: its
// stats, JSON); the handle is released either way, and a failed commit
// leaves nothing new at the path.
//
//export pft_ckpt_stage_commit
func pft_ckpt_stage_commit(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := release[stagedSave](h)
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
		s, err := release[stagedSave](h)
		if err != nil {
			return err
		}
		s.Abort()
		return nil
	})
}
