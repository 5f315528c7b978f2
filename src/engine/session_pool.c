/* SPDX-License-Identifier: Apache-2.0 */
/* Sessions' connection pools (session.h): the versioned handshake with
 * epoch checks, the engine's list of checked-out connections, and checking
 * connections out and in. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>

#include "link/auth.h"
#include "util/clock.h"
#include "directory.h"
#include "engine.h"
#include "testing.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/net.h"
#include "link/transport.h"

/* Whether a handshake has told us who the peer is. */
bool ferry_session_known(ferry_session_t *s)
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
    ferry_deadline_learn(c, f.addr); /* the target's clock (wire.h, FERRY_FRAME_F_DEADLINE) */
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
        s->new_epoch = peer->epoch;
        rc = ferry_fail(FERRY_ERR_PEER_RESTARTED,
                        "peer %s restarted: epoch %016llx became %016llx; its old addresses are void "
                        "(nothing was written; the next call re-opens the session: fetch the new addresses; "
                        "calls pinned to the old epoch keep failing)",
                        s->name, (unsigned long long)s->peer.epoch, (unsigned long long)peer->epoch);
    } else if (!s->have_peer) {
        s->peer = *peer;
        s->have_peer = true;
        s->transport = ferry_transport_choose(&s->engine->xport, peer, s->transport_reason, sizeof s->transport_reason);
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
    c->hello_sent_ns = ferry_now_ns();
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

/* Connects, handshakes, and lists the connection as in use. */
static int connect_new(ferry_session_t *s, uint64_t deadline, bool spare, ferry_conn_t **out)
{
    ferry_engine_t *e = s->engine;
    uint64_t cdl = ferry_deadline_after_ms(e->cfg.connect_timeout_ms);
    if (cdl > deadline) cdl = deadline;
    ferry_conn_t *c = calloc(1, sizeof *c);
    if (!c) return ferry_fail(FERRY_ERR_MEMORY, "connection to %s: out of memory", s->name);
    c->engine = e;
    c->ctx = &e->xport;
    c->link = &e->link;
    c->session = s;
    c->session_port = s->port;
    bool known = ferry_session_known(s);
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
                          "peer %s restarted since this call began (epoch %016llx is void, the peer is at "
                          "%016llx); the next call re-opens the session: fetch the new addresses (calls "
                          "pinned to the old epoch keep failing)",
                          s->name, (unsigned long long)s->peer.epoch, (unsigned long long)s->new_epoch);
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
            /* Each connection was handshaken with the session's epoch
             * (check_epoch); checked again here, since pinned calls rely on
             * it: one that was not is closed, and its replacement's
             * handshake finds the restart. */
            if (conn_looks_healthy(c) && c->peer.epoch == s->peer.epoch) {
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
