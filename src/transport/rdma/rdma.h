/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport's internals, shared by rdma.c (always built: settings,
 * device discovery without loading libibverbs, the usable() decision, the
 * answers of an engine without RDMA) and the verbs files (rdma_verbs.c, rdma_ep.c, rdma_run.c, rdma_commit.c, rdma_serve.c) (built when
 * <infiniband/verbs.h> is found: the verbs themselves). Not a public header. */
#ifndef FERRY_RDMA_H
#define FERRY_RDMA_H

#include <stddef.h>
#include <stdint.h>

#include "link/transport.h"
#include "link/xport.h"

/* The RDMA transport's ops (rdma.c), for its own files. */
extern const ferry_transport_ops_t ferry_transport_rdma;

/* Settings, from FERRY_RDMA* environment variables. */
typedef struct ferry_rdma_env {
    int enabled;             /* FERRY_RDMA=0 turns the transport off; default 1 */
    char device[64];         /* FERRY_RDMA_DEVICE: a device name; "" = the first with an active port */
    int port;                /* FERRY_RDMA_PORT, default 1 */
    int gid_index;           /* FERRY_RDMA_GID_INDEX; -1 = 0 on InfiniBand, picked from sysfs on RoCE */
    const char *sysfs_verbs; /* the uverbs device list: /sys/class/infiniband_verbs */
    const char *sysfs_ib;    /* the RDMA devices, for GID types: /sys/class/infiniband */
    const char *libname;     /* libibverbs.so.1 */
} ferry_rdma_env_t;

/* Defaults, then the environment. INVALID_ARGUMENT naming a bad variable. */
int ferry_rdma_env_load(ferry_rdma_env_t *env);
/* Counts the uverbs devices listed in dir (names: comma-separated, may be
 * NULL). 0 when dir is absent or empty. Touches no RDMA library. */
int ferry_rdma_sysfs_devices(const char *dir, char *names, size_t cap);
/* The GID index to use on a RoCE port, from sysfs_ib/<dev>/ports/<port>/:
 * a RoCE v2 GID holding an IPv4 address first, then any RoCE v2 GID, then
 * any non-zero GID. -1 when there is none (why says so). */
int ferry_rdma_pick_gid(const char *sysfs_ib, const char *dev, int port, char *why, size_t cap);

/* 1 if this engine can use RDMA (why: the device), 0 if not (why: the
 * reason). Probes once, at first call (the state lives in RDMA's slot
 * of the engine's transport context, xport.h). */
int ferry_rdma_local(ferry_xport_ctx_t *ctx, char *why, size_t cap);
/* Probes again with env (tests): drops the previous state first. */
int ferry_rdma_reprobe(ferry_xport_ctx_t *ctx, const ferry_rdma_env_t *env, char *why, size_t cap);
/* 1 when this library was built with the verbs code. */
int ferry_rdma_built(void);

/* Helpers for both files. A failing answer carries the detail as text. */
int ferry_rdma_reply(ferry_conn_t *c, uint8_t type, const ferry_frame_t *req, int status, const void *payload,
                     uint32_t plen, uint64_t len, uint64_t deadline);
/* Reads the text of failing answer f into the calling thread's failure:
 * "target X refused <what>: <text>". Returns f->status, or the I/O failure. */
int ferry_rdma_read_refusal(ferry_conn_t *c, const ferry_frame_t *f, const char *what, uint64_t deadline);

#ifdef FERRY_HAVE_RDMA
/* The verbs code (rdma_int.h). Opens the device env names: 0 and *dev, or a code and why. */
int ferry_rdma_dev_open(ferry_xport_ctx_t *ctx, const ferry_rdma_env_t *env, void **dev, char *why, size_t cap);
void ferry_rdma_dev_close(ferry_xport_ctx_t *ctx, void *dev);
struct ferry_verdict;
int ferry_rdma_verbs_run(ferry_conn_t *c, void *dev, ferry_xfer_t *xs, size_t n, int *broken,
                         struct ferry_verdict *verdict);
int ferry_rdma_verbs_serve(ferry_conn_t *c, void *dev, const ferry_frame_t *f);
/* 1 while tests replaced libibverbs. */
int ferry_rdma_test_hooked(void);
#endif

#endif
