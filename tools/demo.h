/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry demo`: pieces shared by the orchestrator (cmd_demo.c) and the
 * prefill and decode rank processes it forks (demo_ranks.c).
 *
 * The processes talk over pipes in lines of text (the side channel SGLang
 * calls the bootstrap server): engine names, buffer addresses, page lists.
 * KV bytes and completion notices go only through the Ferry engines. */
#ifndef FERRY_DEMO_H
#define FERRY_DEMO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <ferry/kv.h>

/* Fault injection, for the tests that show each failure is caught. */
enum demo_inject {
    DEMO_INJECT_NONE = 0,
    DEMO_INJECT_CORRUPT,      /* prefill rank 0 flips a byte of its KV before sending it */
    DEMO_INJECT_STRAY,        /* prefill rank 0 writes a page into another request's pages */
    DEMO_INJECT_KILL_PREFILL, /* prefill rank 0 dies (SIGKILL) while sending */
    DEMO_INJECT_KILL_DECODE,  /* decode rank 0 dies (SIGKILL) while receiving */
    DEMO_INJECT_FREEZE_PREFILL, /* prefill rank 0 stops (SIGSTOP) while sending */
    DEMO_INJECT_FREEZE_DECODE,  /* decode rank 0 stops (SIGSTOP) while receiving */
};

struct demo_shape {
    uint32_t layers, heads, head_dim, dtype, page;
    uint32_t requests, tokens_min, tokens_max;
    uint32_t prefill_tp, decode_tp;
    uint32_t inflight;   /* requests admitted at once */
    uint64_t seed;
    const char *transport;
    int timeout_ms;      /* engine deadline and the orchestrator's no-progress limit */
    int inject;          /* enum demo_inject */
    uint32_t inject_request;
    uint32_t mla;        /* --mla: one latent buffer per layer (FERRY_KV_MLA), rows of heads x head_dim */
    uint32_t overlap;    /* --overlap: the ranks' fill and checks may run while a transfer is timed */
    /* Derived by demo_shape_derive. */
    uint32_t max_pages;    /* pages of the longest possible request */
    uint32_t prefill_pool; /* pages in each prefill rank's pool */
    uint32_t decode_pool;  /* pages in each decode rank's pool */
};

void demo_shape_derive(struct demo_shape *s);
/* Buffers per layer: K and V, or the one MLA latent buffer. */
static inline uint32_t demo_buffers(const struct demo_shape *s) { return s->mla ? 1 : 2; }
/* The descriptor of one rank; addrs may be NULL (geometry only). */
ferry_kv_cache_desc_t demo_desc(const struct demo_shape *s, int decode, uint32_t rank,
                                const uint64_t *k_addrs, const uint64_t *v_addrs);
/* Staging needed for the pair (prefill prank -> decode drank) by a request of
 * max_pages: the sender's gather region and the decode rank's whole need. */
int demo_staging_need(const struct demo_shape *s, uint32_t prank, uint32_t drank,
                      uint64_t *src_bytes, uint64_t *dst_bytes);
/* Bytes one rank's pool occupies (all layers, K and V). */
uint64_t demo_pool_bytes(const struct demo_shape *s, int decode, uint32_t rank);

/* ------------------------------------------------------------ memory */

/* One rank's paged K and V buffers, one mapping per layer and buffer. */
struct demo_pool {
    ferry_kv_cache_desc_t desc;
    uint32_t first_head, heads; /* model heads this rank holds */
    uint64_t row_bytes;         /* one token of one buffer */
    uint64_t page_bytes;
    uint64_t buffer_bytes;      /* one layer's K (or V) buffer */
    uint64_t *k_addrs, *v_addrs;
};

/* Maps the buffers (fill byte, or no fill when fill < 0) and registers
 * them with flags. 0 or a Ferry code with the detail set. */
int demo_pool_create(struct demo_pool *p, const struct demo_shape *s, int decode, uint32_t rank,
                     ferry_engine_t *e, unsigned flags, int fill);
void demo_pool_destroy(struct demo_pool *p, ferry_engine_t *e);
static inline unsigned char *demo_pool_page(const struct demo_pool *p, uint32_t layer, uint32_t buf,
                                            int32_t page)
{
    uint64_t base = buf ? p->v_addrs[layer] : p->k_addrs[layer];
    return (unsigned char *)(uintptr_t)(base + (uint64_t)page * p->page_bytes);
}
void *demo_map(size_t len);
void demo_unmap(void *p, size_t len);

/* ----------------------------------------------------------- pattern */

/* The decode rank reads and rewrites its pages (and the KV layer its
 * staging) only at points that the protocol orders with the engine's
 * writes into them: after a request's notice (which the other process
 * sends only once every byte was acknowledged), and before the
 * orchestrator, told "armed" or "retired", lets another process write
 * there. ThreadSanitizer sees happens-before through a socket inside one
 * process but not through another process, so it would report each of
 * these as a race with the engine's recv. tests/tsan.supp hides those
 * reports, but a suppressed race is still detected and matched word by
 * word: with every word of every page racing, the serving threads crawl
 * and transfers hit their deadline. So under TSan these accesses, and only
 * these, are kept out of its bookkeeping; the engine's threads stay
 * checked. */
#if defined(__SANITIZE_THREAD__)
#define DEMO_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DEMO_TSAN 1
#endif
#endif
#ifdef DEMO_TSAN
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define CROSS_PROCESS_BEGIN() \
    (AnnotateIgnoreReadsBegin(__FILE__, __LINE__), AnnotateIgnoreWritesBegin(__FILE__, __LINE__))
#define CROSS_PROCESS_END() \
    (AnnotateIgnoreWritesEnd(__FILE__, __LINE__), AnnotateIgnoreReadsEnd(__FILE__, __LINE__))
#else
#define CROSS_PROCESS_BEGIN() ((void)0)
#define CROSS_PROCESS_END() ((void)0)
#endif


/* The reference content of request req: every byte of every (layer, K/V,
 * token, model head, element) derived from the seed. Tokens are positions
 * in the request (page list position * page size + token in page), so
 * both sides compute it from their own page lists. */
void demo_fill_request(const struct demo_shape *s, const struct demo_pool *p, uint32_t req,
                       const int32_t *pages, uint32_t npages);

#define DEMO_CANARY 0xEE /* what a free decode page holds */

struct demo_mismatch {
    uint64_t bytes;  /* mismatched bytes */
    int found;
    /* The first one. */
    uint32_t layer, buf, pos, token, head, byte;
    int32_t page;
    unsigned expected, got;
};

/* Compares the request's pages with the reference; returns bytes checked. */
uint64_t demo_check_request(const struct demo_shape *s, const struct demo_pool *p, uint32_t req,
                            const int32_t *pages, uint32_t npages, struct demo_mismatch *mm);
/* Checks that pages hold only DEMO_CANARY; returns bytes checked. mm->token
 * and head are left 0; byte is the offset in the page. */
uint64_t demo_check_canary(const struct demo_pool *p, const int32_t *pages, uint32_t npages,
                           struct demo_mismatch *mm);
void demo_fill_canary(const struct demo_pool *p, const int32_t *pages, uint32_t npages);
/* "layer 3 V page 117 (position 5 in the request's page list), token 83,
 * head 2, byte 17 of the head: expected 0x1f, got 0xe0; 4096 bytes differ" */
void demo_mismatch_text(const struct demo_mismatch *mm, char *out, size_t cap);

/* ---------------------------------------------------------- plumbing */

uint64_t demo_now_ns(void);

/* A growable string. */
struct demo_str {
    char *s;
    size_t len, cap;
};
void demo_str_printf(struct demo_str *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void demo_str_pages(struct demo_str *b, const int32_t *pages, uint32_t n);
void demo_str_free(struct demo_str *b);

/* Lines read from a pipe. */
struct demo_lines {
    int fd;
    char *buf;
    size_t start, len, cap;
};
/* 1 and *line (NUL-terminated, valid until the next call) when a whole line
 * is buffered, else 0. */
int demo_lines_next(struct demo_lines *l, char **line);
/* Reads what is available: bytes read, 0 at end of file, -1 on error
 * (errno; EAGAIN for a non-blocking pipe with nothing to read). */
ssize_t demo_lines_fill(struct demo_lines *l);
/* Blocking read of the next line: 1, 0 at end of file, -1 error. */
int demo_lines_read(struct demo_lines *l, char **line);
void demo_lines_free(struct demo_lines *l);

/* Writes all of buf, waiting at most timeout_ms (< 0: forever) for room.
 * 0, or -1 with errno (ETIMEDOUT, EPIPE, ...). */
int demo_write_all(int fd, const char *buf, size_t len, int timeout_ms);

/* Token parsing of one line: strtok-like over spaces. */
struct demo_tok {
    char *p;
};
char *demo_tok_next(struct demo_tok *t);
int demo_tok_u64(struct demo_tok *t, uint64_t *v);
int demo_tok_u32(struct demo_tok *t, uint32_t *v);
int demo_tok_i64(struct demo_tok *t, int64_t *v);
/* n page indices into a new array (NULL on a parse failure). */
int32_t *demo_tok_pages(struct demo_tok *t, uint32_t n);
/* The rest of the line after the tokens read so far. */
char *demo_tok_rest(struct demo_tok *t);

/* A line for the other side: newlines and tabs become spaces. */
void demo_one_line(char *s);

/* --------------------------------------------------------- the ranks */

struct demo_rank_args {
    const struct demo_shape *shape;
    uint32_t rank;
    int in_fd, out_fd; /* from and to the orchestrator */
};
/* Never return: exit 0 after a clean "quit", 1 after reporting an error. */
void demo_prefill_main(const struct demo_rank_args *a) __attribute__((noreturn));
void demo_decode_main(const struct demo_rank_args *a) __attribute__((noreturn));

/* Sends "error CODE detail" (the thread's Ferry detail when text is NULL)
 * and exits 1. */
void demo_rank_fail(int out_fd, int code, const char *text) __attribute__((noreturn));

#endif
