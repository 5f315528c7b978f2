/* SPDX-License-Identifier: Apache-2.0 */
/* Round trips between two engines in one process: sync, batch, async, from
 * 1 byte to 256 MiB, and from several threads at once. Runs once per
 * transport (ctest: test_transfer over shm, the auto choice here, and
 * test_transfer_tcp with FERRY_TRANSPORT=tcp, tests/transports.cmake). */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/testing.h"
#include "harness.h"

typedef struct pair {
    ferry_engine_t *initiator, *target;
    char peer[300];
} pair_t;

static int pair_setup(void **state)
{
    pair_t *p = calloc(1, sizeof *p);
    p->initiator = harness_engine_env(20000);
    p->target = harness_engine_env(20000);
    snprintf(p->peer, sizeof p->peer, "%s", ferry_engine_name(p->target));
    *state = p;
    return 0;
}

static int pair_teardown(void **state)
{
    pair_t *p = *state;
    ferry_engine_destroy(p->initiator);
    ferry_engine_destroy(p->target);
    free(p);
    return 0;
}

/* Registers a buffer of len on each side; returns them through out params. */
static void buffers(pair_t *p, size_t len, unsigned char **src, unsigned char **dst)
{
    *src = malloc(len);
    *dst = malloc(len);
    assert_non_null(*src);
    assert_non_null(*dst);
    assert_int_equal(ferry_register(p->initiator, *src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p->target, *dst, len, FERRY_MEM_REMOTE), 0);
}

static void release(pair_t *p, unsigned char *src, unsigned char *dst)
{
    assert_int_equal(ferry_deregister(p->initiator, src), 0);
    assert_int_equal(ferry_deregister(p->target, dst), 0);
    free(src);
    free(dst);
}

/* The session still uses the transport this run is about (no silent
 * fallback happened). */
static void assert_transport(pair_t *p)
{
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p->initiator, p->peer, &info), 0);
    if (strcmp(info.transport, harness_expected_transport()) != 0)
        fail_msg("transport %s (%s), expected %s", info.transport, info.transport_reason,
                 harness_expected_transport());
}

static void engine_basics(void **state)
{
    pair_t *p = *state;
    assert_true(ferry_engine_port(p->target) > 0);
    assert_non_null(strstr(ferry_engine_name(p->target), "127.0.0.1:"));
    assert_true(ferry_engine_epoch(p->target) != ferry_engine_epoch(p->initiator));
    assert_int_equal(ferry_session_open(p->initiator, p->peer), 0);
    /* Idempotent and cached. */
    assert_int_equal(ferry_session_open(p->initiator, p->peer), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p->initiator, p->peer, &info), 0);
    assert_int_equal(info.epoch, ferry_engine_epoch(p->target));
    assert_int_equal(info.protocol_version, FERRY_PROTOCOL_VERSION);
    assert_true(info.same_host);
    assert_string_equal(info.transport, harness_expected_transport());
    assert_true(info.transport_reason[0] != '\0');
}

static void write_read_sizes(void **state)
{
    pair_t *p = *state;
    const size_t sizes[] = {1, 7, 4096, 65537, (1u << 20) + 3, 16u << 20, 256u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t len = sizes[k];
        unsigned char *src, *dst;
        buffers(p, len, &src, &dst);
        harness_fill(src, len, len);
        memset(dst, 0, len);
        int rc = ferry_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len);
        if (rc) fprintf(stderr, "write %zu: %s\n", len, ferry_last_error_detail());
        assert_int_equal(rc, 0);
        /* Completion means placed: the target memory holds it now. */
        assert_true(harness_check(dst, len, len));
        memset(src, 0, len);
        harness_fill(dst, len, len + 1);
        rc = ferry_transfer_sync(p->initiator, p->peer, FERRY_OP_READ, src, (uint64_t)(uintptr_t)dst, len);
        if (rc) fprintf(stderr, "read %zu: %s\n", len, ferry_last_error_detail());
        assert_int_equal(rc, 0);
        assert_true(harness_check(src, len, len + 1));
        release(p, src, dst);
    }
    assert_transport(p);
}

static void batch_sync_blocks(void **state)
{
    pair_t *p = *state;
    enum { N = 200, BLOCK = 8192 };
    unsigned char *src, *dst;
    buffers(p, N * BLOCK, &src, &dst);
    harness_fill(src, N * BLOCK, 42);
    memset(dst, 0, N * BLOCK);
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    /* Scatter: block i goes to slot N-1-i. */
    for (int i = 0; i < N; i++) {
        locals[i] = src + (size_t)i * BLOCK;
        remotes[i] = (uint64_t)(uintptr_t)(dst + (size_t)(N - 1 - i) * BLOCK);
        lens[i] = BLOCK;
    }
    assert_int_equal(ferry_batch_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
    for (int i = 0; i < N; i++)
        assert_memory_equal(src + (size_t)i * BLOCK, dst + (size_t)(N - 1 - i) * BLOCK, BLOCK);
    memset(src, 0, N * BLOCK);
    assert_int_equal(ferry_batch_transfer_sync(p->initiator, p->peer, FERRY_OP_READ, locals, remotes, lens, N), 0);
    assert_true(harness_check(src, N * BLOCK, 42));
    assert_int_equal(ferry_batch_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, locals, remotes, lens, 0), 0);
    assert_transport(p);
    release(p, src, dst);
}

static void async_batch_status(void **state)
{
    pair_t *p = *state;
    enum { N = 16, BLOCK = 1u << 20 };
    unsigned char *src, *dst;
    buffers(p, N * BLOCK, &src, &dst);
    harness_fill(src, N * BLOCK, 7);
    memset(dst, 0, N * BLOCK);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, N + 1, &b), 0);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)i * BLOCK, (uint64_t)(uintptr_t)(dst + (size_t)i * BLOCK),
                                    BLOCK};
    assert_int_equal(ferry_batch_submit(b, p->peer, reqs, N, 0), 0);
    /* A failing request in the same batch: the others still complete. */
    ferry_request_t bad = {FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)(dst + (size_t)N * BLOCK - 10), 4096};
    assert_int_equal(ferry_batch_submit(b, p->peer, &bad, 1, 0), N);
    int rc = ferry_batch_wait(b, 20000);
    assert_int_equal(rc, FERRY_ERR_OUT_OF_BOUNDS);
    assert_detail_contains("request 16");
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
        assert_int_equal(st.code, 0);
        assert_int_equal(st.bytes, BLOCK);
    }
    ferry_status_t st;
    assert_int_equal(ferry_batch_status(b, N, &st), 0);
    assert_int_equal(st.state, FERRY_STATUS_FAILED);
    assert_int_equal(st.code, FERRY_ERR_OUT_OF_BOUNDS);
    assert_detail_contains("past the end");
    assert_int_equal(ferry_batch_status(b, N + 1, &st), FERRY_ERR_NOT_FOUND);
    assert_true(harness_check(dst, N * BLOCK, 7));
    /* Capacity is over the batch's life. */
    assert_int_equal(ferry_batch_submit(b, p->peer, reqs, 1, 0), FERRY_ERR_TOO_MANY_REQUESTS);
    assert_detail_contains("capacity 17");
    assert_int_equal(ferry_batch_free(b), 0);
    assert_transport(p);
    release(p, src, dst);
}

static void batch_busy_until_done(void **state)
{
    pair_t *p = *state;
    size_t len = 64u << 20;
    unsigned char *src, *dst;
    buffers(p, len, &src, &dst);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, 4, &b), 0);
    ferry_request_t r = {FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len};
    assert_int_equal(ferry_batch_submit(b, p->peer, &r, 1, 0), 0);
    int rc = ferry_batch_free(b);
    /* Either still running (BATCH_BUSY) or already done (freed). */
    if (rc == FERRY_ERR_BATCH_BUSY) {
        assert_detail_contains("in flight");
        assert_int_equal(ferry_batch_wait(b, 20000), 0);
        assert_int_equal(ferry_batch_free(b), 0);
    } else {
        assert_int_equal(rc, 0);
    }
    release(p, src, dst);
}

struct worker_arg {
    pair_t *p;
    int id;
    int failures;
};

static void *transfer_worker(void *arg)
{
    struct worker_arg *w = arg;
    size_t len = 256u << 10;
    unsigned char *src = malloc(len), *dst = malloc(len);
    ferry_register(w->p->initiator, src, len, 0);
    ferry_register(w->p->target, dst, len, FERRY_MEM_REMOTE);
    for (int i = 0; i < 50; i++) {
        uint64_t seed = (uint64_t)w->id * 1000 + (uint64_t)i;
        harness_fill(src, len, seed);
        if (ferry_transfer_sync(w->p->initiator, w->p->peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len) != 0 ||
            !harness_check(dst, len, seed))
            w->failures++;
        memset(src, 0, len);
        if (ferry_transfer_sync(w->p->initiator, w->p->peer, FERRY_OP_READ, src, (uint64_t)(uintptr_t)dst, len) != 0 ||
            !harness_check(src, len, seed))
            w->failures++;
    }
    ferry_deregister(w->p->initiator, src);
    ferry_deregister(w->p->target, dst);
    free(src);
    free(dst);
    return NULL;
}

static void four_threads_at_once(void **state)
{
    pair_t *p = *state;
    pthread_t t[4];
    struct worker_arg w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker_arg){p, i, 0};
        pthread_create(&t[i], NULL, transfer_worker, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    assert_transport(p);
}

static void notifications_arrive_in_order(void **state)
{
    pair_t *p = *state;
    for (int i = 0; i < 3; i++) {
        char msg[32];
        int n = snprintf(msg, sizeof msg, "req-%d done", i);
        assert_int_equal(ferry_notify(p->initiator, p->peer, msg, (size_t)n), 0);
    }
    ferry_notification_t got[8];
    long n = ferry_get_notifications(p->target, got, 8);
    assert_int_equal(n, 3);
    for (int i = 0; i < 3; i++) {
        char want[32];
        snprintf(want, sizeof want, "req-%d done", i);
        assert_int_equal(got[i].len, strlen(want));
        assert_memory_equal(got[i].msg, want, got[i].len);
        assert_string_equal(got[i].peer, ferry_engine_name(p->initiator));
    }
    ferry_notifications_free(got, (size_t)n);
    assert_int_equal(ferry_get_notifications(p->target, got, 8), 0);
    char big[1];
    assert_int_equal(ferry_notify(p->initiator, p->peer, big, (64u << 10) + 1), FERRY_ERR_INVALID_ARGUMENT);
}

static void segments_are_listed(void **state)
{
    pair_t *p = *state;
    unsigned char *a = malloc(4096), *b = malloc(8192), *c = malloc(100);
    assert_int_equal(ferry_register(p->target, a, 4096, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(p->target, b, 8192, FERRY_MEM_REMOTE_READ), 0);
    assert_int_equal(ferry_register(p->target, c, 100, FERRY_MEM_LOCAL), 0);
    ferry_segment_t segs[8];
    long n = ferry_session_segments(p->initiator, p->peer, segs, 8);
    assert_int_equal(n, 2); /* local-only regions are not exported */
    assert_true(segs[0].addr < segs[1].addr);
    ferry_deregister(p->target, a);
    ferry_deregister(p->target, b);
    ferry_deregister(p->target, c);
    free(a);
    free(b);
    free(c);
}


/* ------------------------------------------------------ small pieces */

/* A batch of n pieces of block bytes, scattered (piece i into slot
 * perm(i) of the target buffer, a stride of 3 coprime to n), written and
 * read back and checked. */
static void small_batch_round_trip(pair_t *p, unsigned char *src, unsigned char *dst, size_t n, size_t block,
                                   uint64_t seed)
{
    void **locals = calloc(n, sizeof *locals);
    uint64_t *remotes = calloc(n, sizeof *remotes);
    size_t *lens = calloc(n, sizeof *lens);
    harness_fill(src, n * block, seed);
    memset(dst, 0, n * block);
    for (size_t i = 0; i < n; i++) {
        size_t slot = (i * 7 + 3) % n;
        locals[i] = src + i * block;
        remotes[i] = (uint64_t)(uintptr_t)(dst + slot * block);
        lens[i] = block;
    }
    assert_int_equal(ferry_batch_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, locals, remotes, lens, n), 0);
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(src + i * block, dst + ((i * 7 + 3) % n) * block, block);
    memset(src, 0, n * block);
    assert_int_equal(ferry_batch_transfer_sync(p->initiator, p->peer, FERRY_OP_READ, locals, remotes, lens, n), 0);
    assert_true(harness_check(src, n * block, seed));
    free(locals);
    free(remotes);
    free(lens);
}

/* The paged-KV shape: a thousand pieces of 1,152 B, 2 KiB and 4 KiB at
 * scattered addresses in one batch (vector frames under protocol 2). */
static void small_pieces_batch(void **state)
{
    pair_t *p = *state;
    static const size_t blocks[] = {1152, 2048, 4096, 1};
    enum { N = 1000 };
    unsigned char *src, *dst;
    buffers(p, N * 4096, &src, &dst);
    for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++)
        small_batch_round_trip(p, src, dst, N, blocks[k], 100 + k);
    assert_transport(p);
    release(p, src, dst);
}

/* One frame carries pieces for a live region and for one the target
 * dropped after the initiator learned its segments: each piece answers
 * for itself; the dropped region's pieces fail with their own code and
 * detail, the others are placed. */
static void small_pieces_fail_one_by_one(pair_t *p, bool vector)
{
    enum { N = 64, BLOCK = 2048 };
    unsigned char *src, *dst;
    buffers(p, N * BLOCK, &src, &dst);
    unsigned char *gone = malloc(N * BLOCK);
    assert_non_null(gone);
    assert_int_equal(ferry_register(p->target, gone, N * BLOCK, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_session_open(p->initiator, p->peer), 0); /* learns both regions */
    assert_int_equal(ferry_deregister(p->target, gone), 0);
    harness_fill(src, N * BLOCK, 9);
    memset(dst, 0, N * BLOCK);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, N, &b), 0);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++) {
        unsigned char *to = (i % 4 == 3 ? gone : dst) + (size_t)i * BLOCK;
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)i * BLOCK, (uint64_t)(uintptr_t)to, BLOCK};
    }
    assert_int_equal(ferry_batch_submit(b, p->peer, reqs, N, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 20000), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    int later_in_frame = 0;
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        if (i % 4 == 3) {
            assert_int_equal(st.state, FERRY_STATUS_FAILED);
            assert_int_equal(st.code, FERRY_ERR_ADDRESS_NOT_REGISTERED);
            assert_detail_contains("not registered");
            later_in_frame += strstr(ferry_last_error_detail(), "pieces in one frame") != NULL;
        } else {
            assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
            assert_int_equal(st.bytes, BLOCK);
            assert_memory_equal(src + (size_t)i * BLOCK, dst + (size_t)i * BLOCK, BLOCK);
        }
    }
    /* Under protocol 2 most refusals came in a frame with others. */
    if (vector)
        assert_true(later_in_frame > 0);
    else
        assert_int_equal(later_in_frame, 0);
    /* Reads the same way: the live pieces come back, the others fail. */
    ferry_batch_t *rb;
    assert_int_equal(ferry_batch_alloc(p->initiator, N, &rb), 0);
    memset(src, 0, N * BLOCK);
    for (int i = 0; i < N; i++) reqs[i].opcode = FERRY_OP_READ;
    assert_int_equal(ferry_batch_submit(rb, p->peer, reqs, N, 0), 0);
    assert_int_equal(ferry_batch_wait(rb, 20000), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(rb, (size_t)i, &st), 0);
        assert_int_equal(st.code, i % 4 == 3 ? FERRY_ERR_ADDRESS_NOT_REGISTERED : 0);
        if (i % 4 != 3) assert_memory_equal(src + (size_t)i * BLOCK, dst + (size_t)i * BLOCK, BLOCK);
    }
    assert_int_equal(ferry_batch_free(rb), 0);
    assert_int_equal(ferry_batch_free(b), 0);
    free(gone);
    release(p, src, dst);
}

static void small_pieces_per_piece_errors(void **state) { small_pieces_fail_one_by_one(*state, true); }

/* An engine pinned to protocol 1 (an older peer) on either side: the old
 * framing, negotiated in the handshake; the same batches work. */
static void small_pieces_with_protocol_1(void **state)
{
    pair_t *p = *state;
    for (int side = 0; side < 2; side++) {
        ferry_config_t cfg;
        ferry_config_init(&cfg);
        const char *transport = getenv("FERRY_TRANSPORT");
        if (transport && *transport) cfg.transport = transport;
        cfg.timeout_ms = 20000;
        ferry_engine_t *old = harness_engine_cfg(&cfg);
        ferry_test_set_protocol_version(old, 1); /* before its first handshake */
        if (side == 0) {
            ferry_engine_destroy(p->initiator);
            p->initiator = old;
        } else {
            ferry_engine_destroy(p->target);
            p->target = old;
            snprintf(p->peer, sizeof p->peer, "%s", ferry_engine_name(p->target));
        }
        enum { N = 300 };
        unsigned char *src, *dst;
        buffers(p, N * 2048, &src, &dst);
        small_batch_round_trip(p, src, dst, N, 2048, 5);
        ferry_peer_info_t info;
        assert_int_equal(ferry_session_info(p->initiator, p->peer, &info), 0);
        assert_int_equal(info.protocol_version, 1);
        release(p, src, dst);
        small_pieces_fail_one_by_one(p, false);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(engine_basics, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(write_read_sizes, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(batch_sync_blocks, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(async_batch_status, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(batch_busy_until_done, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(four_threads_at_once, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(notifications_arrive_in_order, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(segments_are_listed, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(small_pieces_batch, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(small_pieces_per_piece_errors, pair_setup, pair_teardown),
        cmocka_unit_test_setup_teardown(small_pieces_with_protocol_1, pair_setup, pair_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
