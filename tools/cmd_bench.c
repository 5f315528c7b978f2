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
#include "opts.h"

/* ------------------------------------------------------------- helpers */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    default: break;
    }
    if (*end == 'i' && end[1] == 'B') end += 2;
    else if (*end == 'B') end++;
    if (*end) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static void fmt_size(size_t n, char *out, size_t cap)
{
    if (n >= (1u << 30) && n % (1u << 30) == 0) snprintf(out, cap, "%zu GiB", n >> 30);
    else if (n >= (1u << 20) && n % (1u << 20) == 0) snprintf(out, cap, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0) snprintf(out, cap, "%zu KiB", n >> 10);
    else snprintf(out, cap, "%zu B", n);
}

/* Prints obj (consumed) as one compact JSON line on stdout. */
static void print_json_line(json_t *obj)
{
    json_dumpf(obj, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(obj);
    printf("\n");
}

/* --hugepages: buffers ask for transparent huge pages (MADV_HUGEPAGE). */
static int use_hugepages;

/* Pages in a buffer so that no run measures first-touch faults; 2 MiB
 * aligned, so that huge pages can back it when asked for. */
static void *alloc_touched(size_t len)
{
    size_t align = 2u << 20, want = (len ? len : 1) + align;
    unsigned char *raw = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    size_t tail = (size_t)(raw + want - (p + len));
    if (tail && len) munmap(p + len, tail);
    if (use_hugepages) madvise(p, len, MADV_HUGEPAGE);
    memset(p, 0x5a, len);
    return p;
}

/* CPU seconds (user + system) of a process, from /proc/<pid>/stat. */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    unsigned long ut = 0, st = 0;
    /* Fields after the command: state ppid pgrp session tty tpgid flags
     * minflt cminflt majflt cmajflt utime stime. */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double p)
{
    if (!n) return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* --------------------------------------------------------------- options */

struct opts {
    int local;
    const char *peer;
    uint64_t remote_addr;
    size_t remote_len;
    const char *host;
    int port;
    int op;               /* FERRY_OP_* */
    size_t block;
    size_t batch;
    int threads;
    double duration;
    double warmup;
    const char *transport;
    int conns;
    int json;
    size_t buffer;        /* target: bytes to register */
    size_t blocks;        /* distinct blocks per thread (0 = batch size) */
    int spin_us;          /* config.spin_us for both engines (-1 = config/env) */
    int shared_pool;      /* target: the buffer is a shared pool's (ferry_pool_create_shared) */
    int scatter;          /* blocks at scattered (permuted, non-adjacent) slots on both sides */
    size_t iov;           /* baseline cma: iovecs per process_vm_writev call (1) */
    /* extras */
    int regions, sessions;
    double idle;
};

static void opts_init(struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->op = FERRY_OP_WRITE;
    o->block = 1u << 20;
    o->batch = 1;
    o->threads = 1;
    o->duration = 3;
    o->warmup = 0.3;
    o->transport = "auto";
    o->regions = 10000;
    o->sessions = 100;
    o->idle = 2;
    o->spin_us = -1;
}

/* --scatter: block i of n sits in slot (i * mul + 7) mod n, mul coprime to
 * n, so that neighbours in a batch are neither adjacent nor in order (paged
 * KV: pages of one sequence anywhere in the pool). */
static size_t scatter_slot(size_t i, size_t n, size_t mul)
{
    if (n < 2) return 0;
    for (;; mul += 2) {
        size_t a = mul % n, b = n;
        while (a) {
            size_t t = b % a;
            b = a;
            a = t;
        }
        if (b == 1) break;
    }
    return (i * mul + 7) % n;
}

static size_t nblocks(const struct opts *o)
{
    size_t n = o->blocks ? o->blocks : o->batch;
    return n > o->batch && o->batch ? o->batch : n;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ferry bench --local [OPTIONS]            fork a target and measure against it\n"
            "       ferry bench target [--host H] [--port P] [--buffer-size S] [--duration SEC]\n"
            "       ferry bench initiator --peer HOST:PORT --remote-addr A --remote-len L [OPTIONS]\n"
            "       ferry bench baseline memcpy|memfd|cma [--block-size S] [--blocks N] [--iov N] [--scatter]\n"
            "                                                [--duration SEC] [--json]\n"
            "       ferry bench extras [--regions N] [--sessions N] [--idle SEC] [--json]\n"
            "\n"
            "options:\n"
            "  --op write|read       operation (write)\n"
            "  --block-size S        bytes per request, K/M/G suffixes (1M)\n"
            "  --batch-size N        requests per call (ferry_batch_transfer_sync) (1)\n"
            "  --threads N           initiator threads, each with its own blocks (1)\n"
            "  --blocks N            distinct blocks a thread's requests cycle through (batch size);\n"
            "                        fewer keeps the data cache-hot, like iperf3 and ucx_perftest\n"
            "  --duration SEC        measured time (3); --warmup SEC before it (0.3)\n"
            "  --transport T         auto|tcp|shm (auto; also FERRY_TRANSPORT)\n"
            "  --conns N             connections per peer (config.conns_per_peer)\n"
            "  --spin-us N           both engines busy-poll N us for an answer before sleeping\n"
            "                        (config.spin_us; default: none, waits block)\n"
            "  --json                one JSON object on stdout instead of text\n"
            "  --hugepages           buffers ask for transparent huge pages (both sides)\n"
            "  --scatter             blocks at scattered slots (permuted, not adjacent) on both sides\n"
            "  --shared-pool         the target's buffer is in a shared pool (memfd): same-host\n"
            "                        initiators map it and copy with memcpy\n"
            "\n"
            "The target prints one JSON line {\"name\",\"addr\",\"len\",\"pid\"} once it serves.\n"
            "Latency is per call: one batch of --batch-size requests, submit to completion.\n");
}

/* A size option's value: bytes, K/M/G suffixes; 0 and *out, or -1 after
 * printing the problem. */
static int opt_size(const char *opt, const char *arg, size_t *out)
{
    if (parse_size(arg, out) != 0 || *out == 0) {
        fprintf(stderr, "ferry bench: bad size '%s' for --%s\n", arg, opt);
        return -1;
    }
    return 0;
}

/* Parses the options in argv[first..argc) (getopt_long; they may come in
 * any order); returns 0, or 2 after printing the problem. */
static int parse_opts(int argc, char **argv, int first, struct opts *o)
{
    enum { O_LOCAL = 256, O_HUGEPAGES, O_SHARED_POOL, O_JSON, O_PEER, O_HOST, O_TRANSPORT, O_PORT, O_THREADS,
           O_CONNS, O_REGIONS, O_SESSIONS, O_BLOCKS, O_SPIN_US, O_DURATION, O_WARMUP, O_IDLE, O_REMOTE_ADDR,
           O_OP, O_BLOCK_SIZE, O_BATCH_SIZE, O_BUFFER_SIZE, O_REMOTE_LEN, O_SCATTER, O_IOV };
    static const struct option options[] = {
        {"local", no_argument, NULL, O_LOCAL},
        {"hugepages", no_argument, NULL, O_HUGEPAGES},
        {"shared-pool", no_argument, NULL, O_SHARED_POOL},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {"peer", required_argument, NULL, O_PEER},
        {"host", required_argument, NULL, O_HOST},
        {"transport", required_argument, NULL, O_TRANSPORT},
        {"port", required_argument, NULL, O_PORT},
        {"threads", required_argument, NULL, O_THREADS},
        {"conns", required_argument, NULL, O_CONNS},
        {"regions", required_argument, NULL, O_REGIONS},
        {"sessions", required_argument, NULL, O_SESSIONS},
        {"blocks", required_argument, NULL, O_BLOCKS},
        {"spin-us", required_argument, NULL, O_SPIN_US},
        {"duration", required_argument, NULL, O_DURATION},
        {"warmup", required_argument, NULL, O_WARMUP},
        {"idle", required_argument, NULL, O_IDLE},
        {"remote-addr", required_argument, NULL, O_REMOTE_ADDR},
        {"op", required_argument, NULL, O_OP},
        {"block-size", required_argument, NULL, O_BLOCK_SIZE},
        {"batch-size", required_argument, NULL, O_BATCH_SIZE},
        {"buffer-size", required_argument, NULL, O_BUFFER_SIZE},
        {"remote-len", required_argument, NULL, O_REMOTE_LEN},
        {"scatter", no_argument, NULL, O_SCATTER},
        {"iov", required_argument, NULL, O_IOV},
        {NULL, 0, NULL, 0},
    };
    /* argv[first - 1] stands in for the program name. */
    int n = argc - first + 1, opt;
    char **args = argv + first - 1;
    long v;
    unsigned long long addr;
    optind = 1;
    while ((opt = getopt_long(n, args, "h", options, NULL)) != -1) {
        switch (opt) {
        case O_LOCAL: o->local = 1; break;
        case O_HUGEPAGES: use_hugepages = 1; break;
        case O_SHARED_POOL: o->shared_pool = 1; break;
        case O_SCATTER: o->scatter = 1; break;
        case O_IOV: if (opt_long("bench", "iov", optarg, 1, 1024, &v)) return 2; o->iov = (size_t)v; break;
        case O_JSON: o->json = 1; break;
        case 'h': usage(stdout); exit(0);
        case O_PEER: o->peer = optarg; break;
        case O_HOST: o->host = optarg; break;
        case O_TRANSPORT: o->transport = optarg; break;
        case O_PORT: if (opt_long("bench", "port", optarg, 0, 65535, &v)) return 2; o->port = (int)v; break;
        case O_THREADS: if (opt_long("bench", "threads", optarg, 1, 64, &v)) return 2; o->threads = (int)v; break;
        case O_CONNS: if (opt_long("bench", "conns", optarg, 1, 64, &v)) return 2; o->conns = (int)v; break;
        case O_REGIONS: if (opt_long("bench", "regions", optarg, 1, 10000000, &v)) return 2; o->regions = (int)v; break;
        case O_SESSIONS: if (opt_long("bench", "sessions", optarg, 1, 100000, &v)) return 2; o->sessions = (int)v; break;
        case O_BLOCKS: if (opt_long("bench", "blocks", optarg, 1, 1L << 30, &v)) return 2; o->blocks = (size_t)v; break;
        case O_SPIN_US: if (opt_long("bench", "spin-us", optarg, 0, 1000000, &v)) return 2; o->spin_us = (int)v; break;
        case O_DURATION: if (opt_double("bench", "duration", optarg, 0, 86400, &o->duration)) return 2; break;
        case O_WARMUP: if (opt_double("bench", "warmup", optarg, 0, 3600, &o->warmup)) return 2; break;
        case O_IDLE: if (opt_double("bench", "idle", optarg, 0, 3600, &o->idle)) return 2; break;
        case O_REMOTE_ADDR: if (opt_u64("bench", "remote-addr", optarg, &addr)) return 2; o->remote_addr = addr; break;
        case O_OP:
            if (strcmp(optarg, "write") == 0) o->op = FERRY_OP_WRITE;
            else if (strcmp(optarg, "read") == 0) o->op = FERRY_OP_READ;
            else {
                fprintf(stderr, "ferry bench: --op is write or read, not '%s'\n", optarg);
                return 2;
            }
            break;
        case O_BLOCK_SIZE: if (opt_size("block-size", optarg, &o->block)) return 2; break;
        case O_BATCH_SIZE: if (opt_size("batch-size", optarg, &o->batch)) return 2; break;
        case O_BUFFER_SIZE: if (opt_size("buffer-size", optarg, &o->buffer)) return 2; break;
        case O_REMOTE_LEN: if (opt_size("remote-len", optarg, &o->remote_len)) return 2; break;
        default: /* getopt_long named the problem */
            fprintf(stderr, "\n");
            usage(stderr);
            return 2;
        }
    }
    if (optind < n) {
        fprintf(stderr, "ferry bench: unexpected argument '%s'\n\n", args[optind]);
        usage(stderr);
        return 2;
    }
    if (o->threads < 1 || o->threads > 64 || o->duration <= 0 || o->batch > 65536) {
        fprintf(stderr, "ferry bench: need 1..64 threads, a positive duration, at most 65536 per batch\n");
        return 2;
    }
    return 0;
}

static int make_engine(const struct opts *o, int listen_port, ferry_engine_t **out)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    if (ferry_config_from_env(&cfg) != 0) {
        fprintf(stderr, "ferry bench: %s\n", ferry_last_error_detail());
        return -1;
    }
    cfg.host = o->host;
    cfg.port = (uint16_t)listen_port;
    if (o->transport && (!getenv("FERRY_TRANSPORT") || strcmp(o->transport, "auto") != 0))
        cfg.transport = o->transport;
    if (o->conns > 0) cfg.conns_per_peer = o->conns;
    if (o->spin_us >= 0) cfg.spin_us = o->spin_us;
    if (o->threads > cfg.workers) cfg.workers = o->threads;
    int rc = ferry_engine_create(&cfg, out);
    if (rc) fprintf(stderr, "ferry bench: engine: %s\n", ferry_last_error_detail());
    return rc;
}

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

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    const struct opts *o = w->o;
    size_t b = o->batch;
    for (size_t i = 0; i < b; i++) {
        /* Request i uses block i * blocks / batch: with --blocks 2 the two
         * halves of a batch (one per connection) each reuse one block. */
        size_t k = i * nblocks(o) / b;
        size_t lk = o->scatter ? scatter_slot(k, nblocks(o), 613) : k;
        size_t rk = o->scatter ? scatter_slot(k, nblocks(o), 733) : k;
        w->locals[i] = w->local + lk * o->block;
        w->remotes[i] = w->remote + rk * o->block;
        w->lens[i] = o->block;
    }
    while (now_s() < w->start) {
        int rc = ferry_batch_transfer_sync(w->e, w->peer, o->op, w->locals, w->remotes, w->lens, b);
        if (rc) {
            w->rc = rc;
            snprintf(w->detail, sizeof w->detail, "%s", ferry_last_error_detail());
            return NULL;
        }
    }
    for (;;) {
        double t0 = now_s();
        if (t0 >= w->stop) break;
        int rc = ferry_batch_transfer_sync(w->e, w->peer, o->op, w->locals, w->remotes, w->lens, b);
        double t1 = now_s();
        if (rc) {
            w->rc = rc;
            snprintf(w->detail, sizeof w->detail, "%s", ferry_last_error_detail());
            return NULL;
        }
        if (w->nlat == w->caplat) {
            w->caplat = w->caplat ? w->caplat * 2 : 65536;
            double *n = realloc(w->lat, w->caplat * sizeof *n);
            if (!n) {
                w->rc = FERRY_ERR_MEMORY;
                return NULL;
            }
            w->lat = n;
        }
        w->lat[w->nlat++] = (t1 - t0) * 1e6;
        w->bytes += (uint64_t)b * o->block;
        w->calls++;
    }
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
    int spin = o->spin_us >= 0 ? o->spin_us : cfg.spin_us;
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
               p99, p999, mx, mean, spin ? "busy-polls first" : "blocking waits");
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

/* ------------------------------------------------------------- baselines */

/* Copies block bytes from src to dst by `how` until the time is up. */
static int baseline(const struct opts *o, const char *how)
{
    size_t len = o->block;
    /* --blocks N: copy N distinct blocks in turn (the working set Ferry's
     * batches have); 1 by default, the same block again and again. */
    size_t nb = o->blocks ? o->blocks : 1;
    /* --iov N: N blocks per call (process_vm_writev with N iovecs; memcpy
     * and memfd copy them in a loop), --scatter: at scattered slots. */
    size_t per = o->iov ? o->iov : 1;
    if (per > 1024) per = 1024;
    if (nb < per) nb = per;
    nb -= nb % per;
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
    for (int measuring = 0;; k = (k + per) % nb) {
        double t0 = now_s();
        for (size_t j = 0; j < per; j++) {
            size_t sk = o->scatter ? scatter_slot(k + j, nb, 613) : k + j;
            size_t dk = o->scatter ? scatter_slot(k + j, nb, 733) : k + j;
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
                                  "gbps", gbps, "req_per_s", wall > 0 ? (double)bytes / (double)len / wall : 0.0,
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
static int extras(const struct opts *o)
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

/* ------------------------------------------------------------------ main */

static int cmd_bench(int argc, char **argv)
{
    struct opts o;
    opts_init(&o);
    if (argc >= 2 && strcmp(argv[1], "target") == 0) {
        if (parse_opts(argc, argv, 2, &o)) return 2;
        /* The target serves until killed unless --duration was given. */
        int given = 0;
        for (int i = 2; i < argc; i++) given |= strncmp(argv[i], "--duration", 10) == 0; /* also --duration=S */
        if (!given) o.duration = 0;
        setvbuf(stdout, NULL, _IONBF, 0);
        return run_target(&o, STDOUT_FILENO);
    }
    if (argc >= 2 && strcmp(argv[1], "initiator") == 0) {
        if (parse_opts(argc, argv, 2, &o)) return 2;
        if (!o.peer || !o.remote_addr || !o.remote_len) {
            fprintf(stderr, "ferry bench initiator: needs --peer, --remote-addr and --remote-len (from the target's "
                            "line)\n");
            return 2;
        }
        return run_initiator(&o, o.peer, o.remote_addr, o.remote_len, 0);
    }
    if (argc >= 3 && strcmp(argv[1], "baseline") == 0) {
        if (parse_opts(argc, argv, 3, &o)) return 2;
        return baseline(&o, argv[2]);
    }
    if (argc >= 2 && strcmp(argv[1], "extras") == 0) {
        if (parse_opts(argc, argv, 2, &o)) return 2;
        return extras(&o);
    }
    if (parse_opts(argc, argv, 1, &o)) return 2;
    if (!o.local) {
        usage(stderr);
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
