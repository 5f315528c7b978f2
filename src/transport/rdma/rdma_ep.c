/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport's endpoints: one reliable-connected queue pair per TCP
 * connection with its completion queue and channel, its set-up, the wait
 * for completions, the abort, and the initiator's cache of the target's
 * keys. Part of the verbs code (rdma_int.h). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"
#include "rdma_int.h"

void ferry_rdma_ep_destroy(struct rdma_ep *ep)
{
    const ferry_verbs_t *v = ep->d->v;
    if (ep->qp) v->destroy_qp(ep->qp);
    if (ep->cq) {
        if (ep->events) v->ack_cq_events(ep->cq, ep->events);
        v->destroy_cq(ep->cq);
    }
    if (ep->ch) v->destroy_comp_channel(ep->ch);
    free(ep->rkeys);
    ferry_rdma_group_free(ep->group);
    free(ep);
}

/* ferry_conn_t.xport_free of a connection with a queue pair. */
void ferry_rdma_conn_free_ep(void *ep)
{
    if (ep) ferry_rdma_ep_destroy(ep);
}

int ferry_rdma_verbs_fail(int code, const char *what, struct rdma_dev *d, int err)
{
    return ferry_fail(code, "%s on %s failed: %s", what, d->name, strerror(err ? err : EIO));
}

int ferry_rdma_ep_create(struct rdma_dev *d, struct rdma_ep **out)
{
    const ferry_verbs_t *v = d->v;
    struct rdma_ep *ep = calloc(1, sizeof *ep);
    if (!ep) return ferry_fail(FERRY_ERR_MEMORY, "RDMA endpoint: out of memory");
    ep->d = d;
    ep->peer_fd = -1;
    int rc = 0;
    ep->ch = v->create_comp_channel(d->ctx);
    if (!ep->ch) rc = ferry_rdma_verbs_fail(FERRY_ERR_MEMORY, "ibv_create_comp_channel", d, errno);
    if (rc == 0 && !(ep->cq = v->create_cq(d->ctx, d->cq_depth, ep, ep->ch, 0)))
        rc = ferry_rdma_verbs_fail(FERRY_ERR_MEMORY, "ibv_create_cq", d, errno);
    if (rc == 0) {
        struct ibv_qp_init_attr ia;
        memset(&ia, 0, sizeof ia);
        ia.send_cq = ep->cq;
        ia.recv_cq = ep->cq;
        ia.cap.max_send_wr = (uint32_t)d->send_depth;
        ia.cap.max_recv_wr = (uint32_t)d->recv_depth;
        ia.cap.max_send_sge = (uint32_t)d->max_sge;
        ia.cap.max_recv_sge = 1;
        ia.qp_type = IBV_QPT_RC;
        if (!(ep->qp = v->create_qp(d->pd, &ia)))
            rc = ferry_rdma_verbs_fail(FERRY_ERR_MEMORY, "ibv_create_qp", d, errno);
    }
    if (rc == 0) {
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = d->port;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
        int err = v->modify_qp(ep->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        if (err) rc = ferry_rdma_verbs_fail(FERRY_ERR_INTERNAL, "ibv_modify_qp(INIT)", d, err);
    }
    if (rc) {
        ferry_rdma_ep_destroy(ep);
        return rc;
    }
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint32_t)ferry_now_ns();
    ep->psn = r & 0xffffff;
    *out = ep;
    return 0;
}

void ferry_rdma_ep_info(const struct rdma_ep *ep, ferry_rdma_qp_info_t *q)
{
    const struct rdma_dev *d = ep->d;
    memset(q, 0, sizeof *q);
    q->qpn = ep->qp->qp_num;
    q->psn = ep->psn;
    q->lid = d->pattr.lid;
    q->port = d->port;
    q->link_layer = d->link;
    q->mtu = (uint8_t)d->pattr.active_mtu;
    q->gid_index = (uint8_t)d->gid_index;
    q->rd_atom = d->rd_atom;
    memcpy(q->gid, d->gid.raw, 16);
    q->recv_depth = (uint32_t)d->recv_depth;
    q->guid = d->guid;
}

/* INIT -> RTR -> RTS towards the peer's QP. */
int ferry_rdma_ep_connect(struct rdma_ep *ep, const ferry_rdma_qp_info_t *peer)
{
    struct rdma_dev *d = ep->d;
    if (peer->link_layer != d->link)
        return ferry_fail(FERRY_ERR_ENDPOINT, "the peer's RDMA port is %s, %s's is %s: no common fabric",
                          peer->link_layer == FERRY_RDMA_LINK_ETH ? "RoCE" : "InfiniBand", d->name,
                          d->link == FERRY_RDMA_LINK_ETH ? "RoCE" : "InfiniBand");
    ep->peer = *peer;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = (enum ibv_mtu)(peer->mtu < (uint8_t)d->pattr.active_mtu ? peer->mtu : (uint8_t)d->pattr.active_mtu);
    a.dest_qp_num = peer->qpn;
    a.rq_psn = peer->psn;
    a.max_dest_rd_atomic = d->rd_atom;
    a.min_rnr_timer = 12; /* 0.64 ms */
    a.ah_attr.port_num = d->port;
    if (d->link == FERRY_RDMA_LINK_ETH) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    } else {
        a.ah_attr.dlid = peer->lid;
    }
    int err = d->v->modify_qp(ep->qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err) return ferry_rdma_verbs_fail(FERRY_ERR_ENDPOINT, "ibv_modify_qp(RTR)", d, err);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;   /* 4.096 us * 2^14 = 67 ms per try */
    a.retry_cnt = 7;
    a.rnr_retry = 7;  /* receiver not ready: retry without limit */
    a.sq_psn = ep->psn;
    a.max_rd_atomic = peer->rd_atom < d->rd_atom ? peer->rd_atom : d->rd_atom;
    err = d->v->modify_qp(ep->qp, &a,
                          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                              IBV_QP_MAX_QP_RD_ATOMIC);
    if (err) return ferry_rdma_verbs_fail(FERRY_ERR_ENDPOINT, "ibv_modify_qp(RTS)", d, err);
    return 0;
}

/* Waits for up to max completions: polls, and when the CQ is empty arms it
 * and sleeps in poll() on the channel's fd until an event or the deadline.
 * Returns the count (> 0) or a negative code. */
int ferry_rdma_ep_wait(struct rdma_ep *ep, struct ibv_wc *wc, int max, uint64_t deadline)
{
    const ferry_verbs_t *v = ep->d->v;
    for (;;) {
        int n = v->poll_cq(ep->cq, max, wc);
        if (n < 0) return ferry_fail(FERRY_ERR_INTERNAL, "ibv_poll_cq on %s failed (%d)", ep->d->name, n);
        if (n > 0) return n;
        if (!ep->armed) {
            int err = v->req_notify_cq(ep->cq, 0);
            if (err) return ferry_rdma_verbs_fail(FERRY_ERR_INTERNAL, "ibv_req_notify_cq", ep->d, err);
            ep->armed = true;
            continue; /* a completion may have come before the arming */
        }
        /* The target also watches its control connection: an initiator
         * that hung up sends no immediate any more. */
        struct pollfd p[2] = {{.fd = ep->ch->fd, .events = POLLIN}, {.fd = ep->peer_fd, .events = POLLRDHUP}};
        int ms = ferry_ms_left(deadline);
        if (ms == 0) return ferry_fail(FERRY_ERR_TIMEOUT, "no RDMA completion on %s before the deadline", ep->d->name);
        int r = poll(p, ep->peer_fd >= 0 ? 2 : 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ferry_fail(FERRY_ERR_INTERNAL, "poll on the completion channel: %s", strerror(errno));
        if (r == 0) continue; /* the deadline check above ends it */
        if (!(p[0].revents & POLLIN)) {
            if (ep->peer_fd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)))
                return ferry_fail(FERRY_ERR_PEER_CLOSED, "the peer closed the connection while %s waited for an RDMA "
                                  "completion", ep->d->name);
            continue;
        }
        struct ibv_cq *cq;
        void *cq_ctx;
        if (v->get_cq_event(ep->ch, &cq, &cq_ctx) != 0)
            return ferry_fail(FERRY_ERR_INTERNAL, "ibv_get_cq_event on %s failed: %s", ep->d->name, strerror(errno));
        ep->armed = false;
        if (++ep->events >= 64) { /* acknowledging takes a lock: batch it */
            v->ack_cq_events(ep->cq, ep->events);
            ep->events = 0;
        }
    }
}

/* Moves the QP to the error state: the HCA then flushes every outstanding
 * work request, each with a completion. */
void ferry_rdma_ep_set_error(struct rdma_ep *ep)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_ERR;
    ep->d->v->modify_qp(ep->qp, &a, IBV_QP_STATE);
}

/* After ferry_rdma_ep_set_error: a zero-length signalled work request, flushed at
 * once, whose completion comes after every earlier one's. Needed when the
 * last work request the HCA accepted was unsignalled (a chain refused part
 * way): done before the error, it would never complete visibly. */
int ferry_rdma_post_marker(struct rdma_ep *ep, uint64_t wr_id)
{
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    return ep->d->v->post_send(ep->qp, &wr, &bad);
}

/* Moves the QP to the error state and waits for the completion of work
 * request last_id (every one before it is then done or flushed), so that
 * none is left running. When last_id was not signalled, a marker's. */
void ferry_rdma_ep_abort_until(struct rdma_ep *ep, uint64_t last_id, bool signalled)
{
    ferry_rdma_ep_set_error(ep);
    if (!signalled) {
        last_id = UINT64_MAX;
        if (ferry_rdma_post_marker(ep, last_id) != 0) {
            FERRY_LOG(FERRY_LOG_ERROR, "rdma", "%s: no marker after the abort; the error state flushes the rest",
                      ep->d->name);
            return;
        }
    }
    uint64_t grace = ferry_deadline_after_ms(FLUSH_GRACE_MS);
    struct ibv_wc wc[16];
    for (;;) {
        int n = ferry_rdma_ep_wait(ep, wc, 16, grace);
        if (n <= 0) {
            FERRY_LOG(FERRY_LOG_ERROR, "rdma", "%s: work requests not flushed after the abort", ep->d->name);
            return;
        }
        for (int k = 0; k < n; k++)
            if (wc[k].wr_id == last_id) return;
    }
}

/* --------------------------------------------------------- key cache */

/* Index of the last entry with addr <= a, or -1. */
static long rkey_index(const struct rdma_ep *ep, uint64_t a)
{
    long lo = 0, hi = (long)ep->nrkeys - 1, found = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if (ep->rkeys[mid].addr <= a) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

const struct rkey_ent *ferry_rdma_rkey_find(const struct rdma_ep *ep, uint64_t addr, uint64_t len, uint32_t gen)
{
    long i = rkey_index(ep, addr);
    if (i < 0) return NULL;
    const struct rkey_ent *k = &ep->rkeys[i];
    if (addr + len > k->addr + k->len || (gen && k->generation != gen)) return NULL;
    return k;
}

int ferry_rdma_rkey_put(struct rdma_ep *ep, const ferry_rdma_mr_info_t *m)
{
    if (!ep->rkeys) {
        ep->rkeys = malloc(RKEY_CACHE_MAX * sizeof *ep->rkeys);
        if (!ep->rkeys) return ferry_fail(FERRY_ERR_MEMORY, "RDMA key cache: out of memory");
    }
    long i = rkey_index(ep, m->addr);
    struct rkey_ent k = {m->addr, m->len, m->generation, m->rkey};
    if (i >= 0 && ep->rkeys[i].addr == m->addr) {
        ep->rkeys[i] = k;
        return 0;
    }
    if (ep->nrkeys == RKEY_CACHE_MAX) {
        ep->nrkeys = 0; /* a full cache starts over; keys are fetched again on use */
        i = -1;
    }
    size_t at = (size_t)(i + 1);
    memmove(ep->rkeys + at + 1, ep->rkeys + at, (ep->nrkeys - at) * sizeof *ep->rkeys);
    ep->rkeys[at] = k;
    ep->nrkeys++;
    return 0;
}
