package checkpoint

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stagedOf marks every storage record of recs staged: its Data removed,
// its size kept.
func stagedOf(recs []Record) (out []Record, staged []bool, sizes []int64) {
	out = make([]Record, len(recs))
	copy(out, recs)
	staged = make([]bool, len(recs))
	sizes = make([]int64, len(recs))
	for i := range out {
		sizes[i] = -1
		if out[i].Align == DataAlign {
			staged[i], sizes[i], out[i].Data = true, int64(len(out[i].Data)), nil
		}
	}
	return out, staged, sizes
}

// beginBesideSave writes recs with Save to want and begins a staged save
// of the same records to got, in one temporary directory: the staged
// records are those stagedOf picks.
func beginBesideSave(t *testing.T, recs []Record) (want, got string, s *Staged, staged []bool) {
	t.Helper()
	dir := t.TempDir()
	want, got = filepath.Join(dir, "save.pt"), filepath.Join(dir, "staged.pt")
	_, err := Save(want, recs, WriteOptions{})
	require.NoError(t, err)
	placed, staged, sizes := stagedOf(recs)
	s, err = BeginStaged(got, placed, staged, sizes, WriteOptions{})
	require.NoError(t, err)
	return want, got, s, staged
}

// assertSameFile checks that got holds the bytes of want, and returns them.
func assertSameFile(t *testing.T, want, got string) []byte {
	t.Helper()
	a, err := os.ReadFile(want)
	require.NoError(t, err)
	b, err := os.ReadFile(got)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(a, b), "%s differs from %s", got, want)
	return b
}

// A staged save written in parts of an odd size (through one reused
// buffer, as waves of a staging buffer would be) writes the very bytes Save
// writes for the same records.
func TestStagedSaveIsByteIdenticalToSave(t *testing.T) {
	recs := sampleRecords()
	want, got, s, staged := beginBesideSave(t, recs)
	buf := make([]byte, 3<<20+17) // the reused staging buffer
	for i, r := range recs {
		if !staged[i] {
			continue
		}
		for off := 0; off < len(r.Data); off += len(buf) {
			n := copy(buf, r.Data[off:])
			require.NoError(t, s.WritePart(i, int64(off), buf[:n]))
		}
	}
	_, err := os.Stat(got)
	assert.True(t, os.IsNotExist(err), "nothing at the target before the commit")
	st, err := s.Commit()
	require.NoError(t, err)
	b := assertSameFile(t, want, got)
	assert.Equal(t, int64(len(b)), st.FileBytes)

	ar, err := OpenArchive(got)
	require.NoError(t, err)
	defer ar.Close()
	reqs := make([]ReadRequest, len(recs))
	for i := range recs {
		reqs[i] = ReadRequest{Index: i, Dst: make([]byte, len(recs[i].Data))}
	}
	_, err = ar.Read(reqs, ReadOptions{})
	require.NoError(t, err, "every CRC-32 checks")
}

// Parts of several records in one call (small records packed together,
// two parts of one record in order) write the bytes Save writes; a call
// whose parts are out of order writes nothing and counts nothing.
func TestStagedSaveWritesManyPartsInOneCall(t *testing.T) {
	recs := sampleRecords()
	want, got, s, staged := beginBesideSave(t, recs)
	var parts []Part
	for i, r := range recs {
		if staged[i] {
			half := len(r.Data) / 2
			parts = append(parts, Part{Rec: i, Off: 0, Data: r.Data[:half]}, Part{Rec: i, Off: int64(half), Data: r.Data[half:]})
		}
	}
	swapped := append([]Part{parts[3], parts[2]}, parts[4:]...)
	assert.ErrorIs(t, s.WriteParts(swapped), gds.ErrInvalid, "a record's parts in order")
	require.NoError(t, s.WriteParts(parts))
	_, err := s.Commit()
	require.NoError(t, err)
	assertSameFile(t, want, got)
}

func TestStagedSaveRefusesMisuse(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.pt")
	recs := []Record{{Name: "archive/data.pkl", Data: []byte("p")}, {Name: "archive/data/0", Align: DataAlign}}
	staged, sizes := []bool{false, true}, []int64{-1, 10}

	_, err := BeginStaged(path, []Record{recs[0], {Name: "archive/data/0", Data: []byte("x"), Align: DataAlign}}, staged, sizes, WriteOptions{})
	assert.ErrorIs(t, err, gds.ErrInvalid, "a staged record comes with no data")

	s, err := BeginStaged(path, recs, staged, sizes, WriteOptions{})
	require.NoError(t, err)
	assert.ErrorIs(t, s.WritePart(0, 0, []byte("a")), gds.ErrInvalid, "record 0 is not staged")
	assert.ErrorIs(t, s.WritePart(1, 3, []byte("abc")), gds.ErrInvalid, "parts come in order")
	assert.ErrorIs(t, s.WritePart(1, 0, make([]byte, 11)), gds.ErrInvalid, "no more than the record's size")
	require.NoError(t, s.WritePart(1, 0, []byte("01234")))
	_, err = s.Commit()
	assert.ErrorContains(t, err, `record "archive/data/0" has 5 of its 10 bytes`)
	_, err = os.Stat(path)
	assert.True(t, os.IsNotExist(err), "a failed commit leaves nothing at the target")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "the temporary file is removed")
	s.Abort() // idempotent
	assert.ErrorIs(t, s.WritePart(1, 5, []byte("x")), gds.ErrInvalid, "no part after an abort")
}

// A torch archive staged storage by storage (some staged, some from
// memory) is the file SaveTorch writes: the same layout, the storages on
// DataAlign, decided here for both.
func TestTorchStagedIsByteIdenticalToSaveTorch(t *testing.T) {
	dir := t.TempDir()
	arch := TorchArchive{Prefix: "archive", Pickle: []byte("pickle"), ByteOrder: "little", SerializationID: "42",
		Storages: []TorchStorage{{Key: "0", Data: bytes.Repeat([]byte("a"), 5000)}, {Key: "1", Data: []byte("tiny")},
			{Key: "2", Data: bytes.Repeat([]byte("b"), 9000)}}}
	want := filepath.Join(dir, "save.pt")
	_, err := SaveTorch(want, arch, WriteOptions{})
	require.NoError(t, err)

	staged := []bool{true, false, true}
	in := arch
	in.Storages = make([]TorchStorage, len(arch.Storages))
	sizes := make([]int64, len(arch.Storages))
	for k, s := range arch.Storages {
		in.Storages[k], sizes[k] = s, -1
		if staged[k] {
			in.Storages[k].Data, sizes[k] = nil, int64(len(s.Data))
		}
	}
	got := filepath.Join(dir, "staged.pt")
	s, err := BeginTorchStaged(got, in, staged, sizes, WriteOptions{})
	require.NoError(t, err)
	assert.ErrorIs(t, s.WriteStorage(3, 0, []byte("x")), gds.ErrInvalid, "no storage 3")
	assert.ErrorIs(t, s.WriteStorage(1, 0, []byte("x")), gds.ErrInvalid, "storage 1 is not staged")
	for k, st := range arch.Storages {
		if staged[k] {
			require.NoError(t, s.WriteStorage(k, 0, st.Data[:1000]))
			require.NoError(t, s.WriteStorage(k, 1000, st.Data[1000:]))
		}
	}
	_, err = s.Commit()
	require.NoError(t, err)
	assertSameFile(t, want, got)

	ar, err := OpenArchive(got)
	require.NoError(t, err)
	defer ar.Close()
	for _, e := range ar.Entries {
		if strings.HasPrefix(e.Name, "archive/data/") {
			assert.Zero(t, e.DataOff%DataAlign, e.Name)
		}
	}
}
