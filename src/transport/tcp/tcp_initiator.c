/* SPDX-License-Identifier: Apache-2.0 */
/* The TCP transport, initiator side (tcp_internal.h): a transfer is cut
 * into slices of config.slice_size, pipelined with up to a window of
 * slices unacknowledged, and acks arrive in order; small whole pieces go
 * together in vector frames (link/vec.h). A slice of device memory is
 * staged through the connection's buffer (tcp.c says why). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/fail.h"
#include "util/memkind.h"
#include "util/net.h"
#include "util/tsan.h"
#include "link/watch.h"
#include "link/target.h"
#include "link/transport.h"
#include "link/vec.h"
#include "wire/le.h"
#include "tcp_internal.h"

static unsigned window_slices(size_t slice)
{
    unsigned w = (unsigned)(WINDOW_BYTES / slice);
    return w < 2 ? 2 : w > 256 ? 256 : w;
}


static uint32_t crc_of(const ferry_xport_ctx_t *ctx, const void *p, size_t n)
{
    return ctx->checksum ? ferry_crc32c(0, p, n) : 0;
}
/* Sends one slice; for writes its bytes are src (the local buffer, or
 * their staged copy). */
static int send_slice(ferry_conn_t *c, ferry_xfer_t *x, const unsigned char *src, uint64_t off, uint64_t n,
                      uint8_t type)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    const ferry_xport_ctx_t *ctx = c->ctx;
    ferry_frame_t f = {.type = type, .req_id = x->req_id, .addr = x->remote + off, .len = n, .aux = x->generation};
    x->vec_first = 0; /* in slices (cancel.h) */
    ferry_deadline_stamp(c, &f, x->deadline);
    if (type == FERRY_FRAME_WRITE) {
        f.plen = (uint32_t)n;
        if (ctx->checksum) {
            f.flags = FERRY_FRAME_F_CRC;
            f.crc = crc_of(ctx, src, n);
        }
        return ferry_conn_send_frame(c, &f, src, x->deadline);
    }
    if (ctx->checksum) f.flags = FERRY_FRAME_F_CRC; /* asks for a checksummed answer */
    return ferry_conn_send_frame(c, &f, NULL, x->deadline);
}

/* A read answer's n bytes for device memory (no checksum to verify first):
 * received sub-slice by sub-slice into the connection's pinned buffers,
 * each copied to the device while the next is received (memkind.h,
 * ferry_land); 0 only once every copy is complete on the device. A failed
 * copy fails the piece (the rest of the bytes are still read); a failed
 * receive breaks the connection, after the copies in flight are done. */
static int recv_into_device(ferry_conn_t *c, ferry_xfer_t *x, uint64_t off, uint64_t n, uint32_t kind, int *broken)
{
    if (!c->land && !(c->land = ferry_land_new())) {
        *broken = 1; /* the answer's bytes stay unread */
        return ferry_fail(FERRY_ERR_MEMORY, "device-memory landing: out of memory");
    }
    int copy_rc = 0;
    for (uint64_t sub = 0; sub < n; sub += LAND_SLICE) {
        size_t sub_n = n - sub < LAND_SLICE ? (size_t)(n - sub) : LAND_SLICE;
        unsigned char *b;
        bool stream_ok;
        int rc = ferry_land_buffer(c->land, kind, LAND_SLICE, &b);
        if (rc == 0) rc = ferry_net_recv_local(c->fd, b, sub_n, x->deadline, &stream_ok);
        if (rc) {
            ferry_land_settle(c->land);
            *broken = 1;
            return rc;
        }
        if (copy_rc) continue; /* the piece failed: its bytes are read and dropped */
        copy_rc = ferry_land_put(c->land, kind, x->local + off + sub, sub_n);
        if (copy_rc) ferry_land_settle(c->land);
    }
    int rc = copy_rc ? copy_rc : ferry_land_finish(c->land);
    if (rc)
        return ferry_fail_context("read slice [0x%llx+%llu) from %s: copying into device memory",
                                  (unsigned long long)(x->remote + off), (unsigned long long)n, c->peer.name);
    return 0;
}

/* Receives one answer; for reads, the data lands at local + *off_recv. */
static int recv_answer(ferry_conn_t *c, ferry_xfer_t *x, uint64_t off, uint64_t n, int *broken, unsigned spin_us)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    ferry_frame_t f;
    int rc = ferry_recv_answer(c, x, spin_us, &f, broken, NULL, 0);
    if (*broken) return rc;
    if (f.addr != x->remote + off) {
        /* Answers come in order: another slice's (a duplicate is dropped
         * on receipt, conn.c) means the stream is out of step. */
        *broken = 1;
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected the answer for [0x%llx+%llu) of request %llu, got "
                          "one for 0x%llx", (unsigned long long)(x->remote + off), (unsigned long long)n,
                          (unsigned long long)x->req_id, (unsigned long long)f.addr);
    }
    if (rc) return rc;
    if (x->opcode == FERRY_OP_READ) {
        if (f.plen != n) {
            *broken = 1;
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "read answer of %u bytes for a slice of %llu", f.plen,
                              (unsigned long long)n);
        }
        /* Device memory: pipelined into it without a checksum; with one,
         * received whole into the staging buffer, verified, copied in. */
        uint32_t kind = ferry_registry_kind_of(c->ctx->registry, (uint64_t)(uintptr_t)(x->local + off), n, false);
        if (kind != FERRY_MEMKIND_HOST && !(f.flags & FERRY_FRAME_F_CRC))
            return recv_into_device(c, x, off, n, kind, broken);
        unsigned char *dst = kind == FERRY_MEMKIND_HOST ? x->local + off : ferry_conn_bounce(c, n);
        if (!dst) {
            *broken = 1;
            return FERRY_ERR_MEMORY;
        }
        bool stream_ok;
        rc = ferry_net_recv_local(c->fd, dst, n, x->deadline, &stream_ok);
        if (rc) {
            *broken = !stream_ok; /* a read-only local buffer is the caller's error: the connection stays */
            return rc;
        }
        if ((f.flags & FERRY_FRAME_F_CRC) && ferry_crc32c(0, dst, n) != f.crc)
            return ferry_fail(FERRY_ERR_CHECKSUM_MISMATCH, "read slice [0x%llx+%llu) from %s arrived corrupted",
                              (unsigned long long)(x->remote + off), (unsigned long long)n, c->peer.name);
        if (kind != FERRY_MEMKIND_HOST) {
            rc = ferry_memkind_from_host(kind, x->local + off, dst, n);
            if (rc) return ferry_fail_context("read slice [0x%llx+%llu) from %s: staging into device memory",
                                              (unsigned long long)(x->remote + off), (unsigned long long)n,
                                              c->peer.name);
        }
    } else if (f.len != n) {
        *broken = 1;
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "write ack for %llu bytes, slice was %llu",
                          (unsigned long long)f.len, (unsigned long long)n);
    }
    return 0;
}

/* Whether the piece at xs[cur] starts a vector frame (WRITEV or READV): a
 * small whole piece with at least one more like it after it (a lone piece
 * goes as a plain WRITE or READ_REQ, the shortest round trip), and few
 * enough vector frames in flight that their answers cannot fill a socket
 * buffer while we send (a WRITEV's answer is at most 5 KiB; a READV's
 * bytes are at most VEC_FRAME_BYTES, and while any are unread we send
 * nothing but small requests: see tcp_run). */
static bool x_vec_ok(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, size_t cur, uint64_t cur_off, unsigned vec_frames)
{
    return vec_frames < VEC_FRAMES_INFLIGHT && cur + 1 < nx && cur_off == 0 &&
           xs[cur + 1].opcode == xs[cur].opcode && ferry_vec_eligible(c, &xs[cur]) &&
           ferry_piece_sendable(&xs[cur + 1], xs[cur + 1].done) && ferry_vec_eligible(c, &xs[cur + 1]);
}

/* The most bytes a vector frame carries. */
static uint64_t vec_frame_bytes(ferry_conn_t *c)
{
    return c->ctx->checksum ? VEC_FRAME_CRC_BYTES : VEC_FRAME_BYTES;
}

/* Streams slices of every piece, from each piece's ->done on, keeping up
 * to a window of slices unanswered. A failed answer marks its piece and the
 * stream goes on, so one bad range does not stall the others.
 *
 * While read answers are unread, a write waits for them: the target stops
 * reading once it cannot send what it owes us (its answers filling both
 * ends' socket buffers: ~1 MiB where the system caps the 4 MiB we ask for,
 * net.c), and a write's bytes sent meanwhile would then wait on it while it
 * waits on us. Read requests themselves are small. */
static int tcp_run_stream(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, ferry_verdict_t *verdict);

/* No staging copy outlives the call: the caller may free the memory when
 * the transfer returns. */
int ferry_tcp_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, ferry_verdict_t *verdict)
{
    int rc = tcp_run_stream(c, xs, nx, broken, verdict);
    if (c->stage) ferry_stage_settle(c->stage);
    if (c->land) ferry_land_settle(c->land);
    return rc;
}

static int tcp_run_stream(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, ferry_verdict_t *verdict)
{
    (void)verdict; /* tcp reaches every peer: it never falls back */
    size_t slice = c->ctx->slice_size;
    unsigned window = window_slices(slice);
    struct inflight ring[256];
    unsigned head = 0, count = 0;
    size_t cur = 0;
    uint64_t cur_off = nx ? xs[0].done : 0;
    uint64_t inflight = 0;
    unsigned vec_frames = 0, reads_out = 0;
    *broken = 0;
    for (;;) {
        while (cur < nx && !ferry_piece_sendable(&xs[cur], cur_off)) {
            if (++cur < nx) cur_off = xs[cur].done;
        }
        bool may_send = cur < nx && count < window && (reads_out == 0 || xs[cur].opcode == FERRY_OP_READ);
        if (may_send && x_vec_ok(c, xs, nx, cur, cur_off, vec_frames)) {
            /* Small pieces travel together: one WRITEV, one answer. */
            size_t g = ferry_vec_collect(c, xs + cur, nx - cur, vec_frame_bytes(c));
            int rc = ferry_vec_send(c, xs[cur].opcode == FERRY_OP_WRITE ? FERRY_FRAME_WRITEV : FERRY_FRAME_READV,
                                    xs + cur, g);
            if (rc) {
                *broken = 1;
                return rc;
            }
            uint64_t bytes = 0;
            for (size_t i = 0; i < g; i++) bytes += xs[cur + i].len;
            ring[(head + count++) % 256] = (struct inflight){.x = &xs[cur], .n = bytes, .count = (uint32_t)g};
            inflight += bytes;
            vec_frames++;
            reads_out += xs[cur].opcode == FERRY_OP_READ;
            cur += g;
            cur_off = cur < nx ? xs[cur].done : 0;
            continue;
        }
        if (may_send) {
            ferry_xfer_t *x = &xs[cur];
            uint64_t n = x->len - cur_off < slice ? x->len - cur_off : slice;
            const unsigned char *src = x->local + cur_off;
            uint32_t kind = x->opcode == FERRY_OP_WRITE
                                ? ferry_registry_kind_of(c->ctx->registry, (uint64_t)(uintptr_t)src, n, false)
                                : FERRY_MEMKIND_HOST;
            if (kind != FERRY_MEMKIND_HOST) {
                /* Device memory: stage the slice through the connection's
                 * pinned buffers, and start the copy of the piece's next
                 * slice before this one is sent (memkind.h, ferry_stage);
                 * a failed copy fails the piece, not the connection. */
                unsigned char *b = NULL;
                if (!c->stage) c->stage = ferry_stage_new();
                int src_rc = c->stage ? ferry_stage_take(c->stage, kind, src, n, &b) : FERRY_ERR_MEMORY;
                if (src_rc) {
                    ferry_fail_context("write of [%p+%llu): staging from device memory", (const void *)src,
                                       (unsigned long long)n);
                    ferry_xfer_fail(x, src_rc);
                    continue;
                }
                uint64_t rest = x->len - cur_off - n;
                if (rest) ferry_stage_prefetch(c->stage, kind, src + n, rest < slice ? rest : slice);
                src = b;
            }
            x->inflight++; /* before the first byte leaves: a partial frame is in doubt too (cancel.h) */
            int rc = send_slice(c, x, src, cur_off, n, x->opcode == FERRY_OP_WRITE ? FERRY_FRAME_WRITE : FERRY_FRAME_READ_REQ);
            if (rc) {
                *broken = 1;
                return rc;
            }
            ring[(head + count++) % 256] = (struct inflight){.x = x, .off = cur_off, .n = n};
            cur_off += n;
            inflight += n;
            reads_out += x->opcode == FERRY_OP_READ;
            continue;
        }
        if (count == 0) break;
        struct inflight in = ring[head];
        head = (head + 1) % 256;
        count--;
        unsigned spin = inflight <= SPIN_INFLIGHT_BYTES ? ferry_conn_spin_us(c) : 0;
        inflight -= in.n;
        reads_out -= in.x->opcode == FERRY_OP_READ;
        if (in.count) {
            vec_frames--;
            int rc = in.x->opcode == FERRY_OP_READ ? ferry_vec_recv_read(c, in.x, in.count, spin, broken)
                                                   : ferry_vec_recv_ack(c, in.x, in.count, spin, broken, false, NULL,
                                                                        NULL, 0);
            if (*broken) return rc;
            continue;
        }
        int rc = recv_answer(c, in.x, in.off, in.n, broken, spin);
        if (*broken) return rc;
        in.x->inflight--;
        if (rc) {
            if (in.x->rc == 0) ferry_xfer_fail(in.x, rc);
        } else if (in.x->rc == 0) {
            in.x->done += in.n;
            if (in.x->progress) atomic_fetch_add(in.x->progress, in.n);
        }
    }
    for (size_t i = 0; i < nx; i++) {
        ferry_xfer_t *x = &xs[i];
        if (x->rc == 0 && x->done < x->len)
            ferry_xfer_fail(x, ferry_fail(FERRY_ERR_CANCELLED, "cancelled after %llu of %llu bytes",
                                          (unsigned long long)x->done, (unsigned long long)x->len));
    }
    return 0;
}
