package gds

// Go side of the cuFile shim (cufile_shim.h, cufile_shim.c): every call into
// libcufile goes through here. Nothing links against CUDA; libcufile is
// dlopened at run time.

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "cufile_shim.h"
*/
import "C"

import (
	"syscall"
	"time"
	"unsafe"
)

// cuStatus is a CUfileError_t: a CUfileOpError code (0 for success) and,
// for CU_FILE_CUDA_DRIVER_ERROR, the CUDA driver's CUresult.
type cuStatus struct{ code, cuResult int }

func goStatus(s C.pfcf_status) cuStatus { return cuStatus{int(s.err), int(s.cu_err)} }

// shimLib is one dlopened libcufile with its entry points resolved.
type shimLib struct{ c *C.pfcf_lib }

const shimErrLen = 1024

// shimLoad dlopens path and resolves the cuFile entry points. On failure it
// returns the loader's message.
func shimLoad(path string) (lib shimLib, resolved string, errMsg string) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [shimErrLen]C.char
	l := C.pfcf_load(cpath, &buf[0], shimErrLen)
	if l == nil {
		return shimLib{}, "", C.GoString(&buf[0])
	}
	C.pfcf_resolved(l, &buf[0], shimErrLen)
	resolved = C.GoString(&buf[0])
	if resolved == "" {
		resolved = path
	}
	return shimLib{l}, resolved, ""
}

// shimDriverLoadable reports whether the CUDA driver library libcuda can
// be loaded, with the loader's message when not.
func shimDriverLoadable(libcuda string) (bool, string) {
	clib := C.CString(libcuda)
	defer C.free(unsafe.Pointer(clib))
	var buf [shimErrLen]C.char
	if C.pfcf_need_driver(clib, &buf[0], shimErrLen) != 0 {
		return true, ""
	}
	return false, C.GoString(&buf[0])
}

// probeStage is the first step of pfcf_probe_io that failed.
type probeStage int

const (
	probeOK       probeStage = C.PFCF_PROBE_OK
	probeCUDA     probeStage = C.PFCF_PROBE_CUDA
	probeRegister probeStage = C.PFCF_PROBE_REGISTER
	probeWrite    probeStage = C.PFCF_PROBE_WRITE
	probeRead     probeStage = C.PFCF_PROBE_READ
	probeCompare  probeStage = C.PFCF_PROBE_COMPARE
)

// probeResult is what pfcf_probe_io found (see cufile_shim.h).
type probeResult struct {
	stage probeStage
	call  string // the call that failed
	ret   int64  // its result: cuFile status, transfer result or CUresult
	errno syscall.Errno
	msg   string // the loader's message
}

// probeIO moves n bytes from device memory to fd and back through cuFile
// (pfcf_probe_io), with device memory from libcuda.
func (l shimLib) probeIO(libcuda string, fd, n int) probeResult {
	clib := C.CString(libcuda)
	defer C.free(unsafe.Pointer(clib))
	var r C.pfcf_probe
	C.pfcf_probe_io(l.c, clib, C.int(fd), C.size_t(n), &r)
	return probeResult{stage: probeStage(r.stage), call: C.GoString(&r.call[0]), ret: int64(r.ret),
		errno: syscall.Errno(r.err_no), msg: C.GoString(&r.msg[0])}
}

// canaryOutcome is how cuFileDriverOpen fared in the probe's child process.
type canaryOutcome int

const (
	canaryReturned canaryOutcome = C.PFCF_CANARY_RETURNED
	canaryTimeout  canaryOutcome = C.PFCF_CANARY_TIMEOUT
	canarySignal   canaryOutcome = C.PFCF_CANARY_SIGNAL
	canaryExit     canaryOutcome = C.PFCF_CANARY_EXIT
	canaryNoFork   canaryOutcome = C.PFCF_CANARY_NOFORK
)

// canary calls cuFileDriverOpen in a forked child and reports whether it
// returned within timeout. detail is the signal, exit status or errno that
// goes with the outcome.
func (l shimLib) canary(timeout time.Duration) (out canaryOutcome, st cuStatus, detail int) {
	var s C.pfcf_status
	var d C.int
	o := C.pfcf_canary(l.c, C.int(timeout.Milliseconds()), &s, &d)
	return canaryOutcome(o), goStatus(s), int(d)
}

func (l shimLib) driverOpen() cuStatus { return goStatus(C.pfcf_driver_open(l.c)) }

// handleRegister registers fd and returns the opaque cuFile handle, kept as
// an integer: it is the library's value, never a Go pointer.
func (l shimLib) handleRegister(fd int) (uintptr, cuStatus) {
	var fh C.uintptr_t
	st := goStatus(C.pfcf_handle_register(l.c, C.int(fd), &fh))
	return uintptr(fh), st
}

func (l shimLib) handleDeregister(fh uintptr) { C.pfcf_handle_deregister(l.c, C.uintptr_t(fh)) }

func (l shimLib) bufRegister(base unsafe.Pointer, n int) cuStatus {
	return goStatus(C.pfcf_buf_register(l.c, base, C.size_t(n)))
}

func (l shimLib) bufDeregister(base unsafe.Pointer) cuStatus {
	return goStatus(C.pfcf_buf_deregister(l.c, base))
}

// transfer is one cuFileRead or cuFileWrite of size bytes between file
// offset fileOff and base+bufOff. It returns the library's result (bytes
// moved, -1, or a negated CUfileOpError) and errno, which only means
// something when the result is -1.
func (l shimLib) transfer(write bool, fh uintptr, base unsafe.Pointer, size int, fileOff, bufOff int64) (int64, syscall.Errno) {
	h := C.uintptr_t(fh)
	var r C.ssize_t
	var err error
	if write {
		r, err = C.pfcf_write(l.c, h, base, C.size_t(size), C.off_t(fileOff), C.off_t(bufOff))
	} else {
		r, err = C.pfcf_read(l.c, h, base, C.size_t(size), C.off_t(fileOff), C.off_t(bufOff))
	}
	errno, _ := err.(syscall.Errno)
	return int64(r), errno
}

// aux calls an extra function of type long(long, long, long) that the
// library exports (only the tests' fake libcufile has any).
func (l shimLib) aux(name string, a, b, c int64) (int64, bool) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var out C.long
	if C.pfcf_aux(l.c, cname, C.long(a), C.long(b), C.long(c), &out) == 0 {
		return 0, false
	}
	return int64(out), true
}
