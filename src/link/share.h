/* SPDX-License-Identifier: Apache-2.0 */
/* Shared pools (ferry_pool_create_shared): the control header, in a memfd
 * of its own, which an initiator on this host maps (read-only) together
 * with the pool's data memfd to write and read the pool with a plain
 * memcpy (transport/shm.c).
 *
 * What the owner enforces does not depend on peers cooperating:
 *  - only pools with a FERRY_MEM_REMOTE_* flag live in a memfd (a local-only
 *    pool is anonymous memory: there is nothing to map);
 *  - a read-only pool's memfd is sealed F_SEAL_FUTURE_WRITE once the owner
 *    mapped it: no other mapping of it can be writable, whoever opens it;
 *  - deregistration detaches the pool (ferry_share_detach): the owner's
 *    range is moved onto private pages holding the same bytes, so a peer's
 *    mapping no longer reaches the owner's memory, whatever the peer does,
 *    and the owner waits for no peer;
 *  - the header's memfd is sealed F_SEAL_FUTURE_WRITE: only the owner's
 *    own mapping writes it; no peer can set a revoked pool live again;
 *  - deregistration and destruction mark the header REVOKED (for good)
 *    and fence (ferry_share_revoke) before the detach copies the bytes
 *    over or the pool is unmapped.
 * What the initiator relies on (transport/shm_pool.c, "when mapped copies
 * count"): after its copies and a seq_cst fence, a header that says LIVE
 * at the copies' generation means the revoke had not happened when the
 * copies ended, so the owner's range holds their bytes (the detach carries
 * them over); with the owner's pidfd not yet readable and its end of the
 * connection open (an exec keeps the pid but drops the memory and closes
 * the sockets), the owner was alive then. Otherwise the copies do not count. Where the initiator has no
 * pidfd, the owner confirms over the connection instead (a killed owner
 * answers nothing, one that deregistered answers no). The header is only
 * ever the owner's word about its own memory: a peer gains nothing by it. */
#ifndef FERRY_SHARE_H
#define FERRY_SHARE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define FERRY_SHARE_MAGIC 0x46534850u /* "PHSF" */
#define FERRY_SHARE_LIVE 1u
#define FERRY_SHARE_REVOKED 2u
/* The header memfd's size. */
#define FERRY_SHARE_HEADER 4096u

typedef struct ferry_share_ctl {
    _Atomic uint32_t magic;
    _Atomic uint32_t state;
    _Atomic uint32_t generation;
    uint32_t reserved;
    _Atomic int64_t unused; /* was an in-use count peers raised; ignored */
} ferry_share_ctl_t;

/* A shared pool's state in its region's slot FERRY_REGION_SLOT_SHARE
 * (registry.h): made and freed by core/pool.c, whose hook revokes and
 * detaches the pool when its region leaves the registry first; read by
 * transport/shm_pool.c under the registry's read lock. */
typedef struct ferry_share {
    int fd;                 /* the data's memfd */
    uint64_t off;           /* the region's offset in it (0: the data has its own memfd) */
    ferry_share_ctl_t *ctl; /* the control header */
    int ctl_fd;             /* the control header's memfd */
} ferry_share_t;

/* Marks the header revoked for good, then fences (ferry_share_fence):
 * what the owner reads of the pool afterwards (the detach's copy) sees
 * every byte an initiator copied before it read the header LIVE. No
 * waiting for any peer. */
void ferry_share_revoke(ferry_share_ctl_t *ctl);

/* A full (seq_cst) fence: the plain stores and loads before it are
 * ordered before the loads after it, on both sides of the store-buffering
 * argument above. GCC refuses atomic_thread_fence under -fsanitize=thread
 * (TSan does not model fences); there a seq_cst read-modify-write, a full
 * barrier on x86 and arm64 too, takes its place. */
static inline void ferry_share_fence(void)
{
#if defined(__SANITIZE_THREAD__)
    static _Atomic unsigned ferry_share_fence_word;
    atomic_fetch_add(&ferry_share_fence_word, 0);
#else
    atomic_thread_fence(memory_order_seq_cst);
#endif
}
/* Moves [base, base+len) onto private anonymous pages with the same bytes
 * (mremap over the shared mapping): from then on no peer's mapping aliases
 * the owner's memory. Then frees the memfd's pages [off, off+len) of fd
 * where the seals allow it. Bytes the owner itself writes into the range
 * during the move may be lost. 0, or -errno (the range stays shared;
 * logged). */
int ferry_share_detach(void *base, size_t len, int fd, uint64_t off);

#endif
