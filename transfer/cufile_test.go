package transfer

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
)

// fakeCuFile points the cufile engine at a fresh fake libcufile, with the
// fake's environment variable env set to value ("" for none).
func fakeCuFile(t *testing.T, env, value string) string {
	t.Helper()
	lib, cuda := testutil.BuildFakeCuFile(t)
	t.Cleanup(gds.SetCuFileDriverLibrary(cuda))
	t.Setenv("PYFASTENSOR_CUFILE_LIB", lib)
	if env != "" {
		t.Setenv(env, value)
	}
	return lib
}

// TestHostMemoryFallsBackFromCuFile: each failure mode of the fake, for a
// write and a read of host memory that asked for cufile through a chooser:
// the bytes arrive, a CPU engine served them, and the reason names the
// failure.
func TestHostMemoryFallsBackFromCuFile(t *testing.T) {
	for _, tc := range []struct{ name, env, value, want string }{
		{"driver open prints an error and succeeds", "FAKECUFILE_DRIVER_OPEN", "noinit", "CU_FILE_HANDLE_NOT_REGISTERED (5027)"},
		{"registration fails", "FAKECUFILE_HANDLE_REGISTER", "5027", "CU_FILE_HANDLE_NOT_REGISTERED (5027)"},
		{"reads fail", "FAKECUFILE_READ", "5011", "cuFileRead of 65536 bytes from device memory failed"},
		{"writes fail", "FAKECUFILE_WRITE", "5044", "CU_FILE_IO_ERROR (5044)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakeCuFile(t, tc.env, tc.value)
			dir := t.TempDir()
			path := filepath.Join(dir, "f")
			want := testutil.Pattern(300001, 3)
			o := Options{Chooser: chooseAll("cufile")}
			_, st, err := WriteFile(path, int64(len(want)), []Extent{{Off: 0, Data: want}}, false, nil, o)
			require.NoError(t, err)
			assert.Contains(t, st.Fallback, "cuFile failed")
			assert.Contains(t, st.Fallback, tc.want)
			assert.Zero(t, st.Engines["cufile"], "no byte through cuFile")

			got := make([]byte, len(want))
			_, rst, err := Read(path, []Extent{{Off: 0, Data: got}}, o)
			require.NoError(t, err)
			require.Equal(t, want, got)
			assert.Contains(t, rst.Fallback, tc.want)

			p := Probe(dir)
			assert.True(t, p.CuFileDriver, "the library level passes")
			assert.False(t, p.CuFile)
			assert.Contains(t, p.CuFileReason, tc.want)
		})
	}
}

func TestHostMemoryFallsBackWhenATransferFails(t *testing.T) {
	// The probe passes; then cuFileWrite fails (the fake reads its
	// environment at each call): the transfer is redone through the CPU
	// engine, and the filesystem's verdict turns.
	lib := fakeCuFile(t, "", "")
	dir := t.TempDir()
	require.True(t, gds.ProbeCuFileDir(lib, dir).Available)
	t.Setenv("FAKECUFILE_WRITE", "5044")
	path := filepath.Join(dir, "f")
	want := testutil.Pattern(100000, 4)
	_, st, err := WriteFile(path, int64(len(want)), []Extent{{Off: 0, Data: want}}, false, nil, Options{Chooser: chooseAll("cufile")})
	require.NoError(t, err)
	assert.Contains(t, st.Fallback, "cuFileWrite: CU_FILE_IO_ERROR (5044)")
	disk, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, want, disk)
	v := gds.ProbeCuFileDir(lib, dir)
	assert.False(t, v.Available)
	assert.Equal(t, "failure", v.Source)

	// Named by the caller, cufile's memory may be device memory: no fallback.
	_, _, err = WriteFile(filepath.Join(dir, "g"), 10, []Extent{{Off: 0, Data: want[:10]}}, false, nil, Options{Chooser: Fixed("cufile")})
	require.ErrorIs(t, err, gds.ErrUnavailable)
	assert.Contains(t, err.Error(), "5044")
}

// chooseAll is a chooser (not Fixed) that names one engine for everything,
// as the adaptive dictionaries may.
type chooseAll string

func (c chooseAll) Engine(Op, int64) string                  { return string(c) }
func (c chooseAll) Observe(Op, int64, string, time.Duration) {}
