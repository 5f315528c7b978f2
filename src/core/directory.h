/* The engine's use of the metadata service: publishing its own descriptor
 * under a lease, and looking peers up before the first handshake. With the
 * default p2p backend both are no-ops and peers are reached at their name. */
#ifndef FERRY_DIRECTORY_H
#define FERRY_DIRECTORY_H

#include <stdint.h>

#include <ferry/ferry.h>

typedef struct ferry_directory_entry {
    char host[256];
    uint16_t port;
    uint64_t epoch;
    int protocol;
} ferry_directory_entry_t;

int ferry_directory_start(ferry_engine_t *e);
/* Removes this engine's entry; the service stays open for lookups. */
void ferry_directory_unpublish(ferry_engine_t *e);
/* Unpublishes and closes the service: only once no thread looks peers up. */
void ferry_directory_stop(ferry_engine_t *e);
/* 1 when a metadata service (not p2p) is configured. */
int ferry_directory_enabled(const ferry_engine_t *e);
/* Looks peer up: 0 and *out, or FERRY_ERR_METADATA with detail. */
int ferry_directory_lookup(ferry_engine_t *e, const char *peer, ferry_directory_entry_t *out);

#endif
