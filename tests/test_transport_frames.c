/* SPDX-License-Identifier: Apache-2.0 */
/* Each transport declares the frame types it serves (a list, where a
 * 32-bit mask used to stop at type 31): every type a target serves belongs
 * to exactly one transport, answers and core frames to none, and a
 * transport's own ids past 31 (RDMA_COMMIT_GROUP) are served and named. */
#include <string.h>

#include "harness.h"
#include "link/transport.h"
#include "wire/rdma_wire.h"
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
    assert_ptr_equal(owner[FERRY_FRAME_CMA_WRITE], &ferry_transport_shm);
    assert_ptr_equal(owner[FERRY_FRAME_SHM_MAP_RESP], &ferry_transport_shm);
    assert_ptr_equal(owner[FERRY_FRAME_RDMA_CONNECT], &ferry_transport_rdma);
    assert_ptr_equal(owner[FERRY_FRAME_RDMA_COMMIT_GROUP_ACK], &ferry_transport_rdma);
    assert_null(owner[FERRY_FRAME_WRITE]); /* core frames: named by wire.c */
    assert_null(owner[FERRY_FRAME_CMA_VEC]);
    assert_null(ferry_transport_frame_def(FERRY_FRAME_RDMA_OWN_LAST + 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_served_type_has_one_owner),
        cmocka_unit_test(transport_frames_are_declared_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
