/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's transport context (xport.h, link/xport.h), and the public
 * getters of the engine's port, name and epoch. */
#include "xport.h"

#include "engine.h"

void ferry_engine_xport_init(ferry_engine_t *e)
{
    ferry_xport_ctx_t *x = &e->xport;
    x->registry = &e->registry;
    x->counters = &e->stats;
    x->host_id = e->host_id;
    x->name = e->name;
    x->transport = e->cfg.transport;
    x->timeout_ms = e->cfg.timeout_ms;
    x->slice_size = e->cfg.slice_size;
    x->checksum = e->cfg.checksum != 0;
    for (size_t i = 0; i < FERRY_XPORT_SLOTS; i++) atomic_init(&x->state[i], NULL);
}

ferry_xport_ctx_t *ferry_engine_xport(ferry_engine_t *e) { return &e->xport; }

ferry_counters_t *ferry_engine_counters(ferry_engine_t *e) { return &e->stats; }

uint16_t ferry_engine_port(const ferry_engine_t *e) { return e ? e->port : 0; }
const char *ferry_engine_name(const ferry_engine_t *e) { return e ? e->name : ""; }
uint64_t ferry_engine_epoch(const ferry_engine_t *e) { return e ? e->epoch : 0; }
