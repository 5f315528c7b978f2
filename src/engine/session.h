/* SPDX-License-Identifier: Apache-2.0 */
/* The initiator's sessions (session.c): one per peer, with its pool of
 * connections and its cache of the peer's segments. Private to the library. */
#ifndef FERRY_CORE_SESSION_H
#define FERRY_CORE_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "link/cancel.h"
#include "link/conn.h"
#include "link/metrics.h"
#include "wire/wire.h"

struct ferry_transport_ops;

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
    ferry_hello_t peer;        /* from the first handshake; its epoch never changes (check_epoch) */
    uint64_t new_epoch;        /* SESSION_RESTARTED: the epoch that the restart was found by */
    /* Epochs known not to be the peer's current one (an older session's,
     * a pin a handshake disproved): a call pinned to one fails without a
     * round trip. A ring, kept across the re-open after a restart. */
    uint64_t void_epochs[8];
    unsigned nvoid;
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
    /* The session transport's last run copied every piece inline (its
     * verdict's copied_inline, transport.h; shm's shared-pool mappings): a
     * hint that the next call is one memcpy per piece, best run in the
     * caller's thread (transfer.c). Kept by piece_run.c. */
    atomic_bool inline_hint;
    /* The last run's verdict said small_serial (transport.h): the next
     * call of small pieces runs in the caller's thread (transfer.c). */
    atomic_bool small_hint;
    /* The last run's verdict said shares_frames (transport.h): the next
     * call of large pieces that do not overlap at the target runs in the
     * caller's thread (transfer.c). */
    atomic_bool share_hint;

    ferry_session_t *next;     /* next in its bucket of the engine's session table */
};

/* session.c: initiator side */
/* Splits a peer name into the session's name ("host:port", into plain)
 * and, for a pinned name "host:port#<epoch in hex>", the epoch (*pinned
 * true). INVALID_ARGUMENT for a malformed pin or a name over cap. */
int ferry_peer_name_split(const char *peer, char *plain, size_t cap, uint64_t *epoch, bool *pinned);
/* The session of peer, by its plain name. A pinned name is checked: the
 * session's epoch must be the pinned one (learned by a handshake first
 * when the session is new), else PEER_RESTARTED naming both epochs. */
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
/* Copies the cached segment holding addr into *out: true, or false when no
 * cached segment holds it (strided.c: the run a resolved piece lies in). */
bool ferry_session_segment_of(ferry_session_t *s, uint64_t addr, ferry_segment_t *out);
int ferry_session_refresh_segments(ferry_session_t *s, uint64_t deadline);
/* After retries ran out on a broken link: closes every pooled connection
 * (busy ones at checkin) so that the next use connects and handshakes
 * afresh, epoch check included, and refetches the segments. */
void ferry_session_teardown(ferry_session_t *s);
void ferry_sessions_destroy(ferry_engine_t *e);
/* Whether a handshake has told us who the peer is. */
bool ferry_session_known(ferry_session_t *s);
/* Destroy began (e->stopping set): shuts down every checked-out connection
 * and wakes every wait for one, so that each call blocked on a peer comes
 * out at once. */
void ferry_sessions_interrupt(ferry_engine_t *e);
/* The session table: made once config.max_sessions is known, freed with
 * the engine (ferry_sessions_destroy empties it). */
int ferry_sessions_init(ferry_engine_t *e);
void ferry_sessions_free(ferry_engine_t *e);

#endif
