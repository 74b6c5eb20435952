package loader

import (
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Named errors. Every error of the package wraps one of these (or an
// engine's error from gds, for I/O that failed), with the file, chunk,
// sample or offset it is about in the message; test with errors.Is.
var (
	// ErrCorrupt: a pack failed a check: an index that does not parse or
	// does not match its chunk files, a chunk file missing, short or
	// damaged (CRC-32), a sample whose bytes are not what the index says.
	// The error is a *CorruptError.
	ErrCorrupt = gds.Named(gds.ErrCorrupt, "corrupt pack")
	// ErrVersion: the index is of a format version newer than this build
	// reads. The error is a *VersionError naming both versions.
	ErrVersion = gds.Named(gds.ErrUnsupported, "pack format version not supported")
	// ErrInvalid: a bad argument (an empty spec, a label without a class,
	// a position outside the pack). It also wraps gds.ErrInvalid, which
	// the C boundary maps to a ValueError.
	ErrInvalid = fmt.Errorf("loader: %w", gds.ErrInvalid)
	// ErrNotOurs: a pack's output directory holds files that no pack
	// wrote (Pack refuses to write there, and removes nothing).
	ErrNotOurs = gds.Named(gds.ErrInvalid, "directory holds files that are not a pack's")
	// ErrBudget: the memory budget cannot hold one abstract chunk and one
	// chunk read in flight.
	ErrBudget = gds.Named(gds.ErrInvalid, "memory budget too small for the pack")
	// ErrNotPermutation: a request for a slot that has no undelivered
	// sample left this epoch: the epoch's requests are not a permutation
	// of the pack's positions.
	ErrNotPermutation = gds.Named(gds.ErrInvalid, "request cannot be served: the epoch's requests are not a permutation of the pack's positions")
	// ErrEpochDone: every sample of the epoch was delivered; SetEpoch
	// starts the next one.
	ErrEpochDone = gds.Named(gds.ErrInvalid, "epoch complete: every sample was delivered")
	// ErrNotOwned: a request maps to an abstract chunk another server owns
	// (loader/dist sends such requests to their owner).
	ErrNotOwned = gds.Named(gds.ErrInvalid, "abstract chunk not owned by this server")
	// ErrState: a saved state that does not fit this server (another
	// pack, another layout, inconsistent contents).
	ErrState = gds.Named(gds.ErrInvalid, "state does not fit this server")
	// ErrClosed: the server was closed.
	ErrClosed = fmt.Errorf("loader: server %w", gds.ErrClosed)
)

// CorruptError says which file of a pack, which chunk and sample, and what
// check failed. It wraps ErrCorrupt and, when there is one, the I/O error
// that revealed the damage (errors.Is sees fs.ErrNotExist, gds.ErrEOF).
type CorruptError struct {
	Path   string // the file: index.pfi or a chunk file
	Chunk  int    // the chunk's number, or -1
	Sample int    // the sample's position in the pack's index, or -1
	Offset int64  // the file offset of the problem, or -1
	Reason string
	Err    error // the cause, or nil
}

func (e *CorruptError) Error() string {
	where := ""
	if e.Sample >= 0 {
		where += fmt.Sprintf(" sample %d", e.Sample)
	}
	if e.Offset >= 0 {
		where += fmt.Sprintf(" at offset %d", e.Offset)
	}
	if where != "" {
		where = ":" + where
	}
	msg := fmt.Sprintf("loader: %s is corrupt%s: %s", e.Path, where, e.Reason)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns ErrCorrupt and the cause.
func (e *CorruptError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrCorrupt}
	}
	return []error{ErrCorrupt, e.Err}
}

// corrupt builds a *CorruptError about no particular chunk or sample.
func corrupt(path string, off int64, format string, args ...any) *CorruptError {
	return &CorruptError{Path: path, Chunk: -1, Sample: -1, Offset: off, Reason: fmt.Sprintf(format, args...)}
}

// VersionError is an index of a format version this build does not read.
type VersionError struct {
	Path      string
	Found     uint32 // the index's version
	Supported uint32 // the newest this build reads (FormatVersion)
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("loader: %s is pack format version %d; this build reads versions up to %d (upgrade pyfastensor to read it)",
		e.Path, e.Found, e.Supported)
}

// Unwrap returns ErrVersion.
func (e *VersionError) Unwrap() error { return ErrVersion }
