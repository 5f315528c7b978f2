/* SPDX-License-Identifier: Apache-2.0 */
/* The completion notice's wire form: round trips, foreign messages, and
 * damaged ones. */
#include "harness.h"

#include <string.h>

#include <ferry/kv.h>

static void round_trip_keeps_every_field(void **state)
{
    (void)state;
    unsigned char aux[] = {0x2a, 0, 0, 0, 0xff};
    ferry_kv_notice_t n = {.request_id = 0x1122334455667788ull, .status = FERRY_ERR_TIMEOUT,
                           .prefill_rank = 3, .decode_rank = 1, .bytes = 1ull << 40,
                           .aux_len = sizeof aux, .aux = aux};
    strcpy(n.reason, "write to 127.0.0.1:7001 timed out");
    unsigned char buf[256];
    long len = ferry_kv_notice_encode(&n, buf, sizeof buf);
    assert_int_equal(len, FERRY_KV_NOTICE_HEADER + sizeof aux + strlen(n.reason));
    assert_int_equal((size_t)len, ferry_kv_notice_size(&n));

    ferry_kv_notice_t out;
    assert_int_equal(ferry_kv_notice_decode(buf, (size_t)len, &out), 1);
    assert_int_equal(out.request_id, n.request_id);
    assert_int_equal(out.status, FERRY_ERR_TIMEOUT);
    assert_int_equal(out.prefill_rank, 3);
    assert_int_equal(out.decode_rank, 1);
    assert_int_equal(out.bytes, 1ull << 40);
    assert_int_equal(out.aux_len, sizeof aux);
    assert_memory_equal(out.aux, aux, sizeof aux);
    assert_string_equal(out.reason, n.reason);
}

static void success_without_aux(void **state)
{
    (void)state;
    ferry_kv_notice_t n = {.request_id = 7};
    unsigned char buf[FERRY_KV_NOTICE_HEADER];
    assert_int_equal(ferry_kv_notice_encode(&n, buf, sizeof buf), FERRY_KV_NOTICE_HEADER);
    ferry_kv_notice_t out;
    assert_int_equal(ferry_kv_notice_decode(buf, sizeof buf, &out), 1);
    assert_int_equal(out.status, 0);
    assert_null(out.aux);
    assert_string_equal(out.reason, "");
}

static void other_messages_are_not_notices(void **state)
{
    (void)state;
    ferry_kv_notice_t out;
    assert_int_equal(ferry_kv_notice_decode("hello world", 11, &out), 0);
    assert_int_equal(ferry_kv_notice_decode("FK", 2, &out), 0);
    assert_int_equal(ferry_kv_notice_decode(NULL, 0, &out), 0);
}

static void damaged_notices_are_malformed(void **state)
{
    (void)state;
    unsigned char aux[8] = {0};
    ferry_kv_notice_t n = {.request_id = 9, .aux_len = sizeof aux, .aux = aux};
    unsigned char buf[64];
    long len = ferry_kv_notice_encode(&n, buf, sizeof buf);
    assert_true(len > 0);
    ferry_kv_notice_t out;
    assert_int_equal(ferry_kv_notice_decode(buf, (size_t)len - 1, &out), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("do not hold aux 8 + reason 0");
    assert_int_equal(ferry_kv_notice_decode(buf, 20, &out), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("header needs 40");
    buf[3] = 2;
    assert_int_equal(ferry_kv_notice_decode(buf, (size_t)len, &out), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("version 2");
}

static void encode_refuses_oversized_or_short(void **state)
{
    (void)state;
    unsigned char buf[64];
    ferry_kv_notice_t n = {.aux_len = FERRY_KV_AUX_MAX + 1, .aux = buf};
    assert_int_equal(ferry_kv_notice_encode(&n, buf, sizeof buf), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("limit 32768");
    n.aux_len = 30;
    assert_int_equal(ferry_kv_notice_encode(&n, buf, sizeof buf), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("70 bytes needed, room for 64");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip_keeps_every_field),
        cmocka_unit_test(success_without_aux),
        cmocka_unit_test(other_messages_are_not_notices),
        cmocka_unit_test(damaged_notices_are_malformed),
        cmocka_unit_test(encode_refuses_oversized_or_short),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
