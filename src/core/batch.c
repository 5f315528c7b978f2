/* The async batch API (batch.h): requests cut into pieces and queued as
 * tasks for the workers (workers.c), their states, waiting and cancelling. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "fail.h"

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
    int rc = 0;
    for (size_t i = 0; i < b->count && rc == 0; i++) {
        struct batch_req *r = &b->reqs[i];
        if (r->code) {
            rc = r->code;
            ferry_fail(rc, "request %zu of %zu: %s", i, b->count, r->detail ? r->detail : "failed");
        }
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
    pthread_mutex_lock(&e->queue_lock);
    ferry_task_t *prev = NULL;
    for (ferry_task_t *t = e->queue_head, *next; t; t = next) {
        next = t->next;
        if (t->batch != b) {
            prev = t;
            continue;
        }
        bool left = false;
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
            e->queue_head = next;
        if (e->queue_tail == t) e->queue_tail = prev;
        struct task_ext *te = (struct task_ext *)t;
        finish_task_locked(b, te);
        te->bnext = dropped; /* unlinked from the batch: reuse the link */
        dropped = te;
    }
    pthread_mutex_unlock(&e->queue_lock);
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
