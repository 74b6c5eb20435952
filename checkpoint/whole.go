package checkpoint

import (
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"sync"

	"github.com/pyfastensor/pyfastensor/gds"
)

// A cold load of one of our archives reads the file whole, in large
// O_DIRECT requests, into one page-aligned memory area (ReadWhole), then
// parses it from memory (OpenArchiveMemory): one sequential stream at the
// disk's bandwidth, instead of a parse that waits for the disk at each run
// of small records and reads the records one by one. Each request sums its
// pages' CRC-32s as it lands, while the next ones wait for the disk, so
// that verifying a record later (Verify) joins sums instead of reading
// its bytes again. The Python side then hands each large record's pages
// to its tensor.

// WholePlan describes a file for the choice of that path.
type WholePlan struct {
	// Size is the file's length in bytes.
	Size int64 `json:"size"`
	// Resident is the share of the file in the page cache (0 to 1).
	Resident float64 `json:"resident"`
	// Direct is whether O_DIRECT works in the file's directory (the probe
	// DefaultChooser uses).
	Direct bool `json:"direct"`
	// Ours is whether the file ends with our writer's comment: its storage
	// records then start on page boundaries (DataAlign), and their pages
	// can be handed to tensors whole.
	Ours bool `json:"ours"`
	// Records is the number of records our zip64 end record announces (0
	// when the file is not ours or its end is damaged; opening it says how).
	Records int64 `json:"records"`
}

// PlanWhole describes the file at path for a whole-file cold read.
func PlanWhole(path string) (WholePlan, error) {
	st, err := os.Stat(path)
	if err != nil {
		return WholePlan{}, classify(err)
	}
	dir, err := dirOf(path)
	if err != nil {
		return WholePlan{}, err
	}
	c, ok := DefaultChooser(dir).(*ThresholdChooser)
	plan := WholePlan{Size: st.Size(), Direct: ok && c.Direct}
	if res, err := gds.Resident(path, []int64{0}, []int64{st.Size()}); err == nil && len(res) == 1 {
		plan.Resident = res[0]
	}
	// Our files end with the zip64 end record, its locator, the end record
	// and our comment (endRecords).
	if n := int64(endTotalLen + cdCommentLen); st.Size() >= n {
		f, err := os.Open(path)
		if err != nil {
			return WholePlan{}, classify(err)
		}
		defer f.Close()
		tail := make([]byte, n)
		if _, err := f.ReadAt(tail, st.Size()-n); err == nil {
			plan.Ours = oursComment(tail[endTotalLen:])
			if plan.Ours && le.Uint32(tail) == sigEnd64 {
				plan.Records = int64(min(le.Uint64(tail[32:]), uint64(st.Size())))
			}
		}
	}
	return plan, nil
}

// ReadWhole reads the file at path whole into dst, whose length must be
// the file's, in parallel requests through o.Chooser's engine for a file
// of that size (the caller asks for direct), and parses it from there
// (OpenArchiveMemory). Unless o.NoVerify, each request sums the CRC-32s of
// its granules as it lands, while later requests still wait for the disk;
// Verify then checks records in dst from those sums, touching only the
// partial granules at their ends. dst must stay as read, and alive, for
// as long as the Archive is verified from it.
//
// When the file at path no longer has dst's length (a save replaced it
// since its caller measured it), ReadWhole opens the file as OpenArchive
// does instead, leaving dst alone: the Archive's ReadWhole is false.
func ReadWhole(path string, dst []byte, o ReadOptions) (a *Archive, err error) {
	size := int64(len(dst))
	if o.Chooser == nil {
		dir, derr := dirOf(path)
		if derr != nil {
			return nil, derr
		}
		o.Chooser = DefaultChooser(dir)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, classify(err)
	}
	defer func() {
		if a == nil {
			f.Close()
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() != size {
		return openPinned(f, path, st.Size())
	}
	src := pinnedName(f, path)
	engine := o.Chooser.Engine(OpRead, size)
	var sums []uint32
	if !o.NoVerify {
		sums = make([]uint32, (size+granule-1)/granule)
	}
	tasks := splitPieces(0, size, max(granule, pieceSize(o.Engine)&^(granule-1)))
	rd := newEngineFiles(src, os.O_RDONLY, o.Engine, o.Progress)
	err = runTasks(len(tasks), cmp.Or(o.Workers, readWorkers([]string{engine})), func(t int) error {
		pc := tasks[t]
		p := dst[pc.lo:pc.hi]
		f, err := rd.file(engine)
		if err != nil {
			return fmt.Errorf("checkpoint: read %s whole: %w", path, err)
		}
		if _, err := f.ReadAt(p, pc.lo); err != nil {
			if errors.Is(err, gds.ErrEOF) {
				return corrupt(path, "", pc.lo, "file ends before the %d bytes expected here (shrunk while read?)", len(p))
			}
			return fmt.Errorf("checkpoint: read %s whole: %w", path, err)
		}
		for g := int64(0); sums != nil && g < int64(len(p)); g += granule {
			sums[(pc.lo+g)/granule] = crcOf(p[g:min(g+granule, int64(len(p)))])
		}
		rd.count(f.Engine(), int64(len(p)))
		return nil
	})
	if cerr := rd.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if a, err = OpenArchiveMemory(path, dst); err != nil {
		return nil, err
	}
	a.ReadWhole, a.pin, a.Fd = true, f, int(f.Fd())
	if sums != nil {
		a.whole = &granuleSums{data: dst, sums: sums}
	}
	return a, nil
}

// granule is the span whose CRC-32 ReadWhole sums separately: a page, the
// alignment of our storage records, so that a record's sum is mostly
// granules' sums joined (one table step each) and only its last partial
// page is summed again.
const granule = 4096

// granuleSums are the CRC-32s of the consecutive granules of data.
type granuleSums struct {
	data []byte
	sums []uint32
}

// holds reports whether p is the bytes of data at off.
func (g *granuleSums) holds(p []byte, off int64) bool {
	return off >= 0 && off+int64(len(p)) <= int64(len(g.data)) &&
		(len(p) == 0 || &p[0] == &g.data[off])
}

// crc returns the CRC-32 of data[off:off+n]: the partial granules at its
// ends summed, the whole ones in between joined from their sums.
func (g *granuleSums) crc(off, n int64) uint32 {
	end := off + n
	first := min((off+granule-1)/granule*granule, end)
	crc := crc32.Update(0, crc32.IEEETable, g.data[off:first])
	at := first
	shift := granuleShift()
	for ; at+granule <= end; at += granule {
		crc = shift.apply(crc) ^ g.sums[at/granule]
	}
	return crc32.Update(crc, crc32.IEEETable, g.data[at:end])
}

// byteShift is a linear map on CRC-32s (shiftOp) as four tables, one per
// byte of its argument: four lookups where gf2Times takes 32 steps.
type byteShift [4][256]uint32

func (s *byteShift) apply(c uint32) uint32 {
	return s[0][c&0xff] ^ s[1][c>>8&0xff] ^ s[2][c>>16&0xff] ^ s[3][c>>24]
}

// granuleShift appends a granule of zero bytes to a CRC-32: crcCombine's
// shift for len2 = granule.
var granuleShift = sync.OnceValue(func() *byteShift {
	op := shiftOp(granule)
	s := new(byteShift)
	for k := range s {
		for v := range s[k] {
			s[k][v] = gf2Times(op, uint32(v)<<(8*k))
		}
	}
	return s
})
