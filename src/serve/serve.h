/* SPDX-License-Identifier: Apache-2.0 */
/* The target side's handshake and serving of one connection (engine.c).
 * Private to the library. */
#ifndef FERRY_CORE_SERVE_H
#define FERRY_CORE_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "link/conn.h"
#include "wire/wire.h"

/* engine.c: target side */
int ferry_serve_hello(ferry_conn_t *c, const ferry_frame_t *f);
/* The event loop's handlers (evloop.h's ferry_evloop_handlers_t, which
 * tells what each does); engine.c hands them to the loop. */
int ferry_hello_frame_check(const ferry_frame_t *f);
int ferry_answer_hello(ferry_conn_t *c, const ferry_frame_t *f, const uint8_t *buf, uint8_t *ack, size_t *alen,
                       bool *auth_next);
int ferry_auth_frame_check(ferry_conn_t *c, const ferry_frame_t *f);
int ferry_serve_auth_mac(ferry_conn_t *c, const uint8_t *got, const uint8_t *hello, size_t hlen, const uint8_t *ack,
                         size_t alen);
int ferry_serve_frame(ferry_conn_t *c, const ferry_frame_t *f);
void ferry_serve_ended(ferry_conn_t *c, int rc);
void ferry_conn_set_idle(ferry_conn_t *c);
bool ferry_conn_set_busy(ferry_conn_t *c);
/* Runs a served connection to its end: handshake, then frames until the
 * peer leaves, misbehaves or the engine stops. Frees nothing. */
void ferry_serve_connection(ferry_conn_t *c);

#endif
