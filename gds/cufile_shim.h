// The cuFile shim: libcufile's entry points as a struct of function pointers
// filled by dlopen/dlsym at run time. Nothing here links against CUDA; the
// types below are our own minimal declarations of cuFile's ABI on Linux
// x86-64 and aarch64, written from NVIDIA's cuFile API reference.
#ifndef PFCF_SHIM_H
#define PFCF_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// CUfileError_t: a cuFile status (0 = success, else a 5000-based
// CUfileOpError) and, for CU_FILE_CUDA_DRIVER_ERROR, the CUresult. Two ints,
// returned by value.
typedef struct {
	int err;
	int cu_err;
} pfcf_status;

// CU_FILE_HANDLE_TYPE_OPAQUE_FD: the descriptor holds a Linux fd.
#define PFCF_HANDLE_TYPE_OPAQUE_FD 1

// CUfileDescr_t: handle type, then a union of fd and pointer (pointer
// sized, so 4 bytes of padding follow type), then the user-space file
// system operations (NULL for kernel file systems).
typedef struct {
	int type;
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} pfcf_descr;

// pfcf_lib is one loaded libcufile.
typedef struct {
	void *dl;
	pfcf_status (*driver_open)(void);
	pfcf_status (*driver_close)(void);
	pfcf_status (*handle_register)(void **fh, pfcf_descr *descr);
	void (*handle_deregister)(void *fh);
	pfcf_status (*buf_register)(const void *base, size_t len, int flags);
	pfcf_status (*buf_deregister)(const void *base);
	ssize_t (*read)(void *fh, void *base, size_t size, off_t file_off, off_t buf_off);
	ssize_t (*write)(void *fh, const void *base, size_t size, off_t file_off, off_t buf_off);
	// The CUDA driver's context calls, set by the first probe that passed
	// (NULL until then): a transfer on a thread with no context current
	// runs in the context of its buffer's memory (pfcf_read, pfcf_write).
	int (*ctx_get_current)(void **ctx);
	int (*pointer_context)(void *ctx, int attribute, unsigned long long ptr);
	int (*ctx_push)(void *ctx);
	int (*ctx_pop)(void **ctx);
} pfcf_lib;

// pfcf_load dlopens path and resolves every entry point. On failure it
// returns NULL and writes the reason to err (at most errlen bytes).
pfcf_lib *pfcf_load(const char *path, char *err, size_t errlen);

// pfcf_resolved writes the path the dynamic loader actually opened for l.
void pfcf_resolved(pfcf_lib *l, char *out, size_t outlen);

// pfcf_need_driver reports whether the CUDA driver library libcuda (a
// soname or path: "libcuda.so.1" but in tests) can be loaded; when not, it
// writes dlerror to err and returns 0.
int pfcf_need_driver(const char *libcuda, char *err, size_t errlen);

// Stages of pfcf_probe_io, the first one that failed.
enum {
	PFCF_PROBE_OK = 0,
	PFCF_PROBE_CUDA = 1,     // device memory: libcuda missing a call, or a call failed
	PFCF_PROBE_REGISTER = 2, // cuFileHandleRegister failed
	PFCF_PROBE_WRITE = 3,    // cuFileWrite failed or was short
	PFCF_PROBE_READ = 4,     // cuFileRead failed or was short
	PFCF_PROBE_COMPARE = 5,  // the bytes read back, or those in the file, differ
};

// pfcf_probe is what pfcf_probe_io found.
typedef struct {
	int stage;     // PFCF_PROBE_*
	char call[48]; // the call that failed
	long ret;      // its result: a cuFile status, a transfer's result, or a CUresult
	int err_no;    // errno, for a transfer that returned -1
	char msg[256]; // the loader's message, when libcuda lacks a call
} pfcf_probe;

// pfcf_probe_io checks that cuFile moves bytes between device memory and
// the file fd (open read-write, empty, never seen by cuFile): it registers
// fd, writes n bytes of a pattern from device memory at offset 0, reads
// them back into cleared device memory, and compares both the bytes read
// back and the file's own bytes (pread) with the pattern. Device memory
// comes from libcuda (cuMemAlloc in the context current on this thread,
// else in device 0's primary context), all on the calling thread, as CUDA
// contexts are per thread. Everything is released before it returns. A
// probe that passes binds the driver's context calls into l: from then on
// a transfer on a thread with no context current runs in the context of
// its buffer's memory, pushed for the call and popped after it, as the
// CUDA driver needs one current for device memory.
void pfcf_probe_io(pfcf_lib *l, const char *libcuda, int fd, size_t n, pfcf_probe *r);

// Outcomes of pfcf_canary.
enum {
	PFCF_CANARY_RETURNED = 0, // the call returned; *st holds its status
	PFCF_CANARY_TIMEOUT = 1,  // it did not return in time; the child was killed
	PFCF_CANARY_SIGNAL = 2,   // the child died of signal *sig
	PFCF_CANARY_EXIT = 3,     // the child exited without reporting
	PFCF_CANARY_NOFORK = 4,   // pipe or fork failed with errno *sig
};

// pfcf_canary calls cuFileDriverOpen in a forked child, which reports the
// status through a pipe (then closes the driver and exits), and tells
// whether and how the call came back within timeout_ms. The child is killed
// and reaped before it returns.
int pfcf_canary(pfcf_lib *l, int timeout_ms, pfcf_status *st, int *sig);

// Thin calls through the pointers, so Go never calls a C function pointer.
// File handles cross as integers: they are the library's values, and Go
// must never hold them as pointers.
pfcf_status pfcf_driver_open(pfcf_lib *l);
pfcf_status pfcf_handle_register(pfcf_lib *l, int fd, uintptr_t *fh);
void pfcf_handle_deregister(pfcf_lib *l, uintptr_t fh);
pfcf_status pfcf_buf_register(pfcf_lib *l, void *base, size_t len);
pfcf_status pfcf_buf_deregister(pfcf_lib *l, void *base);
ssize_t pfcf_read(pfcf_lib *l, uintptr_t fh, void *base, size_t size, off_t file_off, off_t buf_off);
ssize_t pfcf_write(pfcf_lib *l, uintptr_t fh, void *base, size_t size, off_t file_off, off_t buf_off);

// pfcf_aux calls a function the library exports beyond the cuFile API, of
// type long(long, long, long), storing its result in *out; it returns 0 when
// there is no such function. Only the fake libcufile of the tests exports
// such functions (its counters, call log and fault injection).
int pfcf_aux(pfcf_lib *l, const char *name, long a, long b, long c, long *out);

#endif
