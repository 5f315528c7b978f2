/* SPDX-License-Identifier: Apache-2.0 */
/* The listener (listener.c): what the engine (engine.c) calls of it.
 * Private to src/core. */
#ifndef FERRY_CORE_LISTENER_H
#define FERRY_CORE_LISTENER_H

#include <stdbool.h>

#include <ferry/ferry.h>

#include "link/conn.h"

/* The connection limits from the engine's config (ferry_engine_create). */
void ferry_listener_limits_from_config(ferry_engine_t *e);
/* A handshake succeeded: c joins the established connections (or is refused). */
int ferry_listener_admit_established(ferry_conn_t *c);
/* The listener thread's body; arg is the engine. */
void *ferry_listener_thread(void *arg);
/* A serving thread is done with c: it no longer counts, leaves the list, is freed. */
void ferry_listener_conn_done(ferry_conn_t *c);
/* Destroy: shuts down every served connection, then (no serving thread
 * left) frees them. */
void ferry_listener_shutdown_conns(ferry_engine_t *e);
void ferry_listener_free_conns(ferry_engine_t *e);

#endif
