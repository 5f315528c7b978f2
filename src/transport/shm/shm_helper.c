/* SPDX-License-Identifier: Apache-2.0 */
/* The shm target's copy helper: a second thread, one per engine, that takes
 * a share of a large copy a serving thread is making, so that one frame's
 * copy runs on two CPUs (shm_vec.c splits a frame of pieces in the
 * initiator's order into parts; each thread claims parts from its own end).
 *
 * Why a thread of the transport's own: a call of 1,024 x 4 KiB pieces is
 * one frame on one connection (the initiator runs such calls unsplit, see
 * shm.c's small_serial), so one serving thread would copy all of it while
 * the other CPU idles. Measured alone (process_vm_readv of 1,024 scattered
 * 4 KiB pieces from one 4 MiB buffer, docs/BENCHMARKS.md, issue 23) one
 * thread takes ~220 us, two ~120 us. Likewise a call of 16 x 1 MiB: the
 * target shares each 4 MiB gathered copy of such a frame (shm_vec.c,
 * large_chunk_shared), so the initiator sends the call on one connection
 * (FERRY_HELLO_F_CMA_SHARE) instead of splitting it over two and paying a
 * hand-off to its worker and the wait for the slower half.
 *
 * The helper only ever works on a job a serving thread offered and waits
 * for: the serving thread holds the registry's read lock for the whole
 * copy and returns only once the helper is done with it, so nothing the
 * helper copies lands after a deregistration, a cancel or a fence. A job
 * the helper has not picked up by the time the serving thread finished its
 * own parts (and so all of them) is withdrawn: its wake-up is never waited
 * for. One job at a time: a second serving thread finding the helper busy
 * copies alone, as it would with one CPU (the two CPUs are busy then). */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "util/clock.h"
#include "util/spin.h"
#include "link/transport.h"

#include "shm_internal.h"
#include "shm_testing.h"

enum { JOB_IDLE, JOB_OFFERED, JOB_TAKEN, JOB_DONE };

struct shm_helper {
    pthread_mutex_t lock;
    pthread_cond_t wake;   /* the helper: a job was offered, or stop */
    pthread_cond_t done;   /* the serving thread: the helper finished its share */
    pthread_t thread;
    bool stop;
    _Atomic int job;       /* JOB_*; written under lock */
    void (*work)(void *arg, int side);
    void *arg;
};

/* Shares taken by the helper (for tests and benchmarks). */
static _Atomic uint64_t helper_shares;

uint64_t ferry_shm_helper_shares(void) { return atomic_load_explicit(&helper_shares, memory_order_relaxed); }

static void *helper_main(void *p)
{
    struct shm_helper *h = p;
    pthread_mutex_lock(&h->lock);
    for (;;) {
        while (!h->stop && atomic_load_explicit(&h->job, memory_order_relaxed) != JOB_OFFERED)
            pthread_cond_wait(&h->wake, &h->lock);
        if (h->stop) break;
        atomic_store_explicit(&h->job, JOB_TAKEN, memory_order_relaxed);
        void (*work)(void *, int) = h->work;
        void *arg = h->arg;
        pthread_mutex_unlock(&h->lock);
        atomic_fetch_add_explicit(&helper_shares, 1, memory_order_relaxed);
        work(arg, 1);
        pthread_mutex_lock(&h->lock);
        atomic_store_explicit(&h->job, JOB_DONE, memory_order_release);
        pthread_cond_signal(&h->done);
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

static _Atomic(void *) *helper_slot(ferry_xport_ctx_t *ctx) { return ferry_transport_state(ctx, &ferry_transport_shm); }

/* Guards the helper's creation (the slot is read lock-free after it). */
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;

/* The engine's helper, started at first use; NULL with one usable CPU or
 * when the thread cannot start (then copies run in the serving thread). */
static struct shm_helper *helper_get(ferry_xport_ctx_t *ctx)
{
    struct shm_helper *h = atomic_load_explicit(helper_slot(ctx), memory_order_acquire);
    if (h || ferry_spin_cpus() < 2) return h;
    pthread_mutex_lock(&create_lock);
    h = atomic_load_explicit(helper_slot(ctx), memory_order_acquire);
    if (!h && (h = calloc(1, sizeof *h)) != NULL) {
        pthread_mutex_init(&h->lock, NULL);
        pthread_cond_init(&h->wake, NULL);
        pthread_cond_init(&h->done, NULL);
        /* The helper takes no signals: they belong to the application's threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int rc = pthread_create(&h->thread, NULL, helper_main, h);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc == 0) {
            atomic_store_explicit(helper_slot(ctx), h, memory_order_release);
        } else {
            pthread_cond_destroy(&h->done);
            pthread_cond_destroy(&h->wake);
            pthread_mutex_destroy(&h->lock);
            free(h);
            h = NULL;
        }
    }
    pthread_mutex_unlock(&create_lock);
    return h;
}

void shm_helper_fini(ferry_xport_ctx_t *ctx)
{
    struct shm_helper *h = atomic_exchange_explicit(helper_slot(ctx), NULL, memory_order_acq_rel);
    if (!h) return;
    pthread_mutex_lock(&h->lock);
    h->stop = true;
    pthread_cond_signal(&h->wake);
    pthread_mutex_unlock(&h->lock);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->done);
    pthread_cond_destroy(&h->wake);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

/* How long the serving thread spins for the helper's last part before it
 * sleeps: a part is about SHM_PART bytes, tens of microseconds of copying;
 * a helper not done by then was descheduled. */
#define HELPER_JOIN_SPIN_NS (200u * 1000u)

bool shm_helper_share(ferry_xport_ctx_t *ctx, void (*work)(void *arg, int side), void *arg)
{
    struct shm_helper *h = helper_get(ctx);
    bool offered = false;
    if (h) {
        pthread_mutex_lock(&h->lock);
        if (!h->stop && atomic_load_explicit(&h->job, memory_order_relaxed) == JOB_IDLE) {
            h->work = work;
            h->arg = arg;
            atomic_store_explicit(&h->job, JOB_OFFERED, memory_order_relaxed);
            pthread_cond_signal(&h->wake);
            offered = true;
        }
        pthread_mutex_unlock(&h->lock);
    }
    work(arg, 0);
    if (!offered) return false;
    pthread_mutex_lock(&h->lock);
    bool taken = atomic_load_explicit(&h->job, memory_order_relaxed) != JOB_OFFERED;
    if (!taken) atomic_store_explicit(&h->job, JOB_IDLE, memory_order_relaxed); /* withdrawn */
    pthread_mutex_unlock(&h->lock);
    if (!taken) return false;
    uint64_t until = ferry_now_ns() + HELPER_JOIN_SPIN_NS;
    while (atomic_load_explicit(&h->job, memory_order_acquire) != JOB_DONE && ferry_now_ns() < until) sched_yield();
    pthread_mutex_lock(&h->lock);
    while (atomic_load_explicit(&h->job, memory_order_relaxed) != JOB_DONE) pthread_cond_wait(&h->done, &h->lock);
    atomic_store_explicit(&h->job, JOB_IDLE, memory_order_relaxed);
    pthread_mutex_unlock(&h->lock);
    return true;
}
