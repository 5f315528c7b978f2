/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry demo`: shape, memory, the reference pattern and its checks, and
 * the line plumbing between the processes. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "demo.h"

/* ------------------------------------------------------------- shape */

void demo_shape_derive(struct demo_shape *s)
{
    s->max_pages = (s->tokens_max + s->page - 1) / s->page;
    uint32_t slack = s->max_pages / 4 > 4 ? s->max_pages / 4 : 4;
    /* Prefill frees a request's pages once sent: the window suffices.
     * Decode also keeps the last verified request resident, to check that
     * the next transfer leaves it alone. The slack lets the free lists mix. */
    s->prefill_pool = s->max_pages * s->inflight + slack;
    s->decode_pool = s->max_pages * (s->inflight + 1) + slack;
}

ferry_kv_cache_desc_t demo_desc(const struct demo_shape *s, int decode, uint32_t rank,
                                const uint64_t *k_addrs, const uint64_t *v_addrs)
{
    uint32_t tp = decode ? s->decode_tp : s->prefill_tp, first = 0, count = 0;
    ferry_kv_rank_heads(s->heads, tp, rank, &first, &count);
    if (s->mla) /* the latent row is never split: every rank holds it whole */
        return (ferry_kv_cache_desc_t){.kind = FERRY_KV_MLA, .num_layers = s->layers,
                                       .num_pages = decode ? s->decode_pool : s->prefill_pool,
                                       .page_size = s->page, .mla_row_bytes = s->heads * s->head_dim * s->dtype,
                                       .tp_rank = rank, .tp_size = tp, .k_addrs = k_addrs};
    return (ferry_kv_cache_desc_t){.kind = FERRY_KV_SPLIT, .num_layers = s->layers,
                                   .num_pages = decode ? s->decode_pool : s->prefill_pool,
                                   .page_size = s->page, .kv_heads = count,
                                   .total_kv_heads = s->heads, .head_dim = s->head_dim,
                                   .dtype_size = s->dtype, .tp_rank = rank, .tp_size = tp,
                                   .k_addrs = k_addrs, .v_addrs = v_addrs};
}

uint64_t demo_pool_bytes(const struct demo_shape *s, int decode, uint32_t rank)
{
    ferry_kv_cache_desc_t d = demo_desc(s, decode, rank, NULL, NULL);
    return ferry_kv_page_bytes(&d) * d.num_pages * demo_buffers(s) * s->layers;
}

int demo_staging_need(const struct demo_shape *s, uint32_t prank, uint32_t drank,
                      uint64_t *src_bytes, uint64_t *dst_bytes)
{
    int32_t *pages = malloc(s->max_pages * sizeof *pages);
    if (!pages) return FERRY_ERR_MEMORY;
    for (uint32_t i = 0; i < s->max_pages; i++) pages[i] = (int32_t)i;
    ferry_kv_cache_desc_t src = demo_desc(s, 0, prank, NULL, NULL);
    ferry_kv_cache_desc_t dst = demo_desc(s, 1, drank, NULL, NULL);
    ferry_kv_plan_t *p = NULL;
    int rc = ferry_kv_plan_create(&src, &dst, pages, pages, s->max_pages, &p);
    free(pages);
    if (rc != 0) return rc;
    ferry_kv_plan_info_t in;
    ferry_kv_plan_get_info(p, &in);
    *src_bytes = in.src_staging_bytes;
    *dst_bytes = in.dst_staging_bytes;
    ferry_kv_plan_destroy(p);
    return 0;
}

/* ------------------------------------------------------------ memory */

void *demo_map(size_t len)
{
    void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    /* Pools of GBs touched once in 4 KiB faults cost seconds of system time
     * on the demo's default shape; huge pages, where the kernel has them,
     * cut that by two orders. Only a hint: failure changes nothing. */
    madvise(p, len ? len : 1, MADV_HUGEPAGE);
#endif
    return p;
}

void demo_unmap(void *p, size_t len)
{
    if (p) munmap(p, len ? len : 1);
}

int demo_pool_create(struct demo_pool *p, const struct demo_shape *s, int decode, uint32_t rank,
                     ferry_engine_t *e, unsigned flags, int fill)
{
    memset(p, 0, sizeof *p);
    p->k_addrs = calloc(s->layers, sizeof *p->k_addrs);
    p->v_addrs = calloc(s->layers, sizeof *p->v_addrs);
    if (!p->k_addrs || !p->v_addrs) {
        fprintf(stderr, "ferry demo: out of memory for %u layer addresses\n", s->layers);
        return FERRY_ERR_MEMORY;
    }
    p->desc = demo_desc(s, decode, rank, p->k_addrs, p->v_addrs);
    uint32_t tp = decode ? s->decode_tp : s->prefill_tp;
    int rc = ferry_kv_rank_heads(s->heads, tp, rank, &p->first_head, &p->heads);
    if (rc != 0) return rc;
    p->row_bytes = ferry_kv_token_bytes(&p->desc);
    p->page_bytes = ferry_kv_page_bytes(&p->desc);
    p->buffer_bytes = p->page_bytes * p->desc.num_pages;
    for (uint32_t l = 0; l < s->layers; l++) {
        for (uint32_t b = 0; b < demo_buffers(s); b++) {
            void *m = demo_map(p->buffer_bytes);
            if (!m) {
                char text[160];
                snprintf(text, sizeof text, "mapping layer %u %s buffer of %llu bytes: %s", l,
                         b ? "V" : "K", (unsigned long long)p->buffer_bytes, strerror(errno));
                fprintf(stderr, "ferry demo: %s\n", text);
                return FERRY_ERR_MEMORY;
            }
            if (fill >= 0) memset(m, fill, p->buffer_bytes);
            (b ? p->v_addrs : p->k_addrs)[l] = (uint64_t)(uintptr_t)m;
            rc = ferry_register(e, m, p->buffer_bytes, flags);
            if (rc != 0) return rc;
        }
    }
    return 0;
}

void demo_pool_destroy(struct demo_pool *p, ferry_engine_t *e)
{
    for (uint32_t l = 0; p->k_addrs && p->v_addrs && l < p->desc.num_layers; l++) {
        for (uint32_t b = 0; b < ferry_kv_buffers_per_layer(&p->desc); b++) {
            uint64_t a = (b ? p->v_addrs : p->k_addrs)[l];
            if (!a) continue;
            if (e) ferry_deregister(e, (void *)(uintptr_t)a);
            demo_unmap((void *)(uintptr_t)a, p->buffer_bytes);
        }
    }
    free(p->k_addrs);
    free(p->v_addrs);
    memset(p, 0, sizeof *p);
}

/* ----------------------------------------------------------- pattern */


/* splitmix64's finaliser: a bijection that mixes every input bit. */
static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

#define GOLDEN 0x9E3779B97F4A7C15ull

/* One (request, layer, buffer) stream; a row of one token and head starts
 * at mix64(prefix + token * heads + head) and its 8-byte words step by the
 * golden ratio, so every element of a row differs from its neighbours and
 * every row from every other. One mix per row keeps the fill at memory
 * speed: the demo fills and checks a few GB. */
static uint64_t stream_prefix(uint64_t seed, uint32_t req, uint32_t layer, uint32_t buf)
{
    return mix64(mix64(mix64(seed ^ 0x6665727279ull) ^ req) ^ ((uint64_t)layer * 2 + buf));
}

static inline void row_fill(unsigned char *dst, uint64_t w, size_t n)
{
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        w += GOLDEN;
        memcpy(dst + j, &w, 8);
    }
    if (j < n) {
        w += GOLDEN;
        memcpy(dst + j, &w, n - j);
    }
}

/* 1 when the row matches. */
static inline int row_same(const unsigned char *src, uint64_t w, size_t n)
{
    size_t j = 0;
    uint64_t diff = 0;
    for (; j + 8 <= n; j += 8) {
        uint64_t got;
        w += GOLDEN;
        memcpy(&got, src + j, 8);
        diff |= got ^ w;
    }
    if (j < n) {
        uint64_t got = 0, want = 0;
        w += GOLDEN;
        memcpy(&got, src + j, n - j);
        memcpy(&want, &w, n - j);
        diff |= got ^ want;
    }
    return diff == 0;
}

void demo_fill_request(const struct demo_shape *s, const struct demo_pool *p, uint32_t req,
                       const int32_t *pages, uint32_t npages)
{
    size_t hb = (size_t)s->head_dim * s->dtype;
    for (uint32_t l = 0; l < s->layers; l++) {
        for (uint32_t b = 0; b < demo_buffers(s); b++) {
            uint64_t prefix = stream_prefix(s->seed, req, l, b);
            for (uint32_t i = 0; i < npages; i++) {
                unsigned char *page = demo_pool_page(p, l, b, pages[i]);
                for (uint32_t t = 0; t < s->page; t++) {
                    uint64_t tok = (uint64_t)i * s->page + t;
                    unsigned char *row = page + t * p->row_bytes;
                    for (uint32_t h = 0; h < p->heads; h++)
                        row_fill(row + h * hb, mix64(prefix + tok * s->heads + p->first_head + h), hb);
                }
            }
        }
    }
}

static void note_row(struct demo_mismatch *mm, const unsigned char *got, uint64_t w, size_t n,
                     uint32_t l, uint32_t b, uint32_t pos, int32_t page, uint32_t token,
                     uint32_t head)
{
    unsigned char want[64];
    for (size_t off = 0; off < n; off += sizeof want) {
        size_t len = n - off < sizeof want ? n - off : sizeof want;
        /* The words of this chunk: w advanced by off / 8 steps. */
        unsigned char tmp[sizeof want + 8];
        row_fill(tmp, w + (uint64_t)(off / 8) * GOLDEN, len);
        memcpy(want, tmp, len);
        for (size_t k = 0; k < len; k++) {
            if (want[k] == got[off + k]) continue;
            if (!mm->found) {
                mm->found = 1;
                mm->layer = l;
                mm->buf = b;
                mm->pos = pos;
                mm->page = page;
                mm->token = token;
                mm->head = head;
                mm->byte = (uint32_t)(off + k);
                mm->expected = want[k];
                mm->got = got[off + k];
            }
            mm->bytes++;
        }
    }
}

uint64_t demo_check_request(const struct demo_shape *s, const struct demo_pool *p, uint32_t req,
                            const int32_t *pages, uint32_t npages, struct demo_mismatch *mm)
{
    size_t hb = (size_t)s->head_dim * s->dtype;
    uint64_t checked = 0;
    CROSS_PROCESS_BEGIN();
    for (uint32_t l = 0; l < s->layers; l++) {
        for (uint32_t b = 0; b < demo_buffers(s); b++) {
            uint64_t prefix = stream_prefix(s->seed, req, l, b);
            for (uint32_t i = 0; i < npages; i++) {
                const unsigned char *page = demo_pool_page(p, l, b, pages[i]);
                for (uint32_t t = 0; t < s->page; t++) {
                    uint64_t tok = (uint64_t)i * s->page + t;
                    const unsigned char *row = page + t * p->row_bytes;
                    for (uint32_t h = 0; h < p->heads; h++) {
                        uint64_t w = mix64(prefix + tok * s->heads + p->first_head + h);
                        if (!row_same(row + h * hb, w, hb))
                            note_row(mm, row + h * hb, w, hb, l, b, i, pages[i], (uint32_t)tok,
                                     p->first_head + h);
                    }
                }
                checked += p->page_bytes;
            }
        }
    }
    CROSS_PROCESS_END();
    return checked;
}

uint64_t demo_check_canary(const struct demo_pool *p, const int32_t *pages, uint32_t npages,
                           struct demo_mismatch *mm)
{
    uint64_t checked = 0, want;
    memset(&want, DEMO_CANARY, sizeof want);
    CROSS_PROCESS_BEGIN();
    for (uint32_t l = 0; l < p->desc.num_layers; l++) {
        for (uint32_t b = 0; b < ferry_kv_buffers_per_layer(&p->desc); b++) {
            for (uint32_t i = 0; i < npages; i++) {
                const unsigned char *page = demo_pool_page(p, l, b, pages[i]);
                uint64_t diff = 0, j = 0;
                for (; j + 8 <= p->page_bytes; j += 8) {
                    uint64_t got;
                    memcpy(&got, page + j, 8);
                    diff |= got ^ want;
                }
                for (; j < p->page_bytes; j++) diff |= page[j] ^ DEMO_CANARY;
                checked += p->page_bytes;
                if (diff == 0) continue;
                for (uint64_t k = 0; k < p->page_bytes; k++) {
                    if (page[k] == DEMO_CANARY) continue;
                    if (!mm->found) {
                        mm->found = 1;
                        mm->layer = l;
                        mm->buf = b;
                        mm->pos = i;
                        mm->page = pages[i];
                        mm->token = (uint32_t)(k / p->row_bytes);
                        mm->head = UINT32_MAX; /* not a request's row */
                        mm->byte = (uint32_t)k;
                        mm->expected = DEMO_CANARY;
                        mm->got = page[k];
                    }
                    mm->bytes++;
                }
            }
        }
    }
    CROSS_PROCESS_END();
    return checked;
}

void demo_fill_canary(const struct demo_pool *p, const int32_t *pages, uint32_t npages)
{
    CROSS_PROCESS_BEGIN();
    for (uint32_t l = 0; l < p->desc.num_layers; l++)
        for (uint32_t b = 0; b < ferry_kv_buffers_per_layer(&p->desc); b++)
            for (uint32_t i = 0; i < npages; i++)
                memset(demo_pool_page(p, l, b, pages[i]), DEMO_CANARY, p->page_bytes);
    CROSS_PROCESS_END();
}

void demo_mismatch_text(const struct demo_mismatch *mm, char *out, size_t cap)
{
    if (mm->head == UINT32_MAX) {
        snprintf(out, cap,
                 "layer %u %s page %d, byte %u of the page (token row %u): expected 0x%02x "
                 "(free-page canary), got 0x%02x; %llu bytes differ",
                 mm->layer, mm->buf ? "V" : "K", mm->page, mm->byte, mm->token, mm->expected,
                 mm->got, (unsigned long long)mm->bytes);
        return;
    }
    snprintf(out, cap,
             "layer %u %s page %d (position %u in the request's page list), token %u, head %u, "
             "byte %u of the head: expected 0x%02x, got 0x%02x; %llu bytes differ",
             mm->layer, mm->buf ? "V" : "K", mm->page, mm->pos, mm->token, mm->head, mm->byte,
             mm->expected, mm->got, (unsigned long long)mm->bytes);
}

/* ---------------------------------------------------------- plumbing */

uint64_t demo_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void str_reserve(struct demo_str *b, size_t more)
{
    if (b->len + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
        fprintf(stderr, "ferry demo: out of memory (a %zu-byte message)\n", cap);
        exit(1);
    }
    b->s = s;
    b->cap = cap;
}

void demo_str_printf(struct demo_str *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    str_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void demo_str_pages(struct demo_str *b, const int32_t *pages, uint32_t n)
{
    str_reserve(b, (size_t)n * 12);
    for (uint32_t i = 0; i < n; i++) b->len += (size_t)sprintf(b->s + b->len, " %d", pages[i]);
}

void demo_str_free(struct demo_str *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

int demo_lines_next(struct demo_lines *l, char **line)
{
    char *nl = l->len ? memchr(l->buf + l->start, '\n', l->len) : NULL;
    if (!nl) return 0;
    *nl = '\0';
    *line = l->buf + l->start;
    size_t used = (size_t)(nl - (l->buf + l->start)) + 1;
    l->start += used;
    l->len -= used;
    return 1;
}

ssize_t demo_lines_fill(struct demo_lines *l)
{
    if (l->start && (l->len == 0 || l->start > l->cap / 2)) {
        memmove(l->buf, l->buf + l->start, l->len);
        l->start = 0;
    }
    if (l->cap - l->start - l->len < 4096) {
        size_t cap = l->cap ? l->cap * 2 : 65536;
        char *b = realloc(l->buf, cap);
        if (!b) {
            errno = ENOMEM;
            return -1;
        }
        l->buf = b;
        l->cap = cap;
    }
    for (;;) {
        ssize_t n = read(l->fd, l->buf + l->start + l->len, l->cap - l->start - l->len - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n > 0) l->len += (size_t)n;
        return n;
    }
}

int demo_lines_read(struct demo_lines *l, char **line)
{
    for (;;) {
        if (demo_lines_next(l, line)) return 1;
        ssize_t n = demo_lines_fill(l);
        if (n == 0) return 0;
        if (n < 0) return -1;
    }
}

void demo_lines_free(struct demo_lines *l)
{
    free(l->buf);
    l->buf = NULL;
    l->start = l->len = l->cap = 0;
}

int demo_write_all(int fd, const char *buf, size_t len, int timeout_ms)
{
    uint64_t deadline = timeout_ms < 0 ? 0 : demo_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (len) {
        ssize_t n = write(fd, buf, len);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN) return -1;
        int wait_ms = -1;
        if (timeout_ms >= 0) {
            uint64_t now = demo_now_ns();
            if (now >= deadline) {
                errno = ETIMEDOUT;
                return -1;
            }
            wait_ms = (int)((deadline - now) / 1000000ull) + 1;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, wait_ms) < 0 && errno != EINTR) return -1;
    }
    return 0;
}

char *demo_tok_next(struct demo_tok *t)
{
    while (t->p && *t->p == ' ') t->p++;
    if (!t->p || !*t->p) return NULL;
    char *start = t->p;
    while (*t->p && *t->p != ' ') t->p++;
    if (*t->p) *t->p++ = '\0';
    return start;
}

int demo_tok_u64(struct demo_tok *t, uint64_t *v)
{
    char *s = demo_tok_next(t), *end;
    if (!s) return -1;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 0);
    if (errno || *end || *s == '-') return -1;
    *v = x;
    return 0;
}

int demo_tok_u32(struct demo_tok *t, uint32_t *v)
{
    uint64_t x;
    if (demo_tok_u64(t, &x) != 0 || x > UINT32_MAX) return -1;
    *v = (uint32_t)x;
    return 0;
}

int demo_tok_i64(struct demo_tok *t, int64_t *v)
{
    char *s = demo_tok_next(t), *end;
    if (!s) return -1;
    errno = 0;
    long long x = strtoll(s, &end, 0);
    if (errno || *end) return -1;
    *v = x;
    return 0;
}

int32_t *demo_tok_pages(struct demo_tok *t, uint32_t n)
{
    int32_t *pages = malloc((n ? n : 1) * sizeof *pages);
    for (uint32_t i = 0; pages && i < n; i++) {
        int64_t v;
        if (demo_tok_i64(t, &v) != 0 || v < 0 || v > INT32_MAX) {
            free(pages);
            return NULL;
        }
        pages[i] = (int32_t)v;
    }
    return pages;
}

char *demo_tok_rest(struct demo_tok *t)
{
    while (t->p && *t->p == ' ') t->p++;
    return t->p ? t->p : (char *)"";
}

void demo_one_line(char *s)
{
    for (; *s; s++)
        if (*s == '\n' || *s == '\r' || *s == '\t') *s = ' ';
}
