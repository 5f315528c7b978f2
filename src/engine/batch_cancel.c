/* SPDX-License-Identifier: Apache-2.0 */
/* Cancelling an async batch's requests (batch.h): the pieces no worker
 * started are settled at once, the running tasks that carry them are
 * interrupted and fence what they had on the wire. */
#include <string.h>

#include "parts.h"
#include "workers.h"
#include "util/fail.h"
#include "batch_internal.h"

static bool in_range(size_t idx, size_t first, size_t n) { return idx >= first && idx - first < n; }

/* Whether task t carries an unfinished request of [first, first+n). Reads
 * only the pieces' immutable index and the requests' state (b->lock held),
 * never what the worker running t writes. */
static bool task_carries(ferry_batch_t *b, const struct task_ext *t, size_t first, size_t n)
{
    for (size_t i = 0; i < t->task.nxfers; i++) {
        size_t idx = t->task.xfers[i].index;
        if (in_range(idx, first, n) && !ferry_batch_is_final(b->reqs[idx].state)) return true;
    }
    return false;
}

/* With b->lock held: flags the unfinished requests of [first, first+n),
 * settles their pieces in tasks no worker has started (dropping tasks left
 * empty), and interrupts the running tasks that carry them. */
static void cancel_locked(ferry_batch_t *b, size_t first, size_t n)
{
    ferry_workers_t *w = ferry_engine_part_work(b->engine);
    for (size_t i = first; i < first + n; i++)
        if (!ferry_batch_is_final(b->reqs[i].state)) atomic_store(&b->reqs[i].cancel, true);
    struct task_ext *dropped = NULL;
    pthread_mutex_lock(&w->lock);
    ferry_task_t *prev = NULL;
    for (ferry_task_t *t = w->head, *next; t; t = next) {
        next = t->next;
        if (t->batch != b) {
            prev = t;
            continue;
        }
        /* A strided lane still owes the windows it has not taken: it
         * settles their cancelled requests itself, so it stays queued. */
        bool left = ((struct task_ext *)t)->run != NULL;
        for (size_t i = 0; i < t->nxfers; i++) {
            ferry_xfer_t *x = &t->xfers[i];
            if (x->has_ended) continue;
            if (!in_range(x->index, first, n)) {
                left = true;
                continue;
            }
            ferry_xfer_fail(x, ferry_fail(FERRY_ERR_CANCELLED, "cancelled before it started"));
            x->has_ended = true;
            ferry_batch_settle_piece_locked(b, x);
        }
        if (left) {
            prev = t;
            continue;
        }
        if (prev)
            prev->next = next;
        else
            w->head = next;
        if (w->tail == t) w->tail = prev;
        struct task_ext *te = (struct task_ext *)t;
        ferry_batch_finish_task_locked(b, te);
        te->bnext = dropped; /* unlinked from the batch: reuse the link */
        dropped = te;
    }
    pthread_mutex_unlock(&w->lock);
    /* Requests of strided windows no lane took have no piece yet: settled
     * here, so that a cancel does not wait for a lane to reach them. */
    for (size_t i = first; i < first + n; i++) {
        if (b->reqs[i].untaken && !ferry_batch_is_final(b->reqs[i].state)) {
            b->reqs[i].untaken = false;
            ferry_batch_settle_unsent_locked(b, i, ferry_fail(FERRY_ERR_CANCELLED, "cancelled before it started"),
                                 ferry_fail_message());
        }
    }
    for (struct task_ext *t = b->tasks; t; t = t->bnext)
        if (task_carries(b, t, first, n)) ferry_stream_ctl_fire(&t->ctl);
    while (dropped) {
        struct task_ext *next = dropped->bnext;
        ferry_batch_release_task(dropped);
        dropped = next;
    }
    pthread_cond_broadcast(&b->cond);
}

/* With b->lock held: CANCEL_UNCONFIRMED for the first such request. */
static int unconfirmed_locked(ferry_batch_t *b, size_t first, size_t n)
{
    for (size_t i = first; i < first + n; i++) {
        struct batch_req *r = &b->reqs[i];
        if (r->code == FERRY_ERR_CANCEL_UNCONFIRMED) {
            const char *text = r->detail ? strstr(r->detail, "): ") : NULL;
            return ferry_fail(r->code, "request %zu: %s", i, text ? text + 3 : "cancel not confirmed");
        }
    }
    return 0;
}

int ferry_batch_cancel(ferry_batch_t *b)
{
    ferry_clear_last_error();
    int check = ferry_batch_check(b, "batch cancel");
    if (check) return check;
    pthread_mutex_lock(&b->lock);
    cancel_locked(b, 0, b->count);
    /* Each interrupted task fences what it had on the wire (bounded by
     * cancel_timeout_ms) before it ends. */
    while (b->tasks_pending > 0) pthread_cond_wait(&b->cond, &b->lock);
    int rc = unconfirmed_locked(b, 0, b->count);
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int ferry_batch_cancel_request(ferry_batch_t *b, size_t idx)
{
    ferry_clear_last_error();
    int check = ferry_batch_check(b, "batch cancel");
    if (check) return check;
    pthread_mutex_lock(&b->lock);
    if (idx >= b->count) {
        size_t count = b->count;
        pthread_mutex_unlock(&b->lock);
        return ferry_fail(FERRY_ERR_NOT_FOUND, "batch cancel: request %zu not submitted (%zu are)", idx, count);
    }
    cancel_locked(b, idx, 1);
    while (!ferry_batch_is_final(b->reqs[idx].state)) pthread_cond_wait(&b->cond, &b->lock);
    int rc = unconfirmed_locked(b, idx, 1);
    pthread_mutex_unlock(&b->lock);
    return rc;
}
