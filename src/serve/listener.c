/* SPDX-License-Identifier: Apache-2.0 */
/* The listener: accepts connections within the connection limits
 * (admission, eviction, the pause when out of file descriptors, the
 * handshake deadline) and hands each to the event loop's serving threads
 * (evloop.c); the serving itself is in engine.c. */
#include "listener.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/engine.h"
#include "util/clock.h"
#include "evloop.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/net.h"

/* The listener's pause after accept() found no file descriptor left (or
 * no thread could start): short when a connection was closed to make room,
 * longer when none could be. */
#define FERRY_ROOM_BACKOFF_MS 10
#define FERRY_ACCEPT_BACKOFF_MS 100

/* ----------------------------------------------------- connection limits */

/* What peers can hold of the target is bounded (a flood of silent
 * connections, or of idle handshaken ones, once locked every new peer out):
 *  - connections still in their handshake have a small budget of their own
 *    (max_handshaking); when it is full, the oldest silent one (its peer
 *    sent nothing yet), else the oldest stalled one, is dropped for the
 *    newcomer, else the newcomer is refused. A silent connection lives until
 *    newer ones push it out, and never takes the place of a working one or
 *    of a peer handshaking in earnest;
 *  - one source address holds at most max_handshaking_per_source of those
 *    (its own oldest silent or stalled one makes way) and max_per_source
 *    connections in all: at that limit its own connection idle the
 *    longest, else its own stalled the longest, makes way for its
 *    newcomer, so a source never locks itself out (a flood from one
 *    address only pushes out that address's connections). Loopback
 *    (127.0.0.0/8, ::1) is one source for every peer on the host: it may
 *    hold max_established unless config.max_connections_per_source is set;
 *  - at most max_established connections are past the handshake; a peer
 *    completing its handshake when they are full takes the place of the
 *    one idle the longest (its initiator sees the close before its next use
 *    and connects again), else of the one stalled the longest (parked in a
 *    frame whose bytes stopped coming, or with answers its peer stopped
 *    reading, for a tenth of config.timeout_ms or more); with every one
 *    busy in earnest it is refused, TOO_MANY_REQUESTS;
 *  - with no file descriptor left, accept() fails at once, every time: the
 *    listener closes the oldest silent connection, else the one idle the
 *    longest, else the one stalled the longest, else the oldest handshaking, or with none sheds the waiting
 *    connection through a reserved descriptor; then it pauses instead of
 *    spinning.
 *  - a connection still handshaking config.connect_timeout_ms after it was
 *    accepted is answered TIMEOUT and closed, and so is one whose frame
 *    header stalls half-read for config.timeout_ms (expire_stalled).
 * All counts and state changes are under conns_lock, except a serving
 * thread's own IDLE <-> BUSY (see enum ferry_conn_state). */

void ferry_listener_limits_from_config(ferry_engine_t *e)
{
    int cap = e->cfg.max_connections;
    e->max_established = cap;
    e->max_handshaking = cap / 16 > 8 ? cap / 16 : 8;
    e->max_per_source = e->cfg.max_connections_per_source ? e->cfg.max_connections_per_source
                                                          : (cap / 4 > 1 ? cap / 4 : 1);
    int hs = e->max_handshaking / 4 > 4 ? e->max_handshaking / 4 : 4;
    e->max_handshaking_per_source = hs < e->max_per_source ? hs : e->max_per_source;
}

/* At most one warning a second about the limits: a flood would otherwise
 * write a line per connection. */
static bool limit_warning_due(ferry_engine_t *e)
{
    uint64_t now = ferry_now_ns(), last = atomic_load(&e->limit_warned_ns);
    return now - last >= 1000000000ull && atomic_compare_exchange_strong(&e->limit_warned_ns, &last, now);
}

/* Closes c, in state from, to make room (conns_lock held); the serving
 * thread that takes it next sees it end. False when c changed state
 * meanwhile. */
static bool evict_locked(ferry_engine_t *e, ferry_conn_t *c, int from)
{
    int expect = from;
    if (!atomic_compare_exchange_strong(&c->state, &expect, CONN_EVICTED)) return false;
    if (from == CONN_HANDSHAKE) {
        e->nhandshaking--;
        FERRY_STAT_ADD(&e->stats, handshakes_evicted, 1);
    } else {
        e->nestablished--;
        FERRY_STAT_ADD(&e->stats, connections_evicted, 1);
    }
    shutdown(c->fd, SHUT_RDWR);
    return true;
}

static bool same_source(const ferry_conn_t *c, const uint8_t *source)
{
    return memcmp(c->source, source, sizeof c->source) == 0;
}

static bool has_input(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) != 0;
}

/* The connection in its handshake accepted first, from source (NULL: any),
 * among those whose peer has not spoken yet, else (unless silent_only)
 * among those that spoke but are still handshaking after a tenth of the
 * handshake deadline. An initiator sends its HELLO as soon as it connects
 * and finishes within milliseconds: silent connections, however many, never
 * push out a peer handshaking in earnest, and a burst of peers connecting
 * at once (a fleet restarting) turns newcomers away rather than cutting
 * handshakes short; peers that stall mid-handshake still make way. */
static ferry_conn_t *oldest_handshaking_locked(ferry_engine_t *e, const uint8_t *source, bool silent_only)
{
    uint64_t stalled_before = ferry_now_ns() - (uint64_t)e->cfg.connect_timeout_ms * 100000u;
    for (int silent = 1; silent >= (silent_only ? 1 : 0); silent--) {
        for (;;) {
            ferry_conn_t *best = NULL;
            for (ferry_conn_t *c = e->conns; c; c = c->next)
                if (atomic_load(&c->state) == CONN_HANDSHAKE && (!source || same_source(c, source)) &&
                    (silent ? !atomic_load(&c->heard) : atomic_load(&c->idle_since_ns) <= stalled_before) &&
                    (!best || c->serial < best->serial))
                    best = c;
            if (!best || !silent || !has_input(best->fd)) {
                if (best) return best;
                break;
            }
            atomic_store(&best->heard, true); /* no serving thread has read it yet */
        }
    }
    return NULL;
}

/* The connection from source (NULL: any) idle the longest with nothing
 * waiting to be read: bytes there are a request on its way, which must not
 * be cut off. */
static ferry_conn_t *oldest_idle_locked(ferry_engine_t *e, const uint8_t *source)
{
    ferry_conn_t *best = NULL;
    for (ferry_conn_t *c = e->conns; c; c = c->next) {
        if (atomic_load(&c->state) != CONN_IDLE || (source && !same_source(c, source))) continue;
        if (best && atomic_load(&c->idle_since_ns) >= atomic_load(&best->idle_since_ns)) continue;
        if (!has_input(c->fd)) best = c;
    }
    return best;
}

/* The established connection from source (NULL: any) stalled the longest
 * in a frame (its header or payload stopped coming) or in its answers (its
 * peer stopped reading them), parked so for at least a tenth of
 * config.timeout_ms: a request that merely pauses is not cut off, as
 * oldest_handshaking_locked spares handshakes in earnest. */
static ferry_conn_t *oldest_stalled_locked(ferry_engine_t *e, const uint8_t *source)
{
    uint64_t before = ferry_now_ns() - (uint64_t)e->cfg.timeout_ms * 100000u, best_since = 0;
    ferry_conn_t *best = NULL;
    for (ferry_conn_t *c = e->conns; c; c = c->next) {
        if (atomic_load(&c->state) != CONN_BUSY || (source && !same_source(c, source))) continue;
        uint64_t since = ferry_evloop_stalled_since(c);
        if (since && since <= before && (!best || since < best_since)) {
            best = c;
            best_since = since;
        }
    }
    return best;
}

/* Closes the one idle the longest, else the one stalled the longest, from
 * source (NULL: any): true when one was. */
static bool evict_established_locked(ferry_engine_t *e, const uint8_t *source)
{
    ferry_conn_t *c = oldest_idle_locked(e, source);
    if (c && evict_locked(e, c, CONN_IDLE)) return true;
    c = oldest_stalled_locked(e, source);
    return c && evict_locked(e, c, CONN_BUSY);
}

/* Closes the oldest silent connection, else the one idle the longest, else
 * the one stalled the longest in a frame, else the oldest stalled in its
 * handshake. */
static bool make_room_locked(ferry_engine_t *e)
{
    ferry_conn_t *c = oldest_handshaking_locked(e, NULL, true);
    if (c && evict_locked(e, c, CONN_HANDSHAKE)) return true;
    if (evict_established_locked(e, NULL)) return true;
    c = oldest_handshaking_locked(e, NULL, false);
    return c && evict_locked(e, c, CONN_HANDSHAKE);
}

/* Whether source is this host's loopback (127.0.0.0/8 as v4-mapped, ::1). */
static bool is_loopback(const uint8_t *source)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff}, v6[16] = {[15] = 1};
    return (memcmp(source, v4mapped, 12) == 0 && source[12] == 127) || memcmp(source, v6, 16) == 0;
}

/* How many connections one source may hold: on one host every local peer
 * is 127.0.0.1 (or ::1), one "source" for them all, so loopback may hold
 * as many as the target serves unless config.max_connections_per_source
 * says otherwise. */
static int source_limit(const ferry_engine_t *e, const uint8_t *source)
{
    return e->cfg.max_connections_per_source == 0 && is_loopback(source) ? e->max_established : e->max_per_source;
}

/* Takes a new connection into the handshake budget, making way as the
 * limits say (conns_lock held); false: refused, its source at its limit or
 * the budget full of handshakes in progress. */
static bool admit_new_locked(ferry_engine_t *e, const ferry_conn_t *c)
{
    int from_source = 0, handshaking_from_source = 0;
    for (ferry_conn_t *o = e->conns; o; o = o->next) {
        int st = atomic_load(&o->state);
        if (st > CONN_BUSY || !same_source(o, c->source)) continue;
        from_source++;
        if (st == CONN_HANDSHAKE) handshaking_from_source++;
    }
    if (from_source >= source_limit(e, c->source) || handshaking_from_source >= e->max_handshaking_per_source) {
        /* A source at its limit competes with itself only: its oldest
         * silent or stalled handshake makes way, else (at its limit of
         * connections) the one it left idle the longest, else the one
         * stalled the longest, so that a source never locks itself out. */
        ferry_conn_t *old = handshaking_from_source ? oldest_handshaking_locked(e, c->source, false) : NULL;
        if (old && evict_locked(e, old, CONN_HANDSHAKE)) return true;
        return handshaking_from_source < e->max_handshaking_per_source && evict_established_locked(e, c->source);
    }
    if (e->nhandshaking >= e->max_handshaking) {
        ferry_conn_t *old = oldest_handshaking_locked(e, NULL, false);
        return old && evict_locked(e, old, CONN_HANDSHAKE);
    }
    return true;
}

/* The handshake succeeded (and authenticated, with a secret): c joins the
 * established connections, in the place of the one idle the longest when
 * they are full. 0, TOO_MANY_REQUESTS when every one is busy, or
 * PEER_CLOSED when c itself was dropped to make room meanwhile. */
int ferry_listener_admit_established(ferry_conn_t *c)
{
    ferry_engine_t *e = c->engine;
    if (!c->listed) { /* served outside the listener (the fuzz target) */
        atomic_store(&c->state, CONN_BUSY);
        return 0;
    }
    int rc = 0;
    pthread_mutex_lock(&e->conns_lock);
    if (atomic_load(&c->state) != CONN_HANDSHAKE) {
        rc = ferry_fail(FERRY_ERR_PEER_CLOSED, "connection from %s was closed during its handshake to make room",
                        c->remote);
    } else {
        if (e->nestablished >= e->max_established) evict_established_locked(e, NULL);
        if (e->nestablished < e->max_established) {
            atomic_store(&c->state, CONN_BUSY);
            e->nhandshaking--;
            e->nestablished++;
        } else {
            rc = ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS,
                            "target %s serves %d connections, all busy (config.max_connections); refused %s (%s)",
                            e->name, e->max_established, c->peer.name, c->remote);
        }
    }
    pthread_mutex_unlock(&e->conns_lock);
    if (rc == FERRY_ERR_TOO_MANY_REQUESTS) {
        FERRY_STAT_ADD(&e->stats, connections_refused, 1);
        if (limit_warning_due(e)) FERRY_LOG(FERRY_LOG_WARN, "engine", "%s", ferry_last_error_detail());
    }
    return rc;
}

/* Its serving thread, at its end: c no longer counts, leaves the list and
 * is freed. It leaves the list only now: a CANCEL naming it must find it
 * while it can still place a byte (cancel.h). */
void ferry_listener_conn_done(ferry_conn_t *c)
{
    ferry_engine_t *e = c->engine;
    pthread_mutex_lock(&e->conns_lock);
    int st = atomic_exchange(&c->state, CONN_ENDED);
    if (st == CONN_HANDSHAKE) e->nhandshaking--;
    if (st == CONN_IDLE || st == CONN_BUSY) e->nestablished--;
    atomic_store(&c->done, true);
    for (ferry_conn_t **pp = &e->conns; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            e->nconns_served--;
            break;
        }
    }
    /* Its descriptor is free once it no longer counts (test_listener_fds). */
    close(c->fd);
    c->fd = -1;
    pthread_mutex_unlock(&e->conns_lock);
    ferry_conn_free(c);
}

/* Destroy: every served connection ends; a frame being served fails at once. */
void ferry_listener_shutdown_conns(ferry_engine_t *e)
{
    pthread_mutex_lock(&e->conns_lock);
    for (ferry_conn_t *c = e->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&e->conns_lock);
}

/* Destroy, once no serving thread is left: frees the connections left. */
void ferry_listener_free_conns(ferry_engine_t *e)
{
    pthread_mutex_lock(&e->conns_lock);
    ferry_conn_t *c = e->conns;
    e->conns = NULL;
    e->nconns_served = e->nhandshaking = e->nestablished = 0;
    pthread_mutex_unlock(&e->conns_lock);
    while (c) {
        ferry_conn_t *next = c->next;
        ferry_conn_free(c);
        c = next;
    }
}

/* A connection still in its handshake past its deadline (conns_lock held):
 * its serving thread answers TIMEOUT and closes it. */
static void expire_locked(ferry_engine_t *e, ferry_conn_t *c)
{
    int expect = CONN_HANDSHAKE;
    if (!atomic_compare_exchange_strong(&c->state, &expect, CONN_EVICTED)) return;
    e->nhandshaking--;
    ferry_evloop_expire(c);
}

/* How often the listener looks for stalls while connections are served:
 * within a quarter of a frame's deadline (at most a second), so that none
 * holds on much past it. */
static uint64_t expiry_period(const ferry_engine_t *e)
{
    uint64_t period = (uint64_t)e->cfg.timeout_ms * 250000u;
    return period > 1000000000ull ? 1000000000ull : period;
}

/* Ends the handshakes past their deadline (config.connect_timeout_ms after
 * the accept) and the frame headers stalled half-read past theirs. Returns
 * when to look again: the next deadline known, at most a second away while
 * any connection is served (a header may stall meanwhile), else never. */
static uint64_t expire_stalled(ferry_engine_t *e)
{
    uint64_t now = ferry_now_ns(), limit = (uint64_t)e->cfg.connect_timeout_ms * 1000000u, next = UINT64_MAX;
    pthread_mutex_lock(&e->conns_lock);
    for (ferry_conn_t *c = e->conns; c; c = c->next) {
        int st = atomic_load(&c->state);
        uint64_t due = st == CONN_HANDSHAKE ? atomic_load(&c->idle_since_ns) + limit
                       : st == CONN_BUSY    ? ferry_evloop_header_due(c)
                                            : 0;
        if (due == 0) continue;
        if (due > now) {
            if (due < next) next = due;
        } else if (st == CONN_HANDSHAKE) {
            expire_locked(e, c);
        } else {
            ferry_evloop_expire(c);
        }
    }
    uint64_t period = expiry_period(e);
    if (e->conns && next > now + period) next = now + period;
    pthread_mutex_unlock(&e->conns_lock);
    return next;
}

/* The peer's address for logs, and as 16 bytes (IPv4 v4-mapped) for the
 * per-source limits. */
static void describe_remote(int fd, char *out, size_t cap, uint8_t source[16])
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    memset(source, 0, 16);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            port = ntohs(a->sin_port);
            source[10] = source[11] = 0xff;
            memcpy(source + 12, &a->sin_addr, 4);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            port = ntohs(a->sin6_port);
            memcpy(source, &a->sin6_addr, 16);
        }
    }
    snprintf(out, cap, "%s port %u", host, port);
}

/* accept() found no file descriptor left (or no memory, or the loop could
 * not watch the connection): it would fail again at once while the connection waits, and
 * poll() would wake us for it forever. Makes room for the next one, or when
 * nothing can be closed, sheds the waiting connection through the reserved
 * descriptor so that its peer learns at once. The caller then pauses. */
static bool out_of_resources(ferry_engine_t *e, const char *what, bool shed)
{
    FERRY_STAT_ADD(&e->stats, accept_backoffs, 1);
    pthread_mutex_lock(&e->conns_lock);
    bool made_room = make_room_locked(e);
    pthread_mutex_unlock(&e->conns_lock);
    if (!made_room && shed && e->reserve_fd >= 0) {
        close(e->reserve_fd);
        int fd = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            ferry_net_abort(fd);
            FERRY_STAT_ADD(&e->stats, connections_refused, 1);
        }
        e->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (limit_warning_due(e))
        FERRY_LOG(FERRY_LOG_WARN, "engine", "%s: %s; %s, pausing the listener", e->name, what,
                  made_room ? "closed a connection to make room" : "refused the waiting connection");
    return made_room;
}

/* Accepts one connection and hands it to the event loop. Returns 0, or
 * when out of file descriptors or memory, how long the listener should
 * pause: briefly when a connection was closed to make room (its descriptor
 * comes free once its serving thread sees it), longer when nothing could be. */
static int accept_one(ferry_engine_t *e)
{
    int fd = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) return 0;
        return out_of_resources(e, strerror(err), true) ? FERRY_ROOM_BACKOFF_MS : FERRY_ACCEPT_BACKOFF_MS;
    }
    ferry_conn_t *c = calloc(1, sizeof *c);
    if (!c) {
        close(fd);
        return out_of_resources(e, "out of memory", false) ? FERRY_ROOM_BACKOFF_MS : FERRY_ACCEPT_BACKOFF_MS;
    }
    c->fd = fd;
    c->engine = e;
    c->ctx = &e->xport;
    c->link = &e->link;
    describe_remote(fd, c->remote, sizeof c->remote, c->source);
    pthread_mutex_lock(&e->conns_lock);
    if (!admit_new_locked(e, c)) {
        pthread_mutex_unlock(&e->conns_lock);
        FERRY_STAT_ADD(&e->stats, connections_refused, 1);
        if (limit_warning_due(e))
            FERRY_LOG(FERRY_LOG_WARN, "engine",
                      "refusing a connection from %s: its address is at its limit (config.max_connections_per_source "
                      "%d, %d handshaking) or %d handshakes are in progress",
                      c->remote, e->max_per_source, e->max_handshaking_per_source, e->max_handshaking);
        ferry_net_abort(fd);
        free(c);
        return 0;
    }
    ferry_net_tune(fd, e->cfg.keepalive_ms);
    c->serial = atomic_fetch_add(&e->next_conn_serial, 1);
    atomic_store(&c->idle_since_ns, ferry_now_ns());
    atomic_store(&c->state, CONN_HANDSHAKE);
    c->listed = true;
    /* Listed first: its serving thread may end it (and unlist it) at once. */
    c->next = e->conns;
    e->conns = c;
    e->nconns_served++;
    e->nhandshaking++;
    int err = ferry_evloop_add(e->evloop, c) == 0 ? 0 : errno;
    if (err) {
        e->conns = c->next;
        e->nconns_served--;
        e->nhandshaking--;
    }
    pthread_mutex_unlock(&e->conns_lock);
    if (err) {
        FERRY_STAT_ADD(&e->stats, connections_refused, 1);
        c->fd = -1;
        ferry_net_abort(fd);
        ferry_conn_free(c);
        char what[128];
        snprintf(what, sizeof what, "cannot watch a connection: %s", strerror(err));
        return out_of_resources(e, what, false) ? FERRY_ROOM_BACKOFF_MS : FERRY_ACCEPT_BACKOFF_MS;
    }
    FERRY_STAT_ADD(&e->stats, connections_accepted, 1);
    return 0;
}

/* Sleeps ms unless the engine is stopped meanwhile. */
static void listener_pause(ferry_engine_t *e, int ms)
{
    struct pollfd p = {.fd = e->wake_fd[0], .events = POLLIN};
    poll(&p, 1, ms);
}

void *ferry_listener_thread(void *arg)
{
    ferry_engine_t *e = arg;
    struct pollfd p[2] = {{.fd = e->listen_fd, .events = POLLIN}, {.fd = e->wake_fd[0], .events = POLLIN}};
    uint64_t next_expiry = UINT64_MAX;
    while (!atomic_load(&e->stopping)) {
        /* It sleeps until a connection comes or a deadline is due (a
         * look a second while connections are served: a scan of the list,
         * next to nothing even with 10,000 idle ones). */
        uint64_t now = ferry_now_ns();
        if (next_expiry <= now) next_expiry = expire_stalled(e);
        int wait_ms = next_expiry == UINT64_MAX ? -1 : (int)((next_expiry - now + 999999) / 1000000);
        int n = poll(p, 2, wait_ms);
        if (n < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        int pause_ms = n > 0 && (p[0].revents & POLLIN) ? accept_one(e) : 0;
        if (pause_ms) listener_pause(e, pause_ms);
        /* A new handshake's deadline comes after every other's; a frame
         * of it may stall sooner. */
        if (next_expiry == UINT64_MAX && n > 0) {
            uint64_t hs = (uint64_t)e->cfg.connect_timeout_ms * 1000000u, period = expiry_period(e);
            next_expiry = ferry_now_ns() + (hs < period ? hs : period);
        }
    }
    return NULL;
}
