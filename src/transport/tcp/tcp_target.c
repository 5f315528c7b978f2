/* SPDX-License-Identifier: Apache-2.0 */
/* The TCP transport, target side (tcp_internal.h): each slice is validated
 * against the registry, then received straight into the destination (no
 * bounce copy unless checksums are on), chunk by chunk under the
 * registry's read lock, so that a deregistration waits for the chunk in
 * progress and later chunks see it. Vector frames (link/vec.h) likewise,
 * one gathered receive or send for many pieces. */
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

long ferry_tcp_recv_ready(int fd, unsigned char *dst, size_t want)
{
    for (;;) {
        ssize_t n = recv(fd, dst, want, MSG_DONTWAIT);
        if (n > 0) return n;
        if (n == 0) return ferry_fail(FERRY_ERR_PEER_CLOSED, "the initiator closed the connection mid-slice");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        /* The destination is registered but not mapped: the kernel refused
         * the copy and left the bytes in the socket. */
        if (errno == EFAULT) return FERRY_ERR_ADDRESS_NOT_REGISTERED;
        return ferry_fail(FERRY_ERR_SOCKET, "recv: %s", strerror(errno));
    }
}

/* A registered range the owner unmapped (or protected) without
 * deregistering it: refused, named, and the target goes on. */
static int unmapped(ferry_conn_t *c, uint64_t addr, uint64_t n)
{
    return ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                      "target memory [0x%llx+%llu) for %s is registered but not mapped writable "
                      "(unmapped without ferry_deregister?)",
                      (unsigned long long)addr, (unsigned long long)n, c->peer.name);
}

/* Copies n bytes between this process's own addresses through the kernel,
 * which reports EFAULT for an unmapped or protected page where memcpy
 * would crash the target. Writes into dst when into, else reads from src.
 * 0, or -1 with errno. Where the call is forbidden (ENOSYS, EPERM under
 * some seccomp profiles) it falls back to memcpy, as before. */
static int copy_checked(void *dst, const void *src, size_t n, bool into)
{
    static atomic_bool forbidden;
    size_t done = 0;
    while (done < n && !atomic_load_explicit(&forbidden, memory_order_relaxed)) {
        struct iovec local = {.iov_base = into ? (void *)((const char *)src + done) : (char *)dst + done,
                              .iov_len = n - done};
        struct iovec other = {.iov_base = into ? (char *)dst + done : (void *)((const char *)src + done),
                              .iov_len = n - done};
        ssize_t k = into ? process_vm_writev(getpid(), &local, 1, &other, 1, 0)
                         : process_vm_readv(getpid(), &local, 1, &other, 1, 0);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == ENOSYS || errno == EPERM)) {
            atomic_store(&forbidden, true);
            break;
        }
        if (k == 0) errno = EFAULT;
        return -1;
    }
    if (done < n) memcpy((char *)dst + done, (const char *)src + done, n - done);
    return 0;
}

/* How a WRITE's payload is read (c->partial.mode); WRITE_DEVICE: into
 * device memory without a checksum (tcp_device.c). */
enum write_mode { WRITE_DIRECT = 0, WRITE_STAGED, WRITE_DISCARD, WRITE_DEVICE };

/* A WRITE's payload ran dry mid-way: 0 read on (more arrived), else
 * FERRY_SERVE_PENDING (parked: the event loop resumes it when bytes come)
 * or TIMEOUT. */
static int write_wait(ferry_conn_t *c, const ferry_partial_t *p)
{
    int w = ferry_serve_payload_wait(c, p->deadline);
    if (w > 0) return 0;
    if (w == 0) return FERRY_SERVE_PENDING;
    return ferry_fail(FERRY_ERR_TIMEOUT, "slice from %s stalled after %llu of %llu bytes", c->peer.name,
                      (unsigned long long)p->done, (unsigned long long)p->f.len);
}

/* Reads and drops the rest of a refused WRITE's payload. */
static int discard_rest(ferry_conn_t *c, ferry_partial_t *p)
{
    unsigned char scratch[16384];
    while (p->done < p->f.len) {
        uint64_t left = p->f.len - p->done;
        long n = ferry_tcp_recv_ready(c->fd, scratch, left < sizeof scratch ? (size_t)left : sizeof scratch);
        if (n < 0) return (int)n;
        p->done += (uint64_t)n;
        int rc = n == 0 ? write_wait(c, p) : 0;
        if (rc) return rc;
    }
    return 0;
}

/* Places the payload straight into target memory from p->done on,
 * re-validating under the read lock before every chunk (also after a
 * pause: the region or the cancel set may have changed meanwhile). A
 * refusal mid-way drops the rest of the payload and is reported in the
 * ack. */
static int place_direct(ferry_conn_t *c, ferry_partial_t *p)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    const ferry_frame_t *f = &p->f;
    ferry_registry_t *r = c->ctx->registry;
    /* The payload usually follows its header at once: try before waiting,
     * and wait only once the socket ran dry. */
    while (p->done < f->len) {
        ferry_registry_read_lock(r);
        int rc = ferry_target_check_locked(c, r, f, FERRY_MEM_REMOTE_WRITE);
        long n = 0;
        uint64_t left = f->len - p->done, want = left < CHUNK_BYTES ? left : CHUNK_BYTES;
        if (rc == 0) n = ferry_tcp_recv_ready(c->fd, (unsigned char *)(uintptr_t)(f->addr + p->done), want);
        if (n > 0) ferry_placed_progress(c, p->done + (uint64_t)n, NULL); /* under the lock (cancel.h) */
        ferry_registry_unlock(r);
        if (rc == FERRY_ERR_ADDRESS_NOT_REGISTERED) ferry_fail_context("region deregistered during the write");
        if (rc == 0 && n == FERRY_ERR_ADDRESS_NOT_REGISTERED) rc = unmapped(c, f->addr + p->done, want);
        if (rc) {
            p->status = rc;
            p->mode = WRITE_DISCARD;
            return discard_rest(c, p);
        }
        if (n < 0) return (int)n;
        p->done += (uint64_t)n;
        if ((uint64_t)n < want && (rc = write_wait(c, p)) != 0) return rc;
    }
    return 0;
}

/* A WRITE into device memory (tcp_device.c says how): holds until the
 * payload is in, discarding the rest after a refusal. */
static int place_device(ferry_conn_t *c, ferry_partial_t *p)
{
    while (p->done < p->f.len) {
        bool dry = false;
        int refused = 0, rc = ferry_tcp_land_hold(c, p, &dry, &refused);
        if (rc) return rc; /* the connection broke; nothing is left in flight */
        if (refused) {
            p->status = refused;
            p->mode = WRITE_DISCARD;
            return discard_rest(c, p);
        }
        if (dry && (rc = write_wait(c, p)) != 0) return rc;
    }
    return 0;
}

/* With checksums, or into device memory: the payload is staged whole in
 * the connection's staging buffer first (from p->done on). */
static int stage_payload(ferry_conn_t *c, ferry_partial_t *p)
{
    while (p->done < p->f.len) {
        long n = ferry_tcp_recv_ready(c->fd, c->bounce + p->done, p->f.len - p->done);
        if (n < 0) return (int)n;
        p->done += (uint64_t)n;
        int rc = p->done < p->f.len ? write_wait(c, p) : 0;
        if (rc) return rc;
    }
    return 0;
}

/* Then verified (if checksummed) and only verified bytes placed, copying
 * into device memory where the region is device memory. */
static void place_staged(ferry_conn_t *c, const ferry_frame_t *f, int *status)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    const unsigned char *b = c->bounce;
    if ((f->flags & FERRY_FRAME_F_CRC) && ferry_crc32c(0, b, f->len) != f->crc) {
        FERRY_STAT_ADD(c->ctx->counters, checksum_failures, 1);
        *status = ferry_fail(FERRY_ERR_CHECKSUM_MISMATCH, "slice [0x%llx+%llu) from %s failed its CRC32C; not placed",
                             (unsigned long long)f->addr, (unsigned long long)f->len, c->peer.name);
        return;
    }
    ferry_registry_t *r = c->ctx->registry;
    ferry_registry_read_lock(r);
    int rc = ferry_target_check_locked(c, r, f, FERRY_MEM_REMOTE_WRITE);
    if (rc == 0) {
        uint32_t kind = ferry_registry_kind_of(r, f->addr, f->len, true);
        if (kind == FERRY_MEMKIND_HOST) {
            if (copy_checked((void *)(uintptr_t)f->addr, b, f->len, true) != 0) rc = unmapped(c, f->addr, f->len);
        } else if ((rc = ferry_memkind_from_host(kind, (void *)(uintptr_t)f->addr, b, f->len)) != 0)
            ferry_fail_context("placing [0x%llx+%llu) from %s into device memory", (unsigned long long)f->addr,
                               (unsigned long long)f->len, c->peer.name);
        if (rc == 0) ferry_placed_progress(c, f->len, NULL);
    }
    ferry_registry_unlock(r);
    *status = rc;
}

/* Reads on a WRITE's payload from where it stands (c->partial), then
 * places what was staged and answers. When the payload runs dry the frame
 * is parked (FERRY_SERVE_PENDING) and this runs again once more bytes
 * arrive, so that a stalled or trickling initiator holds no thread. */
static int write_resume(ferry_conn_t *c)
{
    ferry_partial_t *p = &c->partial;
    int rc = p->mode == WRITE_DIRECT   ? place_direct(c, p)
             : p->mode == WRITE_STAGED ? stage_payload(c, p)
             : p->mode == WRITE_DEVICE ? place_device(c, p)
                                       : discard_rest(c, p);
    p->resume = rc == FERRY_SERVE_PENDING ? write_resume : NULL;
    if (rc) return rc;
    if (p->mode == WRITE_STAGED) place_staged(c, &p->f, &p->status);
    ferry_placed_end(c, p->status, FERRY_PLACED_KEEP, NULL);
    if (p->status == 0) {
        FERRY_STAT_ADD(c->ctx->counters, bytes_placed, p->f.len);
        ferry_watch_placed(c, p->f.addr, p->f.len);
    }
    return ferry_target_send_status(c, FERRY_FRAME_WRITE_ACK, &p->f, p->status, p->deadline);
}

static int serve_write(ferry_conn_t *c, const ferry_frame_t *f)
{
    uint64_t deadline = ferry_deadline_after_ms(c->ctx->timeout_ms);
    if (f->plen != f->len || f->len == 0)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "WRITE of %llu bytes carries %u", (unsigned long long)f->len,
                          f->plen);
    ferry_registry_t *r = c->ctx->registry;
    ferry_registry_read_lock(r);
    int status = ferry_target_check_locked(c, r, f, FERRY_MEM_REMOTE_WRITE);
    uint32_t kind = status ? FERRY_MEMKIND_HOST : ferry_registry_kind_of(r, f->addr, f->len, true);
    ferry_registry_unlock(r);
    ferry_partial_t *p = &c->partial;
    *p = (ferry_partial_t){.f = *f, .deadline = deadline, .status = status, .mode = WRITE_DIRECT};
    if (status)
        p->mode = WRITE_DISCARD;
    else if (f->flags & FERRY_FRAME_F_CRC) /* verified whole before any byte is placed */
        p->mode = WRITE_STAGED;
    else if (kind != FERRY_MEMKIND_HOST)
        p->mode = WRITE_DEVICE;
    if (p->mode == WRITE_STAGED && !ferry_conn_bounce(c, f->len))
        return ferry_fail(FERRY_ERR_MEMORY, "staging buffer of %llu bytes: out of memory", (unsigned long long)f->len);
    return write_resume(c);
}

/* How a READ's answer is sent (c->partial.mode, after the WRITE modes);
 * READ_DEVICE: from device memory without a checksum (tcp_device.c). */
enum read_mode { READ_MEMORY = WRITE_DEVICE + 1, READ_STAGED, READ_DEVICE };

/* Sends a READ's answer from where it stands (c->partial.done bytes of its
 * header and data sent), without waiting while the socket takes bytes.
 * The data comes from the staging buffer, or straight from target memory,
 * chunk by chunk under the read lock; if the region vanishes mid-way the
 * connection is reset: the initiator must never take the rest for data.
 * When the socket is full while another data frame waits for a thread (a
 * peer that stopped reading), the answer is parked: FERRY_SERVE_PENDING,
 * and this runs again once the socket has room. */
static int read_resume(ferry_conn_t *c)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    ferry_partial_t *p = &c->partial;
    const ferry_frame_t *f = &p->f;
    ferry_registry_t *r = c->ctx->registry;
    uint64_t total = FERRY_FRAME_HEADER_SIZE + f->len;
    p->resume = NULL;
    while (p->done < total) {
        ssize_t n;
        int err, rc = 0;
        if (p->done >= FERRY_FRAME_HEADER_SIZE && p->mode == READ_DEVICE) { /* tcp_device.c */
            if ((rc = ferry_tcp_device_send(c, p)) == FERRY_SERVE_PENDING) p->resume = read_resume;
            if (rc) return rc;
            break;
        }
        if (p->done < FERRY_FRAME_HEADER_SIZE) {
            n = send(c->fd, p->out + p->done, FERRY_FRAME_HEADER_SIZE - p->done, MSG_DONTWAIT | MSG_NOSIGNAL);
            err = errno;
        } else {
            uint64_t off = p->done - FERRY_FRAME_HEADER_SIZE, left = f->len - off;
            size_t k = left < CHUNK_BYTES ? (size_t)left : CHUNK_BYTES;
            if (p->mode == READ_STAGED) {
                n = send(c->fd, c->bounce + off, k, MSG_DONTWAIT | MSG_NOSIGNAL);
                err = errno;
            } else {
                ferry_registry_read_lock(r);
                rc = ferry_target_check_locked(c, r, f, FERRY_MEM_REMOTE_READ);
                n = rc ? 0 : send(c->fd, (const char *)(uintptr_t)(f->addr + off), k, MSG_DONTWAIT | MSG_NOSIGNAL);
                err = errno;
                ferry_registry_unlock(r);
            }
        }
        if (rc) return ferry_fail_context("region changed during a read; resetting the connection");
        if (n > 0) {
            p->done += (uint64_t)n;
            continue;
        }
        if (n < 0 && err == EFAULT)
            return ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                              "target memory [0x%llx+%llu) for %s is registered but not mapped readable; "
                              "resetting the connection mid-answer",
                              (unsigned long long)f->addr, (unsigned long long)f->len, c->peer.name);
        if (n < 0 && err == EINTR) continue;
        if (n < 0 && err != EAGAIN && err != EWOULDBLOCK)
            return ferry_fail(FERRY_ERR_PEER_CLOSED, "send: %s", strerror(err));
        int w = ferry_serve_answer_wait(c, p->deadline);
        if (w < 0) return ferry_fail(FERRY_ERR_TIMEOUT, "read answer to %s stalled", c->peer.name);
        if (w == 0) {
            p->resume = read_resume;
            return FERRY_SERVE_PENDING;
        }
    }
    FERRY_STAT_ADD(c->ctx->counters, bytes_served, f->len);
    return 0;
}

static int serve_read(ferry_conn_t *c, const ferry_frame_t *f)
{
    uint64_t deadline = ferry_deadline_after_ms(c->ctx->timeout_ms);
    if (f->plen != 0 || f->len == 0 || f->len > FERRY_WIRE_MAX_DATA)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "READ_REQ of %llu bytes (limit %u)", (unsigned long long)f->len,
                          FERRY_WIRE_MAX_DATA);
    ferry_registry_t *r = c->ctx->registry;
    ferry_registry_read_lock(r);
    int status = ferry_target_check_locked(c, r, f, FERRY_MEM_REMOTE_READ);
    const unsigned char *from = (const unsigned char *)(uintptr_t)f->addr, *staged = NULL;
    uint32_t kind = status ? FERRY_MEMKIND_HOST : ferry_registry_kind_of(r, f->addr, f->len, true);
    if (status == 0 && kind == FERRY_MEMKIND_HOST && (f->flags & FERRY_FRAME_F_CRC)) {
        /* Checksummed: stage the slice, so that the checksum covers the
         * bytes sent and an unmapped page is refused, not a crash. */
        unsigned char *b = ferry_conn_bounce(c, f->len);
        if (!b)
            status = ferry_fail(FERRY_ERR_MEMORY, "staging buffer of %llu bytes: out of memory",
                                (unsigned long long)f->len);
        else if (copy_checked(b, from, f->len, false) != 0)
            status = ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                                "target memory [0x%llx+%llu) for %s is registered but not mapped readable "
                                "(unmapped without ferry_deregister?)",
                                (unsigned long long)f->addr, (unsigned long long)f->len, c->peer.name);
        else
            staged = b;
    } else if (kind != FERRY_MEMKIND_HOST && (f->flags & FERRY_FRAME_F_CRC)) {
        /* Device memory, checksummed (else READ_DEVICE): the slice copied
         * out whole while the region is held, for the header's checksum. */
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
    if (status) return ferry_target_send_status(c, FERRY_FRAME_READ_RESP, f, status, deadline);
    ferry_frame_t h = {.type = FERRY_FRAME_READ_RESP, .req_id = f->req_id, .addr = f->addr, .len = f->len,
                       .plen = (uint32_t)f->len, .flags = f->flags & FERRY_FRAME_F_CRC, .crc = crc};
    ferry_partial_t *p = &c->partial;
    int mode = staged ? READ_STAGED : kind != FERRY_MEMKIND_HOST ? READ_DEVICE : READ_MEMORY;
    *p = (ferry_partial_t){.f = *f, .deadline = deadline, .mode = mode, .wait_out = true};
    ferry_frame_encode(&h, p->out);
    return read_resume(c);
}

/* ------------------------------------------------- target: vector frames */

/* Points the rest of piece i's receive at the sink once it failed (maybe
 * mid-way); its bytes still have to be read off the connection. */
static void sink_piece(struct ferry_vec_scratch *v, size_t i)
{
    unsigned char *b = v->iov[i].iov_base;
    if (b < v->sink || b >= v->sink + sizeof v->sink) v->iov[i].iov_base = v->sink;
}

/* Sets c's receive low-water mark to want bytes (a hint: when the kernel
 * refuses, waits just wake sooner). *cur is the mark in force. */
/* Receives a WRITEV's payload straight into the target regions, with few
 * syscalls: one gathered receive (up to IOV_MAX pieces) for whatever the
 * socket holds, under the registry's read lock, sleeping in between until
 * VEC_RCVLOWAT more bytes (or the rest) arrived. Refused pieces' bytes go to
 * the sink. Before each receive the pieces still to come are checked again
 * when the registry or the cancel set changed (place_direct's discipline,
 * done per run of pieces instead of per piece). Resumable from c->partial
 * (done: payload bytes received; at, version; the socket's low-water
 * mark is kept on the connection, ferry_conn_set_rcvlowat): when another data
 * frame waits for a thread while the socket is dry, the frame is parked
 * (FERRY_SERVE_PENDING) with the low-water mark set, and continues once
 * that much more has come. */
static int vec_place_direct(ferry_conn_t *c, ferry_partial_t *p, struct ferry_vec_scratch *v)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    ferry_registry_t *r = c->ctx->registry;
    const ferry_frame_t *f = &p->f;
    size_t n = (size_t)f->len, at = p->at;
    uint64_t version = p->version;
    if (p->done == 0)
        for (size_t i = 0; i < n; i++)
            v->iov[i] = (struct iovec){v->st[i] ? v->sink : (void *)(uintptr_t)v->d[i].addr, v->d[i].len};
    uint64_t left = f->addr - p->done;
    bool drained = false;
    while (left > 0) {
        p->done = f->addr - left;
        if (drained) {
            ferry_conn_set_rcvlowat(c, left < VEC_RCVLOWAT ? (int)left : (int)VEC_RCVLOWAT);
            int w = ferry_serve_payload_wait(c, p->deadline);
            if (w < 0)
                return ferry_fail(FERRY_ERR_TIMEOUT, "vector frame from %s stalled with %llu of %llu bytes to come",
                                  c->peer.name, (unsigned long long)left, (unsigned long long)f->addr);
            if (w == 0) {
                p->at = at;
                p->version = version;
                return FERRY_SERVE_PENDING;
            }
        }
        ferry_registry_read_lock(r);
        if (r->version != version || ferry_vec_cancels_pending(c)) {
            bool device = false;
            ferry_vec_validate_locked(c, v, at, n, FERRY_MEM_REMOTE_WRITE, &device);
            for (size_t i = at; i < n; i++)
                if (v->st[i]) sink_piece(v, i);
            version = r->version;
        }
        if (ferry_vec_expire(c, f, v, at, n)) /* its deadline passed: the rest goes to the sink */
            for (size_t i = at; i < n; i++)
                if (v->st[i]) sink_piece(v, i);
        size_t cnt = n - at < IOV_MAX ? n - at : IOV_MAX;
        struct msghdr mh = {.msg_iov = v->iov + at, .msg_iovlen = cnt};
        ssize_t got = recvmsg(c->fd, &mh, MSG_DONTWAIT);
        int err = errno;
        if (got > 0) ferry_placed_progress(c, f->addr - left + (uint64_t)got, v->st); /* under the lock */
        ferry_registry_unlock(r);
        if (got == 0) return ferry_fail(FERRY_ERR_PEER_CLOSED, "the initiator closed the connection mid-frame");
        if (got < 0) {
            if (err == EINTR) continue;
            if (err != EAGAIN && err != EWOULDBLOCK) return ferry_fail(FERRY_ERR_SOCKET, "recvmsg: %s", strerror(err));
            drained = true;
            continue;
        }
        left -= (uint64_t)got;
        uint64_t want = 0;
        for (size_t i = at; i < at + cnt; i++) want += v->iov[i].iov_len;
        drained = (uint64_t)got < want;
        size_t k = (size_t)got;
        while (at < n && k >= v->iov[at].iov_len) k -= v->iov[at++].iov_len;
        if (k) {
            v->iov[at].iov_base = (unsigned char *)v->iov[at].iov_base + k;
            v->iov[at].iov_len -= k;
        }
    }
    p->done = f->addr;
    return 0;
}

/* With checksums, or when a piece lies in device memory (p->mode: its
 * kind; the lander's pinned buffer, tcp_device.c): the payload is staged
 * whole in the connection's staging buffer, as it arrives (from
 * c->partial.done on), parked between its parts like vec_place_direct: 0
 * whole, FERRY_SERVE_PENDING, or a failure. */
static unsigned char *vec_buffer(ferry_conn_t *c, const ferry_partial_t *p)
{
    return p->mode ? ferry_tcp_vec_buffer(c, (uint32_t)p->mode, p->f.addr) : ferry_conn_bounce(c, p->f.addr);
}

static int vec_stage(ferry_conn_t *c, ferry_partial_t *p)
{
    const ferry_frame_t *f = &p->f;
    unsigned char *b = vec_buffer(c, p);
    if (!b) return FERRY_ERR_MEMORY;
    while (p->done < f->addr) {
        long n = ferry_tcp_recv_ready(c->fd, b + p->done, f->addr - p->done);
        if (n < 0) return (int)n;
        p->done += (uint64_t)n;
        if (n > 0 || p->done == f->addr) continue;
        uint64_t left = f->addr - p->done;
        ferry_conn_set_rcvlowat(c, left < VEC_RCVLOWAT ? (int)left : (int)VEC_RCVLOWAT);
        int w = ferry_serve_payload_wait(c, p->deadline);
        if (w < 0)
            return ferry_fail(FERRY_ERR_TIMEOUT, "vector frame from %s stalled with %llu of %llu bytes to come",
                              c->peer.name, (unsigned long long)left, (unsigned long long)f->addr);
        if (w == 0) return FERRY_SERVE_PENDING;
    }
    ferry_conn_set_rcvlowat(c, 1);
    return 0;
}

/* Then each piece is verified against its CRC32C, and only verified pieces
 * placed, after checking them again under the read lock. */
static void vec_place_staged(ferry_conn_t *c, const ferry_partial_t *p, struct ferry_vec_scratch *v)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    const ferry_frame_t *f = &p->f;
    size_t n = (size_t)f->len;
    const unsigned char *b = vec_buffer(c, p);
    int rc;
    bool crc = (f->flags & FERRY_FRAME_F_CRC) != 0;
    uint64_t off = 0;
    for (size_t i = 0; i < n; off += v->d[i++].len) {
        if (!crc || v->st[i] || ferry_crc32c(0, b + off, v->d[i].len) == (uint32_t)v->d[i].aux) continue;
        FERRY_STAT_ADD(c->ctx->counters, checksum_failures, 1);
        ferry_vec_fail_piece(v, i, ferry_fail(FERRY_ERR_CHECKSUM_MISMATCH,
                                              "piece [0x%llx+%u) from %s failed its CRC32C; not placed",
                                              (unsigned long long)v->d[i].addr, v->d[i].len, c->peer.name));
    }
    ferry_registry_t *r = c->ctx->registry;
    bool device = false;
    ferry_registry_read_lock(r);
    ferry_vec_validate_locked(c, v, 0, n, FERRY_MEM_REMOTE_WRITE, &device);
    ferry_vec_expire(c, f, v, 0, n);
    off = 0;
    for (size_t i = 0; i < n; off += v->d[i++].len) {
        if (v->st[i]) continue;
        void *dst = (void *)(uintptr_t)v->d[i].addr;
        uint32_t kind = ferry_registry_kind_of(r, v->d[i].addr, v->d[i].len, true);
        if (kind == FERRY_MEMKIND_HOST) {
            memcpy(dst, b + off, v->d[i].len);
        } else if ((rc = p->mode ? ferry_land_put_part(c->land, kind, dst, (size_t)off, v->d[i].len)
                                 : ferry_memkind_from_host(kind, dst, b + off, v->d[i].len)) != 0) {
            ferry_fail_context("placing [0x%llx+%u) from %s into device memory", (unsigned long long)v->d[i].addr,
                               v->d[i].len, c->peer.name);
            ferry_vec_fail_piece(v, i, rc);
        }
    }
    if (p->mode) ferry_tcp_vec_land_finish_locked(c, r, v, n); /* the copies are on the device */
    ferry_placed_progress(c, f->addr, v->st);
    ferry_registry_unlock(r);
}

static int writev_resume(ferry_conn_t *c);
static int writev_staged_resume(ferry_conn_t *c);
static int writev_answer(ferry_conn_t *c, const ferry_frame_t *f, struct ferry_vec_scratch *v, uint64_t deadline);

/* WRITEV: many small pieces, one answer (vec.h). */
static int serve_writev(ferry_conn_t *c, const ferry_frame_t *f)
{
    uint64_t deadline;
    struct ferry_vec_scratch *v;
    int rc = ferry_vec_recv_descs(c, f, &deadline, &v);
    if (rc) return rc;
    size_t n = (size_t)f->len;
    ferry_registry_t *r = c->ctx->registry;
    bool device = false;
    ferry_registry_read_lock(r);
    ferry_vec_validate_locked(c, v, 0, n, FERRY_MEM_REMOTE_WRITE, &device);
    uint64_t version = r->version;
    int kind = device ? (int)ferry_tcp_vec_kind_locked(r, v, n) : 0;
    ferry_registry_unlock(r);
    ferry_partial_t *p = &c->partial;
    *p = (ferry_partial_t){.f = *f, .deadline = deadline, .version = version, .mode = kind};
    if ((f->flags & FERRY_FRAME_F_CRC) || device) return writev_staged_resume(c);
    return writev_resume(c);
}

/* Stages a checksummed (or device-memory) WRITEV's payload from where it
 * stands (c->partial), then verifies, places and answers; parked between
 * its parts like writev_resume, so that a peer stalling in it holds no
 * thread whatever the frame's size. */
static int writev_staged_resume(ferry_conn_t *c)
{
    ferry_partial_t *p = &c->partial;
    int rc = vec_stage(c, p);
    p->resume = rc == FERRY_SERVE_PENDING ? writev_staged_resume : NULL;
    if (rc) return rc;
    vec_place_staged(c, p, c->vec);
    return writev_answer(c, &p->f, c->vec, p->deadline);
}

/* Places a WRITEV's pieces as they arrive, from where they stand
 * (c->partial), then answers; parked between its parts when another data
 * frame wants the thread. */
static int writev_resume(ferry_conn_t *c)
{
    ferry_partial_t *p = &c->partial;
    int rc = vec_place_direct(c, p, c->vec);
    p->resume = rc == FERRY_SERVE_PENDING ? writev_resume : NULL;
    if (rc == FERRY_SERVE_PENDING) return rc; /* parked: wakes once the mark's bytes came */
    /* Back to waking at the first byte: the next header is 64 bytes, and
     * the event loop's waits would otherwise never end. */
    ferry_conn_set_rcvlowat(c, 1);
    return rc ? rc : writev_answer(c, &p->f, c->vec, p->deadline);
}

/* A WRITEV's answer once its payload is in: per-piece statuses (vec.h). */
static int writev_answer(ferry_conn_t *c, const ferry_frame_t *f, struct ferry_vec_scratch *v, uint64_t deadline)
{
    size_t n = (size_t)f->len;
    uint64_t placed = 0;
    for (size_t i = 0; i < n; i++)
        if (!v->st[i]) {
            placed += v->d[i].len;
            ferry_watch_placed(c, v->d[i].addr, v->d[i].len);
        }
    if (placed) FERRY_STAT_ADD(c->ctx->counters, bytes_placed, placed);
    int32_t status = 0;
    for (size_t i = 0; i < n && !status; i++) status = v->st[i];
    ferry_placed_end(c, status, FERRY_PLACED_KEEP, v->st);
    return ferry_vec_send_ack(c, f, v, n, deadline);
}

/* How a READV's bytes are sent (c->partial.mode, after the READ modes). */
enum readv_mode { READV_MEMORY = READ_DEVICE + 1, READV_STAGED };

/* The socket had no room for a READV's bytes: 0 room now, else
 * FERRY_SERVE_PENDING (parked until it has room: another data frame waits
 * for the thread) or TIMEOUT. */
static int readv_wait(ferry_conn_t *c, const ferry_partial_t *p)
{
    int w = ferry_serve_answer_wait(c, p->deadline);
    if (w > 0) return 0;
    if (w == 0) return FERRY_SERVE_PENDING;
    return ferry_fail(FERRY_ERR_TIMEOUT, "read answer to %s stalled: it stopped reading", c->peer.name);
}

/* Sends the served pieces of a READV straight from target memory (their
 * iovecs in c->vec, p->at the next), one gathered sendmsg per socketful,
 * under the registry's read lock; the pieces are checked again when the
 * registry or the cancel set changed, and one that vanished resets the
 * connection (its answer already said "served": the initiator must never
 * take the rest for data). Resumable from c->partial. */
static int vec_send_from_memory(ferry_conn_t *c, ferry_partial_t *p)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    ferry_registry_t *r = c->ctx->registry;
    struct ferry_vec_scratch *v = c->vec;
    size_t n = (size_t)p->f.len, cnt = 0;
    for (size_t i = 0; i < n; i++) cnt += v->st[i] == 0;
    size_t at = p->at;
    while (at < cnt) {
        ferry_registry_read_lock(r);
        size_t failed = 0;
        if (r->version != p->version || ferry_vec_cancels_pending(c)) {
            bool device = false;
            failed = ferry_vec_validate_locked(c, v, 0, n, FERRY_MEM_REMOTE_READ, &device);
        }
        ssize_t k = 0;
        int err = 0;
        if (failed == 0) {
            struct msghdr mh = {.msg_iov = v->iov + at, .msg_iovlen = cnt - at < IOV_MAX ? cnt - at : IOV_MAX};
            k = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
            err = errno;
        }
        ferry_registry_unlock(r);
        if (failed) return ferry_fail_context("a region changed during a vector read; resetting the connection");
        if (k < 0 && err == EINTR) continue;
        if (k < 0 && err != EAGAIN && err != EWOULDBLOCK)
            return ferry_fail(FERRY_ERR_PEER_CLOSED, "sendmsg: %s", strerror(err));
        size_t left = k > 0 ? (size_t)k : 0;
        while (at < cnt && left >= v->iov[at].iov_len) left -= v->iov[at++].iov_len;
        if (left) {
            v->iov[at].iov_base = (unsigned char *)v->iov[at].iov_base + left;
            v->iov[at].iov_len -= left;
        }
        if (k < 0) {
            p->at = at;
            int rc = readv_wait(c, p);
            if (rc) return rc;
        }
    }
    return 0;
}

/* The same from the lander's buffer (device memory, tcp_device.c): p->done
 * of its p->f.addr bytes sent. */
static int vec_send_staged(ferry_conn_t *c, ferry_partial_t *p)
{
    uint64_t total = p->f.addr;
    const unsigned char *b = ferry_land_current(c->land);
    while (p->done < total) {
        ssize_t k = send(c->fd, b + p->done, total - p->done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            p->done += (uint64_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return ferry_fail(FERRY_ERR_PEER_CLOSED, "send: %s", strerror(errno));
        int rc = readv_wait(c, p);
        if (rc) return rc;
    }
    return 0;
}

/* Sends a READV's bytes from where they stand (c->partial), after what is
 * queued of its answer's head; parked (FERRY_SERVE_PENDING) when the peer
 * stopped reading and another data frame wants the thread, as a READ's
 * answer is. */
static int readv_resume(ferry_conn_t *c)
{
    ferry_partial_t *p = &c->partial;
    p->resume = NULL;
    int rc = ferry_serve_flush(c);
    if (rc == 0) rc = p->mode == READV_STAGED ? vec_send_staged(c, p) : vec_send_from_memory(c, p);
    if (rc == FERRY_SERVE_PENDING) p->resume = readv_resume;
    if (rc == 0 && p->mode == READV_STAGED) ferry_land_drop(c->land); /* sent: the buffer is free again */
    if (rc == 0) FERRY_STAT_ADD(c->ctx->counters, bytes_served, p->f.addr);
    return rc;
}

/* READV: many small reads, one answer carrying their bytes (vec.h). */
static int serve_readv(ferry_conn_t *c, const ferry_frame_t *f)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    uint64_t deadline;
    struct ferry_vec_scratch *v;
    int rc = ferry_vec_recv_descs(c, f, &deadline, &v);
    if (rc) return rc;
    size_t n = (size_t)f->len;
    bool crc = (f->flags & FERRY_FRAME_F_CRC) != 0, device = false;
    ferry_registry_t *r = c->ctx->registry;
    unsigned char *staged = NULL;
    ferry_registry_read_lock(r);
    ferry_vec_validate_locked(c, v, 0, n, FERRY_MEM_REMOTE_READ, &device);
    ferry_vec_expire(c, f, v, 0, n); /* past its deadline: not sent */
    if (device) staged = ferry_tcp_vec_gather_locked(c, r, v, n, f->addr); /* sent from there */
    uint64_t data = 0, off = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t sum = 0;
        if (!v->st[i]) {
            if (crc) sum = ferry_crc32c(0, staged ? staged + off : (void *)(uintptr_t)v->d[i].addr, v->d[i].len);
            off += v->d[i].len;
            data += v->d[i].len;
        }
        put32(v->crcs + 4 * i, sum);
    }
    uint64_t version = r->version;
    ferry_registry_unlock(r);
    if (device && !staged) return FERRY_ERR_MEMORY;
    int32_t status = 0;
    for (size_t i = 0; i < n && !status; i++) status = v->st[i];
    size_t tlen = status ? strnlen(v->reason, FERRY_WIRE_MAX_REASON) : 0;
    ferry_frame_t a = {.type = FERRY_FRAME_VEC_ACK, .flags = crc ? FERRY_FRAME_F_CRC : 0, .status = status,
                       .req_id = f->req_id, .addr = data, .len = n, .aux = tlen};
    a.plen = (uint32_t)((status ? 4 * n + tlen : 0) + (crc ? 4 * n : 0) + data);
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(&a, hdr);
    struct iovec iov[4] = {{hdr, sizeof hdr}};
    int cnt = 1;
    if (status) {
        for (size_t i = 0; i < n; i++) put32(v->raw + 4 * i, (uint32_t)v->st[i]);
        iov[cnt++] = (struct iovec){v->raw, 4 * n};
        if (tlen) iov[cnt++] = (struct iovec){v->reason, tlen};
    }
    if (crc) iov[cnt++] = (struct iovec){v->crcs, 4 * n};
    rc = ferry_serve_sendv(c, iov, cnt, deadline);
    if (staged && (rc || !data)) ferry_land_drop(c->land);
    if (rc || !data) return rc;
    ferry_partial_t *p = &c->partial;
    *p = (ferry_partial_t){.f = *f, .deadline = deadline, .version = version, .wait_out = true,
                           .mode = staged ? READV_STAGED : READV_MEMORY};
    p->f.addr = data; /* the bytes to send */
    if (!staged) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (!v->st[i]) v->iov[k++] = (struct iovec){(void *)(uintptr_t)v->d[i].addr, v->d[i].len};
    }
    return readv_resume(c);
}

int ferry_tcp_serve(ferry_conn_t *c, const ferry_frame_t *f)
{
    if (f->type == FERRY_FRAME_WRITEV) return serve_writev(c, f);
    if (f->type == FERRY_FRAME_READV) return serve_readv(c, f);
    return f->type == FERRY_FRAME_WRITE ? serve_write(c, f) : serve_read(c, f);
}
