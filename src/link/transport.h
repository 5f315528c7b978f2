/* SPDX-License-Identifier: Apache-2.0 */
/* Transports behind one vtable.
 *
 * Every session has a TCP control connection pool (sessions, handshake,
 * acks); a transport decides how the bytes of a transfer move: inline in TCP
 * frames ("tcp"), or by cross-memory attach between processes of one host
 * ("shm"), or over RDMA. The target side serves the frame types a transport
 * declares. A transport is one folder, src/transport/<name>/, and one name
 * in the list the table is generated from (FERRY_TRANSPORTS, CMakeLists.txt;
 * README, "Adding a transport"): its CMake fragment (transport.cmake) adds
 * its sources; its code defines ferry_transport_<name>, the ops below; its
 * verdict, never session state; its frames (ids in the ranges it declares,
 * with their names and payload limits in its frames table, listed in
 * serve_types); its HELLO bits; its configuration keys; its per-region
 * data, if any, in its slot of ferry_region_t
 * (ferry_transport_region_slot) with that slot's release hook
 * (ferry_registry_set_hook, registry.h). tests/transport_extra/ is one,
 * with a table of its own. This file names no transport. */
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
    /* Set by run: it moved every piece by plain memory copies in the
     * calling thread, answered by no round trip it had to wait for (shm's
     * shared-pool mappings). A hint the core keeps per session: the
     * session's next small call is best run in the caller's thread,
     * unsplit (transfer.c). */
    bool copied_inline;
    /* Set by run: the call was small pieces whose copies the target makes
     * one call at a time per initiator whichever connection they come on
     * (shm's cross-memory attach: two at once contend in the kernel's page
     * walk). A hint the core keeps per session: the next call of small
     * pieces gains nothing from a worker thread and a second connection
     * but their hand-offs, and runs in the caller's thread (transfer.c). */
    bool small_serial;
    /* Set by run: every piece went in frames that the target copies on
     * two threads itself where a CPU is idle (shm's copy helper, for large
     * pieces). A hint the core keeps per session: the next call of such
     * pieces, none overlapping at the target, gains nothing from a second
     * connection but the hand-off to its worker and the wait for the
     * slower half, and runs in the caller's thread (transfer.c). */
    bool shares_frames;
    char reason[256];
} ferry_verdict_t;

/* Frame ids first..last, both included: a range a transport owns. */
typedef struct ferry_frame_range {
    uint8_t first, last;
} ferry_frame_range_t;

/* A configuration key a transport reads: an environment variable, with its
 * type, default and help text, declared in the transport's keys table and
 * read through ferry_transport_key (never getenv), so that `ferry info` and
 * the README can list them. */
typedef enum ferry_key_type {
    FERRY_KEY_LONG,   /* an integer in [min, max] */
    FERRY_KEY_STRING, /* any text */
    FERRY_KEY_FLAG,   /* set to anything but "0": on (*num = 1) */
} ferry_key_type_t;

typedef struct ferry_transport_key {
    const char *name; /* FERRY_<TRANSPORT>_... */
    ferry_key_type_t type;
    long min, max;    /* FERRY_KEY_LONG: the accepted range */
    const char *def;  /* the default, as text ("" or NULL: none, the transport's code decides) */
    const char *help;
} ferry_transport_key_t;

typedef struct ferry_transport_ops {
    const char *name;
    /* Whether this transport can reach peer from the engine of ctx
     * (xport.h); fills why. */
    int (*usable)(ferry_xport_ctx_t *ctx, const ferry_hello_t *peer, char *why, size_t cap);
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
    uint32_t (*hello_flags)(ferry_xport_ctx_t *ctx);
    /* Optional: frees engine-wide state, at engine destruction, after every
     * connection is gone and before the registry is destroyed. Called for
     * every engine that engine_init was called for, and for an engine whose
     * creation failed before or in it too: it must handle state never set
     * up. The fini hook of engine_init below. */
    void (*engine_fini)(ferry_xport_ctx_t *ctx);
    /* ---- Fields below are appended in the order they came, never moved. */
    /* FERRY_TRANSPORT_OPS_VERSION: the version of this struct the transport
     * was written against; the table refuses another (ferry_transport_table_check). */
    uint32_t version;
    /* Optional: sets up engine-wide state at engine creation, before the
     * engine listens or connects. 0, or a negative Ferry code (with a
     * detail) that fails the creation. */
    int (*engine_init)(ferry_xport_ctx_t *ctx);
    /* The frame ids this transport owns, nframe_ranges ranges: every frame
     * in its frames table lies in one of them, and no range meets another
     * transport's nor the core's (ferry_transport_table_check). */
    const ferry_frame_range_t *frame_ranges;
    size_t nframe_ranges;
    /* The FERRY_HELLO_F_* bits this transport owns (declared in its folder):
     * what hello_flags may return, and what it reads of a peer's flags. No
     * other transport's, none of the core's (FERRY_HELLO_F_CORE, wire.h). */
    uint32_t hello_bits;
    /* The configuration keys it reads (ferry_transport_key), nkeys of them;
     * `ferry info` lists them. */
    const ferry_transport_key_t *keys;
    size_t nkeys;
} ferry_transport_ops_t;

/* The version of ferry_transport_ops_t; raised when a field is appended. */
#define FERRY_TRANSPORT_OPS_VERSION 1

/* Shared by the streaming transports (tcp.c, shm.c): one slice on the
 * wire, awaiting its answer; answers arrive in order. */
struct inflight {
    ferry_xfer_t *x;
    uint64_t off, n;
    uint32_t count; /* > 0: a vector frame of the count pieces from x on (vec.h), n bytes in all */
    bool nap;       /* its answer's wait may nap (FERRY_SPIN_NAP, conn.h) */
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

/* The engine's last uses of two transports by name (piece_run.c, transfer.c),
 * until they go (issue 22); nothing below the engine names a transport. */
extern const ferry_transport_ops_t ferry_transport_tcp;
extern const ferry_transport_ops_t ferry_transport_shm;

/* The table, generated from a list of transport folders into an object of
 * its own (cmake/transports.cmake): NULL-terminated, in order of preference
 * for "auto". A test may link a table of its own instead. */
extern const ferry_transport_ops_t *const ferry_transports[];
/* The table's transport of last resort, which every peer can be reached by:
 * what a forced but unusable transport falls back to. */
extern const ferry_transport_ops_t *const ferry_transport_fallback;

/* Checks a table (NULL-terminated) and its fallback: every transport of
 * this ops version, with a name, usable, run and serve, its frames (and
 * the frames it serves that are not the core's) within its frame ranges,
 * no range holding a core id (ferry_frame_is_core), no core HELLO bit; no
 * name, frame id, HELLO bit or configuration key shared by two transports;
 * the fallback in the table. 0 or INTERNAL naming what is wrong. */
int ferry_transport_table_check(const ferry_transport_ops_t *const *table, const ferry_transport_ops_t *fallback);
/* At engine creation: checks ferry_transports[] (the first time; its
 * verdict is kept), then runs each transport's engine_init in table order.
 * 0 or the first failure. */
int ferry_transports_engine_init(ferry_xport_ctx_t *ctx);
/* At engine destruction (and after a failed creation): every transport's
 * engine_fini. */
void ferry_transports_engine_fini(ferry_xport_ctx_t *ctx);

/* Reads configuration key k (a transport's keys table) from the
 * environment: *num for FERRY_KEY_LONG and FERRY_KEY_FLAG, *str for
 * FERRY_KEY_STRING (either may be NULL). 1 when the variable is set (not
 * empty), 0 when it is not (the values get the key's default; none: they
 * are left as they are), INVALID_ARGUMENT naming the key when its text is
 * no number of its range, INTERNAL for a key no transport of the table
 * declares. */
int ferry_transport_key(const ferry_transport_key_t *k, long *num, const char **str);

const ferry_transport_ops_t *ferry_transport_find(const char *name);
/* Picks the transport for a peer: forced by config, else the first usable. */
const ferry_transport_ops_t *ferry_transport_choose(ferry_xport_ctx_t *ctx, const ferry_hello_t *peer, char *why,
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
/* Transport t's engine-wide state slot in ctx (xport.h), by its index in
 * the table; t must be in the table. */
static inline _Atomic(void *) *ferry_transport_state(ferry_xport_ctx_t *ctx, const ferry_transport_ops_t *t)
{
    return &ctx->state[ferry_transport_region_slot(t) - 1];
}

#endif
