/* Ferry: a data transfer engine for disaggregated LLM inference.
 *
 * One engine per process listens on host:port; peers are named by that
 * string. Memory is registered with the engine; a peer may read or write only
 * inside ranges the owner registered as remote-accessible, and the owner
 * validates every incoming range against its registry before touching memory.
 *
 * Completion guarantee: a write reported complete (0 from a sync call, or
 * FERRY_STATUS_COMPLETED from a batch) means the target engine acknowledged
 * that every byte was placed in its memory. A read reported complete means
 * every byte is in the caller's buffer.
 *
 * A write that failed on a broken link (PEER_CLOSED, TIMEOUT, ...) may have
 * placed some of its bytes, but none of them lands after the next request
 * to that peer started: the initiator first has the target refuse the
 * failed request's id (fencing), so late bytes never overwrite newer data.
 *
 * All calls are thread-safe. Every blocking call ends by its deadline
 * (config.timeout_ms unless stated otherwise) and returns FERRY_ERR_TIMEOUT.
 * On failure a negative code from <ferry/error.h> is returned and
 * ferry_last_error_detail() describes it.
 */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include <stddef.h>
#include <stdint.h>

#include <ferry/error.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0
#define FERRY_VERSION_STRING "0.1.0"
/* Wire protocol version spoken by this build. */
#define FERRY_PROTOCOL_VERSION 1

typedef struct ferry_engine ferry_engine_t;
typedef struct ferry_batch ferry_batch_t;

/* ---------------------------------------------------------------- config */

typedef struct ferry_config {
    const char *host;          /* listen address, default "127.0.0.1" (FERRY_HOST) */
    uint16_t port;             /* listen port, 0 picks a free one (FERRY_PORT) */
    const char *metadata;      /* "p2p" (default), "etcd://h:p", "redis://h:p" (FERRY_METADATA) */
    const char *transport;     /* "auto" (default), "tcp", "shm" (FERRY_TRANSPORT) */
    int timeout_ms;            /* default per-request deadline, 30000 (FERRY_TIMEOUT_MS) */
    int connect_timeout_ms;    /* connect + handshake deadline, 5000 (FERRY_CONNECT_TIMEOUT_MS) */
    int conns_per_peer;        /* TCP connections per peer for striping, 2 (FERRY_CONNS_PER_PEER) */
    int workers;               /* async batch worker threads, 2 (FERRY_WORKERS) */
    size_t slice_size;         /* bytes per wire slice, 1 MiB (FERRY_SLICE_SIZE) */
    int retries;               /* automatic retries of PEER_CLOSED, SOCKET and CHECKSUM_MISMATCH on a
                                  fresh connection, 1 (FERRY_RETRIES); when they run out on a broken
                                  link, the session's connections are torn down and the next use
                                  handshakes afresh */
    int retry_backoff_ms;      /* first backoff, doubled each retry, 10 (FERRY_RETRY_BACKOFF_MS) */
    int checksum;              /* 1: CRC32C per slice, verified before placement (FERRY_CHECKSUM) */
    int keepalive_ms;          /* TCP keepalive idle time, 0 disables, 5000 (FERRY_KEEPALIVE_MS);
                                  also bounds unacknowledged sends (TCP_USER_TIMEOUT, 4x) */
    const char *secret;        /* shared secret, NULL = none (FERRY_SECRET): an engine with one talks
                                  only to engines proving the same one (mutual HMAC-SHA256 at each
                                  connection's handshake), one without only to engines without;
                                  else AUTH_FAILED. Authenticates, does not encrypt. */
    int log_level;             /* 0 error .. 4 trace, default 1 warn (FERRY_LOG) */
    int max_sessions;          /* cap on cached sessions, 4096 */
    /* Testing only: advertise this protocol version instead of ours (0 = ours). */
    int test_protocol_version;
} ferry_config_t;

/* Fills *cfg with defaults. */
void ferry_config_init(ferry_config_t *cfg);
/* Overrides fields of *cfg from the FERRY_* environment variables above.
 * Strings point into the environment. Returns 0 or INVALID_ARGUMENT naming
 * the bad variable. */
int ferry_config_from_env(ferry_config_t *cfg);

/* ---------------------------------------------------------------- engine */

/* Creates an engine listening on cfg->host:cfg->port (cfg NULL: defaults
 * plus environment). Returns 0 and *out, or a negative code. */
int ferry_engine_create(const ferry_config_t *cfg, ferry_engine_t **out);
/* Closes every session and connection, waits for threads, frees. Requests
 * still in flight fail with CONTEXT. NULL is ignored. */
void ferry_engine_destroy(ferry_engine_t *e);
/* The port actually listened on. */
uint16_t ferry_engine_port(const ferry_engine_t *e);
/* "host:port", the name peers use for this engine. */
const char *ferry_engine_name(const ferry_engine_t *e);
/* This boot's epoch: random, fixed for the engine's life. */
uint64_t ferry_engine_epoch(const ferry_engine_t *e);

/* ------------------------------------------------------------------ stats */

/* Room for every error code in the table (it has fewer). */
#define FERRY_STATS_MAX_CODES 64

typedef struct ferry_stats_code {
    int32_t code;         /* a FERRY_ERR_* value (never 0) */
    uint64_t failures;    /* requests and session opens that ended with it */
    uint64_t retries;     /* automatic retries it caused */
} ferry_stats_code_t;

/* Counters since the engine was created; every one only grows. Initiator
 * counters describe this engine's own requests; target counters what peers
 * did to it. A plain struct, for export (e.g. as Prometheus counters). */
typedef struct ferry_stats {
    /* initiator side */
    uint64_t requests;            /* transfer requests accepted (sync and async) */
    uint64_t requests_completed;
    uint64_t requests_failed;     /* by code in codes[] */
    uint64_t bytes_written;       /* bytes peers confirmed placed */
    uint64_t bytes_read;          /* bytes received from peers */
    uint64_t retries;             /* automatic retries of retryable failures */
    uint64_t connections_opened;  /* connections that completed the handshake */
    uint64_t reconnects;          /* ... of them, opened to replace a broken one */
    uint64_t session_teardowns;   /* connection pools dropped after retries ran out */
    uint64_t peer_restarts;       /* peers found with a new epoch */
    uint64_t checksum_failures;   /* CRC32C mismatches detected, either side */
    /* target side */
    uint64_t connections_accepted;
    uint64_t connections_refused; /* over the connection cap, or handshake refused */
    uint64_t auth_failures;       /* shared-secret authentications failed, either side */
    uint64_t frames_rejected;     /* connections dropped for a malformed frame */
    uint64_t bytes_placed;        /* bytes peers wrote into this engine's memory */
    uint64_t bytes_served;        /* bytes peers read from it */
    /* per code: codes[0..ncodes), in the order of the error table */
    size_t ncodes;
    ferry_stats_code_t codes[FERRY_STATS_MAX_CODES];
} ferry_stats_t;

/* Copies the engine's counters into *out. 0, or INVALID_ARGUMENT. */
int ferry_engine_stats(ferry_engine_t *e, ferry_stats_t *out);

/* ----------------------------------------------------------- registration */

#define FERRY_MEM_LOCAL 0u        /* usable as a local source/destination only */
#define FERRY_MEM_REMOTE_READ 1u  /* peers may read it */
#define FERRY_MEM_REMOTE_WRITE 2u /* peers may write it */
#define FERRY_MEM_REMOTE (FERRY_MEM_REMOTE_READ | FERRY_MEM_REMOTE_WRITE)

/* Registers [addr, addr+len). Overlap with a registered region gives
 * ADDRESS_OVERLAPPED. Peers see the change at their next segment refresh. */
int ferry_register(ferry_engine_t *e, void *addr, size_t len, unsigned flags);
/* Deregisters the region that starts at addr; unknown addr gives
 * ADDRESS_NOT_REGISTERED. After it returns, no peer write lands in it. */
int ferry_deregister(ferry_engine_t *e, void *addr);
/* All or nothing: on failure none of the n regions stays registered. */
int ferry_register_batch(ferry_engine_t *e, void *const *addrs, const size_t *lens,
                         size_t n, unsigned flags);
/* Deregisters each; returns the first failure but processes all. */
int ferry_deregister_batch(ferry_engine_t *e, void *const *addrs, size_t n);
/* Number of registered regions. */
size_t ferry_region_count(ferry_engine_t *e);

/* --------------------------------------------------------------- sessions */

typedef struct ferry_segment {
    uint64_t addr;
    uint64_t len;
    uint32_t flags;      /* FERRY_MEM_* */
    uint32_t generation; /* changes when a region is registered again */
} ferry_segment_t;

typedef struct ferry_peer_info {
    char name[256];         /* as opened */
    uint32_t protocol_version;
    uint64_t engine_id;
    uint64_t epoch;
    uint64_t segment_version; /* bumps on every (de)registration at the peer */
    size_t segment_count;     /* remote-accessible regions */
    char transport[16];       /* "tcp" or "shm" */
    char transport_reason[128];
    int32_t pid;
    int same_host;
} ferry_peer_info_t;

/* Opens (or returns the cached) session to peer "host:port": connects,
 * handshakes (versions, engine id, epoch, segments). Idempotent. */
int ferry_session_open(ferry_engine_t *e, const char *peer);
/* Drops the cached session; the next use or open handshakes afresh. */
int ferry_session_close(ferry_engine_t *e, const char *peer);
/* Describes an open session. */
int ferry_session_info(ferry_engine_t *e, const char *peer, ferry_peer_info_t *info);
/* Copies up to max of the peer's remote-accessible segments (ascending addr);
 * returns how many exist, or a negative code. Refreshes from the peer first. */
long ferry_session_segments(ferry_engine_t *e, const char *peer, ferry_segment_t *out,
                            size_t max);

/* -------------------------------------------------------------- transfers */

enum ferry_opcode { FERRY_OP_READ = 0, FERRY_OP_WRITE = 1 };

/* One contiguous request: local [local, local+len) <-> peer [remote, +len). */
typedef struct ferry_request {
    int opcode;      /* FERRY_OP_READ or FERRY_OP_WRITE */
    void *local;
    uint64_t remote; /* address in the peer's address space */
    size_t len;
} ferry_request_t;

/* Moves len bytes; 0 when complete (see the completion guarantee above). */
int ferry_transfer_sync(ferry_engine_t *e, const char *peer, int opcode, void *local,
                        uint64_t remote, size_t len);
/* n requests of one opcode, all complete or the first failure returned. */
int ferry_batch_transfer_sync(ferry_engine_t *e, const char *peer, int opcode,
                              void *const *locals, const uint64_t *remotes,
                              const size_t *lens, size_t n);

/* ------------------------------------------------------------ async batch */

enum ferry_status_state {
    FERRY_STATUS_WAITING = 0,   /* submitted, not started */
    FERRY_STATUS_PENDING = 1,   /* on the wire */
    FERRY_STATUS_COMPLETED = 2,
    FERRY_STATUS_FAILED = 3,    /* code says why */
    FERRY_STATUS_CANCELLED = 4,
    FERRY_STATUS_TIMEOUT = 5
};

typedef struct ferry_status {
    int state;          /* enum ferry_status_state */
    int code;           /* 0 or the failure code */
    uint64_t bytes;     /* bytes confirmed so far */
} ferry_status_t;

/* A batch holds up to capacity requests over its life (until freed). */
int ferry_batch_alloc(ferry_engine_t *e, size_t capacity, ferry_batch_t **out);
/* Submits n requests to peer; they start at once on the worker threads.
 * timeout_ms <= 0 uses config.timeout_ms. Returns the index of the first
 * request (requests are numbered in submission order) or a negative code. */
long ferry_batch_submit(ferry_batch_t *b, const char *peer, const ferry_request_t *reqs,
                        size_t n, int timeout_ms);
/* Status of request idx. */
int ferry_batch_status(ferry_batch_t *b, size_t idx, ferry_status_t *st);
/* Waits without spinning until every submitted request ended or timeout_ms
 * passed (-1 forever). 0: all completed; first failure code; or TIMEOUT. */
int ferry_batch_wait(ferry_batch_t *b, int timeout_ms);
/* Cancels every unfinished request. When it returns 0, no byte of a
 * cancelled request can still land in the target's memory. */
int ferry_batch_cancel(ferry_batch_t *b);
/* Frees; BATCH_BUSY while requests are in flight (cancel or wait first). */
int ferry_batch_free(ferry_batch_t *b);

/* ---------------------------------------------------------- notifications */

/* Sends a small message (<= 64 KiB) to the peer's notification queue; it is
 * delivered after every write this thread issued to that peer before it. */
int ferry_notify(ferry_engine_t *e, const char *peer, const void *msg, size_t len);

typedef struct ferry_notification {
    char peer[256];    /* sender's engine name */
    size_t len;
    unsigned char *msg; /* owned; freed by ferry_notifications_free */
} ferry_notification_t;

/* Moves up to max queued notifications into out; returns how many. */
long ferry_get_notifications(ferry_engine_t *e, ferry_notification_t *out, size_t max);
void ferry_notifications_free(ferry_notification_t *n, size_t count);

#ifdef __cplusplus
}
#endif
#endif
