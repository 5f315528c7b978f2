/* SPDX-License-Identifier: Apache-2.0 */
/* Narrow views of the engine (parts.c): for the engine's files that need
 * one or two of its parts, not the whole struct (engine.h). Private to the
 * library. */
#ifndef FERRY_ENGINE_PARTS_H
#define FERRY_ENGINE_PARTS_H

#include <stdbool.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "link/metrics.h"
#include "link/registry.h"

ferry_registry_t *ferry_engine_part_registry(ferry_engine_t *e);
const ferry_config_t *ferry_engine_part_config(const ferry_engine_t *e);
ferry_metrics_t *ferry_engine_part_metrics(ferry_engine_t *e);
ferry_counters_t *ferry_engine_part_stats(ferry_engine_t *e);
/* The engine's identity, as its HELLO tells it (hello.c). */
uint64_t ferry_engine_part_id(const ferry_engine_t *e);
const uint8_t *ferry_engine_part_host_id(const ferry_engine_t *e);
struct ferry_notify_queue *ferry_engine_part_notify(ferry_engine_t *e);
struct ferry_workers *ferry_engine_part_work(ferry_engine_t *e);
struct ferry_spin *ferry_engine_part_batch_spin(ferry_engine_t *e);
struct ferry_directory *ferry_engine_part_dir(ferry_engine_t *e);
/* Whether destroy began (set: it has, or the workers stop); n fresh
 * request ids (the first returned). */
bool ferry_engine_part_stopping(const ferry_engine_t *e);
void ferry_engine_part_set_stopping(ferry_engine_t *e);
uint64_t ferry_engine_part_req_ids(ferry_engine_t *e, uint64_t n);

/* A public call that may block on a peer enters first (CONTEXT once
 * destroy began) and leaves when done; destroy wakes the calls in progress
 * and waits until they all left before freeing anything. */
int ferry_engine_enter(ferry_engine_t *e);
/* Returns rc, except that a link failure (PEER_CLOSED, SOCKET, TIMEOUT)
 * while destroy runs, which destroy caused, becomes CONTEXT. */
int ferry_engine_leave(ferry_engine_t *e, int rc);

#endif
