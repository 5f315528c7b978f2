/* The RDMA transport's verbs code (built when <infiniband/verbs.h> exists).
 *
 * Each TCP connection of a session gets one reliable-connected queue pair,
 * made at its first RDMA transfer; the TCP connection stays the control
 * channel for everything else.
 *
 *   setup     i->t RDMA_CONNECT (QP info) / t->i RDMA_CONNECT_ACK (QP info):
 *             both QPs go INIT -> RTR -> RTS; the target posts receive WRs.
 *             A refusal or failure moves the whole session to TCP.
 *   keys      i->t RDMA_MR_QUERY [addr, len, generation, access] / t->i
 *             RDMA_MR_INFO: the target checks the range against its registry
 *             (as for a TCP write or read), registers the region with
 *             ibv_reg_mr at first use, and answers the region and its rkey.
 *             Keys are cached per connection by (region, generation).
 *   data      RDMA WRITE / READ work requests of up to slice_size bytes,
 *             posted as chains (one ibv_post_send each) into the free part
 *             of the send queue; adjacent small pieces share a work request
 *             (scatter-gather entries for their local ranges); only every
 *             (depth / 2)-th work request and each chain's last are
 *             signalled. Completions are waited for on the completion
 *             channel (poll() on its fd, never spinning), with the
 *             request's deadline.
 *   commit    writes only: after the data completed, a zero-length RDMA
 *             WRITE WITH IMMEDIATE per piece on the same QP (chained), then
 *             i->t RDMA_COMMIT over TCP. The target waits for that immediate's receive
 *             completion (RC ordering: every earlier WRITE of the QP is then
 *             placed in its memory), checks the range is still registered
 *             with the same generation and not cancelled, and answers
 *             RDMA_COMMIT_ACK. Only then is the piece complete: Ferry's
 *             "completed means the target confirmed placement" holds as on
 *             TCP. Reads complete with their completion (the bytes are in
 *             the caller's buffer).
 *
 * Memory regions are per registry region, made lazily and kept in the
 * region (ferry_region_t.xport); deregistration calls ibv_dereg_mr under the
 * registry's write lock, so after ferry_deregister returns the HCA refuses
 * the old key and no peer write can land (the peer gets a remote access
 * error, reported as STALE_SEGMENT, then ADDRESS_NOT_REGISTERED). A region
 * the HCA cannot register (device memory without GPUDirect RDMA, a locked
 * memory limit) is remembered as such, and its pieces go inline over the
 * same TCP connection, staged through host memory where needed.
 *
 * run() returns only when every work request it posted has completed or
 * was flushed, so a cancelled batch has nothing left on the wire. */
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <arpa/inet.h>

#include "core/clock.h"
#include "core/fail.h"
#include "core/log.h"
#include "core/memkind.h"
#include "core/net.h"
#include "rdma.h"
#include "rdma_verbs.h"
#include "transport.h"

#define SEND_DEPTH 128
#define RECV_DEPTH 128
#define COMMIT_WINDOW 64
#define RKEY_CACHE_MAX 4096
/* At most this many scatter-gather entries per work request. */
#define MAX_SGE 16
/* After an abort, how long to wait for the flushed completions. */
#define FLUSH_GRACE_MS 2000

/* ------------------------------------------------------------- loading */

static const ferry_verbs_t *test_verbs;
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static ferry_verbs_t loaded;
static int loaded_ok;
static int (*compat_query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);

void ferry_rdma_test_use_verbs(const ferry_verbs_t *v) { __atomic_store_n(&test_verbs, v, __ATOMIC_RELEASE); }
int ferry_rdma_test_hooked(void) { return __atomic_load_n(&test_verbs, __ATOMIC_ACQUIRE) != NULL; }

/* The inline verbs of verbs.h go through the context's ops: no symbol. */
static int w_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    return ibv_post_send(qp, wr, bad);
}
static int w_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    return ibv_post_recv(qp, wr, bad);
}
static int w_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { return ibv_poll_cq(cq, n, wc); }
static int w_req_notify_cq(struct ibv_cq *cq, int solicited_only) { return ibv_req_notify_cq(cq, solicited_only); }
/* verbs.h's ___ibv_query_port, with the exported fallback from dlsym. */
static int w_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (!vctx) {
        memset(attr, 0, sizeof *attr);
        return compat_query_port(ctx, port, attr);
    }
    return vctx->query_port(ctx, port, attr, sizeof *attr);
}

static void *sym(void *h, const char *name)
{
    void *p = dlvsym(h, name, "IBVERBS_1.1");
    return p ? p : dlsym(h, name);
}

#define LOAD(field, name)                                                            \
    do {                                                                             \
        void *p_ = sym(h, name);                                                     \
        if (!p_) {                                                                   \
            missing = name;                                                          \
            goto fail;                                                               \
        }                                                                            \
        memcpy(&v.field, &p_, sizeof p_);                                            \
    } while (0)

static int verbs_load(const char *libname, const ferry_verbs_t **out, char *why, size_t cap)
{
    const ferry_verbs_t *t = __atomic_load_n(&test_verbs, __ATOMIC_ACQUIRE);
    if (t) {
        *out = t;
        return 0;
    }
    pthread_mutex_lock(&load_lock);
    if (loaded_ok) {
        pthread_mutex_unlock(&load_lock);
        *out = &loaded;
        return 0;
    }
    const char *missing = NULL;
    ferry_verbs_t v;
    memset(&v, 0, sizeof v);
    void *h = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, cap, "cannot load %s: %s", libname, dlerror());
        pthread_mutex_unlock(&load_lock);
        return FERRY_ERR_DEVICE_NOT_FOUND;
    }
    LOAD(get_device_list, "ibv_get_device_list");
    LOAD(free_device_list, "ibv_free_device_list");
    LOAD(get_device_name, "ibv_get_device_name");
    LOAD(get_device_guid, "ibv_get_device_guid");
    LOAD(open_device, "ibv_open_device");
    LOAD(close_device, "ibv_close_device");
    LOAD(query_device, "ibv_query_device");
    LOAD(query_gid, "ibv_query_gid");
    LOAD(alloc_pd, "ibv_alloc_pd");
    LOAD(dealloc_pd, "ibv_dealloc_pd");
    LOAD(reg_mr, "ibv_reg_mr");
    LOAD(dereg_mr, "ibv_dereg_mr");
    LOAD(create_comp_channel, "ibv_create_comp_channel");
    LOAD(destroy_comp_channel, "ibv_destroy_comp_channel");
    LOAD(create_cq, "ibv_create_cq");
    LOAD(destroy_cq, "ibv_destroy_cq");
    LOAD(get_cq_event, "ibv_get_cq_event");
    LOAD(ack_cq_events, "ibv_ack_cq_events");
    LOAD(create_qp, "ibv_create_qp");
    LOAD(destroy_qp, "ibv_destroy_qp");
    LOAD(modify_qp, "ibv_modify_qp");
    LOAD(wc_status_str, "ibv_wc_status_str");
    LOAD(query_port, "ibv_query_port");
    memcpy(&compat_query_port, &v.query_port, sizeof compat_query_port);
    v.query_port = w_query_port;
    v.post_send = w_post_send;
    v.post_recv = w_post_recv;
    v.poll_cq = w_poll_cq;
    v.req_notify_cq = w_req_notify_cq;
    loaded = v;
    loaded_ok = 1; /* libibverbs stays loaded: providers do not expect dlclose */
    pthread_mutex_unlock(&load_lock);
    *out = &loaded;
    return 0;
fail:
    snprintf(why, cap, "%s lacks %s", libname, missing);
    dlclose(h);
    pthread_mutex_unlock(&load_lock);
    return FERRY_ERR_DEVICE_NOT_FOUND;
}

/* -------------------------------------------------------------- device */

struct rdma_dev {
    const ferry_verbs_t *v;
    ferry_engine_t *engine;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_port_attr pattr;
    uint8_t port, link, rd_atom;
    int gid_index;
    union ibv_gid gid;
    uint64_t guid;
    int send_depth, recv_depth, cq_depth;
    int max_sge, max_sge_rd; /* scatter-gather entries per send work request; per RDMA READ */
    char name[64];
    pthread_mutex_t mr_lock; /* guards ferry_region_t.xport while the registry is read-locked */
};

/* ferry_region_t.xport of a region the HCA could not register. */
static char mr_failed;

static void release_mr(void *ctx, ferry_region_t *reg)
{
    struct rdma_dev *d = ctx;
    if (reg->xport && reg->xport != &mr_failed) {
        int rc = d->v->dereg_mr(reg->xport);
        if (rc)
            FERRY_LOG(FERRY_LOG_ERROR, "rdma", "ibv_dereg_mr of [0x%llx+%llu): %s", (unsigned long long)reg->addr,
                      (unsigned long long)reg->len, strerror(rc));
    }
    reg->xport = NULL;
}

static int min_int(int a, int b) { return a < b ? a : b; }

int ferry_rdma_dev_open(ferry_engine_t *e, const ferry_rdma_env_t *env, void **out, char *why, size_t cap)
{
    const ferry_verbs_t *v;
    int rc = verbs_load(env->libname, &v, why, cap);
    if (rc) return rc;
    int n = 0;
    struct ibv_device **list = v->get_device_list(&n);
    if (!list) { /* ENOSYS: the kernel has no RDMA support at all */
        snprintf(why, cap, "libibverbs found no RDMA device (ibv_get_device_list: %s)", strerror(errno));
        return FERRY_ERR_DEVICE_NOT_FOUND;
    }
    if (n == 0) {
        v->free_device_list(list);
        snprintf(why, cap, "libibverbs found no RDMA device");
        return FERRY_ERR_DEVICE_NOT_FOUND;
    }
    struct rdma_dev *d = calloc(1, sizeof *d);
    if (!d) {
        v->free_device_list(list);
        snprintf(why, cap, "RDMA device context: out of memory");
        return FERRY_ERR_MEMORY;
    }
    d->v = v;
    d->engine = e;
    d->port = (uint8_t)env->port;
    char seen[128] = "";
    for (int i = 0; i < n && !d->ctx; i++) {
        const char *name = v->get_device_name(list[i]);
        size_t used = strlen(seen);
        snprintf(seen + used, sizeof seen - used, "%s%s", used ? "," : "", name ? name : "?");
        if (env->device[0] && (!name || strcmp(name, env->device) != 0)) continue;
        struct ibv_context *ctx = v->open_device(list[i]);
        if (!ctx) continue;
        if (v->query_port(ctx, d->port, &d->pattr) != 0 || d->pattr.state != IBV_PORT_ACTIVE) {
            v->close_device(ctx);
            continue;
        }
        d->ctx = ctx;
        d->guid = be64toh(v->get_device_guid(list[i]));
        snprintf(d->name, sizeof d->name, "%s", name ? name : "?");
    }
    v->free_device_list(list);
    if (!d->ctx) {
        if (env->device[0])
            snprintf(why, cap, "FERRY_RDMA_DEVICE=%s has no active port %d (devices: %s)", env->device, d->port, seen);
        else
            snprintf(why, cap, "no RDMA device has port %d active (devices: %s)", d->port, seen);
        free(d);
        return FERRY_ERR_DEVICE_NOT_FOUND;
    }
    struct ibv_device_attr da;
    memset(&da, 0, sizeof da);
    if (v->query_device(d->ctx, &da) != 0) {
        snprintf(why, cap, "ibv_query_device(%s) failed", d->name);
        goto fail;
    }
    d->link = d->pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? FERRY_RDMA_LINK_ETH : FERRY_RDMA_LINK_IB;
    if (d->link == FERRY_RDMA_LINK_IB && (d->pattr.lid == 0 || d->pattr.lid >= 0xc000)) {
        snprintf(why, cap, "InfiniBand %s port %d has no LID (is a subnet manager running?)", d->name, d->port);
        goto fail;
    }
    d->gid_index = env->gid_index;
    if (d->gid_index < 0) {
        char gwhy[128];
        d->gid_index = d->link == FERRY_RDMA_LINK_ETH ? ferry_rdma_pick_gid(env->sysfs_ib, d->name, d->port, gwhy,
                                                                             sizeof gwhy)
                                                      : 0;
        if (d->gid_index < 0) {
            snprintf(why, cap, "RoCE %s: %s; set FERRY_RDMA_GID_INDEX", d->name, gwhy);
            goto fail;
        }
    }
    memset(&d->gid, 0, sizeof d->gid);
    if (v->query_gid(d->ctx, d->port, d->gid_index, &d->gid) != 0 && d->link == FERRY_RDMA_LINK_ETH) {
        snprintf(why, cap, "ibv_query_gid(%s, port %d, index %d) failed", d->name, d->port, d->gid_index);
        goto fail;
    }
    static const uint8_t zero[16];
    if (d->link == FERRY_RDMA_LINK_ETH && memcmp(d->gid.raw, zero, 16) == 0) {
        snprintf(why, cap, "GID %d of RoCE %s port %d is empty; set FERRY_RDMA_GID_INDEX", d->gid_index, d->name,
                 d->port);
        goto fail;
    }
    d->pd = v->alloc_pd(d->ctx);
    if (!d->pd) {
        snprintf(why, cap, "ibv_alloc_pd(%s) failed: %s", d->name, strerror(errno));
        goto fail;
    }
    d->send_depth = min_int(SEND_DEPTH, da.max_qp_wr > 0 ? da.max_qp_wr : SEND_DEPTH);
    d->recv_depth = min_int(RECV_DEPTH, da.max_qp_wr > 0 ? da.max_qp_wr : RECV_DEPTH);
    d->cq_depth = d->send_depth + d->recv_depth;
    if (da.max_cqe > 0 && d->cq_depth > da.max_cqe) {
        d->send_depth = d->recv_depth = da.max_cqe / 2;
        d->cq_depth = da.max_cqe;
    }
    if (d->send_depth < 2) {
        snprintf(why, cap, "%s allows only %d work requests per queue", d->name, d->send_depth);
        goto fail;
    }
    int rd = min_int(16, min_int(da.max_qp_rd_atom > 0 ? da.max_qp_rd_atom : 1,
                                 da.max_qp_init_rd_atom > 0 ? da.max_qp_init_rd_atom : 1));
    d->rd_atom = (uint8_t)(rd < 1 ? 1 : rd);
    d->max_sge = min_int(MAX_SGE, da.max_sge > 0 ? da.max_sge : 1);
    d->max_sge_rd = min_int(d->max_sge, da.max_sge_rd > 0 ? da.max_sge_rd : 1); /* 0: unknown, be safe */
    pthread_mutex_init(&d->mr_lock, NULL);
    ferry_registry_set_release(&e->registry, release_mr, d);
    if (d->link == FERRY_RDMA_LINK_IB)
        snprintf(why, cap, "%s port %d (InfiniBand, lid %u)", d->name, d->port, d->pattr.lid);
    else
        snprintf(why, cap, "%s port %d (RoCE, GID index %d)", d->name, d->port, d->gid_index);
    *out = d;
    return 0;
fail:
    if (d->pd) v->dealloc_pd(d->pd);
    v->close_device(d->ctx);
    free(d);
    return FERRY_ERR_DEVICE_NOT_FOUND;
}

void ferry_rdma_dev_close(ferry_engine_t *e, void *dev)
{
    struct rdma_dev *d = dev;
    /* Every memory region goes before the protection domain. */
    ferry_registry_release_all(&e->registry);
    if (d->pd) d->v->dealloc_pd(d->pd);
    d->v->close_device(d->ctx);
    pthread_mutex_destroy(&d->mr_lock);
    free(d);
}

/* With the registry read-locked: the region's memory region, registered at
 * first use. NOT_IMPLEMENTED when the HCA cannot register it (the caller
 * moves the piece to TCP). */
static int region_mr(struct rdma_dev *d, ferry_region_t *reg, struct ibv_mr **out)
{
    pthread_mutex_lock(&d->mr_lock);
    int rc = 0;
    if (!reg->xport) {
        int access = IBV_ACCESS_LOCAL_WRITE;
        if (reg->flags & FERRY_MEM_REMOTE_READ) access |= IBV_ACCESS_REMOTE_READ;
        if (reg->flags & FERRY_MEM_REMOTE_WRITE) access |= IBV_ACCESS_REMOTE_WRITE;
        errno = 0;
        struct ibv_mr *mr = d->v->reg_mr(d->pd, (void *)(uintptr_t)reg->addr, reg->len, access);
        int err = errno;
        reg->xport = mr ? (void *)mr : (void *)&mr_failed;
        if (!mr) {
            char kind[32];
            FERRY_LOG(FERRY_LOG_WARN, "rdma",
                      "ibv_reg_mr of %s memory [0x%llx+%llu) on %s failed (%s); that region moves over TCP%s",
                      ferry_memkind_name(reg->kind, kind, sizeof kind), (unsigned long long)reg->addr,
                      (unsigned long long)reg->len, d->name, strerror(err),
                      reg->kind ? " with host staging (GPUDirect RDMA unavailable?)"
                                : err == ENOMEM ? " (locked-memory limit? see ulimit -l)" : "");
        }
    }
    if (reg->xport == &mr_failed) {
        char kind[32];
        rc = ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "%s memory [0x%llx+%llu) cannot be registered with %s",
                        ferry_memkind_name(reg->kind, kind, sizeof kind), (unsigned long long)reg->addr,
                        (unsigned long long)reg->len, d->name);
    } else {
        *out = reg->xport;
    }
    pthread_mutex_unlock(&d->mr_lock);
    return rc;
}

/* ----------------------------------------------------------- endpoint */

struct rkey_ent {
    uint64_t addr, len;
    uint32_t generation, rkey;
};

struct rdma_ep {
    struct rdma_dev *d;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    bool armed;
    unsigned events; /* CQ events got and not yet acknowledged */
    uint32_t psn;
    uint32_t commit_seq; /* the next immediate, counted on both sides */
    ferry_rdma_qp_info_t peer;
    struct rkey_ent *rkeys; /* initiator: sorted by addr */
    size_t nrkeys;
};

static void ep_destroy(struct rdma_ep *ep)
{
    const ferry_verbs_t *v = ep->d->v;
    if (ep->qp) v->destroy_qp(ep->qp);
    if (ep->cq) {
        if (ep->events) v->ack_cq_events(ep->cq, ep->events);
        v->destroy_cq(ep->cq);
    }
    if (ep->ch) v->destroy_comp_channel(ep->ch);
    free(ep->rkeys);
    free(ep);
}

/* ferry_conn_t.xport_free of a connection with a queue pair. */
static void conn_free_ep(void *ep)
{
    if (ep) ep_destroy(ep);
}

static int verbs_fail(int code, const char *what, struct rdma_dev *d, int err)
{
    return ferry_fail(code, "%s on %s failed: %s", what, d->name, strerror(err ? err : EIO));
}

static int ep_create(struct rdma_dev *d, struct rdma_ep **out)
{
    const ferry_verbs_t *v = d->v;
    struct rdma_ep *ep = calloc(1, sizeof *ep);
    if (!ep) return ferry_fail(FERRY_ERR_MEMORY, "RDMA endpoint: out of memory");
    ep->d = d;
    int rc = 0;
    ep->ch = v->create_comp_channel(d->ctx);
    if (!ep->ch) rc = verbs_fail(FERRY_ERR_MEMORY, "ibv_create_comp_channel", d, errno);
    if (rc == 0 && !(ep->cq = v->create_cq(d->ctx, d->cq_depth, ep, ep->ch, 0)))
        rc = verbs_fail(FERRY_ERR_MEMORY, "ibv_create_cq", d, errno);
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
        if (!(ep->qp = v->create_qp(d->pd, &ia))) rc = verbs_fail(FERRY_ERR_MEMORY, "ibv_create_qp", d, errno);
    }
    if (rc == 0) {
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = d->port;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
        int err = v->modify_qp(ep->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        if (err) rc = verbs_fail(FERRY_ERR_INTERNAL, "ibv_modify_qp(INIT)", d, err);
    }
    if (rc) {
        ep_destroy(ep);
        return rc;
    }
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint32_t)ferry_now_ns();
    ep->psn = r & 0xffffff;
    *out = ep;
    return 0;
}

static void ep_info(const struct rdma_ep *ep, ferry_rdma_qp_info_t *q)
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
static int ep_connect(struct rdma_ep *ep, const ferry_rdma_qp_info_t *peer)
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
    if (err) return verbs_fail(FERRY_ERR_ENDPOINT, "ibv_modify_qp(RTR)", d, err);
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
    if (err) return verbs_fail(FERRY_ERR_ENDPOINT, "ibv_modify_qp(RTS)", d, err);
    return 0;
}

/* Waits for up to max completions: polls, and when the CQ is empty arms it
 * and sleeps in poll() on the channel's fd until an event or the deadline.
 * Returns the count (> 0) or a negative code. */
static int ep_wait(struct rdma_ep *ep, struct ibv_wc *wc, int max, uint64_t deadline)
{
    const ferry_verbs_t *v = ep->d->v;
    for (;;) {
        int n = v->poll_cq(ep->cq, max, wc);
        if (n < 0) return ferry_fail(FERRY_ERR_INTERNAL, "ibv_poll_cq on %s failed (%d)", ep->d->name, n);
        if (n > 0) return n;
        if (!ep->armed) {
            int err = v->req_notify_cq(ep->cq, 0);
            if (err) return verbs_fail(FERRY_ERR_INTERNAL, "ibv_req_notify_cq", ep->d, err);
            ep->armed = true;
            continue; /* a completion may have come before the arming */
        }
        struct pollfd p = {.fd = ep->ch->fd, .events = POLLIN};
        int ms = ferry_ms_left(deadline);
        if (ms == 0) return ferry_fail(FERRY_ERR_TIMEOUT, "no RDMA completion on %s before the deadline", ep->d->name);
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ferry_fail(FERRY_ERR_INTERNAL, "poll on the completion channel: %s", strerror(errno));
        if (r == 0) continue; /* the deadline check above ends it */
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

static const struct rkey_ent *rkey_find(const struct rdma_ep *ep, uint64_t addr, uint64_t len, uint32_t gen)
{
    long i = rkey_index(ep, addr);
    if (i < 0) return NULL;
    const struct rkey_ent *k = &ep->rkeys[i];
    if (addr + len > k->addr + k->len || (gen && k->generation != gen)) return NULL;
    return k;
}

static int rkey_put(struct rdma_ep *ep, const ferry_rdma_mr_info_t *m)
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

/* ----------------------------------------------------------- initiator */

/* A failure kept while cleanup may record others; re-raised at the end. */
struct first_err {
    int rc;
    char detail[1024];
};

static void keep_err(struct first_err *fe, int rc)
{
    if (fe->rc || rc == 0) return;
    fe->rc = rc;
    snprintf(fe->detail, sizeof fe->detail, "%s", ferry_fail_message());
}

static int raise_err(const struct first_err *fe) { return ferry_fail(fe->rc, "%s", fe->detail); }

/* The session leaves RDMA for TCP, for the reason given. */
static void fall_back(ferry_conn_t *c, const char *why)
{
    ferry_session_t *s = c->session;
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    if (s->transport == &ferry_transport_rdma) {
        s->transport = &ferry_transport_tcp;
        /* The outcome first: the reason is cut to the field's size. */
        snprintf(s->transport_reason, sizeof s->transport_reason, "rdma setup failed, fell back to tcp: %s", why);
    }
    pthread_mutex_unlock(&s->lock);
    FERRY_LOG(FERRY_LOG_WARN, "rdma", "%s: RDMA setup failed, using TCP: %s", s->name, why);
}

/* Sets up this connection's QP with the target. 0; 1 when the target or
 * the fabric refused (why set: fall back to TCP); negative when the
 * connection itself failed. */
static int connect_initiator(ferry_conn_t *c, struct rdma_dev *d, uint64_t deadline, char *why, size_t cap)
{
    struct rdma_ep *ep;
    int rc = ep_create(d, &ep);
    if (rc) {
        snprintf(why, cap, "%s", ferry_fail_message());
        return 1;
    }
    ferry_rdma_qp_info_t mine, theirs;
    ep_info(ep, &mine);
    uint8_t buf[FERRY_RDMA_QP_INFO_SIZE];
    ferry_rdma_qp_info_encode(&mine, buf);
    ferry_frame_t f = {.type = FERRY_FRAME_RDMA_CONNECT, .plen = sizeof buf};
    rc = ferry_conn_send_frame(c, &f, buf, deadline);
    if (rc == 0) rc = ferry_conn_recv_frame(c, &f, deadline);
    if (rc == 0 && f.type != FERRY_FRAME_RDMA_CONNECT_ACK)
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected RDMA_CONNECT_ACK, got %s", ferry_frame_type_name(f.type));
    if (rc == 0 && f.status < 0) {
        rc = ferry_rdma_read_refusal(c, &f, "an RDMA connection", deadline);
        ep_destroy(ep);
        if (rc != f.status) return rc; /* the text did not arrive: the connection is gone */
        snprintf(why, cap, "%s", ferry_fail_message());
        return 1;
    }
    if (rc == 0 && f.plen != sizeof buf)
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_CONNECT_ACK carries %u bytes", f.plen);
    if (rc == 0) rc = ferry_net_recv(c->fd, buf, sizeof buf, deadline);
    if (rc) {
        ep_destroy(ep);
        return rc;
    }
    if (ferry_rdma_qp_info_decode(buf, sizeof buf, &theirs) != 0 || ep_connect(ep, &theirs) != 0) {
        snprintf(why, cap, "%s", ferry_fail_message());
        ep_destroy(ep);
        return 1;
    }
    c->xport = ep;
    c->xport_free = conn_free_ep;
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

enum plan_mode { PLAN_RDMA = 0, PLAN_TCP, PLAN_SKIP };

struct plan {
    uint8_t mode;
    uint32_t lkey, rkey;
    uint64_t start;     /* ->done when this run began */
    uint64_t completed; /* bytes from start whose work requests completed */
};

/* One send work request of the data phase: the pieces first..last it
 * covers, from offset off of the first, n bytes in all. Pieces after the
 * first are covered whole. */
struct slot {
    size_t first, last;
    uint64_t off, n;
};

static int wc_failure(const ferry_verbs_t *v, const struct ibv_wc *wc, const ferry_xfer_t *x, uint64_t off,
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
    ferry_registry_t *r = &c->engine->registry;
    for (size_t i = 0; i < nx; i++) {
        ferry_xfer_t *x = &xs[i];
        pl[i] = (struct plan){.mode = PLAN_SKIP, .start = x->done};
        if (x->rc || x->done >= x->len) continue;
        pl[i].mode = PLAN_RDMA;
        ferry_registry_read_lock(r);
        ferry_region_t *reg = ferry_registry_lookup_locked(r, (uint64_t)(uintptr_t)x->local, x->len);
        struct ibv_mr *mr = NULL;
        int rc = reg ? region_mr(ep->d, reg, &mr)
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
        const struct rkey_ent *k = rkey_find(ep, x->remote, x->len, x->generation);
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
            if ((rc = rkey_put(ep, &m)) != 0) return rc;
            pl[i].rkey = m.rkey;
        } else {
            pl[i].rkey = k->rkey;
        }
    }
    return 0;
}

/* Moves the QP to the error state: the HCA then flushes every outstanding
 * work request, each with a completion. */
static void ep_set_error(struct rdma_ep *ep)
{
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_ERR;
    ep->d->v->modify_qp(ep->qp, &a, IBV_QP_STATE);
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* After ep_set_error: a zero-length signalled work request, flushed at
 * once, whose completion comes after every earlier one's. Needed when the
 * last work request the HCA accepted was unsignalled (a chain refused part
 * way): done before the error, it would never complete visibly. */
static int post_marker(struct rdma_ep *ep, uint64_t wr_id)
{
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    return ep->d->v->post_send(ep->qp, &wr, &bad);
}

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
    uint64_t slice = c->engine->cfg.slice_size;
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
                keep_err(&post_fe, ferry_fail(FERRY_ERR_INTERNAL, "ibv_post_send of a chain of %u work requests "
                                              "(%u accepted) to %s on %s failed: %s", built, posted, c->peer.name,
                                              ep->d->name, strerror(err)));
                failed = true;
                unsignalled_tail = posted > 0 && !(m.wrs[posted - 1].send_flags & IBV_SEND_SIGNALED);
            }
            count += posted;
        }
        if (failed && !qp_error && count > 0) {
            ep_set_error(ep);
            qp_error = true;
            grace = ferry_deadline_after_ms(FLUSH_GRACE_MS);
            if (unsignalled_tail) { /* a free slot is left: the chain was refused part way */
                unsigned idx = (head + count) % window, prev = (head + count - 1) % window;
                m.ring[idx] = (struct slot){m.ring[prev].last, m.ring[prev].last, 0, 0};
                if (post_marker(ep, idx) == 0) count++;
            }
        }
        if (count == 0) break;
        struct ibv_wc wc[16];
        int got = ep_wait(ep, wc, 16, qp_error ? grace : xs[m.ring[head].first].deadline);
        if (got < 0) {
            keep_err(fe, got); /* TIMEOUT first; after an abort, the flush timed out */
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
                keep_err(fe, ferry_fail(FERRY_ERR_INTERNAL, "RDMA completion for slot %llu, %u outstanding from %u",
                                        (unsigned long long)wc[k].wr_id, count, head));
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
                keep_err(&flush_fe, wc_failure(v, &wc[k], x, s.off, s.n, c->peer.name));
            } else {
                int prc = wc_failure(v, &wc[k], x, s.off, s.n, c->peer.name);
                /* A fault of these pieces' memory fails them; a fault of
                 * the path leaves them pending, for a retry on a new QP. */
                if (prc == FERRY_ERR_STALE_SEGMENT || prc == FERRY_ERR_ADDRESS_NOT_REGISTERED)
                    for (size_t p = s.first; p <= s.last; p++)
                        if (xs[p].rc == 0) ferry_xfer_fail(&xs[p], prc);
                keep_err(fe, prc);
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

/* Moves the QP to the error state and waits for the completion of work
 * request last_id (every one before it is then done or flushed), so that
 * none is left running. When last_id was not signalled, a marker's. */
static void ep_abort_until(struct rdma_ep *ep, uint64_t last_id, bool signalled)
{
    ep_set_error(ep);
    if (!signalled) {
        last_id = UINT64_MAX;
        if (post_marker(ep, last_id) != 0) {
            FERRY_LOG(FERRY_LOG_ERROR, "rdma", "%s: no marker after the abort; the error state flushes the rest",
                      ep->d->name);
            return;
        }
    }
    uint64_t grace = ferry_deadline_after_ms(FLUSH_GRACE_MS);
    struct ibv_wc wc[16];
    for (;;) {
        int n = ep_wait(ep, wc, 16, grace);
        if (n <= 0) {
            FERRY_LOG(FERRY_LOG_ERROR, "rdma", "%s: work requests not flushed after the abort", ep->d->name);
            return;
        }
        for (int k = 0; k < n; k++)
            if (wc[k].wr_id == last_id) return;
    }
}

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
static int commit_writes(ferry_conn_t *c, struct rdma_ep *ep, ferry_xfer_t *xs, size_t nx, struct plan *pl,
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
            keep_err(fe, rc);
            *broken = 1;
            if (posted) ep_abort_until(ep, posted - 1, posted == nb);
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
                keep_err(fe, rc);
                *broken = 1;
                ep_abort_until(ep, nb - 1, true);
                return fe->rc;
            }
            x->done = pl[batch[k]].start + pl[batch[k]].completed;
            if (x->progress) atomic_fetch_add(x->progress, pl[batch[k]].completed);
        }
        /* The chain's completion: its signalled end, or errors and flushes
         * up to it. */
        for (bool ended = false; !ended;) {
            struct ibv_wc wc[16];
            int got = ep_wait(ep, wc, 16, xs[batch[nb - 1]].deadline);
            if (got < 0) {
                keep_err(fe, got);
                *broken = 1;
                ep_abort_until(ep, nb - 1, true);
                return fe->rc;
            }
            for (int k = 0; k < got; k++) {
                if (wc[k].status != IBV_WC_SUCCESS) {
                    /* The target confirmed placement already; the QP is
                     * broken for what follows. */
                    size_t at = wc[k].wr_id < nb ? batch[wc[k].wr_id] : batch[nb - 1];
                    keep_err(fe, wc_failure(ep->d->v, &wc[k], &xs[at], 0, 0, c->peer.name));
                    *broken = 1;
                }
                if (wc[k].wr_id == nb - 1) ended = true;
            }
        }
        if (*broken) {
            ep_set_error(ep);
            return fe->rc;
        }
    }
    return 0;
}

int ferry_rdma_verbs_run(ferry_conn_t *c, void *dev, ferry_xfer_t *xs, size_t nx, int *broken)
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
        if (rc == 1) {
            fall_back(c, why);
            return ferry_transport_tcp.run(c, xs, nx, broken);
        }
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
    if (rc == 0) rc = commit_writes(c, ep, xs, nx, pl, &fe, broken);
    /* Pieces the HCA cannot reach go inline over this TCP connection. */
    for (size_t i = 0; rc == 0 && i < nx; i++) {
        if (pl[i].mode != PLAN_TCP || xs[i].rc || xs[i].done >= xs[i].len) continue;
        rc = ferry_transport_tcp.run(c, &xs[i], 1, broken);
        if (rc) keep_err(&fe, rc);
    }
    free(pl);
    bool pending = false;
    for (size_t i = 0; i < nx; i++) {
        ferry_xfer_t *x = &xs[i];
        if (x->rc || x->done >= x->len) continue;
        if (*broken) {
            pending = true;
        } else {
            ferry_xfer_fail(x, ferry_fail(FERRY_ERR_CANCELLED, "cancelled after %llu of %llu bytes",
                                          (unsigned long long)x->done, (unsigned long long)x->len));
        }
    }
    if (fe.rc && pending) {
        /* Pieces untouched by the failure are retried on a fresh
         * connection: say why this one ended. */
        int code = fe.rc == FERRY_ERR_TIMEOUT || fe.rc == FERRY_ERR_MEMORY ? fe.rc : FERRY_ERR_PEER_CLOSED;
        return ferry_fail(code, "the RDMA queue pair to %s failed: %s", c->peer.name, fe.detail);
    }
    if (fe.rc) raise_err(&fe);
    return 0;
}

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
    status = ep_create(d, &ep);
    if (status == 0) {
        /* Zero-length receives for the commits' immediates. */
        for (int i = 0; status == 0 && i < d->recv_depth; i++) {
            struct ibv_recv_wr wr, *bad = NULL;
            memset(&wr, 0, sizeof wr);
            wr.wr_id = (uint64_t)i;
            int err = d->v->post_recv(ep->qp, &wr, &bad);
            if (err) status = verbs_fail(FERRY_ERR_MEMORY, "ibv_post_recv", d, err);
        }
        if (status == 0) status = ep_connect(ep, &theirs);
        if (status) ep_destroy(ep);
    }
    if (status) return ferry_rdma_reply(c, FERRY_FRAME_RDMA_CONNECT_ACK, f, status, NULL, 0, 0, deadline);
    c->xport = ep;
    c->xport_free = conn_free_ep;
    ep_info(ep, &mine);
    ferry_rdma_qp_info_encode(&mine, buf);
    return ferry_rdma_reply(c, FERRY_FRAME_RDMA_CONNECT_ACK, f, 0, buf, sizeof buf, 0, deadline);
}

static int serve_mr_query(ferry_conn_t *c, struct rdma_dev *d, const ferry_frame_t *f, uint64_t deadline)
{
    uint32_t need = (uint32_t)(f->aux >> 32), generation = (uint32_t)f->aux;
    if (need != FERRY_MEM_REMOTE_READ && need != FERRY_MEM_REMOTE_WRITE)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_MR_QUERY asks for access 0x%x", need);
    ferry_registry_t *r = &c->engine->registry;
    ferry_rdma_mr_info_t m = {0};
    ferry_registry_read_lock(r);
    int status = ferry_registry_check_locked(r, f->addr, f->len, need, generation, "target");
    if (status == 0) {
        ferry_region_t *reg = ferry_registry_lookup_locked(r, f->addr, f->len);
        struct ibv_mr *mr = NULL;
        status = region_mr(d, reg, &mr);
        if (status == 0) m = (ferry_rdma_mr_info_t){reg->addr, reg->len, mr->rkey, reg->generation, reg->flags};
    }
    ferry_registry_unlock(r);
    if (status) return ferry_rdma_reply(c, FERRY_FRAME_RDMA_MR_INFO, f, status, NULL, 0, 0, deadline);
    uint8_t buf[FERRY_RDMA_MR_INFO_SIZE];
    ferry_rdma_mr_info_encode(&m, buf);
    return ferry_rdma_reply(c, FERRY_FRAME_RDMA_MR_INFO, f, 0, buf, sizeof buf, f->len, deadline);
}

/* Waits for the commit's immediate (all earlier writes of the QP are then
 * placed), re-posts its receive, checks the range, answers. */
static int serve_commit(ferry_conn_t *c, struct rdma_dev *d, const ferry_frame_t *f, uint64_t deadline)
{
    struct rdma_ep *ep = c->xport;
    if (!ep) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT before RDMA_CONNECT");
    if (f->len == 0) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "RDMA_COMMIT of 0 bytes");
    struct ibv_wc wc;
    int n = ep_wait(ep, &wc, 1, deadline);
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
    if (err) return verbs_fail(FERRY_ERR_INTERNAL, "ibv_post_recv", d, err);
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

int ferry_rdma_verbs_serve(ferry_conn_t *c, void *dev, const ferry_frame_t *f)
{
    uint64_t deadline = ferry_deadline_after_ms(c->engine->cfg.timeout_ms);
    switch (f->type) {
    case FERRY_FRAME_RDMA_CONNECT: return serve_connect(c, dev, f, deadline);
    case FERRY_FRAME_RDMA_MR_QUERY: return serve_mr_query(c, dev, f, deadline);
    case FERRY_FRAME_RDMA_COMMIT: return serve_commit(c, dev, f, deadline);
    default:
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "unexpected %s frame", ferry_frame_type_name(f->type));
    }
}
