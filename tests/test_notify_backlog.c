/* SPDX-License-Identifier: Apache-2.0 */
/* Notifications under a lazy receiver (issue 20, item 5): a receiver that
 * reads none of its notifications until the end loses nothing up to its
 * per-sender backlog (more than 100,000), the writes interleaved with them
 * all succeed, and one drain call moves everything queued. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define LAZY_COUNT 100500
#define WRITE_EVERY 500

/* 100,500 notifies from one peer, a 4 KiB write after every 500th, none
 * read until the end: every notify and write returns 0, and draining
 * returns each message once, in order. */
static void a_lazy_receiver_loses_nothing(void **state)
{
    (void)state;
    ferry_engine_t *decode = harness_engine(10000), *prefill = harness_engine(10000);
    const char *peer = ferry_engine_name(decode);
    static unsigned char target[4096], source[4096];
    assert_int_equal(ferry_register(decode, target, sizeof target, FERRY_MEM_REMOTE_WRITE), 0);
    assert_int_equal(ferry_register(prefill, source, sizeof source, FERRY_MEM_LOCAL), 0);
    harness_fill(source, sizeof source, 7);
    char msg[32];
    for (long i = 0; i < LAZY_COUNT; i++) {
        int len = snprintf(msg, sizeof msg, "n%ld", i);
        assert_int_equal(ferry_notify(prefill, peer, msg, (size_t)len), 0);
        if (i % WRITE_EVERY == 0)
            assert_int_equal(ferry_transfer_sync(prefill, peer, FERRY_OP_WRITE, source, (uint64_t)(uintptr_t)target,
                                                 sizeof source),
                             0);
    }
    assert_true(harness_check(target, sizeof target, 7));

    /* One call drains everything queued. */
    ferry_notification_t *got = calloc(LAZY_COUNT + 1, sizeof *got);
    assert_non_null(got);
    long n = ferry_get_notifications(decode, got, LAZY_COUNT + 1);
    printf("# %ld notifications queued unread, drained in one call\n", n);
    assert_int_equal(n, LAZY_COUNT);
    for (long i = 0; i < n; i++) {
        int len = snprintf(msg, sizeof msg, "n%ld", i);
        assert_int_equal(got[i].len, (size_t)len);
        assert_memory_equal(got[i].msg, msg, (size_t)len);
    }
    ferry_notifications_free(got, (size_t)n);
    free(got);
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(decode, &st), 0);
    assert_int_equal(st.notifies_dropped, 0);
    assert_int_equal(ferry_engine_stats(prefill, &st), 0);
    assert_int_equal(st.notifies_unsent, 0);
    ferry_engine_destroy(prefill);
    ferry_engine_destroy(decode);
}

/* A sender over its backlog is dropped and told so; its drop is counted
 * on both sides, and another sender's notifications still arrive. The
 * budget is hit by bytes here: 64 KiB messages fill FERRY_NOTIFY_PEER_BYTES
 * long before the count. */
static void a_sender_over_its_bytes_loses_only_its_own(void **state)
{
    (void)state;
    ferry_engine_t *decode = harness_engine(10000), *flooder = harness_engine(10000),
                   *other = harness_engine(10000);
    const char *peer = ferry_engine_name(decode);
    size_t big = 64u << 10;
    unsigned char *msg = calloc(1, big);
    assert_non_null(msg);
    long sent = 0;
    int rc = 0;
    while ((rc = ferry_notify(flooder, peer, msg, big)) == 0) sent++;
    assert_int_equal(rc, FERRY_ERR_TOO_MANY_REQUESTS);
    assert_int_equal(sent, (long)(FERRY_NOTIFY_PEER_BYTES / (big + FERRY_NOTIFY_ENTRY_OVERHEAD)));
    assert_int_equal(ferry_notify(other, peer, "still here", 10), 0);
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(decode, &st), 0);
    assert_int_equal(st.notifies_dropped, 1);
    assert_int_equal(ferry_engine_stats(flooder, &st), 0);
    assert_int_equal(st.notifies_unsent, 1);
    assert_int_equal(ferry_engine_stats(other, &st), 0);
    assert_int_equal(st.notifies_unsent, 0);

    ferry_notification_t got[64];
    long all = 0, n;
    int other_seen = 0;
    while ((n = ferry_get_notifications(decode, got, 64)) > 0) {
        for (long i = 0; i < n; i++)
            if (got[i].len == 10 && memcmp(got[i].msg, "still here", 10) == 0) other_seen++;
        ferry_notifications_free(got, (size_t)n);
        all += n;
    }
    assert_int_equal(all, sent + 1);
    assert_int_equal(other_seen, 1);
    free(msg);
    ferry_engine_destroy(other);
    ferry_engine_destroy(flooder);
    ferry_engine_destroy(decode);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_lazy_receiver_loses_nothing),
        cmocka_unit_test(a_sender_over_its_bytes_loses_only_its_own),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
