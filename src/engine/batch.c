/* SPDX-License-Identifier: Apache-2.0 */
/* The async batch API (batch.h): requests cut into pieces and queued as
 * tasks for the workers (workers.c), their states, waiting and cancelling. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "engine.h"
#include "util/fail.h"

/* ---------------------------------------------------------- async batch */

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

/* The live batches, so that a second ferry_batch_free is refused without
 * touching the freed batch: an open-addressing set of pointers, kept at
 * most half full. Only alloc and free take its lock. */
static struct {
    pthread_mutex_t lock;
    ferry_batch_t **slots;
    size_t cap, used;
} live = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t live_hash(const ferry_batch_t *b, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)b * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

/* With live.lock held: the slot of b, or of the empty slot ending its probe. */
static size_t live_find_locked(const ferry_batch_t *b)
{
    size_t i = live_hash(b, live.cap);
    while (live.slots[i] && live.slots[i] != b) i = (i + 1) & (live.cap - 1);
    return i;
}

static int live_add(ferry_batch_t *b)
{
    pthread_mutex_lock(&live.lock);
    if ((live.used + 1) * 2 > live.cap) {
        size_t cap = live.cap ? live.cap * 2 : 64;
        ferry_batch_t **old = live.slots, **slots = calloc(cap, sizeof *slots);
        if (!slots) {
            pthread_mutex_unlock(&live.lock);
            return -1;
        }
        size_t old_cap = live.cap;
        live.slots = slots;
        live.cap = cap;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i]) live.slots[live_find_locked(old[i])] = old[i];
        free(old);
    }
    live.slots[live_find_locked(b)] = b;
    live.used++;
    pthread_mutex_unlock(&live.lock);
    return 0;
}

/* Removes b; false if b is not a live batch (freed already, or never one). */
static bool live_remove(ferry_batch_t *b)
{
    pthread_mutex_lock(&live.lock);
    size_t i = live.cap ? live_find_locked(b) : 0;
    bool found = live.cap && live.slots[i] == b;
    if (found) {
        /* Backward-shift deletion keeps every probe chain unbroken. */
        live.slots[i] = NULL;
        for (size_t j = (i + 1) & (live.cap - 1); live.slots[j]; j = (j + 1) & (live.cap - 1)) {
            ferry_batch_t *moved = live.slots[j];
            live.slots[j] = NULL;
            live.slots[live_find_locked(moved)] = moved;
        }
        live.used--;
    }
    pthread_mutex_unlock(&live.lock);
    return found;
}

/* A cheap guard at every entry: a freed batch whose memory was not yet
 * reused still carries BATCH_FREED. */
static int batch_check(const ferry_batch_t *b, const char *call)
{
    if (!b) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "%s: batch is NULL", call);
    if (b->magic != BATCH_MAGIC)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "%s: %p is not a live batch (used after ferry_batch_free?)",
                          call, (const void *)b);
    return 0;
}

int ferry_batch_alloc(ferry_engine_t *e, size_t capacity, ferry_batch_t **out)
{
    ferry_clear_last_error();
    if (!e || !out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "batch alloc: NULL argument");
    if (capacity == 0 || capacity > (1u << 24))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "batch alloc: capacity %zu not in [1, %u]", capacity, 1u << 24);
    ferry_batch_t *b = calloc(1, sizeof *b);
    if (b) b->reqs = calloc(capacity, sizeof *b->reqs);
    if (!b || !b->reqs) {
        free(b);
        return ferry_fail(FERRY_ERR_MEMORY, "batch of %zu: out of memory", capacity);
    }
    if (live_add(b) != 0) {
        free(b->reqs);
        free(b);
        return ferry_fail(FERRY_ERR_MEMORY, "batch of %zu: out of memory", capacity);
    }
    b->magic = BATCH_MAGIC;
    b->engine = e;
    b->capacity = capacity;
    pthread_mutex_init(&b->lock, NULL);
    ferry_cond_init_monotonic(&b->cond);
    *out = b;
    return 0;
}

static int final_state(int code)
{
    switch (code) {
    case 0: return FERRY_STATUS_COMPLETED;
    case FERRY_ERR_CANCELLED: return FERRY_STATUS_CANCELLED;
    case FERRY_ERR_TIMEOUT: return FERRY_STATUS_TIMEOUT;
    default: return FERRY_STATUS_FAILED;
    }
}

static bool is_final(int state) { return state >= FERRY_STATUS_COMPLETED; }

/* With b->lock held: folds a finished piece into its request. The first
 * failure names the request, except that CANCEL_UNCONFIRMED (pages not safe
 * to reuse) outranks every other. */
static void settle_piece_locked(ferry_batch_t *b, ferry_xfer_t *x)
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
static void settle_unsent_locked(ferry_batch_t *b, size_t idx, int rc, const char *detail)
{
    ferry_xfer_t x = {.index = idx, .rc = rc, .detail = strdup(detail)};
    settle_piece_locked(b, &x);
}

/* A piece reached its final state while its task goes on (xfer.c). */
static void batch_piece_ended(ferry_xfer_t *x, void *arg)
{
    ferry_batch_t *b = arg;
    pthread_mutex_lock(&b->lock);
    settle_piece_locked(b, x);
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

/* With b->lock held: the task is over; settles what is left of it. */
static void finish_task_locked(ferry_batch_t *b, struct task_ext *t)
{
    ferry_task_t *task = &t->task;
    for (size_t i = 0; i < task->nxfers; i++) {
        ferry_xfer_t *x = &task->xfers[i];
        if (!x->has_ended) {
            x->has_ended = true;
            settle_piece_locked(b, x);
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

static void release_task(struct task_ext *t)
{
    ferry_session_put(t->task.session);
    free(t->task.xfers);
    ferry_task_free(t);
}

/* A worker finished a task. */
static void batch_task_done(ferry_task_t *task, void *owner)
{
    ferry_batch_t *b = owner;
    pthread_mutex_lock(&b->lock);
    finish_task_locked(b, (struct task_ext *)task);
    pthread_mutex_unlock(&b->lock);
    release_task((struct task_ext *)task);
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

/* Reserves slots [first, first+n) under one hold of the lock, so that
 * concurrent submits never share a slot nor pass the capacity. Nothing of
 * the submit can fail after it (slots are never given back: a canceller
 * may already wait on them). The submit counts as a pending task until
 * its tasks are queued (submit_end), so that wait, cancel and free see
 * it. With reserve false, only checks that n slots are left now. */
size_t ferry_batch_room(ferry_batch_t *b)
{
    pthread_mutex_lock(&b->lock);
    size_t room = b->capacity - b->count;
    pthread_mutex_unlock(&b->lock);
    return room;
}

static long reserve_slots(ferry_batch_t *b, size_t n, bool reserve)
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
static void submit_end(ferry_batch_t *b)
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
    int rc = batch_check(b, "batch submit");
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
    long left = reserve_slots(b, n, false); /* fails early, before connecting */
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
    long reserved = rc ? rc : reserve_slots(b, n, true);
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
        xs[i].ended = batch_piece_ended;
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
        struct task_ext *t = part ? ferry_task_new(s, part, cnt, batch_task_done, b) : NULL;
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
    submit_end(b);
    return (long)first;
}

int ferry_batch_status(ferry_batch_t *b, size_t idx, ferry_status_t *st)
{
    int rc = batch_check(b, "batch status");
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
    int check = batch_check(b, "batch wait");
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

/* ---------------------------------------------------------------- cancel */

static bool in_range(size_t idx, size_t first, size_t n) { return idx >= first && idx - first < n; }

/* Whether task t carries an unfinished request of [first, first+n). Reads
 * only the pieces' immutable index and the requests' state (b->lock held),
 * never what the worker running t writes. */
static bool task_carries(ferry_batch_t *b, const struct task_ext *t, size_t first, size_t n)
{
    for (size_t i = 0; i < t->task.nxfers; i++) {
        size_t idx = t->task.xfers[i].index;
        if (in_range(idx, first, n) && !is_final(b->reqs[idx].state)) return true;
    }
    return false;
}

/* With b->lock held: flags the unfinished requests of [first, first+n),
 * settles their pieces in tasks no worker has started (dropping tasks left
 * empty), and interrupts the running tasks that carry them. */
static void cancel_locked(ferry_batch_t *b, size_t first, size_t n)
{
    ferry_engine_t *e = b->engine;
    for (size_t i = first; i < first + n; i++)
        if (!is_final(b->reqs[i].state)) atomic_store(&b->reqs[i].cancel, true);
    struct task_ext *dropped = NULL;
    pthread_mutex_lock(&e->work.lock);
    ferry_task_t *prev = NULL;
    for (ferry_task_t *t = e->work.head, *next; t; t = next) {
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
            settle_piece_locked(b, x);
        }
        if (left) {
            prev = t;
            continue;
        }
        if (prev)
            prev->next = next;
        else
            e->work.head = next;
        if (e->work.tail == t) e->work.tail = prev;
        struct task_ext *te = (struct task_ext *)t;
        finish_task_locked(b, te);
        te->bnext = dropped; /* unlinked from the batch: reuse the link */
        dropped = te;
    }
    pthread_mutex_unlock(&e->work.lock);
    /* Requests of strided windows no lane took have no piece yet: settled
     * here, so that a cancel does not wait for a lane to reach them. */
    for (size_t i = first; i < first + n; i++) {
        if (b->reqs[i].untaken && !is_final(b->reqs[i].state)) {
            b->reqs[i].untaken = false;
            settle_unsent_locked(b, i, ferry_fail(FERRY_ERR_CANCELLED, "cancelled before it started"),
                                 ferry_fail_message());
        }
    }
    for (struct task_ext *t = b->tasks; t; t = t->bnext)
        if (task_carries(b, t, first, n)) ferry_stream_ctl_fire(&t->ctl);
    while (dropped) {
        struct task_ext *next = dropped->bnext;
        release_task(dropped);
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
    int check = batch_check(b, "batch cancel");
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
    int check = batch_check(b, "batch cancel");
    if (check) return check;
    pthread_mutex_lock(&b->lock);
    if (idx >= b->count) {
        size_t count = b->count;
        pthread_mutex_unlock(&b->lock);
        return ferry_fail(FERRY_ERR_NOT_FOUND, "batch cancel: request %zu not submitted (%zu are)", idx, count);
    }
    cancel_locked(b, idx, 1);
    while (!is_final(b->reqs[idx].state)) pthread_cond_wait(&b->cond, &b->lock);
    int rc = unconfirmed_locked(b, idx, 1);
    pthread_mutex_unlock(&b->lock);
    return rc;
}

int ferry_batch_free(ferry_batch_t *b)
{
    ferry_clear_last_error();
    if (!b) return 0;
    /* Looked up before b is read: a batch freed twice is never touched. */
    if (!live_remove(b))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "batch free: %p is not a live batch (freed twice?)",
                          (void *)b);
    pthread_mutex_lock(&b->lock);
    size_t pending = b->tasks_pending;
    pthread_mutex_unlock(&b->lock);
    if (pending) {
        live_add(b); /* it stays live; the set had room for it a moment ago */
        return ferry_fail(FERRY_ERR_BATCH_BUSY, "batch free: %zu task(s) still in flight (wait or cancel first)",
                          pending);
    }
    b->magic = BATCH_FREED;
    for (size_t i = 0; i < b->count; i++) free(b->reqs[i].detail);
    free(b->reqs);
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    free(b);
    return 0;
}

/* Inside the engine's count of calls in progress (engine.h): a submit that
 * races destroy either queues before the workers stop or gets CONTEXT. */
long ferry_batch_submit(ferry_batch_t *b, const char *peer, const ferry_request_t *reqs, size_t n, int timeout_ms)
{
    int rc = batch_check(b, "batch submit");
    if (rc) return rc;
    rc = ferry_engine_enter(b->engine);
    if (rc) return rc;
    long first = batch_submit(b, peer, reqs, n, timeout_ms, false);
    rc = ferry_engine_leave(b->engine, first < 0 ? (int)first : 0);
    return rc ? rc : first;
}

/* b's engine once batch_check passes, else NULL with the failure raised
 * (strided.c). */
ferry_engine_t *ferry_batch_engine(const ferry_batch_t *b)
{
    return batch_check(b, "batch submit") ? NULL : b->engine;
}

/* ferry_batch_submit of requests the caller checked already (strided.c). */
long ferry_batch_submit_checked(ferry_batch_t *b, const char *peer, const ferry_request_t *reqs, size_t n,
                                int timeout_ms)
{
    int rc = batch_check(b, "batch submit");
    if (rc) return rc;
    rc = ferry_engine_enter(b->engine);
    if (rc) return rc;
    long first = batch_submit(b, peer, reqs, n, timeout_ms, true);
    rc = ferry_engine_leave(b->engine, first < 0 ? (int)first : 0);
    return rc ? rc : first;
}

/* ------------------------------------------------------- strided lanes
 *
 * A strided submit's n requests get their slots at once (the batch's own
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
    uint64_t id = atomic_fetch_add(&b->engine->next_req_id, n);
    for (size_t i = from; i < from + n; i++) {
        size_t idx = j->first + i;
        struct batch_req *r = &b->reqs[idx];
        if (!r->untaken) continue; /* a cancel settled it already */
        r->untaken = false;
        if (atomic_load(&r->cancel)) {
            settle_unsent_locked(b, idx, FERRY_ERR_CANCELLED, "cancelled before it started");
            continue;
        }
        if (j->lost_rc) {
            settle_unsent_locked(b, idx, j->lost_rc, j->lost_detail ? j->lost_detail : "the peer was lost");
            continue;
        }
        ferry_xfer_t *x = &xs[k++];
        *x = (ferry_xfer_t){.opcode = d->opcode, .len = d->piece_len, .req_id = id + i - from,
                            .deadline = j->deadline, .index = idx, .cancel = &r->cancel, .progress = &r->bytes,
                            .ended = batch_piece_ended, .ended_arg = b, .ctl = &t->ctl};
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
        if (atomic_load(&e->stopping)) {
            rc = ferry_fail(FERRY_ERR_CONTEXT, "the engine shut down before the request ran");
            for (size_t i = 0; i < n; i++) ferry_xfer_fail(&xs[i], rc);
        } else if (n) {
            rc = ferry_xfer_run(e, t->task.session, xs, n);
        }
        pthread_mutex_lock(&b->lock);
        for (size_t i = 0; i < n; i++) {
            if (!xs[i].has_ended) {
                xs[i].has_ended = true;
                settle_piece_locked(b, &xs[i]);
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
    size_t count = (size_t)(e->cfg.conns_per_peer < e->cfg.workers ? e->cfg.conns_per_peer : e->cfg.workers);
    if (count > 64) count = 64;
    size_t w = j->window = ferry_strided_window(n, count);
    size_t windows = (n - 1) / w + 1;
    if (count > windows) count = windows;
    for (size_t k = 0; k < count; k++) {
        ferry_xfer_t *xs = malloc(w * sizeof *xs);
        lanes[k] = xs ? ferry_task_new(s, xs, 0, batch_task_done, b) : NULL;
        if (!lanes[k]) {
            free(xs);
            for (size_t i = 0; i < k; i++) release_task(lanes[i]);
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
    int rc = batch_check(b, "batch submit");
    if (rc) return rc;
    ferry_engine_t *e = b->engine;
    if (d->n == 0) return reserve_slots(b, 0, false);
    long left = reserve_slots(b, d->n, false); /* fails early, before connecting */
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
        j->deadline = ferry_deadline_after_ms(timeout_ms > 0 ? timeout_ms : e->cfg.timeout_ms);
        nlanes = new_lanes(s, b, j, lanes);
    }
    long reserved = nlanes ? reserve_slots(b, d->n, true)
                           : ferry_fail(FERRY_ERR_MEMORY, "strided submit of %zu pieces: out of memory", d->n);
    if (reserved < 0) {
        for (size_t k = 0; k < nlanes; k++) release_task(lanes[k]);
        free(j);
        ferry_session_put(s);
        return reserved;
    }
    pthread_mutex_init(&j->refs_lock, NULL);
    j->refs = (int)nlanes;
    j->first = (size_t)reserved;
    FERRY_STAT_ADD(&e->stats, requests, d->n);
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
    submit_end(b);
    return (long)first;
}
