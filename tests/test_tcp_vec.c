/* The TCP target's receive of vector frames (WRITEV) when the payload
 * arrives slower than the target drains it: the target then sleeps until a
 * good part of the rest is in (a receive low-water mark, tcp.c), and must
 * wake again at the first byte afterwards, or the next frame on the
 * connection would never be served. Sent by hand, in trickles. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/testing.h"
#include "fault.h"
#include "harness.h"
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(trickled_payload_then_next_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
