/* Shared pools (ferry_pool_create_shared): the control header at the start
 * of a pool's memfd, which an initiator on this host maps together with the
 * pool's data to write and read it with a plain memcpy (transport/shm.c).
 *
 * Revocation protocol (all seq_cst): an initiator increments inuse, then
 * checks state == LIVE and generation, copies, fences, decrements. The
 * target's deregistration stores state = REVOKED, then waits for inuse to
 * reach 0 (ferry_share_revoke). Either the initiator's increment comes first
 * (the target waits for its copy) or the revoke does (the initiator sees it
 * and copies nothing). */
#ifndef FERRY_SHARE_H
#define FERRY_SHARE_H

#include <stdatomic.h>
#include <stdint.h>

#define FERRY_SHARE_MAGIC 0x46534850u /* "PHSF" */
#define FERRY_SHARE_LIVE 1u
#define FERRY_SHARE_REVOKED 2u
/* The header's size: the pool's data starts this far into the memfd. */
#define FERRY_SHARE_HEADER 4096u
/* How long a deregistration waits for copies in progress. A peer that dies
 * in the middle of a copy leaves inuse raised for good: the deregistration
 * then returns after this long with a warning (the dead peer writes no more). */
#define FERRY_SHARE_REVOKE_WAIT_MS 10000

typedef struct ferry_share_ctl {
    _Atomic uint32_t magic;
    _Atomic uint32_t state;
    _Atomic uint32_t generation;
    uint32_t reserved;
    _Atomic int64_t inuse;
} ferry_share_ctl_t;

/* Sets state = REVOKED and waits (bounded) for copies in progress. */
void ferry_share_revoke(ferry_share_ctl_t *ctl);

#endif
