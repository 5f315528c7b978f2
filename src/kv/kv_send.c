/* SPDX-License-Identifier: Apache-2.0 */
/* Sending a request's KV over an engine: staging check, gather, one batch,
 * then a completion notice; any failure is notified to the peer too. */
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

#include <ferry/ferry.h>

#include "util/arith.h"
#include "util/fail.h"
#include "engine/session.h"
#include "kv_internal.h"
#include "wire/wire.h"

/* The message part of a detail "NAME (code): message", for re-wrapping. */
static const char *detail_message(const char *detail, int code)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s (%d): ", ferry_error_name(code), code);
    size_t n = strlen(prefix);
    return strncmp(detail, prefix, n) == 0 ? detail + n : detail;
}

/* How long a failure notice may wait for a peer that just let a transfer
 * time out (or could not confirm its cancel): it is likely stalled, and the
 * caller has already waited out the transfer's own deadline. */
#define KV_NOTICE_TO_STALLED_PEER_MS 1000

static int send_failure_notice(ferry_engine_t *e, const char *peer, uint64_t request_id,
                               uint32_t prefill_rank, uint32_t decode_rank, int status,
                               const char *reason, int timeout_ms);

int ferry_kv_send_failure(ferry_engine_t *e, const char *peer, uint64_t request_id,
                          uint32_t prefill_rank, uint32_t decode_rank, int status,
                          const char *reason)
{
    return send_failure_notice(e, peer, request_id, prefill_rank, decode_rank, status, reason, 0);
}

static int send_failure_notice(ferry_engine_t *e, const char *peer, uint64_t request_id,
                               uint32_t prefill_rank, uint32_t decode_rank, int status,
                               const char *reason, int timeout_ms)
{
    if (status >= 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv failure notice for request %llu: status %d is not a failure code",
                          (unsigned long long)request_id, status);
    ferry_kv_notice_t n = {.request_id = request_id, .status = status,
                           .prefill_rank = prefill_rank, .decode_rank = decode_rank};
    snprintf(n.reason, sizeof n.reason, "%s", reason ? reason : "");
    unsigned char msg[FERRY_KV_NOTICE_HEADER + FERRY_KV_REASON_MAX];
    long len = ferry_kv_notice_encode(&n, msg, sizeof msg);
    if (len < 0) return (int)len;
    return ferry_notify_timeout(e, peer, msg, (size_t)len, timeout_ms);
}

int kv_notify_success(ferry_engine_t *e, const char *peer, const ferry_kv_notice_t *n)
{
    size_t size = ferry_kv_notice_size(n);
    unsigned char *msg = malloc(size);
    if (!msg) return ferry_fail(FERRY_ERR_MEMORY, "kv notice: %zu bytes", size);
    long len = ferry_kv_notice_encode(n, msg, size);
    int rc = len < 0 ? (int)len : ferry_notify(e, peer, msg, (size_t)len);
    free(msg);
    return rc;
}

/* After a failed step: one text for both sides, "kv send request R to P:
 * step: <the failure>", notified to the peer, then left as this thread's
 * detail with the failure's code (the notify call resets the detail). */
int kv_report_failure(ferry_engine_t *e, const char *peer, const ferry_kv_notice_t *base,
                          const char *step, int code)
{
    char reason[FERRY_KV_REASON_MAX];
    snprintf(reason, sizeof reason, "kv send request %llu to %s: %s: %s",
             (unsigned long long)base->request_id, peer, step,
             detail_message(ferry_last_error_detail(), code));
    bool stalled = code == FERRY_ERR_TIMEOUT || code == FERRY_ERR_CANCEL_UNCONFIRMED;
    int notified = send_failure_notice(e, peer, base->request_id, base->prefill_rank, base->decode_rank,
                                       code, reason, stalled ? KV_NOTICE_TO_STALLED_PEER_MS : 0);
    if (notified != 0)
        return ferry_fail(code, "%s (the failure notice %s: %s)", reason,
                          notified == FERRY_ERR_CANCEL_UNCONFIRMED ? "may or may not have been delivered"
                                                                   : "was not delivered either",
                          ferry_error_name(notified));
    return ferry_fail(code, "%s", reason);
}

static int find_write_segment(const ferry_segment_t *segs, size_t n, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < n; i++) {
        if ((segs[i].flags & FERRY_MEM_REMOTE_WRITE) && segs[i].addr <= addr &&
            addr + len <= segs[i].addr + segs[i].len)
            return 1;
    }
    return 0;
}

/* The segment list is asked for again when it grew between the calls. */
static long fetch_segments(ferry_engine_t *e, const char *peer, ferry_segment_t **out)
{
    size_t cap = 64;
    for (;;) {
        ferry_segment_t *segs = malloc(cap * sizeof *segs);
        if (!segs) return ferry_fail(FERRY_ERR_MEMORY, "kv send: %zu segments", cap);
        long n = ferry_session_segments(e, peer, segs, cap);
        if (n < 0 || (size_t)n <= cap) {
            if (n < 0) free(segs);
            else *out = segs;
            return n;
        }
        free(segs);
        cap = (size_t)n;
    }
}

/* A staged plan writes into the decode rank's staging buffer, which the
 * decoder may have forgotten to register (or registered without remote
 * write); the engine would refuse the first write, but with a detail about
 * one block. Checked up front so the detail names the staging range. */
static int check_peer_staging(ferry_engine_t *e, const char *peer, const ferry_kv_plan_t *p)
{
    if (!p->info.scatter || p->info.bytes == 0) return 0;
    uint64_t start = p->dst_staging_remote + p->info.dst_staging_offset;
    ferry_segment_t *segs = NULL;
    long n = fetch_segments(e, peer, &segs);
    if (n < 0) return (int)n;
    int found = find_write_segment(segs, (size_t)n, start, p->info.bytes);
    free(segs);
    if (found) return 0;
    return ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                      "decode staging [0x%llx+%llu) (this pair's region at offset %llu of the "
                      "%llu-byte staging buffer) is not inside any region %s registered for "
                      "remote write; register the staging buffer once at allocation",
                      (unsigned long long)start, (unsigned long long)p->info.bytes,
                      (unsigned long long)p->info.dst_staging_offset,
                      (unsigned long long)p->info.dst_staging_bytes, peer);
}

/* After the batch's submits (rc: the first failing one, or 0): waits for
 * its count requests, and on failure cancels the unfinished ones and keeps
 * the failure's detail (CANCEL_UNCONFIRMED when the target could not
 * confirm). Frees the batch. */
static int kv_batch_finish(ferry_batch_t *b, size_t count, int rc, int timeout_ms)
{
    if (rc == 0) rc = ferry_batch_wait(b, timeout_ms > 0 ? timeout_ms : -1);
    /* Cancel and free reset the thread's detail: keep the failure's. */
    char detail[FERRY_KV_REASON_MAX] = "";
    if (rc != 0) {
        snprintf(detail, sizeof detail, "%s", detail_message(ferry_last_error_detail(), rc));
        /* Nothing of the batch may land later, unless the target could not
         * confirm it: then the caller (and the decode side, through the
         * notice) must hear CANCEL_UNCONFIRMED, not the cause, or it frees
         * pages that late bytes still reach. */
        bool unconfirmed = ferry_batch_cancel(b) == FERRY_ERR_CANCEL_UNCONFIRMED;
        for (size_t i = 0; !unconfirmed && i < count; i++) {
            ferry_status_t st;
            unconfirmed = ferry_batch_status(b, i, &st) == 0 && st.code == FERRY_ERR_CANCEL_UNCONFIRMED;
        }
        if (unconfirmed) {
            size_t used = strlen(detail);
            snprintf(detail + used, sizeof detail - used,
                     "; the peer did not confirm that no more of it can land: do not reuse the pages");
            rc = FERRY_ERR_CANCEL_UNCONFIRMED;
        }
    }
    ferry_batch_free(b);
    if (rc != 0) ferry_fail(rc, "%s", detail);
    return rc;
}

int kv_write_requests(ferry_engine_t *e, const char *peer, const ferry_request_t *reqs,
                      size_t count, int timeout_ms)
{
    if (count == 0) return 0;
    ferry_batch_t *b = NULL;
    int rc = ferry_batch_alloc(e, count, &b);
    if (rc != 0) return rc;
    long first = ferry_batch_submit(b, peer, reqs, count, timeout_ms);
    return kv_batch_finish(b, count, first < 0 ? (int)first : 0, timeout_ms);
}

static uint64_t block_addr(const ferry_kv_block_t *k, bool dst) { return dst ? k->dst : k->src; }

/* One side (dst or src) of blocks[0..n) as base + idx[i] * stride: the
 * stride is the greatest common divisor of their distances (the length
 * when they coincide), so every run of equal blocks fits. */
static void fit_strided(const ferry_kv_block_t *blocks, size_t n, bool dst, uint64_t *base, uint64_t *stride,
                        uint64_t *idx)
{
    uint64_t first = block_addr(&blocks[0], dst), lo = first, d = 0;
    for (size_t i = 1; i < n; i++) {
        uint64_t a = block_addr(&blocks[i], dst);
        d = ferry_gcd64(a > first ? a - first : first - a, d);
        if (a < lo) lo = a;
    }
    if (d == 0) d = blocks[0].len;
    for (size_t i = 0; i < n; i++) idx[i] = (block_addr(&blocks[i], dst) - lo) / d;
    *base = lo;
    *stride = d;
}

/* More blocks than this of one length go as one strided descriptor. */
#define KV_STRIDED_MIN 16

/* Submits blocks[0..n) (of one length, n >= 2) as one strided descriptor,
 * in their order; idx has room for 2n indices. */
static long submit_strided_run(ferry_batch_t *b, const char *peer, const ferry_kv_block_t *blocks, size_t n,
                               uint64_t *idx, int timeout_ms)
{
    ferry_strided_t d = {.opcode = FERRY_OP_WRITE, .piece_len = (size_t)blocks[0].len, .n = n,
                         .local_idx = idx, .remote_idx = idx + n};
    uint64_t lbase;
    fit_strided(blocks, n, false, &lbase, &d.local_stride, idx);
    fit_strided(blocks, n, true, &d.remote_base, &d.remote_stride, idx + n);
    d.local_base = (void *)(uintptr_t)lbase;
    return ferry_batch_submit_strided(b, peer, &d, timeout_ms);
}

static bool one_length(const ferry_kv_block_t *blocks, size_t count)
{
    for (size_t i = 1; i < count; i++)
        if (blocks[i].len != blocks[0].len) return false;
    return true;
}

/* Whether a block is short enough to travel many to a vector frame. */
static bool vector_sized(const ferry_kv_block_t *k) { return k->len <= FERRY_WIRE_VEC_PIECE_MAX; }

/* blocks[0..count) as requests in their own order (the plan's: layer,
 * buffer, page position), the vector-sized ones first: a longer block
 * between them would end the vector frame they share. */
static size_t requests_in_order(const ferry_kv_block_t *blocks, size_t count, ferry_request_t *out)
{
    size_t n = 0;
    for (int longer = 0; longer < 2; longer++)
        for (size_t i = 0; i < count; i++)
            if (vector_sized(&blocks[i]) != longer)
                out[n++] = (ferry_request_t){FERRY_OP_WRITE, (void *)(uintptr_t)blocks[i].src, blocks[i].dst,
                                             (size_t)blocks[i].len};
    return n;
}

/* Writes blocks[0..count) in one batch. Page-run coalescing merged the
 * pages adjacent on both sides; what is left are blocks of many lengths
 * (runs of 1 to a dozen pages), most of them adjacent to their neighbour
 * on one side (where a run of the other side ended). They are submitted in
 * the plan's order so that neighbours stay neighbours in the vector frames:
 * the target merges each side's adjacent pieces into one iovec entry, and
 * the kernel's cross-memory attach pins and walks pages per entry. Grouping
 * them by length (for strided descriptors) cut those neighbours apart:
 * `ferry demo --mla --page 1` over shm, 148,524 remote entries for 158,240
 * blocks against 34,578 in order, ~1.4x the kernel's copy time (docs/BENCHMARKS.md).
 * Blocks of a single length (every page alone, or runs all of one length)
 * lose nothing by a strided descriptor, which also travels compactly, and
 * keep their order in it. The notice follows the whole batch. */
static int write_blocks(ferry_engine_t *e, const char *peer, const ferry_kv_block_t *blocks, size_t count,
                        int timeout_ms)
{
    if (count == 0) return 0;
    bool strided = count > KV_STRIDED_MIN && one_length(blocks, count);
    uint64_t *idx = strided ? ferry_malloc_array(count, 2 * sizeof *idx) : NULL;
    ferry_request_t *reqs = strided ? NULL : ferry_malloc_array(count, sizeof *reqs);
    ferry_batch_t *b = NULL;
    int rc = idx || reqs ? ferry_batch_alloc(e, count, &b) : ferry_fail(FERRY_ERR_MEMORY, "kv send: %zu blocks", count);
    long first = 0;
    if (rc == 0 && strided) first = submit_strided_run(b, peer, blocks, count, idx, timeout_ms);
    else if (rc == 0) first = ferry_batch_submit(b, peer, reqs, requests_in_order(blocks, count, reqs), timeout_ms);
    if (first < 0) rc = (int)first;
    free(idx);
    free(reqs);
    return b ? kv_batch_finish(b, count, rc, timeout_ms) : rc;
}

static int write_plan_blocks(ferry_engine_t *e, const char *peer, const ferry_kv_plan_t *p,
                             int timeout_ms)
{
    size_t count = 0;
    const ferry_kv_block_t *blocks = ferry_kv_plan_blocks(p, &count);
    return write_blocks(e, peer, blocks, count, timeout_ms);
}

/* The name every step of a send uses, peer pinned to the plan's epoch:
 * the plan's addresses are of the receiver's process it was first sent
 * to, so a restarted receiver gets nothing of it, every time (not even a
 * notice). A plan is pinned at its first send, to the epoch of a pinned
 * peer name, else to the session's epoch then (ferry_session_pin); a
 * later send pinned to another epoch fails PEER_RESTARTED. */
static int pin_plan_peer(ferry_engine_t *e, const char *peer, const ferry_kv_plan_t *plan, char *out,
                         size_t cap)
{
    char plain[256];
    uint64_t epoch;
    bool pinned;
    int rc = ferry_peer_name_split(peer, plain, sizeof plain, &epoch, &pinned);
    if (rc != 0) return rc;
    /* The plan is the caller's, allocated by ferry_kv_plan_create: its pin
     * is the one field a send sets. */
    _Atomic uint64_t *pin = &((struct ferry_kv_plan *)plan)->pin_epoch;
    uint64_t have = atomic_load(pin);
    if (!pinned && have == 0) {
        char name[FERRY_PINNED_NAME_MAX];
        rc = ferry_session_pin(e, plain, name, sizeof name);
        if (rc == 0) rc = ferry_peer_name_split(name, plain, sizeof plain, &epoch, &pinned);
        if (rc != 0) return rc;
    } else if (!pinned) {
        epoch = have;
    }
    /* The first send's epoch stays (0: none yet; a peer whose random epoch
     * is 0 leaves its plans unpinned). */
    uint64_t expected = 0;
    if (!atomic_compare_exchange_strong(pin, &expected, epoch)) have = expected;
    else have = epoch;
    if (have != epoch)
        return ferry_fail(FERRY_ERR_PEER_RESTARTED,
                          "the plan's addresses were learned under %s's epoch %016llx and this send is pinned "
                          "to epoch %016llx: nothing was sent (make a plan from the new layout)",
                          plain, (unsigned long long)have, (unsigned long long)epoch);
    int n = snprintf(out, cap, "%s#%016llx", plain, (unsigned long long)have);
    return n > 0 && (size_t)n < cap ? 0 : ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv send: peer name too long");
}

int ferry_kv_send(ferry_engine_t *e, const char *peer, const ferry_kv_plan_t *plan,
                  const ferry_kv_send_args_t *args)
{
    if (!e || !peer || !plan || !args)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv send: NULL engine, peer, plan or args");
    if (!plan->sender_bound)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv send request %llu: plan not bound (ferry_kv_plan_bind_sender first)",
                          (unsigned long long)args->request_id);
    if (args->aux_len > FERRY_KV_AUX_MAX || (args->aux_len && !args->aux))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv send request %llu: aux of %zu bytes (limit %u) must be non-NULL",
                          (unsigned long long)args->request_id, args->aux_len, FERRY_KV_AUX_MAX);
    ferry_kv_notice_t n = {.request_id = args->request_id, .prefill_rank = plan->src.tp_rank,
                           .decode_rank = plan->dst.tp_rank, .bytes = plan->info.bytes,
                           .aux_len = args->aux_len, .aux = args->aux};
    char pinned[FERRY_PINNED_NAME_MAX];
    int rc = pin_plan_peer(e, peer, plan, pinned, sizeof pinned);
    if (rc != 0) /* no notice: the receiver may be another process than the plan's */
        return ferry_fail_context("kv send request %llu to %s: pin", (unsigned long long)args->request_id, peer);
    peer = pinned;
    rc = check_peer_staging(e, peer, plan);
    if (rc != 0) return kv_report_failure(e, peer, &n, "staging check", rc);
    rc = ferry_kv_gather(plan);
    if (rc != 0) return kv_report_failure(e, peer, &n, "gather", rc);
    rc = write_plan_blocks(e, peer, plan, args->timeout_ms);
    if (rc != 0) return kv_report_failure(e, peer, &n, "transfer", rc);
    /* Every byte is acknowledged by the peer: only now may it hear so. */
    rc = kv_notify_success(e, peer, &n);
    if (rc != 0)
        return ferry_fail_context("kv send request %llu to %s: success notice",
                                  (unsigned long long)args->request_id, peer);
    return 0;
}
