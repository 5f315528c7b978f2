/* SPDX-License-Identifier: Apache-2.0 */
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
 *             WRITE WITH IMMEDIATE per group of up to 1,024 pieces, then
 *             i->t RDMA_COMMIT_GROUP over TCP (protocol 3, rdma_wire.h; an
 *             older peer: one immediate and RDMA_COMMIT per piece, the
 *             immediates chained). The target waits for that immediate's receive
 *             completion (RC ordering: every earlier WRITE of the QP is then
 *             placed in its memory), checks the range is still registered
 *             with the same generation and not cancelled, and answers
 *             with each piece's status. Only then is the piece complete: Ferry's
 *             "completed means the target confirmed placement" holds as on
 *             TCP. Reads complete with their completion (the bytes are in
 *             the caller's buffer).
 *
 * Memory regions are per registry region, made lazily and kept in the
 * region (the transport's slot of ferry_region_t, released by its hook,
 * registry.h); deregistration calls ibv_dereg_mr under the
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"
#include "util/log.h"
#include "util/memkind.h"
#include "rdma_int.h"

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

/* The slot state of a region the HCA could not register. */
static char mr_failed;

/* The slot's release hook (registry.h), under the registry's write lock. */
static void release_mr(void *ctx, const ferry_region_t *reg, void *state)
{
    struct rdma_dev *d = ctx;
    if (state != &mr_failed) {
        int rc = d->v->dereg_mr(state);
        if (rc)
            FERRY_LOG(FERRY_LOG_ERROR, "rdma", "ibv_dereg_mr of [0x%llx+%llu): %s", (unsigned long long)reg->addr,
                      (unsigned long long)reg->len, strerror(rc));
    }
}

static int min_int(int a, int b) { return a < b ? a : b; }

int ferry_rdma_dev_open(ferry_xport_ctx_t *xctx, const ferry_rdma_env_t *env, void **out, char *why, size_t cap)
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
    d->xctx = xctx;
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
    d->slot = ferry_transport_region_slot(&ferry_transport_rdma);
    ferry_registry_set_hook(xctx->registry, d->slot, &(ferry_region_hook_t){.release = release_mr, .ctx = d});
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

void ferry_rdma_dev_close(ferry_xport_ctx_t *xctx, void *dev)
{
    struct rdma_dev *d = dev;
    /* Every memory region goes before the protection domain. */
    ferry_registry_release_slot(xctx->registry, d->slot);
    if (d->pd) d->v->dealloc_pd(d->pd);
    d->v->close_device(d->ctx);
    pthread_mutex_destroy(&d->mr_lock);
    free(d);
}

/* With the registry read-locked: the region's memory region, registered at
 * first use. NOT_IMPLEMENTED when the HCA cannot register it (the caller
 * moves the piece to TCP). */
int ferry_rdma_region_mr(struct rdma_dev *d, ferry_region_t *reg, struct ibv_mr **out)
{
    pthread_mutex_lock(&d->mr_lock);
    int rc = 0;
    void **slot = &reg->slot[d->slot];
    if (!*slot) {
        int access = IBV_ACCESS_LOCAL_WRITE;
        if (reg->flags & FERRY_MEM_REMOTE_READ) access |= IBV_ACCESS_REMOTE_READ;
        if (reg->flags & FERRY_MEM_REMOTE_WRITE) access |= IBV_ACCESS_REMOTE_WRITE;
        errno = 0;
        struct ibv_mr *mr = d->v->reg_mr(d->pd, (void *)(uintptr_t)reg->addr, reg->len, access);
        int err = errno;
        *slot = mr ? (void *)mr : (void *)&mr_failed;
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
    if (*slot == &mr_failed) {
        char kind[32];
        rc = ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "%s memory [0x%llx+%llu) cannot be registered with %s",
                        ferry_memkind_name(reg->kind, kind, sizeof kind), (unsigned long long)reg->addr,
                        (unsigned long long)reg->len, d->name);
    } else {
        *out = *slot;
    }
    pthread_mutex_unlock(&d->mr_lock);
    return rc;
}
