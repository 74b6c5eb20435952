package gds

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Populate maps the pages of p in one madvise call (MADV_POPULATE_READ or,
// with write, MADV_POPULATE_WRITE; Linux 5.14) rather than one fault per
// page (or per 16 pages) as a copy or a sum reaches them. Best effort:
// where it fails (an older kernel; a hole past the end of a truncated
// file; memory that cannot be written), the access that follows faults
// the pages in itself, or faults and says so.
//
// For reading, the pages p touches are mapped (a mapping's pages are the
// page cache's: nothing changes). For writing, only the pages wholly
// inside p are: a page p shares with its neighbours is left to the copy,
// so that memory outside p is never faulted in writable on its behalf;
// and none are when the first of them is in memory already (memory a
// load reuses, pyfastensor/_buffers.py FreedPages): walking mapped pages
// again cost a third of a warm ResNet-50 read into reused memory (10.2
// ms against 7.6, the page-table lock contended by both workers).
func Populate(p []byte, write bool) {
	if len(p) == 0 {
		return
	}
	page := uintptr(os.Getpagesize())
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	hi := lo + uintptr(len(p))
	advice := uintptr(unix.MADV_POPULATE_READ)
	if write {
		lo, hi = (lo+page-1)&^(page-1), hi&^(page-1)
		advice = unix.MADV_POPULATE_WRITE
	} else {
		lo &^= page - 1
	}
	if hi <= lo || write && mapped(lo, page) {
		return
	}
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, lo, hi-lo, advice)
}

// mapped reports whether the page at lo is in memory (mincore): a guess
// for the rest of the range, which costs speed only when wrong.
func mapped(lo, page uintptr) bool {
	var vec [1]byte
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, lo, page, uintptr(unsafe.Pointer(&vec[0])))
	return errno == 0 && vec[0]&1 != 0
}
