/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport's own frames, with ids past wire.h's core range
 * (64..79), and their payloads (rdma_wire.c). The older RDMA frames (20..25)
 * keep their ids in wire.h's central enum (the wire format does not
 * change); all eight are named and sized in ferry_rdma_frames below.
 *
 * ---- Group commit (protocol 3, FERRY_PROTOCOL_RDMA_GROUP) ----
 * After a chain of RDMA WRITEs, one zero-length WRITE WITH IMMEDIATE and
 * one RDMA_COMMIT_GROUP commit up to FERRY_RDMA_GROUP_MAX pieces at once
 * (an older peer gets one RDMA_COMMIT per piece). Header: len = n pieces
 * (1..FERRY_RDMA_GROUP_MAX), addr = their total bytes, req_id = the first
 * piece's id (the answer echoes it), plen = n * 32; the payload is n
 * descriptors of 32 bytes:
 *   off size field
 *     0    8 target address          8    8 length (not 0)
 *    16    8 the piece's request id (cancel.h)
 *    24    4 region generation      28    4 reserved, 0
 * The target waits for the immediate (every earlier WRITE of the queue pair
 * is then placed), checks each range as RDMA_COMMIT does, and answers one
 * RDMA_COMMIT_GROUP_ACK with the vector frames' per-piece status layout
 * (wire.h, VEC_ACK): req_id echoed, len = n, addr = the bytes confirmed;
 * status 0: every piece confirmed, no payload; status < 0 (the first
 * failure's code): payload = n statuses (i32 each, 0 or a Ferry code), then
 * the first failed piece's reason text. */
#ifndef FERRY_RDMA_WIRE_H
#define FERRY_RDMA_WIRE_H

#include "wire.h"

/* The ids the RDMA transport takes past the core's (wire.h). */
#define FERRY_FRAME_RDMA_FIRST FERRY_FRAME_TRANSPORT_FIRST
#define FERRY_FRAME_RDMA_LAST (FERRY_FRAME_TRANSPORT_FIRST + 15)

enum ferry_rdma_frame_type {
    FERRY_FRAME_RDMA_COMMIT_GROUP = FERRY_FRAME_RDMA_FIRST,         /* i->t: descriptors of n RDMA-written pieces */
    FERRY_FRAME_RDMA_COMMIT_GROUP_ACK = FERRY_FRAME_RDMA_FIRST + 1, /* t->i: status; per-piece statuses + reason */
    FERRY_FRAME_RDMA_OWN_LAST = FERRY_FRAME_RDMA_COMMIT_GROUP_ACK
};

/* The protocol version that added group commits. */
#define FERRY_PROTOCOL_RDMA_GROUP 3
#define FERRY_RDMA_GROUP_MAX 1024
#define FERRY_RDMA_COMMIT_DESC_SIZE 32

typedef struct ferry_rdma_commit_desc {
    uint64_t addr, len, req_id;
    uint32_t generation;
} ferry_rdma_commit_desc_t;

/* The RDMA transport's frames, old (20..25) and own, with their names and
 * payload limits: its ops' frames table (transport/rdma.c). */
#define FERRY_RDMA_NFRAMES 8
extern const ferry_frame_def_t ferry_rdma_frames[FERRY_RDMA_NFRAMES];

void ferry_rdma_commit_desc_encode(const ferry_rdma_commit_desc_t *d, uint8_t out[FERRY_RDMA_COMMIT_DESC_SIZE]);
/* Checks an RDMA_COMMIT_GROUP header: piece count, payload size. */
int ferry_rdma_commit_group_check(const ferry_frame_t *f);
/* Decodes the f->len descriptors in (f checked above): lengths not 0, no
 * range wraps or starts at 0, reserved bytes 0, lengths add up to f->addr.
 * 0 or MALFORMED_FRAME naming the piece. */
int ferry_rdma_commit_group_decode(const ferry_frame_t *f, const uint8_t *in, ferry_rdma_commit_desc_t *out);
/* Checks an RDMA_COMMIT_GROUP_ACK for n pieces of total bytes against its
 * header. 0 or MALFORMED_FRAME. */
int ferry_rdma_commit_group_ack_check(const ferry_frame_t *f, uint32_t n, uint64_t total);

#endif
