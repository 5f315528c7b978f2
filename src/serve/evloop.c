/* SPDX-License-Identifier: Apache-2.0 */
/* The target side on an event loop: a small fixed set of serving threads,
 * not one thread per connection.
 *
 * Every served connection that waits for its peer is parked in one epoll
 * set, armed EPOLLONESHOT; the serving threads all wait in epoll_wait on
 * that set, so a readable connection wakes exactly one of them (one wake-up
 * per request, as with a thread per connection) and nobody else touches it
 * until that thread parks it again. An idle connection costs its socket, an
 * epoll entry and its ferry_conn_t, no thread and no CPU.
 *
 * The thread that takes a connection:
 *  - in its handshake, reads what has arrived of the HELLO (then the AUTH)
 *    frame without waiting and parks it again until the frame is whole: a
 *    peer that sends a byte and stops (slowloris) holds no thread, and the
 *    listener ends it at its handshake deadline (config.connect_timeout_ms);
 *  - once established, serves frames with the same blocking handlers as
 *    before (engine.c, the transports' serve hooks), each bounded by its
 *    deadline (a frame once begun must arrive whole within config.timeout_ms,
 *    as before; its header is read without waiting, so a peer stalling in
 *    it holds no thread either), then busy-polls briefly for the next header (spin.h) and
 *    parks the connection when none comes, or after SERVE_TURN_FRAMES frames
 *    so that a busy peer does not keep a thread from the others;
 *  - nor does a peer stalling or trickling in a frame's payload: a WRITE's
 *    or an unchecksummed WRITEV's handler (transport/tcp.c; a WRITEV's
 *    descriptors are read whole first) places the payload as it arrives and, when
 *    it runs dry while another data frame waits for a thread, saves its
 *    progress in the connection (ferry_partial_t), returns
 *    FERRY_SERVE_PENDING, and the connection is parked busy with the
 *    frame's deadline (the listener enforces it as for a half-read header)
 *    until more bytes come; every other frame with a payload waits parked
 *    until its payload is whole (payload_gate: the socket's SO_RCVLOWAT),
 *    then runs its handler unchanged; a READ's answer that the socket has
 *    no room for (a peer that stopped reading) is parked the same way,
 *    armed for EPOLLOUT (partial.wait_out), and so is a READV's; every
 *    other answer the socket has no room for is queued in the connection
 *    (ferry_serve_sendv: one frame's answers at most, no frame is read
 *    meanwhile) and the connection parked for room (answer_park), closed
 *    when it does not drain within config.timeout_ms. A control frame's
 *    answer never waits for room, so the control threads never block on a
 *    send. Uncontended, a data frame's thread waits on the connection as
 *    before (ferry_serve_payload_wait, ferry_serve_answer_wait). Limits:
 *    a gated frame whose payload is larger than the kernel will buffer for
 *    the low-water mark (half the largest receive buffer; WRITE and WRITEV
 *    payloads, checksummed or not, are not gated), or one woken early under
 *    the kernel's memory pressure, is served as before, blocking up to its
 *    deadline.
 *
 * Cancels must be served even while every thread is busy with long or
 * stalled writes (a CANCEL comes on a spare connection and its initiator
 * waits config.cancel_timeout_ms, cancel.h). So data frames may occupy at
 * most nthreads - SERVE_CONTROL_THREADS threads at once; a data frame that
 * finds them all taken waits in a FIFO for the next one to come free (its
 * connection stays BUSY, never evicted) while the remaining threads keep
 * serving handshakes and control frames (CANCEL, PING, SEG_QUERY: no
 * payload, a small answer) on every other connection.
 *
 * Why a loop of our own and not libevent or libuv: both run one loop per
 * thread and call back into non-blocking code; ours are blocking handlers
 * with deadlines, shared by every transport. What they need is a set of
 * threads taking turns on ready descriptors, which EPOLLONESHOT gives in a
 * few lines (the model is Redis's ae: a thin layer over epoll), with no new
 * dependency to build, package and audit. As in ae, the loop knows nothing
 * of its owner: the handlers it calls and their context pointer are handed
 * to it at start (evloop.h; engine.c gives them).
 *
 * Ownership: a connection belongs to the thread that took its event (or to
 * the data queue) until it is parked again; only that owner reads or frees
 * it. Everyone else (the evictor, the handshake deadline, destroy) acts on
 * it through its state (under conns_lock) and shutdown(), which makes it
 * readable: its next owner sees why and ends it. */
#include "evloop.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/config.h"
#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/net.h"

/* Threads kept from data frames, for handshakes and control frames. */
#define SERVE_CONTROL_THREADS 2
/* Frames served on one connection in a row before it goes to the back. */
#define SERVE_TURN_FRAMES 16
/* How long a thread that served a frame waits on its connection for the
 * next one before parking it, while other threads wait for work. */
#define SERVE_HOLD_MS 2
/* Bounds of the serving threads (FERRY_SERVE_THREADS, else from the CPUs). */
#define SERVE_THREADS_MIN (SERVE_CONTROL_THREADS + 1)
#define SERVE_THREADS_MAX 256

enum serve_phase { PHASE_HELLO = 0, PHASE_AUTH, PHASE_FRAMES };

#define HELLO_MAX (FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME)

/* The handshake's frames as they arrive, and its transcript for the MACs;
 * freed once the handshake is over. */
typedef struct handshake {
    uint8_t in[FERRY_FRAME_HEADER_SIZE + HELLO_MAX]; /* the frame being read */
    size_t got;
    ferry_frame_t frame;                             /* its header, once whole */
    uint8_t hello[HELLO_MAX], ack[HELLO_MAX];
    size_t hlen, alen;
} handshake_t;

typedef struct ferry_served {
    ferry_evloop_t *loop;       /* the loop that serves it */
    int phase;                  /* enum serve_phase; its owner's */
    atomic_bool expired;        /* the handshake deadline passed (listener) */
    handshake_t *hs;            /* in the handshake */
    ferry_frame_t queued;       /* in the data queue: the frame it waits to serve */
    ferry_conn_t *queue_next;
    /* Established: what has arrived of the next frame's header, and while
     * it is parked half-read, when the rest is due (else 0; listener). */
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    size_t hgot;
    _Atomic uint64_t header_due_ns;
    /* Parked (no thread has it): with header_due_ns set, it is stalled in
     * a frame or in its answers, and evictable under pressure (listener). */
    atomic_bool parked;
    /* Answers the socket had no room for wait in c->outbox (link/conn.h):
     * while it is not empty no new frame is read; the connection waits
     * parked for EPOLLOUT (answer_park) and is closed when it does not
     * drain within config.timeout_ms. */
    /* Bumped (release) by each owner as it parks the connection and read
     * (acquire) by the next: epoll hands the connection over, but thread
     * sanitizers do not see an EPOLL_CTL_MOD as a release. */
    atomic_uint handoff;
} ferry_served_t;

struct ferry_evloop {
    ferry_evloop_handlers_t on; /* what it calls (evloop.h), with ctx */
    void *ctx;
    const char *name;           /* for logs */
    int timeout_ms, connect_timeout_ms;
    const atomic_bool *stopping;
    int epfd, stop_fd;
    /* Readable while data frames wait in the queue (an eventfd): a thread
     * waiting for the rest of a payload gives its slot up when it is. */
    int contended_fd;
    pthread_t *threads;
    int nthreads;
    int data_slots;             /* threads that may serve data frames at once */
    pthread_mutex_t lock;       /* guards data_busy and the queue */
    /* Held around re-arming and removing a connection: the kernel orders a
     * park before the next owner's close, but thread sanitizers see the
     * close race the earlier owner's epoll_ctl unless a lock orders them. */
    pthread_mutex_t arm_lock;
    int data_busy;
    ferry_conn_t *queue_head, *queue_tail;
    atomic_int queued;          /* connections in the queue */
    atomic_int waiting;         /* threads in epoll_wait */
};

/* ------------------------------------------------------------ parking */

/* Watches c for dir (EPOLLIN, or EPOLLOUT for an answer parked for room). */
static int arm(ferry_evloop_t *l, ferry_conn_t *c, int op, uint32_t dir)
{
    struct epoll_event ev = {.events = dir | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = c};
    pthread_mutex_lock(&l->arm_lock);
    int rc = epoll_ctl(l->epfd, op, c->fd, op == EPOLL_CTL_DEL ? NULL : &ev);
    pthread_mutex_unlock(&l->arm_lock);
    return rc;
}

/* The owner is done with c: its serving ended with rc (0: quietly, it was
 * closed to make room or the engine stops). */
static void end_conn(ferry_evloop_t *l, ferry_conn_t *c, int rc)
{
    l->on.ended(c, rc);
    arm(l, c, EPOLL_CTL_DEL, 0);
    shutdown(c->fd, SHUT_RDWR);
    l->on.done(c);
}

/* The owner waits for c's peer again. c is not touched after: another
 * thread may own it at once. */
static void park(ferry_evloop_t *l, ferry_conn_t *c)
{
    /* Read before the handoff: c may be another thread's once it is armed. */
    uint32_t dir = c->partial.resume && c->partial.wait_out ? EPOLLOUT : EPOLLIN;
    atomic_store(&c->served->parked, true);
    atomic_fetch_add_explicit(&c->served->handoff, 1, memory_order_release);
    if (arm(l, c, EPOLL_CTL_MOD, dir) != 0)
        end_conn(l, c, ferry_fail(FERRY_ERR_SOCKET, "epoll: cannot watch the connection from %s: %s", c->remote,
                                  strerror(errno)));
}

/* ------------------------------------------------------------ answers */

/* Continues a connection parked with queued answers (answer_park). */
static int answer_resume(ferry_conn_t *c)
{
    int rc = ferry_serve_flush(c);
    c->partial.resume = rc == FERRY_SERVE_PENDING ? answer_resume : NULL;
    return rc;
}

/* c's frame f was served but its answers wait in the outbox: parks c for
 * room (EPOLLOUT), busy, with config.timeout_ms for them to drain; past
 * it the listener expires c and it is closed (payload_timeout). No frame
 * is read meanwhile, so the outbox holds one frame's answers at most. */
static int answer_park(ferry_evloop_t *l, ferry_conn_t *c, const ferry_frame_t *f)
{
    c->partial = (ferry_partial_t){.f = *f, .deadline = ferry_deadline_after_ms(l->timeout_ms), .wait_out = true,
                                   .resume = answer_resume};
    return answer_resume(c);
}

/* ------------------------------------------------------------ handshake */

static int handshake_timeout(ferry_evloop_t *l, ferry_conn_t *c)
{
    const handshake_t *hs = c->served->hs;
    if (c->served->phase == PHASE_HELLO && hs->got == 0)
        ferry_fail(FERRY_ERR_TIMEOUT, "no HELLO within %d ms", l->connect_timeout_ms);
    else
        ferry_fail(FERRY_ERR_TIMEOUT, "handshake not finished within %d ms", l->connect_timeout_ms);
    return ferry_fail_context("handshake");
}

/* Reads what has arrived of the handshake's current frame: 1 whole, 0 not
 * yet (park it), or the failure. */
static int handshake_read(ferry_evloop_t *l, ferry_conn_t *c)
{
    ferry_served_t *s = c->served;
    handshake_t *hs = s->hs;
    for (;;) {
        size_t need = FERRY_FRAME_HEADER_SIZE + (hs->got < FERRY_FRAME_HEADER_SIZE ? 0 : hs->frame.plen);
        if (hs->got == need) return 1;
        ssize_t n = recv(c->fd, hs->in + hs->got, need - hs->got, MSG_DONTWAIT);
        if (n == 0) {
            if (atomic_load(&s->expired)) return handshake_timeout(l, c);
            return ferry_fail(FERRY_ERR_PEER_CLOSED, "%s closed the connection during its handshake", c->remote);
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return ferry_fail(errno == ECONNRESET ? FERRY_ERR_PEER_CLOSED : FERRY_ERR_SOCKET,
                              "handshake with %s: recv: %s", c->remote, strerror(errno));
        }
        atomic_store(&c->heard, true);
        hs->got += (size_t)n;
        if (hs->got == FERRY_FRAME_HEADER_SIZE) {
            int rc = ferry_frame_decode(hs->in, &hs->frame);
            if (rc == 0)
                rc = s->phase == PHASE_HELLO ? l->on.hello_check(&hs->frame)
                                             : l->on.auth_check(c, &hs->frame);
            if (rc) return rc;
        }
    }
}

/* One step of c's handshake: reads, answers the frame once whole, parks c
 * for the next one or ends it. */
static void handshake_step(ferry_evloop_t *l, ferry_conn_t *c)
{
    ferry_served_t *s = c->served;
    handshake_t *hs = s->hs;
    bool expired = atomic_load(&s->expired);
    int rc = expired ? handshake_timeout(l, c) : handshake_read(l, c);
    /* Closed to make room (its state moved on), or the engine stops: quietly. */
    bool quiet = !expired && (atomic_load(&c->state) != CONN_HANDSHAKE || atomic_load(l->stopping));
    if (rc < 0 || quiet) {
        end_conn(l, c, quiet ? 0 : rc);
        return;
    }
    if (rc == 0) {
        park(l, c);
        return;
    }
    const uint8_t *payload = hs->in + FERRY_FRAME_HEADER_SIZE;
    bool auth_next = false;
    if (s->phase == PHASE_HELLO) {
        hs->hlen = hs->frame.plen;
        memcpy(hs->hello, payload, hs->hlen);
        rc = l->on.hello_answer(c, &hs->frame, hs->hello, hs->ack, &hs->alen, &auth_next);
    } else {
        rc = l->on.auth_mac(c, payload, hs->hello, hs->hlen, hs->ack, hs->alen);
    }
    if (rc) {
        end_conn(l, c, rc);
        return;
    }
    hs->got = 0;
    if (auth_next) {
        s->phase = PHASE_AUTH;
    } else {
        /* Established: admitted (BUSY) by the handshake, now idle. */
        s->phase = PHASE_FRAMES;
        c->outbox.framed = true;
        free(hs);
        s->hs = NULL;
        l->on.set_idle(c);
    }
    park(l, c);
}

/* ------------------------------------------------------------- frames */

/* Frames with no payload and a small answer, served even while data frames
 * hold every thread they may. */
static bool is_control(uint8_t type)
{
    return type == FERRY_FRAME_CANCEL || type == FERRY_FRAME_PING || type == FERRY_FRAME_SEG_QUERY;
}

/* Marks whether data frames wait for a slot (lock held). */
static void contended(struct ferry_evloop *l, bool yes)
{
    uint64_t v = 1;
    ssize_t n = yes ? write(l->contended_fd, &v, sizeof v) : read(l->contended_fd, &v, sizeof v);
    (void)n; /* nonblocking: a full or empty counter is as good */
}

/* A data slot for c's frame f: true taken, false when they are all in use:
 * then c waits in the queue with f, and is no longer ours. */
static bool data_slot_take(struct ferry_evloop *l, ferry_conn_t *c, const ferry_frame_t *f)
{
    pthread_mutex_lock(&l->lock);
    bool took = l->data_busy < l->data_slots;
    if (took) {
        l->data_busy++;
    } else {
        c->served->queued = *f;
        c->served->queue_next = NULL;
        if (!l->queue_head) contended(l, true);
        if (l->queue_tail) l->queue_tail->served->queue_next = c;
        else l->queue_head = c;
        l->queue_tail = c;
        atomic_fetch_add(&l->queued, 1);
    }
    pthread_mutex_unlock(&l->lock);
    return took;
}

/* Gives our data slot to the connection waiting longest (true: *c is ours
 * now, with its frame in *f), or frees it. */
static bool data_slot_pass(ferry_evloop_t *l, ferry_conn_t **c, ferry_frame_t *f)
{
    pthread_mutex_lock(&l->lock);
    ferry_conn_t *next = atomic_load(l->stopping) ? NULL : l->queue_head;
    if (next) {
        l->queue_head = next->served->queue_next;
        if (!l->queue_head) {
            l->queue_tail = NULL;
            contended(l, false);
        }
        atomic_fetch_sub(&l->queued, 1);
        *f = next->served->queued;
        *c = next;
    } else {
        l->data_busy--;
    }
    pthread_mutex_unlock(&l->lock);
    return next != NULL;
}

/* Reads what has arrived of c's next frame header without waiting: 1
 * whole, 0 not yet, or the failure. */
static int header_read(ferry_evloop_t *l, ferry_conn_t *c)
{
    ferry_served_t *s = c->served;
    while (s->hgot < FERRY_FRAME_HEADER_SIZE) {
        ssize_t n = recv(c->fd, s->hdr + s->hgot, FERRY_FRAME_HEADER_SIZE - s->hgot, MSG_DONTWAIT);
        if (n > 0) {
            s->hgot += (size_t)n;
            continue;
        }
        if (n == 0 && atomic_load(&s->expired))
            return ferry_fail(FERRY_ERR_TIMEOUT, "a frame header from %s stalled after %zu of %d bytes for %d ms",
                              c->peer.name, s->hgot, FERRY_FRAME_HEADER_SIZE, l->timeout_ms);
        if (n == 0) return ferry_fail(FERRY_ERR_PEER_CLOSED, "the peer closed the connection");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return ferry_fail(errno == ECONNRESET ? FERRY_ERR_PEER_CLOSED : FERRY_ERR_SOCKET, "recv from %s: %s",
                          c->peer.name, strerror(errno));
    }
    return 1;
}

/* Parks c between frames: idle with nothing read of the next one, else
 * busy with the rest of the header due within config.timeout_ms (as a
 * frame once begun always was), which the listener enforces. */
static void park_between_frames(ferry_evloop_t *l, ferry_conn_t *c)
{
    ferry_served_t *s = c->served;
    if (s->hgot == 0) l->on.set_idle(c);
    else if (atomic_load(&s->header_due_ns) == 0)
        atomic_store(&s->header_due_ns, ferry_deadline_after_ms(l->timeout_ms));
    park(l, c);
}

/* A data frame's payload ran dry and the frame is saved in c->partial:
 * parks c (busy) with the rest due by the frame's deadline, which the
 * listener enforces as it does for a half-read header. The data slot is
 * passed on by our caller. */
static void park_mid_payload(ferry_evloop_t *l, ferry_conn_t *c)
{
    atomic_store(&c->served->header_due_ns, c->partial.deadline);
    park(l, c);
}

/* Bytes waiting in c's socket. */
static uint64_t bytes_waiting(const ferry_conn_t *c)
{
    int n = 0;
    return ioctl(c->fd, FIONREAD, &n) == 0 && n > 0 ? (uint64_t)n : 0;
}

/* How much of f's payload must have arrived before its handler runs
 * (payload_gate): all of it, but none of a WRITE's and only the
 * descriptors of a WRITEV, whose handlers place (or stage, checksummed)
 * the rest as it arrives and park between its parts on their own
 * (transport/tcp.c). */
static uint64_t gate_bytes(const ferry_frame_t *f)
{
    if (f->type == FERRY_FRAME_WRITE) return 0;
    if (f->type == FERRY_FRAME_WRITEV) {
        uint64_t d = ferry_vec_desc_bytes(f);
        return d < f->plen ? d : f->plen;
    }
    return f->plen;
}

static int payload_timeout(ferry_evloop_t *l, ferry_conn_t *c);

/* A gated frame's connection became readable: its whole payload is here,
 * or its peer left, or the kernel woke us early (under memory pressure it
 * reports a socket readable below its low-water mark): then the frame is
 * served as it was before the gate, blocking up to its deadline. */
static int gated_resume(ferry_conn_t *c)
{
    ferry_partial_t *p = &c->partial;
    p->resume = NULL;
    p->done = bytes_waiting(c);
    if (p->done < gate_bytes(&p->f)) {
        struct pollfd q = {.fd = c->fd, .events = POLLRDHUP};
        if (poll(&q, 1, 0) > 0 && (q.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            return ferry_fail(FERRY_ERR_PEER_CLOSED, "%s closed the connection after %llu of a %s frame's %u payload bytes",
                              c->peer.name, (unsigned long long)p->done, ferry_frame_type_name(p->f.type), p->f.plen);
    }
    ferry_conn_set_rcvlowat(c, 1);
    ferry_frame_t f = p->f;
    return c->served->loop->on.frame(c, &f);
}

/* The handlers of frames other than WRITE read their payload with blocking
 * calls. So that a peer stalling in such a payload holds no thread, the
 * frame waits parked until its whole payload has arrived: the socket's
 * receive low-water mark (SO_RCVLOWAT), set to the payload's size, keeps
 * the connection unready until then (or until its peer leaves or the
 * listener expires it at its deadline). 0: serve it now (its payload is
 * here, or is larger than the kernel will wait for: then it is served as
 * before, blocking up to its deadline); FERRY_SERVE_PENDING: parked. */
static int payload_gate(ferry_evloop_t *l, ferry_conn_t *c, const ferry_frame_t *f)
{
    uint64_t need = gate_bytes(f), here = need ? bytes_waiting(c) : 0;
    if (here >= need) return 0;
    int want = (int)need, got = 0;
    socklen_t len = sizeof got;
    ferry_conn_set_rcvlowat(c, want);
    if (getsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &got, &len) != 0 || got < want) {
        ferry_conn_set_rcvlowat(c, 1);
        return 0;
    }
    c->partial = (ferry_partial_t){
        .f = *f, .done = here, .deadline = ferry_deadline_after_ms(l->timeout_ms), .resume = gated_resume};
    /* The wait honours the low-water mark: readable once the payload is
     * whole (or the peer left, or the kernel woke us early: then the
     * handler reads on as before). */
    int w = ferry_serve_payload_wait(c, c->partial.deadline);
    if (w < 0) return payload_timeout(l, c);
    if (w == 0) return FERRY_SERVE_PENDING;
    c->partial.resume = NULL;
    ferry_conn_set_rcvlowat(c, 1);
    return 0;
}

/* c's frame payload stalled past its deadline (the listener expired it). */
static int payload_timeout(ferry_evloop_t *l, ferry_conn_t *c)
{
    ferry_partial_t *p = &c->partial;
    if (p->resume == gated_resume) p->done = bytes_waiting(c);
    p->resume = NULL;
    if (p->wait_out)
        return ferry_fail(FERRY_ERR_TIMEOUT, "the answer to a %s frame from %s stalled: it stopped reading for %d ms",
                          ferry_frame_type_name(p->f.type), c->peer.name, l->timeout_ms);
    return ferry_fail(FERRY_ERR_TIMEOUT, "a %s frame from %s stalled after %llu of %u payload bytes for %d ms",
                      ferry_frame_type_name(p->f.type), c->peer.name, (unsigned long long)p->done, p->f.plen,
                      l->timeout_ms);
}

/* Between two requests on c: waits for the next one on c itself, a short
 * while, when other threads are free to take everything else (and no data
 * frame waits for our slot). The thread that served the last request, its
 * cache warm, then serves the next with one wake-up, as a thread per
 * connection did; parked, the next would wake the thread that waited
 * longest in epoll_wait (the kernel wakes its waiters first in, first out),
 * which on a 2-core machine cost a third of a 1 MiB request stream's
 * throughput. True: c became readable (nothing read yet). */
static bool hold(ferry_evloop_t *l, ferry_conn_t *c, bool slot)
{
    if (atomic_load(&l->waiting) < SERVE_CONTROL_THREADS || (slot && atomic_load(&l->queued) > 0)) return false;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    return poll(&p, 1, SERVE_HOLD_MS) > 0;
}

/* Serves frames on established connection c, starting with queued (its
 * data slot already ours) or with what made c readable, until its peer
 * pauses or its turn is over; then parks or ends c. Returns whether we
 * hold a data slot, which the caller passes on. */
static bool serve_turn(ferry_evloop_t *l, ferry_conn_t *c, const ferry_frame_t *queued)
{
    ferry_served_t *s = c->served;
    bool slot = queued != NULL;
    /* A data frame parked mid-payload continues where it stood. */
    bool resuming = c->partial.resume != NULL;
    ferry_frame_t f;
    int rc = 0;
    if (queued) {
        f = *queued;
    } else if (resuming) {
        /* The engine stops, or the connection was closed to make room. */
        if (atomic_load(l->stopping) || atomic_load(&c->state) == CONN_EVICTED) {
            end_conn(l, c, 0);
            return false;
        }
        /* Queued answers go out without waiting: no slot needed. */
        if (c->partial.resume != answer_resume) {
            if (!data_slot_take(l, c, &c->partial.f)) return false;
            slot = true;
        }
    } else if (s->hgot == 0) { /* it was idle */
        if (atomic_load(l->stopping) || !l->on.set_busy(c)) {
            end_conn(l, c, 0); /* closed to make room, or the engine stops */
            return false;
        }
        ferry_spin_record(&c->spin, ferry_now_ns() - atomic_load(&c->idle_since_ns));
    }
    for (int served = 0;; served++) {
        if (served > 0 || !(queued || resuming)) {
            rc = atomic_load(l->stopping) ? FERRY_ERR_PEER_CLOSED : header_read(l, c);
            if (rc == 0) {
                park_between_frames(l, c);
                return slot;
            }
            if (rc < 0) break;
            s->hgot = 0;
            atomic_store(&s->header_due_ns, 0);
            rc = ferry_frame_decode(s->hdr, &f);
            if (rc) break;
            if (!slot && !(is_control(f.type) && f.plen == 0)) {
                if (!data_slot_take(l, c, &f)) return false;
                slot = true;
            }
        }
        c->outbox.slot = slot;
        if (served == 0 && resuming) {
            rc = atomic_load(&s->expired) ? payload_timeout(l, c) : c->partial.resume(c);
            /* Cut by the listener at its deadline while we read it. */
            if (rc == FERRY_ERR_PEER_CLOSED && atomic_load(&s->expired)) rc = payload_timeout(l, c);
            if (rc != FERRY_SERVE_PENDING) atomic_store(&s->header_due_ns, 0);
        } else {
            rc = payload_gate(l, c, &f);
            if (rc == 0) rc = l->on.frame(c, &f);
        }
        /* Its answers found no room (a peer that stopped reading): they
         * wait parked, holding no thread. */
        if (rc == 0 && ferry_serve_answer_pending(c)) rc = answer_park(l, c, served == 0 && resuming ? &c->partial.f : &f);
        if (rc == FERRY_SERVE_PENDING) {
            park_mid_payload(l, c);
            return slot;
        }
        if (rc || atomic_load(l->stopping)) break;
        /* Its turn is over after SERVE_TURN_FRAMES frames, or after this
         * one when data frames of other connections wait for our slot:
         * they take turns (the queue is first in, first out), so that many
         * peers sending at once each get their share (incast). */
        if (served + 1 >= SERVE_TURN_FRAMES || (slot && atomic_load(&l->queued) > 0)) {
            park_between_frames(l, c);
            return slot;
        }
        /* The next request often follows within microseconds: wait for it
         * here a little (spin.h; never on an idle connection) rather than
         * pay for parking and a wake-up. */
        l->on.set_idle(c);
        uint64_t t0 = ferry_now_ns();
        rc = ferry_net_recv_spin(c->fd, s->hdr, sizeof s->hdr, ferry_conn_spin_us(c), &s->hgot);
        if (rc) break;
        if (s->hgot == 0 && !hold(l, c, slot)) {
            park(l, c);
            return slot;
        }
        ferry_spin_record(&c->spin, ferry_now_ns() - t0);
        if (!l->on.set_busy(c)) { /* closed to make room meanwhile */
            rc = 0;
            break;
        }
    }
    if (rc == FERRY_ERR_PEER_CLOSED && atomic_load(l->stopping)) rc = 0;
    end_conn(l, c, rc);
    return slot;
}

/* --------------------------------------------------------------- threads */

static void take_turn(ferry_evloop_t *l, ferry_conn_t *c)
{
    atomic_load_explicit(&c->served->handoff, memory_order_acquire);
    atomic_store(&c->served->parked, false);
    if (c->served->phase != PHASE_FRAMES) {
        handshake_step(l, c);
        return;
    }
    ferry_frame_t f;
    bool slot = serve_turn(l, c, NULL);
    while (slot && data_slot_pass(l, &c, &f)) slot = serve_turn(l, c, &f);
}

static void *serve_main(void *arg)
{
    ferry_evloop_t *l = arg;
    for (;;) {
        struct epoll_event ev;
        atomic_fetch_add(&l->waiting, 1);
        int n = epoll_wait(l->epfd, &ev, 1, -1);
        atomic_fetch_sub(&l->waiting, 1);
        if (n < 0 && errno != EINTR) {
            FERRY_LOG(FERRY_LOG_ERROR, "engine", "%s: epoll_wait: %s; a serving thread stops", l->name,
                      strerror(errno));
            break;
        }
        if (n <= 0) continue;
        if (!ev.data.ptr) break; /* ferry_evloop_stop */
        take_turn(l, ev.data.ptr);
    }
    return NULL;
}

/* FERRY_SERVE_THREADS, else four per CPU (they mostly wait on peers),
 * between 8 and 32, plus the control threads; INVALID_ARGUMENT naming the
 * variable when it is set to something else. */
static int serve_threads(void)
{
    long v = 0;
    int rc = ferry_env_long("FERRY_SERVE_THREADS", SERVE_THREADS_MIN, SERVE_THREADS_MAX, &v);
    if (rc) return rc < 0 ? rc : (int)v;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long data = cpus > 0 ? 4 * cpus : 8;
    data = data < 8 ? 8 : data > 32 ? 32 : data;
    return (int)data + SERVE_CONTROL_THREADS;
}

static void loop_free(struct ferry_evloop *l)
{
    if (l->epfd >= 0) close(l->epfd);
    if (l->stop_fd >= 0) close(l->stop_fd);
    if (l->contended_fd >= 0) close(l->contended_fd);
    pthread_mutex_destroy(&l->lock);
    pthread_mutex_destroy(&l->arm_lock);
    free(l->threads);
    free(l);
}

int ferry_evloop_start(const ferry_evloop_config_t *cfg, ferry_evloop_t **out)
{
    *out = NULL;
    int want = serve_threads();
    if (want < 0) return want;
    struct ferry_evloop *l = calloc(1, sizeof *l);
    if (!l) return ferry_fail(FERRY_ERR_MEMORY, "serving threads: out of memory");
    l->on = *cfg->on;
    l->ctx = cfg->ctx;
    l->name = cfg->name;
    l->timeout_ms = cfg->timeout_ms;
    l->connect_timeout_ms = cfg->connect_timeout_ms;
    l->stopping = cfg->stopping;
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->arm_lock, NULL);
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    l->contended_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    l->threads = calloc((size_t)want, sizeof *l->threads);
    l->data_slots = want - SERVE_CONTROL_THREADS;
    /* The stop event stays readable once written (level-triggered, not
     * one-shot): every thread sees it. */
    struct epoll_event stop = {.events = EPOLLIN, .data.ptr = NULL};
    if (l->epfd < 0 || l->stop_fd < 0 || l->contended_fd < 0 || !l->threads || epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->stop_fd, &stop) != 0) {
        int rc = ferry_fail(FERRY_ERR_SOCKET, "serving threads: epoll: %s", strerror(errno));
        loop_free(l);
        return rc;
    }
    for (int i = 0; i < want; i++) {
        if (pthread_create(&l->threads[i], NULL, serve_main, l) != 0) {
            ferry_evloop_stop(l);
            return ferry_fail(FERRY_ERR_INTERNAL, "engine create: cannot start serving thread %d of %d", i + 1, want);
        }
        l->nthreads++;
    }
    *out = l;
    return 0;
}

void ferry_evloop_stop(ferry_evloop_t *l)
{
    if (!l) return;
    uint64_t one = 1;
    if (write(l->stop_fd, &one, sizeof one) < 0) { /* an eventfd write of 1 cannot fail here */ }
    /* Frames being served end at once; parked connections wait for us. */
    l->on.shutdown_all(l->ctx);
    for (int i = 0; i < l->nthreads; i++) pthread_join(l->threads[i], NULL);
    l->on.free_all(l->ctx);
    loop_free(l);
}

int ferry_evloop_add(ferry_evloop_t *l, ferry_conn_t *c)
{
    c->served_free = ferry_evloop_conn_free;
    c->outbox.contended_fd = l->contended_fd;
    c->outbox.timeout_ms = l->timeout_ms;
    c->served = calloc(1, sizeof *c->served);
    if (c->served) c->served->hs = calloc(1, sizeof *c->served->hs);
    if (!c->served || !c->served->hs) {
        errno = ENOMEM;
        return -1;
    }
    c->served->loop = l;
    return arm(l, c, EPOLL_CTL_ADD, EPOLLIN);
}

void ferry_evloop_conn_free(ferry_conn_t *c)
{
    if (!c->served) return;
    free(c->served->hs);
    free(c->served);
    c->served = NULL;
}

uint64_t ferry_evloop_header_due(ferry_conn_t *c)
{
    return c->served ? atomic_load(&c->served->header_due_ns) : 0;
}

uint64_t ferry_evloop_stalled_since(ferry_conn_t *c)
{
    if (!c->served || !atomic_load(&c->served->parked)) return 0;
    uint64_t due = atomic_load(&c->served->header_due_ns), span = (uint64_t)c->served->loop->timeout_ms * 1000000u;
    return due > span ? due - span : due ? 1 : 0;
}

void ferry_evloop_expire(ferry_conn_t *c)
{
    atomic_store(&c->served->expired, true);
    shutdown(c->fd, SHUT_RD); /* wakes it; the answer can still go out */
}

int ferry_evloop_nthreads(const ferry_evloop_t *l)
{
    return l ? l->nthreads : 0;
}
