/* SPDX-License-Identifier: Apache-2.0 */
/* Each transport declares the frame types it serves (a list, where a
 * 32-bit mask used to stop at type 31): every type a target serves belongs
 * to exactly one transport, answers and core frames to none, and a
 * transport's own ids past 31 (RDMA_COMMIT_GROUP) are served and named. */
#include <string.h>

#include "harness.h"
#include "link/transport.h"
#include "transport/rdma/rdma_wire.h"
#include "transport/shm/shm_wire.h"
#include "wire/wire.h"

static void every_served_type_has_one_owner(void **state)
{
    (void)state;
    static const struct {
        uint8_t type;
        const char *transport;
    } owned[] = {
        {FERRY_FRAME_WRITE, "tcp"},          {FERRY_FRAME_READ_REQ, "tcp"},
        {FERRY_FRAME_WRITEV, "tcp"},         {FERRY_FRAME_READV, "tcp"},
        {FERRY_FRAME_CMA_WRITE, "shm"},      {FERRY_FRAME_CMA_READ, "shm"},
        {FERRY_FRAME_SHM_MAP_REQ, "shm"},    {FERRY_FRAME_CMA_VEC, "shm"},
        {FERRY_FRAME_RDMA_CONNECT, "rdma"},  {FERRY_FRAME_RDMA_MR_QUERY, "rdma"},
        {FERRY_FRAME_RDMA_COMMIT, "rdma"},  {FERRY_FRAME_RDMA_COMMIT_GROUP, "rdma"},
    };
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) {
        const ferry_transport_ops_t *t = ferry_transport_for_frame(owned[i].type);
        assert_non_null(t);
        assert_string_equal(t->name, owned[i].transport);
    }
    /* No type is listed by two transports, nor twice by one. */
    unsigned seen[256] = {0};
    for (int i = 0; ferry_transports[i]; i++)
        for (size_t k = 0; k < ferry_transports[i]->nserve_types; k++) seen[ferry_transports[i]->serve_types[k]]++;
    for (int type = 0; type < 256; type++) assert_true(seen[type] <= 1);
    /* Core frames and answers belong to no transport. */
    static const uint8_t none[] = {0,
                                   FERRY_FRAME_HELLO,
                                   FERRY_FRAME_SEG_QUERY,
                                   FERRY_FRAME_NOTIFY,
                                   FERRY_FRAME_PING,
                                   FERRY_FRAME_CANCEL,
                                   FERRY_FRAME_WRITE_ACK,
                                   FERRY_FRAME_VEC_ACK,
                                   FERRY_FRAME_RDMA_COMMIT_ACK,
                                   FERRY_FRAME_RDMA_COMMIT_GROUP_ACK,
                                   FERRY_FRAME_TYPE_MAX + 1,
                                   255};
    for (size_t i = 0; i < sizeof none; i++) assert_null(ferry_transport_for_frame(none[i]));
    assert_true(FERRY_FRAME_RDMA_COMMIT_GROUP > 31);
    assert_string_equal(ferry_frame_type_name(FERRY_FRAME_RDMA_COMMIT_GROUP), "RDMA_COMMIT_GROUP");
}

/* Each transport declares its frames itself (its frames table, wire.h):
 * no id is declared twice, none is a core frame (whose name would win),
 * the wire layer names and sizes each as declared, and every type a
 * transport serves past the core range is one it declares. */
static void transport_frames_are_declared_once(void **state)
{
    (void)state;
    const ferry_transport_ops_t *owner[256] = {0};
    for (int i = 0; ferry_transports[i]; i++) {
        const ferry_transport_ops_t *t = ferry_transports[i];
        for (size_t k = 0; k < t->nframes; k++) {
            const ferry_frame_def_t *d = &t->frames[k];
            assert_true(d->type != 0);
            if (owner[d->type]) fail_msg("frame %u declared by %s and %s", d->type, owner[d->type]->name, t->name);
            owner[d->type] = t;
            assert_ptr_equal(ferry_transport_frame_def(d->type), d);
            assert_string_equal(ferry_frame_type_name(d->type), d->name);
            assert_int_equal(ferry_frame_max_payload(d->type), d->max_payload);
        }
        for (size_t k = 0; k < t->nserve_types; k++)
            if (t->serve_types[k] > FERRY_FRAME_TYPE_MAX) assert_ptr_equal(owner[t->serve_types[k]], t);
    }
    assert_ptr_equal(owner[FERRY_FRAME_CMA_WRITE], ferry_transport_find("shm"));
    assert_ptr_equal(owner[FERRY_FRAME_SHM_MAP_RESP], ferry_transport_find("shm"));
    assert_ptr_equal(owner[FERRY_FRAME_RDMA_CONNECT], ferry_transport_find("rdma"));
    assert_ptr_equal(owner[FERRY_FRAME_RDMA_COMMIT_GROUP_ACK], ferry_transport_find("rdma"));
    assert_null(owner[FERRY_FRAME_WRITE]); /* core frames: named by wire.c */
    assert_null(owner[FERRY_FRAME_CMA_VEC]);
    assert_null(ferry_transport_frame_def(FERRY_FRAME_RDMA_OWN_LAST + 1));
}

/* Frame ids are handed out by range: each transport declares the ranges it
 * owns; no two ranges meet, none holds a core id, and every frame a
 * transport declares lies in one of its own. Counted here id by id, apart
 * from the table's own check, which must agree. */
static void frame_ranges_are_disjoint_and_hold_every_frame(void **state)
{
    (void)state;
    const ferry_transport_ops_t *range_owner[256] = {0};
    for (int i = 0; ferry_transports[i]; i++) {
        const ferry_transport_ops_t *t = ferry_transports[i];
        for (size_t r = 0; r < t->nframe_ranges; r++) {
            assert_true(t->frame_ranges[r].first <= t->frame_ranges[r].last);
            for (unsigned id = t->frame_ranges[r].first; id <= t->frame_ranges[r].last; id++) {
                if (range_owner[id]) fail_msg("id %u in ranges of %s and %s", id, range_owner[id]->name, t->name);
                range_owner[id] = t;
                assert_false(ferry_frame_is_core((uint8_t)id));
            }
        }
    }
    for (int i = 0; ferry_transports[i]; i++)
        for (size_t k = 0; k < ferry_transports[i]->nframes; k++)
            assert_ptr_equal(range_owner[ferry_transports[i]->frames[k].type], ferry_transports[i]);
    /* The core's: its frames, and the range kept for frames to come. */
    assert_true(ferry_frame_is_core(FERRY_FRAME_HELLO));
    assert_true(ferry_frame_is_core(FERRY_FRAME_CMA_VEC));
    assert_true(ferry_frame_is_core(FERRY_FRAME_TYPE_MAX + 1));
    assert_true(ferry_frame_is_core(FERRY_FRAME_TRANSPORT_FIRST - 1));
    assert_false(ferry_frame_is_core(0));
    assert_false(ferry_frame_is_core(FERRY_FRAME_CMA_WRITE));
    assert_false(ferry_frame_is_core(FERRY_FRAME_TRANSPORT_FIRST));
    assert_int_equal(ferry_transport_table_check(ferry_transports, ferry_transport_fallback), 0);
}

/* Each transport declares the HELLO bits it owns: none of the core's, no
 * two transports the same, and what it advertises is its own. */
static void hello_bits_belong_to_one_transport(void **state)
{
    (void)state;
    uint32_t seen = 0;
    for (int i = 0; ferry_transports[i]; i++) {
        uint32_t bits = ferry_transports[i]->hello_bits;
        assert_int_equal(bits & FERRY_HELLO_F_CORE, 0);
        assert_int_equal(bits & seen, 0);
        seen |= bits;
    }
    assert_int_equal(ferry_transport_find("rdma")->hello_bits, FERRY_HELLO_F_RDMA);
    assert_int_equal(ferry_transport_find("shm")->hello_bits & FERRY_HELLO_F_CMA, FERRY_HELLO_F_CMA);
    /* The bits on the wire did not move. */
    assert_int_equal(FERRY_HELLO_F_CMA, 0x02);
    assert_int_equal(FERRY_HELLO_F_RDMA, 0x04);
    assert_int_equal(FERRY_HELLO_F_SHMPOOL2, 0x10);
}

/* Tables the check refuses, each for its own reason. */
static int bad_usable(ferry_xport_ctx_t *ctx, const ferry_hello_t *p, char *why, size_t cap)
{
    (void)ctx, (void)p, (void)why, (void)cap;
    return 0;
}
static int bad_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t n, int *broken, ferry_verdict_t *v)
{
    (void)c, (void)xs, (void)n, (void)broken, (void)v;
    return 0;
}
static int bad_serve(ferry_conn_t *c, const ferry_frame_t *f)
{
    (void)c, (void)f;
    return 0;
}

static void expect_refused(const ferry_transport_ops_t *t, const char *detail)
{
    const ferry_transport_ops_t *table[] = {ferry_transport_fallback, t, NULL};
    assert_int_equal(ferry_transport_table_check(table, ferry_transport_fallback), FERRY_ERR_INTERNAL);
    assert_detail_contains(detail);
}

static void table_check_refuses_what_it_must(void **state)
{
    (void)state;
    static const ferry_frame_def_t frame96 = {96, "BAD", 0, 0}, frame_rdma = {64, "BAD", 0, 0};
    static const ferry_frame_range_t r96_111 = {96, 111}, rdma_own = {70, 71}, core = {30, 40};
    static const ferry_transport_key_t key = {"FERRY_BAD", FERRY_KEY_LONG, 0, 1, "0", "help"};
    const ferry_transport_ops_t good = {.name = "bad", .usable = bad_usable, .run = bad_run, .serve = bad_serve,
                                        .version = FERRY_TRANSPORT_OPS_VERSION, .frame_ranges = &r96_111,
                                        .nframe_ranges = 1, .frames = &frame96, .nframes = 1, .keys = &key,
                                        .nkeys = 1};
    const ferry_transport_ops_t *ok[] = {ferry_transport_fallback, &good, NULL};
    assert_int_equal(ferry_transport_table_check(ok, ferry_transport_fallback), 0);
    assert_int_equal(ferry_transport_table_check(ok, &good), 0);

    ferry_transport_ops_t t = good;
    t.version = 0;
    expect_refused(&t, "bad has ops version 0");
    t = good;
    t.frames = &frame_rdma; /* 64: RDMA's, and out of bad's range */
    expect_refused(&t, "bad declares frame 64 (BAD) out of its ranges");
    t = good;
    t.frame_ranges = &core;
    t.nframes = 0;
    expect_refused(&t, "which holds the core's frame 30");
    t = good;
    t.hello_bits = FERRY_HELLO_F_PLACED;
    expect_refused(&t, "declares the core's HELLO bits");
    t = good;
    t.name = ferry_transport_fallback->name;
    expect_refused(&t, "is in the table twice");
    t = good;
    t.serve_types = &frame_rdma.type;
    t.nserve_types = 1;
    expect_refused(&t, "serves frame 64, neither its own nor the core's");

    static const ferry_transport_key_t bad_default = {"FERRY_BAD", FERRY_KEY_LONG, 0, 1, "7", "help"};
    t = good;
    t.keys = &bad_default;
    expect_refused(&t, "key FERRY_BAD has the default '7', not an integer in [0, 1]");

    /* Against the table's own transports: RDMA's range, shm's bits, the key. */
    const ferry_transport_ops_t *rdma = ferry_transport_find("rdma"), *shm = ferry_transport_find("shm");
    t = good;
    t.frame_ranges = &rdma_own;
    t.nframes = 0;
    const ferry_transport_ops_t *with_rdma[] = {rdma, &t, ferry_transport_fallback, NULL};
    assert_int_equal(ferry_transport_table_check(with_rdma, ferry_transport_fallback), FERRY_ERR_INTERNAL);
    assert_detail_contains("rdma and bad share frame ids (64..79, 70..71)");
    t = good;
    t.hello_bits = FERRY_HELLO_F_CMA;
    const ferry_transport_ops_t *with_shm[] = {shm, &t, ferry_transport_fallback, NULL};
    assert_int_equal(ferry_transport_table_check(with_shm, ferry_transport_fallback), FERRY_ERR_INTERNAL);
    assert_detail_contains("shm and bad share HELLO bits 0x2");
    t = good;
    const ferry_transport_ops_t twin = good;
    t.name = "bad2";
    t.frame_ranges = NULL;
    t.nframe_ranges = 0;
    t.nframes = 0;
    const ferry_transport_ops_t *keys[] = {&twin, &t, ferry_transport_fallback, NULL};
    assert_int_equal(ferry_transport_table_check(keys, ferry_transport_fallback), FERRY_ERR_INTERNAL);
    assert_detail_contains("bad and bad2 both declare the key FERRY_BAD");
    /* A fallback out of the table. */
    const ferry_transport_ops_t *alone[] = {&good, NULL};
    assert_int_equal(ferry_transport_table_check(alone, ferry_transport_fallback), FERRY_ERR_INTERNAL);
    assert_detail_contains("its fallback is not in it");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_served_type_has_one_owner),
        cmocka_unit_test(transport_frames_are_declared_once),
        cmocka_unit_test(frame_ranges_are_disjoint_and_hold_every_frame),
        cmocka_unit_test(hello_bits_belong_to_one_transport),
        cmocka_unit_test(table_check_refuses_what_it_must),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
