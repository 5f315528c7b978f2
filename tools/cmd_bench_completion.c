/* SPDX-License-Identifier: Apache-2.0 */
/* ferry bench-completion: the figures behind the completion guarantees.
 *
 *   idle CPU      two engines with a session, idle: % of one core, next to a
 *                 thread that busy-polls a socket (what a spinning engine costs)
 *   wait modes    4 KiB write round trips, blocking (spin_us=-1) vs spinning
 *                 (spin_us=N): p50/p99 latency and CPU per operation
 *   cancel        how soon ferry_batch_cancel returns with a large write in
 *                 flight, against the time the write takes
 *   scale         N registered regions (100,000 by default): register, session
 *                 open, segment table fetch, first transfer to a late region
 *   short-lived   register+send+deregister per buffer vs a pre-registered
 *                 pool (alloc+send+free), with N regions registered
 * Loopback, one process; figures are noisy on a shared machine: read the
 * ratios. */
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include <ferry/ferry.h>

#include "cli.h"
#include "opts.h"
#include "util.h"

/* Human-readable lines go to out (stderr under --json, whose object is
 * the only thing on stdout). */
static FILE *out;

/* The --json object; each figure is added as it is measured. The lock:
 * the SIGINT thread prints what is there. */
static json_t *json_fields;
static pthread_mutex_t fields_lock = PTHREAD_MUTEX_INITIALIZER;

static void json_add(const char *key, double value)
{
    pthread_mutex_lock(&fields_lock);
    if (!json_fields) json_fields = json_object();
    /* A ratio over a zero time is not a number: null, not invalid JSON. */
    json_object_set_new(json_fields, key, isfinite(value) ? json_real(value) : json_null());
    pthread_mutex_unlock(&fields_lock);
}

/* --------------------------------------------- progress lines and SIGINT */

static const char *_Atomic phase = "starting";
static double started, interval_s = 1;
static bool json_mode;

static void set_phase(const char *p) { atomic_store(&phase, p); }

/* A line every --interval seconds: the phase running and the time so far
 * (the phases print their figures as they end). */
static void *progress_main(void *arg)
{
    (void)arg;
    for (double next = started + interval_s;; next += interval_s) {
        double wait = next - now_s();
        if (wait > 0) {
            struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
            nanosleep(&ts, NULL);
        }
        fprintf(out, "[%7.1f s] bench-completion: %s\n", now_s() - started, atomic_load(&phase));
        fflush(out);
    }
    return NULL;
}

/* SIGINT/SIGTERM (blocked in every other thread): the figures so far, as
 * text or as the --json object with "interrupted": true, then exit 130. */
static void *signal_main(void *arg)
{
    sigset_t *set = arg;
    int sig = 0;
    sigwait(set, &sig);
    pthread_mutex_lock(&fields_lock);
    fprintf(out, "bench-completion: interrupted (%s) during %s after %.1f s; the figures so far:\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", atomic_load(&phase), now_s() - started);
    json_t *f = json_fields ? json_fields : json_object();
    const char *key;
    json_t *v;
    json_object_foreach(f, key, v) fprintf(out, "  %-44s %g\n", key, json_is_number(v) ? json_number_value(v) : NAN);
    if (json_mode) {
        json_object_set_new(f, "interrupted", json_true());
        json_object_set_new(f, "interrupted_during", json_string(atomic_load(&phase)));
        print_json_line(f);
    }
    fflush(NULL);
    _exit(130);
}

/* Before any engine exists, so that every thread inherits the mask. */
static void start_progress_and_signals(void)
{
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    started = now_s();
    pthread_t t;
    pthread_create(&t, NULL, signal_main, &set);
    pthread_detach(t);
    if (interval_s > 0) {
        pthread_create(&t, NULL, progress_main, NULL);
        pthread_detach(t);
    }
}

static void fail_exit(int code, const char *what);

static ferry_engine_t *engine(int spin_us)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.spin_us = spin_us;
    ferry_engine_t *e = NULL;
    if (ferry_engine_create(&cfg, &e) != 0) fail_exit(ferry_last_error_code(), "engine");
    return e;
}

/* A failure: on stderr, and with --json as {"error": {...}} on stdout. */
static void fail_exit(int code, const char *what)
{
    char detail[1200];
    snprintf(detail, sizeof detail, "%s: %s", what, ferry_last_error_detail());
    fprintf(stderr, "bench-completion: %s\n", detail);
    if (json_mode) print_json_error(code, detail);
    fflush(NULL);
    _exit(1);
}

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        int rc_ = (call);                                                                           \
        if (rc_ < 0) {                                                                              \
            fail_exit(rc_, #call);                                                                  \
        }                                                                                           \
    } while (0)

static void idle_cpu(double seconds)
{
    ferry_engine_t *a = engine(0), *b = engine(0);
    static unsigned char src[1 << 20], dst[1 << 20];
    CHECK(ferry_register(a, src, sizeof src, FERRY_MEM_LOCAL));
    CHECK(ferry_register(b, dst, sizeof dst, FERRY_MEM_REMOTE));
    CHECK(ferry_transfer_sync(a, ferry_engine_name(b), FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, sizeof src));
    double c0 = self_cpu_s(), t0 = now_s();
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    double ferry_pct = 100 * (self_cpu_s() - c0) / (now_s() - t0);
    /* Baseline: one thread busy-polling an idle socket for the same time. */
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    c0 = self_cpu_s();
    t0 = now_s();
    struct pollfd p = {.fd = sv[0], .events = POLLIN};
    while (now_s() - t0 < seconds) poll(&p, 1, 0);
    double spin_pct = 100 * (self_cpu_s() - c0) / (now_s() - t0);
    close(sv[0]);
    close(sv[1]);
    json_add("idle_cpu_pct", ferry_pct);
    fprintf(out, "idle CPU over %.1f s: ferry (2 engines, 1 session) %.3f%% of a core; busy-poll baseline %.1f%% "
           "(ratio %.5f)\n",
           seconds, ferry_pct, spin_pct, ferry_pct / (spin_pct > 0 ? spin_pct : 1));
    ferry_deregister(a, src);
    ferry_deregister(b, dst);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
}

static void wait_mode(int spin_us, int n, double *p50, double *p99, double *cpu_us)
{
    ferry_engine_t *a = engine(spin_us), *b = engine(-1); /* the target never spins */
    const char *peer = ferry_engine_name(b);
    static unsigned char src[4096], dst[4096];
    CHECK(ferry_register(a, src, sizeof src, FERRY_MEM_LOCAL));
    CHECK(ferry_register(b, dst, sizeof dst, FERRY_MEM_REMOTE));
    CHECK(ferry_session_open(a, peer));
    double *lat = malloc((size_t)n * sizeof *lat);
    double c0 = self_cpu_s();
    for (int i = 0; i < n; i++) {
        double t = now_s();
        CHECK(ferry_transfer_sync(a, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, sizeof src));
        lat[i] = (now_s() - t) * 1e6;
    }
    *cpu_us = (self_cpu_s() - c0) * 1e6 / n;
    qsort(lat, (size_t)n, sizeof *lat, cmp_double);
    *p50 = lat[n / 2];
    *p99 = lat[n * 99 / 100];
    free(lat);
    ferry_deregister(a, src);
    ferry_deregister(b, dst);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
}

static void cancel_latency(void)
{
    ferry_engine_t *a = engine(0), *b = engine(0);
    const char *peer = ferry_engine_name(b);
    size_t len = 256u << 20;
    unsigned char *src = calloc(1, len), *dst = calloc(1, len);
    CHECK(ferry_register(a, src, len, FERRY_MEM_LOCAL));
    CHECK(ferry_register(b, dst, len, FERRY_MEM_REMOTE));
    CHECK(ferry_session_open(a, peer));
    double t0 = now_s();
    CHECK(ferry_transfer_sync(a, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len));
    double full = now_s() - t0;
    ferry_batch_t *bt;
    CHECK(ferry_batch_alloc(a, 1, &bt));
    ferry_request_t r = {FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len};
    CHECK((int)ferry_batch_submit(bt, peer, &r, 1, 0));
    struct timespec ts = {0, (long)(full * 0.2 * 1e9)};
    nanosleep(&ts, NULL);
    t0 = now_s();
    int rc = ferry_batch_cancel(bt);
    double took = now_s() - t0;
    ferry_status_t st;
    ferry_batch_status(bt, 0, &st);
    json_add("cancel_returned_ms", took * 1e3);
    json_add("cancel_write_full_ms", full * 1e3);
    fprintf(out, "cancel: a 256 MiB write takes %.1f ms; cancelled at 20%% it returned in %.2f ms (%s, %s, %.0f%% sent), "
           "ratio %.3f\n",
           full * 1e3, took * 1e3, rc ? ferry_error_name(rc) : "confirmed",
           st.state == FERRY_STATUS_CANCELLED ? "CANCELLED" : "finished first", 100.0 * (double)st.bytes / len,
           took / full);
    ferry_batch_free(bt);
    ferry_deregister(a, src);
    ferry_deregister(b, dst);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
    free(src);
    free(dst);
}

static void scale_and_short_lived(size_t regions)
{
    ferry_engine_t *a = engine(0), *b = engine(0);
    const char *peer = ferry_engine_name(b);
    size_t region = 256;
    unsigned char *mem = calloc(regions, region);
    void **addrs = malloc(regions * sizeof *addrs);
    size_t *lens = malloc(regions * sizeof *lens);
    for (size_t i = 0; i < regions; i++) {
        addrs[i] = mem + i * region;
        lens[i] = region;
    }
    double t0 = now_s();
    CHECK(ferry_register_batch(b, addrs, lens, regions, FERRY_MEM_REMOTE));
    double t_reg = now_s() - t0;
    t0 = now_s();
    CHECK(ferry_session_open(a, peer));
    double t_open = now_s() - t0;
    ferry_segment_t *segs = malloc(regions * sizeof *segs);
    t0 = now_s();
    long n = ferry_session_segments(a, peer, segs, regions);
    double t_segs = now_s() - t0;
    if (n != (long)regions) {
        fprintf(stderr, "bench-completion: %ld segments of %zu\n", n, regions);
        exit(1);
    }
    static unsigned char buf[4096];
    CHECK(ferry_register(a, buf, sizeof buf, FERRY_MEM_LOCAL));
    unsigned char *late = malloc(4096);
    CHECK(ferry_register(b, late, 4096, FERRY_MEM_REMOTE));
    t0 = now_s();
    CHECK(ferry_transfer_sync(a, peer, FERRY_OP_WRITE, buf, (uint64_t)(uintptr_t)late, 4096));
    double t_late = now_s() - t0;
    json_add("scale_regions", (double)regions);
    json_add("scale_session_open_ms", t_open * 1e3);
    json_add("scale_segment_table_ms", t_segs * 1e3);
    json_add("scale_first_write_late_region_ms", t_late * 1e3);
    fprintf(out, "scale: %zu regions: register_batch %.1f ms, session open %.1f ms, segment table %.1f ms "
           "(%zu pages of 4096), first write to a region registered after %.1f ms\n",
           regions, t_reg * 1e3, t_open * 1e3, t_segs * 1e3, (regions + 4095) / 4096, t_late * 1e3);

    /* Local side, per buffer: register+deregister among N regions (engine
     * b holds them) vs alloc+free from a pool. */
    enum { CYCLES = 20000, TSENDS = 1000 };
    unsigned char *tmp = malloc(64 << 10);
    t0 = now_s();
    for (int i = 0; i < CYCLES; i++) {
        CHECK(ferry_register(b, tmp, 64 << 10, FERRY_MEM_LOCAL));
        CHECK(ferry_deregister(b, tmp));
    }
    double reg_only = (now_s() - t0) / CYCLES;
    ferry_pool_t *pool, *tpool;
    CHECK(ferry_pool_create(b, 64u << 20, FERRY_MEM_LOCAL, &pool));
    t0 = now_s();
    for (int i = 0; i < CYCLES; i++) {
        void *p;
        CHECK(ferry_pool_alloc(pool, 64 << 10, &p));
        CHECK(ferry_pool_free(pool, p));
    }
    double pool_only = (now_s() - t0) / CYCLES;
    /* Target side, per send: SGLang's per-request pattern (register a
     * buffer, take one write, deregister; the allocator hands the same
     * address back) vs the same write into a region registered for good.
     * A write into the range registered now lands the first time. */
    /* Interleaved in rounds, so that load from elsewhere falls on both. */
    enum { ROUNDS = 10 };
    int refused = 0;
    double t_long = 0, t_short = 0;
    CHECK(ferry_register(b, tmp, 64 << 10, FERRY_MEM_REMOTE));
    CHECK(ferry_transfer_sync(a, peer, FERRY_OP_WRITE, buf, (uint64_t)(uintptr_t)tmp, 4096)); /* peer learns it */
    CHECK(ferry_deregister(b, tmp));
    for (int round = 0; round < ROUNDS; round++) {
        CHECK(ferry_register(b, tmp, 64 << 10, FERRY_MEM_REMOTE));
        t0 = now_s();
        for (int i = 0; i < TSENDS / ROUNDS; i++)
            CHECK(ferry_transfer_sync(a, peer, FERRY_OP_WRITE, buf, (uint64_t)(uintptr_t)tmp, 4096));
        t_long += now_s() - t0;
        CHECK(ferry_deregister(b, tmp));
        t0 = now_s();
        for (int i = 0; i < TSENDS / ROUNDS; i++) {
            CHECK(ferry_register(b, tmp, 64 << 10, FERRY_MEM_REMOTE));
            int rc = ferry_transfer_sync(a, peer, FERRY_OP_WRITE, buf, (uint64_t)(uintptr_t)tmp, 4096);
            if (rc) refused++;
            CHECK(ferry_deregister(b, tmp));
        }
        t_short += now_s() - t0;
    }
    double per_long = t_long / TSENDS, per_reg = t_short / TSENDS;
    CHECK(ferry_pool_create(b, 64u << 20, FERRY_MEM_REMOTE, &tpool));
    void *warm;
    CHECK(ferry_pool_alloc(tpool, 4096, &warm));
    CHECK(ferry_transfer_sync(a, peer, FERRY_OP_WRITE, buf, (uint64_t)(uintptr_t)warm, 4096)); /* peer learns it */
    t0 = now_s();
    for (int i = 0; i < TSENDS; i++) {
        void *p;
        CHECK(ferry_pool_alloc(tpool, 64 << 10, &p));
        CHECK(ferry_transfer_sync(a, peer, FERRY_OP_WRITE, buf, (uint64_t)(uintptr_t)p, 4096));
        CHECK(ferry_pool_free(tpool, p));
    }
    double per_pool = (now_s() - t0) / TSENDS;
    fprintf(out, "short-lived buffers, %zu regions registered: register+deregister %.2f us vs pool alloc+free "
            "%.2f us\n", regions, reg_only * 1e6, pool_only * 1e6);
    fprintf(out, "target-side buffer per 4 KiB send: register+write+deregister (same address each time) %.1f us vs "
            "write into a long-lived region %.1f us (ratio %.2f) vs buffer from a known pool %.1f us; %d of %d "
            "per-request writes refused\n",
            per_reg * 1e6, per_long * 1e6, per_reg / per_long, per_pool * 1e6, refused, (int)TSENDS);
    json_add("short_lived_register_deregister_us", reg_only * 1e6);
    json_add("short_lived_pool_alloc_free_us", pool_only * 1e6);
    json_add("per_request_register_write_deregister_us", per_reg * 1e6);
    json_add("long_lived_region_write_us", per_long * 1e6);
    json_add("per_request_vs_long_lived_ratio", per_reg / per_long);
    json_add("pool_buffer_write_us", per_pool * 1e6);
    json_add("per_request_writes_refused", refused);
    ferry_pool_free(tpool, warm);
    ferry_pool_destroy(tpool);
    ferry_pool_destroy(pool);
    ferry_deregister(a, buf);
    ferry_deregister(b, late);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
    free(tmp);
    free(late);
    free(segs);
    free(addrs);
    free(lens);
    free(mem);
}

static int usage(FILE *f)
{
    fprintf(f, "usage: ferry bench-completion [--regions N] [--spin-us US] [--ops N] [--idle-s S] [--interval S]\n"
               "                              [--json]\n"
               "  idle CPU, blocking vs spinning waits, cancel latency, N-region scale,\n"
               "  short-lived registration vs a pre-registered pool (loopback);\n"
               "  --interval S: a progress line (phase, time) every S seconds (1; 0 none);\n"
               "  SIGINT/SIGTERM: the figures measured so far, exit 130;\n"
               "  --json: the figures as one JSON object on stdout, the text on stderr\n");
    return f == stdout ? 0 : 2;
}

static int cmd_bench_completion(int argc, char **argv)
{
    size_t regions = 100000;
    int spin = 50, ops = 2000;
    double idle = 2.0;
    bool json = false;
    enum { O_REGIONS = 256, O_SPIN_US, O_OPS, O_IDLE_S, O_JSON, O_INTERVAL };
    static const struct option options[] = {
        {"regions", required_argument, NULL, O_REGIONS}, {"spin-us", required_argument, NULL, O_SPIN_US},
        {"ops", required_argument, NULL, O_OPS},         {"idle-s", required_argument, NULL, O_IDLE_S},
        {"json", no_argument, NULL, O_JSON},             {"help", no_argument, NULL, 'h'},
        {"interval", required_argument, NULL, O_INTERVAL},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = "bench-completion";
    long v;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case O_REGIONS: if (opt_long(cmd, "regions", optarg, 1, 10000000, &v)) return 2; regions = (size_t)v; break;
        case O_SPIN_US: if (opt_long(cmd, "spin-us", optarg, 0, 1000000, &v)) return 2; spin = (int)v; break;
        case O_OPS: if (opt_long(cmd, "ops", optarg, 10, 100000000, &v)) return 2; ops = (int)v; break;
        case O_IDLE_S: if (opt_double(cmd, "idle-s", optarg, 0.001, 3600, &idle)) return 2; break;
        case O_JSON: json = true; break;
        case O_INTERVAL: if (opt_double(cmd, "interval", optarg, 0, 3600, &interval_s)) return 2; break;
        case 'h': return usage(stdout);
        default: return usage(stderr); /* getopt_long named the problem */
        }
    }
    if (opt_none_left("bench-completion", argc, argv) != 0) return usage(stderr);
    out = json ? stderr : stdout;
    json_mode = json;
    start_progress_and_signals();
    set_phase("idle CPU");
    idle_cpu(idle);
    set_phase("wait modes");
    double b50, b99, bcpu, s50, s99, scpu;
    wait_mode(-1, ops, &b50, &b99, &bcpu);
    wait_mode(spin, ops, &s50, &s99, &scpu);
    json_add("wait_blocking_p50_us", b50);
    json_add("wait_blocking_p99_us", b99);
    json_add("wait_spin_p50_us", s50);
    json_add("wait_spin_p99_us", s99);
    fprintf(out, "wait modes, 4 KiB sync write round trip, %d ops: blocking p50 %.1f us p99 %.1f us, %.1f us CPU/op; "
           "spin_us=%d p50 %.1f us p99 %.1f us, %.1f us CPU/op (p50 ratio %.2f)\n",
           ops, b50, b99, bcpu, spin, s50, s99, scpu, s50 / b50);
    set_phase("cancel latency");
    cancel_latency();
    set_phase("N-region scale and short-lived buffers");
    scale_and_short_lived(regions);
    pthread_mutex_lock(&fields_lock); /* a signal now finds the run complete */
    if (json) print_json_line(json_fields ? json_fields : json_object());
    else json_decref(json_fields);
    json_fields = NULL;
    fflush(NULL);
    _exit(0); /* the signal thread still waits: no return through exit handlers racing it */
}

FERRY_COMMAND("bench-completion", cmd_bench_completion,
              "measure idle CPU, wait modes, cancel latency, 100k-region scale, pools")
