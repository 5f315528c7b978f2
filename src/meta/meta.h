/* Metadata backends behind one vtable.
 *
 * A backend stores, per engine name, a small descriptor (JSON text) that
 * tells peers how to reach the engine: its address, epoch, protocol version
 * and segment summary. The descriptor disappears on clean shutdown (remove)
 * and, through a lease/TTL that the engine refreshes, when the process dies.
 *
 * Backends: "p2p" (embedded: nothing is stored, peers handshake directly at
 * host:port), "etcd://host:port" (v3 JSON gateway), "redis://host:port".
 * A new backend is one new file and one entry in meta.c's table.
 */
#ifndef FERRY_META_H
#define FERRY_META_H

#include <stddef.h>

typedef struct ferry_meta_ops {
    const char *scheme; /* "p2p", "etcd", "redis" */
    /* Connects to the service at addr ("host:port", NULL for p2p) within
     * timeout_ms. Returns 0 and *state, or FERRY_ERR_METADATA with detail. */
    int (*open)(const char *addr, int timeout_ms, void **state);
    /* Stores value under key with a lease of ttl_s seconds (0: no lease). */
    int (*publish)(void *state, const char *key, const char *value, int ttl_s);
    /* Extends the lease of everything this state published. */
    int (*keepalive)(void *state);
    /* Fetches key; *value is malloc'd, NUL-terminated. Missing key:
     * FERRY_ERR_NOT_FOUND. */
    int (*lookup)(void *state, const char *key, char **value);
    /* Deletes key; deleting a missing key is not an error. */
    int (*remove)(void *state, const char *key);
    void (*close)(void *state);
} ferry_meta_ops_t;

typedef struct ferry_meta {
    const ferry_meta_ops_t *ops;
    void *state;
} ferry_meta_t;

/* Parses conn ("p2p", "etcd://h:p", "redis://h:p"; NULL or "" = p2p), finds
 * the backend and opens it. Unknown scheme or a backend not built in:
 * FERRY_ERR_INVALID_ARGUMENT / FERRY_ERR_NOT_IMPLEMENTED with detail. */
int ferry_meta_open(const char *conn, int timeout_ms, ferry_meta_t *out);
void ferry_meta_close(ferry_meta_t *m);

/* Keys are namespaced: "ferry/v1/engines/<name>". */
#define FERRY_META_KEY_PREFIX "ferry/v1/engines/"

#endif
