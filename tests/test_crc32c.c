/* SPDX-License-Identifier: Apache-2.0 */
/* CRC32C: every implementation (bytewise, slicing-by-8, the CPU's
 * instruction, ISA-L) against the standard check values and against each
 * other on random lengths, alignments and chained pieces.
 *   test_crc32c           the tests (cmocka)
 *   test_crc32c --bench   GB/s of each implementation, one table (docs/BENCHMARKS.md) */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/crc32c.h"

static void check_values_every_impl(void **state)
{
    (void)state;
    unsigned char zeros[32], ones[32], ascending[32];
    memset(zeros, 0, sizeof zeros);
    memset(ones, 0xff, sizeof ones);
    for (int i = 0; i < 32; i++) ascending[i] = (unsigned char)i;
    int tried = 0;
    for (int impl = 0; impl < FERRY_CRC32C_IMPLS; impl++) {
        if (!ferry_crc32c_impl_available(impl)) continue;
        tried++;
        /* The CRC-32C check value, and RFC 3720 (iSCSI) B.4's vectors. */
        assert_int_equal(ferry_crc32c_with(impl, 0, "123456789", 9), 0xE3069283u);
        assert_int_equal(ferry_crc32c_with(impl, 0, zeros, 32), 0x8A9136AAu);
        assert_int_equal(ferry_crc32c_with(impl, 0, ones, 32), 0x62A8AB43u);
        assert_int_equal(ferry_crc32c_with(impl, 0, ascending, 32), 0x46DD794Eu);
        assert_int_equal(ferry_crc32c_with(impl, 0, "", 0), 0u);
        assert_int_equal(ferry_crc32c_with(impl, 0x1234u, "", 0), 0x1234u);
    }
    assert_true(tried >= 2);
    assert_true(ferry_crc32c_impl_available(ferry_crc32c_impl_chosen()));
    assert_int_equal(ferry_crc32c(0, "123456789", 9), 0xE3069283u);
#ifdef __x86_64__
    /* Every x86-64 CPU Ferry runs on has SSE4.2; the hw path must be tested. */
    assert_true(ferry_crc32c_impl_available(FERRY_CRC32C_HW));
#endif
}

static void impls_agree_on_random_buffers(void **state)
{
    (void)state;
    enum { MAX = 5000 };
    unsigned char *buf = malloc(MAX + 16);
    assert_non_null(buf);
    srand(2026);
    for (int i = 0; i < MAX + 16; i++) buf[i] = (unsigned char)rand();
    for (int round = 0; round < 2000; round++) {
        size_t off = (size_t)rand() % 16;
        size_t len = round < 64 ? (size_t)round : (size_t)rand() % MAX;
        uint32_t seed = round % 3 ? (uint32_t)rand() : 0;
        uint32_t want = ferry_crc32c_with(FERRY_CRC32C_BYTEWISE, seed, buf + off, len);
        for (int impl = 0; impl < FERRY_CRC32C_IMPLS; impl++) {
            if (!ferry_crc32c_impl_available(impl)) continue;
            uint32_t got = ferry_crc32c_with(impl, seed, buf + off, len);
            if (got != want)
                fail_msg("%s: len %zu off %zu seed %08x: %08x, bytewise %08x", ferry_crc32c_impl_name(impl), len,
                         off, seed, got, want);
            /* Chaining: the CRC of a+b continues from the CRC of a. */
            size_t cut = len ? (size_t)rand() % len : 0;
            uint32_t chained = ferry_crc32c_with(impl, ferry_crc32c_with(impl, seed, buf + off, cut), buf + off + cut,
                                                 len - cut);
            if (chained != want)
                fail_msg("%s chained at %zu of %zu: %08x, want %08x", ferry_crc32c_impl_name(impl), cut, len, chained,
                         want);
        }
    }
    free(buf);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* GB/s (10^9 bytes a second) of each implementation over a 1 MiB buffer
 * (Ferry's default slice size, cache-resident) and a 64 MiB one. */
static int bench(void)
{
    const size_t sizes[] = {(size_t)1 << 20, (size_t)64 << 20};
    unsigned char *buf = malloc(sizes[1]);
    if (!buf) return 1;
    for (size_t i = 0; i < sizes[1]; i++) buf[i] = (unsigned char)(i * 2654435761u >> 13);
    printf("| implementation | 1 MiB GB/s | 64 MiB GB/s | used by ferry_crc32c |\n|---|---|---|---|\n");
    for (int impl = 0; impl < FERRY_CRC32C_IMPLS; impl++) {
        if (!ferry_crc32c_impl_available(impl)) continue;
        printf("| %s |", ferry_crc32c_impl_name(impl));
        for (int s = 0; s < 2; s++) {
            volatile uint32_t sink = 0;
            double t0 = now_s(), t;
            size_t bytes = 0;
            do { /* at least 0.3 s per cell */
                sink ^= ferry_crc32c_with(impl, sink, buf, sizes[s]);
                bytes += sizes[s];
                t = now_s() - t0;
            } while (t < 0.3);
            printf(" %.2f |", (double)bytes / t / 1e9);
        }
        printf(" %s |\n", impl == ferry_crc32c_impl_chosen() ? "yes" : "");
        fflush(stdout);
    }
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) return bench();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(check_values_every_impl),
        cmocka_unit_test(impls_agree_on_random_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
