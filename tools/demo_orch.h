/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry demo`, the orchestrator's side: its state and the functions its
 * files share. cmd_demo.c schedules the requests and talks to the rank
 * processes, demo_opts.c parses the options, demo_report.c prints the
 * header, the results and the failures. */
#ifndef FERRY_DEMO_ORCH_H
#define FERRY_DEMO_ORCH_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "demo.h"

struct demo_opts {
    struct demo_shape shape;
    int quiet, json;
    double max_memory_gib;
};

struct child {
    int decode;
    uint32_t rank;
    pid_t pid;
    int to, from;          /* our ends of its pipes */
    struct demo_lines lines;
    int open;              /* its pipe to us is open */
    int reaped, status;
    int hello, ready, bye;
    int reported;          /* it sent an error line */
    char name[256];
    int rpid;
    uint64_t pool_bytes, staging_bytes;
    uint64_t staging, slot_bytes;
    char *addrs;           /* decode: its K and V addresses, as sent */
};

enum { REQ_WAITING = 0, REQ_ARMING, REQ_SENDING, REQ_DONE, REQ_RETIRING, REQ_RETIRED };

struct request {
    int state;
    uint32_t tokens, npages, slot;
    int32_t *ppages, *dpages;
    uint32_t armed, sent, done, retired;
    uint64_t t_submit, t_sent, t_done;
    uint64_t bytes, before, after, fill_ns, verify_ns, checked;
    uint64_t bad_bytes;   /* mismatched bytes the decode ranks reported */
    int prefill_freed;
};

struct path {
    uint32_t prank, drank;
    char transport[32];
    int same_host;
    unsigned proto;
    char reason[160];
};

struct failure {
    char source[96];
    int code;          /* a Ferry code, or 0 */
    char text[2200];
};

struct alloc {
    int32_t *ring;
    uint32_t cap, head, count;
};

struct demo {
    struct demo_opts o;
    const struct demo_shape *s;
    struct child *kids;
    uint32_t nkids;
    struct request *reqs;
    struct alloc palloc, dalloc;
    unsigned char *slot_busy;
    uint32_t next, inflight, completed, retiring;
    struct path *paths;
    uint32_t npaths;
    struct failure fails[16];
    uint32_t nfails;
    uint64_t mismatch_bytes, verified, rechecked, canary;
    uint32_t finals;
    int phase;
    uint64_t t_start, t_first_submit, t_last_progress;
    int tty, progress_drawn;
};

enum { PHASE_HELLO, PHASE_CONNECT, PHASE_RUN, PHASE_FINISH, PHASE_QUIT };

/* What the verified requests add up to (demo_compute_totals). */
struct totals {
    uint64_t bytes, tokens, pages, before, after;
    double busy_s, wall_s, agg_gbps, p50, p99;
    uint32_t n;
};

/* demo_opts.c */
void demo_usage(FILE *out);
/* 0, 2 after saying what is wrong, or -1 after printing the usage (--help). */
int demo_parse_opts(int argc, char **argv, struct demo_opts *o);
/* 0, or 2 after saying why the shape needs more memory than --max-memory. */
int demo_memory_check(struct demo *d);

/* demo_report.c */
void demo_human_bytes(char *out, size_t cap, double b);
void demo_print_header(struct demo *d);
void demo_compute_totals(const struct demo *d, struct totals *t);
void demo_print_table(const struct demo *d, const struct totals *t);
void demo_print_json(const struct demo *d, const struct totals *t, int ok);
void demo_print_failures(const struct demo *d);

#endif
