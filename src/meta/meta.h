/* SPDX-License-Identifier: Apache-2.0 */
/* Metadata backends behind one vtable.
 *
 * A backend stores, per engine name, a small descriptor (JSON text) that
 * tells peers how to reach the engine: its address, epoch, protocol version
 * and segment summary. The descriptor disappears on clean shutdown (remove)
 * and, through a lease/TTL that the engine refreshes, when the process dies.
 *
 * Backends: "p2p" (embedded: nothing is stored, peers handshake directly at
 * host:port), "etcd://host:port" (v3 JSON gateway), "redis://host:port",
 * "http://host:port/path" (Mooncake's HTTP metadata server; no lease:
 * keepalive stores the entries again).
 * A new backend is one new file and one entry in meta.c's table.
 */
#ifndef FERRY_META_H
#define FERRY_META_H

#include <stddef.h>
#include <stdint.h>

typedef struct ferry_meta_ops {
    const char *scheme; /* "p2p", "etcd", "redis", "http" */
    /* Connects to the service at addr ("host:port", "host:port/path" for
     * http, NULL for p2p) within
     * timeout_ms. Returns 0 and *state, or FERRY_ERR_METADATA with detail. */
    int (*open)(const char *addr, int timeout_ms, void **state);
    /* Stores value under key with a lease of ttl_s seconds (0: no lease). */
    int (*publish)(void *state, const char *key, const char *value, int ttl_s);
    /* Extends the lease of everything this state published. An entry that
     * is gone (lease expired, server lost its data) gives FERRY_ERR_NOT_FOUND
     * after the others were refreshed, so that the caller re-publishes. */
    int (*keepalive)(void *state);
    /* Fetches key; *value is malloc'd, NUL-terminated. Missing key:
     * FERRY_ERR_NOT_FOUND. */
    int (*lookup)(void *state, const char *key, char **value);
    /* Deletes key; deleting a missing key is not an error. */
    int (*remove)(void *state, const char *key);
    void (*close)(void *state);
} ferry_meta_ops_t;
/* Backends lock their state: one state may be used from several threads
 * (the publisher's thread refreshes while the engine looks peers up). */

/* The backends in meta.c's table; those not built in are absent. */
extern const ferry_meta_ops_t ferry_meta_p2p_ops;
extern const ferry_meta_ops_t ferry_meta_etcd_ops;
extern const ferry_meta_ops_t ferry_meta_redis_ops;
extern const ferry_meta_ops_t ferry_meta_http_ops;

typedef struct ferry_meta {
    const ferry_meta_ops_t *ops;
    void *state;
} ferry_meta_t;

/* Parses conn ("p2p", "etcd://h:p", "redis://h:p", "http://h:p/path";
 * NULL or "" = p2p), finds
 * the backend and opens it. Unknown scheme or a backend not built in:
 * FERRY_ERR_INVALID_ARGUMENT / FERRY_ERR_NOT_IMPLEMENTED with detail. */
int ferry_meta_open(const char *conn, int timeout_ms, ferry_meta_t *out);
void ferry_meta_close(ferry_meta_t *m);

/* Splits conn into its scheme ("p2p", "etcd", "redis", "http") and address
 * ("host:port"; "host:port/path" for http, the path "/metadata" when none
 * is given; empty for p2p) without opening anything. The port is
 * required and must be 1..65535; an IPv6 host is written in brackets.
 * Bad string: FERRY_ERR_INVALID_ARGUMENT with detail. */
int ferry_meta_parse(const char *conn, char *scheme, size_t scheme_len, char *addr,
                     size_t addr_len);
/* 1 when the backend for scheme is built into this library. */
int ferry_meta_backend_built(const char *scheme);

/* The lease keeper: publishes key=value with a lease of ttl_s seconds (>= 1)
 * and refreshes it from a thread every ttl_s/3, re-publishing when the entry
 * vanished (the server restarted and lost it, or the lease expired during an
 * outage). Refresh failures are logged (FERRY_LOG) and retried; they never
 * reach the caller. The first publish is synchronous: its failure is returned
 * and nothing is started. m must outlive the publisher. */
struct ferry_meta_publisher;
int ferry_meta_publisher_start(ferry_meta_t *m, const char *key, const char *value, int ttl_s,
                               struct ferry_meta_publisher **out);
/* As ferry_meta_publisher_start, and counts into *refreshed each lease
 * refreshed and into *republished each entry published again after it
 * vanished or a refresh failed (either may be NULL). */
int ferry_meta_publisher_start_counted(ferry_meta_t *m, const char *key, const char *value, int ttl_s,
                                       _Atomic uint64_t *refreshed, _Atomic uint64_t *republished,
                                       struct ferry_meta_publisher **out);
/* Stops the thread (promptly: it waits on a condvar, at most one backend
 * call is in flight), removes the key and frees p. Returns 0, or the
 * removal's error; p is freed either way. NULL is a no-op. */
int ferry_meta_publisher_stop(struct ferry_meta_publisher *p);

/* The value of an etcd /kv/range answer body, as etcd_lookup reads it: 0,
 * NOT_FOUND or METADATA with detail (NOT_IMPLEMENTED without etcd). For
 * tests (tests/fuzz/fuzz_meta.c). */
int ferry_etcd_range_answer(const char *body, char **value);

/* Keys are namespaced: "ferry/v1/engines/<name>". */
#define FERRY_META_KEY_PREFIX "ferry/v1/engines/"

#endif
