/* SPDX-License-Identifier: Apache-2.0 */
/* The TCP transport: bytes travel inline in WRITE / READ_RESP frames (and
 * the vector frames WRITEV / READV, link/vec.h). Its ops table is here;
 * the initiator side is in tcp_initiator.c, the target side in
 * tcp_target.c.
 *
 * Initiator: a transfer is cut into slices of config.slice_size, pipelined
 * with up to a window of slices unacknowledged, and acks arrive in order.
 * Target: each slice is validated against the registry, then received
 * straight into the destination (no bounce copy unless checksums are on),
 * chunk by chunk under the registry's read lock, so that a deregistration
 * waits for the chunk in progress and later chunks see it.
 *
 * Device memory (util/memkind.h) cannot be sent from or received into by
 * the socket calls, so slices of a device region go through the
 * connection's staging buffer: device->host before a send, host->device
 * after a receive. Those hooks sit at the four points where bytes meet
 * memory (send_slice's caller, recv_answer, place_staged, serve_read) and
 * cost one relaxed load when no device memory is registered. */
#include <stdio.h>

#include "tcp_internal.h"

static int tcp_usable(ferry_xport_ctx_t *ctx, const ferry_hello_t *peer, char *why, size_t cap)
{
    (void)ctx;
    (void)peer;
    snprintf(why, cap, "tcp reaches every peer");
    return 1;
}

static const uint8_t tcp_frames[] = {FERRY_FRAME_WRITE, FERRY_FRAME_READ_REQ, FERRY_FRAME_WRITEV, FERRY_FRAME_READV};

const ferry_transport_ops_t ferry_transport_tcp = {
    .name = "tcp",
    .usable = tcp_usable,
    .run = ferry_tcp_run,
    .serve = ferry_tcp_serve,
    .serve_types = tcp_frames,
    .nserve_types = sizeof tcp_frames,
    .version = FERRY_TRANSPORT_OPS_VERSION,
};
