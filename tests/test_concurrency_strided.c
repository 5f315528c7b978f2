/* SPDX-License-Identifier: Apache-2.0 */
/* Strided batches and the event loop under 8 threads sharing one engine
 * (the promise of ferry.h: every call is thread-safe), under ASan and TSan:
 *  - strided sync and async (ferry_strided_transfer_sync,
 *    ferry_batch_submit_strided) to one peer and to several, each thread in
 *    its own band of pages, read back and compared; mixed with sessions
 *    closed under them and regions deregistered and registered again under
 *    strided transfers that use them, on both sides;
 *  - a target engine destroyed while strided calls to it run: they end with
 *    a code naming the lost peer, never a hang or a crash, and the calls to
 *    the other targets go on succeeding;
 *  - connections that handshake and ping one byte at a time, or hang up
 *    half-way, opening and closing all the while, next to strided transfers
 *    served by the same event loop.
 * Bounds are iteration counts, never clocks; every call ends by its
 * deadline (config.timeout_ms), so a hang fails as a TIMEOUT. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/testing.h"
#include "fault.h"
#include "harness.h"

#define THREADS 8
#define TARGETS 3
#define PIECE 1024
#define BAND 64 /* pages per thread; 7 * j % BAND is a permutation */
#define ITERS 30
#define TIMEOUT_MS 10000

typedef struct world {
    ferry_engine_t *ini, *tgt[TARGETS];
    char peer[TARGETS][300];
    atomic_bool gone[TARGETS];   /* destroyed on purpose: its errors are expected */
    unsigned char *src, *back;   /* initiator: THREADS bands each */
    unsigned char *dst[TARGETS]; /* each target: THREADS bands */
    int targets;                 /* how many the workers use */
    bool close_sessions, churn;
    /* Register churn: one thread deregisters and registers these again
     * while another moves strided pieces between them. */
    unsigned char *priv, *tpriv;
    atomic_bool churn_done;
    atomic_int errors;
    atomic_long ops, lost; /* lost: calls to a destroyed target that failed */
} world_t;

typedef struct worker {
    world_t *w;
    int id;
    unsigned seed;
} worker_t;

static unsigned next_rand(worker_t *k)
{
    k->seed = k->seed * 1103515245u + 12345u;
    return k->seed >> 16;
}

static size_t band_bytes(void) { return (size_t)THREADS * BAND * PIECE; }

static void world_open(world_t *w, int targets)
{
    memset(w, 0, sizeof *w);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.connect_timeout_ms = TIMEOUT_MS / 2;
    w->targets = targets;
    w->ini = harness_engine_cfg(&cfg);
    w->src = calloc(1, band_bytes());
    w->back = calloc(1, band_bytes());
    assert_int_equal(ferry_register(w->ini, w->src, band_bytes(), FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(w->ini, w->back, band_bytes(), FERRY_MEM_LOCAL), 0);
    for (int t = 0; t < targets; t++) {
        w->tgt[t] = harness_engine_cfg(&cfg);
        snprintf(w->peer[t], sizeof w->peer[t], "%s", ferry_engine_name(w->tgt[t]));
        w->dst[t] = calloc(1, band_bytes());
        assert_int_equal(ferry_register(w->tgt[t], w->dst[t], band_bytes(), FERRY_MEM_REMOTE), 0);
    }
}

static void world_close(world_t *w)
{
    ferry_engine_destroy(w->ini);
    for (int t = 0; t < w->targets; t++) {
        if (w->tgt[t]) ferry_engine_destroy(w->tgt[t]);
        free(w->dst[t]);
    }
    free(w->src);
    free(w->back);
    free(w->priv);
    free(w->tpriv);
}

static void run_threads(world_t *w, void *(*fn)(void *))
{
    pthread_t t[THREADS];
    worker_t k[THREADS];
    for (int i = 0; i < THREADS; i++) {
        k[i] = (worker_t){w, i, (unsigned)i * 2654435761u + 7};
        assert_int_equal(pthread_create(&t[i], NULL, fn, &k[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
}

/* 0 or a code this race may produce: a session closed by another thread
 * under the call; or any failure of a call to a target destroyed on
 * purpose (counted). Anything else is an error. */
static bool expect_ok(worker_t *k, const char *what, int t, long rc)
{
    world_t *w = k->w;
    if (rc >= 0) return true;
    if (w->close_sessions && rc == FERRY_ERR_SESSION_INVALID) return false;
    if (atomic_load(&w->gone[t])) {
        /* Its connection closed, or refused when dialled again, or the
         * session invalidated: the detail names the peer. */
        if ((rc == FERRY_ERR_PEER_CLOSED || rc == FERRY_ERR_SOCKET || rc == FERRY_ERR_SESSION_INVALID ||
             rc == FERRY_ERR_CANCEL_UNCONFIRMED || rc == FERRY_ERR_ENDPOINT) &&
            strstr(ferry_last_error_detail(), w->peer[t])) {
            /* The first of them shows what a caller reads. */
            if (atomic_fetch_add(&w->lost, 1) == 0)
                fprintf(stderr, "first call to the destroyed target: %s: %s\n", ferry_error_name((int)rc),
                        ferry_last_error_detail());
            return false;
        }
    }
    fprintf(stderr, "thread %d: %s to target %d: %ld (%s) %s\n", k->id, what, t, rc, ferry_error_name((int)rc),
            ferry_last_error_detail());
    atomic_fetch_add(&w->errors, 1);
    return false;
}

/* n pieces of this thread's band: local page j to remote page 7j mod BAND,
 * written then read back into `back` and compared. async: through a batch
 * of this thread's, else the sync call. */
static void strided_round(worker_t *k, int t, uint64_t round, bool async)
{
    world_t *w = k->w;
    size_t n = 8 + next_rand(k) % (BAND - 8);
    uint64_t lidx[BAND], ridx[BAND];
    uint64_t first = (uint64_t)k->id * BAND;
    for (size_t j = 0; j < n; j++) {
        lidx[j] = first + j;
        ridx[j] = first + (j * 7 + round) % BAND;
    }
    unsigned char *mine = w->src + first * PIECE;
    harness_fill(mine, n * PIECE, round * 131 + (uint64_t)k->id);
    ferry_strided_t d = {.opcode = FERRY_OP_WRITE, .local_base = w->src, .local_stride = PIECE,
                         .remote_base = (uint64_t)(uintptr_t)w->dst[t], .remote_stride = PIECE, .piece_len = PIECE,
                         .local_idx = lidx, .remote_idx = ridx, .n = n};
    ferry_strided_t r = d;
    r.opcode = FERRY_OP_READ;
    r.local_base = w->back;
    memset(w->back + first * PIECE, 0, n * PIECE);
    if (async) {
        ferry_batch_t *b;
        assert_int_equal(ferry_batch_alloc(w->ini, 2 * BAND, &b), 0);
        long rc = ferry_batch_submit_strided(b, w->peer[t], &d, 0);
        if (expect_ok(k, "strided submit (write)", t, rc)) rc = ferry_batch_wait(b, -1);
        bool ok = expect_ok(k, "strided batch (write)", t, rc);
        if (ok) {
            rc = ferry_batch_submit_strided(b, w->peer[t], &r, 0);
            if (expect_ok(k, "strided submit (read)", t, rc)) {
                assert_int_equal(rc, (long)n); /* numbered on after the writes */
                rc = ferry_batch_wait(b, -1);
            }
            ok = expect_ok(k, "strided batch (read)", t, rc);
        }
        for (size_t i = 0; ok && i < 2 * n; i++) {
            ferry_status_t st;
            assert_int_equal(ferry_batch_status(b, i, &st), 0);
            assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
        }
        assert_int_equal(ferry_batch_free(b), 0);
        if (!ok) return;
    } else {
        if (!expect_ok(k, "strided write", t, ferry_strided_transfer_sync(w->ini, w->peer[t], &d))) return;
        if (!expect_ok(k, "strided read", t, ferry_strided_transfer_sync(w->ini, w->peer[t], &r))) return;
    }
    if (memcmp(w->back + first * PIECE, mine, n * PIECE) != 0) {
        fprintf(stderr, "thread %d: %zu strided pieces read back wrong from target %d\n", k->id, n, t);
        atomic_fetch_add(&w->errors, 1);
    }
}

/* Deregisters and registers the private regions again, both sides. */
static void churn_regions(worker_t *k)
{
    world_t *w = k->w;
    for (int i = 0; i < ITERS * 2; i++) {
        assert_int_equal(ferry_deregister(w->tgt[0], w->tpriv), 0);
        sched_yield();
        assert_int_equal(ferry_register(w->tgt[0], w->tpriv, BAND * PIECE, FERRY_MEM_REMOTE), 0);
        assert_int_equal(ferry_deregister(w->ini, w->priv), 0);
        sched_yield();
        assert_int_equal(ferry_register(w->ini, w->priv, BAND * PIECE, FERRY_MEM_LOCAL), 0);
    }
    atomic_store(&w->churn_done, true);
}

/* Strided writes from priv into tpriv while churn_regions runs: each
 * completes or is refused for the region it found missing or changed. */
static void strided_into_churn(worker_t *k)
{
    world_t *w = k->w;
    long landed = 0;
    for (uint64_t i = 0; !atomic_load(&w->churn_done) || i < ITERS; i++) {
        ferry_strided_t d = {.opcode = (i & 1) ? FERRY_OP_READ : FERRY_OP_WRITE, .local_base = w->priv,
                             .local_stride = 2 * PIECE, .remote_base = (uint64_t)(uintptr_t)w->tpriv,
                             .remote_stride = PIECE, .piece_len = PIECE, .n = BAND / 2};
        int rc = ferry_strided_transfer_sync(w->ini, w->peer[0], &d);
        if (rc == 0) landed++;
        else if (rc != FERRY_ERR_ADDRESS_NOT_REGISTERED && rc != FERRY_ERR_STALE_SEGMENT &&
                 !(w->close_sessions && rc == FERRY_ERR_SESSION_INVALID)) {
            fprintf(stderr, "thread %d: strided into churned regions: %d (%s) %s\n", k->id, rc, ferry_error_name(rc),
                    ferry_last_error_detail());
            atomic_fetch_add(&w->errors, 1);
        }
    }
    fprintf(stderr, "strided into churned regions: %ld landed\n", landed);
}

static void *strided_worker(void *arg)
{
    worker_t *k = arg;
    world_t *w = k->w;
    if (w->churn && k->id == 0) {
        churn_regions(k);
        return NULL;
    }
    if (w->churn && k->id == 1) {
        strided_into_churn(k);
        return NULL;
    }
    for (uint64_t i = 0; i < ITERS; i++) {
        int t = (int)((i + (uint64_t)k->id) % (uint64_t)w->targets);
        if (w->close_sessions && k->id == 2 && i % 3 == 0) {
            int rc = ferry_session_close(w->ini, w->peer[t]);
            if (rc != 0 && rc != FERRY_ERR_NOT_FOUND) expect_ok(k, "session close", t, rc);
        }
        strided_round(k, t, i, next_rand(k) % 2);
        atomic_fetch_add(&w->ops, 1);
    }
    return NULL;
}

static void strided_hammer(int targets, bool close_sessions, bool churn)
{
    world_t w;
    world_open(&w, targets);
    w.close_sessions = close_sessions;
    w.churn = churn;
    if (churn) {
        w.priv = calloc(BAND, PIECE);
        w.tpriv = calloc(BAND, PIECE);
        assert_int_equal(ferry_register(w.ini, w.priv, BAND * PIECE, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_register(w.tgt[0], w.tpriv, BAND * PIECE, FERRY_MEM_REMOTE), 0);
    }
    run_threads(&w, strided_worker);
    fprintf(stderr, "%d target(s)%s%s: %ld strided rounds\n", targets, close_sessions ? ", sessions closed" : "",
            churn ? ", regions churned" : "", atomic_load(&w.ops));
    assert_int_equal(atomic_load(&w.errors), 0);
    world_close(&w);
}

static void strided_one_peer(void **state)
{
    (void)state;
    strided_hammer(1, false, false);
}

static void strided_several_peers(void **state)
{
    (void)state;
    strided_hammer(TARGETS, false, false);
}

static void strided_with_session_close_and_churn(void **state)
{
    (void)state;
    strided_hammer(TARGETS, true, true);
}

/* ------------------------------------------- a target destroyed under them */

typedef struct destroyer {
    world_t *w;
    long after_ops;
} destroyer_t;

/* The workers run on; once they did after_ops rounds, the last target's
 * engine is destroyed under the calls in flight to it. */
static void target_destroyed_under_strided(void **state)
{
    (void)state;
    world_t w;
    world_open(&w, TARGETS);
    pthread_t t[THREADS];
    worker_t k[THREADS];
    for (int i = 0; i < THREADS; i++) {
        k[i] = (worker_t){&w, i, (unsigned)i * 2654435761u + 7};
        assert_int_equal(pthread_create(&t[i], NULL, strided_worker, &k[i]), 0);
    }
    while (atomic_load(&w.ops) < THREADS * ITERS / 4) sched_yield();
    atomic_store(&w.gone[TARGETS - 1], true); /* before the destroy: its calls may fail from now on */
    ferry_engine_destroy(w.tgt[TARGETS - 1]);
    w.tgt[TARGETS - 1] = NULL;
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    fprintf(stderr, "target destroyed after %d rounds: %ld rounds in all, %ld calls to it failed\n",
            THREADS * ITERS / 4, atomic_load(&w.ops), atomic_load(&w.lost));
    assert_int_equal(atomic_load(&w.errors), 0);
    assert_true(atomic_load(&w.lost) > 0); /* the destroy was seen */
    world_close(&w);
}

/* ---------------------------- byte-by-byte handshakes next to transfers */

static void pause_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* Sends n bytes one at a time; false when the target closed meanwhile. */
static bool send_slowly(int fd, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (raw_send_bytes(fd, p + i, 1) != 0) return false;
        pause_us(100);
    }
    return true;
}

/* A HELLO frame, header and payload, in out; its length. */
static size_t hello_bytes(uint8_t *out, int id)
{
    ferry_hello_t h;
    memset(&h, 0, sizeof h);
    h.proto_min = h.proto_max = FERRY_PROTOCOL_VERSION;
    h.engine_id = 0x7700 + (uint64_t)id;
    h.epoch = 1;
    h.pid = 1;
    snprintf(h.name, sizeof h.name, "slow:%d", id);
    int n = ferry_hello_encode(&h, out + FERRY_FRAME_HEADER_SIZE, FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME);
    assert_true(n > 0);
    ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n};
    ferry_frame_encode(&f, out);
    return FERRY_FRAME_HEADER_SIZE + (size_t)n;
}

/* Opens connections to target 0 and handshakes and pings on them one byte
 * at a time; every third one hangs up half-way through its HELLO. */
static void slow_handshakes(worker_t *k)
{
    world_t *w = k->w;
    uint16_t port = ferry_engine_port(w->tgt[0]);
    for (int i = 0; i < ITERS / 3; i++) {
        int fd = raw_connect(port);
        if (fd < 0) {
            fprintf(stderr, "thread %d: connect failed\n", k->id);
            atomic_fetch_add(&w->errors, 1);
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        uint8_t msg[FERRY_FRAME_HEADER_SIZE + FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
        size_t n = hello_bytes(msg, k->id * 100 + i);
        bool hang_up = i % 3 == 2;
        bool sent = send_slowly(fd, msg, hang_up ? n / 2 : n);
        if (!hang_up) {
            ferry_frame_t f;
            uint8_t ack[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
            int rc = sent ? raw_recv(fd, &f, ack, sizeof ack, TIMEOUT_MS) : -1;
            bool ok = rc == 0 && f.type == FERRY_FRAME_HELLO_ACK && f.status == 0;
            if (ok) {
                f = (ferry_frame_t){.type = FERRY_FRAME_PING, .req_id = 500 + (uint64_t)i};
                uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
                ferry_frame_encode(&f, hdr);
                ok = send_slowly(fd, hdr, sizeof hdr) && raw_recv(fd, &f, NULL, 0, TIMEOUT_MS) == 0 &&
                     f.type == FERRY_FRAME_PONG && f.req_id == 500 + (uint64_t)i;
            }
            if (!ok) {
                fprintf(stderr, "thread %d: slow handshake %d failed (rc %d)\n", k->id, i, rc);
                atomic_fetch_add(&w->errors, 1);
            }
        }
        close(fd);
    }
}

static void *mixed_worker(void *arg)
{
    worker_t *k = arg;
    if (k->id % 2) {
        slow_handshakes(k);
        return NULL;
    }
    for (uint64_t i = 0; i < ITERS; i++) {
        strided_round(k, 0, i, i % 2);
        atomic_fetch_add(&k->w->ops, 1);
    }
    return NULL;
}

static void slow_handshakes_next_to_strided(void **state)
{
    (void)state;
    world_t w;
    setenv("FERRY_SERVE_THREADS", "3", 1); /* fewer threads than slow peers */
    world_open(&w, 1);
    unsetenv("FERRY_SERVE_THREADS");
    run_threads(&w, mixed_worker);
    assert_int_equal(atomic_load(&w.errors), 0);
    assert_int_equal(atomic_load(&w.ops), THREADS / 2 * ITERS);
    world_close(&w);
}

/* ------------------------------- engine destroy under a blocked strided call */

typedef struct blocked_call {
    ferry_engine_t *e;
    ferry_batch_t *b; /* NULL: the sync call */
    char peer[64];
    void *local;
    long rc;
    atomic_bool returned;
} blocked_call_t;

static void *blocked_strided_main(void *arg)
{
    blocked_call_t *c = arg;
    ferry_strided_t d = {.opcode = FERRY_OP_WRITE, .local_base = c->local, .local_stride = PIECE,
                         .remote_base = 1u << 20, .remote_stride = PIECE, .piece_len = PIECE, .n = 4};
    c->rc = c->b ? ferry_batch_submit_strided(c->b, c->peer, &d, 0) : ferry_strided_transfer_sync(c->e, c->peer, &d);
    atomic_store(&c->returned, true);
    return NULL;
}

/* A peer that accepts connections (the kernel's backlog) and never says a
 * word: a handshake with it blocks until connect_timeout_ms. */
static int silent_listener(char *name, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 8), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    snprintf(name, cap, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    return fd;
}

/* ferry_engine_destroy while a strided call is blocked in the handshake
 * its bounds check opens (the peer's segments): the call is woken and
 * fails with CONTEXT, and destroy frees nothing before it returned.
 * ferry_batch_submit_strided checked the bounds before it entered the
 * engine, so destroy neither woke nor waited for it and freed the engine
 * under it (seen here as a blocked call the engine did not count). */
static void destroy_during_a_blocked_strided_call(bool async)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 20000;
    cfg.connect_timeout_ms = 20000;
    blocked_call_t c = {.e = harness_engine_cfg(&cfg)};
    int silent = silent_listener(c.peer, sizeof c.peer);
    c.local = calloc(4, PIECE);
    assert_int_equal(ferry_register(c.e, c.local, 4 * PIECE, FERRY_MEM_LOCAL), 0);
    if (async) assert_int_equal(ferry_batch_alloc(c.e, 4, &c.b), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, blocked_strided_main, &c), 0);
    pause_us(300 * 1000); /* blocked by now; if not yet, it starts against a stopping engine */
    assert_false(atomic_load(&c.returned));
    /* Counted among the engine's calls, so that destroy wakes it and waits. */
    assert_int_equal(ferry_test_calls(c.e), 1);
    uint64_t t0 = harness_now_ms();
    ferry_engine_destroy(c.e);
    bool returned_before_destroy_did = atomic_load(&c.returned);
    pthread_join(t, NULL);
    printf("blocked strided %s: %s after destroy began %llu ms before\n", async ? "submit" : "sync",
           ferry_error_name((int)c.rc), (unsigned long long)(harness_now_ms() - t0));
    assert_int_equal(c.rc, FERRY_ERR_CONTEXT);
    assert_true(returned_before_destroy_did); /* destroy waited for it */
    if (c.b) assert_int_equal(ferry_batch_free(c.b), 0);
    close(silent);
    free(c.local);
}

static void destroy_during_a_blocked_strided_submit(void **state)
{
    (void)state;
    destroy_during_a_blocked_strided_call(true);
}

static void destroy_during_a_blocked_strided_sync(void **state)
{
    (void)state;
    destroy_during_a_blocked_strided_call(false);
}

/* THREADS strided calls, half sync and half submits of batches of their
 * own, all blocked behind the handshake with a silent peer, counted by the
 * engine (a bound in iterations, not time), then destroy: every one ends
 * with CONTEXT before destroy returns. */
static void destroy_under_many_blocked_strided_calls(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 20000;
    cfg.connect_timeout_ms = 20000;
    ferry_engine_t *e = harness_engine_cfg(&cfg);
    blocked_call_t c[THREADS];
    pthread_t t[THREADS];
    char peer[64];
    int silent = silent_listener(peer, sizeof peer);
    void *local = calloc(4, PIECE);
    assert_int_equal(ferry_register(e, local, 4 * PIECE, FERRY_MEM_LOCAL), 0);
    for (int i = 0; i < THREADS; i++) {
        c[i] = (blocked_call_t){.e = e, .local = local};
        snprintf(c[i].peer, sizeof c[i].peer, "%s", peer);
        if (i % 2) assert_int_equal(ferry_batch_alloc(e, 4, &c[i].b), 0);
        assert_int_equal(pthread_create(&t[i], NULL, blocked_strided_main, &c[i]), 0);
    }
    /* Up to half the handshake's deadline (they block for all of it). */
    for (uint64_t until = harness_now_ms() + 10000; ferry_test_calls(e) < THREADS && harness_now_ms() < until;)
        pause_us(1000);
    assert_int_equal(ferry_test_calls(e), THREADS);
    ferry_engine_destroy(e);
    for (int i = 0; i < THREADS; i++) assert_true(atomic_load(&c[i].returned)); /* destroy waited for them */
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        if (c[i].rc != FERRY_ERR_CONTEXT)
            fail_msg("call %d (%s) ended %s, not CONTEXT", i, c[i].b ? "submit" : "sync", ferry_error_name((int)c[i].rc));
        if (c[i].b) assert_int_equal(ferry_batch_free(c[i].b), 0);
    }
    close(silent);
    free(local);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(strided_one_peer),
        cmocka_unit_test(strided_several_peers),
        cmocka_unit_test(strided_with_session_close_and_churn),
        cmocka_unit_test(target_destroyed_under_strided),
        cmocka_unit_test(slow_handshakes_next_to_strided),
        cmocka_unit_test(destroy_during_a_blocked_strided_submit),
        cmocka_unit_test(destroy_during_a_blocked_strided_sync),
        cmocka_unit_test(destroy_under_many_blocked_strided_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
