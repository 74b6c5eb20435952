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
	"github.com/pyfastensor/pyfastensor/transfer"
)

// Ring reads (transfer.Ring): a file read through a ring of slots reused
// from fill to fill, one transfer for them all; the caller takes the fills
// in order and releases each slot once it has copied it out (a CUDA load
// through its pinned ring). Records of an archive (pft_ckpt_ring_start,
// their CRC-32s checked) or raw extents of a file (pft_raw_ring_start, a
// safetensors file's tensors); pft_ring_next and pft_ring_close serve both.

// ringRead is what pft_ring_next and pft_ring_close take.
type ringRead interface {
	Next(release int) (int, error)
	Close() error
}

var (
	_ ringRead = (*checkpoint.RingRead)(nil)
	_ ringRead = (*checkpoint.RawRing)(nil)
)

// pft_ckpt_ring_start starts reading records of archive h through nslots
// slots of slotBytes bytes each at slotAddrs: fill k goes to slot
// fillSlots[k] (of nfills), and part j (of nparts) is bytes
// [offs[j], offs[j]+lens[j]) of record recs[j], read into fill fills[j]'s
// slot at ats[j]. Parts come in fill order, a record's in order, each
// record touched whole. options: pft_ckpt_read's (verify, the engine
// choice). progress: NULL, or a counter advanced by the bytes landed. The
// slots are written until pft_ring_close returns, and the archive is kept
// open until then.
//
//export pft_ckpt_ring_start
func pft_ckpt_ring_start(h C.uint64_t, nslots C.int64_t, slotAddrs *unsafe.Pointer, slotBytes C.int64_t,
	nfills C.int64_t, fillSlots *C.int64_t, nparts C.int64_t, fills, recs, offs, lens, ats *C.int64_t,
	options *C.char, progress *C.int64_t, handle *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		a, err := lookup[*checkpoint.Archive](h)
		if err != nil {
			return err
		}
		o, slots, fs, parts, err := ringPlan(nslots, slotAddrs, slotBytes, nfills, fillSlots, nparts, fills, offs, lens, ats,
			options, progress)
		if err != nil {
			return err
		}
		if len(parts) > 0 && recs == nil {
			return fmt.Errorf("%w: ring read of %d parts without their records", gds.ErrInvalid, len(parts))
		}
		ps := make([]checkpoint.RingPart, len(parts))
		rs := unsafe.Slice(recs, len(parts))
		for j, p := range parts {
			ps[j] = checkpoint.RingPart{Fill: p.Fill, Rec: int(rs[j]), Off: p.Off, Len: p.Len, At: p.At}
		}
		r, err := a.StartRing(slots, fs, ps, o)
		if err != nil {
			return err
		}
		*handle = newHandle(ringRead(r))
		return nil
	})
}

// pft_raw_ring_start starts reading extents of the file at path through
// slots, as pft_ckpt_ring_start does records: part j is bytes
// [offs[j], offs[j]+lens[j]) of the file, read into fill fills[j]'s slot at
// ats[j]. Nothing is checksummed. The slots are written until
// pft_ring_close returns.
//
//export pft_raw_ring_start
func pft_raw_ring_start(path *C.char, nslots C.int64_t, slotAddrs *unsafe.Pointer, slotBytes C.int64_t,
	nfills C.int64_t, fillSlots *C.int64_t, nparts C.int64_t, fills, offs, lens, ats *C.int64_t,
	options *C.char, progress *C.int64_t, handle *C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		o, slots, fs, parts, err := ringPlan(nslots, slotAddrs, slotBytes, nfills, fillSlots, nparts, fills, offs, lens, ats,
			options, progress)
		if err != nil {
			return err
		}
		r, err := checkpoint.StartRawRing(C.GoString(path), slots, fs, parts, o)
		if err != nil {
			return err
		}
		*handle = newHandle(ringRead(r))
		return nil
	})
}

// ringPlan reads the C arrays of a ring read: the options, the slots over
// the caller's memory, each fill's slot, and the parts as extents (Off:
// offs[j], within the record or the file).
func ringPlan(nslots C.int64_t, slotAddrs *unsafe.Pointer, slotBytes C.int64_t, nfills C.int64_t, fillSlots *C.int64_t,
	nparts C.int64_t, fills, offs, lens, ats *C.int64_t, options *C.char, progress *C.int64_t,
) (checkpoint.ReadOptions, [][]byte, []int, []transfer.RingExtent, error) {
	o, err := readOptions(options, progress)
	if err != nil {
		return o, nil, nil, nil, err
	}
	ns, nf, np := int(nslots), int(nfills), int(nparts)
	if ns < 0 || nf < 0 || np < 0 || (ns > 0 && slotAddrs == nil) || (nf > 0 && fillSlots == nil) ||
		(np > 0 && (fills == nil || offs == nil || lens == nil || ats == nil)) {
		return o, nil, nil, nil, fmt.Errorf("%w: ring read of %d slots, %d fills, %d parts with missing arrays",
			gds.ErrInvalid, ns, nf, np)
	}
	slots := make([][]byte, ns)
	for i, addr := range unsafe.Slice(slotAddrs, ns) {
		if slots[i], err = memory(addr, C.size_t(slotBytes)); err != nil {
			return o, nil, nil, nil, fmt.Errorf("slot %d: %w", i, err)
		}
	}
	fs := make([]int, nf)
	for k, s := range unsafe.Slice(fillSlots, nf) {
		fs[k] = int(s)
	}
	parts := make([]transfer.RingExtent, np)
	if np > 0 {
		f, off, n, at := unsafe.Slice(fills, np), unsafe.Slice(offs, np), unsafe.Slice(lens, np), unsafe.Slice(ats, np)
		for j := range parts {
			parts[j] = transfer.RingExtent{Fill: int(f[j]), Off: int64(off[j]), Len: int64(n[j]), At: int64(at[j])}
		}
	}
	return o, slots, fs, parts, nil
}

// pft_ring_next releases fill release's slot (-1: none; a fill this call
// returned before, whose slot the caller has copied out), then waits for
// the next fill in order to land (for an archive's records, checking the
// CRC-32 of each record it completes); out receives the fill's index, or
// -1 once every fill has been returned.
//
//export pft_ring_next
func pft_ring_next(h C.uint64_t, release C.int64_t, out *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		r, err := lookup[ringRead](h)
		if err != nil {
			return err
		}
		k, err := r.Next(int(release))
		if err != nil {
			return err
		}
		*out = C.int64_t(k)
		return nil
	})
}

// pft_ring_close stops the read and returns once no read is in flight, so
// the slots are no longer written; the handle is released either way. It
// fails with the read's error, where a read failed.
//
//export pft_ring_close
func pft_ring_close(h C.uint64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		r, err := release[ringRead](h)
		if err != nil {
			return err
		}
		return r.Close()
	})
}
