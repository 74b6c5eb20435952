package checkpoint

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/pyfastensor/pyfastensor/transfer"
)

// Saves and loads pick engines by name, so an engine registered with
// gds.RegisterFault reaches their failure paths on any filesystem.

// faultyEngine registers posix wrapped with inj under a name of the
// test's own and returns the name.
func faultyEngine(t *testing.T, inj gds.Injector) string {
	t.Helper()
	name := "faulty-" + t.Name()
	unregister, err := gds.RegisterFault(name, "posix", inj)
	require.NoError(t, err)
	t.Cleanup(unregister)
	return name
}

func TestSaveFailsWithInjectedNoSpaceAndLeavesTheTargetAlone(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ck.pt")
	require.NoError(t, os.WriteFile(path, []byte("the previous checkpoint"), 0o644))
	// Large records go through the chooser's engine; their write fails
	// half done, as on a full disk.
	engine := faultyEngine(t, gds.Only(gds.OpWrite).WithError(unix.ENOSPC).Partial())
	recs := []Record{
		{Name: "archive/data.pkl", Data: []byte("pickle bytes")},
		{Name: "archive/data/0", Data: testutil.Pattern(transfer.ExtentMin+5, 1), Align: DataAlign},
	}
	_, err := Save(path, recs, WriteOptions{Chooser: transfer.Fixed(engine)})
	require.Error(t, err)
	assert.True(t, gds.IsNoSpace(err), "%v", err)
	assert.ErrorIs(t, err, gds.ErrInjected)
	assert.Contains(t, err.Error(), "partial write")

	got, rerr := os.ReadFile(path)
	require.NoError(t, rerr)
	assert.Equal(t, "the previous checkpoint", string(got), "the target is untouched")
	ents, rerr := os.ReadDir(dir)
	require.NoError(t, rerr)
	assert.Len(t, ents, 1, "the temporary file is removed")
}

func TestReadFailsWithInjectedErrorNamingTheRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ck.pt")
	data := testutil.Pattern(transfer.ExtentMin+5, 2)
	_, err := Save(path, []Record{{Name: "archive/data/0", Data: data, Align: DataAlign}}, WriteOptions{NotDurable: true})
	require.NoError(t, err)
	a, err := OpenArchive(path)
	require.NoError(t, err)
	defer a.Close()

	engine := faultyEngine(t, gds.OnNth(1, gds.OpRead).WithError(unix.EIO))
	dst := make([]byte, len(data))
	_, err = a.Read([]ReadRequest{{Index: 0, Dst: dst}}, ReadOptions{Chooser: transfer.Fixed(engine)})
	require.ErrorIs(t, err, unix.EIO)
	assert.ErrorIs(t, err, gds.ErrInjected)
	assert.Contains(t, err.Error(), `"archive/data/0"`)

	_, err = a.Read([]ReadRequest{{Index: 0, Dst: dst}}, ReadOptions{Chooser: transfer.Fixed(engine)})
	require.NoError(t, err, "only the first read was failed")
	assert.Equal(t, data, dst)
}
