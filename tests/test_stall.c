/* SPDX-License-Identifier: Apache-2.0 */
/* Peers that stall hold no serving thread past the target's timeout_ms
 * (issue 20, item 7). Each case runs on a target with the fewest serving
 * threads (FERRY_SERVE_THREADS=3: one for data frames, two kept for
 * handshakes and control frames) and a short deadline, so that a
 * connection keeping a thread while its peer stalls would delay an honest
 * peer by a deadline per staller, and the case fails:
 *  - peers that flood PINGs, WRITEs and READVs and never read the answers:
 *    a PING on a fresh connection and an honest write are served within a
 *    fraction of the deadline, and the non-readers are closed at it;
 *  - peers that stall in a checksummed WRITEV larger than the kernel will
 *    wait for (SO_RCVLOWAT caps at half the largest receive buffer): the
 *    honest write is served while they stall;
 *  - as many peers stalled mid-frame as the target serves: an honest
 *    newcomer takes the place of the one stalled the longest;
 *  - 512 and more idle connections from 127.0.0.1 (every peer on one
 *    host): a newcomer from 127.0.0.1 is admitted, an idle one makes way. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/crc32c.h"
#include "engine/testing.h"
#include "link/conn.h"
#include "fault.h"
#include "harness.h"

#define DEADLINE_MS 1000
#define MEM_BYTES (1u << 20)

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

typedef struct target {
    ferry_engine_t *e;
    unsigned char *mem;
    size_t len;
} target_t;

/* A TCP target with three serving threads, deadline ms for frames, and
 * len bytes registered (reserved, touched only where written). */
static void target_open(target_t *t, int deadline_ms, size_t len, int max_conns, int per_source)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = deadline_ms;
    cfg.connect_timeout_ms = 5000;
    if (max_conns) cfg.max_connections = max_conns;
    cfg.max_connections_per_source = per_source;
    setenv("FERRY_SERVE_THREADS", "3", 1);
    t->e = harness_engine_cfg(&cfg);
    unsetenv("FERRY_SERVE_THREADS");
    t->len = len;
    t->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(t->mem != MAP_FAILED);
    assert_int_equal(ferry_register(t->e, t->mem, len, FERRY_MEM_REMOTE), 0);
}

static void target_close(target_t *t)
{
    ferry_engine_destroy(t->e);
    munmap(t->mem, t->len);
}

/* A handshaken raw connection that reads little: a small receive buffer,
 * so that the target's answers fill the sockets soon. */
static int non_reader(const target_t *t)
{
    int fd = raw_handshaken(ferry_engine_port(t->e));
    assert_true(fd >= 0);
    int small = 4096, one = 1;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* A frame, as bytes. */
typedef struct msg {
    uint8_t b[FERRY_FRAME_HEADER_SIZE + 64];
    size_t n;
    uint64_t total;
} msg_t;

/* Sends count[i] copies of m[i] on fd[i] without blocking, as many as
 * the sockets take within 300 ms. A frame may be cut at the end: hostile. */
static void flood(const int *fd, msg_t *m, const int *count, int n)
{
    uint8_t *buf[64];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++) {
        buf[i] = malloc((size_t)count[i] * m[i].n);
        for (int k = 0; k < count[i]; k++) memcpy(buf[i] + (size_t)k * m[i].n, m[i].b, m[i].n);
    }
    uint64_t t0 = harness_now_ms();
    for (bool more = true; more && harness_now_ms() - t0 < 300;) {
        more = false;
        for (int i = 0; i < n; i++) {
            size_t all = (size_t)count[i] * m[i].n;
            if (m[i].total >= all) continue;
            ssize_t got = send(fd[i], buf[i] + m[i].total, all - m[i].total, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (got > 0) m[i].total += (uint64_t)got;
            more = more || m[i].total < all;
        }
        if (more) pause_ms(1);
    }
    for (int i = 0; i < n; i++) free(buf[i]);
}

/* A fresh connection's PING is answered: its latency in ms. */
static uint64_t probe_ms(const target_t *t)
{
    uint64_t t0 = harness_now_ms();
    int fd = raw_handshaken(ferry_engine_port(t->e));
    assert_true(fd >= 0);
    ferry_frame_t f = {.type = FERRY_FRAME_PING, .req_id = 77};
    assert_int_equal(raw_send(fd, &f, NULL), 0);
    assert_int_equal(raw_recv(fd, &f, NULL, 0, 30000), 0);
    assert_int_equal(f.type, FERRY_FRAME_PONG);
    close(fd);
    return harness_now_ms() - t0;
}

/* An honest initiator (its own deadline 10 s) writes 4 KiB: its latency in
 * ms, the bytes checked. */
static uint64_t honest_write_ms(const target_t *t, uint64_t seed)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 10000;
    ferry_engine_t *ini = harness_engine_cfg(&cfg);
    unsigned char *src = malloc(4096);
    harness_fill(src, 4096, seed);
    assert_int_equal(ferry_register(ini, src, 4096, FERRY_MEM_LOCAL), 0);
    unsigned char *dst = t->mem + t->len - 4096;
    uint64_t t0 = harness_now_ms();
    int rc = ferry_transfer_sync(ini, ferry_engine_name(t->e), FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096);
    uint64_t ms = harness_now_ms() - t0;
    if (rc) fail_msg("honest write: %s: %s", ferry_error_name(rc), ferry_last_error_detail());
    assert_true(harness_check(dst, 4096, seed));
    ferry_engine_destroy(ini);
    free(src);
    return ms;
}

/* ------------------------------------------------------- non-readers */

#define SEG_FLOODERS 3
#define PING_FLOODERS 2
#define WRITE_FLOODERS 4
#define READV_FLOODERS 4
#define FLOODERS (SEG_FLOODERS + PING_FLOODERS + WRITE_FLOODERS + READV_FLOODERS)
#define SEGMENTS 4096 /* a segment page of 96 KiB */

static void small_sndbuf(ferry_conn_t *c, void *arg)
{
    (void)arg;
    int small = 4096;
    setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
}

static int served_conns(ferry_engine_t *e)
{
    return ferry_test_conns(e).served;
}

/* Non-reading peers: SEG_QUERYs and PINGs (control frames: their answers
 * once took the threads kept for handshakes and cancels), small WRITEs
 * (their acks) and READVs of 64 KiB (their bytes). Before the fix each
 * held a thread until the deadline, a few at a time: a probe and an
 * honest write waited a deadline or more. */
static void non_readers_hold_no_thread(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, DEADLINE_MS, MEM_BYTES, 0, 0);
    unsigned char *segs = calloc(SEGMENTS, 16);
    for (int i = 0; i < SEGMENTS; i++) assert_int_equal(ferry_register(t.e, segs + 16 * i, 16, FERRY_MEM_REMOTE), 0);
    int fd[FLOODERS], count[FLOODERS];
    static msg_t m[FLOODERS];
    for (int i = 0; i < FLOODERS; i++) {
        fd[i] = non_reader(&t);
        size_t n = FERRY_FRAME_HEADER_SIZE;
        if (i < SEG_FLOODERS) {
            ferry_frame_t f = {.type = FERRY_FRAME_SEG_QUERY, .req_id = 1};
            ferry_frame_encode(&f, m[i].b);
            count[i] = 150; /* 14 MiB of answers: more than the target's socket takes (8 MiB) */
        } else if (i < SEG_FLOODERS + PING_FLOODERS) {
            ferry_frame_t f = {.type = FERRY_FRAME_PING, .req_id = 1};
            ferry_frame_encode(&f, m[i].b);
            count[i] = 2000; /* 125 KiB of PONGs */
        } else if (i < SEG_FLOODERS + PING_FLOODERS + WRITE_FLOODERS) {
            ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = 2, .addr = (uint64_t)(uintptr_t)(t.mem + 64 * i),
                               .len = 64, .plen = 64};
            ferry_frame_encode(&f, m[i].b);
            memset(m[i].b + n, 0x33, 64);
            n += 64;
            count[i] = 2000; /* 125 KiB of acks */
        } else {
            ferry_vec_desc_t d = {.addr = (uint64_t)(uintptr_t)t.mem, .len = 64u << 10, .req_id = 3};
            ferry_frame_t f = {.type = FERRY_FRAME_READV, .req_id = 3, .len = 1, .addr = d.len,
                               .plen = FERRY_WIRE_VEC_DESC_SIZE};
            ferry_frame_encode(&f, m[i].b);
            ferry_vec_desc_encode(&d, m[i].b + n);
            n += FERRY_WIRE_VEC_DESC_SIZE;
            count[i] = 200; /* 12.5 MiB of answers */
        }
        m[i].n = n;
    }
    /* The target's end of each takes little (the kernel grants 4 MiB and
     * more otherwise): PONGs and acks fill it soon too. */
    ferry_test_each_conn(t.e, small_sndbuf, NULL);
    uint64_t t0 = harness_now_ms();
    flood(fd, m, count, FLOODERS);
    uint64_t flooded = harness_now_ms() - t0;
    /* The target answers what came until the sockets are full (on
     * loopback that takes a while: the kernel keeps taking some), then
     * threads that waited for room would be held a deadline each: probe
     * and write every 100 ms meanwhile. */
    uint64_t probe = 0, write = 0;
    for (int round = 0; harness_now_ms() - t0 < 4000; round++) {
        uint64_t p = probe_ms(&t), w = honest_write_ms(&t, (uint64_t)round);
        if (p > probe) probe = p;
        if (w > write) write = w;
        pause_ms(100);
    }
    printf("%d non-readers (flooded in %llu ms): probes within %llu ms, writes within %llu ms (deadline %d ms)\n",
           FLOODERS, (unsigned long long)flooded, (unsigned long long)probe, (unsigned long long)write, DEADLINE_MS);
    assert_true(probe < DEADLINE_MS / 2);
    assert_true(write < DEADLINE_MS * 3 / 4); /* a new initiator each: engine, connect, handshake */
    /* Every non-reader's answers stalled (more than the sockets hold): each
     * is closed once they have not drained for the deadline (a log line
     * names it). */
    int left = FLOODERS;
    for (int i = 0; i < 1000 && (left = served_conns(t.e)) > 0; i++) pause_ms(10);
    printf("%d connections left %llu ms after the flood\n", left, (unsigned long long)(harness_now_ms() - t0));
    assert_int_equal(left, 0);
    for (int i = 0; i < FLOODERS; i++) close(fd[i]);
    assert_true(probe_ms(&t) < DEADLINE_MS / 2);
    target_close(&t);
    free(segs);
}

/* ------------------------------------------- checksummed WRITEV stall */

#define CRC_STALLERS 3

/* The largest receive buffer the kernel grants (tcp_rmem's third field). */
static long rmem_max(void)
{
    long a = 0, b = 0, c = 0;
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_rmem", "r");
    if (f) {
        if (fscanf(f, "%ld %ld %ld", &a, &b, &c) != 3) c = 0;
        fclose(f);
    }
    return c;
}

/* Checksummed WRITEVs larger than half the largest receive buffer (the
 * most SO_RCVLOWAT will wait for) were read with blocking calls up to the
 * deadline: CRC_STALLERS of them held the one data thread in turn. */
static void checksummed_writev_stall_holds_no_thread(void **state)
{
    (void)state;
    long half = rmem_max() / 2;
    size_t pieces = (size_t)(half / FERRY_WIRE_VEC_PIECE_MAX) + 16;
    if (half <= 0 || pieces > FERRY_WIRE_VEC_MAX) {
        printf("skipped: tcp_rmem max %ld is beyond one WRITEV\n", half * 2);
        return;
    }
    size_t data = pieces * FERRY_WIRE_VEC_PIECE_MAX;
    target_t t;
    target_open(&t, 4 * DEADLINE_MS, data + MEM_BYTES, 0, 0);
    uint8_t *descs = calloc(pieces, FERRY_WIRE_VEC_DESC_SIZE);
    static uint8_t zeros[FERRY_WIRE_VEC_PIECE_MAX];
    uint32_t crc = ferry_crc32c(0, zeros, sizeof zeros);
    for (size_t i = 0; i < pieces; i++) {
        ferry_vec_desc_t d = {.addr = (uint64_t)(uintptr_t)(t.mem + i * FERRY_WIRE_VEC_PIECE_MAX),
                              .len = FERRY_WIRE_VEC_PIECE_MAX, .req_id = 10 + i, .aux = crc};
        ferry_vec_desc_encode(&d, descs + i * FERRY_WIRE_VEC_DESC_SIZE);
    }
    int fd[CRC_STALLERS];
    for (int i = 0; i < CRC_STALLERS; i++) {
        fd[i] = raw_handshaken(ferry_engine_port(t.e));
        assert_true(fd[i] >= 0);
        ferry_frame_t f = {.type = FERRY_FRAME_WRITEV, .flags = FERRY_FRAME_F_CRC, .req_id = 10, .len = pieces,
                           .addr = data, .plen = (uint32_t)(pieces * FERRY_WIRE_VEC_DESC_SIZE + data)};
        assert_int_equal(raw_send(fd[i], &f, NULL), 0);
        assert_int_equal(raw_send_bytes(fd[i], descs, pieces * FERRY_WIRE_VEC_DESC_SIZE), 0);
        assert_int_equal(raw_send_bytes(fd[i], zeros, sizeof zeros), 0); /* one piece of many */
    }
    pause_ms(50);
    uint64_t write = honest_write_ms(&t, 2), probe = probe_ms(&t);
    printf("%d checksummed WRITEVs of %zu bytes stalled: a write in %llu ms, a probe in %llu ms (deadline %d ms)\n",
           CRC_STALLERS, data, (unsigned long long)write, (unsigned long long)probe, 4 * DEADLINE_MS);
    assert_true(write < 2 * DEADLINE_MS);
    assert_true(probe < 2 * DEADLINE_MS);
    for (int i = 0; i < CRC_STALLERS; i++) {
        assert_true(raw_closed_within(fd[i], 5 * 4 * DEADLINE_MS));
        close(fd[i]);
    }
    free(descs);
    target_close(&t);
}

/* ------------------------------------------------ stalled mid-frame */

#define CAP 16

static int established(ferry_engine_t *e)
{
    return ferry_test_conns(e).established;
}

static void wait_established(ferry_engine_t *e, int n)
{
    for (int i = 0; i < 500 && established(e) != n; i++) pause_ms(10);
    assert_int_equal(established(e), n);
}

/* Every place taken by a peer stalled mid-frame (half a header, or a
 * WRITE's header and part of its payload): they counted as busy and were
 * never evicted, so newcomers were refused until the deadline. Now the one
 * stalled the longest makes way, once stalled a tenth of the deadline. */
static void stalled_mid_frame_make_way(void **state)
{
    (void)state;
    enum { DEADLINE = 10000 }; /* far beyond the case: only eviction frees places */
    target_t t;
    target_open(&t, DEADLINE, MEM_BYTES, CAP, CAP);
    uint16_t port = ferry_engine_port(t.e);
    int fd[CAP];
    for (int i = 0; i < CAP; i++) {
        assert_true((fd[i] = raw_handshaken_from(2 + i % 4, port)) >= 0);
        uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
        if (i % 2) {
            ferry_frame_t f = {.type = FERRY_FRAME_PING, .req_id = 1};
            ferry_frame_encode(&f, hdr);
            assert_int_equal(raw_send_bytes(fd[i], hdr, sizeof hdr / 2), 0);
        } else {
            ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = 1, .addr = (uint64_t)(uintptr_t)(t.mem + 4096 * i),
                               .len = 4096, .plen = 4096};
            uint8_t part[100] = {0};
            assert_int_equal(raw_send(fd[i], &f, NULL), 0);
            assert_int_equal(raw_send_bytes(fd[i], part, sizeof part), 0);
        }
        pause_ms(5); /* distinct stall ages */
    }
    wait_established(t.e, CAP);
    /* Younger than a tenth of the deadline: a pause, not a stall. */
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(t.e, &st), 0);
    uint64_t evicted = st.connections_evicted;
    pause_ms(DEADLINE / 10 + 200);
    uint64_t t0 = harness_now_ms();
    uint64_t write = honest_write_ms(&t, 3);
    printf("%d stalled mid-frame: an honest write in %llu ms\n", CAP, (unsigned long long)(harness_now_ms() - t0));
    (void)write;
    assert_int_equal(ferry_engine_stats(t.e, &st), 0);
    assert_true(st.connections_evicted > evicted);
    assert_true(raw_closed_within(fd[0], 2000)); /* stalled the longest */
    assert_false(raw_closed_within(fd[CAP - 1], 100));
    for (int i = 0; i < CAP; i++) close(fd[i]);
    target_close(&t);
}

/* ------------------------------------------------ one host, one source */

#define IDLE_CONNS 520

/* 512 idle connections from one address once locked that address out for
 * good (only its handshaking ones made way): on one host every peer is
 * 127.0.0.1. With the default limits, and with a per-source limit set,
 * a newcomer from that address is admitted. */
static void one_address_never_locked_out(void **state)
{
    (void)state;
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < 2 * IDLE_CONNS + 256) {
        printf("skipped: %llu file descriptors\n", (unsigned long long)rl.rlim_cur);
        return;
    }
    /* Defaults: 2,048 connections, loopback one source for the host. */
    target_t t;
    target_open(&t, 5000, MEM_BYTES, 0, 0);
    uint16_t port = ferry_engine_port(t.e);
    static int fd[IDLE_CONNS];
    for (int i = 0; i < IDLE_CONNS; i++) assert_true((fd[i] = raw_handshaken_from(1, port)) >= 0);
    wait_established(t.e, IDLE_CONNS);
    assert_true(honest_write_ms(&t, 4) < 5000);
    for (int i = 0; i < IDLE_CONNS; i++) close(fd[i]);
    target_close(&t);

    /* A per-source limit set: the source's own idle ones make way. */
    enum { LIMIT = 64 };
    target_open(&t, 5000, MEM_BYTES, 0, LIMIT);
    port = ferry_engine_port(t.e);
    for (int i = 0; i < LIMIT; i++) {
        assert_true((fd[i] = raw_handshaken_from(1, port)) >= 0);
        pause_ms(1);
    }
    wait_established(t.e, LIMIT);
    assert_true(honest_write_ms(&t, 5) < 5000);
    assert_true(raw_closed_within(fd[0], 2000)); /* idle the longest */
    assert_false(raw_closed_within(fd[LIMIT - 1], 100));
    for (int i = 0; i < LIMIT; i++) close(fd[i]);
    target_close(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(non_readers_hold_no_thread),
        cmocka_unit_test(checksummed_writev_stall_holds_no_thread),
        cmocka_unit_test(stalled_mid_frame_make_way),
        cmocka_unit_test(one_address_never_locked_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
