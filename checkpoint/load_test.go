package checkpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
)

// counting counts the opens a load makes and its reads of the end
// records (any read of the file covering the end record's first byte).
func counting(t *testing.T, eocd int64) (opens, endReads *int) {
	opens, endReads = new(int), new(int)
	open, trace := openFile, traceRead
	openFile = func(name string) (*os.File, error) { *opens++; return open(name) }
	traceRead = func(off, n int64) {
		if off <= eocd && eocd < off+n {
			*endReads++
		}
	}
	t.Cleanup(func() { openFile, traceRead = open, trace })
	return opens, endReads
}

// endsOf returns what the file's end records say.
func endsOf(t *testing.T, path string) *ends {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	st, err := f.Stat()
	require.NoError(t, err)
	e, err := (&parser{f: f, path: path, size: st.Size()}).findEnds()
	require.NoError(t, err)
	return e
}

// A load opens the file once and reads its end records once, whether it
// parses the file in place or reads it whole first; the records read
// back as written.
func TestLoadOpensOnceAndReadsTheEndRecordsOnce(t *testing.T) {
	recs := sampleRecords()
	for i := range 1500 { // a central directory larger than the tail read
		recs = append(recs, Record{Name: fmt.Sprintf("archive/data/s%d", i), Data: testutil.Pattern(100, uint64(i)), Align: DataAlign})
	}
	path, _ := saved(t, recs)
	e := endsOf(t, path)
	require.Greater(t, e.cdSize, int64(endLen+max16), "the directory is read in two parts: from the file, and from the tail")
	eocd := e.eocd
	for _, whole := range []int{-1, 1} {
		t.Run(fmt.Sprint("whole=", whole), func(t *testing.T) {
			opens, endReads := counting(t, eocd)
			a, err := Load(path, LoadOptions{whole: whole})
			require.NoError(t, err)
			assert.Equal(t, 1, *opens)
			assert.Equal(t, 1, *endReads)
			assert.Equal(t, whole > 0, a.ReadWhole)
			assert.Equal(t, "archive/", a.Prefix)
			assert.Empty(t, a.Fallback)
			reqs := make([]ReadRequest, len(recs))
			for i, r := range recs {
				reqs[i] = ReadRequest{Index: a.Index(r.Name), Dst: make([]byte, len(r.Data))}
			}
			_, err = a.Read(reqs, ReadOptions{})
			require.NoError(t, err)
			for i, r := range recs {
				assert.Equal(t, r.Data, reqs[i].Dst, r.Name)
			}
			require.NoError(t, a.Close())
			assert.Equal(t, whole > 0, a.Arena != 0)
			a.DropArena()
		})
	}
}

// The load decides when torch.load must take the file, and says why,
// having read nothing past the end records.
func TestLoadDecidesTheFallback(t *testing.T) {
	dir := t.TempDir()
	legacy := filepath.Join(dir, "legacy.pt")
	require.NoError(t, os.WriteFile(legacy, []byte("\x80\x02legacy pickle"), 0o644))
	tiny := filepath.Join(dir, "tiny.pt")
	require.NoError(t, os.WriteFile(tiny, []byte("PK"), 0o644))
	for path, want := range map[string]string{legacy: "not a zip archive", tiny: "not a zip archive", dir: "not a regular file"} {
		a, err := Load(path, LoadOptions{})
		require.NoError(t, err)
		assert.Contains(t, a.Fallback, want)
		assert.Empty(t, a.Entries)
		assert.Equal(t, -1, a.Fd)
		require.NoError(t, a.Close())
	}
	script, _ := saved(t, []Record{{Name: "m/data.pkl", Data: []byte("p")}, {Name: "m/constants.pkl", Data: []byte("c")}})
	a, err := Load(script, LoadOptions{})
	require.NoError(t, err)
	assert.Equal(t, "a TorchScript archive", a.Fallback)
	assert.Empty(t, a.Entries[0].Memory, "a fallback plans no memory")
	require.NoError(t, a.Close())
}

// Damage is reported as by OpenArchive, naming the file: a truncated file
// and a flipped byte in the central directory, on both paths.
func TestLoadReportsDamage(t *testing.T) {
	path, a := savedSample(t)
	cut := filepath.Join(t.TempDir(), "cut.pt")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cut, data[:a.Entries[5].DataOff+10], 0o644))
	for _, whole := range []int{-1, 1} {
		_, err := Load(cut, LoadOptions{whole: whole})
		require.ErrorIs(t, err, ErrCorrupt)
		assert.Contains(t, err.Error(), "truncated")
		assert.Contains(t, err.Error(), cut)
	}
	bad := filepath.Join(t.TempDir(), "bad.pt")
	data[a.Size-200] ^= 0xFF
	require.NoError(t, os.WriteFile(bad, data, 0o644))
	for _, whole := range []int{-1, 1} {
		_, err := Load(bad, LoadOptions{whole: whole})
		require.ErrorIs(t, err, ErrCorrupt)
		assert.Contains(t, err.Error(), "central directory entry")
		assert.Contains(t, err.Error(), bad)
	}
}
