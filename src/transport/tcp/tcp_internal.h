/* SPDX-License-Identifier: Apache-2.0 */
/* The TCP transport's two halves (tcp.c, README "Layout"): the initiator
 * (tcp_initiator.c) and the target (tcp_target.c), and what they share. */
#ifndef FERRY_TRANSPORT_TCP_INTERNAL_H
#define FERRY_TRANSPORT_TCP_INTERNAL_H

#include "link/transport.h"

/* Slices in flight per connection: enough to keep loopback and a LAN busy,
 * few enough that acks (56 bytes each) never fill a socket buffer. */
#define WINDOW_BYTES (32u << 20)
#define CHUNK_BYTES (1u << 20)
/* Waiting on at most this many unanswered bytes, the answer is due within
 * microseconds: spin for it rather than sleep (ferry_net_recv_spin). */
#define SPIN_INFLIGHT_BYTES (64u << 10)

/* Vector frames (vec.h): bytes per frame, and frames in flight. Without
 * checksums a frame's bytes stream between the socket and the pieces'
 * memory as they come (a WRITEV's are received straight into place, a
 * READV's sent straight from the target's memory and received into the
 * local buffers), so a frame may be large: a paged-KV call of 1,024 pieces
 * of up to 4 KiB then goes as one frame per connection, one answer, one
 * wake-up each side (512 KiB frames made 2-4 a connection and call, and
 * ~1.5x the syscalls and context switches). With checksums a frame's bytes
 * are staged or summed whole (a WRITEV's before any of it is placed, a
 * READV's before its answer leaves): those frames stay at
 * VEC_FRAME_CRC_BYTES, so that one side works on one while the next is on
 * its way. */
#define VEC_FRAME_BYTES (2u << 20)
#define VEC_FRAME_CRC_BYTES (512u << 10)
#define VEC_FRAMES_INFLIGHT 16
/* While the payload of a vector frame is awaited, the target sleeps until
 * this much of it (or all that is left, if less) is in the socket rather
 * than waking at every segment (SO_RCVLOWAT; loopback's are 64 KiB). */
#define VEC_RCVLOWAT (256u << 10)

/* Device memory without checksums: the unit of the pipelines that copy
 * between device and host memory while the socket moves the bytes before
 * or after (util/memkind.h: ferry_stage, ferry_land; tcp_device.c). */
#define LAND_SLICE (256u << 10)

/* Initiator side: the transport's run (transport.h). */
int ferry_tcp_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, ferry_verdict_t *verdict);
/* Target side: the transport's serve (transport.h). */
int ferry_tcp_serve(ferry_conn_t *c, const ferry_frame_t *f);
/* tcp_target.c: what the socket holds now, up to want bytes, into dst (the
 * target's memory or its own buffers): the count (0: none yet), the
 * connection's failure, or ADDRESS_NOT_REGISTERED (no detail) when the
 * kernel refused to write dst. */
long ferry_tcp_recv_ready(int fd, unsigned char *dst, size_t want);
/* Target side, device memory (tcp_device.c): one hold of a WRITE's
 * landing (0 with *dry / *refused, or the connection's failure); a READ's
 * answer after its header (0, FERRY_SERVE_PENDING, or a failure). */
int ferry_tcp_land_hold(ferry_conn_t *c, ferry_partial_t *p, bool *dry, int *refused);
int ferry_tcp_device_send(ferry_conn_t *c, ferry_partial_t *p);
/* A WRITEV with pieces in device memory (tcp_device.c): the first such
 * piece's kind, the lander's buffer to receive its payload into (NULL: out
 * of memory), and after its pieces were put: the wait for their copies,
 * failing every device piece if one failed (under the read lock). */
struct ferry_vec_scratch;
uint32_t ferry_tcp_vec_kind_locked(ferry_registry_t *r, const struct ferry_vec_scratch *v, size_t n);
unsigned char *ferry_tcp_vec_buffer(ferry_conn_t *c, uint32_t kind, size_t n);
void ferry_tcp_vec_land_finish_locked(ferry_conn_t *c, ferry_registry_t *r, struct ferry_vec_scratch *v, size_t n);
/* A READV with pieces in device memory: its served pieces gathered into
 * the lander's buffer (given until the answer is sent: ferry_land_drop),
 * every copy done; NULL when out of memory. */
unsigned char *ferry_tcp_vec_gather_locked(ferry_conn_t *c, ferry_registry_t *r, struct ferry_vec_scratch *v,
                                           size_t n, uint64_t bytes);

#endif
