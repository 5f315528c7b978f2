/* SPDX-License-Identifier: Apache-2.0 */
/* The TCP transport, target side, device memory without checksums: a
 * WRITE's payload landed and a READ's answer staged sub-slice by
 * sub-slice (LAND_SLICE), the host<->device copies overlapping the socket
 * (util/memkind.h: ferry_land, ferry_stage; the initiator's side is in
 * tcp_initiator.c).
 *
 * The target's copies run inside holds of the registry's read lock: a
 * hold is checked at its start like tcp_target.c's chunks, lasts at most
 * CHUNK_BYTES of receives or sends and never a wait for the peer, and
 * ends only once every copy it started is complete (a prefetch: waited
 * for and dropped). So a deregistration or a CANCEL's barrier (the write
 * lock) waits for the copies in flight; no copy outlives a cancel, a
 * deadline or a broken connection (no late write); the placement log
 * counts only bytes on the device; and nothing reads memory that may be
 * deregistered. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "util/fail.h"
#include "util/memkind.h"
#include "util/tsan.h"
#include "link/target.h"
#include "link/vec.h"
#include "tcp_internal.h"

/* One hold of a WRITE into device memory, from p->done on: each whole
 * sub-slice's host->device copy starts while the next is received into
 * the lander's other buffer; a sub-slice cut by the hold's end stays in
 * its buffer. 0 with *dry (the socket ran dry) and *refused (the frame's
 * refusal: its rest is to be discarded), or the connection's failure. */
int ferry_tcp_land_hold(ferry_conn_t *c, ferry_partial_t *p, bool *dry, int *refused)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    const ferry_frame_t *f = &p->f;
    ferry_registry_t *r = c->ctx->registry;
    if (!c->land && !(c->land = ferry_land_new())) {
        *refused = ferry_fail(FERRY_ERR_MEMORY, "device-memory landing: out of memory");
        return 0;
    }
    uint64_t placed = p->done / LAND_SLICE * LAND_SLICE, held = 0;
    long n = 0;
    ferry_registry_read_lock(r);
    int rc = ferry_target_check_locked(c, r, f, FERRY_MEM_REMOTE_WRITE);
    if (rc == FERRY_ERR_ADDRESS_NOT_REGISTERED) ferry_fail_context("region deregistered during the write");
    uint32_t kind = rc ? FERRY_MEMKIND_HOST : ferry_registry_kind_of(r, f->addr, f->len, true);
    while (rc == 0 && !*dry && p->done < f->len && held < CHUNK_BYTES) {
        uint64_t sub = p->done / LAND_SLICE * LAND_SLICE;
        uint64_t sub_n = f->len - sub < LAND_SLICE ? f->len - sub : LAND_SLICE, want = sub + sub_n - p->done;
        unsigned char *b;
        if ((rc = ferry_land_buffer(c->land, kind, LAND_SLICE, &b)) != 0) break;
        if ((n = ferry_tcp_recv_ready(c->fd, b + (p->done - sub), (size_t)want)) < 0) break;
        p->done += (uint64_t)n;
        held += (uint64_t)n;
        *dry = (uint64_t)n < want;
        if (p->done < sub + sub_n) continue;
        rc = ferry_land_put(c->land, kind, (void *)(uintptr_t)(f->addr + sub), (size_t)sub_n);
        if (rc == 0) placed = sub + sub_n;
    }
    int copied = ferry_land_finish(c->land); /* before the lock goes: the copies are on the device */
    if (copied == 0) ferry_placed_progress(c, placed, NULL); /* under the lock (cancel.h) */
    ferry_registry_unlock(r);
    if (n < 0) return (int)n; /* nothing is left in flight */
    if (rc == 0) rc = copied;
    if (rc) {
        ferry_fail_context("placing [0x%llx+%llu) from %s into device memory", (unsigned long long)f->addr,
                           (unsigned long long)f->len, c->peer.name);
        ferry_land_settle(c->land); /* the sub-slice being received is dropped */
        *refused = rc;
    }
    return 0;
}

/* One hold of a READ's answer from device memory, from p->done on (its
 * header sent): each sub-slice is taken from the stager and the next
 * one's device->host copy started before it is sent. 0 with *full (the
 * socket took no more), or a failure (the connection is reset: the
 * initiator must never take the rest for data). */
static int stage_hold(ferry_conn_t *c, ferry_partial_t *p, bool *full)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    const ferry_frame_t *f = &p->f;
    ferry_registry_t *r = c->ctx->registry;
    uint64_t total = FERRY_FRAME_HEADER_SIZE + f->len, held = 0, have = UINT64_MAX; /* the sub-slice in b */
    unsigned char *b = NULL;
    ssize_t n = 0;
    int err = 0;
    ferry_registry_read_lock(r);
    int rc = ferry_target_check_locked(c, r, f, FERRY_MEM_REMOTE_READ);
    uint32_t kind = rc ? FERRY_MEMKIND_HOST : ferry_registry_kind_of(r, f->addr, f->len, true);
    while (rc == 0 && !*full && p->done < total && held < CHUNK_BYTES) {
        uint64_t off = p->done - FERRY_FRAME_HEADER_SIZE, sub = off / LAND_SLICE * LAND_SLICE;
        uint64_t sub_n = f->len - sub < LAND_SLICE ? f->len - sub : LAND_SLICE, next = sub + sub_n;
        if (have != sub) {
            rc = ferry_stage_take(c->stage, kind, (const void *)(uintptr_t)(f->addr + sub), (size_t)sub_n, &b);
            if (rc) break;
            have = sub;
            if (next < f->len)
                ferry_stage_prefetch(c->stage, kind, (const void *)(uintptr_t)(f->addr + next),
                                     f->len - next < LAND_SLICE ? (size_t)(f->len - next) : LAND_SLICE);
        }
        n = send(c->fd, b + (off - sub), (size_t)(next - off), MSG_DONTWAIT | MSG_NOSIGNAL);
        err = errno;
        if (n > 0) {
            p->done += (uint64_t)n;
            held += (uint64_t)n;
        } else if (!(n < 0 && err == EINTR)) {
            *full = true;
        }
    }
    ferry_stage_settle(c->stage); /* nothing reads the memory once the lock goes */
    ferry_registry_unlock(r);
    if (rc)
        return ferry_fail_context("read of [0x%llx+%llu) for %s from device memory; resetting the connection",
                                  (unsigned long long)f->addr, (unsigned long long)f->len, c->peer.name);
    if (*full && n < 0 && err != EAGAIN && err != EWOULDBLOCK)
        return ferry_fail(FERRY_ERR_PEER_CLOSED, "send: %s", strerror(err));
    return 0;
}

int ferry_tcp_device_send(ferry_conn_t *c, ferry_partial_t *p)
{
    if (!c->stage && !(c->stage = ferry_stage_new()))
        return ferry_fail(FERRY_ERR_MEMORY, "device-memory staging: out of memory; resetting the connection");
    while (p->done < FERRY_FRAME_HEADER_SIZE + p->f.len) {
        bool full = false;
        int rc = stage_hold(c, p, &full);
        if (rc) return rc;
        if (!full) continue;
        int w = ferry_serve_answer_wait(c, p->deadline);
        if (w < 0) return ferry_fail(FERRY_ERR_TIMEOUT, "read answer to %s stalled", c->peer.name);
        if (w == 0) return FERRY_SERVE_PENDING;
    }
    return 0;
}

/* ------------------------------------------- vector frames (WRITEV) */

/* A WRITEV with pieces in device memory lands through the lander's
 * pinned buffer: its payload is received there whole (verified there with
 * checksums), then each device piece's copy is queued from it, all waited
 * for once, under the read lock that placing holds. A READV's device
 * pieces are gathered there the same way (device->host), and sent from
 * it. */
uint32_t ferry_tcp_vec_kind_locked(ferry_registry_t *r, const struct ferry_vec_scratch *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t kind = v->st[i] ? FERRY_MEMKIND_HOST : ferry_registry_kind_of(r, v->d[i].addr, v->d[i].len, true);
        if (kind != FERRY_MEMKIND_HOST) return kind;
    }
    return FERRY_MEMKIND_HOST;
}

unsigned char *ferry_tcp_vec_buffer(ferry_conn_t *c, uint32_t kind, size_t n)
{
    unsigned char *b = NULL;
    if (!c->land && !(c->land = ferry_land_new())) return NULL;
    if (ferry_land_buffer(c->land, kind, n, &b) != 0) ferry_clear_last_error();
    return b;
}

void ferry_tcp_vec_land_finish_locked(ferry_conn_t *c, ferry_registry_t *r, struct ferry_vec_scratch *v, size_t n)
{
    int rc = ferry_land_finish(c->land);
    ferry_land_drop(c->land);
    if (rc == 0) return;
    ferry_fail_context("placing a vector frame's pieces from %s into device memory", c->peer.name);
    for (size_t i = 0; i < n; i++) /* which copy failed is not known: every device piece fails */
        if (!v->st[i] && ferry_registry_kind_of(r, v->d[i].addr, v->d[i].len, true) != FERRY_MEMKIND_HOST)
            ferry_vec_fail_piece(v, i, rc);
}

/* ------------------------------------------------ vector frames (READV) */

unsigned char *ferry_tcp_vec_gather_locked(ferry_conn_t *c, ferry_registry_t *r, struct ferry_vec_scratch *v,
                                           size_t n, uint64_t bytes)
{
    unsigned char *b = ferry_tcp_vec_buffer(c, ferry_tcp_vec_kind_locked(r, v, n), (size_t)bytes);
    if (!b) return NULL;
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (v->st[i]) continue;
        const ferry_vec_desc_t *d = &v->d[i];
        const void *src = (const void *)(uintptr_t)d->addr;
        uint32_t kind = ferry_registry_kind_of(r, d->addr, d->len, true);
        int st = kind == FERRY_MEMKIND_HOST ? (memcpy(b + off, src, d->len), 0)
                                            : ferry_land_get_part(c->land, kind, src, (size_t)off, d->len);
        if (st) ferry_vec_fail_piece(v, i, st);
        else off += d->len;
    }
    int rc = ferry_land_finish(c->land); /* before the lock goes: the bytes are staged */
    if (rc) {
        ferry_fail_context("staging a vector read's pieces for %s from device memory", c->peer.name);
        for (size_t i = 0; i < n; i++) /* which copy failed is not known: the frame sends nothing */
            if (!v->st[i]) ferry_vec_fail_piece(v, i, rc);
    }
    return b;
}
