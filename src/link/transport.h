/* SPDX-License-Identifier: Apache-2.0 */
/* Transports behind one vtable.
 *
 * Every session has a TCP control connection pool (sessions, handshake,
 * acks); a transport decides how the bytes of a transfer move: inline in TCP
 * frames ("tcp"), or by cross-memory attach between processes of one host
 * ("shm"), or over RDMA. The target side serves the frame types a transport
 * declares. A new transport is one new file and one entry in transport.c
 * (README, "Adding a transport"): its ops below; its verdict, never session
 * state; its frames (ids past wire.h's core range, declared with their
 * names and payload limits in its frames table, listed in serve_types); its
 * per-region data, if any, in its slot of ferry_region_t
 * (ferry_transport_region_slot) with that slot's release hook
 * (ferry_registry_set_hook, registry.h). tests/test_transport_extra.c is
 * one. */
#ifndef FERRY_TRANSPORT_H
#define FERRY_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "xport.h"

/* What run() may tell the core besides its result. */
typedef struct ferry_verdict {
    /* Set by run: this transport cannot move the pieces of this session
     * (the target refused it, or its set-up failed). The core then moves
     * the session to tcp for good, records reason as its transport_reason
     * (ferry_peer_info), and runs the pieces again over tcp on the same
     * connection, each from its ->done on. run returns 0 with it. */
    bool fall_back;
    /* Set by run: the pieces it left to do (no failure, bytes left) go by
     * tcp, for this call only, on the same connection, each from its
     * ->done on; the session keeps this transport (pieces this one cannot
     * reach: device memory, a region its hardware cannot register; or the
     * transport went unusable). run returns 0 with it; reason says why
     * (logged at debug level). */
    bool by_tcp;
    char reason[256];
} ferry_verdict_t;

typedef struct ferry_transport_ops {
    const char *name;
    /* Whether this transport can reach the peer of c's session; fills why. */
    int (*usable)(ferry_engine_t *e, const ferry_hello_t *peer, char *why, size_t cap);
    /* Moves the n pieces over connection c as one pipelined stream
     * (initiator side), each from its ->done on, recording each piece's
     * outcome in ->rc. Returns 0 or the connection-level failure; when that
     * leaves c in an unknown state, *broken is set. It keeps ->inflight = the
     * frames sent for a piece whose answer has not arrived (counted before
     * the first byte leaves): after a broken return the core fences those
     * pieces so that nothing of them lands late (core/cancel.h). Without a
     * broken return, every answer must have been read. It never writes
     * session state: to leave for tcp, or to leave some pieces to tcp, it
     * fills *verdict (above); it never calls another transport itself. */
    int (*run)(ferry_conn_t *c, ferry_xfer_t *xs, size_t n, int *broken, ferry_verdict_t *verdict);
    /* Target side: serves frame f of a type listed in serve_types. A
     * negative return closes the connection. Before touching memory, and
     * again before every chunk, it must check ferry_conn_is_cancelled()
     * under the registry's read lock: a CANCEL's barrier relies on it. */
    int (*serve)(ferry_conn_t *c, const ferry_frame_t *f);
    /* The frame types this transport serves (its own: no other transport
     * lists them), nserve_types of them. */
    const uint8_t *serve_types;
    size_t nserve_types;
    /* The frames this transport declares (wire.h): ids no core frame and
     * no other transport has, each with its name and payload limit, which
     * the wire layer learns through ferry_transport_frame_def. Requests it
     * serves and the answers it sends back alike; nframes of them. */
    const ferry_frame_def_t *frames;
    size_t nframes;
    /* Optional: FERRY_HELLO_F_* bits this engine advertises in every
     * handshake (what it can serve), e.g. FERRY_HELLO_F_RDMA. */
    uint32_t (*hello_flags)(ferry_engine_t *e);
    /* Optional: frees engine-wide state, at engine destruction, after every
     * connection is gone and before the registry is destroyed. */
    void (*engine_fini)(ferry_engine_t *e);
} ferry_transport_ops_t;

/* Shared by the streaming transports (tcp.c, shm.c): one slice on the
 * wire, awaiting its answer; answers arrive in order. */
struct inflight {
    ferry_xfer_t *x;
    uint64_t off, n;
    uint32_t count; /* > 0: a vector frame of the count pieces from x on (vec.h), n bytes in all */
};

/* Whether piece x still has bytes to send from off: not failed, not done,
 * not cancelled. */
static inline bool ferry_piece_sendable(const ferry_xfer_t *x, uint64_t off)
{
    return x->rc == 0 && off < x->len && !(x->cancel && atomic_load(x->cancel));
}

/* run()'s verdict: fall back to tcp, because of the text why. Returns 0. */
int ferry_verdict_fall_back(ferry_verdict_t *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* run()'s verdict: the pieces left to do go by tcp for this call only,
 * because of the text why. Returns 0. */
int ferry_verdict_by_tcp(ferry_verdict_t *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Initiator side: receives the answer to piece x's oldest slice in flight
 * (WRITE_ACK for writes, READ_RESP for reads) into *f. 0 when the target
 * accepted it (any payload is still to be read); the target's refusal with
 * its detail (reason gets the text when not NULL); or, with *broken set, a
 * failure that leaves the connection unusable (I/O, ERROR frame, an answer
 * out of step). */
int ferry_recv_answer(ferry_conn_t *c, ferry_xfer_t *x, unsigned spin_us, ferry_frame_t *f, int *broken,
                      char *reason, size_t cap);

extern const ferry_transport_ops_t ferry_transport_tcp;
extern const ferry_transport_ops_t ferry_transport_rdma;
extern const ferry_transport_ops_t ferry_transport_shm;
extern const ferry_transport_ops_t ferry_transport_cuda_ipc;
#ifdef FERRY_TEST_TRANSPORT_EXTRA
extern const ferry_transport_ops_t ferry_transport_extra;
#endif

/* NULL-terminated, in order of preference for "auto". */
extern const ferry_transport_ops_t *const ferry_transports[];

const ferry_transport_ops_t *ferry_transport_find(const char *name);
/* Picks the transport for a peer: forced by config, else the first usable. */
const ferry_transport_ops_t *ferry_transport_choose(ferry_engine_t *e, const ferry_hello_t *peer, char *why,
                                                     size_t cap);
/* The frame of type t some transport declares (its frames table), or NULL.
 * transport.c installs it as the wire layer's lookup when the library
 * loads (ferry_wire_set_frame_lookup). */
const ferry_frame_def_t *ferry_transport_frame_def(uint8_t type);
/* The transport that serves frame type t, or NULL. */
const ferry_transport_ops_t *ferry_transport_for_frame(uint8_t type);
/* Transport t's per-region slot (ferry_region_t.slot, registry.h): 1 + its
 * index in the table. FERRY_REGION_SLOTS when t is not in the table. */
unsigned ferry_transport_region_slot(const ferry_transport_ops_t *t);

#endif
