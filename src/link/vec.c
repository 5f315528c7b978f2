/* SPDX-License-Identifier: Apache-2.0 */
/* Vector frames shared by tcp.c and shm.c: grouping, sending and settling
 * on the initiator, descriptor checks and the answer on the target. See
 * vec.h and wire/wire.h. */
#include "vec.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/arith.h"
#include "util/clock.h"
#include "util/fail.h"
#include "util/memkind.h"
#include "util/net.h"
#include "util/tsan.h"
#include "wire/le.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

struct ferry_vec_scratch *ferry_vec_scratch(ferry_conn_t *c)
{
    if (!c->vec) {
        c->vec = malloc(sizeof *c->vec);
        if (!c->vec) ferry_fail(FERRY_ERR_MEMORY, "vector frame buffers: out of memory");
    }
    return c->vec;
}

/* ------------------------------------------------------------- initiator */

/* A READV answer's bytes into the pieces' local memory
 * (ferry_net_recvv_local): a piece the kernel cannot write gets its
 * iov_base set to NULL, the mark its caller fails it by. */
static int recv_gathered(int fd, struct iovec *iov, size_t cnt, uint64_t deadline)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    return ferry_net_recvv_local(fd, iov, cnt, deadline);
}

bool ferry_vec_eligible(ferry_conn_t *c, const ferry_xfer_t *x)
{
    if (x->done != 0 || x->len > FERRY_WIRE_VEC_PIECE_MAX || x->len > c->ctx->slice_size)
        return false;
    if (ferry_conn_version(c) < FERRY_PROTOCOL_VEC) return false;
    ferry_registry_t *r = c->ctx->registry;
    if (ferry_registry_device_count(r) == 0) return true;
    ferry_registry_read_lock(r);
    const ferry_region_t *reg = ferry_registry_lookup_locked(r, (uint64_t)(uintptr_t)x->local, x->len);
    bool host = !reg || reg->kind == FERRY_MEMKIND_HOST;
    ferry_registry_unlock(r);
    return host;
}

size_t ferry_vec_collect(ferry_conn_t *c, ferry_xfer_t *xs, size_t n, uint64_t max_bytes)
{
    uint64_t bytes = xs[0].len;
    size_t k = 1;
    while (k < n && k < FERRY_WIRE_VEC_MAX) {
        const ferry_xfer_t *x = &xs[k];
        if (x->opcode != xs[0].opcode || bytes + x->len > max_bytes || !ferry_piece_sendable(x, x->done) ||
            !ferry_vec_eligible(c, x))
            break;
        bytes += x->len;
        k++;
    }
    return k;
}

static uint64_t earliest(const ferry_xfer_t *g, size_t n)
{
    uint64_t d = UINT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (g[i].deadline < d) d = g[i].deadline;
    return d;
}

/* Sends iov[0..cnt) in calls of at most IOV_MAX entries. */
static int send_gathered(int fd, struct iovec *iov, size_t cnt, uint64_t deadline)
{
    while (cnt > 0) {
        int k = cnt < IOV_MAX ? (int)cnt : IOV_MAX;
        int rc = ferry_net_sendv(fd, iov, k, deadline);
        if (rc) return rc;
        iov += k;
        cnt -= (size_t)k;
    }
    return 0;
}

static uint64_t piece_addr(const ferry_xfer_t *x, bool local)
{
    return local ? (uint64_t)(uintptr_t)x->local : x->remote;
}

/* Describes the addresses of pieces g[0..n) (local or remote) as base +
 * index * stride, indices written to idx as u32: the stride is the
 * greatest common divisor of their distances from the lowest (the piece
 * length when they coincide). It is guessed from the first pieces and
 * refined only when a later one does not fall on it, so a frame of pieces
 * on one stride costs a division a piece (a shift for a power of two).
 * False when an index would not fit 32 bits. */
static bool fit_strided(const ferry_xfer_t *g, size_t n, bool local, uint64_t *base, uint64_t *stride, uint8_t *idx)
{
    uint64_t lo = piece_addr(&g[0], local), hi = lo;
    for (size_t i = 1; i < n; i++) {
        uint64_t a = piece_addr(&g[i], local);
        if (a < lo) lo = a;
        if (a > hi) hi = a;
    }
    uint64_t d = 0;
    for (size_t i = 0; i < n && i < 8; i++) d = ferry_gcd64(piece_addr(&g[i], local) - lo, d);
    if (d == 0) d = g[0].len;
    for (;;) {
        if ((hi - lo) / d > UINT32_MAX) return false;
        bool pow2 = (d & (d - 1)) == 0;
        unsigned shift = (unsigned)__builtin_ctzll(d);
        size_t i = 0;
        for (; i < n; i++) {
            uint64_t off = piece_addr(&g[i], local) - lo, k = pow2 ? off >> shift : off / d;
            if (k * d != off) break;
            put32(idx + 4 * i, (uint32_t)k);
        }
        if (i == n) break;
        d = ferry_gcd64(piece_addr(&g[i], local) - lo, d); /* a smaller divisor of d: ends */
    }
    *base = lo;
    *stride = d;
    return true;
}

/* Writes the compact description of pieces g[0..n) (wire.h, "Compact
 * vector frames") into v->raw when the peer speaks protocol 3 and the
 * pieces fit it: one length, consecutive request ids, 32-bit indices
 * (several generations are listed, F_GENS). Returns its size, or 0 for the descriptors instead. With
 * crc, v->crcs holds the pieces' checksums. */
static size_t encode_compact(ferry_conn_t *c, struct ferry_vec_scratch *v, uint8_t type, bool crc,
                             const ferry_xfer_t *g, size_t n, uint8_t *flags)
{
    if (n < 2 || ferry_conn_version(c) < FERRY_PROTOCOL_COMPACT) return 0;
    bool gens = false; /* pieces of several registrations (a layer's K and V buffers each one) */
    for (size_t i = 1; i < n; i++) {
        if (g[i].len != g[0].len || g[i].req_id != g[0].req_id + i) return 0;
        if (g[i].generation != g[0].generation) gens = true;
    }
    ferry_vec_compact_t h = {.len = (uint32_t)g[0].len, .generation = gens ? 0 : g[0].generation};
    uint8_t *p = v->raw + FERRY_WIRE_COMPACT_HEAD;
    if (!fit_strided(g, n, false, &h.base, &h.stride, p)) return 0;
    p += 4 * n;
    if (type == FERRY_FRAME_CMA_VEC) {
        if (!fit_strided(g, n, true, &h.lbase, &h.lstride, p)) return 0;
        p += 4 * n;
    } else if (crc) {
        memcpy(p, v->crcs, 4 * n);
        p += 4 * n;
    }
    for (size_t i = 0; gens && i < n; i++, p += 4) put32(p, g[i].generation);
    ferry_vec_compact_encode(&h, v->raw);
    *flags = FERRY_FRAME_F_COMPACT | (gens ? FERRY_FRAME_F_GENS : 0);
    return (size_t)(p - v->raw);
}

int ferry_vec_send(ferry_conn_t *c, uint8_t type, ferry_xfer_t *g, size_t n)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    struct ferry_vec_scratch *v = ferry_vec_scratch(c);
    if (!v) return FERRY_ERR_MEMORY;
    bool crc = type == FERRY_FRAME_WRITEV && c->ctx->checksum;
    uint64_t total = 0;
    size_t niov = 2; /* a WRITEV's pieces that lie end to end locally leave as one iovec */
    for (size_t i = 0; i < n; i++) {
        ferry_xfer_t *x = &g[i];
        if (crc) put32(v->crcs + 4 * i, ferry_crc32c(0, x->local, x->len));
        struct iovec *last = &v->iov[niov - 1];
        if (niov > 2 && (unsigned char *)last->iov_base + last->iov_len == x->local)
            last->iov_len += x->len;
        else
            v->iov[niov++] = (struct iovec){x->local, x->len};
        total += x->len;
    }
    uint8_t compact = 0;
    size_t dbytes = encode_compact(c, v, type, crc, g, n, &compact);
    for (size_t i = 0; dbytes == 0 && i < n; i++) {
        ferry_xfer_t *x = &g[i];
        ferry_vec_desc_t d = {.addr = x->remote, .len = (uint32_t)x->len, .generation = x->generation,
                              .req_id = x->req_id};
        if (type == FERRY_FRAME_CMA_VEC) d.aux = (uint64_t)(uintptr_t)x->local;
        else if (crc) d.aux = get32(v->crcs + 4 * i);
        ferry_vec_desc_encode(&d, v->raw + i * FERRY_WIRE_VEC_DESC_SIZE);
    }
    if (!dbytes) dbytes = n * FERRY_WIRE_VEC_DESC_SIZE;
    ferry_frame_t f = {.type = type, .flags = (crc ? FERRY_FRAME_F_CRC : 0) | compact, .req_id = g[0].req_id,
                       .addr = total, .len = n, .plen = (uint32_t)dbytes};
    if (type == FERRY_FRAME_WRITEV) f.plen += (uint32_t)total;
    else if (type == FERRY_FRAME_CMA_VEC) f.aux = (uint64_t)g[0].opcode;
    else if (c->ctx->checksum)
        f.flags |= FERRY_FRAME_F_CRC; /* READV: asks for checksummed answers */
    ferry_deadline_stamp(c, &f, earliest(g, n)); /* wire.h, FERRY_FRAME_F_DEADLINE */
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(&f, hdr);
    ferry_conn_answers_forget(c, &f);
    v->iov[0] = (struct iovec){hdr, sizeof hdr};
    v->iov[1] = (struct iovec){v->raw, dbytes};
    uint64_t off = 0;
    for (size_t i = 0; i < n; off += g[i++].len) {
        g[i].inflight++; /* before the first byte leaves (cancel.h) */
        g[i].vec_first = g[0].req_id; /* where its bytes sit, for a placement report (cancel.h) */
        g[i].vec_off = off;
        g[i].vec_index = (uint32_t)i;
    }
    return send_gathered(c->fd, v->iov, type == FERRY_FRAME_WRITEV ? niov : 2, earliest(g, n));
}

static void piece_placed(ferry_xfer_t *x)
{
    if (x->rc) return;
    x->done = x->len;
    if (x->progress) atomic_fetch_add(x->progress, x->len);
}

/* Settles the n pieces of a frame by the VEC_ACK that answered it: each
 * leaves the wire, then is placed (status 0; st NULL: all were) or fails
 * with its status, the detail in v->reason belonging to the first refused
 * piece; a piece failed already keeps its failure. refusable: a
 * NOT_IMPLEMENTED refusal sets *refused (its reason copied to reason)
 * instead, for the caller to send the pieces another way. */
static void settle_ack(ferry_conn_t *c, struct ferry_vec_scratch *v, ferry_xfer_t *g, size_t n, const int *st,
                       bool refusable, bool *refused, char *reason, size_t cap)
{
    bool first = true;
    for (size_t i = 0; i < n; i++) {
        ferry_xfer_t *x = &g[i];
        x->inflight--;
        int s = st ? st[i] : 0;
        if (s == 0) {
            piece_placed(x);
        } else if (refusable && s == FERRY_ERR_NOT_IMPLEMENTED) {
            *refused = true;
            if (reason) snprintf(reason, cap, "%s", v->reason);
        } else if (x->rc == 0) {
            if (first)
                ferry_fail(s, "target %s refused: %s", c->peer.name, v->reason[0] ? v->reason : "(no detail)");
            else
                ferry_fail(s, "target %s refused [0x%llx+%llu) with %s (one of %zu pieces in one frame; the first "
                              "refused: %s)",
                           c->peer.name, (unsigned long long)x->remote, (unsigned long long)x->len,
                           ferry_error_name(s), n, v->reason[0] ? v->reason : "(no detail)");
            ferry_xfer_fail(x, s);
            first = false;
        }
    }
}

int ferry_vec_recv_ack(ferry_conn_t *c, ferry_xfer_t *g, size_t n, unsigned spin_us, int *broken, bool refusable,
                       bool *refused, char *reason, size_t cap)
{
    struct ferry_vec_scratch *v = c->vec; /* made by the send */
    uint64_t deadline = earliest(g, n);
    ferry_frame_t f;
    int rc = ferry_conn_recv_frame_spin(c, &f, deadline, spin_us);
    if (rc == 0 && f.type == FERRY_FRAME_ERROR && f.status < 0) {
        rc = ferry_conn_fail_from_target(c, &f, deadline, NULL, 0); /* the target dropped us and said why */
    } else if (rc == 0 && (f.type != FERRY_FRAME_VEC_ACK || f.req_id != g[0].req_id)) {
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected VEC_ACK for request %llu, got %s for %llu",
                        (unsigned long long)g[0].req_id, ferry_frame_type_name(f.type), (unsigned long long)f.req_id);
    }
    if (rc == 0) rc = ferry_vec_ack_check(&f, (uint32_t)n);
    if (rc == 0 && f.status < 0) {
        rc = ferry_net_recv(c->fd, v->raw, 4 * n, deadline);
        size_t tlen = f.plen - 4 * n;
        if (rc == 0) rc = ferry_net_recv(c->fd, v->reason, tlen, deadline);
        v->reason[rc == 0 ? tlen : 0] = '\0';
        if (rc == 0) rc = ferry_vec_statuses_decode(v->raw, (uint32_t)n, v->st);
    }
    if (rc) {
        *broken = 1;
        return rc;
    }
    settle_ack(c, v, g, n, f.status < 0 ? v->st : NULL, refusable, refused, reason, cap);
    return 0;
}

int ferry_vec_recv_read(ferry_conn_t *c, ferry_xfer_t *g, size_t n, unsigned spin_us, int *broken)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    struct ferry_vec_scratch *v = c->vec; /* made by the send */
    uint64_t deadline = earliest(g, n), total = 0;
    for (size_t i = 0; i < n; i++) total += g[i].len;
    ferry_frame_t f;
    int rc = ferry_conn_recv_frame_spin(c, &f, deadline, spin_us);
    if (rc == 0 && f.type == FERRY_FRAME_ERROR && f.status < 0) {
        rc = ferry_conn_fail_from_target(c, &f, deadline, NULL, 0);
    } else if (rc == 0 && (f.type != FERRY_FRAME_VEC_ACK || f.req_id != g[0].req_id)) {
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected VEC_ACK for request %llu, got %s for %llu",
                        (unsigned long long)g[0].req_id, ferry_frame_type_name(f.type), (unsigned long long)f.req_id);
    }
    if (rc == 0) rc = ferry_vec_read_ack_check(&f, (uint32_t)n, total);
    memset(v->st, 0, n * sizeof v->st[0]);
    v->reason[0] = '\0';
    if (rc == 0 && f.status < 0) {
        rc = ferry_net_recv(c->fd, v->raw, 4 * n, deadline);
        if (rc == 0) rc = ferry_net_recv(c->fd, v->reason, f.aux, deadline);
        v->reason[rc == 0 ? f.aux : 0] = '\0';
        if (rc == 0) rc = ferry_vec_statuses_decode(v->raw, (uint32_t)n, v->st);
    }
    bool crc = (f.flags & FERRY_FRAME_F_CRC) != 0;
    if (rc == 0 && crc) rc = ferry_net_recv(c->fd, v->crcs, 4 * n, deadline);
    size_t cnt = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (v->st[i]) continue;
        v->iov[cnt++] = (struct iovec){g[i].local, g[i].len};
        bytes += g[i].len;
    }
    if (rc == 0 && bytes != f.addr)
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "VEC_ACK carries %llu bytes for pieces of %llu",
                        (unsigned long long)f.addr, (unsigned long long)bytes);
    if (rc == 0) rc = recv_gathered(c->fd, v->iov, cnt, deadline);
    if (rc) {
        *broken = 1;
        return rc;
    }
    /* The pieces the target sent whose bytes did not land whole here fail
     * with their own detail; settle_ack passes over them. */
    for (size_t i = 0, k = 0; i < n; i++) {
        ferry_xfer_t *x = &g[i];
        if (v->st[i]) continue;
        if (!v->iov[k++].iov_base) { /* its local memory refused the bytes (recv_gathered) */
            v->st[i] = FERRY_ERR_INVALID_ARGUMENT;
            if (x->rc == 0)
                ferry_xfer_fail(x, ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                                              "local buffer [%p+%llu) is registered but not writable here (a "
                                              "read-only or unmapped page): the read's answer from %s was dropped",
                                              (void *)x->local, (unsigned long long)x->len, c->peer.name));
        } else if (crc && ferry_crc32c(0, x->local, x->len) != get32(v->crcs + 4 * i)) {
            v->st[i] = FERRY_ERR_CHECKSUM_MISMATCH;
            if (x->rc == 0)
                ferry_xfer_fail(x, ferry_fail(FERRY_ERR_CHECKSUM_MISMATCH,
                                              "read piece [0x%llx+%llu) from %s arrived corrupted",
                                              (unsigned long long)x->remote, (unsigned long long)x->len,
                                              c->peer.name));
        }
    }
    settle_ack(c, v, g, n, v->st, false, NULL, NULL, 0);
    return 0;
}

/* ---------------------------------------------------------------- target */

static _Atomic uint64_t compact_served;

uint64_t ferry_vec_compact_served(void) { return atomic_load_explicit(&compact_served, memory_order_relaxed); }

int ferry_vec_recv_descs(ferry_conn_t *c, const ferry_frame_t *f, uint64_t *deadline, struct ferry_vec_scratch **out)
{
    *deadline = ferry_deadline_after_ms(c->ctx->timeout_ms);
    struct ferry_vec_scratch *v = *out = ferry_vec_scratch(c);
    if (!v) return FERRY_ERR_MEMORY;
    if (ferry_conn_version(c) < FERRY_PROTOCOL_VEC)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s on a connection that speaks protocol %u",
                          ferry_frame_type_name(f->type), ferry_conn_version(c));
    v->compact = (f->flags & FERRY_FRAME_F_COMPACT) != 0;
    if (v->compact && ferry_conn_version(c) < FERRY_PROTOCOL_COMPACT)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "compact %s on a connection that speaks protocol %u",
                          ferry_frame_type_name(f->type), ferry_conn_version(c));
    int rc = ferry_vec_frame_check(f);
    if (rc) return rc;
    rc = ferry_net_recv(c->fd, v->raw, ferry_vec_desc_bytes(f), *deadline);
    if (rc) return rc;
    rc = v->compact ? ferry_vec_compact_decode(f, v->raw, v->d, &v->span_lo, &v->span_hi)
                    : ferry_vec_desc_decode(f, v->raw, v->d);
    if (rc) return rc;
    if (v->compact) atomic_fetch_add_explicit(&compact_served, 1, memory_order_relaxed);
    memset(v->st, 0, (size_t)f->len * sizeof v->st[0]);
    v->reason[0] = '\0';
    return 0;
}

void ferry_vec_fail_piece(struct ferry_vec_scratch *v, size_t i, int rc)
{
    if (!v->reason[0] || i < v->reason_idx) {
        snprintf(v->reason, sizeof v->reason, "%s", ferry_fail_message());
        v->reason_idx = i;
    }
    v->st[i] = rc;
}

/* Whether piece d lies wholly in reg with the access and generation asked:
 * then it needs no lookup of its own. */
static bool fits_region(const ferry_region_t *reg, const ferry_vec_desc_t *d, uint32_t need)
{
    return reg && d->addr >= reg->addr && d->addr - reg->addr <= reg->len && d->len <= reg->len - (d->addr - reg->addr) &&
           (reg->flags & need) == need && (!d->generation || d->generation == reg->generation);
}

size_t ferry_vec_validate_locked(ferry_conn_t *c, struct ferry_vec_scratch *v, size_t from, size_t n, uint32_t need,
                                 bool *device)
{
    ferry_registry_t *r = c->ctx->registry;
    const ferry_region_t *reg = NULL;
    if (v->compact && from == 0) {
        /* One lookup for the whole span of a compact frame: when it lies in
         * one region, no piece needs a lookup of its own. */
        ferry_vec_desc_t span = {.addr = v->span_lo, .len = 0, .generation = v->d[0].generation};
        reg = ferry_registry_lookup_locked(r, v->span_lo, v->span_hi - v->span_lo);
        if (!fits_region(reg, &span, need)) reg = NULL;
        if (reg && reg->kind != FERRY_MEMKIND_HOST) *device = true;
    }
    bool cancels = ferry_vec_cancels_pending(c);
    size_t failed = 0;
    for (size_t i = from; i < n; i++) {
        const ferry_vec_desc_t *d = &v->d[i];
        if (v->st[i]) {
            failed++;
            continue;
        }
        int rc = 0;
        if (cancels && ferry_conn_is_cancelled(c, d->req_id)) {
            rc = ferry_fail(FERRY_ERR_CANCELLED, "request %llu was cancelled", (unsigned long long)d->req_id);
        } else if (!fits_region(reg, d, need)) {
            rc = ferry_registry_check_locked(r, d->addr, d->len, need, d->generation, "target");
            reg = rc ? NULL : ferry_registry_lookup_locked(r, d->addr, d->len);
            if (reg && reg->kind != FERRY_MEMKIND_HOST) *device = true;
        }
        if (rc) {
            if (v->compact) ferry_fail_context("piece %zu of a compact frame, at 0x%llx", i, (unsigned long long)d->addr);
            ferry_vec_fail_piece(v, i, rc);
            failed++;
        }
    }
    return failed;
}

size_t ferry_vec_expire(ferry_conn_t *c, const ferry_frame_t *f, struct ferry_vec_scratch *v, size_t from, size_t n)
{
    if (!ferry_frame_expired(f)) return 0;
    size_t k = 0;
    for (size_t i = from; i < n; i++) {
        if (v->st[i]) continue;
        ferry_vec_fail_piece(v, i, ferry_frame_expired_fail(c, f));
        k++;
    }
    return k;
}

int ferry_vec_send_ack(ferry_conn_t *c, const ferry_frame_t *req, struct ferry_vec_scratch *v, size_t n,
                       uint64_t deadline)
{
    int32_t status = 0;
    uint64_t placed = 0;
    for (size_t i = 0; i < n; i++) {
        if (v->st[i] && !status) status = v->st[i];
        if (!v->st[i]) placed += v->d[i].len;
    }
    ferry_frame_t a = {.type = FERRY_FRAME_VEC_ACK, .status = status, .req_id = req->req_id, .addr = placed,
                       .len = n};
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    struct iovec iov[3] = {{hdr, sizeof hdr}};
    int cnt = 1;
    if (status) {
        for (size_t i = 0; i < n; i++) put32(v->raw + 4 * i, (uint32_t)v->st[i]);
        size_t tlen = strnlen(v->reason, FERRY_WIRE_MAX_REASON);
        a.plen = (uint32_t)(4 * n + tlen);
        iov[1] = (struct iovec){v->raw, 4 * n};
        iov[2] = (struct iovec){v->reason, tlen};
        cnt = tlen ? 3 : 2;
    }
    ferry_frame_encode(&a, hdr);
    return ferry_serve_sendv(c, iov, cnt, deadline);
}
