/* SPDX-License-Identifier: Apache-2.0 */
/* Ferry: a data transfer engine for disaggregated LLM inference.
 *
 * One engine per process listens on host:port; peers are named by that
 * string. Memory is registered with the engine; a peer may read or write only
 * inside ranges the owner registered as remote-accessible, and the owner
 * validates every incoming range against its registry before touching memory.
 *
 * Completion guarantee: a write reported complete (0 from a sync call, or
 * FERRY_STATUS_COMPLETED from a batch) means the target engine acknowledged
 * that every byte was placed in its memory: a reader there sees them as soon
 * as the call returns. There is no local-only completion. A read reported
 * complete means every byte is in the caller's buffer.
 *
 * No late write: once a request is reported failed, timed out or cancelled
 * (any code but CANCEL_UNCONFIRMED), no byte of it can still land in the
 * target's memory, nor, for a read, in the caller's buffer; both sides' pages
 * may be freed or reused at once. When a request stops with bytes on the
 * wire (deadline, cancel, broken connection), the initiator has the target
 * refuse the rest and waits for its confirmation (config.cancel_timeout_ms)
 * before reporting; a retry after a broken connection does the same first.
 * If the target cannot confirm, the code is CANCEL_UNCONFIRMED: do not reuse
 * the target pages until the peer is known dead or restarted.
 *
 * Waiting: every completion wait ends blocked on an event (condition
 * variable or poll). By default a connection's waits first busy-poll
 * briefly (yielding the CPU at each turn) when its recent waits were short:
 * at most 100 us, twice their median, none when they were long or on a
 * single CPU (config.spin_us). A shared-memory answer to a copy the
 * target makes on one thread, when such waits were long and regular, is
 * awaited by a timed sleep through most of the wait and a spin over its
 * end (at most 100 us). An idle engine never spins and uses no CPU beyond
 * one wake-up a second.
 *
 * All calls are thread-safe, except where a call says it must not race
 * (destroy and free against use of the same object). Every blocking call
 * ends by its deadline (config.timeout_ms unless stated otherwise) and
 * returns FERRY_ERR_TIMEOUT; a transfer that had bytes in flight at its
 * deadline reports at most config.cancel_timeout_ms later (the
 * confirmation above).
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
/* MAJOR * 10000 + MINOR * 100 + PATCH, for #if comparisons. */
#define FERRY_VERSION_NUMBER \
    (FERRY_VERSION_MAJOR * 10000 + FERRY_VERSION_MINOR * 100 + FERRY_VERSION_PATCH)
/* Wire protocol version spoken by this build (the newest; it also speaks
 * every version down to 1 with peers that are older). 2: vector frames;
 * 3: compact (strided) vector frames, RDMA group commits. */
#define FERRY_PROTOCOL_VERSION 3

/* The version of the library loaded at run time, "MAJOR.MINOR.PATCH", which
 * may be newer than the FERRY_VERSION_* this program was compiled with
 * (docs/ABI.md says which differences are compatible). */
FERRY_API const char *ferry_version(void);
/* The same as FERRY_VERSION_NUMBER computes it. */
FERRY_API unsigned ferry_version_number(void);

/* ------------------------------------------------------------- log handler
 *
 * Library messages (the FERRY_LOG / config.log_level levels: 0 error,
 * 1 warn, 2 info, 3 debug, 4 trace) go to stderr as one line each, or to a
 * handler the application sets, e.g. to reach its own logging (the Python
 * binding routes them to `logging`, logger "ferry"). The level filter
 * applies first: the handler sees only messages at or below the level.
 * `component` names the part of the library ("tcp", "shm", "meta", ...);
 * `message` has no trailing newline; both are valid during the call only.
 * The handler may be called from any of the library's threads, several at a
 * time; it must not call ferry_log_set_handler. ferry_log_set_handler(NULL,
 * NULL) restores stderr. Thread-safe: once it returns, no thread is still in,
 * or will enter, the previous handler, so its ctx may be freed. Returns 0. */
#define FERRY_LOG_LEVEL_ERROR 0
#define FERRY_LOG_LEVEL_WARN 1
#define FERRY_LOG_LEVEL_INFO 2
#define FERRY_LOG_LEVEL_DEBUG 3
#define FERRY_LOG_LEVEL_TRACE 4
typedef void (*ferry_log_handler_t)(int level, const char *component, const char *message, void *ctx);
FERRY_API int ferry_log_set_handler(ferry_log_handler_t handler, void *ctx);

typedef struct ferry_engine ferry_engine_t;
typedef struct ferry_batch ferry_batch_t;

/* ---------------------------------------------------------- sized structs
 *
 * Structs that may grow in later versions begin with `size_t struct_size`:
 * sizeof the struct as the caller was compiled. The library reads and writes
 * only the fields that size covers, so a program built against an older
 * header keeps working with a newer library, and fields are only ever added
 * at the end, 0 meaning "the default" (docs/ABI.md). C and C++ callers need
 * not set it: each function taking such a struct is wrapped below by a
 * macro of the same name that sets struct_size first. Callers from other
 * languages (ctypes, FFI) set it themselves before each call. */
static inline void *ferry_sized_(void *s, size_t size)
{
    if (s) *(size_t *)s = size;
    return s;
}
#define FERRY_SIZED_(type, s) ((type *)ferry_sized_((s), sizeof(type)))

/* ---------------------------------------------------------------- config */

typedef struct ferry_config {
    size_t struct_size;        /* sizeof(ferry_config_t), set by ferry_config_init */
    const char *host;          /* listen address, default "127.0.0.1" (FERRY_HOST) */
    uint16_t port;             /* listen port, 0 picks a free one (FERRY_PORT) */
    const char *metadata;      /* "p2p" (default), "etcd://h:p", "redis://h:p",
                                  "http://h:p/metadata" (FERRY_METADATA) */
    const char *transport;     /* "auto" (default), "tcp", "shm", "rdma" (FERRY_TRANSPORT) */
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
    int metadata_ttl_s;        /* lease of this engine's metadata entry, 10 (FERRY_METADATA_TTL_S) */
    int metrics_port;          /* Prometheus endpoint on host:port, 0 off, -1 any free port (FERRY_METRICS_PORT) */
    /* How long a cancel, an expiry or a broken connection may wait for the
     * target to confirm that no more byte of the request can land, 1000
     * (FERRY_CANCEL_TIMEOUT_MS); past it the request fails CANCEL_UNCONFIRMED. */
    int cancel_timeout_ms;
    /* Waits for an answer (and a target's wait for the next request) first
     * poll without sleeping, then block on an event. 0 (default): adaptive,
     * per connection: twice the median of its last 8 waits, at most 100 us,
     * none when that median is above 100 us or the process has one CPU
     * (so an idle engine never spins); ferry_batch_wait and a call's wait
     * for its other connections' pieces spin likewise, learnt from the
     * engine's recent such waits, where a CPU is to spare besides the
     * threads they wait for; the wait for an shm answer to small pieces
     * the target copies on one thread, when such waits were long (over
     * 100 us, up to 5 ms) and regular, sleeps through most of it and spins
     * over its end (at most 100 us). N > 0: always N us (those waits too).
     * -1: never spin, every wait blocks.
     * (FERRY_SPIN_US, -1 to 1000000.) */
    int spin_us;
    /* Served connections that completed the handshake, 2048
     * (FERRY_MAX_CONNECTIONS). When full, a peer finishing its handshake
     * takes the place of the connection idle the longest; one with a request
     * in flight is never closed. Connections still in their handshake have
     * a separate budget of max(8, max_connections / 16), oldest dropped
     * first, so silent connections cannot crowd out working ones. */
    int max_connections;
    /* Connections from one source address at once, 0 (default) = a quarter
     * of max_connections (FERRY_MAX_CONNECTIONS_PER_SOURCE). */
    int max_connections_per_source;
    /* Address the metrics endpoint listens on, NULL = host
     * (FERRY_METRICS_HOST); "0.0.0.0" serves every interface. */
    const char *metrics_host;
} ferry_config_t;

/* Fills *cfg with defaults (the macro sets cfg->struct_size first). */
FERRY_API void ferry_config_init(ferry_config_t *cfg);
#define ferry_config_init(cfg) (ferry_config_init)(FERRY_SIZED_(ferry_config_t, cfg))
/* Overrides fields of *cfg from the FERRY_* environment variables above.
 * Strings point into the environment. Returns 0 or INVALID_ARGUMENT naming
 * the bad variable. */
FERRY_API int ferry_config_from_env(ferry_config_t *cfg);
#define ferry_config_from_env(cfg) (ferry_config_from_env)(FERRY_SIZED_(ferry_config_t, cfg))

/* ---------------------------------------------------------------- engine */

/* Creates an engine listening on cfg->host:cfg->port (cfg NULL: defaults
 * plus environment). Returns 0 and *out, or a negative code. */
FERRY_API int ferry_engine_create(const ferry_config_t *cfg, ferry_engine_t **out);
/* Closes every session and connection, waits for threads, frees. Calls
 * blocked in other threads are woken at once and fail with CONTEXT (or
 * CANCEL_UNCONFIRMED when bytes were on the wire and the target could not
 * confirm within config.cancel_timeout_ms); destroy returns after they all
 * returned. Calls that start once destroy began fail with CONTEXT while it
 * runs; using the engine after it returned is undefined.
 * NULL is ignored. */
FERRY_API void ferry_engine_destroy(ferry_engine_t *e);
/* The port actually listened on. */
FERRY_API uint16_t ferry_engine_port(const ferry_engine_t *e);
/* "host:port", the name peers use for this engine. */
FERRY_API const char *ferry_engine_name(const ferry_engine_t *e);
/* This boot's epoch: random, fixed for the engine's life. */
FERRY_API uint64_t ferry_engine_epoch(const ferry_engine_t *e);

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
    size_t struct_size;           /* sizeof(ferry_stats_t), set by the ferry_engine_stats macro */
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
    uint64_t connections_refused; /* over a connection limit, or handshake refused */
    uint64_t auth_failures;       /* shared-secret authentications failed, either side */
    uint64_t frames_rejected;     /* connections dropped for a malformed frame */
    uint64_t bytes_placed;        /* bytes peers wrote into this engine's memory */
    uint64_t bytes_served;        /* bytes peers read from it */
    uint64_t connections_evicted; /* idle connections closed to make room (config.max_connections) */
    uint64_t handshakes_evicted;  /* connections closed still in their handshake, to make room */
    uint64_t accept_backoffs;     /* times accept() found no file descriptor left and the listener paused */
    /* per code: codes[0..ncodes), in the order of the error table */
    size_t ncodes;
    ferry_stats_code_t codes[FERRY_STATS_MAX_CODES];
    /* metadata service (etcd, Redis; all 0 with p2p). Peer entries are
     * cached for metadata_ttl_s; a peer found restarted, or not answering
     * at its cached address, is looked up afresh. */
    uint64_t metadata_lookups;       /* peer lookups by new sessions */
    uint64_t metadata_cache_hits;    /* ... answered from the cache */
    uint64_t metadata_fetches;       /* requests to the service (misses, expired or invalidated entries) */
    uint64_t metadata_stale_served;  /* expired entries used because the service did not answer */
    uint64_t metadata_invalidations; /* entries dropped: peer restarted, or its cached address refused */
    uint64_t metadata_lease_refreshes; /* this engine's lease extended (every metadata_ttl_s / 3) */
    uint64_t metadata_republishes;   /* its entry published again: lost (service restarted) or lease expired */
    /* notifications (ferry_notify) */
    uint64_t notifies_dropped;       /* peers' notifications dropped here: the sender's backlog share was full */
    uint64_t notifies_unsent;        /* this engine's ferry_notify calls that failed (dropped by the peer, ...) */
} ferry_stats_t;

/* Copies the engine's counters into *out. 0, or INVALID_ARGUMENT. */
FERRY_API int ferry_engine_stats(ferry_engine_t *e, ferry_stats_t *out);
#define ferry_engine_stats(e, out) (ferry_engine_stats)((e), FERRY_SIZED_(ferry_stats_t, out))

/* ----------------------------------------------------------- registration */

#define FERRY_MEM_LOCAL 0u        /* usable as a local source/destination only */
#define FERRY_MEM_REMOTE_READ 1u  /* peers may read it */
#define FERRY_MEM_REMOTE_WRITE 2u /* peers may write it */
#define FERRY_MEM_REMOTE (FERRY_MEM_REMOTE_READ | FERRY_MEM_REMOTE_WRITE)

/* Registers [addr, addr+len). Overlap with a registered region gives
 * ADDRESS_OVERLAPPED. Peers see the change at their next segment refresh. */
FERRY_API int ferry_register(ferry_engine_t *e, void *addr, size_t len, unsigned flags);
/* Deregisters the region that starts at addr; unknown addr gives
 * ADDRESS_NOT_REGISTERED. After it returns, no peer write lands in it. */
FERRY_API int ferry_deregister(ferry_engine_t *e, void *addr);
/* All or nothing: on failure none of the n regions stays registered. */
FERRY_API int ferry_register_batch(ferry_engine_t *e, void *const *addrs, const size_t *lens,
                         size_t n, unsigned flags);
/* Deregisters each; returns the first failure but processes all. */
FERRY_API int ferry_deregister_batch(ferry_engine_t *e, void *const *addrs, size_t n);
/* Number of registered regions. */
FERRY_API size_t ferry_region_count(ferry_engine_t *e);

/* A registered region, as ferry_region_query reports it. */
typedef struct ferry_region_info {
    size_t struct_size;  /* sizeof(ferry_region_info_t), set by the ferry_region_query macro */
    uint64_t addr, len;  /* the whole region */
    unsigned flags;      /* FERRY_MEM_* it was registered with */
    int device;          /* -1: host memory; else the device ordinal (CUDA) */
    char kind[24];       /* "host", "cuda:0", ... */
} ferry_region_info_t;

/* The region registered with e that holds all of [addr, addr+len) (len 0:
 * the byte at addr): 0 and *out, or ADDRESS_NOT_REGISTERED / OUT_OF_BOUNDS
 * with the range named. Touches no memory. */
FERRY_API int ferry_region_query(ferry_engine_t *e, const void *addr, size_t len, ferry_region_info_t *out);
#define ferry_region_query(e, addr, len, out) (ferry_region_query)((e), (addr), (len), FERRY_SIZED_(ferry_region_info_t, out))
/* Copies len bytes from host memory src into dst, or from src into host
 * memory dst, where dst (resp. src) must lie in memory registered with e, of
 * any kind (device memory is copied by its own API). Checked first:
 * ADDRESS_NOT_REGISTERED / OUT_OF_BOUNDS, nothing touched. Deregistration
 * waits for a copy under way. len 0: 0, nothing checked nor touched. */
FERRY_API int ferry_region_write(ferry_engine_t *e, void *dst, const void *src, size_t len);
FERRY_API int ferry_region_read(ferry_engine_t *e, void *dst, const void *src, size_t len);
/* 1 when this build and process tell device (CUDA) memory from host memory
 * at registration, else 0; *why (if why is not NULL) says which and why.
 * The CUDA driver is used only once the process has loaded it (Ferry never
 * loads nor initializes CUDA), so 0 may turn 1 after the application starts
 * using CUDA. */
FERRY_API int ferry_device_memory_supported(const char **why);

/* --------------------------------------------------------------- sessions */

typedef struct ferry_segment {
    uint64_t addr;
    uint64_t len;
    uint32_t flags;      /* FERRY_MEM_* */
    uint32_t generation; /* changes when a region is registered again */
} ferry_segment_t;

typedef struct ferry_peer_info {
    size_t struct_size;     /* sizeof(ferry_peer_info_t), set by the ferry_session_info macro */
    char name[256];         /* as opened */
    uint32_t protocol_version; /* the version both ends speak (the highest in common) */
    uint64_t engine_id;
    uint64_t epoch;
    uint64_t segment_version; /* bumps on every (de)registration at the peer */
    size_t segment_count;     /* remote-accessible regions */
    char transport[16];       /* "tcp", "shm" or "rdma" */
    char transport_reason[128];
    int32_t pid;
    int same_host;
} ferry_peer_info_t;

/* Peer names and restarts. A peer is named "host:port", or pinned to one
 * boot of it: "host:port#<epoch>", the epoch in hex without 0x (16 digits
 * as ferry_session_pin writes it; 1 to 16 accepted), e.g.
 * "127.0.0.1:7000#1a2b3c4d5e6f7081". Every call that takes a peer name
 * takes either; both name the one session of host:port. A malformed pin
 * (empty, not hex, over 16 digits) is INVALID_ARGUMENT.
 *
 * Pinned: a call whose pinned epoch is not the peer's current one fails
 * with PEER_RESTARTED, naming both epochs, before any byte leaves, every
 * time. Every connection its bytes travel on (one re-opened mid-call
 * included) was handshaken with the pinned epoch, and an async batch is
 * checked again when it runs, not only at submit. Pin the addresses you
 * learn: call ferry_session_pin (or build the name from
 * ferry_peer_info_t.epoch) before fetching them, or take the pinned name
 * from the peer that hands them out (its name and ferry_engine_epoch).
 *
 * Unpinned: the call that meets the new epoch (and any other call in
 * flight on the old session) fails with PEER_RESTARTED and sends nothing;
 * after it, calls re-open the session by themselves and go to the new
 * process: a later call that still carries the old process's addresses is
 * placed in the new process's memory if that process registered them
 * there, and refused (ADDRESS_NOT_REGISTERED, ...) only if it did not. */

/* Opens (or returns the cached) session to peer "host:port": connects,
 * handshakes (versions, engine id, epoch, segments). Idempotent. */
FERRY_API int ferry_session_open(ferry_engine_t *e, const char *peer);
/* Opens the session if needed and writes the pinned name of the peer's
 * epoch as the session knows it (that of its first handshake; no round
 * trip when the session is open) into out: "host:port#%016llx", NUL
 * included (FERRY_PINNED_NAME_MAX bytes always suffice). INVALID_ARGUMENT
 * when out is NULL or cap is too small (the detail says the size); a
 * pinned peer must be of the current epoch (else PEER_RESTARTED). */
#define FERRY_PINNED_NAME_MAX 274 /* a 255-byte host:port, '#', 16 digits, NUL */
FERRY_API int ferry_session_pin(ferry_engine_t *e, const char *peer, char *out, size_t cap);
/* Drops the cached session; the next use or open handshakes afresh.
 * Requests other threads have in flight on it then fail with
 * SESSION_INVALID once they need a new connection (retry them; the retry
 * opens a new session). */
FERRY_API int ferry_session_close(ferry_engine_t *e, const char *peer);
/* Describes an open session. */
FERRY_API int ferry_session_info(ferry_engine_t *e, const char *peer, ferry_peer_info_t *info);
#define ferry_session_info(e, peer, info) (ferry_session_info)((e), (peer), FERRY_SIZED_(ferry_peer_info_t, info))
/* Round trip of a small control frame to the peer, in microseconds. */
FERRY_API int ferry_session_ping(ferry_engine_t *e, const char *peer, uint64_t *rtt_us);
/* Copies up to max of the peer's remote-accessible segments (ascending addr);
 * returns how many exist, or a negative code. Refreshes from the peer first. */
FERRY_API long ferry_session_segments(ferry_engine_t *e, const char *peer, ferry_segment_t *out,
                            size_t max);

/* -------------------------------------------------------------- transfers */

enum ferry_opcode { FERRY_OP_READ = 0, FERRY_OP_WRITE = 1 };

/* One contiguous request: local [local, local+len) <-> peer [remote, +len).
 * len 0 is refused (INVALID_ARGUMENT): in C it is usually a bug. The Python
 * binding's Mooncake API completes zero-length requests without a call, as
 * Mooncake does. */
typedef struct ferry_request {
    int opcode;      /* FERRY_OP_READ or FERRY_OP_WRITE */
    void *local;
    uint64_t remote; /* address in the peer's address space */
    size_t len;
} ferry_request_t;

/* Moves len bytes; 0 when complete (see the completion guarantee above). */
FERRY_API int ferry_transfer_sync(ferry_engine_t *e, const char *peer, int opcode, void *local,
                        uint64_t remote, size_t len);
/* n requests of one opcode, all complete or the first failure returned. */
FERRY_API int ferry_batch_transfer_sync(ferry_engine_t *e, const char *peer, int opcode,
                              void *const *locals, const uint64_t *remotes,
                              const size_t *lens, size_t n);

/* ------------------------------------------------------- strided batches
 *
 * The common paged-KV shape in one descriptor instead of n requests: n
 * pieces of piece_len bytes, piece i moving
 *     local_base  + local_idx[i]  * local_stride   (local_idx NULL: i)
 * to or from
 *     remote_base + remote_idx[i] * remote_stride  (remote_idx NULL: i).
 * Bounds are checked once per descriptor, before any byte moves, from the
 * largest and smallest index: an address that overflows 64 bits is
 * INVALID_ARGUMENT; when the local span lies in one registered region, and
 * the remote span in one of the peer's segments, no piece is looked up on
 * its own (else once per run of pieces in one region). A piece outside
 * fails the whole descriptor (ADDRESS_NOT_REGISTERED, OUT_OF_BOUNDS or
 * ACCESS_DENIED, the detail naming its number, index and address). With a peer speaking protocol 3
 * the pieces travel as such (base, stride, length, indices) and the target
 * expands them after its own bounds check; older peers get them as pieces.
 * The initiator expands the pieces a window at a time (a few thousand per
 * connection in use), so the memory a call holds does not grow with n;
 * ferry_batch_submit_strided copies the index lists (8 bytes an index), so
 * the caller may free them once it returns. */
typedef struct ferry_strided {
    size_t struct_size;          /* sizeof(ferry_strided_t), set by the macros below */
    int opcode;                  /* FERRY_OP_READ or FERRY_OP_WRITE */
    void *local_base;
    uint64_t local_stride;       /* bytes between local pieces of consecutive index */
    uint64_t remote_base;        /* address in the peer's address space */
    uint64_t remote_stride;
    size_t piece_len;            /* bytes of every piece, > 0 */
    const uint64_t *local_idx;   /* n indices, or NULL for 0..n-1 */
    const uint64_t *remote_idx;  /* n indices, or NULL for 0..n-1 */
    size_t n;                    /* pieces; 0 moves nothing */
} ferry_strided_t;

/* Moves the n pieces of *d; 0 when all completed, else the first failure
 * (its detail names the piece). */
FERRY_API int ferry_strided_transfer_sync(ferry_engine_t *e, const char *peer, const ferry_strided_t *d);
#define ferry_strided_transfer_sync(e, peer, d) \
    (ferry_strided_transfer_sync)((e), (peer), FERRY_SIZED_(ferry_strided_t, (d)))

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

/* A batch holds up to capacity requests over its life (until freed). Threads
 * may share a batch: concurrent submits take distinct slots. */
FERRY_API int ferry_batch_alloc(ferry_engine_t *e, size_t capacity, ferry_batch_t **out);
/* Submits n requests to peer; they start at once on the worker threads.
 * timeout_ms is the deadline of each of these requests (<= 0: config.
 * timeout_ms); one that has not completed by then ends FERRY_STATUS_TIMEOUT,
 * with the no-late-write guarantee. Submit separately for separate
 * deadlines. Returns the index of the first request (requests are numbered
 * in submission order) or a negative code. */
FERRY_API long ferry_batch_submit(ferry_batch_t *b, const char *peer, const ferry_request_t *reqs,
                        size_t n, int timeout_ms);
/* Submits the n pieces of *d as n requests of b (piece i is request
 * first + i, with its own status; cancel and deadlines as for
 * ferry_batch_submit). Returns first, or a negative code (nothing
 * submitted). */
FERRY_API long ferry_batch_submit_strided(ferry_batch_t *b, const char *peer, const ferry_strided_t *d,
                                          int timeout_ms);
#define ferry_batch_submit_strided(b, peer, d, timeout_ms) \
    (ferry_batch_submit_strided)((b), (peer), FERRY_SIZED_(ferry_strided_t, (d)), (timeout_ms))
/* Status of request idx. */
FERRY_API int ferry_batch_status(ferry_batch_t *b, size_t idx, ferry_status_t *st);
/* Waits on a condition variable (after a short spin: config.spin_us, or by
 * default adaptive, as for answers, learnt from the engine's recent waits)
 * until every submitted request ended or timeout_ms passed (-1 forever).
 * 0: all completed; first failure code; or TIMEOUT (of this wait: the
 * requests go on). */
FERRY_API int ferry_batch_wait(ferry_batch_t *b, int timeout_ms);
/* Cancels every unfinished request and waits until they ended: the running
 * ones are interrupted at once, wherever they are blocked, and the target
 * confirms it refuses the rest of them. Requests that completed first stay
 * COMPLETED; the others end FERRY_STATUS_CANCELLED. Returns 0, after which
 * no byte of a cancelled request can still land in the target's memory or
 * in a read's buffer, so the pages may be freed or reused; or
 * CANCEL_UNCONFIRMED when the target could not confirm within
 * config.cancel_timeout_ms. */
FERRY_API int ferry_batch_cancel(ferry_batch_t *b);
/* The same for request idx alone (NOT_FOUND if not submitted); the batch's
 * other requests go on (those sharing its connection resume on another). */
FERRY_API int ferry_batch_cancel_request(ferry_batch_t *b, size_t idx);
/* Frees; BATCH_BUSY while requests are in flight (cancel or wait first).
 * Must not race with other calls on b; freeing twice is misuse (refused
 * with INVALID_ARGUMENT unless the memory was reused by a new batch). */
FERRY_API int ferry_batch_free(ferry_batch_t *b);

/* ---------------------------------------------------------- notifications */

/* Sends a small message (<= 64 KiB) to the peer's notification queue; it is
 * delivered after every write this thread issued to that peer before it.
 * TOO_MANY_REQUESTS when the receiver dropped it because it holds its
 * whole backlog of unread ones from this sender or its address (see
 * below). A failed notify is counted here in notifies_unsent. The writes
 * before it are not affected: a caller that sends a notify after a placed
 * write reports the write's outcome and the notify's apart.
 * Exactly once, never late (toward peers of this version): 0 means the
 * notification was queued at the receiver exactly once, even when its
 * answer was lost (the sender then asks the receiver, through the cancel
 * fence, whether it was queued, and resends only if it was not) or a relay
 * duplicated it. A failure (TIMEOUT, PEER_CLOSED, ...) means it was not
 * queued and never will be: it carries its deadline and the receiver
 * refuses it once that passed or once the sender fenced it. The one
 * exception is CANCEL_UNCONFIRMED: the receiver could not confirm within
 * config.cancel_timeout_ms, so it may still arrive (at most once). Toward an
 * older receiver a notification whose answer was lost is not resent: it
 * fails with the link's code and may or may not have been queued. */
FERRY_API int ferry_notify(ferry_engine_t *e, const char *peer, const void *msg, size_t len);
/* The same, ending by timeout_ms (<= 0: config.timeout_ms) with TIMEOUT:
 * for a notice to a peer that may not answer (one whose transfer just
 * timed out), which must not hold the caller a whole default deadline. */
FERRY_API int ferry_notify_timeout(ferry_engine_t *e, const char *peer, const void *msg, size_t len,
                                   int timeout_ms);

/* Who sent a notification. ferry_notification_t's peer is the name the
 * sender gave in its handshake: with a shared secret (config.secret) only
 * holders of the secret get a connection at all, and it is the name a
 * holder gave itself (authenticated = 1 below): trust it as far as you
 * trust the holders. Without a secret anyone able to connect can claim any
 * name, "prefill" included: identify the sender by what this engine
 * observed, the connection's source address (which a peer off this host
 * cannot choose) with the engine id and epoch of the handshake, and treat
 * peer as a label.
 *
 * Backlog: a receiver that reads late loses nothing up to a large backlog.
 * Each sender (engine id and epoch from its handshake, at its source IP
 * address) may have FERRY_NOTIFY_PEER_BACKLOG (131,072) unread
 * notifications here, within FERRY_NOTIFY_PEER_BYTES (64 MiB) where each is
 * charged its length plus FERRY_NOTIFY_ENTRY_OVERHEAD: its memory here is
 * bounded by that budget. One source IP address may hold twice a sender's
 * share (FERRY_NOTIFY_ADDRESS_*), the whole queue FERRY_NOTIFY_BACKLOG_*.
 * Past its share a sender's notifications are dropped, nobody else's: the
 * drop is counted (ferry_stats_t.notifies_dropped, the metric
 * ferry_engine_notifies_dropped_total), logged (a warning, at most one a
 * second per engine) and answered TOO_MANY_REQUESTS to that sender's
 * ferry_notify. A flooding peer that mints a new engine id per connection
 * is still held to its address's share: other hosts' notifications keep
 * arriving, those of other engines on the flooder's own host may not once
 * the address's share is full. */
#define FERRY_NOTIFY_PEER_BACKLOG 131072
#define FERRY_NOTIFY_PEER_BYTES (64ull << 20)
#define FERRY_NOTIFY_ADDRESS_BACKLOG (2 * FERRY_NOTIFY_PEER_BACKLOG)
#define FERRY_NOTIFY_ADDRESS_BYTES (2 * FERRY_NOTIFY_PEER_BYTES)
#define FERRY_NOTIFY_BACKLOG_MAX (8 * FERRY_NOTIFY_PEER_BACKLOG)
#define FERRY_NOTIFY_BACKLOG_BYTES (4 * FERRY_NOTIFY_PEER_BYTES)
#define FERRY_NOTIFY_ENTRY_OVERHEAD 64
/* 0.1.0's limits, kept for source compatibility (constants keep their
 * values, docs/ABI.md); no longer applied: see the above. */
#define FERRY_NOTIFY_QUEUE_MAX 65536
#define FERRY_NOTIFY_SENDER_MAX (FERRY_NOTIFY_QUEUE_MAX / 8)
#define FERRY_NOTIFY_SOURCE_MAX (FERRY_NOTIFY_QUEUE_MAX / 2)

typedef struct ferry_notification {
    char peer[256];    /* sender's engine name, as it claimed it (see above) */
    size_t len;
    unsigned char *msg; /* owned; freed by ferry_notifications_free */
} ferry_notification_t;

/* What the receiver verified of a notification's sender (above). */
typedef struct ferry_notification_sender {
    char addr[64];      /* the connection's source, "ip:port" ("[ip6]:port"), as observed */
    uint64_t engine_id; /* the sender's engine id and epoch, from its handshake */
    uint64_t epoch;
    int authenticated;  /* 1: the sender proved it holds this engine's shared secret */
} ferry_notification_sender_t;

/* Moves up to max queued notifications into out; returns how many. Fewer
 * than max only when the queue is empty: to drain everything, call until
 * it returns less than max. */
FERRY_API long ferry_get_notifications(ferry_engine_t *e, ferry_notification_t *out, size_t max);
/* The same, with from[i] (an array of max, or NULL) describing out[i]'s
 * sender. */
FERRY_API long ferry_get_notifications_from(ferry_engine_t *e, ferry_notification_t *out,
                                            ferry_notification_sender_t *from, size_t max);
FERRY_API void ferry_notifications_free(ferry_notification_t *n, size_t count);

/* ---------------------------------------------------------------- metrics */

/* Latency histogram bucket upper bounds, microseconds; the last is +Inf. */
#define FERRY_LATENCY_BUCKETS 19
FERRY_API extern const uint64_t ferry_latency_bounds_us[FERRY_LATENCY_BUCKETS];
#define FERRY_METRICS_MAX_CODES 64

typedef struct ferry_peer_metrics {
    char peer[256];
    char transport[16];        /* the transport last used to this peer */
    uint64_t requests[2];      /* finished requests, by opcode (READ, WRITE) */
    uint64_t bytes[2];         /* bytes confirmed, by opcode */
    uint64_t failures;         /* requests that ended with an error */
    uint64_t retries;          /* automatic retries */
    uint64_t latency[FERRY_LATENCY_BUCKETS]; /* requests per bucket (not cumulative) */
    uint64_t latency_sum_us;
    int error_codes[FERRY_METRICS_MAX_CODES]; /* codes seen ... */
    uint64_t error_counts[FERRY_METRICS_MAX_CODES]; /* ... and how often */
    size_t nerrors;
} ferry_peer_metrics_t;

/* Copies up to max peers' metrics; returns how many peers exist. */
FERRY_API long ferry_metrics_peers(ferry_engine_t *e, ferry_peer_metrics_t *out, size_t max);
/* Sums the peers that used transport ("tcp", "shm", "rdma") into *out. */
FERRY_API int ferry_metrics_transport(ferry_engine_t *e, const char *transport, ferry_peer_metrics_t *out);
/* Renders every metric in Prometheus text format into buf (NUL-terminated,
 * cut at cap); returns the full length, so a caller can size buf. */
FERRY_API long ferry_metrics_prometheus(ferry_engine_t *e, char *buf, size_t cap);
/* The port of the metrics HTTP endpoint (GET /metrics), 0 when off. */
FERRY_API uint16_t ferry_metrics_port(const ferry_engine_t *e);

#ifdef __cplusplus
}
#endif

/* Pre-registered memory: allocate short-lived buffers without registering. */
#include <ferry/pool.h>
#endif
