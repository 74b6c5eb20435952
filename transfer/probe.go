package transfer

import (
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/pyfastensor/pyfastensor/gds"
)

// DirProbe is what one directory's filesystem and this machine can do, as
// every choice of engine sees it: decided once per directory per process
// (Probe) and reported as it is by info(). Fallbacks are states, not
// surprises: each "no" carries its reason.
type DirProbe struct {
	gds.DirInfo
	// Uring is whether io_uring works on this machine; UringReason why not.
	Uring       bool   `json:"io_uring"`
	UringReason string `json:"io_uring_reason,omitempty"`
	// CuFile is whether GPUDirect Storage works; CuFileLibrary is the one
	// libcufile every engine choice loads (gds.CuFileLibrary), with where
	// that name came from, and CuFileReason why it does not work.
	CuFile        bool   `json:"cufile"`
	CuFileLibrary string `json:"cufile_library"`
	CuFileSource  string `json:"cufile_library_source"`
	CuFileReason  string `json:"cufile_reason,omitempty"`
	// Fallback says, in words, what the default choice does instead of
	// O_DIRECT in this directory; "" when O_DIRECT works.
	Fallback string `json:"fallback,omitempty"`
}

var probes sync.Map // absolute dir -> DirProbe

// Probe returns dir's probe, probing it on first use (a small unlinked
// file moved through O_DIRECT; io_uring and libcufile once per process).
// Safe for concurrent use.
func Probe(dir string) DirProbe {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	if p, ok := probes.Load(dir); ok {
		return p.(DirProbe)
	}
	p := DirProbe{DirInfo: gds.ProbeDir(dir)}
	p.Uring, p.UringReason = gds.ProbeUring()
	p.CuFileLibrary, p.CuFileSource = gds.CuFileLibrary(gds.Options{})
	cf := gds.ProbeCuFile(p.CuFileLibrary)
	p.CuFile, p.CuFileReason = cf.Available, cf.Reason
	if cf.Library != "" {
		p.CuFileLibrary = cf.Library
	}
	if !p.Direct {
		p.Fallback = "posix (page cache) for every transfer: " + p.DirectReason
	}
	actual, _ := probes.LoadOrStore(dir, p)
	return actual.(DirProbe)
}

// ShownName returns what errors call the file at path: for
// /proc/self/fd/N (a file pinned open, as a checkpoint load keeps the file
// it parsed) the path that descriptor was opened by, else path.
func ShownName(path string) string {
	if strings.HasPrefix(path, "/proc/self/fd/") {
		if target, err := os.Readlink(path); err == nil && filepath.IsAbs(target) {
			return strings.TrimSuffix(target, " (deleted)")
		}
	}
	return path
}

// DirOf returns the absolute directory of the file at path (ShownName),
// whose probe applies to it.
func DirOf(path string) (string, error) {
	abs, err := filepath.Abs(ShownName(path))
	if err != nil {
		return "", err
	}
	return filepath.Dir(abs), nil
}
