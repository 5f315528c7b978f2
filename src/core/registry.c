/* The region registry. glibc's tsearch family is a red-black tree; ordering
 * ranges by "a ends before b starts" makes any two overlapping ranges compare
 * equal, so tsearch itself refuses overlaps and tfind finds the region that
 * contains an address, both in O(log n). */
#include "registry.h"

#include <sched.h>
#include <errno.h>
#include <fcntl.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "clock.h"
#include "fail.h"
#include "log.h"
#include "share.h"

static int compare_ranges(const void *pa, const void *pb)
{
    const ferry_region_t *a = pa, *b = pb;
    if (a->addr + a->len <= b->addr) return -1;
    if (a->addr >= b->addr + b->len) return 1;
    return 0;
}

int ferry_registry_init(ferry_registry_t *r)
{
    memset(r, 0, sizeof *r);
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* A steady stream of placements must not starve (de)registration. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&r->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    r->next_generation = 1;
    r->export_version = UINT64_MAX;
    return 0;
}

static void revoke_visit(const void *node, VISIT which, void *closure)
{
    (void)closure;
    if (which != postorder && which != leaf) return;
    ferry_region_t *reg = *(ferry_region_t *const *)node;
    if (!reg->share_ctl) return;
    ferry_share_revoke(reg->share_ctl);
    ferry_share_detach((void *)(uintptr_t)reg->addr, (size_t)reg->len, reg->share_fd, reg->share_off);
}

void ferry_registry_destroy(ferry_registry_t *r)
{
    ferry_registry_release_all(r);
    /* Shared pools outliving their engine: no peer writes into them now. */
    twalk_r(r->root, revoke_visit, NULL);
    tdestroy(r->root, free);
    r->root = NULL;
    free(r->export_segs);
    pthread_rwlock_destroy(&r->lock);
}

static int validate_range(uint64_t addr, uint64_t len)
{
    if (addr == 0) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: address is NULL");
    if (len == 0) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: length is 0 at 0x%llx", (unsigned long long)addr);
    if (addr + len < addr)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: [0x%llx+%llu) wraps the address space",
                          (unsigned long long)addr, (unsigned long long)len);
    return 0;
}

/* With the write lock held. */
static int add_locked(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t flags, uint32_t kind)
{
    ferry_region_t *reg = malloc(sizeof *reg);
    if (!reg) return ferry_fail(FERRY_ERR_MEMORY, "register: out of memory");
    reg->addr = addr;
    reg->len = len;
    reg->flags = flags;
    reg->kind = kind;
    reg->xport = NULL;
    reg->share_fd = -1;
    reg->share_off = 0;
    reg->share_ctl = NULL;
    reg->share_ctl_fd = -1;
    reg->generation = r->next_generation++;
    if (r->next_generation == 0) r->next_generation = 1; /* 0 means "any" on the wire */
    void **slot = tsearch(reg, &r->root, compare_ranges);
    if (!slot) {
        free(reg);
        return ferry_fail(FERRY_ERR_MEMORY, "register: out of memory");
    }
    if (*slot != reg) {
        const ferry_region_t *old = *slot;
        free(reg);
        return ferry_fail(FERRY_ERR_ADDRESS_OVERLAPPED,
                          "register [0x%llx+%llu) overlaps registered region [0x%llx+%llu)",
                          (unsigned long long)addr, (unsigned long long)len,
                          (unsigned long long)old->addr, (unsigned long long)old->len);
    }
    r->count++;
    r->version++;
    if (kind) atomic_fetch_add_explicit(&r->device_count, 1, memory_order_relaxed);
    return 0;
}

static ferry_region_t *find_locked(ferry_registry_t *r, uint64_t addr)
{
    ferry_region_t key = {.addr = addr, .len = 1};
    void **slot = tfind(&key, &r->root, compare_ranges);
    return slot ? *slot : NULL;
}

static void remove_locked(ferry_registry_t *r, ferry_region_t *reg)
{
    if (reg->xport && r->release) r->release(r->release_ctx, reg);
    if (reg->kind) atomic_fetch_sub_explicit(&r->device_count, 1, memory_order_relaxed);
    tdelete(reg, &r->root, compare_ranges);
    free(reg);
    r->count--;
    r->version++;
}

int ferry_registry_add(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t flags)
{
    return ferry_registry_add_kind(r, addr, len, flags, 0);
}

int ferry_registry_add_kind(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t flags, uint32_t kind)
{
    int rc = validate_range(addr, len);
    if (rc) return rc;
    pthread_rwlock_wrlock(&r->lock);
    rc = add_locked(r, addr, len, flags, kind);
    pthread_rwlock_unlock(&r->lock);
    return rc;
}

int ferry_registry_add_many(ferry_registry_t *r, void *const *addrs, const size_t *lens, size_t n,
                            uint32_t flags)
{
    return ferry_registry_add_many_kinds(r, addrs, lens, n, flags, NULL);
}

int ferry_registry_add_many_kinds(ferry_registry_t *r, void *const *addrs, const size_t *lens, size_t n,
                                  uint32_t flags, const uint32_t *kinds)
{
    if (!addrs || !lens) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register batch: NULL array");
    for (size_t i = 0; i < n; i++) {
        int rc = validate_range((uint64_t)(uintptr_t)addrs[i], lens[i]);
        if (rc) return ferry_fail_context("region %zu of %zu", i, n);
    }
    pthread_rwlock_wrlock(&r->lock);
    int rc = 0;
    size_t done = 0;
    for (; done < n; done++) {
        rc = add_locked(r, (uint64_t)(uintptr_t)addrs[done], lens[done], flags, kinds ? kinds[done] : 0);
        if (rc) break;
    }
    if (rc) {
        ferry_fail_context("region %zu of %zu (none registered)", done, n);
        for (size_t i = 0; i < done; i++) remove_locked(r, find_locked(r, (uint64_t)(uintptr_t)addrs[i]));
    }
    pthread_rwlock_unlock(&r->lock);
    return rc;
}

int ferry_registry_remove(ferry_registry_t *r, uint64_t addr)
{
    if (addr == 0) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "deregister: address is NULL");
    pthread_rwlock_wrlock(&r->lock);
    ferry_region_t *reg = find_locked(r, addr);
    int rc = 0;
    ferry_share_ctl_t *ctl = NULL;
    uint64_t shared_len = 0, shared_off = 0;
    int shared_fd = -1;
    if (!reg)
        rc = ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED, "deregister: no region at 0x%llx", (unsigned long long)addr);
    else if (reg->addr != addr)
        rc = ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                        "deregister: 0x%llx is inside region [0x%llx+%llu), not its start",
                        (unsigned long long)addr, (unsigned long long)reg->addr, (unsigned long long)reg->len);
    else {
        ctl = reg->share_ctl;
        shared_len = reg->len;
        shared_fd = reg->share_fd;
        shared_off = reg->share_off;
        if (ctl) ferry_share_revoke(ctl);
        remove_locked(r, reg);
    }
    pthread_rwlock_unlock(&r->lock);
    /* Outside the lock (the move copies the whole pool): no placement by
     * this engine starts into the range now, and peers' mappings stop
     * reaching it once it returns. */
    if (ctl) ferry_share_detach((void *)(uintptr_t)addr, (size_t)shared_len, shared_fd, shared_off);
    return rc;
}

int ferry_registry_unshare(ferry_registry_t *r, uint64_t addr)
{
    pthread_rwlock_wrlock(&r->lock);
    ferry_region_t *reg = find_locked(r, addr);
    int rc = 0;
    if (!reg || reg->addr != addr || !reg->share_ctl) {
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "unshare: no shared region starting at 0x%llx",
                        (unsigned long long)addr);
    } else {
        ferry_share_revoke(reg->share_ctl);
        reg->share_fd = -1;
        reg->share_off = 0;
        reg->share_ctl = NULL;
        reg->share_ctl_fd = -1;
    }
    pthread_rwlock_unlock(&r->lock);
    return rc;
}

int ferry_registry_set_shared(ferry_registry_t *r, uint64_t addr, int fd, void *ctl, int ctl_fd)
{
    pthread_rwlock_wrlock(&r->lock);
    ferry_region_t *reg = find_locked(r, addr);
    int rc = 0;
    if (!reg || reg->addr != addr || !ctl || fd < 0 || ctl_fd < 0) {
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "share: no region starting at 0x%llx", (unsigned long long)addr);
    } else {
        ferry_share_ctl_t *c = ctl;
        reg->share_fd = fd;
        reg->share_off = 0;
        reg->share_ctl = ctl;
        reg->share_ctl_fd = ctl_fd;
        atomic_store(&c->generation, reg->generation);
        atomic_store(&c->magic, FERRY_SHARE_MAGIC);
        atomic_store(&c->state, FERRY_SHARE_LIVE);
    }
    pthread_rwlock_unlock(&r->lock);
    return rc;
}

void ferry_share_revoke(ferry_share_ctl_t *ctl)
{
    atomic_store(&ctl->state, FERRY_SHARE_REVOKED);
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

ferry_region_t *ferry_registry_lookup_locked(ferry_registry_t *r, uint64_t addr, uint64_t len)
{
    ferry_region_t *reg = find_locked(r, addr);
    if (!reg || len == 0 || addr + len < addr || addr + len > reg->addr + reg->len) return NULL;
    return reg;
}

void ferry_registry_set_release(ferry_registry_t *r, ferry_region_release_fn fn, void *ctx)
{
    pthread_rwlock_wrlock(&r->lock);
    r->release = fn;
    r->release_ctx = ctx;
    pthread_rwlock_unlock(&r->lock);
}

static void release_visit(const void *node, VISIT which, void *closure)
{
    if (which != postorder && which != leaf) return;
    ferry_region_t *reg = *(ferry_region_t *const *)node;
    ferry_registry_t *r = closure;
    if (reg->xport && r->release) r->release(r->release_ctx, reg);
    reg->xport = NULL;
}

void ferry_registry_release_all(ferry_registry_t *r)
{
    pthread_rwlock_wrlock(&r->lock);
    if (r->release) twalk_r(r->root, release_visit, r);
    r->release = NULL;
    r->release_ctx = NULL;
    pthread_rwlock_unlock(&r->lock);
}

/* ---------------------------------------------------------------- checks */

struct nearest_ctx {
    uint64_t addr;
    const ferry_region_t *below; /* highest region starting at or before addr */
};

static void nearest_visit(const void *node, VISIT which, void *closure)
{
    if (which != postorder && which != leaf) return;
    const ferry_region_t *reg = *(ferry_region_t *const *)node;
    struct nearest_ctx *c = closure;
    if (reg->addr <= c->addr && (!c->below || reg->addr > c->below->addr)) c->below = reg;
}

/* Error path only: a linear walk to name the region nearest below addr. */
static void describe_nearest(ferry_registry_t *r, uint64_t addr, char *out, size_t cap)
{
    struct nearest_ctx c = {.addr = addr, .below = NULL};
    twalk_r(r->root, nearest_visit, &c);
    if (!c.below)
        snprintf(out, cap, "no registered region below it (%zu regions)", r->count);
    else
        snprintf(out, cap, "nearest region below is [0x%llx+%llu), ending %llu bytes before it (%zu regions)",
                 (unsigned long long)c.below->addr, (unsigned long long)c.below->len,
                 (unsigned long long)(addr - (c.below->addr + c.below->len)), r->count);
}

static const char *flag_text(uint32_t flags)
{
    switch (flags & FERRY_MEM_REMOTE) {
    case FERRY_MEM_REMOTE: return "remote read+write";
    case FERRY_MEM_REMOTE_READ: return "remote read only";
    case FERRY_MEM_REMOTE_WRITE: return "remote write only";
    default: return "local only";
    }
}

int ferry_registry_check_locked(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t need_flags,
                                uint32_t generation, const char *side)
{
    const unsigned long long a = addr, l = len;
    if (len == 0) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "%s range at 0x%llx has length 0", side, a);
    if (addr + len < addr) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "%s range [0x%llx+%llu) wraps", side, a, l);
    ferry_region_t *reg = find_locked(r, addr);
    if (!reg) {
        char near[160];
        describe_nearest(r, addr, near, sizeof near);
        return ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED, "%s range [0x%llx+%llu) is not registered; %s", side, a,
                          l, near);
    }
    const unsigned long long ra = reg->addr, rl = reg->len;
    if (addr + len > reg->addr + reg->len)
        return ferry_fail(FERRY_ERR_OUT_OF_BOUNDS,
                          "%s range [0x%llx+%llu) runs %llu bytes past the end of region [0x%llx+%llu)", side, a, l,
                          (unsigned long long)(addr + len - (reg->addr + reg->len)), ra, rl);
    if ((reg->flags & need_flags) != need_flags)
        return ferry_fail(FERRY_ERR_ACCESS_DENIED, "%s range [0x%llx+%llu) is in region [0x%llx+%llu) registered %s",
                          side, a, l, ra, rl, flag_text(reg->flags));
    if (generation && reg->generation != generation)
        return ferry_fail(FERRY_ERR_STALE_SEGMENT,
                          "%s range [0x%llx+%llu): region [0x%llx+%llu) was registered again (generation %u, "
                          "expected %u)", side, a, l, ra, rl, reg->generation, generation);
    return 0;
}

int ferry_registry_check(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t need_flags, const char *side)
{
    pthread_rwlock_rdlock(&r->lock);
    int rc = ferry_registry_check_locked(r, addr, len, need_flags, 0, side);
    pthread_rwlock_unlock(&r->lock);
    return rc;
}

void ferry_registry_read_lock(ferry_registry_t *r) { pthread_rwlock_rdlock(&r->lock); }
void ferry_registry_unlock(ferry_registry_t *r) { pthread_rwlock_unlock(&r->lock); }

void ferry_registry_barrier(ferry_registry_t *r)
{
    pthread_rwlock_wrlock(&r->lock);
    pthread_rwlock_unlock(&r->lock);
}

/* ---------------------------------------------------------------- export */

struct export_ctx {
    ferry_segment_t *out;
    size_t n;
};

static void export_visit(const void *node, VISIT which, void *closure)
{
    if (which != postorder && which != leaf) return;
    const ferry_region_t *reg = *(ferry_region_t *const *)node;
    if (!(reg->flags & FERRY_MEM_REMOTE)) return;
    struct export_ctx *c = closure;
    c->out[c->n++] = (ferry_segment_t){reg->addr, reg->len, reg->flags, reg->generation};
}

/* With the write lock held: rebuilds the sorted export if stale. */
static void refresh_export_locked(ferry_registry_t *r)
{
    if (r->export_version == r->version) return;
    free(r->export_segs);
    r->export_segs = malloc((r->count ? r->count : 1) * sizeof *r->export_segs);
    struct export_ctx c = {.out = r->export_segs, .n = 0};
    if (c.out) twalk_r(r->root, export_visit, &c);
    r->export_count = c.n;
    r->export_version = c.out ? r->version : UINT64_MAX;
}

size_t ferry_registry_export(ferry_registry_t *r, size_t start, ferry_segment_t *out, size_t max, size_t *total,
                             uint64_t *version)
{
    pthread_rwlock_wrlock(&r->lock);
    refresh_export_locked(r);
    size_t n = 0;
    if (start < r->export_count) {
        n = r->export_count - start;
        if (n > max) n = max;
        memcpy(out, r->export_segs + start, n * sizeof *out);
    }
    *total = r->export_count;
    *version = r->version;
    pthread_rwlock_unlock(&r->lock);
    return n;
}

size_t ferry_registry_count(ferry_registry_t *r)
{
    pthread_rwlock_rdlock(&r->lock);
    size_t n = r->count;
    pthread_rwlock_unlock(&r->lock);
    return n;
}

uint64_t ferry_registry_version(ferry_registry_t *r)
{
    pthread_rwlock_rdlock(&r->lock);
    uint64_t v = r->version;
    pthread_rwlock_unlock(&r->lock);
    return v;
}

void ferry_registry_summary(ferry_registry_t *r, uint64_t *version, size_t *count)
{
    pthread_rwlock_rdlock(&r->lock);
    *version = r->version;
    *count = r->count;
    pthread_rwlock_unlock(&r->lock);
}
