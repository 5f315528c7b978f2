/* SPDX-License-Identifier: Apache-2.0 */
/* One connection, either side (conn.h): its framed I/O, the protocol
 * version it speaks, and freeing it. */
#include "conn.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "link.h"
#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/memkind.h"
#include "util/net.h"

/* The answers lately taken on an initiator's connection (conn.h): a ring;
 * type 0 marks a free or forgotten entry. */
struct ferry_answered {
    struct answer_key {
        uint8_t type;
        int32_t status;
        uint64_t req_id, addr, len;
    } k[FERRY_CONN_ANSWERS_KEPT];
    unsigned next;
};

static bool is_answer(uint8_t type)
{
    return type == FERRY_FRAME_READ_RESP || type == FERRY_FRAME_WRITE_ACK || type == FERRY_FRAME_VEC_ACK ||
           type == FERRY_FRAME_NOTIFY_ACK;
}

static bool same_answer(const struct answer_key *k, const ferry_frame_t *f)
{
    return k->type == f->type && k->status == f->status && k->req_id == f->req_id && k->addr == f->addr &&
           k->len == f->len;
}

void ferry_conn_answers_forget(ferry_conn_t *c, const ferry_frame_t *f)
{
    if (!c->answered) return;
    bool whole = f->type == FERRY_FRAME_WRITEV || f->type == FERRY_FRAME_READV || f->type == FERRY_FRAME_CMA_VEC ||
                 f->type == FERRY_FRAME_NOTIFY;
    for (unsigned i = 0; i < FERRY_CONN_ANSWERS_KEPT; i++) {
        struct answer_key *k = &c->answered->k[i];
        if (k->type && k->req_id == f->req_id && (whole || k->addr == f->addr)) k->type = 0;
    }
}

/* Whether answer f duplicates one taken on c; else it is kept as taken.
 * Without memory for the ring, nothing is recognized (conn.h: the caller
 * then finds a duplicate out of step). */
static bool answer_duplicated(ferry_conn_t *c, const ferry_frame_t *f)
{
    if (!c->answered && !(c->answered = calloc(1, sizeof *c->answered))) return false;
    struct ferry_answered *a = c->answered;
    for (unsigned i = 0; i < FERRY_CONN_ANSWERS_KEPT; i++)
        if (same_answer(&a->k[i], f)) return true;
    a->k[a->next] = (struct answer_key){f->type, f->status, f->req_id, f->addr, f->len};
    a->next = (a->next + 1) % FERRY_CONN_ANSWERS_KEPT;
    return false;
}

/* A decoded header f on c: 1 when it is a duplicate answer, whose payload
 * was then read and dropped (the caller receives the next frame); 0 to
 * take it; or a failure reading the payload. */
static int answer_dropped(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline)
{
    if (!c->session || !is_answer(f->type) || !answer_duplicated(c, f)) return 0;
    c->answers_duplicated++;
    FERRY_LOG(FERRY_LOG_DEBUG, "conn", "%s: dropped a duplicate %s for request %llu [0x%llx+%llu) (%llu so far)",
              c->peer.name, ferry_frame_type_name(f->type), (unsigned long long)f->req_id,
              (unsigned long long)f->addr, (unsigned long long)f->len, (unsigned long long)c->answers_duplicated);
    int rc = ferry_conn_discard(c, f->plen, deadline);
    return rc ? rc : 1;
}

int ferry_conn_send_frame(ferry_conn_t *c, ferry_frame_t *f, const void *payload, uint64_t deadline)
{
    if (!c->served) ferry_conn_answers_forget(c, f);
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(f, hdr);
    struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)payload, f->plen}};
    /* The target's answers in the event loop never block a serving thread. */
    if (c->served) return ferry_serve_sendv(c, iov, f->plen ? 2 : 1, deadline);
    return ferry_net_sendv(c->fd, iov, f->plen ? 2 : 1, deadline);
}

int ferry_conn_recv_frame(ferry_conn_t *c, ferry_frame_t *f, uint64_t deadline)
{
    for (;;) {
        uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
        int rc = ferry_net_recv(c->fd, hdr, sizeof hdr, deadline);
        if (rc == 0) rc = ferry_frame_decode(hdr, f);
        if (rc == 0) rc = answer_dropped(c, f, deadline);
        if (rc != 1) return rc;
    }
}

static atomic_ulong nap_waits, naps_taken; /* process-wide (ferry_conn_naps) */

unsigned long ferry_conn_naps(unsigned long *waits)
{
    if (waits) *waits = atomic_load_explicit(&nap_waits, memory_order_relaxed);
    return atomic_load_explicit(&naps_taken, memory_order_relaxed);
}

/* For FERRY_SPIN_NAP (conn.h): the adaptive spin, or a nap (spin.h, never
 * past the deadline) and then the spin over the wait's end, in which case
 * *napped is set for the caller to report how that spin went. */
static unsigned nap_or_spin(ferry_conn_t *c, uint64_t deadline, bool *napped)
{
    atomic_fetch_add_explicit(&nap_waits, 1, memory_order_relaxed);
    unsigned spin_us = ferry_conn_spin_us(c), tail_us = 0;
    unsigned nap_us = spin_us ? 0 : ferry_spin_nap(&c->spin, c->link->spin_us, &tail_us);
    if (nap_us == 0) return spin_us;
    uint64_t now = ferry_now_ns(), left_us = deadline > now ? (deadline - now) / 1000u : 0;
    if (nap_us > left_us) nap_us = (unsigned)left_us;
    if (nap_us == 0) return 0; /* the deadline is due: the receive reports it */
    atomic_fetch_add_explicit(&naps_taken, 1, memory_order_relaxed);
    if (ferry_net_nap_readable(c->fd, nap_us) == 1) {
        ferry_spin_nap_outcome(&c->spin, FERRY_NAP_WOKEN); /* there already: no spin */
        return 0;
    }
    *napped = true;
    return tail_us;
}

int ferry_conn_recv_frame_spin(ferry_conn_t *c, ferry_frame_t *f, uint64_t deadline, unsigned spin_us)
{
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    size_t got = 0;
    uint64_t t0 = ferry_now_ns();
    bool napped = false;
    if (spin_us == FERRY_SPIN_NAP) spin_us = nap_or_spin(c, deadline, &napped);
    int rc = ferry_net_recv_spin(c->fd, hdr, sizeof hdr, spin_us, &got);
    if (napped) ferry_spin_nap_outcome(&c->spin, got == sizeof hdr ? FERRY_NAP_CAUGHT : FERRY_NAP_MISSED);
    if (rc == 0 && got < sizeof hdr) rc = ferry_net_recv(c->fd, hdr + got, sizeof hdr - got, deadline);
    if (rc) return rc;
    ferry_spin_record(&c->spin, ferry_now_ns() - t0);
    rc = ferry_frame_decode(hdr, f);
    if (rc == 0) rc = answer_dropped(c, f, deadline);
    return rc == 1 ? ferry_conn_recv_frame(c, f, deadline) : rc;
}

unsigned ferry_conn_spin_us(ferry_conn_t *c)
{
    return ferry_spin_us(&c->spin, c->link->spin_us);
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

unsigned ferry_conn_version(const ferry_conn_t *c)
{
    unsigned ours = (unsigned)atomic_load_explicit(&c->link->proto_max, memory_order_relaxed);
    return c->peer.proto_max < ours ? c->peer.proto_max : ours;
}

void ferry_conn_set_rcvlowat(ferry_conn_t *c, int n)
{
    int now = c->rcvlowat > 1 ? c->rcvlowat : 1;
    if (n != now && setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &n, sizeof n) == 0) c->rcvlowat = n;
}

void ferry_conn_free(ferry_conn_t *c)
{
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    if (c->served_free) c->served_free(c);
    ferry_cancel_conn_close(c);
    if (c->xport_free) c->xport_free(c->xport);
    free(c->bounce);
    ferry_stage_free(c->stage);
    ferry_land_free(c->land);
    free(c->vec);
    free(c->answered);
    free(c->outbox.out);
    free(c);
}
