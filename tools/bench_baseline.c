/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry bench baseline` (memcpy, memfd, cma: what the transfers compare
 * with) and `ferry bench extras` (registration, sessions, idle CPU). */
#include <errno.h>
#include <getopt.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include <ferry/ferry.h>
#include <ferry/pool.h>

#include "bench.h"
#include "opts.h"
#include "util.h"

/* ------------------------------------------------------------- baselines */

/* Copies block bytes from src to dst by `how` until the time is up. */
int baseline(const struct opts *o, const char *how)
{
    size_t len = o->block;
    /* --blocks N: copy N distinct blocks in turn (the working set Ferry's
     * batches have); 1 by default, the same block again and again. */
    size_t nb = o->blocks ? o->blocks : 1;
    /* --iov N: N blocks per call (process_vm_writev with N iovecs; memcpy
     * and memfd copy them in a loop), --scatter: at scattered slots. */
    size_t per = o->iov ? o->iov : 1;
    if (per > 1024) per = 1024;
    /* --blocks fewer than --iov: a call's iovec j reuses block j * nb / per,
     * as `ferry bench` spreads a call's requests over its blocks (16 x 1 MiB
     * over 2 blocks, one per connection: the "hot" rows' same bytes). */
    bool reuse = nb < per && o->blocks != 0;
    if (!reuse) {
        if (nb < per) nb = per;
        nb -= nb % per;
    }
    size_t span = nb * len;
    struct iovec *liov = calloc(per, sizeof *liov), *riov = calloc(per, sizeof *riov);
    if (!liov || !riov) return 1;
    unsigned char *src = alloc_touched(span);
    unsigned char *dst = NULL;
    pid_t child = 0;
    int up[2] = {-1, -1}, down[2] = {-1, -1};
    int memfd = -1;
    if (!src) return 1;
    if (strcmp(how, "memcpy") == 0) {
        dst = alloc_touched(span);
    } else if (strcmp(how, "memfd") == 0) {
        /* A shared mapping another process holds: the memcpy a shared-memory
         * transport does when both sides map the same pages. */
        memfd = memfd_create("ferry-bench", MFD_CLOEXEC);
        if (memfd < 0 || ftruncate(memfd, (off_t)span) != 0) return 1;
        dst = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
        if (dst == MAP_FAILED) return 1;
        memset(dst, 0, span);
        if (pipe(down) != 0) return 1;
        child = fork();
        if (child == 0) {
            char c;
            if (read(down[0], &c, 1) < 0) _exit(1);
            _exit(0);
        }
    } else if (strcmp(how, "cma") == 0) {
        /* process_vm_writev into another process's private memory. */
        if (pipe(up) != 0 || pipe(down) != 0) return 1;
        fflush(NULL);
        child = fork();
        if (child == 0) {
            void *mine = alloc_touched(span);
            uint64_t a = (uint64_t)(uintptr_t)mine;
            if (write(up[1], &a, sizeof a) != sizeof a) _exit(1);
            char c;
            if (read(down[0], &c, 1) < 0) _exit(1);
            _exit(0);
        }
        uint64_t a = 0;
        if (read(up[0], &a, sizeof a) != sizeof a) return 1;
        dst = (unsigned char *)(uintptr_t)a;
    } else {
        fprintf(stderr, "ferry bench baseline: unknown baseline '%s' (memcpy, memfd, cma)\n", how);
        return 2;
    }
    if (!dst) return 1;
    double *lat = NULL;
    size_t nlat = 0, cap = 0;
    uint64_t bytes = 0;
    double start = now_s() + o->warmup, stop = start + o->duration, wall0 = 0;
    int rc = 0;
    size_t k = 0;
    for (int measuring = 0;; k = reuse ? 0 : (k + per) % nb) {
        double t0 = now_s();
        for (size_t j = 0; j < per; j++) {
            size_t b = reuse ? j * nb / per : k + j;
            size_t sk = o->scatter ? scatter_slot(b, nb, 613) : b;
            size_t dk = o->scatter ? scatter_slot(b, nb, 733) : b;
            liov[j] = (struct iovec){src + sk * len, len};
            riov[j] = (struct iovec){dst + dk * len, len};
        }
        if (!measuring && t0 >= start) {
            measuring = 1;
            wall0 = t0;
        }
        if (t0 >= stop) break;
        if (child && strcmp(how, "cma") == 0) {
            if (process_vm_writev(child, liov, per, riov, per, 0) != (ssize_t)(len * per)) {
                fprintf(stderr, "ferry bench baseline: process_vm_writev: %s\n", strerror(errno));
                rc = 1;
                break;
            }
        } else {
            for (size_t j = 0; j < per; j++) {
                memcpy(riov[j].iov_base, liov[j].iov_base, len);
                __asm__ __volatile__("" ::"r"(riov[j].iov_base) : "memory");
            }
        }
        if (!measuring) continue;
        double t1 = now_s();
        if (nlat == cap) {
            cap = cap ? cap * 2 : 65536;
            lat = realloc(lat, cap * sizeof *lat);
        }
        lat[nlat++] = (t1 - t0) * 1e6;
        bytes += len * per;
    }
    double wall = now_s() - wall0;
    if (child) {
        if (write(down[1], "x", 1) < 0) kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    qsort(lat, nlat, sizeof *lat, cmp_double);
    double gbps = wall > 0 ? (double)bytes / wall / 1e9 : 0;
    if (o->json)
        print_json_line(json_pack("{s:s,s:s,s:I,s:I,s:I,s:b,s:b,s:f,s:f,s:f,s:{s:f,s:f,s:f},s:b}", "tool", "baseline",
                                  "baseline", how, "block_size", (json_int_t)len, "blocks", (json_int_t)nb, "iov",
                                  (json_int_t)per, "scatter", o->scatter, "hugepages", use_hugepages, "seconds", wall,
                                  "gb_per_s", gbps, "req_per_s", wall > 0 ? (double)bytes / (double)len / wall : 0.0,
                                  "lat_us", "p50", pct(lat, nlat, 0.5), "p99", pct(lat, nlat, 0.99), "p999",
                                  pct(lat, nlat, 0.999), "ok", rc == 0));
    else {
        char bs[32];
        fmt_size(len, bs, sizeof bs);
        printf("baseline %s, %s blocks (%zu distinct%s), %zu per call: %.3f GB/s, %.0f blocks/s, p50 %.1f us, "
               "p99 %.1f us\n", how, bs, nb, o->scatter ? ", scattered" : "", per, gbps,
               wall > 0 ? (double)bytes / (double)len / wall : 0, pct(lat, nlat, 0.5), pct(lat, nlat, 0.99));
    }
    free(lat);
    free(liov);
    free(riov);
    return rc;
}

/* ---------------------------------------------------------------- extras */

/* Registration of many regions, opening many sessions, idle CPU. */
int extras(const struct opts *o)
{
    int n = o->regions > 0 ? o->regions : 10000;
    ferry_engine_t *e;
    if (make_engine(o, 0, &e) != 0) return 1;
    size_t each = 4096;
    unsigned char *pool = alloc_touched((size_t)n * each);
    void **addrs = calloc((size_t)n, sizeof *addrs);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    for (int i = 0; i < n; i++) {
        addrs[i] = pool + (size_t)i * each;
        lens[i] = each;
    }
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        if (ferry_register(e, addrs[i], each, FERRY_MEM_REMOTE) != 0) {
            fprintf(stderr, "ferry bench extras: register %d: %s\n", i, ferry_last_error_detail());
            return 1;
        }
    double reg = now_s() - t0;
    /* A peer learning all of them: one session open fetches the table. */
    ferry_engine_t *peer;
    if (make_engine(o, 0, &peer) != 0) return 1;
    t0 = now_s();
    if (ferry_session_open(peer, ferry_engine_name(e)) != 0) {
        fprintf(stderr, "ferry bench extras: session with %d segments: %s\n", n, ferry_last_error_detail());
        return 1;
    }
    double open_many = now_s() - t0;
    ferry_engine_destroy(peer);
    t0 = now_s();
    for (int i = 0; i < n; i++) ferry_deregister(e, addrs[i]);
    double dereg = now_s() - t0;
    t0 = now_s();
    int brc = ferry_register_batch(e, addrs, lens, (size_t)n, FERRY_MEM_REMOTE);
    double reg_batch = now_s() - t0;
    t0 = now_s();
    if (brc == 0) ferry_deregister_batch(e, addrs, (size_t)n);
    double dereg_batch = now_s() - t0;

    /* Sessions: S target engines in a child process, opened one by one. */
    int s = o->sessions > 0 ? o->sessions : 100;
    int p[2];
    if (pipe(p) != 0) return 1;
    int q[2];
    if (pipe(q) != 0) return 1;
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        close(p[0]);
        close(q[1]);
        ferry_engine_t **ts = calloc((size_t)s, sizeof *ts);
        void *buf = alloc_touched(1 << 20);
        for (int i = 0; i < s; i++) {
            ferry_config_t cfg;
            ferry_config_init(&cfg);
            cfg.workers = 1;
            if (ferry_engine_create(&cfg, &ts[i]) != 0) _exit(1);
            ferry_register(ts[i], buf, 1 << 20, FERRY_MEM_REMOTE);
            uint64_t msg[2] = {ferry_engine_port(ts[i]), (uint64_t)(uintptr_t)buf};
            if (write(p[1], msg, sizeof msg) != sizeof msg) _exit(1);
        }
        char c;
        if (read(q[0], &c, 1) < 0) _exit(1);
        for (int i = 0; i < s; i++) ferry_engine_destroy(ts[i]);
        _exit(0);
    }
    close(p[1]);
    close(q[0]);
    char (*names)[64] = calloc((size_t)s, sizeof *names);
    uint64_t remote = 0;
    for (int i = 0; i < s; i++) {
        uint64_t msg[2];
        if (read(p[0], msg, sizeof msg) != sizeof msg) {
            fprintf(stderr, "ferry bench extras: the session targets did not start\n");
            return 1;
        }
        snprintf(names[i], sizeof names[i], "127.0.0.1:%u", (unsigned)msg[0]);
        remote = msg[1];
    }
    t0 = now_s();
    for (int i = 0; i < s; i++)
        if (ferry_session_open(e, names[i]) != 0) {
            fprintf(stderr, "ferry bench extras: session %d: %s\n", i, ferry_last_error_detail());
            return 1;
        }
    double open_s = now_s() - t0;
    /* The first transfer on each (shm: the target verifies the peer then). */
    static unsigned char small[8];
    ferry_register(e, small, sizeof small, FERRY_MEM_LOCAL);
    t0 = now_s();
    for (int i = 0; i < s; i++)
        if (ferry_transfer_sync(e, names[i], FERRY_OP_WRITE, small, remote, sizeof small) != 0) {
            fprintf(stderr, "ferry bench extras: first write to %s: %s\n", names[i], ferry_last_error_detail());
            return 1;
        }
    double first_s = now_s() - t0;
    ferry_peer_info_t info;
    memset(&info, 0, sizeof info);
    ferry_session_info(e, names[0], &info);
    /* Idle: sessions open, nothing to do. */
    double c0 = self_cpu_s(), tc0 = proc_cpu_s(child), w0 = now_s();
    struct timespec ts = {(time_t)o->idle, (long)((o->idle - (double)(time_t)o->idle) * 1e9)};
    nanosleep(&ts, NULL);
    double idle_wall = now_s() - w0;
    double idle_self = (self_cpu_s() - c0) / idle_wall, idle_targets = (proc_cpu_s(child) - tc0) / idle_wall;
    t0 = now_s();
    for (int i = 0; i < s; i++) ferry_session_close(e, names[i]);
    double close_s = now_s() - t0;
    if (write(q[1], "x", 1) < 0) kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    close(p[0]);
    close(q[1]);
    ferry_engine_destroy(e);
    free(names);
    free(addrs);
    free(lens);
    munmap(pool, (size_t)n * each);
    if (o->json) {
        print_json_line(json_pack("{s:s,s:i,s:f,s:f,s:f,s:f,s:f,s:i,s:f,s:f,s:s,s:f,s:f,s:f,s:f}", "tool", "extras",
                                  "regions", n, "register_ms", reg * 1e3, "deregister_ms", dereg * 1e3,
                                  "register_batch_ms", reg_batch * 1e3, "deregister_batch_ms", dereg_batch * 1e3,
                                  "open_with_regions_ms", open_many * 1e3, "sessions", s, "sessions_open_ms",
                                  open_s * 1e3, "first_write_ms", first_s * 1e3, "transport", info.transport,
                                  "sessions_close_ms", close_s * 1e3, "idle_seconds", idle_wall,
                                  "idle_cpu_initiator", idle_self, "idle_cpu_targets", idle_targets));
    } else {
        printf("register %d regions one by one: %.2f ms (%.2f us each); deregister: %.2f ms\n", n, reg * 1e3,
               reg * 1e6 / n, dereg * 1e3);
        printf("register_batch of %d: %.2f ms; deregister_batch: %.2f ms\n", n, reg_batch * 1e3, dereg_batch * 1e3);
        printf("a peer opening a session to an engine with %d segments: %.2f ms\n", n, open_many * 1e3);
        printf("open %d sessions (one engine each, other process): %.2f ms (%.2f ms each); close: %.2f ms\n", s,
               open_s * 1e3, open_s * 1e3 / s, close_s * 1e3);
        printf("first 8-byte write on each (%s; includes the target's peer verification): %.2f ms (%.3f ms each)\n",
               info.transport, first_s * 1e3, first_s * 1e3 / s);
        printf("idle %.1f s with %d sessions open: initiator %.3f%% of a core, %d target engines %.3f%%\n",
               idle_wall, s, idle_self * 100, s, idle_targets * 100);
    }
    return 0;
}
