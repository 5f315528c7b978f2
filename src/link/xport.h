/* SPDX-License-Identifier: Apache-2.0 */
/* What a transport (src/transport) may use of the core: the connection
 * and its framed I/O (conn.h), the piece (xfer.h), the registry's lookups
 * (registry.h), the cancel check (cancel.h), the counters (metrics.h), and
 * the few engine-wide values below (and the public
 * ferry_engine_name), read through functions so that a
 * transport needs not the engine struct (engine.h). Private to the library. */
#ifndef FERRY_CORE_XPORT_H
#define FERRY_CORE_XPORT_H

#include <stdint.h>

#include <ferry/ferry.h>

#include "cancel.h"
#include "conn.h"
#include "util/crc32c.h"
#include "registry.h"
#include "metrics.h"
#include "xfer.h"

/* The engine's registry of memory regions. */
ferry_registry_t *ferry_engine_registry(ferry_engine_t *e);
/* The engine's configuration (its strings owned by the engine). */
const ferry_config_t *ferry_engine_config(const ferry_engine_t *e);
/* The engine-wide fault and traffic counters (metrics.h). */
ferry_counters_t *ferry_engine_counters(ferry_engine_t *e);
/* The engine's host identity, 16 bytes (same host: same id). */
const uint8_t *ferry_engine_host_id(const ferry_engine_t *e);
/* Where the RDMA transport keeps its engine-wide state (transport/rdma.c):
 * read and written with atomics. */
struct ferry_rdma **ferry_engine_rdma_slot(ferry_engine_t *e);

#endif
