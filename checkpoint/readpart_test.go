package checkpoint

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Reading a record part after part through one small buffer gives its
// bytes and, at its last part, checks its CRC-32.
func TestReadPartSumsAcrossParts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ck.pt")
	recs := sampleRecords()
	_, err := Save(path, recs, WriteOptions{})
	require.NoError(t, err)
	a, err := OpenArchive(path)
	require.NoError(t, err)
	defer a.Close()
	buf := make([]byte, 1<<20+3)
	for i, r := range recs {
		var got []byte
		var crc uint32
		for off := 0; off < len(r.Data); off += len(buf) {
			n := min(len(buf), len(r.Data)-off)
			part, err := a.ReadPart(i, int64(off), buf[:n], ReadOptions{})
			require.NoError(t, err, r.Name)
			crc, err = a.JoinPart(i, int64(off), n, crc, part)
			require.NoError(t, err, r.Name)
			got = append(got, buf[:n]...)
		}
		assert.True(t, bytes.Equal(r.Data, got), r.Name)
	}
}

func TestReadPartCatchesACorruptRecordAtItsLastPart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ck.pt")
	recs := sampleRecords()
	_, err := Save(path, recs, WriteOptions{})
	require.NoError(t, err)
	big := len(recs) - 2 // the largest storage record
	a, err := OpenArchive(path)
	require.NoError(t, err)
	off := a.Entries[big].DataOff + 5
	require.NoError(t, a.Close())
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff ^ recs[big].Data[5]}, off)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	a, err = OpenArchive(path)
	require.NoError(t, err)
	defer a.Close()
	size := int64(len(recs[big].Data))
	half := size / 2
	// The second half read first: parts are read in any order, joined in order.
	second, err := a.ReadPart(big, half, make([]byte, size-half), ReadOptions{})
	require.NoError(t, err, "reading checks nothing")
	first, err := a.ReadPart(big, 0, make([]byte, half), ReadOptions{})
	require.NoError(t, err)
	crc, err := a.JoinPart(big, 0, int(half), 0, first)
	require.NoError(t, err, "a mismatch shows only once the record is whole")
	_, err = a.JoinPart(big, half, int(size-half), crc, second)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, recs[big].Name)
	unchecked, err := a.ReadPart(big, half, make([]byte, size-half), ReadOptions{NoVerify: true})
	assert.NoError(t, err)
	assert.Zero(t, unchecked, "no sum without verify")
	_, err = a.ReadPart(big, size-1, make([]byte, 2), ReadOptions{})
	assert.ErrorIs(t, err, gds.ErrInvalid, "a part past the record's end")
	_, err = a.JoinPart(big, size-1, 2, 0, 0)
	assert.ErrorIs(t, err, gds.ErrInvalid, "a part past the record's end")
}

// SumPart over a record's bytes in memory, part after part, agrees with
// its CRC-32, and catches a flipped byte at the last part.
func TestSumPartChecksRecordsInMemory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ck.pt")
	recs := sampleRecords()
	_, err := Save(path, recs, WriteOptions{})
	require.NoError(t, err)
	a, err := OpenArchive(path)
	require.NoError(t, err)
	defer a.Close()
	const part = 3<<20 + 5
	for i, r := range recs {
		var crc uint32
		for off := 0; off < len(r.Data); off += part {
			crc, err = a.SumPart(i, int64(off), r.Data[off:min(off+part, len(r.Data))], crc)
			require.NoError(t, err, r.Name)
		}
	}
	big := len(recs) - 2
	bad := append([]byte(nil), recs[big].Data...)
	bad[len(bad)-1] ^= 1
	_, err = a.SumPart(big, 0, bad, 0)
	assert.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, recs[big].Name)
	_, err = a.SumPart(big, 1, bad, 0)
	assert.ErrorIs(t, err, gds.ErrInvalid, "a part past the record's end")
}
