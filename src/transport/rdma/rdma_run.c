/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport's initiator: the queue pair's set-up (or the fall
 * back to TCP), the target's keys, and the data phase as chains of work
 * requests. The commit of writes is rdma_commit.c. Part of the
 * verbs code (rdma_int.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/net.h"
#include "rdma_int.h"

/* ----------------------------------------------------------- initiator */

void ferry_rdma_keep_err(struct first_err *fe, int rc)
{
    if (fe->rc || rc == 0) return;
    fe->rc = rc;
    snprintf(fe->detail, sizeof fe->detail, "%s", ferry_fail_message());
}

static int raise_err(const struct first_err *fe) { return ferry_fail(fe->rc, "%s", fe->detail); }

/* Sets up this connection's QP with the target. 0; 1 when the target or
 * the fabric refused (why set: fall back to TCP); negative when the
 * connection itself failed. */
static int connect_initiator(ferry_conn_t *c, struct rdma_dev *d, uint64_t deadline, char *why, size_t cap)
{
    struct rdma_ep *ep;
    int rc = ferry_rdma_ep_create(d, &ep);
    if (rc) {
        snprintf(why, cap, "%s", ferry_fail_message());
        return 1;
    }
    ferry_rdma_qp_info_t mine, theirs;
    ferry_rdma_ep_info(ep, &mine);
    uint8_t buf[FERRY_RDMA_QP_INFO_SIZE];
    ferry_rdma_qp_info_encode(&mine, buf);
    ferry_frame_t f = {.type = FERRY_FRAME_RDMA_CONNECT, .plen = sizeof buf};
    rc = ferry_conn_send_frame(c, &f, buf, deadline);
    if (rc == 0) rc = ferry_conn_recv_frame(c, &f, deadline);
    if (rc == 0 && f.type != FERRY_FRAME_RDMA_CONNECT_ACK)
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected RDMA_CONNECT_ACK, got %s", ferry_frame_type_name(f.type));
    if (rc == 0 && f.status < 0) {
        rc = ferry_rdma_read_refusal(c, &f, "an RDMA connection", deadline);
        ferry_rdma_ep_destroy(ep);
        if (rc != f.status) return rc; /* the text did not arrive: the connection is gone */
        snprintf(why, cap, "%s", ferry_fail_message());
        return 1;
    }
    if (rc == 0 && f.plen != sizeof buf)
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_CONNECT_ACK carries %u bytes", f.plen);
    if (rc == 0) rc = ferry_net_recv(c->fd, buf, sizeof buf, deadline);
    if (rc) {
        ferry_rdma_ep_destroy(ep);
        return rc;
    }
    if (ferry_rdma_qp_info_decode(buf, sizeof buf, &theirs) != 0 || ferry_rdma_ep_connect(ep, &theirs) != 0) {
        snprintf(why, cap, "%s", ferry_fail_message());
        ferry_rdma_ep_destroy(ep);
        return 1;
    }
    c->xport = ep;
    c->xport_free = ferry_rdma_conn_free_ep;
    return 0;
}

/* Asks the target for the key of x's remote range. 0 with *m; a positive
 * 1 when the target refused (piece failure in *refused: its code); negative
 * when the connection failed. */
static int mr_query(ferry_conn_t *c, const ferry_xfer_t *x, ferry_rdma_mr_info_t *m, int *refused)
{
    uint32_t need = x->opcode == FERRY_OP_WRITE ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
    ferry_frame_t f = {.type = FERRY_FRAME_RDMA_MR_QUERY, .req_id = x->req_id, .addr = x->remote, .len = x->len,
                       .aux = x->generation | ((uint64_t)need << 32)};
    int rc = ferry_conn_send_frame(c, &f, NULL, x->deadline);
    if (rc == 0) rc = ferry_conn_recv_frame(c, &f, x->deadline);
    if (rc) return rc;
    if (f.type != FERRY_FRAME_RDMA_MR_INFO || f.req_id != x->req_id)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected RDMA_MR_INFO for request %llu, got %s for %llu",
                          (unsigned long long)x->req_id, ferry_frame_type_name(f.type), (unsigned long long)f.req_id);
    if (f.status < 0) {
        rc = ferry_rdma_read_refusal(c, &f, "the RDMA key", x->deadline);
        if (rc != f.status) return rc;
        *refused = rc;
        return 1;
    }
    uint8_t buf[FERRY_RDMA_MR_INFO_SIZE];
    if (f.plen != sizeof buf) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_MR_INFO carries %u bytes", f.plen);
    rc = ferry_net_recv(c->fd, buf, sizeof buf, x->deadline);
    if (rc == 0) rc = ferry_rdma_mr_info_decode(buf, sizeof buf, m);
    if (rc) return rc;
    if (x->remote < m->addr || x->remote + x->len > m->addr + m->len || (x->generation && m->generation != x->generation) ||
        !(m->flags & need))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                          "RDMA_MR_INFO: region [0x%llx+%llu) generation %u does not cover [0x%llx+%llu) generation %u",
                          (unsigned long long)m->addr, (unsigned long long)m->len, m->generation,
                          (unsigned long long)x->remote, (unsigned long long)x->len, x->generation);
    return 0;
}

/* One send work request of the data phase: the pieces first..last it
 * covers, from offset off of the first, n bytes in all. Pieces after the
 * first are covered whole. */
struct slot {
    size_t first, last;
    uint64_t off, n;
};

int ferry_rdma_wc_failure(const ferry_verbs_t *v, const struct ibv_wc *wc, const ferry_xfer_t *x, uint64_t off,
                      uint64_t n, const char *peer)
{
    const char *st = v->wc_status_str ? v->wc_status_str(wc->status) : "?";
    const char *op = x->opcode == FERRY_OP_WRITE ? "RDMA write" : "RDMA read";
    unsigned long long a = x->remote + off, l = n;
    switch (wc->status) {
    case IBV_WC_REM_ACCESS_ERR:
        return ferry_fail(FERRY_ERR_STALE_SEGMENT,
                          "%s of [0x%llx+%llu) at %s: remote access error (%s): the target's region was "
                          "deregistered or registered again since its key was fetched",
                          op, a, l, peer, st);
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
        return ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                          "%s of [0x%llx+%llu) at %s: local protection error (%s): the local buffer %p was "
                          "deregistered during the transfer",
                          op, a, l, peer, st, (void *)(x->local + off));
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return ferry_fail(FERRY_ERR_PEER_CLOSED, "%s of [0x%llx+%llu) at %s: the target's RDMA port stopped answering (%s)",
                          op, a, l, peer, st);
    case IBV_WC_WR_FLUSH_ERR:
        return ferry_fail(FERRY_ERR_PEER_CLOSED, "%s of [0x%llx+%llu) at %s: flushed after an earlier error", op, a, l,
                          peer);
    default:
        return ferry_fail(FERRY_ERR_INTERNAL, "%s of [0x%llx+%llu) at %s failed: %s (vendor error 0x%x)", op, a, l,
                          peer, st, wc->vendor_err);
    }
}

static bool sendable(const ferry_xfer_t *x, const struct plan *p, uint64_t off)
{
    return p->mode == PLAN_RDMA && x->rc == 0 && off < x->len && !(x->cancel && atomic_load(x->cancel));
}

/* Resolves each live piece's local and remote keys. A negative return is
 * a connection failure. */
static int plan_pieces(ferry_conn_t *c, struct rdma_ep *ep, ferry_xfer_t *xs, size_t nx, struct plan *pl)
{
    ferry_registry_t *r = c->ctx->registry;
    for (size_t i = 0; i < nx; i++) {
        ferry_xfer_t *x = &xs[i];
        pl[i] = (struct plan){.mode = PLAN_SKIP, .start = x->done};
        if (x->rc || x->done >= x->len) continue;
        pl[i].mode = PLAN_RDMA;
        ferry_registry_read_lock(r);
        ferry_region_t *reg = ferry_registry_lookup_locked(r, (uint64_t)(uintptr_t)x->local, x->len);
        struct ibv_mr *mr = NULL;
        int rc = reg ? ferry_rdma_region_mr(ep->d, reg, &mr)
                     : ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED, "local buffer [%p+%llu) is no longer registered",
                                  (void *)x->local, (unsigned long long)x->len);
        ferry_registry_unlock(r);
        if (rc == FERRY_ERR_NOT_IMPLEMENTED) {
            pl[i].mode = PLAN_TCP;
            continue;
        }
        if (rc) {
            ferry_xfer_fail(x, rc);
            pl[i].mode = PLAN_SKIP;
            continue;
        }
        pl[i].lkey = mr->lkey;
        const struct rkey_ent *k = ferry_rdma_rkey_find(ep, x->remote, x->len, x->generation);
        if (!k) {
            ferry_rdma_mr_info_t m;
            int refused = 0;
            rc = mr_query(c, x, &m, &refused);
            if (rc < 0) return rc;
            if (rc == 1) {
                if (refused == FERRY_ERR_NOT_IMPLEMENTED) {
                    pl[i].mode = PLAN_TCP; /* the target cannot register it: inline over TCP */
                } else {
                    ferry_xfer_fail(x, refused);
                    pl[i].mode = PLAN_SKIP;
                }
                continue;
            }
            if ((rc = ferry_rdma_rkey_put(ep, &m)) != 0) return rc;
            pl[i].rkey = m.rkey;
        } else {
            pl[i].rkey = k->rkey;
        }
    }
    return 0;
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Fills wr (with its entries sge) for the next run from piece *cur at
 * *cur_off: one slice of that piece, extended over the following whole
 * pieces while their remote range continues this one (same key, same
 * operation) and their local range either continues the last
 * scatter-gather entry or fits a new one (up to max_sge). So adjacent
 * pieces merge into one entry, and pieces scattered locally but adjacent
 * remotely share one work request. Advances *cur and *cur_off past it. */
static struct slot next_wr(const struct rdma_ep *ep, ferry_xfer_t *xs, size_t nx, const struct plan *pl, size_t *cur,
                           uint64_t *cur_off, uint64_t slice, struct ibv_send_wr *wr, struct ibv_sge *sge)
{
    size_t i = *cur;
    const ferry_xfer_t *x = &xs[i];
    uint64_t remote = x->remote + *cur_off;
    struct slot s = {i, i, *cur_off, min_u64(x->len - *cur_off, slice)};
    int nsge = 1, max_sge = x->opcode == FERRY_OP_READ ? ep->d->max_sge_rd : ep->d->max_sge;
    sge[0] = (struct ibv_sge){(uint64_t)(uintptr_t)(x->local + *cur_off), (uint32_t)s.n, pl[i].lkey};
    *cur_off += s.n;
    while (*cur_off == xs[s.last].len && s.last + 1 < nx) {
        size_t j = s.last + 1;
        const ferry_xfer_t *y = &xs[j];
        if (!sendable(y, &pl[j], 0) || pl[j].start != 0 || y->opcode != x->opcode || pl[j].rkey != pl[i].rkey ||
            y->remote != remote + s.n || s.n + y->len > slice)
            break;
        struct ibv_sge *last = &sge[nsge - 1];
        if (pl[j].lkey == last->lkey && last->addr + last->length == (uint64_t)(uintptr_t)y->local)
            last->length += (uint32_t)y->len;
        else if (nsge < max_sge)
            sge[nsge++] = (struct ibv_sge){(uint64_t)(uintptr_t)y->local, (uint32_t)y->len, pl[j].lkey};
        else
            break;
        s.n += y->len;
        s.last = j;
        *cur = j;
        *cur_off = y->len;
    }
    memset(wr, 0, sizeof *wr);
    wr->sg_list = sge;
    wr->num_sge = nsge;
    wr->opcode = x->opcode == FERRY_OP_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    wr->wr.rdma.remote_addr = remote;
    wr->wr.rdma.rkey = pl[i].rkey;
    return s;
}

/* A work request of s completed: its bytes count for its pieces. */
static void credit_slot(ferry_xfer_t *xs, struct plan *pl, const struct slot *s)
{
    uint64_t left = s->n, off = s->off;
    for (size_t p = s->first; p <= s->last; p++, off = 0) {
        ferry_xfer_t *x = &xs[p];
        uint64_t n = min_u64(x->len - off, left);
        left -= n;
        if (x->rc || pl[p].start + pl[p].completed != off) continue;
        pl[p].completed += n;
        if (x->opcode == FERRY_OP_READ) {
            x->done += n;
            if (x->progress) atomic_fetch_add(x->progress, n);
        }
    }
}

/* Working memory of one data phase: the slot ring and one chain's work
 * requests and entries, allocated once per run, never per piece. */
struct chain_mem {
    struct slot *ring;
    struct ibv_send_wr *wrs;
    struct ibv_sge *sges;
};

static int chain_mem_alloc(struct chain_mem *m, unsigned window, int max_sge)
{
    m->ring = malloc(window * sizeof *m->ring);
    m->wrs = malloc(window * sizeof *m->wrs);
    m->sges = malloc((size_t)window * (size_t)max_sge * sizeof *m->sges);
    if (m->ring && m->wrs && m->sges) return 0;
    free(m->ring);
    free(m->wrs);
    free(m->sges);
    return ferry_fail(FERRY_ERR_MEMORY, "RDMA work request chain of %u: out of memory", window);
}

static void chain_mem_free(struct chain_mem *m)
{
    free(m->ring);
    free(m->wrs);
    free(m->sges);
}

/* The data phase: the sendable pieces as chains of work requests, each
 * chain one ibv_post_send into the free part of the send queue. Only every
 * sig_every-th work request and the last of each chain are signalled; a
 * signalled completion retires every earlier outstanding one (RC completes
 * a send queue in order). Returns 0, or the connection-level failure
 * (*broken set). After a failure nothing more is posted, the QP is moved to
 * the error state, and every outstanding work request is still waited for
 * (with a grace deadline), so that none is left running. An error
 * completion fails the pieces of its own work request when it is a fault of
 * their memory; the unsignalled ones before it, retired by it, have an
 * unknown outcome: they are never counted as completed (they stay pending,
 * for a retry on a new QP). The failure reported is the first bad
 * completion; failing that, a refused post; failing that, a flush. */
static int move_data(ferry_conn_t *c, struct rdma_ep *ep, ferry_xfer_t *xs, size_t nx, struct plan *pl,
                     struct first_err *fe, int *broken)
{
    const ferry_verbs_t *v = ep->d->v;
    uint64_t slice = c->ctx->slice_size;
    if (slice > UINT32_MAX) slice = UINT32_MAX; /* a work request's length is 32 bits */
    unsigned window = (unsigned)ep->d->send_depth;
    unsigned sig_every = window / 2 ? window / 2 : 1;
    struct chain_mem m;
    int mrc = chain_mem_alloc(&m, window, ep->d->max_sge);
    if (mrc) return mrc;
    struct first_err post_fe = {0}, flush_fe = {0};
    unsigned head = 0, count = 0, seq = 0, unknown = 0;
    size_t cur = 0;
    uint64_t cur_off = nx ? pl[0].start : 0, grace = 0;
    bool failed = false, qp_error = false, unsignalled_tail = false;
    for (;;) {
        unsigned built = 0;
        while (!failed && count + built < window) {
            while (cur < nx && !sendable(&xs[cur], &pl[cur], cur_off)) {
                if (++cur < nx) cur_off = pl[cur].start;
            }
            if (cur >= nx) break;
            unsigned idx = (head + count + built) % window;
            struct ibv_send_wr *wr = &m.wrs[built];
            m.ring[idx] = next_wr(ep, xs, nx, pl, &cur, &cur_off, slice, wr, &m.sges[(size_t)built * ep->d->max_sge]);
            wr->wr_id = idx;
            if (++seq % sig_every == 0) wr->send_flags = IBV_SEND_SIGNALED;
            if (built > 0) m.wrs[built - 1].next = wr;
            built++;
        }
        if (built > 0) {
            m.wrs[built - 1].send_flags = IBV_SEND_SIGNALED; /* a chain's end always completes visibly */
            struct ibv_send_wr *bad = NULL;
            int err = v->post_send(ep->qp, m.wrs, &bad);
            unsigned posted = built;
            if (err) {
                posted = bad && bad >= m.wrs && bad < m.wrs + built ? (unsigned)(bad - m.wrs) : 0;
                ferry_rdma_keep_err(&post_fe, ferry_fail(FERRY_ERR_INTERNAL, "ibv_post_send of a chain of %u work "
                                              "requests (%u accepted) to %s on %s failed: %s", built, posted, c->peer.name,
                                              ep->d->name, strerror(err)));
                failed = true;
                unsignalled_tail = posted > 0 && !(m.wrs[posted - 1].send_flags & IBV_SEND_SIGNALED);
            }
            count += posted;
        }
        if (failed && !qp_error && count > 0) {
            ferry_rdma_ep_set_error(ep);
            qp_error = true;
            grace = ferry_deadline_after_ms(FLUSH_GRACE_MS);
            if (unsignalled_tail) { /* a free slot is left: the chain was refused part way */
                unsigned idx = (head + count) % window, prev = (head + count - 1) % window;
                m.ring[idx] = (struct slot){m.ring[prev].last, m.ring[prev].last, 0, 0};
                if (ferry_rdma_post_marker(ep, idx) == 0) count++;
            }
        }
        if (count == 0) break;
        struct ibv_wc wc[16];
        int got = ferry_rdma_ep_wait(ep, wc, 16, qp_error ? grace : xs[m.ring[head].first].deadline);
        if (got < 0) {
            ferry_rdma_keep_err(fe, got); /* TIMEOUT first; after an abort, the flush timed out */
            failed = true;
            if (qp_error) {
                FERRY_LOG(FERRY_LOG_ERROR, "rdma", "%s: %u work requests not flushed after an abort", ep->d->name, count);
                break;
            }
            continue;
        }
        for (int k = 0; k < got; k++) {
            unsigned ahead = (unsigned)((wc[k].wr_id + window - head) % window);
            if (wc[k].wr_id >= window || ahead >= count) {
                ferry_rdma_keep_err(fe, ferry_fail(FERRY_ERR_INTERNAL, "RDMA completion for slot %llu, %u outstanding "
                                                   "from %u", (unsigned long long)wc[k].wr_id, count, head));
                failed = true;
                continue;
            }
            if (wc[k].status == IBV_WC_SUCCESS) {
                for (unsigned r = 0; r <= ahead; r++, head = (head + 1) % window, count--)
                    credit_slot(xs, pl, &m.ring[head]);
                continue;
            }
            /* The unsignalled ones before it: outcome unknown, not counted. */
            if (ahead > 0 && wc[k].status != IBV_WC_WR_FLUSH_ERR && !fe->rc) unknown = ahead;
            if (ahead > 0 && wc[k].status != IBV_WC_WR_FLUSH_ERR)
                FERRY_LOG(FERRY_LOG_WARN, "rdma", "%s: %u unsignalled RDMA work requests before a failed one "
                          "(pieces %zu..%zu) have an unknown outcome: not counted as completed", c->peer.name, ahead,
                          m.ring[head].first, m.ring[(head + ahead - 1) % window].last);
            head = (head + ahead) % window;
            count -= ahead;
            struct slot s = m.ring[head];
            ferry_xfer_t *x = &xs[s.first];
            if (wc[k].status == IBV_WC_WR_FLUSH_ERR) {
                ferry_rdma_keep_err(&flush_fe, ferry_rdma_wc_failure(v, &wc[k], x, s.off, s.n, c->peer.name));
            } else {
                int prc = ferry_rdma_wc_failure(v, &wc[k], x, s.off, s.n, c->peer.name);
                /* A fault of these pieces' memory fails them; a fault of
                 * the path leaves them pending, for a retry on a new QP. */
                if (prc == FERRY_ERR_STALE_SEGMENT || prc == FERRY_ERR_ADDRESS_NOT_REGISTERED)
                    for (size_t p = s.first; p <= s.last; p++)
                        if (xs[p].rc == 0) ferry_xfer_fail(&xs[p], prc);
                ferry_rdma_keep_err(fe, prc);
            }
            failed = true;
            head = (head + 1) % window;
            count--;
        }
    }
    chain_mem_free(&m);
    if (!failed) return 0;
    if (!fe->rc) *fe = post_fe.rc ? post_fe : flush_fe;
    if (unknown) {
        size_t used = strlen(fe->detail);
        snprintf(fe->detail + used, sizeof fe->detail - used, "; the %u unsignalled work request(s) before it in its "
                 "chain have an unknown outcome: their pieces are not counted as completed", unknown);
    }
    *broken = 1;
    return fe->rc ? fe->rc : ferry_fail(FERRY_ERR_INTERNAL, "RDMA data phase failed without a cause");
}

int ferry_rdma_verbs_run(ferry_conn_t *c, void *dev, ferry_xfer_t *xs, size_t nx, int *broken,
                         ferry_verdict_t *verdict)
{
    struct rdma_dev *d = dev;
    *broken = 0;
    if (!c->xport) {
        char why[256];
        uint64_t deadline = UINT64_MAX;
        for (size_t i = 0; i < nx; i++)
            if (xs[i].deadline < deadline) deadline = xs[i].deadline;
        int rc = connect_initiator(c, d, deadline, why, sizeof why);
        if (rc < 0) {
            *broken = 1;
            return rc;
        }
        /* The session leaves RDMA for TCP. The outcome first: the
         * reason is cut to the session's field. */
        if (rc == 1) return ferry_verdict_fall_back(verdict, "rdma setup failed, fell back to tcp: %s", why);
    }
    struct rdma_ep *ep = c->xport;
    struct plan *pl = malloc((nx ? nx : 1) * sizeof *pl);
    if (!pl) return ferry_fail(FERRY_ERR_MEMORY, "RDMA plan of %zu pieces: out of memory", nx);
    struct first_err fe = {0};
    int rc = plan_pieces(c, ep, xs, nx, pl);
    if (rc) {
        *broken = 1;
        free(pl);
        return rc;
    }
    rc = move_data(c, ep, xs, nx, pl, &fe, broken);
    if (rc == 0) rc = ferry_rdma_commit_writes(c, ep, xs, nx, pl, &fe, broken);
    /* Pieces the HCA cannot reach go inline over this TCP connection: the
     * core runs them by tcp once this returns (the verdict). */
    size_t by_tcp = 0;
    for (size_t i = 0; rc == 0 && i < nx; i++) {
        if (pl[i].mode != PLAN_TCP || xs[i].rc || xs[i].done >= xs[i].len) continue;
        by_tcp++;
    }
    bool pending = false;
    for (size_t i = 0; i < nx; i++) {
        ferry_xfer_t *x = &xs[i];
        if (x->rc || x->done >= x->len) continue;
        if (by_tcp && pl[i].mode == PLAN_TCP) continue;
        if (*broken) {
            pending = true;
        } else {
            ferry_xfer_fail(x, ferry_fail(FERRY_ERR_CANCELLED, "cancelled after %llu of %llu bytes",
                                          (unsigned long long)x->done, (unsigned long long)x->len));
        }
    }
    free(pl);
    if (fe.rc && pending) {
        /* Pieces untouched by the failure are retried on a fresh
         * connection: say why this one ended. */
        int code = fe.rc == FERRY_ERR_TIMEOUT || fe.rc == FERRY_ERR_MEMORY ? fe.rc : FERRY_ERR_PEER_CLOSED;
        return ferry_fail(code, "the RDMA queue pair to %s failed: %s", c->peer.name, fe.detail);
    }
    if (fe.rc) raise_err(&fe);
    if (by_tcp) ferry_verdict_by_tcp(verdict, "%zu piece(s) in memory the HCA cannot register", by_tcp);
    return 0;
}
