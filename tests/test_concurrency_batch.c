/* SPDX-License-Identifier: Apache-2.0 */
/* One batch shared by many threads: submits race for its slots, and
 * status, cancel and wait race with them. Run under ASan and TSan (the
 * suite's sanitizer stages); every bound below is an iteration count, not a
 * clock. Regression for issue 15 item 1: capacity checked and count raised
 * under two lock holds let concurrent submits write past the request
 * array (heap-buffer-overflow in ferry_batch_submit). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

#define THREADS 8
#define SLOTS 64
#define BLOCK 4096
#define ROUNDS 200

typedef struct world {
    ferry_engine_t *ini, *tgt;
    unsigned char *src, *dst;
    ferry_batch_t *batch;
    pthread_barrier_t go, done;
    atomic_bool stop;
    /* which thread got each slot this round (-1: none) */
    _Atomic int owner[SLOTS];
    atomic_int errors;
} world_t;

typedef struct worker {
    world_t *w;
    int id;
} worker_t;

static void world_open(world_t *w)
{
    memset(w, 0, sizeof *w);
    w->tgt = harness_engine(10000);
    w->ini = harness_engine(10000);
    w->src = calloc(THREADS, BLOCK);
    w->dst = calloc(THREADS, BLOCK);
    assert_int_equal(ferry_register(w->ini, w->src, THREADS * BLOCK, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(w->tgt, w->dst, THREADS * BLOCK, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_session_open(w->ini, ferry_engine_name(w->tgt)), 0);
    pthread_barrier_init(&w->go, NULL, THREADS + 1);
    pthread_barrier_init(&w->done, NULL, THREADS + 1);
}

static void world_close(world_t *w)
{
    pthread_barrier_destroy(&w->go);
    pthread_barrier_destroy(&w->done);
    ferry_engine_destroy(w->ini);
    ferry_engine_destroy(w->tgt);
    free(w->src);
    free(w->dst);
}

static ferry_request_t block_write(world_t *w, int id)
{
    return (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = w->src + (size_t)id * BLOCK,
                             .remote = (uint64_t)(uintptr_t)(w->dst + (size_t)id * BLOCK), .len = BLOCK};
}

/* Submits 1-3 requests at a time until the batch is full. */
static void *submitter(void *arg)
{
    worker_t *k = arg;
    world_t *w = k->w;
    const char *peer = ferry_engine_name(w->tgt);
    for (;;) {
        pthread_barrier_wait(&w->go);
        if (atomic_load(&w->stop)) break;
        for (unsigned i = 0;; i++) {
            size_t n = 1 + (i + (unsigned)k->id) % 3;
            ferry_request_t reqs[3];
            for (size_t j = 0; j < n; j++) reqs[j] = block_write(w, k->id);
            long first = ferry_batch_submit(w->batch, peer, reqs, n, 0);
            if (first == FERRY_ERR_TOO_MANY_REQUESTS) {
                if (n == 1) break; /* full: no single slot left */
                continue;
            }
            if (first < 0 || first + (long)n > SLOTS) {
                fprintf(stderr, "thread %d: submit gave %ld: %s\n", k->id, first, ferry_last_error_detail());
                atomic_fetch_add(&w->errors, 1);
                break;
            }
            for (size_t j = 0; j < n; j++) {
                int none = -1;
                if (!atomic_compare_exchange_strong(&w->owner[first + (long)j], &none, k->id)) {
                    fprintf(stderr, "slot %ld given twice\n", first + (long)j);
                    atomic_fetch_add(&w->errors, 1);
                }
            }
        }
        pthread_barrier_wait(&w->done);
    }
    return NULL;
}

static void start_threads(world_t *w, pthread_t *t, worker_t *k, void *(*fn)(void *))
{
    for (int i = 0; i < THREADS; i++) {
        k[i] = (worker_t){w, i};
        assert_int_equal(pthread_create(&t[i], NULL, fn, &k[i]), 0);
    }
}

static void stop_threads(world_t *w, pthread_t *t)
{
    atomic_store(&w->stop, true);
    pthread_barrier_wait(&w->go);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
}

/* Every slot handed out exactly once, each request completed, none past
 * the capacity. */
static void shared_batch_submits(void **state)
{
    (void)state;
    world_t w;
    world_open(&w);
    pthread_t t[THREADS];
    worker_t k[THREADS];
    start_threads(&w, t, k, submitter);
    for (int round = 0; round < ROUNDS; round++) {
        assert_int_equal(ferry_batch_alloc(w.ini, SLOTS, &w.batch), 0);
        for (int i = 0; i < SLOTS; i++) atomic_store(&w.owner[i], -1);
        pthread_barrier_wait(&w.go);
        pthread_barrier_wait(&w.done);
        assert_int_equal(ferry_batch_wait(w.batch, -1), 0);
        for (size_t i = 0; i < SLOTS; i++) {
            ferry_status_t st;
            assert_int_equal(ferry_batch_status(w.batch, i, &st), 0);
            assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
            assert_int_equal(st.bytes, BLOCK);
            assert_int_not_equal(atomic_load(&w.owner[i]), -1);
        }
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(w.batch, SLOTS, &st), FERRY_ERR_NOT_FOUND);
        assert_int_equal(ferry_batch_free(w.batch), 0);
    }
    stop_threads(&w, t);
    assert_int_equal(atomic_load(&w.errors), 0);
    world_close(&w);
}

/* Submits, status, cancels (one request and all) and waits, all at once on
 * one batch: no sanitizer report, every answer a defined code, and every
 * request ends in a final state. */
static void *mixer(void *arg)
{
    worker_t *k = arg;
    world_t *w = k->w;
    const char *peer = ferry_engine_name(w->tgt);
    unsigned seed = (unsigned)k->id * 2654435761u + 1;
    for (;;) {
        pthread_barrier_wait(&w->go);
        if (atomic_load(&w->stop)) break;
        for (int i = 0; i < 40; i++) {
            seed = seed * 1103515245u + 12345u;
            unsigned pick = (seed >> 16) % 8;
            ferry_status_t st;
            int rc = 0;
            if (pick < 3) {
                ferry_request_t r = block_write(w, k->id);
                long first = ferry_batch_submit(w->batch, peer, &r, 1, 0);
                rc = first >= 0 ? 0 : (int)first;
                if (rc == FERRY_ERR_TOO_MANY_REQUESTS) rc = 0;
            } else if (pick < 5) {
                rc = ferry_batch_status(w->batch, (seed >> 8) % SLOTS, &st);
                if (rc == FERRY_ERR_NOT_FOUND) rc = 0;
            } else if (pick == 5) {
                rc = ferry_batch_cancel_request(w->batch, (seed >> 8) % SLOTS);
                if (rc == FERRY_ERR_NOT_FOUND) rc = 0;
            } else if (pick == 6) {
                rc = ferry_batch_wait(w->batch, 5);
                if (rc == FERRY_ERR_TIMEOUT || rc == FERRY_ERR_CANCELLED) rc = 0;
            } else if (k->id == 0 && i % 10 == 9) {
                rc = ferry_batch_cancel(w->batch);
            } else {
                ferry_stats_t es;
                rc = ferry_engine_stats(w->ini, &es);
            }
            if (rc) {
                fprintf(stderr, "thread %d op %u: %d %s\n", k->id, pick, rc, ferry_last_error_detail());
                atomic_fetch_add(&w->errors, 1);
            }
        }
        pthread_barrier_wait(&w->done);
    }
    return NULL;
}

static void shared_batch_mixed_calls(void **state)
{
    (void)state;
    world_t w;
    world_open(&w);
    pthread_t t[THREADS];
    worker_t k[THREADS];
    start_threads(&w, t, k, mixer);
    for (int round = 0; round < ROUNDS / 4; round++) {
        assert_int_equal(ferry_batch_alloc(w.ini, SLOTS, &w.batch), 0);
        pthread_barrier_wait(&w.go);
        pthread_barrier_wait(&w.done);
        int rc = ferry_batch_wait(w.batch, -1);
        assert_true(rc == 0 || rc == FERRY_ERR_CANCELLED);
        for (size_t i = 0;; i++) {
            ferry_status_t st;
            if (ferry_batch_status(w.batch, i, &st) == FERRY_ERR_NOT_FOUND) break;
            assert_true(st.state == FERRY_STATUS_COMPLETED || st.state == FERRY_STATUS_CANCELLED);
        }
        assert_int_equal(ferry_batch_free(w.batch), 0);
    }
    stop_threads(&w, t);
    assert_int_equal(atomic_load(&w.errors), 0);
    world_close(&w);
}

/* Freeing twice is misuse; the second free is refused without touching
 * the freed batch (ASan would report a touch), and a freed batch's other
 * calls are refused while its memory is not reused. */
static void double_free_refused(void **state)
{
    (void)state;
    ferry_engine_t *e = harness_engine(1000);
    ferry_batch_t *b, *other;
    assert_int_equal(ferry_batch_alloc(e, 4, &b), 0);
    assert_int_equal(ferry_batch_alloc(e, 4, &other), 0);
    assert_int_equal(ferry_batch_free(b), 0);
    assert_int_equal(ferry_batch_free(b), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("not a live batch");
    /* many live batches: the set grows and shrinks */
    ferry_batch_t *many[300];
    for (int i = 0; i < 300; i++) assert_int_equal(ferry_batch_alloc(e, 1, &many[i]), 0);
    for (int i = 0; i < 300; i += 2) assert_int_equal(ferry_batch_free(many[i]), 0);
    for (int i = 0; i < 300; i += 2) assert_int_equal(ferry_batch_free(many[i]), FERRY_ERR_INVALID_ARGUMENT);
    for (int i = 1; i < 300; i += 2) assert_int_equal(ferry_batch_free(many[i]), 0);
    assert_int_equal(ferry_batch_free(other), 0);
    ferry_engine_destroy(e);
}

/* A submit that fails (a peer name without a port) takes no slot: the next one gets
 * index 0 of a batch of one. Slots are reserved only once nothing of the
 * submit can fail, so a canceller waiting on a slot always sees it end. */
static void failed_submit_takes_no_slot(void **state)
{
    (void)state;
    world_t w;
    world_open(&w);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(w.ini, 1, &b), 0);
    ferry_request_t r = block_write(&w, 0);
    assert_true(ferry_batch_submit(b, "no port here", &r, 1, 0) < 0);
    ferry_status_t st;
    assert_int_equal(ferry_batch_status(b, 0, &st), FERRY_ERR_NOT_FOUND);
    assert_int_equal(ferry_batch_submit(b, ferry_engine_name(w.tgt), &r, 1, 0), 0);
    assert_int_equal(ferry_batch_submit(b, ferry_engine_name(w.tgt), &r, 1, 0), FERRY_ERR_TOO_MANY_REQUESTS);
    assert_int_equal(ferry_batch_wait(b, -1), 0);
    assert_int_equal(ferry_batch_free(b), 0);
    world_close(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(shared_batch_submits),
        cmocka_unit_test(shared_batch_mixed_calls),
        cmocka_unit_test(double_free_refused),
        cmocka_unit_test(failed_submit_takes_no_slot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
