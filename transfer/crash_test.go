package transfer

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
)

// crashes is the number of simulated power losses per model.
const crashes = 1000

// One write replacing an old file, crashed at a random step of the commit
// protocol, comes back as the old file or the new one, never anything else
// under the target's name; a durable write that returned comes back new.
// "Strict": only what was synced survives (data and names). "Journaled":
// names created or renamed since the directory's last fsync survive as an
// in-order prefix (a journaling filesystem commits metadata in order),
// while unsynced data is still dropped.
func TestCrashLeavesTheOldOrTheNewFile(t *testing.T) {
	root := t.TempDir()
	rng := rand.New(rand.NewPCG(11, 12))
	models := []struct {
		name    string
		durable bool
		prefix  bool
	}{
		{"durable/strict", true, false},
		{"durable/journaled", true, true},
		{"not-durable/strict", false, false},
	}
	for _, m := range models {
		t.Run(m.name, func(t *testing.T) {
			counts := map[string]int{}
			steps := 0
			for i := range crashes {
				dir := filepath.Join(root, fmt.Sprintf("%s-%d", filepath.Base(m.name), i))
				require.NoError(t, os.MkdirAll(dir, 0o755))
				target := filepath.Join(dir, "ck.pt")
				old := testutil.Pattern(1+rng.IntN(9000), rng.Uint64())
				require.NoError(t, os.WriteFile(target, old, 0o644))
				newer := testutil.Pattern(1+rng.IntN(70000), rng.Uint64())
				if steps == 0 { // learn the protocol's step count from one uncrashed write
					c := NewCrashFS(OS, -1)
					_, _, err := WriteFile(filepath.Join(dir, "probe"), int64(len(newer)), []Extent{{Data: newer}}, m.durable, c, Options{Chooser: Fixed("posix")})
					require.NoError(t, err)
					steps = c.Steps()
				}
				crashAt := rng.IntN(steps + 1) // steps: no crash at all
				c := NewCrashFS(OS, crashAt)
				require.NoError(t, c.Adopt(target))
				if m.prefix {
					c.KeepPrefix = func(n int) int { return rng.IntN(n + 1) }
				}
				engine := Fixed("posix")
				if i%4 == 0 {
					engine = "direct"
				}
				_, _, err := WriteFile(target, int64(len(newer)), []Extent{{Data: newer}}, m.durable, c, Options{Chooser: engine})
				if crashAt < steps {
					require.ErrorIs(t, err, ErrCrashed, "crash at step %d of %d", crashAt, steps)
				} else {
					require.NoError(t, err)
				}
				clone := filepath.Join(dir, "after-crash")
				require.NoError(t, os.Mkdir(clone, 0o755))
				require.NoError(t, c.CloneTo(clone))
				got, err := os.ReadFile(filepath.Join(clone, "ck.pt"))
				require.NoError(t, err, "the target's name must survive every crash (step %d of %d)", crashAt, steps)
				switch {
				case bytes.Equal(got, old):
					counts["old"]++
					if m.durable && crashAt == steps {
						t.Fatalf("a durable write that returned came back old")
					}
				case bytes.Equal(got, newer):
					counts["new"]++
				default:
					t.Fatalf("torn file under the target's name after a crash at step %d of %d (%d bytes; old %d, new %d)",
						crashAt, steps, len(got), len(old), len(newer))
				}
				require.NoError(t, os.RemoveAll(dir))
			}
			t.Logf("%d crashes over %d steps: %v", crashes, steps, counts)
			assert.Positive(t, counts["old"])
			if m.durable {
				assert.Positive(t, counts["new"])
			}
		})
	}
}

// Each failed step leaves the target as it was and no temporary file: a
// full disk at the reservation, a read-only directory at creation, a
// failing fsync or rename.
func TestInjectedCommitFaults(t *testing.T) {
	for _, tc := range []struct {
		op    FSOp
		errno syscall.Errno
		is    error
		says  string
	}{
		{FSCreate, syscall.EROFS, os.ErrPermission, "cannot create a temporary file"},
		{FSCreate, syscall.EACCES, os.ErrPermission, "cannot create a temporary file"},
		{FSReserve, syscall.ENOSPC, gds.ErrNoSpace, "cannot reserve"},
		{FSSync, syscall.EIO, syscall.EIO, "input/output error"},
		{FSRename, syscall.EXDEV, syscall.EXDEV, "rename"},
		{FSSyncDir, syscall.EIO, syscall.EIO, "syncdir"},
	} {
		t.Run(fmt.Sprintf("%s-%v", tc.op, tc.errno), func(t *testing.T) {
			dir := t.TempDir()
			target := filepath.Join(dir, "ck.pt")
			require.NoError(t, os.WriteFile(target, []byte("old"), 0o644))
			fs := &FaultFS{Base: OS, Fail: func(op FSOp, path string, n int64) error {
				if op == tc.op {
					return tc.errno
				}
				return nil
			}}
			_, _, err := WriteFile(target, 5, []Extent{{Data: []byte("newer")}}, true, fs, Options{Chooser: Fixed("posix")})
			require.ErrorIs(t, err, tc.is)
			assert.Contains(t, err.Error(), tc.says)
			got, _ := os.ReadFile(target)
			if tc.op != FSSyncDir { // the rename happened: the new file is in place, its durability unknown
				assert.Equal(t, "old", string(got))
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				assert.False(t, IsTempName(e.Name()), "temporary file %s left behind", e.Name())
			}
		})
	}
}
