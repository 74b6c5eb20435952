// Package testutil holds the helpers the Go tests of several packages
// share: deterministic test bytes and a scratch filesystem. Only tests
// import it.
package testutil

import (
	"encoding/binary"
	"math/rand/v2"
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
