/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport's own frames, with ids past wire.h's core range
 * (64..79), its first frames (20..25, ids of the core range they keep),
 * their payloads (rdma_wire.c) and its HELLO bit; all eight frames are
 * named and sized in ferry_rdma_frames below.
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

#include "wire/wire.h"

/* The RDMA transport's first frames, with ids of the core range (they keep
 * them: the wire format does not change). The TCP connection stays the
 * control channel; these frames set up the queue pair and confirm
 * placement. Payloads are encoded by ferry_rdma_*_encode below. */
enum ferry_rdma_first_frame_type {
    FERRY_FRAME_RDMA_CONNECT = 20,     /* i->t: payload = the initiator's QP info */
    FERRY_FRAME_RDMA_CONNECT_ACK = 21, /* t->i: status; payload = the target's QP info, or the reason text */
    FERRY_FRAME_RDMA_MR_QUERY = 22,    /* i->t: key for [addr, addr+len); aux = generation | access << 32 */
    FERRY_FRAME_RDMA_MR_INFO = 23,     /* t->i: status; payload = ferry_rdma_mr_info, or the reason text */
    FERRY_FRAME_RDMA_COMMIT = 24,      /* i->t: [addr, addr+len) was RDMA-written; aux = generation */
    FERRY_FRAME_RDMA_COMMIT_ACK = 25,  /* t->i: status, len = bytes confirmed; payload = reason text */
};

/* The HELLO bit of the RDMA transport (its ops' hello_bits): the sender has
 * a usable RDMA device and serves RDMA frames. */
#define FERRY_HELLO_F_RDMA 0x04u

/* ---- RDMA transport payloads (rdma_wire.c) ----
 * QP info, 48 bytes, sent in RDMA_CONNECT and RDMA_CONNECT_ACK:
 *   off size field
 *     0    4 qpn (24 bits, not 0)         4    4 psn (24 bits)
 *     8    2 lid (InfiniBand)            10    1 port number (>= 1)
 *    11    1 link layer: 1 InfiniBand, 2 Ethernet (RoCE)
 *    12    1 active MTU as enum ibv_mtu (1..5 = 256..4096 bytes)
 *    13    1 GID index                   14    1 RDMA READs the sender accepts at once (1..16)
 *    15    1 reserved, 0                 16   16 GID (RoCE: required, not all zero)
 *    32    4 receive WRs the sender keeps posted (1..65536)
 *    36    4 reserved, 0                 40    8 node GUID (diagnostics only)
 * MR info, 32 bytes, sent in RDMA_MR_INFO:
 *     0    8 region address              8    8 region length
 *    16    4 rkey                       20    4 region generation
 *    24    4 region flags (FERRY_MEM_REMOTE_*)  28  4 reserved, 0 */
#define FERRY_RDMA_QP_INFO_SIZE 48
#define FERRY_RDMA_MR_INFO_SIZE 32
#define FERRY_RDMA_LINK_IB 1
#define FERRY_RDMA_LINK_ETH 2

typedef struct ferry_rdma_qp_info {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t port, link_layer, mtu, gid_index, rd_atom;
    uint8_t gid[16];
    uint32_t recv_depth;
    uint64_t guid;
} ferry_rdma_qp_info_t;

typedef struct ferry_rdma_mr_info {
    uint64_t addr, len;
    uint32_t rkey, generation, flags;
} ferry_rdma_mr_info_t;

void ferry_rdma_qp_info_encode(const ferry_rdma_qp_info_t *q, uint8_t out[FERRY_RDMA_QP_INFO_SIZE]);
/* Decodes len bytes and validates every field; MALFORMED_FRAME naming the field. */
int ferry_rdma_qp_info_decode(const uint8_t *in, size_t len, ferry_rdma_qp_info_t *q);
void ferry_rdma_mr_info_encode(const ferry_rdma_mr_info_t *m, uint8_t out[FERRY_RDMA_MR_INFO_SIZE]);
int ferry_rdma_mr_info_decode(const uint8_t *in, size_t len, ferry_rdma_mr_info_t *m);


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
