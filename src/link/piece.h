/* SPDX-License-Identifier: Apache-2.0 */
/* Pieces: one contiguous transfer for a transport to move (piece.c),
 * running them on a connection with retries and re-resolution (piece_run.c),
 * and the checks and synchronous calls around them (transfer.c). Private
 * to the library. */
#ifndef FERRY_CORE_XFER_H
#define FERRY_CORE_XFER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "cancel.h"

typedef struct ferry_session ferry_session_t;

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
    /* Exactly-once (cancel.h): the vector frame this piece last went in,
     * named by its first id (0: none, the piece went in slices), and the
     * piece's byte offset in that frame. */
    uint64_t vec_first, vec_off;
    uint32_t vec_index;        /* its index among that frame's pieces */
} ferry_xfer_t;

/* Records a piece's failure with the calling thread's current detail. */
void ferry_xfer_fail(ferry_xfer_t *x, int rc);

/* The piece whose failure a call reports: the first CANCEL_UNCONFIRMED
 * (its pages are not safe to reuse: that must never hide behind another
 * request's code), else the first failed; n when none failed. */
size_t ferry_xfer_worst(const ferry_xfer_t *xs, size_t n);

/* piece_run.c: running pieces on one connection with retries and re-resolution */
int ferry_xfer_run(ferry_engine_t *e, ferry_session_t *s, ferry_xfer_t *xs, size_t n);
struct ferry_transport_ops;
/* The transport s moves its bytes with: tcp until a handshake chose one. */
const struct ferry_transport_ops *ferry_session_transport(ferry_session_t *s);

/* transfer.c: argument checks and the synchronous calls */
int ferry_check_local(ferry_engine_t *e, const void *local, uint64_t len);
/* Checks one request's arguments; touches no memory. */
int ferry_check_request(ferry_engine_t *e, int opcode, const void *local, uint64_t remote, uint64_t len);
/* The synchronous transfer of requests the caller checked already
 * (strided.c), inside the caller's ferry_engine_enter. */
int ferry_run_sync_checked(ferry_engine_t *e, const char *peer, int opcode, void *const *locals,
                           const uint64_t *remotes, const size_t *lens, size_t n);

/* Runs one window of a larger call's pieces on one connection, counted
 * and with the first failure raised (its request index in *failed). */
int ferry_run_window(ferry_engine_t *e, ferry_session_t *s, const char *peer, ferry_xfer_t *xs, size_t n,
                     size_t total, uint64_t t0, size_t *failed);

#endif
