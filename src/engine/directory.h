/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's use of the metadata service: publishing its own descriptor
 * under a lease, and looking peers up before the first handshake. With the
 * default p2p backend both are no-ops and peers are reached at their name. */
#ifndef FERRY_DIRECTORY_H
#define FERRY_DIRECTORY_H

#include <stdbool.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "meta/meta.h"

/* The engine's metadata service (directory.c): a part of the engine
 * (engine.h: e->dir) reached through ferry_engine_part_dir (parts.h). */
typedef struct ferry_directory {
    ferry_meta_t meta;
    bool meta_open;
    struct ferry_meta_publisher *publisher;
    struct ferry_directory_cache *cache; /* peers looked up */
} ferry_directory_t;

typedef struct ferry_directory_entry {
    char host[256];
    uint16_t port;
    uint64_t epoch;
    int protocol;
} ferry_directory_entry_t;

/* Parses peer's descriptor text (the JSON the peer published) into *out:
 * 0, or FERRY_ERR_METADATA when a field is missing, of the wrong type or
 * out of range (port 1..65535, protocol 1..INT32_MAX, epoch 1-16 hex
 * digits): a record is never taken for another value. */
int ferry_directory_parse_entry(const char *peer, const char *text, ferry_directory_entry_t *out);

int ferry_directory_start(ferry_engine_t *e);
/* Removes this engine's entry; the service stays open for lookups. */
void ferry_directory_unpublish(ferry_engine_t *e);
/* Unpublishes and closes the service: only once no thread looks peers up. */
void ferry_directory_stop(ferry_engine_t *e);
/* 1 when a metadata service (not p2p) is configured. */
int ferry_directory_enabled(ferry_engine_t *e);
/* Looks peer up, through the engine's cache of peer entries: 0 and *out,
 * or FERRY_ERR_METADATA with detail. A cached entry serves for
 * metadata_ttl_s (a peer's entry outlives it by its lease at most); an
 * older one is fetched again, and still served when the service does not
 * answer (an outage must not stop sessions to peers already known).
 * *cached (may be NULL) says the entry came from the cache. */
int ferry_directory_lookup(ferry_engine_t *e, const char *peer, ferry_directory_entry_t *out, int *cached);
/* Drops peer's cached entry, so that its next lookup asks the service: a
 * session found it restarted (new epoch) or its address refused. */
void ferry_directory_forget(ferry_engine_t *e, const char *peer);
/* A new session's first connection: looks peer up and connects within
 * deadline. When a cached address fails, the entry is dropped and fetched
 * once more (the peer may have moved or gone), so a stale cache gives the
 * same answer as no cache. 0 and *fd, or the error with detail. */
int ferry_directory_connect(ferry_engine_t *e, const char *peer, uint64_t deadline, int *fd);

#endif
