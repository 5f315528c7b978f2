/* SPDX-License-Identifier: Apache-2.0 */
/* Batches: cutting requests into pieces, the worker pool that runs them on
 * several connections at once (workers.c), and the async batch API
 * (batch.c, batch_live.c, batch_cancel.c, batch_strided.c; their shared
 * state is in batch_internal.h). Private to the library. */
#ifndef FERRY_CORE_BATCH_H
#define FERRY_CORE_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "link/cancel.h"
#include "link/piece.h"

typedef struct ferry_session ferry_session_t;

/* A queued unit of an async batch: pieces run as one pipelined stream on
 * one connection by a worker. */
typedef struct ferry_task {
    ferry_batch_t *batch;
    ferry_session_t *session;  /* holds a reference */
    ferry_xfer_t *xfers;
    size_t nxfers;
    struct ferry_task *next;
} ferry_task_t;

/* workers.c */
typedef void (*task_done_fn)(ferry_task_t *t, void *owner);

struct task_ext {
    ferry_task_t task;
    task_done_fn start; /* optional: the worker picked the task up */
    task_done_fn done;
    void *owner;
    /* Optional: runs the task instead of its pieces (a strided lane that
     * expands its pieces window by window, strided.c), with run_arg. */
    void (*run)(struct task_ext *t, void *run_arg);
    void *run_arg;
    ferry_stream_ctl_t ctl;          /* a canceller interrupts the task here */
    struct task_ext *bnext, *bprev;  /* async: the batch's outstanding tasks */
};

void ferry_task_enqueue(ferry_engine_t *e, ferry_task_t *t);
/* A task of pieces xs[0..n) to s (holding a reference to s), or NULL when
 * out of memory; done is called when it ran. */
struct task_ext *ferry_task_new(ferry_session_t *s, ferry_xfer_t *xs, size_t n, task_done_fn done, void *owner);
void ferry_task_free(struct task_ext *t);
/* The end of a worker task its caller waits for: drops t's session
 * reference, frees t, and counts *left (guarded by lock) down, waking cond
 * (the caller's ferry_wait_zero_locked). */
void ferry_task_finish_joined(ferry_task_t *t, pthread_mutex_t *lock, pthread_cond_t *cond, size_t *left);
/* Splits [0, n) into at most groups contiguous ranges of similar byte
 * counts; writes group starts into starts[0..g] and returns g. */
size_t ferry_task_partition(const ferry_xfer_t *xs, size_t n, size_t groups, size_t *starts);
int ferry_workers_start(ferry_engine_t *e);
void ferry_workers_stop(ferry_engine_t *e);
/* Cuts requests into pieces: big ones into stripes so that several
 * connections carry them. Returns the pieces (malloc'd) and their count. */
int ferry_make_pieces(ferry_engine_t *e, int opcode, void *const *locals, const uint64_t *remotes,
                      const size_t *lens, size_t n, uint64_t deadline, ferry_xfer_t **out, size_t *nout);
/* Runs pieces xs on several of s's connections at once. */
int ferry_run_parallel(ferry_engine_t *e, ferry_session_t *s, ferry_xfer_t *xs, size_t n);
/* Whether a call of pieces averaging avg_piece bytes to s gains nothing
 * from being split over connections (its transport's small_serial hint,
 * transport.h): then it runs in the caller's thread (transfer.c). */
bool ferry_session_small_serial(ferry_session_t *s, uint64_t avg_piece);
/* Waits until *pending (guarded by lock, held) is 0: spinning first for the
 * engine's adaptive budget (spin.h) when the process may run on more CPUs
 * than the others threads the wait is for, then on cond, until deadline
 * (UINT64_MAX: none); records the wait for the adaptive spin. 0, or
 * ETIMEDOUT with *pending still above 0. The lock is held on return. */
int ferry_wait_zero_locked(ferry_engine_t *e, pthread_mutex_t *lock, pthread_cond_t *cond, const size_t *pending,
                           uint64_t deadline, int others);

/* batch.c, for strided.c: b's engine once b is a live batch, else NULL
 * with the failure raised; ferry_batch_submit of requests the caller
 * checked already. */
ferry_engine_t *ferry_batch_engine(const ferry_batch_t *b);
/* Requests b can still take (capacity less those submitted): a submit that
 * must expand its requests first refuses a larger count before allocating. */
size_t ferry_batch_room(ferry_batch_t *b);
long ferry_batch_submit_checked(ferry_batch_t *b, const char *peer, const ferry_request_t *reqs, size_t n,
                                int timeout_ms);

/* Strided descriptors run window by window (strided.c, batch_strided.c): each
 * lane (one connection) expands at most FERRY_STRIDED_WINDOW pieces at
 * once, so the memory a call holds does not grow with n. No more: when a
 * link goes silent under a window, its pieces are in doubt; a target that
 * fences connections whole (FERRY_HELLO_F_CONNFENCE, cancel.h) needs one
 * CANCEL for them all, but an older one is sent one per id and remembers at
 * most FERRY_CANCEL_CONN_MAX of them for that connection; a larger window
 * could not be confirmed there. */
#define FERRY_STRIDED_WINDOW FERRY_CANCEL_CONN_MAX
/* The window for n pieces (n > 0) over up to `lanes` lanes: the size
 * above, or less, so that a small call still spreads over every lane (as a
 * batch's pieces spread over the peer's connections). */
static inline size_t ferry_strided_window(size_t n, size_t lanes)
{
    size_t w = (n + lanes - 1) / lanes;
    return w < FERRY_STRIDED_WINDOW ? w : FERRY_STRIDED_WINDOW;
}
/* Piece i of checked descriptor d: its local and remote addresses. */
static inline void ferry_strided_piece(const ferry_strided_t *d, size_t i, unsigned char **local, uint64_t *remote)
{
    *local = (unsigned char *)d->local_base + (d->local_idx ? d->local_idx[i] : i) * d->local_stride;
    *remote = d->remote_base + (d->remote_idx ? d->remote_idx[i] : i) * d->remote_stride;
}
/* batch_strided.c: ferry_batch_submit of the n pieces of the checked descriptor d
 * as requests of b, expanded window by window by lanes on the workers.
 * The index lists are copied (the caller may free them on return). */
long ferry_batch_submit_strided_checked(ferry_batch_t *b, const char *peer, const ferry_strided_t *d,
                                        int timeout_ms);

#endif
