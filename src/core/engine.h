/* Engine internals shared by the core's files. Not a public header. */
#ifndef FERRY_ENGINE_H
#define FERRY_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "cancel.h"
#include "meta/meta.h"
#include "metrics.h"
#include "registry.h"
#include "spin.h"
#include "stats.h"
#include "wire/wire.h"

struct ferry_transport_ops;
typedef struct ferry_session ferry_session_t;

/* One TCP connection, either side. */
typedef struct ferry_conn {
    int fd;
    ferry_engine_t *engine;
    ferry_session_t *session;  /* initiator side: its session; NULL on the target */
    ferry_hello_t peer;        /* what the other side said in the handshake */
    unsigned char *bounce;     /* checksum / device-memory staging, lazily made */
    size_t bounce_cap;         /* its size; 0 = FERRY_WIRE_MAX_DATA (the target's checksum staging) */
    struct ferry_conn *next;   /* target side: list of served connections */
    struct ferry_conn *busy_prev, *busy_next; /* initiator side: the engine's checked-out list */
    pthread_t thread;          /* target side: its serving thread */
    atomic_bool done;          /* target side: the thread has finished */
    void *xport;               /* a transport's per-connection state, or NULL */
    void (*xport_free)(void *); /* frees xport with the connection */
    uint64_t serial;           /* target side: accept order, 1, 2, ... */
    /* Cancels (cancel.h). Target side: the key this connection was given in
     * its HELLO_ACK, the peer engine it serves (both published once the
     * handshake is read, 0 before), and the ids it refuses (NULL: none).
     * Initiator side: cancel_key is the key the target gave. */
    _Atomic uint64_t cancel_key, cancel_peer;
    _Atomic(ferry_cancel_set_t *) cancels;
    uint64_t pool_gen;         /* initiator side: the session's pool generation at connect */
    char remote[64];           /* target side: the socket's peer address, for logs */
    /* Target side, for the listener's limits (listener.c): where the
     * connection stands (CONN_*), whether it is in the engine's list and
     * counted there, whether the peer spoke yet, its source address (IPv4 as
 * v4-mapped IPv6), and when
     * it was accepted or last went idle. */
    atomic_int state;
    atomic_bool heard;         /* in its handshake: the peer has sent something */
    bool listed;
    uint8_t source[16];
    _Atomic uint64_t idle_since_ns;
    struct ferry_vec_scratch *vec; /* vector frames' per-connection buffers (transport/vec.h), lazily made */
    ferry_spin_t spin;         /* recent waits on it, for the adaptive spin (spin.h) */
} ferry_conn_t;

/* ferry_conn_t.state on the target side. Changes under the engine's
 * conns_lock, except IDLE <-> BUSY, which the serving thread makes alone
 * (a compare-and-swap against the evictor's IDLE -> EVICTED). */
enum ferry_conn_state {
    CONN_HANDSHAKE = 0, /* counted in nhandshaking */
    CONN_IDLE,          /* handshake done, waiting for a request: counted in nestablished */
    CONN_BUSY,          /* serving a frame: counted in nestablished, never evicted */
    CONN_EVICTED,       /* closed to make room; counted nowhere */
    CONN_ENDED          /* its thread is finishing; counted nowhere */
};

enum ferry_session_state { SESSION_OK = 0, SESSION_RESTARTED, SESSION_CLOSED };

/* The initiator's view of one peer. Reference-counted: a transfer holds a
 * reference while it runs, so ferry_session_close never frees under it. */
struct ferry_session {
    char name[256];
    char host[256];
    uint16_t port;
    ferry_engine_t *engine;
    atomic_int refs;

    pthread_mutex_t lock;      /* guards everything below */
    pthread_cond_t cond;       /* a connection was returned */
    int state;
    ferry_hello_t peer;        /* from the first handshake */
    bool have_peer;
    ferry_conn_t **idle;       /* connections ready for use */
    int nidle, nconns, max_conns;
    uint64_t pool_gen;         /* bumped by a teardown: older connections close at checkin */
    int broken_conns;          /* connections lost since the last reconnect (for stats) */
    const struct ferry_transport_ops *transport;
    char transport_reason[128];
    ferry_peer_stats_t *stats;  /* the engine's metrics entry for this peer */
    /* Request ids whose cancel the peer has not confirmed yet (cancel.c):
     * fenced again before the next request goes out. */
    ferry_fence_id_t *unfenced;
    size_t nunfenced;

    /* The peer's remote-accessible segments, sorted by address. */
    pthread_rwlock_t seg_lock;
    ferry_segment_t *segs;
    size_t nsegs;
    uint64_t seg_version;
    atomic_bool segs_stale;    /* refetch before the next resolve (after a teardown) */

    ferry_session_t *next;     /* next in its bucket of the engine's session table */
};

/* One contiguous transfer for a transport to move. */
typedef struct ferry_xfer {
    int opcode;
    unsigned char *local;
    uint64_t remote;
    uint64_t len;
    uint32_t generation;       /* of the remote region, 0 = unchecked */
    uint64_t req_id;
    uint64_t deadline;
    atomic_bool *cancel;       /* set: stop at the next slice boundary */
    _Atomic uint64_t *progress; /* bytes confirmed, added as acks arrive */
    uint64_t done;             /* confirmed prefix: a retry resumes here */
    int rc;                    /* this piece's outcome */
    char *detail;              /* malloc'd detail when rc < 0 */
    size_t index;              /* request index within its batch */
    /* Completion and cancel (cancel.h). */
    unsigned inflight;         /* frames sent whose answer has not arrived */
    ferry_stream_ctl_t *ctl;   /* lets a canceller interrupt the stream; NULL = none */
    void (*ended)(struct ferry_xfer *x, void *arg); /* called once when final */
    void *ended_arg;
    bool has_ended;
} ferry_xfer_t;

/* Records a piece's failure with the calling thread's current detail. */
void ferry_xfer_fail(ferry_xfer_t *x, int rc);

/* A queued unit of an async batch: pieces run as one pipelined stream on
 * one connection by a worker. */
typedef struct ferry_task {
    ferry_batch_t *batch;
    ferry_session_t *session;  /* holds a reference */
    ferry_xfer_t *xfers;
    size_t nxfers;
    struct ferry_task *next;
} ferry_task_t;

struct ferry_notify_count;
typedef struct ferry_notify_node {
    ferry_notification_t n;
    ferry_notification_sender_t from;
    struct ferry_notify_count *sender, *source; /* its sender's and address's counts (notify.c) */
    struct ferry_notify_node *next;
} ferry_notify_node_t;

struct ferry_engine {
    ferry_config_t cfg;
    char *cfg_strings;         /* owned copies of the config's strings */
    int test_protocol_version; /* 0, or what tests make it advertise (testing.h) */
    char name[300];
    uint16_t port;
    int listen_fd;
    int wake_fd[2];            /* pipe that stops the listener */
    uint64_t engine_id, epoch;
    uint8_t host_id[16];
    atomic_bool stopping;
    _Atomic uint64_t next_req_id;
    ferry_spin_t batch_spin;   /* recent waits for a batch or a call's groups (batch.c; spin.h) */

    ferry_registry_t registry;
    ferry_metrics_t metrics;
    ferry_counters_t stats;    /* engine-wide fault and security counters (stats.h) */

    /* Metadata service (directory.c). */
    ferry_meta_t meta;
    bool meta_open;
    struct ferry_meta_publisher *publisher;
    struct ferry_directory_cache *dir_cache; /* peers looked up (directory.c) */

    pthread_t listener;
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
    pthread_mutex_t queue_lock;
    pthread_cond_t queue_cond;
    ferry_task_t *queue_head, *queue_tail;
    pthread_t *workers;
    int nworkers;

    /* Received notifications. */
    pthread_mutex_t notify_lock;
    ferry_notify_node_t *notify_head, *notify_tail;
    size_t notify_count;
    size_t notify_bytes;
    struct ferry_notify_tables *notify_tables; /* queued per sender and per address (notify.c) */

    /* Connections get serials in accept order; cancelled requests are kept
     * per served connection, this many in all (cancel.h). */
    _Atomic uint64_t next_conn_serial;
    atomic_size_t cancels_held;

    /* The RDMA transport's state (src/transport/rdma.c): probe result and
     * device context, made at first use. */
    struct ferry_rdma *rdma;
};

/* config.c */
/* Reads integer environment variable name into *out when set: 1 set, 0
 * unset, INVALID_ARGUMENT (naming it) when not an integer in [lo, hi]. */
int ferry_env_long(const char *name, long lo, long hi, long *out);
int ferry_config_copy(ferry_engine_t *e, const ferry_config_t *cfg);

/* Upper bound of config.max_connections. Each served connection costs a
 * thread; the limits (listener.c) keep peers opening connections without
 * end from exhausting threads or file descriptors. */
#define FERRY_MAX_CONNECTIONS_LIMIT 65536
/* Notifications queued and not yet fetched; more are refused (and per
 * sender and source address, ferry.h's FERRY_NOTIFY_*_MAX). */
#define FERRY_MAX_QUEUED_NOTIFY FERRY_NOTIFY_QUEUE_MAX
#define FERRY_MAX_QUEUED_NOTIFY_BYTES (256u << 20)

/* engine.c: a public call that may block on a peer enters first (CONTEXT
 * once destroy began) and leaves when done; destroy wakes the calls in
 * progress and waits until they all left before freeing anything. */
int ferry_engine_enter(ferry_engine_t *e);
/* Returns rc, except that a link failure (PEER_CLOSED, SOCKET, TIMEOUT)
 * while destroy runs, which destroy caused, becomes CONTEXT. */
int ferry_engine_leave(ferry_engine_t *e, int rc);

/* engine.c: target side */
int ferry_serve_hello(ferry_conn_t *c, const ferry_frame_t *f);
/* Runs a served connection to its end: handshake, then frames until the
 * peer leaves, misbehaves or the engine stops. Frees nothing. */
void ferry_serve_connection(ferry_conn_t *c);
void ferry_hello_fill(ferry_engine_t *e, ferry_hello_t *h);
/* The newest protocol version this engine speaks (a test may pin it:
 * ferry_test_set_protocol_version, core/testing.h), and the one both ends
 * of a handshaken connection speak: the highest in common. Vector frames
 * need FERRY_PROTOCOL_VEC. */
unsigned ferry_engine_proto_max(const ferry_engine_t *e);
unsigned ferry_conn_version(const ferry_conn_t *c);

/* frame I/O shared by both sides */
int ferry_conn_send_frame(ferry_conn_t *c, ferry_frame_t *f, const void *payload, uint64_t deadline);
int ferry_conn_recv_frame(ferry_conn_t *c, ferry_frame_t *f, uint64_t deadline);
/* The same, busy-polling up to spin_us for the header before sleeping
 * (ferry_net_recv_spin): for answers due within microseconds. */
int ferry_conn_recv_frame_spin(ferry_conn_t *c, ferry_frame_t *f, uint64_t deadline, unsigned spin_us);
/* How long the next wait on c may spin (config.spin_us, else adaptive). */
unsigned ferry_conn_spin_us(ferry_conn_t *c);
/* Reads and discards n payload bytes. */
int ferry_conn_discard(ferry_conn_t *c, uint64_t n, uint64_t deadline);
void ferry_conn_free(ferry_conn_t *c);
/* Initiator side, for an answer with status < 0: reads the target's detail
 * text that follows it and raises it as the thread's failure (its code is
 * the answer's status); reason, when not NULL, gets the text too. */
int ferry_conn_fail_from_target(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline, char *reason, size_t cap);
/* The connection's staging buffer of at least n bytes (n <= FERRY_WIRE_MAX_DATA). */
unsigned char *ferry_conn_bounce(ferry_conn_t *c, size_t n);

/* session.c: initiator side */
int ferry_session_get(ferry_engine_t *e, const char *peer, ferry_session_t **out);
void ferry_session_put(ferry_session_t *s);
int ferry_session_checkout(ferry_session_t *s, uint64_t deadline, ferry_conn_t **out);
/* As checkout; returns CANCELLED at once when *abort is set (it is cleared),
 * and ferry_session_wake makes a waiting checkout look again. */
int ferry_session_checkout_abortable(ferry_session_t *s, uint64_t deadline, atomic_bool *abort, ferry_conn_t **out);
void ferry_session_wake(ferry_session_t *s);
/* For a control exchange that must not queue behind busy connections
 * (confirming a cancel): an idle connection, else a new one even beyond
 * conns_per_peer and whatever the session's state (fresh: always a new
 * one). Check it in as usual. */
int ferry_session_checkout_spare(ferry_session_t *s, uint64_t deadline, bool fresh, ferry_conn_t **out);
/* Returns a healthy connection to the pool; broken ones (ok == false) are closed. */
void ferry_session_checkin(ferry_session_t *s, ferry_conn_t *c, bool ok);
/* Resolves [remote, remote+len) in the cached segments (refreshing once on a
 * miss): its generation, or an error naming the range. */
int ferry_session_resolve(ferry_session_t *s, int opcode, uint64_t remote, uint64_t len, uint32_t *generation,
                          uint64_t deadline);
int ferry_session_refresh_segments(ferry_session_t *s, uint64_t deadline);
/* After retries ran out on a broken link: closes every pooled connection
 * (busy ones at checkin) so that the next use connects and handshakes
 * afresh, epoch check included, and refetches the segments. */
void ferry_session_teardown(ferry_session_t *s);
void ferry_sessions_destroy(ferry_engine_t *e);
/* Destroy began (e->stopping set): shuts down every checked-out connection
 * and wakes every wait for one, so that each call blocked on a peer comes
 * out at once. */
void ferry_sessions_interrupt(ferry_engine_t *e);
/* The session table: made once config.max_sessions is known, freed with
 * the engine (ferry_sessions_destroy empties it). */
int ferry_sessions_init(ferry_engine_t *e);
void ferry_sessions_free(ferry_engine_t *e);

/* xfer.c: running pieces on one connection with retries and re-resolution */
int ferry_xfer_run(ferry_engine_t *e, ferry_session_t *s, ferry_xfer_t *xs, size_t n);
int ferry_check_local(ferry_engine_t *e, const void *local, uint64_t len);
/* Counts the outcome of each request among pieces xs (in request order). */
void ferry_stats_requests_done(ferry_engine_t *e, const ferry_xfer_t *xs, size_t n);

/* batch.c */
int ferry_workers_start(ferry_engine_t *e);
void ferry_workers_stop(ferry_engine_t *e);

/* notify.c */
/* Queues msg (taking it); TOO_MANY_REQUESTS (msg freed) when the queue is full. */
/* Queues msg (taking it) as received on the target-side connection c. */
int ferry_notify_push(ferry_conn_t *c, unsigned char *msg, size_t len);
void ferry_notify_clear(ferry_engine_t *e);

/* crc32c.c */
uint32_t ferry_crc32c(uint32_t crc, const void *buf, size_t len);

#endif
