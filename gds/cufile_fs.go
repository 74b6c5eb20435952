package gds

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// CuFileFSStatus says whether cuFile moves bytes on one filesystem, for one
// libcufile: the verdict every choice of the cufile engine follows, and
// what info() reports for a directory.
type CuFileFSStatus struct {
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	// Dev is the filesystem's device number (st_dev), which the verdict is
	// kept by; 0 when the directory could not be examined.
	Dev uint64 `json:"st_dev,omitempty"`
	// Source is how the verdict was reached: "library" (libcufile or its
	// driver is not available: nothing was tried on the filesystem),
	// "probe" (ProbeCuFileDir's write and read), or "failure" (a file's
	// open, registration or transfer failed since, which overrides a probe
	// that passed).
	Source string `json:"source"`
}

// cufileProbeSize is the size of the probe's write and read: a multiple
// of every O_DIRECT alignment, small enough for any filesystem.
const cufileProbeSize = 64 << 10

// fsVerdicts are one library's verdicts, by device number.
type fsVerdicts struct {
	mu    sync.Mutex
	byDev map[uint64]CuFileFSStatus
}

// get returns dev's verdict, running probe for it on first use. Probes are
// serialized: each filesystem is probed once per library per process.
func (v *fsVerdicts) get(dev uint64, probe func() string) CuFileFSStatus {
	v.mu.Lock()
	defer v.mu.Unlock()
	if st, ok := v.byDev[dev]; ok {
		return st
	}
	reason := probe()
	st := CuFileFSStatus{Available: reason == "", Reason: reason, Dev: dev, Source: "probe"}
	if v.byDev == nil {
		v.byDev = map[uint64]CuFileFSStatus{}
	}
	v.byDev[dev] = st
	return st
}

// lookup returns dev's verdict without probing.
func (v *fsVerdicts) lookup(dev uint64) (CuFileFSStatus, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	st, ok := v.byDev[dev]
	return st, ok
}

// fail records that cuFile failed on dev: from now on no file there is
// opened through cuFile. The first failure's reason is kept.
func (v *fsVerdicts) fail(dev uint64, reason string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if st, ok := v.byDev[dev]; ok && !st.Available {
		return
	}
	if v.byDev == nil {
		v.byDev = map[uint64]CuFileFSStatus{}
	}
	v.byDev[dev] = CuFileFSStatus{Reason: reason, Dev: dev, Source: "failure"}
}

// ProbeCuFileDir says whether cuFile moves bytes on the filesystem holding
// dir, with libcufile lib ("" for CuFileLibrary's resolution): the library
// probe (ProbeCuFile) must pass, then, once per filesystem (by st_dev) and
// process, a temporary file in dir is registered with cuFileHandleRegister
// and cufileProbeSize bytes are written to it from device memory and read
// back through cuFile, and both the bytes read and the file's bytes are
// compared with those written. Device memory comes from libcuda
// (cuMemAlloc, in the calling thread's current context or device 0's
// primary context). The verdict is cached, and turns to unavailable for
// good when a file's open or transfer through cuFile fails later.
//
// A directory where no file can be created gets "unavailable" with that
// reason: cuFile is not tried on a filesystem the probe cannot test.
func ProbeCuFileDir(lib, dir string) CuFileFSStatus {
	if lib == "" {
		lib = cufileLibrary(Options{})
	}
	l, st := probeCuFile(lib)
	if !st.Available {
		return CuFileFSStatus{Reason: st.Reason, Source: "library"}
	}
	var s unix.Stat_t
	if err := unix.Stat(dir, &s); err != nil {
		return CuFileFSStatus{Reason: fmt.Sprintf("cufile: stat %s: %v", dir, err), Source: "probe"}
	}
	return l.fs.get(uint64(s.Dev), func() string { return l.probeDir(dir) })
}

// CuFileFailedOn returns the reason cuFile is known not to work on the
// filesystem with device number dev, for the default libcufile
// (CuFileLibrary), and whether it is known: probed and failed, or failed
// on a file since. It never probes. The adaptive dictionaries ask it
// before naming cufile.
func CuFileFailedOn(dev uint64) (string, bool) {
	lib := cufileLibrary(Options{})
	cufileMu.Lock()
	l, ok := cufileByName[lib]
	cufileMu.Unlock()
	if !ok || !l.status.Available {
		return "", false
	}
	st, ok := l.fs.lookup(dev)
	if !ok || st.Available {
		return "", false
	}
	return st.Reason, true
}

// IsCuFileFailure reports whether err is cuFile failing: a cuFile status
// (CuFileError), or the cufile engine unavailable, for the machine or the
// file's filesystem (ErrUnavailable). A caller moving host memory falls
// back to a CPU engine on these; a full disk, an end of file or a bad
// argument are not among them.
func IsCuFileFailure(err error) bool {
	var ce *CuFileError
	return errors.As(err, &ce) || errors.Is(err, ErrUnavailable)
}

// probeDir runs the filesystem probe in dir and returns "" or why cuFile
// does not work there.
func (l *cufileLib) probeDir(dir string) string {
	tmp, err := os.CreateTemp(dir, ".pyfastensor-cufile-probe-*")
	if err != nil {
		return fmt.Sprintf("cannot create a probe file in %s (%v): cuFile not tried on this filesystem", dir, err)
	}
	name := tmp.Name()
	tmp.Close()
	defer os.Remove(name)
	fd, err := openFD(name, os.O_RDWR|unix.O_DIRECT, 0o600)
	if errors.Is(err, unix.EINVAL) {
		fd, err = openFD(name, os.O_RDWR, 0o600)
	}
	if err != nil {
		return fmt.Sprintf("cannot open the probe file %s: %v", name, err)
	}
	defer unix.Close(fd)
	cufileMu.Lock()
	libcuda := cufileProbe.libcuda
	cufileMu.Unlock()
	return describeProbe(l.shim.probeIO(libcuda, fd, cufileProbeSize), dir, libcuda)
}

// describeProbe says in words why the probe failed, or "" when it passed.
func describeProbe(r probeResult, dir, libcuda string) string {
	fs, _ := FSType(dir)
	where := fmt.Sprintf("%s (%s)", dir, fs)
	switch r.stage {
	case probeOK:
		return ""
	case probeCUDA:
		switch {
		case r.call == "dlopen":
			return fmt.Sprintf("no device memory for the cuFile probe: %s cannot be loaded (%s)", libcuda, r.msg)
		case r.msg != "":
			return fmt.Sprintf("no device memory for the cuFile probe: %s lacks %s (%s)", libcuda, r.call, r.msg)
		case r.errno != 0:
			return fmt.Sprintf("cuFile probe: %s failed: %v", r.call, r.errno)
		}
		return fmt.Sprintf("no device memory for the cuFile probe: %s failed with CUresult %d", r.call, r.ret)
	case probeRegister:
		e := &CuFileError{Call: r.call, Code: int(r.ret), CUResult: int(r.errno)}
		return fmt.Sprintf("cuFileHandleRegister failed: %s (%d) on %s: GPUDirect Storage is not installed or not usable on this filesystem (nvidia-fs, a supported filesystem, or cuFile's compatibility mode)",
			cuFileErrorName(e.Code), e.Code, where)
	case probeWrite, probeRead:
		return fmt.Sprintf("%s of %d bytes from device memory failed on %s: %s", r.call, cufileProbeSize, where, transferFailure(r))
	case probeCompare:
		if r.call == "cuFileRead" {
			return fmt.Sprintf("cuFileRead on %s returned other bytes than cuFileWrite wrote", where)
		}
		return fmt.Sprintf("cuFileWrite on %s left other bytes in the file than it was given", where)
	}
	return fmt.Sprintf("cuFile probe on %s: unknown stage %d", where, r.stage)
}

// transferFailure says what one probe transfer's result means.
func transferFailure(r probeResult) string {
	switch {
	case r.ret == -1:
		return r.errno.Error()
	case -r.ret > cuFileOpErrBase:
		return fmt.Sprintf("%s (%d)", cuFileErrorName(int(-r.ret)), -r.ret)
	case r.ret < 0:
		return unix.Errno(-r.ret).Error()
	}
	return fmt.Sprintf("moved %d of %d bytes", r.ret, cufileProbeSize)
}

// probeDirOf returns the directory whose filesystem holds the file the
// engine knows as name: for /proc/self/fd/N (a file pinned open, or an
// O_TMPFILE spill file) the directory of the path the descriptor was opened
// by.
func probeDirOf(name string) string {
	if strings.HasPrefix(name, "/proc/self/fd/") {
		if target, err := os.Readlink(name); err == nil && filepath.IsAbs(target) {
			name = strings.TrimSuffix(target, " (deleted)")
		}
	}
	return filepath.Dir(name)
}
