/* SPDX-License-Identifier: Apache-2.0 */
/* "Completed" means visible at the target, and waiting costs no CPU:
 * target memory read the instant a write returns (many small writes, from
 * several threads, async requests read as soon as their status flips), the
 * CPU an idle engine burns, bounded spinning, and the new config fields. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/testing.h"
#include "link/conn.h"
#include "link/link.h"
#include "util/clock.h"
#include "util/net.h"
#include "util/spin.h"
#include "harness.h"

typedef harness_pair_t pair_t;

static pair_t *pair_new(int spin_us)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 20000;
    cfg.spin_us = spin_us;
    return harness_pair_new(&cfg, 20000);
}

static int setup(void **state)
{
    *state = pair_new(0);
    return 0;
}

static int teardown(void **state)
{
    harness_pair_free(*state);
    return 0;
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

struct small_args {
    pair_t *p;
    unsigned char *src, *dst; /* this thread's slice of the buffers */
    size_t len;
    uint64_t seed;
    int writes, bad;
};

/* Thousands of tiny writes at random offsets; the target bytes are compared
 * right after each call returns, with no wait of any kind. */
static void *small_writer(void *arg)
{
    struct small_args *a = arg;
    uint64_t s = a->seed;
    for (int i = 0; i < a->writes; i++) {
        size_t n = 1 + rng(&s) % 200;
        size_t off = rng(&s) % (a->len - n);
        for (size_t k = 0; k < n; k++) a->src[off + k] = (unsigned char)(rng(&s) | 1);
        int rc = ferry_transfer_sync(a->p->initiator, a->p->peer, FERRY_OP_WRITE, a->src + off,
                                     (uint64_t)(uintptr_t)(a->dst + off), n);
        if (rc != 0 || memcmp(a->dst + off, a->src + off, n) != 0) a->bad++;
    }
    return NULL;
}

static void many_small_writes_visible_on_return(void **state)
{
    pair_t *p = *state;
    enum { THREADS = 3, SLICE = 1 << 16 };
    size_t len = (size_t)THREADS * SLICE;
    unsigned char *src = calloc(1, len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p->initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p->target, dst, len, FERRY_MEM_REMOTE), 0);
    pthread_t t[THREADS];
    struct small_args a[THREADS];
    for (int i = 0; i < THREADS; i++) {
        a[i] = (struct small_args){p, src + (size_t)i * SLICE, dst + (size_t)i * SLICE, SLICE, 0x9e3779b9u * (i + 1), 700, 0};
        pthread_create(&t[i], NULL, small_writer, &a[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(a[i].bad, 0);
    }
    assert_memory_equal(src, dst, len);
    ferry_deregister(p->initiator, src);
    ferry_deregister(p->target, dst);
    free(src);
    free(dst);
}

/* Scatter-gather sync batch: every block is in place when the call returns. */
static void sync_batch_visible_on_return(void **state)
{
    pair_t *p = *state;
    enum { N = 512 };
    size_t len = (size_t)N * 1024;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p->initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p->target, dst, len, FERRY_MEM_REMOTE), 0);
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    for (int round = 0; round < 5; round++) {
        harness_fill(src, len, (uint64_t)round + 1);
        for (int i = 0; i < N; i++) {
            size_t n = 1 + (size_t)((i * 37 + round) % 1024);
            locals[i] = src + (size_t)i * 1024;
            remotes[i] = (uint64_t)(uintptr_t)(dst + (size_t)i * 1024);
            lens[i] = n;
        }
        assert_int_equal(ferry_batch_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
        for (int i = 0; i < N; i++) assert_memory_equal(dst + (size_t)i * 1024, src + (size_t)i * 1024, lens[i]);
    }
    ferry_deregister(p->initiator, src);
    ferry_deregister(p->target, dst);
    free(src);
    free(dst);
}

/* Async: the moment a request's status says COMPLETED (others still in
 * flight), its bytes are at the target. */
static void async_completed_means_visible(void **state)
{
    pair_t *p = *state;
    enum { N = 48 };
    size_t sizes[N], offs[N], total = 0;
    for (int i = 0; i < N; i++) {
        sizes[i] = (size_t)1 << (10 + i % 13); /* 1 KiB .. 4 MiB */
        offs[i] = total;
        total += sizes[i];
    }
    unsigned char *src = malloc(total), *dst = calloc(1, total);
    harness_fill(src, total, 1234);
    assert_int_equal(ferry_register(p->initiator, src, total, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p->target, dst, total, FERRY_MEM_REMOTE), 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, N, &b), 0);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + offs[i], (uint64_t)(uintptr_t)(dst + offs[i]), sizes[i]};
    /* Submitted one by one: separate tasks that finish at different times. */
    for (int i = 0; i < N; i++) assert_int_equal(ferry_batch_submit(b, p->peer, &reqs[i], 1, 0), i);
    bool seen[N] = {false};
    int left = N, early = 0;
    uint64_t until = harness_now_ms() + 60000;
    while (left > 0 && harness_now_ms() < until) {
        for (int i = 0; i < N; i++) {
            if (seen[i]) continue;
            ferry_status_t st;
            assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
            assert_true(st.state != FERRY_STATUS_FAILED);
            if (st.state != FERRY_STATUS_COMPLETED) continue;
            assert_int_equal(st.bytes, sizes[i]);
            assert_memory_equal(dst + offs[i], src + offs[i], sizes[i]);
            seen[i] = true;
            left--;
            early += left > 0;
        }
    }
    assert_int_equal(left, 0);
    printf("async: %d of %d requests checked at the target while others were still in flight\n", early, N);
    assert_int_equal(ferry_batch_wait(b, 20000), 0);
    assert_int_equal(ferry_batch_free(b), 0);
    ferry_deregister(p->initiator, src);
    ferry_deregister(p->target, dst);
    free(src);
    free(dst);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* Two engines with an open session, pooled connections, serving threads
 * and workers, then idle for 2 s: the whole process stays near 0% CPU. A
 * busy-polling wait anywhere would show about 100%. */
static void idle_engines_burn_no_cpu(void **state)
{
    pair_t *p = *state;
    unsigned char *src = malloc(1 << 20), *dst = malloc(1 << 20);
    assert_int_equal(ferry_register(p->initiator, src, 1 << 20, 0), 0);
    assert_int_equal(ferry_register(p->target, dst, 1 << 20, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 1 << 20), 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, 1, &b), 0);
    ferry_request_t r = {FERRY_OP_READ, src, (uint64_t)(uintptr_t)dst, 1 << 20};
    assert_int_equal(ferry_batch_submit(b, p->peer, &r, 1, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 20000), 0);
    double c0 = cpu_seconds();
    uint64_t t0 = harness_now_ms();
    struct timespec ts = {2, 0};
    nanosleep(&ts, NULL);
    double used = cpu_seconds() - c0;
    double wall = (double)(harness_now_ms() - t0) / 1000.0;
    double pct = 100.0 * used / wall;
    printf("idle: %.2f ms of CPU in %.2f s = %.3f%% of one core (2 engines, 1 session)\n", used * 1000, wall, pct);
    assert_true(pct < 5.0);
    assert_int_equal(ferry_batch_free(b), 0);
    ferry_deregister(p->initiator, src);
    ferry_deregister(p->target, dst);
    free(src);
    free(dst);
}

/* With spin_us set, waits spin first and still complete; and spinning is
 * bounded: an idle engine with spin_us still burns nothing. */
static void bounded_spin_wait(void **state)
{
    (void)state;
    pair_t *p = pair_new(200);
    size_t len = 4096;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    harness_fill(src, len, 5);
    assert_int_equal(ferry_register(p->initiator, src, len, 0), 0);
    assert_int_equal(ferry_register(p->target, dst, len, FERRY_MEM_REMOTE), 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, 64, &b), 0);
    for (int i = 0; i < 64; i++) {
        ferry_request_t r = {FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len};
        assert_int_equal(ferry_batch_submit(b, p->peer, &r, 1, 0), i);
        assert_int_equal(ferry_batch_wait(b, 20000), 0);
        assert_true(harness_check(dst, len, 5));
        assert_int_equal(ferry_transfer_sync(p->initiator, p->peer, FERRY_OP_READ, src, (uint64_t)(uintptr_t)dst, len), 0);
    }
    double c0 = cpu_seconds();
    uint64_t t0 = harness_now_ms();
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    double pct = 100.0 * (cpu_seconds() - c0) / ((double)(harness_now_ms() - t0) / 1000.0);
    printf("idle with spin_us=200: %.3f%% of one core\n", pct);
    assert_true(pct < 5.0);
    assert_int_equal(ferry_batch_free(b), 0);
    ferry_deregister(p->initiator, src);
    ferry_deregister(p->target, dst);
    free(src);
    free(dst);
    harness_pair_free(p);
}

/* The adaptive spin's budget (spin.h): twice the median of the recent
 * waits, floored and capped; nothing before any wait, once half the recent
 * waits were long, or on one CPU. */
static void adaptive_spin_budget_follows_recent_waits(void **state)
{
    (void)state;
    uint32_t w[FERRY_SPIN_WINDOW] = {0};
    assert_int_equal(ferry_spin_budget(w, 0, 2), 0);
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) w[i] = 20000; /* 20 us */
    assert_int_equal(ferry_spin_budget(w, FERRY_SPIN_WINDOW, 2), 40);
    assert_int_equal(ferry_spin_budget(w, FERRY_SPIN_WINDOW, 1), 0);
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) w[i] = 2000; /* 2 us: the floor */
    assert_int_equal(ferry_spin_budget(w, FERRY_SPIN_WINDOW, 16), FERRY_SPIN_FLOOR_US);
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) w[i] = 70000; /* 70 us: the cap */
    assert_int_equal(ferry_spin_budget(w, FERRY_SPIN_WINDOW, 2), FERRY_SPIN_CAP_US);
    w[0] = 5000000; /* one slow outlier among short waits does not stop it */
    assert_int_equal(ferry_spin_budget(w, FERRY_SPIN_WINDOW, 2), FERRY_SPIN_CAP_US);

    /* Through the per-connection record: short waits, then slow ones. */
    ferry_spin_t sp;
    memset(&sp, 0, sizeof sp);
    assert_int_equal(ferry_spin_us(&sp, 0), 0); /* nothing measured: no spin */
    for (int i = 0; i < 100; i++) ferry_spin_record(&sp, 12000);
    unsigned fast = ferry_spin_us(&sp, 0);
    printf("after 12 us waits: spins %u us\n", fast);
    assert_true(fast == 24 || fast == 0); /* 0 only where this process has one CPU */
    assert_int_equal(ferry_spin_us(&sp, -1), 0);  /* -1: never */
    assert_int_equal(ferry_spin_us(&sp, 300), 300); /* N > 0: always N */
    for (int i = 0; i < FERRY_SPIN_WINDOW / 2 - 1; i++) ferry_spin_record(&sp, 2000000);
    assert_int_equal(ferry_spin_us(&sp, 0), fast); /* a minority of slow waits */
    ferry_spin_record(&sp, 2000000);
    assert_int_equal(ferry_spin_us(&sp, 0), 0); /* half slow: collapses to 0 */
    ferry_spin_record(&sp, (uint64_t)60 * 1000000000u); /* saturates, does not wrap */
    assert_int_equal(ferry_spin_us(&sp, 0), 0);
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) ferry_spin_record(&sp, 12000);
    assert_int_equal(ferry_spin_us(&sp, 0), fast); /* and comes back with short waits */
}

/* Long regular waits (an answer to a copy of the same size each time) nap
 * through their known part and spin over their end; others do not. */
static void long_regular_waits_nap_then_spin(void **state)
{
    (void)state;
    uint32_t w[FERRY_SPIN_WINDOW];
    unsigned tail = 7;
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) w[i] = 300000; /* 300 us each */
    assert_int_equal(ferry_spin_nap_plan(w, FERRY_SPIN_WINDOW, 2, &tail), 300 - FERRY_NAP_LEAD_US);
    assert_int_equal(tail, 2 * FERRY_NAP_LEAD_US);
    assert_int_equal(ferry_spin_nap_plan(w, FERRY_SPIN_WINDOW, 1, &tail), 0); /* one CPU: the answer needs it */
    assert_int_equal(tail, 0);
    assert_int_equal(ferry_spin_nap_plan(w, FERRY_SPIN_WINDOW - 1, 2, &tail), 0); /* not enough measured */
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) w[i] = 80000; /* 80 us: spun whole instead */
    assert_int_equal(ferry_spin_nap_plan(w, FERRY_SPIN_WINDOW, 2, &tail), 0);
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) w[i] = (FERRY_NAP_MAX_US + 1) * 1000u; /* too long to bother */
    assert_int_equal(ferry_spin_nap_plan(w, FERRY_SPIN_WINDOW, 2, &tail), 0);
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) w[i] = i < 4 ? 150000 : 400000; /* irregular */
    assert_int_equal(ferry_spin_nap_plan(w, FERRY_SPIN_WINDOW, 2, &tail), 0);
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) w[i] = i < 3 ? 200000 : 290000; /* spread 90 us */
    assert_int_equal(ferry_spin_nap_plan(w, FERRY_SPIN_WINDOW, 2, &tail), 200 - FERRY_NAP_LEAD_US);
    assert_int_equal(tail, FERRY_SPIN_CAP_US); /* 290 + 80 - 200 = 170: capped */
    w[0] = 10000; /* one short outlier: the second shortest counts */
    assert_int_equal(ferry_spin_nap_plan(w, FERRY_SPIN_WINDOW, 2, &tail), 200 - FERRY_NAP_LEAD_US);

    /* Through a connection's record, with the trim naps learn. */
    ferry_spin_t sp;
    memset(&sp, 0, sizeof sp);
    for (int i = 0; i < FERRY_SPIN_WINDOW; i++) ferry_spin_record(&sp, 300000);
    if (ferry_spin_cpus() < 2) {
        assert_int_equal(ferry_spin_nap(&sp, 0, &tail), 0);
        return;
    }
    unsigned nap = ferry_spin_nap(&sp, 0, &tail);
    assert_int_equal(nap, 300 - FERRY_NAP_LEAD_US);
    assert_int_equal(ferry_spin_nap(&sp, -1, &tail), 0); /* never spins: never naps */
    assert_int_equal(ferry_spin_nap(&sp, 50, &tail), 0); /* a fixed spin: as configured */
    ferry_spin_nap_outcome(&sp, FERRY_NAP_WOKEN);        /* the answer beat the nap */
    assert_int_equal(ferry_spin_nap(&sp, 0, &tail), nap - FERRY_NAP_TRIM_STEP_US);
    ferry_spin_nap_outcome(&sp, FERRY_NAP_CAUGHT);
    ferry_spin_nap_outcome(&sp, FERRY_NAP_MISSED); /* changes nothing */
    assert_int_equal(ferry_spin_nap(&sp, 0, &tail), nap - FERRY_NAP_TRIM_STEP_US + 1);
    for (unsigned i = 0; i * FERRY_NAP_TRIM_STEP_US < nap; i++) ferry_spin_nap_outcome(&sp, FERRY_NAP_WOKEN);
    assert_int_equal(ferry_spin_nap(&sp, 0, &tail), 0); /* trimmed away: block as before */
    assert_int_equal(tail, 0);
    unsigned left = atomic_load(&sp.nap_trim_us);
    for (unsigned i = 0; i <= left - nap; i++) ferry_spin_nap(&sp, 0, &tail); /* each decline gives 1 us back */
    assert_int_equal(ferry_spin_nap(&sp, 0, &tail), 1);                      /* naps come back */
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* A nap ends when the data comes or its time is up, and leaves the
 * thread's timer slack as it found it. */
static void nap_ends_on_data_or_time(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    double t0 = now_us();
    assert_int_equal(ferry_net_nap_readable(sv[0], 3000), 0);
    assert_true(now_us() - t0 >= 3000);
    assert_int_equal(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), slack);
    assert_int_equal(send(sv[1], "x", 1, 0), 1);
    t0 = now_us();
    assert_int_equal(ferry_net_nap_readable(sv[0], 5000000), 1); /* at once, not in 5 s */
    assert_true(now_us() - t0 < 1000000);
    close(sv[0]);
    close(sv[1]);
}

struct answerer {
    int fd, rounds;
};

/* Answers each 1-byte request with a frame header after ~300 us of work. */
static void *answer_after_work(void *arg)
{
    struct answerer *a = arg;
    for (int i = 0; i < a->rounds; i++) {
        char b;
        if (recv(a->fd, &b, 1, MSG_WAITALL) != 1) break;
        double until = now_us() + 300;
        while (now_us() < until) {
        }
        ferry_frame_t f = {.type = FERRY_FRAME_VEC_ACK, .req_id = (uint64_t)i, .len = 1};
        uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
        ferry_frame_encode(&f, hdr);
        if (send(a->fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr) break;
    }
    return NULL;
}

/* A connection's answers to work of the same length each time: the waits
 * nap (on two CPUs or more), and every answer still arrives, in order. */
static void answers_to_regular_work_nap_and_arrive(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ferry_link_t link;
    memset(&link, 0, sizeof link); /* spin_us 0: adaptive */
    ferry_conn_t c;
    memset(&c, 0, sizeof c);
    c.fd = sv[0];
    c.link = &link;
    struct answerer a = {.fd = sv[1], .rounds = 1000}; /* up to: it stops at the first nap past 50 */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, answer_after_work, &a), 0);
    unsigned long naps0 = ferry_conn_naps(NULL);
    int i = 0;
    for (; i < a.rounds && !(i % 50 == 49 && ferry_conn_naps(NULL) > naps0); i++) {
        assert_int_equal(send(sv[0], "r", 1, 0), 1);
        ferry_frame_t f;
        assert_int_equal(ferry_conn_recv_frame_spin(&c, &f, ferry_deadline_after_ms(10000), FERRY_SPIN_NAP), 0);
        assert_int_equal(f.type, FERRY_FRAME_VEC_ACK);
        assert_int_equal(f.req_id, (uint64_t)i);
    }
    shutdown(sv[0], SHUT_WR); /* the answerer stops at the end of the requests */
    pthread_join(t, NULL);
    unsigned long naps = ferry_conn_naps(NULL) - naps0;
    printf("%lu naps in %d waits (trim %u us)\n", naps, i, atomic_load(&c.spin.nap_trim_us));
    if (ferry_spin_cpus() >= 2) assert_true(naps > 0);
    else assert_int_equal(naps, 0);
    close(sv[0]);
    close(sv[1]);
}

/* With the default (adaptive) spin, after a burst of small round trips
 * that taught both sides to spin, an idle engine pair burns no CPU: the
 * waits for the next request and answer stop spinning once idle. */
static void idle_after_small_round_trips_burns_no_cpu(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 20000;
    cfg.transport = "tcp";
    ferry_engine_t *initiator = harness_engine_cfg(&cfg);
    ferry_engine_t *target = harness_engine(20000);
    unsigned char src[64], *dst = calloc(1, 64);
    memset(src, 7, sizeof src);
    assert_int_equal(ferry_register(initiator, src, sizeof src, 0), 0);
    assert_int_equal(ferry_register(target, dst, 64, FERRY_MEM_REMOTE), 0);
    for (int i = 0; i < 2000; i++)
        assert_int_equal(ferry_transfer_sync(initiator, ferry_engine_name(target), FERRY_OP_WRITE, src + i % 56,
                                             (uint64_t)(uintptr_t)(dst + i % 56), 8),
                         0);
    assert_int_equal(dst[0], 7);
    double c0 = cpu_seconds();
    uint64_t t0 = harness_now_ms();
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    double pct = 100.0 * (cpu_seconds() - c0) / ((double)(harness_now_ms() - t0) / 1000.0);
    printf("idle after 2000 8 B round trips (adaptive spin): %.3f%% of one core\n", pct);
    assert_true(pct < 5.0);
    ferry_deregister(initiator, src);
    ferry_deregister(target, dst);
    ferry_engine_destroy(initiator);
    ferry_engine_destroy(target);
    free(dst);
}

/* With the default (adaptive) spin, ferry_batch_wait learns from its
 * recent waits like the waits for answers: after short batches the engine
 * spins before blocking (on more than one CPU), each wait still completes
 * with the bytes visible, and once idle the pair burns no CPU. */
static void batch_waits_spin_adaptively_and_idle_burns_no_cpu(void **state)
{
    (void)state;
    pair_t *p = pair_new(0);
    size_t len = 4096;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p->initiator, src, len, 0), 0);
    assert_int_equal(ferry_register(p->target, dst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_spin_us(ferry_test_batch_spin(p->initiator), 0), 0); /* nothing waited yet */
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, 200, &b), 0);
    for (int i = 0; i < 200; i++) {
        harness_fill(src, len, (uint64_t)i);
        ferry_request_t r = {FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len};
        assert_int_equal(ferry_batch_submit(b, p->peer, &r, 1, 0), i);
        assert_int_equal(ferry_batch_wait(b, 20000), 0);
        assert_true(harness_check(dst, len, (uint64_t)i));
    }
    unsigned spin = ferry_spin_us(ferry_test_batch_spin(p->initiator), 0);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    printf("after 200 small batch waits: the next spins %u us (%ld CPUs)\n", spin, cpus);
    /* The waits that found work still running were recorded; a slow
     * machine may leave their median above the cap (then 0), never the
     * budget above it. */
    assert_true(atomic_load(&ferry_test_batch_spin(p->initiator)->count) > 0);
    assert_true(spin <= FERRY_SPIN_CAP_US);
    double c0 = cpu_seconds();
    uint64_t t0 = harness_now_ms();
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    double pct = 100.0 * (cpu_seconds() - c0) / ((double)(harness_now_ms() - t0) / 1000.0);
    printf("idle after them: %.3f%% of one core\n", pct);
    assert_true(pct < 5.0);
    assert_int_equal(ferry_batch_free(b), 0);
    ferry_deregister(p->initiator, src);
    ferry_deregister(p->target, dst);
    free(src);
    free(dst);
    harness_pair_free(p);
}

static void completion_config_fields(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    assert_int_equal(cfg.cancel_timeout_ms, 1000);
    assert_int_equal(cfg.spin_us, 0);
    setenv("FERRY_CANCEL_TIMEOUT_MS", "250", 1);
    setenv("FERRY_SPIN_US", "50", 1);
    assert_int_equal(ferry_config_from_env(&cfg), 0);
    assert_int_equal(cfg.cancel_timeout_ms, 250);
    assert_int_equal(cfg.spin_us, 50);
    setenv("FERRY_SPIN_US", "2000000", 1);
    assert_int_equal(ferry_config_from_env(&cfg), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("FERRY_SPIN_US");
    unsetenv("FERRY_SPIN_US");
    unsetenv("FERRY_CANCEL_TIMEOUT_MS");
    ferry_engine_t *e = NULL;
    ferry_config_init(&cfg);
    cfg.cancel_timeout_ms = 0;
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("cancel_timeout_ms");
    ferry_config_init(&cfg);
    cfg.spin_us = -2;
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("spin_us");
    setenv("FERRY_SPIN_US", "-1", 1); /* never spin */
    assert_int_equal(ferry_config_from_env(&cfg), 0);
    assert_int_equal(cfg.spin_us, -1);
    setenv("FERRY_SPIN_US", "-2", 1);
    assert_int_equal(ferry_config_from_env(&cfg), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("FERRY_SPIN_US");
    unsetenv("FERRY_SPIN_US");
    ferry_config_init(&cfg);
    cfg.spin_us = -1;
    ferry_engine_destroy(harness_engine_cfg(&cfg));
}

/* The codes a cancel or an expiry can end with say by themselves what to do. */
static void cancel_codes_say_what_to_do(void **state)
{
    (void)state;
    assert_true(ferry_error_retryable(FERRY_ERR_TIMEOUT));
    assert_false(ferry_error_retryable(FERRY_ERR_CANCELLED));
    assert_false(ferry_error_retryable(FERRY_ERR_CANCEL_UNCONFIRMED));
    assert_non_null(strstr(ferry_error_advice(FERRY_ERR_CANCEL_UNCONFIRMED), "do not reuse"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(many_small_writes_visible_on_return, setup, teardown),
        cmocka_unit_test_setup_teardown(sync_batch_visible_on_return, setup, teardown),
        cmocka_unit_test_setup_teardown(async_completed_means_visible, setup, teardown),
        cmocka_unit_test_setup_teardown(idle_engines_burn_no_cpu, setup, teardown),
        cmocka_unit_test(bounded_spin_wait),
        cmocka_unit_test(adaptive_spin_budget_follows_recent_waits),
        cmocka_unit_test(long_regular_waits_nap_then_spin),
        cmocka_unit_test(nap_ends_on_data_or_time),
        cmocka_unit_test(answers_to_regular_work_nap_and_arrive),
        cmocka_unit_test(idle_after_small_round_trips_burns_no_cpu),
        cmocka_unit_test(batch_waits_spin_adaptively_and_idle_burns_no_cpu),
        cmocka_unit_test(completion_config_fields),
        cmocka_unit_test(cancel_codes_say_what_to_do),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
