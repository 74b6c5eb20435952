package checkpoint

import (
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
)

// ErrCorrupt is wrapped by every error that means a checkpoint file failed
// a check: a CRC-32 mismatch, a malformed or inconsistent zip structure, a
// truncated file. Test with errors.Is.
var ErrCorrupt = gds.Named(gds.ErrCorrupt, "corrupt checkpoint")

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
