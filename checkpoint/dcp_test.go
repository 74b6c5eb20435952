package checkpoint

import (
	"encoding/json"
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/transfer"
)

func dcpItems(rng *rand.Rand, sizes ...int) []DCPItem {
	items := make([]DCPItem, len(sizes))
	for i, n := range sizes {
		p := make([]byte, n)
		for k := range p {
			p[k] = byte(rng.Uint32())
		}
		items[i] = DCPItem{Name: fmt.Sprintf("item%d", i), Data: p}
	}
	return items
}

func saveDCP(t *testing.T, path string, items []DCPItem) []DCPRecord {
	t.Helper()
	recs, st, err := SaveDCP(path, items, WriteOptions{})
	require.NoError(t, err)
	var total int64
	for _, it := range items {
		total += int64(len(it.Data))
	}
	assert.Equal(t, total, st.DataBytes)
	return recs
}

func TestDCPRecordsAreAlignedAndSummed(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	items := dcpItems(rng, 0, 1, 4095, 4096, 4097, 100_000, 3)
	path := filepath.Join(t.TempDir(), "__0_0.pfd")
	recs := saveDCP(t, path, items)
	file, err := os.ReadFile(path)
	require.NoError(t, err)
	for i, r := range recs {
		n := int64(len(items[i].Data))
		assert.Equal(t, items[i].Name, r.Name)
		assert.Zero(t, r.Offset%transfer.Alignment, "item %d at %d", i, r.Offset)
		assert.Equal(t, n, r.Length)
		assert.Equal(t, items[i].Data, file[r.Offset:r.Offset+n], "item %d's bytes in the file", i)
		assert.Equal(t, crc32.ChecksumIEEE(items[i].Data), r.CRC, "item %d", i)
		require.Len(t, r.Pages, int(4*pageCount(n)))
		for k := int64(0); k < pageCount(n); k++ {
			page := items[i].Data[k*transfer.Page : min((k+1)*transfer.Page, n)]
			assert.Equal(t, crc32.ChecksumIEEE(page), r.pageSum(k), "item %d page %d", i, k)
		}
	}
	// Whole records read back in place, checked.
	var ranges []DCPRange
	for i, r := range recs {
		ranges = append(ranges, DCPRange{Record: i, Dst: make([]byte, r.Length)})
	}
	st, err := ReadDCP(path, recs, ranges, ReadOptions{})
	require.NoError(t, err)
	for _, r := range ranges {
		assert.Equal(t, items[r.Record].Data, r.Dst)
	}
	assert.Equal(t, st.Requested, st.DataBytes, "whole records: nothing read beyond them")
}

func TestDCPPartialReadsAreMergedAndChecked(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	// A row-major shard of 64 rows of 6000 bytes (a column slice of it is
	// one range per row) and one of 40 000 bytes.
	items := dcpItems(rng, 64*6000, 40_000)
	path := filepath.Join(t.TempDir(), "__0_0.pfd")
	recs := saveDCP(t, path, items)

	t.Run("column slice: one range per row, merged where pages touch", func(t *testing.T) {
		var ranges []DCPRange
		for row := range 64 {
			ranges = append(ranges, DCPRange{Record: 0, Off: int64(row*6000 + 1000), Dst: make([]byte, 3000)})
		}
		rng.Shuffle(len(ranges), func(i, j int) { ranges[i], ranges[j] = ranges[j], ranges[i] })
		st, err := ReadDCP(path, recs, ranges, ReadOptions{})
		require.NoError(t, err)
		for _, r := range ranges {
			assert.Equal(t, items[0].Data[r.Off:r.end()], r.Dst)
		}
		assert.Equal(t, int64(64*3000), st.Requested)
		assert.Less(t, st.Extents, 64, "rows whose pages touch are read in one request")
		assert.LessOrEqual(t, st.DataBytes, recs[0].Length)
	})
	t.Run("row slice: one range, its whole pages in place", func(t *testing.T) {
		r := DCPRange{Record: 0, Off: 10 * 6000, Dst: make([]byte, 20*6000)}
		st, err := ReadDCP(path, recs, []DCPRange{r}, ReadOptions{})
		require.NoError(t, err)
		assert.Equal(t, items[0].Data[r.Off:r.end()], r.Dst)
		assert.Equal(t, int64(3), int64(st.Extents), "head page, middle, tail page")
		assert.Less(t, st.DataBytes, st.Requested+2*transfer.Page)
	})
	t.Run("random ranges", func(t *testing.T) {
		for range 50 {
			var ranges []DCPRange
			for range 1 + rng.IntN(6) {
				rec := rng.IntN(2)
				n := recs[rec].Length
				off := rng.Int64N(n)
				ln := 1 + rng.Int64N(n-off)
				ranges = append(ranges, DCPRange{Record: rec, Off: off, Dst: make([]byte, ln)})
			}
			_, err := ReadDCP(path, recs, ranges, ReadOptions{})
			require.NoError(t, err)
			for _, r := range ranges {
				require.Equal(t, items[r.Record].Data[r.Off:r.end()], r.Dst)
			}
		}
	})
	t.Run("range outside its item", func(t *testing.T) {
		_, err := ReadDCP(path, recs, []DCPRange{{Record: 1, Off: 39_000, Dst: make([]byte, 2000)}}, ReadOptions{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), `outside item "item1" of 40000 bytes`)
	})
}

func TestDCPDamageNamesFileItemAndOffset(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	items := dcpItems(rng, 30_000, 50_000)
	path := filepath.Join(t.TempDir(), "__1_0.pfd")
	recs := saveDCP(t, path, items)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	bad := recs[1].Offset + 5*transfer.Page + 17 // a byte in item1's sixth page
	_, err = f.WriteAt([]byte{^items[1].Data[5*transfer.Page+17]}, bad)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	whole := []DCPRange{{Record: 1, Dst: make([]byte, recs[1].Length)}}
	_, err = ReadDCP(path, recs, whole, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), `record "item1" at offset `+fmt.Sprint(recs[1].Offset))
	assert.Contains(t, err.Error(), "CRC-32")

	part := []DCPRange{{Record: 1, Off: 5*transfer.Page + 100, Dst: make([]byte, 10)}}
	_, err = ReadDCP(path, recs, part, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), fmt.Sprintf(`record "item1" at offset %d`, recs[1].Offset+5*transfer.Page))

	elsewhere := []DCPRange{{Record: 1, Off: 0, Dst: make([]byte, 4*transfer.Page)}, {Record: 0, Dst: make([]byte, recs[0].Length)}}
	_, err = ReadDCP(path, recs, elsewhere, ReadOptions{})
	require.NoError(t, err, "pages and items the damage is not in read cleanly")

	_, err = ReadDCP(path, recs, whole, ReadOptions{NoVerify: true})
	require.NoError(t, err, "unchecked reads do not look")

	require.NoError(t, os.Truncate(path, recs[1].Offset+1000))
	_, err = ReadDCP(path, recs, whole, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), `record "item1"`)
	assert.Contains(t, err.Error(), "truncated")
}

// testMeta is the metadata of the crash test's checkpoints (DCP's is
// pickled by Python): which data files hold which records.
type testMeta map[string][]DCPRecord

func writeCheckpoint(t *testing.T, dir, tag string, rng *rand.Rand, fsys transfer.FS) (testMeta, error) {
	meta := testMeta{}
	var keep []string
	for rank := range 2 {
		name := fmt.Sprintf("__%d_0_%s%s", rank, tag, DataFileSuffix)
		recs, _, err := SaveDCP(filepath.Join(dir, name), dcpItems(rng, 1+rng.IntN(20_000), rng.IntN(9000)), WriteOptions{FS: fsys})
		if err != nil {
			return nil, err
		}
		meta[name] = recs
		keep = append(keep, name)
	}
	b, err := json.Marshal(meta)
	require.NoError(t, err)
	_, err = CommitDCP(dir, ".metadata", b, keep, WriteOptions{FS: fsys})
	return meta, err
}

// A save of checkpoint B over checkpoint A in one directory, crashed at a
// random step, comes back as A or as B, each whole: its metadata names
// data files that are all there and pass their checksums. Only what was
// synced survives (transfer.CrashFS).
func TestDCPCrashLeavesTheOldOrTheNewCheckpoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	root := t.TempDir()
	steps := 0
	counts := map[string]int{}
	for i := range 200 {
		dir := filepath.Join(root, fmt.Sprint(i))
		require.NoError(t, os.Mkdir(dir, 0o755))
		a, err := writeCheckpoint(t, dir, "a", rng, nil)
		require.NoError(t, err)
		if steps == 0 {
			c := transfer.NewCrashFS(transfer.OS, -1)
			probe := filepath.Join(root, "probe")
			require.NoError(t, os.Mkdir(probe, 0o755))
			_, err := writeCheckpoint(t, probe, "a", rng, nil) // the same steps: two files to replace
			require.NoError(t, err)
			_, err = writeCheckpoint(t, probe, "p", rng, c)
			require.NoError(t, err)
			steps = c.Steps()
		}
		crashAt := rng.IntN(steps + 1)
		c := transfer.NewCrashFS(transfer.OS, crashAt)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			require.NoError(t, c.Adopt(filepath.Join(dir, e.Name())))
		}
		b, err := writeCheckpoint(t, dir, "b", rng, c)
		if crashAt < steps {
			require.ErrorIs(t, err, transfer.ErrCrashed)
		} else {
			require.NoError(t, err)
		}
		clone := filepath.Join(dir, "after-crash")
		require.NoError(t, os.Mkdir(clone, 0o755))
		require.NoError(t, c.CloneTo(clone))
		raw, err := os.ReadFile(filepath.Join(clone, ".metadata"))
		require.NoError(t, err, "the metadata must survive every crash (step %d of %d)", crashAt, steps)
		var got testMeta
		require.NoError(t, json.Unmarshal(raw, &got))
		switch {
		case slices.Equal(mapKeys(got), mapKeys(a)):
			counts["old"]++
			require.Less(t, crashAt, steps, "a save that returned came back old")
		case slices.Equal(mapKeys(got), mapKeys(b)):
			counts["new"]++
		default:
			t.Fatalf("metadata of neither checkpoint: %v", mapKeys(got))
		}
		for name, recs := range got {
			var ranges []DCPRange
			for k, r := range recs {
				ranges = append(ranges, DCPRange{Record: k, Dst: make([]byte, r.Length)})
			}
			_, err := ReadDCP(filepath.Join(clone, name), recs, ranges, ReadOptions{})
			require.NoError(t, err, "data file %s of the surviving checkpoint (crash at step %d of %d)", name, crashAt, steps)
		}
	}
	t.Logf("200 crashes over %d steps: %v", steps, counts)
	assert.Positive(t, counts["old"])
	assert.Positive(t, counts["new"])
}

func mapKeys(m testMeta) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestCommitDCPRemovesOnlyEarlierDataFiles(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"__0_0_old.pfd", "__1_0_old.pfd", "__0_0_new.pfd", "notes.txt", "__0_0_old.distcp"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(n), 0o644))
	}
	// A temporary file of a data file whose writer died (pid 1<<30 does not exist).
	stale := filepath.Join(dir, ".__2_0_x.pfd.pyfastensor-tmp-1073741824-abcdef")
	require.NoError(t, os.WriteFile(stale, nil, 0o644))
	removed, err := CommitDCP(dir, ".metadata", []byte("meta"), []string{"__0_0_new.pfd"}, WriteOptions{})
	require.NoError(t, err)
	slices.Sort(removed)
	assert.Equal(t, []string{stale, filepath.Join(dir, "__0_0_old.pfd"), filepath.Join(dir, "__1_0_old.pfd")}, removed)
	var left []string
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	assert.Equal(t, []string{".metadata", "__0_0_new.pfd", "__0_0_old.distcp", "notes.txt"}, left)
	got, err := os.ReadFile(filepath.Join(dir, ".metadata"))
	require.NoError(t, err)
	assert.Equal(t, "meta", string(got))
}

// Without a chooser, whole-record reads follow transfer.Default, as every
// read: a cold extent of transfer.DirectThreshold and up goes direct, a
// smaller one and a cached one through the page cache; a resharded read
// goes through the page cache.
func TestDCPReadsThroughTheDefaultChooser(t *testing.T) {
	dir := t.TempDir()
	if !transfer.Probe(dir).Direct {
		t.Skip("no O_DIRECT in " + dir)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	items := dcpItems(rng, 3000, transfer.DirectThreshold+5000, 700)
	path := filepath.Join(dir, "__0_0.pfd")
	recs := saveDCP(t, path, items)
	evict(t, path)
	small := []DCPRange{{Record: 0, Dst: make([]byte, 3000)}}
	st, err := ReadDCP(path, recs, small, ReadOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"posix"}, slices.Collect(maps.Keys(st.Engines)), "cold, small: %v", st.Engines)
	evict(t, path)
	large := []DCPRange{{Record: 1, Dst: make([]byte, transfer.DirectThreshold+5000)}}
	st, err = ReadDCP(path, recs, large, ReadOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"direct"}, slices.Collect(maps.Keys(st.Engines)), "cold, large: %v", st.Engines)
	assert.Equal(t, items[1].Data, large[0].Dst)

	// A resharded read (a range that is part of a record) goes through the
	// page cache whole, the large record read with it included: ranks on
	// one machine share the pages at their ranges' edges.
	evict(t, path)
	tail := transfer.DirectThreshold + 5000 - 4096 // large enough to go direct on its own
	parts := []DCPRange{{Record: 1, Off: 4096, Dst: make([]byte, tail)}, {Record: 2, Off: 100, Dst: make([]byte, 500)},
		{Record: 0, Dst: make([]byte, 3000)}}
	st, err = ReadDCP(path, recs, parts, ReadOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"posix"}, slices.Collect(maps.Keys(st.Engines)), "resharded: %v", st.Engines)
	assert.Equal(t, items[1].Data[4096:], parts[0].Dst)
	assert.Equal(t, items[2].Data[100:600], parts[1].Dst)
	assert.Equal(t, items[0].Data, parts[2].Dst)
	evict(t, path)
	st, err = ReadDCP(path, recs, parts[:1], ReadOptions{Chooser: transfer.Fixed("direct")})
	require.NoError(t, err)
	assert.Equal(t, []string{"direct"}, slices.Collect(maps.Keys(st.Engines)), "a chooser named: %v", st.Engines)

	_, err = os.ReadFile(path) // now cached
	require.NoError(t, err)
	st, err = ReadDCP(path, recs, large, ReadOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"posix"}, slices.Collect(maps.Keys(st.Engines)), "cached: %v", st.Engines)
}
