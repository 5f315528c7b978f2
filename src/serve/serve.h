/* SPDX-License-Identifier: Apache-2.0 */
/* The target side's handshake and serving of one connection (engine.c).
 * Private to the library. */
#ifndef FERRY_CORE_SERVE_H
#define FERRY_CORE_SERVE_H

#include <ferry/ferry.h>

#include "link/conn.h"
#include "wire/wire.h"

/* engine.c: target side */
int ferry_serve_hello(ferry_conn_t *c, const ferry_frame_t *f);
/* Runs a served connection to its end: handshake, then frames until the
 * peer leaves, misbehaves or the engine stops. Frees nothing. */
void ferry_serve_connection(ferry_conn_t *c);

#endif
