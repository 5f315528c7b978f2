/* SPDX-License-Identifier: Apache-2.0 */
/* Transfers as the public calls see them: the requests' arguments checked,
 * cut into pieces, run (piece_run.c; several connections at once: workers.c)
 * and counted, and the synchronous public calls. */
#include <stdlib.h>

#include "util/clock.h"
#include "batch.h"
#include "parts.h"
#include "session.h"
#include "stats.h"
#include "util/fail.h"
#include "testing.h"
#include "link/transport.h"

static const char *op_name(int opcode) { return opcode == FERRY_OP_WRITE ? "write" : "read"; }

int ferry_check_local(ferry_engine_t *e, const void *local, uint64_t len)
{
    int rc = ferry_registry_check(ferry_engine_part_registry(e), (uint64_t)(uintptr_t)local, len, 0, "local");
    if (rc) ferry_fail_context("the local buffer must be registered with this engine");
    return rc;
}

static int check_args(int opcode, const void *local, uint64_t remote, uint64_t len);

/* Checks one request's arguments; touches no memory. */
int ferry_check_request(ferry_engine_t *e, int opcode, const void *local, uint64_t remote, uint64_t len)
{
    int rc = check_args(opcode, local, remote, len);
    return rc ? rc : ferry_check_local(e, local, len);
}

/* ferry_check_request for n requests under one hold of the registry's read
 * lock, a region lookup once per run of local buffers in the same region
 * (a batch of small pieces is mostly such runs). */
static int check_requests(ferry_engine_t *e, int opcode, void *const *locals, const uint64_t *remotes,
                          const size_t *lens, size_t n)
{
    ferry_registry_t *r = ferry_engine_part_registry(e);
    const ferry_region_t *reg = NULL;
    int rc = 0;
    ferry_registry_read_lock(r);
    for (size_t i = 0; i < n && rc == 0; i++) {
        uint64_t a = (uint64_t)(uintptr_t)locals[i];
        rc = check_args(opcode, locals[i], remotes[i], lens[i]);
        if (rc == 0 &&
            !(reg && a >= reg->addr && a - reg->addr <= reg->len && lens[i] <= reg->len - (a - reg->addr))) {
            rc = ferry_registry_check_locked(r, a, lens[i], 0, 0, "local");
            if (rc) ferry_fail_context("the local buffer must be registered with this engine");
            reg = rc ? NULL : ferry_registry_lookup_locked(r, a, lens[i]);
        }
        if (rc && n > 1) ferry_fail_context("request %zu of %zu", i, n);
    }
    ferry_registry_unlock(r);
    return rc;
}

static int check_args(int opcode, const void *local, uint64_t remote, uint64_t len)
{
    if (opcode != FERRY_OP_READ && opcode != FERRY_OP_WRITE)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "opcode %d is neither FERRY_OP_READ nor FERRY_OP_WRITE", opcode);
    if (!local) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "local buffer is NULL");
    if (len == 0) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "length is 0");
    if ((uint64_t)(uintptr_t)local + len < (uint64_t)(uintptr_t)local)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "local range [%p+%llu) wraps the address space", local,
                          (unsigned long long)len);
    if (remote == 0) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "remote address is 0");
    if (remote + len < remote)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "remote range [0x%llx+%llu) wraps the address space",
                          (unsigned long long)remote, (unsigned long long)len);
    return 0;
}

/* Re-raises piece x's failure as the thread's error, with context. */
static int report_piece(const ferry_xfer_t *x, const char *peer)
{
    ferry_fail(x->rc, "%s", x->detail ? x->detail : "failed");
    return ferry_fail_context("%s of %llu bytes, local %p <-> %s [0x%llx+%llu)", op_name(x->opcode),
                              (unsigned long long)x->len, (void *)(x->local), peer, (unsigned long long)x->remote,
                              (unsigned long long)x->len);
}

static void free_details(ferry_xfer_t *xs, size_t n)
{
    for (size_t i = 0; i < n; i++) free(xs[i].detail);
}

/* Counts each request's outcome once (pieces of a request are adjacent, in
 * request order): a request failed if any of its pieces did. */
static void record_requests(ferry_session_t *s, const ferry_xfer_t *xs, size_t n, uint64_t latency_ns)
{
    const char *tname = ferry_session_transport(s)->name;
    /* Successful requests of one opcode are counted together (one hold of
     * the metrics lock for a run of them, not one per request). */
    uint64_t ok = 0, ok_bytes = 0;
    int ok_op = n ? xs[0].opcode : 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        uint64_t bytes = 0;
        int rc = 0;
        for (; j < n && xs[j].index == xs[i].index; j++) {
            bytes += xs[j].done;
            if (!rc) rc = xs[j].rc;
        }
        if (ok && (rc || xs[i].opcode != ok_op)) {
            ferry_count_requests_ok(s->engine, s->stats, tname, ok_op, ok, ok_bytes, latency_ns);
            tname = NULL; /* the transport's name once per call: it costs a copy under the lock */
            ok = ok_bytes = 0;
        }
        if (rc) {
            ferry_count_request(s->engine, s->stats, tname, xs[i].opcode, bytes, latency_ns, rc);
            tname = NULL;
        } else {
            ok_op = xs[i].opcode;
            ok++;
            ok_bytes += bytes;
        }
        i = j;
    }
    ferry_count_requests_ok(s->engine, s->stats, tname, ok_op, ok, ok_bytes, latency_ns);
}

/* A call whose pieces all went through shared-pool mappings (the
 * session's hint: its transport's last verdict, piece_run.c) is one memcpy a piece. Split over
 * connections, half of it waits for a worker thread: a hand-off that costs
 * about as much as copying 1,024 pieces of 1 KiB, and that gains only when
 * a core is free. Below this many bytes such a call runs in the caller's
 * thread on one connection. Measured on 2 cores (docs/BENCHMARKS.md, "a
 * mapped call in the caller's thread"): 1,024 x 1,152 B (1.1 MiB) runs at
 * 0.59x a one-thread memcpy split, 1.09x inline; 1,024 x 2 KiB (2 MiB),
 * quiet machine, 12.2-12.8 GB/s split against 21.1-22.9 inline (memcpy
 * 22.0-22.9); at 4 and 8 MiB the split kept more GB/s (4 KiB pieces 28.1-28.3
 * split, 21.9-25.7 inline; 8 KiB 35.0-37.3 against 21.6-22.1): there the
 * second thread's copy outweighs the hand-off. */
#define MAPPED_INLINE_MAX (4u << 20)

static _Atomic uint64_t mapped_inline_calls; /* testing.h */

uint64_t ferry_test_mapped_inline_calls(void) { return atomic_load(&mapped_inline_calls); }

/* A call of pieces averaging under this many bytes, to a session whose
 * transport said small_serial (transport.h: shm's target copies them one
 * call at a time per initiator), runs in the caller's thread on one
 * connection: split, the second half waited for the first at the target
 * and paid a worker's hand-off and a second round trip besides (1,024 x
 * 2 KiB: ~600 us a call split, ~390 us unsplit; docs/BENCHMARKS.md,
 * issue 23). The same bound as shm's (shm_vec.c, SHM_SMALL_ENTRY). */
#define SMALL_SERIAL_PIECE_MAX (64u << 10)

static _Atomic uint64_t small_inline_calls; /* testing.h */

uint64_t ferry_test_small_inline_calls(void) { return atomic_load(&small_inline_calls); }

bool ferry_session_small_serial(ferry_session_t *s, uint64_t avg_piece)
{
    if (!atomic_load_explicit(&s->small_hint, memory_order_relaxed) || avg_piece >= SMALL_SERIAL_PIECE_MAX)
        return false;
    atomic_fetch_add_explicit(&small_inline_calls, 1, memory_order_relaxed);
    return true;
}

static _Atomic uint64_t shared_inline_calls; /* testing.h */

uint64_t ferry_test_shared_inline_calls(void) { return atomic_load(&shared_inline_calls); }

struct range {
    uint64_t addr, len;
};

static int range_cmp(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Whether no two of the n ranges a call writes (a write's remote ones, a
 * read's local ones) overlap (false when out of memory to sort them). */
static bool ranges_disjoint(int opcode, void *const *locals, const uint64_t *remotes, const size_t *lens, size_t n)
{
    struct range small[32], *r = n <= 32 ? small : malloc(n * sizeof *r);
    if (!r) return false;
    for (size_t i = 0; i < n; i++)
        r[i] = (struct range){opcode == FERRY_OP_WRITE ? remotes[i] : (uint64_t)(uintptr_t)locals[i], lens[i]};
    qsort(r, n, sizeof *r, range_cmp);
    bool ok = true;
    for (size_t i = 1; i < n && ok; i++) ok = r[i - 1].addr + r[i - 1].len <= r[i].addr;
    if (r != small) free(r);
    return ok;
}

/* Whether a call of n pieces (nx after striping) runs in the caller's
 * thread on one connection, not split over connections by
 * ferry_run_parallel:
 * - small pieces to a session whose transport copies them one call at a
 *   time (small_hint);
 * - a call under MAPPED_INLINE_MAX that shared-pool mappings copy
 *   (inline_hint);
 * - pieces to a session whose target shares a frame's copy between two
 *   threads itself (share_hint), where the split would use two (at most
 *   two connections a call), none striped, none writing over another (the
 *   target copies overlapping pieces on one thread, in order). */
static bool run_inline(ferry_engine_t *e, ferry_session_t *s, int opcode, void *const *locals, const uint64_t *remotes,
                       const size_t *lens, size_t n, size_t nx)
{
    bool small = atomic_load_explicit(&s->small_hint, memory_order_relaxed);
    bool mapped = atomic_load_explicit(&s->inline_hint, memory_order_relaxed);
    bool share = atomic_load_explicit(&s->share_hint, memory_order_relaxed);
    if (n == 0 || (!small && !mapped && !share)) return false;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) bytes += lens[i];
    if (small && ferry_session_small_serial(s, bytes / n)) return true;
    if (mapped && bytes < MAPPED_INLINE_MAX) {
        atomic_fetch_add_explicit(&mapped_inline_calls, 1, memory_order_relaxed);
        return true;
    }
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    if (!share || nx != n || cfg->conns_per_peer > 2 ||
        !ranges_disjoint(opcode, locals, remotes, lens, n))
        return false;
    atomic_fetch_add_explicit(&shared_inline_calls, 1, memory_order_relaxed);
    return true;
}

static int run_sync(ferry_engine_t *e, const char *peer, int opcode, void *const *locals, const uint64_t *remotes,
                    const size_t *lens, size_t n, bool checked)
{
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "engine is NULL");
    if (!peer) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "peer name is NULL");
    int rc = checked ? 0 : check_requests(e, opcode, locals, remotes, lens, n);
    if (rc) return rc;
    ferry_session_t *s;
    rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    ferry_xfer_t *xs;
    size_t nx;
    uint64_t t0 = ferry_now_ns();
    rc = ferry_make_pieces(e, opcode, locals, remotes, lens, n, ferry_deadline_after_ms(ferry_engine_part_config(e)->timeout_ms), &xs, &nx);
    if (rc == 0) {
        FERRY_STAT_ADD(ferry_engine_part_stats(e), requests, n);
        rc = nx == 1 || run_inline(e, s, opcode, locals, remotes, lens, n, nx) ? ferry_xfer_run(e, s, xs, nx)
                                                                             : ferry_run_parallel(e, s, xs, nx);
        record_requests(s, xs, nx, ferry_now_ns() - t0);
        size_t i = ferry_xfer_worst(xs, nx); /* CANCEL_UNCONFIRMED first */
        if (rc && i < nx) {
            rc = report_piece(&xs[i], peer);
            if (n > 1) ferry_fail_context("request %zu of %zu", xs[i].index, n);
        }
        free_details(xs, nx);
        free(xs);
    }
    ferry_session_put(s);
    return rc;
}

/* Runs pieces xs[0..n) of a call of total requests on one of s's
 * connections (a strided window, strided.c), counts their requests
 * (latency since t0) and frees their details. On failure, raises the first
 * failed piece's error as run_sync names it and sets *failed to its
 * request index. */
int ferry_run_window(ferry_engine_t *e, ferry_session_t *s, const char *peer, ferry_xfer_t *xs, size_t n,
                     size_t total, uint64_t t0, size_t *failed)
{
    int rc = ferry_xfer_run(e, s, xs, n);
    record_requests(s, xs, n, ferry_now_ns() - t0);
    size_t i = ferry_xfer_worst(xs, n); /* CANCEL_UNCONFIRMED first */
    if (rc && i < n) {
        rc = report_piece(&xs[i], peer);
        ferry_fail_context("request %zu of %zu", xs[i].index, total);
        *failed = xs[i].index;
    }
    free_details(xs, n);
    return rc;
}

/* run_sync inside the engine's count of calls in progress (destroy waits). */
static int run_sync_entered(ferry_engine_t *e, const char *peer, int opcode, void *const *locals,
                            const uint64_t *remotes, const size_t *lens, size_t n)
{
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "engine is NULL");
    int rc = ferry_engine_enter(e);
    if (rc) return rc;
    return ferry_engine_leave(e, run_sync(e, peer, opcode, locals, remotes, lens, n, false));
}

/* run_sync for requests the caller checked already (strided.c), inside
 * the caller's ferry_engine_enter. */
int ferry_run_sync_checked(ferry_engine_t *e, const char *peer, int opcode, void *const *locals,
                           const uint64_t *remotes, const size_t *lens, size_t n)
{
    return run_sync(e, peer, opcode, locals, remotes, lens, n, true);
}

int ferry_transfer_sync(ferry_engine_t *e, const char *peer, int opcode, void *local, uint64_t remote, size_t len)
{
    ferry_clear_last_error();
    uint64_t r = remote;
    return run_sync_entered(e, peer, opcode, &local, &r, &len, 1);
}

int ferry_batch_transfer_sync(ferry_engine_t *e, const char *peer, int opcode, void *const *locals,
                              const uint64_t *remotes, const size_t *lens, size_t n)
{
    ferry_clear_last_error();
    if (!locals || !remotes || !lens) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "batch transfer: NULL array");
    if (n == 0) return 0;
    return run_sync_entered(e, peer, opcode, locals, remotes, lens, n);
}
