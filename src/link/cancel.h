/* SPDX-License-Identifier: Apache-2.0 */
/* Cancel and expiry that leave no late write behind.
 *
 * The problem: when a request is cancelled, expires, or its connection
 * breaks, slices already sent may still sit in socket buffers (ours, the
 * network's, the target's) and be placed after the initiator returned.
 *
 * The protocol:
 *  - Every piece of a transfer has its own request id (a retry gets a new
 *    one). A piece with frames on the wire keeps x->inflight > 0 until their
 *    answers arrive.
 *  - When a stream ends with its connection broken (a failure, its deadline,
 *    or a canceller interrupting it), the initiator aborts that connection
 *    and *fences* every piece with frames in flight: it sends CANCEL for
 *    their ids on another connection and waits (config.cancel_timeout_ms)
 *    for CANCEL_ACK. That connection may be an idle pooled one, whose path
 *    may have gone silent with the stream's: it gets a third of the budget,
 *    then a fresh connection the rest (fence.c). Only then is the piece
 *    reported (TIMEOUT, CANCELLED, or
 *    retried under a new id). If the target cannot confirm, the request
 *    fails with CANCEL_UNCONFIRMED: its pages must not be reused yet.
 *  - Every CANCEL names, besides the id, the data connection that carried
 *    its frames: the key the target gave that connection in its HELLO_ACK
 *    (aux). The target records the id in that connection's own cancel set
 *    (and only if the CANCEL comes from the same peer engine), then takes
 *    the registry's write lock once (a barrier): a chunk being placed holds
 *    the read lock, so it finishes first, and every later chunk checks its
 *    connection's set under the read lock before touching memory.
 *    CANCEL_ACK goes out after the barrier, so once it arrives no byte of
 *    that id can land. A key no live connection has means that connection
 *    is over: nothing of it can land, the ack goes at once.
 *  - A set lives exactly as long as its connection: the initiator never
 *    sends a fenced id again, so nothing else can carry it. It does not
 *    matter which connection the CANCEL travels on, nor how old it is.
 *  - Sets are bounded per connection and in total; past either bound a
 *    CANCEL is refused (ERROR, the initiator reports CANCEL_UNCONFIRMED),
 *    never an older entry forgotten, so a peer flooding CANCELs can neither
 *    evict another peer's fences nor make them forgotten. The warning is
 *    rate-limited.
 *  - A CANCEL with key 0 (an initiator that predates keys) is recorded on
 *    every live connection of the same peer engine, bounded the same way.
 *  - Whole connections: the initiator never uses an aborted connection
 *    again, so to a target advertising FERRY_HELLO_F_CONNFENCE it sends one
 *    CANCEL with FERRY_FRAME_F_CONN naming the connection's key instead of
 *    one per id (req_id is only echoed). The target marks that connection
 *    (same peer engine only, as above) fenced: from then on it refuses every
 *    frame and chunk (ferry_conn_is_cancelled answers yes for every id),
 *    whatever the number of pieces that were in flight, in O(1) memory. The
 *    same barrier comes before the ack; a key no live connection of that
 *    peer has is acked at once. Older targets get the per-id CANCELs.
 *
 * Placement reports (exactly-once; targets advertising
 * FERRY_HELLO_F_PLACED):
 *  - Each served data connection keeps a placement log: for its last
 *    FERRY_PLACED_LOG_MAX write frames (WRITE, WRITEV, CMA_WRITE, CMA_VEC
 *    writes; and the reads it serves by writing into the initiator's own
 *    memory, CMA_READ and CMA_VEC reads, logged so that a replayed one is
 *    dropped like a repeated write) the frame's req_id, addr, len and type, the bytes placed so
 *    far (a prefix in the frame's byte order, updated under the registry's
 *    read lock with each chunk, so it is exact after the fence's barrier),
 *    the status, and for vector frames which pieces were refused. An
 *    initiator never has more frames unanswered on one connection than
 *    that, so the log holds every frame whose answer it may lack. The log
 *    outlives its connection by 30 s (at most 256 closed connections' logs
 *    are kept, the oldest dropped first), so that the fence, which follows
 *    the abort, still finds it.
 *  - From an initiator that advertises FERRY_HELLO_F_PLACED (it never sends
 *    one id twice on a connection), a write frame repeating one the same
 *    connection placed whole (same type, req_id, addr, len: a duplicating
 *    relay) is dropped unanswered, its payload read and discarded: the
 *    initiator sent it once and waits for one answer. A retry, also one
 *    on the same connection after CHECKSUM_MISMATCH, resends its piece
 *    under a new id: the slices sent after the refused one were placed
 *    whole, and their repeats under the old id would go unanswered.
 *  - A CANCEL with FERRY_FRAME_F_PLACED (per id or F_CONN) asks for the log
 *    of the connection it names (aux). The CANCEL_ACK, sent after the
 *    barrier, then has F_PLACED when the target knows that log, len = the
 *    entry count and a payload of entries, newest first:
 *      off size field
 *        0    8 req_id (a vector frame's: its first piece's)
 *        8    8 addr (WRITE, CMA_WRITE: the target address; vector frames:
 *               their total bytes)      16  8 len (bytes; vector frames: pieces)
 *       24    8 placed: bytes placed, a prefix in the frame's byte order
 *               (a vector frame's pieces in descriptor order)
 *       32    4 status (0 or the Ferry code the answer carried or would carry)
 *       36    1 frame type             37  1 state: 0 in progress when the
 *               fence came (placed is exact), 1 answered, 2 progress not
 *               tracked (the initiator then takes the frame as unknown)
 *       38    2 bytes of the refused-pieces bitmap that follows (vector
 *               frames with refused pieces: bit i = piece i was refused)
 *    Without F_PLACED in the ack (an evicted log) nothing is known.
 *  - The initiator then settles each piece the broken connection left in
 *    doubt: a write's confirmed prefix grows by what the log says landed;
 *    a piece fully placed succeeds with no resend; the rest is resent under
 *    a new id (it cannot land twice: the fence refuses the old frames). A
 *    write in doubt whose placement is unknown (an older target, an evicted
 *    log, an untracked frame) is not resent: it fails with the code that
 *    broke the stream. Reads are resent as before.
 *  - Vector pieces: at send time each piece records its frame's first id
 *    and its byte offset in that frame (ferry_xfer_t.vec_first/vec_off).
 *
 * Deadlines the target enforces (targets advertising FERRY_HELLO_F_DEADLINE;
 * the clock conversion and the header field are in wire.h,
 * FERRY_FRAME_F_DEADLINE):
 *  - Every data frame carries its request's deadline converted to the
 *    target's CLOCK_MONOTONIC, never earlier than the initiator's own.
 *  - The target checks it, by its own clock, where it checks the cancel set:
 *    before each chunk it places or sends (WRITE, CMA_WRITE, READ answers
 *    and CMA_READ per chunk; vector frames before each gathered receive or
 *    copy). A chunk past the deadline is refused with TIMEOUT (the answer
 *    says so: confirmed, nothing more placed); a READ answer past it is not
 *    sent (the answer is the TIMEOUT status; a READ answer already under
 *    way resets the connection); vector pieces not yet placed are refused.
 *  - So a target frozen (SIGSTOP, a VM pause) that resumes after the
 *    initiator gave up places nothing more of that request, with one bound:
 *    the chunk whose copy the freeze interrupted completes (at most one
 *    chunk per connection: 1 MiB for tcp WRITE, one gathered receive of a
 *    WRITEV, i.e. what the socket held, at most the frame's 2 MiB; 4 MiB
 *    (SHM_CHUNK) for CMA_WRITE and one gathered copy of a CMA_VEC). A freeze before a
 *    copy began lands nothing. The CANCEL fence still runs as before; the
 *    deadline closes the window where the fence is unconfirmed
 *    (CANCEL_UNCONFIRMED) and the target resumes before reading it.
 *  - Deadlines more than 2^30 ms away are not sent (the field is 32-bit,
 *    compared wrap-aware); such frames are refused only by the fence.
 *
 * Notifications (exactly once, never late; targets advertising
 * FERRY_HELLO_F_NOTIFY_ONCE):
 *  - Each NOTIFY has its own request id (a resend takes a new one) and
 *    carries its deadline (FERRY_FRAME_F_DEADLINE, as data frames do).
 *  - The target logs it in the connection's placement log like a write
 *    frame (type NOTIFY, placed 1 once queued, 0 otherwise), drops a
 *    repeat of one queued already (a duplicating relay), and queues it only
 *    under the registry's read lock after checking the connection's cancel
 *    set and the deadline: a fenced or expired NOTIFY is refused (CANCELLED
 *    or TIMEOUT in its NOTIFY_ACK), so the fence's barrier makes the report
 *    final.
 *  - When the initiator lacks the answer (the connection broke, or its
 *    deadline passed), it aborts the connection and fences the id asking
 *    for the placement report: queued = success, no resend; not begun or
 *    not queued = not delivered (resent under a new id when the cause was a
 *    broken connection and retries remain, else the cause is reported);
 *    unknown (an evicted log, a gone target) = the cause, no resend; fence
 *    unconfirmed = CANCEL_UNCONFIRMED (it may still be delivered). Toward
 *    older targets nothing is fenced or resent after the NOTIFY went out:
 *    the link's code is reported.
 *
 * Not a public header. */
#ifndef FERRY_CANCEL_H
#define FERRY_CANCEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ferry_conn;
struct ferry_link;
struct ferry_session;
struct ferry_xfer;

/* A request id and the key of the data connection that carried it. */
typedef struct ferry_fence_id {
    uint64_t req_id, conn_key;
} ferry_fence_id_t;

/* ------------------------------------------------------- target side */

/* Ids one served connection refuses; past this a CANCEL for it is refused. */
#define FERRY_CANCEL_CONN_MAX 4096
/* Ids remembered by all connections of an engine together. */
#define FERRY_CANCEL_ENGINE_MAX (1u << 18)

typedef struct ferry_cancel_set {
    pthread_mutex_t lock;
    void *root;                       /* tsearch tree; the id is the key */
    atomic_size_t count;              /* read without the lock: 0 = fast path */
} ferry_cancel_set_t;

void ferry_cancel_set_init(ferry_cancel_set_t *cs);
void ferry_cancel_set_destroy(ferry_cancel_set_t *cs);
/* 1 added, 0 already there, or MEMORY. */
int ferry_cancel_set_add(ferry_cancel_set_t *cs, uint64_t req_id);
bool ferry_cancel_set_has(ferry_cancel_set_t *cs, uint64_t req_id);
size_t ferry_cancel_set_count(ferry_cancel_set_t *cs);

/* Target: a CANCEL with FERRY_FRAME_F_CONN that arrived on via fences the
 * whole data connection with key conn_key, when it is one of the same peer
 * engine's (see above); a key no live connection of that peer has changes
 * nothing. 0, or MALFORMED_FRAME for key 0. */
int ferry_cancel_fence_conn(struct ferry_conn *via, uint64_t conn_key);
/* Target: records the CANCEL of req_id that arrived on connection via for
 * the data connection with key conn_key (see above). 0, or the refusal
 * (TOO_MANY_REQUESTS, MEMORY) with its detail: then no CANCEL_ACK may go. */
int ferry_cancel_record(struct ferry_conn *via, uint64_t req_id, uint64_t conn_key);
/* Target, before HELLO_ACK goes out on c: gives c its key (returned, for
 * the HELLO_ACK's aux) and publishes which peer engine it serves. */
uint64_t ferry_cancel_conn_open(struct ferry_conn *c);
/* Whether served connection c refuses frames of req_id (registry read lock
 * held, see above). */
bool ferry_conn_is_cancelled(struct ferry_conn *c, uint64_t req_id);
/* Frees c's cancel set, when it has one (ferry_conn_free). */
void ferry_cancel_conn_close(struct ferry_conn *c);
/* Ids remembered by all of an engine's connections together: link.h's
 * cancels_held (tests: ferry_cancel_engine_count, engine/testing.h). */

/* ---------------------------------------------------- initiator side */

/* Lets a canceller wake a stream: while the stream runs, its fd is armed
 * here, and firing shuts the socket down so that every blocked send or
 * receive returns at once; a stream waiting for a connection is poked. */
typedef struct ferry_stream_ctl {
    pthread_mutex_t lock;
    int fd;                    /* the data connection in use, -1 when none */
    bool fired;                /* fired while armed: the break was ours, not the peer's */
    atomic_bool poke;          /* fired: a waiting checkout gives up (consumed there) */
    struct ferry_session *session; /* woken on fire; the stream holds a reference */
} ferry_stream_ctl_t;

void ferry_stream_ctl_init(ferry_stream_ctl_t *ctl, struct ferry_session *s);
void ferry_stream_ctl_destroy(ferry_stream_ctl_t *ctl);
/* NULL ctl is a no-op for all three. */
void ferry_stream_ctl_arm(ferry_stream_ctl_t *ctl, int fd);
/* Disarms; returns whether it fired since arming. */
bool ferry_stream_ctl_disarm(ferry_stream_ctl_t *ctl);
void ferry_stream_ctl_fire(ferry_stream_ctl_t *ctl);

/* After a stream's connection (key conn_key, see ferry_conn_t) broke and
 * was aborted: fences every piece with frames in flight. Confirmed pieces get inflight 0 and a fresh id (a
 * retry cannot be refused); unconfirmed ones fail with CANCEL_UNCONFIRMED.
 * cause is the code that broke the stream; the calling thread's error
 * detail is kept. Returns how many pieces stayed unconfirmed. */
size_t ferry_fence_in_doubt(struct ferry_session *s, struct ferry_xfer *xs, size_t n, int cause, uint64_t conn_key);

/* Before a new request goes out: fences again the requests whose cancel the
 * peer never confirmed (their bytes may still sit in the network), so that
 * none of them can land after the new request. Best effort, bounded by
 * deadline; the ids stay remembered while the peer cannot confirm. */
void ferry_fence_pending(struct ferry_session *s, uint64_t deadline);

/* After a NOTIFY (req_id, on the connection with key conn_key, see
 * ferry_conn_t) lost its answer to cause and its connection was aborted:
 * fences it and reads the placement report ("Notifications" above). One of
 * the FERRY_NOTIFY_* outcomes (the calling thread's error detail kept), or
 * CANCEL_UNCONFIRMED with its detail. */
enum { FERRY_NOTIFY_NOT_DELIVERED = 0, FERRY_NOTIFY_DELIVERED = 1, FERRY_NOTIFY_UNKNOWN = 2 };
int ferry_fence_notify(struct ferry_session *s, uint64_t req_id, uint64_t conn_key, int cause);

/* Whether the target of initiator connection c answers placement reports. */
bool ferry_fence_reports_placed(const struct ferry_conn *c);

/* Fails pieces whose cancel flag is set and that have nothing in flight
 * with CANCELLED. */
void ferry_settle_cancelled(struct ferry_xfer *xs, size_t n);
/* Calls ->ended once for each piece that reached its final state (failed,
 * or every byte confirmed) with nothing in flight; all = every piece. */
void ferry_settle_ended(struct ferry_xfer *xs, size_t n, bool all);

/* ------------------------------------------- placement reports (above) */

/* Write frames a served connection remembers (and the most an initiator
 * keeps unanswered on one connection: tcp's ring). */
#define FERRY_PLACED_LOG_MAX 256
#define FERRY_PLACED_ENTRY_SIZE 40

struct ferry_frame;
struct ferry_placed_log;

/* One decoded entry of a placement report; refused points into the
 * report's bytes. */
typedef struct ferry_placed {
    uint64_t req_id, addr, len, placed;
    int32_t status;
    uint8_t type, state;
    const uint8_t *refused;
} ferry_placed_t;

/* Target: whether f writes into this engine's memory (logged). */
bool ferry_placed_is_write_frame(const struct ferry_frame *f);
/* Target: whether f is logged and a repeat of it dropped: write frames, and
 * reads the target serves by writing into the initiator's own memory
 * (CMA_READ, CMA_VEC reads: a replayed one would land in a buffer its
 * caller reuses once the read returned). Its serving ends the entry with
 * ferry_placed_end. */
bool ferry_placed_is_logged_frame(const struct ferry_frame *f);
/* Target, at the handshake / at ferry_conn_free: makes c's log, retires it. */
void ferry_placed_open(struct ferry_conn *c);
void ferry_placed_close(struct ferry_conn *c);
void ferry_placed_destroy_all(struct ferry_link *l);
/* Target, before serving write frame f: true when f repeats a frame placed
 * whole already (then ferry_placed_drop_duplicate, no answer); else f's
 * entry is begun. */
bool ferry_placed_begin(struct ferry_conn *c, const struct ferry_frame *f);
int ferry_placed_drop_duplicate(struct ferry_conn *c, const struct ferry_frame *f);
/* Target, with the registry's read lock held, right after a chunk landed:
 * the frame's placed prefix is now placed bytes; st: a vector frame's
 * per-piece statuses (NULL: none refused). */
void ferry_placed_progress(struct ferry_conn *c, uint64_t placed, const int32_t *st);
/* Target: the current frame's progress cannot be told (its pieces move in
 * an order the log does not follow). */
void ferry_placed_untracked(struct ferry_conn *c);
/* Target: the current frame was served: its status, bytes placed, st. */
#define FERRY_PLACED_KEEP UINT64_MAX /* placed as the progress calls left it */
void ferry_placed_end(struct ferry_conn *c, int status, uint64_t placed, const int32_t *st);
/* Target: encodes the log of the connection with key conn_key of via's peer
 * into *out (malloc'd, *len bytes, *count entries): 1 found, 0 unknown, or
 * MEMORY. */
int ferry_placed_report(struct ferry_conn *via, uint64_t conn_key, uint8_t **out, size_t *len, uint32_t *count);
/* ------------------------- deadlines the target enforces (wire.h, below) */

/* Initiator, after HELLO_ACK (addr: the target's clock) on c: learns how
 * far ahead the target's clock may be, when it advertises
 * FERRY_HELLO_F_DEADLINE. */
void ferry_deadline_learn(struct ferry_conn *c, uint64_t target_now_ns);
/* Initiator: stamps data frame f with deadline (our clock) converted to
 * the target's, when c's target enforces deadlines. */
void ferry_deadline_stamp(const struct ferry_conn *c, struct ferry_frame *f, uint64_t deadline);
/* Target: whether f carries a deadline that passed by this engine's clock;
 * then ferry_frame_expired_fail gives the TIMEOUT refusal with its detail. */
bool ferry_frame_expired(const struct ferry_frame *f);
int ferry_frame_expired_fail(struct ferry_conn *c, const struct ferry_frame *f);

/* Initiator: decodes a report of count entries; *out malloc'd. 0 or
 * MALFORMED_FRAME. */
int ferry_placed_decode(const uint8_t *in, size_t len, uint32_t count, ferry_placed_t **out);

#endif
