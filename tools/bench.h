/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry bench`: the options and the helpers its files share. cmd_bench.c
 * runs the target, the initiator and --local; bench_opts.c parses the
 * options and holds the helpers every mode uses; bench_baseline.c has the
 * baselines (memcpy, memfd, cma) and the extras. */
#ifndef FERRY_TOOLS_BENCH_H
#define FERRY_TOOLS_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <ferry/ferry.h>

#define SPIN_FROM_CONFIG (-2) /* --spin-us not given */
/* The port `ferry bench target` and `ferry serve` listen on by default (on
 * every interface, as iperf3's server does on 5201), and the one --peer
 * HOST without a port means. Not in Debian's /etc/services. */
#define FERRY_BENCH_DEFAULT_PORT 7070

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
    int duration_set;     /* --duration given (the target serves until killed without it) */
    double warmup;
    const char *transport;
    int conns;
    int json;
    size_t buffer;        /* target: bytes to register */
    size_t blocks;        /* distinct blocks per thread (0 = batch size) */
    int spin_us;          /* config.spin_us for both engines (SPIN_FROM_CONFIG = config/env) */
    int shared_pool;      /* target: the buffer is a shared pool's (ferry_pool_create_shared) */
    int scatter;          /* blocks at scattered (permuted, non-adjacent) slots on both sides */
    size_t iov;           /* baseline cma: iovecs per process_vm_writev call (1) */
    int protocol;         /* 0, or the wire protocol version both engines advertise (testing.h) */
    int strided;          /* each call is one ferry_strided_t (index lists) instead of n requests */
    const char *bind;     /* target: address to listen on (all interfaces) */
    double interval;      /* seconds between progress lines (1; 0 off) */
    int check;            /* verify the bytes moved (--check) */
    int sweep;            /* --sweep: every --block-size x --batch-size in the lists */
    size_t sweep_block[32], sweep_batch[32];
    int nsweep_block, nsweep_batch;
    int csv;              /* --csv: sweep points as CSV on stdout */
    const char *plot;     /* --plot FILE.svg */
    /* extras */
    int regions, sessions;
    double idle;
};

/* bench_opts.c */
void bench_opts_init(struct opts *o);
void bench_usage(FILE *f);
/* Parses the options in argv[first..argc); returns 0, or 2 after printing the problem. */
int bench_parse_opts(int argc, char **argv, int first, struct opts *o);
size_t scatter_slot(size_t i, size_t n, size_t mul);
size_t nblocks(const struct opts *o);
int make_engine(const struct opts *o, int listen_port, ferry_engine_t **out);
extern int use_hugepages;
void *alloc_touched(size_t len);
double proc_cpu_s(pid_t pid);
double pct(const double *v, size_t n, double p);

/* bench_baseline.c */
int baseline(const struct opts *o, const char *how);
int extras(const struct opts *o);

#endif
