/* SPDX-License-Identifier: Apache-2.0 */
/* The target side's event loop (evloop.c): serving threads taking turns on
 * the ready connections. It knows nothing of the engine: what it calls
 * (the handshake's and the frames' handlers, engine.c; the listener's list
 * of connections, listener.c) is handed to it at start, with a context
 * pointer, as Redis's ae takes its file events. Private to src/serve. */
#ifndef FERRY_SERVE_EVLOOP_H
#define FERRY_SERVE_EVLOOP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "link/conn.h"
#include "wire/wire.h"

typedef struct ferry_evloop ferry_evloop_t;

/* What the loop calls. Those given a connection find their engine there;
 * the last two get the context pointer. */
typedef struct ferry_evloop_handlers {
    /* Handshake steps, the frames read without waiting: checks a HELLO's
     * header; answers a HELLO whose payload is buf (ack gets the HELLO_ACK
     * payload sent, FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME bytes of
     * room; *auth_next whether an AUTH frame must follow); checks an AUTH's
     * header; checks the initiator's MAC got over the transcript (hello,
     * ack), admits the connection and answers AUTH_ACK. */
    int (*hello_check)(const ferry_frame_t *f);
    int (*hello_answer)(ferry_conn_t *c, const ferry_frame_t *f, const uint8_t *buf, uint8_t *ack, size_t *alen,
                        bool *auth_next);
    int (*auth_check)(ferry_conn_t *c, const ferry_frame_t *f);
    int (*auth_mac)(ferry_conn_t *c, const uint8_t *got, const uint8_t *hello, size_t hlen, const uint8_t *ack,
                    size_t alen);
    /* Serves one frame whose header is f (payload still in the socket),
     * with blocking, deadline-bounded I/O: 0, FERRY_SERVE_PENDING (conn.h),
     * or a failure, which closes the connection. */
    int (*frame)(ferry_conn_t *c, const ferry_frame_t *f);
    /* The connection's serving ended with rc (logs it, tells a misbehaving
     * peer why), then the loop is done with it: it leaves the list and is
     * freed. */
    void (*ended)(ferry_conn_t *c, int rc);
    void (*done)(ferry_conn_t *c);
    /* IDLE <-> BUSY (enum ferry_conn_state); set_busy: false when the
     * connection was closed to make room first. */
    void (*set_idle)(ferry_conn_t *c);
    bool (*set_busy)(ferry_conn_t *c);
    /* At stop: shuts down every served connection (so that a frame being
     * served ends at once), then, no serving thread left, frees them. */
    void (*shutdown_all)(void *ctx);
    void (*free_all)(void *ctx);
} ferry_evloop_handlers_t;

typedef struct ferry_evloop_config {
    const ferry_evloop_handlers_t *on;
    void *ctx;
    const char *name;           /* for logs; outlives the loop */
    int timeout_ms;             /* a frame once begun, or answers queued, due within it */
    int connect_timeout_ms;     /* the handshake's (for its message: the listener enforces it) */
    const atomic_bool *stopping; /* set when the owner stops: connections end quietly */
} ferry_evloop_config_t;

/* Starts the serving threads (FERRY_SERVE_THREADS, else from the CPUs):
 * 0 with *out the loop, or an error. */
int ferry_evloop_start(const ferry_evloop_config_t *cfg, ferry_evloop_t **out);
/* Wakes every serving thread, shuts down every served connection
 * (shutdown_all), joins the threads, frees every connection left
 * (free_all) and the loop. The listener is stopped first. */
void ferry_evloop_stop(ferry_evloop_t *l);
/* Listener: hands a newly accepted connection (listed, counted, conns_lock
 * held) to the loop. 0, or -1 with errno when the loop cannot watch it. */
int ferry_evloop_add(ferry_evloop_t *l, ferry_conn_t *c);
/* Frees what the loop keeps for c (ferry_conn_free). */
void ferry_evloop_conn_free(ferry_conn_t *c);
/* Listener (conns_lock held): c's handshake (its state moved out of
 * CONN_HANDSHAKE) or its half-read frame header ran past its deadline; its
 * serving thread answers TIMEOUT and closes it. */
void ferry_evloop_expire(ferry_conn_t *c);
/* When the rest of c's half-read frame header is due (0: none); past it the
 * listener expires c the same way. */
uint64_t ferry_evloop_header_due(ferry_conn_t *c);
/* Listener (conns_lock held): when c, parked, began to stall (its frame
 * began, or its answers found no room), else 0 (idle, or a thread has it). */
uint64_t ferry_evloop_stalled_since(ferry_conn_t *c);
/* The serving threads l runs (fixed at start); and an engine's (engine.c),
 * 0 when it has none. */
int ferry_evloop_nthreads(const ferry_evloop_t *l);
int ferry_evloop_threads(const ferry_engine_t *e);

#endif
