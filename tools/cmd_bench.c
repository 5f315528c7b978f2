/* SPDX-License-Identifier: Apache-2.0 */
/* ferry bench: throughput and latency of Ferry transfers, in the manner of
 * Mooncake's transfer_engine_bench, plus the baselines and the
 * housekeeping figures bench/compare reports.
 *
 *   ferry bench --local [OPTIONS]           forks a target, runs an initiator
 *   ferry bench target [--bind A] [--port P] serves a registered buffer on
 *                                           every interface, port 7070
 *   ferry bench initiator --peer H[:P] [OPTIONS]  finds the target's buffer
 *                                           through the handshake (segments)
 *   ferry bench baseline memcpy|memfd|cma [--block-size S] ...
 *   ferry bench extras                      registration, sessions, idle CPU
 *
 * Throughput is bytes confirmed complete per wall-clock second (GB/s =
 * 1e9 bytes/s); latency is measured per call (one batch of --batch-size
 * requests), reported as p50/p99/p999. --interval prints progress lines,
 * SIGINT ends the run with its summary so far, --sweep measures every
 * block size x batch size (CSV, JSON, --plot SVG), --check verifies the
 * bytes moved. */
#include <errno.h>
#include <getopt.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include <ferry/ferry.h>
#include <ferry/pool.h>

#include "cli.h"
#include "bench.h"
#include "opts.h"
#include "svg_plot.h"
#include "util.h"

/* ---------------------------------------------------------------- target */

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { (void)sig; stop_flag = 1; }

/* Serves a registered buffer; writes its JSON line to fd out. */
static int run_target(const struct opts *o, int out)
{
    size_t len = o->buffer ? o->buffer : (size_t)1 << 30;
    ferry_engine_t *e;
    ferry_pool_t *pool = NULL;
    void *buf = NULL;
    if (o->shared_pool) {
        if (make_engine(o, o->port, &e) != 0) return 1;
        size_t cap = 4096; /* a buddy pool hands out powers of two */
        while (cap < len) cap *= 2;
        if (ferry_pool_create_shared(e, cap, FERRY_MEM_REMOTE, &pool) != 0 || ferry_pool_alloc(pool, len, &buf) != 0) {
            fprintf(stderr, "ferry bench target: shared pool of %zu bytes: %s\n", len, ferry_last_error_detail());
            return 1;
        }
        memset(buf, 1, len); /* touched, as alloc_touched does */
    } else {
        buf = alloc_touched(len);
        if (!buf) {
            fprintf(stderr, "ferry bench target: cannot allocate %zu bytes\n", len);
            return 1;
        }
        if (make_engine(o, o->port, &e) != 0) return 1;
    }
    if (!pool && ferry_register(e, buf, len, FERRY_MEM_REMOTE) != 0) {
        fprintf(stderr, "ferry bench target: register: %s\n", ferry_last_error_detail());
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    /* The --local target leaves Ctrl-C (sent to the whole process group) to
     * its initiator, which may still need it for the summary and --check. */
    if (o->local) signal(SIGINT, SIG_IGN);
    else sigaction(SIGINT, &sa, NULL);
    if (write_ready_line(out, e, buf, len) != 0) return 1;
    if (!o->local) print_listening("bench target", e, len);
    double end = o->duration > 0 && !o->local ? now_s() + o->duration : 0;
    while (!stop_flag && (end == 0 || now_s() < end)) {
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    if (pool) ferry_pool_destroy(pool);
    ferry_engine_destroy(e);
    if (!pool) munmap(buf, len);
    return 0;
}

struct target_proc {
    pid_t pid;
    char name[300];
    uint64_t addr;
    size_t len;
};

/* Forks a target serving len bytes; waits for its line. */
static int spawn_target(const struct opts *o, size_t len, struct target_proc *t)
{
    int p[2];
    if (pipe(p) != 0) return -1;
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        /* The target dies with its initiator, however that ends (as demo's
         * ranks do); a parent gone before prctl is caught by getppid. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        close(p[0]);
        struct opts to = *o;
        to.buffer = len;
        to.port = 0;
        to.host = "127.0.0.1";
        to.local = 1; /* serve until killed */
        _exit(run_target(&to, p[1]));
    }
    close(p[1]);
    char line[512];
    size_t n = 0;
    while (n < sizeof line - 1) {
        ssize_t k = read(p[0], line + n, 1);
        if (k <= 0 || line[n] == '\n') break;
        n++;
    }
    line[n] = '\0';
    close(p[0]);
    json_t *ready = json_loads(line, 0, NULL);
    const char *name = NULL;
    json_int_t addr = 0;
    if (!ready || json_unpack(ready, "{s:s,s:I}", "name", &name, "addr", &addr) != 0) {
        fprintf(stderr, "ferry bench: the target did not start\n");
        json_decref(ready);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    snprintf(t->name, sizeof t->name, "%s", name);
    t->addr = (uint64_t)addr;
    json_decref(ready);
    t->len = len;
    t->pid = pid;
    return 0;
}

static void stop_target(struct target_proc *t)
{
    kill(t->pid, SIGTERM);
    int st;
    waitpid(t->pid, &st, 0);
}

/* ------------------------------------------------------------- initiator */

struct worker {
    const struct opts *o;
    size_t block, batch, nblocks; /* this point's (a sweep changes them) */
    ferry_engine_t *e;
    const char *peer;
    unsigned char *local;
    uint64_t remote;
    void **locals;
    uint64_t *remotes;
    size_t *lens;
    double start, stop;
    double *lat;
    size_t nlat, caplat;
    _Atomic uint64_t bytes, calls; /* read by the progress lines while it runs */
    int rc;
    char detail[512];
};

/* One call: the batch's requests, or with --strided one descriptor whose
 * index lists name the same blocks (lidx, ridx). */
static int one_call(struct worker *w, const uint64_t *lidx, const uint64_t *ridx)
{
    const struct opts *o = w->o;
    if (!o->strided) return ferry_batch_transfer_sync(w->e, w->peer, o->op, w->locals, w->remotes, w->lens, w->batch);
    ferry_strided_t d = {.opcode = o->op, .local_base = w->local, .local_stride = w->block, .remote_base = w->remote,
                         .remote_stride = w->block, .piece_len = w->block, .local_idx = lidx, .remote_idx = ridx,
                         .n = w->batch};
    return ferry_strided_transfer_sync(w->e, w->peer, &d);
}

/* Calls until w->stop (or SIGINT) after warming up until w->start,
 * recording each call's latency; 0 or the first failure (its detail in
 * w->detail). */
static int worker_loop(struct worker *w, const uint64_t *lidx, const uint64_t *ridx)
{
    while (now_s() < w->start && !stop_flag) {
        int rc = one_call(w, lidx, ridx);
        if (rc) {
            snprintf(w->detail, sizeof w->detail, "%s", ferry_last_error_detail());
            return rc;
        }
    }
    while (!stop_flag) {
        double t0 = now_s();
        if (t0 >= w->stop) break;
        int rc = one_call(w, lidx, ridx);
        double t1 = now_s();
        if (rc) {
            snprintf(w->detail, sizeof w->detail, "%s", ferry_last_error_detail());
            return rc;
        }
        if (w->nlat == w->caplat) {
            w->caplat = w->caplat ? w->caplat * 2 : 65536;
            double *n = realloc(w->lat, w->caplat * sizeof *n);
            if (!n) return FERRY_ERR_MEMORY;
            w->lat = n;
        }
        w->lat[w->nlat++] = (t1 - t0) * 1e6;
        atomic_fetch_add_explicit(&w->bytes, (uint64_t)w->batch * w->block, memory_order_relaxed);
        atomic_fetch_add_explicit(&w->calls, 1, memory_order_relaxed);
    }
    return 0;
}

/* Request i of a call uses block i * nblocks / batch: with --blocks 2 the
 * two halves of a batch (one per connection) each reuse one block. */
static size_t block_of(const struct worker *w, size_t i, size_t mul)
{
    size_t k = i * w->nblocks / w->batch;
    return w->o->scatter ? scatter_slot(k, w->nblocks, mul) : k;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    size_t b = w->batch;
    uint64_t *lidx = calloc(b, sizeof *lidx), *ridx = calloc(b, sizeof *ridx);
    if (!lidx || !ridx || !w->locals || !w->remotes || !w->lens) {
        free(lidx);
        free(ridx);
        w->rc = FERRY_ERR_MEMORY;
        snprintf(w->detail, sizeof w->detail, "out of memory for %zu requests a call", b);
        return NULL;
    }
    for (size_t i = 0; i < b; i++) {
        size_t lk = block_of(w, i, 613), rk = block_of(w, i, 733);
        w->locals[i] = w->local + lk * w->block;
        w->remotes[i] = w->remote + rk * w->block;
        w->lens[i] = w->block;
        lidx[i] = lk;
        ridx[i] = rk;
    }
    w->rc = worker_loop(w, lidx, ridx);
    free(lidx);
    free(ridx);
    return NULL;
}

/* The initiator's engine, its session to the target, the target's buffer
 * and the local one (sized for the largest point of a sweep). */
struct conn {
    ferry_engine_t *e;
    const char *peer;
    uint64_t raddr;
    size_t rlen;
    pid_t target_pid;   /* --local: the forked target, for its CPU time */
    unsigned char *local;
    size_t local_len;
    ferry_peer_info_t info;
};

/* One measured point. */
struct result {
    size_t block, batch, nblocks;
    double wall, cpu, tcpu; /* tcpu < 0: not known */
    uint64_t bytes, calls;
    double p50, p99, p999, max, mean;
    int rc;
    int interrupted;
    int checked;       /* --check ran */
    int check_ok;
    char check_detail[200];
};

static double gb_per_s(const struct result *r) { return r->wall > 0 ? (double)r->bytes / r->wall / 1e9 : 0; }

/* Prints a failure: always on stderr; with --json also as one object on
 * stdout, {"error": {"code", "name", "detail"}}, as iperf3 prints its
 * {"error": ...}. Returns 1 (the exit status). */
static int bench_fail(const struct opts *o, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bench_fail(const struct opts *o, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int status = cli_vfail("bench", o->json, 1, code, fmt, ap);
    va_end(ap);
    return status;
}

/* The target's buffer: --remote-addr/--remote-len when given (overrides),
 * else the largest remote-accessible segment the handshake announced. */
static int resolve_remote(const struct opts *o, struct conn *c)
{
    if (o->remote_addr && o->remote_len) {
        c->raddr = o->remote_addr;
        c->rlen = o->remote_len;
        return 0;
    }
    ferry_segment_t segs[64];
    long n = ferry_session_segments(c->e, c->peer, segs, 64);
    if (n < 0) return bench_fail(o, (int)n, "segments of %s: %s", c->peer, ferry_last_error_detail());
    if (n == 0) return bench_fail(o, FERRY_ERR_ADDRESS_NOT_REGISTERED, "%s has no remote-accessible buffer", c->peer);
    size_t best = 0, have = n < 64 ? (size_t)n : 64;
    for (size_t i = 0; i < have; i++) {
        if (o->remote_addr && o->remote_addr >= segs[i].addr && o->remote_addr < segs[i].addr + segs[i].len) {
            c->raddr = o->remote_addr; /* --remote-addr alone: to its segment's end */
            c->rlen = (size_t)(segs[i].addr + segs[i].len - o->remote_addr);
            return 0;
        }
        if (segs[i].len > segs[best].len) best = i;
    }
    if (o->remote_addr)
        return bench_fail(o, FERRY_ERR_ADDRESS_NOT_REGISTERED, "--remote-addr 0x%llx is in no segment of %s",
                          (unsigned long long)o->remote_addr, c->peer);
    c->raddr = segs[best].addr;
    c->rlen = o->remote_len && o->remote_len < segs[best].len ? o->remote_len : (size_t)segs[best].len;
    return 0;
}

/* A transport asked for (--transport, FERRY_TRANSPORT) is what runs, or the
 * run fails saying why: the library falls back to TCP, a benchmark must not
 * measure TCP under another name. */
static int check_forced_transport(const struct opts *o, const struct conn *c)
{
    const char *want = o->transport && strcmp(o->transport, "auto") != 0 ? o->transport : getenv("FERRY_TRANSPORT");
    if (!want || !*want || strcmp(want, "auto") == 0 || strcmp(want, c->info.transport) == 0) return 0;
    return bench_fail(o, FERRY_ERR_NOT_IMPLEMENTED, "transport %s was asked for but cannot be used with %s: %s", want,
                      c->peer, c->info.transport_reason);
}

static int conn_open(const struct opts *o, const char *peer, size_t local_len, struct conn *c)
{
    memset(c, 0, sizeof *c);
    c->peer = peer;
    if (make_engine(o, 0, &c->e) != 0) { /* make_engine said why on stderr */
        if (o->json) print_json_error(ferry_last_error_code(), ferry_last_error_detail());
        return 1;
    }
    if (ferry_session_open(c->e, peer) != 0)
        return bench_fail(o, ferry_last_error_code(), "%s", ferry_last_error_detail());
    ferry_session_info(c->e, peer, &c->info);
    if (check_forced_transport(o, c) || resolve_remote(o, c)) return 1;
    if (local_len > c->rlen)
        return bench_fail(o, FERRY_ERR_INVALID_ARGUMENT,
                          "%d thread(s) x %zu blocks x %zu bytes (%zu) exceed the remote buffer (%zu)", o->threads,
                          nblocks(o), o->block, local_len, c->rlen);
    c->local = alloc_touched(local_len);
    if (!c->local || ferry_register(c->e, c->local, local_len, FERRY_MEM_LOCAL) != 0)
        return bench_fail(o, c->local ? ferry_last_error_code() : FERRY_ERR_MEMORY, "local buffer of %zu bytes: %s",
                          local_len, c->local ? ferry_last_error_detail() : "out of memory");
    c->local_len = local_len;
    return 0;
}

static void conn_close(struct conn *c)
{
    if (c->e) ferry_engine_destroy(c->e);
    if (c->local) munmap(c->local, c->local_len);
}

/* --check: a pattern that differs per byte position and per run. */
static unsigned char pattern_byte(size_t i, unsigned seed) { return (unsigned char)((i * 131 + (i >> 13) + seed) & 0xff); }

/* Before the run: the bytes the transfers should move. For a write, the
 * local blocks; for a read, the remote ones (written once, then the local
 * blocks cleared so that only the reads can fill them). */
static int check_prepare(const struct opts *o, struct conn *c, size_t used, unsigned seed)
{
    for (size_t i = 0; i < used; i++) c->local[i] = pattern_byte(i, seed);
    if (o->op == FERRY_OP_WRITE) return 0;
    if (ferry_transfer_sync(c->e, c->peer, FERRY_OP_WRITE, c->local, c->raddr, used) != 0) return -1;
    memset(c->local, 0, used);
    return 0;
}

/* After the run: the target's blocks (read back) or the local ones (after
 * reads) hold the pattern, wherever a request went. */
static void check_verify(const struct opts *o, struct conn *c, size_t used, unsigned seed, struct result *r)
{
    r->checked = 1;
    unsigned char *got = c->local;
    if (o->op == FERRY_OP_WRITE) {
        got = alloc_touched(used);
        if (!got || ferry_register(c->e, got, used, FERRY_MEM_LOCAL) != 0 ||
            ferry_transfer_sync(c->e, c->peer, FERRY_OP_READ, got, c->raddr, used) != 0) {
            snprintf(r->check_detail, sizeof r->check_detail, "reading the target's bytes back: %s",
                     ferry_last_error_detail());
            if (got) munmap(got, used);
            return;
        }
    }
    /* A test hook: FERRY_BENCH_TEST_CORRUPT=N flips byte N of what came
     * back, to show that the check fails when the bytes are wrong. */
    const char *corrupt = getenv("FERRY_BENCH_TEST_CORRUPT");
    if (corrupt && (size_t)atol(corrupt) < used) got[atol(corrupt)] ^= 0xff;
    r->check_ok = 1;
    size_t per_thread = r->nblocks * r->block;
    for (size_t t = 0; t < used / per_thread && r->check_ok; t++) {
        for (size_t k = 0; k < r->nblocks && r->check_ok; k++) {
            /* Block k of a call moves local slot lk <-> remote slot rk (the
             * same slot unless --scatter): a write puts the local pattern
             * at rk, a read brings the remote pattern to lk. */
            size_t lk = o->scatter ? scatter_slot(k, r->nblocks, 613) : k;
            size_t rk = o->scatter ? scatter_slot(k, r->nblocks, 733) : k;
            size_t at = t * per_thread + (o->op == FERRY_OP_WRITE ? rk : lk) * r->block;
            size_t from = t * per_thread + (o->op == FERRY_OP_WRITE ? lk : rk) * r->block;
            for (size_t j = 0; j < r->block; j++) {
                if (got[at + j] != pattern_byte(from + j, seed)) {
                    r->check_ok = 0;
                    snprintf(r->check_detail, sizeof r->check_detail,
                             "byte %zu (block %zu, offset %zu) is 0x%02x, expected 0x%02x", at + j, (at + j) / r->block,
                             j, got[at + j], pattern_byte(from + j, seed));
                    break;
                }
            }
        }
    }
    if (got != c->local) {
        ferry_deregister(c->e, got);
        munmap(got, used);
    }
}

/* Progress lines every --interval seconds while the workers run, in the
 * manner of iperf3's: the interval's throughput and calls. */
static void progress_until_done(const struct opts *o, struct worker *ws, double wall0)
{
    double next = wall0 + o->interval, last_t = wall0;
    uint64_t last_bytes = 0, last_calls = 0;
    for (;;) {
        int running = 0;
        for (int t = 0; t < o->threads; t++) running |= now_s() < ws[t].stop && !stop_flag;
        if (o->interval <= 0 && !running) return;
        struct timespec ts = {0, 20 * 1000000};
        if (running) nanosleep(&ts, NULL);
        double t = now_s();
        /* The last, partial interval too, as iperf3 prints it. */
        if (!running && t - last_t < 0.01) return;
        if (running && (o->interval <= 0 || t < next)) continue;
        uint64_t bytes = 0, calls = 0;
        for (int i = 0; i < o->threads; i++) {
            bytes += atomic_load_explicit(&ws[i].bytes, memory_order_relaxed);
            calls += atomic_load_explicit(&ws[i].calls, memory_order_relaxed);
        }
        double dt = t - last_t;
        printf("[%6.2f-%6.2f s]  %8.3f GB/s  %10.0f calls/s\n", last_t - wall0, t - wall0,
               (double)(bytes - last_bytes) / dt / 1e9, (double)(calls - last_calls) / dt);
        fflush(stdout);
        last_t = t;
        last_bytes = bytes;
        last_calls = calls;
        next = t + o->interval;
        if (!running) return;
    }
}

/* Measures one point (block x batch) over the open connection. */
static void measure(const struct opts *o, struct conn *c, size_t block, size_t batch, struct result *r)
{
    struct opts po = *o;
    po.block = block;
    po.batch = batch;
    size_t nb = nblocks(&po), per_thread = nb * block, used = (size_t)o->threads * per_thread;
    memset(r, 0, sizeof *r);
    r->block = block;
    r->batch = batch;
    r->nblocks = nb;
    r->tcpu = -1;
    unsigned seed = (unsigned)(block * 7 + batch);
    if (o->check && check_prepare(o, c, used, seed) != 0) {
        r->rc = ferry_last_error_code();
        snprintf(r->check_detail, sizeof r->check_detail, "writing the pattern: %s", ferry_last_error_detail());
        return;
    }
    struct worker *ws = calloc((size_t)o->threads, sizeof *ws);
    pthread_t *tids = calloc((size_t)o->threads, sizeof *tids);
    if (!ws || !tids) {
        free(ws);
        free(tids);
        r->rc = FERRY_ERR_MEMORY;
        return;
    }
    double start = now_s() + o->warmup, stop = start + o->duration;
    for (int t = 0; t < o->threads; t++) {
        struct worker *w = &ws[t];
        w->o = o;
        w->block = block;
        w->batch = batch;
        w->nblocks = nb;
        w->e = c->e;
        w->peer = c->peer;
        w->local = c->local + (size_t)t * per_thread;
        w->remote = c->raddr + (uint64_t)t * per_thread;
        w->locals = calloc(batch, sizeof *w->locals);
        w->remotes = calloc(batch, sizeof *w->remotes);
        w->lens = calloc(batch, sizeof *w->lens);
        w->start = start;
        w->stop = stop;
    }
    for (int t = 0; t < o->threads; t++) pthread_create(&tids[t], NULL, worker_main, &ws[t]);
    /* CPU from the end of the warmup on. */
    while (now_s() < start && !stop_flag) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    double cpu0 = self_cpu_s(), tcpu0 = c->target_pid ? proc_cpu_s(c->target_pid) : 0;
    double wall0 = now_s();
    if (!o->sweep && !o->json) progress_until_done(o, ws, wall0);
    for (int t = 0; t < o->threads; t++) pthread_join(tids[t], NULL);
    r->wall = now_s() - wall0;
    r->cpu = self_cpu_s() - cpu0;
    if (c->target_pid) r->tcpu = proc_cpu_s(c->target_pid) - tcpu0;
    r->interrupted = stop_flag != 0;
    size_t nlat = 0;
    for (int t = 0; t < o->threads; t++) {
        if (ws[t].rc && !r->rc) {
            r->rc = ws[t].rc;
            fprintf(stderr, "ferry bench: thread %d: %s\n", t, ws[t].detail);
        }
        r->bytes += ws[t].bytes;
        r->calls += ws[t].calls;
        nlat += ws[t].nlat;
    }
    double *lat = malloc((nlat ? nlat : 1) * sizeof *lat);
    size_t k = 0;
    double sum = 0;
    for (int t = 0; t < o->threads; t++) {
        if (ws[t].nlat) memcpy(lat + k, ws[t].lat, ws[t].nlat * sizeof *lat);
        k += ws[t].nlat;
    }
    for (size_t i = 0; i < nlat; i++) sum += lat[i];
    qsort(lat, nlat, sizeof *lat, cmp_double);
    r->p50 = pct(lat, nlat, 0.50);
    r->p99 = pct(lat, nlat, 0.99);
    r->p999 = pct(lat, nlat, 0.999);
    r->max = nlat ? lat[nlat - 1] : 0;
    r->mean = nlat ? sum / (double)nlat : 0;
    free(lat);
    for (int t = 0; t < o->threads; t++) {
        free(ws[t].lat);
        free(ws[t].locals);
        free(ws[t].remotes);
        free(ws[t].lens);
    }
    free(ws);
    free(tids);
    if (o->check && !r->rc) check_verify(o, c, used, seed, r);
    /* The transport may have changed at the first transfer (a target that
     * refuses shm): report the one that ran. */
    ferry_session_info(c->e, c->peer, &c->info);
}

static json_t *result_json(const struct opts *o, const struct conn *c, const struct result *r)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    ferry_config_from_env(&cfg);
    int conns = o->conns > 0 ? o->conns : cfg.conns_per_peer;
    int spin = o->spin_us != SPIN_FROM_CONFIG ? o->spin_us : cfg.spin_us;
    double reqs = (double)(r->calls * (uint64_t)r->batch);
    json_t *target_cpu = r->wall > 0 && r->tcpu >= 0 ? json_real(r->tcpu / r->wall) : json_null();
    json_t *check = !r->checked ? json_null()
                                : json_pack("{s:b,s:s}", "ok", r->check_ok, "detail", r->check_ok ? "" : r->check_detail);
    return json_pack("{s:s,s:s,s:I,s:I,s:i,s:i,s:I,s:b,s:b,s:i,s:s,s:s,s:s,s:f,s:I,s:I,s:I,s:f,s:f,"
                     "s:{s:f,s:f,s:f,s:f,s:f},s:{s:f,s:o},s:o,s:b,s:b}",
                     "tool", "ferry", "op", o->op == FERRY_OP_WRITE ? "write" : "read", "block_size",
                     (json_int_t)r->block, "batch_size", (json_int_t)r->batch, "threads", o->threads, "conns", conns,
                     "blocks", (json_int_t)r->nblocks, "scatter", o->scatter, "hugepages", use_hugepages, "spin_us",
                     spin, "transport", c->info.transport, "transport_reason", c->info.transport_reason, "peer",
                     c->peer, "seconds", r->wall, "bytes", (json_int_t)r->bytes, "calls", (json_int_t)r->calls,
                     "requests", (json_int_t)(r->calls * (uint64_t)r->batch), "gb_per_s", gb_per_s(r), "req_per_s",
                     r->wall > 0 ? reqs / r->wall : 0.0, "lat_us", "p50", r->p50, "p99", r->p99, "p999", r->p999,
                     "max", r->max, "mean", r->mean, "cpu_cores", "initiator", r->wall > 0 ? r->cpu / r->wall : 0,
                     "target", target_cpu, "check", check, "interrupted", r->interrupted,
                     "ok", r->rc == 0 && (!r->checked || r->check_ok));
}

static void print_result_text(const struct opts *o, const struct conn *c, const struct result *r)
{
    int spin = o->spin_us;
    if (spin == SPIN_FROM_CONFIG) {
        ferry_config_t cfg;
        ferry_config_init(&cfg);
        ferry_config_from_env(&cfg);
        spin = cfg.spin_us;
    }
    char bs[32];
    fmt_size(r->block, bs, sizeof bs);
    double reqs = (double)(r->calls * (uint64_t)r->batch);
    printf("ferry bench: %s %s x %zu per call (%zu distinct blocks), %d thread(s) to %s%s\n",
           o->op == FERRY_OP_WRITE ? "write" : "read", bs, r->batch, r->nblocks, o->threads, c->peer,
           r->interrupted ? " (interrupted: the summary so far)" : "");
    char reason[400];
    fmt_transport_reason(c->info.transport_reason, sizeof c->info.transport_reason, reason, sizeof reason);
    printf("  transport   %s (%s)\n", c->info.transport, reason);
    printf("  throughput  %.3f GB/s  (%.1f MiB/s), %" PRIu64 " calls, %.0f requests in %.2f s (%.0f/s)\n",
           gb_per_s(r), r->wall > 0 ? (double)r->bytes / r->wall / 1048576.0 : 0, r->calls, reqs, r->wall,
           r->wall > 0 ? reqs / r->wall : 0);
    printf("  latency     per call: p50 %.1f us, p99 %.1f us, p999 %.1f us, max %.1f us, mean %.1f us (%s)\n", r->p50,
           r->p99, r->p999, r->max, r->mean,
           spin > 0 ? "busy-polls first" : spin < 0 ? "blocking waits" : "adaptive spin");
    printf("  cpu         initiator %.0f%% of a core", r->wall > 0 ? 100 * r->cpu / r->wall : 0);
    if (r->tcpu >= 0 && r->wall > 0) printf(", target %.0f%%", 100 * r->tcpu / r->wall);
    printf("\n");
    if (r->checked) printf("  check       %s\n", r->check_ok ? "ok: every byte moved is right" : r->check_detail);
}

/* ------------------------------------------------------------------ sweep */

static void print_csv_header(void)
{
    printf("block_size_bytes,batch_size,threads,seconds,bytes,calls,gb_per_s,req_per_s,lat_p50_us,lat_p99_us,"
           "lat_p999_us,check\n");
}

static void print_csv_row(const struct opts *o, const struct result *r)
{
    double reqs = (double)(r->calls * (uint64_t)r->batch);
    printf("%zu,%zu,%d,%.4f,%" PRIu64 ",%" PRIu64 ",%.4f,%.1f,%.2f,%.2f,%.2f,%s\n", r->block, r->batch, o->threads,
           r->wall, r->bytes, r->calls, gb_per_s(r), r->wall > 0 ? reqs / r->wall : 0, r->p50, r->p99, r->p999,
           !r->checked ? "" : r->check_ok ? "ok" : "failed");
}

/* The sweep's picture: GB/s over block size, one line per batch size. */
static int write_sweep_plot(const struct opts *o, const struct conn *c, const struct result *rs, int n)
{
    struct svg_series series[32];
    double xs[32][32], ys[32][32];
    char names[32][48];
    int ns = 0;
    for (int b = 0; b < o->nsweep_batch; b++) {
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (rs[i].batch != o->sweep_batch[b]) continue;
            xs[b][k] = (double)rs[i].block;
            ys[b][k] = gb_per_s(&rs[i]);
            k++;
        }
        if (!k) continue;
        snprintf(names[ns], sizeof names[ns], "batch %zu", o->sweep_batch[b]);
        series[ns] = (struct svg_series){names[ns], xs[b], ys[b], k};
        ns++;
    }
    char title[160];
    snprintf(title, sizeof title, "ferry bench %s, %s, %d thread(s)", o->op == FERRY_OP_WRITE ? "write" : "read",
             c->info.transport, o->threads);
    struct svg_lines chart = {.title = title, .x_label = "block size (bytes per request, log scale)",
                              .y_label = "throughput (GB/s, 1 GB = 10^9 bytes)", .x_log2_sizes = 1,
                              .series = series, .nseries = ns};
    if (svg_write_lines(o->plot, &chart) != 0)
        return bench_fail(o, FERRY_ERR_INVALID_ARGUMENT, "--plot %s: %s", o->plot, strerror(errno));
    fprintf(stderr, "ferry bench: plot written to %s\n", o->plot);
    return 0;
}

static int run_sweep(const struct opts *o, struct conn *c)
{
    int n = 0, rc = 0;
    struct result *rs = calloc((size_t)(o->nsweep_block * o->nsweep_batch), sizeof *rs);
    if (!rs) return bench_fail(o, FERRY_ERR_MEMORY, "out of memory");
    if (o->csv) print_csv_header();
    for (int b = 0; b < o->nsweep_batch && !stop_flag; b++) {
        for (int k = 0; k < o->nsweep_block && !stop_flag; k++) {
            struct result *r = &rs[n++];
            measure(o, c, o->sweep_block[k], o->sweep_batch[b], r);
            if (r->rc || (r->checked && !r->check_ok)) rc = 1;
            if (o->csv) print_csv_row(o, r);
            else if (o->json) print_json_line(result_json(o, c, r));
            else {
                char bs[32];
                fmt_size(r->block, bs, sizeof bs);
                printf("%10s x %-5zu %9.3f GB/s  p50 %8.1f us  p99 %8.1f us%s%s\n", bs, r->batch, gb_per_s(r), r->p50,
                       r->p99, r->checked ? (r->check_ok ? "  check ok" : "  CHECK FAILED: ") : "",
                       r->checked && !r->check_ok ? r->check_detail : "");
            }
            fflush(stdout);
            if (r->rc) break;
        }
    }
    if (!rc) rc = check_forced_transport(o, c);
    if (o->plot && n && write_sweep_plot(o, c, rs, n) != 0) rc = 1;
    free(rs);
    return rc;
}

/* The bytes the largest point needs locally (and at the target). */
static size_t bytes_needed(const struct opts *o)
{
    size_t most = 0;
    for (int b = 0; b < (o->sweep ? o->nsweep_batch : 1); b++) {
        for (int k = 0; k < (o->sweep ? o->nsweep_block : 1); k++) {
            struct opts po = *o;
            if (o->sweep) {
                po.block = o->sweep_block[k];
                po.batch = o->sweep_batch[b];
            }
            size_t need = (size_t)o->threads * nblocks(&po) * po.block;
            if (need > most) most = need;
        }
    }
    return most;
}

static void on_interrupt(int sig) { (void)sig; stop_flag = 1; }

static int run_initiator(const struct opts *o, const char *peer, pid_t target_pid)
{
    struct conn c;
    /* SIGINT/SIGTERM end the run early with the summary so far (iperf3). */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = conn_open(o, peer, bytes_needed(o), &c);
    c.target_pid = target_pid;
    if (rc == 0 && o->sweep) rc = run_sweep(o, &c);
    else if (rc == 0) {
        if (!o->json && o->interval > 0) {
            char bs[32];
            fmt_size(o->block, bs, sizeof bs);
            printf("ferry bench: %s %s x %zu to %s over %s, %.1f s (Ctrl-C ends it with the summary so far)\n",
                   o->op == FERRY_OP_WRITE ? "write" : "read", bs, o->batch, peer, c.info.transport, o->duration);
        }
        struct result r;
        measure(o, &c, o->block, o->batch, &r);
        if (check_forced_transport(o, &c) != 0) {
            conn_close(&c);
            return 1;
        }
        if (o->json) print_json_line(result_json(o, &c, &r));
        else print_result_text(o, &c, &r);
        rc = r.rc || (r.checked && !r.check_ok) ? 1 : 0;
        if (r.checked && !r.check_ok) fprintf(stderr, "ferry bench: --check failed: %s\n", r.check_detail);
    }
    conn_close(&c);
    return rc;
}

/* ------------------------------------------------------------------ main */

/* --peer HOST means HOST:7070, the default port of `ferry bench target`. */
static const char *peer_with_port(const char *peer, char *buf, size_t cap)
{
    const char *colon = strrchr(peer, ':'), *bracket = strrchr(peer, ']');
    int has_port = colon && (peer[0] != '[' || (bracket && colon > bracket));
    if (peer[0] != '[' && colon && strchr(peer, ':') != colon) has_port = 0; /* a bare IPv6 address */
    if (has_port) return peer;
    if (peer[0] != '[' && strchr(peer, ':')) snprintf(buf, cap, "[%s]:%d", peer, FERRY_BENCH_DEFAULT_PORT);
    else snprintf(buf, cap, "%s:%d", peer, FERRY_BENCH_DEFAULT_PORT);
    return buf;
}

static int parse_bench(int argc, char **argv, int first, void *o) { return bench_parse_opts(argc, argv, first, o); }

/* bench_parse_opts, and with --json among the words a failure also as the
 * {"error"} object (parse_json_aware). */
static int parse_opts_json_aware(int argc, char **argv, int first, struct opts *o)
{
    return parse_json_aware(args_have(argc, argv, first, "--json"), parse_bench, argc, argv, first, o);
}

static int cmd_bench(int argc, char **argv)
{
    struct opts o;
    bench_opts_init(&o);
    if (argc >= 2 && strcmp(argv[1], "target") == 0) {
        if (parse_opts_json_aware(argc, argv, 2, &o)) return 2;
        /* The target serves until killed unless --duration was given. */
        if (!o.duration_set) o.duration = 0;
        o.host = o.bind ? o.bind : o.host ? o.host : "0.0.0.0";
        if (o.port < 0) o.port = FERRY_BENCH_DEFAULT_PORT;
        setvbuf(stdout, NULL, _IONBF, 0);
        return run_target(&o, STDOUT_FILENO);
    }
    if (argc >= 2 && strcmp(argv[1], "initiator") == 0) {
        if (parse_opts_json_aware(argc, argv, 2, &o)) return 2;
        if (!o.peer) {
            fprintf(stderr, "ferry bench initiator: needs --peer HOST[:PORT] (a `ferry bench target` or `ferry serve`; "
                            "port %d by default)\n", FERRY_BENCH_DEFAULT_PORT);
            return 2;
        }
        char peer[300];
        return run_initiator(&o, peer_with_port(o.peer, peer, sizeof peer), 0);
    }
    if (argc >= 3 && strcmp(argv[1], "baseline") == 0 && strcmp(argv[2], "-h") && strcmp(argv[2], "--help")) {
        if (parse_opts_json_aware(argc, argv, 3, &o)) return 2;
        return baseline(&o, argv[2]);
    }
    if (argc >= 2 && strcmp(argv[1], "extras") == 0) {
        if (parse_opts_json_aware(argc, argv, 2, &o)) return 2;
        return extras(&o);
    }
    if (parse_opts_json_aware(argc, argv, 1, &o)) return 2;
    if (!o.local) {
        bench_usage(stderr);
        return 2;
    }
    struct target_proc t;
    if (spawn_target(&o, bytes_needed(&o), &t) != 0) return bench_fail(&o, FERRY_ERR_INTERNAL, "the target did not start");
    int rc = run_initiator(&o, t.name, t.pid);
    stop_target(&t);
    return rc;
}

FERRY_COMMAND("bench", cmd_bench, "measure throughput and latency (target, initiator, --local, sweeps, baselines)")
