/* SPDX-License-Identifier: Apache-2.0 */
/* What the link layer's own files (conn.c, cancel.c, placed.c) need of
 * their engine, so that they never see the engine struct: a part of it
 * (engine.h: e->link) that the engine fills at creation and every
 * connection points to (ferry_conn_t.link). Private to the library. */
#ifndef FERRY_LINK_H
#define FERRY_LINK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

struct ferry_conn;
struct ferry_placed_log;

typedef struct ferry_link {
    int spin_us;               /* config.spin_us (spin.h) */
    int timeout_ms;            /* config.timeout_ms */
    /* The protocol version the engine advertises (a test may pin it:
     * ferry_test_set_protocol_version, engine/testing.h), and whether it
     * acts as a peer that predates placement reports (ferry_test_set_no_placed). */
    atomic_int proto_max;
    atomic_bool no_placed;
    /* The engine's served connections (listener.c): the lock that guards
     * the list, and the list's head (ferry_conn_t.next). */
    pthread_mutex_t *conns_lock;
    struct ferry_conn **conns;
    /* Cancelled requests kept by all served connections together (cancel.h). */
    atomic_size_t cancels_held;
    /* Placement logs of served connections, live and recently closed
     * (placed.c, cancel.h). */
    pthread_mutex_t placed_lock;
    struct ferry_placed_log *placed_logs;
    size_t placed_retired;
} ferry_link_t;

#endif
