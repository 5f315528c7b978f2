/* SPDX-License-Identifier: Apache-2.0 */
/* Transfer plans for one (prefill rank -> decode rank) pair: which heads,
 * whether either side stages, staging sizes, and the coalesced blocks. */
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"
#include "util/sized.h"
#include "kv_internal.h"

static int model_field_differs(const char *field, uint64_t prefill, uint64_t decode)
{
    if (prefill == decode) return 0;
    return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                      "kv plan: prefill and decode caches differ in %s: %llu vs %llu", field,
                      (unsigned long long)prefill, (unsigned long long)decode);
}

/* Both sides must describe the same model; only the TP split, the page pool
 * and the addresses may differ. */
static int check_same_model(const ferry_kv_cache_desc_t *s, const ferry_kv_cache_desc_t *d,
                            const struct kv_geometry *sg, const struct kv_geometry *dg)
{
    int rc = model_field_differs("kind", (uint64_t)s->kind, (uint64_t)d->kind);
    if (rc == 0) rc = model_field_differs("num_layers", s->num_layers, d->num_layers);
    if (rc == 0) rc = model_field_differs("page_size", s->page_size, d->page_size);
    if (rc == 0) rc = model_field_differs("total_kv_heads", sg->model_heads, dg->model_heads);
    if (rc == 0)
        rc = model_field_differs(s->kind == FERRY_KV_MLA ? "mla_row_bytes" : "head_dim * dtype_size",
                                 sg->head_bytes, dg->head_bytes);
    return rc;
}

/* Finds the slice prefill rank src_rank gives decode rank dst_rank, and the
 * decode rank's staging layout: each source that fills only part of the
 * decode rows gets a region, in source order. */
static int plan_slice_and_staging(struct ferry_kv_plan *p, uint64_t tokens)
{
    const struct kv_geometry *dg = &p->dst_geo;
    ferry_kv_head_slice_t *slices = malloc(dg->heads * sizeof *slices);
    if (!slices) return ferry_fail(FERRY_ERR_MEMORY, "kv plan: %u slices", dg->heads);
    long k = ferry_kv_tp_sources(dg->model_heads, p->src.tp_size, p->dst.tp_size, p->dst.tp_rank,
                                 slices, dg->heads);
    if (k < 0) {
        free(slices);
        return (int)k;
    }
    /* One head's bytes over every token, layer and buffer; the decode
     * rank's whole share bounds every region, sum and pair size below. */
    uint64_t per_head_region, all_heads;
    if (kv_mul_overflows(tokens, dg->head_bytes, &per_head_region) ||
        kv_mul_overflows(per_head_region, (uint64_t)p->dst.num_layers * dg->buffers * dg->parts,
                         &per_head_region) ||
        kv_mul_overflows(per_head_region, dg->heads, &all_heads)) {
        free(slices);
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv plan: %zu pages overflow the sizes", p->n);
    }
    for (long i = 0; i < k; i++) {
        uint64_t region = per_head_region * slices[i].heads;
        int scatters = slices[i].heads < dg->heads;
        if (slices[i].prefill_rank == p->src.tp_rank) {
            p->info.mode = FERRY_KV_MODE_DIRECT;
            p->info.slice = slices[i];
            p->info.scatter = scatters;
            if (scatters) p->info.dst_staging_offset = p->info.dst_staging_bytes;
        }
        if (scatters) p->info.dst_staging_bytes += region;
    }
    free(slices);
    return 0;
}

static void plan_sizes(struct ferry_kv_plan *p, uint64_t tokens)
{
    ferry_kv_plan_info_t *in = &p->info;
    in->pages = p->n;
    if (in->mode == FERRY_KV_MODE_NONE) {
        in->dst_staging_bytes = in->dst_staging_offset = 0;
        return;
    }
    in->gather = in->slice.heads < p->src_geo.heads;
    if (in->gather || in->scatter) in->mode = FERRY_KV_MODE_STAGED;
    p->slice_row_bytes = p->src_geo.parts * in->slice.heads * p->src_geo.head_bytes;
    in->per_layer_bytes = p->src_geo.buffers * tokens * p->slice_row_bytes;
    in->bytes = in->per_layer_bytes * p->src.num_layers;
    in->src_staging_bytes = in->gather ? in->bytes : 0;
}

static int32_t *copy_pages(const int32_t *pages, size_t n)
{
    int32_t *copy = malloc((n ? n : 1) * sizeof *copy);
    if (copy && n) memcpy(copy, pages, n * sizeof *copy);
    return copy;
}

int ferry_kv_plan_create(const ferry_kv_cache_desc_t *src, const ferry_kv_cache_desc_t *dst,
                         const int32_t *src_pages, const int32_t *dst_pages, size_t n,
                         ferry_kv_plan_t **out)
{
    if (!out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv plan: out is NULL");
    *out = NULL;
    if (ferry_kv_cache_validate(src) != 0) return ferry_fail_context("kv plan: prefill side");
    if (ferry_kv_cache_validate(dst) != 0) return ferry_fail_context("kv plan: decode side");
    struct kv_geometry sg, dg;
    kv_geometry_of(src, &sg);
    kv_geometry_of(dst, &dg);
    int rc = check_same_model(src, dst, &sg, &dg);
    if (rc == 0) rc = ferry_kv_check_pages("prefill", src_pages, n, src->num_pages);
    if (rc == 0) rc = ferry_kv_check_pages("decode", dst_pages, n, dst->num_pages);
    if (rc != 0) return ferry_fail_context("kv plan");

    struct ferry_kv_plan *p = calloc(1, sizeof *p);
    if (!p) return ferry_fail(FERRY_ERR_MEMORY, "kv plan: allocating the plan");
    p->src = *src;
    p->dst = *dst;
    p->src_geo = sg;
    p->dst_geo = dg;
    p->n = n;
    p->src_pages = copy_pages(src_pages, n);
    p->dst_pages = copy_pages(dst_pages, n);
    if (!p->src_pages || !p->dst_pages) {
        ferry_kv_plan_destroy(p);
        return ferry_fail(FERRY_ERR_MEMORY, "kv plan: copying %zu page indices", n);
    }
    uint64_t tokens = (uint64_t)n * src->page_size;
    rc = plan_slice_and_staging(p, tokens);
    if (rc != 0) {
        ferry_kv_plan_destroy(p);
        return rc;
    }
    plan_sizes(p, tokens);
    *out = p;
    return 0;
}

void ferry_kv_plan_destroy(ferry_kv_plan_t *p)
{
    if (!p) return;
    free(p->src_pages);
    free(p->dst_pages);
    kv_blocks_free(&p->blocks);
    free(p);
}

void (ferry_kv_plan_get_info)(const ferry_kv_plan_t *p, ferry_kv_plan_info_t *out)
{
    if (ferry_sized_check(out, FERRY_KV_PLAN_INFO_SIZE_0_1, "kv plan info") != 0) return;
    ferry_kv_plan_info_t info = p->info;
    info.blocks = p->sender_bound ? p->blocks.count : 0;
    ferry_sized_export(out, &info, sizeof info);
}

static int check_staging(const char *which, uint64_t addr, uint64_t len, uint64_t need)
{
    if (addr == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv plan: %s staging buffer missing; %llu bytes needed", which,
                          (unsigned long long)need);
    if (len < need || addr + len < addr)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv plan: %s staging [0x%llx+%llu) too short; %llu bytes needed", which,
                          (unsigned long long)addr, (unsigned long long)len,
                          (unsigned long long)need);
    return 0;
}

/* Where page position i of layer l, buffer b starts on each side: in the
 * pages themselves when that side holds whole rows, else in its staging. */
static uint64_t src_piece(const struct ferry_kv_plan *p, uint32_t l, uint32_t b, size_t i)
{
    uint64_t chunk = (uint64_t)p->src.page_size * p->slice_row_bytes;
    if (p->info.gather) return p->src_staging + kv_staging_offset(p, l, b) + i * chunk;
    return kv_buffer_addr(&p->src, l, b) + (uint64_t)p->src_pages[i] * p->src_geo.page_bytes;
}

static uint64_t dst_piece(const struct ferry_kv_plan *p, uint64_t staging, uint32_t l,
                          uint32_t b, size_t i)
{
    uint64_t chunk = (uint64_t)p->src.page_size * p->slice_row_bytes;
    if (p->info.scatter)
        return staging + p->info.dst_staging_offset + kv_staging_offset(p, l, b) + i * chunk;
    return kv_buffer_addr(&p->dst, l, b) + (uint64_t)p->dst_pages[i] * p->dst_geo.page_bytes;
}

static int build_blocks(struct ferry_kv_plan *p, uint64_t dst_staging)
{
    kv_blocks_reset(&p->blocks);
    if (p->info.mode == FERRY_KV_MODE_NONE) return 0;
    uint64_t chunk = (uint64_t)p->src.page_size * p->slice_row_bytes;
    for (uint32_t l = 0; l < p->src.num_layers; l++) {
        for (uint32_t b = 0; b < p->src_geo.buffers; b++) {
            for (size_t i = 0; i < p->n; i++) {
                int rc = kv_blocks_append(&p->blocks, src_piece(p, l, b, i),
                                          dst_piece(p, dst_staging, l, b, i), chunk);
                if (rc != 0) return rc;
            }
        }
    }
    return 0;
}

int ferry_kv_plan_bind_sender(ferry_kv_plan_t *p, uint64_t src_staging, uint64_t src_len,
                              uint64_t dst_staging, uint64_t dst_len)
{
    if (!p) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv bind sender: plan is NULL");
    p->sender_bound = 0;
    if (!kv_has_addresses(&p->src) || !kv_has_addresses(&p->dst))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv bind sender: the %s descriptor carries no buffer addresses",
                          kv_has_addresses(&p->src) ? "decode" : "prefill");
    if (p->info.gather &&
        check_staging("prefill (gather)", src_staging, src_len, p->info.src_staging_bytes) != 0)
        return ferry_fail_context("kv bind sender");
    if (p->info.scatter &&
        check_staging("decode (scatter)", dst_staging, dst_len, p->info.dst_staging_bytes) != 0)
        return ferry_fail_context("kv bind sender");
    p->src_staging = src_staging;
    p->dst_staging_remote = dst_staging;
    int rc = build_blocks(p, dst_staging);
    if (rc != 0) return rc;
    p->sender_bound = 1;
    return 0;
}

int ferry_kv_plan_bind_receiver(ferry_kv_plan_t *p, uint64_t dst_staging, uint64_t dst_len)
{
    if (!p) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv bind receiver: plan is NULL");
    p->receiver_bound = 0;
    if (!kv_has_addresses(&p->dst))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv bind receiver: the decode descriptor carries no buffer addresses");
    if (p->info.scatter &&
        check_staging("decode (scatter)", dst_staging, dst_len, p->info.dst_staging_bytes) != 0)
        return ferry_fail_context("kv bind receiver");
    p->dst_staging_local = dst_staging;
    p->receiver_bound = 1;
    return 0;
}

const ferry_kv_block_t *ferry_kv_plan_blocks(const ferry_kv_plan_t *p, size_t *count)
{
    if (!p || !p->sender_bound) {
        if (count) *count = 0;
        return NULL;
    }
    /* A bound plan with nothing to move still answers non-NULL. */
    static const ferry_kv_block_t no_blocks[1];
    if (count) *count = p->blocks.count;
    return p->blocks.v ? p->blocks.v : no_blocks;
}
