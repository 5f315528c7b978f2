/* SPDX-License-Identifier: Apache-2.0 */
/* Peer death and restart, with the target in a child process:
 * - kill -9 mid-transfer: every pending request fails within its deadline,
 *   and no thread is left behind;
 * - a target stopped (SIGSTOP: a dead link that never closes) makes requests
 *   fail with TIMEOUT at their deadline;
 * - restart on the same port, even with the buffer at the same address: the
 *   call that finds the new epoch gets PEER_RESTARTED and writes nothing;
 *   the session re-opens by itself, so the next call works (no probe);
 * - a deregistration at the target is seen: the range is refused, named,
 *   never written; a re-registration takes the first write. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "fixtures.h"
#include "harness.h"

/* How long a fence of bytes in flight may wait for the target (cancel.h). */
#define CANCEL_MS 300

static ferry_engine_t *initiator(int timeout_ms) { return fault_initiator(NULL, timeout_ms, 0); }

static bool is_link_error(int code)
{
    return code == FERRY_ERR_PEER_CLOSED || code == FERRY_ERR_SOCKET || code == FERRY_ERR_TIMEOUT;
}

/* ------------------------------------------------ kill -9 */

#define BLOCK (4u << 20)
#define NBLOCKS 16

struct runner {
    ferry_engine_t *e;
    const char *peer;
    unsigned char *src;
    uint64_t remote;
    atomic_bool stop;
    /* outcome of the batch (or sync call) that failed */
    int code;
    uint64_t failed_at;
    atomic_int batches;
    int bad_states;
};

static void *batch_loop(void *arg)
{
    struct runner *r = arg;
    while (!atomic_load(&r->stop)) {
        ferry_batch_t *b;
        assert_int_equal(ferry_batch_alloc(r->e, NBLOCKS, &b), 0);
        ferry_request_t reqs[NBLOCKS];
        for (int i = 0; i < NBLOCKS; i++)
            reqs[i] = (ferry_request_t){FERRY_OP_WRITE, r->src + (size_t)i * BLOCK, r->remote + (uint64_t)i * BLOCK, BLOCK};
        long first = ferry_batch_submit(b, r->peer, reqs, NBLOCKS, 0);
        int rc = first < 0 ? (int)first : ferry_batch_wait(b, -1);
        if (first >= 0) {
            for (int i = 0; i < NBLOCKS; i++) {
                ferry_status_t st;
                ferry_batch_status(b, (size_t)i, &st);
                /* Every request ended, one way or the other. */
                if (st.state == FERRY_STATUS_WAITING || st.state == FERRY_STATUS_PENDING) r->bad_states++;
                if (st.state != FERRY_STATUS_COMPLETED && !is_link_error(st.code)) r->bad_states++;
            }
        }
        assert_int_equal(ferry_batch_free(b), 0);
        if (rc) {
            r->code = rc;
            r->failed_at = harness_now_ms();
            break;
        }
        atomic_fetch_add(&r->batches, 1);
    }
    return NULL;
}

static void *sync_loop(void *arg)
{
    struct runner *r = arg;
    while (!atomic_load(&r->stop)) {
        int rc = ferry_transfer_sync(r->e, r->peer, FERRY_OP_READ, r->src, r->remote, (size_t)NBLOCKS * BLOCK);
        if (rc) {
            r->code = rc;
            r->failed_at = harness_now_ms();
            break;
        }
        atomic_fetch_add(&r->batches, 1);
    }
    return NULL;
}

static void kill9_mid_transfer(void **state)
{
    (void)state;
    int base_threads = thread_baseline();
    const int timeout_ms = 3000;
    ferry_engine_t *e = initiator(timeout_ms);
    peer_proc_t p;
    const char *args[] = {"--len", "134217728", NULL};
    assert_int_equal(peer_spawn(&p, NULL, NULL, args), 0);
    size_t len = (size_t)NBLOCKS * BLOCK;
    unsigned char *src = malloc(len), *src2 = malloc(len);
    harness_fill(src, len, 1);
    assert_int_equal(ferry_register(e, src, len, 0), 0);
    assert_int_equal(ferry_register(e, src2, len, 0), 0);
    struct runner a = {.e = e, .peer = p.name, .src = src, .remote = p.addr};
    struct runner s = {.e = e, .peer = p.name, .src = src2, .remote = p.addr + len};
    pthread_t ta, ts;
    pthread_create(&ta, NULL, batch_loop, &a);
    pthread_create(&ts, NULL, sync_loop, &s);
    /* Let both get going, then kill the target in the middle of it. */
    for (int i = 0; i < 1000 && (atomic_load(&a.batches) < 1 || atomic_load(&s.batches) < 1); i++) usleep(10000);
    usleep(30000);
    uint64_t killed_at = harness_now_ms();
    peer_end(&p, SIGKILL);
    pthread_join(ta, NULL);
    pthread_join(ts, NULL);
    fprintf(stderr, "batch loop: %d done, then %s after %llu ms; sync loop: %d done, then %s after %llu ms\n",
            atomic_load(&a.batches), ferry_error_name(a.code), (unsigned long long)(a.failed_at - killed_at),
            atomic_load(&s.batches),
            ferry_error_name(s.code), (unsigned long long)(s.failed_at - killed_at));
    assert_true(atomic_load(&a.batches) >= 1 && atomic_load(&s.batches) >= 1);
    assert_true(is_link_error(a.code));
    assert_true(is_link_error(s.code));
    assert_int_equal(a.bad_states, 0);
    /* Within the deadline (with a second of slack for a loaded machine). */
    assert_true(a.failed_at - killed_at <= (uint64_t)timeout_ms + 1000);
    assert_true(s.failed_at - killed_at <= (uint64_t)timeout_ms + 1000);
    /* The session was torn down after the retry failed; the stats say so. */
    ferry_stats_t st;
    ferry_engine_stats(e, &st);
    assert_true(st.requests_failed >= 2);
    assert_true(st.session_teardowns >= 1);
    ferry_deregister(e, src);
    ferry_deregister(e, src2);
    ferry_engine_destroy(e);
    free(src);
    free(src2);
    /* No thread survives the engine. */
    assert_int_equal(wait_thread_count(base_threads, 3000), base_threads);
}

/* ------------------------------------------------ SIGSTOP */

static void stopped_peer_times_out(void **state)
{
    (void)state;
    int base_threads = thread_baseline();
    const int timeout_ms = 1000;
    ferry_engine_t *e = initiator(timeout_ms);
    peer_proc_t p;
    assert_int_equal(peer_spawn(&p, NULL, NULL, NULL), 0);
    unsigned char *buf = registered_buffer(e, p.len, 0);
    assert_int_equal(ferry_transfer_sync(e, p.name, FERRY_OP_WRITE, buf, p.addr, p.len), 0);
    harness_stop_process(p.pid);
    /* A sync write and an async batch, both on a link that went silent. */
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(e, 8, &b), 0);
    ferry_request_t reqs[8];
    for (int i = 0; i < 8; i++)
        reqs[i] = (ferry_request_t){FERRY_OP_READ, buf + (size_t)i * (p.len / 8), p.addr + (uint64_t)i * (p.len / 8), p.len / 8};
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_batch_submit(b, p.name, reqs, 8, 0), 0);
    int rc = ferry_transfer_sync(e, p.name, FERRY_OP_WRITE, buf, p.addr, p.len);
    uint64_t sync_ms = harness_now_ms() - t0;
    /* Bytes were in flight and a stopped target cannot confirm the fence:
     * CANCEL_UNCONFIRMED, cancel_timeout_ms after the deadline (cancel.h). */
    assert_true(rc == FERRY_ERR_TIMEOUT || rc == FERRY_ERR_CANCEL_UNCONFIRMED);
    int wrc = ferry_batch_wait(b, 3 * timeout_ms + CANCEL_MS);
    uint64_t batch_ms = harness_now_ms() - t0;
    fprintf(stderr, "stopped peer: sync TIMEOUT after %llu ms, batch %s after %llu ms\n", (unsigned long long)sync_ms,
            ferry_error_name(wrc), (unsigned long long)batch_ms);
    /* The requests' own deadlines ended them, not the wait's. */
    assert_true(wrc == FERRY_ERR_TIMEOUT || wrc == FERRY_ERR_CANCEL_UNCONFIRMED);
    assert_false(strstr(ferry_last_error_detail(), "still running"));
    for (int i = 0; i < 8; i++) {
        ferry_status_t st;
        ferry_batch_status(b, (size_t)i, &st);
        assert_true(st.state == FERRY_STATUS_TIMEOUT ||
                    (st.state == FERRY_STATUS_FAILED && st.code == FERRY_ERR_CANCEL_UNCONFIRMED));
    }
    assert_true(sync_ms >= (uint64_t)timeout_ms - 50 && sync_ms <= (uint64_t)timeout_ms + CANCEL_MS + 1000);
    assert_true(batch_ms <= 2 * (uint64_t)timeout_ms + 2 * CANCEL_MS + 1000);
    assert_int_equal(ferry_batch_free(b), 0);
    kill(p.pid, SIGCONT);
    /* Once it answers again, so does the session. */
    assert_int_equal(ferry_transfer_sync(e, p.name, FERRY_OP_WRITE, buf, p.addr, p.len), 0);
    peer_end(&p, SIGKILL);
    registered_buffer_free(e, buf);
    ferry_engine_destroy(e);
    assert_int_equal(wait_thread_count(base_threads, 3000), base_threads);
}

/* ------------------------------------------------ restart */

/* A notice to a peer that stopped answering ends by its own timeout (and
 * the fence's cancel_timeout_ms), not the engine's (long) default deadline: ferry_kv_send's failure notice
 * after a timed-out transfer relies on it. */
static void notify_to_stopped_peer_ends_by_its_timeout(void **state)
{
    (void)state;
    ferry_engine_t *e = initiator(30000);
    peer_proc_t p;
    assert_int_equal(peer_spawn(&p, NULL, NULL, NULL), 0);
    assert_int_equal(ferry_notify(e, p.name, "hello", 5), 0);
    harness_stop_process(p.pid);
    uint64_t t0 = harness_now_ms();
    int rc = ferry_notify_timeout(e, p.name, "late", 4, 300);
    uint64_t ms = harness_now_ms() - t0;
    fprintf(stderr, "notify to a stopped peer: %s after %llu ms\n", ferry_error_name(rc), (unsigned long long)ms);
    /* The notice's answer is missing: the fence cannot be confirmed by a
     * stopped peer either, so it may still be delivered when the peer
     * resumes (CANCEL_UNCONFIRMED, ferry.h ferry_notify). */
    assert_int_equal(rc, FERRY_ERR_CANCEL_UNCONFIRMED);
    assert_true(ms >= 250);
    assert_true(ms < 15000); /* far below the 30 s default it would have waited */
    kill(p.pid, SIGCONT);
    peer_end(&p, SIGKILL);
    ferry_engine_destroy(e);
}

static void restart_same_port(void **state)
{
    (void)state;
    ferry_engine_t *e = initiator(3000);
    peer_proc_t p1, p2;
    assert_int_equal(peer_spawn(&p1, NULL, NULL, NULL), 0);
    size_t len = p1.len;
    unsigned char *buf = registered_buffer(e, len, 0);
    harness_fill(buf, len, 100);
    assert_int_equal(ferry_transfer_sync(e, p1.name, FERRY_OP_WRITE, buf, p1.addr, len), 0);
    assert_int_equal(peer_cmd(&p1, "check 100 0 %zu", len), 0);

    /* The new process: same port, and its buffer at the old address if the
     * kernel lets it, so a write with the old address would land. */
    peer_restart_in_place(&p1, &p2);
    fprintf(stderr, "restarted peer: buffer %s address\n", p2.addr == p1.addr ? "at the same" : "at another");

    /* The call that finds the new epoch fails, with the epochs in the
     * detail, and writes nothing with the old process's addresses. */
    harness_fill(buf, len, 200);
    int rc = ferry_transfer_sync(e, p1.name, FERRY_OP_WRITE, buf, p1.addr, len);
    assert_int_equal(rc, FERRY_ERR_PEER_RESTARTED);
    assert_detail_contains("restarted");
    assert_detail_contains("next call");
    assert_int_equal(peer_cmd(&p2, "iszero 0 %zu", len), 0); /* nothing landed */
    ferry_stats_t st;
    ferry_engine_stats(e, &st);
    assert_int_equal(st.peer_restarts, 1);

    /* The session re-opens by itself (no ferry_session_open, no probe): the
     * next call learns the new epoch and segments, and works with the new
     * process's addresses. */
    assert_int_equal(ferry_transfer_sync(e, p2.name, FERRY_OP_WRITE, buf, p2.addr, len), 0);
    assert_int_equal(peer_cmd(&p2, "check 200 0 %zu", len), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(e, p2.name, &info), 0);
    char want[32], got[32];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)p2.epoch);
    snprintf(got, sizeof got, "%016llx", (unsigned long long)info.epoch);
    assert_string_equal(got, want);
    ferry_segment_t segs[4];
    assert_int_equal(ferry_session_segments(e, p2.name, segs, 4), 1);
    assert_int_equal(segs[0].addr, p2.addr);
    assert_int_equal(ferry_notify(e, p2.name, "x", 1), 0);
    assert_int_equal(peer_cmd(&p2, "fill 300"), 0);
    assert_int_equal(ferry_transfer_sync(e, p2.name, FERRY_OP_READ, buf, p2.addr, len), 0);
    assert_true(harness_check(buf, len, 300));
    ferry_engine_stats(e, &st);
    assert_int_equal(st.peer_restarts, 1);
    /* ferry_session_open, as before, is harmless. */
    assert_int_equal(ferry_session_open(e, p2.name), 0);
    assert_int_equal(ferry_transfer_sync(e, p2.name, FERRY_OP_READ, buf, p2.addr, len), 0);
    peer_session_end(e, &p2, buf);
}

/* ------------------------------------------------ (de)registration */

static void deregistration_is_seen(void **state)
{
    (void)state;
    ferry_engine_t *e = initiator(3000);
    peer_proc_t p;
    assert_int_equal(peer_spawn(&p, NULL, NULL, NULL), 0);
    unsigned char *buf = registered_buffer(e, 4096, 0);
    harness_fill(buf, 4096, 1);
    assert_int_equal(ferry_transfer_sync(e, p.name, FERRY_OP_WRITE, buf, p.addr, 4096), 0);
    ferry_peer_info_t before, after;
    assert_int_equal(ferry_session_info(e, p.name, &before), 0);

    /* Gone at the target: refused there, with the range named. */
    assert_int_equal(peer_cmd(&p, "dereg"), 0);
    assert_int_equal(peer_cmd(&p, "zero"), 0);
    int rc = ferry_transfer_sync(e, p.name, FERRY_OP_WRITE, buf, p.addr + 64, 4096);
    assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    char range[64];
    snprintf(range, sizeof range, "0x%llx+4096", (unsigned long long)(p.addr + 64));
    assert_detail_contains(range);
    assert_int_equal(peer_cmd(&p, "iszero 0 %llu", (unsigned long long)p.len), 0);
    /* Peers see the change in the segment version. */
    ferry_segment_t segs[2];
    assert_int_equal(ferry_session_segments(e, p.name, segs, 2), 0);
    assert_int_equal(ferry_session_info(e, p.name, &after), 0);
    assert_true(after.segment_version > before.segment_version);
    assert_int_equal(ferry_transfer_sync(e, p.name, FERRY_OP_WRITE, buf, p.addr, 4096), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("not in any region");

    /* Registered again at the same address (a new generation, after the
     * initiator learned the older one): the range is registered now, so
     * the first write lands. */
    assert_int_equal(peer_cmd(&p, "reg"), 0);
    assert_int_equal(ferry_session_segments(e, p.name, segs, 2), 1); /* learn the new one... */
    assert_int_equal(peer_cmd(&p, "dereg"), 0);
    assert_int_equal(peer_cmd(&p, "reg"), 0);                        /* ...registered again */
    rc = ferry_transfer_sync(e, p.name, FERRY_OP_WRITE, buf, p.addr, 4096);
    if (rc) fail_msg("write after re-registration: %s", ferry_last_error_detail());
    assert_int_equal(peer_cmd(&p, "check 1 0 4096"), 0);
    peer_session_end(e, &p, buf);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kill9_mid_transfer),
        cmocka_unit_test(stopped_peer_times_out),
        cmocka_unit_test(notify_to_stopped_peer_ends_by_its_timeout),
        cmocka_unit_test(restart_same_port),
        cmocka_unit_test(deregistration_is_seen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
