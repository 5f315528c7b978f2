/* SPDX-License-Identifier: Apache-2.0 */
/* Encoding and validation of the RDMA transport's payloads (layouts in
 * wire.h and rdma_wire.h). Always compiled: a peer without RDMA still decodes them, and the
 * tests exercise every rejection without a device. */
#include <string.h>

#include "util/fail.h"
#include "wire/le.h"
#include "rdma_wire.h"
#include "wire/wire.h"
#include <ferry/ferry.h>


void ferry_rdma_qp_info_encode(const ferry_rdma_qp_info_t *q, uint8_t out[FERRY_RDMA_QP_INFO_SIZE])
{
    memset(out, 0, FERRY_RDMA_QP_INFO_SIZE);
    put32(out, q->qpn);
    put32(out + 4, q->psn);
    put16(out + 8, q->lid);
    out[10] = q->port;
    out[11] = q->link_layer;
    out[12] = q->mtu;
    out[13] = q->gid_index;
    out[14] = q->rd_atom;
    memcpy(out + 16, q->gid, 16);
    put32(out + 32, q->recv_depth);
    put64(out + 40, q->guid);
}

static int bad(const char *what, unsigned long long v)
{
    return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA QP info: %s %llu is invalid", what, v);
}

int ferry_rdma_qp_info_decode(const uint8_t *in, size_t len, ferry_rdma_qp_info_t *q)
{
    if (len != FERRY_RDMA_QP_INFO_SIZE)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA QP info of %zu bytes, expected %d", len,
                          FERRY_RDMA_QP_INFO_SIZE);
    memset(q, 0, sizeof *q);
    q->qpn = get32(in);
    q->psn = get32(in + 4);
    q->lid = get16(in + 8);
    q->port = in[10];
    q->link_layer = in[11];
    q->mtu = in[12];
    q->gid_index = in[13];
    q->rd_atom = in[14];
    memcpy(q->gid, in + 16, 16);
    q->recv_depth = get32(in + 32);
    q->guid = get64(in + 40);
    if (in[15] != 0 || get32(in + 36) != 0)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA QP info: reserved bytes are not zero");
    if (q->qpn == 0 || q->qpn >= (1u << 24)) return bad("queue pair number", q->qpn);
    if (q->psn >= (1u << 24)) return bad("packet sequence number", q->psn);
    if (q->port == 0) return bad("port", q->port);
    if (q->link_layer != FERRY_RDMA_LINK_IB && q->link_layer != FERRY_RDMA_LINK_ETH)
        return bad("link layer", q->link_layer);
    if (q->mtu < 1 || q->mtu > 5) return bad("MTU code", q->mtu);
    if (q->rd_atom < 1 || q->rd_atom > 16) return bad("RDMA READ depth", q->rd_atom);
    if (q->recv_depth < 1 || q->recv_depth > 65536) return bad("receive depth", q->recv_depth);
    if (q->link_layer == FERRY_RDMA_LINK_IB && (q->lid == 0 || q->lid >= 0xc000))
        return bad("InfiniBand LID (0 and multicast LIDs are not a port)", q->lid);
    if (q->link_layer == FERRY_RDMA_LINK_ETH) {
        static const uint8_t zero[16];
        if (memcmp(q->gid, zero, 16) == 0)
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA QP info: a RoCE port needs a GID, got all zeros");
    }
    return 0;
}

void ferry_rdma_mr_info_encode(const ferry_rdma_mr_info_t *m, uint8_t out[FERRY_RDMA_MR_INFO_SIZE])
{
    memset(out, 0, FERRY_RDMA_MR_INFO_SIZE);
    put64(out, m->addr);
    put64(out + 8, m->len);
    put32(out + 16, m->rkey);
    put32(out + 20, m->generation);
    put32(out + 24, m->flags);
}

int ferry_rdma_mr_info_decode(const uint8_t *in, size_t len, ferry_rdma_mr_info_t *m)
{
    if (len != FERRY_RDMA_MR_INFO_SIZE)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA MR info of %zu bytes, expected %d", len,
                          FERRY_RDMA_MR_INFO_SIZE);
    m->addr = get64(in);
    m->len = get64(in + 8);
    m->rkey = get32(in + 16);
    m->generation = get32(in + 20);
    m->flags = get32(in + 24);
    if (get32(in + 28) != 0) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA MR info: reserved bytes are not zero");
    if (m->len == 0 || m->addr == 0 || m->addr + m->len < m->addr)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA MR info: region [0x%llx+%llu) is empty or wraps",
                          (unsigned long long)m->addr, (unsigned long long)m->len);
    if (m->flags == 0 || (m->flags & ~(uint32_t)FERRY_MEM_REMOTE))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA MR info: region flags 0x%x are not remote access flags",
                          m->flags);
    return 0;
}

/* ---- the RDMA transport's own frames (rdma_wire.h) ---- */

const ferry_frame_def_t ferry_rdma_frames[FERRY_RDMA_NFRAMES] = {
    {FERRY_FRAME_RDMA_CONNECT, "RDMA_CONNECT", FERRY_RDMA_QP_INFO_SIZE, 0},
    /* QP info, MR info, or the reason text when status < 0 */
    {FERRY_FRAME_RDMA_CONNECT_ACK, "RDMA_CONNECT_ACK", FERRY_WIRE_MAX_REASON, 0},
    {FERRY_FRAME_RDMA_MR_QUERY, "RDMA_MR_QUERY", 0, 0},
    {FERRY_FRAME_RDMA_MR_INFO, "RDMA_MR_INFO", FERRY_WIRE_MAX_REASON, 0},
    {FERRY_FRAME_RDMA_COMMIT, "RDMA_COMMIT", 0, 0},
    {FERRY_FRAME_RDMA_COMMIT_ACK, "RDMA_COMMIT_ACK", FERRY_WIRE_MAX_REASON, 0},
    {FERRY_FRAME_RDMA_COMMIT_GROUP, "RDMA_COMMIT_GROUP", FERRY_RDMA_GROUP_MAX * FERRY_RDMA_COMMIT_DESC_SIZE, 0},
    {FERRY_FRAME_RDMA_COMMIT_GROUP_ACK, "RDMA_COMMIT_GROUP_ACK", FERRY_RDMA_GROUP_MAX * 4 + FERRY_WIRE_MAX_REASON, 0},
};

void ferry_rdma_commit_desc_encode(const ferry_rdma_commit_desc_t *d, uint8_t out[FERRY_RDMA_COMMIT_DESC_SIZE])
{
    put64(out, d->addr);
    put64(out + 8, d->len);
    put64(out + 16, d->req_id);
    put32(out + 24, d->generation);
    put32(out + 28, 0);
}

int ferry_rdma_commit_group_check(const ferry_frame_t *f)
{
    if (f->len == 0 || f->len > FERRY_RDMA_GROUP_MAX)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT_GROUP of %llu pieces (1..%d allowed)",
                          (unsigned long long)f->len, FERRY_RDMA_GROUP_MAX);
    if (f->plen != f->len * FERRY_RDMA_COMMIT_DESC_SIZE)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                          "RDMA_COMMIT_GROUP of %llu pieces carries %u bytes, expected %llu", (unsigned long long)f->len,
                          f->plen, (unsigned long long)f->len * FERRY_RDMA_COMMIT_DESC_SIZE);
    return 0;
}

int ferry_rdma_commit_group_decode(const ferry_frame_t *f, const uint8_t *in, ferry_rdma_commit_desc_t *out)
{
    uint64_t total = 0;
    for (uint64_t i = 0; i < f->len; i++, in += FERRY_RDMA_COMMIT_DESC_SIZE) {
        ferry_rdma_commit_desc_t *d = &out[i];
        d->addr = get64(in);
        d->len = get64(in + 8);
        d->req_id = get64(in + 16);
        d->generation = get32(in + 24);
        if (get32(in + 28) != 0)
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT_GROUP piece %llu: reserved bytes are not zero",
                              (unsigned long long)i);
        if (d->len == 0 || d->addr == 0 || d->addr + d->len < d->addr || total + d->len < total)
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                              "RDMA_COMMIT_GROUP piece %llu: [0x%llx+%llu) is empty or wraps", (unsigned long long)i,
                              (unsigned long long)d->addr, (unsigned long long)d->len);
        total += d->len;
    }
    if (total != f->addr)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                          "RDMA_COMMIT_GROUP pieces add up to %llu bytes, the header says %llu",
                          (unsigned long long)total, (unsigned long long)f->addr);
    return 0;
}

int ferry_rdma_commit_group_ack_check(const ferry_frame_t *f, uint32_t n, uint64_t total)
{
    if (f->len != n)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT_GROUP_ACK for %llu pieces, %u were committed",
                          (unsigned long long)f->len, n);
    if (f->status == 0 ? f->plen != 0 || f->addr != total
                       : f->plen < 4u * n || f->plen > 4u * n + FERRY_WIRE_MAX_REASON || f->addr >= total)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                          "RDMA_COMMIT_GROUP_ACK with status %d, %llu bytes confirmed and %u payload bytes for %u "
                          "pieces of %llu bytes",
                          f->status, (unsigned long long)f->addr, f->plen, n, (unsigned long long)total);
    return 0;
}
