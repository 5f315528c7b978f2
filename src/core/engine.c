/* The engine: lifecycle, the listener, and the target side of every
 * connection (handshake, segment queries, notifications, cancels); data
 * frames are handed to the transport that serves them. */
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "clock.h"
#include "directory.h"
#include "fail.h"
#include "log.h"
#include "memkind.h"
#include "net.h"
#include "sized.h"
#include "testing.h"
#include "transport/transport.h"

/* The listener's pause after accept() found no file descriptor left (or
 * no thread could start): short when a connection was closed to make room,
 * longer when none could be. */
#define FERRY_ROOM_BACKOFF_MS 10
#define FERRY_ACCEPT_BACKOFF_MS 100

/* ------------------------------------------------------------ frame I/O */

int ferry_conn_send_frame(ferry_conn_t *c, ferry_frame_t *f, const void *payload, uint64_t deadline)
{
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(f, hdr);
    struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)payload, f->plen}};
    return ferry_net_sendv(c->fd, iov, f->plen ? 2 : 1, deadline);
}

int ferry_conn_recv_frame(ferry_conn_t *c, ferry_frame_t *f, uint64_t deadline)
{
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    int rc = ferry_net_recv(c->fd, hdr, sizeof hdr, deadline);
    if (rc) return rc;
    return ferry_frame_decode(hdr, f);
}

int ferry_conn_recv_frame_spin(ferry_conn_t *c, ferry_frame_t *f, uint64_t deadline, unsigned spin_us)
{
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    size_t got = 0;
    int rc = ferry_net_recv_spin(c->fd, hdr, sizeof hdr, spin_us, &got);
    if (rc == 0 && got < sizeof hdr) rc = ferry_net_recv(c->fd, hdr + got, sizeof hdr - got, deadline);
    if (rc) return rc;
    return ferry_frame_decode(hdr, f);
}

int ferry_conn_discard(ferry_conn_t *c, uint64_t n, uint64_t deadline)
{
    unsigned char scratch[16384];
    while (n > 0) {
        size_t k = n < sizeof scratch ? (size_t)n : sizeof scratch;
        int rc = ferry_net_recv(c->fd, scratch, k, deadline);
        if (rc) return rc;
        n -= k;
    }
    return 0;
}

int ferry_conn_fail_from_target(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline, char *reason, size_t cap)
{
    char text[FERRY_WIRE_MAX_REASON + 1];
    uint32_t n = f->plen <= FERRY_WIRE_MAX_REASON ? f->plen : FERRY_WIRE_MAX_REASON;
    if (ferry_net_recv(c->fd, text, n, deadline) != 0) n = 0;
    text[n] = '\0';
    if (f->plen > n) ferry_conn_discard(c, f->plen - n, deadline);
    if (reason) snprintf(reason, cap, "%s", n ? text : "(no detail)");
    return ferry_fail(f->status, "target %s refused: %s", c->peer.name, n ? text : "(no detail)");
}

void ferry_conn_free(ferry_conn_t *c)
{
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    ferry_cancel_conn_close(c);
    if (c->xport_free) c->xport_free(c->xport);
    free(c->bounce);
    free(c->vec);
    free(c);
}

unsigned char *ferry_conn_bounce(ferry_conn_t *c, size_t n)
{
    size_t cap = c->bounce && c->bounce_cap == 0 ? FERRY_WIRE_MAX_DATA : c->bounce_cap;
    if (c->bounce && cap >= n) return c->bounce;
    free(c->bounce);
    c->bounce = malloc(n);
    c->bounce_cap = c->bounce ? n : 0;
    if (!c->bounce) ferry_fail(FERRY_ERR_MEMORY, "staging buffer of %zu bytes: out of memory", n);
    return c->bounce;
}

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
 *    connections in all (more are refused at accept);
 *  - at most max_established connections are past the handshake; a peer
 *    completing its handshake when they are full takes the place of the
 *    one idle the longest (its initiator sees the close before its next use
 *    and connects again); with every one busy it is refused, TOO_MANY_REQUESTS;
 *  - with no file descriptor left, accept() fails at once, every time: the
 *    listener closes the oldest silent connection, else the one idle the
 *    longest, else the oldest handshaking, or with none sheds the waiting
 *    connection through a reserved descriptor; then it pauses instead of
 *    spinning.
 * All counts and state changes are under conns_lock, except a serving
 * thread's own IDLE <-> BUSY (see enum ferry_conn_state). */

static void limits_from_config(ferry_engine_t *e)
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

/* Closes c, in state from, to make room (conns_lock held); its thread sees
 * the connection end and leaves. False when c changed state meanwhile. */
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
            atomic_store(&best->heard, true); /* its thread has not woken up yet */
        }
    }
    return NULL;
}

/* The connection idle the longest with nothing waiting to be read: bytes
 * there are a request on its way, which must not be cut off. */
static ferry_conn_t *oldest_idle_locked(ferry_engine_t *e)
{
    ferry_conn_t *best = NULL;
    for (ferry_conn_t *c = e->conns; c; c = c->next) {
        if (atomic_load(&c->state) != CONN_IDLE) continue;
        if (best && atomic_load(&c->idle_since_ns) >= atomic_load(&best->idle_since_ns)) continue;
        if (!has_input(c->fd)) best = c;
    }
    return best;
}

/* Closes the oldest silent connection, else the one idle the longest, else
 * the oldest stalled in its handshake. */
static bool make_room_locked(ferry_engine_t *e)
{
    ferry_conn_t *c = oldest_handshaking_locked(e, NULL, true);
    if (c && evict_locked(e, c, CONN_HANDSHAKE)) return true;
    c = oldest_idle_locked(e);
    if (c && evict_locked(e, c, CONN_IDLE)) return true;
    c = oldest_handshaking_locked(e, NULL, false);
    return c && evict_locked(e, c, CONN_HANDSHAKE);
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
    if (from_source >= e->max_per_source || handshaking_from_source >= e->max_handshaking_per_source) {
        /* A source at its limit competes with itself only. */
        ferry_conn_t *old = handshaking_from_source ? oldest_handshaking_locked(e, c->source, false) : NULL;
        return old && evict_locked(e, old, CONN_HANDSHAKE);
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
static int admit_established(ferry_conn_t *c)
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
        if (e->nestablished >= e->max_established) {
            ferry_conn_t *idle = oldest_idle_locked(e);
            if (idle) evict_locked(e, idle, CONN_IDLE);
        }
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

/* Serving thread: waiting for the next request; the connection may be
 * closed to make room from now on. */
static void conn_set_idle(ferry_conn_t *c)
{
    atomic_store(&c->idle_since_ns, ferry_now_ns());
    atomic_store(&c->state, CONN_IDLE);
}

/* Serving thread: a request is arriving. False when the connection was
 * closed to make room first. */
static bool conn_set_busy(ferry_conn_t *c)
{
    int expect = CONN_IDLE;
    return atomic_compare_exchange_strong(&c->state, &expect, CONN_BUSY);
}

/* Serving thread, at its end: c no longer counts. */
static void conn_ended(ferry_conn_t *c)
{
    ferry_engine_t *e = c->engine;
    if (!c->listed) return;
    pthread_mutex_lock(&e->conns_lock);
    int st = atomic_exchange(&c->state, CONN_ENDED);
    if (st == CONN_HANDSHAKE) e->nhandshaking--;
    if (st == CONN_IDLE || st == CONN_BUSY) e->nestablished--;
    pthread_mutex_unlock(&e->conns_lock);
}

/* ------------------------------------------------------------ handshake */

void ferry_hello_fill(ferry_engine_t *e, ferry_hello_t *h)
{
    memset(h, 0, sizeof *h);
    uint16_t v = (uint16_t)ferry_protocol_version_advertised(e);
    /* Every version down to 1 (older peers keep their framing), unless a
     * test pinned one (core/testing.h). */
    h->proto_min = ferry_test_protocol_version(e) ? v : 1;
    h->proto_max = v;
    h->flags = FERRY_HELLO_F_CMA | (e->cfg.secret ? FERRY_HELLO_F_AUTH : 0);
    for (int i = 0; ferry_transports[i]; i++)
        if (ferry_transports[i]->hello_flags) h->flags |= ferry_transports[i]->hello_flags(e);
    h->engine_id = e->engine_id;
    h->epoch = e->epoch;
    h->pid = (int32_t)getpid();
    memcpy(h->host_id, e->host_id, sizeof h->host_id);
    ferry_registry_t *r = &e->registry;
    pthread_rwlock_rdlock(&r->lock);
    h->segment_version = r->version;
    h->segment_count = r->count;
    pthread_rwlock_unlock(&r->lock);
    /* Only authentication needs the nonce; a failure leaves zeros, which
     * ferry_serve_hello and the initiator's handshake refuse to MAC. */
    if (e->cfg.secret && ferry_auth_nonce(h->nonce) != 0) memset(h->nonce, 0, sizeof h->nonce);
    snprintf(h->name, sizeof h->name, "%s", e->name);
}

unsigned ferry_engine_proto_max(const ferry_engine_t *e)
{
    return (unsigned)ferry_protocol_version_advertised(e);
}

unsigned ferry_conn_version(const ferry_conn_t *c)
{
    unsigned ours = ferry_engine_proto_max(c->engine);
    return c->peer.proto_max < ours ? c->peer.proto_max : ours;
}

static bool nonce_is_zero(const uint8_t *n)
{
    uint8_t acc = 0;
    for (int i = 0; i < FERRY_WIRE_NONCE_SIZE; i++) acc |= n[i];
    return acc == 0;
}

/* Target side of the shared-secret check, after HELLO_ACK went out: the
 * initiator's AUTH must carry the MAC of the transcript; only then do we
 * prove ourselves in AUTH_ACK. */
static int serve_auth(ferry_conn_t *c, const uint8_t *hello, size_t hlen, const uint8_t *ack, size_t alen,
                      uint64_t deadline)
{
    ferry_engine_t *e = c->engine;
    ferry_frame_t f;
    int rc = ferry_conn_recv_frame(c, &f, deadline);
    if (rc) return rc == FERRY_ERR_MALFORMED_FRAME ? rc : ferry_fail_context("waiting for AUTH");
    if (f.type != FERRY_FRAME_AUTH || f.plen != FERRY_WIRE_MAC_SIZE)
        return ferry_fail(FERRY_ERR_AUTH_FAILED, "%s answered the authentication challenge with %s of %u bytes",
                          c->peer.name, ferry_frame_type_name(f.type), f.plen);
    uint8_t got[FERRY_WIRE_MAC_SIZE], want[FERRY_WIRE_MAC_SIZE];
    rc = ferry_net_recv(c->fd, got, sizeof got, deadline);
    if (rc) return rc;
    rc = ferry_auth_mac(e->cfg.secret, FERRY_AUTH_INITIATOR, hello, hlen, ack, alen, want);
    if (rc) return rc;
    if (!ferry_auth_equal(got, want)) {
        ferry_frame_t no = {.type = FERRY_FRAME_AUTH_ACK, .status = FERRY_ERR_AUTH_FAILED};
        ferry_conn_send_frame(c, &no, NULL, deadline);
        return ferry_fail(FERRY_ERR_AUTH_FAILED,
                          "%s (engine %016llx, pid %d) sent a wrong MAC: it does not hold this engine's shared secret",
                          c->peer.name, (unsigned long long)c->peer.engine_id, (int)c->peer.pid);
    }
    rc = admit_established(c);
    if (rc) {
        ferry_frame_t full = {.type = FERRY_FRAME_AUTH_ACK, .status = rc};
        ferry_conn_send_frame(c, &full, NULL, deadline);
        return rc;
    }
    rc = ferry_auth_mac(e->cfg.secret, FERRY_AUTH_TARGET, hello, hlen, ack, alen, want);
    if (rc) return rc;
    ferry_frame_t yes = {.type = FERRY_FRAME_AUTH_ACK, .plen = FERRY_WIRE_MAC_SIZE};
    return ferry_conn_send_frame(c, &yes, want, deadline);
}

/* Target side: validates the initiator's HELLO and answers it. A refused
 * handshake is answered with its code, then the connection closes. */
int ferry_serve_hello(ferry_conn_t *c, const ferry_frame_t *f)
{
    ferry_engine_t *e = c->engine;
    uint64_t deadline = ferry_deadline_after_ms(e->cfg.connect_timeout_ms);
    if (f->type != FERRY_FRAME_HELLO)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected HELLO, got %s", ferry_frame_type_name(f->type));
    uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    if (f->plen > sizeof buf)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "HELLO payload of %u bytes is too long", f->plen);
    int rc = ferry_net_recv(c->fd, buf, f->plen, deadline);
    if (rc) return rc;
    rc = ferry_hello_decode(buf, f->plen, &c->peer);
    if (rc) return rc;
    ferry_hello_t mine;
    ferry_hello_fill(e, &mine);
    uint8_t ack[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    int alen = ferry_hello_encode(&mine, ack, sizeof ack);
    if (alen < 0) return alen;
    bool we_auth = e->cfg.secret != NULL, they_auth = (c->peer.flags & FERRY_HELLO_F_AUTH) != 0;
    int status = 0;
    if (c->peer.proto_max < mine.proto_min || c->peer.proto_min > mine.proto_max) {
        status = FERRY_ERR_VERSION_MISMATCH;
        FERRY_LOG(FERRY_LOG_WARN, "engine", "refused %s: protocol %u..%u, we speak %u..%u", c->peer.name,
                  c->peer.proto_min, c->peer.proto_max, mine.proto_min, mine.proto_max);
    } else if (we_auth != they_auth) {
        status = ferry_fail(FERRY_ERR_AUTH_FAILED, "%s %s", c->peer.name,
                            we_auth ? "has no shared secret and this engine requires one"
                                    : "requires a shared secret and this engine has none");
    } else if (we_auth && (nonce_is_zero(c->peer.nonce) || nonce_is_zero(mine.nonce))) {
        status = ferry_fail(FERRY_ERR_AUTH_FAILED, "%s: a handshake nonce is missing", c->peer.name);
    } else if (c->peer.expect_epoch && c->peer.expect_epoch != e->epoch) {
        status = FERRY_ERR_PEER_RESTARTED;
    } else if (atomic_load(&e->stopping)) {
        status = FERRY_ERR_REJECT_HANDSHAKE;
    } else if (!we_auth) {
        status = admit_established(c); /* with a secret: once the peer proved it */
    }
    /* aux: the key CANCELs name this connection by (cancel.h). */
    ferry_frame_t out = {.type = FERRY_FRAME_HELLO_ACK, .status = status, .plen = (uint32_t)alen,
                         .aux = status ? 0 : ferry_cancel_conn_open(c)};
    int src = ferry_conn_send_frame(c, &out, ack, deadline);
    if (status == FERRY_ERR_AUTH_FAILED || status == FERRY_ERR_TOO_MANY_REQUESTS)
        return status; /* keeps its detail for the log */
    if (src) return src;
    if (status) return ferry_fail(status, "handshake with %s refused", c->peer.name);
    if (we_auth) return serve_auth(c, buf, f->plen, ack, (size_t)alen, deadline);
    return 0;
}

/* --------------------------------------------------------- control frames */

static int serve_seg_query(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline)
{
    ferry_segment_t segs[FERRY_WIRE_SEGMENTS_PER_PAGE];
    size_t total;
    uint64_t version;
    size_t n = ferry_registry_export(&c->engine->registry, (size_t)f->aux, segs, FERRY_WIRE_SEGMENTS_PER_PAGE,
                                     &total, &version);
    uint8_t *buf = malloc(n * FERRY_WIRE_SEGMENT_SIZE + 1);
    if (!buf) return ferry_fail(FERRY_ERR_MEMORY, "segment page: out of memory");
    for (size_t i = 0; i < n; i++) {
        ferry_wire_segment_t w = {segs[i].addr, segs[i].len, segs[i].flags, segs[i].generation};
        ferry_segment_encode(&w, buf + i * FERRY_WIRE_SEGMENT_SIZE);
    }
    ferry_frame_t out = {.type = FERRY_FRAME_SEG_PAGE, .req_id = f->req_id, .addr = total, .len = n,
                         .aux = version, .plen = (uint32_t)(n * FERRY_WIRE_SEGMENT_SIZE)};
    int rc = ferry_conn_send_frame(c, &out, buf, deadline);
    free(buf);
    return rc;
}

static int serve_notify(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline)
{
    unsigned char *msg = malloc(f->plen ? f->plen : 1);
    if (!msg) return ferry_fail(FERRY_ERR_MEMORY, "notify: out of memory");
    int rc = ferry_net_recv(c->fd, msg, f->plen, deadline);
    if (rc) {
        free(msg);
        return rc;
    }
    int status = ferry_notify_push(c, msg, f->plen);
    ferry_frame_t ack = {.type = FERRY_FRAME_NOTIFY_ACK, .req_id = f->req_id, .status = status};
    return ferry_conn_send_frame(c, &ack, NULL, deadline);
}

static void send_error(ferry_conn_t *c, int code);

/* Records the cancel on the data connection it names (aux), then waits out
 * every placement in progress (they hold the registry's read lock): once
 * CANCEL_ACK is sent, no byte of the request can land, because every later
 * chunk checks its connection's cancel set first under that lock
 * (cancel.h). */
static int serve_cancel(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline)
{
    ferry_engine_t *e = c->engine;
    int rc = ferry_cancel_record(c, f->req_id, f->aux);
    if (rc) {
        /* No ack: the initiator reports CANCEL_UNCONFIRMED. */
        send_error(c, rc);
        return rc;
    }
    ferry_registry_barrier(&e->registry);
    ferry_frame_t ack = {.type = FERRY_FRAME_CANCEL_ACK, .req_id = f->req_id};
    return ferry_conn_send_frame(c, &ack, NULL, deadline);
}

static int serve_frame(ferry_conn_t *c, const ferry_frame_t *f)
{
    uint64_t deadline = ferry_deadline_after_ms(c->engine->cfg.timeout_ms);
    switch (f->type) {
    case FERRY_FRAME_SEG_QUERY:
        return serve_seg_query(c, f, deadline);
    case FERRY_FRAME_NOTIFY:
        return serve_notify(c, f, deadline);
    case FERRY_FRAME_PING: {
        ferry_frame_t pong = {.type = FERRY_FRAME_PONG, .req_id = f->req_id};
        return ferry_conn_send_frame(c, &pong, NULL, deadline);
    }
    case FERRY_FRAME_CANCEL:
        return serve_cancel(c, f, deadline);
    default: {
        const ferry_transport_ops_t *t = ferry_transport_for_frame(f->type);
        if (t) return t->serve(c, f);
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "unexpected %s frame from an initiator",
                          ferry_frame_type_name(f->type));
    }
    }
}

/* Tells a misbehaving peer why it is dropped, best effort. */
static void send_error(ferry_conn_t *c, int code)
{
    const char *d = ferry_fail_message();
    size_t n = strlen(d);
    ferry_frame_t f = {.type = FERRY_FRAME_ERROR, .status = code, .plen = (uint32_t)n};
    ferry_conn_send_frame(c, &f, d, ferry_deadline_after_ms(100));
}

void ferry_serve_connection(ferry_conn_t *c)
{
    ferry_engine_t *e = c->engine;
    ferry_frame_t f;
    unsigned spin_us = (unsigned)e->cfg.spin_us;
    uint64_t deadline = ferry_deadline_after_ms(e->cfg.connect_timeout_ms);
    /* Waits for the first byte apart: from then on the connection counts as
     * handshaking in earnest (oldest_handshaking_locked). */
    int rc = 0;
    if (ferry_net_wait_readable(c->fd, deadline) == 0)
        rc = ferry_fail(FERRY_ERR_TIMEOUT, "no HELLO within %d ms", e->cfg.connect_timeout_ms);
    atomic_store(&c->heard, true);
    if (rc == 0) rc = ferry_conn_recv_frame(c, &f, deadline);
    if (rc == 0) rc = ferry_serve_hello(c, &f);
    if (rc == FERRY_ERR_TIMEOUT) ferry_fail_context("handshake");
    while (rc == 0 && !atomic_load(&e->stopping)) {
        conn_set_idle(c);
        /* A request often follows the last answer within microseconds:
         * busy-poll for its header briefly before sleeping (a cross-CPU
         * wake-up costs more than a loopback round trip), if config.spin_us
         * asks for it. Idle connections then wait without a deadline (TCP
         * keepalive reaps dead peers); a frame once begun must arrive whole
         * within the timeout. */
        uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
        size_t got = 0;
        rc = ferry_net_recv_spin(c->fd, hdr, sizeof hdr, spin_us, &got);
        if (rc) break;
        if (got == 0) {
            int ready = ferry_net_wait_readable(c->fd, UINT64_MAX);
            if (ready <= 0 || atomic_load(&e->stopping)) break;
        }
        if (!conn_set_busy(c)) break; /* closed to make room */
        if (got < sizeof hdr) rc = ferry_net_recv(c->fd, hdr + got, sizeof hdr - got, ferry_deadline_after_ms(e->cfg.timeout_ms));
        if (rc == 0) rc = ferry_frame_decode(hdr, &f);
        if (rc == 0) rc = serve_frame(c, &f);
    }
    if (rc == FERRY_ERR_MALFORMED_FRAME || rc == FERRY_ERR_AUTH_FAILED || rc == FERRY_ERR_TIMEOUT) {
        if (rc == FERRY_ERR_MALFORMED_FRAME) FERRY_STAT_ADD(&e->stats, frames_rejected, 1);
        if (rc == FERRY_ERR_AUTH_FAILED) FERRY_STAT_ADD(&e->stats, auth_failures, 1);
        FERRY_LOG(FERRY_LOG_WARN, "engine", "dropping connection from %s (calling itself %s): %s", c->remote,
                  c->peer.name[0] ? c->peer.name : "-", ferry_last_error_detail());
        send_error(c, rc);
    } else if (rc && rc != FERRY_ERR_PEER_CLOSED) {
        FERRY_LOG(FERRY_LOG_DEBUG, "engine", "connection from %s ended: %s", c->peer.name,
                  ferry_last_error_detail());
    }
}

static void *serve_thread(void *arg)
{
    ferry_conn_t *c = arg;
    ferry_serve_connection(c);
    shutdown(c->fd, SHUT_RDWR);
    conn_ended(c);
    atomic_store(&c->done, true);
    return NULL;
}

/* Joins and frees served connections whose threads have finished. Only
 * the listener (or destroy, after it) changes the list, so *pp stays put
 * while the lock is dropped. A connection leaves the list only once its
 * thread is joined: a CANCEL naming it must find it while it can still
 * place a byte (cancel.h). */
static void reap_conns(ferry_engine_t *e, bool all)
{
    pthread_mutex_lock(&e->conns_lock);
    ferry_conn_t **pp = &e->conns;
    while (*pp) {
        ferry_conn_t *c = *pp;
        if (all || atomic_load(&c->done)) {
            pthread_mutex_unlock(&e->conns_lock);
            if (all) shutdown(c->fd, SHUT_RDWR);
            pthread_join(c->thread, NULL);
            pthread_mutex_lock(&e->conns_lock);
            *pp = c->next;
            e->nconns_served--;
            pthread_mutex_unlock(&e->conns_lock);
            ferry_conn_free(c);
            pthread_mutex_lock(&e->conns_lock);
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&e->conns_lock);
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

/* accept() found no file descriptor left (or no memory, or no thread could
 * start): it would fail again at once while the connection waits, and
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

/* Accepts one connection and starts its thread. Returns 0, or when out of
 * file descriptors, memory or threads, how long the listener should pause:
 * briefly when a connection was closed to make room (its descriptor comes
 * free once reaped), longer when nothing could be. */
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
    /* Started under the lock: the thread counts itself out under it too. */
    int prc = pthread_create(&c->thread, NULL, serve_thread, c);
    if (prc == 0) {
        c->next = e->conns;
        e->conns = c;
        e->nconns_served++;
        e->nhandshaking++;
    }
    pthread_mutex_unlock(&e->conns_lock);
    if (prc != 0) {
        FERRY_STAT_ADD(&e->stats, connections_refused, 1);
        c->fd = -1;
        ferry_net_abort(fd);
        ferry_conn_free(c);
        return out_of_resources(e, "cannot start a connection thread", false) ? FERRY_ROOM_BACKOFF_MS
                                                                               : FERRY_ACCEPT_BACKOFF_MS;
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

static void *listener_thread(void *arg)
{
    ferry_engine_t *e = arg;
    struct pollfd p[2] = {{.fd = e->listen_fd, .events = POLLIN}, {.fd = e->wake_fd[0], .events = POLLIN}};
    while (!atomic_load(&e->stopping)) {
        int n = poll(p, 2, 1000);
        if (n < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        int pause_ms = n > 0 && (p[0].revents & POLLIN) ? accept_one(e) : 0;
        if (pause_ms) listener_pause(e, pause_ms);
        reap_conns(e, false);
    }
    return NULL;
}

/* ------------------------------------------------------------- lifecycle */

static void read_host_id(uint8_t out[16])
{
    /* The kernel's boot id: equal for two processes iff they share a host
     * (and a boot); the hostname alone is not enough inside containers. */
    char text[64] = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(text, sizeof text, f)) text[0] = '\0';
        fclose(f);
    }
    memset(out, 0, 16);
    int k = 0;
    for (char *p = text; *p && k < 32; p++) {
        int v = (*p >= '0' && *p <= '9') ? *p - '0' : (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10 : -1;
        if (v < 0) continue;
        out[k / 2] |= (uint8_t)(k % 2 ? v : v << 4);
        k++;
    }
}

static uint64_t random64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = ferry_now_ns() ^ ((uint64_t)getpid() << 32);
    return v ? v : 1;
}

static void engine_free(ferry_engine_t *e)
{
    /* Transports release their per-region state (RDMA memory regions) and
     * device contexts while the registry still exists. */
    for (int i = 0; ferry_transports[i]; i++)
        if (ferry_transports[i]->engine_fini) ferry_transports[i]->engine_fini(e);
    ferry_registry_destroy(&e->registry);
    ferry_sessions_free(e);
    ferry_metrics_destroy(&e->metrics);
    if (e->listen_fd >= 0) close(e->listen_fd);
    if (e->wake_fd[0] >= 0) close(e->wake_fd[0]);
    if (e->wake_fd[1] >= 0) close(e->wake_fd[1]);
    if (e->reserve_fd >= 0) close(e->reserve_fd);
    pthread_mutex_destroy(&e->conns_lock);
    pthread_mutex_destroy(&e->queue_lock);
    pthread_cond_destroy(&e->queue_cond);
    pthread_mutex_destroy(&e->notify_lock);
    pthread_mutex_destroy(&e->busy_lock);
    pthread_mutex_destroy(&e->calls_lock);
    pthread_cond_destroy(&e->calls_cond);
    free(e->cfg_strings);
    free(e);
}

static ferry_engine_t *engine_alloc(void)
{
    ferry_engine_t *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->listen_fd = e->wake_fd[0] = e->wake_fd[1] = e->reserve_fd = -1;
    pthread_mutex_init(&e->conns_lock, NULL);
    pthread_mutex_init(&e->queue_lock, NULL);
    ferry_cond_init_monotonic(&e->queue_cond);
    pthread_mutex_init(&e->notify_lock, NULL);
    pthread_mutex_init(&e->busy_lock, NULL);
    pthread_mutex_init(&e->calls_lock, NULL);
    pthread_cond_init(&e->calls_cond, NULL);
    atomic_store(&e->next_conn_serial, 1);
    ferry_registry_init(&e->registry);
    ferry_metrics_init(&e->metrics);
    e->engine_id = random64();
    e->epoch = random64();
    atomic_store(&e->next_req_id, 1);
    read_host_id(e->host_id);
    return e;
}

static void make_name(ferry_engine_t *e)
{
    const char *h = e->cfg.host;
    if (strchr(h, ':'))
        snprintf(e->name, sizeof e->name, "[%s]:%u", h, e->port);
    else
        snprintf(e->name, sizeof e->name, "%s:%u", h, e->port);
}

int ferry_engine_create(const ferry_config_t *cfg, ferry_engine_t **out)
{
    ferry_clear_last_error();
    if (!out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "engine create: out is NULL");
    *out = NULL;
    ferry_config_t defaults;
    if (!cfg) {
        ferry_config_init(&defaults);
        int rc = ferry_config_from_env(&defaults);
        if (rc) return rc;
        cfg = &defaults;
    }
    ferry_engine_t *e = engine_alloc();
    if (!e) return ferry_fail(FERRY_ERR_MEMORY, "engine create: out of memory");
    int rc = ferry_config_copy(e, cfg);
    if (rc) goto fail;
    ferry_log_level = e->cfg.log_level;
    rc = ferry_sessions_init(e);
    if (rc) goto fail;
    if (!ferry_transport_find(e->cfg.transport) && strcmp(e->cfg.transport, "auto") != 0) {
        char names[128] = "auto";
        for (int i = 0; ferry_transports[i]; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), ", %s", ferry_transports[i]->name);
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: unknown transport '%s' (%s)", e->cfg.transport, names);
        goto fail;
    }
    rc = ferry_net_listen(e->cfg.host, e->cfg.port, &e->listen_fd, &e->port);
    if (rc) goto fail;
    limits_from_config(e);
    e->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    make_name(e);
    if (pipe2(e->wake_fd, O_CLOEXEC) != 0) {
        rc = ferry_fail(FERRY_ERR_SOCKET, "engine create: pipe: %s", strerror(errno));
        goto fail;
    }
    if (e->cfg.metrics_port != 0) {
        rc = ferry_metrics_http_start(e, e->cfg.metrics_port);
        if (rc) goto fail;
    }
    rc = ferry_directory_start(e);
    if (rc) {
        ferry_metrics_http_stop(e);
        goto fail;
    }
    rc = ferry_workers_start(e);
    if (rc) {
        ferry_directory_stop(e);
        goto fail;
    }
    if (pthread_create(&e->listener, NULL, listener_thread, e) != 0) {
        ferry_workers_stop(e);
        ferry_directory_stop(e);
        rc = ferry_fail(FERRY_ERR_INTERNAL, "engine create: cannot start the listener thread");
        goto fail;
    }
    FERRY_LOG(FERRY_LOG_INFO, "engine", "listening on %s, epoch %016llx", e->name, (unsigned long long)e->epoch);
    *out = e;
    return 0;
fail:
    engine_free(e);
    return rc;
}

int ferry_engine_enter(ferry_engine_t *e)
{
    atomic_fetch_add(&e->calls, 1);
    if (atomic_load(&e->stopping))
        return ferry_engine_leave(e, ferry_fail(FERRY_ERR_CONTEXT, "the engine is shutting down"));
    return 0;
}

int ferry_engine_leave(ferry_engine_t *e, int rc)
{
    bool ours = rc == FERRY_ERR_PEER_CLOSED || rc == FERRY_ERR_SOCKET || rc == FERRY_ERR_TIMEOUT;
    if (ours && atomic_load(&e->stopping))
        rc = ferry_fail(FERRY_ERR_CONTEXT, "the engine was destroyed during the call (%s)", ferry_last_error_detail());
    /* The last one out while destroy waits tells it; nothing of e is
     * touched after that. */
    if (atomic_fetch_sub(&e->calls, 1) == 1 && atomic_load(&e->stopping)) {
        pthread_mutex_lock(&e->calls_lock);
        pthread_cond_broadcast(&e->calls_cond);
        pthread_mutex_unlock(&e->calls_lock);
    }
    return rc;
}

/* Each call still in progress was woken (ferry_sessions_interrupt) and
 * ends within its fence's cancel_timeout_ms. */
static void wait_for_calls(ferry_engine_t *e)
{
    pthread_mutex_lock(&e->calls_lock);
    while (atomic_load(&e->calls) > 0) pthread_cond_wait(&e->calls_cond, &e->calls_lock);
    pthread_mutex_unlock(&e->calls_lock);
}

void ferry_engine_destroy(ferry_engine_t *e)
{
    if (!e) return;
    /* Leave the directory first: peers stop finding us before we stop
     * answering. It stays open for our own lookups until no thread is left. */
    ferry_directory_unpublish(e);
    atomic_store(&e->stopping, true);
    ferry_sessions_interrupt(e);
    if (write(e->wake_fd[1], "x", 1) < 0) { /* the listener also polls with a timeout */ }
    pthread_join(e->listener, NULL);
    reap_conns(e, true);
    /* Calls in progress may hand pieces to the workers: they go first. */
    wait_for_calls(e);
    ferry_workers_stop(e);
    ferry_sessions_destroy(e);
    ferry_directory_stop(e);
    ferry_metrics_http_stop(e);
    ferry_notify_clear(e);
    engine_free(e);
}

uint16_t ferry_engine_port(const ferry_engine_t *e) { return e ? e->port : 0; }
const char *ferry_engine_name(const ferry_engine_t *e) { return e ? e->name : ""; }
uint64_t ferry_engine_epoch(const ferry_engine_t *e) { return e ? e->epoch : 0; }

int (ferry_engine_stats)(ferry_engine_t *e, ferry_stats_t *out)
{
    ferry_clear_last_error();
    if (!e || !out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "engine stats: NULL argument");
    int rc = ferry_sized_check(out, FERRY_STATS_SIZE_0_1, "engine stats");
    if (rc) return rc;
    ferry_stats_t all;
    ferry_stats_read(&e->stats, &all);
    ferry_sized_export(out, &all, sizeof all);
    return 0;
}

/* ----------------------------------------------------------- registration */

static int check_flags(unsigned flags)
{
    if (flags & ~FERRY_MEM_REMOTE) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: unknown flags 0x%x", flags);
    return 0;
}

int ferry_register(ferry_engine_t *e, void *addr, size_t len, unsigned flags)
{
    ferry_clear_last_error();
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: engine is NULL");
    int rc = check_flags(flags);
    if (rc) return rc;
    uint32_t kind = FERRY_MEMKIND_HOST;
    if (addr && len) rc = ferry_memkind_detect(addr, len, &kind);
    if (rc) return rc;
    return ferry_registry_add_kind(&e->registry, (uint64_t)(uintptr_t)addr, len, flags, kind);
}

int ferry_deregister(ferry_engine_t *e, void *addr)
{
    ferry_clear_last_error();
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "deregister: engine is NULL");
    return ferry_registry_remove(&e->registry, (uint64_t)(uintptr_t)addr);
}

int ferry_register_batch(ferry_engine_t *e, void *const *addrs, const size_t *lens, size_t n, unsigned flags)
{
    ferry_clear_last_error();
    if (!e) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register batch: engine is NULL");
    int rc = check_flags(flags);
    if (rc) return rc;
    if (!addrs || !lens) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register batch: NULL array");
    uint32_t one, *kinds = n > 1 ? calloc(n, sizeof *kinds) : &one;
    if (!kinds) return ferry_fail(FERRY_ERR_MEMORY, "register batch of %zu: out of memory", n);
    for (size_t i = 0; i < n && rc == 0; i++) {
        kinds[i] = FERRY_MEMKIND_HOST;
        if (addrs[i] && lens[i]) rc = ferry_memkind_detect(addrs[i], lens[i], &kinds[i]);
        if (rc) ferry_fail_context("region %zu of %zu (none registered)", i, n);
    }
    if (rc == 0) rc = ferry_registry_add_many_kinds(&e->registry, addrs, lens, n, flags, kinds);
    if (kinds != &one) free(kinds);
    return rc;
}

int ferry_deregister_batch(ferry_engine_t *e, void *const *addrs, size_t n)
{
    ferry_clear_last_error();
    if (!e || !addrs) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "deregister batch: NULL argument");
    int first = 0;
    char detail[1024] = "";
    for (size_t i = 0; i < n; i++) {
        int rc = ferry_registry_remove(&e->registry, (uint64_t)(uintptr_t)addrs[i]);
        if (rc && !first) {
            first = rc;
            snprintf(detail, sizeof detail, "region %zu of %zu: %s", i, n, ferry_fail_message());
        }
    }
    if (first) ferry_fail(first, "%s", detail);
    return first;
}

size_t ferry_region_count(ferry_engine_t *e) { return e ? ferry_registry_count(&e->registry) : 0; }
