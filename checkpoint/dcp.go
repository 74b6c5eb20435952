package checkpoint

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// DCP data files: the items one rank of a torch.distributed.checkpoint
// save writes (pyfastensor/dcp). A data file is nothing but raw records,
// each starting on a transfer.Alignment (4 KiB) boundary, zero padding
// between them; where each item lies and how to check it (DCPRecord: its
// offset, length, CRC-32 and the CRC-32 of each of its 4 KiB pages) is
// kept by the caller in DCP's own metadata, which Python pickles and alone
// reads (Go parses no file here). The checkpoint is committed by
// CommitDCP: the metadata written last, durably, then the data files no
// longer named by it removed.
//
// Reads take byte ranges of records (a resharded load wants a slice of a
// saved shard: one range for a slice of rows, one per row for a slice of
// columns), widen each to the pages around it, merge ranges whose pages
// touch, and read the merged spans through transfer.Read sorted by file
// offset. Widening costs no device bytes (a page-cache read and an
// O_DIRECT read both move whole pages anyway) and makes every byte read
// checkable: a whole record against its CRC-32, any other span page by
// page against the sums recorded at write time.

// DCPItem is one item to write: its name (for errors) and bytes, read
// during the call only.
type DCPItem struct {
	Name string
	Data []byte
}

// DCPRecord is where an item lies in its data file and its checksums.
type DCPRecord struct {
	Name   string `json:"name,omitempty"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
	CRC    uint32 `json:"crc32"`
	// Pages holds the CRC-32 of each transfer.Page of the record (the last
	// one partial when Length is not a multiple of it), little-endian, 4
	// bytes each; base64 in JSON.
	Pages []byte `json:"pages"`
}

// pageCount is the number of pages of a record of n bytes.
func pageCount(n int64) int64 { return (n + transfer.Page - 1) / transfer.Page }

// pageSum returns the recorded sum of page k.
func (r *DCPRecord) pageSum(k int64) uint32 { return binary.LittleEndian.Uint32(r.Pages[4*k:]) }

// dcpLayout places records of these sizes one after the other, each on an
// Alignment boundary (so O_DIRECT and GDS read them in place and a record's
// pages are the file's), and returns their offsets and the file size.
func dcpLayout(sizes []int64) ([]int64, int64) {
	offs := make([]int64, len(sizes))
	var end int64
	for i, n := range sizes {
		offs[i] = alignUp(end)
		end = offs[i] + n
	}
	return offs, end
}

func alignUp(n int64) int64 { return (n + transfer.Alignment - 1) &^ (transfer.Alignment - 1) }

// SaveDCP writes items as a new data file at path, committed as
// transfer/commit.go describes (fsync, rename, directory fsync unless
// o.NotDurable), and returns each item's record. The sums of each page are
// taken as its bytes leave; the record's CRC-32 is joined from them.
func SaveDCP(path string, items []DCPItem, o WriteOptions) ([]DCPRecord, Stats, error) {
	start := time.Now()
	sizes := make([]int64, len(items))
	for i, it := range items {
		sizes[i] = int64(len(it.Data))
	}
	offs, size := dcpLayout(sizes)
	exts := make([]transfer.Extent, 0, len(items))
	pages := make([]*transfer.PageSums, len(items))
	for i, it := range items {
		if len(it.Data) == 0 {
			continue
		}
		pages[i] = transfer.NewPageSums(it.Data)
		exts = append(exts, transfer.Extent{Off: offs[i], Data: it.Data, Pages: pages[i]})
	}
	_, st, err := transfer.WriteFile(path, size, exts, !o.NotDurable, o.FS, o.transferOptions())
	if err != nil {
		return nil, Stats{}, fmt.Errorf("checkpoint: dcp: save %s: %w", path, err)
	}
	recs := make([]DCPRecord, len(items))
	for i, it := range items {
		r := DCPRecord{Name: it.Name, Offset: offs[i], Length: sizes[i], Pages: []byte{}}
		if ps := pages[i]; ps != nil {
			r.CRC = ps.CRC(0, sizes[i])
			r.Pages = make([]byte, 4*len(ps.Sums))
			for k, s := range ps.Sums {
				binary.LittleEndian.PutUint32(r.Pages[4*k:], s)
			}
		}
		recs[i] = r
	}
	return recs, Stats{FileBytes: size, DataBytes: st.Bytes, Engines: st.Engines, Seconds: time.Since(start).Seconds()}, nil
}

// DCPRange asks for the bytes [Off, Off+len(Dst)) of record Record into
// Dst, which is used during the call only.
type DCPRange struct {
	Record int
	Off    int64
	Dst    []byte
}

func (r *DCPRange) end() int64 { return r.Off + int64(len(r.Dst)) }

// DCPReadStats describe a finished read: Requested bytes were asked for,
// DataBytes read from the file in Extents merged extents.
type DCPReadStats struct {
	Stats
	Requested int64 `json:"requested_bytes"`
	Extents   int   `json:"extents"`
}

// dcpSpan is one extent of a read: bytes [lo, hi) of a record, read into
// data (the destination itself, or scratch memory copied out to the
// ranges afterwards), checked whole (sum) or page by page (pages).
type dcpSpan struct {
	rec     int
	lo, hi  int64
	data    []byte
	scratch bool
	ranges  []DCPRange // the ranges whose bytes it holds (scratch spans)
	sum     bool
	pages   *transfer.PageSums
}

// ReadDCP fills each range's Dst from the data file at path, whose records
// are recs, through the chooser (default: transfer.Default, as every read),
// but for a resharded read: when a range is not a whole record and the
// caller named no chooser, the whole file's extents go through the page
// cache (posix). Such a read widens its ranges to the pages around them,
// and the pages at their edges hold other ranks' ranges too: ranks on one
// machine share the page cache, which fetches such a page from the device
// once, where O_DIRECT reads it once per rank, and one engine for the file
// keeps one rank's readahead from fetching what another then reads
// directly. Measured with `bench dcp`'s resharded loads (GPT-2, 498 MB,
// saved by 4 ranks, loaded cold by 2 into the other sharding; bytes read
// from the device over the bytes needed, two rounds each): Shard(0) to
// Shard(1) 1.58-1.64x with the default, 1.81x all O_DIRECT, 1.00-1.01x
// through the page cache (and 0.57-0.77 s against 0.90-1.11 s); Shard(1)
// to Shard(0) 1.25-1.32x with the default, 1.00-1.01x either way. Unless
// o.NoVerify, every byte read is checked: a range that is
// a whole record against the record's CRC-32, any other against the sums
// of the pages read around it. A mismatch, or a file ending early, gives
// an error wrapping ErrCorrupt that names the file, the item and the
// offset.
func ReadDCP(path string, recs []DCPRecord, ranges []DCPRange, o ReadOptions) (DCPReadStats, error) {
	start := time.Now()
	verify := !o.NoVerify
	var requested int64
	resharded := false // a range is part of a record
	byRec := map[int][]DCPRange{}
	for i, r := range ranges {
		if r.Record < 0 || r.Record >= len(recs) {
			return DCPReadStats{}, fmt.Errorf("%w: dcp: read %s: range %d names record %d of %d", gds.ErrInvalid, path, i, r.Record, len(recs))
		}
		rec := &recs[r.Record]
		if r.Off < 0 || r.end() > rec.Length {
			return DCPReadStats{}, fmt.Errorf("%w: dcp: read %s: range %d [%d, %d) outside item %q of %d bytes",
				gds.ErrInvalid, path, i, r.Off, r.end(), rec.Name, rec.Length)
		}
		if rec.Offset < 0 || rec.Offset%transfer.Alignment != 0 {
			return DCPReadStats{}, fmt.Errorf("%w: dcp: read %s: item %q at offset %d, not on a %d-byte boundary",
				gds.ErrInvalid, path, rec.Name, rec.Offset, transfer.Alignment)
		}
		if verify && int64(len(rec.Pages)) != 4*pageCount(rec.Length) {
			return DCPReadStats{}, fmt.Errorf("%w: dcp: read %s: item %q has %d bytes of page sums, %d expected",
				gds.ErrInvalid, path, rec.Name, len(rec.Pages), 4*pageCount(rec.Length))
		}
		if len(r.Dst) > 0 {
			byRec[r.Record] = append(byRec[r.Record], r)
			requested += int64(len(r.Dst))
			resharded = resharded || r.Off != 0 || int64(len(r.Dst)) != rec.Length
		}
	}
	var spans []dcpSpan
	for ri, rs := range byRec {
		spans = append(spans, planSpans(ri, recs[ri].Length, rs, verify)...)
	}
	slices.SortFunc(spans, func(a, b dcpSpan) int { return cmp.Compare(recs[a.rec].Offset+a.lo, recs[b.rec].Offset+b.lo) })
	allocScratch(spans)
	exts := make([]transfer.Extent, len(spans))
	for i := range spans {
		s := &spans[i]
		exts[i] = transfer.Extent{Off: recs[s.rec].Offset + s.lo, Data: s.data, Sum: s.sum, Pages: s.pages}
	}
	topts := o.transferOptions()
	if topts.Chooser == nil && resharded {
		topts.Chooser = transfer.Fixed("posix")
	}
	res, st, err := transfer.Read(path, exts, topts)
	name := transfer.ShownName(path)
	if err != nil {
		var ee *transfer.ExtentError
		if errors.As(err, &ee) && errors.Is(err, gds.ErrEOF) {
			s := &spans[ee.Ext]
			return DCPReadStats{}, corrupt(name, recs[s.rec].Name, ee.Off, "file ends before the %d bytes of the item expected here (truncated?)", s.hi-s.lo)
		}
		return DCPReadStats{}, fmt.Errorf("checkpoint: dcp: read %s: %w", name, err)
	}
	err = transfer.Run(len(spans), 0, func(i int) error {
		s := &spans[i]
		rec := &recs[s.rec]
		if s.sum && res[i].CRC != rec.CRC {
			return corrupt(name, rec.Name, rec.Offset, "CRC-32 of the item's %d bytes is %08x, %08x was recorded", rec.Length, res[i].CRC, rec.CRC)
		}
		if s.pages != nil {
			first := s.lo / transfer.Page
			for k, got := range s.pages.Sums {
				if want := rec.pageSum(first + int64(k)); got != want {
					off := s.lo + int64(k)*transfer.Page
					return corrupt(name, rec.Name, rec.Offset+off, "CRC-32 of the item's page at its byte %d is %08x, %08x was recorded", off, got, want)
				}
			}
		}
		for _, r := range s.ranges { // scratch: copy out each range's share
			a, b := max(r.Off, s.lo), min(r.end(), s.hi)
			if a < b {
				copy(r.Dst[a-r.Off:b-r.Off], s.data[a-s.lo:b-s.lo])
			}
		}
		return nil
	})
	if err != nil {
		return DCPReadStats{}, err
	}
	out := DCPReadStats{Requested: requested, Extents: len(exts)}
	out.DataBytes, out.Engines, out.Seconds = st.Bytes, st.Engines, time.Since(start).Seconds()
	return out, nil
}

// planSpans turns the ranges of one record of length n into the extents
// that read them:
//
//   - a range that is the whole record is read in place, its CRC-32
//     summed as it lands;
//   - the others are widened to the pages around them (clipped to the
//     record), and ranges whose widened spans touch are merged: the device
//     moves those pages either way, and one request replaces several;
//   - a merged span holding one range is read in place for the range's
//     whole pages (and its tail, when the range ends the record), through
//     scratch for its partial first and last pages; a span holding several
//     ranges is read into scratch and copied out.
//
// With verify, every span but the whole-record ones has its pages summed.
func planSpans(rec int, n int64, rs []DCPRange, verify bool) []dcpSpan {
	slices.SortFunc(rs, func(a, b DCPRange) int { return cmp.Compare(a.Off, b.Off) })
	type group struct {
		lo, hi int64
		rs     []DCPRange
	}
	var out []dcpSpan
	var groups []group
	for _, r := range rs {
		if r.Off == 0 && int64(len(r.Dst)) == n {
			out = append(out, dcpSpan{rec: rec, lo: 0, hi: n, data: r.Dst, sum: verify})
			continue
		}
		lo := r.Off &^ (transfer.Page - 1)
		hi := min(alignUp(r.end()), n)
		if k := len(groups) - 1; k >= 0 && lo <= groups[k].hi {
			groups[k].hi = max(groups[k].hi, hi)
			groups[k].rs = append(groups[k].rs, r)
			continue
		}
		groups = append(groups, group{lo: lo, hi: hi, rs: []DCPRange{r}})
	}
	scratch := func(lo, hi int64, rs []DCPRange) dcpSpan {
		return dcpSpan{rec: rec, lo: lo, hi: hi, scratch: true, ranges: rs}
	}
	for _, g := range groups {
		if len(g.rs) > 1 {
			out = append(out, scratch(g.lo, g.hi, g.rs))
			continue
		}
		r := g.rs[0]
		// The range's middle: from its first page boundary to its last
		// one, or to its end when it ends the record (whose last page is
		// partial in the file as in the sums).
		midLo := alignUp(r.Off)
		midHi := r.end() &^ (transfer.Page - 1)
		if r.end() == n {
			midHi = n
		}
		if midHi <= midLo {
			out = append(out, scratch(g.lo, g.hi, g.rs))
			continue
		}
		if g.lo < midLo { // unaligned head
			out = append(out, scratch(g.lo, midLo, g.rs))
		}
		out = append(out, dcpSpan{rec: rec, lo: midLo, hi: midHi, data: r.Dst[midLo-r.Off : midHi-r.Off]})
		if midHi < g.hi { // unaligned tail
			out = append(out, scratch(midHi, g.hi, g.rs))
		}
	}
	if verify {
		for i := range out {
			if !out[i].sum {
				out[i].pages = &transfer.PageSums{} // filled in allocScratch, once data is known
			}
		}
	}
	return out
}

// allocScratch gives the scratch spans their memory, one page-aligned
// buffer carved at page boundaries (O_DIRECT reads land in it in place),
// and the spans to verify their page sums.
func allocScratch(spans []dcpSpan) {
	var total int64
	for _, s := range spans {
		if s.scratch {
			total += alignUp(s.hi - s.lo)
		}
	}
	var buf []byte
	if total > 0 {
		buf = gds.AlignedBuf(int(total), gds.DirectAlign)
	}
	var at int64
	for i := range spans {
		s := &spans[i]
		if s.scratch {
			s.data = buf[at : at+s.hi-s.lo : at+s.hi-s.lo]
			at += alignUp(s.hi - s.lo)
		}
		if s.pages != nil {
			s.pages = transfer.NewPageSums(s.data)
		}
	}
}

// DataFileSuffix ends the name of every DCP data file.
const DataFileSuffix = ".pfd"

// IsDCPDataFile reports whether a base name is a DCP data file's:
// "__<rank>_<...>.pfd".
func IsDCPDataFile(name string) bool {
	return strings.HasPrefix(name, "__") && strings.HasSuffix(name, DataFileSuffix)
}

// CommitDCP makes a checkpoint in dir the current one: it writes meta as
// the file name in dir (its metadata) with the commit protocol (a
// temporary name, fsync, rename, directory fsync unless o.NotDurable), the
// last step of a save, after every data file it names was committed. It
// then removes the data files of earlier saves (IsDCPDataFile names not in
// keep) and the temporary files that crashed saves in dir left behind,
// and returns the paths removed. A crash before the rename leaves the
// previous metadata, whose data files are all still there; after it, the
// new one.
func CommitDCP(dir, name string, meta []byte, keep []string, o WriteOptions) ([]string, error) {
	path := filepath.Join(dir, name)
	exts := []transfer.Extent{{Off: 0, Data: meta}}
	if len(meta) == 0 {
		exts = nil
	}
	if _, _, err := transfer.WriteFile(path, int64(len(meta)), exts, !o.NotDurable, o.FS, transfer.Options{Chooser: transfer.Fixed("posix")}); err != nil {
		return nil, fmt.Errorf("checkpoint: dcp: commit %s: %w", path, err)
	}
	fsys := o.FS
	if fsys == nil {
		fsys = transfer.CurrentFS()
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: dcp: commit %s: listing the data files of earlier saves: %w", path, gds.Classify(err))
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if target, ok := transfer.TempTarget(n); ok && (IsDCPDataFile(target) || target == name) {
			removed = append(removed, transfer.CleanStale(filepath.Join(dir, target))...)
			continue
		}
		if !IsDCPDataFile(n) || slices.Contains(keep, n) {
			continue
		}
		p := filepath.Join(dir, n)
		if err := fsys.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("checkpoint: dcp: %s committed, but the data files of earlier saves were not all removed: %w", path, err)
	}
	return removed, nil
}
