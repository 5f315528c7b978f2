/* SPDX-License-Identifier: Apache-2.0 */
/* Strided batches over the RDMA transport's group commit (protocol 3) from
 * 8 threads sharing one engine, on the software HCA of
 * tests/support/rdma_fake.c, under ASan and TSan: strided sync and async
 * writes read back and compared, with the target's region deregistered
 * and registered again under strided writes into it, and sessions closed
 * under them. Each call completes or fails with a code that race may
 * produce (the region missing or changed; the session closed); no byte
 * lands after ferry_deregister returned.
 *
 * Needs <infiniband/verbs.h>; skipped in builds without the verbs code. */
#ifndef FERRY_HAVE_RDMA
#include "harness.h"
static void skipped(void **state)
{
    (void)state;
    skip();
}
int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "rdma_fake.h"

#define THREADS 8
#define PIECE 2048
#define BAND 64 /* pages per thread; 7 * j % BAND is a permutation */
#define ITERS 20

typedef struct world {
    pair_t p;
    unsigned char *src, *back, *dst;
    unsigned char *churned;     /* target region deregistered under writes */
    atomic_bool churn_done;
    atomic_int errors;
    atomic_long landed, refused;
} world_t;

typedef struct worker {
    world_t *w;
    int id;
} worker_t;

static size_t band_bytes(void) { return (size_t)THREADS * BAND * PIECE; }

static void report(worker_t *k, const char *what, long rc)
{
    fprintf(stderr, "thread %d: %s: %ld (%s) %s\n", k->id, what, rc, ferry_error_name((int)rc),
            ferry_last_error_detail());
    atomic_fetch_add(&k->w->errors, 1);
}

/* 0, or SESSION_INVALID: a session closed by another thread under it. */
static bool ok_or_closed(worker_t *k, const char *what, long rc)
{
    if (rc >= 0) return true;
    if (rc != FERRY_ERR_SESSION_INVALID) report(k, what, rc);
    return false;
}

/* This thread's band: local page j to remote page 7j+round mod BAND,
 * written, read back into `back`, compared; sync or through a batch. */
static void strided_round(worker_t *k, uint64_t round, bool async)
{
    world_t *w = k->w;
    size_t n = 8 + (round * 13 + (uint64_t)k->id) % (BAND - 8);
    uint64_t lidx[BAND], ridx[BAND], first = (uint64_t)k->id * BAND;
    for (size_t j = 0; j < n; j++) {
        lidx[j] = first + j;
        ridx[j] = first + (j * 7 + round) % BAND;
    }
    unsigned char *mine = w->src + first * PIECE;
    harness_fill(mine, n * PIECE, round * 31 + (uint64_t)k->id);
    memset(w->back + first * PIECE, 0, n * PIECE);
    ferry_strided_t d = {.opcode = FERRY_OP_WRITE, .local_base = w->src, .local_stride = PIECE,
                         .remote_base = (uint64_t)(uintptr_t)w->dst, .remote_stride = PIECE, .piece_len = PIECE,
                         .local_idx = lidx, .remote_idx = ridx, .n = n};
    ferry_strided_t r = d;
    r.opcode = FERRY_OP_READ;
    r.local_base = w->back;
    if (async) {
        ferry_batch_t *b;
        assert_int_equal(ferry_batch_alloc(w->p.initiator, 2 * BAND, &b), 0);
        long rc = ferry_batch_submit_strided(b, w->p.peer, &d, 0);
        bool ok = ok_or_closed(k, "strided submit (write)", rc) &&
                  ok_or_closed(k, "strided batch (write)", ferry_batch_wait(b, -1));
        if (ok) {
            rc = ferry_batch_submit_strided(b, w->p.peer, &r, 0);
            ok = ok_or_closed(k, "strided submit (read)", rc) &&
                 ok_or_closed(k, "strided batch (read)", ferry_batch_wait(b, -1));
        }
        assert_int_equal(ferry_batch_free(b), 0);
        if (!ok) return;
    } else {
        if (!ok_or_closed(k, "strided write", ferry_strided_transfer_sync(w->p.initiator, w->p.peer, &d))) return;
        if (!ok_or_closed(k, "strided read", ferry_strided_transfer_sync(w->p.initiator, w->p.peer, &r))) return;
    }
    if (memcmp(w->back + first * PIECE, mine, n * PIECE) != 0) {
        fprintf(stderr, "thread %d: %zu strided pieces read back wrong\n", k->id, n);
        atomic_fetch_add(&w->errors, 1);
    }
}

/* Strided writes into the churned region: landed, or refused for the
 * region missing or changed. */
static void strided_into_churn(worker_t *k)
{
    world_t *w = k->w;
    for (uint64_t i = 0; !atomic_load(&w->churn_done) || i < ITERS; i++) {
        ferry_strided_t d = {.opcode = FERRY_OP_WRITE, .local_base = w->src + (size_t)k->id * BAND * PIECE,
                             .local_stride = PIECE, .remote_base = (uint64_t)(uintptr_t)w->churned,
                             .remote_stride = 2 * PIECE, .piece_len = PIECE, .n = BAND / 2};
        int rc = ferry_strided_transfer_sync(w->p.initiator, w->p.peer, &d);
        if (rc == 0) atomic_fetch_add(&w->landed, 1);
        else if (rc == FERRY_ERR_ADDRESS_NOT_REGISTERED || rc == FERRY_ERR_STALE_SEGMENT ||
                 rc == FERRY_ERR_SESSION_INVALID)
            atomic_fetch_add(&w->refused, 1);
        else report(k, "strided into the churned region", rc);
    }
}

/* Deregisters the churned region, checks that nothing lands in it while it
 * is out (no write may land after ferry_deregister returned), registers it
 * again. */
static void churn_region(worker_t *k)
{
    world_t *w = k->w;
    size_t len = (size_t)BAND * PIECE;
    for (int i = 0; i < ITERS; i++) {
        assert_int_equal(ferry_deregister(w->p.target, w->churned), 0);
        memset(w->churned, 0, len);
        for (int spin = 0; spin < 200; spin++) sched_yield();
        for (size_t b = 0; b < len; b++)
            if (w->churned[b]) {
                fprintf(stderr, "churn %d: byte %zu landed after ferry_deregister returned\n", i, b);
                atomic_fetch_add(&w->errors, 1);
                break;
            }
        /* Registered again: let some writes land (a bounded wait: they may
         * all find the region changed) before the next deregistration. */
        long before = atomic_load(&w->landed);
        assert_int_equal(ferry_register(w->p.target, w->churned, len, FERRY_MEM_REMOTE), 0);
        for (int spin = 0; spin < 100000 && atomic_load(&w->landed) < before + 2; spin++) sched_yield();
    }
    atomic_store(&w->churn_done, true);
}

static void *worker_main(void *arg)
{
    worker_t *k = arg;
    world_t *w = k->w;
    if (k->id == 0) churn_region(k);
    else if (k->id <= 2) strided_into_churn(k);
    else
        for (uint64_t i = 0; i < ITERS; i++) {
            if (k->id == 3 && i % 4 == 3) {
                int rc = ferry_session_close(w->p.initiator, w->p.peer);
                if (rc && rc != FERRY_ERR_NOT_FOUND) report(k, "session close", rc);
            }
            strided_round(k, i, (i + (uint64_t)k->id) % 2);
        }
    return NULL;
}

static void strided_group_commits_from_threads(void **state)
{
    (void)state;
    world_t w;
    memset(&w, 0, sizeof w);
    w.p = pair_make(20000);
    w.src = calloc(1, band_bytes());
    w.back = calloc(1, band_bytes());
    w.dst = calloc(1, band_bytes());
    w.churned = calloc(BAND, PIECE);
    assert_int_equal(ferry_register(w.p.initiator, w.src, band_bytes(), FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(w.p.initiator, w.back, band_bytes(), FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(w.p.target, w.dst, band_bytes(), FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(w.p.target, w.churned, (size_t)BAND * PIECE, FERRY_MEM_REMOTE), 0);
    long imms = hca_get(&H.imms);
    pthread_t t[THREADS];
    worker_t k[THREADS];
    for (int i = 0; i < THREADS; i++) {
        k[i] = (worker_t){&w, i};
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &k[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(w.p.initiator, w.p.peer, &info), 0);
    fprintf(stderr, "over %s: %ld group commits (immediates); into the churned region %ld landed, %ld refused\n",
            info.transport, hca_get(&H.imms) - imms, atomic_load(&w.landed), atomic_load(&w.refused));
    assert_string_equal(info.transport, "rdma");
    assert_true(hca_get(&H.imms) > imms); /* the group commits ran */
    assert_int_equal(atomic_load(&w.errors), 0);
    pair_end(&w.p);
    free(w.src);
    free(w.back);
    free(w.dst);
    free(w.churned);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(strided_group_commits_from_threads),
    };
    return cmocka_run_group_tests(tests, start_hca, stop_hca);
}
#endif
