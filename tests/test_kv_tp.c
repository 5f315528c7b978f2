/* SPDX-License-Identifier: Apache-2.0 */
/* Byte-for-byte check of the TP mapping: a model-wide KV cache with known
 * values is split the way prefill ranks hold it; every decode rank runs
 * plan + gather + block copies (memcpy standing in for the network) +
 * scatter, and must end up with exactly its share of the reference, in its
 * own pages, with every other byte of its pools untouched. */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#include <ferry/kv.h>

#define LAYERS 3
#define PAGE_SIZE 4
#define HEAD_DIM 4
#define DTYPE 2
#define PREFILL_POOL 12
#define DECODE_POOL 13
#define UNTOUCHED 0xEE

/* Pages of one request. Both-consecutive runs: [5,6]->[3,4], [7]->[9],
 * [1,2]->[10,11], [11]->[0]: 4. Source runs alone: 3. Destination runs: 3. */
static const int32_t prefill_pages[] = {5, 6, 7, 1, 2, 11};
static const int32_t decode_pages[] = {3, 4, 9, 10, 11, 0};
#define NPAGES (sizeof prefill_pages / sizeof prefill_pages[0])
#define RUNS_BOTH 4
#define RUNS_SRC 3
#define RUNS_DST 3

struct tp_case {
    int kind;
    uint32_t heads; /* model KV heads (ignored for MLA) */
    uint32_t prefill_tp;
    uint32_t decode_tp;
};

/* One rank's cache: descriptor, address arrays, and the memory. */
struct rank_cache {
    ferry_kv_cache_desc_t desc;
    uint64_t k_addrs[LAYERS];
    uint64_t v_addrs[LAYERS];
    unsigned char *mem[LAYERS][2];
    uint64_t buffer_bytes;
};

static uint32_t model_heads(const struct tp_case *c)
{
    return c->kind == FERRY_KV_MLA ? 1 : c->heads;
}

static uint64_t head_bytes(const struct tp_case *c)
{
    return c->kind == FERRY_KV_MLA ? 40 : HEAD_DIM * DTYPE;
}

/* The reference: the value of byte j of model head h, part (K/V of a fused
 * row), of sequence token tok, in buffer b of layer l. */
static unsigned char reference_byte(uint32_t l, uint32_t b, uint64_t tok, uint32_t h,
                                    uint32_t part, uint64_t j)
{
    uint64_t x = ((((l * 2 + b) * 1000003ull + tok) * 131 + h) * 3 + part) * 4099 + j + 1;
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return (unsigned char)x;
}

static void rank_init(struct rank_cache *r, const struct tp_case *c, uint32_t tp_rank,
                      uint32_t tp_size, uint32_t pool)
{
    memset(r, 0, sizeof *r);
    ferry_kv_cache_desc_t *d = &r->desc;
    d->kind = c->kind;
    d->num_layers = LAYERS;
    d->num_pages = pool;
    d->page_size = PAGE_SIZE;
    d->tp_rank = tp_rank;
    d->tp_size = tp_size;
    if (c->kind == FERRY_KV_MLA) {
        d->mla_row_bytes = (uint32_t)head_bytes(c);
    } else {
        uint32_t first, count;
        assert_int_equal(ferry_kv_rank_heads(c->heads, tp_size, tp_rank, &first, &count), 0);
        d->kv_heads = count;
        d->total_kv_heads = c->heads;
        d->head_dim = HEAD_DIM;
        d->dtype_size = DTYPE;
    }
    r->buffer_bytes = ferry_kv_page_bytes(d) * pool;
    for (uint32_t l = 0; l < LAYERS; l++) {
        for (uint32_t b = 0; b < ferry_kv_buffers_per_layer(d); b++) {
            r->mem[l][b] = malloc(r->buffer_bytes);
            assert_non_null(r->mem[l][b]);
            memset(r->mem[l][b], UNTOUCHED, r->buffer_bytes);
            (b ? r->v_addrs : r->k_addrs)[l] = (uint64_t)(uintptr_t)r->mem[l][b];
        }
    }
    d->k_addrs = r->k_addrs;
    d->v_addrs = c->kind == FERRY_KV_SPLIT ? r->v_addrs : NULL;
    assert_int_equal(ferry_kv_cache_validate(d), 0);
}

static void rank_free(struct rank_cache *r)
{
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < 2; b++) free(r->mem[l][b]);
}

/* Writes the reference values of this rank's heads for the request's tokens
 * into buffer images laid out like the rank's cache. */
static void write_reference(const struct tp_case *c, const ferry_kv_cache_desc_t *d,
                            unsigned char *image[LAYERS][2], const int32_t *pages)
{
    uint32_t first, count;
    assert_int_equal(ferry_kv_rank_heads(model_heads(c), d->tp_size, d->tp_rank, &first, &count), 0);
    uint32_t parts = c->kind == FERRY_KV_FUSED ? 2 : 1;
    uint64_t hb = head_bytes(c), row = ferry_kv_token_bytes(d);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < ferry_kv_buffers_per_layer(d); b++)
            for (size_t i = 0; i < NPAGES; i++)
                for (uint32_t t = 0; t < PAGE_SIZE; t++) {
                    uint64_t tok = i * PAGE_SIZE + t;
                    unsigned char *r = image[l][b] + ((uint64_t)pages[i] * PAGE_SIZE + t) * row;
                    for (uint32_t part = 0; part < parts; part++)
                        for (uint32_t h = 0; h < count; h++)
                            for (uint64_t j = 0; j < hb; j++)
                                r[(part * count + h) * hb + j] =
                                    reference_byte(l, b, tok, first + h, part, j);
                }
}

static size_t expected_blocks(const struct tp_case *c, const ferry_kv_plan_info_t *in)
{
    size_t per_layer = c->kind == FERRY_KV_SPLIT ? 2 : 1;
    if (in->gather && in->scatter) return 1; /* staging to staging: one bulk block */
    if (in->gather) return RUNS_DST * LAYERS * per_layer;
    if (in->scatter) return RUNS_SRC * LAYERS * per_layer;
    return RUNS_BOTH * LAYERS * per_layer;
}

/* Stands in for the network: copies every block of a bound plan. */
static uint64_t copy_blocks(const ferry_kv_plan_t *p)
{
    size_t count = 0;
    const ferry_kv_block_t *blocks = ferry_kv_plan_blocks(p, &count);
    assert_non_null(blocks);
    uint64_t bytes = 0;
    for (size_t i = 0; i < count; i++) {
        memcpy((void *)(uintptr_t)blocks[i].dst, (const void *)(uintptr_t)blocks[i].src,
               blocks[i].len);
        bytes += blocks[i].len;
    }
    return bytes;
}

/* Moves decode rank d's share from its prefill sources, as a real exchange
 * would: plan per source, gather, copy, then scatter once all landed. */
static void receive_one_decode_rank(const struct tp_case *c, struct rank_cache *prefill,
                                    struct rank_cache *decode)
{
    ferry_kv_head_slice_t slices[16];
    long k = ferry_kv_tp_sources(model_heads(c), c->prefill_tp, c->decode_tp,
                                 decode->desc.tp_rank, slices, 16);
    assert_true(k >= 1 && k <= 16);
    ferry_kv_plan_t *plans[16];
    void *src_staging[16];
    unsigned char *dst_staging = NULL;
    uint64_t dst_staging_bytes = 0, moved = 0;
    for (long i = 0; i < k; i++) {
        assert_int_equal(ferry_kv_plan_create(&prefill[slices[i].prefill_rank].desc, &decode->desc,
                                              prefill_pages, decode_pages, NPAGES, &plans[i]),
                         0);
        ferry_kv_plan_info_t in;
        ferry_kv_plan_get_info(plans[i], &in);
        assert_int_not_equal(in.mode, FERRY_KV_MODE_NONE);
        assert_int_equal(in.slice.heads, slices[i].heads);
        /* Every source agrees on the size of the decode rank's staging. */
        if (i == 0) {
            dst_staging_bytes = in.dst_staging_bytes;
            dst_staging = malloc(dst_staging_bytes ? dst_staging_bytes : 1);
            assert_non_null(dst_staging);
        }
        assert_int_equal(in.dst_staging_bytes, dst_staging_bytes);
        src_staging[i] = malloc(in.src_staging_bytes ? in.src_staging_bytes : 1);
        assert_non_null(src_staging[i]);
        uint64_t dst_addr = (uint64_t)(uintptr_t)dst_staging;
        assert_int_equal(ferry_kv_plan_bind_sender(plans[i], (uint64_t)(uintptr_t)src_staging[i],
                                                   in.src_staging_bytes, dst_addr,
                                                   dst_staging_bytes),
                         0);
        assert_int_equal(ferry_kv_plan_bind_receiver(plans[i], dst_addr, dst_staging_bytes), 0);
        ferry_kv_plan_get_info(plans[i], &in);
        assert_int_equal(in.blocks, expected_blocks(c, &in));
        assert_int_equal(ferry_kv_gather(plans[i]), 0);
        uint64_t bytes = copy_blocks(plans[i]);
        assert_int_equal(bytes, in.bytes);
        moved += bytes;
    }
    for (long i = 0; i < k; i++) assert_int_equal(ferry_kv_scatter(plans[i]), 0);

    /* The decode rank received exactly its rows of the request's tokens. */
    uint32_t buffers = ferry_kv_buffers_per_layer(&decode->desc);
    assert_int_equal(moved, (uint64_t)LAYERS * buffers * NPAGES * PAGE_SIZE *
                                ferry_kv_token_bytes(&decode->desc));
    for (long i = 0; i < k; i++) {
        ferry_kv_plan_destroy(plans[i]);
        free(src_staging[i]);
    }
    free(dst_staging);
}

/* -1 when the decode rank's pools hold exactly the reference in its pages
 * and UNTOUCHED elsewhere; else the first differing byte's offset, in the
 * order layer, buffer, byte. */
static long long first_mismatch(const struct tp_case *c, const struct rank_cache *decode)
{
    unsigned char *image[LAYERS][2] = {{0}};
    uint32_t buffers = ferry_kv_buffers_per_layer(&decode->desc);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < buffers; b++) {
            image[l][b] = malloc(decode->buffer_bytes);
            assert_non_null(image[l][b]);
            memset(image[l][b], UNTOUCHED, decode->buffer_bytes);
        }
    write_reference(c, &decode->desc, image, decode_pages);
    long long at = -1;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < buffers; b++) {
            for (uint64_t i = 0; at < 0 && i < decode->buffer_bytes; i++)
                if (image[l][b][i] != decode->mem[l][b][i])
                    at = (long long)(((uint64_t)l * 2 + b) * decode->buffer_bytes + i);
            free(image[l][b]);
        }
    return at;
}

static void tp_transfer_matches_reference(void **state)
{
    const struct tp_case *c = *state;
    struct rank_cache *prefill = calloc(c->prefill_tp, sizeof *prefill);
    struct rank_cache *decode = calloc(c->decode_tp, sizeof *decode);
    assert_non_null(prefill);
    assert_non_null(decode);
    for (uint32_t r = 0; r < c->prefill_tp; r++) {
        rank_init(&prefill[r], c, r, c->prefill_tp, PREFILL_POOL);
        write_reference(c, &prefill[r].desc, prefill[r].mem, prefill_pages);
    }
    for (uint32_t r = 0; r < c->decode_tp; r++) {
        rank_init(&decode[r], c, r, c->decode_tp, DECODE_POOL);
        receive_one_decode_rank(c, prefill, &decode[r]);
        long long at = first_mismatch(c, &decode[r]);
        if (at >= 0) fail_msg("decode rank %u differs from the reference at byte %lld", r, at);
    }
    for (uint32_t r = 0; r < c->prefill_tp; r++) rank_free(&prefill[r]);
    for (uint32_t r = 0; r < c->decode_tp; r++) rank_free(&decode[r]);
    free(prefill);
    free(decode);
}

/* The comparison itself must notice one wrong bit in a landed page, and a
 * page that was never scattered. */
static void reference_check_notices_wrong_bytes(void **state)
{
    (void)state;
    struct tp_case c = {FERRY_KV_SPLIT, 8, 4, 2};
    struct rank_cache prefill[4], decode;
    for (uint32_t r = 0; r < 4; r++) {
        rank_init(&prefill[r], &c, r, 4, PREFILL_POOL);
        write_reference(&c, &prefill[r].desc, prefill[r].mem, prefill_pages);
    }
    rank_init(&decode, &c, 1, 2, DECODE_POOL);
    receive_one_decode_rank(&c, prefill, &decode);
    assert_int_equal(first_mismatch(&c, &decode), -1);

    uint64_t offset = (uint64_t)decode_pages[2] * ferry_kv_page_bytes(&decode.desc) + 5;
    decode.mem[1][1][offset] ^= 1;
    assert_int_equal(first_mismatch(&c, &decode), (long long)((1 * 2 + 1) * decode.buffer_bytes + offset));
    decode.mem[1][1][offset] ^= 1;

    memset(decode.mem[0][0], UNTOUCHED, decode.buffer_bytes);
    assert_true(first_mismatch(&c, &decode) >= 0);
    for (uint32_t r = 0; r < 4; r++) rank_free(&prefill[r]);
    rank_free(&decode);
}

static void empty_request_moves_nothing(void **state)
{
    (void)state;
    struct tp_case c = {FERRY_KV_SPLIT, 8, 2, 4};
    struct rank_cache p, d;
    rank_init(&p, &c, 1, 2, PREFILL_POOL);
    rank_init(&d, &c, 3, 4, DECODE_POOL);
    ferry_kv_plan_t *plan = NULL;
    assert_int_equal(ferry_kv_plan_create(&p.desc, &d.desc, NULL, NULL, 0, &plan), 0);
    ferry_kv_plan_info_t in;
    ferry_kv_plan_get_info(plan, &in);
    assert_int_equal(in.mode, FERRY_KV_MODE_STAGED);
    assert_int_equal(in.bytes, 0);
    assert_int_equal(in.src_staging_bytes, 0);
    unsigned char staging[1];
    assert_int_equal(ferry_kv_plan_bind_sender(plan, (uint64_t)(uintptr_t)staging, 0, 0, 0), 0);
    assert_int_equal(ferry_kv_gather(plan), 0);
    size_t count = 1;
    ferry_kv_plan_blocks(plan, &count);
    assert_int_equal(count, 0);
    ferry_kv_plan_destroy(plan);
    rank_free(&p);
    rank_free(&d);
}

static const struct tp_case split_1_1 = {FERRY_KV_SPLIT, 8, 1, 1};
static const struct tp_case split_2_2 = {FERRY_KV_SPLIT, 8, 2, 2};
static const struct tp_case split_4_2 = {FERRY_KV_SPLIT, 8, 4, 2};
static const struct tp_case split_2_4 = {FERRY_KV_SPLIT, 8, 2, 4};
static const struct tp_case split_8_1 = {FERRY_KV_SPLIT, 8, 8, 1};
static const struct tp_case split_1_8 = {FERRY_KV_SPLIT, 8, 1, 8};
/* 6 heads, 3 per prefill rank, 2 per decode rank: decode rank 1 takes the
 * last head of prefill 0 and the first of prefill 1, cut on both sides. */
static const struct tp_case split_2_3 = {FERRY_KV_SPLIT, 6, 2, 3};
/* 2 heads over 4 decode ranks: replicated on the decode side. */
static const struct tp_case split_2_4_replicated = {FERRY_KV_SPLIT, 2, 2, 4};
/* 2 heads over 4 prefill ranks: replicated on the prefill side. */
static const struct tp_case split_4_1_replicated = {FERRY_KV_SPLIT, 2, 4, 1};
static const struct tp_case fused_4_2 = {FERRY_KV_FUSED, 8, 4, 2};
static const struct tp_case fused_2_4 = {FERRY_KV_FUSED, 8, 2, 4};
static const struct tp_case fused_2_3 = {FERRY_KV_FUSED, 6, 2, 3};
static const struct tp_case mla_2_4 = {FERRY_KV_MLA, 0, 2, 4};
static const struct tp_case mla_8_1 = {FERRY_KV_MLA, 0, 8, 1};

/* Named after the case, so that a failure says which split broke. */
#define TP_CASE(name) {#name, tp_transfer_matches_reference, NULL, NULL, (void *)&name}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TP_CASE(split_1_1),
        TP_CASE(split_2_2),
        TP_CASE(split_4_2),
        TP_CASE(split_2_4),
        TP_CASE(split_8_1),
        TP_CASE(split_1_8),
        TP_CASE(split_2_3),
        TP_CASE(split_2_4_replicated),
        TP_CASE(split_4_1_replicated),
        TP_CASE(fused_4_2),
        TP_CASE(fused_2_4),
        TP_CASE(fused_2_3),
        TP_CASE(mla_2_4),
        TP_CASE(mla_8_1),
        cmocka_unit_test(reference_check_notices_wrong_bytes),
        cmocka_unit_test(empty_request_moves_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
