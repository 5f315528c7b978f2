/* Received notifications (notify.c). Private to the library. */
#ifndef FERRY_CORE_NOTIFY_H
#define FERRY_CORE_NOTIFY_H

#include <stddef.h>

#include <ferry/ferry.h>

#include "conn.h"

struct ferry_notify_count;
typedef struct ferry_notify_node {
    ferry_notification_t n;
    ferry_notification_sender_t from;
    struct ferry_notify_count *sender, *source; /* its sender's and address's counts (notify.c) */
    struct ferry_notify_node *next;
} ferry_notify_node_t;

/* Notifications queued and not yet fetched; more are refused (and per
 * sender and source address, ferry.h's FERRY_NOTIFY_*_MAX). */
#define FERRY_MAX_QUEUED_NOTIFY FERRY_NOTIFY_QUEUE_MAX
#define FERRY_MAX_QUEUED_NOTIFY_BYTES (256u << 20)

/* Queues msg (taking it) as received on the target-side connection c;
 * TOO_MANY_REQUESTS (msg freed) when the queue is full. */
int ferry_notify_push(ferry_conn_t *c, unsigned char *msg, size_t len);
void ferry_notify_clear(ferry_engine_t *e);

#endif
