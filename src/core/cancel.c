/* Cancel and expiry without late writes: the target's cancel set, the
 * initiator's fence, and the interrupt that wakes a blocked stream. The
 * protocol is described in cancel.h. */
#include "cancel.h"

#include <errno.h>
#include <search.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include "clock.h"
#include "engine.h"
#include "fail.h"
#include "log.h"

/* ------------------------------------------------------- the cancel set */

/* The tree holds ids themselves as keys (no allocation per entry but the
 * node); 0 is never a request id. */
static int compare_ids(const void *pa, const void *pb)
{
    uint64_t a = (uint64_t)(uintptr_t)pa, b = (uint64_t)(uintptr_t)pb;
    return a < b ? -1 : a > b;
}

void ferry_cancel_set_init(ferry_cancel_set_t *cs)
{
    memset(cs, 0, sizeof *cs);
    pthread_mutex_init(&cs->lock, NULL);
    atomic_store(&cs->count, 0);
}

static void free_nothing(void *p) { (void)p; }

void ferry_cancel_set_destroy(ferry_cancel_set_t *cs)
{
    tdestroy(cs->root, free_nothing);
    cs->root = NULL;
    atomic_store(&cs->count, 0);
    pthread_mutex_destroy(&cs->lock);
}

int ferry_cancel_set_add(ferry_cancel_set_t *cs, uint64_t req_id)
{
    _Static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "request ids are kept as tree keys");
    void *key = (void *)(uintptr_t)req_id;
    pthread_mutex_lock(&cs->lock);
    int rc = 0;
    if (!tfind(key, &cs->root, compare_ids)) {
        if (tsearch(key, &cs->root, compare_ids)) {
            atomic_fetch_add(&cs->count, 1);
            rc = 1;
        } else {
            rc = ferry_fail(FERRY_ERR_MEMORY, "cancel of request %llu: out of memory", (unsigned long long)req_id);
        }
    }
    pthread_mutex_unlock(&cs->lock);
    return rc;
}

bool ferry_cancel_set_has(ferry_cancel_set_t *cs, uint64_t req_id)
{
    /* The common case, nothing cancelled, costs one load per chunk. A racing
     * add is ordered by the registry barrier that follows it (cancel.h). */
    if (atomic_load(&cs->count) == 0) return false;
    pthread_mutex_lock(&cs->lock);
    bool found = tfind((void *)(uintptr_t)req_id, &cs->root, compare_ids) != NULL;
    pthread_mutex_unlock(&cs->lock);
    return found;
}

size_t ferry_cancel_set_count(ferry_cancel_set_t *cs) { return atomic_load(&cs->count); }

/* ------------------------------------------- the target's cancel sets */

/* One warning a second at most, with the count of those it stands for: a
 * peer flooding CANCELs must not flood the log too. */
static void warn_refused(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn_refused(const char *fmt, ...)
{
    static _Atomic uint64_t last_ns, suppressed;
    uint64_t now = ferry_now_ns(), last = atomic_load(&last_ns);
    if ((last && now - last < 1000000000ull) || !atomic_compare_exchange_strong(&last_ns, &last, now)) {
        atomic_fetch_add(&suppressed, 1);
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    uint64_t more = atomic_exchange(&suppressed, 0);
    FERRY_LOG(FERRY_LOG_WARN, "cancel", "%s (%llu more refused since the last warning)", msg,
              (unsigned long long)more);
}

uint64_t ferry_cancel_conn_open(ferry_conn_t *c)
{
    uint64_t key = 0;
    while (key == 0)
        if (getrandom(&key, sizeof key, 0) != sizeof key) key = ferry_now_ns() ^ ((uint64_t)(uintptr_t)c << 16);
    atomic_store(&c->cancel_peer, c->peer.engine_id);
    atomic_store(&c->cancel_key, key);
    return key;
}

bool ferry_conn_is_cancelled(ferry_conn_t *c, uint64_t req_id)
{
    ferry_cancel_set_t *cs = atomic_load_explicit(&c->cancels, memory_order_acquire);
    return req_id && cs && ferry_cancel_set_has(cs, req_id);
}

void ferry_cancel_conn_close(ferry_conn_t *c)
{
    ferry_cancel_set_t *cs = atomic_exchange(&c->cancels, NULL);
    if (!cs) return;
    atomic_fetch_sub(&c->engine->cancels_held, ferry_cancel_set_count(cs));
    ferry_cancel_set_destroy(cs);
    free(cs);
}

size_t ferry_cancel_engine_count(ferry_engine_t *e) { return atomic_load(&e->cancels_held); }

/* With e->conns_lock held: refuses frames of req_id on data connection c. */
static int record_on(ferry_engine_t *e, ferry_conn_t *c, uint64_t req_id)
{
    ferry_cancel_set_t *cs = atomic_load(&c->cancels);
    if (!cs) {
        cs = malloc(sizeof *cs);
        if (!cs) return ferry_fail(FERRY_ERR_MEMORY, "cancel of request %llu: out of memory", (unsigned long long)req_id);
        ferry_cancel_set_init(cs);
        atomic_store_explicit(&c->cancels, cs, memory_order_release);
    }
    if (ferry_cancel_set_has(cs, req_id)) return 0;
    int rc = 0;
    if (ferry_cancel_set_count(cs) >= FERRY_CANCEL_CONN_MAX)
        rc = ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS,
                        "cancel of request %llu refused: the connection from %s (calling itself %s) already "
                        "refuses %u cancelled requests",
                        (unsigned long long)req_id, c->remote, c->peer.name, FERRY_CANCEL_CONN_MAX);
    else if (atomic_load(&e->cancels_held) >= FERRY_CANCEL_ENGINE_MAX)
        rc = ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS,
                        "cancel of request %llu refused: this engine's connections already refuse %u cancelled "
                        "requests",
                        (unsigned long long)req_id, FERRY_CANCEL_ENGINE_MAX);
    if (rc) {
        warn_refused("%s", ferry_fail_message());
        return rc;
    }
    rc = ferry_cancel_set_add(cs, req_id);
    if (rc == 1) atomic_fetch_add(&e->cancels_held, 1);
    return rc < 0 ? rc : 0;
}

int ferry_cancel_record(ferry_conn_t *via, uint64_t req_id, uint64_t conn_key)
{
    ferry_engine_t *e = via->engine;
    uint64_t peer = via->peer.engine_id;
    int rc = 0;
    pthread_mutex_lock(&e->conns_lock);
    for (ferry_conn_t *c = e->conns; c && rc == 0; c = c->next) {
        /* Another engine's connection is never touched, whatever it names. */
        if (atomic_load(&c->cancel_peer) != peer || atomic_load(&c->done)) continue;
        uint64_t key = atomic_load(&c->cancel_key);
        if (key == 0 || (conn_key && key != conn_key)) continue;
        rc = record_on(e, c, req_id);
    }
    pthread_mutex_unlock(&e->conns_lock);
    return rc;
}

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

/* Sends CANCEL for every id, each naming its data connection, then reads
 * every CANCEL_ACK. */
static int fence_exchange(ferry_conn_t *c, const ferry_fence_id_t *ids, size_t n, uint64_t deadline)
{
    for (size_t i = 0; i < n; i++) {
        ferry_frame_t f = {.type = FERRY_FRAME_CANCEL, .req_id = ids[i].req_id, .aux = ids[i].conn_key};
        int rc = ferry_conn_send_frame(c, &f, NULL, deadline);
        if (rc) return rc;
    }
    for (size_t i = 0; i < n; i++) {
        ferry_frame_t f;
        int rc = ferry_conn_recv_frame(c, &f, deadline);
        if (rc) return rc;
        if (f.type == FERRY_FRAME_ERROR) {
            if (f.status < 0) return ferry_conn_fail_from_target(c, &f, deadline, NULL, 0);
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "the target refused CANCEL");
        }
        if (f.type != FERRY_FRAME_CANCEL_ACK || f.req_id != ids[i].req_id)
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "CANCEL of request %llu answered by %s for %llu",
                              (unsigned long long)ids[i].req_id, ferry_frame_type_name(f.type),
                              (unsigned long long)f.req_id);
    }
    return 0;
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

static int fence(ferry_session_t *s, const ferry_fence_id_t *ids, size_t n, uint64_t deadline, bool *gone)
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
        rc = ferry_session_checkout_spare(s, deadline, attempt > 0, &c);
        if (rc == 0) {
            rc = fence_exchange(c, ids, n, deadline);
            ferry_session_checkin(s, c, rc == 0);
        }
        if (rc == 0) return 0;
        if (target_gone(rc)) {
            *gone = true;
            return rc;
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

static void remember_unfenced(ferry_session_t *s, ferry_fence_id_t id)
{
    pthread_mutex_lock(&s->lock);
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
    uint64_t cap = ferry_deadline_after_ms(s->engine->cfg.cancel_timeout_ms);
    int rc = fence(s, ids, n, cap < deadline ? cap : deadline, &gone);
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

size_t ferry_fence_in_doubt(ferry_session_t *s, ferry_xfer_t *xs, size_t n, int cause, uint64_t conn_key)
{
    size_t doubt = 0;
    for (size_t i = 0; i < n; i++) doubt += xs[i].inflight ? 1 : 0;
    if (doubt == 0) return 0;
    ferry_engine_t *e = s->engine;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ferry_fail_message());
    int saved_code = ferry_last_error_code();
    uint64_t t0 = ferry_now_ns();
    bool gone = false;
    int rc = FERRY_ERR_MEMORY;
    ferry_fence_id_t *ids = malloc(doubt * sizeof *ids);
    if (ids) {
        for (size_t i = 0, k = 0; i < n; i++)
            if (xs[i].inflight) ids[k++] = (ferry_fence_id_t){xs[i].req_id, conn_key};
        rc = fence(s, ids, doubt, ferry_deadline_after_ms(e->cfg.cancel_timeout_ms), &gone);
        free(ids);
    } else {
        ferry_fail(rc, "fencing %zu request(s): out of memory", doubt);
    }
    size_t unconfirmed = 0;
    if (rc == 0 || gone) {
        FERRY_LOG(FERRY_LOG_DEBUG, "cancel", "%zu request(s) to %s fenced after %s in %.2f ms%s", doubt, s->name,
                  ferry_error_name(cause), (double)(ferry_now_ns() - t0) / 1e6,
                  gone ? " (the target is gone)" : "");
        for (size_t i = 0; i < n; i++) {
            if (!xs[i].inflight) continue;
            xs[i].inflight = 0;
            /* A retry must not be refused as the fenced id. */
            xs[i].req_id = atomic_fetch_add(&e->next_req_id, 1);
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
                                          ferry_error_name(cause), slices, e->cfg.cancel_timeout_ms, why));
            remember_unfenced(s, (ferry_fence_id_t){x->req_id, conn_key});
        }
        FERRY_LOG(FERRY_LOG_WARN, "cancel", "%zu request(s) to %s could not be fenced: %s", unconfirmed, s->name, why);
    }
    ferry_fail(saved_code, "%s", saved);
    return unconfirmed;
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
