/* SPDX-License-Identifier: Apache-2.0 */
/* The transport "extra" (extra.c), which only this folder's tests have,
 * at work: its frames known to the wire layer from the table alone, its
 * engine hooks, HELLO bit and configuration key, pieces it leaves to tcp,
 * the per-region state it keeps. Its table is the tests' own
 * (tests.cmake): the library's has no "extra". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "extra.h"
#include "harness.h"

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
    setenv("FERRY_EXTRA_PING", "99", 1); /* its key: the pings carry 99, the pongs 100 (extra.c) */
    pthread_mutex_lock(&extra_lock);
    int inits = extra_inits, finis = extra_finis;
    pthread_mutex_unlock(&extra_lock);
    ferry_engine_t *initiator = engine_with("extra"), *target = engine_with("tcp");
    pthread_mutex_lock(&extra_lock);
    assert_int_equal(extra_inits, inits + 2); /* engine_init, once per engine created */
    assert_int_equal(extra_finis, finis);
    pthread_mutex_unlock(&extra_lock);
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
    assert_true(extra_runs >= 2);
    assert_int_equal(extra_pings_served, extra_runs); /* each run's EXTRA_PING reached extra's serve */
    assert_int_equal(extra_states_kept, 2);
    pthread_mutex_unlock(&extra_lock);

    /* A region leaving hands the transport its state, once. */
    assert_int_equal(extra_states_released, 0);
    assert_int_equal(ferry_deregister(initiator, src), 0);
    assert_int_equal(extra_states_released, 1);
    /* A region still registered at destruction too. */
    ferry_engine_destroy(initiator);
    assert_int_equal(extra_states_released, 2);

    ferry_engine_destroy(target);
    pthread_mutex_lock(&extra_lock);
    assert_int_equal(extra_finis, finis + 2); /* engine_fini, once per engine destroyed */
    pthread_mutex_unlock(&extra_lock);
    unsetenv("FERRY_EXTRA_PING");
    free(src);
    free(back);
    free(dst);
}

/* The peer's HELLO decides: extra is usable only with a peer that
 * advertises extra's own bit, which the table's engines do. */
static void extra_is_chosen_by_its_hello_bit(void **state)
{
    (void)state;
    ferry_hello_t peer = {.name = "p"};
    char why[128];
    assert_false(ferry_transport_extra.usable(NULL, &peer, why, sizeof why));
    assert_string_equal(why, "the peer does not serve EXTRA_PING");
    peer.flags = EXTRA_HELLO_F_PING;
    assert_true(ferry_transport_extra.usable(NULL, &peer, why, sizeof why));
}

/* Its key is read through the link layer's one function: range-checked,
 * and only when some transport of the table declares it. */
static void extra_key_is_read_and_checked(void **state)
{
    (void)state;
    long v = -1;
    unsetenv("FERRY_EXTRA_PING");
    assert_int_equal(ferry_transport_key(&extra_keys[0], &v, NULL), 0);
    assert_int_equal(v, 41); /* unset: the key's default */
    setenv("FERRY_EXTRA_PING", "7", 1);
    assert_int_equal(ferry_transport_key(&extra_keys[0], &v, NULL), 1);
    assert_int_equal(v, 7);
    setenv("FERRY_EXTRA_PING", "1001", 1);
    assert_int_equal(ferry_transport_key(&extra_keys[0], &v, NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("FERRY_EXTRA_PING='1001' is not an integer in [0, 1000]");
    unsetenv("FERRY_EXTRA_PING");
    static const ferry_transport_key_t stray = {"FERRY_EXTRA_STRAY", FERRY_KEY_FLAG, 0, 1, "0", "in no table"};
    assert_int_equal(ferry_transport_key(&stray, &v, NULL), FERRY_ERR_INTERNAL);
    assert_detail_contains("FERRY_EXTRA_STRAY is in no transport's keys table");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(extra_frames_are_named_sized_and_served),
        cmocka_unit_test(extra_transport_moves_pieces_and_keeps_region_state),
        cmocka_unit_test(extra_is_chosen_by_its_hello_bit),
        cmocka_unit_test(extra_key_is_read_and_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
