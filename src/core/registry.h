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

typedef struct ferry_region {
    uint64_t addr, len;
    uint32_t flags;
    uint32_t generation;
    uint32_t kind;           /* memory kind (core/memkind.h): host, CUDA device, ... */
    void *xport;             /* a transport's per-region state (the RDMA memory region), or NULL;
                              * released by the registry's release hook before the region goes */
    /* Shared pools (core/share.h): the memfd behind the region, the region's
     * offset in it, and its control header (and that header's memfd); share_fd -1 and share_ctl NULL
     * for every other region. Deregistration revokes and detaches (share.h). */
    int share_fd;
    uint64_t share_off;      /* 0: the data has its own memfd */
    void *share_ctl;
    int share_ctl_fd;        /* the control header's memfd */
} ferry_region_t;

/* Called with the write lock held, for each region that leaves the registry
 * (deregistration, destroy) whose xport is set. */
typedef void (*ferry_region_release_fn)(void *ctx, ferry_region_t *reg);

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
    ferry_region_release_fn release;
    void *release_ctx;
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
/* Marks the region starting at addr as shareable (core/share.h): stores
 * the data's memfd fd, the control header ctl and its memfd ctl_fd, and
 * makes ctl live with the region's generation. */
int ferry_registry_set_shared(ferry_registry_t *r, uint64_t addr, int fd, void *ctl, int ctl_fd);
/* Revokes the shared region starting at addr and makes it an ordinary
 * region (no detach: for a pool about to be unmapped anyway). */
int ferry_registry_unshare(ferry_registry_t *r, uint64_t addr);

/* With the read (or write) lock held: the region that contains all of
 * [addr, addr+len), or NULL. */
ferry_region_t *ferry_registry_lookup_locked(ferry_registry_t *r, uint64_t addr, uint64_t len);
/* Regions of a non-host memory kind; 0 lets the data paths skip every
 * memory-kind lookup (one relaxed load). */
static inline size_t ferry_registry_device_count(ferry_registry_t *r)
{
    return atomic_load_explicit(&r->device_count, memory_order_relaxed);
}
/* Installs the release hook (NULL to remove it). */
void ferry_registry_set_release(ferry_registry_t *r, ferry_region_release_fn fn, void *ctx);
/* Calls the release hook for every region holding xport state, clears
 * that state, then removes the hook. */
void ferry_registry_release_all(ferry_registry_t *r);

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
