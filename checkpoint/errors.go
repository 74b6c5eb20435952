package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/pyfastensor/pyfastensor/gds"
)

// ErrCorrupt is wrapped by every error that means a checkpoint file failed
// a check: a CRC-32 mismatch, a malformed or inconsistent zip structure, a
// truncated file. Test with errors.Is.
var ErrCorrupt = errors.New("corrupt checkpoint")

// CorruptError says which file, which record and what check failed.
type CorruptError struct {
	Path   string // the file
	Record string // the record's name in the zip ("archive/data/3"), or "" when unknown
	Offset int64  // file offset where the problem was seen, or -1
	Reason string
}

func (e *CorruptError) Error() string {
	where := ""
	if e.Record != "" {
		where = fmt.Sprintf(" record %q", e.Record)
	}
	if e.Offset >= 0 {
		where += fmt.Sprintf(" at offset %d", e.Offset)
	}
	return fmt.Sprintf("checkpoint: %s is corrupt:%s: %s", e.Path, where, e.Reason)
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// corrupt builds a *CorruptError.
func corrupt(path, record string, off int64, format string, args ...any) error {
	return &CorruptError{Path: path, Record: record, Offset: off, Reason: fmt.Sprintf(format, args...)}
}

// readOnlyErr marks EROFS as a permission problem: a read-only mount makes
// a directory unwritable exactly as its mode bits would, and the caller
// should see a PermissionError either way. The message stays the cause's.
type readOnlyErr struct{ cause error }

func (e *readOnlyErr) Error() string   { return e.cause.Error() }
func (e *readOnlyErr) Unwrap() []error { return []error{fs.ErrPermission, e.cause} }

// noSpaceErr marks ENOSPC and EDQUOT met outside an engine (creating or
// reserving the temporary file) with gds.ErrNoSpace, as engines do.
type noSpaceErr struct{ cause error }

func (e *noSpaceErr) Error() string   { return e.cause.Error() }
func (e *noSpaceErr) Unwrap() []error { return []error{gds.ErrNoSpace, e.cause} }

// classify gives EROFS its permission meaning and ENOSPC/EDQUOT the named
// gds.ErrNoSpace; other errors pass unchanged.
func classify(err error) error {
	switch {
	case errors.Is(err, syscall.EROFS):
		return &readOnlyErr{err}
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &noSpaceErr{err}
	}
	return err
}
