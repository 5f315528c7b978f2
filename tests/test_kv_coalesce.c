/* SPDX-License-Identifier: Apache-2.0 */
/* Coalescing page copies into the fewest contiguous blocks, and the checks
 * on page indices. Pure arithmetic on made-up addresses: nothing is copied. */
#include "harness.h"

#include <ferry/kv.h>

#define SRC_BASE 0x10000000ull
#define DST_BASE 0x90000000ull
#define PAGE 4096ull
#define POOL 64u

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static long coalesce(const int32_t *src, const int32_t *dst, size_t n, ferry_kv_block_t *out,
                     size_t max, uint64_t *bytes)
{
    return ferry_kv_coalesce_pages(SRC_BASE, DST_BASE, PAGE, src, POOL, dst, POOL, n, out, max,
                                   bytes);
}

static void assert_block(const ferry_kv_block_t *b, int32_t src_page, int32_t dst_page,
                         uint64_t pages)
{
    assert_int_equal(b->src, SRC_BASE + (uint64_t)src_page * PAGE);
    assert_int_equal(b->dst, DST_BASE + (uint64_t)dst_page * PAGE);
    assert_int_equal(b->len, pages * PAGE);
}

static void empty_list_gives_no_blocks(void **state)
{
    (void)state;
    uint64_t bytes = 99;
    ferry_kv_block_t out[1];
    assert_int_equal(coalesce(NULL, NULL, 0, out, 1, &bytes), 0);
    assert_int_equal(bytes, 0);
}

static void single_page_is_one_block(void **state)
{
    (void)state;
    int32_t src[] = {7}, dst[] = {3};
    ferry_kv_block_t out[1];
    uint64_t bytes = 0;
    assert_int_equal(coalesce(src, dst, 1, out, 1, &bytes), 1);
    assert_block(&out[0], 7, 3, 1);
    assert_int_equal(bytes, PAGE);
}

static void contiguous_run_is_one_block(void **state)
{
    (void)state;
    int32_t src[] = {10, 11, 12, 13, 14, 15, 16, 17}, dst[] = {40, 41, 42, 43, 44, 45, 46, 47};
    ferry_kv_block_t out[8];
    uint64_t bytes = 0;
    assert_int_equal(coalesce(src, dst, 8, out, 8, &bytes), 1);
    assert_block(&out[0], 10, 40, 8);
    assert_int_equal(bytes, 8 * PAGE);
}

static void interleaved_pages_do_not_merge(void **state)
{
    (void)state;
    int32_t src[] = {0, 2, 4, 6}, dst[] = {1, 3, 5, 7};
    ferry_kv_block_t out[4];
    assert_int_equal(coalesce(src, dst, 4, out, 4, NULL), 4);
    for (int i = 0; i < 4; i++) assert_block(&out[i], 2 * i, 2 * i + 1, 1);
}

static void src_contiguous_dst_broken_splits_at_the_break(void **state)
{
    (void)state;
    int32_t src[] = {0, 1, 2, 3, 4}, dst[] = {20, 21, 9, 10, 11};
    ferry_kv_block_t out[5];
    uint64_t bytes = 0;
    assert_int_equal(coalesce(src, dst, 5, out, 5, &bytes), 2);
    assert_block(&out[0], 0, 20, 2);
    assert_block(&out[1], 2, 9, 3);
    assert_int_equal(bytes, 5 * PAGE);
}

static void dst_contiguous_src_broken_splits_too(void **state)
{
    (void)state;
    int32_t src[] = {30, 31, 5, 6, 50}, dst[] = {0, 1, 2, 3, 4};
    ferry_kv_block_t out[5];
    assert_int_equal(coalesce(src, dst, 5, out, 5, NULL), 3);
    assert_block(&out[0], 30, 0, 2);
    assert_block(&out[1], 5, 2, 2);
    assert_block(&out[2], 50, 4, 1);
}

static void descending_pages_never_merge(void **state)
{
    (void)state;
    int32_t src[] = {3, 2, 1}, dst[] = {3, 2, 1};
    assert_int_equal(coalesce(src, dst, 3, NULL, 0, NULL), 3);
}

static void counting_without_output(void **state)
{
    (void)state;
    int32_t src[] = {1, 2, 9}, dst[] = {1, 2, 3};
    uint64_t bytes = 0;
    assert_int_equal(coalesce(src, dst, 3, NULL, 0, &bytes), 2);
    assert_int_equal(bytes, 3 * PAGE);
}

static void too_small_output_is_refused(void **state)
{
    (void)state;
    int32_t src[] = {0, 2, 4}, dst[] = {0, 2, 4};
    ferry_kv_block_t out[2];
    assert_int_equal(coalesce(src, dst, 3, out, 2, NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("3 blocks needed, room for 2");
}

static void duplicate_page_is_named(void **state)
{
    (void)state;
    int32_t src[] = {4, 5, 4}, dst[] = {0, 1, 2};
    assert_int_equal(coalesce(src, dst, 3, NULL, 0, NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("prefill pages: page index 4 at position 2 repeats position 0");

    int32_t src2[] = {0, 1, 2}, dst2[] = {8, 9, 9};
    assert_int_equal(coalesce(src2, dst2, 3, NULL, 0, NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("decode pages: page index 9 at position 2 repeats position 1");
}

static void out_of_range_page_is_named(void **state)
{
    (void)state;
    int32_t src[] = {0, 1}, dst[] = {0, 64};
    assert_int_equal(coalesce(src, dst, 2, NULL, 0, NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("decode pages: page index 64 at position 1 is outside [0, 64)");

    int32_t neg[] = {3, -1};
    assert_int_equal(coalesce(neg, src, 2, NULL, 0, NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("prefill pages: page index -1 at position 1 is outside [0, 64)");
}

static void bad_arguments(void **state)
{
    (void)state;
    int32_t one[] = {0};
    assert_int_equal(ferry_kv_coalesce_pages(SRC_BASE, DST_BASE, 0, one, POOL, one, POOL, 1, NULL,
                                             0, NULL),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("page_bytes is 0");
    assert_int_equal(coalesce(NULL, one, 1, NULL, 0, NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("NULL list of 1");
    assert_int_equal(ferry_kv_coalesce_pages(UINT64_MAX - PAGE, DST_BASE, PAGE, one, POOL, one,
                                             POOL, 1, NULL, 0, NULL),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("wrap the address space");
}

static void check_pages_accepts_a_permutation(void **state)
{
    (void)state;
    int32_t pages[] = {5, 0, 3, 1, 4, 2};
    assert_int_equal(ferry_kv_check_pages("decode", pages, COUNT(pages), 6), 0);
    assert_int_equal(ferry_kv_check_pages("decode", pages, COUNT(pages), 5),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("page index 5 at position 0 is outside [0, 5)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(empty_list_gives_no_blocks),
        cmocka_unit_test(single_page_is_one_block),
        cmocka_unit_test(contiguous_run_is_one_block),
        cmocka_unit_test(interleaved_pages_do_not_merge),
        cmocka_unit_test(src_contiguous_dst_broken_splits_at_the_break),
        cmocka_unit_test(dst_contiguous_src_broken_splits_too),
        cmocka_unit_test(descending_pages_never_merge),
        cmocka_unit_test(counting_without_output),
        cmocka_unit_test(too_small_output_is_refused),
        cmocka_unit_test(duplicate_page_is_named),
        cmocka_unit_test(out_of_range_page_is_named),
        cmocka_unit_test(bad_arguments),
        cmocka_unit_test(check_pages_accepts_a_permutation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
