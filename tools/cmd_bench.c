/* ferry bench: throughput and latency of Ferry transfers, in the manner of
 * Mooncake's transfer_engine_bench, plus the baselines and the
 * housekeeping figures bench/compare reports.
 *
 *   ferry bench --local [OPTIONS]           forks a target, runs an initiator
 *   ferry bench target [--port P] ...       serves a registered buffer
 *   ferry bench initiator --peer H:P --remote-addr A --remote-len L [OPTIONS]
 *   ferry bench baseline memcpy|memfd|cma [--block-size S] ...
 *   ferry bench extras                      registration, sessions, idle CPU
 *
 * Throughput is bytes confirmed complete per wall-clock second (GB/s =
 * 1e9 bytes/s); latency is measured per call (one batch of --batch-size
 * requests), reported as p50/p99/p999. */
#include <errno.h>
#include <getopt.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
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

#include "cli.h"
#include "bench.h"
#include "opts.h"
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
    sigaction(SIGINT, &sa, NULL);
    json_t *ready = json_pack("{s:s,s:I,s:I,s:i}", "name", ferry_engine_name(e), "addr",
                              (json_int_t)(uintptr_t)buf, "len", (json_int_t)len, "pid", (int)getpid());
    char *line = json_dumps(ready, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(ready);
    if (!line) return 1;
    size_t n = strlen(line);
    int ok = write(out, line, n) == (ssize_t)n && write(out, "\n", 1) == 1;
    free(line);
    if (!ok) return 1;
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
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(p[0]);
        struct opts to = *o;
        to.buffer = len;
        to.port = 0;
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
    uint64_t bytes, calls;
    int rc;
    char detail[512];
};

/* One call: the batch's requests, or with --strided one descriptor whose
 * index lists name the same blocks (lidx, ridx). */
static int one_call(struct worker *w, const uint64_t *lidx, const uint64_t *ridx)
{
    const struct opts *o = w->o;
    if (!o->strided) return ferry_batch_transfer_sync(w->e, w->peer, o->op, w->locals, w->remotes, w->lens, o->batch);
    ferry_strided_t d = {.opcode = o->op, .local_base = w->local, .local_stride = o->block, .remote_base = w->remote,
                         .remote_stride = o->block, .piece_len = o->block, .local_idx = lidx, .remote_idx = ridx,
                         .n = o->batch};
    return ferry_strided_transfer_sync(w->e, w->peer, &d);
}

/* Calls until w->stop after warming up until w->start, recording each
 * call's latency; 0 or the first failure (its detail in w->detail). */
static int worker_loop(struct worker *w, const uint64_t *lidx, const uint64_t *ridx)
{
    const struct opts *o = w->o;
    size_t b = o->batch;
    while (now_s() < w->start) {
        int rc = one_call(w, lidx, ridx);
        if (rc) {
            snprintf(w->detail, sizeof w->detail, "%s", ferry_last_error_detail());
            return rc;
        }
    }
    for (;;) {
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
        w->bytes += (uint64_t)b * o->block;
        w->calls++;
    }
    return 0;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    const struct opts *o = w->o;
    size_t b = o->batch;
    uint64_t *lidx = calloc(b, sizeof *lidx), *ridx = calloc(b, sizeof *ridx);
    if (!lidx || !ridx) {
        free(lidx);
        free(ridx);
        w->rc = FERRY_ERR_MEMORY;
        return NULL;
    }
    for (size_t i = 0; i < b; i++) {
        /* Request i uses block i * blocks / batch: with --blocks 2 the two
         * halves of a batch (one per connection) each reuse one block. */
        size_t k = i * nblocks(o) / b;
        size_t lk = o->scatter ? scatter_slot(k, nblocks(o), 613) : k;
        size_t rk = o->scatter ? scatter_slot(k, nblocks(o), 733) : k;
        w->locals[i] = w->local + lk * o->block;
        w->remotes[i] = w->remote + rk * o->block;
        w->lens[i] = o->block;
        lidx[i] = lk;
        ridx[i] = rk;
    }
    w->rc = worker_loop(w, lidx, ridx);
    free(lidx);
    free(ridx);
    return NULL;
}


static int run_initiator(const struct opts *o, const char *peer, uint64_t raddr, size_t rlen, pid_t target_pid)
{
    size_t per_thread = nblocks(o) * o->block;
    if ((size_t)o->threads * per_thread > rlen) {
        fprintf(stderr, "ferry bench: %d thread(s) x %zu requests x %zu bytes exceed the remote buffer (%zu)\n",
                o->threads, o->batch, o->block, rlen);
        return 1;
    }
    ferry_engine_t *e;
    if (make_engine(o, 0, &e) != 0) return 1;
    size_t total = (size_t)o->threads * per_thread;
    unsigned char *local = alloc_touched(total);
    if (!local || ferry_register(e, local, total, FERRY_MEM_LOCAL) != 0) {
        fprintf(stderr, "ferry bench: local buffer of %zu bytes: %s\n", total, ferry_last_error_detail());
        return 1;
    }
    if (ferry_session_open(e, peer) != 0) {
        fprintf(stderr, "ferry bench: %s\n", ferry_last_error_detail());
        return 1;
    }
    struct worker *ws = calloc((size_t)o->threads, sizeof *ws);
    pthread_t *tids = calloc((size_t)o->threads, sizeof *tids);
    double start = now_s() + o->warmup, stop = start + o->duration;
    for (int t = 0; t < o->threads; t++) {
        struct worker *w = &ws[t];
        w->o = o;
        w->e = e;
        w->peer = peer;
        w->local = local + (size_t)t * per_thread;
        w->remote = raddr + (uint64_t)t * per_thread;
        w->locals = calloc(o->batch, sizeof *w->locals);
        w->remotes = calloc(o->batch, sizeof *w->remotes);
        w->lens = calloc(o->batch, sizeof *w->lens);
        w->start = start;
        w->stop = stop;
    }
    double cpu0 = 0, tcpu0 = 0;
    for (int t = 0; t < o->threads; t++) pthread_create(&tids[t], NULL, worker_main, &ws[t]);
    /* CPU from the end of the warmup on. */
    while (now_s() < start) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    cpu0 = self_cpu_s();
    if (target_pid) tcpu0 = proc_cpu_s(target_pid);
    double wall0 = now_s();
    for (int t = 0; t < o->threads; t++) pthread_join(tids[t], NULL);
    double wall = now_s() - wall0;
    double cpu = self_cpu_s() - cpu0;
    double tcpu = target_pid ? proc_cpu_s(target_pid) - tcpu0 : -1;
    int rc = 0;
    uint64_t bytes = 0, calls = 0;
    size_t nlat = 0;
    for (int t = 0; t < o->threads; t++) {
        if (ws[t].rc && !rc) {
            rc = ws[t].rc;
            fprintf(stderr, "ferry bench: thread %d: %s\n", t, ws[t].detail);
        }
        bytes += ws[t].bytes;
        calls += ws[t].calls;
        nlat += ws[t].nlat;
    }
    double *lat = malloc((nlat ? nlat : 1) * sizeof *lat);
    size_t k = 0;
    double sum = 0;
    for (int t = 0; t < o->threads; t++) {
        memcpy(lat + k, ws[t].lat, ws[t].nlat * sizeof *lat);
        k += ws[t].nlat;
    }
    for (size_t i = 0; i < nlat; i++) sum += lat[i];
    qsort(lat, nlat, sizeof *lat, cmp_double);
    ferry_peer_info_t info;
    memset(&info, 0, sizeof info);
    ferry_session_info(e, peer, &info);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    ferry_config_from_env(&cfg);
    int conns = o->conns > 0 ? o->conns : cfg.conns_per_peer;
    int spin = o->spin_us != SPIN_FROM_CONFIG ? o->spin_us : cfg.spin_us;
    double gbps = wall > 0 ? (double)bytes / wall / 1e9 : 0;
    double p50 = pct(lat, nlat, 0.50), p99 = pct(lat, nlat, 0.99), p999 = pct(lat, nlat, 0.999);
    double mx = nlat ? lat[nlat - 1] : 0, mean = nlat ? sum / (double)nlat : 0;
    const char *opname = o->op == FERRY_OP_WRITE ? "write" : "read";
    if (o->json) {
        json_t *target_cpu = wall > 0 && tcpu >= 0 ? json_real(tcpu / wall) : json_null();
        print_json_line(json_pack(
            "{s:s,s:s,s:I,s:I,s:i,s:i,s:I,s:b,s:b,s:i,s:s,s:s,s:s,s:f,s:I,s:I,s:I,s:f,s:f,"
            "s:{s:f,s:f,s:f,s:f,s:f},s:{s:f,s:o},s:b}",
            "tool", "ferry", "op", opname, "block_size", (json_int_t)o->block, "batch_size", (json_int_t)o->batch,
            "threads", o->threads, "conns", conns, "blocks", (json_int_t)nblocks(o), "scatter", o->scatter,
            "hugepages", use_hugepages,
            "spin_us", spin, "transport", info.transport, "transport_reason", info.transport_reason, "peer", peer,
            "seconds", wall, "bytes", (json_int_t)bytes, "calls", (json_int_t)calls, "requests",
            (json_int_t)(calls * (uint64_t)o->batch), "gbps", gbps, "req_per_s",
            wall > 0 ? (double)(calls * (uint64_t)o->batch) / wall : 0.0, "lat_us", "p50", p50, "p99", p99, "p999", p999,
            "max", mx, "mean", mean, "cpu", "initiator", wall > 0 ? cpu / wall : 0, "target", target_cpu, "ok",
            rc == 0));
    } else {
        char bs[32];
        fmt_size(o->block, bs, sizeof bs);
        printf("ferry bench: %s %s x %zu per call (%zu distinct blocks), %d thread(s), %d connection(s) to %s\n",
               opname, bs, o->batch, nblocks(o), o->threads, conns, peer);
        printf("  transport   %s (%s)\n", info.transport, info.transport_reason);
        printf("  throughput  %.3f GB/s  (%.1f MiB/s), %" PRIu64 " calls, %" PRIu64 " requests in %.2f s (%.0f/s)\n",
               gbps, wall > 0 ? (double)bytes / wall / 1048576.0 : 0, calls, calls * (uint64_t)o->batch, wall,
               wall > 0 ? (double)(calls * (uint64_t)o->batch) / wall : 0);
        printf("  latency     per call: p50 %.1f us, p99 %.1f us, p999 %.1f us, max %.1f us, mean %.1f us (%s)\n", p50,
               p99, p999, mx, mean, spin > 0 ? "busy-polls first" : spin < 0 ? "blocking waits" : "adaptive spin");
        printf("  cpu         initiator %.0f%% of a core", wall > 0 ? 100 * cpu / wall : 0);
        if (tcpu >= 0) printf(", target %.0f%%", 100 * tcpu / wall);
        printf("\n");
    }
    free(lat);
    for (int t = 0; t < o->threads; t++) {
        free(ws[t].lat);
        free(ws[t].locals);
        free(ws[t].remotes);
        free(ws[t].lens);
    }
    free(ws);
    free(tids);
    ferry_engine_destroy(e);
    munmap(local, total);
    return rc ? 1 : 0;
}

/* ------------------------------------------------------------------ main */

static int cmd_bench(int argc, char **argv)
{
    struct opts o;
    bench_opts_init(&o);
    if (argc >= 2 && strcmp(argv[1], "target") == 0) {
        if (bench_parse_opts(argc, argv, 2, &o)) return 2;
        /* The target serves until killed unless --duration was given. */
        if (!o.duration_set) o.duration = 0;
        setvbuf(stdout, NULL, _IONBF, 0);
        return run_target(&o, STDOUT_FILENO);
    }
    if (argc >= 2 && strcmp(argv[1], "initiator") == 0) {
        if (bench_parse_opts(argc, argv, 2, &o)) return 2;
        if (!o.peer || !o.remote_addr || !o.remote_len) {
            fprintf(stderr, "ferry bench initiator: needs --peer, --remote-addr and --remote-len (from the target's "
                            "line)\n");
            return 2;
        }
        return run_initiator(&o, o.peer, o.remote_addr, o.remote_len, 0);
    }
    if (argc >= 3 && strcmp(argv[1], "baseline") == 0) {
        if (bench_parse_opts(argc, argv, 3, &o)) return 2;
        return baseline(&o, argv[2]);
    }
    if (argc >= 2 && strcmp(argv[1], "extras") == 0) {
        if (bench_parse_opts(argc, argv, 2, &o)) return 2;
        return extras(&o);
    }
    if (bench_parse_opts(argc, argv, 1, &o)) return 2;
    if (!o.local) {
        bench_usage(stderr);
        return 2;
    }
    struct target_proc t;
    size_t need = (size_t)o.threads * nblocks(&o) * o.block;
    if (spawn_target(&o, need, &t) != 0) return 1;
    int rc = run_initiator(&o, t.name, t.addr, t.len, t.pid);
    stop_target(&t);
    return rc;
}

FERRY_COMMAND("bench", cmd_bench, "measure throughput and latency (target, initiator, --local, baselines)")
