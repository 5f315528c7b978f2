/* SPDX-License-Identifier: Apache-2.0 */
/* The engine struct, and the headers of every part of the core (conn.h,
 * session.h, xfer.h, batch.h, serve.h, hello.h, notify.h, config.h, ...),
 * for the core's files that need them all. A transport includes
 * transport/transport.h (core/xport.h) instead. Not a public header. */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "batch.h"
#include "link/cancel.h"
#include "config.h"
#include "link/conn.h"
#include "link/link.h"
#include "util/crc32c.h"
#include "directory.h"
#include "hello.h"
#include "meta/meta.h"
#include "link/metrics.h"
#include "notify.h"
#include "parts.h"
#include "link/registry.h"
#include "session.h"
#include "workers.h"
#include "stats.h"
#include "util/spin.h"
#include "wire/wire.h"
#include "link/xfer.h"
#include "link/xport.h"

struct ferry_engine {
    ferry_config_t cfg;
    char *cfg_strings;         /* owned copies of the config's strings */
    int test_protocol_version; /* 0, or what tests make it advertise (testing.h) */
    int test_no_conn_fence;    /* tests: act as a peer that predates connection fences (testing.h) */
    char name[300];
    uint16_t port;
    int listen_fd;
    int wake_fd[2];            /* pipe that stops the listener */
    uint64_t engine_id, epoch;
    uint8_t host_id[16];
    atomic_bool stopping;
    _Atomic uint64_t next_req_id;
    ferry_spin_t batch_spin;   /* recent waits for a batch or a call's groups (workers.c; spin.h) */

    ferry_registry_t registry;
    ferry_metrics_t metrics;
    ferry_counters_t stats;    /* engine-wide counters (metrics.h) */

    /* Metadata service (directory.c). */
    ferry_directory_t dir;

    pthread_t listener;
    struct ferry_evloop *evloop; /* the serving threads (evloop.c) */
    pthread_mutex_t conns_lock;
    ferry_conn_t *conns;       /* target side, served connections */
    int nconns_served;         /* length of conns (under conns_lock) */
    int nhandshaking;          /* ... of them in CONN_HANDSHAKE */
    int nestablished;          /* ... in CONN_IDLE or CONN_BUSY */
    /* The listener's limits, from the config (listener.c): connections past
     * the handshake, in it, and from one source address. */
    int max_established, max_handshaking, max_per_source, max_handshaking_per_source;
    int reserve_fd;            /* held open, given up to shed a connection when out of fds */
    _Atomic uint64_t limit_warned_ns; /* last warning about a full table (rate limit) */

    /* Sessions by peer name (session.c): a hash table with striped locks. */
    struct ferry_session_table *session_table;
    atomic_int nsessions;

    /* Initiator connections checked out or connecting (session.c): destroy
     * shuts them down to wake the calls blocked on them. */
    pthread_mutex_t busy_lock;
    ferry_conn_t *busy;
    /* Public calls in progress (ferry_engine_enter); destroy waits for 0. */
    atomic_int calls;
    pthread_mutex_t calls_lock;
    pthread_cond_t calls_cond;

    /* Async batch workers. */
    ferry_workers_t work;

    /* Received notifications. */
    ferry_notify_queue_t notify;

    /* Connections get serials in accept order. */
    _Atomic uint64_t next_conn_serial;
    /* What the link layer needs of the engine (link/link.h): cancels kept
     * and placement logs of served connections, a few config values; every
     * connection points to it. */
    ferry_link_t link;

    /* What the transports see of this engine, their engine-wide state
     * slots included (link/xport.h; filled at creation, xport.c). */
    ferry_xport_ctx_t xport;
};


#endif
