/* Per-peer metrics: counters and latency histograms, kept per engine by
 * peer name so that they outlive sessions re-opened to the same peer. */
#ifndef FERRY_METRICS_H
#define FERRY_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include <ferry/ferry.h>

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
/* A request ended: rc 0 or its code, bytes confirmed, latency. */
void ferry_metrics_request(ferry_peer_stats_t *p, const char *transport, int opcode, uint64_t bytes,
                           uint64_t latency_ns, int rc);
/* The same for count successful requests of one call (one latency): one
 * hold of the lock for all of them. */
void ferry_metrics_requests_ok(ferry_peer_stats_t *p, const char *transport, int opcode, uint64_t count,
                               uint64_t bytes, uint64_t latency_ns);
void ferry_metrics_retry(ferry_peer_stats_t *p);

/* metrics_http: the optional GET /metrics endpoint. */
int ferry_metrics_http_start(ferry_engine_t *e, int port);
void ferry_metrics_http_stop(ferry_engine_t *e);

#endif
