/* SPDX-License-Identifier: Apache-2.0 */
/* The software HCA and the tests' helpers (rdma_fake.h). */
#include "rdma_fake.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util/memkind.h"
#include "harness.h"

struct fake_hca H = {.lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .next_qpn = 0x100,
                     .next_key = 0x1000};


struct fch {
    struct ibv_comp_channel ch;
    int wfd;
    struct fcq *cq;
};

struct fcq {
    struct ibv_cq cq;
    struct ibv_wc *ring;
    uint32_t *send_qpn; /* per entry: the QP whose send slots it frees, 0 for receives */
    int *send_free;     /* per entry: how many (itself and the unsignalled ones before it) */
    int cap, head, n;
    int armed;
    struct fch *ch;
};

struct fqp {
    struct ibv_qp qp;
    enum ibv_qp_state st;
    uint32_t dest, sq_psn, rq_psn;
    uint16_t dlid;
    struct fcq *scq, *rcq;
    int max_send, max_recv, send_out, max_sge;
    int unsig_done; /* unsignalled sends done since the last send completion: their slots free with it */
    uint64_t *recvs;
    int nrecv, rhead;
    struct fqp *next;
};

struct fmr {
    struct ibv_mr mr;
    int access;
    struct fmr *next;
};

struct fwr {
    struct fqp *qp;
    uint64_t wr_id;
    enum ibv_wr_opcode op;
    int signaled;
    struct ibv_sge sge[FAKE_MAX_SGE];
    int nsge;
    uint64_t raddr;
    uint32_t len, rkey, imm;
    struct fwr *next;
};


static struct ibv_device fake_device;

/* Pushes a completion; sq: the QP whose send queue it belongs to (NULL for
 * a receive), whose slots it frees when polled, with those of the
 * unsignalled work requests done before it. */
static void cq_push(struct fcq *cq, const struct ibv_wc *wc, struct fqp *sq)
{
    if (cq->n == cq->cap) {
        fprintf(stderr, "fake HCA: completion queue overflow (%d entries): Ferry sized or drained its CQ wrong\n",
                cq->cap);
        abort();
    }
    int at = (cq->head + cq->n) % cq->cap;
    cq->ring[at] = *wc;
    cq->send_qpn[at] = sq ? sq->qp.qp_num : 0;
    cq->send_free[at] = sq ? 1 + sq->unsig_done : 0;
    if (sq) sq->unsig_done = 0;
    cq->n++;
    if (cq->armed && cq->ch) {
        cq->armed = 0;
        if (write(cq->ch->wfd, "e", 1) != 1) abort();
    }
}

static struct fqp *qp_by_num(uint32_t n)
{
    for (struct fqp *q = H.qps; q; q = q->next)
        if (q->qp.qp_num == n) return q;
    return NULL;
}

static enum ibv_wc_opcode wc_op(enum ibv_wr_opcode op)
{
    return op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
}

/* Flushes q's queued send work requests (and with recvs, its receives). */
static void flush_qp(struct fqp *q, int completions)
{
    struct fwr **pp = &H.head;
    H.tail = NULL;
    while (*pp) {
        struct fwr *w = *pp;
        if (w->qp == q) {
            *pp = w->next;
            H.queued--;
            if (completions) {
                struct ibv_wc wc = {.wr_id = w->wr_id, .status = IBV_WC_WR_FLUSH_ERR, .opcode = wc_op(w->op),
                                    .qp_num = q->qp.qp_num};
                cq_push(q->scq, &wc, q);
            }
            free(w);
        } else {
            H.tail = w;
            pp = &w->next;
        }
    }
    if (completions) {
        while (q->nrecv > 0) {
            struct ibv_wc wc = {.wr_id = q->recvs[q->rhead], .status = IBV_WC_WR_FLUSH_ERR, .opcode = IBV_WC_RECV,
                                .qp_num = q->qp.qp_num};
            q->rhead = (q->rhead + 1) % q->max_recv;
            q->nrecv--;
            cq_push(q->rcq, &wc, NULL);
        }
    }
}

static void qp_error(struct fqp *q)
{
    if (q->st == IBV_QPS_ERR) return;
    q->st = IBV_QPS_ERR;
    flush_qp(q, 1);
}

static struct fmr *mr_find(uint32_t key, struct ibv_pd *pd, uint64_t addr, uint64_t len, int access)
{
    for (struct fmr *m = H.mrs; m; m = m->next) {
        if (m->mr.lkey != key) continue;
        uint64_t a = (uint64_t)(uintptr_t)m->mr.addr;
        if (m->mr.pd != pd || addr < a || addr + len > a + m->mr.length || (m->access & access) != access) return NULL;
        return m;
    }
    return NULL;
}

static enum ibv_wc_status do_op(struct fwr *w, struct fqp *q, struct fqp *dst)
{
    int remote = w->op == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
    int local = w->op == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0;
    if (w->len) {
        for (int k = 0; k < w->nsge; k++)
            if (!mr_find(w->sge[k].lkey, q->qp.pd, w->sge[k].addr, w->sge[k].length, local))
                return IBV_WC_LOC_PROT_ERR;
        if (!mr_find(w->rkey, dst->qp.pd, w->raddr, w->len, remote)) return IBV_WC_REM_ACCESS_ERR;
        /* The gather (write) or scatter (read) list against one remote range. */
        uint64_t r = w->raddr;
        for (int k = 0; k < w->nsge; k++) {
            void *l = (void *)(uintptr_t)w->sge[k].addr;
            if (w->op == IBV_WR_RDMA_READ)
                memcpy(l, (const void *)(uintptr_t)r, w->sge[k].length);
            else
                memcpy((void *)(uintptr_t)r, l, w->sge[k].length);
            r += w->sge[k].length;
        }
        H.bytes += w->len;
    }
    if (w->op == IBV_WR_RDMA_WRITE_WITH_IMM) {
        if (dst->nrecv == 0) return IBV_WC_RNR_RETRY_EXC_ERR;
        H.imms++;
        struct ibv_wc wc = {.wr_id = dst->recvs[dst->rhead], .status = IBV_WC_SUCCESS,
                            .opcode = IBV_WC_RECV_RDMA_WITH_IMM, .byte_len = w->len, .imm_data = w->imm,
                            .qp_num = dst->qp.qp_num, .wc_flags = IBV_WC_WITH_IMM};
        dst->rhead = (dst->rhead + 1) % dst->max_recv;
        dst->nrecv--;
        cq_push(dst->rcq, &wc, NULL);
    }
    return IBV_WC_SUCCESS;
}

static void execute(struct fwr *w)
{
    struct fqp *q = w->qp, *dst = NULL;
    enum ibv_wc_status st;
    if (q->st == IBV_QPS_ERR) {
        st = IBV_WC_WR_FLUSH_ERR;
    } else {
        dst = qp_by_num(q->dest);
        if (!dst || (dst->st != IBV_QPS_RTR && dst->st != IBV_QPS_RTS) || dst->rq_psn != q->sq_psn ||
            q->dlid != FAKE_LID) {
            st = IBV_WC_RETRY_EXC_ERR;
        } else if (H.fail_next_wr > 0) {
            H.fail_next_wr--;
            st = IBV_WC_RETRY_EXC_ERR;
        } else if (H.fail_wr_at > 0 && --H.fail_wr_at == 0) {
            st = H.fail_status;
        } else {
            st = do_op(w, q, dst);
        }
    }
    if (w->signaled || st != IBV_WC_SUCCESS) {
        struct ibv_wc wc = {.wr_id = w->wr_id, .status = st, .opcode = wc_op(w->op), .qp_num = q->qp.qp_num,
                            .byte_len = w->len};
        cq_push(q->scq, &wc, q);
    } else {
        q->unsig_done++; /* no completion: its slot frees with the next one's */
    }
    if (st != IBV_WC_SUCCESS && st != IBV_WC_WR_FLUSH_ERR) {
        qp_error(q);
        if (st == IBV_WC_REM_ACCESS_ERR && dst) qp_error(dst); /* the responder breaks too */
    }
}

static void *hca_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&H.lock);
    while (!H.stop) {
        if (H.paused || !H.head) {
            pthread_cond_wait(&H.work, &H.lock);
            continue;
        }
        if (H.pause_at_imm && H.head->op == IBV_WR_RDMA_WRITE_WITH_IMM) {
            H.pause_at_imm = 0;
            H.paused = 1;
            continue;
        }
        struct fwr *w = H.head;
        H.head = w->next;
        if (!H.head) H.tail = NULL;
        H.queued--;
        execute(w);
        free(w);
    }
    pthread_mutex_unlock(&H.lock);
    return NULL;
}

/* ---- the verbs ---- */

static struct ibv_device **f_get_device_list(int *n)
{
    static struct ibv_device *list[2] = {&fake_device, NULL};
    *n = 1;
    return list;
}
static void f_free_device_list(struct ibv_device **l) { (void)l; }
static const char *f_get_device_name(struct ibv_device *d)
{
    (void)d;
    return "fakerdma0";
}
static __be64 f_get_device_guid(struct ibv_device *d)
{
    (void)d;
    return htobe64(0x0002c90300a1b2c3ull);
}
static struct ibv_context *f_open_device(struct ibv_device *d)
{
    struct ibv_context *c = calloc(1, sizeof *c);
    c->device = d;
    return c;
}
static int f_close_device(struct ibv_context *c)
{
    free(c);
    return 0;
}
static int f_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
    (void)c;
    memset(a, 0, sizeof *a);
    a->max_qp_wr = H.max_wr ? H.max_wr : FAKE_MAX_WR;
    a->max_sge = FAKE_MAX_SGE;
    a->max_sge_rd = FAKE_MAX_SGE;
    a->max_cqe = 4096;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    a->node_guid = htobe64(0x0002c90300a1b2c3ull);
    return 0;
}
static int f_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
    (void)c;
    if (port != 1) return EINVAL;
    memset(a, 0, sizeof *a);
    a->state = IBV_PORT_ACTIVE;
    a->link_layer = IBV_LINK_LAYER_INFINIBAND;
    a->lid = FAKE_LID;
    a->active_mtu = IBV_MTU_4096;
    a->max_mtu = IBV_MTU_4096;
    a->max_msg_sz = 1u << 31;
    a->gid_tbl_len = 1;
    return 0;
}
static int f_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *g)
{
    (void)c;
    (void)port;
    (void)index;
    memset(g, 0, sizeof *g);
    return 0;
}
static struct ibv_pd *f_alloc_pd(struct ibv_context *c)
{
    struct ibv_pd *pd = calloc(1, sizeof *pd);
    pd->context = c;
    return pd;
}
static int f_dealloc_pd(struct ibv_pd *pd)
{
    pthread_mutex_lock(&H.lock);
    for (struct fmr *m = H.mrs; m; m = m->next) {
        if (m->mr.pd == pd) {
            H.dealloc_busy++;
            pthread_mutex_unlock(&H.lock);
            return EBUSY;
        }
    }
    pthread_mutex_unlock(&H.lock);
    free(pd);
    return 0;
}
static struct ibv_mr *f_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    uint32_t kind = 0;
    /* Device memory without GPUDirect: the HCA cannot pin it. */
    if (ferry_memkind_detect(addr, len, &kind) != 0 || kind != FERRY_MEMKIND_HOST) {
        errno = EFAULT;
        return NULL;
    }
    struct fmr *m = calloc(1, sizeof *m);
    pthread_mutex_lock(&H.lock);
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    m->mr.lkey = m->mr.rkey = H.next_key++;
    m->access = access;
    m->next = H.mrs;
    H.mrs = m;
    H.regs++;
    pthread_mutex_unlock(&H.lock);
    return &m->mr;
}
static int f_dereg_mr(struct ibv_mr *mr)
{
    pthread_mutex_lock(&H.lock);
    for (struct fmr **pp = &H.mrs; *pp; pp = &(*pp)->next) {
        if (&(*pp)->mr == mr) {
            struct fmr *m = *pp;
            *pp = m->next;
            free(m);
            H.deregs++;
            pthread_mutex_unlock(&H.lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&H.lock);
    return EINVAL;
}
static struct ibv_comp_channel *f_create_comp_channel(struct ibv_context *c)
{
    struct fch *ch = calloc(1, sizeof *ch);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) abort();
    ch->ch.context = c;
    ch->ch.fd = p[0];
    ch->wfd = p[1];
    return &ch->ch;
}
static int f_destroy_comp_channel(struct ibv_comp_channel *c)
{
    struct fch *ch = (struct fch *)c;
    close(ch->ch.fd);
    close(ch->wfd);
    free(ch);
    return 0;
}
static struct ibv_cq *f_create_cq(struct ibv_context *c, int cqe, void *cq_ctx, struct ibv_comp_channel *ch, int vec)
{
    (void)vec;
    struct fcq *cq = calloc(1, sizeof *cq);
    cq->cq.context = c;
    cq->cq.cq_context = cq_ctx;
    cq->cq.channel = ch;
    cq->cq.cqe = cqe;
    cq->cap = cqe;
    cq->ring = calloc((size_t)cqe, sizeof *cq->ring);
    cq->send_qpn = calloc((size_t)cqe, sizeof *cq->send_qpn);
    cq->send_free = calloc((size_t)cqe, sizeof *cq->send_free);
    cq->ch = (struct fch *)ch;
    if (ch) cq->ch->cq = cq;
    return &cq->cq;
}
static int f_destroy_cq(struct ibv_cq *c)
{
    struct fcq *cq = (struct fcq *)c;
    free(cq->ring);
    free(cq->send_qpn);
    free(cq->send_free);
    free(cq);
    return 0;
}
static int f_get_cq_event(struct ibv_comp_channel *c, struct ibv_cq **cq, void **ctx)
{
    struct fch *ch = (struct fch *)c;
    char b;
    if (read(ch->ch.fd, &b, 1) != 1) return -1;
    *cq = &ch->cq->cq;
    *ctx = ch->cq->cq.cq_context;
    return 0;
}
static void f_ack_cq_events(struct ibv_cq *cq, unsigned n)
{
    (void)cq;
    (void)n;
}
static int f_req_notify_cq(struct ibv_cq *c, int solicited)
{
    (void)solicited;
    pthread_mutex_lock(&H.lock);
    ((struct fcq *)c)->armed = 1;
    pthread_mutex_unlock(&H.lock);
    return 0;
}
static int f_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc)
{
    struct fcq *cq = (struct fcq *)c;
    pthread_mutex_lock(&H.lock);
    int k = 0;
    for (; k < n && cq->n > 0; k++) {
        wc[k] = cq->ring[cq->head];
        uint32_t qpn = cq->send_qpn[cq->head];
        struct fqp *q = qpn ? qp_by_num(qpn) : NULL;
        if (q) q->send_out -= cq->send_free[cq->head]; /* send queue slots free when their completion is polled */
        cq->head = (cq->head + 1) % cq->cap;
        cq->n--;
    }
    pthread_mutex_unlock(&H.lock);
    return k;
}
static struct ibv_qp *f_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    pthread_mutex_lock(&H.lock);
    if (H.qp_fail_skip > 0) {
        H.qp_fail_skip--;
    } else if (H.qp_fail > 0) {
        H.qp_fail--;
        pthread_mutex_unlock(&H.lock);
        errno = ENOMEM;
        return NULL;
    }
    int max_wr = H.max_wr ? H.max_wr : FAKE_MAX_WR;
    if (a->qp_type != IBV_QPT_RC || a->cap.max_send_wr > (uint32_t)max_wr || a->cap.max_recv_wr > (uint32_t)max_wr ||
        a->cap.max_send_sge > FAKE_MAX_SGE || a->cap.max_send_sge < 1 || a->cap.max_recv_sge > 1 || !a->send_cq ||
        !a->recv_cq) {
        pthread_mutex_unlock(&H.lock);
        errno = EINVAL;
        return NULL;
    }
    struct fqp *q = calloc(1, sizeof *q);
    q->qp.qp_num = H.next_qpn++;
    q->qp.pd = pd;
    q->qp.context = pd->context;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.qp_type = IBV_QPT_RC;
    q->st = IBV_QPS_RESET;
    q->scq = (struct fcq *)a->send_cq;
    q->rcq = (struct fcq *)a->recv_cq;
    q->max_send = (int)a->cap.max_send_wr;
    q->max_recv = (int)a->cap.max_recv_wr;
    q->max_sge = (int)a->cap.max_send_sge;
    q->recvs = calloc((size_t)q->max_recv + 1, sizeof *q->recvs);
    q->next = H.qps;
    H.qps = q;
    H.qps_made++;
    pthread_mutex_unlock(&H.lock);
    return &q->qp;
}
static int f_destroy_qp(struct ibv_qp *qp)
{
    struct fqp *q = (struct fqp *)qp;
    pthread_mutex_lock(&H.lock);
    flush_qp(q, 0);
    for (struct fqp **pp = &H.qps; *pp; pp = &(*pp)->next) {
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    }
    pthread_mutex_unlock(&H.lock);
    free(q->recvs);
    free(q);
    return 0;
}
static int f_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    struct fqp *q = (struct fqp *)qp;
    int rc = 0;
    pthread_mutex_lock(&H.lock);
    const int init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    const int rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                    IBV_QP_MAX_QP_RD_ATOMIC;
    if (!(mask & IBV_QP_STATE)) {
        rc = EINVAL;
    } else if (a->qp_state == IBV_QPS_INIT) {
        if (q->st != IBV_QPS_RESET || (mask & init) != init || a->port_num != 1) rc = EINVAL;
        else q->st = IBV_QPS_INIT;
    } else if (a->qp_state == IBV_QPS_RTR) {
        if (q->st != IBV_QPS_INIT || (mask & rtr) != rtr || a->ah_attr.is_global || a->ah_attr.port_num != 1 ||
            a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096 || a->max_dest_rd_atomic < 1 ||
            a->max_dest_rd_atomic > 16)
            rc = EINVAL;
        else {
            q->st = IBV_QPS_RTR;
            q->dest = a->dest_qp_num;
            q->rq_psn = a->rq_psn;
            q->dlid = a->ah_attr.dlid;
        }
    } else if (a->qp_state == IBV_QPS_RTS) {
        if (q->st != IBV_QPS_RTR || (mask & rts) != rts || a->max_rd_atomic < 1 || a->max_rd_atomic > 16) rc = EINVAL;
        else {
            q->st = IBV_QPS_RTS;
            q->sq_psn = a->sq_psn;
        }
    } else if (a->qp_state == IBV_QPS_ERR) {
        qp_error(q);
    } else {
        rc = EINVAL;
    }
    pthread_mutex_unlock(&H.lock);
    return rc;
}
static int f_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct fqp *q = (struct fqp *)qp;
    pthread_mutex_lock(&H.lock);
    H.post_calls++;
    long chain = 0;
    for (; wr; wr = wr->next) {
        int rc = 0;
        if (q->st != IBV_QPS_RTS && q->st != IBV_QPS_ERR) rc = EINVAL;
        else if (q->send_out >= q->max_send) rc = ENOMEM; /* the send queue is full */
        else if (H.refuse_post_at > 0 && --H.refuse_post_at == 0) rc = ENOMEM;
        else if (wr->num_sge > q->max_sge || wr->num_sge < 0 || (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
                                     wr->opcode != IBV_WR_RDMA_READ))
            rc = EINVAL;
        if (rc) {
            *bad = wr;
            pthread_mutex_unlock(&H.lock);
            return rc;
        }
        if (q->st == IBV_QPS_ERR) { /* as the spec says: completed at once with a flush error */
            struct ibv_wc wc = {.wr_id = wr->wr_id, .status = IBV_WC_WR_FLUSH_ERR, .opcode = wc_op(wr->opcode),
                                .qp_num = q->qp.qp_num};
            q->send_out++;
            H.err_posts++;
            cq_push(q->scq, &wc, q);
            continue;
        }
        struct fwr *w = calloc(1, sizeof *w);
        w->qp = q;
        w->wr_id = wr->wr_id;
        w->op = wr->opcode;
        w->signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
        w->nsge = wr->num_sge;
        for (int k = 0; k < wr->num_sge; k++) {
            w->sge[k] = wr->sg_list[k];
            w->len += wr->sg_list[k].length;
        }
        H.post_wrs++;
        H.post_signaled += w->signaled;
        H.post_sges += w->nsge;
        if (++chain > H.longest_chain) H.longest_chain = chain;
        w->raddr = wr->wr.rdma.remote_addr;
        w->rkey = wr->wr.rdma.rkey;
        w->imm = wr->imm_data;
        if (H.tail) H.tail->next = w;
        else H.head = w;
        H.tail = w;
        H.queued++;
        q->send_out++;
    }
    pthread_cond_broadcast(&H.work);
    pthread_mutex_unlock(&H.lock);
    return 0;
}
static int f_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct fqp *q = (struct fqp *)qp;
    pthread_mutex_lock(&H.lock);
    for (; wr; wr = wr->next) {
        if (q->st == IBV_QPS_RESET || q->nrecv >= q->max_recv) {
            *bad = wr;
            pthread_mutex_unlock(&H.lock);
            return q->st == IBV_QPS_RESET ? EINVAL : ENOMEM;
        }
        q->recvs[(q->rhead + q->nrecv) % q->max_recv] = wr->wr_id;
        q->nrecv++;
    }
    pthread_mutex_unlock(&H.lock);
    return 0;
}
static const char *f_wc_status_str(enum ibv_wc_status s)
{
    switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    default: return "other error";
    }
}

static const ferry_verbs_t fake_verbs = {
    .get_device_list = f_get_device_list,
    .free_device_list = f_free_device_list,
    .get_device_name = f_get_device_name,
    .get_device_guid = f_get_device_guid,
    .open_device = f_open_device,
    .close_device = f_close_device,
    .query_device = f_query_device,
    .query_port = f_query_port,
    .query_gid = f_query_gid,
    .alloc_pd = f_alloc_pd,
    .dealloc_pd = f_dealloc_pd,
    .reg_mr = f_reg_mr,
    .dereg_mr = f_dereg_mr,
    .create_comp_channel = f_create_comp_channel,
    .destroy_comp_channel = f_destroy_comp_channel,
    .create_cq = f_create_cq,
    .destroy_cq = f_destroy_cq,
    .get_cq_event = f_get_cq_event,
    .ack_cq_events = f_ack_cq_events,
    .req_notify_cq = f_req_notify_cq,
    .poll_cq = f_poll_cq,
    .create_qp = f_create_qp,
    .destroy_qp = f_destroy_qp,
    .modify_qp = f_modify_qp,
    .post_send = f_post_send,
    .post_recv = f_post_recv,
    .wc_status_str = f_wc_status_str,
};

void hca_pause(int on)
{
    pthread_mutex_lock(&H.lock);
    H.paused = on;
    pthread_cond_broadcast(&H.work);
    pthread_mutex_unlock(&H.lock);
}

long hca_get(long *field)
{
    pthread_mutex_lock(&H.lock);
    long v = *field;
    pthread_mutex_unlock(&H.lock);
    return v;
}

int hca_get_int(int *field)
{
    pthread_mutex_lock(&H.lock);
    int v = *field;
    pthread_mutex_unlock(&H.lock);
    return v;
}

unsigned long long hca_bytes(void)
{
    pthread_mutex_lock(&H.lock);
    unsigned long long v = H.bytes;
    pthread_mutex_unlock(&H.lock);
    return v;
}

int hca_queued(void)
{
    pthread_mutex_lock(&H.lock);
    int v = H.queued;
    pthread_mutex_unlock(&H.lock);
    return v;
}

void wait_queued(int n)
{
    for (int i = 0; i < 5000 && hca_queued() < n; i++) usleep(1000);
    assert_true(hca_queued() >= n);
}
void wait_paused(void)
{
    for (int i = 0; i < 5000 && !hca_get_int(&H.paused); i++) usleep(1000);
    assert_true(hca_get_int(&H.paused));
}

pair_t pair_make(int timeout_ms)
{
    pair_t p;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = timeout_ms;
    cfg.connect_timeout_ms = 5000;
    p.initiator = harness_engine_cfg(&cfg);
    p.target = harness_engine_cfg(&cfg);
    snprintf(p.peer, sizeof p.peer, "%s", ferry_engine_name(p.target));
    return p;
}

void pair_end(pair_t *p)
{
    ferry_engine_destroy(p->initiator);
    ferry_engine_destroy(p->target);
    /* Every memory region went before its protection domain. */
    assert_int_equal(hca_get(&H.dealloc_busy), 0);
}

int write_sync(pair_t *p, void *src, void *dst, size_t len)
{
    return ferry_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len);
}

int start_hca(void **state)
{
    (void)state;
    ferry_rdma_test_use_verbs(&fake_verbs);
    return pthread_create(&H.thread, NULL, hca_main, NULL);
}

int stop_hca(void **state)
{
    (void)state;
    pthread_mutex_lock(&H.lock);
    H.stop = 1;
    pthread_cond_broadcast(&H.work);
    pthread_mutex_unlock(&H.lock);
    pthread_join(H.thread, NULL);
    ferry_rdma_test_use_verbs(NULL);
    return 0;
}

static size_t scatter_slot(size_t i, size_t n, unsigned salt)
{
    /* 2i+1 steps over the 2n slots in an order no two neighbours share. */
    return ((i * 7919u + salt) % n) * 2 + (salt & 1);
}

scatter_t scatter_make(pair_t *p, size_t n, size_t len, bool remote_contiguous)
{
    scatter_t s = {.n = n, .len = len, .cap = 2 * n * len};
    s.src = malloc(s.cap);
    s.dst = calloc(1, s.cap);
    s.locals = malloc(n * sizeof *s.locals);
    s.remotes = malloc(n * sizeof *s.remotes);
    s.lens = malloc(n * sizeof *s.lens);
    harness_fill(s.src, s.cap, 11);
    for (size_t i = 0; i < n; i++) {
        s.locals[i] = s.src + scatter_slot(i, n, 3) * len;
        s.remotes[i] = (uint64_t)(uintptr_t)(s.dst + (remote_contiguous ? i : scatter_slot(i, n, 8)) * len);
        s.lens[i] = len;
    }
    assert_int_equal(ferry_register(p->initiator, s.src, s.cap, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p->target, s.dst, s.cap, FERRY_MEM_REMOTE), 0);
    return s;
}

bool scatter_landed(const scatter_t *s, size_t i)
{
    return memcmp(s->locals[i], (const void *)(uintptr_t)s->remotes[i], s->len) == 0;
}

void scatter_end(pair_t *p, scatter_t *s)
{
    ferry_deregister(p->initiator, s->src);
    ferry_deregister(p->target, s->dst);
    free(s->src);
    free(s->dst);
    free(s->locals);
    free(s->remotes);
    free(s->lens);
}

pair_t pair_make_one_conn(int timeout_ms, int retries)
{
    pair_t p;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = timeout_ms;
    cfg.connect_timeout_ms = 5000;
    cfg.conns_per_peer = 1;
    cfg.retries = retries;
    p.initiator = harness_engine_cfg(&cfg);
    p.target = harness_engine_cfg(&cfg);
    snprintf(p.peer, sizeof p.peer, "%s", ferry_engine_name(p.target));
    return p;
}

void hca_counts(long *calls, long *wrs, long *sig, long *sges)
{
    pthread_mutex_lock(&H.lock);
    *calls = H.post_calls;
    *wrs = H.post_wrs;
    *sig = H.post_signaled;
    *sges = H.post_sges;
    pthread_mutex_unlock(&H.lock);
}

void hca_set_max_wr(int n)
{
    pthread_mutex_lock(&H.lock);
    H.max_wr = n;
    pthread_mutex_unlock(&H.lock);
}

void hca_fail_wr(int nth, enum ibv_wc_status st)
{
    pthread_mutex_lock(&H.lock);
    H.fail_wr_at = nth;
    H.fail_status = st;
    pthread_mutex_unlock(&H.lock);
}

void *unpause_main(void *arg)
{
    struct unpause_later *u = arg;
    for (int i = 0; i < 500 && !atomic_load(&u->cancel_done); i++) usleep(10000);
    hca_pause(0);
    return NULL;
}
