/* SPDX-License-Identifier: Apache-2.0 */
/* The session table (issue 13, item 2): sessions by peer name in a hash
 * table with striped locks. Lookups find the same session, the
 * max_sessions cap holds, closing takes a session out; threads opening,
 * using and closing sessions to different peers at once get every byte
 * right (and run under TSan). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/session.h"
#include "engine/testing.h"
#include "link/conn.h"
#include "harness.h"

static void table_basics(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.max_sessions = 300;
    ferry_engine_t *e = harness_engine_cfg(&cfg);
    static ferry_session_t *got[300];
    char name[64];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "peer-%d.invalid:%d", i, 1000 + i);
        assert_int_equal(ferry_session_get(e, name, &got[i]), 0);
        assert_string_equal(got[i]->name, name);
        assert_int_equal(got[i]->port, 1000 + i);
    }
    /* The same name finds the same session. */
    for (int i = 0; i < 300; i += 7) {
        ferry_session_t *s;
        snprintf(name, sizeof name, "peer-%d.invalid:%d", i, 1000 + i);
        assert_int_equal(ferry_session_get(e, name, &s), 0);
        assert_ptr_equal(s, got[i]);
        ferry_session_put(s);
    }
    ferry_session_t *s;
    assert_int_equal(ferry_session_get(e, "one-too-many.invalid:1", &s), FERRY_ERR_TOO_MANY_REQUESTS);
    assert_detail_contains("max_sessions");
    assert_int_equal(ferry_session_close(e, "never-opened.invalid:1"), FERRY_ERR_NOT_FOUND);
    assert_detail_contains("never-opened.invalid:1");
    /* Closing one makes room, and a closed session is no longer found. */
    assert_int_equal(ferry_session_close(e, "peer-5.invalid:1005"), 0);
    assert_int_equal(ferry_session_close(e, "peer-5.invalid:1005"), FERRY_ERR_NOT_FOUND);
    assert_int_equal(ferry_session_get(e, "one-too-many.invalid:1", &s), 0);
    ferry_session_put(s);
    assert_int_equal(ferry_session_get(e, "peer-5.invalid:1005", &s), FERRY_ERR_TOO_MANY_REQUESTS);
    assert_int_equal(ferry_session_close(e, "peer-6.invalid:1006"), 0);
    assert_int_equal(ferry_session_get(e, "peer-5.invalid:1005", &s), 0);
    assert_ptr_not_equal(s, got[5]); /* a new one; the old lives while referenced */
    assert_int_equal(got[5]->state, SESSION_CLOSED);
    ferry_session_put(s);
    for (int i = 0; i < 300; i++) ferry_session_put(got[i]);
    ferry_engine_destroy(e); /* the rest go with it (ASan: nothing leaks) */
}

/* ------------------------------------------------ threads, many peers */

enum { THREADS = 8, ROUNDS = 25, LEN = 16 << 10 };

typedef struct world {
    ferry_engine_t *initiator;
    ferry_engine_t *own[THREADS], *shared;  /* one target per thread, one for all */
    unsigned char *own_mem[THREADS], *shared_mem;
    atomic_int failures;
} world_t;

typedef struct job {
    world_t *w;
    int i;
} job_t;

static void fail_once(world_t *w, const char *what, int rc)
{
    fprintf(stderr, "%s: %d %s\n", what, rc, ferry_last_error_detail());
    atomic_fetch_add(&w->failures, 1);
}

/* Writes LEN bytes with seed to peer at remote, reads them back, checks. */
static void round_trip(world_t *w, const char *peer, unsigned char *buf, uint64_t remote, uint64_t seed)
{
    harness_fill(buf, LEN, seed);
    int rc = ferry_transfer_sync(w->initiator, peer, FERRY_OP_WRITE, buf, remote, LEN);
    if (rc) return fail_once(w, "write", rc);
    memset(buf, 0, LEN);
    rc = ferry_transfer_sync(w->initiator, peer, FERRY_OP_READ, buf, remote, LEN);
    if (rc) return fail_once(w, "read", rc);
    if (!harness_check(buf, LEN, seed)) fail_once(w, "data", 0);
}

static void *worker(void *arg)
{
    job_t *j = arg;
    world_t *w = j->w;
    unsigned char *buf = malloc(LEN);
    if (ferry_register(w->initiator, buf, LEN, 0) != 0) fail_once(w, "register", -1);
    char own[300], shared[300];
    snprintf(own, sizeof own, "%s", ferry_engine_name(w->own[j->i]));
    snprintf(shared, sizeof shared, "%s", ferry_engine_name(w->shared));
    for (int r = 0; r < ROUNDS; r++) {
        /* Its own peer: opened, used, closed, every round. */
        int rc = ferry_session_open(w->initiator, own);
        if (rc) fail_once(w, "open", rc);
        round_trip(w, own, buf, (uint64_t)(uintptr_t)w->own_mem[j->i], (uint64_t)(j->i * 1000 + r));
        ferry_peer_info_t info;
        rc = ferry_session_info(w->initiator, own, &info);
        if (rc || strcmp(info.name, own) != 0) fail_once(w, "info", rc);
        rc = ferry_session_close(w->initiator, own);
        if (rc) fail_once(w, "close", rc);
        /* The peer all threads share, never closed. */
        round_trip(w, shared, buf, (uint64_t)(uintptr_t)w->shared_mem + (uint64_t)j->i * LEN,
                   (uint64_t)(100000 + j->i * 1000 + r));
    }
    ferry_deregister(w->initiator, buf);
    free(buf);
    return NULL;
}

static void threads_with_their_own_peers(void **state)
{
    (void)state;
    world_t *w = calloc(1, sizeof *w);
    w->initiator = harness_engine_env(10000);
    for (int i = 0; i < THREADS; i++) {
        w->own[i] = harness_engine_env(10000);
        w->own_mem[i] = calloc(1, LEN);
        assert_int_equal(ferry_register(w->own[i], w->own_mem[i], LEN, FERRY_MEM_REMOTE), 0);
    }
    w->shared = harness_engine_env(10000);
    w->shared_mem = calloc(THREADS, LEN);
    assert_int_equal(ferry_register(w->shared, w->shared_mem, (size_t)THREADS * LEN, FERRY_MEM_REMOTE), 0);
    pthread_t t[THREADS];
    job_t jobs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (job_t){w, i};
        pthread_create(&t[i], NULL, worker, &jobs[i]);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&w->failures), 0);
    assert_int_equal(ferry_test_sessions(w->initiator), 1); /* the shared one */
    ferry_engine_destroy(w->initiator);
    for (int i = 0; i < THREADS; i++) {
        ferry_engine_destroy(w->own[i]);
        free(w->own_mem[i]);
    }
    ferry_engine_destroy(w->shared);
    free(w->shared_mem);
    free(w);
}

/* ------------------------------------------------------- lookup cost */

typedef struct lookups {
    ferry_engine_t *e;
    int n, first;
    atomic_int *errors;
} lookups_t;

static void *look_up(void *arg)
{
    lookups_t *l = arg;
    char name[64];
    for (int k = 0; k < 20000; k++) {
        snprintf(name, sizeof name, "peer-%d.invalid:1", l->first + k % l->n);
        ferry_session_t *s;
        if (ferry_session_get(l->e, name, &s) != 0) {
            atomic_fetch_add(l->errors, 1);
            continue;
        }
        ferry_session_put(s);
    }
    return NULL;
}

/* 4,000 sessions (a 64-engine mesh has 63 per engine; the table is sized
 * by max_sessions), looked up from 4 threads each on its own peers: the
 * cost is printed, never asserted. */
static void lookups_among_many(void **state)
{
    (void)state;
    ferry_engine_t *e = harness_engine(5000);
    char name[64];
    for (int i = 0; i < 4000; i++) {
        ferry_session_t *s;
        snprintf(name, sizeof name, "peer-%d.invalid:1", i);
        assert_int_equal(ferry_session_get(e, name, &s), 0);
        ferry_session_put(s);
    }
    atomic_int errors = 0;
    lookups_t l[4];
    pthread_t t[4];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 4; i++) {
        l[i] = (lookups_t){e, 1000, i * 1000, &errors};
        pthread_create(&t[i], NULL, look_up, &l[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "session lookups among 4000: %.0f ns each (4 threads, 80000 lookups, wall)\n", ns / 80000);
    assert_int_equal(atomic_load(&errors), 0);
    assert_int_equal(ferry_test_sessions(e), 4000);
    ferry_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(table_basics),
        cmocka_unit_test(threads_with_their_own_peers),
        cmocka_unit_test(lookups_among_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
