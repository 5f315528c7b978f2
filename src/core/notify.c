/* Notifications: small messages delivered to the peer's queue through the
 * engine, after the writes that preceded them completed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine.h"
#include "fail.h"

int ferry_notify_push(ferry_engine_t *e, const char *peer, unsigned char *msg, size_t len)
{
    pthread_mutex_lock(&e->notify_lock);
    bool full = e->notify_count >= FERRY_MAX_QUEUED_NOTIFY || e->notify_bytes + len > FERRY_MAX_QUEUED_NOTIFY_BYTES;
    size_t count = e->notify_count;
    pthread_mutex_unlock(&e->notify_lock);
    if (full) {
        free(msg);
        return ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS, "notification from %s refused: %zu are queued unread", peer,
                          count);
    }
    ferry_notify_node_t *n = calloc(1, sizeof *n);
    if (!n) {
        free(msg);
        return ferry_fail(FERRY_ERR_MEMORY, "notification from %s: out of memory", peer);
    }
    snprintf(n->n.peer, sizeof n->n.peer, "%s", peer);
    n->n.msg = msg;
    n->n.len = len;
    pthread_mutex_lock(&e->notify_lock);
    if (e->notify_tail)
        e->notify_tail->next = n;
    else
        e->notify_head = n;
    e->notify_tail = n;
    e->notify_count++;
    e->notify_bytes += len;
    pthread_mutex_unlock(&e->notify_lock);
    return 0;
}

void ferry_notify_clear(ferry_engine_t *e)
{
    ferry_notify_node_t *n = e->notify_head;
    while (n) {
        ferry_notify_node_t *next = n->next;
        free(n->n.msg);
        free(n);
        n = next;
    }
    e->notify_head = e->notify_tail = NULL;
    e->notify_count = 0;
    e->notify_bytes = 0;
}

static int send_notify(ferry_conn_t *c, const void *msg, size_t len, uint64_t deadline)
{
    ferry_frame_t f = {.type = FERRY_FRAME_NOTIFY, .plen = (uint32_t)len};
    int rc = ferry_conn_send_frame(c, &f, msg, deadline);
    if (rc) return rc;
    ferry_frame_t ack;
    rc = ferry_conn_recv_frame(c, &ack, deadline);
    if (rc) return rc;
    if (ack.type != FERRY_FRAME_NOTIFY_ACK || ack.plen != 0)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected NOTIFY_ACK, got %s of %u bytes",
                          ferry_frame_type_name(ack.type), ack.plen);
    if (ack.status == FERRY_ERR_TOO_MANY_REQUESTS)
        return ferry_fail(ack.status, "%s's notification queue is full (it does not fetch its notifications?)",
                          c->peer.name);
    if (ack.status) return ferry_fail(ack.status, "%s refused the notification", c->peer.name);
    return 0;
}

static int notify(ferry_engine_t *e, const char *peer, const void *msg, size_t len)
{
    ferry_clear_last_error();
    if (!e || !peer || (!msg && len)) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "notify: NULL argument");
    if (len > FERRY_WIRE_MAX_NOTIFY)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "notify: %zu bytes exceed the %u-byte limit", len,
                          FERRY_WIRE_MAX_NOTIFY);
    ferry_session_t *s;
    int rc = ferry_session_get(e, peer, &s);
    if (rc) return rc;
    uint64_t deadline = ferry_deadline_after_ms(e->cfg.timeout_ms);
    for (int attempt = 0; attempt <= e->cfg.retries; attempt++) {
        ferry_conn_t *c;
        rc = ferry_session_checkout(s, deadline, &c);
        if (rc == 0) {
            rc = send_notify(c, msg, len, deadline);
            ferry_session_checkin(s, c, rc == 0 || rc == FERRY_ERR_TOO_MANY_REQUESTS);
        }
        if (rc != FERRY_ERR_PEER_CLOSED && rc != FERRY_ERR_SOCKET) break;
        if (attempt < e->cfg.retries) ferry_stats_retry(&e->stats, rc);
    }
    ferry_session_put(s);
    if (rc) ferry_fail_context("notify %s (%zu bytes)", peer, len);
    return rc;
}

/* Inside the engine's count of calls in progress (engine.h). */
int ferry_notify(ferry_engine_t *e, const char *peer, const void *msg, size_t len)
{
    int rc = e ? ferry_engine_enter(e) : 0;
    if (rc) return rc;
    rc = notify(e, peer, msg, len);
    return e ? ferry_engine_leave(e, rc) : rc;
}

long ferry_get_notifications(ferry_engine_t *e, ferry_notification_t *out, size_t max)
{
    if (!e || (!out && max)) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "get notifications: NULL argument");
    size_t k = 0;
    pthread_mutex_lock(&e->notify_lock);
    while (k < max && e->notify_head) {
        ferry_notify_node_t *n = e->notify_head;
        e->notify_head = n->next;
        if (!e->notify_head) e->notify_tail = NULL;
        e->notify_count--;
        e->notify_bytes -= n->n.len;
        out[k++] = n->n;
        free(n);
    }
    pthread_mutex_unlock(&e->notify_lock);
    return (long)k;
}

void ferry_notifications_free(ferry_notification_t *n, size_t count)
{
    for (size_t i = 0; n && i < count; i++) {
        free(n[i].msg);
        n[i].msg = NULL;
    }
}
