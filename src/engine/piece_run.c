/* SPDX-License-Identifier: Apache-2.0 */
/* Running pieces on a session's connections: segment resolution, the
 * transport's run, retries with backoff, fences for what is in doubt. The
 * argument checks and the synchronous public calls are in transfer.c. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "util/clock.h"
#include "engine.h"
#include "util/fail.h"
#include "util/log.h"
#include "link/transport.h"

/* Failures worth an automatic retry on a fresh connection: the code is
 * retryable and the request can still succeed unchanged. A timeout is not:
 * its deadline is spent. Stale segments are not: the caller must learn the
 * new addresses. */
static bool auto_retryable(int rc)
{
    return rc == FERRY_ERR_PEER_CLOSED || rc == FERRY_ERR_SOCKET || rc == FERRY_ERR_CHECKSUM_MISMATCH;
}

/* Failures that say the link to the peer is gone: once retries ran out,
 * the session's pooled connections are torn down. */
static bool link_failure(int rc, int broken)
{
    return rc == FERRY_ERR_PEER_CLOSED || rc == FERRY_ERR_SOCKET || rc == FERRY_ERR_MALFORMED_FRAME ||
           (rc == FERRY_ERR_TIMEOUT && broken);
}

/* A connect refused (SOCKET) by a peer this session had handshaken with
 * means the peer went away: say PEER_CLOSED, the code a caller watching
 * for dead peers checks, with the connect's own words kept in the detail.
 * A peer never reached keeps SOCKET. */
static int peer_gone_if_refused(ferry_session_t *s, int rc)
{
    if (rc != FERRY_ERR_SOCKET) return rc;
    pthread_mutex_lock(&s->lock);
    bool known = s->have_peer;
    pthread_mutex_unlock(&s->lock);
    if (!known) return rc;
    char why[512];
    snprintf(why, sizeof why, "%s", ferry_fail_message());
    return ferry_fail(FERRY_ERR_PEER_CLOSED, "%s went away: its connection broke and a new one failed (%s)",
                      s->name, why);
}

static void sleep_backoff(int ms, uint64_t deadline)
{
    uint64_t until = ferry_now_ns() + (uint64_t)ms * 1000000ull;
    if (until > deadline) until = deadline;
    struct timespec ts = ferry_deadline_timespec(until);
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
}

static uint64_t earliest_deadline(const ferry_xfer_t *xs, size_t n)
{
    uint64_t d = UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (xs[i].deadline < d) d = xs[i].deadline;
    return d;
}

/* Copies the cached segment holding piece x's remote range into *out when
 * it is the generation x was resolved to (ferry_session_resolve checked
 * its access). */
static bool segment_of(ferry_session_t *s, const ferry_xfer_t *x, ferry_segment_t *out)
{
    bool found = false;
    pthread_rwlock_rdlock(&s->seg_lock);
    size_t lo = 0, hi = s->nsegs;
    while (lo < hi) { /* the last segment starting at or below x->remote */
        size_t mid = lo + (hi - lo) / 2;
        if (s->segs[mid].addr <= x->remote) lo = mid + 1;
        else hi = mid;
    }
    if (lo > 0) {
        const ferry_segment_t *g = &s->segs[lo - 1];
        found = g->generation == x->generation && x->remote - g->addr < g->len;
        if (found) *out = *g;
    }
    pthread_rwlock_unlock(&s->seg_lock);
    return found;
}

/* Resolves each unresolved live piece against the peer's segments. A
 * piece the peer's table refuses fails; a retryable link failure while
 * fetching the table stops here and is returned (the pieces left
 * unresolved, never sent so), for the caller's retry policy. */
static int resolve_pieces(ferry_session_t *s, ferry_xfer_t *xs, size_t n)
{
    /* The segment that resolved the last piece (a copy): the next pieces
     * that lie in it with the same access need no lookup of their own. */
    ferry_segment_t run = {0};
    int run_op = -1;
    for (size_t i = 0; i < n; i++) {
        ferry_xfer_t *x = &xs[i];
        if (x->rc || x->generation) continue;
        if (x->opcode == run_op && x->remote >= run.addr && x->remote - run.addr <= run.len &&
            x->len <= run.len - (x->remote - run.addr)) {
            x->generation = run.generation;
            continue;
        }
        int rc = ferry_session_resolve(s, x->opcode, x->remote, x->len, &x->generation, x->deadline);
        if (rc && auto_retryable(rc)) return rc;
        if (rc) {
            ferry_xfer_fail(x, rc);
            continue;
        }
        run_op = segment_of(s, x, &run) ? x->opcode : -1;
    }
    return 0;
}

/* After STALE_SEGMENT (a key or mapping the initiator cached belongs to an
 * older registration of the range): learn the peer's current table. A
 * range that is registered and remote-accessible now is resolved to its
 * new generation and the piece goes on (true); one that is gone fails with
 * the table's precise answer (ADDRESS_NOT_REGISTERED, OUT_OF_BOUNDS, ...).
 * may_resume false (the call's budget is spent): only the latter.
 * Nothing was written by the refused attempt, and the target checks the
 * new generation again, so no byte lands outside a live registration. */
static bool relearn_stale(ferry_session_t *s, ferry_xfer_t *x, bool may_resume, bool *refreshed)
{
    uint32_t gen = 0;
    if (!*refreshed) { /* once a round, however many pieces were refused */
        if (ferry_session_refresh_segments(s, x->deadline) != 0) return false;
        *refreshed = true;
    }
    int rc = ferry_session_resolve(s, x->opcode, x->remote, x->len, &gen, x->deadline);
    if (rc) {
        ferry_xfer_fail(x, rc);
        return false;
    }
    if (gen == x->generation || !may_resume) return false; /* keep the refusal */
    x->generation = gen;
    x->rc = 0;
    free(x->detail);
    x->detail = NULL;
    return true;
}

/* Pieces still to do: no failure yet and bytes left. */
static bool any_pending(const ferry_xfer_t *xs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (xs[i].rc == 0 && xs[i].done < xs[i].len) return true;
    return false;
}

/* Every piece done, none failed. */
static bool all_complete(const ferry_xfer_t *xs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (xs[i].rc || xs[i].done < xs[i].len) return false;
    return true;
}

static void fail_pending(ferry_xfer_t *xs, size_t n, int rc)
{
    for (size_t i = 0; i < n; i++)
        if (xs[i].rc == 0 && xs[i].done < xs[i].len) ferry_xfer_fail(&xs[i], rc);
}

const ferry_transport_ops_t *ferry_session_transport(ferry_session_t *s)
{
    pthread_mutex_lock(&s->lock);
    const ferry_transport_ops_t *t = s->transport;
    pthread_mutex_unlock(&s->lock);
    return t ? t : ferry_transport_fallback;
}

/* Runs the pieces over connection c with the session's transport. When
 * that transport's verdict is to fall back, moves the session to the
 * fallback transport (tcp) for good (recording why, for ferry_peer_info)
 * and runs them again over it; when it is to leave pieces to the fallback,
 * runs those over it, this time only. Keeps the verdict's copied_inline,
 * small_serial and shares_frames as the session's hints (transfer.c). */
static int run_transport(ferry_session_t *s, ferry_conn_t *c, ferry_xfer_t *xs, size_t n, int *broken)
{
    const ferry_transport_ops_t *t = ferry_session_transport(s);
    const ferry_transport_ops_t *fallback = ferry_transport_fallback;
    ferry_verdict_t verdict = {.fall_back = false, .by_tcp = false};
    int rc = t->run(c, xs, n, broken, &verdict);
    bool moved = verdict.fall_back || verdict.by_tcp;
    atomic_store_explicit(&s->inline_hint, verdict.copied_inline && !moved, memory_order_relaxed);
    atomic_store_explicit(&s->small_hint, verdict.small_serial && !moved, memory_order_relaxed);
    atomic_store_explicit(&s->share_hint, verdict.shares_frames && !moved, memory_order_relaxed);
    if (rc || t == fallback || !moved) return rc;
    if (!verdict.fall_back) {
        FERRY_LOG(FERRY_LOG_DEBUG, "transport", "%s: pieces by %s this time: %s", s->name, fallback->name,
                  verdict.reason);
        return fallback->run(c, xs, n, broken, &verdict);
    }
    pthread_mutex_lock(&s->lock);
    if (s->transport == t) {
        s->transport = fallback;
        snprintf(s->transport_reason, sizeof s->transport_reason, "%s", verdict.reason);
        FERRY_LOG(FERRY_LOG_WARN, "transport", "%s: %s", s->name, verdict.reason);
    }
    pthread_mutex_unlock(&s->lock);
    return fallback->run(c, xs, n, broken, &verdict);
}

int ferry_xfer_run(ferry_engine_t *e, ferry_session_t *s, ferry_xfer_t *xs, size_t n)
{
    int backoff = e->cfg.retry_backoff_ms;
    int relearns = 4; /* in-call re-resolutions after STALE_SEGMENT (a region re-registered meanwhile) */
    ferry_stream_ctl_t *ctl = n ? xs[0].ctl : NULL; /* cancel.h */
    pthread_mutex_lock(&s->lock);
    bool unfenced = s->nunfenced > 0;
    pthread_mutex_unlock(&s->lock);
    if (unfenced) ferry_fence_pending(s, earliest_deadline(xs, n));
    for (int attempt = 0;; attempt++) {
        ferry_settle_cancelled(xs, n); /* cancel.h */
        int rc = resolve_pieces(s, xs, n);
        if (rc == 0 && !any_pending(xs, n)) break;
        uint64_t deadline = earliest_deadline(xs, n);
        ferry_conn_t *c;
        int broken = 0;
        bool interrupted = false;
        if (rc == 0) rc = ferry_session_checkout_abortable(s, deadline, ctl ? &ctl->poke : NULL, &c);
        if (rc == FERRY_ERR_CANCELLED && ctl) interrupted = true; /* poked by a canceller */
        if (rc == 0) {
            ferry_stream_ctl_arm(ctl, c->fd);
            rc = run_transport(s, c, xs, n, &broken);
            interrupted = ferry_stream_ctl_disarm(ctl);
            uint64_t conn_key = atomic_load(&c->cancel_key);
            ferry_session_checkin(s, c, !broken && !interrupted); /* fired: shut down */
            /* No late write: what the aborted connection may still deliver
             * is fenced before anything is reported or retried (cancel.h). */
            if (broken) ferry_fence_in_doubt(s, xs, n, rc, conn_key);
            /* The fence's placement report may have confirmed every byte
             * whose answer was lost: nothing left to resend or report. */
            if (broken && rc && all_complete(xs, n)) rc = 0;
        }
        if (interrupted) {
            /* A canceller broke the stream on purpose: not the peer's fault,
             * so the other pieces go on without using up a retry. */
            ferry_settle_cancelled(xs, n);
            ferry_settle_ended(xs, n, false);
            attempt--;
            continue;
        }
        if (rc && atomic_load(&e->stopping))
            rc = ferry_fail(FERRY_ERR_CONTEXT, "the engine was destroyed while the request to %s ran (%s)", s->name,
                            ferry_error_name(rc));
        bool corrupted = false, relearned = false, refreshed = false;
        for (size_t i = 0; i < n; i++) {
            if (xs[i].rc == FERRY_ERR_STALE_SEGMENT && relearn_stale(s, &xs[i], relearns > 0, &refreshed))
                relearned = true;
            if (xs[i].rc == FERRY_ERR_CHECKSUM_MISMATCH) {
                FERRY_STAT_ADD(&e->stats, checksum_failures, 1);
                if (attempt < e->cfg.retries) {
                    xs[i].rc = 0;
                    corrupted = true;
                    /* Resent under a new id: the slices sent after the
                     * refused one were placed whole, and the target drops
                     * a repeat of those unanswered (cancel.h, "Placement
                     * reports": a retry never reuses an id on a connection). */
                    xs[i].req_id = atomic_fetch_add(&e->next_req_id, 1);
                }
            }
        }
        /* A stale key breaks an RDMA queue pair (a remote access error
         * flushes the pieces behind it): the link broke for the range's
         * re-registration, not for the peer, and what was in doubt is
         * settled by the fence above. */
        bool stale_break = relearned && broken && rc == FERRY_ERR_PEER_CLOSED;
        if (relearned && (rc == 0 || stale_break)) {
            /* The range is registered now, under a newer generation: send
             * again at once, without using up a retry. */
            relearns--;
            attempt--;
            continue;
        }
        bool retry = rc ? auto_retryable(rc) && attempt < e->cfg.retries && ferry_ms_left(deadline) > 0
                        : corrupted && any_pending(xs, n);
        if (!retry) {
            if (rc) {
                rc = peer_gone_if_refused(s, rc);
                fail_pending(xs, n, rc);
                /* Retries ran out on a broken link: the whole pool goes. */
                if (link_failure(rc, broken)) ferry_session_teardown(s);
            } else if (any_pending(xs, n)) {
                fail_pending(xs, n, ferry_fail(FERRY_ERR_INTERNAL, "pieces left after the last attempt"));
            }
            break;
        }
        int why = rc ? rc : FERRY_ERR_CHECKSUM_MISMATCH;
        ferry_count_retry(e, s->stats, why);
        FERRY_LOG(FERRY_LOG_INFO, "xfer", "retrying to %s after %s (retry %d of %d, backoff %d ms)", s->name,
                  ferry_error_name(why), attempt + 1, e->cfg.retries, backoff);
        ferry_settle_ended(xs, n, false); /* finished pieces report before the backoff */
        sleep_backoff(backoff, deadline);
        backoff = backoff > (1 << 20) ? backoff : backoff * 2;
    }
    ferry_settle_ended(xs, n, true);
    uint64_t written = 0, read = 0;
    for (size_t i = 0; i < n; i++) *(xs[i].opcode == FERRY_OP_WRITE ? &written : &read) += xs[i].done;
    if (written) FERRY_STAT_ADD(&e->stats, bytes_written, written);
    if (read) FERRY_STAT_ADD(&e->stats, bytes_read, read);
    size_t worst = ferry_xfer_worst(xs, n);
    return worst < n ? xs[worst].rc : 0;
}

size_t ferry_xfer_worst(const ferry_xfer_t *xs, size_t n)
{
    size_t first = n;
    for (size_t i = 0; i < n; i++) {
        if (xs[i].rc == FERRY_ERR_CANCEL_UNCONFIRMED) return i;
        if (xs[i].rc && first == n) first = i;
    }
    return first;
}
