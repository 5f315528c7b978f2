/* SPDX-License-Identifier: Apache-2.0 */
/* The concurrency layer (issue 15): every public object that threads may
 * share -- engine, session, pool, KV sender, receiver and embeddings
 * buffer -- hammered from 8 threads with mixed calls, under ASan and TSan
 * (the suite's sanitizer stages). Bounds are iteration counts, never clocks. Each answer must be
 * success or a code the header documents for that race (a session closed
 * under a request: SESSION_INVALID), and the data must be right.
 * (The batch has its own file, test_concurrency_batch.c.) */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <ferry/kv.h>

#include "harness.h"
#include "transport/shm/shm_testing.h"
#include "util/spin.h"

#define THREADS 8
#define SLOT (64u << 10)
#define ITERS 60

typedef struct world {
    ferry_engine_t *ini, *tgt;
    const char *peer;
    unsigned char *src, *dst; /* one SLOT per thread, each side */
    ferry_pool_t *pool;       /* initiator pool (local) */
    ferry_pool_t *tpool;      /* target pool (remote write) */
    atomic_int errors;
    atomic_long notes_sent;
    atomic_long notes_got;
    atomic_long ops;
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

/* 0, or a code this race may produce: a peer's session closed by another
 * thread under the request. Anything else is counted as an error. */
static void expect_ok(worker_t *k, const char *what, long rc, bool session_race)
{
    if (rc >= 0) return;
    if (session_race && rc == FERRY_ERR_SESSION_INVALID) return;
    fprintf(stderr, "thread %d: %s: %ld (%s) %s\n", k->id, what, rc, ferry_error_name((int)rc),
            ferry_last_error_detail());
    atomic_fetch_add(&k->w->errors, 1);
}

static void world_open(world_t *w, const char *transport)
{
    memset(w, 0, sizeof *w);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    if (transport) cfg.transport = transport;
    cfg.timeout_ms = 10000;
    cfg.connect_timeout_ms = 5000;
    w->tgt = harness_engine_cfg(&cfg);
    w->ini = harness_engine_cfg(&cfg);
    w->peer = ferry_engine_name(w->tgt);
    w->src = calloc(THREADS, SLOT);
    w->dst = calloc(THREADS, SLOT);
    assert_int_equal(ferry_register(w->ini, w->src, THREADS * SLOT, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(w->tgt, w->dst, THREADS * SLOT, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_pool_create(w->ini, 4u << 20, FERRY_MEM_LOCAL, &w->pool), 0);
    assert_int_equal(ferry_pool_create(w->tgt, 4u << 20, FERRY_MEM_REMOTE, &w->tpool), 0);
}

static void world_close(world_t *w)
{
    ferry_pool_destroy(w->pool);
    ferry_pool_destroy(w->tpool);
    ferry_engine_destroy(w->ini);
    ferry_engine_destroy(w->tgt);
    free(w->src);
    free(w->dst);
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

/* ------------------------------------------------- engine and session */

/* Write this thread's slot, read it back, compare. */
static void write_read_slot(worker_t *k, uint64_t round)
{
    world_t *w = k->w;
    unsigned char *mine = w->src + (size_t)k->id * SLOT;
    uint64_t remote = (uint64_t)(uintptr_t)(w->dst + (size_t)k->id * SLOT);
    size_t len = 4096u * (1 + next_rand(k) % 16);
    harness_fill(mine, len, round);
    int rc = ferry_transfer_sync(w->ini, w->peer, FERRY_OP_WRITE, mine, remote, len);
    expect_ok(k, "write", rc, true);
    if (rc) return;
    memset(mine, 0, len);
    rc = ferry_transfer_sync(w->ini, w->peer, FERRY_OP_READ, mine, remote, len);
    expect_ok(k, "read", rc, true);
    if (rc == 0 && !harness_check(mine, len, round)) {
        fprintf(stderr, "thread %d: slot read back wrong\n", k->id);
        atomic_fetch_add(&w->errors, 1);
    }
}

/* Four pieces of the slot in one sync batch. */
static void batch_slot(worker_t *k)
{
    world_t *w = k->w;
    void *locals[4];
    uint64_t remotes[4];
    size_t lens[4];
    for (int i = 0; i < 4; i++) {
        locals[i] = w->src + (size_t)k->id * SLOT + (size_t)i * 8192;
        remotes[i] = (uint64_t)(uintptr_t)(w->dst + (size_t)k->id * SLOT + (size_t)(3 - i) * 8192);
        lens[i] = 8192;
    }
    expect_ok(k, "batch transfer", ferry_batch_transfer_sync(w->ini, w->peer, FERRY_OP_WRITE, locals, remotes, lens, 4),
              true);
}

/* Registers and deregisters a private buffer on both engines. */
static void register_churn(worker_t *k)
{
    world_t *w = k->w;
    unsigned char *buf = malloc(8192);
    expect_ok(k, "register target", ferry_register(w->tgt, buf, 8192, FERRY_MEM_REMOTE), false);
    expect_ok(k, "register initiator", ferry_register(w->ini, buf + 4096, 4096, FERRY_MEM_LOCAL), false);
    /* Registered before the write began: it lands. The address may be a
     * freed buffer's that the initiator still knows under its old
     * registration: that write is refused STALE_SEGMENT (the header's
     * contract: retry), and the retry, with the table refreshed, lands. */
    int rc = ferry_transfer_sync(w->ini, w->peer, FERRY_OP_WRITE, buf + 4096, (uint64_t)(uintptr_t)buf, 4096);
    if (rc == FERRY_ERR_STALE_SEGMENT)
        rc = ferry_transfer_sync(w->ini, w->peer, FERRY_OP_WRITE, buf + 4096, (uint64_t)(uintptr_t)buf, 4096);
    expect_ok(k, "write into a fresh region", rc, true);
    expect_ok(k, "deregister target", ferry_deregister(w->tgt, buf), false);
    expect_ok(k, "deregister initiator", ferry_deregister(w->ini, buf + 4096), false);
    free(buf);
}

static void session_calls(worker_t *k)
{
    world_t *w = k->w;
    ferry_peer_info_t info;
    uint64_t rtt;
    ferry_segment_t segs[8];
    switch (next_rand(k) % 4) {
    case 0: expect_ok(k, "session open", ferry_session_open(w->ini, w->peer), true); break;
    case 1: expect_ok(k, "session info", ferry_session_info(w->ini, w->peer, &info), true); break;
    case 2: expect_ok(k, "ping", ferry_session_ping(w->ini, w->peer, &rtt), true); break;
    default: expect_ok(k, "segments", ferry_session_segments(w->ini, w->peer, segs, 8), true); break;
    }
}

static void stats_calls(worker_t *k)
{
    world_t *w = k->w;
    ferry_stats_t st;
    ferry_peer_metrics_t pm[4];
    char text[4096];
    ferry_engine_t *e = next_rand(k) % 2 ? w->ini : w->tgt;
    expect_ok(k, "stats", ferry_engine_stats(e, &st), false);
    expect_ok(k, "metrics peers", ferry_metrics_peers(e, pm, 4), false);
    expect_ok(k, "metrics text", ferry_metrics_prometheus(e, text, sizeof text), false);
    (void)ferry_region_count(e);
}

static void notify_calls(worker_t *k)
{
    world_t *w = k->w;
    char msg[32];
    int n = snprintf(msg, sizeof msg, "t%d", k->id);
    int rc = ferry_notify(w->ini, w->peer, msg, (size_t)n);
    expect_ok(k, "notify", rc, true);
    if (rc == 0) atomic_fetch_add(&w->notes_sent, 1);
    ferry_notification_t got[4];
    long m = ferry_get_notifications(w->tgt, got, 4);
    expect_ok(k, "get notifications", m, false);
    if (m > 0) {
        atomic_fetch_add(&w->notes_got, m);
        ferry_notifications_free(got, (size_t)m);
    }
}

static void *engine_worker(void *arg)
{
    worker_t *k = arg;
    for (uint64_t i = 0; i < ITERS; i++) {
        unsigned pick = next_rand(k) % 16;
        if (pick < 5) write_read_slot(k, i * THREADS + (uint64_t)k->id);
        else if (pick < 7) batch_slot(k);
        else if (pick < 9) register_churn(k);
        else if (pick < 11) session_calls(k);
        else if (pick < 13) stats_calls(k);
        else if (pick < 15) notify_calls(k);
        else if (k->id < 2) {
            int rc = ferry_session_close(k->w->ini, k->w->peer);
            expect_ok(k, "session close", rc == FERRY_ERR_NOT_FOUND ? 0 : rc, false);
        }
        atomic_fetch_add(&k->w->ops, 1);
    }
    return NULL;
}

/* Notifications all arrive: drain what the threads did not take. */
static void drain_notes(world_t *w)
{
    for (int spins = 0; spins < 2000 && atomic_load(&w->notes_got) < atomic_load(&w->notes_sent); spins++) {
        ferry_notification_t got[16];
        long m = ferry_get_notifications(w->tgt, got, 16);
        assert_true(m >= 0);
        if (m == 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            continue;
        }
        atomic_fetch_add(&w->notes_got, m);
        ferry_notifications_free(got, (size_t)m);
    }
    assert_int_equal(atomic_load(&w->notes_got), atomic_load(&w->notes_sent));
}

static void engine_hammer(const char *transport)
{
    world_t w;
    world_open(&w, transport);
    run_threads(&w, engine_worker);
    drain_notes(&w);
    ferry_stats_t st;
    ferry_engine_stats(w.ini, &st);
    fprintf(stderr, "%s: %ld ops, %ld notifications, %llu requests (%llu failed), %llu connections\n",
            transport ? transport : "auto", atomic_load(&w.ops), atomic_load(&w.notes_got),
            (unsigned long long)st.requests, (unsigned long long)st.requests_failed,
            (unsigned long long)st.connections_opened);
    assert_int_equal(atomic_load(&w.errors), 0);
    assert_int_equal(atomic_load(&w.ops), THREADS * ITERS);
    /* The engines still work, and the churned regions are all gone. */
    assert_int_equal(ferry_region_count(w.tgt), 2); /* dst and the pool */
    assert_int_equal(ferry_region_count(w.ini), 2);
    unsigned char *one = w.src;
    harness_fill(one, 4096, 99);
    assert_int_equal(ferry_transfer_sync(w.ini, w.peer, FERRY_OP_WRITE, one, (uint64_t)(uintptr_t)w.dst, 4096), 0);
    assert_true(harness_check(w.dst, 4096, 99));
    world_close(&w);
}

static void engine_shared_tcp(void **state)
{
    (void)state;
    engine_hammer("tcp");
}

static void engine_shared_auto(void **state)
{
    (void)state;
    engine_hammer(NULL);
}

/* ---------------------------------------------------------------- pool */

static void *pool_worker(void *arg)
{
    worker_t *k = arg;
    world_t *w = k->w;
    for (uint64_t i = 0; i < ITERS * 2; i++) {
        size_t len = 4096u * (1 + next_rand(k) % 24);
        void *a = NULL, *b = NULL;
        int rc = ferry_pool_alloc(w->pool, len, &a);
        if (rc == FERRY_ERR_MEMORY) continue; /* full for now: others hold it */
        expect_ok(k, "pool alloc", rc, false);
        if (rc) continue;
        rc = ferry_pool_alloc(w->tpool, len, &b);
        if (rc == 0) {
            harness_fill(a, len, i + (uint64_t)k->id * 1000);
            rc = ferry_transfer_sync(w->ini, w->peer, FERRY_OP_WRITE, a, (uint64_t)(uintptr_t)b, len);
            expect_ok(k, "write pool to pool", rc, false);
            if (rc == 0 && !harness_check(b, len, i + (uint64_t)k->id * 1000)) {
                fprintf(stderr, "thread %d: pool buffer wrong\n", k->id);
                atomic_fetch_add(&w->errors, 1);
            }
            expect_ok(k, "pool free target", ferry_pool_free(w->tpool, b), false);
        } else if (rc != FERRY_ERR_MEMORY) {
            expect_ok(k, "pool alloc target", rc, false);
        }
        ferry_pool_stats_t st;
        expect_ok(k, "pool stats", ferry_pool_stats(next_rand(k) % 2 ? w->pool : w->tpool, &st), false);
        expect_ok(k, "pool free", ferry_pool_free(w->pool, a), false);
        /* a double free is refused, not merged twice */
        if (i % 16 == 0 && ferry_pool_free(w->pool, a) == 0) {
            fprintf(stderr, "thread %d: pool double free accepted\n", k->id);
            atomic_fetch_add(&w->errors, 1);
        }
        atomic_fetch_add(&w->ops, 1);
    }
    return NULL;
}

static void pool_shared(void **state)
{
    (void)state;
    world_t w;
    world_open(&w, NULL);
    run_threads(&w, pool_worker);
    assert_int_equal(atomic_load(&w.errors), 0);
    ferry_pool_stats_t st;
    assert_int_equal(ferry_pool_stats(w.pool, &st), 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.allocations, 0);
    assert_int_equal(st.largest_free, st.size);
    assert_int_equal(ferry_pool_stats(w.tpool, &st), 0);
    assert_int_equal(st.used, 0);
    world_close(&w);
}

/* ------------------------------------------------------------------ KV */

#define KV_LAYERS 2
#define KV_PAGES 16
#define KV_SEND_PAGES 6

typedef struct kv_world {
    world_t w;
    ferry_kv_cache_desc_t sd, dd;
    uint64_t sk[KV_LAYERS], sv[KV_LAYERS], dk[KV_LAYERS], dv[KV_LAYERS];
    unsigned char *smem, *dmem;
    ferry_kv_plan_t *send_plan, *recv_plan;
    ferry_kv_recv_t *shared_recv; /* one request's tracker, offered from every thread */
    ferry_kv_embed_t *embed;      /* one embeddings buffer, sent from every thread */
    unsigned char *embed_dst;
    atomic_int embeds;
    atomic_int completes;
} kv_world_t;

static const int32_t kv_src_pages[KV_SEND_PAGES] = {1, 2, 3, 9, 10, 15};
static const int32_t kv_dst_pages[KV_SEND_PAGES] = {0, 4, 5, 6, 11, 12};

static void kv_desc(ferry_kv_cache_desc_t *d, uint64_t *k, uint64_t *v, unsigned char *mem, uint64_t buf)
{
    *d = (ferry_kv_cache_desc_t){.kind = FERRY_KV_SPLIT, .num_layers = KV_LAYERS, .num_pages = KV_PAGES,
                                 .page_size = 4, .kv_heads = 2, .total_kv_heads = 2, .head_dim = 32,
                                 .dtype_size = 2, .tp_rank = 0, .tp_size = 1, .k_addrs = k, .v_addrs = v};
    for (int l = 0; l < KV_LAYERS; l++) {
        k[l] = (uint64_t)(uintptr_t)(mem + (size_t)(2 * l) * buf);
        v[l] = (uint64_t)(uintptr_t)(mem + (size_t)(2 * l + 1) * buf);
    }
}

static void *kv_worker(void *arg)
{
    worker_t *k = arg;
    kv_world_t *kw = (kv_world_t *)k->w;
    world_t *w = &kw->w;
    for (uint64_t i = 0; i < ITERS / 2; i++) {
        unsigned pick = next_rand(k) % 5;
        if (pick == 4) {
            ferry_kv_send_args_t a = {.request_id = 5000 + i * THREADS + (uint64_t)k->id};
            int rc = ferry_kv_embed_send(kw->embed, w->peer, 4096, (uint64_t)(uintptr_t)kw->embed_dst, &a);
            expect_ok(k, "embed send", rc, false);
            if (rc == 0) atomic_fetch_add(&w->notes_sent, 1);
            if (rc == 0) atomic_fetch_add(&kw->embeds, 1);
        } else if (pick < 2) {
            /* Every thread sends along the one shared plan. */
            ferry_kv_send_args_t a = {.request_id = 1000 + i * THREADS + (uint64_t)k->id, .aux = "tok",
                                      .aux_len = 3};
            int rc = ferry_kv_send(w->ini, w->peer, kw->send_plan, &a);
            expect_ok(k, "kv send", rc, false);
            if (rc == 0) atomic_fetch_add(&w->notes_sent, 1);
        } else if (pick == 2) {
            ferry_kv_event_t ev[4];
            long n = ferry_kv_poll(w->tgt, ev, 4);
            expect_ok(k, "kv poll", n, false);
            for (long j = 0; j < n; j++) {
                if (!ev[j].is_notice || ev[j].notice.status != 0) {
                    fprintf(stderr, "thread %d: unexpected event\n", k->id);
                    atomic_fetch_add(&w->errors, 1);
                }
            }
            if (n > 0) {
                atomic_fetch_add(&w->notes_got, n);
                ferry_kv_events_free(ev, (size_t)n);
            }
        } else {
            /* Threads offer the shared tracker its notice, and others'. */
            ferry_kv_notice_t n = {.request_id = next_rand(k) % 2 ? 7 : 8, .aux = (const unsigned char *)"ab",
                                   .aux_len = 2, .bytes = 1};
            int rc = ferry_kv_recv_offer(kw->shared_recv, &n);
            if (n.request_id == 7 && rc == 1) atomic_fetch_add(&kw->completes, 1);
            else if (rc != 0 && rc != 1) expect_ok(k, "kv recv offer", rc, false);
            size_t len;
            const void *aux = ferry_kv_recv_aux(kw->shared_recv, &len);
            if (aux && (len != 2 || memcmp(aux, "ab", 2) != 0)) atomic_fetch_add(&w->errors, 1);
        }
        atomic_fetch_add(&w->ops, 1);
    }
    return NULL;
}

static void kv_shared(void **state)
{
    (void)state;
    kv_world_t kw;
    memset(&kw, 0, sizeof kw);
    world_open(&kw.w, NULL);
    world_t *w = &kw.w;
    kv_desc(&kw.sd, kw.sk, kw.sv, NULL, 0);
    uint64_t buf = ferry_kv_page_bytes(&kw.sd) * KV_PAGES;
    kw.smem = malloc(buf * 2 * KV_LAYERS);
    kw.dmem = calloc(2 * KV_LAYERS, buf);
    harness_fill(kw.smem, buf * 2 * KV_LAYERS, 5);
    kv_desc(&kw.sd, kw.sk, kw.sv, kw.smem, buf);
    kv_desc(&kw.dd, kw.dk, kw.dv, kw.dmem, buf);
    assert_int_equal(ferry_register(w->ini, kw.smem, buf * 2 * KV_LAYERS, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(w->tgt, kw.dmem, buf * 2 * KV_LAYERS, FERRY_MEM_REMOTE_WRITE), 0);
    assert_int_equal(ferry_kv_plan_create(&kw.sd, &kw.dd, kv_src_pages, kv_dst_pages, KV_SEND_PAGES, &kw.send_plan), 0);
    assert_int_equal(ferry_kv_plan_bind_sender(kw.send_plan, 0, 0, 0, 0), 0);
    assert_int_equal(ferry_kv_plan_create(&kw.sd, &kw.dd, kv_src_pages, kv_dst_pages, KV_SEND_PAGES, &kw.recv_plan), 0);
    assert_int_equal(ferry_kv_plan_bind_receiver(kw.recv_plan, 0, 0), 0);
    assert_int_equal(ferry_kv_recv_create(7, &kw.recv_plan, 1, &kw.shared_recv), 0);
    assert_int_equal(ferry_kv_embed_create(w->ini, 4096, &kw.embed), 0);
    harness_fill(ferry_kv_embed_data(kw.embed), 4096, 11);
    kw.embed_dst = calloc(1, 4096);
    assert_int_equal(ferry_register(w->tgt, kw.embed_dst, 4096, FERRY_MEM_REMOTE_WRITE), 0);
    run_threads(w, kv_worker);
    /* Every success notice arrives, and the pages hold the source's bytes. */
    for (int spins = 0; spins < 2000 && atomic_load(&w->notes_got) < atomic_load(&w->notes_sent); spins++) {
        ferry_kv_event_t ev[8];
        long n = ferry_kv_poll(w->tgt, ev, 8);
        assert_true(n >= 0);
        if (n == 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        atomic_fetch_add(&w->notes_got, n);
        ferry_kv_events_free(ev, (size_t)n);
    }
    assert_int_equal(atomic_load(&w->notes_got), atomic_load(&w->notes_sent));
    assert_int_equal(atomic_load(&w->errors), 0);
    fprintf(stderr, "kv: %ld sends (%d of them embeddings), %d completions of the shared tracker\n",
            atomic_load(&w->notes_sent), atomic_load(&kw.embeds), atomic_load(&kw.completes));
    uint64_t page = ferry_kv_page_bytes(&kw.sd);
    for (int l = 0; l < 2 * KV_LAYERS; l++)
        for (int p = 0; p < KV_SEND_PAGES && atomic_load(&w->notes_sent) > 0; p++)
            assert_memory_equal(kw.dmem + (size_t)l * buf + (size_t)kv_dst_pages[p] * page,
                                kw.smem + (size_t)l * buf + (size_t)kv_src_pages[p] * page, page);
    if (atomic_load(&kw.embeds) > 0) assert_true(harness_check(kw.embed_dst, 4096, 11));
    ferry_kv_embed_destroy(kw.embed);
    ferry_kv_recv_destroy(kw.shared_recv);
    ferry_kv_plan_destroy(kw.send_plan);
    ferry_kv_plan_destroy(kw.recv_plan);
    world_close(w);
    free(kw.smem);
    free(kw.dmem);
    free(kw.embed_dst);
}

/* ------------------------------------------- deregister under writes */

/* Writers keep writing into one region while another thread deregisters
 * it, zeroes it, lets every writer make two more attempts, checks that
 * nothing landed (ferry_deregister: "after it returns, no peer write lands
 * in it"), and registers it again. */
typedef struct churn {
    world_t *w;
    unsigned char *region;
    atomic_bool stop;
    atomic_long attempts[THREADS];
    atomic_long landed;
} churn_t;

typedef struct churn_worker {
    churn_t *c;
    int id;
} churn_worker_t;

static void *churn_writer(void *arg)
{
    churn_worker_t *k = arg;
    churn_t *c = k->c;
    world_t *w = c->w;
    unsigned char *mine = w->src + (size_t)k->id * SLOT;
    memset(mine, 0xa5, 4096);
    while (!atomic_load(&c->stop)) {
        int rc = ferry_transfer_sync(w->ini, w->peer, FERRY_OP_WRITE, mine,
                                     (uint64_t)(uintptr_t)(c->region + (size_t)k->id * 4096), 4096);
        if (rc == 0) atomic_fetch_add(&c->landed, 1);
        else if (rc != FERRY_ERR_ADDRESS_NOT_REGISTERED && rc != FERRY_ERR_STALE_SEGMENT) {
            fprintf(stderr, "writer %d: %d %s\n", k->id, rc, ferry_last_error_detail());
            atomic_fetch_add(&w->errors, 1);
        }
        atomic_fetch_add(&c->attempts[k->id], 1);
    }
    return NULL;
}

static void wait_attempts(churn_t *c, int writers, long more)
{
    long start[THREADS];
    for (int i = 0; i < writers; i++) start[i] = atomic_load(&c->attempts[i]);
    for (int i = 0; i < writers; i++)
        while (atomic_load(&c->attempts[i]) < start[i] + more) sched_yield();
}

static void deregister_under_writes(const char *transport)
{
    world_t w;
    world_open(&w, transport);
    churn_t c = {.w = &w};
    enum { WRITERS = THREADS - 1 };
    c.region = calloc(WRITERS, 4096);
    assert_int_equal(ferry_register(w.tgt, c.region, WRITERS * 4096, FERRY_MEM_REMOTE), 0);
    pthread_t t[WRITERS];
    churn_worker_t k[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        k[i] = (churn_worker_t){&c, i};
        assert_int_equal(pthread_create(&t[i], NULL, churn_writer, &k[i]), 0);
    }
    for (int round = 0; round < 30; round++) {
        wait_attempts(&c, WRITERS, 1);
        assert_int_equal(ferry_deregister(w.tgt, c.region), 0);
        memset(c.region, 0, WRITERS * 4096);
        wait_attempts(&c, WRITERS, 2);
        for (size_t i = 0; i < WRITERS * 4096; i++)
            if (c.region[i]) fail_msg("round %d: byte %zu landed after ferry_deregister returned", round, i);
        assert_int_equal(ferry_register(w.tgt, c.region, WRITERS * 4096, FERRY_MEM_REMOTE), 0);
    }
    atomic_store(&c.stop, true);
    for (int i = 0; i < WRITERS; i++) pthread_join(t[i], NULL);
    fprintf(stderr, "%s: %ld writes landed across 30 deregistrations\n", transport ? transport : "auto",
            atomic_load(&c.landed));
    assert_int_equal(atomic_load(&w.errors), 0);
    assert_int_equal(ferry_deregister(w.tgt, c.region), 0);
    world_close(&w);
    free(c.region);
}

static void deregister_under_writes_tcp(void **state)
{
    (void)state;
    deregister_under_writes("tcp");
}

static void deregister_under_writes_auto(void **state)
{
    (void)state;
    deregister_under_writes(NULL);
}

/* ------------------------------------------ shm copies the helper shares */

typedef struct big_writer {
    world_t *w;
    void *locals[8];
    uint64_t remotes[8];
    size_t lens[8];
    atomic_bool stop;
    atomic_long attempts;
} big_writer_t;

static void *big_writes(void *arg)
{
    big_writer_t *b = arg;
    while (!atomic_load(&b->stop)) {
        int rc = ferry_batch_transfer_sync(b->w->ini, b->w->peer, FERRY_OP_WRITE, b->locals, b->remotes, b->lens, 8);
        if (rc && rc != FERRY_ERR_ADDRESS_NOT_REGISTERED && rc != FERRY_ERR_STALE_SEGMENT) {
            fprintf(stderr, "big writer: %d %s\n", rc, ferry_last_error_detail());
            atomic_fetch_add(&b->w->errors, 1);
        }
        atomic_fetch_add(&b->attempts, 1);
    }
    return NULL;
}

static void big_wait(big_writer_t *b, long more)
{
    long start = atomic_load(&b->attempts);
    while (atomic_load(&b->attempts) < start + more) sched_yield();
}

/* Calls of 8 x 1 MiB to distinct slots over shm (one process: the target
 * attaches to its own pid). The target shares each gathered copy with its
 * copy helper where a CPU is idle (shm_vec.c, large_chunk_shared), and the
 * initiator runs such calls unsplit. The bytes arrive whole, and a
 * deregistration racing such calls is never followed by a byte landing:
 * the helper copies only inside the serving thread's hold of the
 * registry's read lock. */
static void large_writes_shared_copies(void **state)
{
    (void)state;
    enum { N = 8 };
    size_t piece = 1u << 20, cap = N * piece;
    world_t w;
    world_open(&w, "shm");
    unsigned char *src = malloc(cap), *dst = calloc(1, cap);
    assert_non_null(src);
    assert_non_null(dst);
    assert_int_equal(ferry_register(w.ini, src, cap, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(w.tgt, dst, cap, FERRY_MEM_REMOTE), 0);
    static big_writer_t b;
    b = (big_writer_t){.w = &w};
    for (int i = 0; i < N; i++) { /* piece i into slot N-1-i */
        b.locals[i] = src + (size_t)i * piece;
        b.remotes[i] = (uint64_t)(uintptr_t)(dst + (size_t)(N - 1 - i) * piece);
        b.lens[i] = piece;
    }
    uint64_t shares0 = ferry_shm_helper_shares();
    for (int k = 0; k < 20; k++) {
        harness_fill(src, cap, 100 + (uint64_t)k);
        assert_int_equal(ferry_batch_transfer_sync(w.ini, w.peer, FERRY_OP_WRITE, b.locals, b.remotes, b.lens, N), 0);
        for (int i = 0; i < N; i++)
            if (memcmp(dst + (size_t)(N - 1 - i) * piece, b.locals[i], piece) != 0)
                fail_msg("call %d: piece %d arrived wrong", k, i);
    }
    if (ferry_spin_cpus() >= 2 && ferry_shm_helper_shares() == shares0)
        fail_msg("the copy helper took no share of 20 calls of 8 x 1 MiB");
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, big_writes, &b), 0);
    for (int round = 0; round < 10; round++) {
        big_wait(&b, 1);
        assert_int_equal(ferry_deregister(w.tgt, dst), 0);
        memset(dst, 0, cap);
        big_wait(&b, 2);
        for (size_t i = 0; i < cap; i++)
            if (dst[i]) fail_msg("round %d: byte %zu landed after ferry_deregister returned", round, i);
        assert_int_equal(ferry_register(w.tgt, dst, cap, FERRY_MEM_REMOTE), 0);
    }
    atomic_store(&b.stop, true);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&w.errors), 0);
    assert_int_equal(ferry_deregister(w.tgt, dst), 0);
    assert_int_equal(ferry_deregister(w.ini, src), 0);
    world_close(&w);
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(engine_shared_tcp),
        cmocka_unit_test(engine_shared_auto),
        cmocka_unit_test(deregister_under_writes_tcp),
        cmocka_unit_test(deregister_under_writes_auto),
        cmocka_unit_test(pool_shared),
        cmocka_unit_test(kv_shared),
        cmocka_unit_test(large_writes_shared_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
