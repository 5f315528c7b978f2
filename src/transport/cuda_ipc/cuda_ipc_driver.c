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
 * memory allocated: this bounds what stale ones hold).
 *
 * VMM memory (cuMemCreate + cuMemMap, e.g. PyTorch's expandable segments)
 * has no legacy IPC handle. The exporter tells it by
 * cuMemRetainAllocationHandle (which works only for VMM memory), exports
 * the allocation as a POSIX file descriptor (cuMemExportToShareableHandle;
 * only where it was created with that handle type) and sends its pid and
 * the descriptor's number. The importer takes the descriptor with
 * pidfd_open + pidfd_getfd (the kernel asks for ptrace permission over
 * the exporter, as for the shm transport's cross-memory attach; refused:
 * NOT_IMPLEMENTED, and the initiator moves to tcp), imports it
 * (cuMemImportFromShareableHandle) and maps it (cuMemAddressReserve,
 * cuMemMap, cuMemSetAccess for the local device); the import is cached and
 * retired exactly as a legacy one, and closing it unmaps, frees the
 * address range and releases the handle. These entry points are optional:
 * a driver without them exports and imports legacy handles only. */
#include "cuda_ipc.h"
#include "link/peer_pid.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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
    /* A negative device sets every bit, so the decoder refuses it as before. */
    put32(out + 80, x->device < 0 ? (uint32_t)x->device : ((uint32_t)x->device & 0xffffffu) | (x->kind & 0x7fu) << 24);
    put32(out + 84, deadline_ms);
}

void cuda_ipc_vmm_pack(const struct cuda_ipc_vmm *v, uint8_t handle[64])
{
    memset(handle, 0, 64);
    put32(handle, (uint32_t)v->pid);
    put32(handle + 4, (uint32_t)v->fd);
    put64(handle + 8, v->ino);
    put64(handle + 16, v->region);
    put32(handle + 24, v->generation);
}

void cuda_ipc_vmm_unpack(const uint8_t handle[64], struct cuda_ipc_vmm *v)
{
    v->pid = (int32_t)get32(handle);
    v->fd = (int32_t)get32(handle + 4);
    v->ino = get64(handle + 8);
    v->region = get64(handle + 16);
    v->generation = get32(handle + 24);
}

int cuda_ipc_export_decode(const uint8_t in[CUDA_IPC_EXPORT_SIZE], struct cuda_ipc_export *x, uint32_t *deadline_ms)
{
    memcpy(x->handle, in, sizeof x->handle);
    x->base = get64(in + 64);
    x->size = get64(in + 72);
    uint32_t word = get32(in + 80);
    x->device = (int32_t)(word & 0xffffffu);
    x->kind = (word >> 24) & 0x7fu;
    *deadline_ms = get32(in + 84);
    if (x->size == 0 || x->base + x->size < x->base || (word & 0x80000000u) || x->kind > CUDA_IPC_KIND_VMM)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                          "CUDA IPC export: allocation [0x%llx+%llu), device word 0x%x (device, kind %u)",
                          (unsigned long long)x->base, (unsigned long long)x->size, word, x->kind);
    return 0;
}

static _Atomic unsigned long imports_open, imports_opened;
static _Atomic int refuse_getfd; /* tests: pidfd_getfd fails with this errno */

void ferry_cuda_ipc_testing_refuse_getfd(int err) { atomic_store(&refuse_getfd, err); }

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

bool cuda_ipc_vmm_importable(void) { return false; }

void cuda_ipc_run_end(struct cuda_ipc_conn *ic) { (void)ic; }

int cuda_ipc_export_of(struct cuda_ipc_conn *ic, uint64_t region, uint32_t generation, const void *p, uint64_t len,
                       int ordinal, bool peer_vmm, struct cuda_ipc_export *out)
{
    (void)ic, (void)region, (void)generation, (void)p, (void)len, (void)ordinal, (void)peer_vmm, (void)out;
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

/* VMM export and import: optional (vmm_ok when every one is there). */
static struct {
    ferry_cuMemRetainAllocationHandle_fn retain;
    ferry_cuMemGetAllocationPropertiesFromHandle_fn properties;
    ferry_cuMemExportToShareableHandle_fn export_fd;
    ferry_cuMemImportFromShareableHandle_fn import_fd;
    ferry_cuMemRelease_fn release;
    ferry_cuMemAddressReserve_fn reserve;
    ferry_cuMemAddressFree_fn address_free;
    ferry_cuMemMap_fn map;
    ferry_cuMemUnmap_fn unmap;
    ferry_cuMemSetAccess_fn set_access;
} vmm;
static bool vmm_ok;

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
        if (st == 1) {
            static const struct {
                const char *name;
                void **slot;
            } optional[] = {
                {"cuMemRetainAllocationHandle", (void **)&vmm.retain},
                {"cuMemGetAllocationPropertiesFromHandle", (void **)&vmm.properties},
                {"cuMemExportToShareableHandle", (void **)&vmm.export_fd},
                {"cuMemImportFromShareableHandle", (void **)&vmm.import_fd},
                {"cuMemRelease", (void **)&vmm.release},
                {"cuMemAddressReserve", (void **)&vmm.reserve},
                {"cuMemAddressFree", (void **)&vmm.address_free},
                {"cuMemMap", (void **)&vmm.map},
                {"cuMemUnmap", (void **)&vmm.unmap},
                {"cuMemSetAccess", (void **)&vmm.set_access},
            };
            bool all = true;
            for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
                all = (*optional[i].slot = ferry_cuda_symbol(optional[i].name)) != NULL && all;
            vmm_ok = all; /* written before drv_state publishes it */
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

bool cuda_ipc_vmm_importable(void)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    return cuda_ipc_unusable() == NULL && vmm_ok;
#else
    return false;
#endif
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
    uint32_t kind;           /* CUDA_IPC_KIND_* */
    FERRY_CUmemGenericAllocationHandle vmm_handle; /* VMM: the imported allocation, mapped at mapped */
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

#define EXPORTS 32 /* per connection: an expandable segment of 20 MiB chunks is one export each */
#define STREAMS 8

struct cuda_ipc_conn {
    struct {
        uint64_t region;
        uint32_t generation;
        int fd; /* VMM: the exported descriptor, open while cached; -1 legacy */
        struct cuda_ipc_export x;
    } exports[EXPORTS];
    unsigned nexports, next_export;
    int *retired_fds; /* VMM exports dropped from the cache, closed by cuda_ipc_run_end */
    unsigned nretired, retired_cap;
    struct {
        FERRY_CUcontext ctx;
        FERRY_CUstream stream;
    } streams[STREAMS];
    unsigned nstreams;
    /* Target: whether the initiator is the pid its HELLO claims (decided at
     * its first VMM export: taking descriptors from a pid is as much as
     * attaching to it), its pidfd, and why not. */
    int peer_state; /* 0 undecided, 1 verified, -1 refused */
    int pidfd;
    char peer_why[200];
};

/* Closes an import (no copy uses it, it is off the list). */
static void import_close(struct import *im)
{
    int primary = -1;
    if (ferry_cuda_context_enter((const void *)(uintptr_t)im->mapped, im->device < 0 ? 0 : im->device, &primary) ==
        FERRY_CUDA_SUCCESS) {
        if (im->kind == CUDA_IPC_KIND_VMM) {
            vmm.unmap(im->mapped, (size_t)im->size);
            vmm.address_free(im->mapped, (size_t)im->size);
            vmm.release(im->vmm_handle);
        } else {
            drv.ipc_close(im->mapped);
        }
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

/* Whether im is the import of x: the same legacy handle, or the same VMM
 * allocation (all but the descriptor's number, which each export has its
 * own of). */
static bool same_export(const struct import *im, const struct cuda_ipc_export *x)
{
    if (im->kind != x->kind) return false;
    if (x->kind == CUDA_IPC_KIND_LEGACY) return memcmp(im->handle, x->handle, sizeof im->handle) == 0;
    struct cuda_ipc_vmm a, b;
    cuda_ipc_vmm_unpack(im->handle, &a);
    cuda_ipc_vmm_unpack(x->handle, &b);
    return a.pid == b.pid && a.ino == b.ino && a.region == b.region && a.generation == b.generation &&
           im->base == x->base && im->size == x->size;
}

/* The exporter's descriptor v->fd, taken into this process (pidfd_getfd
 * through pidfd, the verified initiator's, or one opened on v->pid where
 * pidfd_open was unavailable at the check; O_CLOEXEC). -1 with why filled
 * when the kernel refuses. */
static int take_fd(const struct cuda_ipc_vmm *v, int verified_pidfd, char *why, size_t cap)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    int pidfd = verified_pidfd >= 0 ? verified_pidfd : (int)syscall(SYS_pidfd_open, (pid_t)v->pid, 0);
    if (pidfd < 0) {
        snprintf(why, cap, "pidfd_open(%d): %s", (int)v->pid, strerror(errno));
        return -1;
    }
    int refuse = atomic_load(&refuse_getfd);
    int fd = refuse ? (errno = refuse, -1) : (int)syscall(SYS_pidfd_getfd, pidfd, v->fd, 0);
    int err = errno;
    if (pidfd != verified_pidfd) close(pidfd);
    if (fd < 0)
        snprintf(why, cap, "pidfd_getfd: %s (needs ptrace permission over the initiator: same user and "
                 "kernel.yama.ptrace_scope 0, or CAP_SYS_PTRACE)", strerror(err));
    return fd;
#else
    (void)v, (void)verified_pidfd;
    snprintf(why, cap, "pidfd_getfd is not in this build's kernel headers");
    return -1;
#endif
}

/* Maps the VMM allocation behind the descriptor fd at a new address
 * range, readable and writable by device (the import takes its own
 * reference: the caller closes fd). A CUDA error code. */
static int vmm_map(int fd, size_t size, int device, FERRY_CUmemGenericAllocationHandle *h, FERRY_CUdeviceptr *va)
{
    int err = vmm.import_fd(h, (void *)(intptr_t)fd, FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (err != FERRY_CUDA_SUCCESS) return err;
    *va = 0;
    err = vmm.reserve(va, size, 0, 0, 0);
    if (err == FERRY_CUDA_SUCCESS) {
        err = vmm.map(*va, size, 0, *h, 0);
        if (err == FERRY_CUDA_SUCCESS) {
            FERRY_CUmemAccessDesc access = {{FERRY_CU_MEM_LOCATION_TYPE_DEVICE, device < 0 ? 0 : device},
                                            FERRY_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            err = vmm.set_access(*va, size, &access, 1);
            if (err == FERRY_CUDA_SUCCESS) return err;
            vmm.unmap(*va, size);
        }
        vmm.address_free(*va, size);
    }
    vmm.release(*h);
    return err;
}

/* Opens the VMM export x of pid into im (mapped, vmm_handle). */
static int vmm_open(int32_t pid, int pidfd, const struct cuda_ipc_export *x, int device, struct import *im)
{
    struct cuda_ipc_vmm v;
    cuda_ipc_vmm_unpack(x->handle, &v);
    if (v.pid != pid)
        return ferry_fail(FERRY_ERR_ACCESS_DENIED, "CUDA IPC: a VMM export naming pid %d's descriptor from pid %d",
                          (int)v.pid, (int)pid);
    if (!vmm_ok)
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "cannot import pid %d's VMM allocation: the CUDA driver here "
                                                     "lacks the VMM entry points", (int)pid);
    char why[300];
    int fd = take_fd(&v, pidfd, why, sizeof why);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != v.ino)) {
        snprintf(why, sizeof why, "its descriptor %d no longer names the exported allocation", (int)v.fd);
        close(fd);
        fd = -1;
    }
    if (fd < 0) /* short: the session's transport reason keeps 128 bytes */
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "VMM import: %s", why);
    int err = vmm_map(fd, (size_t)x->size, device, &im->vmm_handle, &im->mapped);
    close(fd);
    if (err != FERRY_CUDA_SUCCESS)
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED,
                          "cannot map pid %d's VMM allocation [0x%llx+%llu) in this process: %s", (int)pid,
                          (unsigned long long)x->base, (unsigned long long)x->size,
                          ferry_cuda_error_text(err, why, sizeof why));
    im->kind = CUDA_IPC_KIND_VMM;
    return 0;
}

/* The import of x from pid, referenced (opened if need be, in the current
 * context). NOT_IMPLEMENTED when the driver cannot open it. */
static int import_get(struct cuda_ipc_conn *ic, int32_t pid, const struct cuda_ipc_export *x, int device,
                      struct import **out)
{
    pthread_mutex_lock(&imports_lock);
    struct import **link = &imports;
    while (*link) {
        struct import *im = *link;
        if (im->pid == pid && same_export(im, x)) {
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
    if (im && x->kind == CUDA_IPC_KIND_VMM) {
        int rc = vmm_open(pid, ic->pidfd, x, device, im);
        if (rc) {
            pthread_mutex_unlock(&imports_lock);
            free(im);
            return rc;
        }
    }
    int err = im ? FERRY_CUDA_SUCCESS : FERRY_CUDA_ERROR_OUT_OF_MEMORY;
    if (im && x->kind == CUDA_IPC_KIND_LEGACY) {
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

void cuda_ipc_run_end(struct cuda_ipc_conn *ic)
{
    for (unsigned i = 0; i < ic->nretired; i++) close(ic->retired_fds[i]);
    ic->nretired = 0;
}

static void conn_free(void *p)
{
    struct cuda_ipc_conn *ic = p;
    if (ic->peer_state == 1 && ic->pidfd >= 0) close(ic->pidfd);
    cuda_ipc_run_end(ic);
    free(ic->retired_fds);
    for (unsigned i = 0; i < ic->nexports; i++)
        if (ic->exports[i].fd >= 0) close(ic->exports[i].fd);
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
    ic->pidfd = -1;
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

/* VMM memory at p, its allocation h (retained by the caller): exported as
 * a descriptor (*fd) into x's handle. */
static int vmm_export(FERRY_CUmemGenericAllocationHandle h, const void *p, uint64_t len, uint64_t region,
                      uint32_t generation, struct cuda_ipc_export *x, int *fd)
{
    FERRY_CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    int err = vmm.properties(&prop, h);
    if (err != FERRY_CUDA_SUCCESS) return cuda_fail(err, "reading the VMM allocation's properties", (size_t)len, p);
    if (!(prop.requestedHandleTypes & FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED,
                          "CUDA IPC: [%p+%llu) is VMM memory (cuMemCreate) not created shareable as a POSIX file "
                          "descriptor (requested handle types 0x%x)",
                          p, (unsigned long long)len, prop.requestedHandleTypes);
    *fd = -1;
    err = vmm.export_fd(fd, h, FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (err != FERRY_CUDA_SUCCESS) return cuda_fail(err, "exporting the VMM allocation", (size_t)len, p);
    struct stat st;
    if (fstat(*fd, &st) != 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return ferry_fail(FERRY_ERR_INTERNAL, "CUDA IPC: the VMM export's descriptor: fstat: %s", strerror(e));
    }
    struct cuda_ipc_vmm v = {.pid = (int32_t)getpid(), .fd = *fd, .ino = (uint64_t)st.st_ino, .region = region,
                             .generation = generation};
    cuda_ipc_vmm_pack(&v, x->handle);
    x->kind = CUDA_IPC_KIND_VMM;
    return 0;
}

/* The export of the allocation holding [p, p+len) (the memory's context
 * current): *fd the VMM export's descriptor, -1 for a legacy handle. */
static int export_here(const void *p, uint64_t len, uint64_t region, uint32_t generation, bool peer_vmm,
                       struct cuda_ipc_export *x, int *fd)
{
    FERRY_CUdeviceptr base = 0;
    size_t size = 0;
    *fd = -1;
    int err = drv.address_range(&base, &size, (FERRY_CUdeviceptr)(uintptr_t)p);
    if (err != FERRY_CUDA_SUCCESS) return cuda_fail(err, "finding the allocation", (size_t)len, p);
    x->base = base;
    x->size = size;
    FERRY_CUmemGenericAllocationHandle h;
    if (vmm_ok && vmm.retain(&h, (void *)(uintptr_t)p) == FERRY_CUDA_SUCCESS) { /* VMM memory */
        int rc = peer_vmm ? vmm_export(h, p, len, region, generation, x, fd)
                          : ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC: [%p+%llu) is VMM memory (cuMemCreate) "
                                                                  "and the peer does not import VMM exports",
                                       p, (unsigned long long)len);
        vmm.release(h);
        return rc;
    }
    FERRY_CUipcMemHandle ipc;
    err = drv.ipc_get(&ipc, base);
    if (err != FERRY_CUDA_SUCCESS) return cuda_fail(err, "exporting the allocation", (size_t)len, p);
    memcpy(x->handle, ipc.reserved, sizeof x->handle);
    x->kind = CUDA_IPC_KIND_LEGACY;
    return 0;
}

/* A VMM export's descriptor dropped from the cache: closed at the run's
 * end (a frame in flight may name it). Closed now only when the list
 * cannot grow (then the target's inode check catches a reused number). */
static void retire_fd(struct cuda_ipc_conn *ic, int fd)
{
    if (fd < 0) return;
    if (ic->nretired == ic->retired_cap) {
        unsigned cap = ic->retired_cap ? 2 * ic->retired_cap : 8;
        int *more = realloc(ic->retired_fds, cap * sizeof *more);
        if (!more) {
            close(fd);
            return;
        }
        ic->retired_fds = more;
        ic->retired_cap = cap;
    }
    ic->retired_fds[ic->nretired++] = fd;
}

int cuda_ipc_export_of(struct cuda_ipc_conn *ic, uint64_t region, uint32_t generation, const void *p, uint64_t len,
                       int ordinal, bool peer_vmm, struct cuda_ipc_export *out)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    for (unsigned i = 0; i < ic->nexports; i++) {
        const struct cuda_ipc_export *x = &ic->exports[i].x;
        if (ic->exports[i].region != region) continue;
        if (ic->exports[i].generation != generation) {
            /* The region was registered again: this entry never matches
             * again, and a VMM export's descriptor must not keep the old
             * memory allocated until it leaves the cache. */
            retire_fd(ic, ic->exports[i].fd);
            ic->exports[i].fd = -1;
            ic->exports[i].region = 0;
            continue;
        }
        if (a >= x->base && a - x->base <= x->size && len <= x->size - (a - x->base)) {
            *out = *x;
            return 0;
        }
    }
    if (resolve() != 1) return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC: %s", cuda_ipc_unusable());
    int primary = -1, err = ferry_cuda_context_enter(p, ordinal, &primary);
    if (err != FERRY_CUDA_SUCCESS) return cuda_fail(err, "entering the memory's context", (size_t)len, p);
    struct cuda_ipc_export x = {.device = ordinal};
    int fd = -1;
    int rc = export_here(p, len, region, generation, peer_vmm, &x, &fd);
    ferry_cuda_context_leave(primary);
    if (rc) return rc;
    if (a - x.base > x.size || len > x.size - (a - x.base)) {
        if (fd >= 0) close(fd);
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC: [%p+%llu) is not in one allocation ([0x%llx+%llu))", p,
                          (unsigned long long)len, (unsigned long long)x.base, (unsigned long long)x.size);
    }
    bool evict = ic->nexports == EXPORTS;
    unsigned slot = evict ? ic->next_export++ % EXPORTS : ic->nexports++;
    if (evict) retire_fd(ic, ic->exports[slot].fd);
    ic->exports[slot].region = region;
    ic->exports[slot].generation = generation;
    ic->exports[slot].fd = fd;
    ic->exports[slot].x = x;
    *out = x;
    return 0;
}

/* A VMM export is a descriptor to take from the pid the initiator's HELLO
 * claims: only from a connection that pid is verified to own (as shm
 * verifies before it attaches: link/peer_pid.c), else any local process
 * could name another's pid and descriptor and have this target copy that
 * process's device memory out or its own into it. Once per connection;
 * NOT_IMPLEMENTED with the reason when refused (the session goes by tcp). */
static int verify_peer(struct cuda_ipc_conn *ic, ferry_conn_t *c)
{
    if (ic->peer_state == 0)
        ic->peer_state = ferry_peer_verify_pid(c, false, &ic->pidfd, ic->peer_why, sizeof ic->peer_why) == 0 ? 1 : -1;
    if (ic->peer_state == 1 && ferry_pidfd_exited(ic->pidfd)) {
        close(ic->pidfd);
        ic->pidfd = -1;
        ic->peer_state = -1;
        snprintf(ic->peer_why, sizeof ic->peer_why, "the verified initiator pid %d has exited", (int)c->peer.pid);
    }
    if (ic->peer_state == 1) return 0;
    return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "VMM import refused: %s", ic->peer_why);
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
    int rc = x->kind == CUDA_IPC_KIND_VMM ? verify_peer(ic, c) : 0;
    if (rc == 0) rc = import_get(ic, c->peer.pid, x, device, &im);
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
