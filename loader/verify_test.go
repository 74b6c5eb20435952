package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
)

// damage flips one byte of the file at path, at off.
func damage(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[off] ^= 0xff
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// requireCorrupt checks that err is a *CorruptError about path (and
// sample, -1 for none) whose message says want.
func requireCorrupt(t *testing.T, err error, path string, sample int, want string) *CorruptError {
	t.Helper()
	require.ErrorIs(t, err, ErrCorrupt)
	var ce *CorruptError
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Equal(t, path, ce.Path)
	require.Equal(t, sample, ce.Sample)
	require.ErrorContains(t, err, path)
	if sample >= 0 {
		require.ErrorContains(t, err, fmt.Sprintf("sample %d", sample))
	}
	require.ErrorContains(t, err, want)
	return ce
}

func TestVerifyPackFindsTheFirstDamage(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 30, classes: 2, maxSize: 700, seed: 21}, 5)
	var total int64
	var last int64
	require.NoError(t, VerifyPack(p.Dir, func(done, all int64) {
		require.Greater(t, done, last)
		last, total = done, all
	}))
	require.Equal(t, total, last)

	// Damage a sample of chunk 4, then one of chunk 2: the error names
	// chunk 2's file and its sample.
	ix := p.Index
	hit := func(c, k int) int {
		i := c*5 + k
		for ix.Samples[i].Length == 0 {
			i++
		}
		damage(t, p.ChunkPath(c), ix.Samples[i].Offset+ix.Samples[i].Length/2)
		return i
	}
	i := hit(4, 1)
	err := VerifyPack(p.Dir, nil)
	requireCorrupt(t, err, p.ChunkPath(4), i, "where the index has")
	i = hit(2, 3)
	err = VerifyPack(p.Dir, nil)
	ce := requireCorrupt(t, err, p.ChunkPath(2), i, "CRC-32")
	require.Equal(t, 2, ce.Chunk)
	require.Equal(t, ix.Samples[i].Offset, ce.Offset)
}

func TestVerifyPackDamagedPadding(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 4, classes: 1, maxSize: 100, seed: 22}, 4)
	ch := p.Index.Chunks[0]
	require.Less(t, ch.DataLength, ch.Length)
	damage(t, p.ChunkPath(0), ch.Length-1)
	ce := requireCorrupt(t, VerifyPack(p.Dir, nil), p.ChunkPath(0), -1, "padding after the samples is not zero")
	require.Equal(t, ch.Length-1, ce.Offset)
}

func TestOpenPackChecksChunkFiles(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 12, classes: 3, maxSize: 300, seed: 23}, 4)
	path := p.ChunkPath(1)
	require.NoError(t, os.Truncate(path, 4096*7))
	_, err := OpenPack(p.Dir)
	requireCorrupt(t, err, path, -1, "28672 bytes where the index says 4096")
	require.ErrorIs(t, VerifyPack(p.Dir, nil), ErrCorrupt)

	require.NoError(t, os.Remove(path))
	_, err = OpenPack(p.Dir)
	requireCorrupt(t, err, path, -1, "chunk file missing")
	require.ErrorIs(t, err, fs.ErrNotExist)

	require.NoError(t, os.Remove(filepath.Join(p.Dir, IndexName)))
	_, err = OpenPack(p.Dir)
	requireCorrupt(t, err, filepath.Join(p.Dir, IndexName), -1, "no index")
}

func TestOpenPackNewerVersion(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 3, classes: 1, maxSize: 10, seed: 24}, 2)
	path := filepath.Join(p.Dir, IndexName)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	binary.LittleEndian.PutUint32(b[8:], 7)
	require.NoError(t, os.WriteFile(path, reCRC(b), 0o644))
	_, err = OpenPack(p.Dir)
	require.ErrorIs(t, err, ErrVersion)
	require.ErrorContains(t, err, path+" is pack format version 7; this build reads versions up to 1")
	require.ErrorIs(t, VerifyPack(p.Dir, nil), ErrVersion)
}

func TestOpenPackDamagedIndex(t *testing.T) {
	_, p := newPack(t, datasetOpts{n: 3, classes: 1, maxSize: 10, seed: 25}, 2)
	path := filepath.Join(p.Dir, IndexName)
	damage(t, path, 100)
	_, err := OpenPack(p.Dir)
	requireCorrupt(t, err, path, -1, "index CRC-32")
	require.NotErrorIs(t, err, gds.ErrInvalid)
}
