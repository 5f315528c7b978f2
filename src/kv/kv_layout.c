/* SPDX-License-Identifier: Apache-2.0 */
/* KV cache descriptors: validation, row geometry, and which heads each
 * tensor-parallel rank holds. */
#include <stdlib.h>

#include "util/fail.h"
#include "kv_internal.h"

static const char *kind_name(int kind)
{
    switch (kind) {
    case FERRY_KV_SPLIT: return "SPLIT";
    case FERRY_KV_FUSED: return "FUSED";
    case FERRY_KV_MLA: return "MLA";
    default: return "unknown";
    }
}

int ferry_kv_rank_heads(uint32_t total_heads, uint32_t tp_size, uint32_t tp_rank,
                        uint32_t *first, uint32_t *count)
{
    if (total_heads == 0 || tp_size == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv heads: total_kv_heads %u and tp_size %u must be positive",
                          total_heads, tp_size);
    if (tp_rank >= tp_size)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv heads: tp_rank %u not below tp_size %u",
                          tp_rank, tp_size);
    if (total_heads >= tp_size) {
        if (total_heads % tp_size != 0)
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                              "kv heads: total_kv_heads %u is not a multiple of tp_size %u",
                              total_heads, tp_size);
        uint32_t per_rank = total_heads / tp_size;
        *first = tp_rank * per_rank;
        *count = per_rank;
        return 0;
    }
    /* More ranks than heads: each head lives on tp/H consecutive ranks. */
    if (tp_size % total_heads != 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv heads: tp_size %u is not a multiple of total_kv_heads %u",
                          tp_size, total_heads);
    *first = tp_rank / (tp_size / total_heads);
    *count = 1;
    return 0;
}

static uint32_t model_heads_of(const ferry_kv_cache_desc_t *d)
{
    if (d->kind == FERRY_KV_MLA) return 1;
    return d->total_kv_heads ? d->total_kv_heads : d->kv_heads * d->tp_size;
}

static int validate_shape(const ferry_kv_cache_desc_t *d)
{
    if (d->kind != FERRY_KV_SPLIT && d->kind != FERRY_KV_FUSED && d->kind != FERRY_KV_MLA)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv cache: kind %d is not SPLIT, FUSED or MLA",
                          d->kind);
    if (d->num_layers == 0 || d->num_pages == 0 || d->page_size == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv cache: num_layers %u, num_pages %u and page_size %u must be positive",
                          d->num_layers, d->num_pages, d->page_size);
    if (d->tp_size == 0 || d->tp_rank >= d->tp_size)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv cache: tp_rank %u must be below tp_size %u", d->tp_rank, d->tp_size);
    if (d->kind == FERRY_KV_MLA) {
        if (d->mla_row_bytes == 0)
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv cache: MLA needs mla_row_bytes > 0");
        return 0;
    }
    if (d->kv_heads == 0 || d->head_dim == 0 || d->dtype_size == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv cache: kv_heads %u, head_dim %u and dtype_size %u must be positive",
                          d->kv_heads, d->head_dim, d->dtype_size);
    uint32_t first, count;
    int rc = ferry_kv_rank_heads(model_heads_of(d), d->tp_size, d->tp_rank, &first, &count);
    if (rc != 0) return ferry_fail_context("kv cache");
    if (count != d->kv_heads)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv cache: kv_heads %u, but rank %u of tp %u holds %u of the model's %u heads",
                          d->kv_heads, d->tp_rank, d->tp_size, count, model_heads_of(d));
    return 0;
}

/* Every buffer must fit in the address space: base + num_pages * page bytes. */
static int validate_sizes_and_addresses(const ferry_kv_cache_desc_t *d)
{
    uint64_t row = d->kind == FERRY_KV_MLA ? d->mla_row_bytes : 0;
    if (d->kind != FERRY_KV_MLA &&
        (kv_mul_overflows((uint64_t)d->kv_heads * d->head_dim, d->dtype_size, &row) ||
         kv_mul_overflows(row, d->kind == FERRY_KV_FUSED ? 2 : 1, &row)))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv cache: token row size overflows");
    uint64_t buffer_bytes;
    if (kv_mul_overflows(row, d->page_size, &buffer_bytes) ||
        kv_mul_overflows(buffer_bytes, d->num_pages, &buffer_bytes))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv cache: %u pages of %u tokens of %llu bytes overflow", d->num_pages,
                          d->page_size, (unsigned long long)row);
    if (d->kind != FERRY_KV_SPLIT && d->v_addrs)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv cache: v_addrs must be NULL for a %s cache (one buffer per layer)",
                          kind_name(d->kind));
    if (d->kind == FERRY_KV_SPLIT && (d->k_addrs == NULL) != (d->v_addrs == NULL))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv cache: SPLIT needs both k_addrs and v_addrs, or neither");
    for (uint32_t l = 0; d->k_addrs && l < d->num_layers; l++) {
        for (uint32_t b = 0; b < ferry_kv_buffers_per_layer(d); b++) {
            uint64_t base = kv_buffer_addr(d, l, b);
            if (base == 0 || base + buffer_bytes < base)
                return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                                  "kv cache: layer %u %s buffer at 0x%llx of %llu bytes is null or wraps",
                                  l, b ? "V" : "K", (unsigned long long)base,
                                  (unsigned long long)buffer_bytes);
        }
    }
    return 0;
}

int ferry_kv_cache_validate(const ferry_kv_cache_desc_t *d)
{
    if (!d) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv cache: descriptor is NULL");
    int rc = validate_shape(d);
    if (rc != 0) return rc;
    return validate_sizes_and_addresses(d);
}

uint32_t ferry_kv_buffers_per_layer(const ferry_kv_cache_desc_t *d)
{
    return d->kind == FERRY_KV_SPLIT ? 2 : 1;
}

void kv_geometry_of(const ferry_kv_cache_desc_t *d, struct kv_geometry *g)
{
    g->buffers = ferry_kv_buffers_per_layer(d);
    g->parts = d->kind == FERRY_KV_FUSED ? 2 : 1;
    g->model_heads = model_heads_of(d);
    g->head_bytes = d->kind == FERRY_KV_MLA ? d->mla_row_bytes
                                            : (uint64_t)d->head_dim * d->dtype_size;
    /* validate_shape checked that this succeeds and matches kv_heads. */
    ferry_kv_rank_heads(g->model_heads, d->tp_size, d->tp_rank, &g->first_head, &g->heads);
    g->row_bytes = g->parts * g->heads * g->head_bytes;
    g->page_bytes = g->row_bytes * d->page_size;
}

uint64_t ferry_kv_token_bytes(const ferry_kv_cache_desc_t *d)
{
    struct kv_geometry g;
    kv_geometry_of(d, &g);
    return g.row_bytes;
}

uint64_t ferry_kv_page_bytes(const ferry_kv_cache_desc_t *d)
{
    struct kv_geometry g;
    kv_geometry_of(d, &g);
    return g.page_bytes;
}

uint64_t kv_buffer_addr(const ferry_kv_cache_desc_t *d, uint32_t layer, uint32_t buffer)
{
    const uint64_t *addrs = buffer == 0 ? d->k_addrs : d->v_addrs;
    return addrs ? addrs[layer] : 0;
}

int kv_has_addresses(const ferry_kv_cache_desc_t *d)
{
    return d->k_addrs && (d->kind != FERRY_KV_SPLIT || d->v_addrs);
}

/* ------------------------------------------------ tensor-parallel mapping */

/* The prefill rank that serves model head h to decode rank decode_rank, and
 * where h sits in that rank's row. */
static void prefill_owner(uint32_t h, uint32_t total_heads, uint32_t prefill_tp,
                          uint32_t decode_rank, uint32_t *rank, uint32_t *offset)
{
    if (total_heads >= prefill_tp) {
        uint32_t per_rank = total_heads / prefill_tp;
        *rank = h / per_rank;
        *offset = h % per_rank;
        return;
    }
    uint32_t replicas = prefill_tp / total_heads;
    *rank = h * replicas + decode_rank % replicas;
    *offset = 0;
}

long ferry_kv_tp_sources(uint32_t total_heads, uint32_t prefill_tp, uint32_t decode_tp,
                         uint32_t decode_rank, ferry_kv_head_slice_t *out, size_t max)
{
    uint32_t first, count, unused;
    if (ferry_kv_rank_heads(total_heads, prefill_tp, 0, &unused, &unused) != 0)
        return ferry_fail_context("kv prefill tp");
    if (ferry_kv_rank_heads(total_heads, decode_tp, decode_rank, &first, &count) != 0)
        return ferry_fail_context("kv decode tp");
    long n = 0;
    ferry_kv_head_slice_t cur = {0};
    for (uint32_t h = first; h < first + count; h++) {
        uint32_t rank, offset;
        prefill_owner(h, total_heads, prefill_tp, decode_rank, &rank, &offset);
        /* Consecutive heads of one prefill rank extend the current slice. */
        if (n > 0 && rank == cur.prefill_rank && offset == cur.src_head + cur.heads) {
            cur.heads++;
        } else {
            if (n > 0 && (size_t)(n - 1) < max) out[n - 1] = cur;
            cur = (ferry_kv_head_slice_t){rank, decode_rank, offset, h - first, 1};
            n++;
        }
    }
    if (n > 0 && (size_t)(n - 1) < max) out[n - 1] = cur;
    return n;
}

long ferry_kv_tp_targets(uint32_t total_heads, uint32_t prefill_tp, uint32_t decode_tp,
                         uint32_t prefill_rank, ferry_kv_head_slice_t *out, size_t max)
{
    uint32_t unused;
    if (ferry_kv_rank_heads(total_heads, prefill_tp, prefill_rank, &unused, &unused) != 0)
        return ferry_fail_context("kv prefill tp");
    /* A decode rank has at most one slice per prefill rank, and at most
     * total_heads slices in all. */
    size_t slice_cap = total_heads < prefill_tp ? total_heads : prefill_tp;
    ferry_kv_head_slice_t *slices = malloc(slice_cap * sizeof *slices);
    if (!slices) return ferry_fail(FERRY_ERR_MEMORY, "kv tp targets: %zu slices", slice_cap);
    long n = 0;
    for (uint32_t d = 0; d < decode_tp; d++) {
        long k = ferry_kv_tp_sources(total_heads, prefill_tp, decode_tp, d, slices, slice_cap);
        if (k < 0) {
            free(slices);
            return k;
        }
        for (long i = 0; i < k; i++) {
            if (slices[i].prefill_rank != prefill_rank) continue;
            if ((size_t)n < max) out[n] = slices[i];
            n++;
        }
    }
    free(slices);
    return n;
}
