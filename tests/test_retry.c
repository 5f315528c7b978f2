/* SPDX-License-Identifier: Apache-2.0 */
/* The retry policy: retryable link failures are retried with doubling
 * backoff up to config.retries times on fresh connections; non-retryable
 * codes and spent deadlines are not; when retries run out on a broken link
 * the session's connections are torn down, and the next use handshakes
 * afresh. Every step is counted in ferry_engine_stats(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "link/metrics.h"
#include "fault.h"
#include "fixtures.h"
#include "harness.h"

#define LEN (2u << 20)

typedef proxied_pair_t world_t;

static world_t *make(int retries, int backoff_ms, int timeout_ms, proxy_opts_t o)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = timeout_ms;
    cfg.retries = retries;
    cfg.retry_backoff_ms = backoff_ms;
    cfg.conns_per_peer = 1;
    cfg.cancel_timeout_ms = 300;
    return proxied_pair_make(&cfg, NULL, LEN, o);
}

static int write_all(world_t *w, uint64_t seed)
{
    harness_fill(w->src, LEN, seed);
    return proxied_pair_transfer(w, FERRY_OP_WRITE);
}

static ferry_stats_t stats(world_t *w)
{
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(w->ini, &st), 0);
    return st;
}

static const ferry_stats_code_t *code_of(const ferry_stats_t *st, int code)
{
    for (size_t i = 0; i < st->ncodes; i++)
        if (st->codes[i].code == code) return &st->codes[i];
    return NULL;
}

static void retried_until_it_works(void **state)
{
    (void)state;
    /* The proxy cuts the connection at the first two WRITE frames it sees. */
    world_t *w = make(2, 50, 10000, (proxy_opts_t){.cut_writes = 2});
    assert_int_equal(ferry_session_open(w->ini, proxy_name(w->px)), 0);
    uint64_t t0 = harness_now_ms();
    int rc = write_all(w, 1);
    uint64_t took = harness_now_ms() - t0;
    if (rc) fprintf(stderr, "%s\n", ferry_last_error_detail());
    assert_int_equal(rc, 0);
    assert_true(harness_check(w->dst, LEN, 1));
    /* Two retries, after 50 and 100 ms of backoff. */
    assert_true(took >= 150);
    ferry_stats_t st = stats(w);
    assert_int_equal(st.retries, 2);
    assert_int_equal(code_of(&st, FERRY_ERR_PEER_CLOSED)->retries, 2);
    assert_int_equal(st.reconnects, 2);
    assert_int_equal(st.connections_opened, 3);
    assert_int_equal(st.session_teardowns, 0);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.requests_completed, 1);
    assert_int_equal(st.bytes_written, LEN);
    proxied_pair_done(w);
}

static void teardown_when_retries_run_out(void **state)
{
    (void)state;
    world_t *w = make(2, 10, 10000, (proxy_opts_t){.cut_writes = 3});
    assert_int_equal(ferry_session_open(w->ini, proxy_name(w->px)), 0);
    int rc = write_all(w, 2);
    assert_int_equal(rc, FERRY_ERR_PEER_CLOSED);
    assert_true(ferry_error_retryable(rc));
    ferry_stats_t st = stats(w);
    assert_int_equal(st.retries, 2);
    assert_int_equal(st.session_teardowns, 1);
    assert_int_equal(st.requests_failed, 1);
    assert_int_equal(code_of(&st, FERRY_ERR_PEER_CLOSED)->failures, 1);
    /* The session is not dead: the next use connects and handshakes again
     * (with the epoch check) and works. */
    uint64_t opened = st.connections_opened;
    assert_int_equal(write_all(w, 3), 0);
    assert_true(harness_check(w->dst, LEN, 3));
    st = stats(w);
    assert_int_equal(st.connections_opened, opened + 1);
    assert_int_equal(st.peer_restarts, 0);
    proxied_pair_done(w);
}

static void no_retries_configured(void **state)
{
    (void)state;
    world_t *w = make(0, 10, 10000, (proxy_opts_t){.cut_writes = 1});
    assert_int_equal(write_all(w, 4), FERRY_ERR_PEER_CLOSED);
    ferry_stats_t st = stats(w);
    assert_int_equal(st.retries, 0);
    assert_int_equal(st.session_teardowns, 1);
    assert_int_equal(write_all(w, 5), 0);
    proxied_pair_done(w);
}

static void nonretryable_codes_are_not_retried(void **state)
{
    (void)state;
    world_t *w = make(3, 10, 10000, (proxy_opts_t){0});
    /* Past the end of the region: the target refuses; no retry can help. */
    int rc = ferry_transfer_sync(w->ini, proxy_name(w->px), FERRY_OP_WRITE, w->src,
                                 (uint64_t)(uintptr_t)w->dst + 100, LEN);
    assert_int_equal(rc, FERRY_ERR_OUT_OF_BOUNDS);
    assert_false(ferry_error_retryable(rc));
    ferry_stats_t st = stats(w);
    assert_int_equal(st.retries, 0);
    assert_int_equal(st.session_teardowns, 0);
    assert_int_equal(code_of(&st, FERRY_ERR_OUT_OF_BOUNDS)->failures, 1);
    proxied_pair_done(w);
}

static void spent_deadline_is_not_retried(void **state)
{
    (void)state;
    world_t *w = make(3, 10, 600, (proxy_opts_t){0});
    assert_int_equal(write_all(w, 6), 0);
    proxy_stall(w->px, true);
    uint64_t t0 = harness_now_ms();
    int rc = write_all(w, 7);
    uint64_t took = harness_now_ms() - t0;
    /* Bytes were in flight and the stalled target cannot confirm the fence
     * (cancel.h): CANCEL_UNCONFIRMED after cancel_timeout_ms more. */
    assert_true(rc == FERRY_ERR_TIMEOUT || rc == FERRY_ERR_CANCEL_UNCONFIRMED);
    assert_true(took >= 550 && took < 600 + 300 + 1000);
    ferry_stats_t st = stats(w);
    assert_int_equal(st.retries, 0);
    assert_int_equal(st.session_teardowns, 1); /* the link broke: the pool goes */
    proxy_stall(w->px, false);
    rc = write_all(w, 8);
    if (rc) fprintf(stderr, "write after the stall: %s\n", ferry_last_error_detail());
    assert_int_equal(rc, 0);
    assert_true(harness_check(w->dst, LEN, 8));
    proxied_pair_done(w);
}

/* A write cut off by a dead link, whose bytes a router delivers late, after
 * a later write to the same place completed: the target refuses the stale
 * bytes (the initiator fenced the cut-off write before its next one). */
static void late_bytes_of_a_failed_write_never_land(void **state)
{
    (void)state;
    world_t *w = make(0, 10, 600, (proxy_opts_t){0});
    assert_int_equal(write_all(w, 9), 0);
    proxy_hold(w->px, true); /* the current connection goes silent */
    assert_int_equal(write_all(w, 10), FERRY_ERR_TIMEOUT); /* fenced over a new connection */
    assert_int_equal(write_all(w, 11), 0); /* on a new connection */
    assert_true(harness_check(w->dst, LEN, 11));
    proxy_hold(w->px, false); /* the stale seed-10 bytes arrive now */
    usleep(300 * 1000);
    assert_true(harness_check(w->dst, LEN, 11));
    proxied_pair_done(w);
}

static void stats_cover_the_error_table(void **state)
{
    (void)state;
    ferry_engine_t *e = harness_engine(1000);
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(e, &st), 0);
    assert_int_equal(st.ncodes, FERRY_ERROR_TABLE_SIZE - 1); /* every code but OK */
    assert_true(st.ncodes <= FERRY_STATS_MAX_CODES);
    for (size_t i = 0; i < st.ncodes; i++) {
        assert_true(st.codes[i].code < 0);
        assert_string_not_equal(ferry_error_name(st.codes[i].code), "UNKNOWN");
        assert_int_equal(st.codes[i].failures, 0);
    }
    assert_int_equal(ferry_engine_stats(NULL, &st), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_engine_stats(e, NULL), FERRY_ERR_INVALID_ARGUMENT);
    /* Async requests count too, one outcome each. */
    ferry_engine_t *t = harness_engine(1000);
    unsigned char *a = malloc(8192), *b = calloc(1, 8192);
    ferry_register(e, a, 8192, 0);
    ferry_register(t, b, 8192, FERRY_MEM_REMOTE);
    ferry_batch_t *bt;
    assert_int_equal(ferry_batch_alloc(e, 3, &bt), 0);
    ferry_request_t r[3] = {{FERRY_OP_WRITE, a, (uint64_t)(uintptr_t)b, 4096},
                            {FERRY_OP_READ, a + 4096, (uint64_t)(uintptr_t)b + 4096, 4096},
                            {FERRY_OP_WRITE, a, (uint64_t)(uintptr_t)b + 8000, 4096}};
    assert_int_equal(ferry_batch_submit(bt, ferry_engine_name(t), r, 3, 0), 0);
    assert_int_equal(ferry_batch_wait(bt, 5000), FERRY_ERR_OUT_OF_BOUNDS);
    ferry_batch_free(bt);
    ferry_engine_stats(e, &st);
    assert_int_equal(st.requests, 3);
    assert_int_equal(st.requests_completed, 2);
    assert_int_equal(st.requests_failed, 1);
    assert_int_equal(st.bytes_written, 4096);
    assert_int_equal(st.bytes_read, 4096);
    ferry_engine_stats(t, &st);
    assert_int_equal(st.bytes_placed, 4096);
    assert_int_equal(st.bytes_served, 4096);
    assert_true(st.connections_accepted >= 1);
    ferry_engine_destroy(e);
    ferry_engine_destroy(t);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(retried_until_it_works),
        cmocka_unit_test(teardown_when_retries_run_out),
        cmocka_unit_test(no_retries_configured),
        cmocka_unit_test(nonretryable_codes_are_not_retried),
        cmocka_unit_test(spent_deadline_is_not_retried),
        cmocka_unit_test(late_bytes_of_a_failed_write_never_land),
        cmocka_unit_test(stats_cover_the_error_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
