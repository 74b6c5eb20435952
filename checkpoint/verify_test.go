package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// mappedRecords saves the sample records, maps the file privately and
// returns the archive and one request per record over the mapping.
func mappedRecords(t *testing.T) (*Archive, []ReadRequest, []byte, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ck.pt")
	_, err := Save(path, sampleRecords(), WriteOptions{})
	require.NoError(t, err)
	a, err := OpenArchive(path)
	require.NoError(t, err)
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, int(a.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(m) })
	reqs := make([]ReadRequest, len(a.Entries))
	for i, e := range a.Entries {
		reqs[i] = ReadRequest{Index: i, Dst: m[e.DataOff : e.DataOff+e.Size]}
	}
	return a, reqs, m, path
}

func TestVerifyMappedRecords(t *testing.T) {
	a, reqs, _, _ := mappedRecords(t)
	var seen atomic.Int64
	require.NoError(t, a.Verify(reqs, ReadOptions{Progress: func(n int64) { seen.Add(n) }}))
	var want int64
	for _, e := range a.Entries {
		want += e.Size
	}
	assert.Equal(t, want, seen.Load())
}

func TestVerifyNamesTheCorruptRecord(t *testing.T) {
	a, reqs, m, _ := mappedRecords(t)
	i := len(a.Entries) - 2 // the largest record, several pieces
	e := a.Entries[i]
	m[e.DataOff+e.Size-1] ^= 0x40 // the private copy only: the file is intact
	err := a.Verify(reqs, ReadOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), e.Name)
	assert.Contains(t, err.Error(), "CRC-32")
}

func TestVerifyTruncatedMappingIsAnError(t *testing.T) {
	a, reqs, _, path := mappedRecords(t)
	require.NoError(t, os.Truncate(path, 4096)) // the pages past it now fault
	err := a.Verify(reqs, ReadOptions{})
	require.Error(t, err)
	assert.False(t, errors.Is(err, ErrCorrupt))
	assert.Contains(t, err.Error(), "memory fault")
	assert.Contains(t, err.Error(), path)
}

func TestVerifyRejectsWrongSizes(t *testing.T) {
	a, reqs, _, _ := mappedRecords(t)
	i := len(reqs) - 2
	reqs[i].Dst = reqs[i].Dst[:1]
	assert.ErrorContains(t, a.Verify(reqs, ReadOptions{}), "memory 1")
}
