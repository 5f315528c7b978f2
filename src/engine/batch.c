/* SPDX-License-Identifier: Apache-2.0 */
/* The async batch API (batch.h): requests cut into pieces and queued as
 * tasks for the workers (workers.c), their states and waiting (cancel:
 * batch_cancel.c; alloc, free: batch_live.c; strided: batch_strided.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "engine.h"
#include "util/fail.h"
#include "batch_internal.h"

static int final_state(int code)
{
    switch (code) {
    case 0: return FERRY_STATUS_COMPLETED;
    case FERRY_ERR_CANCELLED: return FERRY_STATUS_CANCELLED;
    case FERRY_ERR_TIMEOUT: return FERRY_STATUS_TIMEOUT;
    default: return FERRY_STATUS_FAILED;
    }
}

/* With b->lock held: folds a finished piece into its request. The first
 * failure names the request, except that CANCEL_UNCONFIRMED (pages not safe
 * to reuse) outranks every other. */
void ferry_batch_settle_piece_locked(ferry_batch_t *b, ferry_xfer_t *x)
{
    struct batch_req *r = &b->reqs[x->index];
    if (x->rc && r->code != FERRY_ERR_CANCEL_UNCONFIRMED && (r->code == 0 || x->rc == FERRY_ERR_CANCEL_UNCONFIRMED)) {
        free(r->detail);
        r->code = x->rc;
        r->detail = x->detail;
        x->detail = NULL;
    }
    free(x->detail);
    x->detail = NULL;
    if (--r->pieces_left == 0) {
        r->state = final_state(r->code);
        ferry_count_request(b->engine, r->stats, NULL, r->opcode, atomic_load(&r->bytes),
                            ferry_now_ns() - r->submitted_ns, r->code);
    }
}

/* With b->lock held: settles request idx as failed with rc before any of
 * it was sent (detail copied). */
void ferry_batch_settle_unsent_locked(ferry_batch_t *b, size_t idx, int rc, const char *detail)
{
    ferry_xfer_t x = {.index = idx, .rc = rc, .detail = strdup(detail)};
    ferry_batch_settle_piece_locked(b, &x);
}

/* A piece reached its final state while its task goes on (piece_run.c). */
void ferry_batch_piece_ended(ferry_xfer_t *x, void *arg)
{
    ferry_batch_t *b = arg;
    pthread_mutex_lock(&b->lock);
    ferry_batch_settle_piece_locked(b, x);
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

/* With b->lock held: the task is over; settles what is left of it. */
void ferry_batch_finish_task_locked(ferry_batch_t *b, struct task_ext *t)
{
    ferry_task_t *task = &t->task;
    for (size_t i = 0; i < task->nxfers; i++) {
        ferry_xfer_t *x = &task->xfers[i];
        if (!x->has_ended) {
            x->has_ended = true;
            ferry_batch_settle_piece_locked(b, x);
        }
        free(x->detail);
    }
    if (t->bprev)
        t->bprev->bnext = t->bnext;
    else
        b->tasks = t->bnext;
    if (t->bnext) t->bnext->bprev = t->bprev;
    b->tasks_pending--;
    pthread_cond_broadcast(&b->cond);
}

void ferry_batch_release_task(struct task_ext *t)
{
    ferry_session_put(t->task.session);
    free(t->task.xfers);
    ferry_task_free(t);
}

/* A worker finished a task. */
void ferry_batch_task_done(ferry_task_t *task, void *owner)
{
    ferry_batch_t *b = owner;
    pthread_mutex_lock(&b->lock);
    ferry_batch_finish_task_locked(b, (struct task_ext *)task);
    pthread_mutex_unlock(&b->lock);
    ferry_batch_release_task((struct task_ext *)task);
}

static void batch_task_start(ferry_task_t *t, void *owner)
{
    ferry_batch_t *b = owner;
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < t->nxfers; i++) {
        struct batch_req *r = &b->reqs[t->xfers[i].index];
        if (r->state == FERRY_STATUS_WAITING) r->state = FERRY_STATUS_PENDING;
    }
    pthread_mutex_unlock(&b->lock);
}

size_t ferry_batch_room(ferry_batch_t *b)
{
    pthread_mutex_lock(&b->lock);
    size_t room = b->capacity - b->count;
    pthread_mutex_unlock(&b->lock);
    return room;
}

/* Reserves slots [first, first+n) under one hold of the lock, so that
 * concurrent submits never share a slot nor pass the capacity. Nothing of
 * the submit can fail after it (slots are never given back: a canceller
 * may already wait on them). The submit counts as a pending task until
 * its tasks are queued (ferry_batch_submit_end), so that wait, cancel and
 * free see it. With reserve false, only checks that n slots are left now. */
long ferry_batch_reserve_slots(ferry_batch_t *b, size_t n, bool reserve)
{
    pthread_mutex_lock(&b->lock);
    if (n > b->capacity - b->count) {
        size_t used = b->count;
        pthread_mutex_unlock(&b->lock);
        return ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS, "batch submit: %zu more requests exceed capacity %zu (%zu used)",
                          n, b->capacity, used);
    }
    size_t first = b->count;
    if (reserve) {
        b->count += n;
        b->tasks_pending++;
    }
    pthread_mutex_unlock(&b->lock);
    return (long)first;
}

/* The submit's tasks are queued. */
void ferry_batch_submit_end(ferry_batch_t *b)
{
    pthread_mutex_lock(&b->lock);
    b->tasks_pending--;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

static long batch_submit(ferry_batch_t *b, const char *peer, const ferry_request_t *reqs, size_t n, int timeout_ms,
                         bool checked)
{
    ferry_clear_last_error();
    int rc = ferry_batch_check(b, "batch submit");
    if (rc) return rc;
    if (!peer || (!reqs && n)) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "batch submit: NULL argument");
    ferry_engine_t *e = b->engine;
    if (n == 0) {
        pthread_mutex_lock(&b->lock);
        size_t count = b->count;
        pthread_mutex_unlock(&b->lock);
        return (long)count;
    }
    for (size_t i = 0; !checked && i < n; i++) {
        rc = ferry_check_request(e, reqs[i].opcode, reqs[i].local, reqs[i].remote, reqs[i].len);
        if (rc) return ferry_fail_context("batch submit: request %zu of %zu", i, n);
    }
    long left = ferry_batch_reserve_slots(b, n, false); /* fails early, before connecting */
    if (left < 0) return left;
    ferry_session_t *s;
    rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    uint64_t deadline = ferry_deadline_after_ms(timeout_ms > 0 ? timeout_ms : e->cfg.timeout_ms);
    /* Pieces are cut per opcode run, since ferry_make_pieces takes one. */
    void **locals = malloc(n * sizeof *locals);
    uint64_t *remotes = malloc(n * sizeof *remotes);
    size_t *lens = malloc(n * sizeof *lens);
    ferry_xfer_t *xs = NULL;
    size_t nx = 0;
    if (!locals || !remotes || !lens) rc = ferry_fail(FERRY_ERR_MEMORY, "batch submit: out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        locals[i] = reqs[i].local;
        remotes[i] = reqs[i].remote;
        lens[i] = reqs[i].len;
    }
    if (rc == 0) rc = ferry_make_pieces(e, FERRY_OP_WRITE, locals, remotes, lens, n, deadline, &xs, &nx);
    free(locals);
    free(remotes);
    free(lens);
    long reserved = rc ? rc : ferry_batch_reserve_slots(b, n, true);
    if (reserved < 0) {
        free(xs);
        ferry_session_put(s);
        return reserved;
    }
    size_t first = (size_t)reserved;
    FERRY_STAT_ADD(&e->stats, requests, n);
    pthread_mutex_lock(&b->lock);
    for (size_t i = 0; i < nx; i++) {
        xs[i].opcode = reqs[xs[i].index].opcode;
        xs[i].index += first;
        struct batch_req *r = &b->reqs[xs[i].index];
        xs[i].cancel = &r->cancel;
        xs[i].progress = &r->bytes;
        xs[i].ended = ferry_batch_piece_ended;
        xs[i].ended_arg = b;
        r->pieces_left++;
        r->state = FERRY_STATUS_WAITING;
        r->opcode = xs[i].opcode;
        r->submitted_ns = ferry_now_ns();
        r->stats = s->stats;
    }
    pthread_mutex_unlock(&b->lock);
    size_t groups = (size_t)(e->cfg.conns_per_peer < e->cfg.workers ? e->cfg.conns_per_peer : e->cfg.workers);
    size_t starts[66];
    size_t g = ferry_task_partition(xs, nx, groups > 64 ? 64 : groups, starts);
    for (size_t k = 0; k < g; k++) {
        size_t cnt = starts[k + 1] - starts[k];
        ferry_xfer_t *part = malloc(cnt * sizeof *part);
        struct task_ext *t = part ? ferry_task_new(s, part, cnt, ferry_batch_task_done, b) : NULL;
        if (!t) {
            free(part);
            part = xs + starts[k];
            int mrc = ferry_fail(FERRY_ERR_MEMORY, "batch submit: out of memory");
            pthread_mutex_lock(&b->lock);
            for (size_t i = 0; i < cnt; i++) {
                struct batch_req *r = &b->reqs[part[i].index];
                if (!r->code) r->code = mrc;
                if (--r->pieces_left == 0) {
                    r->state = FERRY_STATUS_FAILED;
                    ferry_count_request(e, NULL, NULL, r->opcode, 0, 0, mrc); /* never ran: the engine's count only */
                }
            }
            pthread_cond_broadcast(&b->cond);
            pthread_mutex_unlock(&b->lock);
            continue;
        }
        memcpy(part, xs + starts[k], cnt * sizeof *part);
        for (size_t i = 0; i < cnt; i++) part[i].ctl = &t->ctl;
        t->start = batch_task_start;
        t->task.batch = b;
        pthread_mutex_lock(&b->lock);
        b->tasks_pending++;
        t->bnext = b->tasks;
        if (b->tasks) b->tasks->bprev = t;
        b->tasks = t;
        pthread_mutex_unlock(&b->lock);
        ferry_task_enqueue(e, &t->task);
    }
    free(xs);
    ferry_session_put(s);
    ferry_batch_submit_end(b);
    return (long)first;
}

int ferry_batch_status(ferry_batch_t *b, size_t idx, ferry_status_t *st)
{
    int rc = ferry_batch_check(b, "batch status");
    if (rc) return rc;
    if (!st) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "batch status: NULL argument");
    pthread_mutex_lock(&b->lock);
    if (idx >= b->count) {
        size_t count = b->count;
        pthread_mutex_unlock(&b->lock);
        return ferry_fail(FERRY_ERR_NOT_FOUND, "batch status: request %zu not submitted (%zu are)", idx, count);
    }
    struct batch_req *r = &b->reqs[idx];
    st->state = r->state;
    st->code = r->code;
    st->bytes = atomic_load(&r->bytes);
    if (r->code && r->detail) ferry_fail(r->code, "request %zu: %s", idx, r->detail);
    pthread_mutex_unlock(&b->lock);
    return 0;
}

int ferry_batch_wait(ferry_batch_t *b, int timeout_ms)
{
    ferry_clear_last_error();
    int check = ferry_batch_check(b, "batch wait");
    if (check) return check;
    uint64_t deadline = ferry_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&b->lock);
    if (ferry_wait_zero_locked(b->engine, &b->lock, &b->cond, &b->tasks_pending, deadline, 2) == ETIMEDOUT) {
        size_t left = b->tasks_pending;
        pthread_mutex_unlock(&b->lock);
        return ferry_fail(FERRY_ERR_TIMEOUT, "batch wait: %zu task(s) still running after %d ms", left, timeout_ms);
    }
    /* The first CANCEL_UNCONFIRMED, else the first failure: a request
     * whose pages are not safe to reuse must never hide behind another
     * request's code. */
    size_t worst = b->count;
    for (size_t i = 0; i < b->count; i++) {
        int code = b->reqs[i].code;
        if (code == FERRY_ERR_CANCEL_UNCONFIRMED) {
            worst = i;
            break;
        }
        if (code && worst == b->count) worst = i;
    }
    int rc = 0;
    if (worst < b->count) {
        struct batch_req *r = &b->reqs[worst];
        rc = ferry_fail(r->code, "request %zu of %zu: %s", worst, b->count, r->detail ? r->detail : "failed");
    }
    pthread_mutex_unlock(&b->lock);
    return rc;
}

/* Inside the engine's count of calls in progress (engine.h): a submit that
 * races destroy either queues before the workers stop or gets CONTEXT. */
long ferry_batch_submit(ferry_batch_t *b, const char *peer, const ferry_request_t *reqs, size_t n, int timeout_ms)
{
    int rc = ferry_batch_check(b, "batch submit");
    if (rc) return rc;
    rc = ferry_engine_enter(b->engine);
    if (rc) return rc;
    long first = batch_submit(b, peer, reqs, n, timeout_ms, false);
    rc = ferry_engine_leave(b->engine, first < 0 ? (int)first : 0);
    return rc ? rc : first;
}

/* b's engine once ferry_batch_check passes, else NULL with the failure raised
 * (strided.c). */
ferry_engine_t *ferry_batch_engine(const ferry_batch_t *b)
{
    return ferry_batch_check(b, "batch submit") ? NULL : b->engine;
}

/* ferry_batch_submit of requests the caller checked already (strided.c). */
long ferry_batch_submit_checked(ferry_batch_t *b, const char *peer, const ferry_request_t *reqs, size_t n,
                                int timeout_ms)
{
    int rc = ferry_batch_check(b, "batch submit");
    if (rc) return rc;
    rc = ferry_engine_enter(b->engine);
    if (rc) return rc;
    long first = batch_submit(b, peer, reqs, n, timeout_ms, true);
    rc = ferry_engine_leave(b->engine, first < 0 ? (int)first : 0);
    return rc ? rc : first;
}
