/* The RDMA transport's commit protocol for writes, both sides: the
 * initiator's chain of zero-length WRITE WITH IMMEDIATE and its
 * RDMA_COMMITs, the target's wait for the immediate and its check. Part of
 * the verbs code (rdma_int.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>

#include "core/fail.h"
#include "core/net.h"
#include "rdma_int.h"

/* Posts the commits' zero-length WRITE WITH IMMEDIATE of pieces batch[0..nb)
 * as one chain, the last alone signalled (wr_id nb - 1). Returns how many
 * the HCA accepted; on a refusal also the failure in *rc. */
static unsigned post_commit_chain(ferry_conn_t *c, struct rdma_ep *ep, ferry_xfer_t *xs, const struct plan *pl,
                                  const size_t *batch, unsigned nb, int *rc)
{
    struct ibv_send_wr wrs[COMMIT_WINDOW], *bad = NULL;
    memset(wrs, 0, nb * sizeof *wrs);
    for (unsigned k = 0; k < nb; k++) {
        size_t i = batch[k];
        wrs[k].wr_id = k;
        wrs[k].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wrs[k].imm_data = htonl(ep->commit_seq + k);
        wrs[k].wr.rdma.remote_addr = xs[i].remote + pl[i].start;
        wrs[k].wr.rdma.rkey = pl[i].rkey;
        wrs[k].next = k + 1 < nb ? &wrs[k + 1] : NULL;
    }
    wrs[nb - 1].send_flags = IBV_SEND_SIGNALED;
    *rc = 0;
    int err = ep->d->v->post_send(ep->qp, wrs, &bad);
    unsigned posted = nb;
    if (err) {
        posted = bad && bad >= wrs && bad < wrs + nb ? (unsigned)(bad - wrs) : 0;
        *rc = ferry_fail(FERRY_ERR_INTERNAL, "ibv_post_send of %u RDMA commits (%u accepted) to %s on %s failed: %s",
                         nb, posted, c->peer.name, ep->d->name, strerror(err));
    }
    ep->commit_seq += posted;
    return posted;
}

/* The commit phase for write pieces: a chain of WRITE WITH IMMEDIATE, then
 * one RDMA_COMMIT per piece, and the target's RDMA_COMMIT_ACKs, windowed. */
int ferry_rdma_commit_writes(ferry_conn_t *c, struct rdma_ep *ep, ferry_xfer_t *xs, size_t nx, struct plan *pl,
                         struct first_err *fe, int *broken)
{
    unsigned window = COMMIT_WINDOW;
    if (window > ep->peer.recv_depth) window = ep->peer.recv_depth;
    if (window > (unsigned)ep->d->send_depth) window = (unsigned)ep->d->send_depth;
    size_t batch[COMMIT_WINDOW];
    size_t i = 0;
    while (i < nx) {
        unsigned nb = 0;
        for (; i < nx && nb < window; i++) {
            ferry_xfer_t *x = &xs[i];
            if (x->opcode != FERRY_OP_WRITE || pl[i].mode != PLAN_RDMA || x->rc || pl[i].completed == 0) continue;
            batch[nb++] = i;
        }
        if (nb == 0) break;
        int rc;
        unsigned posted = post_commit_chain(c, ep, xs, pl, batch, nb, &rc);
        for (unsigned k = 0; rc == 0 && k < nb; k++) {
            ferry_xfer_t *x = &xs[batch[k]];
            ferry_frame_t f = {.type = FERRY_FRAME_RDMA_COMMIT, .req_id = x->req_id,
                               .addr = x->remote + pl[batch[k]].start, .len = pl[batch[k]].completed,
                               .aux = x->generation};
            rc = ferry_conn_send_frame(c, &f, NULL, x->deadline);
        }
        if (rc) {
            ferry_rdma_keep_err(fe, rc);
            *broken = 1;
            if (posted) ferry_rdma_ep_abort_until(ep, posted - 1, posted == nb);
            return fe->rc;
        }
        for (unsigned k = 0; k < nb; k++) {
            ferry_xfer_t *x = &xs[batch[k]];
            ferry_frame_t f;
            rc = ferry_conn_recv_frame(c, &f, x->deadline);
            if (rc == 0 && (f.type != FERRY_FRAME_RDMA_COMMIT_ACK || f.req_id != x->req_id))
                rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected RDMA_COMMIT_ACK for request %llu, got %s for %llu",
                                (unsigned long long)x->req_id, ferry_frame_type_name(f.type),
                                (unsigned long long)f.req_id);
            if (rc == 0 && f.status < 0) {
                rc = ferry_rdma_read_refusal(c, &f, "the RDMA write", x->deadline);
                if (rc == f.status) {
                    ferry_xfer_fail(x, rc); /* the piece failed; the stream goes on */
                    continue;
                }
            }
            if (rc == 0 && f.len != pl[batch[k]].completed)
                rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT_ACK for %llu bytes, committed %llu",
                                (unsigned long long)f.len, (unsigned long long)pl[batch[k]].completed);
            if (rc) {
                ferry_rdma_keep_err(fe, rc);
                *broken = 1;
                ferry_rdma_ep_abort_until(ep, nb - 1, true);
                return fe->rc;
            }
            x->done = pl[batch[k]].start + pl[batch[k]].completed;
            if (x->progress) atomic_fetch_add(x->progress, pl[batch[k]].completed);
        }
        /* The chain's completion: its signalled end, or errors and flushes
         * up to it. */
        for (bool ended = false; !ended;) {
            struct ibv_wc wc[16];
            int got = ferry_rdma_ep_wait(ep, wc, 16, xs[batch[nb - 1]].deadline);
            if (got < 0) {
                ferry_rdma_keep_err(fe, got);
                *broken = 1;
                ferry_rdma_ep_abort_until(ep, nb - 1, true);
                return fe->rc;
            }
            for (int k = 0; k < got; k++) {
                if (wc[k].status != IBV_WC_SUCCESS) {
                    /* The target confirmed placement already; the QP is
                     * broken for what follows. */
                    size_t at = wc[k].wr_id < nb ? batch[wc[k].wr_id] : batch[nb - 1];
                    ferry_rdma_keep_err(fe, ferry_rdma_wc_failure(ep->d->v, &wc[k], &xs[at], 0, 0, c->peer.name));
                    *broken = 1;
                }
                if (wc[k].wr_id == nb - 1) ended = true;
            }
        }
        if (*broken) {
            ferry_rdma_ep_set_error(ep);
            return fe->rc;
        }
    }
    return 0;
}

/* Waits for the commit's immediate (all earlier writes of the QP are then
 * placed), re-posts its receive, checks the range, answers. */
int ferry_rdma_serve_commit(ferry_conn_t *c, struct rdma_dev *d, const ferry_frame_t *f, uint64_t deadline)
{
    struct rdma_ep *ep = c->xport;
    if (!ep) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT before RDMA_CONNECT");
    if (f->len == 0) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT of 0 bytes");
    struct ibv_wc wc;
    int n = ferry_rdma_ep_wait(ep, &wc, 1, deadline);
    if (n < 0) return ferry_fail_context("waiting for the immediate of the commit of [0x%llx+%llu) from %s",
                                         (unsigned long long)f->addr, (unsigned long long)f->len, c->peer.name);
    if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || ntohl(wc.imm_data) != ep->commit_seq)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA commit from %s: completion %s, opcode %d, immediate %u "
                          "(expected %u)", c->peer.name, d->v->wc_status_str ? d->v->wc_status_str(wc.status) : "?",
                          (int)wc.opcode, ntohl(wc.imm_data), ep->commit_seq);
    ep->commit_seq++;
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wc.wr_id;
    int err = d->v->post_recv(ep->qp, &wr, &bad);
    if (err) return ferry_rdma_verbs_fail(FERRY_ERR_INTERNAL, "ibv_post_recv", d, err);
    ferry_registry_t *r = &c->engine->registry;
    ferry_registry_read_lock(r);
    int status = ferry_conn_is_cancelled(c, f->req_id)
                     ? ferry_fail(FERRY_ERR_CANCELLED, "request %llu was cancelled", (unsigned long long)f->req_id)
                     : ferry_registry_check_locked(r, f->addr, f->len, FERRY_MEM_REMOTE_WRITE, (uint32_t)f->aux,
                                                   "target");
    ferry_registry_unlock(r);
    if (status == FERRY_ERR_ADDRESS_NOT_REGISTERED) ferry_fail_context("region deregistered during the write");
    return ferry_rdma_reply(c, FERRY_FRAME_RDMA_COMMIT_ACK, f, status, NULL, 0, f->len, deadline);
}
