package gds

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Residency tells which pages of a file are in the page cache, as mincore
// saw them when it was taken. A load uses it to choose per record between
// the page-cache path (a resident record is a memory copy away) and the
// direct path (a cold one is read from the device at its full bandwidth,
// without the kernel's copy).
type Residency struct {
	page  int64
	first int64  // page number of in[0]
	in    []byte // one byte per page, bit 0 set when resident
}

// FileResidency maps path read-only, asks mincore which of its pages are
// resident and unmaps it. Mapping touches no data: the call costs one
// byte of memory per page of the file and a walk of its page tables. An
// empty file has an empty residency.
func FileResidency(path string) (*Residency, error) {
	return RangeResidency(path, 0, -1)
}

// RangeResidency is FileResidency for the bytes [lo, hi) of the file only
// (hi < 0: to its end); pages outside count as absent. A load asks for the
// span of the records it reads, so a lazy load of one tensor from a large
// file looks at that tensor's pages only.
func RangeResidency(path string, lo, hi int64) (*Residency, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, opErr("resident", "open", path, 0, 0, 0, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, opErr("resident", "stat", path, 0, 0, 0, err)
	}
	page := int64(os.Getpagesize())
	if hi < 0 || hi > st.Size() {
		hi = st.Size()
	}
	lo = alignDown(max(lo, 0), page)
	r := &Residency{page: page, first: lo / page}
	if lo >= hi {
		return r, nil
	}
	m, err := unix.Mmap(int(f.Fd()), lo, int(hi-lo), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, opErr("resident", "mmap", path, lo, int(hi-lo), 0, err)
	}
	defer unix.Munmap(m)
	r.in = make([]byte, (hi-lo+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)),
		uintptr(unsafe.Pointer(&r.in[0]))); e != 0 {
		return nil, opErr("resident", "mincore", path, lo, int(hi-lo), 0, e)
	}
	return r, nil
}

// Fraction returns the share of the pages of [off, off+n) that were
// resident, from 0 to 1. Pages past the end of the file count as absent;
// an empty range is fully resident.
func (r *Residency) Fraction(off, n int64) float64 {
	if n <= 0 {
		return 1
	}
	lo, hi := off/r.page, (off+n+r.page-1)/r.page
	in := 0
	for p := lo; p < hi; p++ {
		if i := p - r.first; i >= 0 && i < int64(len(r.in)) && r.in[i]&1 != 0 {
			in++
		}
	}
	return float64(in) / float64(hi-lo)
}
