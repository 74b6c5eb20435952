package hooks

import (
	"github.com/pyfastensor/pyfastensor/transfer"
	"github.com/pyfastensor/pyfastensor/transfer/dict"
)

// Op is the direction of a transfer (transfer.Op).
type Op = transfer.Op

// Transfer directions.
const (
	OpWrite = transfer.OpWrite // memory to spill file (offload)
	OpRead  = transfer.OpRead  // spill file to memory (prefetch or get)
)

// Picker chooses the engine that moves one transfer of the spill file: a
// transfer.Chooser (the write+read dictionary's view, dict.DictChooser,
// fits) that also lists the engines it may name.
//
// The store opens one file per engine Engines names, all on the same
// (unlinked) inode, and asks Engine before every transfer.
//
// Concurrency: Engine and Observe are called from many goroutines at once.
type Picker interface {
	transfer.Chooser
	// Engines lists every engine Engine may return; the first is the
	// fallback when a name is unknown.
	Engines() []string
}

// FixedPicker always picks one engine ("specific tool" mode): transfer.Fixed,
// listing that engine.
type FixedPicker struct{ transfer.Fixed }

var (
	_ Picker = FixedPicker{}
	_ Picker = (*dict.DictChooser)(nil) // the dictionaries plug in as they are
	_ Picker = defaultPicker{}
)

// Engines implements Picker.
func (p FixedPicker) Engines() []string { return []string{string(p.Fixed)} }

// defaultPicker is transfer.Default for the spill directory (the one
// "direct where the probe says O_DIRECT works" decision, with its size
// threshold), listing the engines it may name.
type defaultPicker struct{ transfer.Chooser }

func newDefaultPicker(dir string) defaultPicker { return defaultPicker{transfer.Default(dir)} }

// Engines implements Picker.
func (p defaultPicker) Engines() []string {
	if p.Engine(transfer.OpWrite, 1<<62) == "direct" {
		return []string{"posix", "direct"}
	}
	return []string{"posix"}
}
