package loader

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/transfer"
)

// listDir returns the names in dir, sorted.
func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestPackRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ds := makeDataset(t, dir, datasetOpts{n: 103, classes: 4, maxSize: 3000, seed: 1})
	spec := ds.spec
	spec.ChunkSize, spec.Seed = 10, 42
	out := filepath.Join(dir, "out")
	var last, calls int64
	st, err := Pack(spec, out, func(done, total int64) {
		require.Greater(t, done, last, "progress increases")
		require.EqualValues(t, 103, total)
		last, calls = done, calls+1
	})
	require.NoError(t, err)
	assert.EqualValues(t, 103, last)
	assert.EqualValues(t, 11, calls, "one call per chunk")
	assert.Equal(t, PackStats{Samples: 103, Chunks: 11, ChunksWritten: 11, DataBytes: st.DataBytes, FileBytes: st.FileBytes,
		IndexBytes: st.IndexBytes, SpecHash: st.SpecHash, Seconds: st.Seconds}, st)

	p, err := OpenPack(out)
	require.NoError(t, err)
	ix := p.Index
	require.Equal(t, 103, ix.Len())
	require.Len(t, ix.Chunks, 11)
	assert.Equal(t, 3, ix.Chunks[10].Samples, "the last chunk holds the remainder")
	assert.Equal(t, spec.Classes, ix.Classes)
	assert.Equal(t, uint64(42), ix.Seed)
	// The order is the seeded shuffle: a permutation, not the identity.
	sources := make([]int, ix.Len())
	var total int64
	for i, e := range ix.Samples {
		sources[i] = e.Source
		total += e.Length
	}
	assert.Equal(t, shuffled(103, 42), sources)
	assert.NotEqual(t, shuffled(103, 43), sources, "another seed, another order")
	assert.False(t, slices.IsSorted(sources))
	assert.Equal(t, total, st.DataBytes)
	// Every sample's bytes lie in its chunk file where the index says; the
	// chunk files are padded with zeros to the alignment.
	for c, ch := range ix.Chunks {
		b, err := os.ReadFile(p.ChunkPath(c))
		require.NoError(t, err)
		require.EqualValues(t, ch.Length, len(b))
		require.Zero(t, len(b)%transfer.Alignment)
		require.Equal(t, transfer.Checksum(b), ch.CRC)
		for k := range ch.Samples {
			e := ix.Samples[c*10+k]
			require.Equal(t, ds.data[e.Source], b[e.Offset:e.Offset+e.Length])
			require.Equal(t, ds.spec.Samples[e.Source].Label, e.Label)
		}
		require.Equal(t, make([]byte, ch.Length-ch.DataLength), b[ch.DataLength:])
	}
	require.NoError(t, VerifyPack(out, nil))

	// The same spec packs to the same bytes, whatever the workers.
	spec.Workers = 1
	out2 := filepath.Join(dir, "out2")
	_, err = Pack(spec, out2, nil)
	require.NoError(t, err)
	for _, name := range listDir(t, out) {
		a, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(out2, name))
		require.NoError(t, err)
		require.Equal(t, a, b, name)
	}
}

func TestPackResumes(t *testing.T) {
	dir := t.TempDir()
	ds := makeDataset(t, dir, datasetOpts{n: 50, classes: 3, maxSize: 5000, seed: 2})
	spec := ds.spec
	spec.ChunkSize, spec.Seed = 8, 1
	out := filepath.Join(dir, "out")
	first, err := Pack(spec, out, nil)
	require.NoError(t, err)
	again, err := Pack(spec, out, nil)
	require.NoError(t, err)
	assert.True(t, again.Resumed, "a complete pack packed again")
	assert.Equal(t, first.Chunks, again.ChunksKept)
	assert.Zero(t, again.ChunksWritten)
	want := map[string][]byte{}
	for _, name := range listDir(t, out) {
		want[name], err = os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err)
	}
	// An interrupted run: no index, one chunk damaged, one missing, one
	// cut short.
	require.NoError(t, os.Remove(filepath.Join(out, IndexName)))
	b := want[ChunkName(2)]
	b = append([]byte{b[0] ^ 1}, b[1:]...)
	require.NoError(t, os.WriteFile(filepath.Join(out, ChunkName(2)), b, 0o644))
	require.NoError(t, os.Remove(filepath.Join(out, ChunkName(4))))
	require.NoError(t, os.Truncate(filepath.Join(out, ChunkName(6)), 100))
	require.ErrorIs(t, VerifyPack(out, nil), ErrCorrupt, "no index, no pack")

	st, err := Pack(spec, out, nil)
	require.NoError(t, err)
	assert.True(t, st.Resumed)
	assert.Equal(t, 3, st.ChunksWritten)
	assert.Equal(t, first.Chunks-3, st.ChunksKept)
	assert.Equal(t, first.SpecHash, st.SpecHash)
	for name, w := range want {
		got, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err)
		require.Equal(t, w, got, name)
	}
	require.NoError(t, VerifyPack(out, nil))
}

func TestPackRestartsForAnotherSpec(t *testing.T) {
	dir := t.TempDir()
	ds := makeDataset(t, dir, datasetOpts{n: 40, classes: 2, maxSize: 500, seed: 3})
	spec := ds.spec
	spec.ChunkSize, spec.Seed = 4, 1
	out := filepath.Join(dir, "out")
	_, err := Pack(spec, out, nil)
	require.NoError(t, err)
	require.Len(t, listDir(t, out), 10+2)

	spec.ChunkSize, spec.Seed = 16, 2
	st, err := Pack(spec, out, nil)
	require.NoError(t, err)
	assert.False(t, st.Resumed)
	assert.Equal(t, 10, st.StaleRemoved)
	assert.Equal(t, 3, st.ChunksWritten)
	assert.Equal(t, []string{ChunkName(0), ChunkName(1), ChunkName(2), IndexName, PlanName}, listDir(t, out))
	p, err := OpenPack(out)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), p.Index.Seed)
	assert.Equal(t, 16, p.Index.ChunkSize)
	require.NoError(t, VerifyPack(out, nil))

	// A changed sample list is another spec too.
	spec.Samples = spec.Samples[:39]
	st, err = Pack(spec, out, nil)
	require.NoError(t, err)
	assert.False(t, st.Resumed)
	assert.Equal(t, 3, st.StaleRemoved)
}

// failing is a FaultFS that fails the first step of kind op on a path
// containing part (a temporary file's name holds its target's).
func failing(op transfer.FSOp, part string) *transfer.FaultFS {
	failed := false
	return &transfer.FaultFS{Base: transfer.OS, Fail: func(o transfer.FSOp, path string, _ int64) error {
		if o == op && strings.Contains(filepath.Base(path), part) && !failed {
			failed = true
			return syscall.EIO
		}
		return nil
	}}
}

func TestPackInterruptedNeverVerifies(t *testing.T) {
	dir := t.TempDir()
	ds := makeDataset(t, dir, datasetOpts{n: 60, classes: 3, maxSize: 2000, seed: 4})
	spec := ds.spec
	spec.ChunkSize, spec.Seed, spec.Workers = 6, 9, 1
	out := filepath.Join(dir, "out")

	for _, tc := range []struct {
		name string
		fs   *transfer.FaultFS
	}{
		{"a chunk's write", failing(transfer.FSCreate, ChunkName(7))},
		{"a chunk's fsync", failing(transfer.FSSync, ChunkName(3))},
		{"the index's fsync", failing(transfer.FSSync, IndexName)},
		{"the index's rename", failing(transfer.FSRename, IndexName)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec
			s.FS = tc.fs
			_, err := Pack(s, out, nil)
			require.ErrorIs(t, err, syscall.EIO)
			_, err = OpenPack(out)
			require.ErrorIs(t, err, ErrCorrupt)
			require.ErrorContains(t, err, "no index")
			require.ErrorIs(t, VerifyPack(out, nil), ErrCorrupt)
			for _, name := range listDir(t, out) {
				assert.False(t, transfer.IsTempName(name), "%s left behind", name)
			}

			st, err := Pack(spec, out, nil)
			require.NoError(t, err)
			assert.True(t, st.Resumed)
			assert.Positive(t, st.ChunksKept)
			require.NoError(t, VerifyPack(out, nil))
		})
	}
}

func TestPackRefusesForeignFiles(t *testing.T) {
	dir := t.TempDir()
	ds := makeDataset(t, dir, datasetOpts{n: 5, classes: 1, maxSize: 10, seed: 5})
	spec := ds.spec
	spec.ChunkSize = 2
	for _, tc := range []struct {
		name, want string
		make       func(out string)
	}{
		{"a file of another program", "notes.txt", func(out string) {
			require.NoError(t, os.WriteFile(filepath.Join(out, "notes.txt"), []byte("mine"), 0o644))
		}},
		{"a directory", "sub", func(out string) { require.NoError(t, os.Mkdir(filepath.Join(out, "sub"), 0o755)) }},
		{"chunk files without a plan", "no " + PlanName, func(out string) {
			require.NoError(t, os.WriteFile(filepath.Join(out, ChunkName(0)), []byte("x"), 0o644))
		}},
		{"a plan not ours", PlanName + " in", func(out string) {
			require.NoError(t, os.WriteFile(filepath.Join(out, PlanName), []byte("{}"), 0o644))
		}},
		{"a chunk-like name", "chunk-01.bin", func(out string) {
			require.NoError(t, os.WriteFile(filepath.Join(out, "chunk-01.bin"), nil, 0o644))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			require.NoError(t, os.Mkdir(out, 0o755))
			tc.make(out)
			before := listDir(t, out)
			_, err := Pack(spec, out, nil)
			require.ErrorIs(t, err, ErrNotOurs)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, out)
			require.Equal(t, before, listDir(t, out), "nothing written or removed")
		})
	}
}

func TestPackSpecErrors(t *testing.T) {
	dir := t.TempDir()
	ds := makeDataset(t, dir, datasetOpts{n: 4, classes: 2, maxSize: 10, seed: 6})
	good := ds.spec
	good.ChunkSize = 2
	for _, tc := range []struct {
		want   string
		change func(s *PackSpec)
	}{
		{"no samples", func(s *PackSpec) { s.Samples = nil }},
		{"chunk size 0", func(s *PackSpec) { s.ChunkSize = 0 }},
		{"chunk size 2097152", func(s *PackSpec) { s.ChunkSize = 2 << 20 }},
		{"no class names", func(s *PackSpec) { s.Classes = nil }},
		{`class 1: name "a" is class 0's too`, func(s *PackSpec) { s.Classes = []string{"a", "a"} }},
		{"sample 1 (" + good.Samples[1].Path + "): label 2 of 2 classes", func(s *PackSpec) {
			s.Samples = slices.Clone(s.Samples)
			s.Samples[1].Label = 2
		}},
		{"sample 3: no path", func(s *PackSpec) {
			s.Samples = slices.Clone(s.Samples)
			s.Samples[3].Path = ""
		}},
	} {
		s := good
		tc.change(&s)
		_, err := Pack(s, filepath.Join(dir, "out"), nil)
		require.ErrorIs(t, err, ErrInvalid, tc.want)
		require.ErrorContains(t, err, tc.want)
	}

	s := good
	s.Samples = slices.Clone(s.Samples)
	s.Samples[2].Path = filepath.Join(dir, "gone.bin")
	_, err := Pack(s, filepath.Join(dir, "out"), nil)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, "sample 2")
	require.ErrorContains(t, err, "gone.bin")

	s.Samples[2].Path = dir
	_, err = Pack(s, filepath.Join(dir, "out"), nil)
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "not a regular file")
}

func TestPackEmptySamples(t *testing.T) {
	dir := t.TempDir()
	ds := makeDataset(t, dir, datasetOpts{n: 9, classes: 1, maxSize: 0, seed: 7})
	p := ds.pack(t, dir, 4, 1)
	for _, c := range p.Index.Chunks {
		assert.Zero(t, c.Length, "a chunk of empty samples is an empty file")
	}
	require.NoError(t, VerifyPack(p.Dir, nil))
	s, err := NewServer(p, ServerOptions{Budget: minBudget(p)})
	require.NoError(t, err)
	got := serveAll(t, s, ds, perm(9, 1), 4)
	requireExactlyOnce(t, 9, got)
}

func TestChunkNumber(t *testing.T) {
	for _, n := range []int{0, 1, 9, 10, 12345} {
		got, ok := chunkNumber(ChunkName(n))
		require.True(t, ok)
		require.Equal(t, n, got)
	}
	for _, name := range []string{"chunk-.bin", "chunk-01.bin", "chunk--1.bin", "chunk-1.bin.x", "chunk-1", "chunk-+1.bin", "xchunk-1.bin"} {
		_, ok := chunkNumber(name)
		require.False(t, ok, name)
	}
}
