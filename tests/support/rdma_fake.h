/* SPDX-License-Identifier: Apache-2.0 */
/* A software HCA for the RDMA transport's tests, in the test process: the
 * verbs table that ferry_rdma_test_use_verbs() installs (no RDMA hardware
 * or kernel support is needed), its knobs and counters, and the engine
 * pairs and scattered batches the tests build on it.
 *
 * It behaves as a strict driver would where Ferry's correctness depends on
 * it: QP state transitions need their attribute masks, the PSNs and LID
 * exchanged must match, send queues and CQs have bounded depth (overflow
 * aborts the test), keys are checked against the protection domain, range
 * and access flags, a deregistered key gives a remote access error that
 * breaks both QPs, a QP moved to error flushes its work requests, and
 * completions are delivered by a separate "HCA" thread through the
 * completion channel's fd. It does not model: the fabric (packets, timing,
 * retransmission), RNR retries (an immediate without a posted receive fails
 * at once), RoCE addressing, memory pinning, GPUDirect.
 *
 * Needs <infiniband/verbs.h> (built with the tests that use it when the
 * verbs code is, tests/rdma.cmake). */
#ifndef FERRY_TEST_RDMA_FAKE_H
#define FERRY_TEST_RDMA_FAKE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "transport/rdma/rdma_verbs.h"

#define FAKE_LID 1
#define FAKE_MAX_WR 48 /* below Ferry's own depth (128): its clamp is exercised */
#define FAKE_MAX_SGE 4 /* below Ferry's own (16): its clamp is exercised */

struct fwr;
struct fqp;
struct fmr;

/* The HCA's state: take lock to read or set anything while it runs. */
struct fake_hca {
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
};
extern struct fake_hca H;

/* cmocka group setup and teardown: the HCA thread and the verbs table. */
int start_hca(void **state);
int stop_hca(void **state);

void hca_pause(int on);
long hca_get(long *field);
int hca_get_int(int *field);
unsigned long long hca_bytes(void);
int hca_queued(void);
/* Waits (5 s at most) until n work requests wait at the HCA. */
void wait_queued(int n);
/* Waits (5 s at most) until the HCA paused itself (pause_at_imm). */
void wait_paused(void);
void hca_counts(long *calls, long *wrs, long *sig, long *sges);
void hca_set_max_wr(int n);
void hca_fail_wr(int nth, enum ibv_wc_status st);

/* Two engines of this process, initiator and target. */
typedef struct pair {
    ferry_engine_t *initiator, *target;
    char peer[300];
} pair_t;

pair_t pair_make(int timeout_ms);
/* A pair whose batches run on one connection (one QP, one chain of work
 * requests at a time), so that counts and positions are exact. */
pair_t pair_make_one_conn(int timeout_ms, int retries);
void pair_end(pair_t *p);
int write_sync(pair_t *p, void *src, void *dst, size_t len);

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

scatter_t scatter_make(pair_t *p, size_t n, size_t len, bool remote_contiguous);
/* 1 when piece i's bytes are in place at the target. */
bool scatter_landed(const scatter_t *s, size_t i);
void scatter_end(pair_t *p, scatter_t *s);

/* Unpauses the HCA when the cancel returned, or after 5 s if the cancel
 * needs the HCA to go on: pthread_create(&u.t, NULL, unpause_main, &u). */
struct unpause_later {
    pthread_t t;
    atomic_int cancel_done;
};
void *unpause_main(void *arg);

#endif
