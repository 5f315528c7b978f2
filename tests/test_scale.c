/* SPDX-License-Identifier: Apache-2.0 */
/* Scale: a target with 100,000 registered regions. The handshake and the
 * segment table (paged, 4096 entries a page) carry all of them; transfers
 * land in the last and a middle one; a region registered afterwards is
 * found; registration of a short-lived buffer stays cheap. Figures are
 * printed, never asserted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { REGIONS = 100000, REGION = 256 };

#include <time.h>

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static double ms_since(uint64_t t0) { return (double)(now_us() - t0) / 1000.0; }

static void hundred_thousand_regions(void **state)
{
    (void)state;
    ferry_engine_t *target = harness_engine(20000), *initiator = harness_engine(20000);
    const char *peer = ferry_engine_name(target);
    size_t total = (size_t)REGIONS * REGION;
    unsigned char *mem = calloc(1, total);
    void **addrs = malloc(REGIONS * sizeof *addrs);
    size_t *lens = malloc(REGIONS * sizeof *lens);
    for (size_t i = 0; i < REGIONS; i++) {
        addrs[i] = mem + i * REGION;
        lens[i] = REGION;
    }
    uint64_t t0 = now_us();
    assert_int_equal(ferry_register_batch(target, addrs, lens, REGIONS, FERRY_MEM_REMOTE), 0);
    double t_register = ms_since(t0);
    assert_int_equal(ferry_region_count(target), REGIONS);

    t0 = now_us();
    assert_int_equal(ferry_session_open(initiator, peer), 0);
    double t_open = ms_since(t0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(initiator, peer, &info), 0);
    assert_int_equal(info.segment_count, REGIONS);

    ferry_segment_t *segs = malloc(REGIONS * sizeof *segs);
    t0 = now_us();
    long n = ferry_session_segments(initiator, peer, segs, REGIONS);
    double t_segments = ms_since(t0);
    assert_int_equal(n, REGIONS);
    for (size_t i = 0; i < REGIONS; i++) {
        assert_int_equal(segs[i].addr, (uint64_t)(uintptr_t)(mem + i * REGION));
        assert_int_equal(segs[i].len, REGION);
    }

    unsigned char *src = malloc(REGION);
    assert_int_equal(ferry_register(initiator, src, REGION, FERRY_MEM_LOCAL), 0);
    size_t picks[] = {REGIONS - 1, REGIONS / 2, 0};
    t0 = now_us();
    for (size_t k = 0; k < 3; k++) {
        harness_fill(src, REGION, picks[k]);
        assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, segs[picks[k]].addr, REGION), 0);
        assert_true(harness_check(mem + picks[k] * REGION, REGION, picks[k]));
        memset(src, 0, REGION);
        assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_READ, src, segs[picks[k]].addr, REGION), 0);
        assert_true(harness_check(src, REGION, picks[k]));
    }
    double t_xfer = ms_since(t0) / 6;
    /* Crossing into the next region is refused, whichever region it is. */
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, segs[REGIONS / 2].addr + 1, REGION),
                     FERRY_ERR_OUT_OF_BOUNDS);

    /* A region registered after the table was fetched: found on the miss
     * by re-fetching all 100,001 entries. */
    unsigned char *late = malloc(REGION);
    assert_int_equal(ferry_register(target, late, REGION, FERRY_MEM_REMOTE), 0);
    harness_fill(src, REGION, 77);
    t0 = now_us();
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)late, REGION), 0);
    double t_miss = ms_since(t0);
    assert_true(harness_check(late, REGION, 77));

    /* A short-lived buffer among 100,000 regions: register, deregister. */
    enum { CYCLES = 2000 };
    unsigned char *tmp = malloc(4096);
    t0 = now_us();
    for (int i = 0; i < CYCLES; i++) {
        assert_int_equal(ferry_register(initiator, tmp, 4096, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_deregister(initiator, tmp), 0);
        assert_int_equal(ferry_register(target, tmp, 4096, FERRY_MEM_REMOTE), 0);
        assert_int_equal(ferry_deregister(target, tmp), 0);
    }
    double us_cycle = ms_since(t0) * 1000.0 / (2.0 * CYCLES);

    printf("100k regions: register_batch %.1f ms, session open %.1f ms, fetch all segments %.1f ms "
           "(%d pages), a 256-byte transfer %.3f ms, first use of a region registered later %.1f ms, "
           "register+deregister %.2f us\n",
           t_register, t_open, t_segments, (REGIONS + 4095) / 4096, t_xfer, t_miss, us_cycle);

    ferry_deregister(initiator, src);
    ferry_deregister(target, late);
    ferry_engine_destroy(initiator);
    ferry_engine_destroy(target);
    free(tmp);
    free(late);
    free(src);
    free(segs);
    free(addrs);
    free(lens);
    free(mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hundred_thousand_regions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
