package checkpoint

import (
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/pyfastensor/pyfastensor/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// sampleRecords mixes what a checkpoint holds: small metadata, empty
// records, records under and over the extent and piece sizes, sizes that
// are not multiples of any block.
func sampleRecords() []Record {
	sizes := []int{0, 1, 4095, 4096, 70001, transfer.ExtentMin, transfer.ExtentMin + 13, gds.DefaultTaskSize + 4097, 2*gds.DefaultTaskSize + 1}
	recs := []Record{{Name: "archive/data.pkl", Data: []byte("pickle bytes")}}
	for i, n := range sizes {
		recs = append(recs, Record{Name: fmt.Sprintf("archive/data/%d", i), Data: testutil.Pattern(n, uint64(i)), Align: DataAlign})
	}
	return append(recs, Record{Name: "archive/version", Data: []byte("3\n")})
}

func TestLayoutAlignsData(t *testing.T) {
	l := plan(sampleRecords())
	for _, p := range l.recs {
		align := p.Align
		if align == 0 {
			align = MetaAlign
		}
		assert.Zero(t, p.dataOff%align, p.Name)
		assert.Equal(t, p.dataOff, p.hdrOff+int64(len(localHeader(p.Name, p.hdrOff, p.size(), p.pad))), p.Name)
	}
}

// saveRoundTrip saves and reads sampleRecords through chooser; served
// lists the engines that must have moved the records' bytes (nil: not
// checked).
func saveRoundTrip(t *testing.T, chooser transfer.Chooser, served ...string) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ck.pt")
	recs := sampleRecords()
	st, err := Save(path, recs, WriteOptions{Chooser: chooser})
	require.NoError(t, err)
	assert.Equal(t, st.FileBytes, fileSize(t, path))
	for _, e := range served {
		assert.Positive(t, st.Engines[e], "engine %s moved none of the save's bytes: %v", e, st.Engines)
	}

	// The standard library's zip reader agrees, CRCs included.
	zr, err := zip.OpenReader(path)
	require.NoError(t, err)
	defer zr.Close()
	require.Len(t, zr.File, len(recs))
	for i, f := range zr.File {
		assert.Equal(t, recs[i].Name, f.Name)
		rc, err := f.Open()
		require.NoError(t, err)
		got, err := io.ReadAll(rc)
		require.NoError(t, err, f.Name)
		assert.True(t, bytes.Equal(recs[i].Data, got), f.Name)
	}

	a, err := OpenArchive(path)
	require.NoError(t, err)
	assert.True(t, a.Ours)
	reqs := make([]ReadRequest, len(a.Entries))
	for i, e := range a.Entries {
		assert.Equal(t, recs[i].Name, e.Name)
		if recs[i].Align == DataAlign {
			assert.Zero(t, e.DataOff%DataAlign, e.Name)
		}
		reqs[i] = ReadRequest{Index: i, Dst: make([]byte, e.Size)}
	}
	evict(t, path) // the zip reader above cached the file: a resident record is read through the cache
	rst, err := a.Read(reqs, ReadOptions{Chooser: chooser})
	require.NoError(t, err)
	for _, e := range served {
		assert.Positive(t, rst.Engines[e], "engine %s moved none of the load's bytes: %v", e, rst.Engines)
	}
	for i := range reqs {
		assert.True(t, bytes.Equal(recs[i].Data, reqs[i].Dst), recs[i].Name)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	assert.Empty(t, left, "temporary files left behind")
}

func TestRoundTripPosix(t *testing.T) { saveRoundTrip(t, transfer.Fixed("posix"), "posix") }
func TestRoundTripDirect(t *testing.T) {
	if p := transfer.Probe(t.TempDir()); !p.Direct {
		t.Skipf("no O_DIRECT in the temporary directory (%s): the direct engine would fall back to posix", p.DirectReason)
	}
	saveRoundTrip(t, &transfer.Threshold{Direct: true, Min: 1}, "direct")
}
func TestRoundTripDefault(t *testing.T) {
	saveRoundTrip(t, nil)
}

func fileSize(t *testing.T, path string) int64 {
	st, err := os.Stat(path)
	require.NoError(t, err)
	return st.Size()
}

func savedSample(t *testing.T) (string, *Archive) {
	return saved(t, sampleRecords())
}

func saved(t *testing.T, recs []Record) (string, *Archive) {
	path := filepath.Join(t.TempDir(), "ck.pt")
	_, err := Save(path, recs, WriteOptions{NotDurable: true})
	require.NoError(t, err)
	a, err := OpenArchive(path)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	return path, a
}

func flip(t *testing.T, path string, off int64) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := []byte{0}
	_, err = f.ReadAt(b, off)
	require.NoError(t, err)
	b[0] ^= 0x20
	_, err = f.WriteAt(b, off)
	require.NoError(t, err)
}

func readAll(a *Archive) error {
	reqs := make([]ReadRequest, len(a.Entries))
	for i, e := range a.Entries {
		reqs[i] = ReadRequest{Index: i, Dst: make([]byte, e.Size)}
	}
	_, err := a.Read(reqs, ReadOptions{})
	return err
}

func TestFlippedDataByte(t *testing.T) {
	path, a := savedSample(t)
	e := a.Entries[5]
	flip(t, path, e.DataOff+e.Size/2)
	err := readAll(a)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), e.Name)

	a.Entries[5].CRC = transfer.Checksum(nil) // verification off reads it anyway
	reqs := []ReadRequest{{Index: 5, Dst: make([]byte, e.Size)}}
	_, err = a.Read(reqs, ReadOptions{NoVerify: true})
	require.NoError(t, err)
}

func TestFlippedCentralDirectoryByte(t *testing.T) {
	path, a := saved(t, sampleRecords()[:6])
	last := a.Entries[len(a.Entries)-1]
	cdOff := last.DataOff + last.Size + 16
	size := fileSize(t, path)
	for off := cdOff; off < size; off++ {
		p2 := filepath.Join(t.TempDir(), "c.pt")
		copyFile(t, path, p2)
		flip(t, p2, off)
		_, err := OpenArchive(p2)
		require.ErrorIs(t, err, ErrCorrupt, "flip at %d of %d", off, size)
		assert.Contains(t, err.Error(), p2)
	}
	// A flip in an entry's CRC field names that entry.
	p2 := filepath.Join(t.TempDir(), "c.pt")
	copyFile(t, path, p2)
	flip(t, p2, cdOff+16)
	_, err := OpenArchive(p2)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), `"archive/data.pkl"`)
}

func copyFile(t *testing.T, from, to string) {
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o644))
}

func TestTruncatedNamesRecord(t *testing.T) {
	path, a := savedSample(t)
	e := a.Entries[7]
	require.NoError(t, os.Truncate(path, e.DataOff+e.Size/3))
	_, err := OpenArchive(path)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), e.Name)
	assert.Contains(t, err.Error(), "truncated")
}

func TestSaveErrorsLeaveTargetAlone(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "ck.pt")
	require.NoError(t, os.WriteFile(target, []byte("old"), 0o644))
	_, err := Save(target, []Record{{Name: "a"}, {Name: "a"}}, WriteOptions{})
	require.Error(t, err)
	got, _ := os.ReadFile(target)
	assert.Equal(t, "old", string(got))

	_, err = Save(filepath.Join(dir, "missing", "ck.pt"), sampleRecords()[:1], WriteOptions{})
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestNotAZip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x")
	require.NoError(t, os.WriteFile(path, []byte("hello, not a zip at all"), 0o644))
	_, err := OpenArchive(path)
	require.True(t, errors.Is(err, ErrCorrupt), "%v", err)
}

// A piece may be any size up to the engines' task size; a task size that
// does not divide records must still work (pieces of odd sizes, straight
// and bounced).
func TestOddTaskSize(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ck.pt")
	recs := sampleRecords()
	opts := gds.Options{TaskSize: 3<<20 + 4096}
	_, err := Save(path, recs, WriteOptions{Chooser: &transfer.Threshold{Direct: true, Min: 1}, Engine: opts})
	require.NoError(t, err)
	a, err := OpenArchive(path)
	require.NoError(t, err)
	reqs := make([]ReadRequest, len(a.Entries))
	for i, e := range a.Entries {
		reqs[i] = ReadRequest{Index: i, Dst: make([]byte, e.Size)}
	}
	_, err = a.Read(reqs, ReadOptions{Chooser: &transfer.Threshold{Direct: true, Min: 1}, Engine: opts})
	require.NoError(t, err)
	for i := range reqs {
		assert.True(t, bytes.Equal(recs[i].Data, reqs[i].Dst), recs[i].Name)
	}
}

func TestSaveThroughSymlinkKeepsModeAndLink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real.pt")
	link := filepath.Join(dir, "link.pt")
	require.NoError(t, os.WriteFile(real, []byte("old"), 0o600))
	require.NoError(t, os.Symlink("real.pt", link))
	_, err := Save(link, sampleRecords()[:2], WriteOptions{})
	require.NoError(t, err)
	fi, err := os.Lstat(link)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&os.ModeSymlink, "the link stays a link")
	st, err := os.Stat(real)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	_, err = OpenArchive(link)
	require.NoError(t, err)
}

// The default chooser reads a cold record direct and a cached one through
// the page cache, deciding per load from mincore.
func TestDefaultReadFollowsResidency(t *testing.T) {
	dir := t.TempDir()
	if !gds.ProbeDir(dir).Direct {
		t.Skip("no O_DIRECT in the temporary directory")
	}
	path := filepath.Join(dir, "ck.pt")
	data := testutil.Pattern(3<<20, 7)
	_, err := Save(path, []Record{{Name: "archive/data/0", Data: data, Align: DataAlign}}, WriteOptions{})
	require.NoError(t, err)
	read := func() map[string]int64 {
		a, err := OpenArchive(path)
		require.NoError(t, err)
		dst := make([]byte, len(data))
		st, err := a.Read([]ReadRequest{{Index: 0, Dst: dst}}, ReadOptions{})
		require.NoError(t, err)
		require.True(t, bytes.Equal(data, dst))
		return st.Engines
	}

	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
	assert.Equal(t, map[string]int64{"direct": int64(len(data))}, read(), "cold: direct")
	a, err := OpenArchive(path)
	require.NoError(t, err)
	res, err := a.Resident()
	require.NoError(t, err)
	require.Len(t, res, 1)
	assert.Less(t, res[0], 0.1, "a direct read leaves the data uncached (read-ahead around the headers aside)")

	_, err = io.Copy(io.Discard, f) // the whole file into the page cache
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"posix": int64(len(data))}, read(), "cached: posix")
	res, err = a.Resident()
	require.NoError(t, err)
	assert.Equal(t, []float64{1}, res)
}

// Local headers of small records are checked from whole spans when the
// file is cold and one by one when it is cached: a damaged header is found
// either way, and names its record.
func TestFlippedLocalHeaderColdAndCached(t *testing.T) {
	path, a := saved(t, sampleRecords()[:6]) // small records: one span
	e := a.Entries[3]
	flip(t, path, e.HeaderOff+localHeaderLen) // first byte of the name
	for _, cold := range []bool{true, false} {
		f, err := os.Open(path)
		require.NoError(t, err)
		if cold {
			require.NoError(t, unix.Fsync(int(f.Fd())))
			require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
			r, err := gds.Resident(path, []int64{0}, []int64{fileSize(t, path)})
			require.NoError(t, err)
			if r[0] >= 0.9 { // tmpfs keeps its pages
				f.Close()
				t.Skip("the temporary directory cannot drop cached pages: the cold case cannot run here")
			}
		} else {
			_, err = io.Copy(io.Discard, f)
			require.NoError(t, err)
		}
		f.Close()
		_, err = OpenArchive(path)
		require.ErrorIs(t, err, ErrCorrupt, "cold=%v", cold)
		assert.Contains(t, err.Error(), e.Name, "cold=%v", cold)
	}
}

// manySmall is a state dict of small tensors: a few hundred KiB of metadata
// first, then records of 1 byte to 40 KB, enough for several runs.
func manySmall(n int) []Record {
	recs := []Record{{Name: "archive/data.pkl", Data: testutil.Pattern(300<<10, 99)}}
	for i := range n {
		recs = append(recs, Record{Name: fmt.Sprintf("archive/data/%d", i), Data: testutil.Pattern(1+(i*7919)%40000, uint64(i)), Align: DataAlign})
	}
	return recs
}

func TestRunsMeetOnBlockBoundaries(t *testing.T) {
	l := plan(manySmall(1200))
	rs := runs(&l, make([]bool, len(l.recs)))
	require.Greater(t, len(rs), 2)
	next := int64(0)
	for k, r := range rs {
		assert.Equal(t, next, r.off, "run %d: runs cover the file up to the central directory", k)
		next = r.off + r.n
		if k > 0 {
			assert.Zero(t, r.off%transfer.Alignment, "run %d starts inside a block", k)
			assert.Equal(t, byte('d'), r.spans[0].kind, "run %d starts with a record's data", k)
		}
		assert.LessOrEqual(t, r.n, int64(transfer.RunMax+64<<10), "run %d", k)
		for j, s := range r.spans { // a descriptor follows its data in the same run
			if s.kind == 'x' {
				require.Positive(t, j, "run %d begins with a descriptor", k)
				assert.Equal(t, span{s.rec, 'd'}, r.spans[j-1], "run %d", k)
			}
		}
	}
	assert.Equal(t, l.cdOff, next)
}

func TestManySmallRecordsRoundTrip(t *testing.T) {
	// Runs composed in borrowed memory, summed as they are copied, written
	// direct where the directory allows it: stock archive/zip checks every
	// CRC-32 and every byte.
	path := filepath.Join(t.TempDir(), "ck.pt")
	recs := manySmall(1200)
	st, err := Save(path, recs, WriteOptions{Chooser: &transfer.Threshold{Direct: true, Min: 1}})
	require.NoError(t, err)
	if transfer.Probe(filepath.Dir(path)).Direct {
		assert.Positive(t, st.Engines["direct"], "runs of small records go through the chooser's engine")
	}
	z, err := zip.OpenReader(path)
	require.NoError(t, err)
	defer z.Close()
	require.Len(t, z.File, len(recs))
	for i, f := range z.File {
		r, err := f.Open()
		require.NoError(t, err)
		got, err := io.ReadAll(r) // archive/zip fails on a CRC-32 mismatch
		require.NoError(t, err, f.Name)
		assert.True(t, bytes.Equal(recs[i].Data, got), f.Name)
	}
}

func TestSaveWithoutCRCsWritesZerosAndLoadsUnchecked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nocrc.pt")
	recs := sampleRecords()
	_, err := Save(path, recs, WriteOptions{NotDurable: true, NoCRC: true})
	require.NoError(t, err)
	a, err := OpenArchive(path)
	require.NoError(t, err)
	defer a.Close()
	assert.True(t, a.NoCRC)
	for i, e := range a.Entries {
		assert.Zero(t, e.CRC, e.Name)
		assert.Equal(t, e.Size > 0, e.Unchecked(), e.Name)
		dst := make([]byte, e.Size)
		_, err := a.Read([]ReadRequest{{Index: i, Dst: dst}}, ReadOptions{})
		require.NoError(t, err)
		assert.True(t, bytes.Equal(recs[i].Data, dst), e.Name)
	}
}

func TestARecordWithoutCRCIsReadUncheckedAndTheOthersChecked(t *testing.T) {
	path, a := savedSample(t)
	// Record 5 as torch writes a record under skip_data(): CRC-32 field 0,
	// its bytes filled in later (here: changed after the save).
	a.Entries[5].CRC = 0
	e := a.Entries[5]
	flip(t, path, e.DataOff+e.Size/2)
	require.NoError(t, readAll(a))
	whole, err := os.ReadFile(path) // as a mapped load checks it, from memory
	require.NoError(t, err)
	require.NoError(t, a.Verify([]ReadRequest{{Index: 5, Dst: whole[e.DataOff : e.DataOff+e.Size]}}, ReadOptions{}))

	other := a.Entries[6]
	flip(t, path, other.DataOff+1)
	err = readAll(a)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), other.Name)
}
