package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/pyfastensor/pyfastensor/checkpoint"
)

// pft_ckpt_read_part reads nbytes of record index, from offset off of its
// data, into the caller's memory at addr (used during the call only);
// crcOut receives the part's own CRC-32, summed as it lands (0 without the
// options' verify). Nothing is checked: pft_ckpt_join_part joins the parts
// in order and checks the record at its last (checkpoint.Archive.ReadPart).
//
//export pft_ckpt_read_part
func pft_ckpt_read_part(h C.uint64_t, index, off C.int64_t, addr unsafe.Pointer, nbytes C.int64_t,
	options *C.char, crcOut *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		a, err := lookup[*checkpoint.Archive](h)
		if err != nil {
			return err
		}
		o, err := readOptions(options, nil)
		if err != nil {
			return err
		}
		p, err := memory(addr, C.size_t(nbytes))
		if err != nil {
			return err
		}
		crc, err := a.ReadPart(int(index), int64(off), p, o)
		if err != nil {
			return err
		}
		if crcOut != nil {
			*crcOut = C.int64_t(crc)
		}
		return nil
	})
}

// pft_ckpt_join_part joins partCRC, the CRC-32 of bytes [off, off+nbytes)
// of record index, to crcIn, that of the bytes before off; crcOut receives
// the sum. At the record's last part the total is checked against the
// central directory's CRC-32 (checkpoint.Archive.JoinPart).
//
//export pft_ckpt_join_part
func pft_ckpt_join_part(h C.uint64_t, index, off, nbytes, crcIn, partCRC C.int64_t, crcOut *C.int64_t,
	errOut **C.char) C.int {
	return call(errOut, func() error {
		a, err := lookup[*checkpoint.Archive](h)
		if err != nil {
			return err
		}
		crc, err := a.JoinPart(int(index), int64(off), int(nbytes), uint32(crcIn), uint32(partCRC))
		if err != nil {
			return err
		}
		if crcOut != nil {
			*crcOut = C.int64_t(crc)
		}
		return nil
	})
}

// pft_ckpt_sum_part sums nbytes at addr, bytes [off, off+nbytes) of record
// index already in the caller's memory (read back from a device), onto
// crcIn; crcOut receives the new sum. At the record's last part the total
// is checked against the central directory's CRC-32
// (checkpoint.Archive.SumPart). The memory is read during the call only.
//
//export pft_ckpt_sum_part
func pft_ckpt_sum_part(h C.uint64_t, index, off C.int64_t, addr unsafe.Pointer, nbytes C.int64_t, crcIn C.int64_t,
	crcOut *C.int64_t, errOut **C.char) C.int {
	return call(errOut, func() error {
		a, err := lookup[*checkpoint.Archive](h)
		if err != nil {
			return err
		}
		p, err := memory(addr, C.size_t(nbytes))
		if err != nil {
			return err
		}
		crc, err := a.SumPart(int(index), int64(off), p, uint32(crcIn))
		if err != nil {
			return err
		}
		if crcOut != nil {
			*crcOut = C.int64_t(crc)
		}
		return nil
	})
}
