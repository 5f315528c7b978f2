/* SPDX-License-Identifier: Apache-2.0 */
/* Shared pieces of the KV module: row geometry, checked arithmetic, and a
 * growable list of blocks that merges contiguous neighbours. */
#ifndef FERRY_KV_INTERNAL_H
#define FERRY_KV_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/kv.h>

#include "util/arith.h"

/* One rank's view of a token row. */
struct kv_geometry {
    uint32_t buffers;    /* per layer: 2 (K, V) or 1 */
    uint32_t parts;      /* head-sliced parts of a row: 2 for FUSED (K, V), else 1 */
    uint32_t model_heads;/* heads split across TP: total_kv_heads, 1 for MLA */
    uint32_t first_head; /* first model head this rank holds */
    uint32_t heads;      /* heads this rank holds */
    uint64_t head_bytes; /* bytes of one head of one part (MLA: the whole row) */
    uint64_t row_bytes;  /* parts * heads * head_bytes */
    uint64_t page_bytes; /* page_size * row_bytes */
};

/* Fills *g from a descriptor that ferry_kv_cache_validate accepted. */
void kv_geometry_of(const ferry_kv_cache_desc_t *d, struct kv_geometry *g);
/* The base address of buffer b (0: K/fused/latent, 1: V) of layer l; 0 when
 * the descriptor carries no addresses. */
uint64_t kv_buffer_addr(const ferry_kv_cache_desc_t *d, uint32_t layer, uint32_t buffer);
/* 1 when the descriptor carries every buffer address. */
int kv_has_addresses(const ferry_kv_cache_desc_t *d);

/* *out = a * b; 0, or 1 on overflow (the shared checked product). */
static inline int kv_mul_overflows(uint64_t a, uint64_t b, uint64_t *out)
{
    return ferry_mul_overflows_u64(a, b, out);
}

struct kv_block_list {
    ferry_kv_block_t *v;
    size_t count;
    size_t cap;
    uint64_t bytes;
};

/* Appends [src, +len) -> [dst, +len), extending the last block instead when
 * both sides continue it. 0 or MEMORY. */
int kv_blocks_append(struct kv_block_list *l, uint64_t src, uint64_t dst, uint64_t len);
void kv_blocks_reset(struct kv_block_list *l);
void kv_blocks_free(struct kv_block_list *l);

/* A plan: one (prefill rank -> decode rank) pair, one page list. */
struct ferry_kv_plan {
    ferry_kv_cache_desc_t src, dst; /* address arrays borrowed from the caller */
    struct kv_geometry src_geo, dst_geo;
    int32_t *src_pages;
    int32_t *dst_pages;
    size_t n;
    ferry_kv_plan_info_t info;
    uint64_t slice_row_bytes;    /* parts * slice heads * head_bytes: a token's share */
    /* Set by bind_sender. */
    int sender_bound;
    uint64_t src_staging;
    uint64_t dst_staging_remote;
    struct kv_block_list blocks;
    /* Set by bind_receiver. */
    int receiver_bound;
    uint64_t dst_staging_local;
    /* The receiver's epoch this plan's sends are pinned to (kv_send.c):
     * the pinned peer name of its first send, or the session's epoch then;
     * 0 until that send. */
    _Atomic uint64_t pin_epoch;
};

/* kv_send.c, shared with the embeddings path. */
/* Writes n requests as one batch and waits; on failure the unfinished ones
 * are cancelled and the detail kept. */
int kv_write_requests(ferry_engine_t *e, const char *peer, const ferry_request_t *reqs,
                      size_t n, int timeout_ms);
int kv_notify_success(ferry_engine_t *e, const char *peer, const ferry_kv_notice_t *n);
/* Notifies the peer a failure notice for base's request with the current
 * detail as reason, and returns code with that same text as the detail. */
int kv_report_failure(ferry_engine_t *e, const char *peer, const ferry_kv_notice_t *base,
                      const char *step, int code);

/* 1 when status is 0 or a code of Ferry's error table (kv_notice.c): the
 * only statuses a notice may carry. */
int kv_status_known(int status);

/* Offset of layer l, buffer b inside a pair's staging region. */
static inline uint64_t kv_staging_offset(const struct ferry_kv_plan *p, uint32_t layer,
                                         uint32_t buffer)
{
    return ((uint64_t)layer * p->src_geo.buffers + buffer) * (p->info.per_layer_bytes /
                                                             p->src_geo.buffers);
}

#endif
