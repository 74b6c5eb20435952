package gds

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The filesystem verdict of the cufile engine (cufile_fs.go), with the
// fake libcufile's failure modes: those seen on a GPU machine without
// GPUDirect Storage, and transfers that fail.

// fakeInMode builds a fake libcufile whose environment variable env is
// value, and probes its library.
func fakeInMode(t *testing.T, env, value string) string {
	t.Helper()
	probeKnobs(t, false, 10*time.Second)
	t.Setenv(env, value)
	lib := buildFake(t)
	st := ProbeCuFile(lib)
	require.True(t, st.Available, "the library level passes: %+v", st)
	return lib
}

// requireRefused checks that dir's verdict is unavailable, says each of
// want, and that the engine refuses a file there with the same reason.
func requireRefused(t *testing.T, lib, dir string, want ...string) CuFileFSStatus {
	t.Helper()
	v := ProbeCuFileDir(lib, dir)
	assert.False(t, v.Available)
	for _, w := range want {
		assert.Contains(t, v.Reason, w)
	}
	e, err := NewCuFile(Options{CuFileLibrary: lib})
	require.NoError(t, err, "the library level is available")
	path := filepath.Join(dir, "f")
	_, err = e.Open(path, os.O_RDWR|os.O_CREATE, 0o644)
	require.Error(t, err)
	assert.True(t, IsCuFileFailure(err), "%v", err)
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), v.Reason)
	assert.Contains(t, err.Error(), "cufile: open "+path)
	return v
}

func TestCuFileDriverOpenThatPrintsAnErrorAndSucceeds(t *testing.T) {
	// pip's libcufile on a GPU machine without GPUDirect Storage.
	lib := fakeInMode(t, "FAKECUFILE_DRIVER_OPEN", "noinit")
	v := requireRefused(t, lib, t.TempDir(), "cuFileHandleRegister failed: CU_FILE_HANDLE_NOT_REGISTERED (5027)",
		"GPUDirect Storage is not installed or not usable on this filesystem")
	assert.Equal(t, "probe", v.Source)
	assert.NotZero(t, v.Dev)
}

func TestCuFileRegistrationRefusedByTheProbe(t *testing.T) {
	lib := fakeInMode(t, "FAKECUFILE_HANDLE_REGISTER", "5027")
	requireRefused(t, lib, t.TempDir(), "CU_FILE_HANDLE_NOT_REGISTERED (5027)")
}

func TestCuFileReadRefusedByTheProbe(t *testing.T) {
	lib := fakeInMode(t, "FAKECUFILE_READ", "5011")
	requireRefused(t, lib, t.TempDir(), "cuFileRead of 65536 bytes from device memory failed", "CU_FILE_CUDA_DRIVER_ERROR (5011)")
}

func TestCuFileWriteRefusedByTheProbe(t *testing.T) {
	lib := fakeInMode(t, "FAKECUFILE_WRITE", "5044")
	requireRefused(t, lib, t.TempDir(), "cuFileWrite of 65536 bytes from device memory failed", "CU_FILE_IO_ERROR (5044)")
}

func TestCuFileProbeNeedsDeviceMemory(t *testing.T) {
	lib := fakeInMode(t, "FAKECUDA_MEMALLOC", "2")
	requireRefused(t, lib, t.TempDir(), "no device memory for the cuFile probe: cuMemAlloc failed with CUresult 2")
}

func TestCuFileProbeOncePerFilesystem(t *testing.T) {
	lib := fakeInMode(t, "FAKECUFILE_DRIVER_OPEN", "")
	l, _ := probeCuFile(lib)
	fake := &fakeLib{t: t, path: lib, shim: l.shim}
	fake.reset()
	a, b := t.TempDir(), t.TempDir()
	va := ProbeCuFileDir(lib, a)
	require.True(t, va.Available, "%+v", va)
	assert.Equal(t, "probe", va.Source)
	assert.Equal(t, int64(1), fake.calls(fakeHandleRegister))
	assert.Equal(t, int64(1), fake.calls(fakeWrite))
	assert.Equal(t, int64(1), fake.calls(fakeRead))
	assert.Equal(t, int64(0), fake.handles(), "the probe's handle is deregistered")
	entries, err := os.ReadDir(a)
	require.NoError(t, err)
	assert.Empty(t, entries, "the probe file is removed")

	assert.Equal(t, va, ProbeCuFileDir(lib, b), "the same filesystem: the cached verdict")
	assert.Equal(t, int64(1), fake.calls(fakeHandleRegister))

	// Another filesystem gets its own probe.
	ProbeCuFileDir(lib, testutil.MountFS(t, "tmpfs", 0, "size=1m"))
	assert.Equal(t, int64(2), fake.calls(fakeHandleRegister))
}

func TestCuFileFailureTurnsTheVerdict(t *testing.T) {
	// The probe passed; a later registration fails: the filesystem's
	// verdict becomes "unavailable" with that failure, for every file.
	e, fake := fakeEngine(t, Options{})
	dir := t.TempDir()
	fake.failNext(fakeHandleRegister, 5027, 0)
	_, err := e.Open(filepath.Join(dir, "a"), os.O_RDWR|os.O_CREATE, 0o644)
	require.Error(t, err)
	assert.True(t, IsCuFileFailure(err))
	v := ProbeCuFileDir(fake.path, dir)
	assert.False(t, v.Available)
	assert.Equal(t, "failure", v.Source)
	assert.Contains(t, v.Reason, "cuFileHandleRegister: CU_FILE_HANDLE_NOT_REGISTERED (5027)")
	_, err = e.Open(filepath.Join(dir, "b"), os.O_RDWR|os.O_CREATE, 0o644)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "5027")
	assert.Equal(t, int64(1), fake.calls(fakeHandleRegister), "no registration tried after the failure")
}

func TestCuFileTransferFailureTurnsTheVerdict(t *testing.T) {
	e, fake := fakeEngine(t, Options{})
	dir := t.TempDir()
	f, err := e.Open(filepath.Join(dir, "a"), os.O_RDWR|os.O_CREATE, 0o644)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt(testutil.Pattern(100, 1), 0)
	require.NoError(t, err)
	fake.failNext(fakeRead, 5011, 0)
	_, err = f.ReadAt(make([]byte, 10), 0)
	require.Error(t, err)
	assert.True(t, IsCuFileFailure(err))
	v := ProbeCuFileDir(fake.path, dir)
	assert.False(t, v.Available)
	assert.Equal(t, "failure", v.Source)
	assert.Contains(t, v.Reason, "cuFileRead: CU_FILE_CUDA_DRIVER_ERROR (5011)")

	// A full disk is not cuFile failing: it says nothing of the verdict.
	assert.False(t, IsCuFileFailure(opErr("cufile", "write", "f", 0, 1, 0, ErrNoSpace)))
}
