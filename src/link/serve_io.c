/* SPDX-License-Identifier: Apache-2.0 */
/* The target side's answers and waits on one served connection (conn.h):
 * what the frame handlers (serve/engine.c, the transports' serve hooks)
 * call to answer without blocking a serving thread of the event loop, and
 * to wait on their connection while no other data frame wants the thread.
 * The event loop (serve/evloop.c) sets what they need of it in the
 * connection's outbox: the handshake is over, the frame holds a data slot,
 * the descriptor that says other data frames wait. */
#include "conn.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "util/clock.h"
#include "util/fail.h"
#include "util/net.h"

/* Queues iov[0..cnt) behind what c's outbox already holds. */
static int outbox_append(ferry_conn_t *c, const struct iovec *iov, int cnt)
{
    ferry_outbox_t *s = &c->outbox;
    size_t need = 0;
    for (int i = 0; i < cnt; i++) need += iov[i].iov_len;
    if (s->out_off == s->out_len) s->out_off = s->out_len = 0;
    if (s->out_len + need > s->out_cap) {
        size_t cap = s->out_len + need < 4096 ? 4096 : s->out_len + need;
        uint8_t *b = realloc(s->out, cap);
        if (!b) return ferry_fail(FERRY_ERR_MEMORY, "answer of %zu bytes to %s: out of memory", need, c->peer.name);
        s->out = b;
        s->out_cap = cap;
    }
    for (int i = 0; i < cnt; i++) {
        memcpy(s->out + s->out_len, iov[i].iov_base, iov[i].iov_len);
        s->out_len += iov[i].iov_len;
    }
    return 0;
}

bool ferry_serve_answer_pending(const ferry_conn_t *c)
{
    return c->outbox.out_off < c->outbox.out_len;
}

/* Sends what it can of iov (advanced past what went): the bytes sent, or
 * -1 with errno (EAGAIN when the socket is full). */
static ssize_t send_some(int fd, struct iovec *iov, int *at, int cnt)
{
    struct msghdr mh = {.msg_iov = iov + *at, .msg_iovlen = (size_t)(cnt - *at)};
    ssize_t n;
    do n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    size_t left = n > 0 ? (size_t)n : 0;
    while (*at < cnt && left >= iov[*at].iov_len) left -= iov[(*at)++].iov_len;
    if (*at < cnt && left) {
        iov[*at].iov_base = (char *)iov[*at].iov_base + left;
        iov[*at].iov_len -= left;
    }
    return n;
}

static int send_failed(ferry_conn_t *c, int err)
{
    return ferry_fail(err == EPIPE || err == ECONNRESET ? FERRY_ERR_PEER_CLOSED : FERRY_ERR_SOCKET,
                      "answer to %s: send: %s", c->peer.name, strerror(err));
}

int ferry_serve_sendv(ferry_conn_t *c, const struct iovec *iov, int cnt, uint64_t deadline)
{
    ferry_outbox_t *s = &c->outbox;
    if (!c->served || !s->framed) return ferry_net_sendv(c->fd, (struct iovec *)iov, cnt, deadline);
    if (cnt > 8) return ferry_fail(FERRY_ERR_INTERNAL, "an answer of %d parts", cnt);
    struct iovec v[8];
    memcpy(v, iov, (size_t)cnt * sizeof *iov);
    int at = 0;
    /* Behind answers already queued: after them, never before. */
    while (!ferry_serve_answer_pending(c) && at < cnt) {
        ssize_t n = send_some(c->fd, v, &at, cnt);
        if (n >= 0) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return send_failed(c, errno);
        if (!s->slot) break; /* a control frame's answer: queued at once */
        int w = ferry_serve_answer_wait(c, deadline);
        if (w < 0)
            return ferry_fail(FERRY_ERR_TIMEOUT, "the answer to %s stalled: it stopped reading for %d ms", c->peer.name,
                              s->timeout_ms);
        if (w == 0) break; /* another data frame wants the thread */
    }
    return at < cnt ? outbox_append(c, v + at, cnt - at) : 0;
}

int ferry_serve_flush(ferry_conn_t *c)
{
    ferry_outbox_t *s = &c->outbox;
    while (ferry_serve_answer_pending(c)) {
        ssize_t n = send(c->fd, s->out + s->out_off, s->out_len - s->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            s->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return send_failed(c, errno);
        return FERRY_SERVE_PENDING;
    }
    s->out_off = s->out_len = 0;
    /* A large answer's room is given back; a small one is kept for the next. */
    if (s->out_cap > 65536) {
        free(s->out);
        s->out = NULL;
        s->out_cap = 0;
    }
    return 0;
}

/* The thread keeps its data slot and waits on the connection, as a thread
 * per connection did, for as long as no other data frame needs a slot:
 * then the frame is parked at once. So a well-behaved peer's pauses (a
 * descheduled sender, a slow link) cost nothing more than before, and
 * stalled or trickling peers hold threads only while nobody else wants
 * them. */
static int serve_wait(ferry_conn_t *c, short events, uint64_t deadline)
{
    for (;;) {
        int ms = ferry_ms_left(deadline);
        if (ms == 0) return -1;
        struct pollfd p[2] = {{.fd = c->fd, .events = events}, {.fd = -1, .events = POLLIN}};
        /* Served by a thread of its own (ferry_serve_connection): it waits. */
        if (c->served) p[1].fd = c->outbox.contended_fd;
        int n = poll(p, 2, ms);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 || p[0].revents) return 1; /* an error: the next receive reports it */
        if (p[1].revents) return 0;
    }
}

int ferry_serve_payload_wait(ferry_conn_t *c, uint64_t deadline)
{
    return serve_wait(c, POLLIN, deadline);
}

int ferry_serve_answer_wait(ferry_conn_t *c, uint64_t deadline)
{
    return serve_wait(c, POLLOUT, deadline);
}
