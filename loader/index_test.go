package loader

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/transfer"
)

// reCRC returns b with its trailer set to the CRC-32 of the rest: an
// index damaged on purpose past its checksum, to reach the checks behind.
func reCRC(b []byte) []byte {
	b = bytes.Clone(b)
	if len(b) >= 4 {
		binary.LittleEndian.PutUint32(b[len(b)-4:], transfer.Checksum(b[:len(b)-4]))
	}
	return b
}

// smallIndex packs a small dataset and returns its index's bytes: 7
// samples in chunks of 3 (the last of 1), 2 classes.
func smallIndex(t testing.TB) []byte {
	t.Helper()
	_, p := newPack(t, datasetOpts{n: 7, classes: 2, maxSize: 20, seed: 11}, 3)
	b, err := os.ReadFile(filepath.Join(p.Dir, IndexName))
	require.NoError(t, err)
	return b
}

func TestIndexRoundTrip(t *testing.T) {
	b := smallIndex(t)
	ix, err := ParseIndex("x", b)
	require.NoError(t, err)
	require.Equal(t, b, encodeIndex(ix), "parse then encode gives the same bytes")
	require.Equal(t, binary.LittleEndian.Uint32(b[len(b)-4:]), ix.CRC)
}

func TestParseIndexErrors(t *testing.T) {
	b := smallIndex(t)
	ix, err := ParseIndex("x", b)
	require.NoError(t, err)
	// Offsets of the tables in b.
	classes := indexHeaderSize
	chunks := classes
	for _, c := range ix.Classes {
		chunks += 4 + len(c)
	}
	samples := chunks
	for _, c := range ix.Chunks {
		samples += indexChunkFixed + len(c.Name)
	}
	set32 := func(off int, v uint32) []byte {
		c := bytes.Clone(b)
		binary.LittleEndian.PutUint32(c[off:], v)
		return reCRC(c)
	}
	set64 := func(off int, v uint64) []byte {
		c := bytes.Clone(b)
		binary.LittleEndian.PutUint64(c[off:], v)
		return reCRC(c)
	}
	s1 := samples + indexSampleSize // the second sample's entry
	for _, tc := range []struct {
		name, want string
		data       []byte
	}{
		{"empty", "no \"PFTBRAND\" magic", nil},
		{"another magic", "no \"PFTBRAND\" magic", append([]byte("PFTBRANX"), b[8:]...)},
		{"version 0", "format version 0", set32(8, 0)},
		{"cut short", "index CRC-32", b[:len(b)-5]},
		{"header only", "shorter than the 92-byte header and trailer", b[:20]},
		{"a flipped bit", "index CRC-32", func() []byte { c := bytes.Clone(b); c[s1+4] ^= 8; return c }()},
		{"flags", "unknown flags 0x4", set32(12, 4)},
		{"no samples", "0 samples", set64(16, 0)},
		{"more samples than the file holds", "need at least", func() []byte {
			c := set64(16, 3<<28)
			binary.LittleEndian.PutUint64(c[24:], 1<<28)
			return reCRC(c)
		}()},
		{"chunk count", "2 chunks for 7 samples in chunks of 3 (want 3)", set64(24, 2)},
		{"chunk size 0", "chunk size 0", set32(36, 0)},
		{"alignment", "alignment 4000", set32(48, 4000)},
		{"reserved", "reserved field 0x1", set32(52, 1)},
		{"no classes", "0 classes", set32(32, 0)},
		{"a class name's length", "class 0: name of 4097 bytes", set32(classes, 4097)},
		{"a repeated class", "is class 0's too", func() []byte {
			c := bytes.Clone(b)
			copy(c[classes+4+len(ix.Classes[0])+4:], ix.Classes[0])
			return reCRC(c)
		}()},
		{"a chunk's name", `chunk 0 is named "chunk-1.bin"`, func() []byte {
			c := bytes.Clone(b)
			c[chunks+2+6] = '1'
			return reCRC(c)
		}()},
		{"a chunk's file length", "is not its data length", set64(chunks+2+len(ix.Chunks[0].Name), 1)},
		{"a chunk's sample count", "chunk 0: 2 samples where its place in the pack gives 3", set32(chunks+2+len(ix.Chunks[0].Name)+16, 2)},
		{"a sample's chunk", "sample 1: chunk 1 where its position gives chunk 0", set32(s1, 1)},
		{"a sample's offset", "sample 1: offset 0 in chunk-0.bin", set64(s1+4, 0)},
		{"a sample's length", "run past", set64(s1+12, 1<<39)},
		{"a sample's label", "sample 1: label 2 of 2 classes", set32(s1+20, 2)},
		{"a repeated source", "sample 1: source index", set64(s1+28, uint64(ix.Samples[0].Source))},
		{"a source out of range", "sample 1: source index 7", set64(s1+28, 7)},
		{"bytes after the table", "the sample table is 256 bytes, not 252 for 7 samples", reCRC(append(bytes.Clone(b), 0, 0, 0, 0))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseIndex("/p/index.pfi", tc.data)
			require.ErrorIs(t, err, ErrCorrupt)
			require.NotErrorIs(t, err, ErrVersion)
			require.ErrorContains(t, err, "/p/index.pfi is corrupt")
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestParseIndexNewerVersion(t *testing.T) {
	b := smallIndex(t)
	binary.LittleEndian.PutUint32(b[8:], FormatVersion+1)
	// Refused before its checksum is looked at: a newer version may
	// keep it elsewhere.
	_, err := ParseIndex("/p/index.pfi", b)
	require.ErrorIs(t, err, ErrVersion)
	require.NotErrorIs(t, err, ErrCorrupt)
	var ve *VersionError
	require.True(t, errors.As(err, &ve))
	require.Equal(t, &VersionError{Path: "/p/index.pfi", Found: 2, Supported: 1}, ve)
	require.EqualError(t, err, "loader: /p/index.pfi is pack format version 2; this build reads versions up to 1 (upgrade pyfastensor to read it)")
}
