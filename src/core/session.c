/* Sessions: the initiator's cached view of each peer, its connection pool,
 * the versioned handshake with epoch checks, and the peer's segment table. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "clock.h"
#include "directory.h"
#include "engine.h"
#include "sized.h"
#include "testing.h"
#include "fail.h"
#include "log.h"
#include "net.h"
#include "transport/transport.h"

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

int ferry_session_get(ferry_engine_t *e, const char *peer, ferry_session_t **out)
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

/* Whether a handshake has told us who the peer is. */
static bool session_known(ferry_session_t *s)
{
    pthread_mutex_lock(&s->lock);
    bool known = s->have_peer;
    pthread_mutex_unlock(&s->lock);
    return known;
}

/* ------------------------------------------------------------ handshake */

/* Receives HELLO_ACK into ack (its payload, for the auth transcript);
 * returns 0, PEER_RESTARTED (left for check_epoch) or the refusal. */
static int recv_hello_ack(ferry_conn_t *c, ferry_session_t *s, uint8_t *ack, size_t cap, size_t *alen,
                          uint64_t deadline)
{
    ferry_engine_t *e = s->engine;
    ferry_frame_t f;
    int rc = ferry_conn_recv_frame(c, &f, deadline);
    if (rc) return rc;
    if (f.type == FERRY_FRAME_ERROR) {
        char text[FERRY_WIRE_MAX_REASON + 1];
        size_t n = f.plen < sizeof text - 1 ? f.plen : sizeof text - 1;
        if (ferry_net_recv(c->fd, text, n, deadline) != 0) n = 0;
        text[n] = '\0';
        return ferry_fail(f.status ? f.status : FERRY_ERR_REJECT_HANDSHAKE, "peer %s refused us: %s", s->name, text);
    }
    if (f.type != FERRY_FRAME_HELLO_ACK)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "peer %s answered HELLO with %s", s->name,
                          ferry_frame_type_name(f.type));
    if (f.plen > cap)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "HELLO_ACK from %s has %u bytes", s->name, f.plen);
    rc = ferry_net_recv(c->fd, ack, f.plen, deadline);
    if (rc) return rc;
    *alen = f.plen;
    atomic_store(&c->cancel_key, f.aux); /* names this connection in CANCELs (cancel.h) */
    rc = ferry_hello_decode(ack, f.plen, &c->peer);
    if (rc) return rc;
    int ours = ferry_protocol_version_advertised(e);
    if (f.status == FERRY_ERR_VERSION_MISMATCH)
        return ferry_fail(FERRY_ERR_VERSION_MISMATCH, "peer %s speaks protocol %u..%u, this engine speaks %d..%d",
                          s->name, c->peer.proto_min, c->peer.proto_max, ferry_test_protocol_version(e) ? ours : 1, ours);
    if (f.status == FERRY_ERR_AUTH_FAILED) {
        FERRY_STAT_ADD(&e->stats, auth_failures, 1);
        bool they = (c->peer.flags & FERRY_HELLO_F_AUTH) != 0;
        if (they && !e->cfg.secret)
            return ferry_fail(FERRY_ERR_AUTH_FAILED,
                              "peer %s requires a shared secret and this engine has none (set config.secret or "
                              "FERRY_SECRET to the peer's)",
                              s->name);
        if (!they && e->cfg.secret)
            return ferry_fail(FERRY_ERR_AUTH_FAILED,
                              "peer %s has no shared secret configured and this engine requires one (set the same "
                              "secret on both)",
                              s->name);
        return ferry_fail(FERRY_ERR_AUTH_FAILED, "peer %s refused the handshake's authentication", s->name);
    }
    if (f.status == FERRY_ERR_TOO_MANY_REQUESTS)
        return ferry_fail(f.status, "peer %s refused the connection: it serves as many as it may, all busy "
                                    "(its config.max_connections)", s->name);
    if (f.status && f.status != FERRY_ERR_PEER_RESTARTED)
        return ferry_fail(f.status, "peer %s refused the handshake", s->name);
    return f.status;
}

static bool nonce_is_zero(const uint8_t *n)
{
    uint8_t acc = 0;
    for (int i = 0; i < FERRY_WIRE_NONCE_SIZE; i++) acc |= n[i];
    return acc == 0;
}

/* The initiator's half of the mutual shared-secret check (see auth.h):
 * an engine with a secret talks only to engines proving the same secret,
 * and one without a secret only to engines without. */
static int authenticate(ferry_conn_t *c, ferry_session_t *s, const uint8_t *hello, size_t hlen, const uint8_t *ack,
                        size_t alen, uint64_t deadline)
{
    ferry_engine_t *e = s->engine;
    bool we = e->cfg.secret != NULL, they = (c->peer.flags & FERRY_HELLO_F_AUTH) != 0;
    int rc = 0;
    if (!we && !they) return 0;
    if (we && !they)
        rc = ferry_fail(FERRY_ERR_AUTH_FAILED,
                        "peer %s does not authenticate (it has no shared secret) and this engine requires it",
                        s->name);
    else if (!we)
        rc = ferry_fail(FERRY_ERR_AUTH_FAILED, "peer %s requires a shared secret and this engine has none",
                        s->name);
    else if (nonce_is_zero(c->peer.nonce))
        rc = ferry_fail(FERRY_ERR_AUTH_FAILED, "peer %s sent no authentication nonce", s->name);
    if (rc) {
        FERRY_STAT_ADD(&e->stats, auth_failures, 1);
        return rc;
    }
    uint8_t mac[FERRY_WIRE_MAC_SIZE], want[FERRY_WIRE_MAC_SIZE];
    rc = ferry_auth_mac(e->cfg.secret, FERRY_AUTH_INITIATOR, hello, hlen, ack, alen, mac);
    if (rc) return rc;
    ferry_frame_t f = {.type = FERRY_FRAME_AUTH, .plen = FERRY_WIRE_MAC_SIZE};
    rc = ferry_conn_send_frame(c, &f, mac, deadline);
    if (rc == 0) rc = ferry_conn_recv_frame(c, &f, deadline);
    if (rc) return rc == FERRY_ERR_PEER_CLOSED ? ferry_fail_context("authenticating with %s", s->name) : rc;
    if (f.type == FERRY_FRAME_AUTH_ACK && f.status == FERRY_ERR_AUTH_FAILED) {
        FERRY_STAT_ADD(&e->stats, auth_failures, 1);
        return ferry_fail(FERRY_ERR_AUTH_FAILED,
                          "peer %s rejected this engine's MAC: the two engines' shared secrets differ", s->name);
    }
    if (f.type == FERRY_FRAME_AUTH_ACK && f.status == FERRY_ERR_TOO_MANY_REQUESTS)
        return ferry_fail(f.status, "peer %s refused the connection: it serves as many as it may, all busy "
                                    "(its config.max_connections)", s->name);
    if (f.type != FERRY_FRAME_AUTH_ACK || f.status != 0 || f.plen != FERRY_WIRE_MAC_SIZE)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "peer %s answered AUTH with %s (status %d, %u bytes)", s->name,
                          ferry_frame_type_name(f.type), f.status, f.plen);
    rc = ferry_net_recv(c->fd, mac, sizeof mac, deadline);
    if (rc == 0) rc = ferry_auth_mac(e->cfg.secret, FERRY_AUTH_TARGET, hello, hlen, ack, alen, want);
    if (rc) return rc;
    if (!ferry_auth_equal(mac, want)) {
        FERRY_STAT_ADD(&e->stats, auth_failures, 1);
        return ferry_fail(FERRY_ERR_AUTH_FAILED,
                          "peer %s failed to prove it holds the shared secret (its MAC is wrong); not trusting it",
                          s->name);
    }
    return 0;
}

/* Compares the handshake's epoch with the one the session knew. */
static int check_epoch(ferry_session_t *s, const ferry_hello_t *peer)
{
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    if (s->have_peer && peer->epoch != s->peer.epoch) {
        if (s->state == SESSION_OK) FERRY_STAT_ADD(&s->engine->stats, peer_restarts, 1);
        s->state = SESSION_RESTARTED;
        rc = ferry_fail(FERRY_ERR_PEER_RESTARTED,
                        "peer %s restarted: epoch %016llx became %016llx; its old addresses are void "
                        "(nothing was written; the next call re-opens the session: fetch the new addresses)",
                        s->name, (unsigned long long)s->peer.epoch, (unsigned long long)peer->epoch);
    } else if (!s->have_peer) {
        s->peer = *peer;
        s->have_peer = true;
        s->transport = ferry_transport_choose(s->engine, peer, s->transport_reason, sizeof s->transport_reason);
        FERRY_LOG(FERRY_LOG_INFO, "session", "%s: transport %s (%s)", s->name,
                  s->transport ? s->transport->name : "none", s->transport_reason);
    }
    pthread_mutex_unlock(&s->lock);
    /* Its cached directory entry is of the old process: look it up anew. */
    if (rc == FERRY_ERR_PEER_RESTARTED) ferry_directory_forget(s->engine, s->name);
    if (rc == 0 && !s->transport)
        rc = ferry_fail(FERRY_ERR_ENDPOINT, "no transport reaches %s: %s", s->name, s->transport_reason);
    return rc;
}

static int handshake(ferry_conn_t *c, ferry_session_t *s, uint64_t deadline)
{
    ferry_engine_t *e = s->engine;
    ferry_hello_t mine;
    ferry_hello_fill(e, &mine);
    pthread_mutex_lock(&s->lock);
    mine.expect_epoch = s->have_peer ? s->peer.epoch : 0;
    pthread_mutex_unlock(&s->lock);
    if (e->cfg.secret && nonce_is_zero(mine.nonce))
        return ferry_fail(FERRY_ERR_INTERNAL, "handshake with %s: no nonce could be made", s->name);
    uint8_t hello[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME], ack[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    int n = ferry_hello_encode(&mine, hello, sizeof hello);
    if (n < 0) return n;
    size_t alen = 0;
    ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n};
    int rc = ferry_conn_send_frame(c, &f, hello, deadline);
    if (rc == 0) rc = recv_hello_ack(c, s, ack, sizeof ack, &alen, deadline);
    if (rc == FERRY_ERR_PEER_RESTARTED) {
        /* A target that found our expected epoch stale answers so without
         * authenticating; nothing but the restart is learned from it. */
        if (!mine.expect_epoch || c->peer.epoch == mine.expect_epoch)
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "peer %s answered PEER_RESTARTED but kept epoch %016llx",
                              s->name, (unsigned long long)c->peer.epoch);
        return check_epoch(s, &c->peer);
    }
    if (rc == 0) rc = authenticate(c, s, hello, (size_t)n, ack, alen, deadline);
    if (rc == 0) rc = check_epoch(s, &c->peer);
    return rc;
}

/* ------------------------------------------------- checked-out connections */

/* Lists c as in use. Once destroy began, only a fence (spare) may still
 * use a connection (bounded by cancel_timeout_ms): others get CONTEXT. The
 * check is made under the list's lock, so ferry_sessions_interrupt either
 * sees c or c sees the engine stopping. */
static int busy_add(ferry_conn_t *c, bool spare)
{
    ferry_engine_t *e = c->engine;
    pthread_mutex_lock(&e->busy_lock);
    bool stopping = atomic_load(&e->stopping);
    if (spare || !stopping) {
        c->busy_prev = NULL;
        c->busy_next = e->busy;
        if (e->busy) e->busy->busy_prev = c;
        e->busy = c;
    }
    pthread_mutex_unlock(&e->busy_lock);
    if (spare || !stopping) return 0;
    return ferry_fail(FERRY_ERR_CONTEXT, "the engine is shutting down");
}

static void busy_remove(ferry_conn_t *c)
{
    ferry_engine_t *e = c->engine;
    pthread_mutex_lock(&e->busy_lock);
    if (c->busy_prev)
        c->busy_prev->busy_next = c->busy_next;
    else if (e->busy == c)
        e->busy = c->busy_next;
    if (c->busy_next) c->busy_next->busy_prev = c->busy_prev;
    c->busy_prev = c->busy_next = NULL;
    pthread_mutex_unlock(&e->busy_lock);
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

/* Connects, handshakes, and lists the connection as in use. */
static int connect_new(ferry_session_t *s, uint64_t deadline, bool spare, ferry_conn_t **out)
{
    ferry_engine_t *e = s->engine;
    uint64_t cdl = ferry_deadline_after_ms(e->cfg.connect_timeout_ms);
    if (cdl > deadline) cdl = deadline;
    ferry_conn_t *c = calloc(1, sizeof *c);
    if (!c) return ferry_fail(FERRY_ERR_MEMORY, "connection to %s: out of memory", s->name);
    c->engine = e;
    c->session = s;
    bool known = session_known(s);
    int rc;
    if (!known && ferry_directory_enabled(e))
        /* Only a new session asks the directory (through its cache): with
         * the service down, sessions already open keep working. */
        rc = ferry_directory_connect(e, s->name, cdl, &c->fd);
    else
        rc = ferry_net_connect(s->host, s->port, cdl, &c->fd);
    if (rc) {
        free(c);
        return rc;
    }
    rc = busy_add(c, spare);
    if (rc) {
        ferry_conn_free(c);
        return rc;
    }
    ferry_net_tune(c->fd, e->cfg.keepalive_ms);
    rc = handshake(c, s, cdl);
    if (rc) {
        if (rc == FERRY_ERR_TIMEOUT) ferry_fail_context("handshake with %s", s->name);
        if (atomic_load(&e->stopping) && !spare) rc = ferry_fail(FERRY_ERR_CONTEXT, "the engine is shutting down");
        busy_remove(c);
        ferry_conn_free(c);
        return rc;
    }
    FERRY_STAT_ADD(&e->stats, connections_opened, 1);
    pthread_mutex_lock(&s->lock);
    c->pool_gen = s->pool_gen;
    if (s->broken_conns > 0) {
        s->broken_conns--;
        FERRY_STAT_ADD(&e->stats, reconnects, 1);
    }
    pthread_mutex_unlock(&s->lock);
    *out = c;
    return 0;
}

/* An idle connection with something to read is dead (EOF, reset) or out of
 * step; either way it must not carry a request. */
static bool conn_looks_healthy(ferry_conn_t *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    return poll(&p, 1, 0) == 0;
}

/* With s->lock held: counts a new connection, releases the lock and
 * connects; a failed connect gives its place back. */
static int connect_counted(ferry_session_t *s, uint64_t deadline, bool spare, ferry_conn_t **out)
{
    s->nconns++;
    pthread_mutex_unlock(&s->lock);
    int rc = connect_new(s, deadline, spare, out);
    if (rc) {
        pthread_mutex_lock(&s->lock);
        s->nconns--;
        pthread_cond_signal(&s->cond);
        pthread_mutex_unlock(&s->lock);
    }
    return rc;
}

static int state_error(ferry_session_t *s)
{
    if (s->state == SESSION_RESTARTED)
        return ferry_fail(FERRY_ERR_PEER_RESTARTED,
                          "peer %s restarted since this call began (epoch %016llx is void); the next call "
                          "re-opens the session: fetch the new addresses",
                          s->name, (unsigned long long)s->peer.epoch);
    return ferry_fail(FERRY_ERR_SESSION_INVALID, "the session to %s was closed", s->name);
}

int ferry_session_checkout(ferry_session_t *s, uint64_t deadline, ferry_conn_t **out)
{
    return ferry_session_checkout_abortable(s, deadline, NULL, out);
}

void ferry_session_wake(ferry_session_t *s)
{
    pthread_mutex_lock(&s->lock);
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

int ferry_session_checkout_abortable(ferry_session_t *s, uint64_t deadline, atomic_bool *abort, ferry_conn_t **out)
{
    pthread_mutex_lock(&s->lock);
    for (;;) {
        if (abort && atomic_exchange(abort, false)) {
            pthread_mutex_unlock(&s->lock);
            return ferry_fail(FERRY_ERR_CANCELLED, "interrupted while waiting for a connection to %s", s->name);
        }
        if (atomic_load(&s->engine->stopping)) {
            pthread_mutex_unlock(&s->lock);
            return ferry_fail(FERRY_ERR_CONTEXT, "the engine is shutting down");
        }
        if (s->state != SESSION_OK) {
            int rc = state_error(s);
            pthread_mutex_unlock(&s->lock);
            return rc;
        }
        if (s->nidle > 0) {
            ferry_conn_t *c = s->idle[--s->nidle];
            if (conn_looks_healthy(c)) {
                int rc = busy_add(c, false);
                if (rc) {
                    s->nconns--;
                    pthread_mutex_unlock(&s->lock);
                    ferry_conn_free(c);
                    return rc;
                }
                pthread_mutex_unlock(&s->lock);
                *out = c;
                return 0;
            }
            s->nconns--;
            ferry_conn_free(c);
            continue;
        }
        if (s->nconns < s->max_conns) return connect_counted(s, deadline, false, out);
        struct timespec ts = ferry_deadline_timespec(deadline);
        if (deadline == UINT64_MAX)
            pthread_cond_wait(&s->cond, &s->lock);
        else if (pthread_cond_timedwait(&s->cond, &s->lock, &ts) == ETIMEDOUT) {
            pthread_mutex_unlock(&s->lock);
            return ferry_fail(FERRY_ERR_TIMEOUT, "all %d connections to %s stayed busy until the deadline",
                              s->max_conns, s->name);
        }
    }
}

/* Used to confirm cancels (cancel.c): never waits for a busy connection. */
int ferry_session_checkout_spare(ferry_session_t *s, uint64_t deadline, bool fresh, ferry_conn_t **out)
{
    pthread_mutex_lock(&s->lock);
    while (!fresh && s->state == SESSION_OK && s->nidle > 0) {
        ferry_conn_t *c = s->idle[--s->nidle];
        if (conn_looks_healthy(c)) {
            busy_add(c, true);
            pthread_mutex_unlock(&s->lock);
            *out = c;
            return 0;
        }
        s->nconns--;
        ferry_conn_free(c);
    }
    return connect_counted(s, deadline, true, out);
}

void ferry_session_checkin(ferry_session_t *s, ferry_conn_t *c, bool ok)
{
    busy_remove(c);
    pthread_mutex_lock(&s->lock);
    if (ok && s->state == SESSION_OK && c->pool_gen == s->pool_gen && s->nidle < s->max_conns) {
        s->idle[s->nidle++] = c;
        c = NULL;
    } else {
        s->nconns--;
        if (!ok && s->broken_conns < s->max_conns) s->broken_conns++;
    }
    if (atomic_load(&s->engine->stopping))
        pthread_cond_broadcast(&s->cond); /* every waiter gives up, not one */
    else
        pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    if (c) ferry_net_abort(c->fd), c->fd = -1, ferry_conn_free(c);
}

void ferry_session_teardown(ferry_session_t *s)
{
    pthread_mutex_lock(&s->lock);
    s->pool_gen++;
    for (int i = 0; i < s->nidle; i++) {
        ferry_net_abort(s->idle[i]->fd);
        s->idle[i]->fd = -1;
        ferry_conn_free(s->idle[i]);
    }
    s->nconns -= s->nidle;
    s->nidle = 0;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    atomic_store(&s->segs_stale, true);
    FERRY_STAT_ADD(&s->engine->stats, session_teardowns, 1);
    FERRY_LOG(FERRY_LOG_INFO, "session", "%s: connections torn down after repeated failures", s->name);
}

/* ------------------------------------------------------------- segments */

static const char *s_name(const ferry_conn_t *c) { return c->session ? c->session->name : c->peer.name; }

static int fetch_page(ferry_conn_t *c, size_t start, ferry_segment_t **segs, size_t *cap, size_t *total,
                      uint64_t *version, size_t *got, uint64_t deadline)
{
    ferry_frame_t q = {.type = FERRY_FRAME_SEG_QUERY, .aux = start};
    int rc = ferry_conn_send_frame(c, &q, NULL, deadline);
    if (rc) return rc;
    ferry_frame_t f;
    rc = ferry_conn_recv_frame(c, &f, deadline);
    if (rc) return rc;
    if (f.type != FERRY_FRAME_SEG_PAGE || f.len > FERRY_WIRE_SEGMENTS_PER_PAGE ||
        f.plen != f.len * FERRY_WIRE_SEGMENT_SIZE || start + f.len > f.addr)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "bad segment page (%s, %llu entries of %llu)",
                          ferry_frame_type_name(f.type), (unsigned long long)f.len, (unsigned long long)f.addr);
    if (f.addr > FERRY_WIRE_MAX_SEGMENTS)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s claims %llu segments (limit %u)", s_name(c),
                          (unsigned long long)f.addr, FERRY_WIRE_MAX_SEGMENTS);
    *total = (size_t)f.addr;
    *version = f.aux;
    /* Grown by what arrived, never by what the peer claims. */
    if (start + f.len > *cap) {
        size_t want = *cap ? *cap : 64;
        while (want < start + f.len) want *= 2;
        ferry_segment_t *n = realloc(*segs, want * sizeof **segs);
        if (!n) return ferry_fail(FERRY_ERR_MEMORY, "segment table of %zu entries: out of memory", want);
        *segs = n;
        *cap = want;
    }
    uint8_t *buf = malloc(f.plen + 1);
    if (!buf) return ferry_fail(FERRY_ERR_MEMORY, "segment page: out of memory");
    rc = ferry_net_recv(c->fd, buf, f.plen, deadline);
    for (size_t i = 0; rc == 0 && i < f.len; i++) {
        ferry_wire_segment_t w;
        rc = ferry_segment_decode(buf + i * FERRY_WIRE_SEGMENT_SIZE, &w);
        if (rc) break;
        size_t k = start + i;
        /* Sorted and disjoint, or lookups would be wrong. */
        if (k > 0 && (*segs)[k - 1].addr + (*segs)[k - 1].len > w.addr)
            rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s sent segment %zu [0x%llx+%llu) out of order", s_name(c), k,
                            (unsigned long long)w.addr, (unsigned long long)w.len);
        (*segs)[k] = (ferry_segment_t){w.addr, w.len, w.flags, w.generation};
    }
    free(buf);
    *got = (size_t)f.len;
    return rc;
}

/* Pages the whole table in; restarts if the peer's registry changed midway. */
static int fetch_segments(ferry_conn_t *c, ferry_session_t *s, uint64_t deadline)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        ferry_segment_t *segs = NULL;
        size_t cap = 0, total = 0, got = 0, pos = 0;
        uint64_t version = 0, first_version = 0;
        int rc = 0;
        do {
            rc = fetch_page(c, pos, &segs, &cap, &total, &version, &got, deadline);
            if (rc) break;
            if (pos == 0) first_version = version;
            pos += got;
        } while (version == first_version && pos < total && got > 0);
        if (rc) {
            free(segs);
            return rc;
        }
        if (version != first_version) {
            free(segs);
            continue;
        }
        /* Concurrent fetches may finish out of order: never put an older
         * table over a newer one (a region registered between them would
         * vanish from the cache, and its writes fail as unregistered). */
        pthread_rwlock_wrlock(&s->seg_lock);
        if (!s->segs || version >= s->seg_version) {
            ferry_segment_t *old = s->segs;
            s->segs = segs;
            s->nsegs = pos;
            s->seg_version = version;
            segs = old;
        }
        pthread_rwlock_unlock(&s->seg_lock);
        free(segs);
        return 0;
    }
    return ferry_fail(FERRY_ERR_TIMEOUT, "segments of %s kept changing while being fetched", s->name);
}

int ferry_session_refresh_segments(ferry_session_t *s, uint64_t deadline)
{
    ferry_conn_t *c;
    int rc = ferry_session_checkout(s, deadline, &c);
    if (rc) return rc;
    rc = fetch_segments(c, s, deadline);
    ferry_session_checkin(s, c, rc == 0);
    if (rc) ferry_fail_context("fetching the segments of %s", s->name);
    return rc;
}

/* Index of the segment containing addr, or the insertion point (negative). */
static long find_segment(const ferry_segment_t *segs, size_t n, uint64_t addr)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid].addr + segs[mid].len <= addr)
            lo = mid + 1;
        else if (segs[mid].addr > addr)
            hi = mid;
        else
            return (long)mid;
    }
    return -(long)lo - 1;
}

static int resolve_cached(ferry_session_t *s, int opcode, uint64_t remote, uint64_t len, uint32_t *generation)
{
    const unsigned long long a = remote, l = len;
    uint32_t need = opcode == FERRY_OP_WRITE ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
    pthread_rwlock_rdlock(&s->seg_lock);
    long i = find_segment(s->segs, s->nsegs, remote);
    int rc = 0;
    if (i < 0) {
        long below = -i - 2;
        if (below >= 0)
            rc = ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                            "remote range [0x%llx+%llu) is not in any region %s registered; nearest below is "
                            "[0x%llx+%llu) (%zu remote regions)",
                            a, l, s->name, (unsigned long long)s->segs[below].addr,
                            (unsigned long long)s->segs[below].len, s->nsegs);
        else
            rc = ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                            "remote range [0x%llx+%llu) is not in any region %s registered (%zu remote regions)", a,
                            l, s->name, s->nsegs);
    } else {
        const ferry_segment_t *g = &s->segs[i];
        if (remote + len > g->addr + g->len)
            rc = ferry_fail(FERRY_ERR_OUT_OF_BOUNDS,
                            "remote range [0x%llx+%llu) runs %llu bytes past the end of %s's region [0x%llx+%llu)",
                            a, l, (unsigned long long)(remote + len - g->addr - g->len), s->name,
                            (unsigned long long)g->addr, (unsigned long long)g->len);
        else if ((g->flags & need) != need)
            rc = ferry_fail(FERRY_ERR_ACCESS_DENIED, "remote range [0x%llx+%llu) of %s is not registered for remote %s",
                            a, l, s->name, opcode == FERRY_OP_WRITE ? "write" : "read");
        else
            *generation = g->generation;
    }
    pthread_rwlock_unlock(&s->seg_lock);
    return rc;
}

int ferry_session_resolve(ferry_session_t *s, int opcode, uint64_t remote, uint64_t len, uint32_t *generation,
                          uint64_t deadline)
{
    if (remote + len < remote)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "remote range [0x%llx+%llu) wraps the address space",
                          (unsigned long long)remote, (unsigned long long)len);
    bool known = session_known(s);
    if (!known || atomic_exchange(&s->segs_stale, false)) {
        /* First use (the handshake, in checkout, and a segment fetch), or
         * the first after a teardown. */
        int rc = ferry_session_refresh_segments(s, deadline);
        if (rc) return rc;
    }
    if (resolve_cached(s, opcode, remote, len, generation) == 0) return 0;
    /* The peer may have registered since we looked: ask once more. */
    int rc = ferry_session_refresh_segments(s, deadline);
    if (rc) return rc;
    return resolve_cached(s, opcode, remote, len, generation);
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
    ferry_session_t *s = session_remove(e, peer);
    if (!s) return ferry_fail(FERRY_ERR_NOT_FOUND, "no session to %s", peer);
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
    bool known = session_known(s);
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

int ferry_session_ping(ferry_engine_t *e, const char *peer, uint64_t *rtt_us)
{
    int rc = e ? ferry_engine_enter(e) : 0;
    if (rc) return rc;
    rc = session_ping(e, peer, rtt_us);
    return e ? ferry_engine_leave(e, rc) : rc;
}
