/* SPDX-License-Identifier: Apache-2.0 */
/* The region registry. glibc's tsearch family is a red-black tree; ordering
 * ranges by "a ends before b starts" makes any two overlapping ranges compare
 * equal, so tsearch itself refuses overlaps and tfind finds the region that
 * contains an address, both in O(log n). */
#include "registry.h"

#include <sched.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"

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

/* Hands each slot's state of reg to the slot's release hook, with the
 * write lock held, and clears the slot. */
static void release_slots_locked(ferry_registry_t *r, ferry_region_t *reg)
{
    for (unsigned i = 0; i < FERRY_REGION_SLOTS; i++) {
        const ferry_region_hook_t *h = &r->hooks[i];
        if (reg->slot[i] && h->release) h->release(h->ctx, reg, reg->slot[i]);
    }
}

/* After the lock is dropped: the released hooks of the slots of gone (a
 * copy of a region that left), with the hooks as they were then. */
static void released_slots(const ferry_region_hook_t *hooks, const ferry_region_t *gone)
{
    for (unsigned i = 0; i < FERRY_REGION_SLOTS; i++)
        if (gone->slot[i] && hooks[i].release && hooks[i].released)
            hooks[i].released(hooks[i].ctx, gone, gone->slot[i]);
}

static void destroy_visit(const void *node, VISIT which, void *closure)
{
    if (which != postorder && which != leaf) return;
    ferry_region_t *reg = *(ferry_region_t *const *)node;
    ferry_registry_t *r = closure;
    release_slots_locked(r, reg);
    released_slots(r->hooks, reg);
}

void ferry_registry_destroy(ferry_registry_t *r)
{
    /* Regions left at the end (shared pools outliving their engine) are
     * released as if deregistered: no peer writes into them now. */
    twalk_r(r->root, destroy_visit, r);
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
    memset(reg->slot, 0, sizeof reg->slot);
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
    release_slots_locked(r, reg);
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
    ferry_region_t gone = {.addr = 0};
    ferry_region_hook_t hooks[FERRY_REGION_SLOTS];
    if (!reg)
        rc = ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED, "deregister: no region at 0x%llx", (unsigned long long)addr);
    else if (reg->addr != addr)
        rc = ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                        "deregister: 0x%llx is inside region [0x%llx+%llu), not its start",
                        (unsigned long long)addr, (unsigned long long)reg->addr, (unsigned long long)reg->len);
    else {
        gone = *reg;
        memcpy(hooks, r->hooks, sizeof hooks);
        remove_locked(r, reg);
    }
    pthread_rwlock_unlock(&r->lock);
    /* Outside the lock (a shared pool's detach copies the whole pool): no
     * placement by this engine starts into the range now. */
    if (gone.addr) released_slots(hooks, &gone);
    return rc;
}

int ferry_registry_update(ferry_registry_t *r, uint64_t addr, int (*fn)(void *arg, ferry_region_t *reg), void *arg,
                          const char *what)
{
    pthread_rwlock_wrlock(&r->lock);
    ferry_region_t *reg = find_locked(r, addr);
    int rc;
    if (!reg || reg->addr != addr)
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "%s: no region starting at 0x%llx", what, (unsigned long long)addr);
    else
        rc = fn(arg, reg);
    pthread_rwlock_unlock(&r->lock);
    return rc;
}

ferry_region_t *ferry_registry_lookup_locked(ferry_registry_t *r, uint64_t addr, uint64_t len)
{
    ferry_region_t *reg = find_locked(r, addr);
    if (!reg || len == 0 || addr + len < addr || addr + len > reg->addr + reg->len) return NULL;
    return reg;
}

void ferry_registry_set_hook(ferry_registry_t *r, unsigned slot, const ferry_region_hook_t *hook)
{
    if (slot >= FERRY_REGION_SLOTS) return;
    pthread_rwlock_wrlock(&r->lock);
    if (hook)
        r->hooks[slot] = *hook;
    else
        memset(&r->hooks[slot], 0, sizeof r->hooks[slot]);
    pthread_rwlock_unlock(&r->lock);
}

struct release_ctx {
    ferry_registry_t *r;
    unsigned slot;
};

static void release_visit(const void *node, VISIT which, void *closure)
{
    if (which != postorder && which != leaf) return;
    ferry_region_t *reg = *(ferry_region_t *const *)node;
    const struct release_ctx *c = closure;
    const ferry_region_hook_t *h = &c->r->hooks[c->slot];
    if (reg->slot[c->slot]) h->release(h->ctx, reg, reg->slot[c->slot]);
    reg->slot[c->slot] = NULL;
}

void ferry_registry_release_slot(ferry_registry_t *r, unsigned slot)
{
    if (slot >= FERRY_REGION_SLOTS) return;
    pthread_rwlock_wrlock(&r->lock);
    struct release_ctx c = {r, slot};
    if (r->hooks[slot].release) twalk_r(r->root, release_visit, &c);
    memset(&r->hooks[slot], 0, sizeof r->hooks[slot]);
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
