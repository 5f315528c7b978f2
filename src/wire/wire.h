/* SPDX-License-Identifier: Apache-2.0 */
/* Ferry's wire protocol: fixed 56-byte frame headers, little-endian,
 * optionally followed by a payload of plen bytes.
 *
 *   off  size  field
 *     0     4  magic "FRRY" (0x59525246)
 *     4     1  type (enum ferry_frame_type)
 *     5     1  flags (FERRY_FRAME_F_*)
 *     6     2  reserved, must be 0
 *     8     4  status (i32: 0 or a negative Ferry code)
 *    12     4  plen: payload bytes that follow
 *    16     8  req_id: the initiator's request id, echoed in answers
 *    24     8  addr: target address (WRITE, READ_REQ, CMA_*)
 *    32     8  len: operation length in bytes
 *    40     8  aux: region generation (WRITE, READ_REQ), source address (CMA),
 *              segment version (SEG_PAGE), start index (SEG_QUERY),
 *              connection key (HELLO_ACK, CANCEL)
 *    48     4  crc: CRC32C of the payload when FERRY_FRAME_F_CRC is set;
 *              CMA_WRITE / CMA_READ (no payload): the region generation
 *    52     4  data frames with FERRY_FRAME_F_DEADLINE: the request's
 *              deadline on the target's CLOCK_MONOTONIC, in milliseconds
 *              modulo 2^32 (deadline_ms, see FERRY_FRAME_F_DEADLINE);
 *              otherwise reserved, must be 0
 *
 * Every length and count read off the wire is checked against the limits
 * below before anything is allocated, so a hostile peer cannot make us
 * allocate or read without bound. */
#ifndef FERRY_WIRE_H
#define FERRY_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FERRY_WIRE_MAGIC 0x59525246u
#define FERRY_FRAME_HEADER_SIZE 56
/* Largest payload of a data frame (one slice). */
#define FERRY_WIRE_MAX_DATA (64u << 20)
/* Largest payload of a control frame (hello, segment page, notify). */
#define FERRY_WIRE_MAX_CONTROL (1u << 20)
/* Segment entries per SEG_PAGE: keeps each page well under the control cap,
 * and the segment table itself unbounded. */
#define FERRY_WIRE_SEGMENTS_PER_PAGE 4096
#define FERRY_WIRE_SEGMENT_SIZE 24
/* Most segments a peer may advertise (a 24-byte entry each: 384 MiB). */
#define FERRY_WIRE_MAX_SEGMENTS (16u << 20)
#define FERRY_WIRE_MAX_NAME 255
#define FERRY_WIRE_MAX_NOTIFY (64u << 10)
#define FERRY_WIRE_NONCE_SIZE 32
#define FERRY_WIRE_MAC_SIZE 32
/* A failing answer may carry the target's detail text, this long at most. */
#define FERRY_WIRE_MAX_REASON 1024

enum ferry_frame_type {
    FERRY_FRAME_HELLO = 1,      /* i->t: hello payload */
    FERRY_FRAME_HELLO_ACK = 2,  /* t->i: status, hello payload; aux = the key CANCELs name this connection by */
    FERRY_FRAME_SEG_QUERY = 3,  /* i->t: aux = first index wanted */
    FERRY_FRAME_SEG_PAGE = 4,   /* t->i: addr = total count, aux = version, payload entries */
    FERRY_FRAME_WRITE = 5,      /* i->t: payload = data for [addr, addr+len) */
    FERRY_FRAME_WRITE_ACK = 6,  /* t->i: status, len = bytes placed */
    FERRY_FRAME_READ_REQ = 7,   /* i->t: send me [addr, addr+len) */
    FERRY_FRAME_READ_RESP = 8,  /* t->i: status, payload = data */
    FERRY_FRAME_NOTIFY = 9,     /* i->t: payload = message */
    FERRY_FRAME_NOTIFY_ACK = 10,
    FERRY_FRAME_PING = 11,
    FERRY_FRAME_PONG = 12,
    FERRY_FRAME_CANCEL = 13,    /* i->t: req_id = request to refuse from now on, on the connection whose
                                   key is aux (0: every connection of this peer); core/cancel.h */
    FERRY_FRAME_CANCEL_ACK = 14,
    FERRY_FRAME_CMA_WRITE = 15, /* i->t: target pulls [aux, aux+len) of the initiator into addr */
    FERRY_FRAME_CMA_READ = 16,  /* i->t: target pushes [addr, addr+len) into the initiator's aux */
    FERRY_FRAME_AUTH = 17,      /* i->t: payload = MAC over the target's nonce */
    FERRY_FRAME_AUTH_ACK = 18,  /* t->i: status, payload = MAC over the initiator's nonce */
    FERRY_FRAME_ERROR = 19,     /* t->i: status, payload = text; the connection closes */
    /* 20..25: the RDMA transport's first frames (src/transport/rdma/rdma_wire.h). */
    /* Shared pools (transport/shm.c), only on connections whose pid the
     * target verified: */
    FERRY_FRAME_SHM_MAP_REQ = 26,      /* i->t: may I map [addr, addr+len)? crc = generation, aux = probe address */
    FERRY_FRAME_SHM_MAP_RESP = 27,     /* t->i: status; payload = ferry_shm_map_info, or the reason text */
    /* Vector frames (protocol 2, see "Vector frames" below): many small
     * pieces in one frame, one answer for them all. */
    FERRY_FRAME_WRITEV = 28,    /* i->t: len = pieces; payload = descriptors, then the pieces' bytes */
    FERRY_FRAME_VEC_ACK = 29,   /* t->i: len = pieces; status < 0: payload = per-piece statuses + reason */
    FERRY_FRAME_CMA_VEC = 30,   /* i->t: len = pieces; payload = descriptors (aux: the initiator's address);
                                 * frame aux = FERRY_OP_WRITE (target pulls) or FERRY_OP_READ (pushes) */
    FERRY_FRAME_READV = 31,     /* i->t: len = pieces; payload = descriptors; answered by a VEC_ACK with the bytes */
    FERRY_FRAME_TYPE_MAX = 31   /* the last core frame; 32..63 are for core frames to come */
};

/* Frame ids past the core ones (FERRY_FRAME_TRANSPORT_FIRST..255) belong
 * to one transport each, which declares them in its own files (for RDMA,
 * rdma_wire.h): their ids, names and payload limits in its ops' frames
 * table, which wire.c reads through the lookup below, and serves them (its
 * serve_types, transport.h). No list here names them; test_transport_frames
 * checks that no id is declared twice. A few frames of the core range that
 * predate this (CMA_WRITE, CMA_READ, RDMA_* 20..25, SHM_MAP_*) keep their
 * ids (the wire format does not change), but their names and limits too
 * come from the transport that declares them. */
#define FERRY_FRAME_TRANSPORT_FIRST 64

/* One frame a transport declares: its id, its name (for messages), the
 * largest payload it may carry (ferry_frame_decode refuses more) and what
 * serving it writes (FERRY_FRAME_DEF_*: the exactly-once log, cancel.h). */
typedef struct ferry_frame_def {
    uint8_t type;
    const char *name;
    uint32_t max_payload;
    uint32_t places;
} ferry_frame_def_t;

/* ferry_frame_def_t.places: serving the frame writes into the target's
 * memory (a write: logged with its progress, settled by the fence's report,
 * a repeat dropped); or into the initiator's own memory (a read served by
 * the target's copy: logged, a repeat dropped, since it would land in a
 * buffer its caller reuses once the read returned); or the one or the other
 * as the frame's aux says (FERRY_OP_WRITE, FERRY_OP_READ). 0: neither (the
 * answer carries the bytes, or the frame is control). */
#define FERRY_FRAME_PLACES_TARGET 1u
#define FERRY_FRAME_PLACES_INITIATOR 2u
#define FERRY_FRAME_PLACES_BY_OP 3u
/* The places value of a transport's frame type; 0 for core frames. */
uint32_t ferry_frame_places(uint8_t type);

/* How wire.c finds the frame of a type it does not define itself: the
 * transport table's ferry_transport_frame_def (transport.c), installed once
 * at load time. NULL (the default) or a type no one declares: an unknown
 * frame, refused. The wire layer so never depends on the transports. */
typedef const ferry_frame_def_t *(*ferry_frame_lookup_fn)(uint8_t type);
void ferry_wire_set_frame_lookup(ferry_frame_lookup_fn lookup);
/* Whether id type is the core's: a frame wire.c defines itself, or an id
 * of the core range kept for core frames to come (32..63). The ids of the
 * core range that transports declare (CMA_*, RDMA_* 20..25, SHM_MAP_*) are
 * not. No transport's frame range may hold a core id (transport.h). */
bool ferry_frame_is_core(uint8_t type);

#define FERRY_FRAME_F_CRC 0x01u
/* Vector frames only (protocol 3): the pieces are described compactly
 * ("Compact vector frames" below). */
#define FERRY_FRAME_F_COMPACT 0x02u
/* With F_COMPACT: the pieces lie in regions of several generations, listed
 * per piece (the compact header's generation is then 0). */
#define FERRY_FRAME_F_GENS 0x04u
/* CANCEL only, to targets advertising FERRY_HELLO_F_CONNFENCE: refuse every
 * later frame of the whole data connection whose key is aux (req_id is only
 * echoed in the CANCEL_ACK); core/cancel.h. */
#define FERRY_FRAME_F_CONN 0x08u
/* CANCEL: report what the named connection placed; CANCEL_ACK: the payload
 * is that report (to and from targets advertising FERRY_HELLO_F_PLACED;
 * the layout is in core/cancel.h, "Placement reports"). */
#define FERRY_FRAME_F_PLACED 0x10u
/* Data frames (WRITE, READ_REQ, WRITEV, READV, CMA_WRITE, CMA_READ,
 * CMA_VEC), to targets advertising FERRY_HELLO_F_DEADLINE: header bytes
 * 52..55 carry the request's deadline converted to the target's
 * CLOCK_MONOTONIC milliseconds (mod 2^32; compared wrap-aware, so deadlines
 * within 2^30 ms only). The initiator learns the conversion at the
 * handshake: the HELLO_ACK's addr holds the target's CLOCK_MONOTONIC
 * nanoseconds when it answered, T; with t0 when the initiator sent its HELLO,
 * the target's clock reads at most (initiator clock) + (T - t0), so the
 * initiator sends deadline + (T - t0), rounded up: the target's view of the
 * deadline is never earlier than the initiator's (late by at most the
 * handshake's round trip). The target refuses, by its own clock, each chunk
 * of such a frame that it would place or send after that deadline (core/cancel.h).
 * NOTIFY frames carry it too, to targets advertising FERRY_HELLO_F_NOTIFY_ONCE:
 * the target refuses (does not queue) a NOTIFY past it, answering TIMEOUT. */
#define FERRY_FRAME_F_DEADLINE 0x20u

typedef struct ferry_frame {
    uint8_t type;
    uint8_t flags;
    int32_t status;
    uint32_t plen;
    uint64_t req_id;
    uint64_t addr;
    uint64_t len;
    uint64_t aux;
    uint32_t crc;
    uint32_t deadline_ms;      /* with FERRY_FRAME_F_DEADLINE: bytes 52..55 */
} ferry_frame_t;

/* Encodes f into exactly FERRY_FRAME_HEADER_SIZE bytes. */
void ferry_frame_encode(const ferry_frame_t *f, uint8_t out[FERRY_FRAME_HEADER_SIZE]);
/* Decodes and validates a header: magic, type, reserved bytes, and plen
 * against the limit for its type. 0 or FERRY_ERR_MALFORMED_FRAME (detail set). */
int ferry_frame_decode(const uint8_t in[FERRY_FRAME_HEADER_SIZE], ferry_frame_t *f);
/* The largest payload a frame of this type may carry. */
uint32_t ferry_frame_max_payload(uint8_t type);
const char *ferry_frame_type_name(uint8_t type);

/* Handshake payload, sent by both sides. */
#define FERRY_HELLO_F_AUTH 0x01u   /* the sender requires shared-secret auth */
/* 0x02, 0x08, 0x10: the shm transport's (src/transport/shm/shm_wire.h);
 * 0x04: the RDMA transport's (src/transport/rdma/rdma_wire.h). Each
 * transport declares the bits it owns (hello_bits, link/transport.h). */
/* The sender serves CANCEL with FERRY_FRAME_F_CONN (a whole connection
 * fenced at once, core/cancel.h). */
#define FERRY_HELLO_F_CONNFENCE 0x20u
/* The sender keeps placement logs, drops duplicate write frames and answers
 * CANCEL with FERRY_FRAME_F_PLACED by a placement report (exactly-once
 * resends, core/cancel.h). Initiators resend a write whose answer was lost
 * only to such targets. */
#define FERRY_HELLO_F_PLACED 0x40u
/* The sender honours FERRY_FRAME_F_DEADLINE, and its HELLO_ACK's addr is its
 * CLOCK_MONOTONIC in nanoseconds (FERRY_FRAME_F_DEADLINE above). */
#define FERRY_HELLO_F_DEADLINE 0x80u
/* The sender serves NOTIFY exactly once and never late (core/cancel.h,
 * "Notifications"): it logs each NOTIFY in the connection's placement log
 * (reported to a CANCEL with FERRY_FRAME_F_PLACED), drops a repeated one,
 * and refuses a NOTIFY whose FERRY_FRAME_F_DEADLINE passed or whose id was
 * fenced. Initiators stamp NOTIFYs with deadlines, and resend a NOTIFY whose
 * answer was lost, only to such targets. */
#define FERRY_HELLO_F_NOTIFY_ONCE 0x100u

/* The bits the core owns; every other bit is a transport's. */
#define FERRY_HELLO_F_CORE                                                                                  \
    (FERRY_HELLO_F_AUTH | FERRY_HELLO_F_CONNFENCE | FERRY_HELLO_F_PLACED | FERRY_HELLO_F_DEADLINE |         \
     FERRY_HELLO_F_NOTIFY_ONCE)

typedef struct ferry_hello {
    uint16_t proto_min, proto_max;
    uint32_t flags;
    uint64_t engine_id;
    uint64_t epoch;
    uint64_t expect_epoch;      /* i->t: the epoch the initiator knew, 0 = none */
    uint64_t segment_version;
    uint64_t segment_count;
    int32_t pid;
    uint8_t host_id[16];         /* boot id: equal on the same host */
    uint8_t nonce[FERRY_WIRE_NONCE_SIZE];
    char name[FERRY_WIRE_MAX_NAME + 1];
} ferry_hello_t;

#define FERRY_HELLO_FIXED_SIZE (2 + 2 + 4 + 8 + 8 + 8 + 8 + 8 + 4 + 16 + FERRY_WIRE_NONCE_SIZE + 2)

/* Encodes into out (capacity cap); returns the size or FERRY_ERR_INVALID_ARGUMENT. */
int ferry_hello_encode(const ferry_hello_t *h, uint8_t *out, size_t cap);
/* Decodes len bytes; FERRY_ERR_MALFORMED_FRAME on any inconsistency. */
int ferry_hello_decode(const uint8_t *in, size_t len, ferry_hello_t *h);

/* Segment entries: addr u64, len u64, flags u32, generation u32. */
typedef struct ferry_wire_segment {
    uint64_t addr, len;
    uint32_t flags, generation;
} ferry_wire_segment_t;

/* ---- Vector frames (protocol 2) ----
 * A WRITEV or CMA_VEC frame carries n pieces (1..FERRY_WIRE_VEC_MAX): the
 * header's len = n, addr = the pieces' total bytes, req_id = the first
 * piece's id (the answer echoes it). Its payload starts with n descriptors
 * of 32 bytes:
 *   off size field
 *     0    8 target address          8    4 length (1..FERRY_WIRE_VEC_PIECE_MAX;
 *                                          CMA_VEC: FERRY_WIRE_CMA_PIECE_MAX)
 *    12    4 region generation      16    8 the piece's own request id (cancel.h)
 *    24    8 WRITEV: CRC32C of the piece in the low 32 bits when the frame
 *              has FERRY_FRAME_F_CRC, else 0; CMA_VEC: the initiator's address
 * and, for WRITEV, the pieces' bytes follow in descriptor order.
 * The one VEC_ACK echoes req_id and len = n, addr = bytes placed. Status 0:
 * every piece placed, no payload. Status < 0 (the first failure's code):
 * payload = n statuses (i32 each, 0 or a Ferry code), then the first
 * failed piece's reason text. A piece that fails has placed nothing the
 * caller may rely on; the others are placed (pieces fail one by one).
 * A READV (descriptors only; F_CRC asks for checksums) is answered by a
 * VEC_ACK that carries the bytes: addr = the bytes that follow, aux = the
 * reason text's length; payload = [n statuses, reason text: status < 0]
 * [n CRC32Cs, u32 each: F_CRC] [the placed pieces' bytes, in order]. */
#define FERRY_WIRE_VEC_MAX 1024
#define FERRY_WIRE_VEC_DESC_SIZE 32
#define FERRY_WIRE_VEC_PIECE_MAX (64u << 10)
/* A CMA_VEC piece (no bytes on the wire) may be up to this long when the
 * target advertises FERRY_HELLO_F_CMA_BIG (1 MiB pieces then go many to a
 * frame, one answer for them: shm.c); to others, FERRY_WIRE_VEC_PIECE_MAX. */
#define FERRY_WIRE_CMA_PIECE_MAX (4u << 20)
/* The protocol version that added vector frames. */
#define FERRY_PROTOCOL_VEC 2

typedef struct ferry_vec_desc {
    uint64_t addr;
    uint32_t len, generation;
    uint64_t req_id;
    uint64_t aux;
} ferry_vec_desc_t;

void ferry_vec_desc_encode(const ferry_vec_desc_t *d, uint8_t out[FERRY_WIRE_VEC_DESC_SIZE]);
/* Checks a vector frame's header: piece count and payload size against
 * the total it declares. 0 or MALFORMED_FRAME. */
int ferry_vec_frame_check(const ferry_frame_t *f);
/* Decodes the n descriptors in[0 .. n*32) of frame f (checked by
 * ferry_vec_frame_check): every length in range, no range wraps, the
 * lengths add up to f->addr, CMA initiator addresses non-zero and not
 * wrapping. 0 or MALFORMED_FRAME naming the piece. */
int ferry_vec_desc_decode(const ferry_frame_t *f, const uint8_t *in, ferry_vec_desc_t *out);
/* Checks a VEC_ACK for n pieces against its header; for status < 0,
 * decodes the statuses (each 0 or a Ferry code, at least one failing).
 * 0 or MALFORMED_FRAME. */
int ferry_vec_ack_check(const ferry_frame_t *f, uint32_t n);
/* The same for the answer to a READV of n pieces, total bytes at most. */
int ferry_vec_read_ack_check(const ferry_frame_t *f, uint32_t n, uint64_t total);
int ferry_vec_statuses_decode(const uint8_t *in, uint32_t n, int32_t *st);

/* ---- Compact vector frames (protocol 3) ----
 * A WRITEV, READV or CMA_VEC with FERRY_FRAME_F_COMPACT describes its n
 * pieces (all of one length, request ids f.req_id + i, one region
 * generation or, with F_GENS, one listed per piece) in place of the n
 * descriptors, the common KV shape of pages at
 * base + index * stride:
 *     0    8 target base              8    8 target stride
 *    16    8 CMA_VEC: initiator base  24    8 CMA_VEC: initiator stride (else both 0)
 *    32    4 piece length            36    4 region generation
 *    40      n u32 target indices; CMA_VEC: then n u32 initiator indices;
 *            WRITEV with F_CRC: then n u32 CRC32Cs of the pieces;
 *            F_GENS: then n u32 region generations (pieces of one
 *            descriptor spanning several registrations, a layer's K and V
 *            buffers each its own; the header's generation is 0)
 * Piece i lies at target base + index[i] * stride. The target expands the
 * pieces into descriptors (every address computed without overflow and
 * not wrapping, else MALFORMED_FRAME) and checks them against its
 * registry, the whole span at once when it lies in one region; the answer
 * is the same VEC_ACK. An initiator speaking to a peer older than this
 * version sends the descriptors instead. */
#define FERRY_PROTOCOL_COMPACT 3
#define FERRY_WIRE_COMPACT_HEAD 40

typedef struct ferry_vec_compact {
    uint64_t base, stride;     /* the target's side */
    uint64_t lbase, lstride;   /* CMA_VEC: the initiator's side */
    uint32_t len, generation;
} ferry_vec_compact_t;

void ferry_vec_compact_encode(const ferry_vec_compact_t *h, uint8_t out[FERRY_WIRE_COMPACT_HEAD]);
/* The payload bytes that describe the pieces of vector frame f. */
uint64_t ferry_vec_desc_bytes(const ferry_frame_t *f);
/* Expands the compact description in[0 .. ferry_vec_desc_bytes(f)) of
 * frame f (checked by ferry_vec_frame_check) into f->len descriptors:
 * length in range, no address overflowing or wrapping, CMA initiator
 * addresses non-zero. *lo and *hi get the span of the target ranges.
 * 0 or MALFORMED_FRAME naming the piece and its index. */
int ferry_vec_compact_decode(const ferry_frame_t *f, const uint8_t *in, ferry_vec_desc_t *out, uint64_t *lo,
                             uint64_t *hi);

void ferry_segment_encode(const ferry_wire_segment_t *s, uint8_t out[FERRY_WIRE_SEGMENT_SIZE]);
/* Decodes; rejects zero length and address wrap-around. */
int ferry_segment_decode(const uint8_t in[FERRY_WIRE_SEGMENT_SIZE], ferry_wire_segment_t *s);


#endif
