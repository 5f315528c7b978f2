/* The registry of memory regions: a balanced tree (glibc's tsearch, a
 * red-black tree) of non-overlapping [addr, addr+len) ranges under a
 * writer-preferring rwlock. Lookups are O(log n). */
#ifndef FERRY_REGISTRY_H
#define FERRY_REGISTRY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

typedef struct ferry_region {
    uint64_t addr, len;
    uint32_t flags;
    uint32_t generation;
} ferry_region_t;

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
} ferry_registry_t;

int ferry_registry_init(ferry_registry_t *r);
void ferry_registry_destroy(ferry_registry_t *r);

int ferry_registry_add(ferry_registry_t *r, uint64_t addr, uint64_t len, uint32_t flags);
/* Adds n regions all-or-nothing. */
int ferry_registry_add_many(ferry_registry_t *r, void *const *addrs, const size_t *lens, size_t n,
                            uint32_t flags);
int ferry_registry_remove(ferry_registry_t *r, uint64_t addr);

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

#endif
