/* SPDX-License-Identifier: Apache-2.0 */
/* The engine: lifecycle and the target side of every connection
 * (handshake, segment queries, notifications, cancels); data frames are
 * handed to the transport that serves them. The listener, accepting
 * connections within their limits, is in listener.c. */
#include "engine/engine.h"
#include "serve.h"

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

#include "link/auth.h"
#include "util/clock.h"
#include "engine/directory.h"
#include "engine/xport.h"
#include "evloop.h"
#include "util/fail.h"
#include "listener.h"
#include "util/log.h"
#include "util/memkind.h"
#include "util/net.h"
#include "util/sized.h"
#include "engine/testing.h"
#include "link/transport.h"

/* ------------------------------------------------------ connection state */

/* Serving thread: waiting for the next request; the connection may be
 * closed to make room from now on. */
void ferry_conn_set_idle(ferry_conn_t *c)
{
    atomic_store(&c->idle_since_ns, ferry_now_ns());
    /* A busy connection may be closed to make room (a stalled one, under
     * pressure): EVICTED stays, and its next turn ends it. */
    int expect = CONN_BUSY;
    atomic_compare_exchange_strong(&c->state, &expect, CONN_IDLE);
}

/* Serving thread: a request is arriving. False when the connection was
 * closed to make room first. */
bool ferry_conn_set_busy(ferry_conn_t *c)
{
    int expect = CONN_IDLE;
    return atomic_compare_exchange_strong(&c->state, &expect, CONN_BUSY);
}

/* ------------------------------------------------------------ handshake */

static bool nonce_is_zero(const uint8_t *n)
{
    uint8_t acc = 0;
    for (int i = 0; i < FERRY_WIRE_NONCE_SIZE; i++) acc |= n[i];
    return acc == 0;
}

int ferry_auth_frame_check(ferry_conn_t *c, const ferry_frame_t *f)
{
    if (f->type != FERRY_FRAME_AUTH || f->plen != FERRY_WIRE_MAC_SIZE)
        return ferry_fail(FERRY_ERR_AUTH_FAILED, "%s answered the authentication challenge with %s of %u bytes",
                          c->peer.name, ferry_frame_type_name(f->type), f->plen);
    return 0;
}

int ferry_serve_auth_mac(ferry_conn_t *c, const uint8_t *got, const uint8_t *hello, size_t hlen, const uint8_t *ack,
                         size_t alen)
{
    ferry_engine_t *e = c->engine;
    uint64_t deadline = ferry_deadline_after_ms(e->cfg.connect_timeout_ms);
    uint8_t want[FERRY_WIRE_MAC_SIZE];
    int rc = ferry_auth_mac(e->cfg.secret, FERRY_AUTH_INITIATOR, hello, hlen, ack, alen, want);
    if (rc) return rc;
    if (!ferry_auth_equal(got, want)) {
        ferry_frame_t no = {.type = FERRY_FRAME_AUTH_ACK, .status = FERRY_ERR_AUTH_FAILED};
        ferry_conn_send_frame(c, &no, NULL, deadline);
        return ferry_fail(FERRY_ERR_AUTH_FAILED,
                          "%s (engine %016llx, pid %d) sent a wrong MAC: it does not hold this engine's shared secret",
                          c->peer.name, (unsigned long long)c->peer.engine_id, (int)c->peer.pid);
    }
    rc = ferry_listener_admit_established(c);
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

/* Target side of the shared-secret check, after HELLO_ACK went out: the
 * initiator's AUTH must carry the MAC of the transcript; only then do we
 * prove ourselves in AUTH_ACK. Blocking (ferry_serve_connection); the event
 * loop reads the AUTH frame without waiting and calls the two steps. */
static int serve_auth(ferry_conn_t *c, const uint8_t *hello, size_t hlen, const uint8_t *ack, size_t alen,
                      uint64_t deadline)
{
    ferry_frame_t f;
    int rc = ferry_conn_recv_frame(c, &f, deadline);
    if (rc) return rc == FERRY_ERR_MALFORMED_FRAME ? rc : ferry_fail_context("waiting for AUTH");
    rc = ferry_auth_frame_check(c, &f);
    if (rc) return rc;
    uint8_t got[FERRY_WIRE_MAC_SIZE];
    rc = ferry_net_recv(c->fd, got, sizeof got, deadline);
    if (rc) return rc;
    return ferry_serve_auth_mac(c, got, hello, hlen, ack, alen);
}

int ferry_hello_frame_check(const ferry_frame_t *f)
{
    if (f->type != FERRY_FRAME_HELLO)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected HELLO, got %s", ferry_frame_type_name(f->type));
    if (f->plen > FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "HELLO payload of %u bytes is too long", f->plen);
    return 0;
}

int ferry_answer_hello(ferry_conn_t *c, const ferry_frame_t *f, const uint8_t *buf, uint8_t *ack, size_t *alen_out,
                       bool *auth_next)
{
    ferry_engine_t *e = c->engine;
    uint64_t deadline = ferry_deadline_after_ms(e->cfg.connect_timeout_ms);
    *auth_next = false;
    int rc = ferry_hello_decode(buf, f->plen, &c->peer);
    if (rc) return rc;
    ferry_hello_t mine;
    ferry_hello_fill(e, &mine);
    int alen = ferry_hello_encode(&mine, ack, FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME);
    if (alen < 0) return alen;
    *alen_out = (size_t)alen;
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
        status = ferry_listener_admit_established(c); /* with a secret: once the peer proved it */
    }
    /* aux: the key CANCELs name this connection by (cancel.h). */
    /* addr: this engine's clock, for deadlines in data frames (wire.h). */
    ferry_frame_t out = {.type = FERRY_FRAME_HELLO_ACK, .status = status, .plen = (uint32_t)alen,
                         .aux = status ? 0 : ferry_cancel_conn_open(c), .addr = status ? 0 : ferry_now_ns()};
    int src = ferry_conn_send_frame(c, &out, ack, deadline);
    if (status == FERRY_ERR_AUTH_FAILED || status == FERRY_ERR_TOO_MANY_REQUESTS)
        return status; /* keeps its detail for the log */
    if (src) return src;
    if (status) return ferry_fail(status, "handshake with %s refused", c->peer.name);
    *auth_next = we_auth;
    return 0;
}

/* Target side: validates the initiator's HELLO and answers it. A refused
 * handshake is answered with its code, then the connection closes. */
int ferry_serve_hello(ferry_conn_t *c, const ferry_frame_t *f)
{
    ferry_engine_t *e = c->engine;
    uint64_t deadline = ferry_deadline_after_ms(e->cfg.connect_timeout_ms);
    int rc = ferry_hello_frame_check(f);
    if (rc) return rc;
    uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    rc = ferry_net_recv(c->fd, buf, f->plen, deadline);
    if (rc) return rc;
    uint8_t ack[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    size_t alen = 0;
    bool auth_next = false;
    rc = ferry_answer_hello(c, f, buf, ack, &alen, &auth_next);
    if (rc == 0 && auth_next) rc = serve_auth(c, buf, f->plen, ack, alen, deadline);
    return rc;
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

/* Exactly once, never late (cancel.h, "Notifications"): a repeated NOTIFY
 * is dropped unanswered; the queueing happens under the registry's read
 * lock after the cancel and deadline checks, and is logged in the
 * connection's placement log (placed 1 = queued), so that a fence's barrier
 * makes the log's word on it final. */
static int serve_notify(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline)
{
    if (ferry_placed_begin(c, f)) return ferry_placed_drop_duplicate(c, f);
    unsigned char *msg = malloc(f->plen ? f->plen : 1);
    if (!msg) {
        int rc = ferry_fail(FERRY_ERR_MEMORY, "notify: out of memory");
        ferry_placed_end(c, rc, 0, NULL);
        return rc;
    }
    int rc = ferry_net_recv(c->fd, msg, f->plen, deadline);
    if (rc) {
        free(msg);
        ferry_placed_end(c, rc, 0, NULL);
        return rc;
    }
    ferry_registry_t *reg = &c->engine->registry;
    int status;
    ferry_registry_read_lock(reg);
    if (ferry_conn_is_cancelled(c, f->req_id)) {
        status = ferry_fail(FERRY_ERR_CANCELLED, "notification %llu from %s: fenced by its sender; not queued",
                            (unsigned long long)f->req_id, c->peer.name);
        free(msg);
    } else if (ferry_frame_expired(f)) {
        status = ferry_frame_expired_fail(c, f);
        free(msg);
    } else {
        status = ferry_notify_push(c, msg, f->plen); /* frees msg when refused */
    }
    ferry_placed_end(c, status, status == 0 ? 1 : 0, NULL);
    ferry_registry_unlock(reg);
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
    int rc = (f->flags & FERRY_FRAME_F_CONN) ? ferry_cancel_fence_conn(c, f->aux)
                                             : ferry_cancel_record(c, f->req_id, f->aux);
    if (rc) {
        /* No ack: the initiator reports CANCEL_UNCONFIRMED. */
        send_error(c, rc);
        return rc;
    }
    ferry_registry_barrier(&e->registry);
    ferry_frame_t ack = {.type = FERRY_FRAME_CANCEL_ACK, .req_id = f->req_id};
    uint8_t *report = NULL;
    if (f->flags & FERRY_FRAME_F_PLACED) {
        /* After the barrier: the log is final for what was fenced. */
        size_t len = 0;
        uint32_t count = 0;
        rc = ferry_placed_report(c, f->aux, &report, &len, &count);
        if (rc < 0) {
            send_error(c, rc);
            return rc;
        }
        if (rc == 1 && len <= FERRY_WIRE_MAX_CONTROL) {
            ack.flags = FERRY_FRAME_F_PLACED;
            ack.len = count;
            ack.plen = (uint32_t)len;
        }
    }
    rc = ferry_conn_send_frame(c, &ack, ack.plen ? report : NULL, deadline);
    free(report);
    return rc;
}

int ferry_serve_frame(ferry_conn_t *c, const ferry_frame_t *f)
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
        /* Exactly-once (cancel.h): a write frame placed whole already (or
         * a read served into the initiator's memory) is dropped
         * unanswered; any other is logged as it is served. */
        if (t && ferry_placed_is_logged_frame(f) && ferry_placed_begin(c, f))
            return ferry_placed_drop_duplicate(c, f);
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
        ferry_conn_set_idle(c);
        /* A request often follows the last answer within microseconds:
         * busy-poll for its header briefly before sleeping (a cross-CPU
         * wake-up costs more than a loopback round trip), for config.spin_us
         * or, by default, as long as the recent gaps between requests on this
         * connection say is worth it (spin.h: none once they are long, so an
         * idle connection never spins). Idle connections then wait without a
         * deadline (TCP keepalive reaps dead peers); a frame once begun must
         * arrive whole within the timeout. */
        uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
        size_t got = 0;
        uint64_t t0 = ferry_now_ns();
        rc = ferry_net_recv_spin(c->fd, hdr, sizeof hdr, ferry_conn_spin_us(c), &got);
        if (rc) break;
        if (got == 0) {
            int ready = ferry_net_wait_readable(c->fd, UINT64_MAX);
            if (ready <= 0 || atomic_load(&e->stopping)) break;
        }
        ferry_spin_record(&c->spin, ferry_now_ns() - t0);
        if (!ferry_conn_set_busy(c)) break; /* closed to make room */
        if (got < sizeof hdr) rc = ferry_net_recv(c->fd, hdr + got, sizeof hdr - got, ferry_deadline_after_ms(e->cfg.timeout_ms));
        if (rc == 0) rc = ferry_frame_decode(hdr, &f);
        if (rc == 0) rc = ferry_serve_frame(c, &f);
    }
    ferry_serve_ended(c, rc);
}

void ferry_serve_ended(ferry_conn_t *c, int rc)
{
    ferry_engine_t *e = c->engine;
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
    ferry_transports_engine_fini(&e->xport);
    ferry_registry_destroy(&e->registry);
    ferry_sessions_free(e);
    ferry_metrics_destroy(&e->metrics);
    if (e->listen_fd >= 0) close(e->listen_fd);
    if (e->wake_fd[0] >= 0) close(e->wake_fd[0]);
    if (e->wake_fd[1] >= 0) close(e->wake_fd[1]);
    if (e->reserve_fd >= 0) close(e->reserve_fd);
    pthread_mutex_destroy(&e->conns_lock);
    ferry_placed_destroy_all(&e->link);
    pthread_mutex_destroy(&e->link.placed_lock);
    pthread_mutex_destroy(&e->work.lock);
    pthread_cond_destroy(&e->work.cond);
    pthread_mutex_destroy(&e->notify.lock);
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
    pthread_mutex_init(&e->link.placed_lock, NULL);
    e->link.conns_lock = &e->conns_lock;
    e->link.conns = &e->conns;
    atomic_store(&e->link.proto_max, FERRY_PROTOCOL_VERSION);
    pthread_mutex_init(&e->work.lock, NULL);
    ferry_cond_init_monotonic(&e->work.cond);
    pthread_mutex_init(&e->notify.lock, NULL);
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

/* ------------------------------------------------------------ serving */

static void listener_shutdown_all(void *e) { ferry_listener_shutdown_conns(e); }
static void listener_free_all(void *e) { ferry_listener_free_conns(e); }

/* What the event loop calls: this file's handshake and frame handlers and
 * the listener's list of connections. */
static const ferry_evloop_handlers_t serve_handlers = {
    .hello_check = ferry_hello_frame_check,
    .hello_answer = ferry_answer_hello,
    .auth_check = ferry_auth_frame_check,
    .auth_mac = ferry_serve_auth_mac,
    .frame = ferry_serve_frame,
    .ended = ferry_serve_ended,
    .done = ferry_listener_conn_done,
    .set_idle = ferry_conn_set_idle,
    .set_busy = ferry_conn_set_busy,
    .shutdown_all = listener_shutdown_all,
    .free_all = listener_free_all,
};

static int serve_start(ferry_engine_t *e)
{
    ferry_evloop_config_t cfg = {.on = &serve_handlers,
                                 .ctx = e,
                                 .name = e->name,
                                 .timeout_ms = e->cfg.timeout_ms,
                                 .connect_timeout_ms = e->cfg.connect_timeout_ms,
                                 .stopping = &e->stopping};
    return ferry_evloop_start(&cfg, &e->evloop);
}

static void serve_stop(ferry_engine_t *e)
{
    ferry_evloop_stop(e->evloop);
    e->evloop = NULL;
}

int ferry_evloop_threads(const ferry_engine_t *e) { return e->evloop ? ferry_evloop_nthreads(e->evloop) : 0; }

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
    int rc = ferry_config_copy(&e->cfg, &e->cfg_strings, cfg);
    if (rc) goto fail;
    ferry_engine_xport_init(e);
    ferry_log_level = e->cfg.log_level;
    e->link.spin_us = e->cfg.spin_us;
    e->link.timeout_ms = e->cfg.timeout_ms;
    rc = ferry_sessions_init(e);
    if (rc) goto fail;
    if (!ferry_transport_find(e->cfg.transport) && strcmp(e->cfg.transport, "auto") != 0) {
        char names[128] = "auto";
        for (int i = 0; ferry_transports[i]; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), ", %s", ferry_transports[i]->name);
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: unknown transport '%s' (%s)", e->cfg.transport, names);
        goto fail;
    }
    rc = ferry_transports_engine_init(&e->xport);
    if (rc) goto fail;
    rc = ferry_net_listen(e->cfg.host, e->cfg.port, &e->listen_fd, &e->port);
    if (rc) goto fail;
    ferry_listener_limits_from_config(e);
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
    rc = serve_start(e);
    if (rc) {
        ferry_workers_stop(e);
        ferry_directory_stop(e);
        goto fail;
    }
    if (pthread_create(&e->listener, NULL, ferry_listener_thread, e) != 0) {
        serve_stop(e);
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
    serve_stop(e);
    /* Calls in progress may hand pieces to the workers: they go first. */
    wait_for_calls(e);
    ferry_workers_stop(e);
    ferry_sessions_destroy(e);
    ferry_directory_stop(e);
    ferry_metrics_http_stop(e);
    ferry_notify_clear(e);
    engine_free(e);
}

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
