/* SPDX-License-Identifier: Apache-2.0 */
/* The staging copies: gather a head slice out of paged rows into a
 * contiguous buffer (sender), scatter it back into paged rows (receiver).
 * Both walk the same staging layout, [layer][buffer][token][part][heads]. */
#include <string.h>

#include "util/fail.h"
#include "kv_internal.h"

enum copy_direction { PAGES_TO_STAGING, STAGING_TO_PAGES };

/* One side's paged rows and the slice of each row that the pair moves. */
struct paged_side {
    const ferry_kv_cache_desc_t *desc;
    const struct kv_geometry *geo;
    const int32_t *pages;
    uint32_t first_head; /* slice start within this side's rows */
};

/* Copies the slice of every token of one page between the page and its
 * staging chunk. A row holds parts (K, V for FUSED) of geo->heads heads; the
 * slice takes the same heads of each part. */
static void copy_page(const struct ferry_kv_plan *p, const struct paged_side *side,
                      unsigned char *page, unsigned char *chunk, enum copy_direction dir)
{
    const struct kv_geometry *g = side->geo;
    uint64_t slice_part_bytes = p->info.slice.heads * g->head_bytes;
    uint64_t part_stride = g->heads * g->head_bytes;
    uint64_t slice_offset = side->first_head * g->head_bytes;
    for (uint32_t t = 0; t < side->desc->page_size; t++) {
        unsigned char *row = page + t * g->row_bytes + slice_offset;
        unsigned char *staged = chunk + t * p->slice_row_bytes;
        for (uint32_t part = 0; part < g->parts; part++) {
            unsigned char *r = row + part * part_stride;
            unsigned char *s = staged + part * slice_part_bytes;
            if (dir == PAGES_TO_STAGING) memcpy(s, r, slice_part_bytes);
            else memcpy(r, s, slice_part_bytes);
        }
    }
}

static void copy_all(const struct ferry_kv_plan *p, const struct paged_side *side,
                     uint64_t staging, enum copy_direction dir)
{
    uint64_t chunk_bytes = (uint64_t)side->desc->page_size * p->slice_row_bytes;
    for (uint32_t l = 0; l < side->desc->num_layers; l++) {
        for (uint32_t b = 0; b < side->geo->buffers; b++) {
            unsigned char *base = (unsigned char *)(uintptr_t)kv_buffer_addr(side->desc, l, b);
            unsigned char *region = (unsigned char *)(uintptr_t)(staging + kv_staging_offset(p, l, b));
            for (size_t i = 0; i < p->n; i++)
                copy_page(p, side, base + (uint64_t)side->pages[i] * side->geo->page_bytes,
                          region + i * chunk_bytes, dir);
        }
    }
}

int ferry_kv_gather(const ferry_kv_plan_t *p)
{
    if (!p) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv gather: plan is NULL");
    if (!p->info.gather) return 0;
    if (!p->sender_bound)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv gather: plan not bound (ferry_kv_plan_bind_sender first)");
    struct paged_side side = {&p->src, &p->src_geo, p->src_pages, p->info.slice.src_head};
    copy_all(p, &side, p->src_staging, PAGES_TO_STAGING);
    return 0;
}

int ferry_kv_scatter(const ferry_kv_plan_t *p)
{
    if (!p) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv scatter: plan is NULL");
    if (!p->info.scatter) return 0;
    if (!p->receiver_bound)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv scatter: plan not bound (ferry_kv_plan_bind_receiver first)");
    struct paged_side side = {&p->dst, &p->dst_geo, p->dst_pages, p->info.slice.dst_head};
    copy_all(p, &side, p->dst_staging_local + p->info.dst_staging_offset, STAGING_TO_PAGES);
    return 0;
}
