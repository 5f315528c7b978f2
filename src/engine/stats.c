/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's counting (stats.h) and the public metrics readers: the
 * link layer's counters (link/metrics.c) reached through the engine. */
#include "stats.h"

#include "engine.h"
#include "util/fail.h"

void ferry_count_request(ferry_engine_t *e, ferry_peer_stats_t *p, const char *transport, int opcode,
                         uint64_t bytes, uint64_t latency_ns, int rc)
{
    ferry_count_request_in(&e->stats, p, transport, opcode, bytes, latency_ns, rc);
}

void ferry_count_requests_ok(ferry_engine_t *e, ferry_peer_stats_t *p, const char *transport, int opcode,
                             uint64_t count, uint64_t bytes, uint64_t latency_ns)
{
    ferry_count_requests_ok_in(&e->stats, p, transport, opcode, count, bytes, latency_ns);
}

void ferry_count_retry(ferry_engine_t *e, ferry_peer_stats_t *p, int code) { ferry_count_retry_in(&e->stats, p, code); }

void ferry_count_failure(ferry_engine_t *e, int code) { ferry_count_failure_in(&e->stats, code); }

long ferry_metrics_peers(ferry_engine_t *e, ferry_peer_metrics_t *out, size_t max)
{
    if (!e || (!out && max)) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metrics: NULL argument");
    return ferry_metrics_copy_peers(&e->metrics, out, max);
}

int ferry_metrics_transport(ferry_engine_t *e, const char *transport, ferry_peer_metrics_t *out)
{
    if (!e || !transport || !out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metrics: NULL argument");
    ferry_metrics_sum_transport(&e->metrics, transport, out);
    return 0;
}

long ferry_metrics_prometheus(ferry_engine_t *e, char *buf, size_t cap)
{
    if (!e || (!buf && cap)) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metrics: NULL argument");
    ferry_metrics_source_t src = {.metrics = &e->metrics,
                                  .stats = &e->stats,
                                  .regions = ferry_registry_count(&e->registry),
                                  .name = e->name,
                                  .epoch = e->epoch};
    return ferry_metrics_render(&src, buf, cap);
}

uint16_t ferry_metrics_port(const ferry_engine_t *e) { return e ? e->metrics.http_port : 0; }
