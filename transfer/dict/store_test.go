package dict

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pyfastensor/pyfastensor/transfer"
)

// A save commits the file through transfer's commit protocol and the FS it
// is given: crashed at each of its steps (transfer.CrashFS: only what was
// synced survives), the file comes back as the dictionaries saved before
// or as the ones being saved, never torn, and a save that returned comes
// back new.
func TestSaveCrashLeavesTheOldOrTheNewFile(t *testing.T) {
	f := fakeTimes{
		OpWrite: {"posix": time.Millisecond, "direct": 2 * time.Millisecond, "uring": 3 * time.Millisecond},
		OpRead:  {"posix": 3 * time.Millisecond, "direct": time.Millisecond, "uring": 2 * time.Millisecond, "mmap": 4 * time.Millisecond},
	}
	root := t.TempDir()
	// saveOld writes the dictionaries a crashed save is to replace, through the real filesystem.
	saveOld := func(path string) DictFile {
		d := newDicts(t, DictConfig{Path: path, SaveInterval: -1})
		f.run(d.Chooser(UseSeparate), OpWrite, 4096, 4)
		require.NoError(t, d.Close())
		return d.Snapshot()
	}
	// saveNew learns more and saves through fsys.
	saveNew := func(path string, fsys transfer.FS) (*Dictionaries, error) {
		d, err := OpenDictionaries(DictConfig{Path: path, Write: three, Read: append(three, "mmap"), SaveInterval: -1, FS: fsys})
		require.NoError(t, err)
		f.run(d.Chooser(UseSeparate), OpRead, 1<<20, 5)
		return d, d.Save()
	}
	probe := filepath.Join(root, "probe", "d.json")
	saveOld(probe)
	c := transfer.NewCrashFS(transfer.OS, -1)
	_, err := saveNew(probe, c)
	require.NoError(t, err)
	steps := c.Steps()
	require.Positive(t, steps, "the save went through the FS")

	counts := map[string]int{}
	for crashAt := 0; crashAt <= steps; crashAt++ { // steps: no crash at all
		dir := filepath.Join(root, fmt.Sprint(crashAt))
		path := filepath.Join(dir, "d.json")
		old := saveOld(path)
		c := transfer.NewCrashFS(transfer.OS, crashAt)
		require.NoError(t, c.Adopt(path))
		d, err := saveNew(path, c)
		if crashAt < steps {
			require.ErrorIs(t, err, transfer.ErrCrashed, "crash at step %d of %d", crashAt, steps)
		} else {
			require.NoError(t, err)
		}
		clone := filepath.Join(dir, "after-crash")
		require.NoError(t, os.Mkdir(clone, 0o755))
		require.NoError(t, c.CloneTo(clone))
		raw, err := os.ReadFile(filepath.Join(clone, "d.json"))
		require.NoError(t, err, "the file's name must survive every crash (step %d of %d)", crashAt, steps)
		var got DictFile
		require.NoError(t, json.Unmarshal(raw, &got), "torn file after a crash at step %d of %d", crashAt, steps)
		newer := d.Snapshot()
		got.Updated, old.Updated, newer.Updated = "", "", ""
		switch {
		case assert.ObjectsAreEqual(old, got):
			counts["old"]++
			require.Less(t, crashAt, steps, "a save that returned came back old")
		case assert.ObjectsAreEqual(newer, got):
			counts["new"]++
		default:
			t.Fatalf("after a crash at step %d of %d the file is neither the old dictionaries nor the new", crashAt, steps)
		}
	}
	t.Logf("%d crash points: %v", steps+1, counts)
	assert.Positive(t, counts["old"])
	assert.Positive(t, counts["new"])
}
