/* SPDX-License-Identifier: Apache-2.0 */
/* Soak: thousands of async batches of mixed reads and writes through a proxy
 * that cuts connections and corrupts payloads at random (checksums on,
 * retries on). Every request ends; every failure has a link or integrity
 * code; and every byte reported delivered (a completed request, or the
 * confirmed prefix of a failed one) is correct, at the time and at the end.
 * Bounded by batch count and by time (about 30 s at most). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "harness.h"

#define SLOT (64u << 10)
#define RING 256            /* write slots at the target */
#define READ_BLOCKS 64      /* read-only blocks at the target */
#define PER_BATCH 8
#define MAX_BATCHES 3000
#define MAX_MS 30000
#define TIMEOUT_MS 2000

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static bool allowed(int code)
{
    /* CANCEL_UNCONFIRMED: a fence whose own connection the proxy cut. */
    return code == FERRY_ERR_PEER_CLOSED || code == FERRY_ERR_SOCKET || code == FERRY_ERR_CHECKSUM_MISMATCH ||
           code == FERRY_ERR_TIMEOUT || code == FERRY_ERR_CANCEL_UNCONFIRMED;
}

struct slot_state {
    uint64_t seed;
    size_t len;
    bool complete; /* the last write to it completed */
};

static void soak(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.checksum = 1;
    cfg.retries = 1;
    cfg.retry_backoff_ms = 1;
    cfg.slice_size = 16u << 10; /* several slices per request: partial progress happens */
    ferry_engine_t *ini = harness_engine_cfg(&cfg);
    ferry_config_init(&cfg);
    ferry_engine_t *tgt = harness_engine_cfg(&cfg);
    proxy_t *px = proxy_start("127.0.0.1", ferry_engine_port(tgt),
                              &(proxy_opts_t){.cut_prob = 0.02, .corrupt_prob = 0.03, .seed = 42});
    assert_non_null(px);
    const char *peer = proxy_name(px);

    unsigned char *ring = calloc(RING, SLOT), *rblocks = malloc((size_t)READ_BLOCKS * SLOT);
    unsigned char *local = malloc((size_t)PER_BATCH * SLOT);
    assert_int_equal(ferry_register(tgt, ring, (size_t)RING * SLOT, FERRY_MEM_REMOTE_WRITE), 0);
    assert_int_equal(ferry_register(tgt, rblocks, (size_t)READ_BLOCKS * SLOT, FERRY_MEM_REMOTE_READ), 0);
    assert_int_equal(ferry_register(ini, local, (size_t)PER_BATCH * SLOT, 0), 0);
    for (int b = 0; b < READ_BLOCKS; b++) harness_fill(rblocks + (size_t)b * SLOT, SLOT, 1000000 + (uint64_t)b);
    struct slot_state *slots = calloc(RING, sizeof *slots);

    uint64_t t0 = harness_now_ms();
    size_t next_slot = 0;
    long requests = 0, completed = 0, failed = 0, partial_checked = 0;
    long by_code[4] = {0};
    int batches = 0;
    for (; batches < MAX_BATCHES && harness_now_ms() - t0 < MAX_MS; batches++) {
        ferry_batch_t *b;
        size_t n = 1 + rnd() % PER_BATCH;
        assert_int_equal(ferry_batch_alloc(ini, n, &b), 0);
        ferry_request_t reqs[PER_BATCH];
        uint64_t seeds[PER_BATCH];
        size_t where[PER_BATCH];
        for (size_t i = 0; i < n; i++) {
            size_t len = 1 + rnd() % SLOT;
            unsigned char *lbuf = local + i * SLOT;
            if (rnd() % 10 < 7) {
                size_t s = next_slot++ % RING;
                seeds[i] = ((uint64_t)batches << 8) | i;
                harness_fill(lbuf, len, seeds[i]);
                reqs[i] = (ferry_request_t){FERRY_OP_WRITE, lbuf, (uint64_t)(uintptr_t)(ring + s * SLOT), len};
                where[i] = s;
            } else {
                size_t blk = rnd() % READ_BLOCKS;
                memset(lbuf, 0, len);
                reqs[i] = (ferry_request_t){FERRY_OP_READ, lbuf, (uint64_t)(uintptr_t)(rblocks + blk * SLOT), len};
                seeds[i] = 1000000 + blk;
                where[i] = blk;
            }
        }
        assert_int_equal(ferry_batch_submit(b, peer, reqs, n, 0), 0);
        int rc = ferry_batch_wait(b, 5 * TIMEOUT_MS);
        if (rc == FERRY_ERR_TIMEOUT && strstr(ferry_last_error_detail(), "still running")) {
            fprintf(stderr, "batch %d hung: %s\n", batches, ferry_last_error_detail());
            fail();
        }
        for (size_t i = 0; i < n; i++) {
            ferry_status_t st;
            assert_int_equal(ferry_batch_status(b, i, &st), 0);
            requests++;
            bool write = reqs[i].opcode == FERRY_OP_WRITE;
            /* What was reported delivered: all of it, or the confirmed prefix. */
            size_t good = st.state == FERRY_STATUS_COMPLETED ? reqs[i].len : (size_t)st.bytes;
            assert_true(good <= reqs[i].len);
            if (st.state == FERRY_STATUS_COMPLETED) {
                completed++;
                assert_int_equal(st.bytes, reqs[i].len);
            } else {
                failed++;
                assert_true(st.state == FERRY_STATUS_FAILED || st.state == FERRY_STATUS_TIMEOUT);
                if (!allowed(st.code)) {
                    fprintf(stderr, "request failed with %s: %s\n", ferry_error_name(st.code),
                            ferry_last_error_detail());
                    fail();
                }
                by_code[st.code == FERRY_ERR_PEER_CLOSED ? 0 : st.code == FERRY_ERR_SOCKET ? 1
                        : st.code == FERRY_ERR_CHECKSUM_MISMATCH ? 2 : 3]++;
                if (good) partial_checked++;
            }
            if (good) {
                /* The pattern's prefix is the pattern of the prefix. */
                unsigned char *check = write ? ring + where[i] * SLOT : (unsigned char *)reqs[i].local;
                unsigned char *want = malloc(reqs[i].len);
                harness_fill(want, reqs[i].len, seeds[i]);
                if (memcmp(check, want, good) != 0) {
                    fprintf(stderr, "batch %d request %zu (%s of %zu, %zu reported): delivered bytes are wrong\n",
                            batches, i, write ? "write" : "read", reqs[i].len, good);
                    fail();
                }
                free(want);
            }
            if (write) slots[where[i]] = (struct slot_state){seeds[i], reqs[i].len, st.state == FERRY_STATUS_COMPLETED};
        }
        assert_int_equal(ferry_batch_free(b), 0);
    }
    uint64_t took = harness_now_ms() - t0;
    /* Nothing landed late on top of a completed write. */
    int rechecked = 0;
    for (size_t s = 0; s < RING; s++) {
        if (!slots[s].complete) continue;
        unsigned char *want = malloc(slots[s].len);
        harness_fill(want, slots[s].len, slots[s].seed);
        assert_memory_equal(ring + s * SLOT, want, slots[s].len);
        free(want);
        rechecked++;
    }
    ferry_stats_t si;
    ferry_engine_stats(ini, &si);
    fprintf(stderr,
            "soak: %d batches, %ld requests in %llu ms: %ld completed, %ld failed (PEER_CLOSED %ld, SOCKET %ld, "
            "CHECKSUM %ld, TIMEOUT or CANCEL_UNCONFIRMED %ld; %ld with a verified partial prefix); proxy cut %llu connections and "
            "corrupted %llu frames; %llu retries, %llu reconnects, %llu teardowns; %d slots rechecked\n",
            batches, requests, (unsigned long long)took, completed, failed, by_code[0], by_code[1], by_code[2],
            by_code[3], partial_checked, (unsigned long long)proxy_cuts(px), (unsigned long long)proxy_corrupted(px),
            (unsigned long long)si.retries, (unsigned long long)si.reconnects,
            (unsigned long long)si.session_teardowns, rechecked);
    assert_true(batches >= 1000);
    assert_true(proxy_cuts(px) > 0 && proxy_corrupted(px) > 0); /* faults really happened */
    assert_true(completed >= requests * 8 / 10);                /* and retries absorbed most */
    assert_int_equal(si.requests, requests);
    assert_int_equal(si.requests_completed, completed);
    assert_int_equal(si.requests_failed, failed);
    ferry_engine_destroy(ini);
    proxy_stop(px);
    ferry_engine_destroy(tgt);
    free(ring);
    free(rblocks);
    free(local);
    free(slots);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(soak)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
