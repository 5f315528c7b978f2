/* SPDX-License-Identifier: Apache-2.0 */
/* Pre-registered pools: a binary buddy allocator over one registered
 * region (include/ferry/pool.h). Hand-written: it sits on the per-send path
 * that a pool exists to make cheap, and a general allocator cannot hand out
 * memory from a given registered range.
 *
 * The pool is cut into 4 KiB blocks. A free run of 2^k blocks starts at a
 * block index that is a multiple of 2^k; its buddy is index ^ 2^k. The
 * metadata lives outside the pool (one tag byte and two links per block), so
 * the pool's memory is never written by the allocator. */
#include <ferry/pool.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "parts.h"
#include "link/share.h"
#include "util/sized.h"

#include "util/fail.h"
#include "util/log.h"

#define MAX_ORDERS 40
#define NIL UINT32_MAX
#define TAG_FREE 0x40u /* head of a free run; low 6 bits: its order */
#define TAG_USED 0x80u /* head of an allocation; low 6 bits: its order */
#define TAG_ORDER(t) ((unsigned)(t) & 0x3fu)

struct ferry_pool {
    ferry_engine_t *engine;
    unsigned char *base;
    size_t size;             /* nblocks * FERRY_POOL_BLOCK */
    uint32_t nblocks;
    unsigned max_order;      /* largest order a run can have */
    pthread_mutex_t lock;
    uint8_t *tag;            /* per block */
    uint32_t *next, *prev;   /* free-list links of run heads */
    uint32_t head[MAX_ORDERS];
    size_t used, live;
    int memfd;               /* shared pools: the data's memfd (mapped at base), else -1 */
    int ctlfd;               /* shared pools: the control header's memfd, else -1 */
    unsigned char *map;      /* shared pools: the control header's mapping */
    size_t map_len;
};

static void push_free(ferry_pool_t *p, uint32_t i, unsigned k)
{
    p->tag[i] = (uint8_t)(k | TAG_FREE);
    p->prev[i] = NIL;
    p->next[i] = p->head[k];
    if (p->head[k] != NIL) p->prev[p->head[k]] = i;
    p->head[k] = i;
}

static void remove_free(ferry_pool_t *p, uint32_t i, unsigned k)
{
    if (p->prev[i] != NIL)
        p->next[p->prev[i]] = p->next[i];
    else
        p->head[k] = p->next[i];
    if (p->next[i] != NIL) p->prev[p->next[i]] = p->prev[i];
    p->tag[i] = 0;
}

static size_t largest_free_locked(const ferry_pool_t *p)
{
    for (unsigned k = p->max_order + 1; k-- > 0;)
        if (p->head[k] != NIL) return (size_t)FERRY_POOL_BLOCK << k;
    return 0;
}

static void unmap_pool(ferry_pool_t *p);

/* A memfd of len bytes mapped read-write here at *mem, then sealed: never
 * shrinking (a peer's mapping can never fault with SIGBUS) nor growing,
 * and with read_only, against any later writable mapping or write(2),
 * whoever opens it (through /proc/<pid>/fd, in whatever mode): only our
 * own mapping, made before the seal, can write it. The fd, or -1. */
static int sealed_memfd(const char *name, size_t len, bool read_only, unsigned char **mem)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    void *m = MAP_FAILED;
    unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | (read_only ? F_SEAL_FUTURE_WRITE : 0);
    if (ftruncate(fd, (off_t)len) == 0) m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED && fcntl(fd, F_ADD_SEALS, seals) == 0) {
        *mem = m;
        return fd;
    }
    if (m != MAP_FAILED) munmap(m, len);
    close(fd);
    return -1;
}

/* Maps the pool: anonymous memory, or (shared) two sealed memfds: the
 * control header (core/share.h), which only we can write, and the data,
 * which peers can write only if the pool is remote-writable. */
static unsigned char *map_pool(ferry_pool_t *p, bool shared, unsigned flags)
{
    if (!shared) {
        void *mem = mmap(NULL, p->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return mem == MAP_FAILED ? NULL : mem;
    }
    unsigned char *data = NULL;
    p->map_len = FERRY_SHARE_HEADER;
    p->ctlfd = sealed_memfd("ferry-pool-ctl", p->map_len, true, &p->map);
    if (p->ctlfd >= 0) p->memfd = sealed_memfd("ferry-pool", p->size, !(flags & FERRY_MEM_REMOTE_WRITE), &data);
    if (p->memfd < 0) {
        unmap_pool(p);
        return NULL;
    }
    return data;
}

static void unmap_pool(ferry_pool_t *p)
{
    if (p->ctlfd >= 0) {
        munmap(p->map, p->map_len);
        close(p->ctlfd);
        p->ctlfd = -1;
        p->map = NULL;
    }
    if (p->memfd >= 0) {
        close(p->memfd);
        p->memfd = -1;
    }
    if (p->base) munmap(p->base, p->size);
    p->base = NULL;
}

/* ---------------------------------------------- the shared pools' slot */

void ferry_share_revoke(ferry_share_ctl_t *ctl)
{
    atomic_store(&ctl->state, FERRY_SHARE_REVOKED);
    /* Before any read of the pool's bytes that follows (the detach's copy):
     * an initiator that reads LIVE after its copies and its own fence then
     * has its bytes seen by that copy (share.h). A seq_cst store alone
     * does not order later plain loads on every architecture. */
    ferry_share_fence();
}

int ferry_share_detach(void *base, size_t len, int fd, uint64_t off)
{
    void *fresh = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    int err = 0;
    if (fresh == MAP_FAILED) {
        err = errno;
    } else {
        memcpy(fresh, base, len);
        if (mremap(fresh, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, base) == MAP_FAILED) {
            err = errno;
            munmap(fresh, len);
        } else if (fd >= 0) {
            /* The memfd's pages are nobody's now: give them back (peers
             * still mapping them see zeros). A read-only pool's seal
             * refuses this; its pages go when the pool is destroyed. */
            (void)fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
        }
    }
    if (err)
        FERRY_LOG(FERRY_LOG_WARN, "pool",
                  "cannot detach shared pool [%p+%zu) from its peers' mappings: %s; a same-host peer that mapped "
                  "it can still write it",
                  base, len, strerror(err));
    return -err;
}

/* A shared pool's region left the registry while the pool still maps it
 * (a deregistration of its base, the engine's destruction): revoked under
 * the registry's lock, then detached (a copy of the whole pool) outside. */
static void share_release(void *ctx, const ferry_region_t *reg, void *state)
{
    (void)ctx, (void)reg;
    ferry_share_revoke(((ferry_share_t *)state)->ctl);
}

static void share_released(void *ctx, const ferry_region_t *reg, void *state)
{
    (void)ctx;
    ferry_share_t *sh = state;
    ferry_share_detach((void *)(uintptr_t)reg->addr, (size_t)reg->len, sh->fd, sh->off);
    free(sh);
}

static const ferry_region_hook_t share_hook = {.release = share_release, .released = share_released};

/* Under the registry's write lock: the region becomes shareable, its
 * header live with the region's generation. */
static int share_locked(void *arg, ferry_region_t *reg)
{
    ferry_share_t *sh = arg;
    reg->slot[FERRY_REGION_SLOT_SHARE] = sh;
    atomic_store(&sh->ctl->generation, reg->generation);
    atomic_store(&sh->ctl->magic, FERRY_SHARE_MAGIC);
    atomic_store(&sh->ctl->state, FERRY_SHARE_LIVE);
    return 0;
}

/* Under the registry's write lock: revokes the shared region and makes it
 * an ordinary one (no detach: the pool is about to be unmapped anyway);
 * *arg gets the state to free. */
static int unshare_locked(void *arg, ferry_region_t *reg)
{
    ferry_share_t *sh = reg->slot[FERRY_REGION_SLOT_SHARE];
    if (!sh)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "unshare: no shared region starting at 0x%llx",
                          (unsigned long long)reg->addr);
    ferry_share_revoke(sh->ctl);
    reg->slot[FERRY_REGION_SLOT_SHARE] = NULL;
    *(ferry_share_t **)arg = sh;
    return 0;
}

static int share_region(ferry_engine_t *e, ferry_pool_t *p)
{
    ferry_share_t *sh = malloc(sizeof *sh);
    if (!sh) return ferry_fail(FERRY_ERR_MEMORY, "share: out of memory");
    *sh = (ferry_share_t){.fd = p->memfd, .off = 0, .ctl = (ferry_share_ctl_t *)p->map, .ctl_fd = p->ctlfd};
    ferry_registry_set_hook(ferry_engine_part_registry(e), FERRY_REGION_SLOT_SHARE, &share_hook);
    int rc = ferry_registry_update(ferry_engine_part_registry(e), (uint64_t)(uintptr_t)p->base, share_locked, sh, "share");
    if (rc) free(sh);
    return rc;
}

static void unshare_region(ferry_pool_t *p)
{
    ferry_share_t *sh = NULL;
    ferry_registry_update(ferry_engine_part_registry(p->engine), (uint64_t)(uintptr_t)p->base, unshare_locked, &sh, "unshare");
    free(sh);
}

static int pool_create(ferry_engine_t *e, size_t bytes, unsigned flags, bool shared, ferry_pool_t **out);

int ferry_pool_create(ferry_engine_t *e, size_t bytes, unsigned flags, ferry_pool_t **out)
{
    return pool_create(e, bytes, flags, false, out);
}

int ferry_pool_create_shared(ferry_engine_t *e, size_t bytes, unsigned flags, ferry_pool_t **out)
{
    /* A pool no peer may touch has no business in a memfd a peer could map. */
    return pool_create(e, bytes, flags, (flags & FERRY_MEM_REMOTE) != 0, out);
}

static int pool_create(ferry_engine_t *e, size_t bytes, unsigned flags, bool shared, ferry_pool_t **out)
{
    ferry_clear_last_error();
    if (!e || !out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "pool create: NULL argument");
    *out = NULL;
    if (bytes == 0 || bytes > (size_t)FERRY_POOL_BLOCK * (NIL - 1))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "pool create: size %zu not in [1, %zu]", bytes,
                          (size_t)FERRY_POOL_BLOCK * (NIL - 1));
    size_t nblocks = (bytes + FERRY_POOL_BLOCK - 1) / FERRY_POOL_BLOCK;
    ferry_pool_t *p = calloc(1, sizeof *p);
    if (!p) return ferry_fail(FERRY_ERR_MEMORY, "pool create: out of memory");
    p->engine = e;
    p->memfd = -1;
    p->ctlfd = -1;
    p->nblocks = (uint32_t)nblocks;
    p->size = nblocks * FERRY_POOL_BLOCK;
    p->tag = calloc(nblocks, 1);
    p->next = malloc(nblocks * sizeof *p->next);
    p->prev = malloc(nblocks * sizeof *p->prev);
    int rc = 0;
    if (p->tag && p->next && p->prev) p->base = map_pool(p, shared, flags);
    if (!p->tag || !p->next || !p->prev || !p->base)
        rc = ferry_fail(FERRY_ERR_MEMORY, "pool create: cannot map %zu bytes%s", p->size,
                        shared ? " in a memfd" : "");
    if (rc == 0) rc = ferry_register(e, p->base, p->size, flags);
    if (rc == 0 && shared) {
        rc = share_region(e, p);
        if (rc) ferry_deregister(e, p->base);
    }
    if (rc) {
        ferry_fail_context("pool create of %zu bytes", bytes);
        unmap_pool(p);
        free(p->tag);
        free(p->next);
        free(p->prev);
        free(p);
        return rc;
    }
    pthread_mutex_init(&p->lock, NULL);
    for (unsigned k = 0; k < MAX_ORDERS; k++) p->head[k] = NIL;
    while (((uint64_t)1 << (p->max_order + 1)) <= nblocks) p->max_order++;
    /* Cut [0, nblocks) into the largest aligned power-of-two runs. */
    for (uint32_t i = 0; i < p->nblocks;) {
        unsigned k = p->max_order;
        while (k > 0 && ((i & ((1u << k) - 1)) != 0 || (uint64_t)i + (1u << k) > p->nblocks)) k--;
        push_free(p, i, k);
        i += 1u << k;
    }
    *out = p;
    return 0;
}

int ferry_pool_alloc(ferry_pool_t *p, size_t len, void **out)
{
    ferry_clear_last_error();
    if (!p || !out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "pool alloc: NULL argument");
    *out = NULL;
    if (len == 0) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "pool alloc: length is 0");
    if (len > p->size)
        return ferry_fail(FERRY_ERR_MEMORY, "pool alloc: %zu bytes exceed the pool's %zu", len, p->size);
    size_t need = (len + FERRY_POOL_BLOCK - 1) / FERRY_POOL_BLOCK;
    unsigned k = 0;
    while (((size_t)1 << k) < need) k++;
    pthread_mutex_lock(&p->lock);
    unsigned j = k;
    while (j <= p->max_order && p->head[j] == NIL) j++;
    if (j > p->max_order) {
        size_t used = p->used, largest = largest_free_locked(p);
        pthread_mutex_unlock(&p->lock);
        return ferry_fail(FERRY_ERR_MEMORY,
                          "pool alloc: no free run of %zu bytes (%zu asked) in a pool of %zu: %zu used, largest "
                          "free run %zu",
                          (size_t)FERRY_POOL_BLOCK << k, len, p->size, used, largest);
    }
    uint32_t i = p->head[j];
    remove_free(p, i, j);
    while (j > k) {
        j--;
        push_free(p, i + (1u << j), j);
    }
    p->tag[i] = (uint8_t)(k | TAG_USED);
    p->used += (size_t)FERRY_POOL_BLOCK << k;
    p->live++;
    pthread_mutex_unlock(&p->lock);
    *out = p->base + (size_t)i * FERRY_POOL_BLOCK;
    return 0;
}

int ferry_pool_free(ferry_pool_t *p, void *ptr)
{
    ferry_clear_last_error();
    if (!p) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "pool free: pool is NULL");
    uintptr_t a = (uintptr_t)ptr, b = (uintptr_t)p->base;
    if (a < b || a >= b + p->size || (a - b) % FERRY_POOL_BLOCK)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "pool free: %p is not a buffer of the pool [%p+%zu)", ptr,
                          (void *)p->base, p->size);
    uint32_t i = (uint32_t)((a - b) / FERRY_POOL_BLOCK);
    pthread_mutex_lock(&p->lock);
    if (!(p->tag[i] & TAG_USED)) {
        pthread_mutex_unlock(&p->lock);
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "pool free: %p is not an allocated buffer (freed twice?)", ptr);
    }
    unsigned k = TAG_ORDER(p->tag[i]);
    p->tag[i] = 0;
    p->used -= (size_t)FERRY_POOL_BLOCK << k;
    p->live--;
    while (k < p->max_order) {
        uint32_t buddy = i ^ (1u << k);
        if ((uint64_t)buddy + (1u << k) > p->nblocks || p->tag[buddy] != (uint8_t)(k | TAG_FREE)) break;
        remove_free(p, buddy, k);
        if (buddy < i) i = buddy;
        k++;
    }
    push_free(p, i, k);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

int (ferry_pool_stats)(ferry_pool_t *p, ferry_pool_stats_t *out)
{
    if (!p || !out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "pool stats: NULL argument");
    int rc = ferry_sized_check(out, FERRY_POOL_STATS_SIZE_0_1, "pool stats");
    if (rc) return rc;
    ferry_pool_stats_t st = {.struct_size = sizeof st};
    pthread_mutex_lock(&p->lock);
    st.size = p->size;
    st.used = p->used;
    st.largest_free = largest_free_locked(p);
    st.allocations = p->live;
    pthread_mutex_unlock(&p->lock);
    ferry_sized_export(out, &st, sizeof st);
    return 0;
}

void ferry_pool_destroy(ferry_pool_t *p)
{
    if (!p) return;
    /* Unshared first: the pages are unmapped next, no detach needed. */
    if (p->memfd >= 0) unshare_region(p);
    ferry_deregister(p->engine, p->base);
    unmap_pool(p);
    pthread_mutex_destroy(&p->lock);
    free(p->tag);
    free(p->next);
    free(p->prev);
    free(p);
}
