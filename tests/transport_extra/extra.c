/* SPDX-License-Identifier: Apache-2.0 */
/* A trivial transport, "extra", which only the tests of this folder have
 * (tests.cmake): made the way README's "Adding a transport" says, it uses
 * what every transport may use (link/transport.h) and nothing else:
 *  - its ops, of this ops version: usable, run, serve, engine_init and
 *    engine_fini;
 *  - its own frames, EXTRA_PING and EXTRA_PONG, declared here with their
 *    ids (in the range it declares), names and payload limits (its frames
 *    table) and nowhere else: the wire layer names, sizes and accepts them
 *    through the transport table, and the target's core hands EXTRA_PING
 *    to extra's serve;
 *  - its HELLO bit, which it advertises and wants from its peer;
 *  - a configuration key, read through ferry_transport_key;
 *  - a verdict: it moves no byte itself and leaves every piece to tcp for
 *    the call, without the session leaving it;
 *  - its per-region slot and the slot's release hook (registry.h), which
 *    the registry calls when a region it keeps state for leaves. */
#include "extra.h"

#include <stdio.h>

#include "harness.h"
#include "util/clock.h"

static const ferry_frame_def_t extra_frame_defs[] = {
    {FRAME_EXTRA_PING, "EXTRA_PING", 0, 0}, /* i->t: aux = a number */
    {FRAME_EXTRA_PONG, "EXTRA_PONG", 0, 0}, /* t->i: req_id echoed, aux = the number + 1 */
};
static const ferry_frame_range_t extra_ranges[] = {{FRAME_EXTRA_PING, FRAME_EXTRA_LAST}};
static const uint8_t extra_serves[] = {FRAME_EXTRA_PING};

const ferry_transport_key_t extra_keys[] = {
    {"FERRY_EXTRA_PING", FERRY_KEY_LONG, 0, 1000, "41", "the number each EXTRA_PING carries (the test's transport)"},
};

pthread_mutex_t extra_lock = PTHREAD_MUTEX_INITIALIZER;
int extra_runs, extra_pings_served, extra_states_kept, extra_states_released, extra_inits, extra_finis;
static char extra_state; /* what the transport keeps per region (an address will do) */

static void extra_release(void *ctx, const ferry_region_t *reg, void *state)
{
    (void)reg;
    assert_ptr_equal(state, &extra_state);
    (*(int *)ctx)++;
}

static int extra_init(ferry_xport_ctx_t *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&extra_lock);
    extra_inits++;
    pthread_mutex_unlock(&extra_lock);
    return 0;
}

static void extra_fini(ferry_xport_ctx_t *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&extra_lock);
    extra_finis++;
    pthread_mutex_unlock(&extra_lock);
}

static int extra_usable(ferry_xport_ctx_t *ctx, const ferry_hello_t *peer, char *why, size_t cap)
{
    (void)ctx;
    if (!(peer->flags & EXTRA_HELLO_F_PING)) {
        snprintf(why, cap, "the peer does not serve EXTRA_PING");
        return 0;
    }
    snprintf(why, cap, "the test's extra transport");
    return 1;
}

static uint32_t extra_hello_flags(ferry_xport_ctx_t *ctx)
{
    (void)ctx;
    return EXTRA_HELLO_F_PING;
}

/* Target side: answers an EXTRA_PING (which carries no payload: its
 * limit is 0) with an EXTRA_PONG. */
static int extra_serve(ferry_conn_t *c, const ferry_frame_t *f)
{
    assert_int_equal(f->type, FRAME_EXTRA_PING);
    pthread_mutex_lock(&extra_lock);
    extra_pings_served++;
    pthread_mutex_unlock(&extra_lock);
    ferry_frame_t pong = {.type = FRAME_EXTRA_PONG, .req_id = f->req_id, .aux = f->aux + 1};
    return ferry_conn_send_frame(c, &pong, NULL, ferry_deadline_after_ms(5000));
}

/* Initiator side: one EXTRA_PING on the session's connection, carrying its
 * configuration key's number, and its answer. */
static void extra_ping(ferry_conn_t *c)
{
    long number = 41;
    assert_true(ferry_transport_key(&extra_keys[0], &number, NULL) >= 0);
    ferry_frame_t ping = {.type = FRAME_EXTRA_PING, .req_id = 7, .aux = (uint64_t)number}, pong;
    uint64_t deadline = ferry_deadline_after_ms(5000);
    assert_int_equal(ferry_conn_send_frame(c, &ping, NULL, deadline), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &pong, deadline), 0);
    assert_int_equal(pong.type, FRAME_EXTRA_PONG);
    assert_int_equal(pong.req_id, 7);
    assert_int_equal(pong.aux, (uint64_t)number + 1);
}

/* Pings the target over its own frames, keeps state for each piece's local
 * region, then leaves the pieces to tcp. */
static int extra_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t n, int *broken, ferry_verdict_t *verdict)
{
    extra_ping(c);
    ferry_registry_t *r = c->ctx->registry;
    unsigned slot = ferry_transport_region_slot(&ferry_transport_extra);
    assert_true(slot < FERRY_REGION_SLOTS);
    ferry_registry_set_hook(r, slot, &(ferry_region_hook_t){.release = extra_release, .ctx = &extra_states_released});
    ferry_registry_read_lock(r);
    pthread_mutex_lock(&extra_lock); /* the slot is ours to write under the read lock with a lock of our own */
    for (size_t i = 0; i < n; i++) {
        ferry_region_t *reg = ferry_registry_lookup_locked(r, (uint64_t)(uintptr_t)xs[i].local, xs[i].len);
        if (reg && !reg->slot[slot]) {
            reg->slot[slot] = &extra_state;
            extra_states_kept++;
        }
    }
    extra_runs++;
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
    .hello_flags = extra_hello_flags,
    .engine_fini = extra_fini,
    .version = FERRY_TRANSPORT_OPS_VERSION,
    .engine_init = extra_init,
    .frame_ranges = extra_ranges,
    .nframe_ranges = sizeof extra_ranges / sizeof extra_ranges[0],
    .hello_bits = EXTRA_HELLO_F_PING,
    .keys = extra_keys,
    .nkeys = 1,
};
