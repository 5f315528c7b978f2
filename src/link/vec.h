/* SPDX-License-Identifier: Apache-2.0 */
/* Vector frames (protocol 2): many small pieces in one frame and one answer
 * for them all, shared by the tcp (WRITEV) and shm (CMA_VEC) transports.
 * The format is in wire/wire.h ("Vector frames").
 *
 * Initiator: consecutive small pieces of a stream that can go together
 * (ferry_vec_collect) leave as one frame; each piece keeps its own request
 * id, so cancel and fencing (cancel.h) treat them exactly as before: a
 * frame in doubt is fenced as a whole, piece by piece. The answer says per
 * piece whether it was placed and, if not, why (its code; the first failed
 * piece also gets the target's detail text).
 *
 * Target: the descriptors are validated with the registry's read lock held,
 * a region lookup once per run of adjacent pieces in the same region
 * (ferry_vec_validate_locked); every buffer is per connection, made once,
 * so nothing is allocated per piece or per frame. */
#ifndef FERRY_VEC_H
#define FERRY_VEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "transport.h"

/* A connection's buffers for vector frames (either side). */
struct ferry_vec_scratch {
    ferry_vec_desc_t d[FERRY_WIRE_VEC_MAX];
    int32_t st[FERRY_WIRE_VEC_MAX];              /* per-piece status */
    struct iovec iov[FERRY_WIRE_VEC_MAX + 2];    /* gathered I/O: header, descriptors, pieces */
    struct iovec riov[FERRY_WIRE_VEC_MAX];       /* cross-memory attach: the other process's side */
    uint8_t raw[FERRY_WIRE_VEC_MAX * FERRY_WIRE_VEC_DESC_SIZE];
    uint8_t crcs[FERRY_WIRE_VEC_MAX * 4];        /* READV answers: per-piece CRC32C */
    char reason[FERRY_WIRE_MAX_REASON + 1];      /* the detail of the failed piece of lowest index */
    size_t reason_idx;                           /* that piece */
    bool compact;                                /* the frame described its pieces compactly (wire.h) */
    uint64_t span_lo, span_hi;                   /* ... then the span of their target ranges */
    unsigned char sink[FERRY_WIRE_VEC_PIECE_MAX]; /* takes the bytes of refused pieces */
};

/* The connection's scratch, made at first use; NULL (MEMORY raised) when
 * out of memory. */
struct ferry_vec_scratch *ferry_vec_scratch(ferry_conn_t *c);

/* ------------------------------------------------------------- initiator */

/* Whether piece x may travel in a vector frame: a whole small piece of
 * host memory, nothing of it sent yet, on a connection that speaks
 * protocol 2. */
bool ferry_vec_eligible(ferry_conn_t *c, const ferry_xfer_t *x);
/* The count of consecutive pieces from xs[0] (at most n) that go in one
 * vector frame: each sendable and eligible with the same opcode, at most
 * FERRY_WIRE_VEC_MAX pieces and max_bytes in all (the first always goes). */
size_t ferry_vec_collect(ferry_conn_t *c, ferry_xfer_t *xs, size_t n, uint64_t max_bytes);
/* Sends pieces g[0..n) as one frame of type (WRITEV: with their bytes;
 * CMA_VEC: naming the local buffers). Each piece's inflight is counted
 * before the first byte leaves. 0 or the connection's failure. */
int ferry_vec_send(ferry_conn_t *c, uint8_t type, ferry_xfer_t *g, size_t n);
/* Receives the answer for the frame of pieces g[0..n) and settles each
 * piece: placed (done, progress) or failed with its code and detail. With
 * refusable, pieces refused with NOT_IMPLEMENTED (the shm target declined
 * cross-memory attach) are left pending and *refused is set, reason gets
 * the target's text. 0, or with *broken a connection failure. */
int ferry_vec_recv_ack(ferry_conn_t *c, ferry_xfer_t *g, size_t n, unsigned spin_us, int *broken, bool refusable,
                       bool *refused, char *reason, size_t cap);
/* The same for a READV of pieces g[0..n): the bytes of the pieces the
 * target served land straight in their local buffers (one gathered receive
 * per socketful), each checked against its CRC32C when the answer has
 * them. */
int ferry_vec_recv_read(ferry_conn_t *c, ferry_xfer_t *g, size_t n, unsigned spin_us, int *broken);

/* ---------------------------------------------------------------- target */

/* Reads and decodes the descriptors of vector frame f into the connection's
 * scratch (*out) and clears the statuses, by the deadline of a served frame
 * (*deadline). 0, or a failure that closes the connection. */
int ferry_vec_recv_descs(ferry_conn_t *c, const ferry_frame_t *f, uint64_t *deadline, struct ferry_vec_scratch **out);
/* With the registry's read lock held: checks pieces [from, n) not yet
 * failed (cancel set, registration, bounds, access, generation), recording
 * failures in v->st (the first one's detail in v->reason). *device is set
 * when a piece lies in device memory. Returns how many pieces failed. */
size_t ferry_vec_validate_locked(ferry_conn_t *c, struct ferry_vec_scratch *v, size_t from, size_t n, uint32_t need,
                                 bool *device);
/* Whether connection c refuses any request id (its cancel set is not
 * empty): only then do pieces need a look at it (cancel.h). */
static inline bool ferry_vec_cancels_pending(ferry_conn_t *c)
{
    ferry_cancel_set_t *cs = atomic_load_explicit(&c->cancels, memory_order_acquire);
    return atomic_load_explicit(&c->fenced, memory_order_acquire) || (cs && ferry_cancel_set_count(cs) > 0);
}
/* Compact vector frames this process served (for tests and benchmarks). */
uint64_t ferry_vec_compact_served(void);
/* Target: when frame f's deadline passed (cancel.h), refuses its pieces
 * [from, n) not refused yet with TIMEOUT; returns how many. */
size_t ferry_vec_expire(ferry_conn_t *c, const ferry_frame_t *f, struct ferry_vec_scratch *v, size_t from, size_t n);
/* Records piece i's failure rc (the thread's detail) in v. */
void ferry_vec_fail_piece(struct ferry_vec_scratch *v, size_t i, int rc);
/* Sends the one answer for frame req of n pieces. */
int ferry_vec_send_ack(ferry_conn_t *c, const ferry_frame_t *req, struct ferry_vec_scratch *v, size_t n,
                       uint64_t deadline);

#endif
