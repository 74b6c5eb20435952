package transfer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
)

// heldDeleted counts this process's descriptors on a deleted file once
// named target: the replaced files not yet freed.
func heldDeleted(t *testing.T, target string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && link == target+" (deleted)" {
			n++
		}
	}
	return n
}

// holdReleases makes the releaser's goroutine wait in its close until the
// returned function is called.
func holdReleases(t *testing.T) (let func()) {
	WaitReleased() // other tests' releases go first
	gate := make(chan struct{})
	setClose(func(fd int) error {
		<-gate
		return os.NewFile(uintptr(fd), "replaced").Close()
	})
	var once bool
	let = func() {
		if !once {
			once = true
			close(gate)
		}
	}
	t.Cleanup(func() {
		let()
		WaitReleased()
		setClose(nil)
	})
	return let
}

func setClose(f func(fd int) error) {
	releaser.Lock()
	releaser.close = f
	releaser.Unlock()
}

func TestCommitFreesTheReplacedFileAfterItReturns(t *testing.T) {
	let := holdReleases(t)
	target := filepath.Join(t.TempDir(), "ckpt")
	for i, durable := range []bool{true, true, false} {
		data := testutil.Pattern(1<<20, uint64(i+1))
		_, _, err := WriteFile(target, int64(len(data)), []Extent{{Data: data}}, durable, nil, Options{Chooser: Fixed("posix")})
		require.NoError(t, err)
		got, err := os.ReadFile(target)
		require.NoError(t, err)
		assert.Equal(t, data, got, "commit %d", i)
		// The first commit replaced nothing; each later one left the file it
		// replaced held, to be freed behind it.
		assert.Equal(t, i, heldDeleted(t, target), "commit %d", i)
	}
	let()
	WaitReleased()
	assert.Zero(t, heldDeleted(t, target), "replaced files still held after WaitReleased")
}

func TestAtMostReleaseQueueReplacedFilesWait(t *testing.T) {
	let := holdReleases(t)
	target := filepath.Join(t.TempDir(), "ckpt")
	for i := range 3 * releaseQueue {
		data := []byte(strings.Repeat("x", i+1))
		_, _, err := WriteFile(target, int64(len(data)), []Extent{{Data: data}}, false, nil, Options{Chooser: Fixed("posix")})
		require.NoError(t, err)
		assert.LessOrEqual(t, heldDeleted(t, target), releaseQueue, "commit %d", i)
	}
	assert.Equal(t, releaseQueue, heldDeleted(t, target))
	let()
	WaitReleased()
	assert.Zero(t, heldDeleted(t, target))
}

func TestAFailedRenameKeepsTheTargetAndHoldsNothing(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "ckpt")
	require.NoError(t, os.WriteFile(target, []byte("old"), 0o644))
	fs := &FaultFS{Base: OS, Fail: func(op FSOp, _ string, _ int64) error {
		if op == FSRename {
			return os.ErrPermission
		}
		return nil
	}}
	_, _, err := WriteFile(target, 5, []Extent{{Data: []byte("newer")}}, true, fs, Options{Chooser: Fixed("posix")})
	require.Error(t, err)
	WaitReleased()
	got, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, "old", string(got))
	assert.Zero(t, heldDeleted(t, target))
}
