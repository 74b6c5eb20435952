// A fake libcufile for the tests of the cufile engine: the cuFile calls the
// engine uses, served with pread/pwrite on host memory, plus counters, a
// call log and fault injection that the tests reach through extra exported
// functions, all of type long(long, long, long).
//
// Build: gcc -shared -fPIC -o libcufile.so.0 fakecufile.c
// (no -soname, so it never answers a dlopen of the real library's soname).
//
// What it checks, as the real library would reject it: the driver is open
// before a handle is registered, descriptors are of type OPAQUE_FD with no
// file system operations, handles are ones it handed out, a registered
// buffer is addressed through its registered base, and a buffer is
// registered at most once.
//
// Environment, read at each call of the function it names:
//   FAKECUFILE_DRIVER_OPEN=hang    never return
//   FAKECUFILE_DRIVER_OPEN=crash   die of SIGSEGV
//   FAKECUFILE_DRIVER_OPEN=<n>     fail with CUfileOpError n
//   FAKECUFILE_DRIVER_OPEN=noinit  what pip's libcufile does on a GPU machine
//                                  without GPUDirect Storage: print cuInit and
//                                  initialization errors to stderr, return
//                                  success, then refuse every handle with
//                                  CU_FILE_HANDLE_NOT_REGISTERED (5027)
//   FAKECUFILE_HANDLE_REGISTER=<n> every cuFileHandleRegister fails with n
//   FAKECUFILE_READ=<n>            every cuFileRead returns -n (a CUfileOpError)
//   FAKECUFILE_WRITE=<n>           every cuFileWrite returns -n
//   FAKECUFILE_CONTEXT=<libcuda>   cuFileRead and cuFileWrite need a CUDA context
//                                  current on the calling thread, as device memory
//                                  does: that of the fake libcuda loaded by this name
//                                  (else they return CU_FILE_CUDA_DRIVER_ERROR)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct {
	int err;
	int cu_err;
} status_t;

typedef struct {
	int type;
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} descr_t;

enum { // CUfileOpError values the fake returns
	DRIVER_NOT_INITIALIZED = 5001,
	CUDA_DRIVER_ERROR = 5011,
	INVALID_VALUE = 5022,
	MEMORY_ALREADY_REGISTERED = 5023,
	MEMORY_NOT_REGISTERED = 5024,
	HANDLE_NOT_REGISTERED = 5027,
	CUDA_POINTER_RANGE_ERROR = 5014,
};

enum { // operations, as the tests name them
	OP_DRIVER_OPEN = 1,
	OP_DRIVER_CLOSE = 2,
	OP_HANDLE_REGISTER = 3,
	OP_HANDLE_DEREGISTER = 4,
	OP_BUF_REGISTER = 5,
	OP_BUF_DEREGISTER = 6,
	OP_READ = 7,
	OP_WRITE = 8,
	OP_COUNT = 9,
};

enum { LOG_MAX = 1 << 16, BUF_MAX = 256, MAGIC = 0x6366 };

typedef struct {
	long op, a, size, file_off, buf_off, ret;
} entry_t;

typedef struct {
	int magic;
	int fd;     // the fd registered by the caller
	int own_fd; // our reopening of it without O_DIRECT, for unaligned pread/pwrite
} handle_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long calls[OP_COUNT];
static long driver_opened, handles;
static int driver_broken; // opened in "noinit" mode: handles are refused
static struct {
	long op, code, skip;
} fault;
static long short_left;
static entry_t log_[LOG_MAX];
static long log_len;
static struct {
	char *base;
	size_t len;
} bufs[BUF_MAX];
static long nbufs;

// record counts a call and logs it. Called with mu held.
static long record(long op, long a, long size, long file_off, long buf_off, long ret) {
	calls[op]++;
	if (log_len < LOG_MAX) {
		log_[log_len] = (entry_t){op, a, size, file_off, buf_off, ret};
	}
	return log_len++;
}

// injected returns the armed fault for op, or 0. Called with mu held.
static long injected(long op) {
	if (fault.op != op || fault.code == 0) {
		return 0;
	}
	if (fault.skip > 0) {
		fault.skip--;
		return 0;
	}
	long code = fault.code;
	fault.code = 0;
	return code;
}

static status_t st(int err) { return (status_t){err, 0}; }

// env_code returns the CUfileOpError the environment variable name asks
// for, or 0.
static long env_code(const char *name) {
	const char *v = getenv(name);
	return v && *v ? atol(v) : 0;
}

status_t cuFileDriverOpen(void) {
	const char *mode = getenv("FAKECUFILE_DRIVER_OPEN");
	if (mode && strcmp(mode, "hang") == 0) {
		for (;;) {
			pause();
		}
	}
	if (mode && strcmp(mode, "crash") == 0) {
		raise(SIGSEGV);
	}
	int noinit = mode && strcmp(mode, "noinit") == 0;
	if (noinit) { // the messages of pip's libcufile where cuInit fails
		fprintf(stderr, "cuInit Failed, error CUDA_ERROR_NOT_INITIALIZED\n");
		fprintf(stderr, "cuFile initialization failed\n");
	}
	pthread_mutex_lock(&mu);
	long code = injected(OP_DRIVER_OPEN);
	if (code == 0 && mode && *mode && !noinit) {
		code = atol(mode);
	}
	if (code == 0) {
		driver_opened++;
		driver_broken = noinit;
	}
	record(OP_DRIVER_OPEN, 0, 0, 0, 0, code);
	pthread_mutex_unlock(&mu);
	return st((int)code);
}

static status_t driver_close(void) {
	pthread_mutex_lock(&mu);
	record(OP_DRIVER_CLOSE, 0, 0, 0, 0, 0);
	if (driver_opened > 0) {
		driver_opened--;
	}
	pthread_mutex_unlock(&mu);
	return st(0);
}

status_t cuFileDriverClose(void) { return driver_close(); }
status_t cuFileDriverClose_v2(void) { return driver_close(); }

status_t cuFileHandleRegister(void **fh, descr_t *d) {
	pthread_mutex_lock(&mu);
	long code = injected(OP_HANDLE_REGISTER);
	if (!code && driver_opened == 0) {
		code = DRIVER_NOT_INITIALIZED;
	}
	if (!code && driver_broken) {
		code = HANDLE_NOT_REGISTERED;
	}
	if (!code) {
		code = env_code("FAKECUFILE_HANDLE_REGISTER");
	}
	if (!code && (d->type != 1 || d->fs_ops != NULL)) {
		code = INVALID_VALUE;
	}
	handle_t *h = NULL;
	if (!code) {
		char proc[64];
		snprintf(proc, sizeof proc, "/proc/self/fd/%d", d->handle.fd);
		int flags = fcntl(d->handle.fd, F_GETFL);
		int own = flags < 0 ? -1 : open(proc, (flags & O_ACCMODE) | O_CLOEXEC);
		h = own < 0 ? NULL : calloc(1, sizeof *h);
		if (h) {
			*h = (handle_t){MAGIC, d->handle.fd, own};
			*fh = h;
			handles++;
		} else {
			if (own >= 0) {
				close(own);
			}
			code = INVALID_VALUE;
		}
	}
	record(OP_HANDLE_REGISTER, d->handle.fd, 0, 0, 0, code);
	pthread_mutex_unlock(&mu);
	return st((int)code);
}

void cuFileHandleDeregister(void *fh) {
	handle_t *h = fh;
	pthread_mutex_lock(&mu);
	int ok = h && h->magic == MAGIC;
	record(OP_HANDLE_DEREGISTER, ok ? h->fd : -1, 0, 0, 0, ok ? 0 : HANDLE_NOT_REGISTERED);
	if (ok) {
		h->magic = 0;
		close(h->own_fd);
		free(h);
		handles--;
	}
	pthread_mutex_unlock(&mu);
}

status_t cuFileBufRegister(const void *base, size_t len, int flags) {
	(void)flags;
	pthread_mutex_lock(&mu);
	long code = injected(OP_BUF_REGISTER);
	for (long i = 0; !code && i < nbufs; i++) {
		if (bufs[i].base == base) {
			code = MEMORY_ALREADY_REGISTERED;
		}
	}
	if (!code && nbufs == BUF_MAX) {
		code = INVALID_VALUE;
	}
	if (!code) {
		bufs[nbufs].base = (char *)base;
		bufs[nbufs].len = len;
		nbufs++;
	}
	record(OP_BUF_REGISTER, (long)base, (long)len, 0, 0, code);
	pthread_mutex_unlock(&mu);
	return st((int)code);
}

status_t cuFileBufDeregister(const void *base) {
	pthread_mutex_lock(&mu);
	long code = MEMORY_NOT_REGISTERED;
	for (long i = 0; i < nbufs; i++) {
		if (bufs[i].base == base) {
			bufs[i] = bufs[--nbufs];
			code = 0;
			break;
		}
	}
	record(OP_BUF_DEREGISTER, (long)base, 0, 0, 0, code);
	pthread_mutex_unlock(&mu);
	return st((int)code);
}

// no_context reports whether FAKECUFILE_CONTEXT names a loaded libcuda in
// which no context is current on this thread.
static int no_context(void) {
	const char *name = getenv("FAKECUFILE_CONTEXT");
	if (!name || !*name) {
		return 0;
	}
	void *dl = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
	if (!dl) {
		return 0; // not loaded (yet): nothing can be current in it
	}
	int (*get)(void **) = (int (*)(void **))dlsym(dl, "cuCtxGetCurrent");
	void *ctx = NULL;
	int none = get && get(&ctx) == 0 && !ctx;
	dlclose(dl);
	return none;
}

// io serves cuFileRead and cuFileWrite: bytes moved, -1 with errno, or
// the negative of a CUfileOpError.
static ssize_t io(long op, void *fh, char *base, size_t size, off_t file_off, off_t buf_off) {
	handle_t *h = fh;
	int contextless = no_context();
	pthread_mutex_lock(&mu);
	long code = injected(op);
	if (!code && contextless) {
		code = CUDA_DRIVER_ERROR;
	}
	if (!code) {
		code = env_code(op == OP_READ ? "FAKECUFILE_READ" : "FAKECUFILE_WRITE");
	}
	if (!code && (!h || h->magic != MAGIC)) {
		code = HANDLE_NOT_REGISTERED;
	}
	// A registered buffer must be addressed through its registered base.
	char *p = base + buf_off;
	for (long i = 0; !code && i < nbufs; i++) {
		char *lo = bufs[i].base, *hi = lo + bufs[i].len;
		if (p >= lo && p < hi) {
			if (base != lo) {
				code = INVALID_VALUE;
			} else if (p + size > hi) {
				code = CUDA_POINTER_RANGE_ERROR;
			}
		}
	}
	long idx = record(op, (long)base, (long)size, (long)file_off, (long)buf_off, 0);
	if (!code && short_left > 0 && size >= 3) {
		short_left--;
		size /= 3;
	}
	pthread_mutex_unlock(&mu);

	ssize_t ret;
	int saved = 0;
	if (code < 0) { // an injected system error
		ret = -1;
		saved = (int)-code;
	} else if (code > 0) {
		ret = -code;
	} else {
		ret = op == OP_READ ? pread(h->own_fd, p, size, file_off) : pwrite(h->own_fd, p, size, file_off);
		saved = errno;
	}
	pthread_mutex_lock(&mu);
	if (idx < LOG_MAX) {
		log_[idx].ret = ret;
	}
	pthread_mutex_unlock(&mu);
	errno = saved;
	return ret;
}

ssize_t cuFileRead(void *fh, void *base, size_t size, off_t file_off, off_t buf_off) {
	return io(OP_READ, fh, base, size, file_off, buf_off);
}

ssize_t cuFileWrite(void *fh, const void *base, size_t size, off_t file_off, off_t buf_off) {
	return io(OP_WRITE, fh, (char *)base, size, file_off, buf_off);
}

// ---- control, for the tests ----

long fake_reset(long a, long b, long c) {
	(void)a, (void)b, (void)c;
	pthread_mutex_lock(&mu);
	memset(calls, 0, sizeof calls);
	memset(&fault, 0, sizeof fault);
	short_left = 0;
	log_len = 0;
	pthread_mutex_unlock(&mu);
	return 0;
}

// fake_calls returns how many times op was called.
long fake_calls(long op, long b, long c) {
	(void)b, (void)c;
	pthread_mutex_lock(&mu);
	long n = op > 0 && op < OP_COUNT ? calls[op] : -1;
	pthread_mutex_unlock(&mu);
	return n;
}

// fake_fail_next makes a call of op fail after skip calls went through:
// code > 0 returns that CUfileOpError, code < 0 returns -1 with errno -code.
long fake_fail_next(long op, long code, long skip) {
	pthread_mutex_lock(&mu);
	fault.op = op;
	fault.code = code;
	fault.skip = skip;
	pthread_mutex_unlock(&mu);
	return 0;
}

// fake_short_transfers makes the next n reads or writes of 3 bytes or more
// move a third of what they were asked for.
long fake_short_transfers(long n, long b, long c) {
	(void)b, (void)c;
	pthread_mutex_lock(&mu);
	short_left = n;
	pthread_mutex_unlock(&mu);
	return 0;
}

long fake_registered_handles(long a, long b, long c) {
	(void)a, (void)b, (void)c;
	pthread_mutex_lock(&mu);
	long n = handles;
	pthread_mutex_unlock(&mu);
	return n;
}

long fake_registered_bufs(long a, long b, long c) {
	(void)a, (void)b, (void)c;
	pthread_mutex_lock(&mu);
	long n = nbufs;
	pthread_mutex_unlock(&mu);
	return n;
}

long fake_driver_opened(long a, long b, long c) {
	(void)a, (void)b, (void)c;
	pthread_mutex_lock(&mu);
	long n = driver_opened;
	pthread_mutex_unlock(&mu);
	return n;
}

long fake_log_len(long a, long b, long c) {
	(void)a, (void)b, (void)c;
	pthread_mutex_lock(&mu);
	long n = log_len < LOG_MAX ? log_len : LOG_MAX;
	pthread_mutex_unlock(&mu);
	return n;
}

// fake_log_field returns field f of log entry i: 0 op, 1 fd (handle
// calls) or buffer base (buffer and transfer calls), 2 size, 3 file offset,
// 4 buffer offset, 5 result.
long fake_log_field(long i, long f, long c) {
	(void)c;
	pthread_mutex_lock(&mu);
	long v = -1;
	if (i >= 0 && i < log_len && i < LOG_MAX) {
		entry_t *e = &log_[i];
		long fields[] = {e->op, e->a, e->size, e->file_off, e->buf_off, e->ret};
		if (f >= 0 && f < 6) {
			v = fields[f];
		}
	}
	pthread_mutex_unlock(&mu);
	return v;
}
