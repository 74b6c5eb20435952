// What has run where: nothing in this file has run on a GPU. Its transfers,
// offsets, registration and error handling are tested against a fake
// libcufile (testdata/fakecufile) that serves the cuFile calls from host
// memory, and its probe against the real libcufile of torch's wheels on a
// machine without an NVIDIA driver, where it must say "unavailable" and
// why. The first run on a GPU with GPUDirect Storage is still to come.

package gds

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CuFile is the GPUDirect Storage engine: transfers go through libcufile's
// cuFileRead and cuFileWrite, between files and device memory. libcufile is
// loaded at run time (see ProbeCuFile); nothing links against CUDA.
//
// Memory: the p of ReadAt and WriteAt describes device memory (a CUDA
// device address and a length); Go never dereferences it. Any address,
// offset and length works: cuFile handles unaligned transfers itself.
//
// A cufile File never falls back to another engine: no other engine can
// touch device memory. When cuFile cannot serve a file, Open fails.
//
// Nothing of this engine has run on a GPU yet: see the comment at the top
// of cufile.go.
type CuFile struct {
	opts Options
	lib  *cufileLib
}

// CuFileStatus says whether the cufile engine works with one libcufile.
type CuFileStatus struct {
	// Available is true when libcufile loaded and cuFileDriverOpen succeeded.
	Available bool
	// Library is the path the dynamic loader opened, or the name asked for
	// when it could not be opened.
	Library string
	// Reason says, in words, why the engine is not available; "" when it is.
	Reason string
}

// CuFileError is a failure status from libcufile: the CUfileOpError code
// and, for CU_FILE_CUDA_DRIVER_ERROR, the CUDA driver's CUresult.
type CuFileError struct {
	Call     string // the cuFile function, e.g. "cuFileRead"
	Code     int    // a CUfileOpError, 5001 and up
	CUResult int    // the CUresult; 0 unless Code is CU_FILE_CUDA_DRIVER_ERROR
}

func (e *CuFileError) Error() string {
	msg := fmt.Sprintf("%s: %s (%d)", e.Call, cuFileErrorName(e.Code), e.Code)
	if e.CUResult != 0 {
		msg += fmt.Sprintf(", CUresult %d", e.CUResult)
	}
	return msg
}

// cuFileOpErrBase is CUFILEOP_BASE_ERR: cuFile's own codes lie above it, so
// a negative transfer result of smaller magnitude is an errno.
const cuFileOpErrBase = 5000

// cuFileErrorNames are the CUfileOpError values of cufile.h.
var cuFileErrorNames = map[int]string{
	5001: "CU_FILE_DRIVER_NOT_INITIALIZED", 5002: "CU_FILE_DRIVER_INVALID_PROPS",
	5003: "CU_FILE_DRIVER_UNSUPPORTED_LIMIT", 5004: "CU_FILE_DRIVER_VERSION_MISMATCH",
	5005: "CU_FILE_DRIVER_VERSION_READ_ERROR", 5006: "CU_FILE_DRIVER_CLOSING",
	5007: "CU_FILE_PLATFORM_NOT_SUPPORTED", 5008: "CU_FILE_IO_NOT_SUPPORTED",
	5009: "CU_FILE_DEVICE_NOT_SUPPORTED", 5010: "CU_FILE_NVFS_DRIVER_ERROR",
	5011: "CU_FILE_CUDA_DRIVER_ERROR", 5012: "CU_FILE_CUDA_POINTER_INVALID",
	5013: "CU_FILE_CUDA_MEMORY_TYPE_INVALID", 5014: "CU_FILE_CUDA_POINTER_RANGE_ERROR",
	5015: "CU_FILE_CUDA_CONTEXT_MISMATCH", 5016: "CU_FILE_INVALID_MAPPING_SIZE",
	5017: "CU_FILE_INVALID_MAPPING_RANGE", 5018: "CU_FILE_INVALID_FILE_TYPE",
	5019: "CU_FILE_INVALID_FILE_OPEN_FLAG", 5020: "CU_FILE_DIO_NOT_SET",
	5021: "CU_FILE_EXPECTED_FILE_MODE", 5022: "CU_FILE_INVALID_VALUE",
	5023: "CU_FILE_MEMORY_ALREADY_REGISTERED", 5024: "CU_FILE_MEMORY_NOT_REGISTERED",
	5025: "CU_FILE_PERMISSION_DENIED", 5026: "CU_FILE_DRIVER_ALREADY_OPEN",
	5027: "CU_FILE_HANDLE_NOT_REGISTERED", 5028: "CU_FILE_HANDLE_ALREADY_REGISTERED",
	5029: "CU_FILE_DEVICE_NOT_FOUND", 5030: "CU_FILE_INTERNAL_ERROR",
	5031: "CU_FILE_GETNEWFD_FAILED", 5033: "CU_FILE_NVFS_SETUP_ERROR",
	5034: "CU_FILE_IO_DISABLED", 5035: "CU_FILE_BATCH_SUBMIT_FAILED",
	5036: "CU_FILE_GPU_MEMORY_PINNING_FAILED", 5037: "CU_FILE_BATCH_FULL",
	5038: "CU_FILE_ASYNC_NOT_SUPPORTED", 5039: "CU_FILE_INTERNAL_BATCH_SETUP_ERROR",
	5040: "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR", 5041: "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR",
	5042: "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR", 5043: "CU_FILE_NOMEM_ERROR",
	5044: "CU_FILE_IO_ERROR", 5045: "CU_FILE_INTERNAL_BUF_REGISTER_ERROR",
	5046: "CU_FILE_HASH_OPR_ERROR", 5047: "CU_FILE_INVALID_CONTEXT_ERROR",
	5048: "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR", 5049: "CU_FILE_BATCH_NOCOMPAT_ERROR",
}

func cuFileErrorName(code int) string {
	if n, ok := cuFileErrorNames[code]; ok {
		return n
	}
	return "unknown cuFile error"
}

// cuFileDriverHint guesses, for a failed cuFileDriverOpen, what is missing.
func cuFileDriverHint(code int) string {
	switch code {
	case 5001, 5010, 5033: // not initialized, nvidia-fs ioctl, nvidia-fs setup
		return "nvidia-fs not loaded?"
	case 5009, 5029: // device not supported, device not found
		return "no GPU that supports GPUDirect Storage?"
	case 5004, 5005: // driver version mismatch or unreadable
		return "NVIDIA driver and libcufile versions do not match?"
	}
	return "no NVIDIA driver?"
}

// cufileLibEnv names the environment variable with the libcufile to load.
const cufileLibEnv = "PYFASTENSOR_CUFILE_LIB"

// cufileDefaultLib is what the dynamic loader is asked for by default.
const cufileDefaultLib = "libcufile.so.0"

// cufileCandidates are libcufile paths found by the Python package (the
// copies torch's CUDA wheels install under site-packages), set once when
// the library is loaded (SetCuFileCandidates).
var cufileCandidates struct {
	sync.Mutex
	paths []string
}

// SetCuFileCandidates records the libcufile paths to try after
// Options.CuFileLibrary and $PYFASTENSOR_CUFILE_LIB, before the dynamic
// loader's search. Paths that do not exist are skipped at resolution.
func SetCuFileCandidates(paths []string) {
	cufileCandidates.Lock()
	cufileCandidates.paths = slices.Clone(paths)
	cufileCandidates.Unlock()
}

// CuFileLibrary is the one resolution of the libcufile to load, the same
// for info(), checkpoints, the spill store and raw files: Options.
// CuFileLibrary, else $PYFASTENSOR_CUFILE_LIB, else the first existing
// candidate (SetCuFileCandidates), else the soname libcufile.so.0 for the
// loader's search. It returns the library and where it came from
// ("option", "environment", "candidate" or "loader").
func CuFileLibrary(o Options) (lib, source string) {
	if o.CuFileLibrary != "" {
		return o.CuFileLibrary, "option"
	}
	if v := os.Getenv(cufileLibEnv); v != "" {
		return v, "environment"
	}
	cufileCandidates.Lock()
	defer cufileCandidates.Unlock()
	for _, p := range cufileCandidates.paths {
		if _, err := os.Stat(p); err == nil {
			return p, "candidate"
		}
	}
	return cufileDefaultLib, "loader"
}

func cufileLibrary(o Options) string {
	lib, _ := CuFileLibrary(o)
	return lib
}

// cufileLib is one loaded libcufile, shared by every engine and file that
// uses it.
type cufileLib struct {
	shim   shimLib
	status CuFileStatus
	bufs   bufRegistry
}

// The probe's state: outcomes cached per library name asked for, loaded
// libraries per resolved path, so the driver is opened once per library
// even when it is reached by two names.
var (
	cufileMu     sync.Mutex
	cufileByName = map[string]*cufileLib{}
	cufileByPath = map[string]*cufileLib{}
	// cufileProbe holds the probe's knobs. requireLibcuda skips the
	// driver-open test when libcuda.so.1 cannot be loaded (the fake
	// libcufile of the tests needs no libcuda); timeout bounds the
	// driver-open test.
	cufileProbe = struct {
		requireLibcuda bool
		timeout        time.Duration
	}{true, 10 * time.Second}
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
		if ok, msg := shimDriverLoadable(); !ok {
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

// NewCuFile returns the cufile engine, or an error wrapping ErrUnavailable
// with the probe's reason when libcufile or the driver cannot be used.
func NewCuFile(opts Options) (*CuFile, error) {
	opts = opts.withDefaults()
	lib, st := probeCuFile(cufileLibrary(opts))
	if !st.Available {
		return nil, fmt.Errorf("%w: cufile: %s", ErrUnavailable, st.Reason)
	}
	return &CuFile{opts: opts, lib: lib}, nil
}

func init() {
	register("cufile", func(o Options) (Engine, error) {
		e, err := NewCuFile(o)
		if err != nil {
			return nil, err
		}
		return e, nil
	})
}

// Name implements Engine.
func (e *CuFile) Name() string { return "cufile" }

// Library is the path of the libcufile in use.
func (e *CuFile) Library() string { return e.lib.status.Library }

// Open implements Engine. The file is opened with O_DIRECT, which GPUDirect
// Storage needs; on a filesystem that refuses O_DIRECT it is opened without,
// and cuFile serves it in its compatibility mode. The descriptor is
// registered with cuFile until Close.
func (e *CuFile) Open(path string, flag int, perm os.FileMode) (File, error) {
	fd, err := openFD(path, flag|unix.O_DIRECT, uint32(perm.Perm()))
	if errors.Is(err, unix.EINVAL) {
		fd, err = openFD(path, flag, uint32(perm.Perm()))
	}
	name := e.opts.nameFor(path)
	if err != nil {
		return nil, opErr("cufile", "open", name, 0, 0, 0, err)
	}
	fh, st := e.lib.shim.handleRegister(fd)
	if st.code != 0 {
		unix.Close(fd)
		return nil, opErr("cufile", "open", name, 0, 0, 0, &CuFileError{"cuFileHandleRegister", st.code, st.cuResult})
	}
	return &cufileFile{fd: fd, fh: fh, path: name, opts: e.opts, lib: e.lib}, nil
}

// RegisterBuffer registers device memory p with cuFile, so that transfers
// from or into p, or any part of it, go straight to it instead of through
// cuFile's internal bounce buffers. Registration is costly: do it for
// buffers that are reused, and deregister before freeing the memory.
func (e *CuFile) RegisterBuffer(p []byte) error {
	if len(p) == 0 {
		return fmt.Errorf("%w: cufile: registering an empty buffer", ErrInvalid)
	}
	base := unsafe.Pointer(unsafe.SliceData(p))
	if st := e.lib.shim.bufRegister(base, len(p)); st.code != 0 {
		return fmt.Errorf("cufile: register buffer %p (%d bytes): %w", base, len(p), &CuFileError{"cuFileBufRegister", st.code, st.cuResult})
	}
	e.lib.bufs.add(uintptr(base), len(p))
	return nil
}

// DeregisterBuffer undoes RegisterBuffer for the same p.
func (e *CuFile) DeregisterBuffer(p []byte) error {
	base := unsafe.Pointer(unsafe.SliceData(p))
	e.lib.bufs.remove(uintptr(base))
	if st := e.lib.shim.bufDeregister(base); st.code != 0 {
		return fmt.Errorf("cufile: deregister buffer %p: %w", base, &CuFileError{"cuFileBufDeregister", st.code, st.cuResult})
	}
	return nil
}

// bufRegistry remembers registered buffers: cuFile wants a transfer into a
// registered buffer addressed as its registered base plus an offset.
type bufRegistry struct {
	mu   sync.RWMutex
	bufs map[uintptr]int // base -> length
}

func (r *bufRegistry) add(base uintptr, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bufs == nil {
		r.bufs = map[uintptr]int{}
	}
	r.bufs[base] = n
}

func (r *bufRegistry) remove(base uintptr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.bufs, base)
}

// locate returns how far p starts past the base of the registered buffer
// that holds it, or 0 when none does.
func (r *bufRegistry) locate(p []byte) int64 {
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	r.mu.RLock()
	defer r.mu.RUnlock()
	for base, n := range r.bufs {
		if addr >= base && addr+uintptr(len(p)) <= base+uintptr(n) {
			return int64(addr - base)
		}
	}
	return 0
}

// cufileFile is an open file of the cufile engine.
type cufileFile struct {
	fd     int
	fh     uintptr // cuFile's handle for fd
	path   string
	opts   Options
	lib    *cufileLib
	closed atomic.Bool
}

var _ File = (*cufileFile)(nil)

func (f *cufileFile) Path() string     { return f.path }
func (f *cufileFile) Engine() string   { return "cufile" }
func (f *cufileFile) Fallback() string { return "" }

func (f *cufileFile) check(op string, p []byte, off int64) error {
	if f.closed.Load() {
		return opErr("cufile", op, f.path, off, len(p), 0, ErrClosed)
	}
	if err := checkRange(p, off); err != nil {
		return opErr("cufile", op, f.path, off, len(p), 0, err)
	}
	return nil
}

// ReadAt implements File. The read is clamped to the file's size first, so
// the count returned with ErrEOF is that of the bytes before the end.
func (f *cufileFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check("read", p, off); err != nil || len(p) == 0 {
		return 0, err
	}
	size, err := fdSize("cufile", f.fd, f.path)
	if err != nil {
		return 0, err
	}
	want := p
	if avail := size - off; avail < int64(len(p)) {
		want = p[:max(avail, 0)]
	}
	n, err := f.transfer(false, want, off)
	if err == nil && len(want) < len(p) {
		err = ErrEOF
	}
	if err != nil {
		return n, opErr("cufile", "read", f.path, off, len(p), n, err)
	}
	return n, nil
}

// WriteAt implements File.
func (f *cufileFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check("write", p, off); err != nil || len(p) == 0 {
		return 0, err
	}
	n, err := f.transfer(true, p, off)
	if err != nil {
		return n, opErr("cufile", "write", f.path, off, len(p), n, err)
	}
	return n, nil
}

// transfer moves p at off in task-sized pieces across the engine's
// threads. Every piece names the same buffer base, the start of p (or of
// the registered buffer holding p), and its own offset from it.
func (f *cufileFile) transfer(write bool, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	delta := f.lib.bufs.locate(p)
	base := unsafe.Add(unsafe.Pointer(unsafe.SliceData(p)), -delta)
	return splitRun(len(p), f.opts.TaskSize, f.opts.Threads, func(lo, hi int) (int, error) {
		return f.piece(write, base, delta+int64(lo), hi-lo, off+int64(lo))
	})
}

// piece moves n bytes between file offset off and base+bufOff, looping on
// short transfers until done.
func (f *cufileFile) piece(write bool, base unsafe.Pointer, bufOff int64, n int, off int64) (int, error) {
	call := "cuFileRead"
	if write {
		call = "cuFileWrite"
	}
	done := 0
	for done < n {
		r, errno := f.lib.shim.transfer(write, f.fh, base, n-done, off+int64(done), bufOff+int64(done))
		switch {
		case r > 0:
			done += int(r)
		case r == 0 && write:
			return done, io.ErrShortWrite // no progress: do not spin
		case r == 0:
			return done, ErrEOF // the file shrank under the read
		case r == -1 && errno == unix.EINTR:
		case r == -1:
			return done, errno
		case -r > cuFileOpErrBase:
			return done, &CuFileError{Call: call, Code: int(-r)}
		default: // a negated errno, which some paths of libcufile return
			return done, unix.Errno(-r)
		}
	}
	return done, nil
}

// Sync implements File: fsync of the descriptor.
func (f *cufileFile) Sync() error {
	if f.closed.Load() {
		return opErr("cufile", "sync", f.path, 0, 0, 0, ErrClosed)
	}
	if err := unix.Fsync(f.fd); err != nil {
		return opErr("cufile", "sync", f.path, 0, 0, 0, err)
	}
	return nil
}

// Size implements File.
func (f *cufileFile) Size() (int64, error) { return fdSize("cufile", f.fd, f.path) }

// Truncate implements File.
func (f *cufileFile) Truncate(size int64) error {
	if err := unix.Ftruncate(f.fd, size); err != nil {
		return opErr("cufile", "truncate", f.path, size, 0, 0, err)
	}
	return nil
}

// Close implements File: the cuFile handle is deregistered, then the
// descriptor closed.
func (f *cufileFile) Close() error {
	if f.closed.Swap(true) {
		return opErr("cufile", "close", f.path, 0, 0, 0, ErrClosed)
	}
	f.lib.shim.handleDeregister(f.fh)
	if err := unix.Close(f.fd); err != nil {
		return opErr("cufile", "close", f.path, 0, 0, 0, err)
	}
	return nil
}
