/* SPDX-License-Identifier: Apache-2.0 */
/* TCP vector frames (WRITEV, tcp.c):
 *  - a paged-KV batch of 1,024 pieces leaves as one frame per connection,
 *    with per-piece errors in its one answer, and local pieces that lie end
 *    to end leave as one iovec;
 *  - when the payload arrives slower than the target drains it, the target
 *    sleeps until a good part of the rest is in (a receive low-water mark)
 *    and must wake again at the first byte afterwards, or the next frame on
 *    the connection would never be served (sent by hand, in trickles). */
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
#define PIECES 256 /* 512 KiB: more than the low-water mark */

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A WRITEV of PIECES pieces of PIECE bytes (piece i filled with i + seed)
 * at base + i * 2 * PIECE, sent in bursts of `burst` bytes with a pause
 * between them. */
static void send_writev_trickled(int fd, uint64_t base, uint8_t seed, size_t burst, int pause)
{
    size_t dbytes = (size_t)PIECES * FERRY_WIRE_VEC_DESC_SIZE, data = (size_t)PIECES * PIECE;
    size_t total = FERRY_FRAME_HEADER_SIZE + dbytes + data;
    uint8_t *buf = malloc(total);
    assert_non_null(buf);
    ferry_frame_t f = {.type = FERRY_FRAME_WRITEV, .req_id = 700, .addr = data, .len = PIECES,
                       .plen = (uint32_t)(dbytes + data)};
    ferry_frame_encode(&f, buf);
    uint8_t *d = buf + FERRY_FRAME_HEADER_SIZE;
    for (size_t i = 0; i < PIECES; i++) {
        ferry_vec_desc_t desc = {.addr = base + i * 2 * PIECE, .len = PIECE, .req_id = 700 + i};
        ferry_vec_desc_encode(&desc, d + i * FERRY_WIRE_VEC_DESC_SIZE);
        memset(d + dbytes + i * PIECE, (int)(uint8_t)(i + seed), PIECE);
    }
    for (size_t off = 0; off < total; off += burst) {
        size_t n = total - off < burst ? total - off : burst;
        assert_int_equal(raw_send_bytes(fd, buf + off, n), 0);
        pause_ms(pause);
    }
    free(buf);
}

static void expect_placed(const unsigned char *dst, uint8_t seed)
{
    for (size_t i = 0; i < PIECES; i++) {
        const unsigned char *p = dst + i * 2 * PIECE;
        if (p[0] != (uint8_t)(i + seed) || p[PIECE - 1] != (uint8_t)(i + seed) || p[PIECE] != 0)
            fail_msg("piece %zu: 0x%02x..0x%02x (want 0x%02x), after it 0x%02x", i, p[0], p[PIECE - 1],
                     (uint8_t)(i + seed), p[PIECE]);
    }
}

/* A trickled WRITEV is placed whole; then a second one and an 8-byte
 * WRITE on the same connection are answered (each within seconds, where
 * the target's timeout is 30 s: a mark left behind would hold them until
 * the sender gave up). */
static void trickled_payload_then_next_frames(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 30000;
    ferry_engine_t *t = harness_engine_cfg(&cfg);
    size_t len = (size_t)PIECES * 2 * PIECE;
    unsigned char *dst = calloc(1, len);
    assert_int_equal(ferry_register(t, dst, len, FERRY_MEM_REMOTE_WRITE), 0);
    int fd = raw_handshaken(ferry_engine_port(t));
    assert_true(fd >= 0);
    uint64_t base = (uint64_t)(uintptr_t)dst;

    send_writev_trickled(fd, base, 1, 40000, 5); /* the target drains each burst and waits */
    ferry_frame_t a;
    uint8_t body[4096];
    assert_int_equal(raw_recv(fd, &a, body, sizeof body, 10000), 0);
    assert_int_equal(a.type, FERRY_FRAME_VEC_ACK);
    assert_int_equal(a.status, 0);
    assert_int_equal(a.addr, (uint64_t)PIECES * PIECE);
    expect_placed(dst, 1);

    send_writev_trickled(fd, base, 7, 300000, 20); /* bigger bursts than the mark, then the tail */
    assert_int_equal(raw_recv(fd, &a, body, sizeof body, 10000), 0);
    assert_int_equal(a.type, FERRY_FRAME_VEC_ACK);
    assert_int_equal(a.status, 0);
    expect_placed(dst, 7);

    uint8_t eight[8] = {0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8};
    ferry_frame_t w = {.type = FERRY_FRAME_WRITE, .req_id = 1000, .addr = base + PIECE, .len = 8, .plen = 8};
    assert_int_equal(raw_send(fd, &w, eight), 0);
    int rc = raw_recv(fd, &a, body, sizeof body, 10000);
    if (rc) fail_msg("no answer to an 8-byte WRITE after a trickled WRITEV (%d)", rc);
    assert_int_equal(a.type, FERRY_FRAME_WRITE_ACK);
    assert_int_equal(a.status, 0);
    assert_memory_equal(dst + PIECE, eight, 8);
    close(fd);
    ferry_engine_destroy(t);
    free(dst);
}

/* 1,024 pieces of 2 KiB on one connection: one compact WRITEV (2 MiB; it
 * was four of 512 KiB), local pieces in runs of five end to end, remote
 * ones scattered, every 97th into a region the target dropped after the
 * initiator learned it. Those fail alone, with their code and detail; the
 * others are placed. Then the same pieces read back: one READV. */
static void one_frame_per_batch_with_per_piece_errors(void **state)
{
    (void)state;
    enum { N = 1024, BLOCK = 2048, RUN = 5 };
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 20000;
    cfg.conns_per_peer = 1;
    ferry_engine_t *ini = harness_engine_cfg(&cfg), *t = harness_engine_cfg(&cfg);
    size_t span = (size_t)N * BLOCK * 2;
    unsigned char *src = malloc(span), *dst = calloc(1, (size_t)N * BLOCK), *gone = malloc((size_t)N * BLOCK);
    assert_true(src && dst && gone);
    assert_int_equal(ferry_register(ini, src, span, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(t, dst, (size_t)N * BLOCK, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(t, gone, (size_t)N * BLOCK, FERRY_MEM_REMOTE), 0);
    const char *peer = ferry_engine_name(t);
    assert_int_equal(ferry_session_open(ini, peer), 0); /* learns both regions */
    assert_int_equal(ferry_deregister(t, gone), 0);
    harness_fill(src, span, 11);
    ferry_request_t *reqs = calloc(N, sizeof *reqs);
    size_t *local_off = calloc(N, sizeof *local_off);
    for (size_t i = 0; i < N; i++) {
        local_off[i] = (i / RUN * (RUN + 1) + i % RUN) * BLOCK; /* runs of RUN, then a gap of one */
        size_t slot = (i * 7 + 3) % N;
        unsigned char *to = (i % 97 == 50 ? gone : dst) + slot * BLOCK;
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + local_off[i], (uint64_t)(uintptr_t)to, BLOCK};
    }
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(ini, N, &b), 0);
    uint64_t frames = ferry_vec_compact_served();
    assert_int_equal(ferry_batch_submit(b, peer, reqs, N, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 20000), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(ferry_vec_compact_served() - frames, 1);
    int failed = 0, later_in_frame = 0;
    for (size_t i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, i, &st), 0);
        if (i % 97 == 50) {
            assert_int_equal(st.state, FERRY_STATUS_FAILED);
            assert_int_equal(st.code, FERRY_ERR_ADDRESS_NOT_REGISTERED);
            later_in_frame += strstr(ferry_last_error_detail(), "pieces in one frame") != NULL;
            failed++;
        } else {
            assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
            assert_memory_equal(src + local_off[i], dst + ((i * 7 + 3) % N) * BLOCK, BLOCK);
        }
    }
    assert_int_equal(failed, 11);
    assert_int_equal(later_in_frame, 10); /* the first refused carries the target's detail, the rest name it */
    assert_int_equal(ferry_batch_free(b), 0);
    /* Read back the same way: one READV, its answer carrying the 1,013
     * pieces served straight into the local runs. */
    memset(src, 0, span);
    for (size_t i = 0; i < N; i++) reqs[i].opcode = FERRY_OP_READ;
    assert_int_equal(ferry_batch_alloc(ini, N, &b), 0);
    frames = ferry_vec_compact_served();
    assert_int_equal(ferry_batch_submit(b, peer, reqs, N, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 20000), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(ferry_vec_compact_served() - frames, 1);
    for (size_t i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, i, &st), 0);
        assert_int_equal(st.code, i % 97 == 50 ? FERRY_ERR_ADDRESS_NOT_REGISTERED : 0);
        if (i % 97 != 50) assert_memory_equal(src + local_off[i], dst + ((i * 7 + 3) % N) * BLOCK, BLOCK);
    }
    assert_int_equal(ferry_batch_free(b), 0);
    free(reqs);
    free(local_off);
    ferry_engine_destroy(ini);
    ferry_engine_destroy(t);
    free(src);
    free(dst);
    free(gone);
}

/* One batch of 8,192 reads then 8,192 writes of 2 KiB on one connection
 * (16 MiB each way, more than both ends' socket buffers hold): the READVs'
 * answers in flight stay few enough that the target keeps reading the
 * WRITEVs sent after them, so neither side waits on the other. */
static void reads_then_writes_on_one_connection(void **state)
{
    (void)state;
    enum { N = 8192, BLOCK = 2048 };
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 20000;
    cfg.conns_per_peer = 1;
    ferry_engine_t *ini = harness_engine_cfg(&cfg), *t = harness_engine_cfg(&cfg);
    size_t half = (size_t)N * BLOCK;
    unsigned char *local = malloc(2 * half), *remote = malloc(2 * half);
    assert_true(local && remote);
    harness_fill(local, 2 * half, 21);
    harness_fill(remote, 2 * half, 22);
    assert_int_equal(ferry_register(ini, local, 2 * half, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(t, remote, 2 * half, FERRY_MEM_REMOTE), 0);
    const char *peer = ferry_engine_name(t);
    ferry_request_t *reqs = calloc(2 * N, sizeof *reqs);
    for (size_t i = 0; i < N; i++) {
        size_t slot = (i * 7 + 3) % N;
        reqs[i] = (ferry_request_t){FERRY_OP_READ, local + i * BLOCK, (uint64_t)(uintptr_t)(remote + slot * BLOCK),
                                    BLOCK};
        reqs[N + i] = (ferry_request_t){FERRY_OP_WRITE, local + half + i * BLOCK,
                                        (uint64_t)(uintptr_t)(remote + half + slot * BLOCK), BLOCK};
    }
    unsigned char *want_read = malloc(half), *want_written = malloc(half);
    for (size_t i = 0; i < N; i++) {
        memcpy(want_read + i * BLOCK, remote + ((i * 7 + 3) % N) * BLOCK, BLOCK);
        memcpy(want_written + ((i * 7 + 3) % N) * BLOCK, local + half + i * BLOCK, BLOCK);
    }
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(ini, 2 * N, &b), 0);
    assert_int_equal(ferry_batch_submit(b, peer, reqs, 2 * N, 0), 0);
    int rc = ferry_batch_wait(b, 30000);
    if (rc) fail_msg("mixed batch: %s", ferry_last_error_detail());
    assert_memory_equal(local, want_read, half);
    assert_memory_equal(remote + half, want_written, half);
    assert_int_equal(ferry_batch_free(b), 0);
    free(reqs);
    free(want_read);
    free(want_written);
    ferry_engine_destroy(ini);
    ferry_engine_destroy(t);
    free(local);
    free(remote);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_frame_per_batch_with_per_piece_errors),
        cmocka_unit_test(reads_then_writes_on_one_connection),
        cmocka_unit_test(trickled_payload_then_next_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
