package hooks

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// TestSpillFallsBackFromCuFile: a spill store asked to use cufile where
// libcufile's driver opens but registration fails (pip's libcufile on a GPU
// machine without GPUDirect Storage, as the fake plays it) opens, and
// stores and returns every byte through a CPU engine, saying why.
func TestSpillFallsBackFromCuFile(t *testing.T) {
	lib, cuda := testutil.BuildFakeCuFile(t)
	t.Cleanup(gds.SetCuFileDriverLibrary(cuda))
	t.Setenv("PYFASTENSOR_CUFILE_LIB", lib)
	t.Setenv("FAKECUFILE_DRIVER_OPEN", "noinit")
	for _, picker := range []Picker{FixedPicker{transfer.Fixed("cufile")}, listing{"posix", "cufile"}} {
		s, err := Open(Config{Dir: t.TempDir(), Picker: picker, Workers: 2})
		require.NoError(t, err)
		want := testutil.Pattern(1<<20+17, 5)
		id, err := s.Put(want)
		require.NoError(t, err)
		require.NoError(t, s.Wait(id))
		got := make([]byte, len(want))
		require.NoError(t, s.Get(id, got))
		require.Equal(t, want, got)
		d := s.Describe()
		assert.Contains(t, d.Fallback, "cuFile failed")
		assert.Contains(t, d.Fallback, "CU_FILE_HANDLE_NOT_REGISTERED (5027)")
		st := s.Stats()
		assert.Equal(t, d.Fallback, st.Fallback)
		assert.Zero(t, st.EngineBytes["cufile"], "no byte through cuFile")
		assert.Equal(t, int64(len(want)), st.EngineBytes["posix"]+st.EngineBytes["direct"])
		require.NoError(t, s.Close())
	}
}

// listing picks cufile for every transfer and lists the engines given, as
// a dictionary whose candidates include cufile does.
type listing []string

func (l listing) Engine(transfer.Op, int64) string                  { return "cufile" }
func (l listing) Observe(transfer.Op, int64, string, time.Duration) {}
func (l listing) Engines() []string                                 { return l }
