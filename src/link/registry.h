/* SPDX-License-Identifier: Apache-2.0 */
/* The registry of memory regions: a balanced tree (glibc's tsearch, a
 * red-black tree) of non-overlapping [addr, addr+len) ranges under a
 * writer-preferring rwlock. Lookups are O(log n). */
#ifndef FERRY_REGISTRY_H
#define FERRY_REGISTRY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

/* Per-region slots: each part that keeps state per region owns one and
 * installs the slot's release hook. Slot 0 is the core's shared pools'
 * (core/pool.c, share.h); slot 1 + i that of transport i of the transport
 * table (transport/transport.h, ferry_transport_region_slot). */
#define FERRY_REGION_SLOTS 6
#define FERRY_REGION_SLOT_SHARE 0

typedef struct ferry_region {
    uint64_t addr, len;
    uint32_t flags;
    uint32_t generation;
    uint32_t kind;           /* memory kind (core/memkind.h): host, CUDA device, ... */
    /* Each slot's owner's state for this region (the RDMA memory region, a
     * shared pool's memfds), or NULL. The registry knows none of them: it
     * gives each to its slot's hook when the region leaves. Written under
     * the write lock (ferry_registry_update), or under the read lock with
     * a lock of the owner's own. */
    void *slot[FERRY_REGION_SLOTS];
} ferry_region_t;

/* What the registry does with a slot's state when a region leaves. */
typedef struct ferry_region_hook {
    /* With the write lock held, for each region that leaves the registry
     * (deregistration, destroy, ferry_registry_release_slot) holding state
     * in the slot: releases it. The registry then clears the slot. */
    void (*release)(void *ctx, const ferry_region_t *reg, void *state);
    /* Optional: after a deregistration dropped the write lock (and at
     * destroy), for the same state: slow work that must not block
     * placements. reg is a copy: the region is gone. */
    void (*released)(void *ctx, const ferry_region_t *reg, void *state);
    void *ctx;
} ferry_region_hook_t;

typedef struct ferry_registry {
    pthread_rwlock_t lock;
    void *root;              /* tsearch tree of ferry_region_t* */
    size_t count;
    uint64_t version;        /* bumps on each change */
    uint32_t next_generation;
    /* Cached export of remote-accessible regions, sorted by address. */
    ferry_segment_t *export_segs;
    size_t export_count;
    uint64_t export_version;
    _Atomic size_t device_count; /* regions whose kind is not host memory */
    ferry_region_hook_t hooks[FERRY_REGION_SLOTS]; /* release NULL: none installed */
} ferry_registry_t;

int ferry_registry_init(ferry_registry_t *r);
void ferry_registry_destroy(ferry_registry_t *r);

int ferry_registry_add(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t flags);
/* Adds n regions all-or-nothing. */
int ferry_registry_add_many(ferry_registry_t *r, void *const *addrs, const size_t *lens, size_t n,
                            uint32_t flags);
/* As above, with the memory kind of each region (kinds NULL: all host). */
int ferry_registry_add_kind(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t flags, uint32_t kind);
int ferry_registry_add_many_kinds(ferry_registry_t *r, void *const *addrs, const size_t *lens, size_t n,
                                  uint32_t flags, const uint32_t *kinds);
int ferry_registry_remove(ferry_registry_t *r, uint64_t addr);
/* With the write lock held: fn(arg, reg) on the region starting at addr
 * (how a slot's owner sets its state with everything else in step), and
 * its result; INVALID_ARGUMENT "<what>: no region starting at <addr>" when
 * none does. */
int ferry_registry_update(ferry_registry_t *r, uint64_t addr, int (*fn)(void *arg, ferry_region_t *reg), void *arg,
                          const char *what);

/* With the read (or write) lock held: the region that contains all of
 * [addr, addr+len), or NULL. */
ferry_region_t *ferry_registry_lookup_locked(ferry_registry_t *r, uint64_t addr, uint64_t len);
/* Regions of a non-host memory kind; 0 lets the data paths skip every
 * memory-kind lookup (one relaxed load). */
static inline size_t ferry_registry_device_count(ferry_registry_t *r)
{
    return atomic_load_explicit(&r->device_count, memory_order_relaxed);
}
/* Installs the hook of slot (NULL: removes it; a region's state in a
 * slot without a hook is left alone). */
void ferry_registry_set_hook(ferry_registry_t *r, unsigned slot, const ferry_region_hook_t *hook);
/* Releases every region's state in slot (release only, under the write
 * lock), clears it, then removes the slot's hook: for an owner that goes
 * before the registry (an RDMA device closed). */
void ferry_registry_release_slot(ferry_registry_t *r, unsigned slot);

/* With the read lock held: checks that [addr, addr+len) lies in one region
 * having all of need_flags and (generation != 0) that generation.
 * 0, or ADDRESS_NOT_REGISTERED / OUT_OF_BOUNDS / ACCESS_DENIED /
 * STALE_SEGMENT with a detail naming the range and the region. */
int ferry_registry_check_locked(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t need_flags,
                                uint32_t generation, const char *side);
/* Takes the read lock around ferry_registry_check_locked. */
int ferry_registry_check(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t need_flags,
                         const char *side);

void ferry_registry_read_lock(ferry_registry_t *r);
void ferry_registry_unlock(ferry_registry_t *r);
/* Waits until no reader holds the lock: after it returns, every placement
 * that started before has finished. */
void ferry_registry_barrier(ferry_registry_t *r);

/* Copies the remote-accessible segments from index start (up to max) into
 * out; sets *total and *version. Consistent per version. */
size_t ferry_registry_export(ferry_registry_t *r, size_t start, ferry_segment_t *out, size_t max,
                             size_t *total, uint64_t *version);
size_t ferry_registry_count(ferry_registry_t *r);
uint64_t ferry_registry_version(ferry_registry_t *r);
/* The version and the region count, read together (one consistent pair). */
void ferry_registry_summary(ferry_registry_t *r, uint64_t *version, size_t *count);

#endif
