/* SPDX-License-Identifier: Apache-2.0 */
/* What a transport (src/transport) may use of the engine: the connection
 * and its framed I/O (conn.h), the piece (piece.h), the registry's lookups
 * (registry.h), the cancel check (cancel.h: ferry_conn_is_cancelled, and
 * target.h's ferry_target_check_locked), the counters (metrics.h), and the
 * narrow context below, which the engine fills when it is created and
 * every connection points to (ferry_conn_t.ctx). A transport never sees
 * the engine struct (engine.h) nor calls the engine layer. Private to the
 * library. */
#ifndef FERRY_CORE_XPORT_H
#define FERRY_CORE_XPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "cancel.h"
#include "conn.h"
#include "util/crc32c.h"
#include "registry.h"
#include "metrics.h"
#include "piece.h"

/* Engine-wide state slots, one per transport of the table, by its index
 * (ferry_transport_state, transport.h): the per-region slots less the
 * core's. */
#define FERRY_XPORT_SLOTS (FERRY_REGION_SLOTS - 1)

/* One engine as its transports see it. The pointers and values are set
 * once, at engine creation, before any connection exists, and stay valid
 * until the engine is freed (after every transport's engine_fini). */
typedef struct ferry_xport_ctx {
    ferry_registry_t *registry; /* the engine's memory regions */
    ferry_counters_t *counters; /* its fault and traffic counters (metrics.h) */
    const uint8_t *host_id;     /* its host identity, 16 bytes (same host: same id) */
    const char *name;           /* its name, "host:port" (set once it listens) */
    /* The configuration values transports read (ferry_config_t). */
    const char *transport;      /* the forced transport's name, or "auto" */
    int timeout_ms;             /* the per-request deadline */
    size_t slice_size;          /* bytes per wire slice */
    bool checksum;              /* CRC32C on every slice */
    /* Each transport's engine-wide state (RDMA: its probe and device),
     * made at first use, freed by its engine_fini; read and written with
     * atomics. */
    _Atomic(void *) state[FERRY_XPORT_SLOTS];
} ferry_xport_ctx_t;

#endif
