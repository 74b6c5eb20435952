// What has run where: the cufile engine (cufile*.go) ran once on a GPU, an
// H100 with the libcufile of pip's nvidia-cufile wheel and no GPUDirect
// Storage installed: cuFileDriverOpen printed "cuInit Failed" and
// "cuFile initialization failed" yet returned success, and
// cuFileHandleRegister then failed with CU_FILE_HANDLE_NOT_REGISTERED
// (5027). That is what the filesystem probe (cufile_fs.go) and the
// fallback of host-memory callers (transfer.Files) handle; on an H200 with
// the same libcufile, the probe (real libcuda, device memory) reported 5027
// per filesystem and every save, load and spill took the CPU engines. A run
// with working GPUDirect Storage is still to come. Everything else is tested
// against a fake libcufile and a fake libcuda (testdata/fakecufile) that
// serve the calls from host memory, and the library probe against the
// real libcufile of torch's wheels on a machine without an NVIDIA driver,
// where it must say "unavailable" and why.

package gds

import (
	"errors"
	"fmt"
	"os"
	"sync"
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
// touch device memory. When cuFile cannot serve a file, Open fails with an
// error wrapping ErrUnavailable or a CuFileError (IsCuFileFailure), and
// callers that move host memory (transfer.Files) use a CPU engine instead.
// Open serves only filesystems where ProbeCuFileDir's verdict is
// "available"; a registration or transfer that fails turns that verdict to
// unavailable for the rest of the process.
//
// What has run on a GPU: see the comment at the top of cufile.go.
type CuFile struct {
	opts Options
	lib  *cufileLib
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
// and cuFile serves it in its compatibility mode. The first file on a
// filesystem runs the filesystem probe (ProbeCuFileDir) in its directory;
// where the verdict is "unavailable" Open fails with ErrUnavailable and the
// verdict's reason. The descriptor is registered with cuFile until Close.
func (e *CuFile) Open(path string, flag int, perm os.FileMode) (File, error) {
	fd, err := openFD(path, flag|unix.O_DIRECT, uint32(perm.Perm()))
	if errors.Is(err, unix.EINVAL) {
		fd, err = openFD(path, flag, uint32(perm.Perm()))
	}
	name := e.opts.nameFor(path)
	if err != nil {
		return nil, opErr("cufile", "open", name, 0, 0, 0, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, opErr("cufile", "open", name, 0, 0, 0, err)
	}
	dev := uint64(st.Dev)
	v := e.lib.fs.get(dev, func() string { return e.lib.probeDir(probeDirOf(name)) })
	if !v.Available {
		unix.Close(fd)
		return nil, opErr("cufile", "open", name, 0, 0, 0, fmt.Errorf("%w: %s", ErrUnavailable, v.Reason))
	}
	fh, cst := e.lib.shim.handleRegister(fd)
	if cst.code != 0 {
		unix.Close(fd)
		err := opErr("cufile", "open", name, 0, 0, 0, &CuFileError{"cuFileHandleRegister", cst.code, cst.cuResult})
		e.lib.fs.fail(dev, err.Error())
		return nil, err
	}
	return &cufileFile{fd: fd, fh: fh, dev: dev, path: name, opts: e.opts, lib: e.lib}, nil
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
