package gds

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// CuFileStatus says whether the cufile engine works with one libcufile.
type CuFileStatus struct {
	// Available is true when libcufile loaded and cuFileDriverOpen
	// succeeded: the library level only. Whether cuFile moves bytes on a
	// filesystem is ProbeCuFileDir's question (libcufile's driver open has
	// been seen to print an error and return success anyway).
	Available bool
	// Library is the path the dynamic loader opened, or the name asked for
	// when it could not be opened.
	Library string
	// Reason says, in words, why the engine is not available; "" when it is.
	Reason string
}

// cufileLib is one loaded libcufile, shared by every engine and file that
// uses it.
type cufileLib struct {
	shim   shimLib
	status CuFileStatus
	bufs   bufRegistry
	fs     fsVerdicts // per filesystem: does cuFile move bytes there
}

// The probe's state: outcomes cached per library name asked for, loaded
// libraries per resolved path, so the driver is opened once per library
// even when it is reached by two names.
var (
	cufileMu     sync.Mutex
	cufileByName = map[string]*cufileLib{}
	cufileByPath = map[string]*cufileLib{}
	// cufileProbe holds the probe's knobs. requireLibcuda skips the
	// driver-open test when libcuda cannot be loaded (the fake
	// libcufile of the tests needs no libcuda to open its driver);
	// timeout bounds the driver-open test; libcuda is the CUDA driver
	// library, whose calls give the filesystem probe its device memory
	// (the tests' fake libcuda, testdata/fakecufile/fakecuda.c, serves
	// them from host memory).
	cufileProbe = struct {
		requireLibcuda bool
		timeout        time.Duration
		libcuda        string
	}{true, 10 * time.Second, "libcuda.so.1"}
)

// ProbeCuFile loads libcufile and opens the cuFile driver, once per library:
// lib is a path or a name for the dynamic loader, "" for CuFileLibrary's
// resolution. The outcome is cached.
//
// The probe never crashes or hangs the process, even when libcufile does:
// on a machine without an NVIDIA driver it does not call cuFileDriverOpen at
// all (libcuda.so.1 cannot be loaded), and otherwise it first calls
// cuFileDriverOpen in a short-lived child process, killed after 10 seconds,
// and calls it here only if it came back there. (Without a driver,
// libcufile 1.x has been seen to spin forever inside cuFileDriverOpen when
// /proc/modules cannot be read.) The driver, once open, stays open for the
// life of the process.
func ProbeCuFile(lib string) CuFileStatus {
	if lib == "" {
		lib = cufileLibrary(Options{})
	}
	_, st := probeCuFile(lib)
	return st
}

// probeCuFile is ProbeCuFile returning the loaded library too (nil when not
// available).
func probeCuFile(name string) (*cufileLib, CuFileStatus) {
	cufileMu.Lock()
	defer cufileMu.Unlock()
	l, ok := cufileByName[name]
	if !ok {
		l = loadCuFile(name)
		cufileByName[name] = l
	}
	if !l.status.Available {
		return nil, l.status
	}
	return l, l.status
}

// loadCuFile does the probe's work for one name. Called with cufileMu held.
func loadCuFile(name string) *cufileLib {
	shim, path, msg := shimLoad(name)
	if msg != "" {
		if !strings.Contains(msg, name) {
			msg = name + ": " + msg
		}
		return &cufileLib{status: CuFileStatus{Library: name, Reason: "libcufile not found: " + msg}}
	}
	if l, ok := cufileByPath[path]; ok {
		return l
	}
	l := &cufileLib{shim: shim, status: CuFileStatus{Library: path}}
	cufileByPath[path] = l
	l.status.Reason = openDriver(shim)
	l.status.Available = l.status.Reason == ""
	return l
}

// openDriver opens the cuFile driver of a loaded library, guarded as
// ProbeCuFile explains, and returns "" or why it could not.
func openDriver(shim shimLib) string {
	if cufileProbe.requireLibcuda {
		if ok, msg := shimDriverLoadable(cufileProbe.libcuda); !ok {
			return "no NVIDIA driver: libcuda.so.1 cannot be loaded (" + msg + "); cuFileDriverOpen not called"
		}
	}
	limit := cufileProbe.timeout
	out, _, detail := shim.canary(limit)
	switch out {
	case canaryReturned:
		// It comes back. Its status in the child is not trusted either way:
		// CUDA does not work in a child forked after the parent used it.
	case canaryTimeout:
		return fmt.Sprintf("cuFileDriverOpen did not return within %v in a probe process (killed); not called here", limit)
	case canarySignal:
		return fmt.Sprintf("cuFileDriverOpen crashed a probe process (signal %d: %v); not called here", detail, unix.Signal(detail))
	case canaryExit:
		return fmt.Sprintf("cuFileDriverOpen ended a probe process (exit status %d); not called here", detail)
	case canaryNoFork:
		return fmt.Sprintf("cannot start a probe process for cuFileDriverOpen: %v", unix.Errno(detail))
	}
	st := shim.driverOpen()
	if st.code == 0 {
		return ""
	}
	msg := fmt.Sprintf("cuFileDriverOpen failed: %s (%d)", cuFileErrorName(st.code), st.code)
	if st.cuResult != 0 {
		msg += fmt.Sprintf(", CUresult %d", st.cuResult)
	}
	return msg + ": " + cuFileDriverHint(st.code)
}

// SetCuFileDriverLibrary makes the probes load libcuda (a soname or path)
// as the CUDA driver library until restore is called. For tests outside this package that run the cufile engine
// over the fake libcufile and fake libcuda of testdata/fakecufile; the
// driver open is then not guarded by the libcuda check (the fake needs
// none).
func SetCuFileDriverLibrary(libcuda string) (restore func()) {
	cufileMu.Lock()
	defer cufileMu.Unlock()
	saved := cufileProbe
	cufileProbe.libcuda, cufileProbe.requireLibcuda = libcuda, false
	return func() {
		cufileMu.Lock()
		defer cufileMu.Unlock()
		cufileProbe = saved
	}
}
