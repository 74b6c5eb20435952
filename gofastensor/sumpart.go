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
