package checkpoint

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// Fuzz tests of the zip parser: the central directory, local headers,
// zip64 records and data descriptors of any bytes. The property: the
// parser never panics or hangs, and either returns an archive whose
// entries lie within the data, each of which then reads back (CRC-32
// checked) or fails as corrupt, or returns an error wrapping ErrCorrupt
// that says what is wrong.

// fuzzName is the path the fuzzed archives are parsed as.
const fuzzName = "fuzz.pt"

// archiveSeeds returns the seed corpus: archives written by Save (a few
// records, a single record, none), a zip64 archive, files written by stock
// torch.save (testdata/), a zip written by archive/zip with a compressed
// record, and truncated and damaged variants of the first.
func archiveSeeds(f *testing.F) [][]byte {
	f.Helper()
	dir := f.TempDir()
	save := func(name string, recs []Record) []byte {
		path := filepath.Join(dir, name)
		_, err := Save(path, recs, WriteOptions{NotDurable: true})
		require.NoError(f, err)
		b, err := os.ReadFile(path)
		require.NoError(f, err)
		return b
	}
	few := save("few.pt", []Record{
		{Name: "archive/data.pkl", Data: []byte("pickle bytes")},
		{Name: "archive/data/0", Data: testutil.Pattern(100, 1)},
		{Name: "archive/data/1", Data: nil},
		{Name: "archive/data/2", Data: testutil.Pattern(300, 2)},
		{Name: "archive/version", Data: []byte("3\n")},
	})
	valid := [][]byte{
		few,
		save("one.pt", []Record{{Name: "archive/data/0", Data: []byte("x")}}),
		save("none.pt", nil),
		zip64Archive(),
		stdlibZip(f),
	}
	torch, err := filepath.Glob(filepath.Join("testdata", "torch_*.pt"))
	require.NoError(f, err)
	require.NotEmpty(f, torch, "testdata holds files written by torch.save")
	for _, path := range torch {
		b, err := os.ReadFile(path)
		require.NoError(f, err)
		valid = append(valid, b)
	}
	for _, b := range valid {
		_, err := OpenArchiveMemory(fuzzName, b)
		require.NoError(f, err, "every unharmed seed parses")
	}

	damaged := func(b []byte, off int, to byte) []byte {
		b = bytes.Clone(b)
		b[off] = to
		return b
	}
	central := func(b []byte) int { // the first central directory entry
		return bytes.Index(b, binary.LittleEndian.AppendUint32(nil, sigCentral))
	}
	end, cd := len(few), central(few)
	z64 := valid[3]
	locator := len(z64) - endLen - locator64Len
	a, err := OpenArchiveMemory(fuzzName, few)
	require.NoError(f, err)
	data := int(a.Entries[1].DataOff) + 10 // inside archive/data/0
	return append(valid,
		few[:end/2],                                    // cut inside the records
		few[:cd],                                       // cut before the central directory
		few[:end-1],                                    // cut inside the end record's comment
		few[:end-endLen],                               // no end record at all
		damaged(few, cd+20, 0),                         // a central entry's size
		damaged(few, cd+42, 7),                         // a central entry's header offset
		damaged(few, 0, 'Q'),                           // the first local header's signature
		damaged(few, data, few[data]^1),                // a data byte (CRC mismatch)
		damaged(z64, locator+8, 1),                     // the zip64 locator's offset
		damaged(z64, locator-end64Len+32, 9),           // the zip64 entry count
		damaged(z64, locator-end64Len+40, 200),         // the zip64 directory size
		damaged(z64, central(z64)+centralLen+14+4, 99), // the size in the zip64 extra field
	)
}

// zip64Archive is a one-record archive whose central entry keeps its sizes
// and header offset in a zip64 extra field (the 32-bit fields say
// 0xFFFFFFFF) and whose data descriptor has 64-bit sizes, as a writer that
// always uses zip64 lays it out. Save writes such fields only past 4 GiB,
// too large for a seed.
func zip64Archive() []byte {
	le := binary.LittleEndian
	name, data := "archive/data/0", []byte("a record behind zip64 fields")
	crc := crc32.ChecksumIEEE(data)
	b := le.AppendUint32(nil, sigLocal)
	b = le.AppendUint16(b, versionZip64)
	b = le.AppendUint16(b, flagUTF8|flagDescriptor)
	b = le.AppendUint16(b, 0) // method: stored
	b = le.AppendUint32(b, 0) // time, date
	b = le.AppendUint32(b, 0) // CRC: in the descriptor
	b = le.AppendUint32(b, max32)
	b = le.AppendUint32(b, max32)
	b = le.AppendUint16(b, uint16(len(name)))
	b = le.AppendUint16(b, 4+16)
	b = append(b, name...)
	b = le.AppendUint16(b, extraZip64)
	b = le.AppendUint16(b, 16)
	b = le.AppendUint64(b, 0) // sizes: in the descriptor
	b = le.AppendUint64(b, 0)
	b = append(b, data...)
	b = le.AppendUint32(b, sigDescriptor)
	b = le.AppendUint32(b, crc)
	b = le.AppendUint64(b, uint64(len(data)))
	b = le.AppendUint64(b, uint64(len(data)))

	cdOff := len(b)
	b = le.AppendUint32(b, sigCentral)
	b = le.AppendUint16(b, versionZip64) // made by
	b = le.AppendUint16(b, versionZip64) // needed
	b = le.AppendUint16(b, flagUTF8|flagDescriptor)
	b = le.AppendUint16(b, 0) // method
	b = le.AppendUint32(b, 0) // time, date
	b = le.AppendUint32(b, crc)
	b = le.AppendUint32(b, max32)
	b = le.AppendUint32(b, max32)
	b = le.AppendUint16(b, uint16(len(name)))
	b = le.AppendUint16(b, 4+24)
	b = le.AppendUint16(b, 0) // comment
	b = le.AppendUint16(b, 0) // disk
	b = le.AppendUint16(b, 0) // internal attributes
	b = le.AppendUint32(b, 0) // external attributes
	b = le.AppendUint32(b, max32)
	b = append(b, name...)
	b = le.AppendUint16(b, extraZip64)
	b = le.AppendUint16(b, 24)
	b = le.AppendUint64(b, uint64(len(data))) // uncompressed size
	b = le.AppendUint64(b, uint64(len(data))) // compressed size
	b = le.AppendUint64(b, 0)                 // local header offset
	return append(b, endRecords(1, int64(cdOff), int64(len(b)-cdOff), 0)...)
}

// stdlibZip is a zip written by Go's archive/zip: one stored record and
// one deflated (which the parser describes and leaves to torch).
func stdlibZip(f *testing.F) []byte {
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	for _, h := range []*zip.FileHeader{
		{Name: "archive/data/0", Method: zip.Store},
		{Name: "archive/data.pkl", Method: zip.Deflate},
	} {
		fw, err := w.CreateHeader(h)
		require.NoError(f, err)
		_, err = fw.Write(bytes.Repeat([]byte(h.Name), 20))
		require.NoError(f, err)
	}
	require.NoError(f, w.Close())
	return buf.Bytes()
}

// checkParsed checks the outcome of parsing data as name: an error
// wrapping ErrCorrupt that names the file and says what is wrong, or an archive
// whose entries lie within the data, in order, without overlapping.
func checkParsed(t *testing.T, name string, data []byte, a *Archive, err error) {
	t.Helper()
	if err != nil {
		if a != nil {
			t.Fatalf("an archive and an error: %v", err)
		}
		var ce *CorruptError
		if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) {
			t.Fatalf("error does not wrap ErrCorrupt: %v", err)
		}
		if ce.Reason == "" || ce.Path != name {
			t.Fatalf("corruption error does not say which file and what is wrong: %#v", ce)
		}
		return
	}
	size := int64(len(data))
	if a.Size != size {
		t.Fatalf("archive size %d, data %d bytes", a.Size, size)
	}
	var prevEnd int64
	seen := map[string]bool{}
	for _, e := range a.Entries {
		if e.Name == "" || seen[e.Name] {
			t.Fatalf("entry name %q empty or repeated", e.Name)
		}
		seen[e.Name] = true
		if e.HeaderOff < prevEnd || e.DataOff < e.HeaderOff+localHeaderLen || e.Size < 0 ||
			e.DataOff > size || e.Size > size-e.DataOff {
			t.Fatalf("entry %q (header at %d, %d bytes at %d) does not lie within %d bytes after %d",
				e.Name, e.HeaderOff, e.Size, e.DataOff, size, prevEnd)
		}
		prevEnd = e.DataOff + e.Size
	}
}

// storedRequests asks for every stored record, each into its place in
// data (mem) or into new memory.
func storedRequests(a *Archive, data []byte, inPlace bool) []ReadRequest {
	var reqs []ReadRequest
	for i, e := range a.Entries {
		if e.Method != 0 {
			continue
		}
		dst := data[e.DataOff : e.DataOff+e.Size]
		if !inPlace {
			dst = make([]byte, e.Size)
		}
		reqs = append(reqs, ReadRequest{Index: i, Dst: dst})
	}
	return reqs
}

// checkCRCs checks that a verification or read of reqs (err) agrees with
// the CRC-32s of the records' bytes in data: it fails as corrupt exactly
// when one differs from the central directory's.
func checkCRCs(t *testing.T, a *Archive, data []byte, reqs []ReadRequest, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, ErrCorrupt) {
		t.Fatalf("reading the records: error does not wrap ErrCorrupt: %v", err)
	}
	bad := false
	for _, r := range reqs {
		e := a.Entries[r.Index]
		bad = bad || crc32.ChecksumIEEE(data[e.DataOff:e.DataOff+e.Size]) != e.CRC
	}
	if want := bad && !a.NoCRC; want != (err != nil) {
		t.Fatalf("a record's CRC-32 differs: %v, but reading says %v", want, err)
	}
}

func FuzzOpenArchiveMemory(f *testing.F) {
	for _, b := range archiveSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := OpenArchiveMemory(fuzzName, data)
		checkParsed(t, fuzzName, data, a, err)
		if err != nil {
			return
		}
		reqs := storedRequests(a, data, true)
		checkCRCs(t, a, data, reqs, a.Verify(reqs, ReadOptions{Workers: 1}))
	})
}

// FuzzOpenArchive is FuzzOpenArchiveMemory through a file: the parse must
// agree with the in-memory one, and the records read back through an
// engine.
func FuzzOpenArchive(f *testing.F) {
	for _, b := range archiveSeeds(f) {
		f.Add(b)
	}
	// One file, rewritten by every run: the fuzz function runs one input
	// at a time in each process, and each process has its own directory.
	path := filepath.Join(f.TempDir(), fuzzName)
	f.Fuzz(func(t *testing.T, data []byte) {
		require.NoError(t, os.WriteFile(path, data, 0o600))
		a, err := OpenArchive(path)
		checkParsed(t, path, data, a, err)
		mem, merr := OpenArchiveMemory(fuzzName, data)
		if (err == nil) != (merr == nil) {
			t.Fatalf("the file parses with %v, the same bytes in memory with %v", err, merr)
		}
		if err != nil {
			return
		}
		defer a.Close()
		require.Equal(t, mem.Entries, a.Entries)
		reqs := storedRequests(a, data, false)
		_, err = a.Read(reqs, ReadOptions{Chooser: transfer.Fixed("posix"), Workers: 1})
		checkCRCs(t, a, data, reqs, err)
		if err == nil {
			for _, r := range reqs {
				e := a.Entries[r.Index]
				if !bytes.Equal(r.Dst, data[e.DataOff:e.DataOff+e.Size]) {
					t.Fatalf("record %q reads back other bytes", e.Name)
				}
			}
		}
	})
}
