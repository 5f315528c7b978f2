/* SPDX-License-Identifier: Apache-2.0 */
/* Fencing a whole data connection (core/cancel.h): a stream whose
 * connection broke with many small pieces in flight is fenced by one
 * CANCEL naming the connection, so a plain batch of far more pieces than a
 * connection's cancel set holds (FERRY_CANCEL_CONN_MAX) ends TIMEOUT with
 * every piece fenced, not CANCEL_UNCONFIRMED; only the connection's own
 * peer engine can fence it; a target that predates connection fences gets
 * the per-id CANCELs.
 *
 * End to end, over a proxy that holds the link silent and delivers what it
 * held once released; frame by frame, with raw sockets, for the target
 * alone. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "link/cancel.h"
#include "engine/session.h"
#include "util/clock.h"
#include "link/conn.h"
#include "engine/testing.h"
#include "fault.h"
#include "harness.h"
#include "wire/wire.h"

#define LEN 16     /* bytes a piece */
#define RSTRIDE 32 /* the target's slots: every other 16 bytes stay clear */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------- end to end */

typedef struct pair {
    ferry_engine_t *initiator, *target;
    proxy_t *px;
    unsigned char *src, *dst;
    size_t n;
    ferry_request_t *reqs;
} pair_t;

/* Engines with a short deadline, the target behind a proxy; workers: the
 * initiator's worker threads (0: the default), which bound a batch's lanes. */
static pair_t *pair_new(size_t n, bool old_target, int workers)
{
    pair_t *p = calloc(1, sizeof *p);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 600;
    /* The fence of 10,000 pieces: TSan beside another test needed more than
     * 500 ms (its first attempt may spend a third of this on a pooled
     * connection the proxy holds: fence_leaves_a_stuck_pooled_connection). */
    cfg.cancel_timeout_ms = 3000;
    cfg.connect_timeout_ms = 5000;
    p->target = harness_engine_cfg(&cfg);
    if (workers) cfg.workers = workers;
    p->initiator = harness_engine_cfg(&cfg);
    if (old_target) ferry_test_set_no_conn_fence(p->target, true);
    p->n = n;
    p->src = malloc(n * LEN);
    p->dst = calloc(n, RSTRIDE);
    harness_fill(p->src, n * LEN, 7);
    assert_int_equal(ferry_register(p->initiator, p->src, n * LEN, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p->target, p->dst, n * RSTRIDE, FERRY_MEM_REMOTE), 0);
    p->px = proxy_start("127.0.0.1", ferry_engine_port(p->target), &(proxy_opts_t){0});
    assert_non_null(p->px);
    p->reqs = calloc(n, sizeof *p->reqs);
    for (size_t i = 0; i < n; i++)
        p->reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = p->src + i * LEN,
                                       .remote = (uint64_t)(uintptr_t)(p->dst + i * RSTRIDE), .len = LEN};
    return p;
}

static void pair_free(pair_t *p)
{
    ferry_engine_destroy(p->initiator);
    ferry_engine_destroy(p->target);
    proxy_stop(p->px);
    free(p->src);
    free(p->dst);
    free(p->reqs);
    free(p);
}

/* Opens the pooled connections through the proxy with a small batch, then
 * holds them silent. */
static void warm_and_hold(pair_t *p)
{
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, 64, &b), 0);
    assert_int_equal(ferry_batch_submit(b, proxy_name(p->px), p->reqs, 64, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 20000), 0);
    assert_int_equal(ferry_batch_free(b), 0);
    proxy_hold(p->px, true);
}

/* All n pieces as one plain batch over the silent link: the batch ends
 * TIMEOUT, every piece TIMEOUT or COMPLETED (fenced, its pages free).
 * Returns how many timed out. */
static size_t batch_over_silent_link(pair_t *p, size_t n)
{
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, n, &b), 0);
    assert_int_equal(ferry_batch_submit(b, proxy_name(p->px), p->reqs, n, 600), 0);
    int rc = ferry_batch_wait(b, 60000);
    size_t timed_out = 0, unconfirmed = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, i, &st), 0);
        if (st.state == FERRY_STATUS_TIMEOUT) timed_out++;
        else if (st.code == FERRY_ERR_CANCEL_UNCONFIRMED) unconfirmed++;
        else if (st.state != FERRY_STATUS_COMPLETED)
            fail_msg("request %zu ended %d (%s)", i, st.state, ferry_error_name(st.code));
    }
    print_message("%zu pieces over a silent link: %s; %zu timed out, %zu unconfirmed\n", n, ferry_error_name(rc),
                  timed_out, unconfirmed);
    assert_int_equal(unconfirmed, 0);
    assert_int_equal(rc, FERRY_ERR_TIMEOUT);
    assert_true(timed_out > 0);
    assert_int_equal(ferry_batch_free(b), 0);
    return timed_out;
}

/* Clears the target's slots, lets the held bytes through and writes piece
 * 0 behind them: no other byte may land. */
static void assert_nothing_lands_late(pair_t *p, size_t n)
{
    memset(p->dst, 0, n * RSTRIDE);
    proxy_hold(p->px, false);
    sleep_ms(300);
    assert_int_equal(ferry_transfer_sync(p->initiator, proxy_name(p->px), FERRY_OP_WRITE, p->src,
                                         (uint64_t)(uintptr_t)p->dst, LEN),
                     0);
    if (!harness_all_equal(p->dst + RSTRIDE, (n - 1) * RSTRIDE, 0))
        fail_msg("bytes of the timed-out batch landed after it returned");
}

/* 20,000 tiny pieces, some 10,000 in flight on each connection when the
 * link goes silent: more than a connection's cancel set holds, so fencing
 * them id by id was refused (CANCEL_UNCONFIRMED) before connections were
 * fenced whole. Now one CANCEL per connection: nothing in any set. */
#define MANY 20000
static void many_pieces_time_out_fenced(void **state)
{
    (void)state;
    pair_t *p = pair_new(MANY, false, 0);
    warm_and_hold(p);
    batch_over_silent_link(p, MANY);
    assert_int_equal(ferry_cancel_engine_count(p->target), 0);
    assert_nothing_lands_late(p, MANY);
    pair_free(p);
}

#define FEW 2000

/* An idle pooled connection that went silent with the link (the proxy
 * holds it as it holds the streams'): the first fence may take it, gets no
 * answer, and goes on over a fresh connection within its budget; every
 * piece is fenced (before: the whole budget went waiting on it, and the
 * pieces ended CANCEL_UNCONFIRMED). */
static void fence_leaves_a_stuck_pooled_connection(void **state)
{
    (void)state;
    pair_t *p = pair_new(FEW, false, 1); /* one worker: the batch runs on one connection of two */
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, 64, &b), 0);
    assert_int_equal(ferry_batch_submit(b, proxy_name(p->px), p->reqs, 64, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 20000), 0);
    assert_int_equal(ferry_batch_free(b), 0);
    ferry_session_t *s;
    assert_int_equal(ferry_session_get(p->initiator, proxy_name(p->px), &s), 0);
    ferry_conn_t *c[2];
    for (int i = 0; i < 2; i++) /* two connections in the pool, both idle */
        assert_int_equal(ferry_session_checkout_spare(s, ferry_deadline_after_ms(5000), i > 0, &c[i]), 0);
    for (int i = 0; i < 2; i++) ferry_session_checkin(s, c[i], true);
    pthread_mutex_lock(&s->lock);
    int idle = s->nidle;
    pthread_mutex_unlock(&s->lock);
    ferry_session_put(s);
    assert_int_equal(idle, 2);
    proxy_hold(p->px, true);
    batch_over_silent_link(p, FEW);
    assert_nothing_lands_late(p, FEW);
    pair_free(p);
}

/* A target that predates connection fences (no FERRY_HELLO_F_CONNFENCE):
 * the fence names every id in flight, as before; within the bound, every
 * piece fenced. */
static void old_target_gets_per_id_fences(void **state)
{
    (void)state;
    pair_t *p = pair_new(FEW, true, 0);
    warm_and_hold(p);
    batch_over_silent_link(p, FEW);
    size_t ids = ferry_cancel_engine_count(p->target);
    print_message("the old target holds %zu cancelled ids\n", ids);
    assert_true(ids > 0);
    assert_nothing_lands_late(p, FEW);
    pair_free(p);
}

/* How many unconfirmed fences the initiator's session to the proxy keeps. */
static size_t unfenced_kept(pair_t *p)
{
    ferry_session_t *s;
    assert_int_equal(ferry_session_get(p->initiator, proxy_name(p->px), &s), 0);
    pthread_mutex_lock(&s->lock);
    size_t n = s->nunfenced;
    pthread_mutex_unlock(&s->lock);
    ferry_session_put(s);
    return n;
}

/* The link stalls whole (the fence cannot pass either): the pieces end
 * CANCEL_UNCONFIRMED, and the session keeps one id per connection to fence
 * later, not every id (which overflowed its 4,096 and forgot connections);
 * once the link is back, the next call fences them. */
static void unconfirmed_connections_kept_once(void **state)
{
    (void)state;
    pair_t *p = pair_new(MANY, false, 0);
    warm_and_hold(p);
    proxy_hold(p->px, false);
    proxy_stall(p->px, true);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, MANY, &b), 0);
    assert_int_equal(ferry_batch_submit(b, proxy_name(p->px), p->reqs, MANY, 600), 0);
    int rc = ferry_batch_wait(b, 60000);
    size_t unconfirmed = 0;
    for (size_t i = 0; i < MANY; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, i, &st), 0);
        unconfirmed += st.code == FERRY_ERR_CANCEL_UNCONFIRMED;
    }
    assert_int_equal(ferry_batch_free(b), 0);
    size_t kept = unfenced_kept(p);
    print_message("stalled link: %s, %zu unconfirmed, %zu fence(s) kept\n", ferry_error_name(rc), unconfirmed, kept);
    assert_true(unconfirmed > 0);
    assert_true(kept >= 1 && kept <= 4);
    proxy_stall(p->px, false);
    assert_int_equal(ferry_transfer_sync(p->initiator, proxy_name(p->px), FERRY_OP_WRITE, p->src,
                                         (uint64_t)(uintptr_t)p->dst, LEN),
                     0);
    assert_int_equal(unfenced_kept(p), 0);
    pair_free(p);
}

/* ------------------------------------------------------ frame by frame */

/* A raw initiator that said HELLO as engine engine_id; *key gets the key
 * the target gave the connection, *flags the target's HELLO flags. */
static int hello_as(uint16_t port, uint64_t engine_id, uint64_t *key, uint32_t *flags)
{
    uint8_t ackbuf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    ferry_frame_t ack;
    int fd = raw_hello_as(port, engine_id, &ack, ackbuf, sizeof ackbuf);
    assert_int_equal(ack.type, FERRY_FRAME_HELLO_ACK);
    assert_int_equal(ack.status, 0);
    ferry_hello_t th;
    assert_int_equal(ferry_hello_decode(ackbuf, ack.plen, &th), 0);
    if (key) *key = ack.aux;
    if (flags) *flags = th.flags;
    return fd;
}

static ferry_frame_t conn_cancel(uint64_t req_id, uint64_t key)
{
    return (ferry_frame_t){.type = FERRY_FRAME_CANCEL, .flags = FERRY_FRAME_F_CONN, .req_id = req_id, .aux = key};
}

/* Only the connection's own peer fences it, and then every frame on it is
 * refused, whatever its id, with no cancel set; another peer naming it (it
 * would have to know its key) changes nothing; a key no connection has is
 * acked at once; key 0 is refused. */
static void conn_fence_scope(void **state)
{
    (void)state;
    ferry_engine_t *t = harness_engine(20000);
    size_t len = 64u << 10;
    unsigned char *dst = calloc(1, len), *src = malloc(len);
    memset(src, 0xcd, len);
    assert_int_equal(ferry_register(t, dst, len, FERRY_MEM_REMOTE), 0);
    uint16_t port = ferry_engine_port(t);
    uint64_t kdata, kctl, kother;
    uint32_t flags = 0;
    int data = hello_as(port, 42, &kdata, &flags), ctl = hello_as(port, 42, &kctl, NULL);
    int other = hello_as(port, 43, &kother, NULL);
    assert_true(flags & FERRY_HELLO_F_CONNFENCE);
    assert_true(kdata && kctl && kother && kdata != kctl);

    /* Peer 43 names peer 42's data connection: acked, no effect. */
    raw_send_frame(other, conn_cancel(5, kdata), NULL);
    ferry_frame_t a = raw_recv_frame(other, NULL, 0);
    assert_int_equal(a.type, FERRY_FRAME_CANCEL_ACK);
    assert_int_equal(a.req_id, 5);
    ferry_frame_t w = {.type = FERRY_FRAME_WRITE, .req_id = 5, .addr = (uint64_t)(uintptr_t)dst, .len = 4096,
                       .plen = 4096};
    raw_send_frame(data, w, src);
    assert_int_equal(raw_recv_frame(data, NULL, 0).status, 0);
    assert_int_equal(dst[0], 0xcd);

    /* A key no live connection has: acked at once. */
    raw_send_frame(ctl, conn_cancel(6, kdata ^ kctl ^ kother ^ 1), NULL);
    assert_int_equal(raw_recv_frame(ctl, NULL, 0).type, FERRY_FRAME_CANCEL_ACK);
    w.req_id = 6;
    w.addr += 4096;
    raw_send_frame(data, w, src);
    assert_int_equal(raw_recv_frame(data, NULL, 0).status, 0);

    /* Peer 42 fences its data connection: every later frame refused, ids
     * never named included; its other connection and peer 43's still land. */
    raw_send_frame(ctl, conn_cancel(7, kdata), NULL);
    a = raw_recv_frame(ctl, NULL, 0);
    assert_int_equal(a.type, FERRY_FRAME_CANCEL_ACK);
    assert_int_equal(a.req_id, 7);
    assert_int_equal(ferry_cancel_engine_count(t), 0);
    for (uint64_t id = 100; id < 103; id++) {
        w.req_id = id;
        w.addr = (uint64_t)(uintptr_t)dst + 2 * 4096 + (id - 100) * 4096;
        raw_send_frame(data, w, src);
        assert_int_equal(raw_recv_frame(data, NULL, 0).status, FERRY_ERR_CANCELLED);
    }
    assert_true(harness_all_equal(dst + 2 * 4096, 3 * 4096, 0));
    w.req_id = 200;
    w.addr = (uint64_t)(uintptr_t)dst + 8 * 4096;
    raw_send_frame(ctl, w, src);
    assert_int_equal(raw_recv_frame(ctl, NULL, 0).status, 0);
    w.addr += 4096;
    raw_send_frame(other, w, src);
    assert_int_equal(raw_recv_frame(other, NULL, 0).status, 0);

    /* Key 0 names no connection: refused, the connection dropped. */
    raw_send_frame(other, conn_cancel(8, 0), NULL);
    ferry_frame_t no = raw_recv_frame(other, NULL, 0);
    assert_int_equal(no.type, FERRY_FRAME_ERROR);
    assert_int_equal(no.status, FERRY_ERR_MALFORMED_FRAME);

    close(data);
    close(ctl);
    close(other);
    ferry_engine_destroy(t);
    free(dst);
    free(src);
}

/* An engine acting as an older one does not advertise the fence. */
static void old_target_does_not_advertise(void **state)
{
    (void)state;
    ferry_engine_t *t = harness_engine(20000);
    ferry_test_set_no_conn_fence(t, true);
    uint32_t flags = 0;
    int fd = hello_as(ferry_engine_port(t), 42, NULL, &flags);
    assert_false(flags & FERRY_HELLO_F_CONNFENCE);
    close(fd);
    ferry_engine_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(conn_fence_scope),
        cmocka_unit_test(old_target_does_not_advertise),
        cmocka_unit_test(many_pieces_time_out_fenced),
        cmocka_unit_test(fence_leaves_a_stuck_pooled_connection),
        cmocka_unit_test(old_target_gets_per_id_fences),
        cmocka_unit_test(unconfirmed_connections_kept_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
