/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry bench` options, and the helpers every mode uses (see cmd_bench.c). */
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

#include "bench.h"
#include "engine/testing.h"
#include "opts.h"
#include "util.h"

/* ------------------------------------------------------------- helpers */

/* --hugepages: buffers ask for transparent huge pages (MADV_HUGEPAGE). */
int use_hugepages;

/* Pages in a buffer so that no run measures first-touch faults; 2 MiB
 * aligned, so that huge pages can back it when asked for. */
void *alloc_touched(size_t len)
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
double proc_cpu_s(pid_t pid)
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

double pct(const double *v, size_t n, double p)
{
    if (!n) return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* --------------------------------------------------------------- options */

void bench_opts_init(struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->port = -1; /* target: FERRY_BENCH_DEFAULT_PORT */
    o->interval = 1;
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
    o->spin_us = SPIN_FROM_CONFIG;
}

/* --scatter: block i of n sits in slot (i * mul + 7) mod n, mul coprime to
 * n, so that neighbours in a batch are neither adjacent nor in order (paged
 * KV: pages of one sequence anywhere in the pool). */
size_t scatter_slot(size_t i, size_t n, size_t mul)
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

size_t nblocks(const struct opts *o)
{
    size_t n = o->blocks ? o->blocks : o->batch;
    return n > o->batch && o->batch ? o->batch : n;
}

void bench_usage(FILE *f)
{
    fprintf(f, /* NOLINT: a format with the default port twice */
            "usage: ferry bench --local [OPTIONS]            fork a target and measure against it\n"
            "       ferry bench target [--bind ADDR] [--port P] [--buffer-size S] [--duration SEC]\n"
            "       ferry bench initiator --peer HOST[:PORT] [OPTIONS]\n"
            "       ferry bench baseline memcpy|memfd|cma [--block-size S] [--blocks N] [--iov N] [--scatter]\n"
            "                                                [--duration SEC] [--json]\n"
            "       ferry bench extras [--regions N] [--sessions N] [--idle SEC] [--json]\n"
            "\n"
            "target:\n"
            "  --bind ADDR           address to listen on (0.0.0.0: every interface; --host is the same)\n"
            "  --port P              port to listen on (%d; 0: any free port)\n"
            "  --buffer-size S       bytes to register for remote access (1G)\n"
            "initiator:\n"
            "  --peer HOST[:PORT]    the target (port %d when left out); its buffer comes from\n"
            "                        the handshake (ferry_session_segments): the largest one\n"
            "  --remote-addr A       override: use the target's buffer from address A on\n"
            "  --remote-len L        override: use L bytes of it\n"
            "options:\n"
            "  --op write|read       operation (write)\n"
            "  --block-size S        bytes per request, K/M/G suffixes (1M); with --sweep a list: 4K,64K,1M\n"
            "  --batch-size N        requests per call (ferry_batch_transfer_sync) (1); with --sweep a list\n"
            "  --sweep               measure every block size x batch size of the lists, one line each\n"
            "                        (default lists 4K,16K,64K,256K,1M,4M and 1,16; --duration per point)\n"
            "  --csv                 sweep points as CSV on stdout (--json: one JSON object a point)\n"
            "  --plot FILE.svg       sweep: GB/s over block size, a line per batch size, as SVG\n"
            "  --check               verify the bytes moved (a pattern written, read back, compared)\n"
            "  --interval SEC        a progress line every SEC seconds (1; 0 none; not with --json)\n"
            "  --threads N           initiator threads, each with its own blocks (1)\n"
            "  --blocks N            distinct blocks a thread's requests cycle through (batch size);\n"
            "                        fewer keeps the data cache-hot, like iperf3 and ucx_perftest\n"
            "  --duration SEC        measured time (3); --warmup SEC before it (0.3)\n"
            "  --transport T         auto|tcp|shm (auto; also FERRY_TRANSPORT)\n"
            "  --conns N             connections per peer (config.conns_per_peer)\n"
            "  --spin-us N           both engines busy-poll N us for an answer before sleeping;\n"
            "                        0 adaptive (the default), -1 never (config.spin_us)\n"
            "  --json                one JSON object on stdout instead of text\n"
            "  --hugepages           buffers ask for transparent huge pages (both sides)\n"
            "  --scatter             blocks at scattered slots (permuted, not adjacent) on both sides\n"
            "  --strided             each call is one strided descriptor (ferry_strided_t, index\n"
            "                        lists) instead of batch-size requests\n"
            "  --protocol N          the engines advertise wire protocol N (2: vector frames without\n"
            "                        the compact form, 1: a frame per piece), to compare\n"
            "  --shared-pool         the target's buffer is in a shared pool (memfd): same-host\n"
            "                        initiators map it and copy with memcpy\n"
            "\n"
            "The target prints one JSON line {\"name\",\"addr\",\"len\",\"pid\",\"epoch\",\"port\",\"metrics_port\"}\n"
            "once it serves (as `ferry serve` does). Throughput is GB/s, 1 GB = 10^9 bytes (JSON: gb_per_s).\n"
            "Latency is per call: one batch of --batch-size requests, submit to completion.\n"
            "SIGINT (Ctrl-C) ends a run early with the summary so far. With --json a failure is\n"
            "{\"error\": {\"code\", \"name\", \"detail\"}} on stdout.\n",
            FERRY_BENCH_DEFAULT_PORT, FERRY_BENCH_DEFAULT_PORT);
}

/* A size option's value: bytes, K/M/G suffixes; 0 and *out, or -1 after
 * printing the problem (nan, inf, negative, 0 and overflow included). */
static int opt_size(const char *opt, const char *arg, size_t *out)
{
    if (parse_size(arg, out) != 0 || *out == 0) {
        fprintf(stderr, "ferry bench: --%s '%s' is not a size: a positive number of bytes, with an optional K, M or G "
                        "suffix (64K, 1M), at most 1 PiB\n", opt, arg);
        return -1;
    }
    return 0;
}

/* A comma-separated list of sizes (--sweep); the count, or -1. */
static int opt_size_list(const char *opt, const char *arg, size_t *out, int cap)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", arg);
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == cap) {
            fprintf(stderr, "ferry bench: --%s lists at most %d values\n", opt, cap);
            return -1;
        }
        if (opt_size(opt, t, &out[n]) != 0) return -1;
        n++;
    }
    if (n == 0) return opt_size(opt, arg, &out[0]) == 0 ? 1 : -1;
    return n;
}

/* After parsing: lists only with --sweep, which has default lists; 0 or 2. */
static int sweep_lists(struct opts *o)
{
    static const size_t blocks[] = {4096, 16384, 65536, 262144, 1u << 20, 4u << 20}, batches[] = {1, 16};
    if (!o->sweep) {
        if (o->nsweep_block > 1 || o->nsweep_batch > 1 || o->csv || o->plot) {
            fprintf(stderr, "ferry bench: lists of sizes, --csv and --plot go with --sweep\n");
            return 2;
        }
        return 0;
    }
    if (o->nsweep_block == 0) {
        memcpy(o->sweep_block, blocks, sizeof blocks);
        o->nsweep_block = 6;
    }
    if (o->nsweep_batch == 0) {
        memcpy(o->sweep_batch, batches, sizeof batches);
        o->nsweep_batch = 2;
    }
    for (int i = 0; i < o->nsweep_batch; i++) {
        if (o->sweep_batch[i] > 65536) {
            fprintf(stderr, "ferry bench: at most 65536 per batch\n");
            return 2;
        }
    }
    if (o->csv && o->json) {
        fprintf(stderr, "ferry bench: --csv or --json, not both\n");
        return 2;
    }
    return 0;
}

/* Parses the options in argv[first..argc) (getopt_long; they may come in
 * any order); returns 0, or 2 after printing the problem. */
int bench_parse_opts(int argc, char **argv, int first, struct opts *o)
{
    enum { O_LOCAL = 256, O_HUGEPAGES, O_SHARED_POOL, O_JSON, O_PEER, O_HOST, O_TRANSPORT, O_PORT, O_THREADS,
           O_CONNS, O_REGIONS, O_SESSIONS, O_BLOCKS, O_SPIN_US, O_DURATION, O_WARMUP, O_IDLE, O_REMOTE_ADDR,
           O_OP, O_BLOCK_SIZE, O_BATCH_SIZE, O_BUFFER_SIZE, O_REMOTE_LEN, O_SCATTER, O_IOV, O_PROTOCOL,
           O_STRIDED, O_BIND, O_INTERVAL, O_CHECK, O_SWEEP, O_CSV, O_PLOT };
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
        {"protocol", required_argument, NULL, O_PROTOCOL},
        {"strided", no_argument, NULL, O_STRIDED},
        {"bind", required_argument, NULL, O_BIND},
        {"interval", required_argument, NULL, O_INTERVAL},
        {"check", no_argument, NULL, O_CHECK},
        {"sweep", no_argument, NULL, O_SWEEP},
        {"csv", no_argument, NULL, O_CSV},
        {"plot", required_argument, NULL, O_PLOT},
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
        case O_PROTOCOL:
            if (opt_long("bench", "protocol", optarg, 1, FERRY_PROTOCOL_VERSION, &v)) return 2;
            o->protocol = (int)v;
            break;
        case O_STRIDED: o->strided = 1; break;
        case O_IOV: if (opt_long("bench", "iov", optarg, 1, 1024, &v)) return 2; o->iov = (size_t)v; break;
        case O_JSON: o->json = 1; break;
        case 'h': bench_usage(stdout); exit(0);
        case O_PEER: o->peer = optarg; break;
        case O_HOST: o->host = optarg; break;
        case O_BIND: o->bind = optarg; break;
        case O_INTERVAL: if (opt_double("bench", "interval", optarg, 0, 3600, &o->interval)) return 2; break;
        case O_CHECK: o->check = 1; break;
        case O_SWEEP: o->sweep = 1; break;
        case O_CSV: o->csv = 1; break;
        case O_PLOT: o->plot = optarg; break;
        case O_TRANSPORT: o->transport = optarg; break;
        case O_PORT: if (opt_long("bench", "port", optarg, 0, 65535, &v)) return 2; o->port = (int)v; break;
        case O_THREADS: if (opt_long("bench", "threads", optarg, 1, 64, &v)) return 2; o->threads = (int)v; break;
        case O_CONNS: if (opt_long("bench", "conns", optarg, 1, 64, &v)) return 2; o->conns = (int)v; break;
        case O_REGIONS: if (opt_long("bench", "regions", optarg, 1, 10000000, &v)) return 2; o->regions = (int)v; break;
        case O_SESSIONS: if (opt_long("bench", "sessions", optarg, 1, 100000, &v)) return 2; o->sessions = (int)v; break;
        case O_BLOCKS: if (opt_long("bench", "blocks", optarg, 1, 1L << 30, &v)) return 2; o->blocks = (size_t)v; break;
        case O_SPIN_US: if (opt_long("bench", "spin-us", optarg, -1, 1000000, &v)) return 2; o->spin_us = (int)v; break;
        case O_DURATION:
            if (opt_double("bench", "duration", optarg, 0, 86400, &o->duration)) return 2;
            o->duration_set = 1;
            break;
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
        case O_BLOCK_SIZE:
            if ((o->nsweep_block = opt_size_list("block-size", optarg, o->sweep_block, 32)) < 0) return 2;
            o->block = o->sweep_block[0];
            break;
        case O_BATCH_SIZE:
            if ((o->nsweep_batch = opt_size_list("batch-size", optarg, o->sweep_batch, 32)) < 0) return 2;
            o->batch = o->sweep_batch[0];
            break;
        case O_BUFFER_SIZE: if (opt_size("buffer-size", optarg, &o->buffer)) return 2; break;
        case O_REMOTE_LEN: if (opt_size("remote-len", optarg, &o->remote_len)) return 2; break;
        default: /* getopt_long named the problem */
            fprintf(stderr, "\n");
            bench_usage(stderr);
            return 2;
        }
    }
    if (opt_none_left("bench", n, args) != 0) {
        fprintf(stderr, "\n");
        bench_usage(stderr);
        return 2;
    }
    if (o->threads < 1 || o->threads > 64 || o->duration <= 0 || o->batch > 65536) {
        fprintf(stderr, "ferry bench: need 1..64 threads, a positive duration, at most 65536 per batch\n");
        return 2;
    }
    return sweep_lists(o);
}

int make_engine(const struct opts *o, int listen_port, ferry_engine_t **out)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    if (ferry_config_from_env(&cfg) != 0) {
        fprintf(stderr, "ferry bench: %s\n", ferry_last_error_detail());
        return -1;
    }
    cfg.host = o->host ? o->host : "127.0.0.1";
    cfg.port = (uint16_t)listen_port;
    if (o->transport && (!getenv("FERRY_TRANSPORT") || strcmp(o->transport, "auto") != 0))
        cfg.transport = o->transport;
    if (o->conns > 0) cfg.conns_per_peer = o->conns;
    if (o->spin_us != SPIN_FROM_CONFIG) cfg.spin_us = o->spin_us;
    if (o->threads > cfg.workers) cfg.workers = o->threads;
    int rc = ferry_engine_create(&cfg, out);
    if (rc) fprintf(stderr, "ferry bench: engine: %s\n", ferry_last_error_detail());
    else if (o->protocol) ferry_test_set_protocol_version(*out, o->protocol);
    return rc;
}
