/* Encoding and validation of the RDMA transport's payloads (layout in
 * wire.h). Always compiled: a peer without RDMA still decodes them, and the
 * tests exercise every rejection without a device. */
#include <string.h>

#include "core/fail.h"
#include "le.h"
#include "wire.h"
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
