/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA device memory through the CUDA driver API, loaded at run time.
 *
 * Nothing from CUDA is linked: libcuda.so.1 (or the file FERRY_CUDA_DRIVER
 * names, how the tests bring a stub driver) is dlopen()ed, and only when
 * this process has loaded it already (RTLD_NOLOAD). The reason: device
 * memory exists only in a process that uses CUDA, and that process has the
 * driver loaded; a process that does not use CUDA never gets it loaded or
 * initialized by Ferry (cuInit before a fork breaks CUDA in the child).
 * While the driver is not loaded every registration is host memory and the
 * next one asks again; once it is, cuInit and the symbols are checked once,
 * and the answer (usable or why not) is kept (ferry_memkind_status()).
 *
 * Asking costs no disk access: dlopen(RTLD_NOLOAD) of a name the process
 * has not loaded searches the library path (five failed openat for
 * libcuda.so.1 where a toolkit is installed, ~125 us a registration), so
 * it runs only when the loader's list of objects, read in memory with
 * dl_iterate_phdr, holds a candidate (a file named like the driver or with
 * "cuda" in its name), and not again until the loader's add/remove
 * counters change: a process without CUDA registers as fast with a
 * toolkit installed as without, and one that loads CUDA later is seen at
 * its next registration.
 *
 * Detection: cuPointerGetAttributes (memory type, managed, device ordinal)
 * of the first and the last byte. Staging copies: cuMemcpyDtoH/HtoD with the
 * pointer's context pushed on the calling thread (Ferry's threads have none)
 * and popped after, so the caller's CUDA state is left as it was. */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "cuda_memory.h"
#include "fail.h"
#include "memkind.h"

static struct {
    ferry_cuInit_fn init;
    ferry_cuDriverGetVersion_fn driver_version;
    ferry_cuDeviceGetCount_fn device_count;
    ferry_cuDeviceGet_fn device_get;
    ferry_cuGetErrorName_fn error_name;
    ferry_cuGetErrorString_fn error_string;
    ferry_cuPointerGetAttributes_fn pointer_attributes;
    ferry_cuDevicePrimaryCtxRetain_fn primary_retain;
    ferry_cuDevicePrimaryCtxRelease_fn primary_release;
    ferry_cuCtxPushCurrent_fn ctx_push;
    ferry_cuCtxPopCurrent_fn ctx_pop;
    ferry_cuMemcpyDtoH_fn dtoh;
    ferry_cuMemcpyHtoD_fn htod;
    ferry_cuStreamSynchronize_fn stream_sync;
} cu;

enum { DRIVER_NOT_LOADED, DRIVER_USABLE, DRIVER_UNUSABLE };
static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int driver_state = DRIVER_NOT_LOADED;
static void *_Atomic driver_handle; /* the usable driver's dlopen handle, for ferry_cuda_symbol */
static char status_text[384];

static const char *driver_path(void)
{
    const char *p = getenv("FERRY_CUDA_DRIVER");
    return p && *p ? p : "libcuda.so.1";
}

/* Under driver_lock. Rewritten only when it changes, so that a reader of the
 * pointer ferry_cuda_status() returned does not race a writer. */
static void set_status(const char *text)
{
    if (strcmp(status_text, text) != 0) snprintf(status_text, sizeof status_text, "%s", text);
}

static const char *error_text(int err, char *buf, size_t cap)
{
    const char *name = NULL, *text = NULL;
    if (cu.error_name) cu.error_name(err, &name);
    if (cu.error_string) cu.error_string(err, &text);
    snprintf(buf, cap, "%s (%s)", name ? name : "CUDA error", text ? text : "no description");
    if (!name) snprintf(buf, cap, "CUDA error %d", err);
    return buf;
}

static int resolve(void *h, const char *path, char *why, size_t cap)
{
    static const struct {
        const char *name;
        void **slot;
    } table[] = {
        {"cuInit", (void **)&cu.init},
        {"cuDriverGetVersion", (void **)&cu.driver_version},
        {"cuDeviceGetCount", (void **)&cu.device_count},
        {"cuDeviceGet", (void **)&cu.device_get},
        {"cuGetErrorName", (void **)&cu.error_name},
        {"cuGetErrorString", (void **)&cu.error_string},
        {"cuPointerGetAttributes", (void **)&cu.pointer_attributes},
        {"cuDevicePrimaryCtxRetain", (void **)&cu.primary_retain},
        {"cuDevicePrimaryCtxRelease_v2", (void **)&cu.primary_release},
        {"cuCtxPushCurrent_v2", (void **)&cu.ctx_push},
        {"cuCtxPopCurrent_v2", (void **)&cu.ctx_pop},
        {"cuMemcpyDtoH_v2", (void **)&cu.dtoh},
        {"cuMemcpyHtoD_v2", (void **)&cu.htod},
        {"cuStreamSynchronize", (void **)&cu.stream_sync},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        *table[i].slot = dlsym(h, table[i].name);
        if (!*table[i].slot) {
            snprintf(why, cap, "CUDA built in; the CUDA driver %s lacks %s (driver too old?): all memory is host memory",
                     path, table[i].name);
            memset(&cu, 0, sizeof cu);
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------- is the driver loaded? */

/* The loader's counters when a look found no driver (under driver_lock);
 * loader_seen false: none yet, or forgotten. */
static unsigned long long loader_adds, loader_subs;
static bool loader_seen;
static _Atomic unsigned long driver_probes; /* dlopen(RTLD_NOLOAD) calls: the tests count them */

struct loader_scan {
    const char *want;                 /* the driver's file name, without folders */
    unsigned long long adds, subs;    /* the loader's counters now */
    bool counted, unchanged, candidate;
};

static bool driver_like(const char *name, const char *want)
{
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    return strcmp(base, want) == 0 || strstr(base, "cuda") != NULL;
}

/* dl_iterate_phdr's callback: the first object carries the loader's
 * counters (stop at once when they are those of the last look); then
 * every object's name, until a candidate. Nothing here touches the disk. */
static int scan_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct loader_scan *s = arg;
    if (!s->counted && size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        s->counted = true;
        s->adds = info->dlpi_adds;
        s->subs = info->dlpi_subs;
        if (loader_seen && s->adds == loader_adds && s->subs == loader_subs) {
            s->unchanged = true;
            return 1;
        }
    }
    s->candidate = info->dlpi_name && driver_like(info->dlpi_name, s->want);
    return s->candidate;
}

/* Under driver_lock: remembers the loader's counters of a look that found
 * no driver, so that the next look stops at the first object. */
static void driver_not_loaded_at(const struct loader_scan *s)
{
    loader_seen = s->counted;
    loader_adds = s->adds;
    loader_subs = s->subs;
}

/* Under driver_lock: false when the driver cannot be loaded in this
 * process (the loader holds the same objects as at the last look that
 * found none, or none like the driver); true when dlopen must tell. */
static bool driver_maybe_loaded(const char *path, struct loader_scan *s)
{
    const char *slash = strrchr(path, '/');
    *s = (struct loader_scan){.want = slash ? slash + 1 : path};
    dl_iterate_phdr(scan_object, s);
    if (s->unchanged) return false;
    if (!s->candidate) driver_not_loaded_at(s);
    return s->candidate;
}

unsigned long ferry_cuda_driver_probes(void) { return atomic_load(&driver_probes); }

/* Under driver_lock, while DRIVER_NOT_LOADED. */
static void driver_try_load(void)
{
    char why[sizeof status_text], err_buf[200];
    const char *path = driver_path();
    struct loader_scan scan;
    void *h = NULL;
    if (driver_maybe_loaded(path, &scan)) {
        atomic_fetch_add(&driver_probes, 1);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (!h) driver_not_loaded_at(&scan); /* a candidate, but not the driver */
    }
    if (!h) {
        snprintf(why, sizeof why,
                 "CUDA built in (driver API at run time); the CUDA driver %s is not loaded in this process "
                 "(not installed, or no CUDA used here yet): all memory is host memory",
                 path);
        set_status(why);
        return; /* asked again at the next registration */
    }
    int state = DRIVER_UNUSABLE, version = 0, n = 0, err;
    if (resolve(h, path, why, sizeof why) == 0) {
        if ((err = cu.init(0)) != FERRY_CUDA_SUCCESS) {
            snprintf(why, sizeof why, "CUDA built in; cuInit of %s failed: %s: all memory is host memory", path,
                     error_text(err, err_buf, sizeof err_buf));
        } else if ((err = cu.device_count(&n)) != FERRY_CUDA_SUCCESS || n <= 0) {
            snprintf(why, sizeof why, "CUDA built in; %s: %s: all memory is host memory", path,
                     err ? error_text(err, err_buf, sizeof err_buf) : "cuDeviceGetCount found 0 devices");
        } else {
            cu.driver_version(&version);
            snprintf(why, sizeof why, "CUDA built in (driver API, %s, driver version %d); %d device(s)", path, version,
                     n);
            state = DRIVER_USABLE;
        }
    }
    if (state == DRIVER_USABLE) atomic_store(&driver_handle, h);
    set_status(why);
    /* An unusable driver stays loaded (it was before us; dlclose would only
     * drop our reference) and is not asked again. */
    atomic_store(&driver_state, state);
}

static int driver_usable(void)
{
    int state = atomic_load(&driver_state);
    if (state != DRIVER_NOT_LOADED) return state == DRIVER_USABLE;
    pthread_mutex_lock(&driver_lock);
    if (atomic_load(&driver_state) == DRIVER_NOT_LOADED) driver_try_load();
    pthread_mutex_unlock(&driver_lock);
    return atomic_load(&driver_state) == DRIVER_USABLE;
}

const char *ferry_cuda_status(void)
{
    driver_usable();
    return status_text;
}

int ferry_cuda_usable(void) { return driver_usable(); }

void ferry_cuda_forget_driver(void)
{
    pthread_mutex_lock(&driver_lock);
    memset(&cu, 0, sizeof cu);
    atomic_store(&driver_handle, NULL);
    status_text[0] = '\0';
    loader_seen = false;
    atomic_store(&driver_state, DRIVER_NOT_LOADED);
    pthread_mutex_unlock(&driver_lock);
}

int ferry_cuda_classify(int err, int type, int managed, int device, uint32_t *kind)
{
    *kind = FERRY_MEMKIND_HOST;
    /* An error means CUDA does not know the pointer: then it is not device
     * memory, and the CPU may touch it. */
    if (err != FERRY_CUDA_SUCCESS) return 0;
    /* Host (pinned), managed and unknown (type 0) memory: CPU-accessible. */
    if (type != FERRY_CU_MEMORYTYPE_DEVICE || managed) return 0;
    if (device < 0 || device > 0xffffff)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: CUDA reports device ordinal %d", device);
    *kind = FERRY_MEMKIND_MAKE(FERRY_MEMKIND_CUDA, device);
    return 0;
}

struct pointer_info {
    unsigned int type;
    unsigned int managed; /* the driver writes a bool: 0 stays 0 */
    int device;
};

/* cuPointerGetAttributes: an address CUDA does not know gets the default
 * (zero) values and CUDA_SUCCESS. */
static int pointer_info(const void *p, struct pointer_info *info)
{
    memset(info, 0, sizeof *info);
    info->device = -1;
    int attrs[] = {FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, FERRY_CU_POINTER_ATTRIBUTE_IS_MANAGED,
                   FERRY_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[] = {&info->type, &info->managed, &info->device};
    return cu.pointer_attributes(3, attrs, data, (FERRY_CUdeviceptr)(uintptr_t)p);
}

int ferry_cuda_detect(const void *addr, size_t len, uint32_t *kind)
{
    *kind = FERRY_MEMKIND_HOST;
    if (!driver_usable()) return 0;
    struct pointer_info a, b;
    int err = pointer_info(addr, &a);
    int rc = ferry_cuda_classify(err, (int)a.type, (int)a.managed, a.device, kind);
    if (rc || *kind == FERRY_MEMKIND_HOST) return rc;
    /* The whole range must be memory of that one device. */
    err = pointer_info((const char *)addr + len - 1, &b);
    if (err != FERRY_CUDA_SUCCESS || b.type != FERRY_CU_MEMORYTYPE_DEVICE || b.managed || b.device != a.device) {
        char buf[200];
        *kind = FERRY_MEMKIND_HOST;
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "register: [%p+%zu) starts in CUDA device %d memory but its last byte is not (%s)", addr, len,
                          a.device, err ? error_text(err, buf, sizeof buf) : "another kind or device");
    }
    return 0;
}

int ferry_cuda_error_code(int err)
{
    switch (err) {
    case FERRY_CUDA_SUCCESS: return 0;
    case FERRY_CUDA_ERROR_NO_DEVICE:
    case FERRY_CUDA_ERROR_INVALID_DEVICE:
    case FERRY_CUDA_ERROR_NOT_INITIALIZED:
    case FERRY_CUDA_ERROR_DEINITIALIZED:
    case FERRY_CUDA_ERROR_STUB_LIBRARY:
    case FERRY_CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return FERRY_ERR_DEVICE_NOT_FOUND;
    case FERRY_CUDA_ERROR_INVALID_VALUE: return FERRY_ERR_INVALID_ARGUMENT;
    case FERRY_CUDA_ERROR_OUT_OF_MEMORY: return FERRY_ERR_MEMORY;
    default: return FERRY_ERR_INTERNAL;
    }
}

/* The context device memory at p belongs to, pushed on this thread. Memory
 * without one (cuMemCreate/cuMemMap) gets its device's primary context,
 * retained (*primary set) until copy_leave. */
static int copy_enter(const void *p, int ordinal, FERRY_CUdevice *primary)
{
    FERRY_CUcontext ctx = NULL;
    int attr = FERRY_CU_POINTER_ATTRIBUTE_CONTEXT;
    void *data[] = {&ctx};
    int err = cu.pointer_attributes(1, &attr, data, (FERRY_CUdeviceptr)(uintptr_t)p);
    if (err == FERRY_CUDA_SUCCESS && !ctx) {
        FERRY_CUdevice dev;
        err = cu.device_get(&dev, ordinal);
        if (err == FERRY_CUDA_SUCCESS) err = cu.primary_retain(&ctx, dev);
        if (err == FERRY_CUDA_SUCCESS) *primary = dev;
    }
    if (err == FERRY_CUDA_SUCCESS) err = cu.ctx_push(ctx);
    if (err != FERRY_CUDA_SUCCESS && *primary >= 0) {
        cu.primary_release(*primary);
        *primary = -1;
    }
    return err;
}

static void copy_leave(FERRY_CUdevice primary)
{
    FERRY_CUcontext popped;
    cu.ctx_pop(&popped);
    if (primary >= 0) cu.primary_release(primary);
}

void *ferry_cuda_symbol(const char *name)
{
    void *h = driver_usable() ? atomic_load(&driver_handle) : NULL;
    return h ? dlsym(h, name) : NULL;
}

int ferry_cuda_context_enter(const void *device_ptr, int ordinal, int *primary)
{
    *primary = -1;
    if (!driver_usable()) return FERRY_CUDA_ERROR_NOT_INITIALIZED;
    return copy_enter(device_ptr, ordinal, primary);
}

void ferry_cuda_context_leave(int primary) { copy_leave(primary); }

const char *ferry_cuda_error_text(int err, char *buf, size_t cap) { return error_text(err, buf, cap); }

int ferry_cuda_copy(uint32_t kind, void *dst, const void *src, size_t n, int to_host)
{
    int ordinal = FERRY_MEMKIND_DEVICE(kind);
    if (!driver_usable())
        return ferry_fail(FERRY_ERR_DEVICE_NOT_FOUND, "CUDA copy of %zu bytes on device %d: %s", n, ordinal,
                          status_text);
    const void *device_side = to_host ? src : dst;
    FERRY_CUdevice primary = -1;
    int err = copy_enter(device_side, ordinal, &primary);
    if (err == FERRY_CUDA_SUCCESS) {
        if (to_host) {
            err = cu.dtoh(dst, (FERRY_CUdeviceptr)(uintptr_t)src, n);
        } else {
            /* From pageable memory the copy may return before the DMA ends:
             * wait on the legacy stream (which the copy ran on) so the bytes
             * are on the device when the transfer is reported complete. */
            err = cu.htod((FERRY_CUdeviceptr)(uintptr_t)dst, src, n);
            if (err == FERRY_CUDA_SUCCESS) err = cu.stream_sync(NULL);
        }
        copy_leave(primary);
    }
    if (err == FERRY_CUDA_SUCCESS) return 0;
    char buf[200];
    return ferry_fail(ferry_cuda_error_code(err), "CUDA %s copy of %zu bytes on device %d (%p -> %p) failed: %s",
                      to_host ? "device->host" : "host->device", n, ordinal, src, dst,
                      error_text(err, buf, sizeof buf));
}

/* ------------------------------------------- pinned, pipelined staging */

/* Entry points the stager needs beyond the staging copies, resolved at
 * first use (a driver without them: the stager copies synchronously). */
static struct {
    ferry_cuMemAllocHost_fn alloc_host;
    ferry_cuMemFreeHost_fn free_host;
    ferry_cuStreamCreate_fn stream_create;
    ferry_cuStreamDestroy_fn stream_destroy;
    ferry_cuMemcpyAsync_fn copy_async;
    ferry_cuCtxGetCurrent_fn ctx_current;
} st;
static pthread_once_t st_once = PTHREAD_ONCE_INIT;
static bool st_ok;

static void stage_resolve(void)
{
    st.alloc_host = (ferry_cuMemAllocHost_fn)ferry_cuda_symbol("cuMemAllocHost_v2");
    st.free_host = (ferry_cuMemFreeHost_fn)ferry_cuda_symbol("cuMemFreeHost");
    st.stream_create = (ferry_cuStreamCreate_fn)ferry_cuda_symbol("cuStreamCreate");
    st.stream_destroy = (ferry_cuStreamDestroy_fn)ferry_cuda_symbol("cuStreamDestroy_v2");
    st.copy_async = (ferry_cuMemcpyAsync_fn)ferry_cuda_symbol("cuMemcpyAsync");
    st.ctx_current = (ferry_cuCtxGetCurrent_fn)ferry_cuda_symbol("cuCtxGetCurrent");
    st_ok = st.alloc_host && st.free_host && st.stream_create && st.stream_destroy && st.copy_async && st.ctx_current;
}

/* Whether the stager's entry points are there (asked once the driver is
 * usable: ferry_cuda_symbol answers NULL before). */
static bool stage_entry_points(void)
{
    if (!driver_usable()) return false;
    pthread_once(&st_once, stage_resolve);
    return st_ok;
}

static int stage_fail(int err, const char *what, size_t n)
{
    char buf[200];
    return ferry_fail(ferry_cuda_error_code(err), "CUDA staging: %s (%zu bytes) failed: %s", what, n,
                      error_text(err, buf, sizeof buf));
}

int ferry_cuda_host_alloc(int ordinal, size_t n, void **out, void **ctx)
{
    if (!stage_entry_points())
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA staging: no page-locked allocation in this driver");
    FERRY_CUdevice primary = -1;
    FERRY_CUdevice dev;
    FERRY_CUcontext c = NULL;
    int err = cu.device_get(&dev, ordinal);
    if (err == FERRY_CUDA_SUCCESS) err = cu.primary_retain(&c, dev);
    if (err == FERRY_CUDA_SUCCESS) primary = dev;
    if (err == FERRY_CUDA_SUCCESS) err = cu.ctx_push(c);
    if (err == FERRY_CUDA_SUCCESS) {
        err = st.alloc_host(out, n);
        FERRY_CUcontext popped;
        cu.ctx_pop(&popped);
    }
    /* Not kept retained: the application's use of the device keeps its
     * primary context (and so the buffer) alive; the free retains it again. */
    if (primary >= 0) cu.primary_release(primary);
    if (err != FERRY_CUDA_SUCCESS) return stage_fail(err, "cuMemAllocHost", n);
    *ctx = (void *)(intptr_t)(dev + 1);
    return 0;
}

void ferry_cuda_host_free(void *p, void *ctx)
{
    FERRY_CUdevice dev = (FERRY_CUdevice)((intptr_t)ctx - 1);
    FERRY_CUcontext c = NULL, popped;
    if (cu.primary_retain(&c, dev) != FERRY_CUDA_SUCCESS) return;
    if (cu.ctx_push(c) == FERRY_CUDA_SUCCESS) {
        st.free_host(p);
        cu.ctx_pop(&popped);
    }
    cu.primary_release(dev);
}

int ferry_cuda_copy_async(uint32_t kind, void *dst, const void *src, size_t n, int to_host, void **stream,
                          void **stream_ctx)
{
    if (!stage_entry_points())
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA staging: no asynchronous copy in this driver");
    FERRY_CUdevice primary = -1;
    int err = copy_enter(to_host ? src : dst, FERRY_MEMKIND_DEVICE(kind), &primary);
    if (err != FERRY_CUDA_SUCCESS) return stage_fail(err, "entering the memory's context", n);
    FERRY_CUcontext here = NULL;
    err = st.ctx_current(&here);
    if (err == FERRY_CUDA_SUCCESS && *stream && *stream_ctx != (void *)here) {
        st.stream_destroy(*stream); /* another context's: the copies on it were waited for */
        *stream = NULL;
    }
    if (err == FERRY_CUDA_SUCCESS && !*stream) {
        err = st.stream_create((FERRY_CUstream *)stream, FERRY_CU_STREAM_NON_BLOCKING);
        if (err == FERRY_CUDA_SUCCESS) *stream_ctx = here;
    }
    if (err == FERRY_CUDA_SUCCESS)
        err = st.copy_async((FERRY_CUdeviceptr)(uintptr_t)dst, (FERRY_CUdeviceptr)(uintptr_t)src, n, *stream);
    copy_leave(primary);
    if (err == FERRY_CUDA_SUCCESS) return 0;
    return stage_fail(err, to_host ? "cuMemcpyAsync device->host" : "cuMemcpyAsync host->device", n);
}

int ferry_cuda_stream_wait(void *stream, void *stream_ctx)
{
    FERRY_CUcontext popped;
    int err = cu.ctx_push((FERRY_CUcontext)stream_ctx);
    if (err == FERRY_CUDA_SUCCESS) {
        err = cu.stream_sync(stream);
        cu.ctx_pop(&popped);
    }
    return err == FERRY_CUDA_SUCCESS ? 0 : stage_fail(err, "waiting for the stream's copy", 0);
}

void ferry_cuda_stream_free(void *stream, void *stream_ctx)
{
    FERRY_CUcontext popped;
    if (!stream || cu.ctx_push((FERRY_CUcontext)stream_ctx) != FERRY_CUDA_SUCCESS) return;
    st.stream_destroy(stream);
    cu.ctx_pop(&popped);
}
