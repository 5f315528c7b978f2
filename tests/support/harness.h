/* SPDX-License-Identifier: Apache-2.0 */
/* Shared helpers for Ferry's tests (cmocka). */
#ifndef FERRY_TEST_HARNESS_H
#define FERRY_TEST_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include <ferry/ferry.h>

/* Asserts that ferry_last_error_detail() contains needle. */
#define assert_detail_contains(needle) harness_assert_detail(needle, __FILE__, __LINE__)
void harness_assert_detail(const char *needle, const char *file, int line);

/* Fills buf with a pattern derived from seed; checks it back. */
void harness_fill(void *buf, size_t len, uint64_t seed);
int harness_check(const void *buf, size_t len, uint64_t seed);
/* Whether every one of the n bytes at buf is v. */
int harness_all_equal(const void *buf, size_t n, unsigned char v);
/* Polls (every 5 ms) until every one of the n bytes at buf is v: 1, or 0
 * when ms passed first (bytes another thread or process places). */
int harness_wait_filled(const void *buf, size_t n, unsigned char v, int ms);

/* An initiator and a target engine of this process; peer: the target's
 * name. */
typedef struct harness_pair {
    ferry_engine_t *initiator, *target;
    char peer[300];
} harness_pair_t;
/* The initiator from cfg (by harness_engine_cfg), the target by
 * harness_engine(target_timeout_ms). */
harness_pair_t *harness_pair_new(ferry_config_t *cfg, int target_timeout_ms);
void harness_pair_free(harness_pair_t *p);

/* An engine on 127.0.0.1 with an OS-picked port, and the short timeouts
 * tests want (timeout_ms as given). Fails the test on failure. */
ferry_engine_t *harness_engine_cfg(ferry_config_t *cfg);
static inline ferry_engine_t *harness_engine(int timeout_ms)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    /* FERRY_TRANSPORT=tcp runs a suite over TCP (auto picks shm between
     * engines of one host). */
    const char *transport = getenv("FERRY_TRANSPORT");
    if (transport && *transport) cfg.transport = transport;
    cfg.timeout_ms = timeout_ms;
    cfg.connect_timeout_ms = timeout_ms < 5000 ? timeout_ms : 5000;
    return harness_engine_cfg(&cfg);
}

/* As harness_engine, but the FERRY_* environment applies first (e.g.
 * FERRY_TRANSPORT=tcp runs a suite over TCP); host and port stay the
 * harness's. */
static inline ferry_engine_t *harness_engine_env(int timeout_ms)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    if (ferry_config_from_env(&cfg) != 0) fail_msg("environment: %s", ferry_last_error_detail());
    cfg.timeout_ms = timeout_ms;
    cfg.connect_timeout_ms = timeout_ms < 5000 ? timeout_ms : 5000;
    return harness_engine_cfg(&cfg);
}

/* The transport a suite run expects between two engines of this host:
 * FERRY_TRANSPORT if set to tcp or shm, else "shm" (what auto picks). */
const char *harness_expected_transport(void);

/* Writes n blocks of block bytes from src to peer at remote in reverse
 * order with one batch, reads them back the same way, and checks them. */
void harness_reverse_batch_round_trip(ferry_engine_t *e, const char *peer, unsigned char *src, uint64_t remote,
                                      int n, size_t block, uint64_t seed);

/* Monotonic milliseconds. */
uint64_t harness_now_ms(void);

/* SIGSTOPs pid and returns once every thread of it is stopped ('T' in
 * /proc/PID/task/TID/stat): the signal takes effect asynchronously, and a
 * thread running on the other core may still answer one request. */
void harness_stop_process(int pid);

#endif
