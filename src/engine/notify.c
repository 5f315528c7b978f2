/* SPDX-License-Identifier: Apache-2.0 */
/* Notifications: small messages delivered to the peer's queue through the
 * engine, after the writes that preceded them completed. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "link/cancel.h"
#include "util/clock.h"
#include "notify.h"
#include "parts.h"
#include "session.h"
#include "stats.h"
#include "util/fail.h"
#include "util/log.h"
#include "link/metrics.h"
#include "xport.h"

/* Unread notifications per sender and per source address, so that one
 * peer filling the queue loses only its own (ferry.h: backlog). A count
 * lives while a queued notification points at it; a sender's count also
 * holds what the notifications say of their sender, once for all of them. */
#define NOTIFY_BUCKETS 256
#define NOTIFY_KEY 32

typedef struct ferry_notify_count {
    uint8_t key[NOTIFY_KEY];
    size_t n, charged;
    char name[256];                    /* sender counts: the name it claimed */
    char host[INET6_ADDRSTRLEN + 2];   /* its source address, "[...]" for IPv6 */
    ferry_notification_sender_t from;  /* addr filled per notification */
    struct ferry_notify_count *next;
} ferry_notify_count_t;

struct ferry_notify_tables {
    ferry_notify_count_t *sender[NOTIFY_BUCKETS], *source[NOTIFY_BUCKETS];
    uint64_t last_drop_log_ns; /* drops are logged at most once a second */
    uint64_t drops_unlogged;
};

static unsigned key_bucket(const uint8_t *key)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (int i = 0; i < NOTIFY_KEY; i++) h = (h ^ key[i]) * 16777619u;
    return h % NOTIFY_BUCKETS;
}

/* The count for key in table, made (zero) if missing; NULL when out of memory. */
static ferry_notify_count_t *count_get(ferry_notify_count_t **table, const uint8_t *key)
{
    ferry_notify_count_t **b = &table[key_bucket(key)];
    for (ferry_notify_count_t *c = *b; c; c = c->next)
        if (memcmp(c->key, key, NOTIFY_KEY) == 0) return c;
    ferry_notify_count_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    memcpy(c->key, key, NOTIFY_KEY);
    c->next = *b;
    *b = c;
    return c;
}

/* Frees a count that holds no notification. */
static void count_forget_empty(ferry_notify_count_t **table, ferry_notify_count_t *c)
{
    if (!c || c->n) return;
    ferry_notify_count_t **p = &table[key_bucket(c->key)];
    while (*p != c) p = &(*p)->next;
    *p = c->next;
    free(c);
}

/* What one notification of len bytes costs against the budgets. */
static size_t charge_of(size_t len)
{
    return len + FERRY_NOTIFY_ENTRY_OVERHEAD;
}

/* Takes one notification of len bytes off the count. */
static void count_put(ferry_notify_count_t **table, ferry_notify_count_t *c, size_t len)
{
    c->n--;
    c->charged -= charge_of(len);
    count_forget_empty(table, c);
}

/* The connection's source address: 16 bytes (IPv4 as ::ffff:a.b.c.d) into
 * ip, the host as text ("a.b.c.d" or "[v6]") and the port. */
static void source_of(int fd, uint8_t ip[16], char *host, size_t cap, uint16_t *port)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char text[INET6_ADDRSTRLEN] = "?";
    memset(ip, 0, 16);
    *port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        ip[10] = ip[11] = 0xff;
        memcpy(ip + 12, &a->sin_addr, 4);
        inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
        *port = ntohs(a->sin_port);
        snprintf(host, cap, "%s", text);
        return;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        memcpy(ip, &a->sin6_addr, 16);
        inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
        *port = ntohs(a->sin6_port);
    }
    snprintf(host, cap, "[%s]", text);
}

/* Which share, if any, one more notification of len bytes would overflow. */
static const char *over_share(ferry_engine_t *e, const ferry_notify_count_t *snd,
                              const ferry_notify_count_t *src, size_t len, size_t *count)
{
    ferry_notify_queue_t *q = ferry_engine_part_notify(e);
    size_t charge = charge_of(len);
    if (snd->n >= FERRY_NOTIFY_PEER_BACKLOG || snd->charged + charge > FERRY_NOTIFY_PEER_BYTES) {
        *count = snd->n;
        return "sender";
    }
    if (src->n >= FERRY_NOTIFY_ADDRESS_BACKLOG || src->charged + charge > FERRY_NOTIFY_ADDRESS_BYTES) {
        *count = src->n;
        return "address";
    }
    if (q->count >= FERRY_MAX_QUEUED_NOTIFY || q->bytes + charge > FERRY_MAX_QUEUED_NOTIFY_BYTES) {
        *count = q->count;
        return "engine";
    }
    return NULL;
}

/* Counts a dropped notification and says so, at most once a second (the
 * lines say how many were dropped unlogged since). Under notify_lock. */
static void note_drop_locked(ferry_engine_t *e, const ferry_conn_t *c, const char *host, const char *over,
                             size_t count)
{
    ferry_notify_queue_t *q = ferry_engine_part_notify(e);
    FERRY_STAT_ADD(ferry_engine_counters(e), notifies_dropped, 1);
    struct ferry_notify_tables *t = q->tables;
    uint64_t now = ferry_now_ns();
    if (t && t->last_drop_log_ns && now - t->last_drop_log_ns < 1000000000ull) {
        t->drops_unlogged++;
        return;
    }
    FERRY_LOG(FERRY_LOG_WARN, "notify",
              "dropped a notification from %s (engine %016llx at %s): %zu from this %s are queued unread "
              "(%llu more dropped since the last such line)",
              c->peer.name, (unsigned long long)c->peer.engine_id, host, count, over,
              (unsigned long long)(t ? t->drops_unlogged : 0));
    if (t) {
        t->last_drop_log_ns = now ? now : 1;
        t->drops_unlogged = 0;
    }
}

int ferry_notify_push(ferry_conn_t *c, unsigned char *msg, size_t len)
{
    ferry_engine_t *e = c->engine;
    ferry_notify_queue_t *q = ferry_engine_part_notify(e);
    ferry_notify_node_t *n = calloc(1, sizeof *n);
    uint8_t ip[16], sender_key[NOTIFY_KEY] = {0}, source_key[NOTIFY_KEY] = {0};
    char host[INET6_ADDRSTRLEN + 2];
    uint16_t port;
    source_of(c->fd, ip, host, sizeof host, &port);
    memcpy(sender_key, ip, 16);
    memcpy(sender_key + 16, &c->peer.engine_id, 8);
    memcpy(sender_key + 24, &c->peer.epoch, 8);
    memcpy(source_key, ip, 16);

    const char *over = NULL;
    size_t count = 0;
    pthread_mutex_lock(&q->lock);
    if (!q->tables) q->tables = calloc(1, sizeof *q->tables);
    ferry_notify_count_t *snd = n && q->tables ? count_get(q->tables->sender, sender_key) : NULL;
    ferry_notify_count_t *src = snd ? count_get(q->tables->source, source_key) : NULL;
    if (!src)
        over = "memory";
    else
        over = over_share(e, snd, src, len, &count);
    if (over) {
        note_drop_locked(e, c, host, over, count);
        /* A count made just now for this refused one holds nothing. */
        if (q->tables) {
            count_forget_empty(q->tables->sender, snd);
            count_forget_empty(q->tables->source, src);
        }
    } else {
        if (snd->n == 0) { /* a new sender entry: what its notifications say of it */
            snprintf(snd->name, sizeof snd->name, "%s", c->peer.name);
            snprintf(snd->host, sizeof snd->host, "%s", host);
            snd->from.engine_id = c->peer.engine_id;
            snd->from.epoch = c->peer.epoch;
            /* Served connections exist only after the handshake; with a
             * secret, only after the initiator proved it holds it (engine.c). */
            snd->from.authenticated = ferry_engine_part_config(e)->secret != NULL;
        }
        snd->n++;
        snd->charged += charge_of(len);
        src->n++;
        src->charged += charge_of(len);
        n->sender = snd;
        n->source = src;
        n->msg = msg;
        n->len = (uint32_t)len;
        n->port = port;
        if (q->tail)
            q->tail->next = n;
        else
            q->head = n;
        q->tail = n;
        q->count++;
        q->bytes += charge_of(len);
    }
    pthread_mutex_unlock(&q->lock);
    if (!over) return 0;
    int rc = strcmp(over, "memory") == 0
                 ? ferry_fail(FERRY_ERR_MEMORY, "notification from %s: out of memory", c->peer.name)
                 : ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS,
                              "notification from %s (engine %016llx, %s) dropped: %zu from this %s are queued unread",
                              c->peer.name, (unsigned long long)c->peer.engine_id, host, count, over);
    free(msg);
    free(n);
    return rc;
}

static void tables_free(ferry_notify_count_t **table)
{
    for (int b = 0; b < NOTIFY_BUCKETS; b++)
        while (table[b]) {
            ferry_notify_count_t *c = table[b];
            table[b] = c->next;
            free(c);
        }
}

void ferry_notify_clear(ferry_engine_t *e)
{
    ferry_notify_queue_t *q = ferry_engine_part_notify(e);
    ferry_notify_node_t *n = q->head;
    while (n) {
        ferry_notify_node_t *next = n->next;
        free(n->msg);
        free(n);
        n = next;
    }
    q->head = q->tail = NULL;
    q->count = 0;
    q->bytes = 0;
    if (q->tables) {
        tables_free(q->tables->sender);
        tables_free(q->tables->source);
        free(q->tables);
        q->tables = NULL;
    }
}

/* Whether c's target serves NOTIFY exactly once (cancel.h, "Notifications"). */
static bool notify_once(const ferry_conn_t *c)
{
    return (c->peer.flags & FERRY_HELLO_F_NOTIFY_ONCE) && ferry_fence_reports_placed(c);
}

/* One NOTIFY exchange under request id req_id. *answered: the target's
 * NOTIFY_ACK for it arrived (else, once the frame began to go out, whether
 * it was queued is in doubt). */
static int send_notify(ferry_conn_t *c, uint64_t req_id, const void *msg, size_t len, uint64_t deadline,
                       bool *answered)
{
    *answered = false;
    ferry_frame_t f = {.type = FERRY_FRAME_NOTIFY, .req_id = req_id, .plen = (uint32_t)len};
    if (notify_once(c)) ferry_deadline_stamp(c, &f, deadline);
    int rc = ferry_conn_send_frame(c, &f, msg, deadline);
    if (rc) return rc;
    ferry_frame_t ack;
    rc = ferry_conn_recv_frame(c, &ack, deadline);
    if (rc) return rc;
    if (ack.type != FERRY_FRAME_NOTIFY_ACK || ack.plen != 0 || ack.req_id != req_id)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected NOTIFY_ACK for %llu, got %s for %llu of %u bytes",
                          (unsigned long long)req_id, ferry_frame_type_name(ack.type),
                          (unsigned long long)ack.req_id, ack.plen);
    *answered = true;
    if (ack.status == FERRY_ERR_TOO_MANY_REQUESTS)
        return ferry_fail(ack.status, "%s's notification queue is full (it does not fetch its notifications?)",
                          c->peer.name);
    if (ack.status == FERRY_ERR_TIMEOUT)
        return ferry_fail(ack.status, "%s received the notification past its deadline; not queued", c->peer.name);
    if (ack.status) return ferry_fail(ack.status, "%s refused the notification", c->peer.name);
    return 0;
}

/* A NOTIFY whose answer was lost to rc, on a connection now aborted: what
 * the fence says of it. 0 (delivered), rc again when it was not delivered
 * (*resend: a broken connection may try again) or cannot be told, or
 * CANCEL_UNCONFIRMED. */
static int settle_in_doubt(ferry_session_t *s, uint64_t req_id, uint64_t conn_key, int rc, bool *resend)
{
    int out = ferry_fence_notify(s, req_id, conn_key, rc);
    if (out < 0) return out;
    if (out == FERRY_NOTIFY_DELIVERED) {
        FERRY_LOG(FERRY_LOG_DEBUG, "notify", "%s: the notification was queued before %s; not resent", s->name,
                  ferry_error_name(rc));
        ferry_clear_last_error();
        return 0;
    }
    if (out == FERRY_NOTIFY_NOT_DELIVERED) *resend = true;
    else
        ferry_fail_context("the target cannot tell whether it was queued; not resent, so that it is not "
                           "delivered twice");
    return rc;
}

static int notify(ferry_engine_t *e, const char *peer, const void *msg, size_t len, int timeout_ms)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    ferry_clear_last_error();
    if (!e || !peer || (!msg && len)) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "notify: NULL argument");
    if (len > FERRY_WIRE_MAX_NOTIFY)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "notify: %zu bytes exceed the %u-byte limit", len,
                          FERRY_WIRE_MAX_NOTIFY);
    ferry_session_t *s;
    int rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    uint64_t deadline = ferry_deadline_after_ms(timeout_ms > 0 ? timeout_ms : cfg->timeout_ms);
    for (int attempt = 0; attempt <= cfg->retries; attempt++) {
        ferry_conn_t *c;
        bool resend = false;
        rc = ferry_session_checkout(s, deadline, &c);
        if (rc == 0) {
            /* Each attempt its own id: a fenced one is refused for good. */
            uint64_t req_id = ferry_engine_part_req_ids(e, 1);
            bool answered = false, once = notify_once(c);
            uint64_t conn_key = atomic_load(&c->cancel_key);
            rc = send_notify(c, req_id, msg, len, deadline, &answered);
            ferry_session_checkin(s, c, answered && (rc == 0 || rc == FERRY_ERR_TOO_MANY_REQUESTS));
            if (!answered && once) rc = settle_in_doubt(s, req_id, conn_key, rc, &resend);
            else if (!answered)
                resend = false; /* an older target: the NOTIFY may have been queued; no blind resend */
        } else {
            resend = true; /* nothing went out */
        }
        if (!resend || (rc != FERRY_ERR_PEER_CLOSED && rc != FERRY_ERR_SOCKET)) break;
        if (attempt < cfg->retries) ferry_count_retry(e, NULL, rc);
    }
    ferry_session_put(s);
    if (rc) {
        FERRY_STAT_ADD(ferry_engine_counters(e), notifies_unsent, 1);
        ferry_fail_context("notify %s (%zu bytes)", peer, len);
    }
    return rc;
}

/* Inside the engine's count of calls in progress (engine.h). */
int ferry_notify_timeout(ferry_engine_t *e, const char *peer, const void *msg, size_t len, int timeout_ms)
{
    int rc = e ? ferry_engine_enter(e) : 0;
    if (rc) return rc;
    rc = notify(e, peer, msg, len, timeout_ms);
    return e ? ferry_engine_leave(e, rc) : rc;
}

int ferry_notify(ferry_engine_t *e, const char *peer, const void *msg, size_t len)
{
    return ferry_notify_timeout(e, peer, msg, len, 0);
}

long ferry_get_notifications(ferry_engine_t *e, ferry_notification_t *out, size_t max)
{
    return ferry_get_notifications_from(e, out, NULL, max);
}

long ferry_get_notifications_from(ferry_engine_t *e, ferry_notification_t *out, ferry_notification_sender_t *from,
                                  size_t max)
{
    ferry_notify_queue_t *q = ferry_engine_part_notify(e);
    if (!e || (!out && max)) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "get notifications: NULL argument");
    size_t k = 0;
    pthread_mutex_lock(&q->lock);
    while (k < max && q->head) {
        ferry_notify_node_t *n = q->head;
        q->head = n->next;
        if (!q->head) q->tail = NULL;
        q->count--;
        q->bytes -= charge_of(n->len);
        ferry_notify_count_t *snd = n->sender;
        memset(&out[k], 0, sizeof out[k]);
        snprintf(out[k].peer, sizeof out[k].peer, "%s", snd->name);
        out[k].msg = n->msg;
        out[k].len = n->len;
        if (from) {
            from[k] = snd->from;
            snprintf(from[k].addr, sizeof from[k].addr, "%s:%u", snd->host, (unsigned)n->port);
        }
        count_put(q->tables->sender, snd, n->len);
        count_put(q->tables->source, n->source, n->len);
        k++;
        free(n);
    }
    pthread_mutex_unlock(&q->lock);
    return (long)k;
}

void ferry_notifications_free(ferry_notification_t *n, size_t count)
{
    for (size_t i = 0; n && i < count; i++) {
        free(n[i].msg);
        n[i].msg = NULL;
    }
}
