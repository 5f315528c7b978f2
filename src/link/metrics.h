/* SPDX-License-Identifier: Apache-2.0 */
/* Counting: every event is counted once here, into the engine-wide
 * counters (relaxed atomics bumped on the hot paths, read by the public
 * ferry_engine_stats) and, for transfers, into the peer's entry (counters
 * and latency histograms kept per engine by peer name, so that they outlive
 * sessions re-opened to the same peer; read by ferry_metrics_peers).
 * ferry_metrics_prometheus renders both. Not a public header. */
#ifndef FERRY_METRICS_H
#define FERRY_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <ferry/ferry.h>

#define FERRY_X_COUNT(name, value, retry, text) +1
/* Codes in the error table, OK included. */
enum { FERRY_ERROR_TABLE_SIZE = 0 FERRY_ERROR_TABLE(FERRY_X_COUNT) };
#undef FERRY_X_COUNT

/* One field per counter of ferry_stats_t (same names), with its help text:
 * each is the Prometheus counter ferry_engine_<field>_total. */
#define FERRY_STATS_FIELDS(X)                                                                                  \
    X(requests, "Transfer requests accepted.")                                                                \
    X(requests_completed, "Transfer requests completed.")                                                     \
    X(requests_failed, "Transfer requests failed.")                                                           \
    X(bytes_written, "Bytes peers confirmed placed.")                                                         \
    X(bytes_read, "Bytes received from peers.")                                                               \
    X(retries, "Automatic retries.")                                                                          \
    X(connections_opened, "Connections that completed the handshake.")                                        \
    X(reconnects, "Connections opened to replace broken ones.")                                               \
    X(session_teardowns, "Connection pools dropped after retries ran out.")                                   \
    X(peer_restarts, "Peers found with a new epoch.")                                                         \
    X(checksum_failures, "CRC32C mismatches detected.")                                                       \
    X(connections_accepted, "Connections accepted from peers.")                                               \
    X(connections_refused, "Connections refused.")                                                            \
    X(auth_failures, "Shared-secret authentications failed.")                                                 \
    X(frames_rejected, "Connections dropped for a malformed frame.")                                          \
    X(bytes_placed, "Bytes peers wrote into this engine's memory.")                                           \
    X(bytes_served, "Bytes peers read from this engine.")                                                     \
    X(connections_evicted, "Idle connections closed to make room.")                                           \
    X(handshakes_evicted, "Connections closed in their handshake to make room.")                              \
    X(accept_backoffs, "Pauses of the listener for want of file descriptors.")                                \
    X(metadata_lookups, "Peer lookups by new sessions.")                                                      \
    X(metadata_cache_hits, "Peer lookups answered from the cache.")                                           \
    X(metadata_fetches, "Requests to the metadata service for peer entries.")                                 \
    X(metadata_stale_served, "Expired cached entries used while the service did not answer.")                 \
    X(metadata_invalidations, "Cached entries dropped: peer restarted or address refused.")                   \
    X(metadata_lease_refreshes, "Leases of this engine's entry extended.")                                    \
    X(metadata_republishes, "This engine's entry published again after it was lost.")                        \
    X(notifies_dropped, "Peers' notifications dropped: the sender's backlog share was full.")                 \
    X(notifies_unsent, "Notifications this engine sent that failed.")

/* The engine-wide counters, plus per-code arrays indexed by the code's
 * position in the error table. */
typedef struct ferry_counters {
#define FERRY_X_FIELD(f, help) _Atomic uint64_t f;
    FERRY_STATS_FIELDS(FERRY_X_FIELD)
#undef FERRY_X_FIELD
    _Atomic uint64_t failures[FERRY_ERROR_TABLE_SIZE];
    _Atomic uint64_t code_retries[FERRY_ERROR_TABLE_SIZE];
} ferry_counters_t;

/* An event that only the engine-wide counters count. */
#define FERRY_STAT_ADD(counters, field, n) \
    atomic_fetch_add_explicit(&(counters)->field, (uint64_t)(n), memory_order_relaxed)

/* Copies the counters into the public form. */
void ferry_stats_read(ferry_counters_t *c, ferry_stats_t *out);

typedef struct ferry_peer_stats {
    pthread_mutex_t lock;
    ferry_peer_metrics_t m;
    struct ferry_peer_stats *next;
} ferry_peer_stats_t;

typedef struct ferry_metrics {
    pthread_mutex_t lock;      /* guards the list */
    ferry_peer_stats_t *peers;
    void *http;                /* the HTTP endpoint, when on */
    uint16_t http_port;
} ferry_metrics_t;

void ferry_metrics_init(ferry_metrics_t *m);
void ferry_metrics_destroy(ferry_metrics_t *m);
/* The entry for peer, created on first use (NULL only when out of memory). */
ferry_peer_stats_t *ferry_metrics_peer(ferry_metrics_t *m, const char *peer);

/* A request ended: rc 0 or its code, bytes confirmed, latency. Counted as
 * completed or failed (by code) for the engine, and in peer p's entry when
 * p is not NULL (transport, when not NULL, names what carried it). */
void ferry_count_request_in(ferry_counters_t *stats, ferry_peer_stats_t *p, const char *transport, int opcode,
                            uint64_t bytes, uint64_t latency_ns, int rc);
/* The same for count requests of one call that all completed (one
 * latency), under one hold of each lock rather than one per request. */
void ferry_count_requests_ok_in(ferry_counters_t *stats, ferry_peer_stats_t *p, const char *transport, int opcode,
                                uint64_t count, uint64_t bytes, uint64_t latency_ns);
/* An automatic retry caused by code (< 0), of a transfer to peer p (NULL:
 * not a transfer's). */
void ferry_count_retry_in(ferry_counters_t *stats, ferry_peer_stats_t *p, int code);
/* A call outside any request (opening a session) failed with code < 0. */
void ferry_count_failure_in(ferry_counters_t *stats, int code);
/* (The engine counts through engine/stats.h, which names its counters.) */

/* The readers of the public API (engine/stats.c): every peer's entry, up
 * to max of them copied into out (the count of entries returned); the
 * entries of one transport summed into out. */
long ferry_metrics_copy_peers(ferry_metrics_t *m, ferry_peer_metrics_t *out, size_t max);
void ferry_metrics_sum_transport(ferry_metrics_t *m, const char *transport, ferry_peer_metrics_t *out);
/* What the Prometheus text tells of an engine. */
typedef struct ferry_metrics_source {
    ferry_metrics_t *metrics;
    ferry_counters_t *stats;   /* the engine-wide counters */
    size_t regions;            /* memory regions registered */
    const char *name;
    uint64_t epoch;
} ferry_metrics_source_t;
/* Renders it as Prometheus text into buf (cap bytes, NUL-terminated when
 * it fits): the length of the whole text. */
long ferry_metrics_render(const ferry_metrics_source_t *src, char *buf, size_t cap);

#endif
