/* SPDX-License-Identifier: Apache-2.0 */
/* The error table: names, values kept from Mooncake, retry flags, details. */
#include "harness.h"

#include <string.h>

#include "util/fail.h"

static void mooncake_values_kept(void **state)
{
    (void)state;
    assert_int_equal(FERRY_ERR_INVALID_ARGUMENT, -1);
    assert_int_equal(FERRY_ERR_TOO_MANY_REQUESTS, -2);
    assert_int_equal(FERRY_ERR_ADDRESS_NOT_REGISTERED, -3);
    assert_int_equal(FERRY_ERR_BATCH_BUSY, -4);
    assert_int_equal(FERRY_ERR_DEVICE_NOT_FOUND, -6);
    assert_int_equal(FERRY_ERR_ADDRESS_OVERLAPPED, -7);
    assert_int_equal(FERRY_ERR_DNS, -101);
    assert_int_equal(FERRY_ERR_SOCKET, -102);
    assert_int_equal(FERRY_ERR_MALFORMED_JSON, -103);
    assert_int_equal(FERRY_ERR_REJECT_HANDSHAKE, -104);
    assert_int_equal(FERRY_ERR_METADATA, -200);
    assert_int_equal(FERRY_ERR_ENDPOINT, -201);
    assert_int_equal(FERRY_ERR_CONTEXT, -202);
    assert_int_equal(FERRY_ERR_NUMA, -300);
    assert_int_equal(FERRY_ERR_CLOCK, -301);
    assert_int_equal(FERRY_ERR_MEMORY, -302);
    assert_int_equal(FERRY_ERR_NOT_IMPLEMENTED, -303);
}

static void names_meanings_advice(void **state)
{
    (void)state;
    assert_string_equal(ferry_error_name(-3), "ADDRESS_NOT_REGISTERED");
    assert_string_equal(ferry_error_name(FERRY_ERR_PEER_RESTARTED), "PEER_RESTARTED");
    assert_string_equal(ferry_error_name(12345), "UNKNOWN");
    assert_non_null(strstr(ferry_strerror(FERRY_ERR_TIMEOUT), "deadline"));
    assert_non_null(strstr(ferry_error_advice(FERRY_ERR_ADDRESS_NOT_REGISTERED), "re-register"));
    assert_string_equal(ferry_strerror(999), "unknown error code");
}

static void retryable_by_code_alone(void **state)
{
    (void)state;
    assert_true(ferry_error_retryable(FERRY_ERR_TIMEOUT));
    assert_true(ferry_error_retryable(FERRY_ERR_PEER_CLOSED));
    assert_true(ferry_error_retryable(FERRY_ERR_SOCKET));
    assert_false(ferry_error_retryable(FERRY_ERR_PEER_RESTARTED));
    assert_false(ferry_error_retryable(FERRY_ERR_INVALID_ARGUMENT));
    assert_false(ferry_error_retryable(FERRY_ERR_ADDRESS_NOT_REGISTERED));
    assert_false(ferry_error_retryable(FERRY_ERR_VERSION_MISMATCH));
    assert_false(ferry_error_retryable(777));
}

static void parse_by_name_or_number(void **state)
{
    (void)state;
    int c = 0;
    assert_true(ferry_error_parse("TIMEOUT", &c));
    assert_int_equal(c, FERRY_ERR_TIMEOUT);
    assert_true(ferry_error_parse("ferry_err_peer_closed", &c));
    assert_int_equal(c, FERRY_ERR_PEER_CLOSED);
    assert_true(ferry_error_parse("-3", &c));
    assert_int_equal(c, -3);
    assert_true(ferry_error_parse("MALFORMED_JSON", &c));
    assert_int_equal(c, -103);
    assert_false(ferry_error_parse("-5", &c));
    /* Out of int's range: an error, not the code it wraps to (4294966894 is
     * -402, PEER_RESTARTED, modulo 2^32). */
    assert_false(ferry_error_parse("4294966894", &c));
    assert_false(ferry_error_parse("-4294967298", &c));
    assert_false(ferry_error_parse("99999999999999999999999", &c));
    assert_false(ferry_error_parse("NOPE", &c));
    assert_false(ferry_error_parse("", &c));
}

static void detail_is_per_thread_and_prefixable(void **state)
{
    (void)state;
    ferry_clear_last_error();
    assert_string_equal(ferry_last_error_detail(), "");
    int rc = ferry_fail(FERRY_ERR_OUT_OF_BOUNDS, "range [0x%x+%d) crosses region end", 0x1000, 64);
    assert_int_equal(rc, FERRY_ERR_OUT_OF_BOUNDS);
    assert_int_equal(ferry_last_error_code(), FERRY_ERR_OUT_OF_BOUNDS);
    assert_detail_contains("OUT_OF_BOUNDS (-404)");
    assert_detail_contains("[0x1000+64)");
    rc = ferry_fail_context("write to %s", "127.0.0.1:9");
    assert_int_equal(rc, FERRY_ERR_OUT_OF_BOUNDS);
    assert_detail_contains("OUT_OF_BOUNDS (-404): write to 127.0.0.1:9: range [0x1000+64)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mooncake_values_kept),
        cmocka_unit_test(names_meanings_advice),
        cmocka_unit_test(retryable_by_code_alone),
        cmocka_unit_test(parse_by_name_or_number),
        cmocka_unit_test(detail_is_per_thread_and_prefixable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
