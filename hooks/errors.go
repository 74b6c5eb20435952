package hooks

import (
	"errors"
	"fmt"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Named errors of the store. ErrUnknownSlot wraps gds.ErrInvalid so the C
// boundary maps it to an invalid-argument status; write failures keep the
// engine's error (gds.ErrNoSpace for a full disk) so errors.Is still works.
var (
	// ErrUnknownSlot: a slot id that was never issued or was already freed.
	ErrUnknownSlot = fmt.Errorf("%w: unknown or freed slot", gds.ErrInvalid)
	// ErrClosed: the store was closed.
	ErrClosed = fmt.Errorf("%w: store closed", gds.ErrClosed)
	// ErrSpillDir: the spill directory cannot hold the spill file. The
	// message names the directory; the cause (permission, missing,
	// read-only) is wrapped too.
	ErrSpillDir = errors.New("spill directory unusable")
	// ErrInternal: a transfer panicked on a pool goroutine; the slot's
	// write or prefetch failed with this error instead of crashing.
	ErrInternal = gds.ErrInternal
)

// spillDirError explains why dir cannot hold a spill file.
func spillDirError(dir string, cause error) error {
	return fmt.Errorf("%w: cannot create the spill file in %q (set spill_dir to a writable directory on a local disk): %w",
		ErrSpillDir, dir, gds.Classify(cause))
}

// IsNoSpace reports whether err means the spill filesystem is full.
func IsNoSpace(err error) bool { return gds.IsNoSpace(err) }
