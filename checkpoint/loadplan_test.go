package checkpoint

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pyfastensor/pyfastensor/gds"
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

// bigRecords are 20 records of 1 MiB: a file over WholeMin whose records
// average over WholeAverageMin.
func bigRecords() []Record {
	var recs []Record
	for i := range 20 {
		recs = append(recs, Record{Name: fmt.Sprintf("archive/data/%d", i), Data: testutil.Pattern(1<<20, uint64(i)), Align: DataAlign})
	}
	return recs
}

func TestLoadPlans(t *testing.T) {
	path, a := saved(t, bigRecords())
	require.GreaterOrEqual(t, a.Size, int64(transfer.WholeMin))
	plan := func(o LoadOptions) LoadPlan {
		t.Helper()
		l, err := Load(path, o)
		require.NoError(t, err)
		require.NoError(t, l.Close())
		assert.Equal(t, l.Plan.Whole, l.ReadWhole)
		assert.Equal(t, l.Plan.Whole, l.Arena != 0)
		l.DropArena()
		return l.Plan
	}

	p := plan(LoadOptions{ParseOnly: true})
	assert.False(t, p.Whole)
	assert.Contains(t, p.Reason, "mapped")
	p = plan(LoadOptions{Read: ReadOptions{Chooser: transfer.Fixed("posix")}})
	assert.False(t, p.Whole)
	assert.Contains(t, p.Reason, "engine chosen")

	cache(t, path)
	p = plan(LoadOptions{})
	assert.False(t, p.Whole)
	assert.GreaterOrEqual(t, p.Resident, transfer.ResidentShare) // 1 unless another process drops caches meanwhile
	assert.True(t, p.Warm)
	assert.Contains(t, p.Reason, "page cache")

	// A load to a device (parse only) is told the residency too, measured before its reads.
	p = plan(LoadOptions{ParseOnly: true})
	assert.True(t, p.Warm, "cached: %v", p.Resident)
	evict(t, path)
	p = plan(LoadOptions{ParseOnly: true})
	assert.False(t, p.Warm, "evicted, the parse's own reads not counted: %v", p.Resident)
	assert.Less(t, p.Resident, transfer.ResidentShare)

	small, _ := saved(t, sampleRecords()[:5])
	evict(t, small)
	l, err := Load(small, LoadOptions{})
	require.NoError(t, err)
	assert.False(t, l.Plan.Whole, "sample is under WholeMin")
	assert.Contains(t, l.Plan.Reason, "smaller than")
	require.NoError(t, l.Close())

	_, err = Load(path+".missing", LoadOptions{})
	require.ErrorIs(t, err, os.ErrNotExist)

	// The same file without our end-record comment (another zip writer's):
	// record by record, whatever the page cache holds, and it still loads.
	other := filepath.Join(t.TempDir(), "other.pt")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	copy(b[len(b)-cdCommentLen:], strings.Repeat("x", len(cdCommentPrefix)))
	require.NoError(t, os.WriteFile(other, b, 0o644))
	evict(t, other)
	l, err = Load(other, LoadOptions{})
	require.NoError(t, err)
	assert.False(t, l.Plan.Whole)
	assert.Contains(t, l.Plan.Reason, "not written by pyfastensor")
	require.NoError(t, l.Close())

	evict(t, path)
	p = plan(LoadOptions{})
	if !transfer.Probe(filepath.Dir(path)).Direct {
		assert.False(t, p.Whole)
		assert.Contains(t, p.Reason, "O_DIRECT")
		t.Skip("no O_DIRECT in the temporary directory: the whole-file decision cannot be taken here")
	}
	assert.True(t, p.Whole, p.Reason)
	assert.Equal(t, int64(transfer.WholeRequest), p.Request)
}

// A record-by-record load puts large records in aligned memory, cold or
// cached, and the rest in the allocator's; the residency is kept for the
// engines.
func TestPlanMemory(t *testing.T) {
	path, _ := savedSample(t)
	for _, res := range []float64{0, 1} {
		a, err := OpenArchive(path)
		require.NoError(t, err)
		require.NoError(t, a.planMemory(res))
		for i, e := range a.Entries {
			want := MemoryAllocator
			if e.Size >= transfer.AlignedMin {
				want = MemoryAligned
			}
			assert.Equal(t, want, e.Memory, e.Name)
			assert.Equal(t, res, a.resident[i])
		}
		require.NoError(t, a.Close())
	}
}

// Neither known cold nor known cached (unknown: -1, or between), the
// residency is measured per record: 0 for a file just dropped from the
// page cache, 1 once read through it.
func TestPlanMemoryMeasuresTheResidency(t *testing.T) {
	path, _ := saved(t, bigRecords())
	a, err := OpenArchive(path)
	require.NoError(t, err)
	defer a.Close()
	evict(t, path)
	if r, err := gds.Resident(path, []int64{0}, []int64{a.Size}); err != nil || r[0] > 0.5 {
		t.Skipf("this filesystem keeps its pages (tmpfs) or cannot tell (%v)", err)
	}
	for _, c := range []struct {
		fileResident, want float64
	}{{-1, 0}, {0.5, 1}} {
		if c.want == 1 {
			cache(t, path)
		}
		require.NoError(t, a.planMemory(c.fileResident))
		big := 0
		for i, e := range a.Entries {
			if e.Size >= transfer.AlignedMin {
				big++
				assert.Equal(t, c.want, a.resident[i], e.Name)
			}
		}
		require.Equal(t, 20, big)
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
