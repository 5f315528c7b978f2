/* SPDX-License-Identifier: Apache-2.0 */
/* Strided batches (ferry.h, "strided batches"): one descriptor for n pieces
 * at base + index * stride on both sides. The bounds are checked once per
 * descriptor (its smallest and largest index), then the pieces are made a
 * window at a time and run (below; async: batch_strided.c); the
 * vector frames describe them compactly again on the wire
 * (transport/vec.c). */
#include <stdlib.h>
#include <string.h>

#include "util/arith.h"
#include "batch.h"
#include "util/clock.h"
#include "parts.h"
#include "util/fail.h"
#include "link/registry.h"
#include "session.h"
#include "util/sized.h"

/* The first published layout of ferry_strided_t. */
#define FERRY_STRIDED_SIZE_MIN (offsetof(ferry_strided_t, n) + sizeof(size_t))

static uint64_t idx_at(const uint64_t *idx, size_t i) { return idx ? idx[i] : i; }

/* The smallest and largest index of n (n > 0). */
static void idx_range(const uint64_t *idx, size_t n, uint64_t *lo, uint64_t *hi)
{
    *lo = idx ? idx[0] : 0;
    *hi = idx ? idx[0] : n - 1;
    for (size_t i = 1; idx && i < n; i++) {
        if (idx[i] < *lo) *lo = idx[i];
        if (idx[i] > *hi) *hi = idx[i];
    }
}

/* base + idx * stride, with room for len bytes after it: false when it
 * overflows (or wraps) 64 bits. */
static bool piece_at(uint64_t base, uint64_t stride, uint64_t idx, uint64_t len, uint64_t *out)
{
    uint64_t off;
    return !__builtin_mul_overflow(idx, stride, &off) && !__builtin_add_overflow(base, off, out) &&
           *out + len >= *out;
}

/* Checks one side's span [base + lo*stride, base + hi*stride + len): no
 * address overflows (the largest index bounds all others). */
static int check_span(const char *side, uint64_t base, uint64_t stride, uint64_t hi, uint64_t len, size_t n)
{
    uint64_t a;
    if (!piece_at(base, stride, hi, len, &a))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "strided %s: index %llu at 0x%llx + %llu * %llu (+%llu bytes) overflows the address space "
                          "(%zu pieces)",
                          side, (unsigned long long)hi, (unsigned long long)base, (unsigned long long)hi,
                          (unsigned long long)stride, (unsigned long long)len, n);
    return 0;
}

/* The local pieces must lie in memory registered with e: one lookup when
 * the whole span lies in one region, else one per run of pieces in the
 * same region. The refused piece is named by number, index and address. */
static int check_local(ferry_engine_t *e, const ferry_strided_t *d, uint64_t lo, uint64_t hi)
{
    ferry_registry_t *r = ferry_engine_part_registry(e);
    uint64_t base = (uint64_t)(uintptr_t)d->local_base, first = base + lo * d->local_stride;
    uint64_t end = base + hi * d->local_stride + d->piece_len;
    int rc = 0;
    ferry_registry_read_lock(r);
    if (!ferry_registry_lookup_locked(r, first, end - first)) {
        const ferry_region_t *reg = NULL;
        for (size_t i = 0; i < d->n && rc == 0; i++) {
            uint64_t k = idx_at(d->local_idx, i), a = base + k * d->local_stride;
            if (reg && a >= reg->addr && a - reg->addr <= reg->len && d->piece_len <= reg->len - (a - reg->addr))
                continue;
            rc = ferry_registry_check_locked(r, a, d->piece_len, 0, 0, "local");
            if (rc)
                ferry_fail_context("strided piece %zu of %zu (local index %llu at 0x%llx): the local buffer must be "
                                   "registered with this engine",
                                   i, d->n, (unsigned long long)k, (unsigned long long)a);
            reg = rc ? NULL : ferry_registry_lookup_locked(r, a, d->piece_len);
        }
    }
    ferry_registry_unlock(r);
    return rc;
}

/* The remote pieces must lie in the peer's segments with the access asked:
 * checked before any byte moves, one lookup when the whole span lies in
 * the segment of the lowest piece, else one per run of pieces in one
 * segment (the first use of a session fetches the peer's table, a miss
 * fetches it again once, as for any request). A piece outside fails the
 * whole descriptor, named by number, index and address. */
static int check_remote(ferry_engine_t *e, const char *peer, const ferry_strided_t *d, uint64_t lo, uint64_t hi)
{
    ferry_session_t *s;
    int rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    uint64_t deadline = ferry_deadline_after_ms(ferry_engine_part_config(e)->timeout_ms);
    uint64_t first = d->remote_base + lo * d->remote_stride, end = d->remote_base + hi * d->remote_stride + d->piece_len;
    uint32_t gen;
    ferry_segment_t run = {0};
    rc = ferry_session_resolve(s, d->opcode, first, d->piece_len, &gen, deadline);
    bool have = rc == 0 && ferry_session_segment_of(s, first, &run);
    if (have && end <= run.addr + run.len) { /* the whole span: done */
        ferry_session_put(s);
        return 0;
    }
    rc = 0; /* the loop finds the first piece refused, in order, and names it */
    for (size_t i = 0; rc == 0 && i < d->n; i++) {
        uint64_t k = idx_at(d->remote_idx, i), a = d->remote_base + k * d->remote_stride;
        if (have && a >= run.addr && a - run.addr <= run.len && d->piece_len <= run.len - (a - run.addr)) continue;
        rc = ferry_session_resolve(s, d->opcode, a, d->piece_len, &gen, deadline);
        if (rc)
            ferry_fail_context("strided piece %zu of %zu (remote index %llu at 0x%llx)", i, d->n,
                               (unsigned long long)k, (unsigned long long)a);
        have = rc == 0 && ferry_session_segment_of(s, a, &run);
    }
    ferry_session_put(s);
    return rc;
}

/* Imports and checks *theirs into *d: arguments, no overflow, local
 * registration, the peer's segments. */
static int strided_check(ferry_engine_t *e, const char *peer, const ferry_strided_t *theirs, ferry_strided_t *d)
{
    *d = (ferry_strided_t){0};
    int rc = ferry_sized_import(d, sizeof *d, theirs, FERRY_STRIDED_SIZE_MIN, "strided transfer");
    if (rc) return rc;
    if (d->opcode != FERRY_OP_READ && d->opcode != FERRY_OP_WRITE)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "strided transfer: opcode %d is neither read nor write",
                          d->opcode);
    if (d->n == 0) return 0;
    if (!d->local_base || d->remote_base == 0 || d->piece_len == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "strided transfer: local base %p, remote base 0x%llx, piece length %zu (none may be 0)",
                          d->local_base, (unsigned long long)d->remote_base, d->piece_len);
    uint64_t llo, lhi, rlo, rhi;
    idx_range(d->local_idx, d->n, &llo, &lhi);
    idx_range(d->remote_idx, d->n, &rlo, &rhi);
    rc = check_span("local", (uint64_t)(uintptr_t)d->local_base, d->local_stride, lhi, d->piece_len, d->n);
    if (rc == 0) rc = check_span("remote", d->remote_base, d->remote_stride, rhi, d->piece_len, d->n);
    if (rc == 0) rc = check_local(e, d, llo, lhi);
    if (rc == 0) rc = check_remote(e, peer, d, rlo, rhi);
    return rc;
}

/* Pieces this big are striped over several connections (workers.c), which
 * the windows do not do: they go the way of any batch, expanded at once
 * (one entry of bookkeeping per 8 MiB moved). */
#define STRIDED_BIG_PIECE (8u << 20)

/* The pieces of d as the three arrays of a batch (one allocation). */
static void *expand(const ferry_strided_t *d, void ***locals, uint64_t **remotes, size_t **lens)
{
    size_t n = d->n, bytes;
    if (ferry_mul_overflows(n, sizeof **locals + sizeof **remotes + sizeof **lens, &bytes)) {
        ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "strided transfer of %zu pieces of %zu bytes: more pieces than "
                   "memory can describe", n, d->piece_len);
        return NULL;
    }
    unsigned char *mem = malloc(bytes);
    if (!mem) {
        ferry_fail(FERRY_ERR_MEMORY, "strided transfer of %zu pieces: out of memory", n);
        return NULL;
    }
    *locals = (void **)mem;
    *remotes = (uint64_t *)(mem + n * sizeof **locals);
    *lens = (size_t *)(mem + n * (sizeof **locals + sizeof **remotes));
    for (size_t i = 0; i < n; i++) {
        unsigned char *local;
        ferry_strided_piece(d, i, &local, &(*remotes)[i]);
        (*locals)[i] = local;
        (*lens)[i] = d->piece_len;
    }
    return mem;
}

static int run_big_pieces(ferry_engine_t *e, const char *peer, const ferry_strided_t *d)
{
    void **locals;
    uint64_t *remotes;
    size_t *lens;
    void *mem = expand(d, &locals, &remotes, &lens);
    int rc = mem ? ferry_run_sync_checked(e, peer, d->opcode, locals, remotes, lens, d->n) : ferry_last_error_code();
    free(mem);
    return rc;
}

static long submit_big_pieces(ferry_batch_t *b, const char *peer, const ferry_strided_t *d, int timeout_ms)
{
    size_t bytes, room = ferry_batch_room(b);
    if (d->n > room) /* refused before n requests are expanded (as ferry_batch_submit would after) */
        return ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS, "strided submit: %zu pieces exceed the batch's room for %zu",
                          d->n, room);
    if (ferry_mul_overflows(d->n, sizeof(ferry_request_t), &bytes))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "strided submit of %zu pieces of %zu bytes: more pieces than "
                          "memory can describe", d->n, d->piece_len);
    ferry_request_t *reqs = malloc(bytes ? bytes : sizeof *reqs);
    if (!reqs) return ferry_fail(FERRY_ERR_MEMORY, "strided submit of %zu pieces: out of memory", d->n);
    for (size_t i = 0; i < d->n; i++) {
        unsigned char *local;
        reqs[i] = (ferry_request_t){.opcode = d->opcode, .len = d->piece_len};
        ferry_strided_piece(d, i, &local, &reqs[i].remote);
        reqs[i].local = local;
    }
    long first = ferry_batch_submit_checked(b, peer, reqs, d->n, timeout_ms);
    free(reqs);
    return first;
}

/* ------------------------------------------------ synchronous windows
 *
 * The pieces are expanded a window at a time (ferry_strided_window):
 * lanes (the caller's thread and up to conns_per_peer - 1 workers, one
 * connection each) take the next window in piece order, expand it into
 * their own buffer and run it. While one lane waits for its window's last answers the
 * others keep the pipe full. After a failure no lane takes another window;
 * the failure reported is the lowest failed piece, and every window below
 * it ran, so it is the first failure, as when the pieces ran at once. */

struct lanes {
    ferry_engine_t *e;
    ferry_session_t *s;
    const char *peer;
    const ferry_strided_t *d;
    uint64_t deadline, t0;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    size_t window;      /* pieces a window */
    size_t next;        /* the first piece no lane took */
    size_t workers;     /* worker lanes still to end */
    bool stop;          /* a piece failed: no more windows */
    size_t failed;      /* the lowest failed piece, SIZE_MAX when none */
    int rc;
    char *detail;       /* its error detail (raised on a worker's thread) */
};

/* Expands pieces [from, from + n) of d into xs (cleared here). */
static void expand_window(ferry_engine_t *e, const ferry_strided_t *d, size_t from, size_t n, uint64_t deadline,
                          ferry_xfer_t *xs)
{
    memset(xs, 0, n * sizeof *xs);
    uint64_t id = ferry_engine_part_req_ids(e, n); /* one id a piece, so one can be fenced alone */
    for (size_t i = 0; i < n; i++) {
        ferry_xfer_t *x = &xs[i];
        ferry_strided_piece(d, from + i, &x->local, &x->remote);
        x->opcode = d->opcode;
        x->len = d->piece_len;
        x->req_id = id + i;
        x->deadline = deadline;
        x->index = from + i;
    }
}

/* Records the failure raised on this thread for piece `failed`, if it is
 * the lowest so far (a CANCEL_UNCONFIRMED before any other code: it must
 * not hide behind another request's), and stops the lanes. */
static void lanes_fail(struct lanes *l, int rc, size_t failed)
{
    pthread_mutex_lock(&l->lock);
    bool unconfirmed = rc == FERRY_ERR_CANCEL_UNCONFIRMED, had = l->rc == FERRY_ERR_CANCEL_UNCONFIRMED;
    if (l->failed == SIZE_MAX || (unconfirmed && !had) || (failed < l->failed && unconfirmed == had)) {
        free(l->detail);
        l->detail = strdup(ferry_fail_message());
        l->failed = failed;
        l->rc = rc;
    }
    l->stop = true;
    pthread_mutex_unlock(&l->lock);
}

/* One lane: windows until none is left or a piece failed. */
static void lane_run(struct lanes *l)
{
    const ferry_strided_t *d = l->d;
    size_t w = l->window;
    ferry_xfer_t *xs = ferry_malloc_array(w, sizeof *xs);
    if (!xs) { /* the call fails, unless a piece failed too (ranked after every piece) */
        lanes_fail(l, ferry_fail(FERRY_ERR_MEMORY, "strided transfer: out of memory for a window of %zu pieces", w),
                   d->n);
        return;
    }
    for (;;) {
        pthread_mutex_lock(&l->lock);
        size_t from = l->next, n = d->n - from < w ? d->n - from : w;
        bool done = l->stop || n == 0;
        l->next += done ? 0 : n;
        pthread_mutex_unlock(&l->lock);
        if (done) break;
        if (ferry_engine_part_stopping(l->e)) {
            lanes_fail(l, ferry_fail(FERRY_ERR_CONTEXT, "the engine was destroyed while the strided transfer to %s ran "
                                     "(piece %zu of %zu not sent)", l->peer, from, d->n), from);
            break;
        }
        expand_window(l->e, d, from, n, l->deadline, xs);
        size_t failed = SIZE_MAX;
        int rc = ferry_run_window(l->e, l->s, l->peer, xs, n, d->n, l->t0, &failed);
        if (rc) lanes_fail(l, rc, failed);
    }
    free(xs);
}

static void worker_lane(struct task_ext *t, void *arg)
{
    (void)t;
    lane_run(arg);
}

static void worker_lane_done(ferry_task_t *t, void *owner)
{
    struct lanes *l = owner;
    ferry_task_finish_joined(t, &l->lock, &l->cond, &l->workers);
}

/* Runs the checked descriptor d (n > 0) to peer in windows. */
static int run_windows(ferry_engine_t *e, const char *peer, const ferry_strided_t *d)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    struct lanes l = {.e = e, .peer = peer, .d = d, .failed = SIZE_MAX, .t0 = ferry_now_ns(),
                      .deadline = ferry_deadline_after_ms(cfg->timeout_ms)};
    int rc = ferry_session_get(e, peer, &l.s);
    if (rc) return rc;
    FERRY_STAT_ADD(ferry_engine_part_stats(e), requests, d->n);
    pthread_mutex_init(&l.lock, NULL);
    pthread_cond_init(&l.cond, NULL);
    size_t lanes = (size_t)cfg->conns_per_peer;
    if (lanes > (size_t)cfg->workers + 1) lanes = (size_t)cfg->workers + 1;
    if (ferry_session_small_serial(l.s, d->piece_len)) lanes = 1; /* as a batch of such pieces (transfer.c) */
    l.window = ferry_strided_window(d->n, lanes);
    size_t windows = (d->n - 1) / l.window + 1;
    if (lanes > windows) lanes = windows;
    for (size_t k = 1; k < lanes; k++) {
        struct task_ext *t = ferry_task_new(l.s, NULL, 0, worker_lane_done, &l);
        if (!t) break; /* fewer lanes: slower, still correct */
        t->run = worker_lane;
        t->run_arg = &l;
        pthread_mutex_lock(&l.lock);
        l.workers++;
        pthread_mutex_unlock(&l.lock);
        ferry_task_enqueue(e, &t->task);
    }
    lane_run(&l);
    pthread_mutex_lock(&l.lock);
    ferry_wait_zero_locked(e, &l.lock, &l.cond, &l.workers, UINT64_MAX, 1);
    pthread_mutex_unlock(&l.lock);
    pthread_mutex_destroy(&l.lock);
    pthread_cond_destroy(&l.cond);
    ferry_session_put(l.s);
    if (l.failed != SIZE_MAX) rc = ferry_fail(l.rc, "%s", l.detail ? l.detail : "failed");
    free(l.detail);
    return rc;
}

int(ferry_strided_transfer_sync)(ferry_engine_t *e, const char *peer, const ferry_strided_t *theirs)
{
    ferry_clear_last_error();
    if (!e || !peer || !theirs) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "strided transfer: NULL argument");
    int rc = ferry_engine_enter(e);
    if (rc) return rc;
    ferry_strided_t d;
    rc = strided_check(e, peer, theirs, &d);
    if (rc || d.n == 0) return ferry_engine_leave(e, rc);
    return ferry_engine_leave(e, d.piece_len >= STRIDED_BIG_PIECE ? run_big_pieces(e, peer, &d)
                                                                   : run_windows(e, peer, &d));
}

long(ferry_batch_submit_strided)(ferry_batch_t *b, const char *peer, const ferry_strided_t *theirs, int timeout_ms)
{
    ferry_clear_last_error();
    if (!b || !peer || !theirs) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "strided submit: NULL argument");
    ferry_engine_t *e = ferry_batch_engine(b);
    if (!e) return ferry_last_error_code();
    /* Entered before the bounds check, which may open the session (a
     * handshake): destroy then wakes this call and waits for it. */
    int rc = ferry_engine_enter(e);
    if (rc) return rc;
    ferry_strided_t d;
    rc = strided_check(e, peer, theirs, &d);
    if (rc) return ferry_engine_leave(e, ferry_fail_context("strided submit"));
    long first = d.piece_len >= STRIDED_BIG_PIECE ? submit_big_pieces(b, peer, &d, timeout_ms)
                                                  : ferry_batch_submit_strided_checked(b, peer, &d, timeout_ms);
    rc = ferry_engine_leave(e, first < 0 ? (int)first : 0);
    return rc ? rc : first;
}
