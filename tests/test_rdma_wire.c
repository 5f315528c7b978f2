/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport's wire payloads and frame types: round trips, and
 * every field the decoders must refuse. Runs in every build. */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "link/transport.h"
#include "transport/rdma/rdma_wire.h"
#include "wire/wire.h"

static ferry_rdma_qp_info_t good_qp(void)
{
    ferry_rdma_qp_info_t q;
    memset(&q, 0, sizeof q);
    q.qpn = 0x1234;
    q.psn = 0xabcdef;
    q.lid = 7;
    q.port = 1;
    q.link_layer = FERRY_RDMA_LINK_IB;
    q.mtu = 5;
    q.gid_index = 3;
    q.rd_atom = 16;
    for (int i = 0; i < 16; i++) q.gid[i] = (uint8_t)(i + 1);
    q.recv_depth = 128;
    q.guid = 0x1122334455667788ull;
    return q;
}

static void qp_info_round_trip(void **state)
{
    (void)state;
    ferry_rdma_qp_info_t q = good_qp(), back;
    uint8_t buf[FERRY_RDMA_QP_INFO_SIZE];
    ferry_rdma_qp_info_encode(&q, buf);
    assert_int_equal(ferry_rdma_qp_info_decode(buf, sizeof buf, &back), 0);
    assert_int_equal(back.qpn, q.qpn);
    assert_int_equal(back.psn, q.psn);
    assert_int_equal(back.lid, q.lid);
    assert_int_equal(back.port, q.port);
    assert_int_equal(back.link_layer, q.link_layer);
    assert_int_equal(back.mtu, q.mtu);
    assert_int_equal(back.gid_index, q.gid_index);
    assert_int_equal(back.rd_atom, q.rd_atom);
    assert_memory_equal(back.gid, q.gid, 16);
    assert_int_equal(back.recv_depth, q.recv_depth);
    assert_int_equal(back.guid, q.guid);
    /* Little-endian on the wire, as every Ferry field. */
    assert_int_equal(buf[0], 0x34);
    assert_int_equal(buf[1], 0x12);
    assert_int_equal(buf[40], 0x88);
    /* RoCE with a GID, LID 0, is fine. */
    q.link_layer = FERRY_RDMA_LINK_ETH;
    q.lid = 0;
    ferry_rdma_qp_info_encode(&q, buf);
    assert_int_equal(ferry_rdma_qp_info_decode(buf, sizeof buf, &back), 0);
    assert_int_equal(back.link_layer, FERRY_RDMA_LINK_ETH);
}

/* Encodes q, lets edit change the bytes, and expects a refusal naming what. */
static void expect_qp_refused(const ferry_rdma_qp_info_t *q, size_t off, int byte, const char *what)
{
    uint8_t buf[FERRY_RDMA_QP_INFO_SIZE];
    ferry_rdma_qp_info_t back;
    ferry_rdma_qp_info_encode(q, buf);
    if (byte >= 0) buf[off] = (uint8_t)byte;
    assert_int_equal(ferry_rdma_qp_info_decode(buf, sizeof buf, &back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains(what);
}

static void qp_info_refusals(void **state)
{
    (void)state;
    ferry_rdma_qp_info_t q = good_qp(), back;
    uint8_t buf[FERRY_RDMA_QP_INFO_SIZE + 1];
    ferry_rdma_qp_info_encode(&q, buf);
    assert_int_equal(ferry_rdma_qp_info_decode(buf, FERRY_RDMA_QP_INFO_SIZE - 1, &back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("47 bytes, expected 48");
    assert_int_equal(ferry_rdma_qp_info_decode(buf, FERRY_RDMA_QP_INFO_SIZE + 1, &back), FERRY_ERR_MALFORMED_FRAME);

    expect_qp_refused(&q, 15, 1, "reserved");
    expect_qp_refused(&q, 37, 1, "reserved");
    ferry_rdma_qp_info_t t = q;
    t.qpn = 0;
    expect_qp_refused(&t, 0, -1, "queue pair number 0");
    expect_qp_refused(&q, 3, 1, "queue pair number");      /* >= 2^24 */
    expect_qp_refused(&q, 7, 1, "packet sequence number"); /* >= 2^24 */
    expect_qp_refused(&q, 10, 0, "port 0");
    expect_qp_refused(&q, 11, 3, "link layer 3");
    expect_qp_refused(&q, 12, 0, "MTU code 0");
    expect_qp_refused(&q, 12, 6, "MTU code 6");
    expect_qp_refused(&q, 14, 0, "RDMA READ depth 0");
    expect_qp_refused(&q, 14, 17, "RDMA READ depth 17");
    t = q;
    t.recv_depth = 0;
    expect_qp_refused(&t, 0, -1, "receive depth 0");
    t.recv_depth = 65537;
    expect_qp_refused(&t, 0, -1, "receive depth 65537");
    t = q;
    t.lid = 0;
    expect_qp_refused(&t, 0, -1, "LID");
    t.lid = 0xc000; /* multicast */
    expect_qp_refused(&t, 0, -1, "LID");
    t = q;
    t.link_layer = FERRY_RDMA_LINK_ETH;
    memset(t.gid, 0, 16);
    expect_qp_refused(&t, 0, -1, "needs a GID");
}

static void mr_info_round_trip_and_refusals(void **state)
{
    (void)state;
    ferry_rdma_mr_info_t m = {0x7f0000001000ull, 1u << 20, 0xdeadbeef, 42, FERRY_MEM_REMOTE_WRITE}, back;
    uint8_t buf[FERRY_RDMA_MR_INFO_SIZE];
    ferry_rdma_mr_info_encode(&m, buf);
    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf, &back), 0);
    assert_int_equal(back.addr, m.addr);
    assert_int_equal(back.len, m.len);
    assert_int_equal(back.rkey, m.rkey);
    assert_int_equal(back.generation, m.generation);
    assert_int_equal(back.flags, m.flags);

    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf - 1, &back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("31 bytes");
    buf[30] = 1;
    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf, &back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("reserved");

    ferry_rdma_mr_info_t t = m;
    t.len = 0;
    ferry_rdma_mr_info_encode(&t, buf);
    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf, &back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("empty or wraps");
    t = m;
    t.addr = UINT64_MAX - 10;
    ferry_rdma_mr_info_encode(&t, buf);
    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf, &back), FERRY_ERR_MALFORMED_FRAME);
    t = m;
    t.addr = 0;
    ferry_rdma_mr_info_encode(&t, buf);
    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf, &back), FERRY_ERR_MALFORMED_FRAME);
    t = m;
    t.flags = 0;
    ferry_rdma_mr_info_encode(&t, buf);
    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf, &back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("flags 0x0");
    t.flags = 0x10;
    ferry_rdma_mr_info_encode(&t, buf);
    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf, &back), FERRY_ERR_MALFORMED_FRAME);
}

/* The new frame types decode, carry their payload limits, and have names. */
static void rdma_frame_types(void **state)
{
    (void)state;
    static const struct {
        uint8_t type;
        uint32_t max;
        const char *name;
    } t[] = {
        {FERRY_FRAME_RDMA_CONNECT, FERRY_RDMA_QP_INFO_SIZE, "RDMA_CONNECT"},
        {FERRY_FRAME_RDMA_CONNECT_ACK, FERRY_WIRE_MAX_REASON, "RDMA_CONNECT_ACK"},
        {FERRY_FRAME_RDMA_MR_QUERY, 0, "RDMA_MR_QUERY"},
        {FERRY_FRAME_RDMA_MR_INFO, FERRY_WIRE_MAX_REASON, "RDMA_MR_INFO"},
        {FERRY_FRAME_RDMA_COMMIT, 0, "RDMA_COMMIT"},
        {FERRY_FRAME_RDMA_COMMIT_ACK, FERRY_WIRE_MAX_REASON, "RDMA_COMMIT_ACK"},
        {FERRY_FRAME_RDMA_COMMIT_GROUP, FERRY_RDMA_GROUP_MAX * FERRY_RDMA_COMMIT_DESC_SIZE, "RDMA_COMMIT_GROUP"},
        {FERRY_FRAME_RDMA_COMMIT_GROUP_ACK, FERRY_RDMA_GROUP_MAX * 4 + FERRY_WIRE_MAX_REASON, "RDMA_COMMIT_GROUP_ACK"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        assert_int_equal(ferry_frame_max_payload(t[i].type), t[i].max);
        assert_string_equal(ferry_frame_type_name(t[i].type), t[i].name);
        ferry_frame_t f = {.type = t[i].type, .plen = t[i].max, .req_id = 9, .addr = 1, .len = 2, .aux = 3}, back;
        uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
        ferry_frame_encode(&f, hdr);
        assert_int_equal(ferry_frame_decode(hdr, &back), 0);
        assert_int_equal(back.type, t[i].type);
        assert_int_equal(back.aux, 3);
        f.plen = t[i].max + 1;
        ferry_frame_encode(&f, hdr);
        assert_int_equal(ferry_frame_decode(hdr, &back), FERRY_ERR_MALFORMED_FRAME);
        assert_detail_contains("exceeds its limit");
    }
    /* One past the last type is still refused. */
    ferry_frame_t f = {.type = FERRY_FRAME_TYPE_MAX + 1}, back;
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(&f, hdr);
    assert_int_equal(ferry_frame_decode(hdr, &back), FERRY_ERR_MALFORMED_FRAME);
    char text[64];
    snprintf(text, sizeof text, "unknown frame type %d", FERRY_FRAME_TYPE_MAX + 1);
    assert_detail_contains(text);
    /* So is an id in the RDMA range that the transport does not define. */
    f.type = FERRY_FRAME_RDMA_OWN_LAST + 1;
    ferry_frame_encode(&f, hdr);
    assert_int_equal(ferry_frame_decode(hdr, &back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("unknown frame type");
    assert_string_equal(ferry_frame_type_name(FERRY_FRAME_RDMA_LAST), "INVALID");
}

/* A group commit's header and descriptors: round trip, and every field
 * the decoder must refuse. */
static void commit_group_round_trip_and_refusals(void **state)
{
    (void)state;
    enum { N = 3 };
    ferry_rdma_commit_desc_t d[N] = {{0x7f0000001000ull, 2048, 11, 4},
                                     {0x7f0000100000ull, 1ull << 33, 12, 4},
                                     {0x1000, 1, 13, 0}},
                             back[N];
    uint8_t buf[N * FERRY_RDMA_COMMIT_DESC_SIZE];
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        ferry_rdma_commit_desc_encode(&d[i], buf + i * FERRY_RDMA_COMMIT_DESC_SIZE);
        total += d[i].len;
    }
    ferry_frame_t f = {.type = FERRY_FRAME_RDMA_COMMIT_GROUP, .req_id = 11, .addr = total, .len = N,
                       .plen = sizeof buf};
    assert_int_equal(ferry_rdma_commit_group_check(&f), 0);
    assert_int_equal(ferry_rdma_commit_group_decode(&f, buf, back), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(back[i].addr, d[i].addr);
        assert_int_equal(back[i].len, d[i].len);
        assert_int_equal(back[i].req_id, d[i].req_id);
        assert_int_equal(back[i].generation, d[i].generation);
    }
    /* The header: no pieces, too many, a payload that is not n descriptors. */
    ferry_frame_t g = f;
    g.len = 0;
    assert_int_equal(ferry_rdma_commit_group_check(&g), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("0 pieces");
    g.len = FERRY_RDMA_GROUP_MAX + 1;
    g.plen = (uint32_t)g.len * FERRY_RDMA_COMMIT_DESC_SIZE;
    assert_int_equal(ferry_rdma_commit_group_check(&g), FERRY_ERR_MALFORMED_FRAME);
    g = f;
    g.plen--;
    assert_int_equal(ferry_rdma_commit_group_check(&g), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("carries");
    /* The total the header declares. */
    g = f;
    g.addr++;
    assert_int_equal(ferry_rdma_commit_group_decode(&g, buf, back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("add up to");
    /* A piece: reserved bytes, empty, at address 0, wrapping. */
    uint8_t bad[sizeof buf];
    memcpy(bad, buf, sizeof bad);
    bad[FERRY_RDMA_COMMIT_DESC_SIZE + 30] = 1;
    assert_int_equal(ferry_rdma_commit_group_decode(&f, bad, back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("piece 1: reserved");
    ferry_rdma_commit_desc_t t[3] = {{0x1000, 0, 1, 0}, {0, 8, 1, 0}, {UINT64_MAX - 4, 8, 1, 0}};
    for (int k = 0; k < 3; k++) {
        memcpy(bad, buf, sizeof bad);
        ferry_rdma_commit_desc_encode(&t[k], bad + 2 * FERRY_RDMA_COMMIT_DESC_SIZE);
        g = f;
        g.addr = total - d[2].len + t[k].len;
        assert_int_equal(ferry_rdma_commit_group_decode(&g, bad, back), FERRY_ERR_MALFORMED_FRAME);
        assert_detail_contains("piece 2:");
    }
}

/* The answer to a group commit against the group it answers. */
static void commit_group_ack_checks(void **state)
{
    (void)state;
    ferry_frame_t a = {.type = FERRY_FRAME_RDMA_COMMIT_GROUP_ACK, .addr = 300, .len = 3};
    assert_int_equal(ferry_rdma_commit_group_ack_check(&a, 3, 300), 0);
    assert_int_equal(ferry_rdma_commit_group_ack_check(&a, 4, 300), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("for 3 pieces, 4 were committed");
    assert_int_equal(ferry_rdma_commit_group_ack_check(&a, 3, 301), FERRY_ERR_MALFORMED_FRAME); /* not all confirmed */
    a.plen = 4;
    assert_int_equal(ferry_rdma_commit_group_ack_check(&a, 3, 300), FERRY_ERR_MALFORMED_FRAME); /* payload on success */
    /* A failure carries the statuses and at most a reason's text. */
    a.status = FERRY_ERR_ADDRESS_NOT_REGISTERED;
    a.addr = 200;
    a.plen = 12 + 5;
    assert_int_equal(ferry_rdma_commit_group_ack_check(&a, 3, 300), 0);
    a.plen = 11;
    assert_int_equal(ferry_rdma_commit_group_ack_check(&a, 3, 300), FERRY_ERR_MALFORMED_FRAME);
    a.plen = 12 + FERRY_WIRE_MAX_REASON + 1;
    assert_int_equal(ferry_rdma_commit_group_ack_check(&a, 3, 300), FERRY_ERR_MALFORMED_FRAME);
    a.plen = 12;
    a.addr = 300; /* a failure cannot have confirmed everything */
    assert_int_equal(ferry_rdma_commit_group_ack_check(&a, 3, 300), FERRY_ERR_MALFORMED_FRAME);
}

int main(void)
{
    /* The RDMA frames' names and limits come from the transport table
     * (wire.h), which a program of wire calls alone may not link. */
    ferry_wire_set_frame_lookup(ferry_transport_frame_def);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qp_info_round_trip),
        cmocka_unit_test(qp_info_refusals),
        cmocka_unit_test(mr_info_round_trip_and_refusals),
        cmocka_unit_test(rdma_frame_types),
        cmocka_unit_test(commit_group_round_trip_and_refusals),
        cmocka_unit_test(commit_group_ack_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
