/* SPDX-License-Identifier: Apache-2.0 */
/* Cancel and expiry without late writes, the initiator's side: the
 * interrupt that wakes a blocked stream, the fence, and settling pieces.
 * The target's cancel set is in cancel.c. The protocol is described in
 * cancel.h. */
#include "link/cancel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "util/clock.h"
#include "parts.h"
#include "session.h"
#include "link/conn.h"
#include "link/piece.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/net.h"
#include "testing.h"

/* ------------------------------------------------------- stream control */

void ferry_stream_ctl_init(ferry_stream_ctl_t *ctl, ferry_session_t *s)
{
    pthread_mutex_init(&ctl->lock, NULL);
    ctl->fd = -1;
    ctl->fired = false;
    atomic_store(&ctl->poke, false);
    ctl->session = s;
}

void ferry_stream_ctl_destroy(ferry_stream_ctl_t *ctl) { pthread_mutex_destroy(&ctl->lock); }

void ferry_stream_ctl_arm(ferry_stream_ctl_t *ctl, int fd)
{
    if (!ctl) return;
    pthread_mutex_lock(&ctl->lock);
    ctl->fd = fd;
    ctl->fired = false;
    pthread_mutex_unlock(&ctl->lock);
}

bool ferry_stream_ctl_disarm(ferry_stream_ctl_t *ctl)
{
    if (!ctl) return false;
    pthread_mutex_lock(&ctl->lock);
    bool fired = ctl->fired;
    ctl->fd = -1;
    ctl->fired = false;
    pthread_mutex_unlock(&ctl->lock);
    return fired;
}

void ferry_stream_ctl_fire(ferry_stream_ctl_t *ctl)
{
    if (!ctl) return;
    pthread_mutex_lock(&ctl->lock);
    /* The fd stays open while armed (the stream disarms before checking the
     * connection in), so this cannot hit a reused descriptor. */
    if (ctl->fd >= 0 && !ctl->fired) {
        shutdown(ctl->fd, SHUT_RDWR);
        ctl->fired = true;
    } else if (ctl->fd < 0) {
        atomic_store(&ctl->poke, true);
    }
    ferry_session_t *s = ctl->session;
    pthread_mutex_unlock(&ctl->lock);
    if (s) ferry_session_wake(s);
}

/* ------------------------------------------------------------ the fence */

/* The CANCELs that fence ids over connection c: to a target that fences
 * whole connections, one naming each distinct connection (F_CONN, echoing
 * the first of its ids); else, and for ids naming no connection, one per
 * id. Fills out (n entries at most); returns how many. */
static size_t fence_frames(ferry_conn_t *c, const ferry_fence_id_t *ids, size_t n, ferry_frame_t *out,
                           bool reports)
{
    bool whole = (c->peer.flags & FERRY_HELLO_F_CONNFENCE) && !ferry_test_no_conn_fence(c->engine);
    bool placed = reports && ferry_fence_reports_placed(c);
    /* The connections whose placement report was asked for: one report
     * each (cancel.h). Few in practice; past the cap no more are asked (their
     * writes in doubt are then not resent). */
    enum { MAX_ASKED = 64 };
    uint64_t asked[MAX_ASKED];
    size_t nasked = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        bool conn = whole && ids[i].conn_key != 0;
        bool seen = false;
        /* Few distinct connections in practice: the last one first. */
        for (size_t j = k; conn && j-- > 0 && !seen;)
            seen = (out[j].flags & FERRY_FRAME_F_CONN) && out[j].aux == ids[i].conn_key;
        if (seen) continue;
        out[k] = (ferry_frame_t){.type = FERRY_FRAME_CANCEL, .flags = conn ? FERRY_FRAME_F_CONN : 0,
                                 .req_id = ids[i].req_id, .aux = ids[i].conn_key};
        bool known = false;
        for (size_t j = nasked; j-- > 0 && !known;) known = asked[j] == ids[i].conn_key;
        if (placed && ids[i].conn_key && !known && nasked < MAX_ASKED) {
            out[k].flags |= FERRY_FRAME_F_PLACED;
            asked[nasked++] = ids[i].conn_key;
        }
        k++;
    }
    return k;
}

bool ferry_fence_reports_placed(const ferry_conn_t *c)
{
    return (c->peer.flags & FERRY_HELLO_F_PLACED) && !ferry_test_no_placed(c->engine);
}

/* The placement reports one fence collected, one per connection key. */
typedef struct fence_report {
    uint64_t conn_key;
    uint8_t *raw;
    ferry_placed_t *entries;
    uint32_t count;
} fence_report_t;

typedef struct fence_reports {
    fence_report_t *r;
    size_t n;
} fence_reports_t;

static void reports_clear(fence_reports_t *rs)
{
    for (size_t i = 0; i < rs->n; i++) {
        free(rs->r[i].raw);
        free(rs->r[i].entries);
    }
    free(rs->r);
    rs->r = NULL;
    rs->n = 0;
}

static const fence_report_t *report_of(const fence_reports_t *rs, uint64_t conn_key)
{
    for (size_t i = rs->n; conn_key && i-- > 0;)
        if (rs->r[i].conn_key == conn_key) return &rs->r[i];
    return NULL;
}

/* Reads the placement report of a CANCEL_ACK (f) for connection conn_key. */
static int read_report(ferry_conn_t *c, const ferry_frame_t *f, uint64_t conn_key, uint64_t deadline,
                       fence_reports_t *rs)
{
    uint8_t *raw = malloc(f->plen ? f->plen : 1);
    if (!raw) return ferry_fail(FERRY_ERR_MEMORY, "placement report: out of memory");
    int rc = ferry_net_recv(c->fd, raw, f->plen, deadline);
    ferry_placed_t *entries = NULL;
    if (rc == 0 && f->len > FERRY_PLACED_LOG_MAX)
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "CANCEL_ACK reports %llu entries", (unsigned long long)f->len);
    if (rc == 0) rc = ferry_placed_decode(raw, f->plen, (uint32_t)f->len, &entries);
    fence_report_t *grown = rc ? NULL : realloc(rs->r, (rs->n + 1) * sizeof *grown);
    if (rc == 0 && !grown) rc = ferry_fail(FERRY_ERR_MEMORY, "placement report: out of memory");
    if (rc) {
        free(raw);
        free(entries);
        return rc;
    }
    rs->r = grown;
    rs->r[rs->n++] = (fence_report_t){conn_key, raw, entries, (uint32_t)f->len};
    return 0;
}

/* Sends the CANCELs fencing every id, each naming its data connection,
 * then reads every CANCEL_ACK. */
static int fence_exchange(ferry_conn_t *c, const ferry_fence_id_t *ids, size_t n, uint64_t deadline,
                          fence_reports_t *rs)
{
    ferry_frame_t *fs = malloc(n * sizeof *fs);
    if (!fs) return ferry_fail(FERRY_ERR_MEMORY, "fencing %zu request(s): out of memory", n);
    size_t k = fence_frames(c, ids, n, fs, rs != NULL);
    int rc = 0;
    for (size_t i = 0; i < k && rc == 0; i++) rc = ferry_conn_send_frame(c, &fs[i], NULL, deadline);
    for (size_t i = 0; i < k && rc == 0; i++) {
        ferry_frame_t f;
        rc = ferry_conn_recv_frame(c, &f, deadline);
        if (rc) break;
        if (f.type == FERRY_FRAME_ERROR) {
            if (f.status < 0) rc = ferry_conn_fail_from_target(c, &f, deadline, NULL, 0);
            else rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "the target refused CANCEL");
        } else if (f.type != FERRY_FRAME_CANCEL_ACK || f.req_id != fs[i].req_id) {
            rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "CANCEL of %s %llu answered by %s for %llu",
                            (fs[i].flags & FERRY_FRAME_F_CONN) ? "the connection of request" : "request",
                            (unsigned long long)fs[i].req_id, ferry_frame_type_name(f.type),
                            (unsigned long long)f.req_id);
        } else if ((f.flags & FERRY_FRAME_F_PLACED) && (fs[i].flags & FERRY_FRAME_F_PLACED)) {
            rc = read_report(c, &f, fs[i].aux, deadline, rs);
        } else if (f.plen) {
            rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "CANCEL_ACK with a payload of %u bytes unasked", f.plen);
        }
    }
    free(fs);
    return rc;
}

/* Whether a failure to reach the target proves that nothing more can land:
 * its listening socket is closed (the engine is destroyed, which first joins
 * every serving thread, or its process died), or another engine with a new
 * epoch answers there (the old memory is gone). Connection refused is
 * reported by net.c as "connect: <strerror>". Assumes no relay between the
 * two that outlives its own listening socket. */
static bool target_gone(int rc)
{
    if (rc == FERRY_ERR_PEER_RESTARTED) return true;
    return rc == FERRY_ERR_SOCKET && strstr(ferry_last_error_detail(), strerror(ECONNREFUSED)) != NULL;
}

/* The share of a fence's budget its first attempt gets (1/FENCE_IDLE_SHARE). */
#define FENCE_IDLE_SHARE 3

static int fence(ferry_session_t *s, const ferry_fence_id_t *ids, size_t n, uint64_t deadline, bool *gone,
                 fence_reports_t *rs)
{
    int rc = 0;
    *gone = false;
    /* Connection failures are tried again on new connections until the
     * deadline: an idle connection may have died unnoticed, and a peer being
     * killed resets connections before its listener closes (then refused:
     * gone). */
    uint64_t pause_ms = 5;
    for (int attempt = 0;; attempt++) {
        ferry_conn_t *c;
        /* The first attempt may take an idle pooled connection, whose path
         * may be as stuck as the stream's was (it went idle before the
         * outage): it gets a third of the budget, and a fresh connection
         * the rest. A CANCEL that arrives twice is answered twice. */
        uint64_t by = deadline;
        if (attempt == 0) {
            uint64_t now = ferry_now_ns();
            if (deadline > now && deadline != UINT64_MAX) by = now + (deadline - now) / FENCE_IDLE_SHARE;
        }
        rc = ferry_session_checkout_spare(s, by, attempt > 0, &c);
        if (rc == 0) {
            if (rs) reports_clear(rs); /* a new attempt asks again */
            rc = fence_exchange(c, ids, n, by, rs);
            ferry_session_checkin(s, c, rc == 0);
        }
        if (rc == 0) return 0;
        if (target_gone(rc)) {
            *gone = true;
            return rc;
        }
        if (attempt == 0 && rc == FERRY_ERR_TIMEOUT && ferry_ms_left(deadline) > 0) {
            FERRY_LOG(FERRY_LOG_DEBUG, "cancel", "fence to %s unanswered on a pooled connection; a fresh one next",
                      s->name);
            continue;
        }
        if (!(rc == FERRY_ERR_PEER_CLOSED || rc == FERRY_ERR_SOCKET) || ferry_ms_left(deadline) == 0) return rc;
        uint64_t until = ferry_now_ns() + pause_ms * 1000000u;
        if (until > deadline) until = deadline;
        struct timespec ts = ferry_deadline_timespec(until);
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        if (pause_ms < 100) pause_ms *= 2;
    }
}

/* Unconfirmed ids kept per session: enough for any realistic outage; past
 * it the oldest are dropped, with a warning. */
#define MAX_UNFENCED 4096

/* With s->lock held: whether id's connection is already remembered and the
 * peer fences connections whole (then one id of it is enough: the fence
 * names the connection). The ids of one stream come in a row. */
static bool unfenced_conn_known(ferry_session_t *s, ferry_fence_id_t id)
{
    if (!id.conn_key || !s->have_peer || !(s->peer.flags & FERRY_HELLO_F_CONNFENCE) ||
        ferry_test_no_conn_fence(s->engine))
        return false;
    for (size_t i = s->nunfenced, seen = 0; i-- > 0 && seen < 16; seen++)
        if (s->unfenced[i].conn_key == id.conn_key) return true;
    return false;
}

static void remember_unfenced(ferry_session_t *s, ferry_fence_id_t id)
{
    pthread_mutex_lock(&s->lock);
    if (s->unfenced && unfenced_conn_known(s, id)) {
        pthread_mutex_unlock(&s->lock);
        return;
    }
    if (!s->unfenced) s->unfenced = calloc(MAX_UNFENCED, sizeof *s->unfenced);
    if (s->unfenced) {
        if (s->nunfenced == MAX_UNFENCED) {
            FERRY_LOG(FERRY_LOG_WARN, "cancel", "%s: more than %d unconfirmed cancels; forgetting the oldest",
                      s->name, MAX_UNFENCED);
            memmove(s->unfenced, s->unfenced + 1, (MAX_UNFENCED - 1) * sizeof *s->unfenced);
            s->nunfenced--;
        }
        s->unfenced[s->nunfenced++] = id;
    }
    pthread_mutex_unlock(&s->lock);
}

void ferry_fence_pending(ferry_session_t *s, uint64_t deadline)
{
    pthread_mutex_lock(&s->lock);
    size_t n = s->nunfenced;
    ferry_fence_id_t *ids = n ? malloc(n * sizeof *ids) : NULL;
    if (ids) memcpy(ids, s->unfenced, n * sizeof *ids);
    pthread_mutex_unlock(&s->lock);
    if (!ids) return;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ferry_fail_message());
    int saved_code = ferry_last_error_code();
    bool gone = false;
    uint64_t cap = ferry_deadline_after_ms(ferry_engine_part_config(s->engine)->cancel_timeout_ms);
    int rc = fence(s, ids, n, cap < deadline ? cap : deadline, &gone, NULL);
    if (rc == 0 || gone) {
        /* Drop what we fenced; ids added meanwhile stay. */
        pthread_mutex_lock(&s->lock);
        memmove(s->unfenced, s->unfenced + n, (s->nunfenced - n) * sizeof *s->unfenced);
        s->nunfenced -= n;
        pthread_mutex_unlock(&s->lock);
        FERRY_LOG(FERRY_LOG_INFO, "cancel", "%s: %zu earlier unconfirmed cancel(s) now confirmed%s", s->name, n,
                  gone ? " (the target is gone)" : "");
    }
    free(ids);
    ferry_fail(saved_code, "%s", saved);
}

/* The entry of report r for write frame (type, req_id, addr), or NULL: the
 * target never began that frame. */
static const ferry_placed_t *entry_of(const fence_report_t *r, bool vec, uint64_t req_id, uint64_t addr)
{
    for (uint32_t i = 0; i < r->count; i++) {
        const ferry_placed_t *p = &r->entries[i];
        bool p_vec = p->type == FERRY_FRAME_WRITEV || p->type == FERRY_FRAME_CMA_VEC;
        if (p->req_id == req_id && p_vec == vec && (vec || p->addr == addr)) return p;
    }
    return NULL;
}

/* Bytes of write piece x that landed beyond x->done by report r, or -1
 * when the report cannot tell (cancel.h). */
static int64_t landed_by_report(const ferry_xfer_t *x, const fence_report_t *r)
{
    if (x->vec_first) {
        const ferry_placed_t *p = entry_of(r, true, x->vec_first, 0);
        if (!p) return 0;
        if (p->state == 2) return -1;
        if (p->refused && x->vec_index < p->len && (p->refused[x->vec_index / 8] >> (x->vec_index % 8)) & 1)
            return 0;
        if (p->placed <= x->vec_off) return 0;
        uint64_t in = p->placed - x->vec_off;
        return (int64_t)(in < x->len ? in : x->len);
    }
    uint64_t done = x->done;
    for (;;) {
        const ferry_placed_t *p = entry_of(r, false, x->req_id, x->remote + done);
        if (!p) break;
        if (p->state == 2) return -1;
        uint64_t add = p->placed < p->len ? p->placed : p->len;
        if (add > x->len - done) add = x->len - done;
        done += add;
        if (add == 0 || add < p->len || done == x->len) break;
    }
    return (int64_t)(done - x->done);
}

/* Settles write piece x that the fence confirmed: its confirmed prefix
 * grows by what the target's placement report says landed (cancel.h); a
 * write whose placement cannot be told fails with cause, not resent. */
static void settle_fenced(ferry_session_t *s, ferry_xfer_t *x, bool gone, const fence_report_t *r, int cause)
{
    if (x->opcode != FERRY_OP_WRITE || x->rc || gone) return; /* reads are resent; a gone target holds nothing */
    int64_t landed = r ? landed_by_report(x, r) : -1;
    if (landed < 0) {
        ferry_xfer_fail(x, ferry_fail(cause ? cause : FERRY_ERR_PEER_CLOSED,
                                      "write of [0x%llx+%llu) to %s: the stream broke (%s) with its answer "
                                      "outstanding and the target cannot tell what landed; not resent, so "
                                      "that nothing lands twice",
                                      (unsigned long long)x->remote, (unsigned long long)x->len, s->name,
                                      ferry_error_name(cause)));
        return;
    }
    if (landed == 0) return;
    x->done += (uint64_t)landed;
    if (x->progress) atomic_fetch_add(x->progress, (uint64_t)landed);
    FERRY_LOG(FERRY_LOG_DEBUG, "cancel", "%s: %lld byte(s) of [0x%llx+%llu) had landed before the break; %s",
              s->name, (long long)landed, (unsigned long long)x->remote, (unsigned long long)x->len,
              x->done == x->len ? "complete, not resent" : "resending the rest");
}

size_t ferry_fence_in_doubt(ferry_session_t *s, ferry_xfer_t *xs, size_t n, int cause, uint64_t conn_key)
{
    size_t doubt = 0;
    for (size_t i = 0; i < n; i++) doubt += xs[i].inflight ? 1 : 0;
    if (doubt == 0) return 0;
    ferry_engine_t *e = s->engine;
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ferry_fail_message());
    int saved_code = ferry_last_error_code();
    uint64_t t0 = ferry_now_ns();
    bool gone = false;
    int rc = FERRY_ERR_MEMORY;
    fence_reports_t reports = {NULL, 0};
    ferry_fence_id_t *ids = malloc(doubt * sizeof *ids);
    if (ids) {
        for (size_t i = 0, k = 0; i < n; i++)
            if (xs[i].inflight) ids[k++] = (ferry_fence_id_t){xs[i].req_id, conn_key};
        rc = fence(s, ids, doubt, ferry_deadline_after_ms(cfg->cancel_timeout_ms), &gone, &reports);
        free(ids);
    } else {
        ferry_fail(rc, "fencing %zu request(s): out of memory", doubt);
    }
    size_t unconfirmed = 0;
    if (rc == 0 || gone) {
        FERRY_LOG(FERRY_LOG_DEBUG, "cancel", "%zu request(s) to %s fenced after %s in %.2f ms%s", doubt, s->name,
                  ferry_error_name(cause), (double)(ferry_now_ns() - t0) / 1e6,
                  gone ? " (the target is gone)" : "");
        const fence_report_t *r = report_of(&reports, conn_key);
        for (size_t i = 0; i < n; i++) {
            if (!xs[i].inflight) continue;
            settle_fenced(s, &xs[i], gone, r, cause);
            xs[i].inflight = 0;
            /* A retry must not be refused as the fenced id. */
            xs[i].req_id = ferry_engine_part_req_ids(e, 1);
        }
    } else {
        char why[512];
        snprintf(why, sizeof why, "%s", ferry_last_error_detail());
        for (size_t i = 0; i < n; i++) {
            ferry_xfer_t *x = &xs[i];
            if (!x->inflight) continue;
            unsigned slices = x->inflight;
            x->inflight = 0;
            unconfirmed++;
            ferry_xfer_fail(x, ferry_fail(FERRY_ERR_CANCEL_UNCONFIRMED,
                                          "%s of [0x%llx+%llu) at %s stopped by %s with %u slice(s) unacknowledged; "
                                          "the target did not confirm the cancel within %d ms (%s), so bytes may "
                                          "still land: do not reuse the pages yet",
                                          x->opcode == FERRY_OP_WRITE ? "write" : "read",
                                          (unsigned long long)x->remote, (unsigned long long)x->len, s->name,
                                          ferry_error_name(cause), slices, cfg->cancel_timeout_ms, why));
            remember_unfenced(s, (ferry_fence_id_t){x->req_id, conn_key});
        }
        FERRY_LOG(FERRY_LOG_WARN, "cancel", "%zu request(s) to %s could not be fenced: %s", unconfirmed, s->name, why);
    }
    reports_clear(&reports);
    ferry_fail(saved_code, "%s", saved);
    return unconfirmed;
}

/* ----------------------------------------------------- notifications */

int ferry_fence_notify(ferry_session_t *s, uint64_t req_id, uint64_t conn_key, int cause)
{
    ferry_engine_t *e = s->engine;
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ferry_fail_message());
    int saved_code = ferry_last_error_code();
    ferry_fence_id_t id = {req_id, conn_key};
    fence_reports_t reports = {NULL, 0};
    bool gone = false;
    int rc = fence(s, &id, 1, ferry_deadline_after_ms(cfg->cancel_timeout_ms), &gone, &reports);
    int out = FERRY_NOTIFY_UNKNOWN;
    if (rc == 0 && !gone) {
        const fence_report_t *r = report_of(&reports, conn_key);
        const ferry_placed_t *p = NULL;
        for (uint32_t i = 0; r && i < r->count && !p; i++)
            if (r->entries[i].type == FERRY_FRAME_NOTIFY && r->entries[i].req_id == req_id) p = &r->entries[i];
        if (r && !p) out = FERRY_NOTIFY_NOT_DELIVERED; /* the target never began it: it never will */
        else if (p && p->state != 2) out = p->placed ? FERRY_NOTIFY_DELIVERED : FERRY_NOTIFY_NOT_DELIVERED;
    } else if (!gone) {
        char why[512];
        snprintf(why, sizeof why, "%s", ferry_last_error_detail());
        remember_unfenced(s, id);
        FERRY_LOG(FERRY_LOG_WARN, "cancel", "a notification to %s could not be fenced: %s", s->name, why);
        reports_clear(&reports);
        return ferry_fail(FERRY_ERR_CANCEL_UNCONFIRMED,
                          "notification to %s stopped by %s with its answer outstanding; the target did not "
                          "confirm the cancel within %d ms (%s), so it may still be delivered",
                          s->name, ferry_error_name(cause), cfg->cancel_timeout_ms, why);
    }
    reports_clear(&reports);
    ferry_fail(saved_code, "%s", saved);
    return out;
}

/* ------------------------------------------------------------ settling */

void ferry_settle_cancelled(ferry_xfer_t *xs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ferry_xfer_t *x = &xs[i];
        if (x->rc == 0 && x->done < x->len && x->inflight == 0 && x->cancel && atomic_load(x->cancel))
            ferry_xfer_fail(x, ferry_fail(FERRY_ERR_CANCELLED, "cancelled after %llu of %llu bytes",
                                          (unsigned long long)x->done, (unsigned long long)x->len));
    }
}

void ferry_settle_ended(ferry_xfer_t *xs, size_t n, bool all)
{
    for (size_t i = 0; i < n; i++) {
        ferry_xfer_t *x = &xs[i];
        if (x->has_ended) continue;
        if (!all && (x->inflight || (x->rc == 0 && x->done < x->len))) continue;
        x->has_ended = true;
        if (x->ended) x->ended(x, x->ended_arg);
    }
}
