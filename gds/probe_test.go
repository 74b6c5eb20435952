package gds

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pyfastensor/pyfastensor/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProbeDirOnTempDir(t *testing.T) {
	dir := t.TempDir()
	info := ProbeDir(dir)
	assert.NotEmpty(t, info.FSType)
	if info.Direct {
		assert.Positive(t, info.OffsetAlign)
		assert.Contains(t, []string{"statx", "probe"}, info.AlignSource)
	} else {
		assert.NotEmpty(t, info.DirectReason)
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "the probe leaves no file behind")
}

func TestProbeDirWithoutODirect(t *testing.T) {
	dir := testutil.MountFS(t, "ramfs", 0, "") // ramfs refuses O_DIRECT
	info := ProbeDir(dir)
	assert.Equal(t, "0x858458f6", info.FSType)
	assert.False(t, info.Direct)
	assert.Contains(t, info.DirectReason, "does not support O_DIRECT")
}

func TestProbeDirUnwritable(t *testing.T) {
	info := ProbeDir(filepath.Join(t.TempDir(), "missing"))
	assert.False(t, info.Direct)
	assert.NotEmpty(t, info.DirectReason)
}
