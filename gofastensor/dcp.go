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

// torch.distributed.checkpoint data files (checkpoint/dcp.go): write one
// rank's items, read byte ranges of records, commit the metadata. Python
// (pyfastensor/dcp) does DCP's planning and pickles its metadata; records
// cross as JSON (checkpoint.DCPRecord, page sums in base64), memory as
// addresses used during the call only.

// pft_dcp_save writes n items as a data file at path. names holds the item
// names separated by '\n'; addrs and sizes are arrays of n. options,
// progress as for pft_ckpt_save_torch. out: {"records": [DCPRecord...],
// "stats": {...}} as JSON.
//
//export pft_dcp_save
func pft_dcp_save(path *C.char, n C.int64_t, names *C.char, addrs *unsafe.Pointer, sizes *C.int64_t,
	options *C.char, progress *C.int64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		if n < 0 || (n > 0 && (names == nil || addrs == nil || sizes == nil)) {
			return fmt.Errorf("%w: %d items with missing arrays", gds.ErrInvalid, n)
		}
		var nameList []string
		if n > 0 {
			nameList = strings.Split(C.GoString(names), "\n")
			if len(nameList) != int(n) {
				return fmt.Errorf("%w: %d names for %d items", gds.ErrInvalid, len(nameList), n)
			}
		}
		items, err := overMemory(int(n), sizes, addrs, sizes, "items", func(_ int64, p []byte) checkpoint.DCPItem {
			return checkpoint.DCPItem{Data: p}
		})
		if err != nil {
			return err
		}
		for i := range items {
			items[i].Name = nameList[i]
		}
		o, err := writeOptions(options, progress)
		if err != nil {
			return err
		}
		recs, st, err := checkpoint.SaveDCP(C.GoString(path), items, o)
		if err != nil {
			return err
		}
		return putJSON(out, map[string]any{"records": recs, "stats": st})
	})
}

// pft_dcp_read fills n ranges from the data file at path. records is JSON,
// the file's records as pft_dcp_save returned them (those the ranges
// name); range i is bytes [offs[i], offs[i]+sizes[i]) of record recs[i],
// read into addrs[i]. With the options' verify every byte read is checked
// (checkpoint.ReadDCP). out: the stats, JSON.
//
//export pft_dcp_read
func pft_dcp_read(path, records *C.char, n C.int64_t, recs, offs *C.int64_t, addrs *unsafe.Pointer,
	sizes *C.int64_t, options *C.char, progress *C.int64_t, out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		var rs []checkpoint.DCPRecord
		if err := parseJSON(records, &rs); err != nil {
			return err
		}
		if n > 0 && recs == nil {
			return fmt.Errorf("%w: %d ranges with missing arrays", gds.ErrInvalid, n)
		}
		ranges, err := overMemory(int(n), offs, addrs, sizes, "ranges", func(off int64, p []byte) checkpoint.DCPRange {
			return checkpoint.DCPRange{Off: off, Dst: p}
		})
		if err != nil {
			return err
		}
		if n > 0 {
			for i, r := range unsafe.Slice(recs, n) {
				ranges[i].Record = int(r)
			}
		}
		o, err := readOptions(options, progress)
		if err != nil {
			return err
		}
		st, err := checkpoint.ReadDCP(C.GoString(path), rs, ranges, o)
		if err != nil {
			return err
		}
		return putJSON(out, st)
	})
}

// pft_dcp_commit writes size bytes at addr as the file name in dir, the
// checkpoint's metadata, with the commit protocol (the options' durable:
// fsyncs), then removes the data files of earlier saves there: those not
// in keep (names separated by '\n') (checkpoint.CommitDCP). out: the
// paths removed, JSON.
//
//export pft_dcp_commit
func pft_dcp_commit(dir, name *C.char, addr unsafe.Pointer, size C.int64_t, keep *C.char, options *C.char,
	out **C.char, errOut **C.char) C.int {
	return call(errOut, func() error {
		o, err := parseOptions(options)
		if err != nil {
			return err
		}
		meta, err := memory(addr, C.size_t(size))
		if err != nil {
			return err
		}
		var keepList []string
		if keep != nil && C.GoString(keep) != "" {
			keepList = strings.Split(C.GoString(keep), "\n")
		}
		removed, err := checkpoint.CommitDCP(C.GoString(dir), C.GoString(name), meta, keepList,
			checkpoint.WriteOptions{NotDurable: !o.Durable})
		if err != nil {
			return err
		}
		if removed == nil {
			removed = []string{}
		}
		return putJSON(out, removed)
	})
}
