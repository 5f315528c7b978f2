/* SPDX-License-Identifier: Apache-2.0 */
/* The live batches (batch.h): ferry_batch_alloc and ferry_batch_free,
 * and the set of live batches that lets free refuse a batch freed twice
 * and every call refuse one that is not live. */
#include <stdlib.h>

#include "util/clock.h"
#include "util/fail.h"
#include "batch_internal.h"

/* The live batches, so that a second ferry_batch_free is refused without
 * touching the freed batch: an open-addressing set of pointers, kept at
 * most half full. Only alloc and free take its lock. */
static struct {
    pthread_mutex_t lock;
    ferry_batch_t **slots;
    size_t cap, used;
} live = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t live_hash(const ferry_batch_t *b, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)b * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

/* With live.lock held: the slot of b, or of the empty slot ending its probe. */
static size_t live_find_locked(const ferry_batch_t *b)
{
    size_t i = live_hash(b, live.cap);
    while (live.slots[i] && live.slots[i] != b) i = (i + 1) & (live.cap - 1);
    return i;
}

static int live_add(ferry_batch_t *b)
{
    pthread_mutex_lock(&live.lock);
    if ((live.used + 1) * 2 > live.cap) {
        size_t cap = live.cap ? live.cap * 2 : 64;
        ferry_batch_t **old = live.slots, **slots = calloc(cap, sizeof *slots);
        if (!slots) {
            pthread_mutex_unlock(&live.lock);
            return -1;
        }
        size_t old_cap = live.cap;
        live.slots = slots;
        live.cap = cap;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i]) live.slots[live_find_locked(old[i])] = old[i];
        free(old);
    }
    live.slots[live_find_locked(b)] = b;
    live.used++;
    pthread_mutex_unlock(&live.lock);
    return 0;
}

/* Removes b; false if b is not a live batch (freed already, or never one). */
static bool live_remove(ferry_batch_t *b)
{
    pthread_mutex_lock(&live.lock);
    size_t i = live.cap ? live_find_locked(b) : 0;
    bool found = live.cap && live.slots[i] == b;
    if (found) {
        /* Backward-shift deletion keeps every probe chain unbroken. */
        live.slots[i] = NULL;
        for (size_t j = (i + 1) & (live.cap - 1); live.slots[j]; j = (j + 1) & (live.cap - 1)) {
            ferry_batch_t *moved = live.slots[j];
            live.slots[j] = NULL;
            live.slots[live_find_locked(moved)] = moved;
        }
        live.used--;
    }
    pthread_mutex_unlock(&live.lock);
    return found;
}

/* A cheap guard at every entry: a freed batch whose memory was not yet
 * reused still carries BATCH_FREED. */
int ferry_batch_check(const ferry_batch_t *b, const char *call)
{
    if (!b) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "%s: batch is NULL", call);
    if (b->magic != BATCH_MAGIC)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "%s: %p is not a live batch (used after ferry_batch_free?)",
                          call, (const void *)b);
    return 0;
}

int ferry_batch_alloc(ferry_engine_t *e, size_t capacity, ferry_batch_t **out)
{
    ferry_clear_last_error();
    if (!e || !out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "batch alloc: NULL argument");
    if (capacity == 0 || capacity > (1u << 24))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "batch alloc: capacity %zu not in [1, %u]", capacity, 1u << 24);
    ferry_batch_t *b = calloc(1, sizeof *b);
    if (b) b->reqs = calloc(capacity, sizeof *b->reqs);
    if (!b || !b->reqs) {
        free(b);
        return ferry_fail(FERRY_ERR_MEMORY, "batch of %zu: out of memory", capacity);
    }
    if (live_add(b) != 0) {
        free(b->reqs);
        free(b);
        return ferry_fail(FERRY_ERR_MEMORY, "batch of %zu: out of memory", capacity);
    }
    b->magic = BATCH_MAGIC;
    b->engine = e;
    b->capacity = capacity;
    pthread_mutex_init(&b->lock, NULL);
    ferry_cond_init_monotonic(&b->cond);
    *out = b;
    return 0;
}

int ferry_batch_free(ferry_batch_t *b)
{
    ferry_clear_last_error();
    if (!b) return 0;
    /* Looked up before b is read: a batch freed twice is never touched. */
    if (!live_remove(b))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "batch free: %p is not a live batch (freed twice?)",
                          (void *)b);
    pthread_mutex_lock(&b->lock);
    size_t pending = b->tasks_pending;
    pthread_mutex_unlock(&b->lock);
    if (pending) {
        live_add(b); /* it stays live; the set had room for it a moment ago */
        return ferry_fail(FERRY_ERR_BATCH_BUSY, "batch free: %zu task(s) still in flight (wait or cancel first)",
                          pending);
    }
    b->magic = BATCH_FREED;
    for (size_t i = 0; i < b->count; i++) free(b->reqs[i].detail);
    free(b->reqs);
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    free(b);
    return 0;
}
