// Package testutil holds the helpers the Go tests of several packages
// share: deterministic test bytes, a scratch filesystem and the fake
// libcufile. Only tests
// import it.
package testutil

import (
	"encoding/binary"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// Pattern returns n pseudo-random bytes, the same for the same seed:
// bytes that differ at every position of interest, so a misplaced or
// missing piece shows in a comparison.
func Pattern(n int, seed uint64) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	p := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(p)
	return p
}

// MountFS mounts a fresh filesystem of fstype (with mount flags and mount
// data opts) on a temporary directory for the test, unmounted when the
// test ends, or skips the test with the reason when this process may not
// mount.
func MountFS(t testing.TB, fstype string, flags uintptr, opts string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(fstype, dir, fstype, flags, opts); err != nil {
		t.Skipf("cannot mount %s here (needs root and mount rights): %v", fstype, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// BuildFakeCuFile compiles the fake libcufile and the fake libcuda of
// gds/testdata/fakecufile into a directory of the test's own and returns
// their paths (a fresh copy per test: its own counters). It skips the test
// when gcc is missing. The caller points gds at them
// (gds.SetCuFileDriverLibrary, PYFASTENSOR_CUFILE_LIB).
func BuildFakeCuFile(t testing.TB) (libcufile, libcuda string) {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skipf("gcc not found, cannot build the fake libcufile: %v", err)
	}
	_, here, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(here), "..", "..", "gds", "testdata", "fakecufile")
	dir := t.TempDir()
	libcufile, libcuda = filepath.Join(dir, "libcufile.so.0"), filepath.Join(dir, "libcuda.so.1")
	for in, out := range map[string]string{"fakecufile.c": libcufile, "fakecuda.c": libcuda} {
		if msg, err := exec.Command(gcc, "-shared", "-fPIC", "-o", out, filepath.Join(src, in)).CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v: %s", in, err, msg)
		}
	}
	return libcufile, libcuda
}
