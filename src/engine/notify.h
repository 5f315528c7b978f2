/* SPDX-License-Identifier: Apache-2.0 */
/* Received notifications (notify.c). Private to the library. */
#ifndef FERRY_CORE_NOTIFY_H
#define FERRY_CORE_NOTIFY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "link/conn.h"

struct ferry_notify_count;
/* One queued notification, kept compact (40 bytes plus the message) so
 * that a lazy receiver can hold a large backlog: who sent it lives once in
 * its sender's count (notify.c), the node keeps only its source port. */
typedef struct ferry_notify_node {
    struct ferry_notify_node *next;
    struct ferry_notify_count *sender, *source; /* its sender's and address's counts (notify.c) */
    unsigned char *msg;
    uint32_t len;
    uint16_t port; /* the connection's source port, for from.addr */
} ferry_notify_node_t;

/* The engine's received notifications, in arrival order, and their counts
 * per sender and per address (notify.c); e->notify (engine.h). */
typedef struct ferry_notify_queue {
    pthread_mutex_t lock;
    ferry_notify_node_t *head, *tail;
    size_t count;
    size_t bytes;
    struct ferry_notify_tables *tables; /* queued per sender and per address (notify.c) */
} ferry_notify_queue_t;

/* Notifications queued and not yet fetched, in all (ferry.h's
 * FERRY_NOTIFY_BACKLOG_*); per sender and source address: FERRY_NOTIFY_PEER_*
 * and FERRY_NOTIFY_ADDRESS_*. Each is charged its length plus
 * FERRY_NOTIFY_ENTRY_OVERHEAD bytes. */
#define FERRY_MAX_QUEUED_NOTIFY FERRY_NOTIFY_BACKLOG_MAX
#define FERRY_MAX_QUEUED_NOTIFY_BYTES FERRY_NOTIFY_BACKLOG_BYTES

/* Queues msg (taking it) as received on the target-side connection c;
 * TOO_MANY_REQUESTS (msg freed, counted in notifies_dropped and logged)
 * when its sender's, its address's or the whole backlog is full. */
int ferry_notify_push(ferry_conn_t *c, unsigned char *msg, size_t len);
void ferry_notify_clear(ferry_engine_t *e);

#endif
