/* The RDMA transport end to end, on a software HCA that lives in this test
 * (no RDMA hardware or kernel support is needed): two engines in one
 * process, the verbs table replaced by ferry_rdma_test_use_verbs().
 *
 * The fake HCA behaves as a strict driver would where Ferry's correctness
 * depends on it: QP state transitions need their attribute masks, the PSNs
 * and LID exchanged must match, send queues and CQs have bounded depth
 * (overflow aborts the test), keys are checked against the protection
 * domain, range and access flags, a deregistered key gives a remote access
 * error that breaks both QPs, a QP moved to error flushes its work requests,
 * and completions are delivered by a separate "HCA" thread through the
 * completion channel's fd. It does not model: the fabric (packets, timing,
 * retransmission), RNR retries (an immediate without a posted receive fails
 * at once), RoCE addressing, memory pinning, GPUDirect.
 *
 * Needs <infiniband/verbs.h>; skipped in builds without the verbs code. */
#ifndef FERRY_HAVE_RDMA
#include "harness.h"
static void skipped(void **state)
{
    (void)state;
    skip();
}
int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/memkind.h"
#include "core/net.h"
#include "core/testing.h"
#include "harness.h"
#include "transport/rdma.h"
#include "transport/rdma_verbs.h"
#include "wire/rdma_wire.h"

/* ============================================================ fake HCA */

#define FAKE_LID 1
#define FAKE_MAX_WR 48 /* below Ferry's own depth (128): its clamp is exercised */
#define FAKE_MAX_SGE 4 /* below Ferry's own (16): its clamp is exercised */

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

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work;
    pthread_t thread;
    int stop, paused;
    struct fwr *head, *tail;
    int queued;
    struct fqp *qps;
    struct fmr *mrs;
    uint32_t next_qpn, next_key;
    /* knobs */
    int fail_next_wr;     /* the next n work requests fail with RETRY_EXC_ERR */
    int fail_wr_at;       /* > 0: the fail_wr_at-th work request executed from now fails with fail_status */
    enum ibv_wc_status fail_status;
    int max_wr;           /* the device's max_qp_wr; 0 = FAKE_MAX_WR */
    int refuse_post_at;   /* > 0: the refuse_post_at-th work request posted from now is refused (ENOMEM) */
    int qp_fail_skip, qp_fail; /* after skipping n creates, fail the next m */
    int pause_at_imm;     /* the HCA pauses before it executes the next WRITE WITH IMMEDIATE */
    /* counters */
    long regs, deregs, qps_made, dealloc_busy, imms;
    long post_calls, post_wrs, post_signaled, post_sges, longest_chain; /* ibv_post_send */
    long err_posts; /* work requests posted to a QP in the error state (flushed at once) */
    unsigned long long bytes;
} H = {.lock = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .next_qpn = 0x100, .next_key = 0x1000};

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

static void hca_pause(int on)
{
    pthread_mutex_lock(&H.lock);
    H.paused = on;
    pthread_cond_broadcast(&H.work);
    pthread_mutex_unlock(&H.lock);
}

static long hca_get(long *field)
{
    pthread_mutex_lock(&H.lock);
    long v = *field;
    pthread_mutex_unlock(&H.lock);
    return v;
}

static int hca_get_int(int *field)
{
    pthread_mutex_lock(&H.lock);
    int v = *field;
    pthread_mutex_unlock(&H.lock);
    return v;
}

static unsigned long long hca_bytes(void)
{
    pthread_mutex_lock(&H.lock);
    unsigned long long v = H.bytes;
    pthread_mutex_unlock(&H.lock);
    return v;
}

static int hca_queued(void)
{
    pthread_mutex_lock(&H.lock);
    int v = H.queued;
    pthread_mutex_unlock(&H.lock);
    return v;
}

static void wait_queued(int n)
{
    for (int i = 0; i < 5000 && hca_queued() < n; i++) usleep(1000);
    assert_true(hca_queued() >= n);
}

/* ============================================================ the tests */

typedef struct pair {
    ferry_engine_t *initiator, *target;
    char peer[300];
} pair_t;

static pair_t pair_make(int timeout_ms)
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

static void pair_end(pair_t *p)
{
    ferry_engine_destroy(p->initiator);
    ferry_engine_destroy(p->target);
    /* Every memory region went before its protection domain. */
    assert_int_equal(hca_get(&H.dealloc_busy), 0);
}

static int write_sync(pair_t *p, void *src, void *dst, size_t len)
{
    return ferry_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len);
}

static void auto_selects_rdma(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    char why[128];
    assert_int_equal(ferry_rdma_local(p.target, why, sizeof why), 1);
    assert_string_equal(why, "fakerdma0 port 1 (InfiniBand, lid 1)");
    assert_int_equal(ferry_session_open(p.initiator, p.peer), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
    assert_string_equal(info.transport, "rdma");
    assert_non_null(strstr(info.transport_reason, "rdma on fakerdma0"));
    pair_end(&p);
}

/* A peer that has RDMA turned off advertises nothing: the next transport in
 * line (shm, the peer being on this host), saying why not rdma. */
static void peer_without_rdma_gets_tcp(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    ferry_rdma_env_t env;
    assert_int_equal(ferry_rdma_env_load(&env), 0);
    env.enabled = 0;
    char why[128];
    assert_int_equal(ferry_rdma_reprobe(p.target, &env, why, sizeof why), 0);
    assert_int_equal(ferry_session_open(p.initiator, p.peer), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
    assert_string_equal(info.transport, "shm");
    assert_non_null(strstr(info.transport_reason, "not rdma: the peer has no usable RDMA device"));
    pair_end(&p);
}

static void writes_and_reads_of_every_size(void **state)
{
    (void)state;
    pair_t p = pair_make(20000);
    const size_t sizes[] = {1, 4096, (3u << 20) + 5, 64u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t len = sizes[k];
        unsigned char *src = malloc(len), *dst = calloc(1, len), *back = calloc(1, len);
        assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_register(p.initiator, back, len, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
        harness_fill(src, len, len);
        unsigned long long before = hca_bytes();
        int rc = write_sync(&p, src, dst, len);
        if (rc) fprintf(stderr, "%s\n", ferry_last_error_detail());
        assert_int_equal(rc, 0);
        assert_true(harness_check(dst, len, len));
        rc = ferry_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, back, (uint64_t)(uintptr_t)dst, len);
        assert_int_equal(rc, 0);
        assert_true(harness_check(back, len, len));
        /* Every byte went through the HCA, none inline over TCP. */
        assert_true(hca_bytes() - before == 2ull * len);
        ferry_deregister(p.initiator, src);
        ferry_deregister(p.initiator, back);
        ferry_deregister(p.target, dst);
        free(src);
        free(dst);
        free(back);
    }
    pair_end(&p);
}

/* More pieces than the send queue and the commit window hold. */
static void batches_beyond_every_window(void **state)
{
    (void)state;
    pair_t p = pair_make(20000);
    enum { N = 150, LEN = 8192 };
    unsigned char *src = malloc((size_t)N * LEN), *dst = calloc(N, LEN);
    assert_int_equal(ferry_register(p.initiator, src, (size_t)N * LEN, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, (size_t)N * LEN, FERRY_MEM_REMOTE), 0);
    harness_fill(src, (size_t)N * LEN, 5);
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        locals[i] = src + (size_t)i * LEN;
        remotes[i] = (uint64_t)(uintptr_t)(dst + (size_t)i * LEN);
        lens[i] = LEN;
    }
    long regs = hca_get(&H.regs), imms = hca_get(&H.imms);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
    assert_true(harness_check(dst, (size_t)N * LEN, 5));
    /* The pieces were committed in groups: one immediate (and one
     * RDMA_COMMIT_GROUP) per connection the batch ran on. */
    assert_in_range(hca_get(&H.imms) - imms, 1, 2);
    /* One memory region per registered region and side, made lazily. */
    assert_int_equal(hca_get(&H.regs) - regs, 2);

    /* Async, with progress counted at commit. */
    memset(dst, 0, (size_t)N * LEN);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &b), 0);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++) reqs[i] = (ferry_request_t){FERRY_OP_WRITE, locals[i], remotes[i], LEN};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, N, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 20000), 0);
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
        assert_int_equal(st.bytes, LEN);
    }
    assert_true(harness_check(dst, (size_t)N * LEN, 5));
    assert_int_equal(ferry_batch_free(b), 0);
    assert_int_equal(hca_get(&H.regs) - regs, 2);
    long deregs = hca_get(&H.deregs);
    ferry_deregister(p.target, dst);
    assert_int_equal(hca_get(&H.deregs) - deregs, 1);
    ferry_deregister(p.initiator, src);
    free(src);
    free(dst);
    pair_end(&p);
}

struct async_write {
    pair_t *p;
    void *src, *dst;
    size_t len;
    int rc;
    char detail[1024];
};

static void *async_write_main(void *arg)
{
    struct async_write *a = arg;
    a->rc = write_sync(a->p, a->src, a->dst, a->len);
    snprintf(a->detail, sizeof a->detail, "%s", ferry_last_error_detail());
    return NULL;
}

/* A deregistration while writes to the region are queued at the HCA: once
 * ferry_deregister returns, not one byte lands, and the writer learns the
 * region is gone. */
static void deregistration_stops_queued_writes(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 4u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 1);
    assert_int_equal(write_sync(&p, src, dst, len), 0); /* QPs and keys exist now */
    memset(dst, 0xee, len);
    harness_fill(src, len, 2);
    hca_pause(1);
    struct async_write a = {&p, src, dst, len, 0, ""};
    pthread_t t;
    pthread_create(&t, NULL, async_write_main, &a);
    wait_queued(4); /* all four slices wait at the HCA */
    assert_int_equal(ferry_deregister(p.target, dst), 0);
    hca_pause(0);
    pthread_join(t, NULL);
    assert_int_equal(a.rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    for (size_t i = 0; i < len; i++)
        if (dst[i] != 0xee) fail_msg("byte %zu landed after the deregistration", i);
    ferry_deregister(p.initiator, src);
    free(src);
    free(dst);
    pair_end(&p);
}

/* A target that re-registered the region: the old key fails at the HCA,
 * the call learns the new key and succeeds the first time. */
static void reregistered_region_is_stale_then_works(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 1u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 3);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    assert_int_equal(ferry_deregister(p.target, dst), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    memset(dst, 0, len);
    /* The old key fails at the HCA (nothing placed); the call learns the
     * new key and the write lands, in the same call. */
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    assert_true(harness_check(dst, len, 3));
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* The HCA stalls past the deadline: TIMEOUT, no hang, and the queued
 * writes are flushed, so nothing lands when the HCA wakes up. */
static void stalled_hca_times_out_without_late_writes(void **state)
{
    (void)state;
    pair_t p = pair_make(400);
    size_t len = 2u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 4);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    memset(dst, 0x5a, len);
    hca_pause(1);
    uint64_t t0 = harness_now_ms();
    assert_int_equal(write_sync(&p, src, dst, len), FERRY_ERR_TIMEOUT);
    assert_detail_contains("no RDMA completion");
    assert_true(harness_now_ms() - t0 >= 390);
    assert_int_equal(hca_queued(), 0); /* flushed, none left to run */
    hca_pause(0);
    usleep(20000);
    for (size_t i = 0; i < len; i++)
        if (dst[i] != 0x5a) fail_msg("byte %zu landed after the timeout", i);
    /* The broken QP was dropped: the next write uses a fresh one. */
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    assert_true(harness_check(dst, len, 4));
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

struct resumer {
    int ms;
};
static void *resume_later(void *arg)
{
    usleep((useconds_t)((struct resumer *)arg)->ms * 1000);
    hca_pause(0);
    return NULL;
}

static double thread_cpu_ms(void)
{
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

/* Waiting for completions blocks on the channel: a 300 ms wait costs the
 * waiting thread almost no CPU (a spinning wait would cost ~300 ms). */
static void completion_wait_does_not_spin(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 1u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    hca_pause(1);
    struct resumer r = {300};
    pthread_t t;
    pthread_create(&t, NULL, resume_later, &r);
    double cpu0 = thread_cpu_ms();
    uint64_t t0 = harness_now_ms();
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    double cpu = thread_cpu_ms() - cpu0;
    uint64_t wall = harness_now_ms() - t0;
    pthread_join(t, NULL);
    assert_true(wall >= 250);
    if (cpu > 100.0) fail_msg("the waiting thread used %.1f ms of CPU in %llu ms", cpu, (unsigned long long)wall);
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* A port failure (retry counter exceeded) breaks the QP; Ferry retries on
 * a fresh connection and queue pair and completes. */
static void port_failure_is_retried_on_a_new_queue_pair(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 2u << 20;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 6);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    memset(dst, 0, len);
    long qps = hca_get(&H.qps_made);
    pthread_mutex_lock(&H.lock);
    H.fail_next_wr = 1;
    pthread_mutex_unlock(&H.lock);
    int rc = write_sync(&p, src, dst, len);
    if (rc) fprintf(stderr, "%s\n", ferry_last_error_detail());
    assert_int_equal(rc, 0);
    assert_true(harness_check(dst, len, 6));
    assert_true(hca_get(&H.qps_made) - qps >= 2); /* a new pair of QPs */
    /* With no retries left, the failure is reported with its cause. */
    ferry_engine_destroy(p.initiator);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 10000;
    cfg.retries = 0;
    p.initiator = harness_engine_cfg(&cfg);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    pthread_mutex_lock(&H.lock);
    H.fail_next_wr = 1;
    pthread_mutex_unlock(&H.lock);
    assert_int_equal(write_sync(&p, src, dst, len), FERRY_ERR_PEER_CLOSED);
    assert_detail_contains("stopped answering");
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* The target cannot make its QP: the session moves to TCP, says why, and
 * the transfer completes. */
static void target_qp_failure_falls_back_to_tcp(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 1u << 20;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 7);
    pthread_mutex_lock(&H.lock);
    H.qp_fail_skip = 1; /* the initiator's QP is made, the target's is not */
    H.qp_fail = 1;
    pthread_mutex_unlock(&H.lock);
    unsigned long long before = hca_bytes();
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    assert_true(harness_check(dst, len, 7));
    assert_true(hca_bytes() == before);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
    assert_string_equal(info.transport, "tcp");
    assert_non_null(strstr(info.transport_reason, "rdma setup failed, fell back to tcp: "));
    assert_non_null(strstr(info.transport_reason, "ibv_create_qp"));
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* Device memory the HCA cannot register (no GPUDirect): those pieces go
 * inline over the same TCP connection with host staging, the others by
 * RDMA, in one batch. */
static void device_memory_moves_over_tcp_with_staging(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = (1u << 20) + 9;
    int fd = memfd_create("ferry-fake-device", MFD_CLOEXEC);
    assert_int_equal(ftruncate(fd, (off_t)len), 0);
    unsigned char *dev = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
    unsigned char *alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_int_equal(ferry_memkind_fake_add(dev, len, alias), 0);
    unsigned char *src = malloc(2 * len), *hostdst = calloc(1, len);
    assert_int_equal(ferry_register(p.initiator, src, 2 * len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dev, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(p.target, hostdst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, 2 * len, 8);
    void *locals[2] = {src, src + len};
    uint64_t remotes[2] = {(uint64_t)(uintptr_t)dev, (uint64_t)(uintptr_t)hostdst};
    size_t lens[2] = {len, len};
    unsigned long th0, fh0, th1, fh1;
    ferry_memkind_fake_counts(&th0, &fh0);
    unsigned long long before = hca_bytes();
    int rc = ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, locals, remotes, lens, 2);
    if (rc) fprintf(stderr, "%s\n", ferry_last_error_detail());
    assert_int_equal(rc, 0);
    assert_true(harness_check(alias, len, 8));
    unsigned char *expect = malloc(2 * len);
    harness_fill(expect, 2 * len, 8);
    assert_memory_equal(hostdst, expect + len, len);
    ferry_memkind_fake_counts(&th1, &fh1);
    assert_int_equal(fh1 - fh0, 2);               /* two slices staged into the device */
    assert_true(hca_bytes() - before == len);     /* the host piece went by RDMA */
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
    assert_string_equal(info.transport, "rdma"); /* the session stays on RDMA */
    /* And back: a read out of device memory. */
    memset(src, 0, len);
    assert_int_equal(ferry_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, src, (uint64_t)(uintptr_t)dev, len), 0);
    assert_memory_equal(src, expect, len);
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dev);
    ferry_deregister(p.target, hostdst);
    ferry_memkind_fake_remove(dev);
    munmap(dev, len);
    munmap(alias, len);
    free(src);
    free(hostdst);
    free(expect);
    pair_end(&p);
}

/* Cancel: when ferry_batch_cancel returns, nothing of the batch is left
 * at the HCA. */
static void cancel_leaves_nothing_on_the_wire(void **state)
{
    (void)state;
    pair_t p = pair_make(20000);
    size_t len = 32u << 20;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(write_sync(&p, src, 4096 + dst, 4096), 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, 4, &b), 0);
    ferry_request_t reqs[4];
    for (int i = 0; i < 4; i++)
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)i * (len / 4),
                                    (uint64_t)(uintptr_t)(dst + (size_t)i * (len / 4)), len / 4};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, 4, 0), 0);
    assert_int_equal(ferry_batch_cancel(b), 0);
    assert_int_equal(hca_queued(), 0);
    for (int i = 0; i < 4; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        assert_true(st.state == FERRY_STATUS_CANCELLED || st.state == FERRY_STATUS_COMPLETED);
    }
    assert_int_equal(ferry_batch_free(b), 0);
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* The target's RDMA frames, raw: key queries are validated like any
 * access, and protocol errors close the connection. */
static void target_validates_key_queries(void **state)
{
    (void)state;
    pair_t p = pair_make(5000);
    unsigned char *dst = malloc(8192);
    assert_int_equal(ferry_register(p.target, dst, 8192, FERRY_MEM_REMOTE_READ), 0);
    ferry_session_t *s;
    ferry_conn_t *c;
    uint64_t dl = ferry_deadline_after_ms(5000);
    assert_int_equal(ferry_session_get(p.initiator, p.peer, &s), 0);
    assert_int_equal(ferry_session_checkout(s, dl, &c), 0);
    ferry_frame_t q = {.type = FERRY_FRAME_RDMA_MR_QUERY, .req_id = 1, .addr = (uint64_t)(uintptr_t)dst, .len = 8192,
                       .aux = (uint64_t)FERRY_MEM_REMOTE_READ << 32}, f;
    /* Readable: the key of the whole region. */
    assert_int_equal(ferry_conn_send_frame(c, &q, NULL, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_RDMA_MR_INFO);
    assert_int_equal(f.status, 0);
    assert_int_equal(f.plen, FERRY_RDMA_MR_INFO_SIZE);
    uint8_t buf[FERRY_RDMA_MR_INFO_SIZE];
    assert_int_equal(ferry_net_recv(c->fd, buf, sizeof buf, dl), 0);
    ferry_rdma_mr_info_t m;
    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf, &m), 0);
    assert_int_equal(m.addr, (uint64_t)(uintptr_t)dst);
    assert_int_equal(m.len, 8192);
    assert_int_equal(m.flags, FERRY_MEM_REMOTE_READ);
    /* Not writable; out of bounds; unregistered; wrong generation. */
    struct {
        uint64_t addr, len, aux;
        int code;
        const char *text;
    } bad[] = {
        {(uint64_t)(uintptr_t)dst, 8192, (uint64_t)FERRY_MEM_REMOTE_WRITE << 32, FERRY_ERR_ACCESS_DENIED,
         "remote read only"},
        {(uint64_t)(uintptr_t)dst + 4096, 8192, (uint64_t)FERRY_MEM_REMOTE_READ << 32, FERRY_ERR_OUT_OF_BOUNDS,
         "past the end"},
        {4096, 1, (uint64_t)FERRY_MEM_REMOTE_READ << 32, FERRY_ERR_ADDRESS_NOT_REGISTERED, "not registered"},
        {(uint64_t)(uintptr_t)dst, 1, ((uint64_t)FERRY_MEM_REMOTE_READ << 32) | (m.generation + 1),
         FERRY_ERR_STALE_SEGMENT, "registered again"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        q.addr = bad[i].addr;
        q.len = bad[i].len;
        q.aux = bad[i].aux;
        assert_int_equal(ferry_conn_send_frame(c, &q, NULL, dl), 0);
        assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
        assert_int_equal(f.status, bad[i].code);
        assert_int_equal(ferry_rdma_read_refusal(c, &f, "the RDMA key", dl), bad[i].code);
        assert_detail_contains(bad[i].text);
    }
    /* A second CONNECT on a connection is refused, the first accepted. */
    ferry_rdma_qp_info_t qi = {.qpn = 0x999, .psn = 1, .lid = 1, .port = 1, .link_layer = FERRY_RDMA_LINK_IB,
                               .mtu = 5, .rd_atom = 1, .recv_depth = 8};
    uint8_t qb[FERRY_RDMA_QP_INFO_SIZE];
    ferry_rdma_qp_info_encode(&qi, qb);
    for (int k = 0; k < 2; k++) {
        ferry_frame_t cf = {.type = FERRY_FRAME_RDMA_CONNECT, .plen = sizeof qb};
        assert_int_equal(ferry_conn_send_frame(c, &cf, qb, dl), 0);
        assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
        assert_int_equal(f.type, FERRY_FRAME_RDMA_CONNECT_ACK);
        if (k == 0) {
            assert_int_equal(f.status, 0);
            assert_int_equal(ferry_conn_discard(c, f.plen, dl), 0);
        } else {
            assert_int_equal(f.status, FERRY_ERR_MALFORMED_FRAME);
            assert_int_equal(ferry_rdma_read_refusal(c, &f, "an RDMA connection", dl), FERRY_ERR_MALFORMED_FRAME);
            assert_detail_contains("second RDMA_CONNECT");
        }
    }
    /* An access that is neither read nor write: the connection closes. */
    q.aux = 3ull << 32;
    assert_int_equal(ferry_conn_send_frame(c, &q, NULL, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_ERROR);
    ferry_session_checkin(s, c, false);
    ferry_session_put(s);
    ferry_deregister(p.target, dst);
    free(dst);
    pair_end(&p);
}

static int start_hca(void **state)
{
    (void)state;
    ferry_rdma_test_use_verbs(&fake_verbs);
    return pthread_create(&H.thread, NULL, hca_main, NULL);
}

static int stop_hca(void **state)
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

/* ============================================ small pieces as WR chains */

/* N pieces of len bytes at scattered slots of two buffers of 2N slots each
 * (a fixed permutation per side): neither side has two batch-adjacent
 * pieces at adjacent addresses, so nothing merges. */
typedef struct scatter {
    unsigned char *src, *dst;
    size_t n, len, cap;
    void **locals;
    uint64_t *remotes;
    size_t *lens;
} scatter_t;

static size_t scatter_slot(size_t i, size_t n, unsigned salt)
{
    /* 2i+1 steps over the 2n slots in an order no two neighbours share. */
    return ((i * 7919u + salt) % n) * 2 + (salt & 1);
}

static scatter_t scatter_make(pair_t *p, size_t n, size_t len, bool remote_contiguous)
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

/* 1 when piece i's bytes are in place at the target. */
static bool scatter_landed(const scatter_t *s, size_t i)
{
    return memcmp(s->locals[i], (const void *)(uintptr_t)s->remotes[i], s->len) == 0;
}

static void scatter_end(pair_t *p, scatter_t *s)
{
    ferry_deregister(p->initiator, s->src);
    ferry_deregister(p->target, s->dst);
    free(s->src);
    free(s->dst);
    free(s->locals);
    free(s->remotes);
    free(s->lens);
}

/* A pair whose batches run on one connection (one QP, one chain of work
 * requests at a time), so that counts and positions are exact. */
static pair_t pair_make_one_conn(int timeout_ms, int retries)
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

static void hca_counts(long *calls, long *wrs, long *sig, long *sges)
{
    pthread_mutex_lock(&H.lock);
    *calls = H.post_calls;
    *wrs = H.post_wrs;
    *sig = H.post_signaled;
    *sges = H.post_sges;
    pthread_mutex_unlock(&H.lock);
}

static void hca_set_max_wr(int n)
{
    pthread_mutex_lock(&H.lock);
    H.max_wr = n;
    pthread_mutex_unlock(&H.lock);
}

/* 1,024 scattered 2 KiB pieces (the paged-KV shape): byte-exact, and
 * posted as chains: far fewer ibv_post_send calls and signalled work
 * requests than pieces. A structural bound, not a time. */
static void small_scattered_pieces_post_few_chains(void **state)
{
    (void)state;
    enum { N = 1024, LEN = 2048 };
    hca_set_max_wr(1024); /* a device deeper than Ferry's own queue (128) */
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0); /* the QP and the keys */
    long calls, wrs, sig, sges, calls2, wrs2, sig2, sges2;
    hca_counts(&calls, &wrs, &sig, &sges);
    long imms = hca_get(&H.imms);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_int_equal(hca_get(&H.imms) - imms, 1); /* one group commit for all */
    assert_int_equal(wrs2 - wrs, N + 1);          /* scattered both sides: one data WR each, nothing merged */
    fprintf(stderr, "write: %ld post_send calls, %ld WRs, %ld signalled for %d pieces\n", calls2 - calls,
            wrs2 - wrs, sig2 - sig, N);
    assert_true(calls2 - calls <= N / 16);
    assert_true(sig2 - sig <= N / 16);
    /* Reads the same way, into a cleared buffer. */
    memset(s.src, 0, s.cap);
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_int_equal(wrs2 - wrs, N);
    assert_true(calls2 - calls <= N / 32);
    scatter_end(&p, &s);
    pair_end(&p);
    hca_set_max_wr(0);
}

/* Adjacent pieces merge: contiguous on both sides into one entry per
 * slice; scattered locally but contiguous remotely into one work request
 * of up to max_sge (the fake's 4) entries. */
static void adjacent_pieces_merge(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, true);
    assert_int_equal(write_sync(&p, s.src, s.dst + s.cap - 64, 64), 0);
    long calls, wrs, sig, sges, calls2, wrs2, sig2, sges2;
    /* Locally scattered, remotely contiguous: 4 entries per WR. */
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_int_equal(wrs2 - wrs - 1, N / FAKE_MAX_SGE); /* data WRs, after the group commit's immediate */
    assert_int_equal(sges2 - sges, N);
    /* Read back the same way: a scatter list of 4 entries per READ. */
    memset(s.src, 0, s.cap);
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_int_equal(wrs2 - wrs, N / FAKE_MAX_SGE);
    /* Contiguous on both sides: one entry for all 512 KiB (one slice). */
    memset(s.dst, 0, s.cap);
    for (size_t i = 0; i < N; i++) s.locals[i] = s.src + i * LEN;
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    assert_memory_equal(s.src, s.dst, (size_t)N * LEN);
    assert_int_equal(wrs2 - wrs, 2); /* the data, and the group commit's immediate */
    /* Reads merge the same way (a scatter list on the local side). */
    memset(s.src, 0, (size_t)N * LEN);
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    assert_memory_equal(s.src, s.dst, (size_t)N * LEN);
    assert_int_equal(wrs2 - wrs, 1);
    scatter_end(&p, &s);
    pair_end(&p);
}

static void hca_fail_wr(int nth, enum ibv_wc_status st)
{
    pthread_mutex_lock(&H.lock);
    H.fail_wr_at = nth;
    H.fail_status = st;
    pthread_mutex_unlock(&H.lock);
}

/* The 100th work request of a chain fails. A fault of its memory fails
 * its piece alone; the unsignalled ones before it in the chain have an
 * unknown outcome and are never reported completed; with retries the
 * others land on a new QP. A fault of the path: everything lands. */
static void error_in_the_middle_of_a_chain(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048, BAD = 99 };
    pair_t p = pair_make_one_conn(20000, 0);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    hca_fail_wr(BAD + 1, IBV_WC_LOC_PROT_ERR);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &b), 0);
    ferry_request_t *reqs = malloc(N * sizeof *reqs);
    for (int i = 0; i < N; i++) reqs[i] = (ferry_request_t){FERRY_OP_WRITE, s.locals[i], s.remotes[i], LEN};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, N, 0), 0);
    assert_int_not_equal(ferry_batch_wait(b, 20000), 0);
    assert_detail_contains("unknown outcome");
    int completed = 0;
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        if (i == BAD) {
            assert_int_equal(st.state, FERRY_STATUS_FAILED);
            assert_int_equal(st.code, FERRY_ERR_ADDRESS_NOT_REGISTERED);
        } else if (st.state == FERRY_STATUS_COMPLETED) {
            assert_true(scatter_landed(&s, (size_t)i)); /* completed means placed */
            completed++;
        } else {
            assert_int_equal(st.state, FERRY_STATUS_FAILED);
            assert_int_not_equal(st.code, 0);
        }
    }
    /* A write completes only when the target confirmed it through a commit
     * on the same QP, which broke: nothing completes in this run, whatever
     * the HCA did. Of the pieces before the failed one, those after the
     * last signalled completion (96..98: Ferry signals every 24th work
     * request on the fake's queue of 48) were not even proven placed; the
     * detail says so. */
    assert_int_equal(completed, 0);
    assert_int_equal(ferry_batch_free(b), 0);
    /* A fault of the path in mid-chain, with retries: all land. */
    ferry_engine_destroy(p.initiator);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 20000;
    cfg.conns_per_peer = 1;
    cfg.retries = 3;
    p.initiator = harness_engine_cfg(&cfg);
    assert_int_equal(ferry_register(p.initiator, s.src, s.cap, FERRY_MEM_LOCAL), 0);
    memset(s.dst, 0, s.cap);
    long qps = hca_get(&H.qps_made);
    assert_int_equal(write_sync(&p, s.src, s.dst + s.cap - 64, 64), 0);
    hca_fail_wr(BAD + 1, IBV_WC_RETRY_EXC_ERR);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_true(hca_get(&H.qps_made) - qps >= 4); /* the first pair, then a new one */
    free(reqs);
    scatter_end(&p, &s);
    pair_end(&p);
}

/* The HCA refuses a chain part way (the 60th work request: the 13th of the
 * second chain, unsignalled; then the 10th commit immediate of an
 * initiator of protocol 2, which commits each piece with its own): the
 * accepted ones end visibly (a signalled marker after the error state, so
 * no wait for a completion that cannot come), the run retries on a new QP,
 * all land. */
static void chain_refused_part_way(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    ferry_test_set_protocol_version(p.initiator, 2);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    long marks = hca_get(&H.err_posts), qps = hca_get(&H.qps_made);
    pthread_mutex_lock(&H.lock);
    H.refuse_post_at = 60;
    pthread_mutex_unlock(&H.lock);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_true(hca_get(&H.err_posts) - marks >= 1);
    assert_true(hca_get(&H.qps_made) - qps >= 2);
    /* The same in the commits' chain: the 10th immediate after the 256
     * data work requests. */
    memset(s.dst, 0, s.cap);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, 64);
    marks = hca_get(&H.err_posts);
    qps = hca_get(&H.qps_made);
    pthread_mutex_lock(&H.lock);
    H.refuse_post_at = N + 10;
    pthread_mutex_unlock(&H.lock);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_true(hca_get(&H.err_posts) - marks >= 1);
    assert_true(hca_get(&H.qps_made) - qps >= 2);
    scatter_end(&p, &s);
    pair_end(&p);
}

/* Unpauses the HCA when the cancel returned, or after 5 s if the cancel
 * needs the HCA to go on. */
struct unpause_later {
    pthread_t t;
    atomic_int cancel_done;
};

static void *unpause_main(void *arg)
{
    struct unpause_later *u = arg;
    for (int i = 0; i < 500 && !atomic_load(&u->cancel_done); i++) usleep(10000);
    hca_pause(0);
    return NULL;
}

/* Cancel while a chain is posted and not yet executed: every piece ends
 * COMPLETED (placed) or CANCELLED, nothing is left on the HCA, and no byte
 * lands after the cancel returned. */
static void cancel_mid_chain(void **state)
{
    (void)state;
    enum { N = 1024, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    long calls, wrs, sig, sges, calls2, wrs2, sig2, sges2;
    hca_counts(&calls, &wrs, &sig, &sges);
    hca_pause(1);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &b), 0);
    ferry_request_t *reqs = malloc(N * sizeof *reqs);
    for (int i = 0; i < N; i++) reqs[i] = (ferry_request_t){FERRY_OP_WRITE, s.locals[i], s.remotes[i], LEN};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, N, 0), 0);
    wait_queued(FAKE_MAX_WR); /* the first chain fills the send queue */
    struct unpause_later u;
    atomic_init(&u.cancel_done, 0);
    pthread_create(&u.t, NULL, unpause_main, &u);
    int rc = ferry_batch_cancel(b);
    atomic_store(&u.cancel_done, 1);
    pthread_join(u.t, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(hca_queued(), 0);
    unsigned char *snap = malloc(s.cap);
    memcpy(snap, s.dst, s.cap);
    int cancelled = 0;
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        if (st.state == FERRY_STATUS_COMPLETED) {
            assert_true(scatter_landed(&s, (size_t)i));
        } else {
            assert_int_equal(st.state, FERRY_STATUS_CANCELLED);
            cancelled++;
        }
    }
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    fprintf(stderr, "cancel: %d of %d cancelled; %ld WRs posted\n", cancelled, N, wrs2 - wrs);
    /* At most the one chain posted before the cancel ran. */
    assert_true(cancelled >= N - FAKE_MAX_WR);
    assert_int_equal(ferry_batch_free(b), 0);
    usleep(20000);
    assert_memory_equal(snap, s.dst, s.cap); /* no late write */
    assert_int_equal(hca_queued(), 0);
    free(snap);
    free(reqs);
    scatter_end(&p, &s);
    pair_end(&p);
}

/* ============================================ group commits (protocol 3) */

static void wait_paused(void)
{
    for (int i = 0; i < 5000 && !hca_get_int(&H.paused); i++) usleep(1000);
    assert_true(hca_get_int(&H.paused));
}

/* 1,024 RDMA-written pieces are committed with one immediate and one
 * RDMA_COMMIT_GROUP (the commit frames counted by their immediates, one
 * each) when both ends speak protocol 3; when either end is older, each
 * piece with its own (the per-piece RDMA_COMMIT). Every byte lands. */
static void group_commit_is_negotiated(void **state)
{
    (void)state;
    enum { N = 1024, LEN = 2048 };
    static const struct {
        int initiator, target, expect_version;
        long expect_imms;
    } cases[] = {{0, 0, FERRY_PROTOCOL_VERSION, 1}, {2, 0, 2, N}, {0, 2, 2, N}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        pair_t p = pair_make_one_conn(20000, 3);
        if (cases[c].initiator) ferry_test_set_protocol_version(p.initiator, cases[c].initiator);
        if (cases[c].target) ferry_test_set_protocol_version(p.target, cases[c].target);
        scatter_t s = scatter_make(&p, N, LEN, false);
        assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
        memset(s.dst, 0, s.cap);
        ferry_peer_info_t info;
        assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
        assert_string_equal(info.transport, "rdma");
        assert_int_equal(info.protocol_version, cases[c].expect_version);
        long imms = hca_get(&H.imms);
        assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N),
                         0);
        for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
        assert_int_equal(hca_get(&H.imms) - imms, cases[c].expect_imms);
        scatter_end(&p, &s);
        pair_end(&p);
    }
}

/* The target region of every other piece is deregistered after the
 * pieces' bytes were written and before the group's commit is checked (the
 * HCA holds the immediate): the one answer fails exactly those pieces,
 * each with its code and a detail naming its own range, the first with
 * the target's reason; the others complete. */
static void group_commit_fails_pieces_one_by_one(void **state)
{
    (void)state;
    enum { N = 64, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    unsigned char *src = malloc((size_t)N * LEN), *a = calloc(N, LEN), *b = calloc(N, LEN);
    assert_int_equal(ferry_register(p.initiator, src, (size_t)N * LEN, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, a, (size_t)N * LEN, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(p.target, b, (size_t)N * LEN, FERRY_MEM_REMOTE), 0);
    harness_fill(src, (size_t)N * LEN, 21);
    assert_int_equal(write_sync(&p, src, a, 64), 0); /* the QP */
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++) {
        unsigned char *dst = (i % 2 ? b : a) + (size_t)(i / 2) * LEN;
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)i * LEN, (uint64_t)(uintptr_t)dst, LEN};
    }
    pthread_mutex_lock(&H.lock);
    H.pause_at_imm = 1;
    pthread_mutex_unlock(&H.lock);
    long imms = hca_get(&H.imms);
    ferry_batch_t *batch;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &batch), 0);
    assert_int_equal(ferry_batch_submit(batch, p.peer, reqs, N, 0), 0);
    wait_paused(); /* every data write done, the group's immediate held */
    assert_int_equal(ferry_deregister(p.target, b), 0);
    hca_pause(0);
    assert_int_equal(ferry_batch_wait(batch, 20000), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(hca_get(&H.imms) - imms, 1); /* one group commit */
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(batch, (size_t)i, &st), 0);
        if (i % 2 == 0) {
            assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
            assert_memory_equal((void *)(uintptr_t)reqs[i].remote, reqs[i].local, LEN);
            continue;
        }
        assert_int_equal(st.state, FERRY_STATUS_FAILED);
        assert_int_equal(st.code, FERRY_ERR_ADDRESS_NOT_REGISTERED);
        char range[64];
        snprintf(range, sizeof range, "0x%llx", (unsigned long long)reqs[i].remote);
        assert_detail_contains(range);
        if (i == 1) assert_detail_contains("region deregistered during the write");
        else assert_detail_contains("one of 64 pieces in one group commit");
    }
    assert_int_equal(ferry_batch_free(batch), 0);
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, a);
    free(src);
    free(a);
    free(b);
    pair_end(&p);
}

/* Cancel while the group's immediate is held at the HCA (every data write
 * done, nothing confirmed): every piece ends CANCELLED or COMPLETED
 * (placed), nothing is left on the HCA, and no byte lands after the cancel
 * returned. */
static void cancel_during_group_commit(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    pthread_mutex_lock(&H.lock);
    H.pause_at_imm = 1;
    pthread_mutex_unlock(&H.lock);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &b), 0);
    ferry_request_t *reqs = malloc(N * sizeof *reqs);
    for (int i = 0; i < N; i++) reqs[i] = (ferry_request_t){FERRY_OP_WRITE, s.locals[i], s.remotes[i], LEN};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, N, 0), 0);
    wait_paused();
    struct unpause_later u;
    atomic_init(&u.cancel_done, 0);
    pthread_create(&u.t, NULL, unpause_main, &u);
    int rc = ferry_batch_cancel(b);
    atomic_store(&u.cancel_done, 1);
    pthread_join(u.t, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(hca_queued(), 0);
    unsigned char *snap = malloc(s.cap);
    memcpy(snap, s.dst, s.cap);
    int cancelled = 0;
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        if (st.state == FERRY_STATUS_COMPLETED) {
            assert_true(scatter_landed(&s, (size_t)i));
        } else {
            assert_int_equal(st.state, FERRY_STATUS_CANCELLED);
            cancelled++;
        }
    }
    fprintf(stderr, "cancel during the group commit: %d of %d cancelled\n", cancelled, N);
    assert_int_equal(ferry_batch_free(b), 0);
    usleep(20000);
    assert_memory_equal(snap, s.dst, s.cap); /* no late write */
    assert_int_equal(hca_queued(), 0);
    free(snap);
    free(reqs);
    scatter_end(&p, &s);
    pair_end(&p);
}

/* The HCA refuses the group's immediate: nothing is committed, the run
 * retries on a new QP, all land. */
static void group_commit_post_refused(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    long qps = hca_get(&H.qps_made);
    pthread_mutex_lock(&H.lock);
    H.refuse_post_at = N + 1; /* after the N data work requests */
    pthread_mutex_unlock(&H.lock);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_true(hca_get(&H.qps_made) - qps >= 2);
    scatter_end(&p, &s);
    pair_end(&p);
}

/* Sends RDMA_COMMIT_GROUP of one piece [addr+len) on c and expects the
 * target to drop the connection with an ERROR whose text has want. */
static void expect_group_dropped(ferry_conn_t *c, uint64_t npieces, uint64_t addr, uint64_t len, const char *want)
{
    uint64_t dl = ferry_deadline_after_ms(5000);
    uint8_t d[FERRY_RDMA_COMMIT_DESC_SIZE];
    ferry_rdma_commit_desc_t desc = {addr, len, 1, 0};
    ferry_rdma_commit_desc_encode(&desc, d);
    ferry_frame_t g = {.type = FERRY_FRAME_RDMA_COMMIT_GROUP, .req_id = 1, .addr = len, .len = npieces,
                       .plen = npieces ? sizeof d : 0}, f;
    assert_int_equal(ferry_conn_send_frame(c, &g, d, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_ERROR);
    assert_int_equal(ferry_conn_fail_from_target(c, &f, dl, NULL, 0), FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains(want);
}

/* Sends a valid RDMA_CONNECT on c; the target accepts it. */
static void raw_rdma_connect(ferry_conn_t *c)
{
    uint64_t dl = ferry_deadline_after_ms(5000);
    ferry_rdma_qp_info_t qi = {.qpn = 0x999, .psn = 1, .lid = 1, .port = 1, .link_layer = FERRY_RDMA_LINK_IB,
                               .mtu = 5, .rd_atom = 1, .recv_depth = 8};
    uint8_t qb[FERRY_RDMA_QP_INFO_SIZE];
    ferry_rdma_qp_info_encode(&qi, qb);
    ferry_frame_t cf = {.type = FERRY_FRAME_RDMA_CONNECT, .plen = sizeof qb}, f;
    assert_int_equal(ferry_conn_send_frame(c, &cf, qb, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_RDMA_CONNECT_ACK);
    assert_int_equal(f.status, 0);
    assert_int_equal(ferry_conn_discard(c, f.plen, dl), 0);
}

/* Raw RDMA_COMMIT_GROUPs the target refuses by closing the connection: no
 * pieces, one before the queue pair exists, a bad descriptor, and one on
 * a connection whose protocol predates group commits. */
static void target_refuses_bad_group_commits(void **state)
{
    (void)state;
    for (int version = 3; version >= 2; version--) {
        pair_t p = pair_make_one_conn(5000, 0);
        if (version == 2) ferry_test_set_protocol_version(p.initiator, 2);
        unsigned char *dst = malloc(8192);
        uint64_t a = (uint64_t)(uintptr_t)dst;
        assert_int_equal(ferry_register(p.target, dst, 8192, FERRY_MEM_REMOTE), 0);
        ferry_session_t *s;
        assert_int_equal(ferry_session_get(p.initiator, p.peer, &s), 0);
        for (int k = 0; k < (version == 3 ? 3 : 1); k++) {
            ferry_conn_t *c;
            assert_int_equal(ferry_session_checkout(s, ferry_deadline_after_ms(5000), &c), 0);
            if (version == 2) {
                raw_rdma_connect(c);
                expect_group_dropped(c, 1, a, 64, "connection of protocol 2 (needs 3)");
            } else if (k == 0) {
                expect_group_dropped(c, 0, a, 64, "RDMA_COMMIT_GROUP of 0 pieces");
            } else if (k == 1) {
                expect_group_dropped(c, 1, a, 64, "RDMA_COMMIT_GROUP before RDMA_CONNECT");
            } else {
                raw_rdma_connect(c);
                expect_group_dropped(c, 1, a, 0, "piece 0: [0x");
            }
            ferry_session_checkin(s, c, false);
        }
        ferry_session_put(s);
        ferry_deregister(p.target, dst);
        free(dst);
        pair_end(&p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(auto_selects_rdma),
        cmocka_unit_test(peer_without_rdma_gets_tcp),
        cmocka_unit_test(writes_and_reads_of_every_size),
        cmocka_unit_test(batches_beyond_every_window),
        cmocka_unit_test(deregistration_stops_queued_writes),
        cmocka_unit_test(reregistered_region_is_stale_then_works),
        cmocka_unit_test(stalled_hca_times_out_without_late_writes),
        cmocka_unit_test(completion_wait_does_not_spin),
        cmocka_unit_test(port_failure_is_retried_on_a_new_queue_pair),
        cmocka_unit_test(target_qp_failure_falls_back_to_tcp),
        cmocka_unit_test(device_memory_moves_over_tcp_with_staging),
        cmocka_unit_test(cancel_leaves_nothing_on_the_wire),
        cmocka_unit_test(target_validates_key_queries),
        cmocka_unit_test(small_scattered_pieces_post_few_chains),
        cmocka_unit_test(adjacent_pieces_merge),
        cmocka_unit_test(error_in_the_middle_of_a_chain),
        cmocka_unit_test(cancel_mid_chain),
        cmocka_unit_test(chain_refused_part_way),
        cmocka_unit_test(group_commit_is_negotiated),
        cmocka_unit_test(group_commit_fails_pieces_one_by_one),
        cmocka_unit_test(cancel_during_group_commit),
        cmocka_unit_test(group_commit_post_refused),
        cmocka_unit_test(target_refuses_bad_group_commits),
    };
    return cmocka_run_group_tests(tests, start_hca, stop_hca);
}
#endif
