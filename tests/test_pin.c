/* SPDX-License-Identifier: Apache-2.0 */
/* Epoch pinning (issue 20, item 2): a target restarted at the same port,
 * with its buffer at the same address, so that a call carrying the old
 * process's addresses would land in the new one. Over tcp and shm:
 * - calls pinned to the old epoch ("host:port#epoch"): sync write, read,
 *   batch, strided, async batch submits, notify, session calls, each fail
 *   PEER_RESTARTED on every one of N tries, naming both epochs, and the new
 *   process's memory is untouched;
 * - an async batch submitted (pinned) before the restart that runs after
 *   it fails the same way;
 * - a re-pinned name works; a pin newer than the session re-opens it;
 * - unpinned calls keep the documented rule: the one call that meets the
 *   restart fails, later ones go to the new process;
 * - malformed pins are INVALID_ARGUMENT;
 * - KV: a plan's sends are pinned to the decode it was first sent to (or
 *   to the pinned name given): a restarted decode gets nothing under the
 *   old layout, every time. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ferry/kv.h>

#include "fault.h"
#include "fixtures.h"
#include "harness.h"

#define TRIES 5

/* This suite runs each case over both transports. */
static ferry_engine_t *initiator(const char *transport, int workers)
{
    return fault_initiator(transport, 3000, workers);
}

static void pinned_name(char *out, size_t cap, const peer_proc_t *p)
{
    snprintf(out, cap, "%s#%016llx", p->name, (unsigned long long)p->epoch);
}

/* Ends p1 and starts its successor at the same port, its buffer at the
 * same address, filled with seed 300 (so that both a write landing there
 * and a read taking from there would show). */
static void restart(peer_proc_t *p1, peer_proc_t *p2)
{
    peer_restart_in_place(p1, p2);
    assert_int_equal(p2->addr, p1->addr); /* else old addresses could not land anyway */
    assert_int_equal(peer_cmd(p2, "fill 300"), 0);
}

static void assert_restarted_detail(const peer_proc_t *p1, const peer_proc_t *p2)
{
    char old[32], cur[32];
    snprintf(old, sizeof old, "%016llx", (unsigned long long)p1->epoch);
    snprintf(cur, sizeof cur, "%016llx", (unsigned long long)p2->epoch);
    assert_detail_contains(old);
    assert_detail_contains(cur);
}

static void expect_restarted(int rc, const char *what, int i, const peer_proc_t *p1, const peer_proc_t *p2)
{
    if (rc != FERRY_ERR_PEER_RESTARTED)
        fail_msg("%s, try %d: %s (%d), expected PEER_RESTARTED: %s", what, i, ferry_error_name(rc), rc,
                 ferry_last_error_detail());
    assert_restarted_detail(p1, p2);
}

static void pinned_calls_into_a_restart(const char *transport)
{
    ferry_engine_t *e = initiator(transport, 0);
    peer_proc_t p1, p2;
    assert_int_equal(peer_spawn(&p1, NULL, NULL, NULL), 0);
    size_t len = p1.len, half = len / 2;
    unsigned char *buf = registered_buffer(e, len, 0);

    /* The pin: what ferry_session_pin writes is the documented form. */
    char pin1[128], want[128];
    assert_int_equal(ferry_session_pin(e, p1.name, pin1, sizeof pin1), 0);
    pinned_name(want, sizeof want, &p1);
    assert_string_equal(pin1, want);
    char tiny[8];
    assert_int_equal(ferry_session_pin(e, p1.name, tiny, sizeof tiny), FERRY_ERR_INVALID_ARGUMENT);
    harness_fill(buf, len, 100);
    assert_int_equal(ferry_transfer_sync(e, pin1, FERRY_OP_WRITE, buf, p1.addr, len), 0);
    assert_int_equal(peer_cmd(&p1, "check 100 0 %zu", len), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(e, pin1, &info), 0);
    assert_string_equal(info.transport, transport);
    assert_string_equal(info.name, p1.name); /* the one session of host:port */

    restart(&p1, &p2);
    harness_fill(buf, len, 200);
    void *locals[2] = {buf, buf + half};
    uint64_t remotes[2] = {p1.addr, p1.addr + half};
    size_t lens[2] = {half, half};
    ferry_strided_t d = {.opcode = FERRY_OP_WRITE, .local_base = buf, .local_stride = 4096,
                         .remote_base = p1.addr, .remote_stride = 4096, .piece_len = 4096, .n = len / 4096};
    for (int i = 0; i < TRIES; i++) {
        /* The first of these meets the dead connection and re-opens one,
         * which the new process answers with its epoch. */
        expect_restarted(ferry_transfer_sync(e, pin1, FERRY_OP_WRITE, buf, p1.addr, len), "write", i, &p1, &p2);
        expect_restarted(ferry_transfer_sync(e, pin1, FERRY_OP_READ, buf, p1.addr, len), "read", i, &p1, &p2);
        expect_restarted(ferry_batch_transfer_sync(e, pin1, FERRY_OP_WRITE, locals, remotes, lens, 2), "batch", i,
                         &p1, &p2);
        d.opcode = FERRY_OP_WRITE;
        expect_restarted(ferry_strided_transfer_sync(e, pin1, &d), "strided write", i, &p1, &p2);
        d.opcode = FERRY_OP_READ;
        expect_restarted(ferry_strided_transfer_sync(e, pin1, &d), "strided read", i, &p1, &p2);
        ferry_batch_t *b;
        assert_int_equal(ferry_batch_alloc(e, 4, &b), 0);
        ferry_request_t reqs[2] = {{FERRY_OP_WRITE, buf, p1.addr, half}, {FERRY_OP_READ, buf + half, p1.addr + half, half}};
        long first = ferry_batch_submit(b, pin1, reqs, 2, 0);
        expect_restarted((int)first, "async batch", i, &p1, &p2);
        d.opcode = FERRY_OP_WRITE;
        first = ferry_batch_submit_strided(b, pin1, &d, 0);
        expect_restarted((int)first, "async strided", i, &p1, &p2);
        assert_int_equal(ferry_batch_free(b), 0);
        expect_restarted(ferry_notify(e, pin1, "stale", 5), "notify", i, &p1, &p2);
        expect_restarted(ferry_session_info(e, pin1, &info), "info", i, &p1, &p2);
        ferry_segment_t segs[2];
        expect_restarted((int)ferry_session_segments(e, pin1, segs, 2), "segments", i, &p1, &p2);
        uint64_t rtt;
        expect_restarted(ferry_session_ping(e, pin1, &rtt), "ping", i, &p1, &p2);
        expect_restarted(ferry_session_open(e, pin1), "open", i, &p1, &p2);
    }
    /* Nothing landed in the new process, nothing came from it. */
    assert_int_equal(peer_cmd(&p2, "check 300 0 %zu", len), 0);
    assert_true(harness_check(buf, len, 200));
    ferry_stats_t st;
    ferry_engine_stats(e, &st);
    assert_int_equal(st.peer_restarts, 1);

    /* Pinned again, to the new process: its addresses work. */
    char pin2[128];
    assert_int_equal(ferry_session_pin(e, p2.name, pin2, sizeof pin2), 0);
    pinned_name(want, sizeof want, &p2);
    assert_string_equal(pin2, want);
    assert_int_equal(ferry_transfer_sync(e, pin2, FERRY_OP_WRITE, buf, p2.addr, len), 0);
    assert_int_equal(peer_cmd(&p2, "check 200 0 %zu", len), 0);
    /* The old pin still fails, the new one still works. */
    expect_restarted(ferry_transfer_sync(e, pin1, FERRY_OP_WRITE, buf, p1.addr, len), "write after re-pin", 0, &p1,
                     &p2);
    assert_int_equal(ferry_transfer_sync(e, pin2, FERRY_OP_READ, buf, p2.addr, len), 0);
    /* Unpinned, as documented: once the restart was met, calls go to the
     * new process, whichever addresses they carry. */
    harness_fill(buf, len, 400);
    assert_int_equal(ferry_transfer_sync(e, p1.name, FERRY_OP_WRITE, buf, p1.addr, len), 0);
    assert_int_equal(peer_cmd(&p2, "check 400 0 %zu", len), 0);
    peer_session_end(e, &p2, buf);
}

static void pinned_calls_into_a_restart_tcp(void **state)
{
    (void)state;
    pinned_calls_into_a_restart("tcp");
}

static void pinned_calls_into_a_restart_shm(void **state)
{
    (void)state;
    pinned_calls_into_a_restart("shm");
}

/* An async batch submitted, pinned, before the restart and run after it:
 * the only worker is held by a batch to a stopped peer meanwhile. */
static void pinned_batch_runs_after_restart(const char *transport)
{
    ferry_engine_t *e = initiator(transport, 1);
    peer_proc_t p0, p1, p2;
    assert_int_equal(peer_spawn(&p0, NULL, NULL, NULL), 0);
    assert_int_equal(peer_spawn(&p1, NULL, NULL, NULL), 0);
    size_t len = p1.len;
    unsigned char *buf = registered_buffer(e, len, 0);
    harness_fill(buf, len, 100);
    assert_int_equal(ferry_transfer_sync(e, p0.name, FERRY_OP_WRITE, buf, p0.addr, 4096), 0);
    char pin1[128];
    assert_int_equal(ferry_session_pin(e, p1.name, pin1, sizeof pin1), 0);
    assert_int_equal(ferry_transfer_sync(e, pin1, FERRY_OP_WRITE, buf, p1.addr, 4096), 0);

    harness_stop_process(p0.pid);
    ferry_batch_t *blocker, *b;
    assert_int_equal(ferry_batch_alloc(e, 1, &blocker), 0);
    assert_int_equal(ferry_batch_alloc(e, 1, &b), 0);
    ferry_request_t r0 = {FERRY_OP_WRITE, buf, p0.addr, 4096};
    assert_int_equal(ferry_batch_submit(blocker, p0.name, &r0, 1, 4000), 0);
    usleep(100000); /* the worker took it */
    harness_fill(buf, len, 200);
    ferry_request_t r = {FERRY_OP_WRITE, buf, p1.addr, len};
    assert_int_equal(ferry_batch_submit(b, pin1, &r, 1, 10000), 0);
    ferry_status_t st;
    assert_int_equal(ferry_batch_status(b, 0, &st), 0);
    assert_int_equal(st.state, FERRY_STATUS_WAITING);
    restart(&p1, &p2);
    int rc = ferry_batch_wait(b, 15000);
    if (rc != FERRY_ERR_PEER_RESTARTED) fail_msg("batch: %s: %s", ferry_error_name(rc), ferry_last_error_detail());
    assert_int_equal(ferry_batch_status(b, 0, &st), 0);
    assert_int_equal(st.code, FERRY_ERR_PEER_RESTARTED);
    assert_int_equal(peer_cmd(&p2, "check 300 0 %zu", len), 0);
    rc = ferry_batch_wait(blocker, 15000);
    assert_true(rc == FERRY_ERR_TIMEOUT || rc == FERRY_ERR_CANCEL_UNCONFIRMED);
    assert_int_equal(ferry_batch_free(blocker), 0);
    assert_int_equal(ferry_batch_free(b), 0);
    /* Submitted again with the old pin: refused at submit, every time. */
    for (int i = 0; i < TRIES; i++) {
        assert_int_equal(ferry_batch_alloc(e, 1, &b), 0);
        expect_restarted((int)ferry_batch_submit(b, pin1, &r, 1, 0), "batch resubmit", i, &p1, &p2);
        assert_int_equal(ferry_batch_free(b), 0);
    }
    assert_int_equal(peer_cmd(&p2, "check 300 0 %zu", len), 0);
    kill(p0.pid, SIGCONT);
    peer_end(&p0, SIGKILL);
    peer_session_end(e, &p2, buf);
}

static void pinned_batch_runs_after_restart_tcp(void **state)
{
    (void)state;
    pinned_batch_runs_after_restart("tcp");
}

static void pinned_batch_runs_after_restart_shm(void **state)
{
    (void)state;
    pinned_batch_runs_after_restart("shm");
}

struct bg_write {
    ferry_engine_t *e;
    const char *peer;
    void *buf;
    uint64_t remote;
    size_t len;
    int rc;
    char detail[1024]; /* the thread's own */
};

static void *bg_write(void *arg)
{
    struct bg_write *w = arg;
    w->rc = ferry_transfer_sync(w->e, w->peer, FERRY_OP_WRITE, w->buf, w->remote, w->len);
    snprintf(w->detail, sizeof w->detail, "%s", ferry_last_error_detail());
    return NULL;
}

/* A pinned write under way when its connection breaks (the target killed
 * while stopped, so the write was waiting for its answer) retries on a
 * new connection, which reaches the restarted process at the same port:
 * its handshake refuses it and nothing of the write lands there. */
static void pinned_call_reconnects_into_restart(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 15000;
    cfg.connect_timeout_ms = 3000;
    cfg.retries = 4; /* 300, 600, 1200, 2400 ms: the new process is up by then */
    cfg.retry_backoff_ms = 300;
    cfg.cancel_timeout_ms = 300;
    cfg.transport = "tcp";
    ferry_engine_t *e = harness_engine_cfg(&cfg);
    peer_proc_t p1, p2;
    assert_int_equal(peer_spawn(&p1, NULL, NULL, NULL), 0);
    size_t len = p1.len;
    unsigned char *buf = registered_buffer(e, len, 0);
    harness_fill(buf, len, 100);
    char pin1[128];
    assert_int_equal(ferry_session_pin(e, p1.name, pin1, sizeof pin1), 0);
    assert_int_equal(ferry_transfer_sync(e, pin1, FERRY_OP_WRITE, buf, p1.addr, 4096), 0);

    harness_stop_process(p1.pid);
    struct bg_write w = {.e = e, .peer = pin1, .buf = buf, .remote = p1.addr, .len = len};
    pthread_t t;
    pthread_create(&t, NULL, bg_write, &w);
    usleep(300000); /* on the wire, waiting for the stopped target's answer */
    restart(&p1, &p2);
    pthread_join(t, NULL);
    fprintf(stderr, "pinned write across the restart: %s: %s\n", ferry_error_name(w.rc), w.detail);
    /* PEER_RESTARTED; CANCEL_UNCONFIRMED when the fence of the bytes the
     * dead process had could not be confirmed (it is gone). */
    assert_true(w.rc == FERRY_ERR_PEER_RESTARTED || w.rc == FERRY_ERR_CANCEL_UNCONFIRMED);
    assert_int_equal(peer_cmd(&p2, "check 300 0 %zu", len), 0);
    for (int i = 0; i < TRIES; i++)
        expect_restarted(ferry_transfer_sync(e, pin1, FERRY_OP_WRITE, buf, p1.addr, len), "write after", i, &p1, &p2);
    assert_int_equal(peer_cmd(&p2, "check 300 0 %zu", len), 0);
    peer_session_end(e, &p2, buf);
}

/* The peer restarted and no call met it yet, but the caller learned the
 * new epoch elsewhere (the new process handed out its pinned name): the
 * pinned call finds the restart and goes to the new process. */
static void newer_pin_reopens_the_session(void **state)
{
    (void)state;
    ferry_engine_t *e = initiator("tcp", 0);
    peer_proc_t p1, p2;
    assert_int_equal(peer_spawn(&p1, NULL, NULL, NULL), 0);
    size_t len = p1.len;
    unsigned char *buf = registered_buffer(e, len, 0);
    harness_fill(buf, len, 100);
    assert_int_equal(ferry_transfer_sync(e, p1.name, FERRY_OP_WRITE, buf, p1.addr, len), 0);
    restart(&p1, &p2);
    char pin2[128];
    pinned_name(pin2, sizeof pin2, &p2);
    assert_int_equal(ferry_transfer_sync(e, pin2, FERRY_OP_WRITE, buf, p2.addr, len), 0);
    assert_int_equal(peer_cmd(&p2, "check 100 0 %zu", len), 0);
    peer_session_end(e, &p2, buf);
}

/* A pin that never was the peer's: refused every time, with one probe
 * (the session stays healthy; no restart is counted). Malformed pins are
 * argument errors. */
static void wrong_and_malformed_pins(void **state)
{
    (void)state;
    ferry_engine_t *e = initiator("tcp", 0);
    peer_proc_t p;
    assert_int_equal(peer_spawn(&p, NULL, NULL, NULL), 0);
    unsigned char *buf = registered_buffer(e, 4096, 0);
    char wrong[128];
    snprintf(wrong, sizeof wrong, "%s#%llx", p.name, (unsigned long long)(p.epoch ^ 0x5a5a));
    for (int i = 0; i < TRIES; i++) {
        assert_int_equal(ferry_transfer_sync(e, wrong, FERRY_OP_WRITE, buf, p.addr, 4096), FERRY_ERR_PEER_RESTARTED);
        assert_detail_contains("pinned to epoch");
    }
    assert_int_equal(peer_cmd(&p, "iszero 0 4096"), 0);
    assert_int_equal(ferry_transfer_sync(e, p.name, FERRY_OP_WRITE, buf, p.addr, 4096), 0);
    ferry_stats_t st;
    ferry_engine_stats(e, &st);
    assert_int_equal(st.peer_restarts, 0);
    /* Uppercase and short pins are the same epoch. */
    char upper[128];
    snprintf(upper, sizeof upper, "%s#%llX", p.name, (unsigned long long)p.epoch);
    assert_int_equal(ferry_transfer_sync(e, upper, FERRY_OP_WRITE, buf, p.addr, 4096), 0);

    const char *bad[] = {"#", "#0x12", "#12g4", "#12345678901234567", "# 12", "#12#34"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "%s%s", p.name, bad[i]);
        int rc = ferry_transfer_sync(e, name, FERRY_OP_WRITE, buf, p.addr, 4096);
        if (rc != FERRY_ERR_INVALID_ARGUMENT) fail_msg("'%s': %s", name, ferry_error_name(rc));
        assert_detail_contains("hex digits");
        char out[128];
        assert_int_equal(ferry_session_pin(e, name, out, sizeof out), FERRY_ERR_INVALID_ARGUMENT);
    }
    /* Closing by a pinned name closes the session of host:port. */
    char pin[128];
    assert_int_equal(ferry_session_pin(e, p.name, pin, sizeof pin), 0);
    assert_int_equal(ferry_session_close(e, pin), 0);
    assert_int_equal(ferry_session_close(e, p.name), FERRY_ERR_NOT_FOUND);
    peer_session_end(e, &p, buf);
}

/* The decode's layout: an MLA cache of one layer in the peer's buffer,
 * pages of one 4 KiB row; the prefill's the same in buf. */
#define KV_PAGES 64
#define KV_ROW 4096

static ferry_kv_plan_t *kv_plan(uint64_t *src_addr, uint64_t *dst_addr)
{
    ferry_kv_cache_desc_t src = {.kind = FERRY_KV_MLA, .num_layers = 1, .num_pages = KV_PAGES, .page_size = 1,
                                 .mla_row_bytes = KV_ROW, .tp_rank = 0, .tp_size = 1, .k_addrs = src_addr};
    ferry_kv_cache_desc_t dst = src;
    dst.k_addrs = dst_addr;
    int32_t sp[KV_PAGES / 2], dp[KV_PAGES / 2];
    for (int i = 0; i < KV_PAGES / 2; i++) sp[i] = i, dp[i] = KV_PAGES - 1 - 2 * i;
    ferry_kv_plan_t *plan;
    assert_int_equal(ferry_kv_plan_create(&src, &dst, sp, dp, KV_PAGES / 2, &plan), 0);
    assert_int_equal(ferry_kv_plan_bind_sender(plan, 0, 0, 0, 0), 0);
    return plan;
}

static void kv_restarted_decode_gets_nothing(void **state)
{
    (void)state;
    ferry_engine_t *e = initiator("tcp", 0);
    peer_proc_t p1, p2;
    assert_int_equal(peer_spawn(&p1, NULL, NULL, NULL), 0);
    size_t len = (size_t)KV_PAGES * KV_ROW;
    assert_true(p1.len >= len);
    unsigned char *buf = registered_buffer(e, len, 0);
    harness_fill(buf, len, 100);
    uint64_t src_addr = (uint64_t)(uintptr_t)buf, dst_addr = p1.addr;
    ferry_kv_send_args_t args = {.request_id = 7, .timeout_ms = 3000};
    /* Sent once to the live decode: the plan is pinned to it. */
    ferry_kv_plan_t *plan = kv_plan(&src_addr, &dst_addr);
    assert_int_equal(ferry_kv_send(e, p1.name, plan, &args), 0);
    assert_int_equal(peer_cmd(&p1, "iszero %d %d", (KV_PAGES - 1) * KV_ROW, KV_ROW), 1); /* page 0 -> 63 */
    char pin1[128];
    pinned_name(pin1, sizeof pin1, &p1); /* what the decode advertises with its layout */
    /* A second plan made from the layout, still unsent. */
    ferry_kv_plan_t *plan2 = kv_plan(&src_addr, &dst_addr);

    restart(&p1, &p2);
    for (int i = 0; i < TRIES; i++) {
        args.request_id = 100 + (uint64_t)i;
        expect_restarted(ferry_kv_send(e, p1.name, plan, &args), "kv send", i, &p1, &p2);
        expect_restarted(ferry_kv_send(e, pin1, plan2, &args), "kv send, pinned layout", i, &p1, &p2);
    }
    assert_int_equal(peer_cmd(&p2, "check 300 0 %zu", p2.len), 0);
    /* A plan of the new layout, pinned anew, goes. */
    dst_addr = p2.addr;
    ferry_kv_plan_t *plan3 = kv_plan(&src_addr, &dst_addr);
    char pin2[128];
    assert_int_equal(ferry_session_pin(e, p2.name, pin2, sizeof pin2), 0);
    assert_int_equal(ferry_kv_send(e, pin2, plan3, &args), 0);
    /* ... and then refuses another epoch than its own. */
    expect_restarted(ferry_kv_send(e, pin1, plan3, &args), "kv send, plan of another epoch", 0, &p1, &p2);
    ferry_kv_plan_destroy(plan);
    ferry_kv_plan_destroy(plan2);
    ferry_kv_plan_destroy(plan3);
    peer_session_end(e, &p2, buf);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pinned_calls_into_a_restart_tcp),
        cmocka_unit_test(pinned_calls_into_a_restart_shm),
        cmocka_unit_test(pinned_batch_runs_after_restart_tcp),
        cmocka_unit_test(pinned_batch_runs_after_restart_shm),
        cmocka_unit_test(pinned_call_reconnects_into_restart),
        cmocka_unit_test(newer_pin_reopens_the_session),
        cmocka_unit_test(wrong_and_malformed_pins),
        cmocka_unit_test(kv_restarted_decode_gets_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
