/* SPDX-License-Identifier: Apache-2.0 */
/* KV cache descriptors, the TP head split, and what plans say about each
 * (prefill rank -> decode rank) pair: mode, staging sizes, bind checks. */
#include "harness.h"

#include <string.h>

#include <ferry/kv.h>

#define LAYERS 2
#define HEADS 8

static const uint64_t fake_k[LAYERS] = {0x100000, 0x200000};
static const uint64_t fake_v[LAYERS] = {0x300000, 0x400000};

static ferry_kv_cache_desc_t split_desc(uint32_t tp_rank, uint32_t tp_size)
{
    ferry_kv_cache_desc_t d = {
        .kind = FERRY_KV_SPLIT,
        .num_layers = LAYERS,
        .num_pages = 32,
        .page_size = 16,
        .kv_heads = HEADS / tp_size,
        .total_kv_heads = HEADS,
        .head_dim = 128,
        .dtype_size = 2,
        .tp_rank = tp_rank,
        .tp_size = tp_size,
        .k_addrs = fake_k,
        .v_addrs = fake_v,
    };
    return d;
}

static void valid_descriptors_and_row_sizes(void **state)
{
    (void)state;
    ferry_kv_cache_desc_t d = split_desc(1, 4);
    assert_int_equal(ferry_kv_cache_validate(&d), 0);
    assert_int_equal(ferry_kv_buffers_per_layer(&d), 2);
    assert_int_equal(ferry_kv_token_bytes(&d), 2 * 128 * 2);
    assert_int_equal(ferry_kv_page_bytes(&d), 16 * 2 * 128 * 2);

    d.kind = FERRY_KV_FUSED;
    d.v_addrs = NULL;
    assert_int_equal(ferry_kv_cache_validate(&d), 0);
    assert_int_equal(ferry_kv_buffers_per_layer(&d), 1);
    assert_int_equal(ferry_kv_token_bytes(&d), 2 * 2 * 128 * 2);

    ferry_kv_cache_desc_t mla = {.kind = FERRY_KV_MLA, .num_layers = LAYERS, .num_pages = 8,
                                 .page_size = 64, .mla_row_bytes = 576 * 2, .tp_rank = 3,
                                 .tp_size = 8, .k_addrs = fake_k};
    assert_int_equal(ferry_kv_cache_validate(&mla), 0);
    assert_int_equal(ferry_kv_token_bytes(&mla), 1152);
    assert_int_equal(ferry_kv_page_bytes(&mla), 64 * 1152);

    /* total_kv_heads 0 means kv_heads * tp_size. */
    d = split_desc(0, 2);
    d.total_kv_heads = 0;
    assert_int_equal(ferry_kv_cache_validate(&d), 0);
    /* No addresses at all is fine for a geometry-only descriptor. */
    d.k_addrs = d.v_addrs = NULL;
    assert_int_equal(ferry_kv_cache_validate(&d), 0);
}

static void invalid_descriptors_name_the_field(void **state)
{
    (void)state;
    assert_int_equal(ferry_kv_cache_validate(NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("descriptor is NULL");

    ferry_kv_cache_desc_t d = split_desc(4, 4);
    assert_int_equal(ferry_kv_cache_validate(&d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("tp_rank 4 must be below tp_size 4");

    d = split_desc(0, 4);
    d.kv_heads = 4;
    assert_int_equal(ferry_kv_cache_validate(&d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("kv_heads 4, but rank 0 of tp 4 holds 2 of the model's 8 heads");

    d = split_desc(0, 4);
    d.total_kv_heads = 6;
    d.kv_heads = 1;
    assert_int_equal(ferry_kv_cache_validate(&d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("total_kv_heads 6 is not a multiple of tp_size 4");

    d = split_desc(0, 1);
    d.page_size = 0;
    assert_int_equal(ferry_kv_cache_validate(&d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("page_size 0 must be positive");

    d = split_desc(0, 1);
    d.kind = 7;
    assert_int_equal(ferry_kv_cache_validate(&d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("kind 7");

    d = split_desc(0, 1);
    d.kind = FERRY_KV_FUSED;
    assert_int_equal(ferry_kv_cache_validate(&d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("v_addrs must be NULL for a FUSED cache");

    d = split_desc(0, 1);
    d.v_addrs = NULL;
    assert_int_equal(ferry_kv_cache_validate(&d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("SPLIT needs both k_addrs and v_addrs");

    uint64_t with_null[LAYERS] = {0x1000, 0};
    d = split_desc(0, 1);
    d.v_addrs = with_null;
    assert_int_equal(ferry_kv_cache_validate(&d), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("layer 1 V buffer at 0x0");

    ferry_kv_cache_desc_t mla = {.kind = FERRY_KV_MLA, .num_layers = 1, .num_pages = 1,
                                 .page_size = 1, .tp_size = 1};
    assert_int_equal(ferry_kv_cache_validate(&mla), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("MLA needs mla_row_bytes");
}

static void rank_heads_split_and_replicate(void **state)
{
    (void)state;
    uint32_t first = 0, count = 0;
    assert_int_equal(ferry_kv_rank_heads(8, 4, 2, &first, &count), 0);
    assert_int_equal(first, 4);
    assert_int_equal(count, 2);
    assert_int_equal(ferry_kv_rank_heads(8, 1, 0, &first, &count), 0);
    assert_int_equal(first, 0);
    assert_int_equal(count, 8);
    /* 2 heads over 4 ranks: ranks 0,1 hold head 0; ranks 2,3 hold head 1. */
    assert_int_equal(ferry_kv_rank_heads(2, 4, 1, &first, &count), 0);
    assert_int_equal(first, 0);
    assert_int_equal(count, 1);
    assert_int_equal(ferry_kv_rank_heads(2, 4, 3, &first, &count), 0);
    assert_int_equal(first, 1);
    assert_int_equal(ferry_kv_rank_heads(3, 2, 0, &first, &count), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("total_kv_heads 3 is not a multiple of tp_size 2");
    assert_int_equal(ferry_kv_rank_heads(2, 3, 0, &first, &count), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("tp_size 3 is not a multiple of total_kv_heads 2");
}

static void assert_slice(const ferry_kv_head_slice_t *s, uint32_t prefill, uint32_t decode,
                         uint32_t src_head, uint32_t dst_head, uint32_t heads)
{
    assert_int_equal(s->prefill_rank, prefill);
    assert_int_equal(s->decode_rank, decode);
    assert_int_equal(s->src_head, src_head);
    assert_int_equal(s->dst_head, dst_head);
    assert_int_equal(s->heads, heads);
}

static void tp_sources_for_each_ratio(void **state)
{
    (void)state;
    ferry_kv_head_slice_t s[8];
    /* 1:1 - the same rank, every head. */
    assert_int_equal(ferry_kv_tp_sources(8, 2, 2, 1, s, 8), 1);
    assert_slice(&s[0], 1, 1, 0, 0, 4);
    /* 4:2 - decode rank 1 holds heads 4..7 = prefill ranks 2 and 3. */
    assert_int_equal(ferry_kv_tp_sources(8, 4, 2, 1, s, 8), 2);
    assert_slice(&s[0], 2, 1, 0, 0, 2);
    assert_slice(&s[1], 3, 1, 0, 2, 2);
    /* 2:4 - decode rank 3 holds heads 6,7 = the second half of prefill rank 1. */
    assert_int_equal(ferry_kv_tp_sources(8, 2, 4, 3, s, 8), 1);
    assert_slice(&s[0], 1, 3, 2, 0, 2);
    /* 8:1 - one head from each prefill rank. */
    assert_int_equal(ferry_kv_tp_sources(8, 8, 1, 0, s, 8), 8);
    for (uint32_t r = 0; r < 8; r++) assert_slice(&s[r], r, 0, 0, r, 1);
    /* 1:8 - decode rank 5 takes head 5 of the only prefill rank. */
    assert_int_equal(ferry_kv_tp_sources(8, 1, 8, 5, s, 8), 1);
    assert_slice(&s[0], 0, 5, 5, 0, 1);
    /* Counting only. */
    assert_int_equal(ferry_kv_tp_sources(8, 8, 1, 0, NULL, 0), 8);
}

static void tp_sources_with_replicated_heads(void **state)
{
    (void)state;
    ferry_kv_head_slice_t s[2];
    /* MLA (one "head") prefill tp 4, decode tp 8: decode rank 5 reads replica 5 % 4. */
    assert_int_equal(ferry_kv_tp_sources(1, 4, 8, 5, s, 2), 1);
    assert_slice(&s[0], 1, 5, 0, 0, 1);
    /* 2 heads, prefill tp 4 (each head on 2 ranks), decode tp 1. */
    assert_int_equal(ferry_kv_tp_sources(2, 4, 1, 0, s, 2), 2);
    assert_slice(&s[0], 0, 0, 0, 0, 1);
    assert_slice(&s[1], 2, 0, 0, 1, 1);
    assert_int_equal(ferry_kv_tp_sources(8, 3, 1, 0, s, 2), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("kv prefill tp");
    assert_int_equal(ferry_kv_tp_sources(8, 2, 2, 2, s, 2), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("tp_rank 2 not below tp_size 2");
}

static void tp_targets_are_the_sources_seen_from_prefill(void **state)
{
    (void)state;
    ferry_kv_head_slice_t s[8];
    /* 4:2 - prefill rank 3 gives its heads to decode rank 1, as heads 2,3. */
    assert_int_equal(ferry_kv_tp_targets(8, 4, 2, 3, s, 8), 1);
    assert_slice(&s[0], 3, 1, 0, 2, 2);
    /* 2:4 - prefill rank 1 feeds decode ranks 2 and 3, half each. */
    assert_int_equal(ferry_kv_tp_targets(8, 2, 4, 1, s, 8), 2);
    assert_slice(&s[0], 1, 2, 0, 0, 2);
    assert_slice(&s[1], 1, 3, 2, 0, 2);
    /* 1:8 - the only prefill rank feeds all eight. */
    assert_int_equal(ferry_kv_tp_targets(8, 1, 8, 0, s, 8), 8);
    /* MLA 4:8 - prefill rank 1 serves decode ranks 1 and 5. */
    assert_int_equal(ferry_kv_tp_targets(1, 4, 8, 1, s, 8), 2);
    assert_int_equal(s[0].decode_rank, 1);
    assert_int_equal(s[1].decode_rank, 5);
}

static ferry_kv_plan_t *make_plan(const ferry_kv_cache_desc_t *src, const ferry_kv_cache_desc_t *dst,
                                  size_t n, ferry_kv_plan_info_t *info)
{
    int32_t src_pages[] = {3, 4, 5, 9};
    int32_t dst_pages[] = {0, 1, 2, 3};
    ferry_kv_plan_t *p = NULL;
    assert_int_equal(ferry_kv_plan_create(src, dst, src_pages, dst_pages, n, &p), 0);
    ferry_kv_plan_get_info(p, info);
    return p;
}

/* Bytes of h heads of one token of one buffer of one layer in split_desc. */
#define HEAD_ROW(h) ((uint64_t)(h) * 128 * 2)
#define TOKENS(pages) ((uint64_t)(pages) * 16)

static void plan_modes_and_staging_sizes(void **state)
{
    (void)state;
    ferry_kv_plan_info_t in;
    ferry_kv_cache_desc_t p1 = split_desc(1, 2), d1 = split_desc(1, 2);
    ferry_kv_plan_t *p = make_plan(&p1, &d1, 4, &in);
    assert_int_equal(in.mode, FERRY_KV_MODE_DIRECT);
    assert_false(in.gather);
    assert_false(in.scatter);
    assert_int_equal(in.bytes, LAYERS * 2 * TOKENS(4) * HEAD_ROW(4));
    assert_int_equal(in.src_staging_bytes, 0);
    assert_int_equal(in.dst_staging_bytes, 0);
    ferry_kv_plan_destroy(p);

    /* 4:2, prefill rank 3 -> decode rank 1: the decode rows are half filled,
     * so it scatters; its staging holds prefill 2's region, then ours. */
    ferry_kv_cache_desc_t p3 = split_desc(3, 4);
    p = make_plan(&p3, &d1, 4, &in);
    assert_int_equal(in.mode, FERRY_KV_MODE_STAGED);
    assert_false(in.gather);
    assert_true(in.scatter);
    uint64_t region = LAYERS * 2 * TOKENS(4) * HEAD_ROW(2);
    assert_int_equal(in.bytes, region);
    assert_int_equal(in.per_layer_bytes, 2 * TOKENS(4) * HEAD_ROW(2));
    assert_int_equal(in.dst_staging_offset, region);
    assert_int_equal(in.dst_staging_bytes, 2 * region);
    assert_int_equal(in.src_staging_bytes, 0);
    ferry_kv_plan_destroy(p);

    /* 2:4, prefill rank 1 -> decode rank 3: the sender cuts its rows. */
    ferry_kv_cache_desc_t d3 = split_desc(3, 4);
    p = make_plan(&p1, &d3, 4, &in);
    assert_int_equal(in.mode, FERRY_KV_MODE_STAGED);
    assert_true(in.gather);
    assert_false(in.scatter);
    assert_int_equal(in.slice.src_head, 2);
    assert_int_equal(in.src_staging_bytes, in.bytes);
    assert_int_equal(in.dst_staging_bytes, 0);
    ferry_kv_plan_destroy(p);

    /* 2:4, prefill rank 0 -> decode rank 3: no shared heads. */
    ferry_kv_cache_desc_t p0 = split_desc(0, 2);
    p = make_plan(&p0, &d3, 4, &in);
    assert_int_equal(in.mode, FERRY_KV_MODE_NONE);
    assert_int_equal(in.bytes, 0);
    assert_int_equal(ferry_kv_plan_bind_sender(p, 0, 0, 0, 0), 0);
    size_t count = 99;
    assert_non_null(ferry_kv_plan_blocks(p, &count));
    assert_int_equal(count, 0);
    ferry_kv_plan_destroy(p);
}

static void plan_refuses_mismatched_models_and_bad_pages(void **state)
{
    (void)state;
    ferry_kv_cache_desc_t src = split_desc(0, 1), dst = split_desc(0, 1);
    int32_t pages[] = {0, 1};
    int32_t bad[] = {0, 32};
    ferry_kv_plan_t *p = (ferry_kv_plan_t *)&p;
    dst.page_size = 32;
    assert_int_equal(ferry_kv_plan_create(&src, &dst, pages, pages, 2, &p),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_null(p);
    assert_detail_contains("differ in page_size: 16 vs 32");
    dst = split_desc(0, 1);
    dst.dtype_size = 1;
    assert_int_equal(ferry_kv_plan_create(&src, &dst, pages, pages, 2, &p),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("differ in head_dim * dtype_size: 256 vs 128");
    dst = split_desc(0, 1);
    assert_int_equal(ferry_kv_plan_create(&src, &dst, pages, bad, 2, &p),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("kv plan: ");
    assert_detail_contains("kv decode pages: page index 32 at position 1");
    dst.tp_rank = 1;
    assert_int_equal(ferry_kv_plan_create(&src, &dst, pages, pages, 2, &p),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("kv plan: decode side: ");
    assert_detail_contains("tp_rank 1 must be below tp_size 1");
}

static void bind_checks_addresses_and_staging(void **state)
{
    (void)state;
    ferry_kv_plan_info_t in;
    ferry_kv_cache_desc_t p3 = split_desc(3, 4), d1 = split_desc(1, 2);
    ferry_kv_plan_t *p = make_plan(&p3, &d1, 4, &in);
    assert_int_equal(ferry_kv_plan_bind_sender(p, 0, 0, 0, 0), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("decode (scatter) staging buffer missing");
    assert_int_equal(ferry_kv_plan_bind_sender(p, 0, 0, 0x800000, in.dst_staging_bytes - 1),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("too short");
    assert_null(ferry_kv_plan_blocks(p, NULL));
    assert_int_equal(ferry_kv_scatter(p), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("bind_receiver first");
    assert_int_equal(ferry_kv_plan_bind_sender(p, 0, 0, 0x800000, in.dst_staging_bytes), 0);
    size_t count = 0;
    const ferry_kv_block_t *b = ferry_kv_plan_blocks(p, &count);
    /* Source pages 3,4,5 | 9: two runs in each of 2 layers x 2 buffers. */
    assert_int_equal(count, 2 * LAYERS * 2);
    assert_int_equal(b[0].src, fake_k[0] + 3 * ferry_kv_page_bytes(&p3));
    assert_int_equal(b[0].dst, 0x800000 + in.dst_staging_offset);
    assert_int_equal(b[0].len, 3 * ferry_kv_page_bytes(&p3));
    ferry_kv_plan_get_info(p, &in);
    assert_int_equal(in.blocks, count);
    ferry_kv_plan_destroy(p);

    /* A receiver-side plan knows the sender only by its TP geometry. */
    p3.k_addrs = p3.v_addrs = NULL;
    p = make_plan(&p3, &d1, 4, &in);
    assert_int_equal(ferry_kv_plan_bind_sender(p, 0, 0, 0x800000, in.dst_staging_bytes),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("the prefill descriptor carries no buffer addresses");
    assert_int_equal(ferry_kv_plan_bind_receiver(p, 0x800000, in.dst_staging_bytes), 0);
    ferry_kv_plan_destroy(p);

    /* The gather side needs its own staging. */
    ferry_kv_cache_desc_t p1 = split_desc(1, 2), d3 = split_desc(3, 4);
    p = make_plan(&p1, &d3, 4, &in);
    assert_int_equal(ferry_kv_plan_bind_sender(p, 0, 0, 0, 0), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("prefill (gather) staging buffer missing");
    assert_int_equal(ferry_kv_gather(p), FERRY_ERR_INVALID_ARGUMENT);
    ferry_kv_plan_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_descriptors_and_row_sizes),
        cmocka_unit_test(invalid_descriptors_name_the_field),
        cmocka_unit_test(rank_heads_split_and_replicate),
        cmocka_unit_test(tp_sources_for_each_ratio),
        cmocka_unit_test(tp_sources_with_replicated_heads),
        cmocka_unit_test(tp_targets_are_the_sources_seen_from_prefill),
        cmocka_unit_test(plan_modes_and_staging_sizes),
        cmocka_unit_test(plan_refuses_mismatched_models_and_bad_pages),
        cmocka_unit_test(bind_checks_addresses_and_staging),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
