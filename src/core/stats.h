/* Per-engine counters: relaxed atomics bumped on the hot paths, copied into
 * the public ferry_stats_t by ferry_engine_stats(). Not a public header. */
#ifndef FERRY_STATS_H
#define FERRY_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#include <ferry/ferry.h>

#define FERRY_X_COUNT(name, value, retry, text) +1
/* Codes in the error table, OK included. */
enum { FERRY_ERROR_TABLE_SIZE = 0 FERRY_ERROR_TABLE(FERRY_X_COUNT) };
#undef FERRY_X_COUNT

/* One field per counter of ferry_stats_t (same names), plus per-code arrays
 * indexed by the code's position in the error table. */
#define FERRY_STATS_FIELDS(X)                                                \
    X(requests) X(requests_completed) X(requests_failed) X(bytes_written)    \
    X(bytes_read) X(retries) X(connections_opened) X(reconnects)             \
    X(session_teardowns) X(peer_restarts) X(checksum_failures)               \
    X(connections_accepted) X(connections_refused) X(auth_failures)          \
    X(frames_rejected) X(bytes_placed) X(bytes_served)                     \
    X(connections_evicted) X(handshakes_evicted) X(accept_backoffs)         \
    X(metadata_lookups) X(metadata_cache_hits) X(metadata_fetches)           \
    X(metadata_stale_served) X(metadata_invalidations)                      \
    X(metadata_lease_refreshes) X(metadata_republishes)

typedef struct ferry_counters {
#define FERRY_X_FIELD(f) _Atomic uint64_t f;
    FERRY_STATS_FIELDS(FERRY_X_FIELD)
#undef FERRY_X_FIELD
    _Atomic uint64_t failures[FERRY_ERROR_TABLE_SIZE];
    _Atomic uint64_t code_retries[FERRY_ERROR_TABLE_SIZE];
} ferry_counters_t;

#define FERRY_STAT_ADD(counters, field, n) \
    atomic_fetch_add_explicit(&(counters)->field, (uint64_t)(n), memory_order_relaxed)

/* A request (or session open) ended with code < 0. */
void ferry_stats_failure(ferry_counters_t *c, int code);
/* An automatic retry caused by code. */
void ferry_stats_retry(ferry_counters_t *c, int code);
/* Copies the counters into the public form. */
void ferry_stats_read(ferry_counters_t *c, ferry_stats_t *out);

#endif
