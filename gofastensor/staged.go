package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/pyfastensor/pyfastensor/checkpoint"
	"github.com/pyfastensor/pyfastensor/gds"
)

// Staged saves (checkpoint.Staged): begin with the records laid out, write
// the staged records' data in parts, commit or abort. A save larger than
// the memory it is staged through (a CUDA state through a bounded pinned
// buffer) goes this way.

// pft_ckpt_stage_begin lays out n records for a staged save at path and
// creates its temporary file; handle receives the save's handle. names
// holds the record names separated by '\n'; staged[i] non-zero marks a
// record whose sizes[i] bytes come later (pft_ckpt_stage_write; addrs[i]
// is then ignored); every other record's memory (addrs[i], sizes[i]) is
// read at pft_ckpt_stage_commit, so the caller keeps it alive until the
// commit or abort returns. Options as for pft_ckpt_save_torch.
//
//export pft_ckpt_stage_begin
func pft_ckpt_stage_begin(path *C.char, n C.int64_t, names *C.char, addrs *unsafe.Pointer, sizes, aligns *C.int64_t,
	staged *C.int, options *C.char, handle *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		count := int(n)
		if count < 0 || (count > 0 && (names == nil || addrs == nil || sizes == nil || aligns == nil || staged == nil)) {
			return fmt.Errorf("%w: %d records with missing arrays", gds.ErrInvalid, count)
		}
		o, err := writeOptions(options, nil)
		if err != nil {
			return err
		}
		nameList := strings.Split(C.GoString(names), "\n")
		if count > 0 && len(nameList) != count {
			return fmt.Errorf("%w: %d names for %d records", gds.ErrInvalid, len(nameList), count)
		}
		recs := make([]checkpoint.Record, count)
		flags := make([]bool, count)
		lens := make([]int64, count)
		if count > 0 {
			as, ss, als, st := unsafe.Slice(addrs, count), unsafe.Slice(sizes, count), unsafe.Slice(aligns, count), unsafe.Slice(staged, count)
			for i := range recs {
				recs[i] = checkpoint.Record{Name: nameList[i], Align: int64(als[i])}
				flags[i], lens[i] = st[i] != 0, int64(ss[i])
				if flags[i] {
					continue
				}
				if recs[i].Data, err = memory(as[i], C.size_t(ss[i])); err != nil {
					return fmt.Errorf("record %q: %w", nameList[i], err)
				}
				lens[i] = -1
			}
		}
		s, err := checkpoint.BeginStaged(C.GoString(path), recs, flags, lens, o)
		if err != nil {
			return err
		}
		*handle = newHandle(s)
		return nil
	})
}

// pft_ckpt_stage_write writes nbytes at addr as the data of staged record
// index from offset off (parts of a record in order). The memory is read
// during the call only.
//
//export pft_ckpt_stage_write
func pft_ckpt_stage_write(h C.uint64_t, index C.int64_t, off C.int64_t, addr unsafe.Pointer, nbytes C.int64_t,
	errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := lookup[*checkpoint.Staged](h)
		if err != nil {
			return err
		}
		p, err := memory(addr, C.size_t(nbytes))
		if err != nil {
			return err
		}
		return s.WritePart(int(index), int64(off), p)
	})
}

// pft_ckpt_stage_commit writes the rest and commits the save (out: its
// stats, JSON); the handle is released either way, and a failed commit
// leaves nothing new at the path.
//
//export pft_ckpt_stage_commit
func pft_ckpt_stage_commit(h C.uint64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		s, err := release[*checkpoint.Staged](h)
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
		s, err := release[*checkpoint.Staged](h)
		if err != nil {
			return err
		}
		s.Abort()
		return nil
	})
}
