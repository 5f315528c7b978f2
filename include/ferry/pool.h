/* SPDX-License-Identifier: Apache-2.0 */
/* Pre-registered memory pools.
 *
 * Registering a buffer for one send and deregistering it after (the encoder
 * path: one embedding per send) costs a registry change per send, and every
 * peer re-fetches the segment table on its next miss. A pool is one region
 * registered once; buffers are allocated from it and freed back without
 * touching the registry, so transfers from or into them need no
 * registration at all.
 *
 * The allocator is a binary buddy allocator over 4 KiB blocks: every buffer
 * is 4 KiB-aligned and rounded up to a power of two of blocks (so a 5 MiB
 * buffer takes 8 MiB of the pool); allocation and free are O(log(pool size /
 * 4 KiB)) under one mutex, and a free merges with its buddy at once, so
 * freeing everything gives the whole pool back as one block. Thread-safe.
 */
#ifndef FERRY_POOL_H
#define FERRY_POOL_H

#include <stddef.h>

#include <ferry/ferry.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_pool ferry_pool_t;

/* Allocation granularity and alignment. */
#define FERRY_POOL_BLOCK 4096u

typedef struct ferry_pool_stats {
    size_t struct_size;  /* sizeof(ferry_pool_stats_t), set by the ferry_pool_stats macro */
    size_t size;         /* bytes the pool manages */
    size_t used;         /* bytes allocated (rounded sizes) */
    size_t largest_free; /* the largest allocation that would succeed now */
    size_t allocations;  /* live allocations */
} ferry_pool_stats_t;

/* Maps bytes (rounded up to 4 KiB) of anonymous memory and registers it with
 * e under flags (FERRY_MEM_*). Destroy the pool before its engine. */
FERRY_API int ferry_pool_create(ferry_engine_t *e, size_t bytes, unsigned flags, ferry_pool_t **out);
/* As ferry_pool_create, but the pool lives in a memfd (MAP_SHARED) that
 * initiators on this host may map: their writes and reads into it are one
 * plain memcpy instead of cross-memory attach (the shm transport). Peers
 * elsewhere, or where mapping fails, use the ordinary paths.
 *
 * What the owner (this process) enforces with the kernel, whatever a peer
 * does:
 *  - flags FERRY_MEM_LOCAL: no memfd at all (anonymous memory, as
 *    ferry_pool_create); map requests for it are refused (ACCESS_DENIED).
 *  - FERRY_MEM_REMOTE_READ only: the memfd is sealed (F_SEAL_FUTURE_WRITE):
 *    no process, however it got the fd, can map it writable or write(2) it.
 *  - ferry_deregister of the pool (and ferry_pool_destroy, and destroying
 *    the engine) detaches it: its pages are moved onto private memory
 *    holding the same bytes, so no peer mapping reaches the pool after the
 *    call returns, and it waits for no peer (its cost: one copy of the pool,
 *    under ferry_deregister; ferry_pool_destroy skips the copy). Do not
 *    write into the pool from this process during that deregistration.
 *  - the pool's memfds are handed only to verified initiators, with
 *    SCM_RIGHTS: the data read-only unless the pool is remote-writable, the
 *    control header (live or revoked, and the generation) read-only and
 *    sealed so that only this process writes it.
 *  - an initiator reports a mapped write or read complete only if, after
 *    the copy and a memory fence, the control header still says live at
 *    the generation the copy began under (deregistration marks it revoked,
 *    and fences, before it detaches the pool) and this process has neither
 *    exited nor exec'd (its pidfd and the connection, polled once). Otherwise the copy does not count: a
 *    killed owner's write fails, one into a pool deregistered meanwhile
 *    goes again by cross-memory attach, which this engine refuses. Where
 *    the initiator has no pidfd_open, this engine confirms over the
 *    connection instead (one round trip per call and region).
 *
 * What a same-host peer can do (not enforceable here): map requests are
 * served only on connections whose initiator the engine verified (same host,
 * the claimed pid owns the socket, the kernel lets the engine attach to it);
 * such a peer runs as the same user. While a writable pool is registered, a
 * peer that mapped it can write any byte of it at any time, not only the
 * ranges its requests name, and read it; requests cannot be ordered against
 * its stores. A process the kernel lets ptrace or attach to this one (same
 * user, Yama permitting; an engine that initiates over shm sets
 * PR_SET_PTRACER_ANY under ptrace_scope 1) can read and write all of this
 * process's memory anyway: pools do not protect against it, and no Ferry
 * setting does. Keep pools
 * FERRY_MEM_LOCAL or read-only where such peers are not trusted, or use
 * FERRY_SHM_NOMAP=1 / transport "tcp" at initiators you control. */
FERRY_API int ferry_pool_create_shared(ferry_engine_t *e, size_t bytes, unsigned flags, ferry_pool_t **out);
/* A len-byte buffer (len > 0) from the pool into *out; MEMORY when no free
 * run is large enough (the detail gives the largest free run). */
FERRY_API int ferry_pool_alloc(ferry_pool_t *p, size_t len, void **out);
/* Returns a buffer from ferry_pool_alloc; INVALID_ARGUMENT for any other
 * pointer, including a second free of the same buffer. */
FERRY_API int ferry_pool_free(ferry_pool_t *p, void *ptr);
FERRY_API int ferry_pool_stats(ferry_pool_t *p, ferry_pool_stats_t *st);
#define ferry_pool_stats(p, st) (ferry_pool_stats)((p), FERRY_SIZED_(ferry_pool_stats_t, st))
/* Deregisters and unmaps the pool; buffers still allocated become invalid.
 * NULL is ignored. Must not race with other calls on p. */
FERRY_API void ferry_pool_destroy(ferry_pool_t *p);

#ifdef __cplusplus
}
#endif
#endif
