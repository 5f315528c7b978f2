/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA IPC transport's driver calls: its entry points (resolved from
 * the driver the process loaded, src/util/cuda_memory.c), the
 * initiator's exports, the target's imports and its streams.
 *
 * Imports are process-wide: a real driver maps an IPC handle once per
 * process (a second cuIpcOpenMemHandle of it fails with ALREADY_MAPPED),
 * whichever connection asks. Each import is owned by the connection that
 * opened it and closed with it (so a restarted or departed initiator's
 * mappings go with its connections); a copy holds a reference while it
 * runs, and an import whose owner left is closed by its last copy, unless
 * another connection of the same initiator takes it over first. An import
 * goes stale when the same initiator names a different handle at the same
 * allocation base (its region was deregistered and the memory allocated
 * again): it is closed (at once, or by its last copy) and never used
 * again. The driver cannot say when an exporter freed an allocation, so an
 * import of memory the initiator freed and did not reuse stays mapped
 * until then, until its connection closes, or until it is the least
 * recently used of more than IMPORTS_MAX (a mapping keeps the exporter's
 * memory allocated: this bounds what stale ones hold). */
#include "cuda_ipc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"
#include "util/memkind.h"
#include "wire/le.h"
#include "wire/wire.h"

#ifdef FERRY_HAVE_CUDA
#include "util/cuda_driver.h"
#include "util/cuda_memory.h"
#endif

void cuda_ipc_export_encode(const struct cuda_ipc_export *x, uint32_t deadline_ms, uint8_t out[CUDA_IPC_EXPORT_SIZE])
{
    memcpy(out, x->handle, sizeof x->handle);
    put64(out + 64, x->base);
    put64(out + 72, x->size);
    put32(out + 80, (uint32_t)x->device);
    put32(out + 84, deadline_ms);
}

int cuda_ipc_export_decode(const uint8_t in[CUDA_IPC_EXPORT_SIZE], struct cuda_ipc_export *x, uint32_t *deadline_ms)
{
    memcpy(x->handle, in, sizeof x->handle);
    x->base = get64(in + 64);
    x->size = get64(in + 72);
    x->device = (int32_t)get32(in + 80);
    *deadline_ms = get32(in + 84);
    if (x->size == 0 || x->base + x->size < x->base || x->device < 0)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "CUDA IPC export: allocation [0x%llx+%llu) on device %d",
                          (unsigned long long)x->base, (unsigned long long)x->size, (int)x->device);
    return 0;
}

static _Atomic unsigned long imports_open, imports_opened;

void ferry_cuda_ipc_counts(unsigned long *open_now, unsigned long *opened)
{
    *open_now = atomic_load(&imports_open);
    *opened = atomic_load(&imports_opened);
}

/* Declared in every build (`ferry info` lists it), read only where CUDA is
 * built in. */
const ferry_transport_key_t cuda_ipc_keys[CUDA_IPC_NKEYS] = {
    [CUDA_IPC_KEY_ENABLE] = {"FERRY_CUDA_IPC", FERRY_KEY_FLAG, 0, 1, "1",
                             "0: this process neither offers nor chooses the cuda_ipc transport"},
};

#ifndef FERRY_HAVE_CUDA

const char *cuda_ipc_unusable(void) { return "CUDA not built in (configured with -DFERRY_WITH_CUDA=OFF)"; }

struct cuda_ipc_conn *cuda_ipc_conn_get(ferry_conn_t *c)
{
    (void)c;
    return NULL;
}

int cuda_ipc_export_of(struct cuda_ipc_conn *ic, uint64_t region, uint32_t generation, const void *p, uint64_t len,
                       int ordinal, struct cuda_ipc_export *out)
{
    (void)ic, (void)region, (void)generation, (void)p, (void)len, (void)ordinal, (void)out;
    return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC: %s", cuda_ipc_unusable());
}

int cuda_ipc_copy(struct cuda_ipc_conn *ic, ferry_conn_t *c, const struct cuda_ipc_export *x, uint64_t off,
                  void *local, uint32_t kind, size_t n, bool to_local)
{
    (void)ic, (void)c, (void)x, (void)off, (void)local, (void)kind, (void)n, (void)to_local;
    return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC: %s", cuda_ipc_unusable());
}

#else

/* ------------------------------------------------------ entry points */

static struct {
    ferry_cuMemGetAddressRange_fn address_range;
    ferry_cuIpcGetMemHandle_fn ipc_get;
    ferry_cuIpcOpenMemHandle_fn ipc_open;
    ferry_cuIpcCloseMemHandle_fn ipc_close;
    ferry_cuCtxGetCurrent_fn ctx_current;
    ferry_cuCtxPushCurrent_fn ctx_push;
    ferry_cuCtxPopCurrent_fn ctx_pop;
    ferry_cuStreamCreate_fn stream_create;
    ferry_cuStreamDestroy_fn stream_destroy;
    ferry_cuStreamSynchronize_fn stream_sync;
    ferry_cuMemcpyAsync_fn memcpy_async;
} drv;

static pthread_mutex_t drv_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int drv_state; /* 0 not yet, 1 resolved, -1 an entry point missing */
static char drv_missing[64];

/* Resolves every entry point once the driver is usable (asked again while
 * it is not: a process may load CUDA later). */
static int resolve(void)
{
    int state = atomic_load(&drv_state);
    if (state) return state;
    pthread_mutex_lock(&drv_lock);
    if (!atomic_load(&drv_state) && ferry_memkind_device_usable()) {
        static const struct {
            const char *name;
            void **slot;
        } table[] = {
            {"cuMemGetAddressRange_v2", (void **)&drv.address_range},
            {"cuIpcGetMemHandle", (void **)&drv.ipc_get},
            {"cuIpcOpenMemHandle_v2", (void **)&drv.ipc_open},
            {"cuIpcCloseMemHandle", (void **)&drv.ipc_close},
            {"cuCtxGetCurrent", (void **)&drv.ctx_current},
            {"cuCtxPushCurrent_v2", (void **)&drv.ctx_push},
            {"cuCtxPopCurrent_v2", (void **)&drv.ctx_pop},
            {"cuStreamCreate", (void **)&drv.stream_create},
            {"cuStreamDestroy_v2", (void **)&drv.stream_destroy},
            {"cuStreamSynchronize", (void **)&drv.stream_sync},
            {"cuMemcpyAsync", (void **)&drv.memcpy_async},
        };
        int st = 1;
        for (size_t i = 0; i < sizeof table / sizeof table[0] && st == 1; i++) {
            *table[i].slot = ferry_cuda_symbol(table[i].name);
            if (!*table[i].slot) {
                snprintf(drv_missing, sizeof drv_missing, "%s", table[i].name);
                st = -1;
            }
        }
        atomic_store(&drv_state, st);
    }
    pthread_mutex_unlock(&drv_lock);
    return atomic_load(&drv_state);
}

const char *cuda_ipc_unusable(void)
{
    long on = 1;
    if (ferry_transport_key(&cuda_ipc_keys[CUDA_IPC_KEY_ENABLE], &on, NULL) < 0) ferry_clear_last_error();
    if (!on) return "FERRY_CUDA_IPC=0";
    int st = resolve();
    if (st == 0) return "no usable CUDA driver in this process";
    if (st < 0) return "the CUDA driver lacks an IPC entry point";
    return NULL;
}

static int cuda_fail(int err, const char *what, size_t n, const void *p)
{
    char buf[200];
    return ferry_fail(err == FERRY_CUDA_ERROR_INVALID_VALUE ? FERRY_ERR_INTERNAL : ferry_cuda_error_code(err),
                      "CUDA IPC: %s (%zu bytes at %p) failed: %s", what, n, p, ferry_cuda_error_text(err, buf, sizeof buf));
}

/* --------------------------------------------------------- imports */

struct import {
    int32_t pid;             /* the exporter */
    uint8_t handle[64];
    uint64_t base, size;     /* in the exporter's address space */
    FERRY_CUdeviceptr mapped; /* here */
    int device;              /* the local device whose context it was opened in (-1: primary of 0) */
    unsigned refs;           /* copies running with it */
    struct cuda_ipc_conn *owner; /* NULL: its connection left */
    bool stale;
    struct import *next;
};

static pthread_mutex_t imports_lock = PTHREAD_MUTEX_INITIALIZER;
static struct import *imports; /* most recently used first */
static unsigned nimports;
#define IMPORTS_MAX 32

#define EXPORTS 8
#define STREAMS 8

struct cuda_ipc_conn {
    struct {
        uint64_t region;
        uint32_t generation;
        struct cuda_ipc_export x;
    } exports[EXPORTS];
    unsigned nexports, next_export;
    struct {
        FERRY_CUcontext ctx;
        FERRY_CUstream stream;
    } streams[STREAMS];
    unsigned nstreams;
};

/* Closes an import (no copy uses it, it is off the list). */
static void import_close(struct import *im)
{
    int primary = -1;
    if (ferry_cuda_context_enter((const void *)(uintptr_t)im->mapped, im->device < 0 ? 0 : im->device, &primary) ==
        FERRY_CUDA_SUCCESS) {
        drv.ipc_close(im->mapped);
        ferry_cuda_context_leave(primary);
    }
    atomic_fetch_sub(&imports_open, 1);
    free(im);
}

/* Under imports_lock: unlinks im; closes it now, or marks it for its last copy. */
static void import_retire_locked(struct import **link, struct import *im)
{
    *link = im->next;
    nimports--;
    im->stale = true;
    im->owner = NULL;
    if (im->refs == 0) import_close(im);
}

static void retire_least_used_locked(void);

/* The import of x from pid, referenced (opened if need be, in the current
 * context). NOT_IMPLEMENTED when the driver cannot open it. */
static int import_get(struct cuda_ipc_conn *ic, int32_t pid, const struct cuda_ipc_export *x, int device,
                      struct import **out)
{
    pthread_mutex_lock(&imports_lock);
    struct import **link = &imports;
    while (*link) {
        struct import *im = *link;
        if (im->pid == pid && memcmp(im->handle, x->handle, sizeof im->handle) == 0) {
            im->refs++;
            if (!im->owner) im->owner = ic;
            *link = im->next; /* to the front: most recently used */
            im->next = imports;
            imports = im;
            pthread_mutex_unlock(&imports_lock);
            *out = im;
            return 0;
        }
        if (im->pid == pid && im->base < x->base + x->size && x->base < im->base + im->size) {
            /* Two live allocations of one process never overlap: the
             * one imported was freed, and its mapping is stale. */
            import_retire_locked(link, im);
            continue;
        }
        link = &im->next;
    }
    struct import *im = calloc(1, sizeof *im);
    int err = FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    if (im) {
        FERRY_CUipcMemHandle h;
        memcpy(h.reserved, x->handle, sizeof h.reserved);
        err = drv.ipc_open(&im->mapped, h, FERRY_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    }
    if (err != FERRY_CUDA_SUCCESS) {
        pthread_mutex_unlock(&imports_lock);
        free(im);
        char buf[200];
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED,
                          "cannot open the CUDA IPC handle of pid %d's allocation [0x%llx+%llu) in this process: %s",
                          (int)pid, (unsigned long long)x->base, (unsigned long long)x->size,
                          ferry_cuda_error_text(err, buf, sizeof buf));
    }
    im->pid = pid;
    memcpy(im->handle, x->handle, sizeof im->handle);
    im->base = x->base;
    im->size = x->size;
    im->device = device;
    im->refs = 1;
    im->owner = ic;
    im->next = imports;
    imports = im;
    if (++nimports > IMPORTS_MAX) retire_least_used_locked();
    atomic_fetch_add(&imports_open, 1);
    atomic_fetch_add(&imports_opened, 1);
    pthread_mutex_unlock(&imports_lock);
    *out = im;
    return 0;
}

/* Under imports_lock: closes the least recently used import no copy uses. */
static void retire_least_used_locked(void)
{
    struct import **victim = NULL;
    for (struct import **link = &imports; *link; link = &(*link)->next)
        if ((*link)->refs == 0) victim = link;
    if (victim) import_retire_locked(victim, *victim);
}

static void import_put(struct import *im)
{
    pthread_mutex_lock(&imports_lock);
    bool close_now = --im->refs == 0 && im->stale;
    pthread_mutex_unlock(&imports_lock);
    if (close_now) import_close(im);
}

/* ------------------------------------------------------ connections */

static void conn_free(void *p)
{
    struct cuda_ipc_conn *ic = p;
    pthread_mutex_lock(&imports_lock);
    struct import **link = &imports;
    while (*link) {
        if ((*link)->owner == ic) import_retire_locked(link, *link);
        else link = &(*link)->next;
    }
    pthread_mutex_unlock(&imports_lock);
    for (unsigned i = 0; i < ic->nstreams; i++) {
        FERRY_CUcontext popped;
        if (drv.ctx_push(ic->streams[i].ctx) != FERRY_CUDA_SUCCESS) continue;
        drv.stream_destroy(ic->streams[i].stream);
        drv.ctx_pop(&popped);
    }
    free(ic);
}

struct cuda_ipc_conn *cuda_ipc_conn_get(ferry_conn_t *c)
{
    if (c->xport) return c->xport_free == conn_free ? c->xport : NULL; /* NULL: another transport's state */
    struct cuda_ipc_conn *ic = calloc(1, sizeof *ic);
    if (!ic) return NULL;
    c->xport = ic;
    c->xport_free = conn_free;
    return ic;
}

/* This connection's stream in the current context (made at first use). */
static int stream_here(struct cuda_ipc_conn *ic, FERRY_CUstream *out)
{
    FERRY_CUcontext ctx = NULL;
    int err = drv.ctx_current(&ctx);
    if (err != FERRY_CUDA_SUCCESS) return err;
    for (unsigned i = 0; i < ic->nstreams; i++)
        if (ic->streams[i].ctx == ctx) {
            *out = ic->streams[i].stream;
            return FERRY_CUDA_SUCCESS;
        }
    if (ic->nstreams == STREAMS) return FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    err = drv.stream_create(out, FERRY_CU_STREAM_NON_BLOCKING);
    if (err != FERRY_CUDA_SUCCESS) return err;
    ic->streams[ic->nstreams].ctx = ctx;
    ic->streams[ic->nstreams++].stream = *out;
    return FERRY_CUDA_SUCCESS;
}

/* ----------------------------------------------------------- copies */

int cuda_ipc_export_of(struct cuda_ipc_conn *ic, uint64_t region, uint32_t generation, const void *p, uint64_t len,
                       int ordinal, struct cuda_ipc_export *out)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    for (unsigned i = 0; i < ic->nexports; i++) {
        const struct cuda_ipc_export *x = &ic->exports[i].x;
        if (ic->exports[i].region == region && ic->exports[i].generation == generation && a >= x->base &&
            a - x->base <= x->size && len <= x->size - (a - x->base)) {
            *out = *x;
            return 0;
        }
    }
    if (resolve() != 1) return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC: %s", cuda_ipc_unusable());
    int primary = -1, err = ferry_cuda_context_enter(p, ordinal, &primary);
    if (err != FERRY_CUDA_SUCCESS) return cuda_fail(err, "entering the memory's context", (size_t)len, p);
    FERRY_CUdeviceptr base = 0;
    size_t size = 0;
    FERRY_CUipcMemHandle h;
    err = drv.address_range(&base, &size, (FERRY_CUdeviceptr)a);
    if (err == FERRY_CUDA_SUCCESS) err = drv.ipc_get(&h, base);
    ferry_cuda_context_leave(primary);
    if (err != FERRY_CUDA_SUCCESS) return cuda_fail(err, "exporting the allocation", (size_t)len, p);
    if (a - base > size || len > size - (a - base))
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC: [%p+%llu) is not in one allocation ([0x%llx+%zu))", p,
                          (unsigned long long)len, (unsigned long long)base, size);
    struct cuda_ipc_export x = {.base = base, .size = size, .device = ordinal};
    memcpy(x.handle, h.reserved, sizeof x.handle);
    unsigned slot = ic->nexports < EXPORTS ? ic->nexports++ : ic->next_export++ % EXPORTS;
    ic->exports[slot].region = region;
    ic->exports[slot].generation = generation;
    ic->exports[slot].x = x;
    *out = x;
    return 0;
}

int cuda_ipc_copy(struct cuda_ipc_conn *ic, ferry_conn_t *c, const struct cuda_ipc_export *x, uint64_t off,
                  void *local, uint32_t kind, size_t n, bool to_local)
{
    if (resolve() != 1) return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC: %s", cuda_ipc_unusable());
    int device = FERRY_MEMKIND_TYPE(kind) == FERRY_MEMKIND_CUDA ? FERRY_MEMKIND_DEVICE(kind) : -1;
    /* Host memory here: the first device's primary context will do (the
     * copy goes by unified addressing). */
    int primary = -1, err = ferry_cuda_context_enter(local, device < 0 ? 0 : device, &primary);
    if (err != FERRY_CUDA_SUCCESS) return cuda_fail(err, "entering the local memory's context", n, local);
    struct import *im = NULL;
    int rc = import_get(ic, c->peer.pid, x, device, &im);
    if (rc) {
        ferry_cuda_context_leave(primary);
        return rc;
    }
    FERRY_CUstream stream;
    FERRY_CUdeviceptr remote = im->mapped + off, here = (FERRY_CUdeviceptr)(uintptr_t)local;
    err = stream_here(ic, &stream);
    if (err == FERRY_CUDA_SUCCESS)
        err = drv.memcpy_async(to_local ? here : remote, to_local ? remote : here, n, stream);
    /* Done means done on the device: the caller holds the registry's read
     * lock until this returns, so no byte lands after a deregistration or
     * a cancel's barrier. */
    if (err == FERRY_CUDA_SUCCESS) err = drv.stream_sync(stream);
    ferry_cuda_context_leave(primary);
    import_put(im);
    if (err != FERRY_CUDA_SUCCESS)
        return cuda_fail(err, to_local ? "copying from the initiator" : "copying to the initiator", n, local);
    return 0;
}

#endif
