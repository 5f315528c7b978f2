/* SPDX-License-Identifier: Apache-2.0 */
/* What the async batch's files share (batch.h has their calls): a batch's
 * state and the calls that settle its requests. batch.c: submit, status,
 * wait and the settling of pieces; batch_live.c: the live-batch set, alloc
 * and free; batch_cancel.c: cancel; batch_strided.c: strided lanes.
 * Private to those files. */
#ifndef FERRY_ENGINE_BATCH_INTERNAL_H
#define FERRY_ENGINE_BATCH_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "link/metrics.h"

struct batch_req {
    uint64_t submitted_ns;
    int opcode;
    int state;
    int code;
    _Atomic uint64_t bytes;
    size_t pieces_left;
    char *detail;
    atomic_bool cancel;        /* its pieces stop at the next slice */
    bool untaken;              /* in a strided window no lane took yet (its piece not made) */
    ferry_peer_stats_t *stats; /* the peer's metrics entry */
};

#define BATCH_MAGIC 0x46594241u /* "FYBA": a live batch */
#define BATCH_FREED 0xdeadba7cu

struct ferry_batch {
    uint32_t magic;            /* BATCH_MAGIC while live: catches some use after free */
    ferry_engine_t *engine;
    size_t capacity, count;
    struct batch_req *reqs;
    pthread_mutex_t lock;
    pthread_cond_t cond;       /* a piece or a task ended */
    size_t tasks_pending;      /* outstanding tasks, and submits still cutting theirs */
    struct task_ext *tasks;    /* outstanding tasks, queued or running */
};


/* batch_live.c: a cheap guard at every entry: 0 for a live batch, else
 * the failure (call names the caller in its detail). */
int ferry_batch_check(const ferry_batch_t *b, const char *call);

static inline bool ferry_batch_is_final(int state) { return state >= FERRY_STATUS_COMPLETED; }

/* batch.c: with b->lock held, folds a finished piece into its request. */
void ferry_batch_settle_piece_locked(ferry_batch_t *b, ferry_xfer_t *x);
/* batch.c: with b->lock held, settles request idx as failed with rc
 * before any of it was sent (detail copied). */
void ferry_batch_settle_unsent_locked(ferry_batch_t *b, size_t idx, int rc, const char *detail);
/* batch.c: a piece reached its final state while its task goes on (the
 * pieces' ended callback, arg the batch). */
void ferry_batch_piece_ended(ferry_xfer_t *x, void *arg);
/* batch.c: with b->lock held, the task is over; settles what is left of it
 * and unlinks it from b. */
void ferry_batch_finish_task_locked(ferry_batch_t *b, struct task_ext *t);
/* batch.c: drops t's session reference and frees t with its pieces. */
void ferry_batch_release_task(struct task_ext *t);
/* batch.c: a worker finished a task of batch owner (the tasks' done). */
void ferry_batch_task_done(ferry_task_t *task, void *owner);
/* batch.c: reserves n request slots of b (reserve true), or only checks
 * that n are left; the first slot, or the failure. */
long ferry_batch_reserve_slots(ferry_batch_t *b, size_t n, bool reserve);
/* batch.c: the submit that reserved slots queued its tasks. */
void ferry_batch_submit_end(ferry_batch_t *b);

#endif
