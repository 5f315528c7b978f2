/* The wire decoders refuse every out-of-range length, count and field. */
#include "harness.h"

#include <stdio.h>
#include <string.h>

#include "wire/wire.h"

static void encode(const ferry_frame_t *f, uint8_t *out) { ferry_frame_encode(f, out); }

static void frame_round_trip(void **state)
{
    (void)state;
    ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .flags = FERRY_FRAME_F_CRC, .status = 0, .plen = 4096,
                       .req_id = 7, .addr = 0x1000, .len = 4096, .aux = 3, .crc = 0xdeadbeef};
    uint8_t b[FERRY_FRAME_HEADER_SIZE];
    encode(&f, b);
    ferry_frame_t g;
    assert_int_equal(ferry_frame_decode(b, &g), 0);
    assert_int_equal(g.type, f.type);
    assert_int_equal(g.plen, 4096);
    assert_int_equal(g.addr, 0x1000);
    assert_int_equal(g.crc, 0xdeadbeef);
    /* A failing answer with a real code decodes. */
    f = (ferry_frame_t){.type = FERRY_FRAME_WRITE_ACK, .status = FERRY_ERR_OUT_OF_BOUNDS, .plen = 10};
    encode(&f, b);
    assert_int_equal(ferry_frame_decode(b, &g), 0);
    assert_int_equal(g.status, FERRY_ERR_OUT_OF_BOUNDS);
}

static void frame_rejects(void **state)
{
    (void)state;
    uint8_t b[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_t g, ok = {.type = FERRY_FRAME_PING};
    encode(&ok, b);
    b[0] ^= 1;
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("magic");
    encode(&ok, b);
    b[4] = 0;
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    b[4] = FERRY_FRAME_TYPE_MAX + 1;
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("unknown frame type");
    encode(&ok, b);
    b[5] = 0x80;
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    encode(&ok, b);
    b[53] = 1;
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("reserved");
    /* Payload limits per type: data, control, none. */
    ferry_frame_t big = {.type = FERRY_FRAME_WRITE, .plen = FERRY_WIRE_MAX_DATA + 1};
    encode(&big, b);
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("exceeds its limit");
    big = (ferry_frame_t){.type = FERRY_FRAME_WRITE, .plen = 0xffffffffu};
    encode(&big, b);
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    big = (ferry_frame_t){.type = FERRY_FRAME_HELLO, .plen = FERRY_WIRE_MAX_CONTROL + 1};
    encode(&big, b);
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    big = (ferry_frame_t){.type = FERRY_FRAME_SEG_QUERY, .plen = 1};
    encode(&big, b);
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    big = (ferry_frame_t){.type = FERRY_FRAME_AUTH, .plen = FERRY_WIRE_MAC_SIZE + 1};
    encode(&big, b);
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    /* Statuses must be Ferry codes. */
    ferry_frame_t st = {.type = FERRY_FRAME_WRITE_ACK, .status = 5};
    encode(&st, b);
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    st.status = -99999;
    encode(&st, b);
    assert_int_equal(ferry_frame_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("no Ferry error code");
}

static int hello_bytes(uint8_t *buf, size_t cap, const char *name)
{
    ferry_hello_t h;
    memset(&h, 0, sizeof h);
    h.proto_min = h.proto_max = 1;
    h.engine_id = 42;
    snprintf(h.name, sizeof h.name, "%s", name);
    return ferry_hello_encode(&h, buf, cap);
}

static void hello_limits(void **state)
{
    (void)state;
    uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    int n = hello_bytes(buf, sizeof buf, "127.0.0.1:7000");
    assert_true(n > 0);
    ferry_hello_t h;
    assert_int_equal(ferry_hello_decode(buf, (size_t)n, &h), 0);
    assert_string_equal(h.name, "127.0.0.1:7000");
    assert_int_equal(h.engine_id, 42);
    /* Every truncation is refused. */
    for (int k = 0; k < n; k++) assert_int_equal(ferry_hello_decode(buf, (size_t)k, &h), FERRY_ERR_MALFORMED_FRAME);
    /* Name length field inconsistent with the payload. */
    uint8_t bad[sizeof buf];
    memcpy(bad, buf, (size_t)n);
    bad[FERRY_HELLO_FIXED_SIZE - 2] = 0xff;
    assert_int_equal(ferry_hello_decode(bad, (size_t)n, &h), FERRY_ERR_MALFORMED_FRAME);
    /* A NUL inside the name. */
    memcpy(bad, buf, (size_t)n);
    bad[FERRY_HELLO_FIXED_SIZE + 3] = 0;
    assert_int_equal(ferry_hello_decode(bad, (size_t)n, &h), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("NUL");
    /* An empty version range. */
    memcpy(bad, buf, (size_t)n);
    bad[0] = 5;
    assert_int_equal(ferry_hello_decode(bad, (size_t)n, &h), FERRY_ERR_MALFORMED_FRAME);
    /* Names longer than the limit cannot be encoded. */
    ferry_hello_t big;
    memset(&big, 0, sizeof big);
    memset(big.name, 'x', FERRY_WIRE_MAX_NAME);
    assert_true(ferry_hello_encode(&big, buf, sizeof buf) > 0);
    assert_int_equal(ferry_hello_encode(&big, buf, sizeof buf - 1), FERRY_ERR_INVALID_ARGUMENT);
}

static void segment_limits(void **state)
{
    (void)state;
    uint8_t b[FERRY_WIRE_SEGMENT_SIZE];
    ferry_wire_segment_t s = {0x1000, 4096, FERRY_MEM_REMOTE, 1}, g;
    ferry_segment_encode(&s, b);
    assert_int_equal(ferry_segment_decode(b, &g), 0);
    assert_int_equal(g.len, 4096);
    s.len = 0;
    ferry_segment_encode(&s, b);
    assert_int_equal(ferry_segment_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    s = (ferry_wire_segment_t){UINT64_MAX - 10, 100, FERRY_MEM_REMOTE, 1};
    ferry_segment_encode(&s, b);
    assert_int_equal(ferry_segment_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("wraps");
    s = (ferry_wire_segment_t){0x1000, 10, 0x10, 1};
    ferry_segment_encode(&s, b);
    assert_int_equal(ferry_segment_decode(b, &g), FERRY_ERR_MALFORMED_FRAME);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(frame_round_trip),
        cmocka_unit_test(frame_rejects),
        cmocka_unit_test(hello_limits),
        cmocka_unit_test(segment_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
