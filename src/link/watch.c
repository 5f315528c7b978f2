/* SPDX-License-Identifier: Apache-2.0 */
/* Placement watches (watch.h). Few and short-lived (one per KV pair in
 * flight on a decode rank), so they live in one process-wide list: the
 * transports' hook costs one relaxed atomic load while none exists. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"
#include "watch.h"

struct ferry_watch {
    ferry_engine_t *engine;
    ferry_watch_source_t src;
    ferry_watch_range_t *ranges; /* sorted by addr, disjoint */
    size_t n;
    uint64_t bytes, foreign;     /* under watch_lock */
    struct ferry_watch *next;
};

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry_watch_t *watches;
static atomic_int watch_count;

static int range_cmp(const void *a, const void *b)
{
    const ferry_watch_range_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Sorts and merges overlapping or touching ranges in place; returns how
 * many remain. */
static size_t ranges_merge(ferry_watch_range_t *r, size_t n)
{
    if (n == 0) return 0;
    qsort(r, n, sizeof *r, range_cmp);
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        uint64_t end = r[k].addr + r[k].len;
        if (r[i].addr <= end) {
            uint64_t iend = r[i].addr + r[i].len;
            if (iend > end) r[k].len = iend - r[k].addr;
        } else {
            r[++k] = r[i];
        }
    }
    return k + 1;
}

int ferry_watch_create(ferry_engine_t *e, const ferry_watch_source_t *src, const ferry_watch_range_t *ranges,
                       size_t n, ferry_watch_t **out)
{
    if (!e || !src || !out || (n && !ranges))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "watch: NULL engine, source, ranges or out");
    for (size_t i = 0; i < n; i++)
        if (ranges[i].len == 0 || ranges[i].addr + ranges[i].len < ranges[i].addr)
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "watch: range %zu (0x%llx + %llu) is empty or wraps", i,
                              (unsigned long long)ranges[i].addr, (unsigned long long)ranges[i].len);
    ferry_watch_t *w = calloc(1, sizeof *w);
    if (w) w->ranges = malloc((n ? n : 1) * sizeof *w->ranges);
    if (!w || !w->ranges) {
        if (w) free(w->ranges);
        free(w);
        return ferry_fail(FERRY_ERR_MEMORY, "watch: %zu ranges", n);
    }
    w->engine = e;
    w->src = *src;
    if (n) memcpy(w->ranges, ranges, n * sizeof *ranges);
    w->n = ranges_merge(w->ranges, n);
    pthread_mutex_lock(&watch_lock);
    w->next = watches;
    watches = w;
    atomic_fetch_add_explicit(&watch_count, 1, memory_order_relaxed);
    pthread_mutex_unlock(&watch_lock);
    *out = w;
    return 0;
}

uint64_t ferry_watch_bytes(const ferry_watch_t *w)
{
    pthread_mutex_lock(&watch_lock);
    uint64_t v = w ? w->bytes : 0;
    pthread_mutex_unlock(&watch_lock);
    return v;
}

uint64_t ferry_watch_foreign_bytes(const ferry_watch_t *w)
{
    pthread_mutex_lock(&watch_lock);
    uint64_t v = w ? w->foreign : 0;
    pthread_mutex_unlock(&watch_lock);
    return v;
}

void ferry_watch_destroy(ferry_watch_t *w)
{
    if (!w) return;
    pthread_mutex_lock(&watch_lock);
    ferry_watch_t **p = &watches;
    while (*p && *p != w) p = &(*p)->next;
    if (*p) {
        *p = w->next;
        atomic_fetch_sub_explicit(&watch_count, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&watch_lock);
    free(w->ranges);
    free(w);
}

/* Bytes of [addr, addr+len) inside w's ranges. */
static uint64_t overlap(const ferry_watch_t *w, uint64_t addr, uint64_t len)
{
    uint64_t end = addr + len < addr ? UINT64_MAX : addr + len;
    size_t lo = 0, hi = w->n; /* first range whose end is past addr */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->ranges[mid].addr + w->ranges[mid].len <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint64_t total = 0;
    for (size_t i = lo; i < w->n && w->ranges[i].addr < end; i++) {
        uint64_t a = w->ranges[i].addr > addr ? w->ranges[i].addr : addr;
        uint64_t rend = w->ranges[i].addr + w->ranges[i].len;
        uint64_t b = rend < end ? rend : end;
        if (b > a) total += b - a;
    }
    return total;
}

static int from_source(const ferry_watch_t *w, const ferry_conn_t *c)
{
    return c->peer.engine_id == w->src.engine_id && c->peer.epoch == w->src.epoch &&
           (w->src.any_ip || memcmp(c->source, w->src.ip, 16) == 0);
}

void ferry_watch_placed(const ferry_conn_t *c, uint64_t addr, uint64_t len)
{
    if (atomic_load_explicit(&watch_count, memory_order_relaxed) == 0 || len == 0) return;
    pthread_mutex_lock(&watch_lock);
    for (ferry_watch_t *w = watches; w; w = w->next) {
        if (w->engine != c->engine) continue;
        uint64_t in = overlap(w, addr, len);
        if (from_source(w, c))
            w->bytes += in;
        else
            w->foreign += in;
    }
    pthread_mutex_unlock(&watch_lock);
}
