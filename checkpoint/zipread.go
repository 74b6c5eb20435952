package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// Entry is one record of an archive, as the central directory describes it
// and the local header confirms.
type Entry struct {
	Name      string `json:"name"`
	HeaderOff int64  `json:"header_offset"`
	DataOff   int64  `json:"offset"`
	Size      int64  `json:"size"`
	CRC       uint32 `json:"crc32"`
	Method    uint16 `json:"method"` // 0: stored; anything else we hand back to torch
	// Memory is where a load puts the record's bytes (MemoryAligned, ...),
	// as the load planner decided; "" when the archive was not opened for
	// a load.
	Memory string `json:"memory,omitempty"`
}

// Unchecked reports whether the record carries no CRC-32 to check its
// bytes against: its field is 0 though it has bytes. torch writes 0 where
// it computed none: torch.serialization.set_crc32_options(False), and
// records written metadata-only (torch.serialization.skip_data()), whose
// bytes a program fills in later; so does our writer under the first. The
// CRC-32 of real data is 0 once in 2^32, so a record of ours that happens to
// sum to 0 goes unchecked at that rate.
func (e *Entry) Unchecked() bool { return e.CRC == 0 && e.Size > 0 }

// Archive is a parsed, validated zip archive.
type Archive struct {
	Path    string  `json:"path"`
	Size    int64   `json:"file_size"`
	Entries []Entry `json:"entries"`
	// Ours is true when the file carries our central directory checksum.
	Ours bool `json:"ours"`
	// NoCRC is true when no record carries a CRC-32 (every record with data
	// is Unchecked), as torch writes with
	// torch.serialization.set_crc32_options(False). Reads cannot verify
	// such a file; in others, the records that carry one are checked.
	NoCRC bool `json:"no_crc"`

	// Prefix is the directory of the first record, with its slash
	// ("archive/"): torch puts every record under one.
	Prefix string `json:"prefix"`
	// Fallback says why a load hands the file to torch.load instead of
	// reading it (a TorchScript archive, compressed records, not torch's
	// layout); "" when it is read here.
	Fallback string `json:"fallback,omitempty"`

	// ReadWhole says whether the file was read whole into memory (Load's
	// plan, or ReadWhole; false when the file's size had changed since
	// ReadWhole's caller measured it).
	ReadWhole bool `json:"read_whole"`
	// Plan is how Load planned the load (zero when not opened by Load).
	Plan LoadPlan `json:"plan"`
	// Arena is the address of the mapping Load read the file whole into
	// (0: none): the file's Size bytes, rounded up to pages. The caller
	// owns it from then on (it unmaps it, after Close).
	Arena uintptr `json:"arena"`
	// Fd is the descriptor of the file parsed, open until Close (-1 when
	// none is held): the caller maps or reopens the same inode through it.
	Fd int `json:"fd"`

	// whole holds the CRC-32s of the file's pages when ReadWhole read it
	// with verification on.
	whole *transfer.PageSums
	// mem is the whole file in memory when ReadWhole read it: reads copy
	// from it (readMemory) instead of going to the file again.
	mem []byte
	// resident is each entry's share in the page cache as the load planner
	// measured it (planMemory); nil when it did not.
	resident []float64

	// pin is the file parsed, held open until Close: reads reopen this
	// inode (source), so that a file replaced at path by a rename, as
	// every save of ours replaces it, is read as it was parsed, not as its
	// successor, whose records lie elsewhere. mu keeps Close from closing
	// it under a read.
	mu     sync.RWMutex
	pin    *os.File
	closed bool
}

// source returns the name that opens the inode the archive was parsed
// from: /proc/self/fd/N of the pinned file (Linux), or Path without /proc
// or a pin. Callers hold a.mu for reading.
func (a *Archive) source() (string, error) {
	if a.pin == nil {
		if a.closed {
			return "", fmt.Errorf("%w: archive %s", gds.ErrClosed, a.Path)
		}
		return a.Path, nil
	}
	return pinnedName(a.pin, a.Path), nil
}

// pinnedName returns a name that opens the file f, opened from path:
// /proc/self/fd/N, or path itself without /proc (as it is now).
func pinnedName(f *os.File, path string) string {
	name := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if _, err := os.Stat(name); err != nil {
		return path
	}
	return name
}

// Close releases the file the archive holds open (idempotent). Reads
// after Close fail.
func (a *Archive) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.pin == nil {
		return nil
	}
	err := a.pin.Close()
	a.pin = nil
	return err
}

// OpenArchive reads and validates the central directory of the zip file at
// path: every entry's fields, its local header (which must agree), its data
// descriptor (which must agree), and that no two records overlap. A file
// that fails any check gives an error wrapping ErrCorrupt that names the
// file and, where known, the record.
func OpenArchive(path string) (*Archive, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, gds.Classify(err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	a, err := openPinned(f, path, st.Size())
	if err != nil {
		f.Close()
		return nil, err
	}
	return a, nil
}

// openPinned parses f, of size bytes, opened from path, and pins it in the
// archive.
func openPinned(f *os.File, path string, size int64) (*Archive, error) {
	p := &parser{f: f, file: f, path: path, size: size}
	a, err := p.parse()
	if err != nil {
		return nil, err
	}
	a.pin, a.Fd = f, int(f.Fd())
	return a, nil
}

// OpenArchiveMemory is OpenArchive over data, the whole file at path
// already in memory (a cold load reads it whole, in large O_DIRECT
// requests, before parsing it): the same checks, with no read of the file.
// data is only read during the call; errors name path.
func OpenArchiveMemory(path string, data []byte) (*Archive, error) {
	a, err := inMemoryParser(path, data).parse()
	if a != nil {
		a.Fd = -1
	}
	return a, err
}

type parser struct {
	f    io.ReaderAt
	path string
	size int64
	file *os.File // the file f reads; nil when f is its bytes in memory (no page cache to consult)
	// tail is the end of the file from tailOff, read once (readTail):
	// reads it covers are served from it, so that the end records are
	// read from the file once however often the parse looks at them.
	tail    []byte
	tailOff int64
}

// traceRead, when set (tests), sees every read a parser makes of a file
// (not of memory): its offset and length.
var traceRead func(off, n int64)

// readTail reads the last endLen+max16 bytes of the file (all of it when
// smaller): the end records, whatever the comment's length.
func (p *parser) readTail() error {
	span := min(p.size, endLen+max16)
	b, err := p.read(p.size-span, span, "", "end of file")
	if err != nil {
		return err
	}
	p.tail, p.tailOff = b, p.size-span
	return nil
}

// read returns n bytes at off, or a corruption error naming record when
// the file ends first.
func (p *parser) read(off, n int64, record, what string) ([]byte, error) {
	return p.readInto(nil, off, n, record, what)
}

// readInto is read into buf when its capacity suffices.
func (p *parser) readInto(buf []byte, off, n int64, record, what string) ([]byte, error) {
	if off < 0 || n < 0 || n > p.size-off { // not off+n: it may overflow
		return nil, corrupt(p.path, record, off, "%s (%d bytes) lies past the end of the file (%d bytes)", what, n, p.size)
	}
	if p.tail != nil && off >= p.tailOff && buf == nil {
		return p.tail[off-p.tailOff : off-p.tailOff+n], nil
	}
	b := buf[:0]
	if int64(cap(b)) >= n {
		b = b[:n]
	} else {
		b = make([]byte, n)
	}
	// The part of the range the tail holds is copied from it, not read again.
	head := b
	if p.tail != nil && off+n > p.tailOff {
		skip := max(p.tailOff-off, 0)
		head = b[:skip]
		copy(b[skip:], p.tail[off+skip-p.tailOff:])
	}
	if len(head) == 0 {
		return b, nil
	}
	if p.file != nil && traceRead != nil {
		traceRead(off, int64(len(head)))
	}
	if _, err := p.f.ReadAt(head, off); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, corrupt(p.path, record, off, "%s: file ends early", what)
		}
		return nil, fmt.Errorf("checkpoint: read %s of %s at %d: %w", what, p.path, off, err)
	}
	return b, nil
}

// ends is what the end records say: where the central directory lies and
// how many entries it holds, and the end record's comment.
type ends struct {
	eocd          int64 // offset of the end record
	n             int64 // entries
	cdOff, cdSize int64
	comment       []byte
}

// ours reports whether the comment is our writer's (oursComment).
func (e *ends) ours() bool { return oursComment(e.comment) }

func (p *parser) parse() (*Archive, error) {
	e, err := p.findEnds()
	if err != nil {
		return nil, err
	}
	return p.parseFrom(e)
}

// findEnds reads and checks the end record and, when there is one, the
// zip64 end record and its locator.
func (p *parser) findEnds() (*ends, error) {
	eocd, tail, err := p.findEnd()
	if err != nil {
		return nil, err
	}
	n := int64(le.Uint16(tail[10:]))
	cdSize := int64(le.Uint32(tail[12:]))
	cdOff := int64(le.Uint32(tail[16:]))
	comment := tail[endLen:]
	cdEnd := eocd // where the central directory must end
	if loc, err := p.read(eocd-locator64Len, locator64Len, "", "zip64 locator"); err == nil && le.Uint32(loc) == sigLocator64 {
		e64Off := int64(le.Uint64(loc[8:]))
		if e64Off < 0 || e64Off+end64Len != eocd-locator64Len {
			return nil, corrupt(p.path, "", eocd-locator64Len, "zip64 locator points to %d, not to the record before it", e64Off)
		}
		e64, err := p.read(e64Off, end64Len, "", "zip64 end record")
		if err != nil {
			return nil, err
		}
		if le.Uint32(e64) != sigEnd64 {
			return nil, corrupt(p.path, "", e64Off, "bad zip64 end record signature")
		}
		n, cdSize, cdOff = int64(le.Uint64(e64[32:])), int64(le.Uint64(e64[40:])), int64(le.Uint64(e64[48:]))
		if int64(le.Uint64(e64[24:])) != n {
			return nil, corrupt(p.path, "", e64Off, "zip64 end record: entry counts disagree")
		}
		cdEnd = e64Off
	}
	if cdOff < 0 || cdSize < 0 || cdOff+cdSize != cdEnd {
		return nil, corrupt(p.path, "", cdOff, "central directory (%d bytes at %d) does not end where the end records start (%d)", cdSize, cdOff, cdEnd)
	}
	if n < 0 || n > cdSize/centralLen { // not n*centralLen: a zip64 count may overflow it
		return nil, corrupt(p.path, "", cdOff, "central directory of %d bytes cannot hold %d entries", cdSize, n)
	}
	return &ends{eocd: eocd, n: n, cdOff: cdOff, cdSize: cdSize, comment: comment}, nil
}

// parseFrom parses the central directory the end records e describe, and
// checks every record's local header against it.
func (p *parser) parseFrom(e *ends) (*Archive, error) {
	n, cdOff, cdSize, comment := e.n, e.cdOff, e.cdSize, e.comment
	a := &Archive{Path: p.path, Size: p.size}
	var cd []byte
	if oursComment(comment) {
		a.Ours = true
		sum := comment[len(cdCommentPrefix):]
		// One read for the directory and the checksum over it and the end records.
		all, err := p.read(cdOff, e.eocd+endLen-cdOff, "", "central directory")
		if err != nil {
			return nil, err
		}
		cd = all[:cdSize]
		if string(comment[:len(cdCommentPrefix)]) != cdCommentPrefix || string(sum) != fmt.Sprintf("%08x", transfer.Checksum(all)) {
			// Find the entry that differs, if the field-by-field checks
			// below can; else report the directory as a whole.
			if _, err := p.entries(cd, cdOff, n, true); err != nil {
				return nil, err
			}
			return nil, corrupt(p.path, "", cdOff, "central directory checksum mismatch (stored %q)", sum)
		}
	} else {
		var err error
		if cd, err = p.read(cdOff, cdSize, "", "central directory"); err != nil {
			return nil, err
		}
	}
	var err error
	a.Entries, err = p.entries(cd, cdOff, n, a.Ours)
	if err != nil {
		return nil, err
	}
	a.NoCRC = true
	withData := false
	for i := range a.Entries {
		if e := &a.Entries[i]; e.Size > 0 {
			withData = true
			a.NoCRC = a.NoCRC && e.Unchecked()
		}
	}
	a.NoCRC = a.NoCRC && withData
	a.Prefix, a.Fallback = torchLayout(a.Entries)
	return a, nil
}

// torchLayout returns the directory torch's records live under (the first
// record's, with its slash) and why a load leaves the archive to torch.load,
// "" when the records are torch's, stored: not a TorchScript archive
// (constants.pkl), none compressed.
func torchLayout(es []Entry) (prefix, fallback string) {
	if len(es) == 0 {
		return "", "no records"
	}
	dir, _, ok := strings.Cut(es[0].Name, "/")
	if !ok {
		return "", "not torch's layout: the first record is in no directory"
	}
	prefix = dir + "/"
	for _, e := range es {
		if e.Name == prefix+"constants.pkl" {
			return prefix, "a TorchScript archive"
		}
		if e.Method != 0 {
			return prefix, fmt.Sprintf("record %q is compressed", e.Name)
		}
	}
	return prefix, ""
}

// oursComment reports whether an end record's comment is the one our
// writer puts there: the right length and the prefix, give or take two
// damaged bytes (so a flip inside the prefix is caught as corruption rather
// than taken for a foreign comment).
func oursComment(c []byte) bool {
	if len(c) != cdCommentLen {
		return false
	}
	diff := 0
	for i := range len(cdCommentPrefix) {
		if c[i] != cdCommentPrefix[i] {
			diff++
		}
	}
	return diff <= 2
}

// findEnd locates the end record: the last "PK\5\6" whose comment length
// reaches exactly the end of the file. It returns its offset and the bytes
// from it to the end of the file.
func (p *parser) findEnd() (int64, []byte, error) {
	if p.tail == nil {
		if err := p.readTail(); err != nil {
			return 0, nil, err
		}
	}
	tail := p.tail
	for i := len(tail) - endLen; i >= 0; i-- {
		if le.Uint32(tail[i:]) == sigEnd && i+endLen+int(le.Uint16(tail[i+20:])) == len(tail) {
			return p.tailOff + int64(i), tail[i:], nil
		}
	}
	return 0, nil, p.truncated()
}

// entries parses n central directory entries and checks each against its
// local header and data descriptor. strict adds the checks of fields our
// writer always leaves zero.
func (p *parser) entries(cd []byte, cdOff int64, n int64, strict bool) ([]Entry, error) {
	out := make([]Entry, 0, n)
	heads := make([][]byte, 0, n) // each entry's fixed central fields
	seen := make(map[string]bool, n)
	pos := 0
	for i := int64(0); i < n; i++ {
		at := cdOff + int64(pos)
		if len(cd)-pos < centralLen || le.Uint32(cd[pos:]) != sigCentral {
			return nil, corrupt(p.path, "", at, "central directory entry %d: bad signature", i)
		}
		h := cd[pos : pos+centralLen]
		nameLen, extraLen, commentLen := int(le.Uint16(h[28:])), int(le.Uint16(h[30:])), int(le.Uint16(h[32:]))
		if pos+centralLen+nameLen+extraLen+commentLen > len(cd) {
			return nil, corrupt(p.path, "", at, "central directory entry %d runs past the directory", i)
		}
		name := string(cd[pos+centralLen : pos+centralLen+nameLen])
		extra := cd[pos+centralLen+nameLen : pos+centralLen+nameLen+extraLen]
		pos += centralLen + nameLen + extraLen + commentLen
		if !utf8.ValidString(name) || name == "" {
			return nil, corrupt(p.path, "", at, "central directory entry %d: bad name %q", i, name)
		}
		if seen[name] {
			return nil, corrupt(p.path, name, at, "record appears twice in the central directory")
		}
		seen[name] = true
		e := Entry{Name: name, Method: le.Uint16(h[10:]), CRC: le.Uint32(h[16:])}
		csize, usize, hoff := int64(le.Uint32(h[20:])), int64(le.Uint32(h[24:])), int64(le.Uint32(h[42:]))
		var err error
		if usize, csize, hoff, err = zip64Fields(extra, usize, csize, hoff); err != nil {
			return nil, corrupt(p.path, name, at, "%v", err)
		}
		if e.Method == 0 && csize != usize {
			return nil, corrupt(p.path, name, at, "stored record with compressed size %d != size %d", csize, usize)
		}
		e.Size, e.HeaderOff = csize, hoff
		if strict && (le.Uint16(h[4:]) != 0 || le.Uint32(h[10:]) != 0 || le.Uint32(h[34:]) != 0 ||
			le.Uint32(h[38:]) != 0 || commentLen != 0 || e.Method != 0 || extraLen != zip64ExtraLen(hoff, csize) ||
			le.Uint16(h[6:]) != versionFor(hoff, csize) || le.Uint16(h[8:]) != flagsFor(csize)) {
			return nil, corrupt(p.path, name, at, "central directory entry differs from what pyfastensor writes")
		}
		out = append(out, e)
		heads = append(heads, h)
	}
	if pos != len(cd) {
		return nil, corrupt(p.path, "", cdOff+int64(pos), "%d stray bytes after the last central directory entry", len(cd)-pos)
	}
	if err := p.checkLocals(out, heads, cdOff); err != nil {
		return nil, err
	}
	var prevEnd int64
	for i := range out {
		e := &out[i]
		if e.HeaderOff < prevEnd {
			return nil, corrupt(p.path, e.Name, e.HeaderOff, "record overlaps the record before it")
		}
		prevEnd = e.DataOff + e.Size
	}
	return out, nil
}

// checkLocals checks every entry's local header and data descriptor. The
// checks read the file at two small places per record; one at a time they
// would each wait for the disk on a cold cache. Runs of small records are
// therefore read in spans of up to spanMax bytes (one large sequential
// read, which also leaves their data in the page cache for the loads that
// follow) and checked from memory, unless the span is already cached;
// large records get their two small reads. Spans and large records are checked on several goroutines.
func (p *parser) checkLocals(es []Entry, heads [][]byte, cdOff int64) error {
	const spanMax = 8 << 20
	// The extra field is unknown until the header is read: allow for the
	// padding of DataAlign plus zip64 fields.
	reach := func(e *Entry) int64 {
		return min(e.HeaderOff+localHeaderLen+int64(len(e.Name))+DataAlign+64+e.Size+24, cdOff)
	}
	type group struct{ first, last int } // entries [first, last]
	var groups []group
	for i := range es {
		e := &es[i]
		if n := len(groups); n > 0 && e.Size < transfer.ExtentMin {
			g := &groups[n-1]
			if f := &es[g.first]; f.Size < transfer.ExtentMin && e.HeaderOff >= f.HeaderOff && reach(e)-f.HeaderOff <= spanMax {
				g.last = i
				continue
			}
		}
		groups = append(groups, group{i, i})
	}
	var spans sync.Pool // span buffers, reused: fresh ones cost a clear each
	// A span already in the page cache gains nothing from being read whole
	// (the load copies its data from the cache anyway): its headers are
	// read one by one, a few hundred bytes each instead of the span.
	los, lens := make([]int64, len(groups)), make([]int64, len(groups)) // spans; 0 bytes: none
	for gi, g := range groups {
		if f := &es[g.first]; f.Size < transfer.ExtentMin {
			lo, hi := f.HeaderOff, reach(&es[g.last])
			for i := g.first; i <= g.last; i++ {
				hi = max(hi, reach(&es[i]))
			}
			los[gi], lens[gi] = lo, max(hi-lo, 0)
		}
	}
	var res []float64
	if p.file == nil { // headers one by one, from memory
		clear(lens)
	} else {
		res, _ = gds.ResidentFile(p.file, los, lens) // best effort: nil reads spans
	}
	return transfer.Run(len(groups), transfer.CachedReadWorkers(), func(gi int) error {
		g := groups[gi]
		v := &view{}
		if lo, n := los[gi], lens[gi]; n > 0 && (res == nil || res[gi] < 0.9) {
			bp, _ := spans.Get().(*[]byte)
			if bp == nil {
				bp = new([]byte)
			}
			defer spans.Put(bp)
			b, err := p.readInto(*bp, lo, n, es[g.first].Name, "records")
			if err != nil {
				return err
			}
			*bp = b
			v.off, v.b = lo, b
		}
		for i := g.first; i <= g.last; i++ {
			if err := p.checkLocal(v, &es[i], heads[i], cdOff); err != nil {
				return err
			}
		}
		return nil
	})
}

// view is a part of the file already in memory; reads it covers are served
// from it, others from the file.
type view struct {
	off int64
	b   []byte
}

func (v *view) read(p *parser, off, n int64, record, what string) ([]byte, error) {
	if off >= v.off && off+n <= v.off+int64(len(v.b)) {
		return v.b[off-v.off : off-v.off+n], nil
	}
	return p.read(off, n, record, what)
}

// zip64Fields replaces 0xFFFFFFFF fields by their zip64 extra values.
func zip64Fields(extra []byte, usize, csize, hoff int64) (int64, int64, int64, error) {
	for len(extra) >= 4 {
		id, n := le.Uint16(extra), int(le.Uint16(extra[2:]))
		if 4+n > len(extra) {
			return 0, 0, 0, errors.New("extra field runs past its end")
		}
		if id == extraZip64 {
			d := extra[4 : 4+n]
			next := func(v *int64) error {
				if *v != max32 {
					return nil
				}
				if len(d) < 8 {
					return errors.New("zip64 extra field too short")
				}
				*v = int64(le.Uint64(d))
				d = d[8:]
				return nil
			}
			for _, v := range []*int64{&usize, &csize, &hoff} {
				if err := next(v); err != nil {
					return 0, 0, 0, err
				}
			}
		}
		extra = extra[4+n:]
	}
	if usize == max32 || csize == max32 || hoff == max32 || usize < 0 || csize < 0 || hoff < 0 {
		return 0, 0, 0, errors.New("size or offset needs a zip64 field that is missing")
	}
	return usize, csize, hoff, nil
}

// checkLocal reads e's local header and data descriptor, checks them
// against the central entry h and sets e.DataOff.
func (p *parser) checkLocal(v *view, e *Entry, h []byte, cdOff int64) error {
	// One read for the header and the name the central entry says it has.
	lh, err := v.read(p, e.HeaderOff, min(localHeaderLen+int64(len(e.Name)), p.size-e.HeaderOff), e.Name, "local header")
	if err != nil {
		return err
	}
	if len(lh) < localHeaderLen || le.Uint32(lh) != sigLocal {
		return corrupt(p.path, e.Name, e.HeaderOff, "bad local header signature")
	}
	flags := le.Uint16(lh[6:])
	if flags != le.Uint16(h[8:]) || le.Uint16(lh[8:]) != e.Method || le.Uint32(lh[10:]) != le.Uint32(h[12:]) {
		return corrupt(p.path, e.Name, e.HeaderOff, "local header disagrees with the central directory (flags, method or time)")
	}
	nameLen, extraLen := int64(le.Uint16(lh[26:])), int64(le.Uint16(lh[28:]))
	if nameLen != int64(len(e.Name)) || len(lh) != localHeaderLen+len(e.Name) || string(lh[localHeaderLen:]) != e.Name {
		return corrupt(p.path, e.Name, e.HeaderOff, "local header names %q", lh[localHeaderLen:])
	}
	e.DataOff = e.HeaderOff + localHeaderLen + nameLen + extraLen
	if e.Size > cdOff-e.DataOff { // not DataOff+Size: a zip64 size may overflow it
		return corrupt(p.path, e.Name, e.DataOff, "data (%d bytes) runs into the central directory at %d", e.Size, cdOff)
	}
	if flags&flagDescriptor == 0 {
		crc, cs, us := le.Uint32(lh[14:]), int64(le.Uint32(lh[18:])), int64(le.Uint32(lh[22:]))
		if crc != e.CRC || (cs != max32 && cs != e.Size) || (us != max32 && e.Method == 0 && us != e.Size) {
			return corrupt(p.path, e.Name, e.HeaderOff, "local header CRC or size disagrees with the central directory")
		}
		return nil
	}
	return p.checkDescriptor(v, e, cdOff)
}

// checkDescriptor compares a record's data descriptor (signature optional,
// 32- or 64-bit sizes) with its central entry.
func (p *parser) checkDescriptor(v *view, e *Entry, cdOff int64) error {
	off := e.DataOff + e.Size
	d, err := v.read(p, off, min(24, cdOff-off), e.Name, "data descriptor")
	if err != nil {
		return err
	}
	if len(d) >= 4 && le.Uint32(d) == sigDescriptor {
		d = d[4:]
	}
	if len(d) < 12 {
		return corrupt(p.path, e.Name, off, "data descriptor cut short")
	}
	if le.Uint32(d) != e.CRC {
		return corrupt(p.path, e.Name, off, "CRC-32 in the data descriptor (%08x) differs from the central directory's (%08x)", le.Uint32(d), e.CRC)
	}
	// The second size is the uncompressed one: only a stored record's
	// equals Size (as with the local header's sizes, a compressed record's
	// is left to torch).
	s32 := int64(le.Uint32(d[4:])) == e.Size && (e.Method != 0 || int64(le.Uint32(d[8:])) == e.Size)
	s64 := len(d) >= 20 && int64(le.Uint64(d[4:])) == e.Size && (e.Method != 0 || int64(le.Uint64(d[12:])) == e.Size)
	if !s32 && !s64 {
		return corrupt(p.path, e.Name, off, "size in the data descriptor differs from the central directory's (%d)", e.Size)
	}
	return nil
}
