/* SPDX-License-Identifier: Apache-2.0 */
/* The verbs the RDMA transport calls, as a table of function pointers.
 *
 * In production the table is filled by dlopen("libibverbs.so.1") and dlsym,
 * so libferry.so has no link-time dependency on libibverbs: a machine
 * without rdma-core runs Ferry, and a machine with rdma-core but no device
 * never loads it (the sysfs check comes first). The verbs that verbs.h
 * defines inline (post_send, post_recv, poll_cq, req_notify_cq, and the
 * extended query_port) call through the device context's ops and need no
 * symbol; thin wrappers put them in the table too.
 *
 * Tests install a table of their own (ferry_rdma_test_use_verbs): a
 * software HCA in the test process, so that the transport's queue-pair
 * setup, key exchange, data path and commit protocol run for real on a
 * machine without RDMA hardware. Needs <infiniband/verbs.h> (libibverbs-dev). */
#ifndef FERRY_RDMA_VERBS_H
#define FERRY_RDMA_VERBS_H

#include <infiniband/verbs.h>

typedef struct ferry_verbs {
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    __be64 (*get_device_guid)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *ch,
                                int vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
    int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
    int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
    int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
    const char *(*wc_status_str)(enum ibv_wc_status status);
} ferry_verbs_t;

/* Tests only: use v instead of libibverbs for engines probed from now on
 * (NULL restores libibverbs). The sysfs device check is skipped while set. */
void ferry_rdma_test_use_verbs(const ferry_verbs_t *v);

#endif
