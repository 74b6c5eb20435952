package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pyfastensor/pyfastensor/gds"
	"github.com/stretchr/testify/assert"
)

// An operating-system error without a status of its own crosses the
// boundary with its errno (Python raises an OSError carrying it); the
// named ones keep theirs, and an error without an errno is stError.
func TestStatusOfCarriesOtherErrnos(t *testing.T) {
	_, err := os.Create(filepath.Join(t.TempDir(), strings.Repeat("x", 300)))
	assert.Equal(t, stErrno+int(syscall.ENAMETOOLONG), int(statusOf(err)))
	_, err = os.Create(t.TempDir())
	assert.Equal(t, stErrno+int(syscall.EISDIR), int(statusOf(err)))
	eio := &gds.OpError{Engine: "direct", Op: "write", Path: "/ckpt.pt", Offset: 4096, Err: gds.Classify(syscall.EIO)}
	assert.Equal(t, stErrno+int(syscall.EIO), int(statusOf(eio)))

	assert.Equal(t, stNoSpace, int(statusOf(gds.Classify(syscall.ENOSPC))))
	assert.Equal(t, stPermission, int(statusOf(gds.Classify(syscall.EROFS))))
	assert.Equal(t, stNotFound, int(statusOf(&os.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT})))
	assert.Equal(t, stInvalid, int(statusOf(gds.ErrInvalid)))
	assert.Equal(t, stError, int(statusOf(errors.New("no errno"))))
}
