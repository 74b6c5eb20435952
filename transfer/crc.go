package transfer

import (
	"hash/crc32"
	"sync"
	"sync/atomic"

	"github.com/pyfastensor/pyfastensor/gds"
)

// CRC-32 as zip and our other formats define it: the IEEE polynomial
// (hash/crc32.IEEE), not Castagnoli. Large extents are checksummed in
// pieces on several goroutines, alongside their transfers; Combine joins
// the pieces' checksums without touching the data again.

// Checksum returns the CRC-32 (IEEE) of p.
func Checksum(p []byte) uint32 { return crc32.ChecksumIEEE(p) }

// Combine returns the CRC-32 of A followed by B, given crc1 = CRC(A),
// crc2 = CRC(B) and len2 = len(B). It is zlib's crc32_combine: appending
// len2 zero bytes to A is a linear map over GF(2) (shiftOp), and
// CRC(A‖B) = shift(crc1) ^ crc2. A zero crc1 maps to zero, so the first
// piece of a record costs nothing.
func Combine(crc1, crc2 uint32, len2 int64) uint32 {
	if len2 <= 0 {
		return crc1
	}
	if crc1 == 0 {
		return crc2
	}
	return gf2Times(shiftOp(len2), crc1) ^ crc2
}

// shiftOps caches shiftOp by length: a record's pieces are all one task
// size but the last, so a load needs few distinct operators.
var shiftOps sync.Map // int64 -> *[32]uint32

// shiftOpsMax bounds the cache.
const shiftOpsMax = 256

var shiftOpsLen atomic.Int64

// shiftOp returns the operator that appends n zero bytes to a CRC-32:
// the one-zero-bit operator raised to 8n by repeated squaring.
func shiftOp(n int64) *[32]uint32 {
	if m, ok := shiftOps.Load(n); ok {
		return m.(*[32]uint32)
	}
	var even, odd [32]uint32
	odd[0] = 0xedb88320 // the reflected IEEE polynomial: one zero bit
	row := uint32(1)
	for i := 1; i < 32; i++ {
		odd[i] = row
		row <<= 1
	}
	gf2Square(&even, &odd) // two zero bits
	gf2Square(&odd, &even) // four zero bits
	op := new([32]uint32)
	for i := range op {
		op[i] = 1 << i // identity
	}
	sq, next := &odd, &even
	for len2 := n; len2 != 0; len2 >>= 1 {
		gf2Square(next, sq) // 8, 16, 32... zero bits: one, two, four... bytes
		sq, next = next, sq
		if len2&1 != 0 {
			var c [32]uint32
			for i := range c {
				c[i] = gf2Times(sq, op[i])
			}
			*op = c
		}
	}
	if shiftOpsLen.Add(1) <= shiftOpsMax {
		shiftOps.Store(n, op)
	}
	return op
}

func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

func gf2Square(square, mat *[32]uint32) {
	for n := range 32 {
		square[n] = gf2Times(mat, mat[n])
	}
}

// PieceCRCs collects the checksums of an extent's pieces, in any order, and
// joins them in file order. Set may be called from many goroutines for
// distinct pieces.
type PieceCRCs struct {
	crc []uint32
	n   []int64
}

// NewPieceCRCs is room for the checksums of an extent of that many pieces.
func NewPieceCRCs(pieces int) *PieceCRCs {
	return &PieceCRCs{crc: make([]uint32, pieces), n: make([]int64, pieces)}
}

// Set records piece i's checksum and length.
func (p *PieceCRCs) Set(i int, crc uint32, n int64) { p.crc[i], p.n[i] = crc, n }

// Total is the extent's checksum.
func (p *PieceCRCs) Total() uint32 {
	var c uint32
	for i := range p.crc {
		c = Combine(c, p.crc[i], p.n[i])
	}
	return c
}

// MoveSummed writes (write) or reads p at off through f, returning the
// CRC-32 of p when sum is set. On error it returns the bytes moved before
// it.
//
// Page-cache writes go in SumChunk steps, each summed just before the
// kernel copies it, while the bytes are in the CPU cache. Other writes
// (direct, io_uring, GDS: the device's DMA reads memory, not the cache)
// are summed first and go in one request, as reads do: the device needs
// large requests queued to reach its bandwidth (1 MiB reads measured 1.5
// GB/s where 8 MiB ones reached the disk's 2.1; a durable ResNet-50 save's
// writes took 63 ms in 8 MiB requests against 72 in 1 MiB ones). Reads
// that the CPU copies out of the page cache go in steps too, each summed
// just after it lands (readSummed); other reads go in one request, and
// the data a direct read lands in memory is not in the cache anyway; the
// sum follows.
func MoveSummed(f gds.File, write bool, p []byte, off int64, sum bool) (uint32, int, error) {
	if !write && cpuCopies(f) {
		// New memory (a load's tensors) is mapped in one madvise rather
		// than faulted page by page inside the kernel's copy.
		gds.Populate(p, true)
		if sum {
			return readSummed(f, p, off)
		}
	}
	if !write {
		n, err := f.ReadAt(p, off)
		if err != nil || !sum {
			return 0, n, err
		}
		return crc32.Update(0, crc32.IEEETable, p), n, nil
	}
	var crc uint32
	done := 0
	step := SumChunk
	if !cpuCopies(f) {
		step = len(p)
	}
	for done < len(p) {
		q := p[done:min(done+step, len(p))]
		if sum {
			crc = crc32.Update(crc, crc32.IEEETable, q)
		}
		n, err := f.WriteAt(q, off+int64(done))
		done += n
		if err != nil {
			return 0, done, err
		}
	}
	return crc, done, nil
}

// readSummed reads p at off through f in ReadSumChunk steps, summing each
// step just after it lands, while the CPU that copied it still holds it
// in its cache. On error it returns the bytes read before it.
func readSummed(f gds.File, p []byte, off int64) (uint32, int, error) {
	var crc uint32
	done := 0
	for done < len(p) {
		q := p[done:min(done+ReadSumChunk, len(p))]
		n, err := f.ReadAt(q, off+int64(done))
		done += n
		if err != nil {
			return 0, done, err
		}
		crc = crc32.Update(crc, crc32.IEEETable, q)
	}
	return crc, done, nil
}

// cpuCopies reports whether a transfer through f is a copy by the CPU
// into or out of the page cache (posix, mmap, and direct after it fell
// back to posix), which leaves the bytes in the core's cache and costs no
// more in steps of a few hundred KiB than in one request. Direct
// transfers (DMA from or into aligned memory, or a bounce buffer) and GDS
// need their large requests.
func cpuCopies(f gds.File) bool {
	e := f.Engine()
	return e == "posix" || e == "mmap"
}

// Page is the span whose CRC-32 a whole-file read sums separately: a page,
// the alignment of our records (Alignment), so that a record's sum is
// mostly pages' sums joined (one table step each) and only its partial
// pages at the ends are summed again.
const Page = Alignment

// PageSums are the CRC-32s of the consecutive pages of Data.
type PageSums struct {
	Data []byte
	Sums []uint32
}

// NewPageSums is room for the page sums of data (filled by a read with
// Extent.Pages set).
func NewPageSums(data []byte) *PageSums {
	return &PageSums{Data: data, Sums: make([]uint32, (int64(len(data))+Page-1)/Page)}
}

// Holds reports whether p is the bytes of Data at off.
func (g *PageSums) Holds(p []byte, off int64) bool {
	return off >= 0 && off+int64(len(p)) <= int64(len(g.Data)) &&
		(len(p) == 0 || &p[0] == &g.Data[off])
}

// CRC returns the CRC-32 of Data[off:off+n]: the partial pages at its
// ends summed, the whole ones in between joined from their sums.
func (g *PageSums) CRC(off, n int64) uint32 {
	end := off + n
	first := min((off+Page-1)/Page*Page, end)
	crc := crc32.Update(0, crc32.IEEETable, g.Data[off:first])
	at := first
	shift := pageShift()
	for ; at+Page <= end; at += Page {
		crc = shift.apply(crc) ^ g.Sums[at/Page]
	}
	return crc32.Update(crc, crc32.IEEETable, g.Data[at:end])
}

// sumPages fills the sums of the pages of p, which starts at offset off of
// Data (a page boundary).
func (g *PageSums) sumPages(p []byte, off int64) {
	for at := int64(0); at < int64(len(p)); at += Page {
		g.Sums[(off+at)/Page] = Checksum(p[at:min(at+Page, int64(len(p)))])
	}
}

// byteShift is a linear map on CRC-32s (shiftOp) as four tables, one per
// byte of its argument: four lookups where gf2Times takes 32 steps.
type byteShift [4][256]uint32

func (s *byteShift) apply(c uint32) uint32 {
	return s[0][c&0xff] ^ s[1][c>>8&0xff] ^ s[2][c>>16&0xff] ^ s[3][c>>24]
}

// pageShift appends a page of zero bytes to a CRC-32: Combine's shift for
// len2 = Page.
var pageShift = sync.OnceValue(func() *byteShift {
	op := shiftOp(Page)
	s := new(byteShift)
	for k := range s {
		for v := range s[k] {
			s[k][v] = gf2Times(op, uint32(v)<<(8*k))
		}
	}
	return s
})
