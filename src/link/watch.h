/* SPDX-License-Identifier: Apache-2.0 */
/* Placement watches: the target side counts the bytes that one sender
 * (engine id and epoch from its handshake, optionally its source address)
 * placed into a set of address ranges of this engine, so that a layer
 * above (the KV tracker, kv_recv.c) can tell what actually landed from
 * what a notice claims. Not a public header. */
#ifndef FERRY_CORE_WATCH_H
#define FERRY_CORE_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "conn.h"

typedef struct ferry_watch ferry_watch_t;

/* Whose writes a watch counts. */
typedef struct ferry_watch_source {
    uint64_t engine_id;
    uint64_t epoch;
    uint8_t ip[16];  /* the source address, IPv4 as v4-mapped IPv6 */
    int any_ip;      /* 1: any source address */
} ferry_watch_source_t;

/* One watched range [addr, addr+len). */
typedef struct ferry_watch_range {
    uint64_t addr;
    uint64_t len;
} ferry_watch_range_t;

/* Starts counting src's writes into the n ranges (copied, sorted, merged)
 * placed by e's target side from now on. 0, INVALID_ARGUMENT or MEMORY. */
int ferry_watch_create(ferry_engine_t *e, const ferry_watch_source_t *src, const ferry_watch_range_t *ranges,
                       size_t n, ferry_watch_t **out);
/* Bytes of the watched ranges src placed so far (a range written twice
 * counts twice). */
uint64_t ferry_watch_bytes(const ferry_watch_t *w);
/* Bytes others (another engine id, epoch or address) placed into them. */
uint64_t ferry_watch_foreign_bytes(const ferry_watch_t *w);
/* Stops counting and frees; NULL is ignored. */
void ferry_watch_destroy(ferry_watch_t *w);

/* Transports, after placing [addr, addr+len) from the peer of target-side
 * connection c, before answering: one relaxed load when nothing is watched. */
void ferry_watch_placed(const ferry_conn_t *c, uint64_t addr, uint64_t len);

#endif
