/* SPDX-License-Identifier: Apache-2.0 */
/* Pre-registered pools: the buddy allocator's rounding, alignment,
 * coalescing and errors, use from several threads, and transfers from and
 * into pool buffers with no registration of their own. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "engine/testing.h"

#include <ferry/pool.h>

static void alloc_free_coalesce(void **state)
{
    (void)state;
    ferry_engine_t *e = harness_engine(5000);
    ferry_pool_t *p;
    size_t size = 1u << 20; /* 256 blocks */
    assert_int_equal(ferry_pool_create(e, size, FERRY_MEM_LOCAL, &p), 0);
    assert_int_equal(ferry_region_count(e), 1);
    ferry_pool_stats_t st;
    assert_int_equal(ferry_pool_stats(p, &st), 0);
    assert_int_equal(st.size, size);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.largest_free, size);

    /* Rounded up to a power of two of 4 KiB blocks, 4 KiB-aligned. */
    void *a, *b, *c;
    assert_int_equal(ferry_pool_alloc(p, 1, &a), 0);
    assert_int_equal(ferry_pool_alloc(p, 5000, &b), 0);
    assert_int_equal(ferry_pool_alloc(p, 3 * 4096 + 1, &c), 0);
    assert_int_equal((uintptr_t)a % FERRY_POOL_BLOCK, 0);
    assert_int_equal((uintptr_t)b % FERRY_POOL_BLOCK, 0);
    assert_int_equal((uintptr_t)c % FERRY_POOL_BLOCK, 0);
    assert_int_equal(ferry_pool_stats(p, &st), 0);
    assert_int_equal(st.used, 4096 + 8192 + 16384);
    assert_int_equal(st.allocations, 3);
    memset(a, 1, 4096);
    memset(b, 2, 8192);
    memset(c, 3, 16384);
    assert_int_equal(((unsigned char *)a)[4095], 1); /* no overlap */
    assert_int_equal(((unsigned char *)b)[8191], 2);

    /* Errors: zero length, too big, foreign and double frees. */
    void *x;
    assert_int_equal(ferry_pool_alloc(p, 0, &x), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_alloc(p, size + 1, &x), FERRY_ERR_MEMORY);
    assert_int_equal(ferry_pool_alloc(p, size, &x), FERRY_ERR_MEMORY);
    assert_detail_contains("largest free run");
    assert_int_equal(ferry_pool_free(p, (char *)a + 8), FERRY_ERR_INVALID_ARGUMENT);
    int local;
    assert_int_equal(ferry_pool_free(p, &local), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("not a buffer of the pool");
    assert_int_equal(ferry_pool_free(p, a), 0);
    assert_int_equal(ferry_pool_free(p, a), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("freed twice");
    assert_int_equal(ferry_pool_free(p, b), 0);
    assert_int_equal(ferry_pool_free(p, c), 0);
    /* Everything back, merged into one run. */
    assert_int_equal(ferry_pool_stats(p, &st), 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.largest_free, size);

    /* Fill with single blocks, free in a scattered order, take it whole. */
    void *blocks[256];
    for (int i = 0; i < 256; i++) assert_int_equal(ferry_pool_alloc(p, 4096, &blocks[i]), 0);
    assert_int_equal(ferry_pool_alloc(p, 1, &x), FERRY_ERR_MEMORY);
    assert_true(ferry_error_retryable(FERRY_ERR_MEMORY));
    for (int i = 0; i < 256; i++) assert_int_equal(ferry_pool_free(p, blocks[(i * 97) % 256]), 0);
    assert_int_equal(ferry_pool_alloc(p, size, &x), 0);
    assert_int_equal(ferry_pool_free(p, x), 0);
    ferry_pool_destroy(p);
    assert_int_equal(ferry_region_count(e), 0);

    assert_int_equal(ferry_pool_create(e, 0, 0, &p), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_create(NULL, 4096, 0, &p), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_pool_create(e, 4096, 0x80, &p), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_region_count(e), 0);
    ferry_pool_destroy(NULL);
    ferry_engine_destroy(e);
}

/* A size that is not a power of two: every block is usable, none twice. */
static void odd_size_pool(void **state)
{
    (void)state;
    ferry_engine_t *e = harness_engine(5000);
    ferry_pool_t *p;
    size_t nblocks = 37;
    assert_int_equal(ferry_pool_create(e, nblocks * 4096 - 100, 0, &p), 0);
    ferry_pool_stats_t st;
    assert_int_equal(ferry_pool_stats(p, &st), 0);
    assert_int_equal(st.size, nblocks * 4096);
    assert_int_equal(st.largest_free, 32 * 4096);
    void *got[64];
    size_t k = 0;
    while (k < 64 && ferry_pool_alloc(p, 4096, &got[k]) == 0) k++;
    assert_int_equal(k, nblocks);
    for (size_t i = 0; i < k; i++)
        for (size_t j = i + 1; j < k; j++) assert_true(got[i] != got[j]);
    for (size_t i = 0; i < k; i++) assert_int_equal(ferry_pool_free(p, got[i]), 0);
    assert_int_equal(ferry_pool_stats(p, &st), 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.largest_free, 32 * 4096);
    ferry_pool_destroy(p);
    ferry_engine_destroy(e);
}

struct churn {
    ferry_pool_t *p;
    int id, bad;
};

static void *churner(void *arg)
{
    struct churn *c = arg;
    void *held[16] = {0};
    uint64_t s = 88172645463325252ull + (uint64_t)c->id;
    for (int i = 0; i < 20000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        int slot = (int)(s % 16);
        if (held[slot]) {
            if (((unsigned char *)held[slot])[0] != (unsigned char)c->id) c->bad++;
            if (ferry_pool_free(c->p, held[slot]) != 0) c->bad++;
            held[slot] = NULL;
        } else if (ferry_pool_alloc(c->p, 1 + (size_t)(s >> 20) % 20000, &held[slot]) == 0) {
            ((unsigned char *)held[slot])[0] = (unsigned char)c->id;
        } else {
            held[slot] = NULL;
        }
    }
    for (int i = 0; i < 16; i++)
        if (held[i] && ferry_pool_free(c->p, held[i]) != 0) c->bad++;
    return NULL;
}

static void threads_share_a_pool(void **state)
{
    (void)state;
    ferry_engine_t *e = harness_engine(5000);
    ferry_pool_t *p;
    assert_int_equal(ferry_pool_create(e, 4u << 20, 0, &p), 0);
    pthread_t t[4];
    struct churn c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (struct churn){p, i + 1, 0};
        pthread_create(&t[i], NULL, churner, &c[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(c[i].bad, 0);
    }
    ferry_pool_stats_t st;
    assert_int_equal(ferry_pool_stats(p, &st), 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.allocations, 0);
    assert_int_equal(st.largest_free, 4u << 20);
    ferry_pool_destroy(p);
    ferry_engine_destroy(e);
}

/* The encoder path: allocate, send once, free; no registration per send,
 * and a pool on the target side receives writes. */
static void transfers_use_pool_buffers(void **state)
{
    (void)state;
    ferry_engine_t *ini = harness_engine(20000), *tgt = harness_engine(20000);
    const char *peer = ferry_engine_name(tgt);
    ferry_pool_t *send_pool, *recv_pool;
    assert_int_equal(ferry_pool_create(ini, 8u << 20, FERRY_MEM_LOCAL, &send_pool), 0);
    assert_int_equal(ferry_pool_create(tgt, 8u << 20, FERRY_MEM_REMOTE, &recv_pool), 0);
    void *dst;
    assert_int_equal(ferry_pool_alloc(recv_pool, 1u << 20, &dst), 0);
    for (int i = 0; i < 50; i++) {
        size_t len = 1000 + (size_t)i * 20000;
        void *emb;
        assert_int_equal(ferry_pool_alloc(send_pool, len, &emb), 0);
        harness_fill(emb, len, (uint64_t)i);
        assert_int_equal(ferry_transfer_sync(ini, peer, FERRY_OP_WRITE, emb, (uint64_t)(uintptr_t)dst, len), 0);
        assert_true(harness_check(dst, len, (uint64_t)i));
        assert_int_equal(ferry_pool_free(send_pool, emb), 0);
    }
    assert_int_equal(ferry_region_count(ini), 1);
    assert_int_equal(ferry_pool_free(recv_pool, dst), 0);
    ferry_pool_destroy(send_pool);
    ferry_pool_destroy(recv_pool);
    ferry_engine_destroy(ini);
    ferry_engine_destroy(tgt);
}

struct dereg_writer {
    ferry_engine_t *e;
    const char *peer;
    void *src;
    uint64_t dst;
    atomic_bool stop;
    atomic_int ok, failed;
};

static void *dereg_writer_main(void *arg)
{
    struct dereg_writer *w = arg;
    while (!atomic_load(&w->stop)) {
        if (ferry_transfer_sync(w->e, w->peer, FERRY_OP_WRITE, w->src, w->dst, 1u << 20) == 0)
            atomic_fetch_add(&w->ok, 1);
        else
            atomic_fetch_add(&w->failed, 1);
    }
    return NULL;
}

/* A shared pool (memfd): over shm the initiator maps it and copies with
 * memcpy (the target places nothing itself); a deregistration while a
 * thread writes in a loop leaves the memory untouched once it returns.
 * Two engines in one process, so TSan sees the threads of both sides
 * (test_shm_pool has the two-process cases). */
static void shared_pool_round_trip_and_revoke(void **state)
{
    (void)state;
    ferry_engine_t *ini = harness_engine(20000), *tgt = harness_engine(20000);
    const char *peer = ferry_engine_name(tgt);
    bool shm = strcmp(harness_expected_transport(), "shm") == 0;
    ferry_pool_t *pool;
    assert_int_equal(ferry_pool_create_shared(tgt, 4u << 20, FERRY_MEM_REMOTE, &pool), 0);
    unsigned char *dst;
    assert_int_equal(ferry_pool_alloc(pool, 4u << 20, (void **)&dst), 0);
    unsigned char *src = malloc(4u << 20);
    assert_int_equal(ferry_register(ini, src, 4u << 20, FERRY_MEM_LOCAL), 0);
    harness_fill(src, 4u << 20, 5);
    assert_int_equal(ferry_transfer_sync(ini, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4u << 20), 0);
    assert_true(harness_check(dst, 4u << 20, 5));
    harness_fill(dst, 1u << 20, 6);
    assert_int_equal(ferry_transfer_sync(ini, peer, FERRY_OP_READ, src, (uint64_t)(uintptr_t)dst, 1u << 20), 0);
    assert_true(harness_check(src, 1u << 20, 6));
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(tgt, &st), 0);
    if (shm) assert_int_equal(st.bytes_placed, 0);
    /* Batches into the mapped pool: after the first, each runs in the
     * caller's thread (transfer.c), here under TSan too. */
    uint64_t inline0 = ferry_test_mapped_inline_calls();
    harness_reverse_batch_round_trip(ini, peer, src, (uint64_t)(uintptr_t)dst, 64, 4096, 8);
    harness_reverse_batch_round_trip(ini, peer, src, (uint64_t)(uintptr_t)dst, 64, 4096, 9);
    if (shm) assert_int_equal(ferry_test_mapped_inline_calls() - inline0, 4);

    struct dereg_writer w = {.e = ini, .peer = peer, .src = src, .dst = (uint64_t)(uintptr_t)dst};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, dereg_writer_main, &w), 0);
    while (atomic_load(&w.ok) < 10 && atomic_load(&w.failed) == 0) usleep(1000);
    assert_int_equal(atomic_load(&w.failed), 0);
    assert_int_equal(ferry_deregister(tgt, dst), 0);
    unsigned char *snap = malloc(1u << 20);
    memcpy(snap, dst, 1u << 20);
    usleep(100 * 1000);
    assert_memory_equal(snap, dst, 1u << 20);
    atomic_store(&w.stop, true);
    pthread_join(t, NULL);
    assert_true(atomic_load(&w.failed) > 0);
    free(snap);
    ferry_pool_destroy(pool); /* its region is gone already: the deregister inside fails quietly */
    ferry_engine_destroy(ini);
    ferry_engine_destroy(tgt);
    free(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(alloc_free_coalesce),
        cmocka_unit_test(odd_size_pool),
        cmocka_unit_test(threads_share_a_pool),
        cmocka_unit_test(transfers_use_pool_buffers),
        cmocka_unit_test(shared_pool_round_trip_and_revoke),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
