/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport's target: the queue pair's set-up on RDMA_CONNECT
 * and the keys of RDMA_MR_QUERY, and the dispatch of RDMA frames (the
 * commit is rdma_commit.c). Part of the verbs code (rdma_int.h). */
#include <stdio.h>
#include <string.h>

#include "util/clock.h"
#include "util/fail.h"
#include "util/net.h"
#include "rdma_int.h"
#include "rdma_wire.h"

/* -------------------------------------------------------------- target */

static int serve_connect(ferry_conn_t *c, struct rdma_dev *d, const ferry_frame_t *f, uint64_t deadline)
{
    uint8_t buf[FERRY_RDMA_QP_INFO_SIZE];
    if (f->plen != sizeof buf)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_CONNECT carries %u bytes, expected %zu", f->plen, sizeof buf);
    int rc = ferry_net_recv(c->fd, buf, sizeof buf, deadline);
    if (rc) return rc;
    ferry_rdma_qp_info_t theirs, mine;
    /* A bad QP info or a second CONNECT is answered (the stream is intact):
     * the initiator then falls back to TCP. */
    int status = ferry_rdma_qp_info_decode(buf, sizeof buf, &theirs);
    if (status == 0 && c->xport)
        status = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "a second RDMA_CONNECT on one connection");
    if (status) return ferry_rdma_reply(c, FERRY_FRAME_RDMA_CONNECT_ACK, f, status, NULL, 0, 0, deadline);
    struct rdma_ep *ep;
    status = ferry_rdma_ep_create(d, &ep);
    if (status == 0) {
        /* Zero-length receives for the commits' immediates. */
        for (int i = 0; status == 0 && i < d->recv_depth; i++) {
            struct ibv_recv_wr wr, *bad = NULL;
            memset(&wr, 0, sizeof wr);
            wr.wr_id = (uint64_t)i;
            int err = d->v->post_recv(ep->qp, &wr, &bad);
            if (err) status = ferry_rdma_verbs_fail(FERRY_ERR_MEMORY, "ibv_post_recv", d, err);
        }
        if (status == 0) status = ferry_rdma_ep_connect(ep, &theirs);
        if (status) ferry_rdma_ep_destroy(ep);
    }
    if (status) return ferry_rdma_reply(c, FERRY_FRAME_RDMA_CONNECT_ACK, f, status, NULL, 0, 0, deadline);
    c->xport = ep;
    ep->peer_fd = c->fd;
    c->xport_free = ferry_rdma_conn_free_ep;
    ferry_rdma_ep_info(ep, &mine);
    ferry_rdma_qp_info_encode(&mine, buf);
    return ferry_rdma_reply(c, FERRY_FRAME_RDMA_CONNECT_ACK, f, 0, buf, sizeof buf, 0, deadline);
}

static int serve_mr_query(ferry_conn_t *c, struct rdma_dev *d, const ferry_frame_t *f, uint64_t deadline)
{
    uint32_t need = (uint32_t)(f->aux >> 32), generation = (uint32_t)f->aux;
    if (need != FERRY_MEM_REMOTE_READ && need != FERRY_MEM_REMOTE_WRITE)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_MR_QUERY asks for access 0x%x", need);
    ferry_registry_t *r = c->ctx->registry;
    ferry_rdma_mr_info_t m = {0};
    ferry_registry_read_lock(r);
    int status = ferry_registry_check_locked(r, f->addr, f->len, need, generation, "target");
    if (status == 0) {
        ferry_region_t *reg = ferry_registry_lookup_locked(r, f->addr, f->len);
        struct ibv_mr *mr = NULL;
        status = ferry_rdma_region_mr(d, reg, &mr);
        if (status == 0) m = (ferry_rdma_mr_info_t){reg->addr, reg->len, mr->rkey, reg->generation, reg->flags};
    }
    ferry_registry_unlock(r);
    if (status) return ferry_rdma_reply(c, FERRY_FRAME_RDMA_MR_INFO, f, status, NULL, 0, 0, deadline);
    uint8_t buf[FERRY_RDMA_MR_INFO_SIZE];
    ferry_rdma_mr_info_encode(&m, buf);
    return ferry_rdma_reply(c, FERRY_FRAME_RDMA_MR_INFO, f, 0, buf, sizeof buf, f->len, deadline);
}


int ferry_rdma_verbs_serve(ferry_conn_t *c, void *dev, const ferry_frame_t *f)
{
    uint64_t deadline = ferry_deadline_after_ms(c->ctx->timeout_ms);
    switch (f->type) {
    case FERRY_FRAME_RDMA_CONNECT: return serve_connect(c, dev, f, deadline);
    case FERRY_FRAME_RDMA_MR_QUERY: return serve_mr_query(c, dev, f, deadline);
    case FERRY_FRAME_RDMA_COMMIT: return ferry_rdma_serve_commit(c, dev, f, deadline);
    case FERRY_FRAME_RDMA_COMMIT_GROUP: return ferry_rdma_serve_commit_group(c, dev, f, deadline);
    default:
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "unexpected %s frame", ferry_frame_type_name(f->type));
    }
}
