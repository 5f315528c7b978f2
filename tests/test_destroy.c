/* SPDX-License-Identifier: Apache-2.0 */
/* ferry_engine_destroy while other threads are blocked in calls to a peer
 * that stopped answering (issue 15, item 5): the calls are woken and fail
 * with CONTEXT, or CANCEL_UNCONFIRMED when bytes were on the wire and the
 * stopped target cannot confirm; destroy frees nothing before they all
 * returned (ASan and TSan would see it), and no call outlives its deadline.
 * The stopped target is a delay proxy that moves no byte any more while it
 * still accepts connections, as a kernel does for a SIGSTOPped process. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "delay_proxy.h"
#include "harness.h"

#define TIMEOUT_MS 20000
#define CANCEL_TIMEOUT_MS 1000
#define LEN (32u << 20)

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct rig {
    ferry_engine_t *initiator, *target;
    delay_proxy_t *proxy;
    const char *peer;
    unsigned char *src, *dst;
} rig_t;

static void rig_up_fence(rig_t *r, const char *transport, int conns, int cancel_timeout_ms)
{
    memset(r, 0, sizeof *r);
    r->target = harness_engine(TIMEOUT_MS);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = transport;
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.connect_timeout_ms = TIMEOUT_MS; /* a handshake could outlast destroy only by being waited for */
    cfg.cancel_timeout_ms = cancel_timeout_ms;
    cfg.conns_per_peer = conns;
    cfg.workers = 2;
    r->initiator = harness_engine_cfg(&cfg);
    r->proxy = delay_proxy_start(ferry_engine_port(r->target), 5, 16u << 20);
    r->peer = delay_proxy_name(r->proxy);
    r->src = malloc(LEN);
    r->dst = calloc(1, LEN);
    assert_non_null(r->src);
    assert_non_null(r->dst);
    harness_fill(r->src, LEN, 5);
    assert_int_equal(ferry_register(r->initiator, r->src, LEN, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(r->target, r->dst, LEN, FERRY_MEM_REMOTE), 0);
}

static void rig_up(rig_t *r, const char *transport, int conns)
{
    rig_up_fence(r, transport, conns, CANCEL_TIMEOUT_MS);
}

static void rig_down(rig_t *r)
{
    delay_proxy_stop(r->proxy);
    ferry_engine_destroy(r->target);
    free(r->src);
    free(r->dst);
}

enum call { SYNC_WRITE, SESSION_OPEN, PING };

typedef struct caller {
    rig_t *r;
    enum call what;
    int rc;
    char detail[512];
    uint64_t started_ms, returned_ms;
    atomic_bool returned;
} caller_t;

static void *call_main(void *arg)
{
    caller_t *c = arg;
    rig_t *r = c->r;
    c->started_ms = harness_now_ms();
    uint64_t rtt;
    switch (c->what) {
    case SYNC_WRITE:
        c->rc = ferry_transfer_sync(r->initiator, r->peer, FERRY_OP_WRITE, r->src, (uint64_t)(uintptr_t)r->dst, LEN);
        break;
    case SESSION_OPEN: c->rc = ferry_session_open(r->initiator, r->peer); break;
    case PING: c->rc = ferry_session_ping(r->initiator, r->peer, &rtt); break;
    }
    snprintf(c->detail, sizeof c->detail, "%s", ferry_last_error_detail());
    c->returned_ms = harness_now_ms();
    atomic_store(&c->returned, true);
    return NULL;
}

/* Destroys the initiator while c is blocked; checks how c ended. */
static void destroy_under(rig_t *r, caller_t *c, pthread_t t, bool bytes_on_the_wire)
{
    sleep_ms(300); /* blocked by now; if not yet, it starts against a stopping engine */
    if (atomic_load(&c->returned)) fail_msg("the call returned before destroy: %s", c->detail);
    /* Freeing under the call would show under ASan or TSan. */
    ferry_engine_destroy(r->initiator);
    r->initiator = NULL;
    pthread_join(t, NULL);
    printf("blocked call: %s after %llu ms: %s\n", ferry_error_name(c->rc),
           (unsigned long long)(c->returned_ms - c->started_ms), c->detail);
    if (bytes_on_the_wire)
        assert_true(c->rc == FERRY_ERR_CONTEXT || c->rc == FERRY_ERR_CANCEL_UNCONFIRMED);
    else
        assert_int_equal(c->rc, FERRY_ERR_CONTEXT);
    /* What the header promises: by its deadline plus the fence's time. */
    assert_true(c->returned_ms - c->started_ms < TIMEOUT_MS + CANCEL_TIMEOUT_MS);
}

/* A sync write striped over two connections (the caller's thread and a
 * worker), blocked mid-way on a target that stopped. */
static void destroy_during_a_blocked_sync_write(void **state)
{
    (void)state;
    rig_t r;
    rig_up(&r, "tcp", 2);
    assert_int_equal(ferry_session_open(r.initiator, r.peer), 0);
    caller_t c = {.r = &r, .what = SYNC_WRITE};
    pthread_t t;
    pthread_create(&t, NULL, call_main, &c);
    uint64_t until = harness_now_ms() + 20000;
    while (delay_proxy_bytes_to_target(r.proxy) < (2u << 20) && harness_now_ms() < until) sleep_ms(5);
    delay_proxy_stall(r.proxy, true);
    destroy_under(&r, &c, t, true);
    rig_down(&r);
}

/* The same over the default transport (shm between engines of one host:
 * the target pulls, only the frames cross the stopped link). */
static void destroy_during_a_blocked_sync_write_default_transport(void **state)
{
    (void)state;
    rig_t r;
    rig_up(&r, "auto", 1);
    assert_int_equal(ferry_session_open(r.initiator, r.peer), 0);
    delay_proxy_stall(r.proxy, true);
    caller_t c = {.r = &r, .what = SYNC_WRITE};
    pthread_t t;
    pthread_create(&t, NULL, call_main, &c);
    destroy_under(&r, &c, t, true);
    rig_down(&r);
}

/* A first call, blocked in the handshake: nothing was sent, CONTEXT. */
static void destroy_during_a_blocked_handshake(void **state)
{
    (void)state;
    rig_t r;
    rig_up(&r, "tcp", 1);
    delay_proxy_stall(r.proxy, true);
    caller_t c = {.r = &r, .what = SESSION_OPEN};
    pthread_t t;
    pthread_create(&t, NULL, call_main, &c);
    destroy_under(&r, &c, t, false);
    rig_down(&r);
}

/* A ping waiting for its answer, and a second caller waiting for the only
 * connection, which the first holds. */
static void destroy_during_a_ping_and_a_wait_for_its_connection(void **state)
{
    (void)state;
    rig_t r;
    rig_up(&r, "tcp", 1);
    assert_int_equal(ferry_session_open(r.initiator, r.peer), 0);
    delay_proxy_stall(r.proxy, true);
    caller_t a = {.r = &r, .what = PING}, b = {.r = &r, .what = PING};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, call_main, &a);
    sleep_ms(100);
    pthread_create(&tb, NULL, call_main, &b);
    sleep_ms(300);
    assert_false(atomic_load(&a.returned));
    assert_false(atomic_load(&b.returned));
    ferry_engine_destroy(r.initiator);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.rc, FERRY_ERR_CONTEXT);
    assert_int_equal(b.rc, FERRY_ERR_CONTEXT);
    rig_down(&r);
}

/* An async batch blocked in a worker: destroy does not wait for its
 * deadline; the batch ends and can be freed. */
static void destroy_during_a_blocked_batch(void **state)
{
    (void)state;
    rig_t r;
    rig_up(&r, "tcp", 1);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(r.initiator, 1, &b), 0);
    ferry_request_t req = {FERRY_OP_WRITE, r.src, (uint64_t)(uintptr_t)r.dst, LEN};
    assert_int_equal(ferry_batch_submit(b, r.peer, &req, 1, 0), 0);
    uint64_t until = harness_now_ms() + 20000;
    while (delay_proxy_bytes_to_target(r.proxy) < (2u << 20) && harness_now_ms() < until) sleep_ms(5);
    delay_proxy_stall(r.proxy, true);
    sleep_ms(300);
    uint64_t t0 = harness_now_ms();
    ferry_engine_destroy(r.initiator);
    uint64_t took = harness_now_ms() - t0;
    ferry_status_t st;
    assert_int_equal(ferry_batch_status(b, 0, &st), 0);
    printf("blocked batch: state %d, %s, destroy took %llu ms\n", st.state, ferry_error_name(st.code),
           (unsigned long long)took);
    assert_int_equal(st.state, FERRY_STATUS_FAILED);
    assert_true(st.code == FERRY_ERR_CONTEXT || st.code == FERRY_ERR_CANCEL_UNCONFIRMED);
    assert_true(took < TIMEOUT_MS);
    assert_int_equal(ferry_batch_free(b), 0);
    rig_down(&r);
}

static void *destroy_main(void *arg)
{
    ferry_engine_destroy(arg);
    return NULL;
}

/* A call that starts while destroy waits for a blocked one (its fence
 * cannot be confirmed for 5 s) fails with CONTEXT at once. */
static void call_started_during_destroy_gets_context(void **state)
{
    (void)state;
    rig_t r;
    rig_up_fence(&r, "tcp", 1, 5000);
    assert_int_equal(ferry_session_open(r.initiator, r.peer), 0);
    caller_t c = {.r = &r, .what = SYNC_WRITE};
    pthread_t t, d;
    pthread_create(&t, NULL, call_main, &c);
    uint64_t until = harness_now_ms() + 20000;
    while (delay_proxy_bytes_to_target(r.proxy) < (2u << 20) && harness_now_ms() < until) sleep_ms(5);
    delay_proxy_stall(r.proxy, true);
    sleep_ms(200);
    pthread_create(&d, NULL, destroy_main, r.initiator);
    sleep_ms(200); /* destroy began; it cannot end before the fence gives up (5 s) */
    uint64_t rtt;
    assert_false(atomic_load(&c.returned));
    assert_int_equal(ferry_session_ping(r.initiator, r.peer, &rtt), FERRY_ERR_CONTEXT);
    assert_detail_contains("shutting down");
    pthread_join(d, NULL);
    pthread_join(t, NULL);
    assert_true(c.rc == FERRY_ERR_CONTEXT || c.rc == FERRY_ERR_CANCEL_UNCONFIRMED);
    rig_down(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(destroy_during_a_blocked_sync_write),
        cmocka_unit_test(destroy_during_a_blocked_sync_write_default_transport),
        cmocka_unit_test(destroy_during_a_blocked_handshake),
        cmocka_unit_test(destroy_during_a_ping_and_a_wait_for_its_connection),
        cmocka_unit_test(destroy_during_a_blocked_batch),
        cmocka_unit_test(call_started_during_destroy_gets_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
