package hooks

import "time"

// Op is the direction of a transfer, for engine pickers.
type Op int

// Transfer directions.
const (
	OpWrite Op = iota // memory to spill file (offload)
	OpRead            // spill file to memory (prefetch or get)
)

func (o Op) String() string {
	if o == OpWrite {
		return "write"
	}
	return "read"
}

// Picker chooses the engine that moves one transfer of the spill file.
//
// The store opens one file per engine Engines names, all on the same
// (unlinked) inode, and asks Pick before every transfer. An adaptive picker
// (the write, read or write+read dictionary) learns from Observe.
//
// Concurrency: Pick and Observe are called from many goroutines at once.
type Picker interface {
	// Engines lists every engine Pick may return; the first is the
	// fallback when a name is unknown.
	Engines() []string
	// Pick names the engine for a transfer of n bytes in direction op.
	Pick(op Op, n int64) string
	// Observe reports how long a transfer took on an engine.
	Observe(op Op, n int64, engine string, d time.Duration)
}

// FixedPicker always picks one engine ("specific tool" mode).
type FixedPicker string

var _ Picker = FixedPicker("")

// Engines implements Picker.
func (p FixedPicker) Engines() []string { return []string{string(p)} }

// Pick implements Picker.
func (p FixedPicker) Pick(Op, int64) string { return string(p) }

// Observe implements Picker.
func (p FixedPicker) Observe(Op, int64, string, time.Duration) {}
