/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's side of the transports' context (link/xport.h): filled
 * once at creation, reached from the engine (xport.c). Private to the
 * library. */
#ifndef FERRY_ENGINE_XPORT_H
#define FERRY_ENGINE_XPORT_H

#include <ferry/ferry.h>

#include "link/metrics.h"
#include "link/xport.h"

/* Fills e's transport context from its registry, counters, host id, name
 * and configuration; at engine creation, once the configuration is
 * copied, before any connection or transport call. */
void ferry_engine_xport_init(ferry_engine_t *e);
/* e's transport context: what a connection of e points to (ctx), what
 * the transport ops' usable, hello_flags and engine_fini get. */
ferry_xport_ctx_t *ferry_engine_xport(ferry_engine_t *e);
/* The engine-wide fault and traffic counters (metrics.h). */
ferry_counters_t *ferry_engine_counters(ferry_engine_t *e);

#endif
