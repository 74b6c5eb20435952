package checkpoint

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/pyfastensor/pyfastensor/transfer"
)

func evict(t *testing.T, path string) {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
}

func cache(t *testing.T, path string) {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	_, err = io.Copy(io.Discard, f)
	require.NoError(t, err)
}

func TestEndRecordCount(t *testing.T) {
	path, a := savedSample(t)
	ours, n := endRecordCount(path, a.Size)
	assert.True(t, ours)
	assert.Equal(t, int64(len(a.Entries)), n)
	foreign := filepath.Join(t.TempDir(), "foreign.zip")
	require.NoError(t, os.WriteFile(foreign, []byte("PK\x05\x06 not one of ours, long enough"), 0o644))
	ours, n = endRecordCount(foreign, 39)
	assert.False(t, ours)
	assert.Zero(t, n)
}

// bigRecords are 20 records of 1 MiB: a file over WholeMin whose records
// average over WholeAverageMin.
func bigRecords() []Record {
	var recs []Record
	for i := range 20 {
		recs = append(recs, Record{Name: fmt.Sprintf("archive/data/%d", i), Data: testutil.Pattern(1<<20, uint64(i)), Align: DataAlign})
	}
	return recs
}

func TestPlanLoadDecides(t *testing.T) {
	path, a := saved(t, bigRecords())
	require.GreaterOrEqual(t, a.Size, int64(transfer.WholeMin))

	plan, err := PlanLoad(path, true, false)
	require.NoError(t, err)
	assert.False(t, plan.Whole)
	assert.Contains(t, plan.Reason, "mapped")

	cache(t, path)
	plan, err = PlanLoad(path, false, false)
	require.NoError(t, err)
	assert.False(t, plan.Whole)
	assert.Equal(t, 1.0, plan.Resident)
	assert.Contains(t, plan.Reason, "page cache")

	evict(t, path)
	plan, err = PlanLoad(path, false, false)
	require.NoError(t, err)
	assert.Equal(t, a.Size, plan.Size)
	if !transfer.Probe(filepath.Dir(path)).Direct {
		assert.False(t, plan.Whole)
		assert.Contains(t, plan.Reason, "O_DIRECT")
		t.Skip("no O_DIRECT in the temporary directory: the whole-file decision cannot be taken here")
	}
	assert.True(t, plan.Whole, plan.Reason)
	assert.Equal(t, int64(transfer.WholeRequest), plan.Request)

	small, _ := saved(t, sampleRecords()[:5])
	evict(t, small)
	plan, err = PlanLoad(small, false, false)
	require.NoError(t, err)
	assert.False(t, plan.Whole, "sample is under WholeMin")

	_, err = PlanLoad(path+".missing", false, false)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// A record-by-record load puts large records in aligned memory, cold or
// cached, and the rest in the allocator's; the residency is kept for the
// engines.
func TestOpenForLoadPlansMemory(t *testing.T) {
	path, _ := savedSample(t)
	evict(t, path)
	a, err := OpenForLoad(path, 0)
	require.NoError(t, err)
	defer a.Close()
	for i, e := range a.Entries {
		want := MemoryAllocator
		if e.Size >= transfer.AlignedMin {
			want = MemoryAligned
		}
		assert.Equal(t, want, e.Memory, e.Name)
		assert.Equal(t, 0.0, a.resident[i])
	}
	b, err := OpenForLoad(path, 1)
	require.NoError(t, err)
	defer b.Close()
	for i, e := range b.Entries {
		want := MemoryAllocator
		if e.Size >= transfer.AlignedMin {
			want = MemoryAligned
		}
		assert.Equal(t, want, e.Memory, "cached: %s", e.Name)
		assert.Equal(t, 1.0, b.resident[i])
	}
}

func TestReadWholeCarves(t *testing.T) {
	path, a := savedSample(t)
	w, err := ReadWhole(path, make([]byte, a.Size), ReadOptions{Chooser: transfer.Fixed("posix")})
	require.NoError(t, err)
	defer w.Close()
	for _, e := range w.Entries {
		want := MemoryAllocator
		if e.DataOff%transfer.Page == 0 && e.Size >= transfer.CarveMin {
			want = MemoryPages
		}
		assert.Equal(t, want, e.Memory, e.Name)
	}
}
