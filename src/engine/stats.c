/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's counting (stats.h) and the public metrics readers: the
 * link layer's counters (link/metrics.c) reached through the engine. */
#include "stats.h"

#include "parts.h"
#include "util/fail.h"

void ferry_count_request(ferry_engine_t *e, ferry_peer_stats_t *p, const char *transport, int opcode,
                         uint64_t bytes, uint64_t latency_ns, int rc)
{
    ferry_count_request_in(ferry_engine_part_stats(e), p, transport, opcode, bytes, latency_ns, rc);
}

void ferry_count_requests_ok(ferry_engine_t *e, ferry_peer_stats_t *p, const char *transport, int opcode,
                             uint64_t count, uint64_t bytes, uint64_t latency_ns)
{
    ferry_count_requests_ok_in(ferry_engine_part_stats(e), p, transport, opcode, count, bytes, latency_ns);
}

void ferry_count_retry(ferry_engine_t *e, ferry_peer_stats_t *p, int code)
{
    ferry_count_retry_in(ferry_engine_part_stats(e), p, code);
}

void ferry_count_failure(ferry_engine_t *e, int code) { ferry_count_failure_in(ferry_engine_part_stats(e), code); }

long ferry_metrics_peers(ferry_engine_t *e, ferry_peer_metrics_t *out, size_t max)
{
    if (!e || (!out && max)) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metrics: NULL argument");
    return ferry_metrics_copy_peers(ferry_engine_part_metrics(e), out, max);
}

int ferry_metrics_transport(ferry_engine_t *e, const char *transport, ferry_peer_metrics_t *out)
{
    if (!e || !transport || !out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metrics: NULL argument");
    ferry_metrics_sum_transport(ferry_engine_part_metrics(e), transport, out);
    return 0;
}

long ferry_metrics_prometheus(ferry_engine_t *e, char *buf, size_t cap)
{
    if (!e || (!buf && cap)) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metrics: NULL argument");
    ferry_metrics_source_t src = {.metrics = ferry_engine_part_metrics(e),
                                  .stats = ferry_engine_part_stats(e),
                                  .regions = ferry_registry_count(ferry_engine_part_registry(e)),
                                  .name = ferry_engine_name(e),
                                  .epoch = ferry_engine_epoch(e)};
    return ferry_metrics_render(&src, buf, cap);
}
