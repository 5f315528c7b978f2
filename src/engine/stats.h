/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's counting (stats.c): the link layer's counters
 * (link/metrics.h) reached through the engine, and the optional
 * GET /metrics endpoint (metrics_http*.c). Private to the library. */
#ifndef FERRY_ENGINE_STATS_H
#define FERRY_ENGINE_STATS_H

#include <stdint.h>

#include <ferry/ferry.h>

#include "link/metrics.h"

/* link/metrics.h's ferry_count_*_in, into e's engine-wide counters. */
void ferry_count_request(ferry_engine_t *e, ferry_peer_stats_t *p, const char *transport, int opcode,
                         uint64_t bytes, uint64_t latency_ns, int rc);
void ferry_count_requests_ok(ferry_engine_t *e, ferry_peer_stats_t *p, const char *transport, int opcode,
                             uint64_t count, uint64_t bytes, uint64_t latency_ns);
void ferry_count_retry(ferry_engine_t *e, ferry_peer_stats_t *p, int code);
void ferry_count_failure(ferry_engine_t *e, int code);

/* metrics_http: the optional GET /metrics endpoint. */
int ferry_metrics_http_start(ferry_engine_t *e, int port);
void ferry_metrics_http_stop(ferry_engine_t *e);

#endif
