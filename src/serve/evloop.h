/* SPDX-License-Identifier: Apache-2.0 */
/* The target side's event loop (evloop.c), and the pieces of serving in
 * engine.c it drives. Private to src/core. */
#ifndef FERRY_CORE_EVLOOP_H
#define FERRY_CORE_EVLOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* ---------------------------------------------------------- evloop.c */

/* Starts the serving threads (ferry_engine_create): 0 or an error. */
int ferry_evloop_start(ferry_engine_t *e);
/* Destroy: wakes every serving thread, shuts down every served connection
 * so that a frame being served ends at once, joins the threads and frees
 * every connection left. The listener is stopped first. */
void ferry_evloop_stop(ferry_engine_t *e);
/* Listener: hands a newly accepted connection (listed, counted, conns_lock
 * held) to the loop. 0, or -1 with errno when the loop cannot watch it. */
int ferry_evloop_add(ferry_engine_t *e, ferry_conn_t *c);
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
/* The serving threads the loop runs (fixed at start). */
int ferry_evloop_threads(const ferry_engine_t *e);

/* ---------------------------------------------------------- engine.c */

/* Handshake steps, for a loop that reads the frames without waiting. */
int ferry_hello_frame_check(const ferry_frame_t *f);
/* Answers a HELLO whose payload is buf (f->plen bytes); ack gets the
 * HELLO_ACK payload sent (FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME bytes
 * of room), *auth_next whether an AUTH frame must follow. */
int ferry_answer_hello(ferry_conn_t *c, const ferry_frame_t *f, const uint8_t *buf, uint8_t *ack, size_t *alen,
                       bool *auth_next);
int ferry_auth_frame_check(ferry_conn_t *c, const ferry_frame_t *f);
/* Checks the initiator's MAC got over the transcript (hello, ack), admits
 * the connection and answers AUTH_ACK. */
int ferry_serve_auth_mac(ferry_conn_t *c, const uint8_t *got, const uint8_t *hello, size_t hlen, const uint8_t *ack,
                         size_t alen);
/* Serves one frame whose header is f (payload still in the socket), with
 * blocking, deadline-bounded I/O. A negative return closes the connection. */
int ferry_serve_frame(ferry_conn_t *c, const ferry_frame_t *f);
/* The connection's serving ended with rc: logs it and tells a misbehaving
 * peer why (best effort). */
void ferry_serve_ended(ferry_conn_t *c, int rc);
/* IDLE <-> BUSY (see enum ferry_conn_state); busy: false when the
 * connection was closed to make room first. */
void ferry_conn_set_idle(ferry_conn_t *c);
bool ferry_conn_set_busy(ferry_conn_t *c);

#endif
