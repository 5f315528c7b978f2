/* The TCP transport: bytes travel inline in WRITE / READ_RESP frames.
 *
 * Initiator: a transfer is cut into slices of config.slice_size, pipelined
 * with up to a window of slices unacknowledged, and acks arrive in order.
 * Target: each slice is validated against the registry, then received
 * straight into the destination (no bounce copy unless checksums are on),
 * chunk by chunk under the registry's read lock, so that a deregistration
 * waits for the chunk in progress and later chunks see it.
 *
 * Device memory (core/memkind.h) cannot be sent from or received into by
 * the socket calls, so slices of a device region go through the
 * connection's staging buffer: device->host before a send, host->device
 * after a receive. Those hooks sit at the four points where bytes meet
 * memory (send_slice's caller, recv_answer, place_staged, serve_read) and
 * cost one relaxed load when no device memory is registered. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/clock.h"
#include "core/fail.h"
#include "core/memkind.h"
#include "core/net.h"
#include "transport.h"

/* Slices in flight per connection: enough to keep loopback and a LAN busy,
 * few enough that acks (56 bytes each) never fill a socket buffer. */
#define WINDOW_BYTES (32u << 20)
#define CHUNK_BYTES (1u << 20)
/* Waiting on at most this many unanswered bytes, the answer is due within
 * microseconds: spin for it rather than sleep (ferry_net_recv_spin). */
#define SPIN_INFLIGHT_BYTES (64u << 10)

static unsigned window_slices(size_t slice)
{
    unsigned w = (unsigned)(WINDOW_BYTES / slice);
    return w < 2 ? 2 : w > 256 ? 256 : w;
}


static uint32_t crc_of(const ferry_engine_t *e, const void *p, size_t n)
{
    return e->cfg.checksum ? ferry_crc32c(0, p, n) : 0;
}

/* The memory kind of the registered range [p, p+n) of this engine; host
 * without a lookup when no device memory is registered. */
static uint32_t kind_of(ferry_registry_t *r, uint64_t p, uint64_t n, bool locked)
{
    if (ferry_registry_device_count(r) == 0) return FERRY_MEMKIND_HOST;
    if (!locked) ferry_registry_read_lock(r);
    const ferry_region_t *reg = ferry_registry_lookup_locked(r, p, n);
    uint32_t k = reg ? reg->kind : FERRY_MEMKIND_HOST;
    if (!locked) ferry_registry_unlock(r);
    return k;
}

/* ------------------------------------------------------------ initiator */

/* Sends one slice; for writes its bytes are src (the local buffer, or
 * their staged copy). */
static int send_slice(ferry_conn_t *c, ferry_xfer_t *x, const unsigned char *src, uint64_t off, uint64_t n,
                      uint8_t type)
{
    ferry_engine_t *e = c->engine;
    ferry_frame_t f = {.type = type, .req_id = x->req_id, .addr = x->remote + off, .len = n, .aux = x->generation};
    if (type == FERRY_FRAME_WRITE) {
        f.plen = (uint32_t)n;
        if (e->cfg.checksum) {
            f.flags = FERRY_FRAME_F_CRC;
            f.crc = crc_of(e, src, n);
        }
        return ferry_conn_send_frame(c, &f, src, x->deadline);
    }
    if (e->cfg.checksum) f.flags = FERRY_FRAME_F_CRC; /* asks for a checksummed answer */
    return ferry_conn_send_frame(c, &f, NULL, x->deadline);
}

/* Receives one answer; for reads, the data lands at local + *off_recv. */
static int recv_answer(ferry_conn_t *c, ferry_xfer_t *x, uint64_t off, uint64_t n, int *broken, unsigned spin_us)
{
    ferry_frame_t f;
    int rc = ferry_recv_answer(c, x, spin_us, &f, broken, NULL, 0);
    if (rc) return rc;
    if (x->opcode == FERRY_OP_READ) {
        if (f.plen != n) {
            *broken = 1;
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "read answer of %u bytes for a slice of %llu", f.plen,
                              (unsigned long long)n);
        }
        /* Device memory: receive into the staging buffer, copy in after. */
        uint32_t kind = kind_of(&c->engine->registry, (uint64_t)(uintptr_t)(x->local + off), n, false);
        unsigned char *dst = kind == FERRY_MEMKIND_HOST ? x->local + off : ferry_conn_bounce(c, n);
        if (!dst) {
            *broken = 1;
            return FERRY_ERR_MEMORY;
        }
        rc = ferry_net_recv(c->fd, dst, n, x->deadline);
        if (rc) {
            *broken = 1;
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

/* Streams slices of every piece, from each piece's ->done on, keeping up
 * to a window of slices unanswered. A failed answer marks its piece and the
 * stream goes on, so one bad range does not stall the others. */
static int tcp_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken)
{
    size_t slice = c->engine->cfg.slice_size;
    unsigned window = window_slices(slice);
    struct inflight ring[256];
    unsigned head = 0, count = 0;
    size_t cur = 0;
    uint64_t cur_off = nx ? xs[0].done : 0;
    uint64_t inflight = 0;
    *broken = 0;
    for (;;) {
        while (cur < nx && !ferry_piece_sendable(&xs[cur], cur_off)) {
            if (++cur < nx) cur_off = xs[cur].done;
        }
        if (cur < nx && count < window) {
            ferry_xfer_t *x = &xs[cur];
            uint64_t n = x->len - cur_off < slice ? x->len - cur_off : slice;
            const unsigned char *src = x->local + cur_off;
            uint32_t kind = x->opcode == FERRY_OP_WRITE
                                ? kind_of(&c->engine->registry, (uint64_t)(uintptr_t)src, n, false)
                                : FERRY_MEMKIND_HOST;
            if (kind != FERRY_MEMKIND_HOST) {
                /* Device memory: stage the slice; a failed copy fails the
                 * piece, not the connection. */
                unsigned char *b = ferry_conn_bounce(c, n);
                int src_rc = b ? ferry_memkind_to_host(kind, b, src, n) : FERRY_ERR_MEMORY;
                if (src_rc) {
                    ferry_fail_context("write of [%p+%llu): staging from device memory", (const void *)src,
                                       (unsigned long long)n);
                    ferry_xfer_fail(x, src_rc);
                    continue;
                }
                src = b;
            }
            x->inflight++; /* before the first byte leaves: a partial frame is in doubt too (cancel.h) */
            int rc = send_slice(c, x, src, cur_off, n, x->opcode == FERRY_OP_WRITE ? FERRY_FRAME_WRITE : FERRY_FRAME_READ_REQ);
            if (rc) {
                *broken = 1;
                return rc;
            }
            ring[(head + count++) % 256] = (struct inflight){x, cur_off, n};
            cur_off += n;
            inflight += n;
            continue;
        }
        if (count == 0) break;
        struct inflight in = ring[head];
        head = (head + 1) % 256;
        count--;
        unsigned spin = inflight <= SPIN_INFLIGHT_BYTES ? ferry_conn_spin_us(c) : 0;
        inflight -= in.n;
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

/* --------------------------------------------------------------- target */

static int send_status(ferry_conn_t *c, uint8_t type, const ferry_frame_t *req, int status, uint64_t deadline)
{
    const char *why = status ? ferry_fail_message() : "";
    size_t n = strlen(why);
    if (n > FERRY_WIRE_MAX_REASON) n = FERRY_WIRE_MAX_REASON;
    ferry_frame_t f = {.type = type, .status = status, .req_id = req->req_id, .addr = req->addr,
                       .len = status ? 0 : req->len, .plen = (uint32_t)n};
    return ferry_conn_send_frame(c, &f, why, deadline);
}

/* Validation of one incoming range, with the registry's read lock held. */
static int check_locked(ferry_conn_t *c, const ferry_frame_t *f, uint32_t need)
{
    ferry_engine_t *e = c->engine;
    if (ferry_conn_is_cancelled(c, f->req_id))
        return ferry_fail(FERRY_ERR_CANCELLED, "request %llu was cancelled", (unsigned long long)f->req_id);
    /* Against the registry as it is now, whatever generation the initiator
     * learned: a range registered again at the same address takes the
     * write (as on Mooncake); one deregistered is refused. */
    return ferry_registry_check_locked(&e->registry, f->addr, f->len, need, 0, "target");
}

/* Receives up to want bytes into dst without blocking; returns the count,
 * 0 if nothing is ready, or a negative code. */
static long recv_ready(int fd, unsigned char *dst, size_t want)
{
    for (;;) {
        ssize_t n = recv(fd, dst, want, MSG_DONTWAIT);
        if (n > 0) return n;
        if (n == 0) return ferry_fail(FERRY_ERR_PEER_CLOSED, "the initiator closed the connection mid-slice");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return ferry_fail(FERRY_ERR_SOCKET, "recv: %s", strerror(errno));
    }
}

/* Places f->len payload bytes straight into target memory, re-validating
 * under the read lock before every chunk. A failure mid-way discards the
 * rest of the payload and is reported in the ack. */
static int place_direct(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline, int *status)
{
    ferry_registry_t *r = &c->engine->registry;
    uint64_t done = 0;
    /* The payload usually follows its header at once: try before polling,
     * and poll only once the socket ran dry. */
    bool drained = false;
    while (done < f->len) {
        if (drained) {
            int w = ferry_net_wait_readable(c->fd, deadline);
            if (w <= 0) return ferry_fail(FERRY_ERR_TIMEOUT, "slice from %s stalled after %llu of %llu bytes",
                                          c->peer.name, (unsigned long long)done, (unsigned long long)f->len);
        }
        ferry_registry_read_lock(r);
        int rc = check_locked(c, f, FERRY_MEM_REMOTE_WRITE);
        long n = 0;
        uint64_t left = f->len - done, want = left < CHUNK_BYTES ? left : CHUNK_BYTES;
        if (rc == 0) n = recv_ready(c->fd, (unsigned char *)(uintptr_t)(f->addr + done), want);
        drained = n >= 0 && (uint64_t)n < want;
        ferry_registry_unlock(r);
        if (rc) {
            *status = rc;
            if (rc == FERRY_ERR_ADDRESS_NOT_REGISTERED) ferry_fail_context("region deregistered during the write");
            return ferry_conn_discard(c, f->len - done, deadline);
        }
        if (n < 0) return (int)n;
        done += (uint64_t)n;
    }
    return 0;
}

/* With checksums, or into device memory: stage, verify (if checksummed),
 * and place only verified bytes, copying into device memory where the
 * region is device memory. */
static int place_staged(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline, int *status)
{
    unsigned char *b = ferry_conn_bounce(c, f->len);
    if (!b) return ferry_fail(FERRY_ERR_MEMORY, "staging buffer of %llu bytes: out of memory", (unsigned long long)f->len);
    int rc = ferry_net_recv(c->fd, b, f->len, deadline);
    if (rc) return rc;
    if ((f->flags & FERRY_FRAME_F_CRC) && ferry_crc32c(0, b, f->len) != f->crc) {
        FERRY_STAT_ADD(&c->engine->stats, checksum_failures, 1);
        *status = ferry_fail(FERRY_ERR_CHECKSUM_MISMATCH, "slice [0x%llx+%llu) from %s failed its CRC32C; not placed",
                             (unsigned long long)f->addr, (unsigned long long)f->len, c->peer.name);
        return 0;
    }
    ferry_registry_t *r = &c->engine->registry;
    ferry_registry_read_lock(r);
    rc = check_locked(c, f, FERRY_MEM_REMOTE_WRITE);
    if (rc == 0) {
        uint32_t kind = kind_of(r, f->addr, f->len, true);
        if (kind == FERRY_MEMKIND_HOST)
            memcpy((void *)(uintptr_t)f->addr, b, f->len);
        else if ((rc = ferry_memkind_from_host(kind, (void *)(uintptr_t)f->addr, b, f->len)) != 0)
            ferry_fail_context("placing [0x%llx+%llu) from %s into device memory", (unsigned long long)f->addr,
                               (unsigned long long)f->len, c->peer.name);
    }
    ferry_registry_unlock(r);
    *status = rc;
    return 0;
}

static int serve_write(ferry_conn_t *c, const ferry_frame_t *f)
{
    uint64_t deadline = ferry_deadline_after_ms(c->engine->cfg.timeout_ms);
    if (f->plen != f->len || f->len == 0)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "WRITE of %llu bytes carries %u", (unsigned long long)f->len,
                          f->plen);
    ferry_registry_t *r = &c->engine->registry;
    ferry_registry_read_lock(r);
    int status = check_locked(c, f, FERRY_MEM_REMOTE_WRITE);
    uint32_t kind = status ? FERRY_MEMKIND_HOST : kind_of(r, f->addr, f->len, true);
    ferry_registry_unlock(r);
    int rc;
    if (status)
        rc = ferry_conn_discard(c, f->len, deadline);
    else if ((f->flags & FERRY_FRAME_F_CRC) || kind != FERRY_MEMKIND_HOST)
        rc = place_staged(c, f, deadline, &status);
    else
        rc = place_direct(c, f, deadline, &status);
    if (rc) return rc;
    if (status == 0) FERRY_STAT_ADD(&c->engine->stats, bytes_placed, f->len);
    return send_status(c, FERRY_FRAME_WRITE_ACK, f, status, deadline);
}

/* Sends the slice straight from target memory, chunk by chunk under the read
 * lock. If the region vanishes mid-way the connection is reset: the
 * initiator must never take the rest for data. */
static int send_from_memory(ferry_conn_t *c, const ferry_frame_t *f, uint64_t deadline)
{
    ferry_registry_t *r = &c->engine->registry;
    uint64_t done = 0;
    while (done < f->len) {
        struct pollfd p = {.fd = c->fd, .events = POLLOUT};
        int w = poll(&p, 1, ferry_ms_left(deadline));
        if (w <= 0) return ferry_fail(FERRY_ERR_TIMEOUT, "read answer to %s stalled", c->peer.name);
        ferry_registry_read_lock(r);
        int rc = check_locked(c, f, FERRY_MEM_REMOTE_READ);
        ssize_t n = 0;
        if (rc == 0) {
            uint64_t left = f->len - done;
            n = send(c->fd, (const char *)(uintptr_t)(f->addr + done), left < CHUNK_BYTES ? left : CHUNK_BYTES,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
        }
        ferry_registry_unlock(r);
        if (rc) return ferry_fail_context("region changed during a read; resetting the connection");
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return ferry_fail(FERRY_ERR_PEER_CLOSED, "send: %s", strerror(errno));
        if (n > 0) done += (uint64_t)n;
    }
    return 0;
}

static int serve_read(ferry_conn_t *c, const ferry_frame_t *f)
{
    uint64_t deadline = ferry_deadline_after_ms(c->engine->cfg.timeout_ms);
    if (f->plen != 0 || f->len == 0 || f->len > FERRY_WIRE_MAX_DATA)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "READ_REQ of %llu bytes (limit %u)", (unsigned long long)f->len,
                          FERRY_WIRE_MAX_DATA);
    ferry_registry_t *r = &c->engine->registry;
    ferry_registry_read_lock(r);
    int status = check_locked(c, f, FERRY_MEM_REMOTE_READ);
    const unsigned char *from = (const unsigned char *)(uintptr_t)f->addr, *staged = NULL;
    uint32_t kind = status ? FERRY_MEMKIND_HOST : kind_of(r, f->addr, f->len, true);
    if (kind != FERRY_MEMKIND_HOST) {
        /* Device memory: copy the slice out while the region is held. */
        unsigned char *b = ferry_conn_bounce(c, f->len);
        status = b ? ferry_memkind_to_host(kind, b, from, f->len)
                   : ferry_fail(FERRY_ERR_MEMORY, "staging buffer of %llu bytes: out of memory",
                                (unsigned long long)f->len);
        if (status == 0) staged = b;
        else ferry_fail_context("read of [0x%llx+%llu) for %s: staging from device memory",
                                       (unsigned long long)f->addr, (unsigned long long)f->len, c->peer.name);
    }
    uint32_t crc = 0;
    if (status == 0 && (f->flags & FERRY_FRAME_F_CRC)) crc = ferry_crc32c(0, staged ? staged : from, f->len);
    ferry_registry_unlock(r);
    if (status) return send_status(c, FERRY_FRAME_READ_RESP, f, status, deadline);
    ferry_frame_t h = {.type = FERRY_FRAME_READ_RESP, .req_id = f->req_id, .addr = f->addr, .len = f->len,
                       .plen = (uint32_t)f->len, .flags = f->flags & FERRY_FRAME_F_CRC, .crc = crc};
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(&h, hdr);
    int rc = ferry_net_send(c->fd, hdr, sizeof hdr, deadline);
    if (rc == 0) rc = staged ? ferry_net_send(c->fd, staged, f->len, deadline) : send_from_memory(c, f, deadline);
    if (rc == 0) FERRY_STAT_ADD(&c->engine->stats, bytes_served, f->len);
    return rc;
}

static int tcp_serve(ferry_conn_t *c, const ferry_frame_t *f)
{
    return f->type == FERRY_FRAME_WRITE ? serve_write(c, f) : serve_read(c, f);
}

static int tcp_usable(ferry_engine_t *e, const ferry_hello_t *peer, char *why, size_t cap)
{
    (void)e;
    (void)peer;
    snprintf(why, cap, "tcp reaches every peer");
    return 1;
}

const ferry_transport_ops_t ferry_transport_tcp = {
    .name = "tcp",
    .usable = tcp_usable,
    .run = tcp_run,
    .serve = tcp_serve,
    .serve_types = (1u << FERRY_FRAME_WRITE) | (1u << FERRY_FRAME_READ_REQ),
};
