/* SPDX-License-Identifier: Apache-2.0 */
/* Sessions: the initiator's cached view of each peer, kept in the engine's
 * table by peer name, and the public session calls. The connection pool
 * and handshake are in session_pool.c, the peer's segment table in
 * session_segments.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "util/clock.h"
#include "engine.h"
#include "util/sized.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/net.h"
#include "link/transport.h"

/* ------------------------------------------------------------ lifecycle */

static ferry_session_t *session_new(ferry_engine_t *e, const char *peer)
{
    ferry_session_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->idle = calloc((size_t)e->cfg.conns_per_peer, sizeof *s->idle);
    if (!s->idle) {
        free(s);
        return NULL;
    }
    snprintf(s->name, sizeof s->name, "%s", peer);
    s->engine = e;
    s->stats = ferry_metrics_peer(&e->metrics, peer);
    s->max_conns = e->cfg.conns_per_peer;
    atomic_store(&s->refs, 1); /* the engine's table holds one */
    pthread_mutex_init(&s->lock, NULL);
    ferry_cond_init_monotonic(&s->cond);
    pthread_rwlock_init(&s->seg_lock, NULL);
    return s;
}

static void session_free(ferry_session_t *s)
{
    for (int i = 0; i < s->nidle; i++) ferry_conn_free(s->idle[i]);
    free(s->idle);
    free(s->segs);
    free(s->unfenced);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    pthread_rwlock_destroy(&s->seg_lock);
    free(s);
}

void ferry_session_put(ferry_session_t *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) session_free(s);
}

/* Marks s closed and drops its idle connections; in-use ones close when
 * they are checked in. */
static void session_invalidate(ferry_session_t *s)
{
    pthread_mutex_lock(&s->lock);
    s->state = SESSION_CLOSED;
    for (int i = 0; i < s->nidle; i++) ferry_conn_free(s->idle[i]);
    s->nconns -= s->nidle;
    s->nidle = 0;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* ---------------------------------------------------------- the table */

/* Sessions by peer name: a hash table whose buckets are guarded by striped
 * locks (bucket i by stripe i % SESSION_STRIPES), so that threads working
 * with different peers look up, open and close without contending; one
 * lock for all, with a list searched under it, serialised every call. A
 * lookup holds its stripe only to find the session and take a reference. */
#define SESSION_STRIPES 64

struct session_stripe {
    _Alignas(64) pthread_mutex_t lock; /* a cache line each: no false sharing */
};

struct ferry_session_table {
    struct session_stripe stripes[SESSION_STRIPES];
    size_t mask;                 /* buckets - 1 (a power of two, >= SESSION_STRIPES) */
    ferry_session_t **buckets;   /* chained through ferry_session.next */
};

int ferry_sessions_init(ferry_engine_t *e)
{
    size_t want = e->cfg.max_sessions < 65536 ? (size_t)e->cfg.max_sessions : 65536, n = SESSION_STRIPES;
    while (n < want) n *= 2;
    struct ferry_session_table *t = aligned_alloc(64, sizeof *t);
    ferry_session_t **buckets = calloc(n, sizeof *buckets);
    if (!t || !buckets) {
        free(t);
        free(buckets);
        return ferry_fail(FERRY_ERR_MEMORY, "session table of %zu buckets: out of memory", n);
    }
    memset(t, 0, sizeof *t);
    for (int i = 0; i < SESSION_STRIPES; i++) pthread_mutex_init(&t->stripes[i].lock, NULL);
    t->mask = n - 1;
    t->buckets = buckets;
    e->session_table = t;
    atomic_store(&e->nsessions, 0);
    return 0;
}

void ferry_sessions_free(ferry_engine_t *e)
{
    struct ferry_session_table *t = e->session_table;
    if (!t) return;
    for (int i = 0; i < SESSION_STRIPES; i++) pthread_mutex_destroy(&t->stripes[i].lock);
    free(t->buckets);
    free(t);
    e->session_table = NULL;
}

/* FNV-1a over the peer's name. */
static size_t bucket_of(const struct ferry_session_table *t, const char *peer)
{
    uint64_t h = 14695981039346656037ull;
    for (const unsigned char *p = (const unsigned char *)peer; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return (size_t)(h ^ (h >> 32)) & t->mask;
}

static pthread_mutex_t *stripe_of(struct ferry_session_table *t, size_t bucket)
{
    return &t->stripes[bucket % SESSION_STRIPES].lock;
}

/* The session named peer in its bucket (its stripe held), or NULL; with
 * take, taken out of the table. */
static ferry_session_t *find_locked(ferry_engine_t *e, size_t bucket, const char *peer, bool take)
{
    for (ferry_session_t **pp = &e->session_table->buckets[bucket]; *pp; pp = &(*pp)->next) {
        ferry_session_t *s = *pp;
        if (strcmp(s->name, peer) != 0) continue;
        if (take) {
            *pp = s->next;
            atomic_fetch_sub(&e->nsessions, 1);
        }
        return s;
    }
    return NULL;
}

/* Takes s out of the table (for ferry_session_close): NULL when no session
 * is named peer. The table's reference passes to the caller. */
static ferry_session_t *session_remove(ferry_engine_t *e, const char *peer)
{
    size_t b = bucket_of(e->session_table, peer);
    pthread_mutex_lock(stripe_of(e->session_table, b));
    ferry_session_t *s = find_locked(e, b, peer, true);
    pthread_mutex_unlock(stripe_of(e->session_table, b));
    return s;
}

static bool session_restarted(ferry_session_t *s)
{
    pthread_mutex_lock(&s->lock);
    bool restarted = s->state == SESSION_RESTARTED;
    pthread_mutex_unlock(&s->lock);
    return restarted;
}

/* Remembers that epoch is not the peer's current one (s->lock held). */
static void void_epoch_locked(ferry_session_t *s, uint64_t epoch)
{
    size_t cap = sizeof s->void_epochs / sizeof s->void_epochs[0];
    for (size_t i = 0; i < s->nvoid && i < cap; i++)
        if (s->void_epochs[i] == epoch) return;
    s->void_epochs[s->nvoid++ % cap] = epoch;
}

static bool epoch_void_locked(const ferry_session_t *s, uint64_t epoch)
{
    size_t cap = sizeof s->void_epochs / sizeof s->void_epochs[0];
    for (size_t i = 0; i < s->nvoid && i < cap; i++)
        if (s->void_epochs[i] == epoch) return true;
    return false;
}

/* The session re-opened after old's restart knows that old's epoch (and
 * those old knew void) are gone: calls pinned to them fail at once. */
static void inherit_void_epochs(ferry_session_t *s, ferry_session_t *old)
{
    pthread_mutex_lock(&old->lock);
    size_t cap = sizeof s->void_epochs / sizeof s->void_epochs[0];
    for (size_t i = 0; i < old->nvoid && i < cap; i++) void_epoch_locked(s, old->void_epochs[i]);
    if (old->have_peer) void_epoch_locked(s, old->peer.epoch);
    pthread_mutex_unlock(&old->lock);
}

static int session_get_plain(ferry_engine_t *e, const char *peer, ferry_session_t **out)
{
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "engine is NULL");
    if (atomic_load(&e->stopping)) return ferry_fail(FERRY_ERR_CONTEXT, "the engine is shutting down");
    char host[256];
    uint16_t port;
    int rc = ferry_parse_hostport(peer, host, sizeof host, &port);
    if (rc) return rc;
    struct ferry_session_table *t = e->session_table;
    size_t b = bucket_of(t, peer);
    pthread_mutex_lock(stripe_of(t, b));
    ferry_session_t *s = find_locked(e, b, peer, false), *restarted = NULL;
    if (s && session_restarted(s)) {
        /* A restart was found and reported by an earlier call: the next
         * call opens a fresh session, which learns the new process (its
         * epoch, its addresses). Calls still holding the old one keep
         * failing with PEER_RESTARTED: they carry the old addresses. */
        find_locked(e, b, peer, true);
        restarted = s;
        s = NULL;
    }
    if (!s) {
        /* Counted before it is made: two stripes adding at once cannot
         * both take the last place. */
        if (atomic_fetch_add(&e->nsessions, 1) >= e->cfg.max_sessions) {
            atomic_fetch_sub(&e->nsessions, 1);
            pthread_mutex_unlock(stripe_of(t, b));
            ferry_session_put(restarted);
            return ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS, "session to %s: already %d sessions (max_sessions)", peer,
                              e->cfg.max_sessions);
        }
        s = session_new(e, peer);
        if (!s) {
            atomic_fetch_sub(&e->nsessions, 1);
            pthread_mutex_unlock(stripe_of(t, b));
            ferry_session_put(restarted);
            return ferry_fail(FERRY_ERR_MEMORY, "session to %s: out of memory", peer);
        }
        snprintf(s->host, sizeof s->host, "%s", host);
        s->port = port;
        if (restarted) inherit_void_epochs(s, restarted);
        s->next = t->buckets[b];
        t->buckets[b] = s;
    }
    atomic_fetch_add(&s->refs, 1);
    pthread_mutex_unlock(stripe_of(t, b));
    if (restarted) {
        FERRY_LOG(FERRY_LOG_INFO, "session", "%s: re-opened after the peer's restart", peer);
        ferry_session_put(restarted); /* the table's reference */
    }
    *out = s;
    return 0;
}

/* ------------------------------------------------------- pinned names */

int ferry_peer_name_split(const char *peer, char *plain, size_t cap, uint64_t *epoch, bool *pinned)
{
    if (!peer) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "peer name is NULL");
    const char *hash = strchr(peer, '#');
    size_t len = hash ? (size_t)(hash - peer) : strlen(peer);
    if (len >= cap) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "peer name '%.64s...' is too long", peer);
    memcpy(plain, peer, len);
    plain[len] = '\0';
    *pinned = hash != NULL;
    *epoch = 0;
    if (!hash) return 0;
    const char *hex = hash + 1;
    size_t digits = strspn(hex, "0123456789abcdefABCDEF");
    if (digits == 0 || digits > 16 || hex[digits] != '\0')
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "peer name '%s': after '#' comes the peer's epoch, 1 to 16 hex digits without 0x "
                          "(\"host:port#1a2b3c4d5e6f7081\", as ferry_session_pin writes it)",
                          peer);
    for (size_t i = 0; i < digits; i++) {
        char c = hex[i];
        unsigned v = c <= '9' ? (unsigned)(c - '0') : (unsigned)((c | 0x20) - 'a' + 10);
        *epoch = *epoch << 4 | v;
    }
    return 0;
}

/* A pinned call's check, before any byte of it leaves: 0 when the session
 * s is of the pinned epoch, PEER_RESTARTED when it is not, 1 when s was
 * found restarted meanwhile (look the session up again: it is re-opened).
 * A session's epoch is that of its first handshake and never changes:
 * every later connection of it handshakes expecting that epoch, one that
 * meets another marks the session restarted (check_epoch), and a restarted
 * session hands out no connection. So every connection a pinned call's
 * bytes travel on, one re-opened mid-call included, was handshaken with
 * the pinned epoch, and a batch holding s checks it again when it runs. */
static int pin_verdict(ferry_session_t *s, uint64_t pin)
{
    ferry_engine_t *e = s->engine;
    uint64_t deadline = ferry_deadline_after_ms(e->cfg.connect_timeout_ms);
    ferry_conn_t *c;
    int rc = 0;
    if (!ferry_session_known(s)) { /* learn the peer's epoch: one handshake */
        rc = ferry_session_checkout(s, deadline, &c);
        if (rc == 0) ferry_session_checkin(s, c, true);
        if (rc == FERRY_ERR_PEER_RESTARTED) return 1;
        if (rc) return rc;
    }
    pthread_mutex_lock(&s->lock);
    bool restarted = s->state == SESSION_RESTARTED;
    uint64_t now = s->peer.epoch;
    bool known_void = epoch_void_locked(s, pin);
    pthread_mutex_unlock(&s->lock);
    if (restarted) return 1;
    if (now == pin) return 0;
    if (!known_void) {
        /* The pin may be newer than this session (the peer restarted and
         * no call has met it yet): a fresh handshake tells. It expects the
         * session's epoch, so a restart marks the session restarted. */
        rc = ferry_session_checkout_spare(s, deadline, true, &c);
        if (rc == 0) ferry_session_checkin(s, c, true);
        if (rc == FERRY_ERR_PEER_RESTARTED) return 1;
        if (rc) return ferry_fail_context("checking %s's epoch against the pinned %016llx", s->name,
                                          (unsigned long long)pin);
        pthread_mutex_lock(&s->lock);
        void_epoch_locked(s, pin); /* the peer is at `now`: the pin is of another process */
        pthread_mutex_unlock(&s->lock);
    }
    return ferry_fail(FERRY_ERR_PEER_RESTARTED,
                      "peer %s is at epoch %016llx and this call is pinned to epoch %016llx: its addresses "
                      "are another process's, so nothing was sent (pinned calls fail so every time; learn "
                      "the new addresses and pin them with ferry_session_pin)",
                      s->name, (unsigned long long)now, (unsigned long long)pin);
}

int ferry_session_get(ferry_engine_t *e, const char *peer, ferry_session_t **out)
{
    char plain[256];
    uint64_t pin;
    bool pinned;
    int rc = ferry_peer_name_split(peer, plain, sizeof plain, &pin, &pinned);
    if (rc) return rc;
    for (int round = 0;; round++) {
        ferry_session_t *s = NULL;
        rc = session_get_plain(e, plain, &s);
        if (rc || !pinned) {
            if (rc == 0) *out = s;
            return rc;
        }
        rc = pin_verdict(s, pin);
        if (rc == 0) {
            *out = s;
            return 0;
        }
        ferry_session_put(s);
        if (rc < 0) return rc;
        if (round == 1)
            return ferry_fail(FERRY_ERR_PEER_RESTARTED, "peer %s restarted twice while a call pinned to epoch "
                                                        "%016llx looked it up", plain, (unsigned long long)pin);
    }
}

/* Opens the session if needed; its epoch, that of its first handshake. */
static int session_pin(ferry_engine_t *e, const char *peer, char *out, size_t cap)
{
    ferry_clear_last_error();
    if (!out || cap == 0) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "session pin: out is NULL or cap 0");
    ferry_session_t *s;
    int rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    if (!ferry_session_known(s)) {
        ferry_conn_t *c;
        rc = ferry_session_checkout(s, ferry_deadline_after_ms(e->cfg.connect_timeout_ms), &c);
        if (rc == 0) ferry_session_checkin(s, c, true);
    }
    if (rc == 0) {
        pthread_mutex_lock(&s->lock);
        uint64_t epoch = s->peer.epoch;
        pthread_mutex_unlock(&s->lock);
        int n = snprintf(out, cap, "%s#%016llx", s->name, (unsigned long long)epoch);
        if (n < 0 || (size_t)n >= cap)
            rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "session pin: %d bytes do not fit in %zu", n + 1, cap);
    }
    if (rc) ferry_fail_context("pin %s", peer);
    ferry_session_put(s);
    return rc;
}

void ferry_sessions_destroy(ferry_engine_t *e)
{
    struct ferry_session_table *t = e->session_table;
    for (size_t b = 0; b <= t->mask; b++) {
        pthread_mutex_lock(stripe_of(t, b));
        ferry_session_t *s = t->buckets[b];
        t->buckets[b] = NULL;
        pthread_mutex_unlock(stripe_of(t, b));
        while (s) {
            ferry_session_t *next = s->next;
            atomic_fetch_sub(&e->nsessions, 1);
            session_invalidate(s);
            ferry_session_put(s);
            s = next;
        }
    }
}

void ferry_sessions_interrupt(ferry_engine_t *e)
{
    pthread_mutex_lock(&e->busy_lock);
    /* Listed connections are open: they leave the list before closing. */
    for (ferry_conn_t *c = e->busy; c; c = c->busy_next) shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&e->busy_lock);
    /* Waits for a connection see the engine stopping. A session out of the
     * table (closed, or replaced after a restart) is woken by the checkins
     * of its interrupted connections (ferry_session_checkin). */
    struct ferry_session_table *t = e->session_table;
    for (size_t b = 0; b <= t->mask; b++) {
        pthread_mutex_lock(stripe_of(t, b));
        for (ferry_session_t *s = t->buckets[b]; s; s = s->next) ferry_session_wake(s);
        pthread_mutex_unlock(stripe_of(t, b));
    }
}

/* ------------------------------------------------------------- public API */

static int session_open(ferry_engine_t *e, const char *peer)
{
    ferry_clear_last_error();
    ferry_session_t *s = NULL; /* set when get succeeds (GCC cannot tell once this is inlined) */
    int rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    pthread_mutex_lock(&s->lock);
    int state = s->state;
    pthread_mutex_unlock(&s->lock);
    if (state != SESSION_OK) {
        /* Opening again after a restart is how a caller re-learns the peer. */
        ferry_session_put(s);
        ferry_session_close(e, peer);
        rc = ferry_session_get(e, peer, &s);
        if (rc) return rc;
    }
    rc = ferry_session_refresh_segments(s, ferry_deadline_after_ms(e->cfg.connect_timeout_ms));
    if (rc) {
        ferry_count_failure(e, rc);
        ferry_fail_context("open session to %s", peer);
    }
    ferry_session_put(s);
    return rc;
}

int ferry_session_close(ferry_engine_t *e, const char *peer)
{
    ferry_clear_last_error();
    if (!e || !peer) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "session close: NULL argument");
    char plain[256];
    uint64_t pin;
    bool pinned;
    int rc = ferry_peer_name_split(peer, plain, sizeof plain, &pin, &pinned);
    if (rc) return rc;
    ferry_session_t *s = session_remove(e, plain); /* pinned or not: the one session of host:port */
    if (!s) return ferry_fail(FERRY_ERR_NOT_FOUND, "no session to %s", plain);
    session_invalidate(s);
    ferry_session_put(s);
    return 0;
}

/* Fills the whole struct (this library's size). */
static int session_info_all(ferry_engine_t *e, const char *peer, ferry_peer_info_t *info)
{
    ferry_session_t *s;
    int rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    bool known = ferry_session_known(s);
    if (!known) rc = ferry_session_refresh_segments(s, ferry_deadline_after_ms(e->cfg.connect_timeout_ms));
    if (rc == 0) {
        memset(info, 0, sizeof *info);
        pthread_mutex_lock(&s->lock);
        snprintf(info->name, sizeof info->name, "%s", s->name);
        unsigned ours = ferry_engine_proto_max(e);
        info->protocol_version = s->peer.proto_max < ours ? s->peer.proto_max : ours;
        info->engine_id = s->peer.engine_id;
        info->epoch = s->peer.epoch;
        info->pid = s->peer.pid;
        info->same_host = memcmp(s->peer.host_id, e->host_id, sizeof e->host_id) == 0;
        snprintf(info->transport, sizeof info->transport, "%s", s->transport ? s->transport->name : "none");
        snprintf(info->transport_reason, sizeof info->transport_reason, "%s", s->transport_reason);
        pthread_mutex_unlock(&s->lock);
        pthread_rwlock_rdlock(&s->seg_lock);
        info->segment_version = s->seg_version;
        info->segment_count = s->nsegs;
        pthread_rwlock_unlock(&s->seg_lock);
    }
    ferry_session_put(s);
    return rc;
}

int (ferry_session_info)(ferry_engine_t *e, const char *peer, ferry_peer_info_t *info)
{
    ferry_clear_last_error();
    if (!info) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "session info: info is NULL");
    int rc = ferry_sized_check(info, FERRY_PEER_INFO_SIZE_0_1, "session info");
    if (rc) return rc;
    rc = e ? ferry_engine_enter(e) : 0; /* destroy waits for it (engine.h) */
    if (rc) return rc;
    ferry_peer_info_t all;
    rc = session_info_all(e, peer, &all);
    if (e) rc = ferry_engine_leave(e, rc);
    if (rc == 0) ferry_sized_export(info, &all, sizeof all);
    return rc;
}

static long session_segments(ferry_engine_t *e, const char *peer, ferry_segment_t *out, size_t max)
{
    ferry_clear_last_error();
    if (!out && max) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "session segments: out is NULL");
    ferry_session_t *s;
    int rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    rc = ferry_session_refresh_segments(s, ferry_deadline_after_ms(e->cfg.timeout_ms));
    long n = rc;
    if (rc == 0) {
        pthread_rwlock_rdlock(&s->seg_lock);
        size_t k = s->nsegs < max ? s->nsegs : max;
        if (k) memcpy(out, s->segs, k * sizeof *out);
        n = (long)s->nsegs;
        pthread_rwlock_unlock(&s->seg_lock);
    }
    ferry_session_put(s);
    return n;
}

static int session_ping(ferry_engine_t *e, const char *peer, uint64_t *rtt_us)
{
    ferry_clear_last_error();
    if (!rtt_us) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "ping: rtt_us is NULL");
    ferry_session_t *s;
    int rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    uint64_t deadline = ferry_deadline_after_ms(e->cfg.timeout_ms);
    ferry_conn_t *c;
    rc = ferry_session_checkout(s, deadline, &c);
    if (rc == 0) {
        uint64_t id = atomic_fetch_add(&e->next_req_id, 1);
        ferry_frame_t f = {.type = FERRY_FRAME_PING, .req_id = id};
        uint64_t t0 = ferry_now_ns();
        rc = ferry_conn_send_frame(c, &f, NULL, deadline);
        if (rc == 0) rc = ferry_conn_recv_frame(c, &f, deadline);
        if (rc == 0 && (f.type != FERRY_FRAME_PONG || f.req_id != id))
            rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected PONG %llu, got %s %llu", (unsigned long long)id,
                            ferry_frame_type_name(f.type), (unsigned long long)f.req_id);
        *rtt_us = (ferry_now_ns() - t0) / 1000;
        ferry_session_checkin(s, c, rc == 0);
    }
    if (rc) ferry_fail_context("ping %s", peer);
    ferry_session_put(s);
    return rc;
}

/* The calls that talk to a peer run inside the engine's count of calls in
 * progress, so that destroy wakes them and waits for them (engine.h). */

int ferry_session_open(ferry_engine_t *e, const char *peer)
{
    int rc = e ? ferry_engine_enter(e) : 0;
    if (rc) return rc;
    rc = session_open(e, peer);
    return e ? ferry_engine_leave(e, rc) : rc;
}

long ferry_session_segments(ferry_engine_t *e, const char *peer, ferry_segment_t *out, size_t max)
{
    int rc = e ? ferry_engine_enter(e) : 0;
    if (rc) return rc;
    long n = session_segments(e, peer, out, max);
    if (!e) return n;
    rc = ferry_engine_leave(e, n < 0 ? (int)n : 0);
    return rc ? rc : n;
}

int ferry_session_pin(ferry_engine_t *e, const char *peer, char *out, size_t cap)
{
    int rc = e ? ferry_engine_enter(e) : 0;
    if (rc) return rc;
    rc = session_pin(e, peer, out, cap);
    return e ? ferry_engine_leave(e, rc) : rc;
}

int ferry_session_ping(ferry_engine_t *e, const char *peer, uint64_t *rtt_us)
{
    int rc = e ? ferry_engine_enter(e) : 0;
    if (rc) return rc;
    rc = session_ping(e, peer, rtt_us);
    return e ? ferry_engine_leave(e, rc) : rc;
}
