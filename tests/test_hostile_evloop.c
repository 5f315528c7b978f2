/* SPDX-License-Identifier: Apache-2.0 */
/* Hostile input against the event loop's incremental parsing (evloop.c):
 * the target reads handshakes and frame headers as their bytes arrive and
 * parks the connection in between, so a slow or stalling peer holds no
 * serving thread. Each case runs on a target with the fewest serving
 * threads (FERRY_SERVE_THREADS=3: one for data frames, two for handshakes
 * and control frames), so that a connection that kept a thread while it
 * waited for bytes would starve the others and the case would fail:
 *  - many handshakes and frames sent one byte at a time, interleaved, with
 *    pauses, and a WRITE whose header arrives whole before a pause and its
 *    payload after: all answered, the bytes placed;
 *  - peers that hang up at every point of a header sent byte by byte;
 *  - a peer that sends its HELLO and frames in one stream without waiting
 *    for the answers, at once and a byte at a time;
 *  - peers that stall after half a header (before and after the handshake),
 *    more of them than serving threads: a well-behaved initiator with a
 *    shorter deadline than the target's still transfers, and the stallers
 *    are ended by the target's own deadlines;
 *  - oversize and garbage headers arriving in pieces: dropped, nothing
 *    placed, the target still serving;
 *  - peers that send a WRITE's, NOTIFY's or WRITEV's header and part of its
 *    payload, then stop or trickle a byte every 100 ms, more of them than
 *    data threads: the frames are parked mid-payload (a WRITE's handler
 *    parks on its own, other frames wait parked until their payload is
 *    whole), a well-behaved initiator still transfers long before their
 *    deadline, and they are ended at it with TIMEOUT;
 *  - a WRITE parked mid-payload (a thread waiting for a payload gives its
 *    slot up as soon as another data frame waits for one) keeps the guarantees: refused, checksummed,
 *    cancelled or deregistered while parked, each is answered as it would
 *    be whole, and no byte lands after the cancel or deregistration; a peer
 *    that hangs up mid-payload is ended at once;
 *  - peers that ask for more READ answers than the sockets hold and stop
 *    reading, more of them than data threads: the answers are parked until
 *    the socket has room, a well-behaved initiator still transfers, and
 *    the readers are dropped at the target's deadline. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/crc32c.h"
#include "engine/testing.h"
#include "serve/evloop.h"
#include "fault.h"
#include "harness.h"

#define TIMEOUT_MS 2000
#define MEM_BYTES (64u << 10)
#define HELLO_MAX (FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME)
#define SLOW_CONNS 8 /* more than the serving threads */

static void pause_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

typedef struct target {
    ferry_engine_t *e;
    unsigned char *mem; /* remote read+write, between PROT_NONE guard pages */
    unsigned char *map;
} target_t;

/* A TCP target with three serving threads and deadline ms for frames and
 * handshakes. */
static void target_open(target_t *t, int deadline_ms)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = deadline_ms;
    cfg.connect_timeout_ms = deadline_ms;
    setenv("FERRY_SERVE_THREADS", "3", 1);
    t->e = harness_engine_cfg(&cfg);
    unsetenv("FERRY_SERVE_THREADS");
    t->map = mmap(NULL, MEM_BYTES + 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(t->map != MAP_FAILED);
    assert_int_equal(mprotect(t->map, 4096, PROT_NONE), 0);
    assert_int_equal(mprotect(t->map + 4096 + MEM_BYTES, 4096, PROT_NONE), 0);
    t->mem = t->map + 4096;
    assert_int_equal(ferry_register(t->e, t->mem, MEM_BYTES, FERRY_MEM_REMOTE), 0);
}

static void target_close(target_t *t)
{
    ferry_engine_destroy(t->e);
    munmap(t->map, MEM_BYTES + 8192);
}

static bool untouched(const target_t *t)
{
    for (size_t i = 0; i < MEM_BYTES; i++)
        if (t->mem[i]) return false;
    return true;
}

/* A raw connection whose every send leaves at once (no Nagle coalescing). */
static int slow_connect(const target_t *t)
{
    int fd = raw_connect(ferry_engine_port(t->e));
    assert_true(fd >= 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* The bytes of a frame: header, then payload. */
typedef struct wire_msg {
    uint8_t b[FERRY_FRAME_HEADER_SIZE + HELLO_MAX + 256];
    size_t n;
} wire_msg_t;

static void msg_frame(wire_msg_t *m, const ferry_frame_t *f, const void *payload)
{
    assert_true(FERRY_FRAME_HEADER_SIZE + f->plen <= sizeof m->b);
    ferry_frame_encode(f, m->b);
    if (f->plen && payload) memcpy(m->b + FERRY_FRAME_HEADER_SIZE, payload, f->plen);
    m->n = FERRY_FRAME_HEADER_SIZE + f->plen;
}

static void msg_hello(wire_msg_t *m, int i)
{
    ferry_hello_t h;
    memset(&h, 0, sizeof h);
    h.proto_min = h.proto_max = FERRY_PROTOCOL_VERSION;
    h.engine_id = 0x51000 + (uint64_t)i;
    h.epoch = 1;
    h.pid = 1;
    snprintf(h.name, sizeof h.name, "slow:%d", i);
    uint8_t p[HELLO_MAX];
    int n = ferry_hello_encode(&h, p, sizeof p);
    assert_true(n > 0);
    ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n};
    msg_frame(m, &f, p);
}

/* Sends m[i] to fd[i] for every i, one byte per connection per turn, with
 * a pause between turns: every message is half-way at the same time. */
static void send_interleaved(const int *fd, const wire_msg_t *m, int n, size_t from, size_t to, long gap_us)
{
    for (size_t k = from; k < to; k++) {
        for (int i = 0; i < n; i++)
            if (k < m[i].n) assert_int_equal(raw_send_bytes(fd[i], m[i].b + k, 1), 0);
        pause_us(gap_us);
    }
}

static size_t max_len(const wire_msg_t *m, int n)
{
    size_t most = 0;
    for (int i = 0; i < n; i++)
        if (m[i].n > most) most = m[i].n;
    return most;
}

static void expect_frame(int fd, uint8_t type, uint64_t req_id, int status)
{
    ferry_frame_t f;
    char text[1100] = "";
    assert_int_equal(raw_recv(fd, &f, text, sizeof text - 1, 10 * TIMEOUT_MS), 0);
    if (f.type != type || f.status != status)
        fail_msg("got %s status %d (%s), wanted %s status %d", ferry_frame_type_name(f.type), f.status, text,
                 ferry_frame_type_name(type), status);
    if (req_id) assert_int_equal(f.req_id, req_id);
}

/* An ERROR frame (any code) or a silent close: the connection is dropped. */
static void expect_dropped(int fd)
{
    ferry_frame_t f;
    char text[1100];
    int rc = raw_recv(fd, &f, text, sizeof text - 1, 10 * TIMEOUT_MS);
    if (rc == 0) {
        assert_int_equal(f.type, FERRY_FRAME_ERROR);
        assert_true(f.status < 0);
    } else {
        assert_int_equal(rc, -1);
    }
    assert_true(raw_closed_within(fd, 10 * TIMEOUT_MS));
    close(fd);
}

/* The target answers a ping on a fresh connection. */
static void still_serving(const target_t *t)
{
    int fd = raw_handshaken(ferry_engine_port(t->e));
    assert_true(fd >= 0);
    ferry_frame_t f = {.type = FERRY_FRAME_PING, .req_id = 77};
    assert_int_equal(raw_send(fd, &f, NULL), 0);
    expect_frame(fd, FERRY_FRAME_PONG, 77, 0);
    close(fd);
}

/* SLOW_CONNS peers at once: HELLO, PING, then a WRITE whose header comes
 * whole, a pause, then its payload, every byte on its own with pauses
 * between. Each is answered; every WRITE lands where it was sent. */
static void byte_by_byte_interleaved(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, TIMEOUT_MS);
    assert_int_equal(ferry_evloop_threads(t.e), 3);
    int fd[SLOW_CONNS];
    wire_msg_t m[SLOW_CONNS];
    for (int i = 0; i < SLOW_CONNS; i++) {
        fd[i] = slow_connect(&t);
        msg_hello(&m[i], i);
    }
    send_interleaved(fd, m, SLOW_CONNS, 0, max_len(m, SLOW_CONNS), 300);
    for (int i = 0; i < SLOW_CONNS; i++) expect_frame(fd[i], FERRY_FRAME_HELLO_ACK, 0, 0);

    for (int i = 0; i < SLOW_CONNS; i++) {
        ferry_frame_t f = {.type = FERRY_FRAME_PING, .req_id = 1000 + (uint64_t)i};
        msg_frame(&m[i], &f, NULL);
    }
    send_interleaved(fd, m, SLOW_CONNS, 0, FERRY_FRAME_HEADER_SIZE, 300);
    for (int i = 0; i < SLOW_CONNS; i++) expect_frame(fd[i], FERRY_FRAME_PONG, 1000 + (uint64_t)i, 0);

    uint8_t data[SLOW_CONNS][200];
    for (int i = 0; i < SLOW_CONNS; i++) {
        memset(data[i], 0xa0 + i, sizeof data[i]);
        ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = 2000 + (uint64_t)i,
                           .addr = (uint64_t)(uintptr_t)(t.mem + 1024 * i), .len = 200, .plen = 200};
        msg_frame(&m[i], &f, data[i]);
    }
    /* Headers whole, then a pause longer than the serving threads' hold,
     * split right before the payload. */
    send_interleaved(fd, m, SLOW_CONNS, 0, FERRY_FRAME_HEADER_SIZE, 300);
    pause_us(200 * 1000);
    send_interleaved(fd, m, SLOW_CONNS, FERRY_FRAME_HEADER_SIZE, max_len(m, SLOW_CONNS), 100);
    for (int i = 0; i < SLOW_CONNS; i++) {
        expect_frame(fd[i], FERRY_FRAME_WRITE_ACK, 2000 + (uint64_t)i, 0);
        assert_memory_equal(t.mem + 1024 * i, data[i], sizeof data[i]);
        close(fd[i]);
    }
    still_serving(&t);
    target_close(&t);
}

/* The target's connections still in their handshake (listener.c). */
static int handshaking(const target_t *t)
{
    return ferry_test_conns(t->e).handshaking;
}

/* Waits until the target ended every connection that hung up in its
 * handshake (at the latest by its handshake deadline), so that the next
 * ones are not refused by the per-source handshake limit meanwhile. */
static void wait_no_handshakes(const target_t *t)
{
    uint64_t until = harness_now_ms() + 10 * TIMEOUT_MS;
    while (handshaking(t) > 0 && harness_now_ms() < until) pause_us(1000);
    assert_int_equal(handshaking(t), 0);
}

/* Header and hello bytes sent one at a time, the peer hanging up after
 * each count of them: before the handshake (in the HELLO header and its
 * payload) and after it (in a WRITE header). Nothing placed; the target
 * serves the next peer. */
static void hang_up_mid_header(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, TIMEOUT_MS);
    wire_msg_t hello, write;
    msg_hello(&hello, 0);
    uint8_t data[64];
    memset(data, 0x5c, sizeof data);
    ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = 9, .addr = (uint64_t)(uintptr_t)t.mem, .len = 64,
                       .plen = 64};
    msg_frame(&write, &f, data);
    for (size_t cut = 1; cut < hello.n; cut += (cut < FERRY_FRAME_HEADER_SIZE ? 5 : 17)) {
        int fd[SLOW_CONNS];
        for (int i = 0; i < SLOW_CONNS; i++) fd[i] = slow_connect(&t);
        wire_msg_t m[SLOW_CONNS];
        for (int i = 0; i < SLOW_CONNS; i++) m[i] = hello;
        send_interleaved(fd, m, SLOW_CONNS, 0, cut, 50);
        for (int i = 0; i < SLOW_CONNS; i++) close(fd[i]);
        wait_no_handshakes(&t);
    }
    for (size_t cut = 1; cut < FERRY_FRAME_HEADER_SIZE; cut += 5) {
        int fd[SLOW_CONNS];
        wire_msg_t m[SLOW_CONNS];
        for (int i = 0; i < SLOW_CONNS; i++) {
            fd[i] = raw_handshaken(ferry_engine_port(t.e));
            assert_true(fd[i] >= 0);
            m[i] = write;
        }
        send_interleaved(fd, m, SLOW_CONNS, 0, cut, 50);
        for (int i = 0; i < SLOW_CONNS; i++) close(fd[i]);
    }
    still_serving(&t);
    assert_true(untouched(&t));
    target_close(&t);
}

/* Peers that stall after half a header, before and after their handshake,
 * four times as many as the serving threads, on a target whose deadlines
 * are long. A well-behaved initiator whose own deadline is much shorter
 * still opens a session and transfers: no staller holds a thread. Then
 * the stallers are ended by the target's deadlines (handshake:
 * connect_timeout_ms; a header begun: timeout_ms), without a word or with
 * an ERROR. */
#define STALL_DEADLINE_MS 15000
#define STALLERS 12
static void half_header_stallers_hold_no_thread(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, STALL_DEADLINE_MS);
    int fd[2 * STALLERS];
    wire_msg_t hello;
    msg_hello(&hello, 1);
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = 5, .addr = (uint64_t)(uintptr_t)t.mem, .len = 64,
                       .plen = 64};
    ferry_frame_encode(&f, hdr);
    for (int i = 0; i < STALLERS; i++) {
        fd[i] = slow_connect(&t);
        assert_int_equal(raw_send_bytes(fd[i], hello.b, FERRY_FRAME_HEADER_SIZE / 2), 0);
        fd[STALLERS + i] = raw_handshaken(ferry_engine_port(t.e));
        assert_true(fd[STALLERS + i] >= 0);
        assert_int_equal(raw_send_bytes(fd[STALLERS + i], hdr, FERRY_FRAME_HEADER_SIZE / 2), 0);
    }
    uint64_t stalled_at = harness_now_ms();

    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = STALL_DEADLINE_MS / 3;
    cfg.connect_timeout_ms = STALL_DEADLINE_MS / 3;
    ferry_engine_t *ini = harness_engine_cfg(&cfg);
    unsigned char *src = malloc(4096);
    assert_int_equal(ferry_register(ini, src, 4096, FERRY_MEM_LOCAL), 0);
    const char *peer = ferry_engine_name(t.e);
    for (int round = 0; round < 10; round++) {
        harness_fill(src, 4096, (uint64_t)round);
        int rc = ferry_transfer_sync(ini, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)t.mem + 8192, 4096);
        if (rc) fail_msg("round %d: %s: %s", round, ferry_error_name(rc), ferry_last_error_detail());
        assert_true(harness_check(t.mem + 8192, 4096, (uint64_t)round));
    }
    uint64_t served_at = harness_now_ms();
    /* Served before any staller's deadline, so while they all stalled. */
    printf("10 transfers %llu ms after %d stallers (their deadline: %d ms)\n",
           (unsigned long long)(served_at - stalled_at), 2 * STALLERS, STALL_DEADLINE_MS);
    assert_true(served_at - stalled_at < STALL_DEADLINE_MS);
    for (int i = 0; i < 2 * STALLERS; i++) {
        assert_true(raw_closed_within(fd[i], 4 * STALL_DEADLINE_MS));
        close(fd[i]);
    }
    ferry_engine_destroy(ini);
    free(src);
    memset(t.mem + 8192, 0, 4096);
    assert_true(untouched(&t));
    still_serving(&t);
    target_close(&t);
}

/* Headers no frame may have, arriving in pieces with pauses: a WRITE
 * claiming more payload than the wire allows, a HELLO claiming a huge
 * payload, a wrong magic, and bytes of noise. Each connection is dropped
 * (ERROR or close), nothing is placed. */
static void bad_headers_in_pieces(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, TIMEOUT_MS);
    uint8_t oversize[FERRY_FRAME_HEADER_SIZE], huge_hello[FERRY_FRAME_HEADER_SIZE], bad_magic[FERRY_FRAME_HEADER_SIZE],
        noise[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = 3, .addr = (uint64_t)(uintptr_t)t.mem,
                       .len = (uint64_t)FERRY_WIRE_MAX_DATA + 1, .plen = FERRY_WIRE_MAX_DATA + 1};
    ferry_frame_encode(&f, oversize);
    f = (ferry_frame_t){.type = FERRY_FRAME_HELLO, .plen = UINT32_MAX};
    ferry_frame_encode(&f, huge_hello);
    f = (ferry_frame_t){.type = FERRY_FRAME_PING, .req_id = 4};
    ferry_frame_encode(&f, bad_magic);
    bad_magic[0] ^= 0xff;
    srand(7);
    for (size_t i = 0; i < sizeof noise; i++) noise[i] = (uint8_t)rand();
    struct {
        const uint8_t *hdr;
        bool handshaken;
    } cases[] = {
        {oversize, true}, {huge_hello, false}, {bad_magic, true}, {bad_magic, false}, {noise, true}, {noise, false},
    };
    const size_t pieces[] = {1, 7, 28};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
            int fd = cases[c].handshaken ? raw_handshaken(ferry_engine_port(t.e)) : slow_connect(&t);
            assert_true(fd >= 0);
            for (size_t k = 0; k < FERRY_FRAME_HEADER_SIZE; k += pieces[p]) {
                size_t n = FERRY_FRAME_HEADER_SIZE - k < pieces[p] ? FERRY_FRAME_HEADER_SIZE - k : pieces[p];
                /* The target may drop it before the last piece. */
                if (raw_send_bytes(fd, cases[c].hdr + k, n) != 0) break;
                pause_us(20 * 1000);
            }
            expect_dropped(fd);
        }
    }
    assert_true(untouched(&t));
    still_serving(&t);
    target_close(&t);
}

/* A peer that does not wait for answers: HELLO, PING, WRITE and PING in
 * one stream, sent at once and sent a byte at a time. The target reads
 * each frame's bytes and no more (the next frame stays in the socket for
 * the next step): the four answers come in order, the bytes are placed. */
static void pipelined_without_waiting(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, TIMEOUT_MS);
    for (int slowly = 0; slowly < 2; slowly++) {
        wire_msg_t hello, ping, write, ping2;
        msg_hello(&hello, 40 + slowly);
        ferry_frame_t f = {.type = FERRY_FRAME_PING, .req_id = 71};
        msg_frame(&ping, &f, NULL);
        uint8_t data[100];
        memset(data, 0x3e + slowly, sizeof data);
        f = (ferry_frame_t){.type = FERRY_FRAME_WRITE, .req_id = 72,
                            .addr = (uint64_t)(uintptr_t)(t.mem + 4096 * slowly), .len = 100, .plen = 100};
        msg_frame(&write, &f, data);
        f = (ferry_frame_t){.type = FERRY_FRAME_PING, .req_id = 73};
        msg_frame(&ping2, &f, NULL);
        uint8_t stream[4 * sizeof hello.b];
        size_t n = 0;
        const wire_msg_t *parts[] = {&hello, &ping, &write, &ping2};
        for (int i = 0; i < 4; i++) {
            memcpy(stream + n, parts[i]->b, parts[i]->n);
            n += parts[i]->n;
        }
        int fd = slow_connect(&t);
        if (slowly) {
            for (size_t k = 0; k < n; k++) {
                assert_int_equal(raw_send_bytes(fd, stream + k, 1), 0);
                pause_us(200);
            }
        } else {
            assert_int_equal(raw_send_bytes(fd, stream, n), 0);
        }
        expect_frame(fd, FERRY_FRAME_HELLO_ACK, 0, 0);
        expect_frame(fd, FERRY_FRAME_PONG, 71, 0);
        expect_frame(fd, FERRY_FRAME_WRITE_ACK, 72, 0);
        expect_frame(fd, FERRY_FRAME_PONG, 73, 0);
        assert_memory_equal(t.mem + 4096 * slowly, data, sizeof data);
        close(fd);
    }
    still_serving(&t);
    target_close(&t);
}

/* Peers that begin a WRITE and stall in its payload. */
#define PAYLOAD_STALLERS 6 /* more than the one data thread */
#define PAYLOAD_BYTES 4096
#define PAYLOAD_SENT 100   /* of it, before stalling */
#define TRICKLE_GAP_US (100 * 1000)

typedef struct trickler {
    const int *fd;
    int n;
    atomic_bool stop;
} trickler_t;

/* One more byte of each stalled payload every TRICKLE_GAP_US, until told
 * to stop (sends to a connection the target closed just fail). */
static void *trickle_main(void *arg)
{
    trickler_t *t = arg;
    const uint8_t b = 0x5a;
    while (!atomic_load(&t->stop)) {
        for (int i = 0; i < t->n; i++) (void)!send(t->fd[i], &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        pause_us(TRICKLE_GAP_US);
    }
    return NULL;
}

/* An ERROR frame saying TIMEOUT within ms, then the connection closed. */
static void expect_timed_out(int fd, int ms)
{
    ferry_frame_t f;
    char text[1100] = "";
    assert_int_equal(raw_recv(fd, &f, text, sizeof text - 1, ms), 0);
    if (f.type != FERRY_FRAME_ERROR || f.status != FERRY_ERR_TIMEOUT)
        fail_msg("got %s status %d (%s), wanted ERROR TIMEOUT", ferry_frame_type_name(f.type), f.status, text);
    assert_non_null(strstr(text, "stalled"));
    assert_true(raw_closed_within(fd, ms));
}

/* PAYLOAD_STALLERS handshaken peers each send a WRITE, NOTIFY or WRITEV
 * header and PAYLOAD_SENT of its PAYLOAD_BYTES, then stop (or trickle). A serving
 * thread that waited in such a payload would hold the only data thread
 * until the target's deadline (STALL_DEADLINE_MS) and the initiator's
 * transfers (a third of it) would time out behind it. */
static void payload_stallers(bool trickle)
{
    target_t t;
    target_open(&t, STALL_DEADLINE_MS);
    /* Static: a failed assertion leaves the trickling thread running. */
    static int fd[PAYLOAD_STALLERS];
    static trickler_t tr;
    uint8_t part[PAYLOAD_SENT];
    memset(part, 0x77, sizeof part);
    for (int i = 0; i < PAYLOAD_STALLERS; i++) {
        fd[i] = raw_handshaken(ferry_engine_port(t.e));
        assert_true(fd[i] >= 0);
        int one = 1;
        setsockopt(fd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        const uint8_t types[] = {FERRY_FRAME_WRITE, FERRY_FRAME_NOTIFY, FERRY_FRAME_WRITEV};
        ferry_frame_t f = {.type = types[i % 3], .req_id = 300 + (uint64_t)i,
                           .addr = (uint64_t)(uintptr_t)(t.mem + PAYLOAD_BYTES * i), .len = PAYLOAD_BYTES,
                           .plen = PAYLOAD_BYTES};
        uint8_t sent[PAYLOAD_SENT];
        memcpy(sent, part, sizeof sent);
        if (f.type == FERRY_FRAME_WRITEV) { /* one piece: its descriptor, then its bytes */
            ferry_vec_desc_t d = {.addr = f.addr, .len = PAYLOAD_BYTES - FERRY_WIRE_VEC_DESC_SIZE};
            ferry_vec_desc_encode(&d, sent);
            f.len = 1;
            f.addr = d.len;
        }
        assert_int_equal(raw_send(fd[i], &f, NULL), 0);
        assert_int_equal(raw_send_bytes(fd[i], sent, sizeof sent), 0);
    }
    uint64_t stalled_at = harness_now_ms();
    tr = (trickler_t){.fd = fd, .n = PAYLOAD_STALLERS};
    pthread_t th;
    if (trickle) assert_int_equal(pthread_create(&th, NULL, trickle_main, &tr), 0);

    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = STALL_DEADLINE_MS / 3;
    ferry_engine_t *ini = harness_engine_cfg(&cfg);
    unsigned char *src = malloc(4096);
    assert_int_equal(ferry_register(ini, src, 4096, FERRY_MEM_LOCAL), 0);
    const char *peer = ferry_engine_name(t.e);
    unsigned char *dst = t.mem + MEM_BYTES - 4096;
    for (int round = 0; round < 10; round++) {
        harness_fill(src, 4096, (uint64_t)round);
        int rc = ferry_transfer_sync(ini, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096);
        if (rc) fail_msg("round %d: %s: %s", round, ferry_error_name(rc), ferry_last_error_detail());
        assert_true(harness_check(dst, 4096, (uint64_t)round));
    }
    uint64_t served_at = harness_now_ms();
    printf("10 transfers %llu ms after %d %s (their deadline: %d ms)\n",
           (unsigned long long)(served_at - stalled_at), PAYLOAD_STALLERS, trickle ? "tricklers" : "stallers",
           STALL_DEADLINE_MS);
    /* Served before any staller's deadline, so while they all stalled. */
    assert_true(served_at - stalled_at < STALL_DEADLINE_MS);
    for (int i = 0; i < PAYLOAD_STALLERS; i++) expect_timed_out(fd[i], 4 * STALL_DEADLINE_MS);
    if (trickle) {
        atomic_store(&tr.stop, true);
        pthread_join(th, NULL);
    }
    for (int i = 0; i < PAYLOAD_STALLERS; i++) close(fd[i]);
    ferry_engine_destroy(ini);
    free(src);
    still_serving(&t);
    target_close(&t);
}

/* Enough 64 KiB READ answers to fill the target's send buffer (4 MiB asked,
 * 8 MiB granted) and the reader's receive buffer several times over. */
#define STALLED_READS 384
#define STALLED_READERS 3

static void stalled_readers_hold_no_thread(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, STALL_DEADLINE_MS);
    int fd[STALLED_READERS];
    for (int i = 0; i < STALLED_READERS; i++) {
        fd[i] = raw_handshaken(ferry_engine_port(t.e));
        assert_true(fd[i] >= 0);
        for (int k = 0; k < STALLED_READS; k++) {
            ferry_frame_t f = {.type = FERRY_FRAME_READ_REQ, .req_id = 1 + (uint64_t)k,
                               .addr = (uint64_t)(uintptr_t)t.mem, .len = MEM_BYTES};
            assert_int_equal(raw_send(fd[i], &f, NULL), 0);
        }
    }
    uint64_t stalled_at = harness_now_ms();

    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = STALL_DEADLINE_MS / 3;
    ferry_engine_t *ini = harness_engine_cfg(&cfg);
    unsigned char *src = malloc(4096);
    assert_int_equal(ferry_register(ini, src, 4096, FERRY_MEM_LOCAL), 0);
    for (int round = 0; round < 10; round++) {
        harness_fill(src, 4096, (uint64_t)round);
        int rc = ferry_transfer_sync(ini, ferry_engine_name(t.e), FERRY_OP_WRITE, src,
                                     (uint64_t)(uintptr_t)(t.mem + MEM_BYTES - 4096), 4096);
        if (rc) fail_msg("round %d: %s: %s", round, ferry_error_name(rc), ferry_last_error_detail());
        assert_true(harness_check(t.mem + MEM_BYTES - 4096, 4096, (uint64_t)round));
    }
    uint64_t served_at = harness_now_ms();
    printf("10 transfers %llu ms after %d stalled readers (their deadline: %d ms)\n",
           (unsigned long long)(served_at - stalled_at), STALLED_READERS, STALL_DEADLINE_MS);
    assert_true(served_at - stalled_at < STALL_DEADLINE_MS);
    /* Past their deadline the target has dropped them: reading now gets
     * what was sent, then the end (had it not, reading would let it
     * answer every request and keep the connection open). */
    uint64_t after = stalled_at + STALL_DEADLINE_MS + 5000, now = harness_now_ms();
    if (now < after) pause_us((long)(after - now) * 1000);
    for (int i = 0; i < STALLED_READERS; i++) {
        assert_true(raw_closed_within(fd[i], 4 * STALL_DEADLINE_MS));
        close(fd[i]);
    }
    ferry_engine_destroy(ini);
    free(src);
    still_serving(&t);
    target_close(&t);
}

static void payload_stallers_hold_no_thread(void **state)
{
    (void)state;
    payload_stallers(false);
}

static void payload_tricklers_hold_no_thread(void **state)
{
    (void)state;
    payload_stallers(true);
}

/* A whole WRITE of 8 bytes on connection nudge, answered: with the one
 * data thread, only once the frame that held it was parked (a thread
 * waiting for a payload gives its slot up when another data frame waits
 * for one). */
static void nudge(int fd, const target_t *t)
{
    static uint64_t req = 900;
    const uint8_t bytes[8] = {0};
    ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = ++req,
                       .addr = (uint64_t)(uintptr_t)(t->mem + 16384 - 8), .len = 8, .plen = 8};
    assert_int_equal(raw_send(fd, &f, bytes), 0);
    expect_frame(fd, FERRY_FRAME_WRITE_ACK, req, 0);
}

/* Sends a frame's header and its first `first` payload bytes, pauses, and
 * has the target park the frame (nudge). */
static void send_split(int fd, const ferry_frame_t *f, const uint8_t *payload, size_t first, int nudge_fd,
                       const target_t *t)
{
    assert_int_equal(raw_send(fd, f, NULL), 0);
    assert_int_equal(raw_send_bytes(fd, payload, first), 0);
    pause_us(50 * 1000);
    nudge(nudge_fd, t);
}

static bool zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

#define SPLIT_BYTES 1000
#define SPLIT_FIRST 100

static void parked_frames_keep_guarantees(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, 4 * TIMEOUT_MS);
    int fd = raw_handshaken(ferry_engine_port(t.e)), ctl = raw_handshaken(ferry_engine_port(t.e));
    assert_true(fd >= 0 && ctl >= 0);
    uint8_t data[SPLIT_BYTES];
    memset(data, 0x6b, sizeof data);

    /* Refused (the guard page below the region): the rest is read and
     * dropped, the answer says why, and the connection goes on. */
    ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = 1, .addr = (uint64_t)(uintptr_t)t.map,
                       .len = SPLIT_BYTES, .plen = SPLIT_BYTES};
    send_split(fd, &f, data, SPLIT_FIRST, ctl, &t);
    assert_int_equal(raw_send_bytes(fd, data + SPLIT_FIRST, SPLIT_BYTES - SPLIT_FIRST), 0);
    expect_frame(fd, FERRY_FRAME_WRITE_ACK, 1, FERRY_ERR_ADDRESS_NOT_REGISTERED);

    /* Checksummed, in three parts: placed whole once verified; with a wrong
     * checksum not placed at all. */
    f = (ferry_frame_t){.type = FERRY_FRAME_WRITE, .flags = FERRY_FRAME_F_CRC, .req_id = 2,
                        .addr = (uint64_t)(uintptr_t)t.mem, .len = SPLIT_BYTES, .plen = SPLIT_BYTES,
                        .crc = ferry_crc32c(0, data, SPLIT_BYTES)};
    send_split(fd, &f, data, SPLIT_FIRST, ctl, &t);
    assert_true(zero(t.mem, SPLIT_BYTES));
    assert_int_equal(raw_send_bytes(fd, data + SPLIT_FIRST, 400), 0);
    pause_us(50 * 1000);
    nudge(ctl, &t);
    assert_int_equal(raw_send_bytes(fd, data + SPLIT_FIRST + 400, SPLIT_BYTES - SPLIT_FIRST - 400), 0);
    expect_frame(fd, FERRY_FRAME_WRITE_ACK, 2, 0);
    assert_memory_equal(t.mem, data, SPLIT_BYTES);
    f.req_id = 3;
    f.addr += 4096;
    f.crc ^= 1;
    send_split(fd, &f, data, SPLIT_FIRST, ctl, &t);
    assert_int_equal(raw_send_bytes(fd, data + SPLIT_FIRST, SPLIT_BYTES - SPLIT_FIRST), 0);
    expect_frame(fd, FERRY_FRAME_WRITE_ACK, 3, FERRY_ERR_CHECKSUM_MISMATCH);
    assert_true(zero(t.mem + 4096, SPLIT_BYTES));

    /* Cancelled while parked (from another connection of the same peer):
     * once CANCEL_ACK is in, no later byte lands. */
    f = (ferry_frame_t){.type = FERRY_FRAME_WRITE, .req_id = 4, .addr = (uint64_t)(uintptr_t)(t.mem + 8192),
                        .len = SPLIT_BYTES, .plen = SPLIT_BYTES};
    send_split(fd, &f, data, SPLIT_FIRST, ctl, &t);
    ferry_frame_t cancel = {.type = FERRY_FRAME_CANCEL, .req_id = 4};
    assert_int_equal(raw_send(ctl, &cancel, NULL), 0);
    expect_frame(ctl, FERRY_FRAME_CANCEL_ACK, 4, 0);
    assert_int_equal(raw_send_bytes(fd, data + SPLIT_FIRST, SPLIT_BYTES - SPLIT_FIRST), 0);
    expect_frame(fd, FERRY_FRAME_WRITE_ACK, 4, FERRY_ERR_CANCELLED);
    assert_true(zero(t.mem + 8192 + SPLIT_FIRST, SPLIT_BYTES - SPLIT_FIRST));

    /* Deregistered while parked: the deregistration does not wait for the
     * parked frame, and no later byte lands. */
    unsigned char *other = t.mem + 16384;
    assert_int_equal(ferry_deregister(t.e, t.mem), 0);
    assert_int_equal(ferry_register(t.e, t.mem, 16384, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(t.e, other, 16384, FERRY_MEM_REMOTE), 0);
    f = (ferry_frame_t){.type = FERRY_FRAME_WRITE, .req_id = 5, .addr = (uint64_t)(uintptr_t)other,
                        .len = SPLIT_BYTES, .plen = SPLIT_BYTES};
    send_split(fd, &f, data, SPLIT_FIRST, ctl, &t);
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_deregister(t.e, other), 0);
    assert_true(harness_now_ms() - t0 < 2 * TIMEOUT_MS);
    assert_int_equal(raw_send_bytes(fd, data + SPLIT_FIRST, SPLIT_BYTES - SPLIT_FIRST), 0);
    expect_frame(fd, FERRY_FRAME_WRITE_ACK, 5, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_true(zero(other + SPLIT_FIRST, SPLIT_BYTES - SPLIT_FIRST));

    /* Hang-ups mid-payload, a WRITE's and a frame read whole first
     * (NOTIFY): ended at once, well before the deadline. */
    for (int i = 0; i < 2; i++) {
        f = (ferry_frame_t){.type = i ? FERRY_FRAME_NOTIFY : FERRY_FRAME_WRITE, .req_id = 6,
                            .addr = (uint64_t)(uintptr_t)(t.mem + 12288), .len = SPLIT_BYTES, .plen = SPLIT_BYTES};
        int h = i ? raw_handshaken(ferry_engine_port(t.e)) : fd;
        assert_true(h >= 0);
        send_split(h, &f, data, SPLIT_FIRST, ctl, &t);
        shutdown(h, SHUT_WR);
        assert_true(raw_closed_within(h, 2 * TIMEOUT_MS));
        close(h);
    }
    close(ctl);
    still_serving(&t);
    target_close(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(byte_by_byte_interleaved),
        cmocka_unit_test(hang_up_mid_header),
        cmocka_unit_test(pipelined_without_waiting),
        cmocka_unit_test(half_header_stallers_hold_no_thread),
        cmocka_unit_test(bad_headers_in_pieces),
        cmocka_unit_test(parked_frames_keep_guarantees),
        cmocka_unit_test(payload_stallers_hold_no_thread),
        cmocka_unit_test(payload_tricklers_hold_no_thread),
        cmocka_unit_test(stalled_readers_hold_no_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
