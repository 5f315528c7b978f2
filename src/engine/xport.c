/* SPDX-License-Identifier: Apache-2.0 */
/* The engine-wide values a transport reads (xport.h), and the public
 * getters of the engine's port, name and epoch. */
#include "link/xport.h"

#include "engine.h"

ferry_registry_t *ferry_engine_registry(ferry_engine_t *e) { return &e->registry; }

const ferry_config_t *ferry_engine_config(const ferry_engine_t *e) { return &e->cfg; }

ferry_counters_t *ferry_engine_counters(ferry_engine_t *e) { return &e->stats; }

const uint8_t *ferry_engine_host_id(const ferry_engine_t *e) { return e->host_id; }

struct ferry_rdma **ferry_engine_rdma_slot(ferry_engine_t *e) { return &e->rdma; }

uint16_t ferry_engine_port(const ferry_engine_t *e) { return e ? e->port : 0; }
const char *ferry_engine_name(const ferry_engine_t *e) { return e ? e->name : ""; }
uint64_t ferry_engine_epoch(const ferry_engine_t *e) { return e ? e->epoch : 0; }
