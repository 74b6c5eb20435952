// A fake libcuda.so.1 for the tests of the cufile engine's probe: the few
// CUDA driver calls the probe makes to get device memory (see
// cufile_shim.c pfcf_probe_io), served from host memory so that the fake
// libcufile beside it can pread and pwrite "device" memory.
//
// Build: gcc -shared -fPIC -o libcuda.so.1 fakecuda.c
//
// What it checks, as the real driver would reject it: cuInit comes first,
// memory calls need a context current on the calling thread (contexts are
// per thread in CUDA), and only memory it handed out is copied or freed.
//
// Environment, read at each call: FAKECUDA_MEMALLOC=<n> makes cuMemAlloc
// fail with CUresult n.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
};

static int inited;
static int primary; // the primary context of device 0, as an address
static __thread void *current;

int pyfastensor_fake_libcuda; // lets a test tell this library from a real one

CUresult cuInit(unsigned flags) {
	(void)flags;
	inited = 1;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(int *dev, int ordinal) {
	if (!inited) {
		return CUDA_ERROR_NOT_INITIALIZED;
	}
	if (ordinal != 0) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	*dev = 0;
	return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(void **ctx) {
	if (!inited) {
		return CUDA_ERROR_NOT_INITIALIZED;
	}
	*ctx = current;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
	if (!inited) {
		return CUDA_ERROR_NOT_INITIALIZED;
	}
	if (dev != 0) {
		return CUDA_ERROR_INVALID_DEVICE;
	}
	*ctx = &primary;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }

CUresult cuCtxPushCurrent_v2(void *ctx) {
	if (ctx != &primary) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	current = ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(void **ctx) {
	if (!current) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	if (ctx) {
		*ctx = current;
	}
	current = NULL;
	return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	const char *fail = getenv("FAKECUDA_MEMALLOC");
	if (fail && *fail) {
		return atoi(fail);
	}
	if (!current) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	void *m = malloc(n ? n : 1);
	if (!m) {
		return 2; // CUDA_ERROR_OUT_OF_MEMORY
	}
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	if (!current) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	free((void *)(uintptr_t)p);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	if (!current) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	memcpy((void *)(uintptr_t)dst, src, n);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	if (!current) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	memcpy(dst, (void *)(uintptr_t)src, n);
	return CUDA_SUCCESS;
}

// cuPointerGetAttribute answers CU_POINTER_ATTRIBUTE_CONTEXT (1) only: every
// pointer is taken for memory of device 0's primary context (the tests'
// "device memory" is host memory).
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr p) {
	if (!inited) {
		return CUDA_ERROR_NOT_INITIALIZED;
	}
	if (attribute != 1 || !p) {
		return CUDA_ERROR_INVALID_VALUE;
	}
	*(void **)data = &primary;
	return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
	if (!current) {
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	memset((void *)(uintptr_t)dst, v, n);
	return CUDA_SUCCESS;
}
