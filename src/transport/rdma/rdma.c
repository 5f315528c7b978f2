/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport, the part every build has: settings, finding devices
 * without loading libibverbs, the per-engine probe and usable() decision,
 * and what an engine without RDMA answers to RDMA frames.
 *
 * The verbs code is in rdma_verbs.c, rdma_ep.c, rdma_run.c, rdma_commit.c and rdma_serve.c (rdma_int.h), built when <infiniband/verbs.h> is
 * found (FERRY_HAVE_RDMA). Even then libibverbs is not linked: it is
 * dlopen'ed at an engine's first probe, and only when sysfs lists an RDMA
 * device, so a process on a machine without one never loads it.
 *
 * Selection: an engine advertises FERRY_HELLO_F_RDMA in its handshakes when
 * its probe found an active port; an initiator uses RDMA for a peer when
 * both sides have it (auto), or when forced with transport=rdma; otherwise
 * transport_choose() falls back to TCP and records why. */
#include "rdma.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/env.h"
#include "util/net.h"
#include "link/transport.h"
#include "rdma_wire.h"

struct ferry_rdma {
    int usable;
    char why[128];
    void *dev; /* rdma_verbs.c's device context when usable */
};

/* Guards the creation of an engine's state; reads after it go lock-free. */
static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;

int ferry_rdma_built(void)
{
#ifdef FERRY_HAVE_RDMA
    return 1;
#else
    return 0;
#endif
}

/* -------------------------------------------------------------- settings */

/* The RDMA transport's configuration keys (docs/RDMA_AND_GPU.md), read
 * through the link layer (ferry_transport_key); its ops list them. */
enum { KEY_RDMA, KEY_RDMA_DEVICE, KEY_RDMA_PORT, KEY_RDMA_GID_INDEX, NKEYS };
static const ferry_transport_key_t rdma_keys[NKEYS] = {
    [KEY_RDMA] = {"FERRY_RDMA", FERRY_KEY_LONG, 0, 1, "1", "0 turns the RDMA transport off"},
    [KEY_RDMA_DEVICE] = {"FERRY_RDMA_DEVICE", FERRY_KEY_STRING, 0, 0, "",
                         "device name, e.g. mlx5_0; unset: the first with an active port"},
    [KEY_RDMA_PORT] = {"FERRY_RDMA_PORT", FERRY_KEY_LONG, 1, 255, "1", "port number"},
    [KEY_RDMA_GID_INDEX] = {"FERRY_RDMA_GID_INDEX", FERRY_KEY_LONG, -1, 255, "-1",
                            "GID index; -1: 0 on InfiniBand, picked from sysfs on RoCE"},
};

static int key_int(int key, int *out)
{
    long v = *out;
    int rc = ferry_transport_key(&rdma_keys[key], &v, NULL); /* unset: the key's default */
    if (rc < 0) return rc;
    *out = (int)v;
    return 0;
}

int ferry_rdma_env_load(ferry_rdma_env_t *env)
{
    memset(env, 0, sizeof *env); /* enabled, port, gid_index: their keys' defaults below */
    env->sysfs_verbs = "/sys/class/infiniband_verbs";
    env->sysfs_ib = "/sys/class/infiniband";
    env->libname = "libibverbs.so.1";
    int rc = key_int(KEY_RDMA, &env->enabled);
    if (rc == 0) rc = key_int(KEY_RDMA_PORT, &env->port);
    if (rc == 0) rc = key_int(KEY_RDMA_GID_INDEX, &env->gid_index);
    const char *dev = NULL;
    if (rc == 0) {
        int got = ferry_transport_key(&rdma_keys[KEY_RDMA_DEVICE], NULL, &dev);
        if (got < 0) rc = got;
    }
    if (rc == 0 && dev && strlen(dev) >= sizeof env->device)
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "environment FERRY_RDMA_DEVICE is longer than %zu bytes",
                        sizeof env->device - 1);
    if (rc == 0 && dev) snprintf(env->device, sizeof env->device, "%s", dev);
    return rc;
}

/* ----------------------------------------------------- sysfs, no libraries */

int ferry_rdma_sysfs_devices(const char *dir, char *names, size_t cap)
{
    if (names && cap) names[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, "uverbs", 6) != 0) continue;
        if (names && cap) {
            size_t used = strlen(names);
            snprintf(names + used, cap - used, "%s%s", n ? "," : "", de->d_name);
        }
        n++;
    }
    closedir(d);
    return n;
}

/* Reads a one-line sysfs file without its newline; 0 or -1. */
static int read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *ok = fgets(buf, (int)cap, f);
    fclose(f);
    if (!ok) return -1;
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

/* Parses "fe80:0000:...:0001" (8 groups of 4 hex digits) into 16 bytes. */
static int parse_gid(const char *text, uint8_t gid[16])
{
    for (int g = 0; g < 8; g++) {
        unsigned v = 0;
        for (int k = 0; k < 4; k++) {
            char ch = *text++;
            int d = (ch >= '0' && ch <= '9') ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10
                    : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10 : -1;
            if (d < 0) return -1;
            v = v * 16 + (unsigned)d;
        }
        gid[2 * g] = (uint8_t)(v >> 8);
        gid[2 * g + 1] = (uint8_t)v;
        if (g < 7 && *text++ != ':') return -1;
    }
    return *text == '\0' ? 0 : -1;
}

int ferry_rdma_pick_gid(const char *sysfs_ib, const char *dev, int port, char *why, size_t cap)
{
    int best = -1, best_score = 0;
    for (int i = 0; i < 256; i++) {
        char path[512], text[128];
        uint8_t gid[16];
        snprintf(path, sizeof path, "%s/%s/ports/%d/gids/%d", sysfs_ib, dev, port, i);
        if (read_line(path, text, sizeof text) != 0) break; /* past the table's end */
        if (parse_gid(text, gid) != 0) continue;
        static const uint8_t zero[16];
        if (memcmp(gid, zero, 16) == 0) continue;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        snprintf(path, sizeof path, "%s/%s/ports/%d/gid_attrs/types/%d", sysfs_ib, dev, port, i);
        int v2 = read_line(path, text, sizeof text) == 0 && strstr(text, "v2") != NULL;
        int score = v2 ? (memcmp(gid, v4mapped, 12) == 0 ? 3 : 2) : 1;
        if (score > best_score) {
            best = i;
            best_score = score;
        }
    }
    if (best < 0) snprintf(why, cap, "no non-zero GID on %s port %d (%s)", dev, port, sysfs_ib);
    return best;
}

/* ------------------------------------------------------------------ probe */

/* The engine's state, in RDMA's slot of its transport context (xport.h). */
static _Atomic(void *) *state_slot(ferry_xport_ctx_t *ctx)
{
    return ferry_transport_state(ctx, &ferry_transport_rdma);
}

static struct ferry_rdma *state_of(ferry_xport_ctx_t *ctx)
{
    return atomic_load_explicit(state_slot(ctx), memory_order_acquire);
}

static void state_set(ferry_xport_ctx_t *ctx, struct ferry_rdma *st)
{
    atomic_store_explicit(state_slot(ctx), st, memory_order_release);
}

static void state_free(ferry_xport_ctx_t *ctx, struct ferry_rdma *st)
{
    if (!st) return;
#ifdef FERRY_HAVE_RDMA
    if (st->dev) ferry_rdma_dev_close(ctx, st->dev);
#else
    (void)ctx;
#endif
    free(st);
}

static void probe(ferry_xport_ctx_t *ctx, const ferry_rdma_env_t *env, struct ferry_rdma *st)
{
    (void)ctx;
    if (!env->enabled) {
        snprintf(st->why, sizeof st->why, "RDMA is turned off (FERRY_RDMA=0)");
        return;
    }
#ifndef FERRY_HAVE_RDMA
    snprintf(st->why, sizeof st->why, "this build has no RDMA (no libibverbs-dev, or FERRY_WITH_RDMA=OFF)");
#else
    if (!ferry_rdma_test_hooked() && ferry_rdma_sysfs_devices(env->sysfs_verbs, NULL, 0) == 0) {
        snprintf(st->why, sizeof st->why, "no RDMA device (%s lists none; libibverbs not loaded)", env->sysfs_verbs);
        return;
    }
    char why[128];
    if (ferry_rdma_dev_open(ctx, env, &st->dev, why, sizeof why) == 0) {
        st->usable = 1;
        snprintf(st->why, sizeof st->why, "%s", why);
    } else {
        st->dev = NULL;
        snprintf(st->why, sizeof st->why, "%s", why);
    }
#endif
}

int ferry_rdma_reprobe(ferry_xport_ctx_t *ctx, const ferry_rdma_env_t *env, char *why, size_t cap)
{
    struct ferry_rdma *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(why, cap, "RDMA probe: out of memory");
        return 0;
    }
    pthread_mutex_lock(&probe_lock);
    struct ferry_rdma *old = state_of(ctx);
    state_set(ctx, NULL);
    state_free(ctx, old);
    probe(ctx, env, st);
    state_set(ctx, st);
    pthread_mutex_unlock(&probe_lock);
    FERRY_LOG(FERRY_LOG_INFO, "rdma", "%s: %s", st->usable ? "usable" : "not usable", st->why);
    snprintf(why, cap, "%s", st->why);
    return st->usable;
}

static struct ferry_rdma *state_get(ferry_xport_ctx_t *ctx)
{
    struct ferry_rdma *st = state_of(ctx);
    if (st) return st;
    pthread_mutex_lock(&probe_lock);
    st = state_of(ctx);
    if (!st) {
        st = calloc(1, sizeof *st);
        if (st) {
            ferry_rdma_env_t env;
            if (ferry_rdma_env_load(&env) != 0) {
                /* A bad setting turns RDMA off, saying which. */
                snprintf(st->why, sizeof st->why, "RDMA off: %s", ferry_fail_message());
            } else {
                probe(ctx, &env, st);
            }
            FERRY_LOG(FERRY_LOG_INFO, "rdma", "%s: %s", st->usable ? "usable" : "not usable", st->why);
            state_set(ctx, st);
        }
    }
    pthread_mutex_unlock(&probe_lock);
    return st;
}

int ferry_rdma_local(ferry_xport_ctx_t *ctx, char *why, size_t cap)
{
    struct ferry_rdma *st = state_get(ctx);
    if (!st) {
        snprintf(why, cap, "RDMA probe: out of memory");
        return 0;
    }
    snprintf(why, cap, "%s", st->why);
    return st->usable;
}

/* ----------------------------------------------------------- the vtable */

static int rdma_usable(ferry_xport_ctx_t *ctx, const ferry_hello_t *peer, char *why, size_t cap)
{
    char local[128];
    if (!ferry_rdma_local(ctx, local, sizeof local)) {
        snprintf(why, cap, "%s", local);
        return 0;
    }
    if (!(peer->flags & FERRY_HELLO_F_RDMA)) {
        snprintf(why, cap, "the peer has no usable RDMA device");
        return 0;
    }
    snprintf(why, cap, "rdma on %s", local);
    return 1;
}

static uint32_t rdma_hello_flags(ferry_xport_ctx_t *ctx)
{
    char why[128];
    return ferry_rdma_local(ctx, why, sizeof why) ? FERRY_HELLO_F_RDMA : 0;
}

static void rdma_engine_fini(ferry_xport_ctx_t *ctx)
{
    struct ferry_rdma *st = state_of(ctx);
    state_set(ctx, NULL);
    state_free(ctx, st);
}

static int rdma_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t n, int *broken, ferry_verdict_t *verdict)
{
#ifdef FERRY_HAVE_RDMA
    struct ferry_rdma *st = state_get(c->ctx);
    if (st && st->usable) return ferry_rdma_verbs_run(c, st->dev, xs, n, broken, verdict);
#endif
    /* Chosen for a session, then made unusable (a test's reprobe): TCP
     * still reaches the peer over this very connection. */
    (void)c, (void)xs, (void)n, (void)broken;
    return ferry_verdict_by_tcp(verdict, "rdma is not usable on this engine now");
}

/* What an engine without a usable device answers: RDMA_CONNECT and
 * RDMA_MR_QUERY get DEVICE_NOT_FOUND with the reason, so the initiator
 * falls back to TCP; RDMA_COMMIT cannot be valid without a queue pair. */
static int serve_unavailable(ferry_conn_t *c, const ferry_frame_t *f, const char *why)
{
    uint64_t deadline = ferry_deadline_after_ms(c->ctx->timeout_ms);
    int rc = ferry_conn_discard(c, f->plen, deadline);
    if (rc) return rc;
    switch (f->type) {
    case FERRY_FRAME_RDMA_CONNECT:
        ferry_fail(FERRY_ERR_DEVICE_NOT_FOUND, "target %s cannot take an RDMA connection: %s", c->ctx->name,
                   why);
        return ferry_rdma_reply(c, FERRY_FRAME_RDMA_CONNECT_ACK, f, FERRY_ERR_DEVICE_NOT_FOUND, NULL, 0, 0, deadline);
    case FERRY_FRAME_RDMA_MR_QUERY:
        ferry_fail(FERRY_ERR_DEVICE_NOT_FOUND, "target %s has no RDMA keys: %s", c->ctx->name, why);
        return ferry_rdma_reply(c, FERRY_FRAME_RDMA_MR_INFO, f, FERRY_ERR_DEVICE_NOT_FOUND, NULL, 0, 0, deadline);
    default:
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s from %s on a connection without an RDMA queue pair (%s)",
                          ferry_frame_type_name(f->type), c->peer.name, why);
    }
}

static int rdma_serve(ferry_conn_t *c, const ferry_frame_t *f)
{
    char why[128];
    int usable = ferry_rdma_local(c->ctx, why, sizeof why);
#ifdef FERRY_HAVE_RDMA
    if (usable) return ferry_rdma_verbs_serve(c, state_get(c->ctx)->dev, f);
#else
    (void)usable;
#endif
    return serve_unavailable(c, f, why);
}

static const uint8_t rdma_frames[] = {FERRY_FRAME_RDMA_CONNECT, FERRY_FRAME_RDMA_MR_QUERY, FERRY_FRAME_RDMA_COMMIT,
                                      FERRY_FRAME_RDMA_COMMIT_GROUP};

/* RDMA's frame ids: its first frames (of the core range) and its own. */
static const ferry_frame_range_t rdma_frame_ranges[] = {{FERRY_FRAME_RDMA_CONNECT, FERRY_FRAME_RDMA_COMMIT_ACK},
                                                       {FERRY_FRAME_RDMA_FIRST, FERRY_FRAME_RDMA_LAST}};

const ferry_transport_ops_t ferry_transport_rdma = {
    .name = "rdma",
    .usable = rdma_usable,
    .run = rdma_run,
    .serve = rdma_serve,
    .serve_types = rdma_frames,
    .nserve_types = sizeof rdma_frames,
    .frames = ferry_rdma_frames,
    .nframes = FERRY_RDMA_NFRAMES,
    .hello_flags = rdma_hello_flags,
    .engine_fini = rdma_engine_fini,
    .version = FERRY_TRANSPORT_OPS_VERSION,
    .frame_ranges = rdma_frame_ranges,
    .nframe_ranges = sizeof rdma_frame_ranges / sizeof rdma_frame_ranges[0],
    .hello_bits = FERRY_HELLO_F_RDMA,
    .keys = rdma_keys,
    .nkeys = NKEYS,
};

/* ------------------------------------------------------------- helpers */

int ferry_rdma_reply(ferry_conn_t *c, uint8_t type, const ferry_frame_t *req, int status, const void *payload,
                     uint32_t plen, uint64_t len, uint64_t deadline)
{
    if (status) {
        payload = ferry_fail_message();
        size_t n = strlen(payload);
        plen = (uint32_t)(n > FERRY_WIRE_MAX_REASON ? FERRY_WIRE_MAX_REASON : n);
        len = 0;
    }
    ferry_frame_t f = {.type = type, .status = status, .req_id = req->req_id, .addr = req->addr, .len = len,
                       .plen = plen};
    return ferry_conn_send_frame(c, &f, payload, deadline);
}

int ferry_rdma_read_refusal(ferry_conn_t *c, const ferry_frame_t *f, const char *what, uint64_t deadline)
{
    char text[FERRY_WIRE_MAX_REASON + 1];
    uint32_t n = f->plen <= FERRY_WIRE_MAX_REASON ? f->plen : FERRY_WIRE_MAX_REASON;
    int rc = ferry_net_recv(c->fd, text, n, deadline);
    if (rc) return rc;
    text[n] = '\0';
    if (f->plen > n && (rc = ferry_conn_discard(c, f->plen - n, deadline)) != 0) return rc;
    return ferry_fail(f->status, "target %s refused %s: %s", c->peer.name, what, n ? text : "(no detail)");
}
