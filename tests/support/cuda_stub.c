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
 * (the device count, default 2); and FERRY_CUDA_STUB_COPY_DELAY_US, read
 * at each stream synchronize (each stream copy takes that long, to hold a
 * transfer in flight).
 *
 * IPC between processes (cuIpcGetMemHandle / cuIpcOpenMemHandle): the
 * allocation's memfd stays open in the exporter, and the handle names it by
 * pid, descriptor and inode; the importer opens /proc/<pid>/fd/<fd> (same
 * user), checks the inode (a freed allocation's descriptor may be reused)
 * and maps it as "device memory" of its current context's device. As a
 * real driver: a handle cannot be opened in the process that made it, nor
 * twice in one process (ALREADY_MAPPED), and only an allocation's base
 * can be exported. Stream copies (cuMemcpyAsync) are queued on the stream
 * and done only when it is synchronized, so a caller that reports a copy
 * complete without waiting for it finds the bytes missing.
 *
 * VMM (cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess, ...):
 * an allocation handle is a memfd; a mapping is "device memory" without a
 * context (as the real driver's), copies to or from it fail until
 * cuMemSetAccess, cuIpcGetMemHandle refuses it, cuMemRetainAllocationHandle
 * accepts only it, cuMemExportToShareableHandle gives a duplicate of the
 * memfd (only for an allocation created with the POSIX descriptor handle
 * type) and cuMemImportFromShareableHandle takes one
 * (cuda_stub_vmm_counts). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/cuda_driver.h"

#define STUB_API __attribute__((visibility("default")))
#define MAX_ALLOCS 128
#define MAX_DEVICES 4
#define MAX_PINNED 64
#define STREAM_QUEUE 64
#define STUB_MANAGED 1 /* cuda_stub_alloc flags: managed memory (CPU-accessible) */
#define STUB_NO_CONTEXT 2 /* no context attribute (as cuMemCreate memory): primary context */
#define STUB_IMPORTED 0x100 /* internal: mapped from another process's IPC handle */
#define STUB_VMM 0x200 /* internal: a cuMemMap mapping */
#define MAX_PHYS 64
#define MAX_RESERVED 64

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
    int fd;            /* the memfd, kept open so that an IPC handle can name it; -1 imported */
    uint64_t ino;      /* its inode */
    int32_t from_pid;  /* imported: the exporter */
    int phys;          /* VMM: the mapped allocation's handle */
    bool accessible;   /* VMM: cuMemSetAccess done */
} allocs[MAX_ALLOCS];
/* VMM allocation handles (handle = index + 1) and reserved address ranges. */
static struct phys {
    int fd, device, handle_types, refs;
    size_t len;
    bool imported;
} phys[MAX_PHYS];
static struct {
    uintptr_t base;
    size_t len;
} reserved[MAX_RESERVED];
static _Atomic unsigned long vmm_counts[3]; /* exports, imports, imported allocations released */
static _Thread_local FERRY_CUcontext stack[8];
static _Thread_local int depth;
static _Atomic unsigned long counts[7]; /* dtoh, htod, syncs, pushes, pops, retains, releases */
/* ipc_get, ipc_open, ipc_close, async copies, host registers, host unregisters, host allocs, host frees */
static _Atomic unsigned long more_counts[8];

/* The handle's bytes (64): who exported which memfd. */
struct stub_ipc_handle {
    char magic[8];
    int32_t pid, fd;
    uint64_t ino, len;
    int32_t device;
    char pad[FERRY_CU_IPC_HANDLE_SIZE - 36];
};
_Static_assert(sizeof(struct stub_ipc_handle) == FERRY_CU_IPC_HANDLE_SIZE, "handle size");

/* Under lock: the first free slot, or NULL. */
static struct alloc *free_slot(void)
{
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].base == 0) return &allocs[i];
    return NULL;
}

static void *alloc_at(void *want, size_t len, int device, int flags);

STUB_API void *cuda_stub_alloc(size_t len, int device, int flags) { return alloc_at(NULL, len, device, flags); }

/* The same at the address want (free there): memory allocated again where
 * freed memory was, as a real allocator may. */
STUB_API void *cuda_stub_alloc_at(void *want, size_t len, int device) { return alloc_at(want, len, device, 0); }

static void *alloc_at(void *want, size_t len, int device, int flags)
{
    int fd = memfd_create("cuda_stub", MFD_CLOEXEC);
    struct stat st;
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    void *dev = mmap(want, len, (flags & STUB_MANAGED) ? PROT_READ | PROT_WRITE : PROT_NONE,
                     MAP_SHARED | (want ? MAP_FIXED_NOREPLACE : 0), fd, 0);
    void *alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (dev == MAP_FAILED || alias == MAP_FAILED || (want && dev != want)) {
        if (dev != MAP_FAILED) munmap(dev, len);
        if (alias != MAP_FAILED) munmap(alias, len);
        close(fd);
        return NULL;
    }
    pthread_mutex_lock(&lock);
    struct alloc *a = free_slot();
    if (a) *a = (struct alloc){(uintptr_t)dev, len, alias, device, flags, fd, (uint64_t)st.st_ino, 0, 0, false};
    pthread_mutex_unlock(&lock);
    if (!a) {
        munmap(dev, len);
        munmap(alias, len);
        close(fd);
        return NULL;
    }
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
    if (a && !(a->flags & (STUB_IMPORTED | STUB_VMM))) {
        munmap((void *)a->base, a->len);
        munmap(a->alias, a->len);
        close(a->fd);
        memset(a, 0, sizeof *a);
    }
    pthread_mutex_unlock(&lock);
}

STUB_API void cuda_stub_counts(unsigned long out[7])
{
    for (int i = 0; i < 7; i++) out[i] = atomic_load(&counts[i]);
}

/* ipc_get, ipc_open, ipc_close, async copies, host registers, host
 * unregisters, host allocs, host frees. */
STUB_API void cuda_stub_more_counts(unsigned long out[8])
{
    for (int i = 0; i < 8; i++) out[i] = atomic_load(&more_counts[i]);
}

/* A test's own accesses to device bytes (through cuda_stub_alias) in step
 * with the stub's stream copies: TSan then sees the order that the
 * transfer's answer, over a socket from another process, gave them. */
STUB_API void cuda_stub_lock(void) { pthread_mutex_lock(&lock); }
STUB_API void cuda_stub_unlock(void) { pthread_mutex_unlock(&lock); }

/* Handles of other processes mapped here now. */
STUB_API int cuda_stub_imported(void)
{
    int n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++) n += allocs[i].base && (allocs[i].flags & STUB_IMPORTED);
    pthread_mutex_unlock(&lock);
    return n;
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
    case FERRY_CUDA_ERROR_ALREADY_MAPPED: *name = "CUDA_ERROR_ALREADY_MAPPED"; break;
    case FERRY_CUDA_ERROR_INVALID_HANDLE: *name = "CUDA_ERROR_INVALID_HANDLE"; break;
    case FERRY_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: *name = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"; break;
    default: *name = NULL; return FERRY_CUDA_ERROR_INVALID_VALUE;
    }
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuGetErrorString(FERRY_CUresult err, const char **text)
{
    *text = err == FERRY_CUDA_SUCCESS ? "no error" : "stub driver error";
    return FERRY_CUDA_SUCCESS;
}

/* Page-locked host memory (cuMemHostRegister, cuMemAllocHost). */
static struct {
    uintptr_t base;
    size_t len;
    bool allocated;
} pinned_ranges[MAX_PINNED];

/* Under lock: the pinned range holding p, or -1. */
static int pinned_find(uintptr_t p)
{
    for (int i = 0; i < MAX_PINNED; i++)
        if (pinned_ranges[i].base && p - pinned_ranges[i].base < pinned_ranges[i].len) return i;
    return -1;
}

/* Unknown addresses get zero values and success, as the real driver does. */
STUB_API FERRY_CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, FERRY_CUdeviceptr ptr)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)ptr, 1);
    struct alloc copy = a ? *a : (struct alloc){0};
    bool pinned = !a && pinned_find((uintptr_t)ptr) >= 0;
    pthread_mutex_unlock(&lock);
    for (unsigned int i = 0; i < n; i++) {
        switch (attrs[i]) {
        case FERRY_CU_POINTER_ATTRIBUTE_CONTEXT:
            *(FERRY_CUcontext *)data[i] = a && !(copy.flags & STUB_NO_CONTEXT) ? &contexts[copy.device]
                                          : pinned                            ? &contexts[0]
                                                                              : NULL;
            break;
        case FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            /* Managed memory is reported as device memory, the hard case. */
            *(unsigned int *)data[i] = a ? FERRY_CU_MEMORYTYPE_DEVICE : pinned ? FERRY_CU_MEMORYTYPE_HOST : 0;
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

STUB_API FERRY_CUresult cuCtxGetCurrent(FERRY_CUcontext *ctx)
{
    *ctx = depth ? stack[depth - 1] : NULL;
    return FERRY_CUDA_SUCCESS;
}

/* The device side of a copy: in one allocation of the current context's
 * device, or the error a real driver gives. */
static FERRY_CUresult device_bytes(FERRY_CUdeviceptr p, size_t n, unsigned char **bytes)
{
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p, n);
    FERRY_CUresult err = !a || ((a->flags & STUB_VMM) && !a->accessible) ? FERRY_CUDA_ERROR_INVALID_VALUE
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

static void stream_drain(struct CUstream_st *s);

/* NULL: the legacy stream (the synchronous copies above are done); a
 * stream of cuStreamCreate: its queued copies are done now. */
STUB_API FERRY_CUresult cuStreamSynchronize(void *stream)
{
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    if (stream) stream_drain(stream);
    atomic_fetch_add(&counts[2], 1);
    return FERRY_CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ IPC */

STUB_API FERRY_CUresult cuMemGetAddressRange_v2(FERRY_CUdeviceptr *base, size_t *size, FERRY_CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p, 1);
    if (a) {
        if (base) *base = a->base;
        if (size) *size = a->len;
    }
    pthread_mutex_unlock(&lock);
    return a ? FERRY_CUDA_SUCCESS : FERRY_CUDA_ERROR_INVALID_VALUE;
}

STUB_API FERRY_CUresult cuIpcGetMemHandle(FERRY_CUipcMemHandle *handle, FERRY_CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p, 1);
    FERRY_CUresult err = FERRY_CUDA_SUCCESS;
    if (!a || a->base != (uintptr_t)p || (a->flags & (STUB_MANAGED | STUB_IMPORTED | STUB_VMM)))
        err = FERRY_CUDA_ERROR_INVALID_VALUE; /* only the base of this process's own cuMemAlloc */
    else {
        struct stub_ipc_handle h = {.magic = "FRYSTUB", .pid = (int32_t)getpid(), .fd = a->fd, .ino = a->ino,
                                    .len = a->len, .device = a->device};
        memcpy(handle, &h, sizeof h);
    }
    pthread_mutex_unlock(&lock);
    if (!err) atomic_fetch_add(&more_counts[0], 1);
    return err;
}

STUB_API FERRY_CUresult cuIpcOpenMemHandle_v2(FERRY_CUdeviceptr *p, FERRY_CUipcMemHandle handle, unsigned int flags)
{
    struct stub_ipc_handle h;
    memcpy(&h, &handle, sizeof h);
    if (memcmp(h.magic, "FRYSTUB", 8) != 0 || h.len == 0 || flags != FERRY_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        return FERRY_CUDA_ERROR_INVALID_VALUE;
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    if (h.pid == (int32_t)getpid()) return FERRY_CUDA_ERROR_INVALID_CONTEXT; /* not in the exporting process */
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].base && (allocs[i].flags & STUB_IMPORTED) && allocs[i].from_pid == h.pid &&
            allocs[i].ino == h.ino) {
            pthread_mutex_unlock(&lock);
            return FERRY_CUDA_ERROR_ALREADY_MAPPED;
        }
    pthread_mutex_unlock(&lock);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return FERRY_CUDA_ERROR_INVALID_HANDLE; /* the exporter or its allocation is gone */
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != h.ino || (uint64_t)st.st_size != h.len) {
        close(fd);
        return FERRY_CUDA_ERROR_INVALID_HANDLE; /* the descriptor now names another file */
    }
    void *dev = mmap(NULL, h.len, PROT_NONE, MAP_SHARED, fd, 0);
    void *alias = mmap(NULL, h.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (dev == MAP_FAILED || alias == MAP_FAILED) return FERRY_CUDA_ERROR_MAP_FAILED;
    pthread_mutex_lock(&lock);
    struct alloc *a = free_slot();
    if (a)
        *a = (struct alloc){(uintptr_t)dev, h.len, alias, stack[depth - 1]->device, STUB_IMPORTED, -1, h.ino, h.pid, 0, false};
    pthread_mutex_unlock(&lock);
    if (!a) {
        munmap(dev, h.len);
        munmap(alias, h.len);
        return FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (FERRY_CUdeviceptr)(uintptr_t)dev;
    atomic_fetch_add(&more_counts[1], 1);
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuIpcCloseMemHandle(FERRY_CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p, 1);
    FERRY_CUresult err = FERRY_CUDA_ERROR_INVALID_VALUE;
    if (a && a->base == (uintptr_t)p && (a->flags & STUB_IMPORTED)) {
        munmap((void *)a->base, a->len);
        munmap(a->alias, a->len);
        memset(a, 0, sizeof *a);
        err = FERRY_CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    if (!err) atomic_fetch_add(&more_counts[2], 1);
    return err;
}

/* -------------------------------------------------------------- streams */

struct CUstream_st {
    int device;
    int n;
    struct {
        unsigned char *dst;
        const unsigned char *src;
        size_t len;
    } queued[STREAM_QUEUE];
};

STUB_API FERRY_CUresult cuStreamCreate(FERRY_CUstream *stream, unsigned int flags)
{
    (void)flags;
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    s->device = stack[depth - 1]->device;
    *stream = s;
    return FERRY_CUDA_SUCCESS;
}

static void stream_drain(struct CUstream_st *s)
{
    const char *d = getenv("FERRY_CUDA_STUB_COPY_DELAY_US"); /* read each time: a test sets it in a child */
    unsigned copy_delay_us = d ? (unsigned)atoi(d) : 0;
    for (int i = 0; i < s->n; i++) {
        if (copy_delay_us) usleep(copy_delay_us);
        pthread_mutex_lock(&lock); /* "the device" writes in order with cuda_stub_lock's holders */
        memmove(s->queued[i].dst, s->queued[i].src, s->queued[i].len);
        pthread_mutex_unlock(&lock);
    }
    s->n = 0;
}

STUB_API FERRY_CUresult cuStreamDestroy_v2(FERRY_CUstream stream)
{
    if (!stream) return FERRY_CUDA_ERROR_INVALID_HANDLE;
    stream_drain(stream); /* as the driver: queued work completes first */
    free(stream);
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuStreamQuery(FERRY_CUstream stream)
{
    return stream && stream->n ? 600 /* CUDA_ERROR_NOT_READY */ : FERRY_CUDA_SUCCESS;
}

/* Where the bytes of [p, p+n) are: an allocation's alias (device memory,
 * this process's or imported), or p itself (host memory, pinned or not). */
static unsigned char *bytes_of(FERRY_CUdeviceptr p, size_t n)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p, 1);
    unsigned char *b = !a ? (unsigned char *)(uintptr_t)p
                       : (a->flags & STUB_VMM) && !a->accessible ? NULL /* no cuMemSetAccess yet */
                       : n <= a->len - ((uintptr_t)p - a->base) ? a->alias + ((uintptr_t)p - a->base)
                                                                 : NULL;
    pthread_mutex_unlock(&lock);
    return b;
}

STUB_API FERRY_CUresult cuMemcpyAsync(FERRY_CUdeviceptr dst, FERRY_CUdeviceptr src, size_t n, FERRY_CUstream stream)
{
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    if (!stream) return FERRY_CUDA_ERROR_INVALID_VALUE; /* Ferry always names its own stream */
    unsigned char *d = bytes_of(dst, n);
    const unsigned char *s = bytes_of(src, n);
    if (!d || !s || !dst || !src) return FERRY_CUDA_ERROR_INVALID_VALUE;
    if (stream->n == STREAM_QUEUE) stream_drain(stream);
    stream->queued[stream->n].dst = d;
    stream->queued[stream->n].src = s;
    stream->queued[stream->n].len = n;
    stream->n++;
    atomic_fetch_add(&more_counts[3], 1);
    return FERRY_CUDA_SUCCESS;
}

/* ---------------------------------------------------- page-locked memory */

static FERRY_CUresult pin(void *p, size_t n, bool allocated)
{
    if (!p || n == 0) return FERRY_CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    FERRY_CUresult err = FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    if (pinned_find((uintptr_t)p) >= 0 || pinned_find((uintptr_t)p + n - 1) >= 0)
        err = FERRY_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else
        for (int i = 0; i < MAX_PINNED; i++)
            if (!pinned_ranges[i].base) {
                pinned_ranges[i].base = (uintptr_t)p;
                pinned_ranges[i].len = n;
                pinned_ranges[i].allocated = allocated;
                err = FERRY_CUDA_SUCCESS;
                break;
            }
    pthread_mutex_unlock(&lock);
    return err;
}

static FERRY_CUresult unpin(void *p, bool allocated)
{
    pthread_mutex_lock(&lock);
    int i = pinned_find((uintptr_t)p);
    FERRY_CUresult err = FERRY_CUDA_ERROR_INVALID_VALUE;
    if (i >= 0 && pinned_ranges[i].base == (uintptr_t)p && pinned_ranges[i].allocated == allocated) {
        memset(&pinned_ranges[i], 0, sizeof pinned_ranges[i]);
        err = FERRY_CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return err;
}

STUB_API FERRY_CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags)
{
    (void)flags;
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    FERRY_CUresult err = pin(p, n, false);
    if (!err) atomic_fetch_add(&more_counts[4], 1);
    return err;
}

STUB_API FERRY_CUresult cuMemHostUnregister(void *p)
{
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    FERRY_CUresult err = unpin(p, false);
    if (!err) atomic_fetch_add(&more_counts[5], 1);
    return err;
}

STUB_API FERRY_CUresult cuMemAllocHost_v2(void **p, size_t n)
{
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    void *m = NULL;
    if (n == 0 || posix_memalign(&m, 4096, n) != 0) return FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    FERRY_CUresult err = pin(m, n, true);
    if (err) {
        free(m);
        return err;
    }
    *p = m;
    atomic_fetch_add(&more_counts[6], 1);
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuMemFreeHost(void *p)
{
    if (depth == 0) return FERRY_CUDA_ERROR_INVALID_CONTEXT;
    FERRY_CUresult err = unpin(p, true);
    if (err) return err;
    free(p);
    atomic_fetch_add(&more_counts[7], 1);
    return FERRY_CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ VMM */

STUB_API void cuda_stub_vmm_counts(unsigned long out[3])
{
    for (int i = 0; i < 3; i++) out[i] = atomic_load(&vmm_counts[i]);
}

/* Under lock: the allocation of handle h, or NULL. */
static struct phys *phys_of(FERRY_CUmemGenericAllocationHandle h)
{
    return h >= 1 && h <= MAX_PHYS && phys[h - 1].refs > 0 ? &phys[h - 1] : NULL;
}

/* Under lock: a new handle for the memfd fd (taken), or 0. */
static FERRY_CUmemGenericAllocationHandle phys_new(int fd, size_t len, int device, int types, bool imported)
{
    for (int i = 0; i < MAX_PHYS; i++)
        if (phys[i].refs == 0) {
            phys[i] = (struct phys){fd, device, types, 1, len, imported};
            return (FERRY_CUmemGenericAllocationHandle)i + 1;
        }
    return 0;
}

/* Under lock: drops one reference to p. */
static void phys_put(struct phys *p)
{
    if (--p->refs > 0) return;
    close(p->fd);
    if (p->imported) atomic_fetch_add(&vmm_counts[2], 1);
    memset(p, 0, sizeof *p);
}

STUB_API FERRY_CUresult cuMemCreate(FERRY_CUmemGenericAllocationHandle *h, size_t size,
                                    const FERRY_CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!h || size == 0 || flags || prop->type != FERRY_CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != FERRY_CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
        prop->location.id >= devices)
        return FERRY_CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("cuda_stub_vmm", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) close(fd);
        return FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&lock);
    *h = phys_new(fd, size, prop->location.id, prop->requestedHandleTypes, false);
    pthread_mutex_unlock(&lock);
    if (!*h) close(fd);
    return *h ? FERRY_CUDA_SUCCESS : FERRY_CUDA_ERROR_OUT_OF_MEMORY;
}

STUB_API FERRY_CUresult cuMemRelease(FERRY_CUmemGenericAllocationHandle h)
{
    pthread_mutex_lock(&lock);
    struct phys *p = phys_of(h);
    if (p) phys_put(p);
    pthread_mutex_unlock(&lock);
    return p ? FERRY_CUDA_SUCCESS : FERRY_CUDA_ERROR_INVALID_VALUE;
}

STUB_API FERRY_CUresult cuMemAddressReserve(FERRY_CUdeviceptr *ptr, size_t size, size_t alignment,
                                            FERRY_CUdeviceptr addr, unsigned long long flags)
{
    (void)alignment;
    if (size == 0 || flags) return FERRY_CUDA_ERROR_INVALID_VALUE;
    /* addr: a hint, kept when free (the tests reserve where freed memory was). */
    void *m = mmap((void *)(uintptr_t)addr, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (addr ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    if (m == MAP_FAILED && addr) m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < MAX_RESERVED && reserved[i].base) i++;
    if (i < MAX_RESERVED) {
        reserved[i].base = (uintptr_t)m;
        reserved[i].len = size;
    }
    pthread_mutex_unlock(&lock);
    if (i == MAX_RESERVED) {
        munmap(m, size);
        return FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (FERRY_CUdeviceptr)(uintptr_t)m;
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuMemAddressFree(FERRY_CUdeviceptr ptr, size_t size)
{
    FERRY_CUresult err = FERRY_CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_RESERVED; i++)
        if (reserved[i].base == (uintptr_t)ptr && reserved[i].len == size) {
            err = find((uintptr_t)ptr, 1) ? FERRY_CUDA_ERROR_INVALID_VALUE /* still mapped */ : FERRY_CUDA_SUCCESS;
            if (!err) {
                munmap((void *)reserved[i].base, size);
                reserved[i].base = 0;
            }
            break;
        }
    pthread_mutex_unlock(&lock);
    return err;
}

/* Under lock: whether [p, p+n) is in one reserved range. */
static bool is_reserved(uintptr_t p, size_t n)
{
    for (int i = 0; i < MAX_RESERVED; i++)
        if (reserved[i].base && p >= reserved[i].base && p - reserved[i].base <= reserved[i].len &&
            n <= reserved[i].len - (p - reserved[i].base))
            return true;
    return false;
}

STUB_API FERRY_CUresult cuMemMap(FERRY_CUdeviceptr ptr, size_t size, size_t offset,
                                 FERRY_CUmemGenericAllocationHandle h, unsigned long long flags)
{
    if (offset || flags || size == 0) return FERRY_CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct phys *p = phys_of(h);
    struct alloc *a = free_slot();
    FERRY_CUresult err = !p || size > p->len || !is_reserved((uintptr_t)ptr, size) || find((uintptr_t)ptr, size)
                             ? FERRY_CUDA_ERROR_INVALID_VALUE
                         : !a ? FERRY_CUDA_ERROR_OUT_OF_MEMORY
                              : FERRY_CUDA_SUCCESS;
    if (!err) {
        void *dev = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, 0);
        void *alias = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
        if (dev == MAP_FAILED || alias == MAP_FAILED) {
            if (alias != MAP_FAILED) munmap(alias, size);
            err = FERRY_CUDA_ERROR_MAP_FAILED;
        } else {
            struct stat st;
            fstat(p->fd, &st);
            int device = p->imported ? (depth ? stack[depth - 1]->device : 0) : p->device;
            *a = (struct alloc){(uintptr_t)ptr, size, alias, device,
                                STUB_NO_CONTEXT | STUB_VMM | (p->imported ? STUB_IMPORTED : 0), -1,
                                (uint64_t)st.st_ino, 0, (int)h, false};
            p->refs++; /* the mapping holds the allocation */
        }
    }
    pthread_mutex_unlock(&lock);
    return err;
}

STUB_API FERRY_CUresult cuMemUnmap(FERRY_CUdeviceptr ptr, size_t size)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)ptr, 1);
    FERRY_CUresult err = FERRY_CUDA_ERROR_INVALID_VALUE;
    if (a && (a->flags & STUB_VMM) && a->base == (uintptr_t)ptr && a->len == size) {
        munmap(a->alias, a->len);
        /* The range stays reserved. */
        mmap((void *)a->base, a->len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        struct phys *p = phys_of((FERRY_CUmemGenericAllocationHandle)a->phys);
        if (p) phys_put(p);
        memset(a, 0, sizeof *a);
        err = FERRY_CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return err;
}

STUB_API FERRY_CUresult cuMemSetAccess(FERRY_CUdeviceptr ptr, size_t size, const FERRY_CUmemAccessDesc *desc,
                                       size_t count)
{
    if (count != 1 || desc->location.type != FERRY_CU_MEM_LOCATION_TYPE_DEVICE || desc->location.id < 0 ||
        desc->location.id >= devices || desc->flags != FERRY_CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return FERRY_CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)ptr, size);
    bool ok = a && (a->flags & STUB_VMM) && a->base == (uintptr_t)ptr && a->len == size;
    if (ok) a->accessible = true;
    pthread_mutex_unlock(&lock);
    return ok ? FERRY_CUDA_SUCCESS : FERRY_CUDA_ERROR_INVALID_VALUE;
}

STUB_API FERRY_CUresult cuMemRetainAllocationHandle(FERRY_CUmemGenericAllocationHandle *h, void *addr)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)addr, 1);
    struct phys *p = a && (a->flags & STUB_VMM) ? phys_of((FERRY_CUmemGenericAllocationHandle)a->phys) : NULL;
    if (p) {
        p->refs++;
        *h = (FERRY_CUmemGenericAllocationHandle)a->phys;
    }
    pthread_mutex_unlock(&lock);
    return p ? FERRY_CUDA_SUCCESS : FERRY_CUDA_ERROR_INVALID_VALUE; /* only VMM memory */
}

STUB_API FERRY_CUresult cuMemGetAllocationPropertiesFromHandle(FERRY_CUmemAllocationProp *prop,
                                                               FERRY_CUmemGenericAllocationHandle h)
{
    pthread_mutex_lock(&lock);
    struct phys *p = phys_of(h);
    if (p) {
        memset(prop, 0, sizeof *prop);
        prop->type = FERRY_CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->requestedHandleTypes = p->handle_types;
        prop->location.type = FERRY_CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = p->device;
    }
    pthread_mutex_unlock(&lock);
    return p ? FERRY_CUDA_SUCCESS : FERRY_CUDA_ERROR_INVALID_VALUE;
}

STUB_API FERRY_CUresult cuMemExportToShareableHandle(void *shareable, FERRY_CUmemGenericAllocationHandle h, int type,
                                                     unsigned long long flags)
{
    if (type != FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags) return FERRY_CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct phys *p = phys_of(h);
    int fd = p && (p->handle_types & type) ? fcntl(p->fd, F_DUPFD_CLOEXEC, 0) : -1;
    pthread_mutex_unlock(&lock);
    if (fd < 0) return FERRY_CUDA_ERROR_INVALID_VALUE;
    *(int *)shareable = fd;
    atomic_fetch_add(&vmm_counts[0], 1);
    return FERRY_CUDA_SUCCESS;
}

STUB_API FERRY_CUresult cuMemImportFromShareableHandle(FERRY_CUmemGenericAllocationHandle *h, void *os_handle,
                                                       int type)
{
    if (type != FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return FERRY_CUDA_ERROR_INVALID_VALUE;
    struct stat st;
    int fd = fcntl((int)(intptr_t)os_handle, F_DUPFD_CLOEXEC, 0);
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
        if (fd >= 0) close(fd);
        return FERRY_CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&lock);
    *h = phys_new(fd, (size_t)st.st_size, 0, type, true);
    pthread_mutex_unlock(&lock);
    if (!*h) {
        close(fd);
        return FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    }
    atomic_fetch_add(&vmm_counts[1], 1);
    return FERRY_CUDA_SUCCESS;
}
