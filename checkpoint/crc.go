package checkpoint

import (
	"hash/crc32"
	"sync"
	"sync/atomic"

	"github.com/pyfastensor/pyfastensor/gds"
)

// CRC-32 as zip defines it: the IEEE polynomial (hash/crc32.IEEE), not
// Castagnoli. Large records are checksummed in pieces on several
// goroutines, alongside their transfers; crcCombine joins the pieces'
// checksums without touching the data again.

// crcOf returns the zip CRC-32 of p.
func crcOf(p []byte) uint32 { return crc32.ChecksumIEEE(p) }

// crcCombine returns the CRC-32 of A followed by B, given crc1 = CRC(A),
// crc2 = CRC(B) and len2 = len(B). It is zlib's crc32_combine: appending
// len2 zero bytes to A is a linear map over GF(2) (shiftOp), and
// CRC(A‖B) = shift(crc1) ^ crc2. A zero crc1 maps to zero, so the first
// piece of a record costs nothing.
func crcCombine(crc1, crc2 uint32, len2 int64) uint32 {
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

// pieceCRCs collects the checksums of a record's pieces, in any order, and
// joins them in file order.
type pieceCRCs struct {
	crc []uint32
	n   []int64
}

func newPieceCRCs(pieces int) *pieceCRCs {
	return &pieceCRCs{crc: make([]uint32, pieces), n: make([]int64, pieces)}
}

func (p *pieceCRCs) set(i int, crc uint32, n int64) { p.crc[i], p.n[i] = crc, n }

func (p *pieceCRCs) total() uint32 {
	var c uint32
	for i := range p.crc {
		c = crcCombine(c, p.crc[i], p.n[i])
	}
	return c
}

// sumChunk is the size of the sub-transfers of a piece whose CRC-32 is
// computed alongside: small enough that the bytes just moved are still in
// the CPU cache when they are summed, so the check costs little memory
// bandwidth on top of the transfer.
const sumChunk = 1 << 20

// moveSummed writes (write) or reads p at off through f, returning the
// CRC-32 of p when sum is set. On error it returns the bytes moved before
// it.
//
// Writes go in sumChunk steps, each summed just before it leaves, while
// the bytes are in the CPU cache. Reads go in one request: the device
// needs large requests queued to reach its bandwidth (1 MiB reads measured
// 1.5 GB/s where 8 MiB ones reached the disk's 2.1), and the data a direct
// read lands in memory is not in the cache anyway; the sum follows.
func moveSummed(f gds.File, write bool, p []byte, off int64, sum bool) (uint32, int, error) {
	if !write {
		n, err := f.ReadAt(p, off)
		if err != nil || !sum {
			return 0, n, err
		}
		return crc32.Update(0, crc32.IEEETable, p), n, nil
	}
	var crc uint32
	done := 0
	for done < len(p) {
		q := p[done:min(done+sumChunk, len(p))]
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
