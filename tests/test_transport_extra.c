/* SPDX-License-Identifier: Apache-2.0 */
/* A new transport is one new file and one table entry (README, "Adding a
 * transport"): this file is that file for a trivial transport, "extra",
 * which only this test's build has (test_transport_extra.cmake). It uses
 * what every transport may use (transport.h) and nothing else:
 *  - its ops: usable, run, serve;
 *  - its own frames, EXTRA_PING and EXTRA_PONG, declared here with their
 *    ids, names and payload limits (its frames table) and nowhere else:
 *    the wire layer names, sizes and accepts them through the transport
 *    table, and the target's core hands EXTRA_PING to extra's serve;
 *  - a verdict: it moves no byte itself and leaves every piece to tcp for
 *    the call, without the session leaving it;
 *  - its per-region slot and the slot's release hook (registry.h), which
 *    the registry calls when a region it keeps state for leaves. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "util/clock.h"
#include "harness.h"
#include "link/transport.h"

/* Ids past RDMA's (rdma_wire.h), free in every transport of the table. */
enum { FRAME_EXTRA_PING = 80, FRAME_EXTRA_PONG = 81 };
static const ferry_frame_def_t extra_frame_defs[] = {
    {FRAME_EXTRA_PING, "EXTRA_PING", 0}, /* i->t: aux = a number */
    {FRAME_EXTRA_PONG, "EXTRA_PONG", 0}, /* t->i: req_id echoed, aux = the number + 1 */
};
static const uint8_t extra_serves[] = {FRAME_EXTRA_PING};
static int pings_served;

static pthread_mutex_t extra_lock = PTHREAD_MUTEX_INITIALIZER;
static int runs, states_kept, states_released;
static char extra_state; /* what the transport keeps per region (an address will do) */

static void extra_release(void *ctx, const ferry_region_t *reg, void *state)
{
    (void)reg;
    assert_ptr_equal(state, &extra_state);
    (*(int *)ctx)++;
}

static int extra_usable(ferry_xport_ctx_t *ctx, const ferry_hello_t *peer, char *why, size_t cap)
{
    (void)ctx, (void)peer;
    snprintf(why, cap, "the test's extra transport");
    return 1;
}

/* Target side: answers an EXTRA_PING (which carries no payload: its
 * limit is 0) with an EXTRA_PONG. */
static int extra_serve(ferry_conn_t *c, const ferry_frame_t *f)
{
    assert_int_equal(f->type, FRAME_EXTRA_PING);
    pthread_mutex_lock(&extra_lock);
    pings_served++;
    pthread_mutex_unlock(&extra_lock);
    ferry_frame_t pong = {.type = FRAME_EXTRA_PONG, .req_id = f->req_id, .aux = f->aux + 1};
    return ferry_conn_send_frame(c, &pong, NULL, ferry_deadline_after_ms(5000));
}

/* Initiator side: one EXTRA_PING on the session's connection, its answer. */
static void extra_ping(ferry_conn_t *c)
{
    ferry_frame_t ping = {.type = FRAME_EXTRA_PING, .req_id = 7, .aux = 41}, pong;
    uint64_t deadline = ferry_deadline_after_ms(5000);
    assert_int_equal(ferry_conn_send_frame(c, &ping, NULL, deadline), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &pong, deadline), 0);
    assert_int_equal(pong.type, FRAME_EXTRA_PONG);
    assert_int_equal(pong.req_id, 7);
    assert_int_equal(pong.aux, 42);
}

/* Pings the target over its own frames, keeps state for each piece's local
 * region, then leaves the pieces to tcp. */
static int extra_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t n, int *broken, ferry_verdict_t *verdict)
{
    extra_ping(c);
    ferry_registry_t *r = c->ctx->registry;
    unsigned slot = ferry_transport_region_slot(&ferry_transport_extra);
    assert_true(slot < FERRY_REGION_SLOTS);
    ferry_registry_set_hook(r, slot, &(ferry_region_hook_t){.release = extra_release, .ctx = &states_released});
    ferry_registry_read_lock(r);
    pthread_mutex_lock(&extra_lock); /* the slot is ours to write under the read lock with a lock of our own */
    for (size_t i = 0; i < n; i++) {
        ferry_region_t *reg = ferry_registry_lookup_locked(r, (uint64_t)(uintptr_t)xs[i].local, xs[i].len);
        if (reg && !reg->slot[slot]) {
            reg->slot[slot] = &extra_state;
            states_kept++;
        }
    }
    runs++;
    pthread_mutex_unlock(&extra_lock);
    ferry_registry_unlock(r);
    *broken = 0;
    return ferry_verdict_by_tcp(verdict, "the extra transport moves no byte itself");
}

const ferry_transport_ops_t ferry_transport_extra = {
    .name = "extra",
    .usable = extra_usable,
    .run = extra_run,
    .serve = extra_serve,
    .serve_types = extra_serves,
    .nserve_types = sizeof extra_serves,
    .frames = extra_frame_defs,
    .nframes = sizeof extra_frame_defs / sizeof extra_frame_defs[0],
};

/* The wire layer knows extra's frames from its table alone: names, limits,
 * and which transport serves them. */
static void extra_frames_are_named_sized_and_served(void **state)
{
    (void)state;
    assert_string_equal(ferry_frame_type_name(FRAME_EXTRA_PING), "EXTRA_PING");
    assert_string_equal(ferry_frame_type_name(FRAME_EXTRA_PONG), "EXTRA_PONG");
    assert_ptr_equal(ferry_transport_for_frame(FRAME_EXTRA_PING), &ferry_transport_extra);
    assert_null(ferry_transport_for_frame(FRAME_EXTRA_PONG)); /* an answer: served by no one */
    ferry_frame_t f = {.type = FRAME_EXTRA_PING, .aux = 1}, back;
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(&f, hdr);
    assert_int_equal(ferry_frame_decode(hdr, &back), 0);
    assert_int_equal(back.type, FRAME_EXTRA_PING);
    f.plen = 1; /* past its limit */
    ferry_frame_encode(&f, hdr);
    assert_int_equal(ferry_frame_decode(hdr, &back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("EXTRA_PING frame payload of 1 bytes exceeds its limit of 0");
    /* The id after extra's is nobody's. */
    f.type = FRAME_EXTRA_PONG + 1;
    f.plen = 0;
    ferry_frame_encode(&f, hdr);
    assert_int_equal(ferry_frame_decode(hdr, &back), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("unknown frame type 82");
}

static ferry_engine_t *engine_with(const char *transport)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 5000;
    cfg.transport = transport;
    return harness_engine_cfg(&cfg);
}

static void extra_transport_moves_pieces_and_keeps_region_state(void **state)
{
    (void)state;
    ferry_engine_t *initiator = engine_with("extra"), *target = engine_with("tcp");
    const char *peer = ferry_engine_name(target);
    size_t len = 1u << 20;
    unsigned char *src = malloc(len), *back = calloc(1, len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(initiator, back, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(target, dst, len, FERRY_MEM_REMOTE), 0);

    assert_int_equal(ferry_session_open(initiator, peer), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(initiator, peer, &info), 0);
    assert_string_equal(info.transport, "extra");
    assert_non_null(strstr(info.transport_reason, "forced by config; the test's extra transport"));

    harness_fill(src, len, 12);
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len), 0);
    assert_true(harness_check(dst, len, 12));
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_READ, back, (uint64_t)(uintptr_t)dst, len), 0);
    assert_true(harness_check(back, len, 12));
    /* tcp moved the bytes for each call; the session stayed with extra. */
    assert_int_equal(ferry_session_info(initiator, peer, &info), 0);
    assert_string_equal(info.transport, "extra");
    pthread_mutex_lock(&extra_lock);
    assert_true(runs >= 2);
    assert_int_equal(pings_served, runs); /* each run's EXTRA_PING reached extra's serve */
    assert_int_equal(states_kept, 2);
    pthread_mutex_unlock(&extra_lock);

    /* A region leaving hands the transport its state, once. */
    assert_int_equal(states_released, 0);
    assert_int_equal(ferry_deregister(initiator, src), 0);
    assert_int_equal(states_released, 1);
    /* A region still registered at destruction too. */
    ferry_engine_destroy(initiator);
    assert_int_equal(states_released, 2);

    ferry_engine_destroy(target);
    free(src);
    free(back);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(extra_frames_are_named_sized_and_served),
        cmocka_unit_test(extra_transport_moves_pieces_and_keeps_region_state),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
