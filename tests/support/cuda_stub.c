/* SPDX-License-Identifier: Apache-2.0 */
/* A stand-in for libcuda.so.1, for tests without a GPU: the driver API
 * entry points Ferry calls (src/util/cuda_driver.h), over host memory.
 *
 * "Device memory" (cuda_stub_alloc) is a memfd mapped twice: the pointer
 * handed out is mapped PROT_NONE, so a CPU touch crashes the test, and the
 * bytes are reached through a second, read-write mapping (cuda_stub_alias).
 * Copies need the allocation's context current on the calling thread, as a
 * real driver does, and count what they did (cuda_stub_counts). Built twice
 * by tests/cuda.cmake: libcuda_stub.so, and libcuda_stub_partial.so without
 * cuMemcpyHtoD_v2 (a driver that lacks an entry point). Knobs, read at
 * cuInit: FERRY_CUDA_STUB_INIT_ERROR (cuInit's result), FERRY_CUDA_STUB_DEVICES
 * (the device count, default 2). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util/cuda_driver.h"

#define STUB_API __attribute__((visibility("default")))
#define MAX_ALLOCS 32
#define MAX_DEVICES 4
#define STUB_MANAGED 1 /* cuda_stub_alloc flags: managed memory (CPU-accessible) */
#define STUB_NO_CONTEXT 2 /* no context attribute (as cuMemCreate memory): primary context */

struct CUctx_st {
    int device;
};

static struct CUctx_st contexts[MAX_DEVICES] = {{0}, {1}, {2}, {3}};
static int devices = 2;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc {
    uintptr_t base;
    size_t len;
    unsigned char *alias;
    int device, flags;
} allocs[MAX_ALLOCS];
static _Thread_local FERRY_CUcontext stack[8];
static _Thread_local int depth;
static _Atomic unsigned long counts[7]; /* dtoh, htod, syncs, pushes, pops, retains, releases */

STUB_API void *cuda_stub_alloc(size_t len, int device, int flags)
{
    int fd = memfd_create("cuda_stub", 0);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) return NULL;
    void *dev = mmap(NULL, len, (flags & STUB_MANAGED) ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_SHARED, fd, 0);
    void *alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (dev == MAP_FAILED || alias == MAP_FAILED) return NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].base == 0) {
            allocs[i] = (struct alloc){(uintptr_t)dev, len, alias, device, flags};
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return dev;
}

static struct alloc *find(uintptr_t p, size_t n)
{
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].base && p >= allocs[i].base && p - allocs[i].base < allocs[i].len &&
            n <= allocs[i].len - (p - allocs[i].base))
            return &allocs[i];
    return NULL;
}

STUB_API void *cuda_stub_alias(void *p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p, 1);
    void *alias = a ? a->alias + ((uintptr_t)p - a->base) : NULL;
    pthread_mutex_unlock(&lock);
    return alias;
}

STUB_API void cuda_stub_free(void *p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p, 1);
    if (a) {
        munmap((void *)a->base, a->len);
        munmap(a->alias, a->len);
        memset(a, 0, sizeof *a);
    }
    pthread_mutex_unlock(&lock);
}

STUB_API void cuda_stub_counts(unsigned long out[7])
{
    for (int i = 0; i < 7; i++) out[i] = atomic_load(&counts[i]);
}

STUB_API FERRY_CUresult cuInit(unsigned int flags)
{
    (void)flags;
    const char *n = getenv("FERRY_CUDA_STUB_DEVICES");
    devices = n ? atoi(n) : 2;
    if (devices > MAX_DEVICES) devices = MAX_DEVICES;
    const char *e = getenv("FERRY_CUDA_STUB_INIT_ERROR");
    return e ? atoi(e) : FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuDeviceGetCount(int *n)
{
    *n = devices;
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuDeviceGet(FERRY_CUdevice *dev, int ordinal)
{
    if (ordinal < 0 || ordinal >= devices) return FERRY_CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuGetErrorName(FERRY_CUresult err, const char **name)
{
    switch (err) {
    case FERRY_CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case FERRY_CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case FERRY_CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case FERRY_CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    case FERRY_CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
    default: *name = NULL; return FERRY_CUDA_ERROR_INVALID_VALUE;
    }
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuGetErrorString(FERRY_CUresult err, const char **text)
{
    *text = err == FERRY_CUDA_SUCCESS ? "no error" : "stub driver error";
    return FERRY_CUDA_SUCCESS;
}

/* Unknown addresses get zero values and success, as the real driver does. */
STUB_API FERRY_CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, FERRY_CUdeviceptr ptr)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)ptr, 1);
    struct alloc copy = a ? *a : (struct alloc){0};
    pthread_mutex_unlock(&lock);
    for (unsigned int i = 0; i < n; i++) {
        switch (attrs[i]) {
        case FERRY_CU_POINTER_ATTRIBUTE_CONTEXT:
            *(FERRY_CUcontext *)data[i] = a && !(copy.flags & STUB_NO_CONTEXT) ? &contexts[copy.device] : NULL;
            break;
        case FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            /* Managed memory is reported as device memory, the hard case. */
            *(unsigned int *)data[i] = a ? FERRY_CU_MEMORYTYPE_DEVICE : 0;
            break;
        case FERRY_CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(unsigned char *)data[i] = (copy.flags & STUB_MANAGED) != 0; /* a bool, one byte */
            break;
        case FERRY_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data[i] = a ? copy.device : -2; break;
        default: return FERRY_CUDA_ERROR_INVALID_VALUE;
        }
    }
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuDevicePrimaryCtxRetain(FERRY_CUcontext *ctx, FERRY_CUdevice dev)
{
    if (dev < 0 || dev >= devices) return FERRY_CUDA_ERROR_INVALID_DEVICE;
    *ctx = &contexts[dev];
    atomic_fetch_add(&counts[5], 1);
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuDevicePrimaryCtxRelease_v2(FERRY_CUdevice dev)
{
    (void)dev;
    atomic_fetch_add(&counts[6], 1);
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuCtxPushCurrent_v2(FERRY_CUcontext ctx)
{
    if (!ctx || depth == 8) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    stack[depth++] = ctx;
    atomic_fetch_add(&counts[3], 1);
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuCtxPopCurrent_v2(FERRY_CUcontext *ctx)
{
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    *ctx = stack[--depth];
    atomic_fetch_add(&counts[4], 1);
    return FERRY_CUDA_SUCCESS;
}

/* The device side of a copy: in one allocation of the current context's
 * device, or the error a real driver gives. */
static FERRY_CUresult device_bytes(FERRY_CUdeviceptr p, size_t n, unsigned char **bytes)
{
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p, n);
    FERRY_CUresult err = !a ? FERRY_CUDA_ERROR_INVALID_VALUE
                         : a->device != stack[depth - 1]->device ? FERRY_CUDA_ERROR_INVALID_CONTEXT
                                                                 : FERRY_CUDA_SUCCESS;
    if (a) *bytes = a->alias + ((uintptr_t)p - a->base);
    pthread_mutex_unlock(&lock);
    return err;
}

STUB_API FERRY_CUresult cuMemcpyDtoH_v2(void *dst, FERRY_CUdeviceptr src, size_t n)
{
    unsigned char *bytes;
    FERRY_CUresult err = device_bytes(src, n, &bytes);
    if (err) return err;
    memcpy(dst, bytes, n);
    atomic_fetch_add(&counts[0], 1);
    return FERRY_CUDA_SUCCESS;
}

#ifndef CUDA_STUB_PARTIAL
STUB_API FERRY_CUresult cuMemcpyHtoD_v2(FERRY_CUdeviceptr dst, const void *src, size_t n)
{
    unsigned char *bytes;
    FERRY_CUresult err = device_bytes(dst, n, &bytes);
    if (err) return err;
    memcpy(bytes, src, n);
    atomic_fetch_add(&counts[1], 1);
    return FERRY_CUDA_SUCCESS;
}
#endif

STUB_API FERRY_CUresult cuStreamSynchronize(void *stream)
{
    (void)stream;
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    atomic_fetch_add(&counts[2], 1);
    return FERRY_CUDA_SUCCESS;
}
