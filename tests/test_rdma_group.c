/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport's group commit (protocol 3; rdma_wire.h) on the
 * software HCA of tests/support/rdma_fake.c: negotiated with older peers,
 * per-piece failures in the one answer, cancel and fences, refusals by the
 * target.
 *
 * Needs <infiniband/verbs.h>; skipped in builds without the verbs code. */
#ifndef FERRY_HAVE_RDMA
#include "harness.h"
static void skipped(void **state)
{
    (void)state;
    skip();
}
int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"
#include "engine/session.h"
#include "link/conn.h"
#include "util/net.h"
#include "engine/testing.h"
#include "harness.h"
#include "rdma_fake.h"
#include "transport/rdma/rdma_wire.h"

/* 1,024 RDMA-written pieces are committed with one immediate and one
 * RDMA_COMMIT_GROUP (the commit frames counted by their immediates, one
 * each) when both ends speak protocol 3; when either end is older, each
 * piece with its own (the per-piece RDMA_COMMIT). Every byte lands. */
static void group_commit_is_negotiated(void **state)
{
    (void)state;
    enum { N = 1024, LEN = 2048 };
    static const struct {
        int initiator, target, expect_version;
        long expect_imms;
    } cases[] = {{0, 0, FERRY_PROTOCOL_VERSION, 1}, {2, 0, 2, N}, {0, 2, 2, N}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        pair_t p = pair_make_one_conn(20000, 3);
        if (cases[c].initiator) ferry_test_set_protocol_version(p.initiator, cases[c].initiator);
        if (cases[c].target) ferry_test_set_protocol_version(p.target, cases[c].target);
        scatter_t s = scatter_make(&p, N, LEN, false);
        assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
        memset(s.dst, 0, s.cap);
        ferry_peer_info_t info;
        assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
        assert_string_equal(info.transport, "rdma");
        assert_int_equal(info.protocol_version, cases[c].expect_version);
        long imms = hca_get(&H.imms);
        assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N),
                         0);
        for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
        assert_int_equal(hca_get(&H.imms) - imms, cases[c].expect_imms);
        scatter_end(&p, &s);
        pair_end(&p);
    }
}

/* The target region of every other piece is deregistered after the
 * pieces' bytes were written and before the group's commit is checked (the
 * HCA holds the immediate): the one answer fails exactly those pieces,
 * each with its code and a detail naming its own range, the first with
 * the target's reason; the others complete. */
static void group_commit_fails_pieces_one_by_one(void **state)
{
    (void)state;
    enum { N = 64, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    unsigned char *src = malloc((size_t)N * LEN), *a = calloc(N, LEN), *b = calloc(N, LEN);
    assert_int_equal(ferry_register(p.initiator, src, (size_t)N * LEN, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, a, (size_t)N * LEN, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(p.target, b, (size_t)N * LEN, FERRY_MEM_REMOTE), 0);
    harness_fill(src, (size_t)N * LEN, 21);
    assert_int_equal(write_sync(&p, src, a, 64), 0); /* the QP */
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++) {
        unsigned char *dst = (i % 2 ? b : a) + (size_t)(i / 2) * LEN;
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)i * LEN, (uint64_t)(uintptr_t)dst, LEN};
    }
    pthread_mutex_lock(&H.lock);
    H.pause_at_imm = 1;
    pthread_mutex_unlock(&H.lock);
    long imms = hca_get(&H.imms);
    ferry_batch_t *batch;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &batch), 0);
    assert_int_equal(ferry_batch_submit(batch, p.peer, reqs, N, 0), 0);
    wait_paused(); /* every data write done, the group's immediate held */
    assert_int_equal(ferry_deregister(p.target, b), 0);
    hca_pause(0);
    assert_int_equal(ferry_batch_wait(batch, 20000), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(hca_get(&H.imms) - imms, 1); /* one group commit */
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(batch, (size_t)i, &st), 0);
        if (i % 2 == 0) {
            assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
            assert_memory_equal((void *)(uintptr_t)reqs[i].remote, reqs[i].local, LEN);
            continue;
        }
        assert_int_equal(st.state, FERRY_STATUS_FAILED);
        assert_int_equal(st.code, FERRY_ERR_ADDRESS_NOT_REGISTERED);
        char range[64];
        snprintf(range, sizeof range, "0x%llx", (unsigned long long)reqs[i].remote);
        assert_detail_contains(range);
        if (i == 1) assert_detail_contains("region deregistered during the write");
        else assert_detail_contains("one of 64 pieces in one group commit");
    }
    assert_int_equal(ferry_batch_free(batch), 0);
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, a);
    free(src);
    free(a);
    free(b);
    pair_end(&p);
}

/* Cancel while the group's immediate is held at the HCA (every data write
 * done, nothing confirmed): every piece ends CANCELLED or COMPLETED
 * (placed), nothing is left on the HCA, and no byte lands after the cancel
 * returned. */
static void cancel_during_group_commit(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    pthread_mutex_lock(&H.lock);
    H.pause_at_imm = 1;
    pthread_mutex_unlock(&H.lock);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &b), 0);
    ferry_request_t *reqs = malloc(N * sizeof *reqs);
    for (int i = 0; i < N; i++) reqs[i] = (ferry_request_t){FERRY_OP_WRITE, s.locals[i], s.remotes[i], LEN};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, N, 0), 0);
    wait_paused();
    struct unpause_later u;
    atomic_init(&u.cancel_done, 0);
    pthread_create(&u.t, NULL, unpause_main, &u);
    int rc = ferry_batch_cancel(b);
    atomic_store(&u.cancel_done, 1);
    pthread_join(u.t, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(hca_queued(), 0);
    unsigned char *snap = malloc(s.cap);
    memcpy(snap, s.dst, s.cap);
    int cancelled = 0;
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        if (st.state == FERRY_STATUS_COMPLETED) {
            assert_true(scatter_landed(&s, (size_t)i));
        } else {
            assert_int_equal(st.state, FERRY_STATUS_CANCELLED);
            cancelled++;
        }
    }
    fprintf(stderr, "cancel during the group commit: %d of %d cancelled\n", cancelled, N);
    assert_int_equal(ferry_batch_free(b), 0);
    usleep(20000);
    assert_memory_equal(snap, s.dst, s.cap); /* no late write */
    assert_int_equal(hca_queued(), 0);
    free(snap);
    free(reqs);
    scatter_end(&p, &s);
    pair_end(&p);
}

/* The HCA refuses the group's immediate: nothing is committed, the run
 * retries on a new QP, all land. */
static void group_commit_post_refused(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    long qps = hca_get(&H.qps_made);
    pthread_mutex_lock(&H.lock);
    H.refuse_post_at = N + 1; /* after the N data work requests */
    pthread_mutex_unlock(&H.lock);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_true(hca_get(&H.qps_made) - qps >= 2);
    scatter_end(&p, &s);
    pair_end(&p);
}

/* Sends RDMA_COMMIT_GROUP of one piece [addr+len) on c and expects the
 * target to drop the connection with an ERROR whose text has want. */
static void expect_group_dropped(ferry_conn_t *c, uint64_t npieces, uint64_t addr, uint64_t len, const char *want)
{
    uint64_t dl = ferry_deadline_after_ms(5000);
    uint8_t d[FERRY_RDMA_COMMIT_DESC_SIZE];
    ferry_rdma_commit_desc_t desc = {addr, len, 1, 0};
    ferry_rdma_commit_desc_encode(&desc, d);
    ferry_frame_t g = {.type = FERRY_FRAME_RDMA_COMMIT_GROUP, .req_id = 1, .addr = len, .len = npieces,
                       .plen = npieces ? sizeof d : 0}, f;
    assert_int_equal(ferry_conn_send_frame(c, &g, d, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_ERROR);
    assert_int_equal(ferry_conn_fail_from_target(c, &f, dl, NULL, 0), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains(want);
}

/* Sends a valid RDMA_CONNECT on c; the target accepts it. */
static void raw_rdma_connect(ferry_conn_t *c)
{
    uint64_t dl = ferry_deadline_after_ms(5000);
    ferry_rdma_qp_info_t qi = {.qpn = 0x999, .psn = 1, .lid = 1, .port = 1, .link_layer = FERRY_RDMA_LINK_IB,
                               .mtu = 5, .rd_atom = 1, .recv_depth = 8};
    uint8_t qb[FERRY_RDMA_QP_INFO_SIZE];
    ferry_rdma_qp_info_encode(&qi, qb);
    ferry_frame_t cf = {.type = FERRY_FRAME_RDMA_CONNECT, .plen = sizeof qb}, f;
    assert_int_equal(ferry_conn_send_frame(c, &cf, qb, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_RDMA_CONNECT_ACK);
    assert_int_equal(f.status, 0);
    assert_int_equal(ferry_conn_discard(c, f.plen, dl), 0);
}

/* Raw RDMA_COMMIT_GROUPs the target refuses by closing the connection: no
 * pieces, one before the queue pair exists, a bad descriptor, and one on
 * a connection whose protocol predates group commits. */
static void target_refuses_bad_group_commits(void **state)
{
    (void)state;
    for (int version = 3; version >= 2; version--) {
        pair_t p = pair_make_one_conn(5000, 0);
        if (version == 2) ferry_test_set_protocol_version(p.initiator, 2);
        unsigned char *dst = malloc(8192);
        uint64_t a = (uint64_t)(uintptr_t)dst;
        assert_int_equal(ferry_register(p.target, dst, 8192, FERRY_MEM_REMOTE), 0);
        ferry_session_t *s;
        assert_int_equal(ferry_session_get(p.initiator, p.peer, &s), 0);
        for (int k = 0; k < (version == 3 ? 3 : 1); k++) {
            ferry_conn_t *c;
            assert_int_equal(ferry_session_checkout(s, ferry_deadline_after_ms(5000), &c), 0);
            if (version == 2) {
                raw_rdma_connect(c);
                expect_group_dropped(c, 1, a, 64, "connection of protocol 2 (needs 3)");
            } else if (k == 0) {
                expect_group_dropped(c, 0, a, 64, "RDMA_COMMIT_GROUP of 0 pieces");
            } else if (k == 1) {
                expect_group_dropped(c, 1, a, 64, "RDMA_COMMIT_GROUP before RDMA_CONNECT");
            } else {
                raw_rdma_connect(c);
                expect_group_dropped(c, 1, a, 0, "piece 0: [0x");
            }
            ferry_session_checkin(s, c, false);
        }
        ferry_session_put(s);
        ferry_deregister(p.target, dst);
        free(dst);
        pair_end(&p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(group_commit_is_negotiated),
        cmocka_unit_test(group_commit_fails_pieces_one_by_one),
        cmocka_unit_test(cancel_during_group_commit),
        cmocka_unit_test(group_commit_post_refused),
        cmocka_unit_test(target_refuses_bad_group_commits),
    };
    return cmocka_run_group_tests(tests, start_hca, stop_hca);
}
#endif
