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
	// CuFile is whether cuFile moves bytes on this directory's filesystem
	// (gds.ProbeCuFileDir: the library and its driver open, then a small
	// write and read through cuFile from device memory, once per
	// filesystem; a later failure on a file there turns it off), and
	// CuFileReason why not. CuFileVerdict is how that was decided:
	// "library", "probe" or "failure". CuFileDriver is the library level
	// alone (libcufile loaded, cuFileDriverOpen returned success), with
	// CuFileDriverReason. CuFileLibrary is the one libcufile every engine
	// choice loads (gds.CuFileLibrary), with where that name came from.
	CuFile             bool   `json:"cufile"`
	CuFileReason       string `json:"cufile_reason,omitempty"`
	CuFileVerdict      string `json:"cufile_verdict"`
	CuFileDriver       bool   `json:"cufile_driver"`
	CuFileDriverReason string `json:"cufile_driver_reason,omitempty"`
	CuFileLibrary      string `json:"cufile_library"`
	CuFileSource       string `json:"cufile_library_source"`
	// Fallback says, in words, what the default choice does instead of
	// O_DIRECT in this directory; "" when O_DIRECT works.
	Fallback string `json:"fallback,omitempty"`
}

var probes sync.Map // absolute dir -> DirProbe

// Probe returns dir's probe, probing it on first use (a small unlinked
// file moved through O_DIRECT; io_uring and libcufile once per process;
// cuFile once per filesystem). The cuFile fields are the verdict of now:
// a failure of cuFile on a file since the first probe shows. Safe for
// concurrent use.
func Probe(dir string) DirProbe {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	p, ok := probes.Load(dir)
	if !ok {
		p = DirProbe{DirInfo: gds.ProbeDir(dir)}
		d := p.(DirProbe)
		d.Uring, d.UringReason = gds.ProbeUring()
		if !d.Direct {
			d.Fallback = "posix (page cache) for every transfer: " + d.DirectReason
		}
		p, _ = probes.LoadOrStore(dir, d)
	}
	d := p.(DirProbe)
	d.CuFileLibrary, d.CuFileSource = gds.CuFileLibrary(gds.Options{})
	lib := gds.ProbeCuFile(d.CuFileLibrary)
	d.CuFileDriver, d.CuFileDriverReason = lib.Available, lib.Reason
	if lib.Library != "" {
		d.CuFileLibrary = lib.Library
	}
	fs := gds.ProbeCuFileDir(d.CuFileLibrary, dir)
	d.CuFile, d.CuFileReason, d.CuFileVerdict = fs.Available, fs.Reason, fs.Source
	return d
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
