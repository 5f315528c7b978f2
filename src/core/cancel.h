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
 *    for CANCEL_ACK. Only then is the piece reported (TIMEOUT, CANCELLED, or
 *    retried under a new id). If the target cannot confirm, the request
 *    fails with CANCEL_UNCONFIRMED: its pages must not be reused yet.
 *  - The target records the id in its cancel set, then takes the registry's
 *    write lock once (a barrier): a chunk being placed holds the read lock,
 *    so it finishes first, and every later chunk checks the cancel set under
 *    the read lock before touching memory. CANCEL_ACK goes out after the
 *    barrier, so once it arrives no byte of that id can land.
 *  - The target forgets an id once every connection that could carry its
 *    frames has ended: frames of a fenced id travel only on connections
 *    accepted before the fence's own connection (accept order is FIFO, and
 *    the initiator never sends a fenced id again), so an entry records the
 *    fence connection's serial and lives while an older connection is
 *    served. A cap bounds memory against a flood (oldest dropped, logged).
 *
 * Not a public header. */
#ifndef FERRY_CANCEL_H
#define FERRY_CANCEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ferry_session;
struct ferry_xfer;

/* ------------------------------------------------------- target side */

/* Entries above this drop the oldest (a warning is logged). */
#define FERRY_CANCEL_SET_MAX (1u << 18)

typedef struct ferry_cancel_entry ferry_cancel_entry_t;

typedef struct ferry_cancel_set {
    pthread_mutex_t lock;
    void *root;                       /* tsearch tree by (engine id, req id) */
    ferry_cancel_entry_t *head, *tail; /* insertion order, oldest first */
    atomic_size_t count;              /* read without the lock: 0 = fast path */
} ferry_cancel_set_t;

void ferry_cancel_set_init(ferry_cancel_set_t *cs);
void ferry_cancel_set_destroy(ferry_cancel_set_t *cs);
/* Refuses frames of (engine_id, req_id) from now on. before: serial of the
 * connection the CANCEL came on; the entry lives while a connection with a
 * lower serial is still served. 0 or MEMORY (then no CANCEL_ACK may go). */
int ferry_cancel_set_add(ferry_cancel_set_t *cs, uint64_t engine_id, uint64_t req_id, uint64_t before);
bool ferry_cancel_set_has(ferry_cancel_set_t *cs, uint64_t engine_id, uint64_t req_id);
/* Drops entries no live connection can carry: oldest_live is the lowest
 * serial of a connection still served (UINT64_MAX when none). */
void ferry_cancel_set_prune(ferry_cancel_set_t *cs, uint64_t oldest_live);
size_t ferry_cancel_set_count(ferry_cancel_set_t *cs);

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

/* After a stream's connection broke (and was aborted): fences every piece
 * with frames in flight. Confirmed pieces get inflight 0 and a fresh id (a
 * retry cannot be refused); unconfirmed ones fail with CANCEL_UNCONFIRMED.
 * cause is the code that broke the stream; the calling thread's error
 * detail is kept. Returns how many pieces stayed unconfirmed. */
size_t ferry_fence_in_doubt(struct ferry_session *s, struct ferry_xfer *xs, size_t n, int cause);

/* Before a new request goes out: fences again the requests whose cancel the
 * peer never confirmed (their bytes may still sit in the network), so that
 * none of them can land after the new request. Best effort, bounded by
 * deadline; the ids stay remembered while the peer cannot confirm. */
void ferry_fence_pending(struct ferry_session *s, uint64_t deadline);

/* Fails pieces whose cancel flag is set and that have nothing in flight
 * with CANCELLED. */
void ferry_settle_cancelled(struct ferry_xfer *xs, size_t n);
/* Calls ->ended once for each piece that reached its final state (failed,
 * or every byte confirmed) with nothing in flight; all = every piece. */
void ferry_settle_ended(struct ferry_xfer *xs, size_t n, bool all);

#endif
