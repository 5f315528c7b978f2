/* SPDX-License-Identifier: Apache-2.0 */
/* One connection between two engines, either side, and the framed I/O
 * on it (engine.c). Private to the library. */
#ifndef FERRY_CORE_CONN_H
#define FERRY_CORE_CONN_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <ferry/ferry.h>

#include "cancel.h"
#include "util/spin.h"
#include "wire/wire.h"

typedef struct ferry_session ferry_session_t;
typedef struct ferry_conn ferry_conn_t;

/* A frame handler's answer (ferry_serve_frame, a transport's serve): the
 * frame's payload ran dry mid-way and its progress is saved in the
 * connection's partial; the event loop parks the connection and calls
 * partial.resume once more bytes arrive (evloop.c). */
#define FERRY_SERVE_PENDING 1

/* Target side: a data frame whose payload is still arriving, kept while
 * the connection waits for the rest in the event loop, so that a stalled
 * or slow peer holds no serving thread. Its handler's own. */
typedef struct ferry_partial {
    ferry_frame_t f;          /* the frame's header */
    uint64_t done;            /* payload bytes read so far */
    uint64_t deadline;        /* the whole payload is due by then (config.timeout_ms from its header) */
    int status;               /* its refusal so far (the rest is read and dropped), else 0 */
    int mode;                 /* the handler's */
    bool wait_out;            /* it waits to send (its answer), not to receive */
    /* A WRITEV's: the piece being received, the registry version its
     * pieces were last checked against. */
    size_t at;
    uint64_t version;
    uint8_t out[FERRY_FRAME_HEADER_SIZE]; /* the answer's header, when it sends one */
    /* Continues the frame: 0 served, FERRY_SERVE_PENDING, or a failure
     * (closes the connection). NULL: no frame is in progress. */
    int (*resume)(ferry_conn_t *c);
} ferry_partial_t;

/* Target side, served by the event loop: the answers its socket had no
 * room for (out[out_off, out_len) is still to go), and what the answer
 * helpers (serve_io.c) need of the loop, which sets it (serve/evloop.c). */
typedef struct ferry_outbox {
    bool framed;       /* the handshake is over: answers may be queued */
    bool slot;         /* the frame being served holds a data slot: its answer may wait for room while
                          no other data frame wants the slot (a control frame's never waits) */
    int contended_fd;  /* readable while data frames wait for a slot */
    int timeout_ms;    /* config.timeout_ms, for an answer that stalls */
    uint8_t *out;
    size_t out_off, out_len, out_cap;
} ferry_outbox_t;

/* One TCP connection, either side. */
struct ferry_conn {
    int fd;
    ferry_engine_t *engine;
    struct ferry_xport_ctx *ctx; /* what a transport may use of the engine (xport.h), set with engine */
    struct ferry_link *link;   /* what the link layer needs of the engine (link.h), set with engine */
    ferry_session_t *session;  /* initiator side: its session; NULL on the target */
    ferry_hello_t peer;        /* what the other side said in the handshake */
    unsigned char *bounce;     /* checksum / device-memory staging, lazily made */
    size_t bounce_cap;         /* its size; 0 = FERRY_WIRE_MAX_DATA (the target's checksum staging) */
    struct ferry_stage *stage; /* initiator: pinned, pipelined staging of device memory (memkind.h), lazily made */
    struct ferry_land *land;   /* receiving into device memory: pinned, pipelined landing (memkind.h), lazily made */
    struct ferry_conn *next;   /* target side: list of served connections */
    struct ferry_conn *busy_prev, *busy_next; /* initiator side: the engine's checked-out list */
    struct ferry_served *served; /* target side: its serving state in the event loop (evloop.c) */
    void (*served_free)(struct ferry_conn *c); /* target side: frees served (ferry_conn_free), or NULL */
    atomic_bool done;          /* target side: its serving has finished */
    void *xport;               /* a transport's per-connection state, or NULL */
    void (*xport_free)(void *); /* frees xport with the connection */
    uint64_t serial;           /* target side: accept order, 1, 2, ... */
    /* Cancels (cancel.h). Target side: the key this connection was given in
     * its HELLO_ACK, the peer engine it serves (both published once the
     * handshake is read, 0 before), and the ids it refuses (NULL: none).
     * Initiator side: cancel_key is the key the target gave. */
    _Atomic uint64_t cancel_key, cancel_peer;
    _Atomic(ferry_cancel_set_t *) cancels;
    struct ferry_placed_log *placed; /* target side: what it placed (cancel.h), NULL = none */
    /* Initiator side, deadlines the target enforces (wire.h,
     * FERRY_FRAME_F_DEADLINE): when the HELLO left, and the most the
     * target's clock can be ahead of ours, once learned. */
    uint64_t hello_sent_ns;
    int64_t clock_ahead_ns;
    bool clock_known;
    atomic_bool fenced;        /* target side: fenced whole (CANCEL with F_CONN): refuses every frame */
    int rcvlowat;              /* target side: the socket's SO_RCVLOWAT above 1, 0 = the default 1 */
    uint64_t pool_gen;         /* initiator side: the session's pool generation at connect */
    uint16_t session_port;     /* initiator side: the port its session names the peer by (as dialed) */
    char remote[64];           /* target side: the socket's peer address, for logs */
    /* Target side, for the listener's limits (listener.c): where the
     * connection stands (CONN_*), whether it is in the engine's list and
     * counted there, whether the peer spoke yet, its source address (IPv4 as
 * v4-mapped IPv6), and when
     * it was accepted or last went idle. */
    atomic_int state;
    atomic_bool heard;         /* in its handshake: the peer has sent something */
    bool listed;
    uint8_t source[16];
    _Atomic uint64_t idle_since_ns;
    struct ferry_vec_scratch *vec; /* vector frames' per-connection buffers (transport/vec.h), lazily made */
    ferry_spin_t spin;         /* recent waits on it, for the adaptive spin (spin.h) */
    ferry_partial_t partial;   /* target side: a data frame parked mid-payload */
    /* Initiator side: the answers lately taken on it (conn.c), so that a
     * duplicate of one (a relay that repeated a frame, or a request that
     * reached the target twice) is read and dropped, never taken as the
     * answer of another request or slice; lazily made. And how many such
     * duplicates were dropped. */
    struct ferry_answered *answered;
    uint64_t answers_duplicated;
    ferry_outbox_t outbox;     /* target side, in the event loop: answers waiting for room (serve_io.c) */
};

/* Target side (serve_io.c): a data frame's payload ran dry mid-way. 1: more
 * has arrived, read on; 0: park the frame (save its progress in
 * c->partial, return FERRY_SERVE_PENDING) and let the thread serve others;
 * -1: its deadline passed. Waits for more a moment first, but only while
 * no other connection's data frame waits for a thread. */
int ferry_serve_payload_wait(ferry_conn_t *c, uint64_t deadline);
/* The same for an answer that the socket has no room for (a peer that
 * stopped reading): 1 room, 0 park it (with partial.wait_out), -1 the
 * deadline passed. */
int ferry_serve_answer_wait(ferry_conn_t *c, uint64_t deadline);
/* Target side, an answer (iov[0..cnt), cnt <= 8) to the frame being
 * served: sent without blocking; what the socket has no room for is
 * queued in the connection (after waiting for room up to deadline, but
 * only while the frame holds a data slot nobody else wants), and the event
 * loop parks the connection until it drains, within config.timeout_ms, or
 * closes it. Served outside the event loop (or in the handshake): a
 * blocking send up to deadline. 0 or a failure. */
int ferry_serve_sendv(ferry_conn_t *c, const struct iovec *iov, int cnt, uint64_t deadline);
/* Whether answers wait queued in c (ferry_serve_sendv). */
bool ferry_serve_answer_pending(const ferry_conn_t *c);
/* Sends what the socket takes of c's queued answers without waiting: 0
 * all gone, FERRY_SERVE_PENDING some left, or a failure. */
int ferry_serve_flush(ferry_conn_t *c);

/* ferry_conn_t.state on the target side. Changes under the engine's
 * conns_lock, except IDLE <-> BUSY, which the serving thread makes alone
 * (a compare-and-swap against the evictor's IDLE -> EVICTED). */
enum ferry_conn_state {
    CONN_HANDSHAKE = 0, /* counted in nhandshaking */
    CONN_IDLE,          /* handshake done, waiting for a request: counted in nestablished */
    CONN_BUSY,          /* a request arrived (half its header, queued for a thread, or being served):
                           counted in nestablished, never evicted */
    CONN_EVICTED,       /* closed to make room, or its handshake expired; counted nowhere */
    CONN_ENDED          /* its serving is over, it is being freed; counted nowhere */
};

/* The protocol version both ends of a handshaken connection speak: the
 * highest in common (ours: link.h's proto_max). Vector frames need
 * FERRY_PROTOCOL_VEC. */
unsigned ferry_conn_version(const ferry_conn_t *c);

/* frame I/O shared by both sides */
int ferry_conn_send_frame(ferry_conn_t *c, ferry_frame_t *f, const void *payload, uint64_t deadline);
int ferry_conn_recv_frame(ferry_conn_t *c, ferry_frame_t *f, uint64_t deadline);
/* The same, busy-polling up to spin_us for the header before sleeping
 * (ferry_net_recv_spin): for answers due within microseconds. */
int ferry_conn_recv_frame_spin(ferry_conn_t *c, ferry_frame_t *f, uint64_t deadline, unsigned spin_us);
/* spin_us for ferry_conn_recv_frame_spin (and the vector answers' receives
 * that pass it on): the adaptive spin, or, for a long regular wait, a nap
 * and a spin over its end (spin.h, ferry_spin_nap). For answers to work
 * the target does on one thread, leaving this CPU idle meanwhile. */
#define FERRY_SPIN_NAP UINT_MAX
/* Naps taken so far in this process, and in *waits (if not NULL) the
 * waits that were let nap (FERRY_SPIN_NAP) whether they did or not: for
 * tests. */
unsigned long ferry_conn_naps(unsigned long *waits);
/* How long the next wait on c may spin (config.spin_us, else adaptive). */
unsigned ferry_conn_spin_us(ferry_conn_t *c);
/* Initiator side, both receives: an answer (READ_RESP, WRITE_ACK, VEC_ACK,
 * NOTIFY_ACK) identical in type, status, req_id, addr and len to one of the
 * last FERRY_CONN_ANSWERS_KEPT answers taken on c is a duplicate: its
 * payload is read and dropped, it is counted (answers_duplicated), and the
 * receive waits on for the next frame. Sending a request forgets the
 * answers kept for it (its req_id and addr; for a vector frame or NOTIFY,
 * its req_id), so that a request sent again on c may be answered again. A
 * duplicate older than that is not recognized: the caller finds it out of
 * step (MALFORMED_FRAME, the connection breaks), never takes it. */
#define FERRY_CONN_ANSWERS_KEPT 64
/* Initiator side: request f leaves on c (ferry_conn_send_frame does it; a
 * sender that encodes its own header calls it): its earlier answers on c
 * are no longer duplicates. */
void ferry_conn_answers_forget(ferry_conn_t *c, const ferry_frame_t *f);
/* Reads and discards n payload bytes. */
int ferry_conn_discard(ferry_conn_t *c, uint64_t n, uint64_t deadline);
void ferry_conn_free(ferry_conn_t *c);
/* Target side: sets the socket's receive low-water mark to n bytes (1: the
 * default), skipping the call when it is set so already. The event loop
 * (payload gates) and tcp_target.c (WRITEV payloads) share the mark through it. */
void ferry_conn_set_rcvlowat(ferry_conn_t *c, int n);
/* Initiator side, for an answer with status < 0: reads the target's detail
 * text that follows it and raises it as the thread's failure (its code is
 * the answer's status); reason, when not NULL, gets the text too. */
int ferry_conn_fail_from_target(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline, char *reason, size_t cap);
/* The connection's staging buffer of at least n bytes (n <= FERRY_WIRE_MAX_DATA). */
unsigned char *ferry_conn_bounce(ferry_conn_t *c, size_t n);

#endif
