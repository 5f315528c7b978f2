/* SPDX-License-Identifier: Apache-2.0 */
/* Strided batches (ferry_strided_transfer_sync, ferry_batch_submit_strided)
 * and the compact vector frames that carry them (protocol 3): placement
 * with and without index lists, both transports, reads and writes, async
 * statuses, bounds refused before any byte moves, peers that speak only
 * protocol 2 or 1, CRC32C, cancel of a compact group, and hostile compact
 * frames sent by hand. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/testing.h"
#include "fault.h"
#include "harness.h"
#include "link/vec.h"
#include "wire/le.h"

#define PIECE 2048
#define SLOTS 4096 /* pages in each side's pool */

typedef struct pair {
    ferry_engine_t *initiator, *target;
    char peer[300];
    unsigned char *src, *dst; /* SLOTS pages each, registered */
} pair_t;

static pair_t *pair_new(const char *transport, int checksum)
{
    pair_t *p = calloc(1, sizeof *p);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = transport;
    cfg.checksum = checksum;
    cfg.timeout_ms = 20000;
    cfg.connect_timeout_ms = 5000;
    p->initiator = harness_engine_cfg(&cfg);
    p->target = harness_engine_cfg(&cfg);
    snprintf(p->peer, sizeof p->peer, "%s", ferry_engine_name(p->target));
    p->src = calloc(SLOTS, PIECE);
    p->dst = calloc(SLOTS + 1, PIECE); /* the last page is never registered: a guard */
    assert_int_equal(ferry_register(p->initiator, p->src, (size_t)SLOTS * PIECE, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p->target, p->dst, (size_t)SLOTS * PIECE, FERRY_MEM_REMOTE), 0);
    harness_fill(p->src, (size_t)SLOTS * PIECE, 11);
    return p;
}

static void pair_free(pair_t *p)
{
    ferry_engine_destroy(p->initiator);
    ferry_engine_destroy(p->target);
    free(p->src);
    free(p->dst);
    free(p);
}

static int zero(const unsigned char *b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (b[i]) return 0;
    return 1;
}

/* A scattered page table: n distinct slots below SLOTS, not adjacent. */
static void page_table(uint64_t *idx, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) idx[i] = (i * 7 + seed) % SLOTS;
}

static ferry_strided_t strided(pair_t *p, int opcode, const uint64_t *lidx, const uint64_t *ridx, size_t n)
{
    return (ferry_strided_t){.opcode = opcode, .local_base = p->src, .local_stride = PIECE,
                             .remote_base = (uint64_t)(uintptr_t)p->dst, .remote_stride = PIECE,
                             .piece_len = PIECE, .local_idx = lidx, .remote_idx = ridx, .n = n};
}

/* Writes n pieces (local piece i -> remote slot ridx[i]), checks every
 * slot, reads them back into cleared local pages, checks again. */
static void round_trip(pair_t *p, size_t n, bool expect_compact)
{
    uint64_t *ridx = malloc(n * sizeof *ridx);
    page_table(ridx, n, 3);
    uint64_t before = ferry_vec_compact_served();
    ferry_strided_t d = strided(p, FERRY_OP_WRITE, NULL, ridx, n);
    assert_int_equal(ferry_strided_transfer_sync(p->initiator, p->peer, &d), 0);
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(p->dst + ridx[i] * PIECE, p->src + i * PIECE, PIECE);
    assert_true(zero(p->dst + (size_t)SLOTS * PIECE, PIECE));
    if (expect_compact) assert_true(ferry_vec_compact_served() > before);
    else assert_int_equal(ferry_vec_compact_served(), before);
    /* Read back: remote slot ridx[i] -> local page lidx[i] (reversed). */
    uint64_t *lidx = malloc(n * sizeof *lidx);
    for (size_t i = 0; i < n; i++) lidx[i] = n - 1 - i;
    unsigned char *copy = malloc(n * PIECE);
    memcpy(copy, p->src, n * PIECE);
    memset(p->src, 0, n * PIECE);
    d = strided(p, FERRY_OP_READ, lidx, ridx, n);
    before = ferry_vec_compact_served();
    assert_int_equal(ferry_strided_transfer_sync(p->initiator, p->peer, &d), 0);
    if (expect_compact) assert_true(ferry_vec_compact_served() > before); /* READV, or CMA_VEC pushing */
    else assert_int_equal(ferry_vec_compact_served(), before);
    for (size_t i = 0; i < n; i++) assert_memory_equal(p->src + lidx[i] * PIECE, copy + i * PIECE, PIECE);
    memcpy(p->src, copy, n * PIECE);
    free(copy);
    free(lidx);
    free(ridx);
}

static void sync_round_trip_tcp(void **state)
{
    (void)state;
    pair_t *p = pair_new("tcp", 0);
    round_trip(p, 1000, true);
    round_trip(p, 3, true);
    pair_free(p);
}

static void sync_round_trip_shm(void **state)
{
    (void)state;
    pair_t *p = pair_new("shm", 0);
    round_trip(p, 1000, true);
    pair_free(p);
}

/* Per-piece CRC32C travels in the compact frame too. */
static void sync_round_trip_crc(void **state)
{
    (void)state;
    pair_t *p = pair_new("tcp", 1);
    round_trip(p, 700, true);
    pair_free(p);
}

/* Plain batches travel compactly too when their pieces share a length:
 * the first pieces suggest one stride (8 KiB), later ones refine it (2 KiB,
 * then 16 B), and every piece lands where it was sent. */
static void plain_batch_refined_stride(void **state)
{
    (void)state;
    const char *transports[2] = {"tcp", "shm"};
    for (int t = 0; t < 2; t++) {
        pair_t *p = pair_new(transports[t], 0);
        enum { N = 40, LEN = 512 };
        void *locals[N];
        uint64_t remotes[N];
        size_t lens[N];
        for (size_t i = 0; i < N; i++) {
            uint64_t off = i < 8 ? (N - i) * 8192 : i < 20 ? i * 2048 : 400000 + i * 1040; /* none overlap */
            locals[i] = p->src + (i * 7 % N) * 1056; /* local side: a 1,056-byte stride, out of order */
            remotes[i] = (uint64_t)(uintptr_t)p->dst + off;
            lens[i] = LEN;
        }
        uint64_t before = ferry_vec_compact_served();
        assert_int_equal(ferry_batch_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
        assert_true(ferry_vec_compact_served() > before);
        for (size_t i = 0; i < N; i++)
            assert_memory_equal(p->dst + (remotes[i] - (uint64_t)(uintptr_t)p->dst), locals[i], LEN);
        pair_free(p);
    }
}

/* One descriptor over two registrations at the target (a layer's K and V
 * buffers): the frames list each piece's region generation, over tcp with
 * and without CRC32C and over shm. */
static void two_regions(void **state)
{
    (void)state;
    struct { const char *transport; int crc; } runs[3] = {{"tcp", 0}, {"tcp", 1}, {"shm", 0}};
    for (int r = 0; r < 3; r++) {
        pair_t *p = pair_new(runs[r].transport, runs[r].crc);
        /* Split the target's pool: deregister it, register two halves. */
        size_t half = (size_t)SLOTS / 2 * PIECE;
        assert_int_equal(ferry_deregister(p->target, p->dst), 0);
        assert_int_equal(ferry_register(p->target, p->dst, half, FERRY_MEM_REMOTE), 0);
        assert_int_equal(ferry_register(p->target, p->dst + half, half, FERRY_MEM_REMOTE), 0);
        ferry_session_close(p->initiator, p->peer); /* learn the new table */
        round_trip(p, 1000, true);
        pair_free(p);
    }
}

/* A target that speaks only protocol 2 (vector frames, no compact form)
 * or 1 (no vector frames) gets the pieces expanded on the initiator. */
static void older_peers(void **state)
{
    (void)state;
    for (int v = 2; v >= 1; v--) {
        pair_t *p = pair_new("tcp", 1);
        ferry_test_set_protocol_version(p->target, v);
        round_trip(p, 500, false);
        ferry_test_set_protocol_version(p->target, 0); /* and an older initiator meeting a newer target */
        ferry_test_set_protocol_version(p->initiator, v);
        ferry_session_close(p->initiator, p->peer);
        round_trip(p, 500, false);
        ferry_peer_info_t info;
        assert_int_equal(ferry_session_info(p->initiator, p->peer, &info), 0);
        assert_int_equal(info.protocol_version, (uint32_t)v);
        pair_free(p);
    }
}

/* Async: every piece is a request with its own status. */
static void async_submit(void **state)
{
    (void)state;
    pair_t *p = pair_new("tcp", 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, 4096, &b), 0);
    uint64_t ridx[800];
    page_table(ridx, 800, 5);
    ferry_strided_t d = strided(p, FERRY_OP_WRITE, NULL, ridx, 800);
    assert_int_equal(ferry_batch_submit_strided(b, p->peer, &d, 0), 0);
    /* A second descriptor in the same batch numbers on from 800. */
    ferry_strided_t e = strided(p, FERRY_OP_WRITE, NULL, NULL, 4);
    e.local_base = p->src + 900 * PIECE;
    e.remote_base = (uint64_t)(uintptr_t)(p->dst + 4087 * PIECE); /* slots the first one leaves alone */
    assert_int_equal(ferry_batch_submit_strided(b, p->peer, &e, 0), 800);
    assert_int_equal(ferry_batch_wait(b, 20000), 0);
    for (size_t i = 0; i < 804; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, i, &st), 0);
        assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
        assert_int_equal(st.bytes, PIECE);
    }
    for (size_t i = 0; i < 800; i++) assert_memory_equal(p->dst + ridx[i] * PIECE, p->src + i * PIECE, PIECE);
    assert_memory_equal(p->dst + 4087 * PIECE, p->src + 900 * PIECE, 4 * PIECE);
    assert_int_equal(ferry_batch_free(b), 0);
    pair_free(p);
}

/* Bounds: a local index past the registration, a remote one past the
 * peer's region, and an address that overflows are refused before any
 * byte moves, the detail naming the piece. */
static void bounds_refused(void **state)
{
    (void)state;
    pair_t *p = pair_new("tcp", 0);
    uint64_t idx[4] = {1, 2, SLOTS, 3}; /* SLOTS: one page past either region */
    ferry_strided_t d = strided(p, FERRY_OP_WRITE, idx, NULL, 4);
    int rc = ferry_strided_transfer_sync(p->initiator, p->peer, &d);
    assert_true(rc == FERRY_ERR_OUT_OF_BOUNDS || rc == FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("strided piece 2 of 4 (local index 4096");
    assert_true(zero(p->dst, (size_t)(SLOTS + 1) * PIECE));
    d = strided(p, FERRY_OP_WRITE, NULL, idx, 4);
    rc = ferry_strided_transfer_sync(p->initiator, p->peer, &d);
    assert_true(rc == FERRY_ERR_OUT_OF_BOUNDS || rc == FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("strided piece 2 of 4 (remote index 4096");
    assert_true(zero(p->dst, (size_t)(SLOTS + 1) * PIECE)); /* nothing moved, the guard page least of all */
    d = strided(p, FERRY_OP_WRITE, NULL, NULL, 3); /* index 2 */
    d.remote_stride = UINT64_MAX / 2;
    assert_int_equal(ferry_strided_transfer_sync(p->initiator, p->peer, &d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("overflows");
    d = strided(p, 7, NULL, NULL, 2);
    assert_int_equal(ferry_strided_transfer_sync(p->initiator, p->peer, &d), FERRY_ERR_INVALID_ARGUMENT);
    d = strided(p, FERRY_OP_WRITE, NULL, NULL, 2);
    d.piece_len = 0;
    assert_int_equal(ferry_strided_transfer_sync(p->initiator, p->peer, &d), FERRY_ERR_INVALID_ARGUMENT);
    d.struct_size = 8; /* a binding that forgot it */
    assert_int_equal((ferry_strided_transfer_sync)(p->initiator, p->peer, &d), FERRY_ERR_INVALID_ARGUMENT);
    d = strided(p, FERRY_OP_WRITE, NULL, NULL, 0);
    assert_int_equal(ferry_strided_transfer_sync(p->initiator, p->peer, &d), 0); /* nothing to do */
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, 16, &b), 0);
    d = strided(p, FERRY_OP_WRITE, idx, NULL, 4);
    rc = (int)ferry_batch_submit_strided(b, p->peer, &d, 0);
    assert_true(rc == FERRY_ERR_OUT_OF_BOUNDS || rc == FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("local index 4096");
    assert_int_equal(ferry_batch_free(b), 0);
    pair_free(p);
}

/* Stride 0 (every piece the same bytes), no index lists, pieces of 8 MiB
 * or more (the path that expands every piece at once) and a count whose
 * bookkeeping (24 bytes a piece in the sync call, 32 in a submit) wraps
 * size_t: refused before any allocation or byte moves. Before the checked
 * product the wrapped size allocated a few bytes and the expansion wrote
 * past them (heap-buffer-overflow under ASan, SIGSEGV in release). */
static void huge_count_refused(void **state)
{
    (void)state;
    pair_t *p = pair_new("tcp", 0);
    ferry_strided_t d = strided(p, FERRY_OP_WRITE, NULL, NULL, ((size_t)1 << 61) + 1); /* * 24 = 24 mod 2^64 */
    d.local_stride = d.remote_stride = 0;
    d.piece_len = (size_t)SLOTS * PIECE; /* 8 MiB: each side's whole region */
    assert_int_equal(ferry_strided_transfer_sync(p->initiator, p->peer, &d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("more pieces than memory can describe");
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, 16, &b), 0);
    d.n = ((size_t)1 << 59) + 1; /* * 32 = 32 mod 2^64 */
    long rc = ferry_batch_submit_strided(b, p->peer, &d, 0);
    assert_int_equal(rc, FERRY_ERR_TOO_MANY_REQUESTS); /* more than the batch holds, found before expanding */
    /* The same before expanding for a count that fits memory but not the
     * batch (2^40 pieces: 32 TiB of requests, MEMORY before). */
    d.n = (size_t)1 << 40;
    assert_int_equal(ferry_batch_submit_strided(b, p->peer, &d, 0), FERRY_ERR_TOO_MANY_REQUESTS);
    assert_detail_contains("exceed the batch's room for 16");
    assert_int_equal(ferry_batch_free(b), 0);
    assert_true(zero(p->dst, (size_t)(SLOTS + 1) * PIECE));
    pair_free(p);
}

/* Cancel of a compact group: pieces end COMPLETED or CANCELLED, and no
 * byte of a cancelled one lands afterwards. */
static void cancel_compact_group(void **state)
{
    (void)state;
    pair_t *p = pair_new("tcp", 0);
    /* A slow link (1 ms a chunk) keeps groups on the wire when the cancel comes. */
    proxy_t *px = proxy_start("127.0.0.1", ferry_engine_port(p->target), &(proxy_opts_t){.delay_ms = 1});
    assert_non_null(px);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, SLOTS, &b), 0);
    uint64_t *ridx = malloc(SLOTS * sizeof *ridx);
    for (size_t i = 0; i < SLOTS; i++) ridx[i] = SLOTS - 1 - i;
    ferry_strided_t d = strided(p, FERRY_OP_WRITE, NULL, ridx, SLOTS);
    assert_int_equal(ferry_batch_submit_strided(b, proxy_name(px), &d, 0), 0);
    /* Cancel once the first pieces landed: the rest are on the wire or queued. */
    for (uint64_t until = harness_now_ms() + 5000; harness_now_ms() < until;) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, 0, &st), 0);
        if (st.state == FERRY_STATUS_COMPLETED) break;
    }
    int rc = ferry_batch_cancel(b);
    assert_int_equal(rc, 0);
    size_t cancelled = 0;
    for (size_t i = 0; i < SLOTS; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, i, &st), 0);
        assert_true(st.state == FERRY_STATUS_COMPLETED || st.state == FERRY_STATUS_CANCELLED);
        if (st.state == FERRY_STATUS_COMPLETED) {
            assert_memory_equal(p->dst + ridx[i] * PIECE, p->src + i * PIECE, PIECE);
        } else {
            /* It may have landed before the cancel; from now on it must not. */
            cancelled++;
            memset(p->dst + ridx[i] * PIECE, 0, PIECE);
        }
    }
    /* A late write would show bytes in a cancelled slot cleared above. */
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    ferry_strided_t probe = strided(p, FERRY_OP_WRITE, NULL, NULL, 1);
    assert_int_equal(ferry_strided_transfer_sync(p->initiator, proxy_name(px), &probe), 0);
    for (size_t i = 0; i < SLOTS; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, i, &st), 0);
        if (st.state == FERRY_STATUS_CANCELLED && ridx[i] != 0 && !zero(p->dst + ridx[i] * PIECE, PIECE))
            fail_msg("cancelled piece %zu landed at slot %llu after the cancel", i, (unsigned long long)ridx[i]);
    }
    print_message("cancelled %zu of %d pieces\n", cancelled, SLOTS);
    assert_int_equal(ferry_batch_free(b), 0);
    free(ridx);
    pair_free(p);
    proxy_stop(px);
}

/* The connection breaks while compact groups are on the wire: the pieces in
 * doubt are fenced, sent again on a fresh connection, and every piece ends
 * placed once. */
static void cut_mid_group(void **state)
{
    (void)state;
    pair_t *p = pair_new("tcp", 0);
    proxy_t *px = proxy_start("127.0.0.1", ferry_engine_port(p->target), &(proxy_opts_t){.delay_ms = 1});
    assert_non_null(px);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p->initiator, SLOTS, &b), 0);
    uint64_t *ridx = malloc(SLOTS * sizeof *ridx);
    page_table(ridx, SLOTS, 1);
    ferry_strided_t d = strided(p, FERRY_OP_WRITE, NULL, ridx, SLOTS);
    assert_int_equal(ferry_batch_submit_strided(b, proxy_name(px), &d, 0), 0);
    for (uint64_t until = harness_now_ms() + 5000; harness_now_ms() < until;) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, 0, &st), 0);
        if (st.state == FERRY_STATUS_COMPLETED) break;
    }
    proxy_cut_all(px);
    int rc = ferry_batch_wait(b, 20000);
    if (rc) fail_msg("after the cut: %s", ferry_last_error_detail());
    for (size_t i = 0; i < SLOTS; i++) assert_memory_equal(p->dst + ridx[i] * PIECE, p->src + i * PIECE, PIECE);
    print_message("cut %llu connection(s)\n", (unsigned long long)proxy_cuts(px));
    assert_int_equal(ferry_batch_free(b), 0);
    free(ridx);
    pair_free(p);
    proxy_stop(px);
}

/* ------------------------------------------------- hostile compact frames */

/* Sends a compact WRITEV of n pieces of len at base + idx[i] * stride
 * (bytes 0x5a) on fd. */
static void send_compact_writev(int fd, uint64_t base, uint64_t stride, uint32_t len, const uint32_t *idx, size_t n,
                                uint64_t declared_n)
{
    size_t dbytes = FERRY_WIRE_COMPACT_HEAD + 4 * n;
    size_t plen = dbytes + n * len;
    uint8_t *payload = calloc(1, plen);
    ferry_vec_compact_t h = {.base = base, .stride = stride, .len = len};
    ferry_vec_compact_encode(&h, payload);
    for (size_t i = 0; i < n; i++) put32(payload + FERRY_WIRE_COMPACT_HEAD + 4 * i, idx[i]);
    memset(payload + dbytes, 0x5a, n * len);
    ferry_frame_t f = {.type = FERRY_FRAME_WRITEV, .flags = FERRY_FRAME_F_COMPACT, .req_id = 500,
                       .addr = (uint64_t)n * len, .len = declared_n, .plen = (uint32_t)plen};
    assert_int_equal(raw_send(fd, &f, payload), 0);
    free(payload);
}

/* raw_handshaken, advertising protocol version v alone. */
static int raw_handshaken_v(uint16_t port, uint16_t v)
{
    int fd = raw_connect(port);
    assert_true(fd >= 0);
    ferry_hello_t h = {.proto_min = v, .proto_max = v, .engine_id = 0x0badc0de, .epoch = 1, .pid = 1};
    snprintf(h.name, sizeof h.name, "rogue:1");
    uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME + 1];
    int n = ferry_hello_encode(&h, buf, sizeof buf);
    assert_true(n > 0);
    ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n};
    assert_int_equal(raw_send(fd, &f, buf), 0);
    assert_int_equal(raw_recv(fd, &f, buf, sizeof buf - 1, 5000), 0);
    assert_int_equal(f.type, FERRY_FRAME_HELLO_ACK);
    assert_int_equal(f.status, 0);
    return fd;
}

static void hostile_frames(void **state)
{
    (void)state;
    pair_t *p = pair_new("tcp", 0);
    uint16_t port = ferry_engine_port(p->target);
    uint64_t base = (uint64_t)(uintptr_t)p->dst;
    /* Piece 1's index lies past the region: it alone is refused, by
     * number and address; the others are placed. */
    int fd = raw_handshaken(port);
    assert_true(fd >= 0);
    uint32_t idx[3] = {5, SLOTS, 9};
    send_compact_writev(fd, base, PIECE, 64, idx, 3, 3);
    ferry_frame_t a;
    uint8_t body[4096];
    assert_int_equal(raw_recv(fd, &a, body, sizeof body - 1, 5000), 0);
    assert_int_equal(a.type, FERRY_FRAME_VEC_ACK);
    assert_true(a.status == FERRY_ERR_OUT_OF_BOUNDS || a.status == FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(a.addr, 128); /* two pieces placed */
    assert_int_equal(get32(body), 0);
    assert_int_equal((int32_t)get32(body + 4), a.status);
    assert_int_equal(get32(body + 8), 0);
    body[a.plen < sizeof body - 1 ? a.plen : sizeof body - 1] = '\0';
    char want[64];
    snprintf(want, sizeof want, "piece 1 of a compact frame, at 0x%llx",
             (unsigned long long)(base + (uint64_t)SLOTS * PIECE));
    if (!strstr((const char *)body + 12, want)) fail_msg("reason '%s' lacks '%s'", body + 12, want);
    assert_int_equal(p->dst[5 * PIECE], 0x5a);
    assert_int_equal(p->dst[9 * PIECE + 63], 0x5a);
    assert_true(zero(p->dst + (size_t)SLOTS * PIECE, PIECE));
    close(fd);
    /* base + index * stride overflowing 64 bits: the connection closes,
     * nothing placed. */
    fd = raw_handshaken(port);
    uint32_t big[2] = {0, 4};
    send_compact_writev(fd, base, UINT64_MAX / 2, 64, big, 2, 2);
    assert_true(raw_closed_within(fd, 5000));
    close(fd);
    /* More pieces than a frame may hold. */
    fd = raw_handshaken(port);
    uint32_t one[1] = {0};
    send_compact_writev(fd, base, PIECE, 64, one, 1, FERRY_WIRE_VEC_MAX + 1);
    assert_true(raw_closed_within(fd, 5000));
    close(fd);
    /* The compact flag on a connection that agreed on protocol 2. */
    fd = raw_handshaken_v(port, 2);
    send_compact_writev(fd, base, PIECE, 64, one, 1, 1);
    assert_true(raw_closed_within(fd, 5000));
    close(fd);
    assert_true(zero(p->dst + (size_t)SLOTS * PIECE, PIECE));
    pair_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sync_round_trip_tcp), cmocka_unit_test(sync_round_trip_shm),
        cmocka_unit_test(sync_round_trip_crc), cmocka_unit_test(older_peers),
        cmocka_unit_test(plain_batch_refined_stride), cmocka_unit_test(two_regions),
        cmocka_unit_test(async_submit),        cmocka_unit_test(bounds_refused),
        cmocka_unit_test(huge_count_refused),
        cmocka_unit_test(cancel_compact_group), cmocka_unit_test(cut_mid_group),
        cmocka_unit_test(hostile_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
