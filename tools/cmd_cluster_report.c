/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry cluster report --dir DIR`: reads what the cluster's engines logged
 * (format in cluster.h) with the script's DIR/nodes, DIR/run and
 * DIR/faults, prints goodput against the links, latency, errors by code,
 * integrity, threads and memory, and per fault: when the cluster noticed,
 * what failed with which code, and when goodput came back.
 *
 * Exit status 1 when the run broke a rule: a corrupted or stale byte, a
 * failure with a code that does not match a fault in progress (or with no
 * fault at all), a request that outlived its deadline by far (a hang), a
 * new session failing otherwise than METADATA, or no work done. */
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ferry/error.h>

#include "cluster.h"

#define MAX_NODES 512
#define MAX_FAULTS 64
#define BIN_MS 100

struct node {
    int index;
    char role[16];
    char name[64];
    long max_threads, max_rss_kb, max_peers;
    long max_engine_threads; /* the process's threads less the node's own (-1: not logged) */
    long max_sessions, max_conns_out, max_conns_in; /* peers with a connection up; TCP out / in (-1: not logged) */
    uint64_t sent_bytes; /* prefill: confirmed, in the steady window */
    uint64_t recv_bytes; /* decode: confirmed to it, in the steady window */
};

struct rec { /* one prefill send */
    uint64_t end, lat_us, bytes;
    int from, to, code, stale;
};

struct probe_rec {
    uint64_t t;
    int code;
};

struct fault {
    char kind[16];
    char target[64];
    uint64_t t0, t1;
};

struct codes {
    int code[64];
    uint64_t n[64];
    int len;
};

static struct node nodes[MAX_NODES];
static int nnodes;
static struct rec *recs;
static size_t nrecs, caprecs;
static struct probe_rec *probes;
static size_t nprobes, capprobes;
static struct fault faults[MAX_FAULTS];
static int nfaults;
static uint64_t run_start, run_end, rate_bps, timeout_ms = 2000, cancel_ms = 1000, warmup_ms = 3000;
static int links;
static char pattern[32] = "?";
static int violations;

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("VIOLATION: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    violations++;
}

static void codes_add(struct codes *c, int code, uint64_t n)
{
    for (int i = 0; i < c->len; i++)
        if (c->code[i] == code) {
            c->n[i] += n;
            return;
        }
    if (c->len < 64) {
        c->code[c->len] = code;
        c->n[c->len++] = n;
    }
}

static void codes_print(const struct codes *c)
{
    if (c->len == 0) printf(" none");
    for (int i = 0; i < c->len; i++) printf(" %s=%" PRIu64, ferry_error_name(c->code[i]), c->n[i]);
}

/* A mesh engine is both a prefill and a decode. */
static bool has_role(const struct node *n, const char *role)
{
    return !strcmp(n->role, role) || (!strcmp(n->role, "mesh") && strcmp(role, "probe") != 0);
}

static int node_by_name(const char *name)
{
    for (int i = 0; i < nnodes; i++)
        if (strcmp(nodes[i].name, name) == 0) return i;
    return -1;
}

static int read_nodes(const char *dir)
{
    char path[4096], line[512];
    snprintf(path, sizeof path, "%s/nodes", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    while (nnodes < MAX_NODES && fgets(line, sizeof line, f)) {
        struct node *n = &nodes[nnodes];
        memset(n, 0, sizeof *n);
        n->max_engine_threads = n->max_sessions = n->max_conns_out = n->max_conns_in = -1;
        if (sscanf(line, "%d %15s %63s", &n->index, n->role, n->name) == 3) nnodes++;
    }
    fclose(f);
    return 0;
}

static void read_run(const char *dir)
{
    char path[4096], line[512], key[64], val[128];
    snprintf(path, sizeof path, "%s/run", dir);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%63[^=]=%127s", key, val) != 2) continue;
        uint64_t v = strtoull(val, NULL, 10);
        if (!strcmp(key, "start_ms")) run_start = v;
        else if (!strcmp(key, "end_ms")) run_end = v;
        else if (!strcmp(key, "rate_bps")) rate_bps = v;
        else if (!strcmp(key, "links")) links = (int)v;
        else if (!strcmp(key, "timeout_ms")) timeout_ms = v;
        else if (!strcmp(key, "cancel_ms")) cancel_ms = v;
        else if (!strcmp(key, "warmup_ms")) warmup_ms = v;
        else if (!strcmp(key, "pattern")) snprintf(pattern, sizeof pattern, "%s", val);
    }
    if (f) fclose(f);
}

static void read_faults(const char *dir)
{
    char path[4096], line[512], kind[16], target[64], phase[16];
    uint64_t t;
    snprintf(path, sizeof path, "%s/faults", dir);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "%" SCNu64 " %15s %63s %15s", &t, kind, target, phase) != 4) continue;
        if (!strcmp(phase, "start") && nfaults < MAX_FAULTS) {
            struct fault *x = &faults[nfaults++];
            snprintf(x->kind, sizeof x->kind, "%s", kind);
            snprintf(x->target, sizeof x->target, "%s", target);
            x->t0 = x->t1 = t;
        } else if (!strcmp(phase, "end")) {
            for (int i = nfaults - 1; i >= 0; i--)
                if (!strcmp(faults[i].kind, kind) && !strcmp(faults[i].target, target)) {
                    faults[i].t1 = t;
                    break;
                }
        }
    }
    if (f) fclose(f);
}

struct decode_totals {
    uint64_t verified, bad, stale, quarantined, abandoned, notify_fail;
    struct codes notices, notify_codes;
};

static void read_node_log(const char *dir, int ni, struct decode_totals *dt)
{
    char path[4096], line[1024], peer[64];
    snprintf(path, sizeof path, "%s/node-%d.log", dir, nodes[ni].index);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        uint64_t t, a, b, c, d, e2;
        int code, stale;
        long th, rss, peers;
        switch (line[0]) {
        case 'R':
            if (sscanf(line, "R %" SCNu64 " %" SCNu64 " %63s %" SCNu64 " %d %d", &t, &a, peer, &b, &code, &stale) == 6) {
                if (nrecs == caprecs) {
                    caprecs = caprecs ? caprecs * 2 : 4096;
                    recs = realloc(recs, caprecs * sizeof *recs);
                    if (!recs) exit(3);
                }
                recs[nrecs++] = (struct rec){t, a, b, ni, node_by_name(peer), code, stale};
            }
            break;
        case 'V':
            if (sscanf(line, "V %" SCNu64 " %63s %" SCNu64 " %" SCNu64, &t, peer, &a, &b) == 4) {
                dt->verified += a;
                dt->bad += b;
            }
            break;
        case 'X':
            if (sscanf(line, "X %" SCNu64 " %" SCNu64, &t, &a) == 2) dt->stale += a;
            break;
        case 'F':
            if (sscanf(line, "F %" SCNu64 " %63s %d", &t, peer, &code) == 3) codes_add(&dt->notices, code, 1);
            break;
        case 'N':
            if (sscanf(line, "N %" SCNu64 " %63s %d", &t, peer, &code) == 3) {
                dt->notify_fail++;
                codes_add(&dt->notify_codes, code, 1);
            }
            break;
        case 'A':
            dt->abandoned++;
            break;
        case 'E':
            if (sscanf(line, "E %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64, &t, &a, &b, &c, &d,
                       &e2) == 6)
                dt->quarantined += d;
            break;
        case 'P':
            if (sscanf(line, "P %" SCNu64 " %63s %d", &t, peer, &code) == 3) {
                if (nprobes == capprobes) {
                    capprobes = capprobes ? capprobes * 2 : 1024;
                    probes = realloc(probes, capprobes * sizeof *probes);
                    if (!probes) exit(3);
                }
                probes[nprobes++] = (struct probe_rec){t, code};
            }
            break;
        case 'S': {
            long own = -1, sess = -1, out = -1, in = -1;
            int k = sscanf(line, "S %" SCNu64 " %ld %ld %ld %ld %ld %ld %ld", &t, &th, &rss, &peers, &own, &sess, &out, &in);
            if (k >= 4) {
                if (th > nodes[ni].max_threads) nodes[ni].max_threads = th;
                if (rss > nodes[ni].max_rss_kb) nodes[ni].max_rss_kb = rss;
                if (peers > nodes[ni].max_peers) nodes[ni].max_peers = peers;
                if (k >= 5 && th - own > nodes[ni].max_engine_threads) nodes[ni].max_engine_threads = th - own;
                if (sess > nodes[ni].max_sessions) nodes[ni].max_sessions = sess;
                if (out > nodes[ni].max_conns_out) nodes[ni].max_conns_out = out;
                if (in > nodes[ni].max_conns_in) nodes[ni].max_conns_in = in;
            }
            break;
        }
        default:
            break;
        }
    }
    fclose(f);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Goodput (bytes per second) of confirmed sends ending in [from, to),
 * leaving out those to node `skip` (-1: none). */
static double goodput(uint64_t from, uint64_t to, int skip)
{
    if (to <= from) return 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < nrecs; i++)
        if (recs[i].code == 0 && recs[i].end >= from && recs[i].end < to && recs[i].to != skip) bytes += recs[i].bytes;
    return (double)bytes * 1000.0 / (double)(to - from);
}

/* First time >= from at which a 1 s window holds at least frac of base;
 * 0 when none before the end of the run. */
static uint64_t recovered_at(uint64_t from, double base, double frac, int skip)
{
    for (uint64_t t = from; t + 1000 <= run_end; t += BIN_MS)
        if (goodput(t, t + 1000, skip) >= frac * base) return t;
    return 0;
}

static bool code_in(int code, const int *allowed)
{
    for (; *allowed; allowed++)
        if (*allowed == code) return true;
    return false;
}

static const int kill_codes[] = {FERRY_ERR_PEER_CLOSED, FERRY_ERR_PEER_RESTARTED, FERRY_ERR_SOCKET, 0};
static const int stop_codes[] = {FERRY_ERR_TIMEOUT, FERRY_ERR_CANCEL_UNCONFIRMED, 0};
static const int drop_codes[] = {FERRY_ERR_TIMEOUT, FERRY_ERR_CANCEL_UNCONFIRMED, 0};
static const int etcd_codes[] = {0}; /* no open session may fail */

static const int *fault_codes(const struct fault *f)
{
    if (!strcmp(f->kind, "kill")) return kill_codes;
    if (!strcmp(f->kind, "stop")) return stop_codes;
    if (!strcmp(f->kind, "drop")) return drop_codes;
    return etcd_codes;
}

/* How long after a fault ends its failures may still come: a request sent
 * just before the end has its deadline and cancel confirmation to run. */
static uint64_t fault_tail_ms(void)
{
    return 2 * timeout_ms + cancel_ms + 3000;
}

/* The fault that explains a failed send, or -1. */
static int fault_of(const struct rec *r)
{
    for (int i = 0; i < nfaults; i++) {
        const struct fault *f = &faults[i];
        bool node_fault = strcmp(f->kind, "etcd") != 0;
        if (node_fault && (r->to < 0 || strcmp(nodes[r->to].name, f->target) != 0)) continue;
        if (r->end + 0 >= f->t0 && r->end <= f->t1 + fault_tail_ms() && code_in(r->code, fault_codes(f))) return i;
    }
    return -1;
}

static void report_fault(int fi)
{
    const struct fault *f = &faults[fi];
    int target = node_by_name(f->target);
    printf("\nfault %d: %s %s at +%.1f s", fi + 1, f->kind, f->target, (double)(f->t0 - run_start) / 1000.0);
    if (f->t1 > f->t0) printf(", until +%.1f s (%.1f s)", (double)(f->t1 - run_start) / 1000.0, (double)(f->t1 - f->t0) / 1000.0);
    printf("\n");
    struct codes failed = {0};
    uint64_t nfail = 0, stale = 0, first = 0, inflight = 0, inflight_last = 0;
    for (size_t i = 0; i < nrecs; i++) {
        const struct rec *r = &recs[i];
        if (r->code == 0 || fault_of(r) != fi) continue;
        nfail++;
        codes_add(&failed, r->code, 1);
        if (r->stale) {
            stale++;
            continue;
        }
        if (!first || r->end < first) first = r->end;
        if (r->end - r->lat_us / 1000 <= f->t0) {
            inflight++;
            if (r->end > inflight_last) inflight_last = r->end;
        }
    }
    printf("  requests failed: %" PRIu64 " (", nfail);
    codes_print(&failed);
    printf(" )");
    if (stale) printf(", of them %" PRIu64 " asks of the dead incarnation refused before sending", stale);
    printf("\n");
    if (first) printf("  noticed: first failure %.0f ms after the fault\n", (double)(first - f->t0));
    for (int k = 0; !strcmp(f->kind, "kill") && k < failed.len; k++)
        if (failed.code[k] == FERRY_ERR_SOCKET)
            printf("  note: SOCKET is a connect refused by the dead peer before any session to it had\n"
                   "        handshaken (a peer once reached that goes away fails PEER_CLOSED)\n");
    if (inflight)
        printf("  in flight at the fault: %" PRIu64 " requests, all ended %.0f ms after it at the latest\n", inflight,
               (double)(inflight_last - f->t0));
    if (!strcmp(f->kind, "etcd")) {
        uint64_t first_meta = 0, last_meta = 0, back = 0;
        struct codes pc = {0};
        for (size_t i = 0; i < nprobes; i++) {
            if (probes[i].t < f->t0 || probes[i].t > f->t1 + 5000) continue;
            codes_add(&pc, probes[i].code, 1);
            if (probes[i].code == FERRY_ERR_METADATA && !first_meta) first_meta = probes[i].t;
            if (probes[i].code == FERRY_ERR_METADATA) last_meta = probes[i].t;
        }
        /* Back: the first success after the last refusal, at any later time
         * (the script logs the end once etcd answered its health check, so
         * a probe may succeed a moment before that line). */
        for (size_t i = 0; i < nprobes && !back; i++)
            if (probes[i].code == 0 && probes[i].t > f->t0 && probes[i].t > last_meta) back = probes[i].t;
        printf("  new sessions (probe) during the outage and 5 s after:");
        codes_print(&pc);
        printf("\n");
        if (first_meta) printf("  first new session refused with METADATA %.0f ms after etcd stopped\n", (double)(first_meta - f->t0));
        else violation("etcd was down but no new session failed with METADATA");
        if (back) printf("  new sessions succeed again %.0f ms after etcd restarted\n", back > f->t1 ? (double)(back - f->t1) : 0.0);
        else violation("new sessions did not succeed again after etcd restarted");
    }
    double base = goodput(f->t0 > 3000 ? f->t0 - 3000 : 0, f->t0, -1);
    double base_others = goodput(f->t0 > 3000 ? f->t0 - 3000 : 0, f->t0, target);
    uint64_t back = recovered_at(f->t1, base, 0.9, -1);
    double worst = -1;
    for (uint64_t t = f->t0; t + 1000 <= f->t1 + 2000 && t + 1000 <= run_end; t += BIN_MS) {
        double g = goodput(t, t + 1000, target);
        if (worst < 0 || g < worst) worst = g;
    }
    uint64_t others_back = recovered_at(f->t0, base_others, 0.9, target);
    printf("  goodput before: %.1f MB/s; ", base / 1e6);
    if (back) printf("back to 90%% of it %.0f ms after the fault %s\n", (double)(back - f->t1), f->t1 > f->t0 ? "ended" : "");
    else printf("not back to 90%% of it before the run ended\n");
    if (target >= 0 && base_others > 0) {
        printf("  the others (without %s): %.1f MB/s before, worst 1 s window during the fault %.0f%% of it", f->target,
               base_others / 1e6, worst >= 0 ? 100.0 * worst / base_others : 0.0);
        if (others_back) printf(", at 90%% again %.0f ms after the fault began\n", (double)(others_back - f->t0));
        else printf(", not at 90%% again before the run ended\n");
    }
}

/* Per engine: threads, memory, sessions and connections (the largest
 * once-a-second sample of each), and the largest of each over all. */
static void report_engines(void)
{
    long mx[6] = {0};
    printf("per engine (largest sample): threads of the process / of the engine, resident MiB,\n"
           "sessions (peers with a connection up), TCP connections to peers / into it\n");
    for (int i = 0; i < nnodes; i++) {
        const struct node *n = &nodes[i];
        long v[6] = {n->max_threads, n->max_engine_threads, n->max_rss_kb, n->max_sessions, n->max_conns_out,
                     n->max_conns_in};
        for (int k = 0; k < 6; k++)
            if (v[k] > mx[k]) mx[k] = v[k];
        printf("  %3d %-7s %-20s %3ld / %3ld threads %7.1f MiB %4ld sessions %4ld / %4ld conns\n", n->index, n->role,
               n->name, v[0], v[1], (double)v[2] / 1024.0, v[3], v[4], v[5]);
    }
    long sessions = 0;
    for (int i = 0; i < nnodes; i++)
        if (has_role(&nodes[i], "decode") || has_role(&nodes[i], "prefill")) sessions += nodes[i].max_sessions > 0 ? nodes[i].max_sessions : 0;
    printf("largest: %ld threads in a process, %ld the engine's own, %.1f MiB, %ld sessions, %ld / %ld conns; "
           "sessions of all engines together: %ld\n",
           mx[0], mx[1], (double)mx[2] / 1024.0, mx[3], mx[4], mx[5], sessions);
}

static int usage_to(FILE *out, int rc)
{
    fprintf(out, "usage: ferry cluster report --dir DIR\n"
                 "Prints the report of a scripts/cluster.sh run from the nodes' files in DIR.\n");
    return rc;
}

static int usage(void) { return usage_to(stderr, 2); }

int cluster_report_main(int argc, char **argv)
{
    static const struct option options[] = {
        {"dir", required_argument, NULL, 'd'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
    const char *dir = NULL;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        if (opt == 'h') return usage_to(stdout, 0);
        if (opt != 'd') return usage(); /* getopt_long named the problem */
        dir = optarg;
    }
    if (optind < argc) return usage();
    if (!dir || read_nodes(dir) != 0 || nnodes == 0) {
        fprintf(stderr, "cluster report: no %s/nodes\n", dir ? dir : "DIR");
        return usage();
    }
    read_run(dir);
    read_faults(dir);
    struct decode_totals dt = {0};
    for (int i = 0; i < nnodes; i++) read_node_log(dir, i, &dt);
    if (!run_end) {
        for (size_t i = 0; i < nrecs; i++)
            if (recs[i].end > run_end) run_end = recs[i].end;
    }
    int np = 0, nd = 0, nprobe = 0;
    for (int i = 0; i < nnodes; i++) {
        np += has_role(&nodes[i], "prefill");
        nd += has_role(&nodes[i], "decode");
        nprobe += has_role(&nodes[i], "probe");
    }
    printf("cluster: %d engines (%d prefill, %d decode, %d probe), pattern %s, %.0f s\n", nnodes, np, nd, nprobe,
           pattern, (double)(run_end - run_start) / 1000.0);

    /* The steady window: after the warm-up, before the first fault. */
    uint64_t s_from = run_start + warmup_ms, s_to = run_end;
    for (int i = 0; i < nfaults; i++)
        if (faults[i].t0 < s_to) s_to = faults[i].t0;
    double g = goodput(s_from, s_to, -1);
    double line = (double)rate_bps / 8.0 * links;
    printf("goodput (steady, +%.1f..+%.1f s): %.1f MB/s = %.2f Gbit/s", (double)(s_from - run_start) / 1000.0,
           (double)(s_to - run_start) / 1000.0, g / 1e6, g * 8 / 1e9);
    if (line > 0)
        printf(", %.2f of the %d links x %.0f Mbit/s the pattern can fill (%.2f Gbit/s)", g / line, links,
               (double)rate_bps / 1e6, line * 8 / 1e9);
    printf("\ngoodput (whole run): %.1f MB/s\n", goodput(run_start, run_end, -1) / 1e6);

    /* Fairness among senders and receivers in the steady window. */
    for (size_t i = 0; i < nrecs; i++) {
        const struct rec *r = &recs[i];
        if (r->code || r->end < s_from || r->end >= s_to) continue;
        nodes[r->from].sent_bytes += r->bytes;
        if (r->to >= 0) nodes[r->to].recv_bytes += r->bytes;
    }
    for (int side = 0; side < 2; side++) {
        const char *role = side ? "decode" : "prefill";
        double mx = 0, mn = -1;
        for (int i = 0; i < nnodes; i++) {
            if (!has_role(&nodes[i], role)) continue;
            double v = (double)(side ? nodes[i].recv_bytes : nodes[i].sent_bytes) * 1000.0 / (double)(s_to - s_from);
            if (v > mx) mx = v;
            if (mn < 0 || v < mn) mn = v;
        }
        if (mn >= 0)
            printf("per %s engine (steady): min %.1f MB/s, max %.1f MB/s, max/min %.2f\n", role, mn / 1e6, mx / 1e6,
                   mn > 0 ? mx / mn : 0.0);
    }

    /* Latency and codes over every send. */
    uint64_t *lat = malloc((nrecs + 1) * sizeof *lat);
    size_t nlat = 0, ok = 0, refused_stale = 0;
    struct codes all = {0};
    uint64_t hang_ms = 2 * (timeout_ms + cancel_ms) + 5000;
    for (size_t i = 0; lat && i < nrecs; i++) {
        const struct rec *r = &recs[i];
        if (r->code == 0) {
            ok++;
            lat[nlat++] = r->lat_us;
        } else {
            codes_add(&all, r->code, 1);
            refused_stale += (size_t)r->stale;
            if (fault_of(r) < 0)
                violation("%s -> %s failed with %s at +%.1f s: no fault in progress explains that code",
                          nodes[r->from].name, r->to >= 0 ? nodes[r->to].name : "?", ferry_error_name(r->code),
                          (double)(r->end - run_start) / 1000.0);
        }
        if (r->lat_us / 1000 > hang_ms)
            violation("%s -> %s took %.1f s, past its deadline %" PRIu64 " ms plus confirmation (a hang)",
                      nodes[r->from].name, r->to >= 0 ? nodes[r->to].name : "?", (double)r->lat_us / 1e6, timeout_ms);
    }
    uint64_t req_bytes = 0;
    for (size_t i = 0; i < nrecs && !req_bytes; i++) req_bytes = recs[i].bytes;
    if (lat && nlat) {
        qsort(lat, nlat, sizeof *lat, cmp_u64);
        printf("requests: %zu sent, %zu confirmed (%.0f KiB each); latency p50 %.2f ms, p99 %.2f ms, max %.2f ms\n",
               nrecs, ok, (double)req_bytes / 1024.0, (double)lat[nlat / 2] / 1000.0,
               (double)lat[(nlat * 99) / 100] / 1000.0, (double)lat[nlat - 1] / 1000.0);
    }
    free(lat);
    printf("failed requests by code:");
    codes_print(&all);
    if (refused_stale) printf(" (%zu refused before sending: asks of a restarted decode's previous incarnation)", refused_stale);
    printf("\ndecode side: failure notices");
    codes_print(&dt.notices);
    printf("; asks that could not be sent %" PRIu64 " (", dt.notify_fail);
    codes_print(&dt.notify_codes);
    printf(" ); asks abandoned without a notice %" PRIu64 "\n", dt.abandoned);
    printf("integrity: %" PRIu64 " bytes verified against the (sender, request, offset) pattern, %" PRIu64
           " corrupted, %" PRIu64 " stale or stray bytes in free pages; %" PRIu64 " pages quarantined\n",
           dt.verified, dt.bad, dt.stale, dt.quarantined);
    if (dt.bad) violation("%" PRIu64 " corrupted bytes", dt.bad);
    if (dt.stale) violation("%" PRIu64 " stale or stray bytes in free pages", dt.stale);
    if (ok == 0) violation("no request completed");

    /* New sessions outside an etcd outage must succeed. */
    for (size_t i = 0; i < nprobes; i++) {
        if (probes[i].code == 0) continue;
        bool in_outage = false;
        for (int k = 0; k < nfaults; k++)
            if (!strcmp(faults[k].kind, "etcd") && probes[i].t >= faults[k].t0 && probes[i].t <= faults[k].t1 + 3000)
                in_outage = probes[i].code == FERRY_ERR_METADATA;
        if (!in_outage)
            violation("a new session failed with %s at %+.1f s", ferry_error_name(probes[i].code),
                      ((double)probes[i].t - (double)run_start) / 1000.0);
    }

    for (int side = 0; side < 2; side++) {
        const char *role = side ? "decode" : "prefill";
        long th = 0, eth = 0, rss = 0, peers = 0;
        for (int i = 0; i < nnodes; i++) {
            if (!has_role(&nodes[i], role)) continue;
            if (nodes[i].max_threads > th) th = nodes[i].max_threads;
            if (nodes[i].max_engine_threads > eth) eth = nodes[i].max_engine_threads;
            if (nodes[i].max_rss_kb > rss) rss = nodes[i].max_rss_kb;
            if (nodes[i].max_peers > peers) peers = nodes[i].max_peers;
        }
        printf("%s engines: at most %ld threads (the engine's own: at most %ld), %.1f MiB resident, %ld peers each\n",
               role, th, eth, (double)rss / 1024.0, peers);
    }
    report_engines();
    for (int i = 0; i < nfaults; i++) report_fault(i);
    printf("\n%s: %d violation%s\n", violations ? "FAILED" : "OK", violations, violations == 1 ? "" : "s");
    free(recs);
    free(probes);
    return violations ? 1 : 0;
}
