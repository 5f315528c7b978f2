/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport's commit protocol for writes, both sides: the
 * initiator's zero-length WRITE WITH IMMEDIATE and its commit frames, the
 * target's wait for the immediate and its check of the ranges. With a peer
 * of protocol 3 a group of up to FERRY_RDMA_GROUP_MAX pieces is committed
 * with one immediate, one RDMA_COMMIT_GROUP and one answer carrying each
 * piece's status (rdma_wire.h); with an older peer, each piece with its own
 * immediate and RDMA_COMMIT. Part of the verbs code (rdma_int.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "util/fail.h"
#include "util/net.h"
#include "rdma_int.h"
#include "rdma_wire.h"

/* An endpoint's buffers for group commits, either side, made at first use
 * (struct rdma_ep.group; freed with the endpoint): nothing per piece or
 * per frame allocates. raw holds the descriptors, or the statuses. */
struct ferry_rdma_group {
    uint8_t raw[FERRY_RDMA_GROUP_MAX * FERRY_RDMA_COMMIT_DESC_SIZE];
    ferry_rdma_commit_desc_t desc[FERRY_RDMA_GROUP_MAX];
    int32_t st[FERRY_RDMA_GROUP_MAX];
    size_t batch[FERRY_RDMA_GROUP_MAX];
    char reason[FERRY_WIRE_MAX_REASON + 1];
};

static struct ferry_rdma_group *group_scratch(struct rdma_ep *ep)
{
    if (!ep->group && !(ep->group = malloc(sizeof *ep->group)))
        ferry_fail(FERRY_ERR_MEMORY, "RDMA group commit buffers (%zu bytes): out of memory", sizeof *ep->group);
    return ep->group;
}

void ferry_rdma_group_free(struct ferry_rdma_group *g) { free(g); }

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

/* ------------------------------------------------- group commit (protocol 3) */

static uint64_t group_deadline(const ferry_xfer_t *xs, const struct ferry_rdma_group *g, unsigned nb)
{
    uint64_t d = UINT64_MAX;
    for (unsigned k = 0; k < nb; k++)
        if (xs[g->batch[k]].deadline < d) d = xs[g->batch[k]].deadline;
    return d;
}

/* Receives the answer to a group commit of nb pieces, total bytes, whose
 * first piece is x: 0 with *f (and, when it failed, the statuses in g->st
 * and the reason in g->reason), or a failure of the connection. */
static int recv_group_ack(ferry_conn_t *c, struct ferry_rdma_group *g, const ferry_xfer_t *x, unsigned nb,
                          uint64_t total, uint64_t deadline, ferry_frame_t *f)
{
    int rc = ferry_conn_recv_frame(c, f, deadline);
    if (rc) return rc;
    if (f->type == FERRY_FRAME_ERROR && f->status < 0) return ferry_conn_fail_from_target(c, f, deadline, NULL, 0);
    if (f->type != FERRY_FRAME_RDMA_COMMIT_GROUP_ACK || f->req_id != x->req_id)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected RDMA_COMMIT_GROUP_ACK for request %llu, got %s for %llu",
                          (unsigned long long)x->req_id, ferry_frame_type_name(f->type), (unsigned long long)f->req_id);
    rc = ferry_rdma_commit_group_ack_check(f, nb, total);
    if (rc || f->status == 0) return rc;
    size_t tlen = f->plen - 4u * nb;
    rc = ferry_net_recv(c->fd, g->raw, 4u * nb, deadline);
    if (rc == 0) rc = ferry_net_recv(c->fd, g->reason, tlen, deadline);
    g->reason[rc == 0 ? tlen : 0] = '\0';
    if (rc == 0) rc = ferry_vec_statuses_decode(g->raw, nb, g->st);
    return rc;
}

/* Settles the nb pieces of an answered group commit by their statuses: the
 * confirmed ones are complete, the refused ones fail with the target's
 * detail (the text belongs to the first refused; the others name their own
 * range and code). MALFORMED_FRAME when the answer's confirmed bytes
 * disagree with its statuses. */
static int settle_group(ferry_conn_t *c, ferry_xfer_t *xs, struct plan *pl, struct ferry_rdma_group *g, unsigned nb,
                        const ferry_frame_t *f)
{
    uint64_t confirmed = 0;
    for (unsigned k = 0; k < nb; k++)
        if (f->status == 0 || g->st[k] == 0) confirmed += pl[g->batch[k]].completed;
    if (confirmed != f->addr)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT_GROUP_ACK confirms %llu bytes, its statuses %llu",
                          (unsigned long long)f->addr, (unsigned long long)confirmed);
    const char *why = g->reason[0] ? g->reason : "(no detail)";
    bool first = true;
    for (unsigned k = 0; k < nb; k++) {
        size_t i = g->batch[k];
        ferry_xfer_t *x = &xs[i];
        int st = f->status < 0 ? g->st[k] : 0;
        if (st == 0) {
            x->done = pl[i].start + pl[i].completed;
            if (x->progress) atomic_fetch_add(x->progress, pl[i].completed);
            continue;
        }
        if (first)
            ferry_fail(st, "target %s refused the RDMA write: %s", c->peer.name, why);
        else
            ferry_fail(st, "target %s refused the RDMA write of [0x%llx+%llu) with %s (one of %u pieces in one group "
                           "commit; the first refused: %s)", c->peer.name,
                       (unsigned long long)(x->remote + pl[i].start), (unsigned long long)pl[i].completed,
                       ferry_error_name(st), nb, why);
        ferry_xfer_fail(x, st);
        first = false;
    }
    return 0;
}

/* Commits the nb pieces g->batch[0..nb): one zero-length WRITE WITH
 * IMMEDIATE (signalled, wr_id 0), one RDMA_COMMIT_GROUP, one answer, then
 * the immediate's own completion. */
static int commit_group(ferry_conn_t *c, struct rdma_ep *ep, ferry_xfer_t *xs, struct plan *pl,
                        struct ferry_rdma_group *g, unsigned nb, struct first_err *fe, int *broken)
{
    const ferry_xfer_t *x0 = &xs[g->batch[0]];
    uint64_t deadline = group_deadline(xs, g, nb), total = 0;
    for (unsigned k = 0; k < nb; k++) {
        size_t i = g->batch[k];
        ferry_rdma_commit_desc_t d = {xs[i].remote + pl[i].start, pl[i].completed, xs[i].req_id, xs[i].generation};
        ferry_rdma_commit_desc_encode(&d, g->raw + (size_t)k * FERRY_RDMA_COMMIT_DESC_SIZE);
        total += d.len;
    }
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(ep->commit_seq);
    wr.wr.rdma.remote_addr = x0->remote + pl[g->batch[0]].start;
    wr.wr.rdma.rkey = pl[g->batch[0]].rkey;
    int err = ep->d->v->post_send(ep->qp, &wr, &bad);
    if (err) {
        ferry_rdma_keep_err(fe, ferry_fail(FERRY_ERR_INTERNAL, "ibv_post_send of the group commit of %u pieces to %s "
                                           "on %s failed: %s", nb, c->peer.name, ep->d->name, strerror(err)));
        *broken = 1;
        return fe->rc;
    }
    ep->commit_seq++;
    ferry_frame_t f = {.type = FERRY_FRAME_RDMA_COMMIT_GROUP, .req_id = x0->req_id, .addr = total, .len = nb,
                       .plen = nb * FERRY_RDMA_COMMIT_DESC_SIZE};
    int rc = ferry_conn_send_frame(c, &f, g->raw, deadline);
    if (rc == 0) rc = recv_group_ack(c, g, x0, nb, total, deadline, &f);
    if (rc == 0) rc = settle_group(c, xs, pl, g, nb, &f);
    if (rc) {
        ferry_rdma_keep_err(fe, rc);
        *broken = 1;
        ferry_rdma_ep_abort_until(ep, 0, true);
        return fe->rc;
    }
    for (bool ended = false; !ended;) {
        struct ibv_wc wc[16];
        int got = ferry_rdma_ep_wait(ep, wc, 16, deadline);
        if (got < 0) {
            ferry_rdma_keep_err(fe, got);
            *broken = 1;
            ferry_rdma_ep_abort_until(ep, 0, true);
            return fe->rc;
        }
        for (int k = 0; k < got; k++) {
            if (wc[k].status != IBV_WC_SUCCESS) {
                /* The target confirmed placement already; the QP is
                 * broken for what follows. */
                ferry_rdma_keep_err(fe, ferry_rdma_wc_failure(ep->d->v, &wc[k], x0, 0, 0, c->peer.name));
                *broken = 1;
            }
            if (wc[k].wr_id == 0) ended = true;
        }
    }
    if (*broken) {
        ferry_rdma_ep_set_error(ep);
        return fe->rc;
    }
    return 0;
}

/* The commit phase with a peer of protocol 3: the RDMA-written pieces in
 * groups of up to FERRY_RDMA_GROUP_MAX, one frame and one answer each. */
static int commit_groups(ferry_conn_t *c, struct rdma_ep *ep, ferry_xfer_t *xs, size_t nx, struct plan *pl,
                         struct first_err *fe, int *broken)
{
    struct ferry_rdma_group *g = NULL;
    for (size_t i = 0; i < nx;) {
        unsigned nb = 0;
        for (; i < nx && nb < FERRY_RDMA_GROUP_MAX; i++) {
            ferry_xfer_t *x = &xs[i];
            if (x->opcode != FERRY_OP_WRITE || pl[i].mode != PLAN_RDMA || x->rc || pl[i].completed == 0) continue;
            if (!g && !(g = group_scratch(ep))) return ferry_fail_context("committing to %s", c->peer.name);
            g->batch[nb++] = i;
        }
        if (nb == 0) break;
        int rc = commit_group(c, ep, xs, pl, g, nb, fe, broken);
        if (rc) return rc;
    }
    return 0;
}

/* The commit phase for write pieces: a chain of WRITE WITH IMMEDIATE, then
 * one RDMA_COMMIT per piece, and the target's RDMA_COMMIT_ACKs, windowed. */
int ferry_rdma_commit_writes(ferry_conn_t *c, struct rdma_ep *ep, ferry_xfer_t *xs, size_t nx, struct plan *pl,
                         struct first_err *fe, int *broken)
{
    if (ferry_conn_version(c) >= FERRY_PROTOCOL_RDMA_GROUP) return commit_groups(c, ep, xs, nx, pl, fe, broken);
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

/* Target: waits for the next commit's immediate (all earlier writes of
 * the QP are then placed) and re-posts its receive. what names the commit
 * in a failure. */
static int take_immediate(ferry_conn_t *c, struct rdma_dev *d, struct rdma_ep *ep, const char *what,
                          uint64_t deadline)
{
    struct ibv_wc wc;
    int n = ferry_rdma_ep_wait(ep, &wc, 1, deadline);
    if (n < 0) return ferry_fail_context("waiting for the immediate of %s from %s", what, c->peer.name);
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
    return 0;
}

/* Waits for the commit's immediate, checks the range, answers. */
int ferry_rdma_serve_commit(ferry_conn_t *c, struct rdma_dev *d, const ferry_frame_t *f, uint64_t deadline)
{
    struct rdma_ep *ep = c->xport;
    if (!ep) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT before RDMA_CONNECT");
    if (f->len == 0) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT of 0 bytes");
    char what[96];
    snprintf(what, sizeof what, "the commit of [0x%llx+%llu)", (unsigned long long)f->addr,
             (unsigned long long)f->len);
    int rc = take_immediate(c, d, ep, what, deadline);
    if (rc) return rc;
    ferry_registry_t *r = c->ctx->registry;
    ferry_registry_read_lock(r);
    int status = ferry_conn_is_cancelled(c, f->req_id)
                     ? ferry_fail(FERRY_ERR_CANCELLED, "request %llu was cancelled", (unsigned long long)f->req_id)
                     : ferry_registry_check_locked(r, f->addr, f->len, FERRY_MEM_REMOTE_WRITE, (uint32_t)f->aux,
                                                   "target");
    ferry_registry_unlock(r);
    if (status == FERRY_ERR_ADDRESS_NOT_REGISTERED) ferry_fail_context("region deregistered during the write");
    return ferry_rdma_reply(c, FERRY_FRAME_RDMA_COMMIT_ACK, f, status, NULL, 0, f->len, deadline);
}

/* Target: RDMA_COMMIT_GROUP. Reads and checks the descriptors, waits for
 * the group's immediate, checks every range (registered with the same
 * generation, not cancelled) and answers once with each piece's status. A
 * malformed frame closes the connection. */
int ferry_rdma_serve_commit_group(ferry_conn_t *c, struct rdma_dev *d, const ferry_frame_t *f, uint64_t deadline)
{
    struct rdma_ep *ep = c->xport;
    int rc = ferry_rdma_commit_group_check(f);
    if (rc) return rc;
    if (!ep) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT_GROUP before RDMA_CONNECT");
    if (ferry_conn_version(c) < FERRY_PROTOCOL_RDMA_GROUP)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT_GROUP on a connection of protocol %u (needs %d)",
                          ferry_conn_version(c), FERRY_PROTOCOL_RDMA_GROUP);
    struct ferry_rdma_group *g = group_scratch(ep);
    if (!g) return FERRY_ERR_MEMORY;
    unsigned n = (unsigned)f->len;
    rc = ferry_net_recv(c->fd, g->raw, f->plen, deadline);
    if (rc == 0) rc = ferry_rdma_commit_group_decode(f, g->raw, g->desc);
    if (rc) return rc;
    char what[96];
    snprintf(what, sizeof what, "the group commit of %u pieces (%llu bytes)", n, (unsigned long long)f->addr);
    rc = take_immediate(c, d, ep, what, deadline);
    if (rc) return rc;
    ferry_registry_t *r = c->ctx->registry;
    int first = 0;
    uint64_t confirmed = 0;
    g->reason[0] = '\0';
    ferry_registry_read_lock(r);
    for (unsigned k = 0; k < n; k++) {
        const ferry_rdma_commit_desc_t *p = &g->desc[k];
        int st = ferry_conn_is_cancelled(c, p->req_id)
                     ? ferry_fail(FERRY_ERR_CANCELLED, "request %llu was cancelled", (unsigned long long)p->req_id)
                     : ferry_registry_check_locked(r, p->addr, p->len, FERRY_MEM_REMOTE_WRITE, p->generation, "target");
        g->st[k] = st;
        if (st == 0) {
            confirmed += p->len;
        } else if (first == 0) {
            if (st == FERRY_ERR_ADDRESS_NOT_REGISTERED) ferry_fail_context("region deregistered during the write");
            first = st;
            snprintf(g->reason, sizeof g->reason, "%s", ferry_fail_message());
        }
    }
    ferry_registry_unlock(r);
    ferry_frame_t a = {.type = FERRY_FRAME_RDMA_COMMIT_GROUP_ACK, .status = first, .req_id = f->req_id,
                       .addr = confirmed, .len = n};
    if (first == 0) return ferry_conn_send_frame(c, &a, NULL, deadline);
    /* The statuses, then the first refusal's text, in raw (the descriptors
     * are decoded). */
    for (unsigned k = 0; k < n; k++) {
        uint32_t v = (uint32_t)g->st[k];
        for (int b = 0; b < 4; b++) g->raw[4 * k + b] = (uint8_t)(v >> (8 * b));
    }
    size_t tlen = strlen(g->reason);
    memcpy(g->raw + 4u * n, g->reason, tlen);
    a.plen = (uint32_t)(4u * n + tlen);
    return ferry_conn_send_frame(c, &a, g->raw, deadline);
}
