// See cufile_shim.h. Kept small on purpose: loading, one probe that must
// survive a misbehaving library, and one-line calls through the pointers.
#define _GNU_SOURCE
#include "cufile_shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void put_err(char *err, size_t errlen, const char *prefix) {
	const char *e = dlerror();
	snprintf(err, errlen, "%s%s", prefix, e ? e : "unknown dlerror");
}

pfcf_lib *pfcf_load(const char *path, char *err, size_t errlen) {
	dlerror();
	void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!dl) {
		put_err(err, errlen, "");
		return NULL;
	}
	// From here on the library stays loaded, even when it turns out not to
	// be a libcufile: unloading libraries of this kind is not worth the risk.
	pfcf_lib *l = calloc(1, sizeof *l);
	if (!l) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	l->dl = dl;
	// cufile.h maps cuFileDriverClose to cuFileDriverClose_v2 where the
	// library has it; older libraries export only the plain name.
	*(void **)&l->driver_close = dlsym(dl, "cuFileDriverClose_v2");
	struct {
		void **slot;
		const char *name;
	} syms[] = {
		{(void **)&l->driver_open, "cuFileDriverOpen"},
		{(void **)&l->driver_close, "cuFileDriverClose"},
		{(void **)&l->handle_register, "cuFileHandleRegister"},
		{(void **)&l->handle_deregister, "cuFileHandleDeregister"},
		{(void **)&l->buf_register, "cuFileBufRegister"},
		{(void **)&l->buf_deregister, "cuFileBufDeregister"},
		{(void **)&l->read, "cuFileRead"},
		{(void **)&l->write, "cuFileWrite"},
	};
	for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		if (*syms[i].slot) {
			continue; // cuFileDriverClose_v2 found above
		}
		dlerror();
		*syms[i].slot = dlsym(dl, syms[i].name);
		if (!*syms[i].slot) {
			char prefix[96];
			snprintf(prefix, sizeof prefix, "missing symbol %s: ", syms[i].name);
			put_err(err, errlen, prefix);
			free(l);
			return NULL;
		}
	}
	return l;
}

void pfcf_resolved(pfcf_lib *l, char *out, size_t outlen) {
	struct link_map *lm = NULL;
	out[0] = 0;
	if (dlinfo(l->dl, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name) {
		snprintf(out, outlen, "%s", lm->l_name);
	}
}

int pfcf_need_driver(const char *libcuda, char *err, size_t errlen) {
	dlerror();
	// Kept loaded: libcufile loads the same library when it opens the driver.
	if (dlopen(libcuda, RTLD_LAZY | RTLD_LOCAL)) {
		return 1;
	}
	put_err(err, errlen, "");
	return 0;
}

static long now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int reap(pid_t pid) {
	int ws = 0;
	while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
	}
	return ws;
}

// The child runs only C: it never returns into the Go runtime, whose other
// threads do not exist in it, and leaves with _exit.
static void canary_child(pfcf_lib *l, int fd) {
	static const int crash[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP};
	sigset_t none;
	for (size_t i = 0; i < sizeof crash / sizeof crash[0]; i++) {
		signal(crash[i], SIG_DFL); // a crash kills the child, and says so
	}
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	pfcf_status st = l->driver_open();
	ssize_t n;
	do {
		n = write(fd, &st, sizeof st); // first, in case closing hangs
	} while (n < 0 && errno == EINTR);
	if (st.err == 0) {
		l->driver_close();
	}
	_exit(0);
}

int pfcf_canary(pfcf_lib *l, int timeout_ms, pfcf_status *st, int *sig) {
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0) {
		*sig = errno;
		return PFCF_CANARY_NOFORK;
	}
	pid_t pid = fork();
	if (pid < 0) {
		*sig = errno;
		close(p[0]);
		close(p[1]);
		return PFCF_CANARY_NOFORK;
	}
	if (pid == 0) {
		close(p[0]);
		canary_child(l, p[1]);
	}
	close(p[1]);

	long deadline = now_ms() + timeout_ms;
	int ready = 0;
	for (;;) {
		long left = deadline - now_ms();
		if (left <= 0) {
			break;
		}
		struct pollfd pfd = {.fd = p[0], .events = POLLIN};
		int r = poll(&pfd, 1, (int)left);
		if (r > 0) {
			ready = 1;
			break;
		}
		if (r < 0 && errno != EINTR) {
			break;
		}
	}
	int outcome = PFCF_CANARY_TIMEOUT;
	if (ready) {
		ssize_t n;
		do {
			n = read(p[0], st, sizeof *st);
		} while (n < 0 && errno == EINTR);
		outcome = n == (ssize_t)sizeof *st ? PFCF_CANARY_RETURNED : PFCF_CANARY_EXIT;
	}
	close(p[0]);
	if (outcome == PFCF_CANARY_EXIT) {
		// The pipe closed without a status: the child died first.
		int ws = reap(pid);
		if (WIFSIGNALED(ws)) {
			*sig = WTERMSIG(ws);
			return PFCF_CANARY_SIGNAL;
		}
		*sig = WIFEXITED(ws) ? WEXITSTATUS(ws) : 0;
		return PFCF_CANARY_EXIT;
	}
	// Returned or stuck: either way the child has nothing left to do. It
	// stays a zombie until reaped, so the pid cannot have been reused.
	kill(pid, SIGKILL);
	reap(pid);
	return outcome;
}

pfcf_status pfcf_driver_open(pfcf_lib *l) { return l->driver_open(); }

pfcf_status pfcf_handle_register(pfcf_lib *l, int fd, uintptr_t *fh) {
	pfcf_descr d;
	void *h = NULL;
	memset(&d, 0, sizeof d);
	d.type = PFCF_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = fd;
	pfcf_status st = l->handle_register(&h, &d);
	*fh = (uintptr_t)h;
	return st;
}

void pfcf_handle_deregister(pfcf_lib *l, uintptr_t fh) { l->handle_deregister((void *)fh); }

pfcf_status pfcf_buf_register(pfcf_lib *l, void *base, size_t len) {
	return l->buf_register(base, len, 0);
}

pfcf_status pfcf_buf_deregister(pfcf_lib *l, void *base) { return l->buf_deregister(base); }

// CU_POINTER_ATTRIBUTE_CONTEXT: the context a pointer's memory belongs to.
#define PFCF_POINTER_ATTRIBUTE_CONTEXT 1

// enter_buffer_context makes the context of base's memory current on this
// thread when none is (the Go core's threads never make one current; CUDA
// contexts are per thread) and returns it, to be popped after the
// transfer; NULL when nothing was pushed: a context is current already,
// no probe has bound the driver's calls, or base is not device memory.
static void *enter_buffer_context(pfcf_lib *l, const void *base) {
	int (*get)(void **) = __atomic_load_n(&l->ctx_get_current, __ATOMIC_ACQUIRE);
	void *cur = NULL, *ctx = NULL;
	if (!get || get(&cur) != 0 || cur) {
		return NULL;
	}
	int (*context_of)(void *, int, unsigned long long) = __atomic_load_n(&l->pointer_context, __ATOMIC_RELAXED);
	int (*push)(void *) = __atomic_load_n(&l->ctx_push, __ATOMIC_RELAXED);
	if (context_of(&ctx, PFCF_POINTER_ATTRIBUTE_CONTEXT, (unsigned long long)(uintptr_t)base) != 0 || !ctx) {
		return NULL;
	}
	return push(ctx) == 0 ? ctx : NULL;
}

static void leave_buffer_context(pfcf_lib *l, void *pushed) {
	if (pushed) {
		void *popped = NULL;
		int (*pop)(void **) = __atomic_load_n(&l->ctx_pop, __ATOMIC_RELAXED);
		pop(&popped);
	}
}

// transfer runs one cuFileRead or cuFileWrite in base's context.
static ssize_t transfer(pfcf_lib *l, int write, uintptr_t fh, void *base, size_t size, off_t file_off,
			off_t buf_off) {
	void *pushed = enter_buffer_context(l, base);
	ssize_t n = write ? l->write((void *)fh, base, size, file_off, buf_off)
			  : l->read((void *)fh, base, size, file_off, buf_off);
	int saved = errno;
	leave_buffer_context(l, pushed);
	errno = saved;
	return n;
}

ssize_t pfcf_read(pfcf_lib *l, uintptr_t fh, void *base, size_t size, off_t file_off, off_t buf_off) {
	return transfer(l, 0, fh, base, size, file_off, buf_off);
}

ssize_t pfcf_write(pfcf_lib *l, uintptr_t fh, void *base, size_t size, off_t file_off, off_t buf_off) {
	return transfer(l, 1, fh, base, size, file_off, buf_off);
}

// The CUDA driver calls the probe makes, resolved from libcuda.
typedef struct {
	int (*init)(unsigned);
	int (*device_get)(int *, int);
	int (*ctx_get_current)(void **);
	int (*primary_retain)(void **, int);
	int (*primary_release)(int);
	int (*ctx_push)(void *);
	int (*ctx_pop)(void **);
	int (*pointer_context)(void *, int, unsigned long long);
	int (*mem_alloc)(unsigned long long *, size_t);
	int (*mem_free)(unsigned long long);
	int (*htod)(unsigned long long, const void *, size_t);
	int (*dtoh)(void *, unsigned long long, size_t);
	int (*memset8)(unsigned long long, unsigned char, size_t);
} cuda_api;

static int probe_fail(pfcf_probe *r, int stage, const char *call, long ret, int err_no) {
	r->stage = stage;
	snprintf(r->call, sizeof r->call, "%s", call);
	r->ret = ret;
	r->err_no = err_no;
	return 0;
}

// load_cuda resolves the calls (the _v2 names are those cuda.h maps the
// plain ones to).
static int load_cuda(const char *libcuda, cuda_api *c, pfcf_probe *r) {
	dlerror();
	void *dl = dlopen(libcuda, RTLD_LAZY | RTLD_LOCAL);
	if (!dl) {
		put_err(r->msg, sizeof r->msg, "");
		return probe_fail(r, PFCF_PROBE_CUDA, "dlopen", 0, 0);
	}
	struct {
		void **slot;
		const char *name;
	} syms[] = {
		{(void **)&c->init, "cuInit"},
		{(void **)&c->device_get, "cuDeviceGet"},
		{(void **)&c->ctx_get_current, "cuCtxGetCurrent"},
		{(void **)&c->primary_retain, "cuDevicePrimaryCtxRetain"},
		{(void **)&c->primary_release, "cuDevicePrimaryCtxRelease_v2"},
		{(void **)&c->ctx_push, "cuCtxPushCurrent_v2"},
		{(void **)&c->ctx_pop, "cuCtxPopCurrent_v2"},
		{(void **)&c->pointer_context, "cuPointerGetAttribute"},
		{(void **)&c->mem_alloc, "cuMemAlloc_v2"},
		{(void **)&c->mem_free, "cuMemFree_v2"},
		{(void **)&c->htod, "cuMemcpyHtoD_v2"},
		{(void **)&c->dtoh, "cuMemcpyDtoH_v2"},
		{(void **)&c->memset8, "cuMemsetD8_v2"},
	};
	for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		dlerror();
		*syms[i].slot = dlsym(dl, syms[i].name);
		if (!*syms[i].slot) {
			put_err(r->msg, sizeof r->msg, "");
			return probe_fail(r, PFCF_PROBE_CUDA, syms[i].name, 0, 0);
		}
	}
	return 1;
}

// probe_transfer runs one cuFileRead or cuFileWrite of n bytes at offset 0
// and says whether it moved them all.
static int probe_transfer(pfcf_lib *l, int write, uintptr_t fh, unsigned long long dev, size_t n, pfcf_probe *r) {
	ssize_t got;
	do {
		errno = 0;
		got = write ? pfcf_write(l, fh, (void *)(uintptr_t)dev, n, 0, 0) : pfcf_read(l, fh, (void *)(uintptr_t)dev, n, 0, 0);
	} while (got == -1 && errno == EINTR);
	if (got == (ssize_t)n) {
		return 1;
	}
	return probe_fail(r, write ? PFCF_PROBE_WRITE : PFCF_PROBE_READ, write ? "cuFileWrite" : "cuFileRead", (long)got,
			  got == -1 ? errno : 0);
}

// probe_io_in runs the probe's transfers with device memory dev (n bytes)
// and host memory host and back (n bytes each, aligned for O_DIRECT).
static void probe_io_in(pfcf_lib *l, cuda_api *c, int fd, size_t n, unsigned long long dev, unsigned char *host,
			unsigned char *back, pfcf_probe *r) {
	int cr;
	for (size_t i = 0; i < n; i++) {
		host[i] = (unsigned char)(i * 131 + 7);
	}
	if ((cr = c->htod(dev, host, n)) != 0) {
		probe_fail(r, PFCF_PROBE_CUDA, "cuMemcpyHtoD", cr, 0);
		return;
	}
	uintptr_t fh = 0;
	pfcf_status st = pfcf_handle_register(l, fd, &fh);
	if (st.err != 0) {
		probe_fail(r, PFCF_PROBE_REGISTER, "cuFileHandleRegister", st.err, 0);
		r->err_no = st.cu_err; // the CUresult, for CU_FILE_CUDA_DRIVER_ERROR
		return;
	}
	if (!probe_transfer(l, 1, fh, dev, n, r)) {
		goto out;
	}
	if ((cr = c->memset8(dev, 0, n)) != 0) {
		probe_fail(r, PFCF_PROBE_CUDA, "cuMemsetD8", cr, 0);
		goto out;
	}
	if (!probe_transfer(l, 0, fh, dev, n, r)) {
		goto out;
	}
	if ((cr = c->dtoh(back, dev, n)) != 0) {
		probe_fail(r, PFCF_PROBE_CUDA, "cuMemcpyDtoH", cr, 0);
		goto out;
	}
	if (memcmp(host, back, n) != 0) {
		probe_fail(r, PFCF_PROBE_COMPARE, "cuFileRead", 0, 0);
		goto out;
	}
	memset(back, 0, n);
	if (pread(fd, back, n, 0) != (ssize_t)n || memcmp(host, back, n) != 0) {
		probe_fail(r, PFCF_PROBE_COMPARE, "cuFileWrite", 0, 0);
	}
out:
	pfcf_handle_deregister(l, fh);
}

void pfcf_probe_io(pfcf_lib *l, const char *libcuda, int fd, size_t n, pfcf_probe *r) {
	memset(r, 0, sizeof *r);
	cuda_api c;
	if (!load_cuda(libcuda, &c, r)) {
		return;
	}
	int cr;
	if ((cr = c.init(0)) != 0) {
		probe_fail(r, PFCF_PROBE_CUDA, "cuInit", cr, 0);
		return;
	}
	void *ctx = NULL, *pushed = NULL;
	if ((cr = c.ctx_get_current(&ctx)) != 0) {
		probe_fail(r, PFCF_PROBE_CUDA, "cuCtxGetCurrent", cr, 0);
		return;
	}
	if (!ctx) { // none current on this thread: device 0's primary context, as torch uses
		int dev0 = 0;
		if ((cr = c.device_get(&dev0, 0)) != 0) {
			probe_fail(r, PFCF_PROBE_CUDA, "cuDeviceGet", cr, 0);
			return;
		}
		if ((cr = c.primary_retain(&pushed, dev0)) != 0) {
			probe_fail(r, PFCF_PROBE_CUDA, "cuDevicePrimaryCtxRetain", cr, 0);
			return;
		}
		if ((cr = c.ctx_push(pushed)) != 0) {
			c.primary_release(dev0);
			probe_fail(r, PFCF_PROBE_CUDA, "cuCtxPushCurrent", cr, 0);
			return;
		}
	}
	unsigned long long dev = 0;
	unsigned char *host = NULL, *back = NULL;
	if ((cr = c.mem_alloc(&dev, n)) != 0) {
		probe_fail(r, PFCF_PROBE_CUDA, "cuMemAlloc", cr, 0);
	} else if (posix_memalign((void **)&host, 4096, n) != 0 || posix_memalign((void **)&back, 4096, n) != 0) {
		probe_fail(r, PFCF_PROBE_CUDA, "posix_memalign", 0, ENOMEM);
	} else {
		probe_io_in(l, &c, fd, n, dev, host, back, r);
	}
	free(host);
	free(back);
	if (dev) {
		c.mem_free(dev);
	}
	if (pushed) {
		c.ctx_pop(NULL);
		c.primary_release(0);
	}
	if (r->stage == PFCF_PROBE_OK) { // the transfers that follow run in their buffer's context
		__atomic_store_n(&l->pointer_context, c.pointer_context, __ATOMIC_RELAXED);
		__atomic_store_n(&l->ctx_push, c.ctx_push, __ATOMIC_RELAXED);
		__atomic_store_n(&l->ctx_pop, c.ctx_pop, __ATOMIC_RELAXED);
		__atomic_store_n(&l->ctx_get_current, c.ctx_get_current, __ATOMIC_RELEASE); // last: enables them
	}
}

int pfcf_aux(pfcf_lib *l, const char *name, long a, long b, long c, long *out) {
	long (*fn)(long, long, long);
	*(void **)&fn = dlsym(l->dl, name);
	if (!fn) {
		return 0;
	}
	*out = fn(a, b, c);
	return 1;
}
