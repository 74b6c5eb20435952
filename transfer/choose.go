package transfer

import (
	"time"
)

// Engine choice: the one place that says which engine moves an extent.
// Fastensor's three modes are three Choosers: Fixed ("specific tool"), the
// adaptive dictionaries of transfer/dict ("specific dictionary" and "aware
// dictionary", DictChooser), and Default, the threshold chooser a probe of
// the directory sets up when the caller names nothing.

// Op is the direction of a transfer.
type Op int

// Transfer directions.
const (
	OpWrite Op = iota // memory to file
	OpRead            // file to memory
)

func (o Op) String() string {
	if o == OpRead {
		return "read"
	}
	return "write"
}

// Chooser picks the engine for each transfer and learns from the time it
// took. Consumers (checkpoint records, raw files, the offload spill file)
// ask Engine before a transfer and report with Observe after it.
//
// Implementations are safe for concurrent use: Observe is called from the
// goroutines that move extents.
type Chooser interface {
	// Engine names the engine for a transfer of size bytes in direction op.
	Engine(op Op, size int64) string
	// Observe reports that a transfer of size bytes took d with engine.
	Observe(op Op, size int64, engine string, d time.Duration)
}

// ResidentChooser is a Chooser that, on reads, takes into account how much
// of the extent the page cache holds (0 to 1, measured once per transfer).
type ResidentChooser interface {
	Chooser
	ReadEngine(size int64, resident float64) string
}

// Fixed uses one engine for every size: the paper's "specific tool" mode.
type Fixed string

var _ Chooser = Fixed("")

// Engine implements Chooser.
func (c Fixed) Engine(Op, int64) string { return string(c) }

// Observe implements Chooser; a fixed choice does not learn.
func (c Fixed) Observe(Op, int64, string, time.Duration) {}

// Threshold uses the direct engine for extents of at least Min bytes when
// Direct is set, and posix for everything else. On reads it also looks at
// the page cache: an extent at least ResidentShare resident is read
// through it whatever its size. It ignores observations.
type Threshold struct {
	Direct bool
	Min    int64
}

var _ ResidentChooser = (*Threshold)(nil)

// Engine implements Chooser.
func (c *Threshold) Engine(op Op, size int64) string {
	if c.Direct && size >= c.Min {
		return "direct"
	}
	return "posix"
}

// ReadEngine implements ResidentChooser: posix for an extent mostly in the
// page cache (a memory copy away, which O_DIRECT would skip for the
// device), else Engine's choice.
func (c *Threshold) ReadEngine(size int64, resident float64) string {
	if resident >= ResidentShare {
		return "posix"
	}
	return c.Engine(OpRead, size)
}

// Observe implements Chooser; a threshold does not learn.
func (c *Threshold) Observe(Op, int64, string, time.Duration) {}

// Default returns the chooser for files in dir when the caller names none:
// extents of DirectThreshold and up direct when the directory's probe
// (Probe, once per directory per process) says O_DIRECT works there,
// everything else posix; on reads, an extent the page cache mostly holds
// goes through it whatever its size.
func Default(dir string) Chooser {
	return &Threshold{Direct: Probe(dir).Direct, Min: DirectThreshold}
}

// DefaultFor is Default for the directory of the file at path (see DirOf).
func DefaultFor(path string) (Chooser, error) {
	dir, err := DirOf(path)
	if err != nil {
		return nil, err
	}
	return Default(dir), nil
}

// ReadEngines returns the engine of each read extent: the chooser's
// ReadEngine with the extent's residency when it is a ResidentChooser and
// resident is given (one share per extent, measured once by the caller),
// else its Engine.
func ReadEngines(c Chooser, sizes []int64, resident []float64) []string {
	out := make([]string, len(sizes))
	rc, _ := c.(ResidentChooser)
	for i, n := range sizes {
		if rc != nil && resident != nil {
			out[i] = rc.ReadEngine(n, resident[i])
		} else {
			out[i] = c.Engine(OpRead, n)
		}
	}
	return out
}

// ReadWorkers is the number of reads in flight for reads through engines:
// CachedReadWorkers when all are posix, DirectReadWorkers when any is not.
func ReadWorkers(engines []string) int {
	for _, e := range engines {
		if e != "posix" {
			return DirectReadWorkers
		}
	}
	return CachedReadWorkers()
}
