/* SPDX-License-Identifier: Apache-2.0 */
/* Page-index checks and coalescing of page copies into contiguous blocks. */
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"
#include "kv_internal.h"

int kv_blocks_append(struct kv_block_list *l, uint64_t src, uint64_t dst, uint64_t len)
{
    if (len == 0) return 0;
    l->bytes += len;
    if (l->count > 0) {
        ferry_kv_block_t *last = &l->v[l->count - 1];
        if (last->src + last->len == src && last->dst + last->len == dst) {
            last->len += len;
            return 0;
        }
    }
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        ferry_kv_block_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) return ferry_fail(FERRY_ERR_MEMORY, "kv blocks: growing to %zu blocks", cap);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->count++] = (ferry_kv_block_t){src, dst, len};
    return 0;
}

void kv_blocks_reset(struct kv_block_list *l)
{
    l->count = 0;
    l->bytes = 0;
}

void kv_blocks_free(struct kv_block_list *l)
{
    free(l->v);
    memset(l, 0, sizeof *l);
}

struct indexed_page {
    int32_t page;
    size_t pos;
};

static int by_page_then_pos(const void *a, const void *b)
{
    const struct indexed_page *x = a, *y = b;
    if (x->page != y->page) return x->page < y->page ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Sorting a copy finds repeats in O(n log n) without a bitmap sized by the
 * pool, which may hold millions of pages. */
static int check_distinct(const char *side, const int32_t *pages, size_t n)
{
    if (n < 2) return 0;
    struct indexed_page *sorted = ferry_malloc_array(n, sizeof *sorted);
    if (!sorted) return ferry_fail(FERRY_ERR_MEMORY, "kv %s pages: sorting %zu indices", side, n);
    for (size_t i = 0; i < n; i++) sorted[i] = (struct indexed_page){pages[i], i};
    qsort(sorted, n, sizeof *sorted, by_page_then_pos);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++) {
        if (sorted[i].page == sorted[i - 1].page)
            rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                            "kv %s pages: page index %d at position %zu repeats position %zu",
                            side, sorted[i].page, sorted[i].pos, sorted[i - 1].pos);
    }
    free(sorted);
    return rc;
}

int ferry_kv_check_pages(const char *side, const int32_t *pages, size_t n, uint32_t num_pages)
{
    if (!side) side = "";
    if (n > 0 && !pages)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv %s pages: NULL list of %zu", side, n);
    for (size_t i = 0; i < n; i++) {
        if (pages[i] < 0 || (uint32_t)pages[i] >= num_pages)
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                              "kv %s pages: page index %d at position %zu is outside [0, %u)",
                              side, pages[i], i, num_pages);
    }
    return check_distinct(side, pages, n);
}

long ferry_kv_coalesce_pages(uint64_t src_base, uint64_t dst_base, uint64_t page_bytes,
                             const int32_t *src_pages, uint32_t src_num_pages,
                             const int32_t *dst_pages, uint32_t dst_num_pages, size_t n,
                             ferry_kv_block_t *out, size_t max, uint64_t *bytes)
{
    if (bytes) *bytes = 0;
    if (page_bytes == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv coalesce: page_bytes is 0");
    uint64_t src_end, dst_end;
    if (kv_mul_overflows(page_bytes, src_num_pages, &src_end) || src_base + src_end < src_base ||
        kv_mul_overflows(page_bytes, dst_num_pages, &dst_end) || dst_base + dst_end < dst_base)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv coalesce: buffers of %u / %u pages of %llu bytes wrap the address space",
                          src_num_pages, dst_num_pages, (unsigned long long)page_bytes);
    int rc = ferry_kv_check_pages("prefill", src_pages, n, src_num_pages);
    if (rc == 0) rc = ferry_kv_check_pages("decode", dst_pages, n, dst_num_pages);
    if (rc != 0) return rc;

    struct kv_block_list list = {0};
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = kv_blocks_append(&list, src_base + (uint64_t)src_pages[i] * page_bytes,
                              dst_base + (uint64_t)dst_pages[i] * page_bytes, page_bytes);
    if (rc == 0 && out && list.count > max)
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                        "kv coalesce: %zu blocks needed, room for %zu", list.count, max);
    if (rc == 0 && out && list.count) memcpy(out, list.v, list.count * sizeof *out);
    if (rc == 0 && bytes) *bytes = list.bytes;
    long count = rc == 0 ? (long)list.count : rc;
    kv_blocks_free(&list);
    return count;
}
