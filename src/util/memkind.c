/* SPDX-License-Identifier: Apache-2.0 */
/* Memory kinds: detection at registration and the staging copies. Host
 * memory needs neither; CUDA lives in cuda_memory.c; the fake kind exists
 * for the tests, so that the staging paths of the transports run for real
 * in every build, GPU or not. */
#include "memkind.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fail.h"

/* ------------------------------------------------------------ fake kind */

#define FAKE_MAX 16

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t base;
    size_t len;
    unsigned char *alias;
} fakes[FAKE_MAX];
static _Atomic int nfakes; /* read without the lock first: 0 in production */
static _Atomic unsigned long fake_to_host, fake_from_host;

int ferry_memkind_fake_add(void *base, size_t len, void *alias)
{
    if (!base || !alias || len == 0) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "fake memkind: NULL or empty");
    pthread_mutex_lock(&fake_lock);
    int n = atomic_load(&nfakes);
    if (n == FAKE_MAX) {
        pthread_mutex_unlock(&fake_lock);
        return ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS, "fake memkind: at most %d ranges", FAKE_MAX);
    }
    fakes[n].base = (uintptr_t)base;
    fakes[n].len = len;
    fakes[n].alias = alias;
    atomic_store(&nfakes, n + 1);
    pthread_mutex_unlock(&fake_lock);
    return 0;
}

void ferry_memkind_fake_remove(void *base)
{
    pthread_mutex_lock(&fake_lock);
    int n = atomic_load(&nfakes);
    for (int i = 0; i < n; i++) {
        if (fakes[i].base == (uintptr_t)base) {
            fakes[i] = fakes[n - 1];
            atomic_store(&nfakes, n - 1);
            break;
        }
    }
    pthread_mutex_unlock(&fake_lock);
}

void ferry_memkind_fake_clear(void)
{
    pthread_mutex_lock(&fake_lock);
    atomic_store(&nfakes, 0);
    pthread_mutex_unlock(&fake_lock);
}

void ferry_memkind_fake_counts(unsigned long *to_host, unsigned long *from_host)
{
    *to_host = atomic_load(&fake_to_host);
    *from_host = atomic_load(&fake_from_host);
}

/* Index of the fake range holding addr (and, if whole, all n bytes), or -1;
 * -2 when the range starts inside one but does not fit. */
static int fake_find(uintptr_t addr, size_t n)
{
    if (atomic_load(&nfakes) == 0) return -1;
    int found = -1;
    pthread_mutex_lock(&fake_lock);
    for (int i = 0; i < atomic_load(&nfakes); i++) {
        if (addr >= fakes[i].base && addr - fakes[i].base < fakes[i].len) {
            found = n <= fakes[i].len - (addr - fakes[i].base) ? i : -2;
            break;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    return found;
}

static int fake_copy(void *dst, const void *src, size_t n, int to_host)
{
    uintptr_t dev = (uintptr_t)(to_host ? src : dst);
    int i = fake_find(dev, n);
    if (i < 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "fake device copy: [0x%llx+%zu) is not fake device memory",
                          (unsigned long long)dev, n);
    unsigned char *alias = fakes[i].alias + (dev - fakes[i].base);
    if (to_host) {
        memcpy(dst, alias, n);
        atomic_fetch_add(&fake_to_host, 1);
    } else {
        memcpy(alias, src, n);
        atomic_fetch_add(&fake_from_host, 1);
    }
    return 0;
}

/* ------------------------------------------------------------ interface */

int ferry_memkind_detect(const void *addr, size_t len, uint32_t *kind)
{
    *kind = FERRY_MEMKIND_HOST;
    int i = fake_find((uintptr_t)addr, len);
    if (i == -2)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: [%p+%zu) runs past the end of its fake device range",
                          addr, len);
    if (i >= 0) {
        *kind = FERRY_MEMKIND_MAKE(FERRY_MEMKIND_FAKE, i);
        return 0;
    }
#ifdef FERRY_HAVE_CUDA
    return ferry_cuda_detect(addr, len, kind);
#else
    return 0;
#endif
}

static int copy(uint32_t kind, void *dst, const void *src, size_t n, int to_host)
{
    switch (FERRY_MEMKIND_TYPE(kind)) {
    case FERRY_MEMKIND_HOST:
        memcpy(dst, src, n);
        return 0;
    case FERRY_MEMKIND_FAKE:
        return fake_copy(dst, src, n, to_host);
#ifdef FERRY_HAVE_CUDA
    case FERRY_MEMKIND_CUDA:
        return ferry_cuda_copy(kind, dst, src, n, to_host);
#endif
    default:
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "memory kind %u is not supported by this build", kind);
    }
}

int ferry_memkind_to_host(uint32_t kind, void *dst, const void *src, size_t n) { return copy(kind, dst, src, n, 1); }
int ferry_memkind_from_host(uint32_t kind, void *dst, const void *src, size_t n) { return copy(kind, dst, src, n, 0); }

const char *ferry_memkind_name(uint32_t kind, char *buf, size_t cap)
{
    switch (FERRY_MEMKIND_TYPE(kind)) {
    case FERRY_MEMKIND_HOST: snprintf(buf, cap, "host"); break;
    case FERRY_MEMKIND_CUDA: snprintf(buf, cap, "cuda:%d", FERRY_MEMKIND_DEVICE(kind)); break;
    case FERRY_MEMKIND_FAKE: snprintf(buf, cap, "fake:%d", FERRY_MEMKIND_DEVICE(kind)); break;
    default: snprintf(buf, cap, "kind-%u", kind); break;
    }
    return buf;
}

int ferry_memkind_device_usable(void)
{
#ifdef FERRY_HAVE_CUDA
    return ferry_cuda_usable();
#else
    return 0;
#endif
}

const char *ferry_memkind_status(void)
{
#ifdef FERRY_HAVE_CUDA
    return ferry_cuda_status();
#else
    return "CUDA not built in (configured with -DFERRY_WITH_CUDA=OFF); all memory is host memory";
#endif
}

/* ------------------------------------------- pinned, pipelined staging */

static _Atomic unsigned long total_take_prefetched, total_take_copied;
static _Atomic unsigned long total_land_queued, total_land_copied, total_land_overlapped;

void ferry_staging_totals(ferry_staging_totals_t *t)
{
    t->take_prefetched = atomic_load(&total_take_prefetched);
    t->take_copied = atomic_load(&total_take_copied);
    t->land_queued = atomic_load(&total_land_queued);
    t->land_copied = atomic_load(&total_land_copied);
    t->land_overlapped = atomic_load(&total_land_overlapped);
}

/* Two host buffers of one size, page-locked for CUDA memory when the
 * driver gives them (else malloc'd): the stager's and the lander's. */
struct buffer_pair {
    unsigned char *buf[2];
    void *pin_ctx[2]; /* CUDA: the buffer is page-locked (its device + 1), else NULL: malloc'd */
    size_t cap;       /* each buffer's size */
    bool pin_refused; /* the driver gave no page-locked buffer: pageable from then on */
};

static void pair_release(struct buffer_pair *p)
{
    for (int i = 0; i < 2; i++) {
#ifdef FERRY_HAVE_CUDA
        if (p->pin_ctx[i]) ferry_cuda_host_free(p->buf[i], p->pin_ctx[i]);
        else
#endif
            free(p->buf[i]);
        p->buf[i] = NULL;
        p->pin_ctx[i] = NULL;
    }
    p->cap = 0;
}

/* Whether the pair must be made again to serve n bytes of kind. */
static bool pair_unfit(const struct buffer_pair *p, uint32_t kind, size_t n)
{
    bool want_pinned = FERRY_MEMKIND_TYPE(kind) == FERRY_MEMKIND_CUDA && !p->pin_refused;
    return p->cap < n || (want_pinned && !p->pin_ctx[0]);
}

/* Both buffers hold at least n bytes, page-locked for CUDA memory when
 * the driver gives them. The caller has nothing in flight from them. */
static int pair_reserve(struct buffer_pair *p, uint32_t kind, size_t n)
{
    if (!pair_unfit(p, kind, n)) return 0;
#ifdef FERRY_HAVE_CUDA
    bool want_pinned = FERRY_MEMKIND_TYPE(kind) == FERRY_MEMKIND_CUDA && !p->pin_refused;
#endif
    size_t cap = n > p->cap ? n : p->cap;
    pair_release(p);
    for (int i = 0; i < 2; i++) {
#ifdef FERRY_HAVE_CUDA
        if (want_pinned && ferry_cuda_host_alloc(FERRY_MEMKIND_DEVICE(kind), cap, (void **)&p->buf[i],
                                                 &p->pin_ctx[i]) == 0)
            continue;
        if (want_pinned) {
            p->pin_refused = true; /* not asked again at every take */
            want_pinned = false;
            ferry_clear_last_error();
        }
#endif
        p->buf[i] = malloc(cap);
        if (!p->buf[i]) {
            pair_release(p);
            return ferry_fail(FERRY_ERR_MEMORY, "staging buffers of %zu bytes: out of memory", cap);
        }
    }
    p->cap = cap;
    return 0;
}

struct ferry_stage {
    struct buffer_pair b;
    int last;              /* the buffer the last take gave, -1 none */
    /* the prefetch in flight, into buf[1 - last] */
    bool pending;
    uint32_t pkind;
    const void *psrc;
    size_t pn;
    void *stream, *stream_ctx; /* CUDA: the stager's stream */
    unsigned long prefetched, copied;
};

ferry_stage_t *ferry_stage_new(void)
{
    ferry_stage_t *s = calloc(1, sizeof *s);
    if (s) s->last = -1;
    return s;
}

/* Waits for the prefetch in flight, if any: 0 or its failure. */
static int stage_settle(ferry_stage_t *s)
{
    if (!s->pending) return 0;
    s->pending = false;
#ifdef FERRY_HAVE_CUDA
    return ferry_cuda_stream_wait(s->stream, s->stream_ctx);
#else
    return 0;
#endif
}

void ferry_stage_settle(ferry_stage_t *s)
{
    if (stage_settle(s)) ferry_clear_last_error(); /* its bytes are not wanted */
}

void ferry_stage_free(ferry_stage_t *s)
{
    if (!s) return;
    stage_settle(s);
#ifdef FERRY_HAVE_CUDA
    ferry_cuda_stream_free(s->stream, s->stream_ctx);
#endif
    pair_release(&s->b);
    free(s);
}

int ferry_stage_take(ferry_stage_t *s, uint32_t kind, const void *src, size_t n, unsigned char **out)
{
    int next = s->last < 0 ? 0 : 1 - s->last;
    if (s->pending && s->pkind == kind && s->psrc == src && s->pn == n) {
        int rc = stage_settle(s);
        if (rc == 0) {
            s->last = next;
            s->prefetched++;
            atomic_fetch_add_explicit(&total_take_prefetched, 1, memory_order_relaxed);
            *out = s->b.buf[next];
            return 0;
        }
        ferry_clear_last_error(); /* copied again below, which says why if it fails too */
    }
    stage_settle(s); /* a prefetch of something else: its bytes are not wanted */
    int rc = pair_reserve(&s->b, kind, n);
    if (rc == 0) rc = ferry_memkind_to_host(kind, s->b.buf[next], src, n);
    if (rc) return rc;
    s->last = next;
    s->copied++;
    atomic_fetch_add_explicit(&total_take_copied, 1, memory_order_relaxed);
    *out = s->b.buf[next];
    return 0;
}

void ferry_stage_prefetch(ferry_stage_t *s, uint32_t kind, const void *src, size_t n)
{
#ifdef FERRY_HAVE_CUDA
    if (FERRY_MEMKIND_TYPE(kind) != FERRY_MEMKIND_CUDA || n == 0 || stage_settle(s) != 0) return;
    if (n > s->b.cap) return; /* the buffers are sized by the takes: a larger one is copied at its take */
    int next = s->last < 0 ? 0 : 1 - s->last;
    if (!s->b.pin_ctx[next]) return; /* pageable: an asynchronous copy would not overlap anything */
    if (ferry_cuda_copy_async(kind, s->b.buf[next], src, n, 1, &s->stream, &s->stream_ctx) != 0) {
        ferry_clear_last_error();
        return;
    }
    s->pending = true;
    s->pkind = kind;
    s->psrc = src;
    s->pn = n;
#else
    (void)s, (void)kind, (void)src, (void)n;
#endif
}

void ferry_stage_counts(const ferry_stage_t *s, unsigned long *prefetched, unsigned long *copied)
{
    *prefetched = s->prefetched;
    *copied = s->copied;
}

/* ------------------------------------------- pinned, pipelined landing */

struct ferry_land {
    struct buffer_pair b;
    int cur;      /* the buffer given and not yet put, -1 none */
    int last_put; /* the buffer of the last put, -1 none */
    bool pending[2];                   /* a copy from buf[i] is in flight */
    void *stream[2], *stream_ctx[2];   /* CUDA: buf[i]'s stream */
    int failed;                        /* the first failed copy since the last finish, 0 none */
    char why[256];                     /* its detail */
    unsigned long queued, copied, overlapped;
};

ferry_land_t *ferry_land_new(void)
{
    ferry_land_t *l = calloc(1, sizeof *l);
    if (l) l->cur = l->last_put = -1;
    return l;
}

/* Waits for buf[i]'s copy, if one is in flight (only CUDA's are); its
 * failure, the first since the last finish, is kept for the finish. */
static void land_wait(ferry_land_t *l, int i)
{
    if (!l->pending[i]) return;
    l->pending[i] = false;
#ifdef FERRY_HAVE_CUDA
    int rc = ferry_cuda_stream_wait(l->stream[i], l->stream_ctx[i]);
    if (rc && !l->failed) {
        l->failed = rc;
        snprintf(l->why, sizeof l->why, "%s", ferry_fail_message());
    }
#endif
}

void ferry_land_free(ferry_land_t *l)
{
    if (!l) return;
    ferry_land_settle(l);
#ifdef FERRY_HAVE_CUDA
    for (int i = 0; i < 2; i++) ferry_cuda_stream_free(l->stream[i], l->stream_ctx[i]);
#endif
    pair_release(&l->b);
    free(l);
}

int ferry_land_buffer(ferry_land_t *l, uint32_t kind, size_t n, unsigned char **out)
{
    if (l->cur >= 0 && n <= l->b.cap) {
        *out = l->b.buf[l->cur];
        return 0;
    }
    if (l->cur >= 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "landing: %zu bytes asked of a buffer of %zu being filled", n,
                          l->b.cap);
    int next = l->last_put < 0 ? 0 : 1 - l->last_put;
    land_wait(l, next);
    if (pair_unfit(&l->b, kind, n)) {
        land_wait(l, 1 - next); /* the buffers are made again: nothing may read them */
        int rc = pair_reserve(&l->b, kind, n);
        if (rc) return rc;
    }
    if (l->pending[1 - next]) {
        l->overlapped++; /* this buffer fills while the other one's copy runs */
        atomic_fetch_add_explicit(&total_land_overlapped, 1, memory_order_relaxed);
    }
    l->cur = next;
    *out = l->b.buf[next];
    return 0;
}

/* Copies n bytes at off of buffer b into dev (to_host: from dev into the
 * buffer): queued on b's stream when it is pinned and the memory CUDA's,
 * else done now. */
static int land_copy(ferry_land_t *l, int b, uint32_t kind, void *dev, size_t off, size_t n, int to_host)
{
    unsigned char *host = l->b.buf[b] + off;
#ifdef FERRY_HAVE_CUDA
    /* Pinned: asynchronous on the buffer's own stream (from pageable
     * memory the driver would stage it synchronously anyway). */
    if (FERRY_MEMKIND_TYPE(kind) == FERRY_MEMKIND_CUDA && l->b.pin_ctx[b]) {
        void *dst = to_host ? (void *)host : dev;
        const void *src = to_host ? (const void *)dev : host;
        if (ferry_cuda_copy_async(kind, dst, src, n, to_host, &l->stream[b], &l->stream_ctx[b]) == 0) {
            l->pending[b] = true;
            l->queued++;
            atomic_fetch_add_explicit(&total_land_queued, 1, memory_order_relaxed);
            return 0;
        }
        ferry_clear_last_error(); /* copied below, which says why if it fails too */
    }
#endif
    l->copied++;
    atomic_fetch_add_explicit(&total_land_copied, 1, memory_order_relaxed);
    return to_host ? ferry_memkind_to_host(kind, host, dev, n) : ferry_memkind_from_host(kind, dev, host, n);
}

int ferry_land_put(ferry_land_t *l, uint32_t kind, void *dst, size_t n)
{
    if (l->cur < 0 || n > l->b.cap)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "landing: put of %zu bytes without a buffer that holds them",
                          n);
    int b = l->cur;
    l->cur = -1;
    l->last_put = b;
    return land_copy(l, b, kind, dst, 0, n, 0);
}

int ferry_land_put_part(ferry_land_t *l, uint32_t kind, void *dst, size_t off, size_t n)
{
    if (l->cur < 0 || off > l->b.cap || n > l->b.cap - off)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "landing: put of [%zu+%zu) outside the buffer being filled",
                          off, n);
    l->last_put = l->cur;
    return land_copy(l, l->cur, kind, dst, off, n, 0);
}

int ferry_land_get_part(ferry_land_t *l, uint32_t kind, const void *src, size_t off, size_t n)
{
    if (l->cur < 0 || off > l->b.cap || n > l->b.cap - off)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "landing: get of [%zu+%zu) outside the buffer being filled",
                          off, n);
    l->last_put = l->cur;
    return land_copy(l, l->cur, kind, (void *)(uintptr_t)src, off, n, 1);
}

unsigned char *ferry_land_current(const ferry_land_t *l) { return l->cur < 0 ? NULL : l->b.buf[l->cur]; }

void ferry_land_drop(ferry_land_t *l) { l->cur = -1; }

int ferry_land_finish(ferry_land_t *l)
{
    land_wait(l, 0);
    land_wait(l, 1);
    int rc = l->failed;
    l->failed = 0;
    if (rc) return ferry_fail(rc, "%s", l->why);
    return 0;
}

void ferry_land_settle(ferry_land_t *l)
{
    if (ferry_land_finish(l)) ferry_clear_last_error(); /* the receiver's own failure says why */
    l->cur = -1;
}

void ferry_land_counts(const ferry_land_t *l, unsigned long *queued, unsigned long *copied, unsigned long *overlapped)
{
    *queued = l->queued;
    *copied = l->copied;
    *overlapped = l->overlapped;
}
