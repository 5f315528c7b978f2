/* SPDX-License-Identifier: Apache-2.0 */
/* What the parts of the RDMA transport's verbs code share (built when
 * <infiniband/verbs.h> is found; see rdma_verbs.c for the protocol):
 *
 *   rdma_verbs.c         loading libibverbs, the device, memory regions
 *   rdma_ep.c      queue pairs (endpoints), completions, the key cache
 *   rdma_run.c     the initiator: set-up, key queries, the data phase
 *   rdma_commit.c  the commit protocol, both sides
 *   rdma_serve.c   the target: set-up and key queries
 *
 * Not a public header. */
#ifndef FERRY_RDMA_INT_H
#define FERRY_RDMA_INT_H

#include <pthread.h>
#include <stdbool.h>

#include "rdma.h"
#include "rdma_verbs.h"
#include "link/transport.h"
#include "rdma_wire.h"

#define SEND_DEPTH 128
#define RECV_DEPTH 128
#define COMMIT_WINDOW 64
#define RKEY_CACHE_MAX 4096
/* At most this many scatter-gather entries per work request. */
#define MAX_SGE 16
/* After an abort, how long to wait for the flushed completions. */
#define FLUSH_GRACE_MS 2000

struct rdma_dev {
    const ferry_verbs_t *v;
    ferry_xport_ctx_t *xctx;   /* the engine's transport context (xport.h) */
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
    unsigned slot;           /* the transport's per-region slot (ferry_region_t.slot) */
    pthread_mutex_t mr_lock; /* guards that slot while the registry is read-locked */
};

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
    struct ferry_rdma_group *group; /* group commit buffers, either side, made at first use */
    int peer_fd;                    /* target: its control connection, watched while waiting; -1 */
};

/* A failure kept while cleanup may record others; re-raised at the end. */
struct first_err {
    int rc;
    char detail[1024];
};

enum plan_mode { PLAN_RDMA = 0, PLAN_TCP, PLAN_SKIP };

struct plan {
    uint8_t mode;
    uint32_t lkey, rkey;
    uint64_t start;     /* ->done when this run began */
    uint64_t completed; /* bytes from start whose work requests completed */
};

/* rdma_verbs.c */
int ferry_rdma_region_mr(struct rdma_dev *d, ferry_region_t *reg, struct ibv_mr **out);

/* rdma_ep.c */
int ferry_rdma_verbs_fail(int code, const char *what, struct rdma_dev *d, int err);
int ferry_rdma_ep_create(struct rdma_dev *d, struct rdma_ep **out);
void ferry_rdma_ep_destroy(struct rdma_ep *ep);
/* ferry_conn_t.xport_free of a connection with a queue pair. */
void ferry_rdma_conn_free_ep(void *ep);
void ferry_rdma_ep_info(const struct rdma_ep *ep, ferry_rdma_qp_info_t *q);
int ferry_rdma_ep_connect(struct rdma_ep *ep, const ferry_rdma_qp_info_t *peer);
int ferry_rdma_ep_wait(struct rdma_ep *ep, struct ibv_wc *wc, int max, uint64_t deadline);
void ferry_rdma_ep_set_error(struct rdma_ep *ep);
int ferry_rdma_post_marker(struct rdma_ep *ep, uint64_t wr_id);
void ferry_rdma_ep_abort_until(struct rdma_ep *ep, uint64_t last_id, bool signalled);
const struct rkey_ent *ferry_rdma_rkey_find(const struct rdma_ep *ep, uint64_t addr, uint64_t len, uint32_t gen);
int ferry_rdma_rkey_put(struct rdma_ep *ep, const ferry_rdma_mr_info_t *m);

/* rdma_run.c */
void ferry_rdma_keep_err(struct first_err *fe, int rc);
int ferry_rdma_wc_failure(const ferry_verbs_t *v, const struct ibv_wc *wc, const ferry_xfer_t *x, uint64_t off,
                          uint64_t n, const char *peer);

/* rdma_commit.c */
int ferry_rdma_commit_writes(ferry_conn_t *c, struct rdma_ep *ep, ferry_xfer_t *xs, size_t nx, struct plan *pl,
                  struct first_err *fe, int *broken);
int ferry_rdma_serve_commit(ferry_conn_t *c, struct rdma_dev *d, const ferry_frame_t *f, uint64_t deadline);
int ferry_rdma_serve_commit_group(ferry_conn_t *c, struct rdma_dev *d, const ferry_frame_t *f, uint64_t deadline);
void ferry_rdma_group_free(struct ferry_rdma_group *g);

#endif
