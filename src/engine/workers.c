/* SPDX-License-Identifier: Apache-2.0 */
/* Cutting requests into pieces, the worker pool that runs them on several
 * connections at once, and the synchronous parallel run (batch.h). The
 * async batch API is in batch*.c. */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>

#include "util/clock.h"
#include "parts.h"
#include "session.h"
#include "util/spin.h"
#include "workers.h"
#include "util/fail.h"

/* Requests at least this big are striped over the peer's connections. */
#define STRIPE_MIN (8u << 20)

static int stripes_for(const ferry_engine_t *e, uint64_t len)
{
    int k = ferry_engine_part_config(e)->conns_per_peer;
    if (len < STRIPE_MIN || k < 2) return 1;
    uint64_t max_k = len / (STRIPE_MIN / 2);
    return (uint64_t)k > max_k ? (int)max_k : k;
}

int ferry_make_pieces(ferry_engine_t *e, int opcode, void *const *locals, const uint64_t *remotes,
                      const size_t *lens, size_t n, uint64_t deadline, ferry_xfer_t **out, size_t *nout)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += lens[i] < STRIPE_MIN ? 1 : (size_t)stripes_for(e, lens[i]);
    /* Cleared once as a whole, then only the fields set: a compound
     * literal per piece costs a small `rep stos` each, which showed. */
    ferry_xfer_t *xs = calloc(total, sizeof *xs);
    if (!xs) return ferry_fail(FERRY_ERR_MEMORY, "%zu transfer pieces: out of memory", total);
    size_t k = 0;
    uint64_t slice = ferry_engine_part_config(e)->slice_size;
    /* One id per piece, so that one piece can be fenced alone (cancel.h);
     * taken as one block. */
    uint64_t next_id = ferry_engine_part_req_ids(e, total);
    for (size_t i = 0; i < n; i++) {
        if (lens[i] < STRIPE_MIN) { /* one piece: the common case, kept cheap */
            ferry_xfer_t *x = &xs[k++];
            x->opcode = opcode;
            x->local = (unsigned char *)locals[i];
            x->remote = remotes[i];
            x->len = lens[i];
            x->req_id = next_id++;
            x->deadline = deadline;
            x->index = i;
            continue;
        }
        int stripes = stripes_for(e, lens[i]);
        /* Stripe boundaries on slice multiples keep every slice full-sized. */
        uint64_t per = (lens[i] / (uint64_t)stripes + slice - 1) / slice * slice;
        for (int j = 0; j < stripes; j++) {
            uint64_t off = per * (uint64_t)j;
            if (off >= lens[i]) break;
            uint64_t len = lens[i] - off < per ? lens[i] - off : per;
            uint64_t req_id = next_id++;
            xs[k++] = (ferry_xfer_t){.opcode = opcode, .local = (unsigned char *)locals[i] + off,
                                     .remote = remotes[i] + off, .len = len, .req_id = req_id,
                                     .deadline = deadline, .index = i};
        }
    }
    *out = xs;
    *nout = k;
    return 0;
}

/* ------------------------------------------------------------- workers */

void ferry_task_enqueue(ferry_engine_t *e, ferry_task_t *t)
{
    ferry_workers_t *w = ferry_engine_part_work(e);
    pthread_mutex_lock(&w->lock);
    t->next = NULL;
    if (w->tail)
        w->tail->next = t;
    else
        w->head = t;
    w->tail = t;
    pthread_mutex_unlock(&w->lock);
    /* After the unlock: a worker woken while we still held the lock would
     * only block on it again (two wake-ups for one task). The condition
     * lives as long as the engine, which outlives every caller. */
    pthread_cond_signal(&w->cond);
}

static ferry_task_t *dequeue(ferry_engine_t *e)
{
    ferry_workers_t *w = ferry_engine_part_work(e);
    pthread_mutex_lock(&w->lock);
    while (!w->head && !ferry_engine_part_stopping(e)) pthread_cond_wait(&w->cond, &w->lock);
    ferry_task_t *t = w->head;
    if (t) {
        w->head = t->next;
        if (!w->head) w->tail = NULL;
    }
    pthread_mutex_unlock(&w->lock);
    return t;
}

static void run_task(ferry_engine_t *e, ferry_task_t *t)
{
    struct task_ext *x = (struct task_ext *)t;
    if (x->run) {
        x->run(x, x->run_arg); /* a lane: fails its own pieces once the engine stops */
    } else if (ferry_engine_part_stopping(e)) {
        int rc = ferry_fail(FERRY_ERR_CONTEXT, "the engine shut down before the request ran");
        for (size_t i = 0; i < t->nxfers; i++)
            if (t->xfers[i].rc == 0) ferry_xfer_fail(&t->xfers[i], rc);
    } else {
        if (x->start) x->start(t, x->owner);
        ferry_xfer_run(e, t->session, t->xfers, t->nxfers);
    }
    x->done(t, x->owner);
}

static void *worker_main(void *arg)
{
    ferry_engine_t *e = arg;
    ferry_task_t *t;
    while ((t = dequeue(e)) != NULL) run_task(e, t);
    return NULL;
}

int ferry_workers_start(ferry_engine_t *e)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    ferry_workers_t *w = ferry_engine_part_work(e);
    w->threads = calloc((size_t)cfg->workers, sizeof *w->threads);
    if (!w->threads) return ferry_fail(FERRY_ERR_MEMORY, "workers: out of memory");
    for (int i = 0; i < cfg->workers; i++) {
        if (pthread_create(&w->threads[i], NULL, worker_main, e) != 0) {
            ferry_workers_stop(e);
            return ferry_fail(FERRY_ERR_INTERNAL, "cannot start worker thread %d", i);
        }
        w->n++;
    }
    return 0;
}

/* Stops the workers; tasks still queued are failed with CONTEXT. */
void ferry_workers_stop(ferry_engine_t *e)
{
    ferry_workers_t *w = ferry_engine_part_work(e);
    pthread_mutex_lock(&w->lock);
    ferry_engine_part_set_stopping(e);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    for (int i = 0; i < w->n; i++) pthread_join(w->threads[i], NULL);
    free(w->threads);
    w->threads = NULL;
    w->n = 0;
    ferry_task_t *t;
    while ((t = dequeue(e)) != NULL) run_task(e, t);
}

struct task_ext *ferry_task_new(ferry_session_t *s, ferry_xfer_t *xs, size_t n, task_done_fn done, void *owner)
{
    struct task_ext *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    atomic_fetch_add(&s->refs, 1);
    ferry_stream_ctl_init(&t->ctl, s);
    t->task.session = s;
    t->task.xfers = xs;
    t->task.nxfers = n;
    t->done = done;
    t->owner = owner;
    return t;
}

size_t ferry_task_partition(const ferry_xfer_t *xs, size_t n, size_t groups, size_t *starts)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += xs[i].len;
    if (groups > n) groups = n;
    size_t g = 0;
    uint64_t acc = 0;
    starts[0] = 0;
    for (size_t i = 0; i < n && g + 1 < groups; i++) {
        acc += xs[i].len;
        if (acc >= total / groups * (g + 1) && i + 1 < n) starts[++g] = i + 1;
    }
    starts[++g] = n;
    return g;
}

/* ------------------------------------------------- sync parallel runs */

/* Before blocking on a condition variable until *pending (guarded by
 * lock) is 0, busy-polls it for the engine's spin budget (spin.h:
 * config.spin_us, else learnt from the recent such waits, so none when they
 * are long or the engine is idle), yielding the CPU at each turn: a worker
 * finishing in microseconds then costs no cross-CPU wake-up. Returns with
 * the lock held, and whether *pending was 0 by then. */
static bool spin_until_zero_locked(ferry_engine_t *e, pthread_mutex_t *lock, const size_t *pending,
                                   uint64_t deadline, int others)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    unsigned spin_us = *pending ? ferry_spin_us(ferry_engine_part_batch_spin(e), cfg->spin_us) : 0;
    /* Adaptive: only with a CPU to spare besides the threads the wait is
     * for; on fewer the spin takes the CPU they need (a 1-piece batch on
     * 2 CPUs waited 30 us p50 blocking, 36 us spinning). */
    if (cfg->spin_us == 0 && ferry_spin_cpus() <= others) spin_us = 0;
    if (spin_us == 0) return *pending == 0;
    uint64_t until = ferry_now_ns() + (uint64_t)spin_us * 1000u;
    if (until > deadline) until = deadline;
    while (*pending > 0 && ferry_now_ns() < until) {
        pthread_mutex_unlock(lock);
        sched_yield();
        pthread_mutex_lock(lock);
    }
    return *pending == 0;
}

int ferry_wait_zero_locked(ferry_engine_t *e, pthread_mutex_t *lock, pthread_cond_t *cond, const size_t *pending,
                           uint64_t deadline, int others)
{
    if (*pending == 0) return 0;
    uint64_t t0 = ferry_now_ns();
    if (!spin_until_zero_locked(e, lock, pending, deadline, others)) {
        struct timespec ts = ferry_deadline_timespec(deadline);
        while (*pending > 0) {
            if (deadline == UINT64_MAX) pthread_cond_wait(cond, lock);
            else if (pthread_cond_timedwait(cond, lock, &ts) == ETIMEDOUT && *pending > 0) return ETIMEDOUT;
        }
    }
    ferry_spin_record(ferry_engine_part_batch_spin(e), ferry_now_ns() - t0);
    return 0;
}

struct join {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t left;
};

void ferry_task_free(struct task_ext *t)
{
    ferry_stream_ctl_destroy(&t->ctl);
    free(t);
}

void ferry_task_finish_joined(ferry_task_t *t, pthread_mutex_t *lock, pthread_cond_t *cond, size_t *left)
{
    ferry_session_put(t->session);
    ferry_task_free((struct task_ext *)t);
    pthread_mutex_lock(lock);
    (*left)--;
    pthread_cond_signal(cond);
    pthread_mutex_unlock(lock);
}

static void join_done(ferry_task_t *t, void *owner)
{
    struct join *j = owner;
    ferry_task_finish_joined(t, &j->lock, &j->cond, &j->left);
}

/* Runs the pieces on up to conns_per_peer connections: the caller's thread
 * takes the first group, workers the others. Returns the first failure. */
int ferry_run_parallel(ferry_engine_t *e, ferry_session_t *s, ferry_xfer_t *xs, size_t n)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    size_t groups = (size_t)cfg->conns_per_peer;
    if (groups > (size_t)cfg->workers + 1) groups = (size_t)cfg->workers + 1;
    size_t starts[66];
    size_t g = ferry_task_partition(xs, n, groups > 64 ? 64 : groups, starts);
    struct join j = {.left = 0};
    pthread_mutex_init(&j.lock, NULL);
    pthread_cond_init(&j.cond, NULL);
    for (size_t k = 1; k < g; k++) {
        struct task_ext *t = ferry_task_new(s, xs + starts[k], starts[k + 1] - starts[k], join_done, &j);
        if (!t) {
            /* Run it here instead: slower, still correct. */
            ferry_xfer_run(e, s, xs + starts[k], starts[k + 1] - starts[k]);
            continue;
        }
        pthread_mutex_lock(&j.lock);
        j.left++;
        pthread_mutex_unlock(&j.lock);
        ferry_task_enqueue(e, &t->task);
    }
    ferry_xfer_run(e, s, xs, starts[1]);
    pthread_mutex_lock(&j.lock);
    /* The caller's own group is done: the workers still copying are the
     * one other thread that must run on this machine's CPUs. */
    ferry_wait_zero_locked(e, &j.lock, &j.cond, &j.left, UINT64_MAX, 1);
    pthread_mutex_unlock(&j.lock);
    pthread_mutex_destroy(&j.lock);
    pthread_cond_destroy(&j.cond);
    for (size_t i = 0; i < n; i++)
        if (xs[i].rc) return xs[i].rc;
    return 0;
}
