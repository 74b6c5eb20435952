package checkpoint

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOpenArchiveMemoryMatchesTheFile(t *testing.T) {
	path, a := savedSample(t)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	m, err := OpenArchiveMemory(path, data)
	require.NoError(t, err)
	assert.Equal(t, a, m)

	// Records verified from the same memory.
	reqs := make([]ReadRequest, len(m.Entries))
	for i, e := range m.Entries {
		reqs[i] = ReadRequest{Index: i, Dst: data[e.DataOff : e.DataOff+e.Size]}
	}
	require.NoError(t, m.Verify(reqs, ReadOptions{}))
}

func TestOpenArchiveMemoryCatchesWhatTheFileCheckCatches(t *testing.T) {
	path, a := saved(t, sampleRecords()[:6])
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	e := a.Entries[3]

	header := append([]byte(nil), data...)
	header[e.HeaderOff+localHeaderLen] ^= 0xff // first byte of the local header's name
	_, err = OpenArchiveMemory(path, header)
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), e.Name)

	_, err = OpenArchiveMemory(path, data[:len(data)-100]) // truncated
	require.ErrorIs(t, err, ErrCorrupt)
	assert.Contains(t, err.Error(), path)
}

func TestPlanWhole(t *testing.T) {
	path, a := savedSample(t)
	plan, err := PlanWhole(path)
	require.NoError(t, err)
	assert.Equal(t, a.Size, plan.Size)
	assert.GreaterOrEqual(t, plan.Resident, 0.0)
	assert.LessOrEqual(t, plan.Resident, 1.0)
	assert.True(t, plan.Ours)
	assert.Equal(t, int64(len(a.Entries)), plan.Records)
	foreign := filepath.Join(t.TempDir(), "foreign.zip")
	require.NoError(t, os.WriteFile(foreign, []byte("PK\x05\x06 not one of ours, long enough"), 0o644))
	plan, err = PlanWhole(foreign)
	require.NoError(t, err)
	assert.False(t, plan.Ours)
	assert.Zero(t, plan.Records)
	_, err = PlanWhole(path + ".missing")
	require.ErrorIs(t, err, os.ErrNotExist)
}
