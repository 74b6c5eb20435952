package checkpoint

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/pyfastensor/pyfastensor/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// More than 65535 entries: the end record's counts overflow, the zip64 end
// record carries them.
func TestZip64ManyEntries(t *testing.T) {
	const n = 70000
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{Name: fmt.Sprintf("archive/data/%d", i), Data: []byte(fmt.Sprint(i))}
	}
	path := filepath.Join(t.TempDir(), "many.pt")
	_, err := Save(path, recs, WriteOptions{NotDurable: true})
	require.NoError(t, err)
	zr, err := zip.OpenReader(path)
	require.NoError(t, err)
	defer zr.Close()
	require.Len(t, zr.File, n)
	a, err := OpenArchive(path)
	require.NoError(t, err)
	require.Len(t, a.Entries, n)
	last := a.Entries[n-1]
	dst := make([]byte, last.Size)
	_, err = a.Read([]ReadRequest{{Index: n - 1, Dst: dst}}, ReadOptions{})
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(n-1), string(dst))
}

// A record over 4 GiB, and records past 4 GiB: zip64 sizes and offsets in
// local headers, descriptors and central entries. The big record's memory
// is an untouched anonymous mapping (zero pages), so the test costs disk
// bandwidth, not memory.
func TestZip64LargeRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 4 GiB")
	}
	big, err := unix.Mmap(-1, 0, 4<<30+12345, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANON)
	require.NoError(t, err)
	defer unix.Munmap(big)
	recs := []Record{
		{Name: "archive/data.pkl", Data: []byte("p")},
		{Name: "archive/data/0", Data: big, Align: DataAlign},
		{Name: "archive/data/1", Data: []byte("after the big one"), Align: DataAlign},
		{Name: "archive/version", Data: []byte("3\n")},
	}
	path := filepath.Join(t.TempDir(), "big.pt")
	_, err = Save(path, recs, WriteOptions{NotDurable: true, Chooser: transfer.Fixed("posix")})
	require.NoError(t, err)

	zr, err := zip.OpenReader(path)
	require.NoError(t, err)
	defer zr.Close()
	require.Len(t, zr.File, 4)
	assert.Equal(t, uint64(len(big)), zr.File[1].UncompressedSize64)
	rc, err := zr.File[2].Open()
	require.NoError(t, err)
	got, err := io.ReadAll(rc)
	require.NoError(t, err) // also checks the CRC and the zip64 descriptor
	assert.Equal(t, "after the big one", string(got))

	a, err := OpenArchive(path)
	require.NoError(t, err)
	assert.Greater(t, a.Entries[2].HeaderOff, int64(max32))
	assert.Zero(t, a.Entries[2].DataOff%DataAlign)
	dst := make([]byte, a.Entries[2].Size)
	_, err = a.Read([]ReadRequest{{Index: 2, Dst: dst}}, ReadOptions{})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(recs[2].Data, dst))
	assert.Equal(t, transfer.Checksum(big), a.Entries[1].CRC)
}
