/* SPDX-License-Identifier: Apache-2.0 */
/* The strided lanes of an async batch (batch.h): a strided submit whose
 * pieces are expanded window by window on the workers. */
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "parts.h"
#include "session.h"
#include "util/fail.h"
#include "batch_internal.h"

/* A strided submit's n requests get their slots at once (the batch's own
 * memory, sized by its capacity), but their pieces are expanded only a
 * window (ferry_strided_window) at a time by each lane: a task that a
 * worker runs window after window on one connection, taking the next in piece
 * order. The pieces of the window a lane runs are its task's pieces, so
 * cancel finds and interrupts them as any task's; the pieces of windows
 * not yet taken are settled by the lane when it reaches them (cancelled,
 * or failed at once after the peer was lost), and a queued lane is never
 * dropped by a cancel: it still owes its windows' settlement. */

struct strided_job {
    pthread_mutex_t refs_lock;
    int refs;                  /* lanes holding it */
    ferry_strided_t d;         /* checked; the index lists are the copies below */
    size_t first;              /* the batch slot of piece 0 */
    size_t window;             /* pieces a window */
    uint64_t deadline;
    size_t next;               /* the first piece no lane took (b->lock) */
    int lost_rc;               /* the peer was lost: later windows fail so at once (b->lock) */
    char *lost_detail;
};

static void job_put(struct strided_job *j)
{
    pthread_mutex_lock(&j->refs_lock);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->refs_lock);
    if (!last) return;
    pthread_mutex_destroy(&j->refs_lock);
    free(j->lost_detail);
    free(j);
}

/* With b->lock held: takes lane t's next window and expands it into its
 * task's pieces (requests cancelled meanwhile, or doomed by a lost peer,
 * are settled instead). Returns false when no window is left. */
static bool take_window_locked(ferry_batch_t *b, struct task_ext *t, struct strided_job *j)
{
    const ferry_strided_t *d = &j->d;
    size_t from = j->next, n = d->n - from < j->window ? d->n - from : j->window;
    if (n == 0) return false;
    j->next += n;
    ferry_xfer_t *xs = t->task.xfers;
    size_t k = 0;
    uint64_t id = ferry_engine_part_req_ids(b->engine, n);
    for (size_t i = from; i < from + n; i++) {
        size_t idx = j->first + i;
        struct batch_req *r = &b->reqs[idx];
        if (!r->untaken) continue; /* a cancel settled it already */
        r->untaken = false;
        if (atomic_load(&r->cancel)) {
            ferry_batch_settle_unsent_locked(b, idx, FERRY_ERR_CANCELLED, "cancelled before it started");
            continue;
        }
        if (j->lost_rc) {
            ferry_batch_settle_unsent_locked(b, idx, j->lost_rc, j->lost_detail ? j->lost_detail : "the peer was lost");
            continue;
        }
        ferry_xfer_t *x = &xs[k++];
        *x = (ferry_xfer_t){.opcode = d->opcode, .len = d->piece_len, .req_id = id + i - from,
                            .deadline = j->deadline, .index = idx, .cancel = &r->cancel, .progress = &r->bytes,
                            .ended = ferry_batch_piece_ended, .ended_arg = b, .ctl = &t->ctl};
        ferry_strided_piece(d, i, &x->local, &x->remote);
        if (r->state == FERRY_STATUS_WAITING) r->state = FERRY_STATUS_PENDING;
    }
    t->task.nxfers = k;
    pthread_cond_broadcast(&b->cond);
    return true;
}

/* A lane on a worker: windows until none is left. */
static void strided_lane(struct task_ext *t, void *arg)
{
    struct strided_job *j = arg;
    ferry_batch_t *b = t->task.batch;
    ferry_engine_t *e = b->engine;
    for (;;) {
        pthread_mutex_lock(&b->lock);
        bool more = take_window_locked(b, t, j);
        pthread_mutex_unlock(&b->lock);
        if (!more) break;
        ferry_xfer_t *xs = t->task.xfers;
        size_t n = t->task.nxfers; /* only this lane changes it */
        int rc = 0;
        if (ferry_engine_part_stopping(e)) {
            rc = ferry_fail(FERRY_ERR_CONTEXT, "the engine shut down before the request ran");
            for (size_t i = 0; i < n; i++) ferry_xfer_fail(&xs[i], rc);
        } else if (n) {
            rc = ferry_xfer_run(e, t->task.session, xs, n);
        }
        pthread_mutex_lock(&b->lock);
        for (size_t i = 0; i < n; i++) {
            if (!xs[i].has_ended) {
                xs[i].has_ended = true;
                ferry_batch_settle_piece_locked(b, &xs[i]);
            }
            free(xs[i].detail);
            xs[i].detail = NULL;
        }
        t->task.nxfers = 0;
        /* Retries ran out on a broken link (xfer.c tore the pool down), or
         * the deadline passed: the windows not taken would each wait out
         * the same retries, or time out. */
        bool spent = rc == FERRY_ERR_TIMEOUT && ferry_now_ns() >= j->deadline; /* the deadline all share */
        if ((rc == FERRY_ERR_PEER_CLOSED || rc == FERRY_ERR_SOCKET || rc == FERRY_ERR_CONTEXT || spent) &&
            !j->lost_rc) {
            j->lost_rc = rc;
            j->lost_detail = strdup(ferry_fail_message());
        }
        pthread_cond_broadcast(&b->cond);
        pthread_mutex_unlock(&b->lock);
    }
    job_put(j);
}

/* The lanes of a submit of n pieces, allocated before anything is
 * submitted (so a failure submits nothing). */
static size_t new_lanes(ferry_session_t *s, ferry_batch_t *b, struct strided_job *j, struct task_ext **lanes)
{
    ferry_engine_t *e = b->engine;
    size_t n = j->d.n;
    size_t count = (size_t)(ferry_engine_part_config(e)->conns_per_peer < ferry_engine_part_config(e)->workers ? ferry_engine_part_config(e)->conns_per_peer : ferry_engine_part_config(e)->workers);
    if (count > 64) count = 64;
    size_t w = j->window = ferry_strided_window(n, count);
    size_t windows = (n - 1) / w + 1;
    if (count > windows) count = windows;
    for (size_t k = 0; k < count; k++) {
        ferry_xfer_t *xs = malloc(w * sizeof *xs);
        lanes[k] = xs ? ferry_task_new(s, xs, 0, ferry_batch_task_done, b) : NULL;
        if (!lanes[k]) {
            free(xs);
            for (size_t i = 0; i < k; i++) ferry_batch_release_task(lanes[i]);
            return 0;
        }
        lanes[k]->run = strided_lane;
        lanes[k]->run_arg = j;
        lanes[k]->task.batch = b;
    }
    return count;
}

long ferry_batch_submit_strided_checked(ferry_batch_t *b, const char *peer, const ferry_strided_t *d, int timeout_ms)
{
    int rc = ferry_batch_check(b, "batch submit");
    if (rc) return rc;
    ferry_engine_t *e = b->engine;
    if (d->n == 0) return ferry_batch_reserve_slots(b, 0, false);
    long left = ferry_batch_reserve_slots(b, d->n, false); /* fails early, before connecting */
    if (left < 0) return left;
    ferry_session_t *s;
    rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    size_t nidx = (d->local_idx ? d->n : 0) + (d->remote_idx ? d->n : 0);
    struct strided_job *j = calloc(1, sizeof *j + nidx * sizeof(uint64_t));
    struct task_ext *lanes[64];
    size_t nlanes = 0;
    if (j) {
        j->d = *d;
        uint64_t *idx = (uint64_t *)(j + 1);
        if (d->local_idx) j->d.local_idx = memcpy(idx, d->local_idx, d->n * sizeof *idx), idx += d->n;
        if (d->remote_idx) j->d.remote_idx = memcpy(idx, d->remote_idx, d->n * sizeof *idx);
        j->deadline = ferry_deadline_after_ms(timeout_ms > 0 ? timeout_ms : ferry_engine_part_config(e)->timeout_ms);
        nlanes = new_lanes(s, b, j, lanes);
    }
    long reserved = nlanes ? ferry_batch_reserve_slots(b, d->n, true)
                           : ferry_fail(FERRY_ERR_MEMORY, "strided submit of %zu pieces: out of memory", d->n);
    if (reserved < 0) {
        for (size_t k = 0; k < nlanes; k++) ferry_batch_release_task(lanes[k]);
        free(j);
        ferry_session_put(s);
        return reserved;
    }
    pthread_mutex_init(&j->refs_lock, NULL);
    j->refs = (int)nlanes;
    j->first = (size_t)reserved;
    FERRY_STAT_ADD(ferry_engine_part_stats(e), requests, d->n);
    uint64_t now = ferry_now_ns();
    pthread_mutex_lock(&b->lock);
    for (size_t i = j->first; i < j->first + d->n; i++) {
        struct batch_req *r = &b->reqs[i];
        r->pieces_left = 1;
        r->untaken = true;
        r->state = FERRY_STATUS_WAITING;
        r->opcode = d->opcode;
        r->submitted_ns = now;
        r->stats = s->stats;
    }
    for (size_t k = 0; k < nlanes; k++) {
        b->tasks_pending++;
        lanes[k]->bnext = b->tasks;
        if (b->tasks) b->tasks->bprev = lanes[k];
        b->tasks = lanes[k];
    }
    pthread_mutex_unlock(&b->lock);
    size_t first = j->first; /* j is the lanes' once they are queued */
    for (size_t k = 0; k < nlanes; k++) ferry_task_enqueue(e, &lanes[k]->task);
    ferry_session_put(s);
    ferry_batch_submit_end(b);
    return (long)first;
}
