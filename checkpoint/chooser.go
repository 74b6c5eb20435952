package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/pyfastensor/pyfastensor/gds"
)

// Op is the direction of a transfer: gds's, shared with the adaptive
// dictionaries and the offload store.
type Op = gds.Op

// Transfer directions.
const (
	OpWrite = gds.OpWrite
	OpRead  = gds.OpRead
)

// Chooser picks the engine for each record's transfer and learns from the
// time it took: gds's interface, which the adaptive dictionaries
// (gds.DictChooser) implement; until they are wired in, ThresholdChooser
// serves. Implementations are safe for concurrent use: Observe is called
// from the goroutines that move records.
type Chooser = gds.Chooser

// DefaultDirectThreshold is the record size from which ThresholdChooser
// uses O_DIRECT. Below it the page cache's copy costs less than a direct
// transfer's fixed latency and its read-modify-write of edge blocks.
const DefaultDirectThreshold = 1 << 20

// ThresholdChooser uses the direct engine for records of at least Threshold
// bytes when Direct is set, and posix for everything else. On reads it also
// looks at the page cache (ResidentChooser): a record mostly resident is
// read through it whatever its size. It ignores observations.
type ThresholdChooser struct {
	Direct    bool
	Threshold int64
}

var _ ResidentChooser = (*ThresholdChooser)(nil)

// Engine implements Chooser.
func (c *ThresholdChooser) Engine(op Op, size int64) string {
	if c.Direct && size >= c.Threshold {
		return "direct"
	}
	return "posix"
}

// ReadEngine implements ResidentChooser: posix for a record at least half
// in the page cache (a memory copy away, which O_DIRECT would skip for the
// device), else Engine's choice.
func (c *ThresholdChooser) ReadEngine(size int64, resident float64) string {
	if resident >= 0.5 {
		return "posix"
	}
	return c.Engine(OpRead, size)
}

// Observe implements Chooser; a threshold does not learn.
func (c *ThresholdChooser) Observe(Op, int64, string, time.Duration) {}

// ResidentChooser is a Chooser that, on reads, takes into account how much
// of the record the page cache holds (0 to 1, from gds.Resident when the load
// starts).
type ResidentChooser interface {
	Chooser
	ReadEngine(size int64, resident float64) string
}

// readEngines returns the engine of each read (offset, size) of the file
// at path: the chooser's ReadEngine with each range's residency when it is
// a ResidentChooser and the residency can be read, else its Engine.
func readEngines(path string, c Chooser, offs, sizes []int64) []string {
	out := make([]string, len(sizes))
	rc, _ := c.(ResidentChooser)
	var res []float64
	if rc != nil {
		res, _ = gds.Resident(path, offs, sizes) // best effort: without it, Engine decides
	}
	for i, n := range sizes {
		if res != nil {
			out[i] = rc.ReadEngine(n, res[i])
		} else {
			out[i] = c.Engine(OpRead, n)
		}
	}
	return out
}

// readWorkers is the number of transfers in flight in a load whose reads
// go through engines: the CPUs when all are posix (the work is the
// kernel's copy and our CRC-32, bound by CPUs), DirectReadWorkers when any
// is direct (the goroutines mostly wait for the device, which needs many
// requests queued to reach its bandwidth).
func readWorkers(engines []string) int {
	for _, e := range engines {
		if e != "posix" {
			return DirectReadWorkers
		}
	}
	return defaultReadWorkers()
}

// DirectReadWorkers is the number of reads in flight in a load that reads
// direct.
const DirectReadWorkers = 16

// FixedChooser uses one engine for every size: the paper's "specific tool"
// mode.
type FixedChooser string

// Engine implements Chooser.
func (c FixedChooser) Engine(Op, int64) string { return string(c) }

// Observe implements Chooser.
func (c FixedChooser) Observe(Op, int64, string, time.Duration) {}

// shownName returns what errors call the file at path: for
// /proc/self/fd/N (a file pinned open, see Archive.source) the path that
// descriptor was opened by, else path.
func shownName(path string) string {
	if strings.HasPrefix(path, "/proc/self/fd/") {
		if target, err := os.Readlink(path); err == nil && filepath.IsAbs(target) {
			return strings.TrimSuffix(target, " (deleted)")
		}
	}
	return path
}

// dirOf returns the absolute directory of the file at path (shownName),
// whose O_DIRECT probe applies to it.
func dirOf(path string) (string, error) {
	abs, err := filepath.Abs(shownName(path))
	if err != nil {
		return "", err
	}
	return filepath.Dir(abs), nil
}

// directOK caches, per directory, whether the probe found O_DIRECT working.
var directOK sync.Map // dir -> bool

// DefaultChooser returns the chooser for files in dir: large records
// (DefaultDirectThreshold and up) direct when the probe says O_DIRECT works
// there (decided once per directory per process), everything else posix;
// on reads, a record the page cache mostly holds goes through it whatever
// its size (ThresholdChooser.ReadEngine).
//
// Measured on the development VM (virtio disk, fio limits 0.54-0.62 GB/s
// write and 2.1-2.4 GB/s read): a durable GPT-2-sized save reached 0.47
// GB/s direct against 0.35 through the page cache (which pays for
// writeback at fsync), and a cold load's reads 1.9 GB/s direct into
// page-aligned memory against 0.7 through the page cache.
func DefaultChooser(dir string) Chooser {
	ok, found := directOK.Load(dir)
	if !found {
		ok = gds.ProbeDir(dir).Direct
		directOK.Store(dir, ok)
	}
	return &ThresholdChooser{Direct: ok.(bool), Threshold: DefaultDirectThreshold}
}
