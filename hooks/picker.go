package hooks

import (
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Op is the direction of a transfer: gds's, shared with the adaptive
// dictionaries.
type Op = gds.Op

// Transfer directions.
const (
	OpWrite = gds.OpWrite // memory to spill file (offload)
	OpRead  = gds.OpRead  // spill file to memory (prefetch or get)
)

// Picker chooses the engine that moves one transfer of the spill file: a
// gds.Chooser (the write+read dictionary's view, gds.DictChooser, fits)
// that also lists the engines it may name.
//
// The store opens one file per engine Engines names, all on the same
// (unlinked) inode, and asks Engine before every transfer.
//
// Concurrency: Engine and Observe are called from many goroutines at once.
type Picker interface {
	gds.Chooser
	// Engines lists every engine Engine may return; the first is the
	// fallback when a name is unknown.
	Engines() []string
}

// FixedPicker always picks one engine ("specific tool" mode).
type FixedPicker string

var (
	_ Picker = FixedPicker("")
	_ Picker = (*gds.DictChooser)(nil) // the dictionaries plug in as they are
)

// Engines implements Picker.
func (p FixedPicker) Engines() []string { return []string{string(p)} }

// Engine implements Picker.
func (p FixedPicker) Engine(Op, int64) string { return string(p) }

// Observe implements Picker.
func (p FixedPicker) Observe(Op, int64, string, time.Duration) {}
