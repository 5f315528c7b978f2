/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry metabench`: what the metadata service must serve for a cluster of
 * N engines, against what this one serves.
 *
 * Needed (the cluster's pattern, issue 13; per engine, lease ttl T):
 *   keepalive  one lease refresh every T/3 s                 N * 3/T per s
 *   lookups    once per peer when a session first opens; cached for T,
 *              so even an engine re-opening sessions to every peer
 *              all the time asks at most once per T per peer  N(N-1)/T per s
 *   probe      one uncached lookup every 300 ms (cluster.sh's probe)
 *   restart    one engine back: a publish (grant + put) and one fetch by
 *              each engine that held a session to it          2 + (N-1)
 *   start      every engine publishes, then opens a session to every peer:
 *              2N + N(N-1) requests, once
 *
 * Served: a tight loop of lookups (a descriptor-sized entry, through the
 * backend Ferry uses, one connection per client thread) and of lease
 * keepalives, for --seconds each. */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ferry/ferry.h>

#include "cli.h"
#include "meta/meta.h"
#include "opts.h"
#include "util.h"

#define MAX_CLIENTS 64

struct bench {
    const char *conn;
    char key[128];
    double seconds;
    int clients;
    int keepalive; /* 0: lookups, 1: keepalives */
    atomic_uint_fast64_t ops, failures;
    char first_error[512];
    int first_code; /* its Ferry code */
    pthread_mutex_t error_mu;
};

static void note_error(struct bench *b)
{
    atomic_fetch_add(&b->failures, 1);
    pthread_mutex_lock(&b->error_mu);
    if (!b->first_error[0]) {
        snprintf(b->first_error, sizeof b->first_error, "%s", ferry_last_error_detail());
        b->first_code = ferry_last_error_code();
    }
    pthread_mutex_unlock(&b->error_mu);
}

static void *client_main(void *arg)
{
    struct bench *b = arg;
    ferry_meta_t m;
    if (ferry_meta_open(b->conn, 3000, &m) != 0) {
        note_error(b);
        return NULL;
    }
    char key[160];
    if (b->keepalive) {
        /* Each client keeps its own lease alive, as each engine does. */
        snprintf(key, sizeof key, "%s-ka-%p", b->key, (void *)&m);
        if (m.ops->publish(m.state, key, "{}", 60) != 0) note_error(b);
    }
    double end = now_s() + b->seconds;
    uint64_t n = 0;
    while (now_s() < end) {
        char *v = NULL;
        int rc = b->keepalive ? m.ops->keepalive(m.state) : m.ops->lookup(m.state, b->key, &v);
        free(v);
        if (rc)
            note_error(b);
        else
            n++;
    }
    atomic_fetch_add(&b->ops, n);
    if (b->keepalive) m.ops->remove(m.state, key);
    ferry_meta_close(&m);
    return NULL;
}

/* Runs the loop on every client; returns operations per second. */
static double measure(struct bench *b, int keepalive)
{
    b->keepalive = keepalive;
    atomic_store(&b->ops, 0);
    atomic_store(&b->failures, 0);
    pthread_t th[MAX_CLIENTS];
    double t0 = now_s();
    int started = 0;
    for (int i = 0; i < b->clients; i++)
        if (pthread_create(&th[i], NULL, client_main, b) == 0) started++;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    double dt = now_s() - t0;
    return dt > 0 ? (double)atomic_load(&b->ops) / dt : 0;
}

static int usage(FILE *out)
{
    fprintf(out,
            "usage: ferry metabench --metadata etcd://HOST:PORT|redis://HOST:PORT|http://HOST:PORT/PATH [--engines 8,16,64]\n"
            "                       [--ttl S (10)] [--seconds S (3)] [--clients K (4)] [--json]\n"
            "Measures lookups and lease keepalives per second the service serves (K client\n"
            "connections in a tight loop) and prints the operations per second a cluster of N\n"
            "engines needs (lease refreshes, cached lookups, restarts), with the headroom.\n"
            "--json: one line {\"metadata\",\"clients\",\"seconds\",\"lookups_per_s\",\"keepalives_per_s\"}\n"
            "(the measured rates; no table) or, on failure (bad usage included), the {\"error\":\n"
            "{\"code\",\"name\",\"detail\"}} object `ferry bench --json` prints.\n");
    return out == stderr ? 2 : 0;
}

static void print_needs(const char *engines, int ttl, double lookups_s, double keepalives_s)
{
    printf("\n%8s %12s %9s %14s %11s %11s %10s %12s\n", "engines", "keepalive/s", "probe/s", "lookups/s max",
           "cluster/s", "headroom", "worst/s", "headroom");
    char list[256];
    snprintf(list, sizeof list, "%s", engines);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        double n = strtod(tok, NULL); /* a whole number >= 2: check_engines */
        if (n < 2) continue;
        double ka = n * 3.0 / ttl;
        double lk = n * (n - 1) / ttl; /* every session re-opened all the time, cache of ttl */
        double probe = 1.0 / 0.3;
        double steady = ka + probe; /* sessions kept open: no lookups */
        double worst = steady + lk;
        double start = 2 * n + n * (n - 1);
        /* The service's capacity for this mix: lookups and keepalives cost
         * about the same; the smaller rate bounds it. */
        double cap = lookups_s < keepalives_s ? lookups_s : keepalives_s;
        printf("%8.0f %12.1f %9.1f %14.1f %11.1f %10.0fx %10.1f %11.0fx\n", n, ka, probe, lk, steady, cap / steady,
               worst, cap / worst);
        printf("%8s a restart: %.0f requests; start (all publish, full mesh lookups): %.0f requests,\n"
               "%8s %.2f s at the measured rate\n", "", 2 + (n - 1), start, "", cap > 0 ? start / cap : 0);
    }
}

/* --engines: a comma-separated list of cluster sizes, each a whole number of
 * at least 2; 0, or -1 after naming the bad entry. */
static int check_engines(const char *list)
{
    char copy[256];
    if (snprintf(copy, sizeof copy, "%s", list) >= (int)sizeof copy) {
        fprintf(stderr, "ferry metabench: --engines '%s' is longer than %zu characters\n", list, sizeof copy - 1);
        return -1;
    }
    long n;
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (opt_long("metabench", "engines", tok, 2, 1000000, &n) != 0) return -1;
    return 0;
}

struct metabench_opts {
    struct bench *b;
    const char *engines;
    int ttl, json, help;
};

static int parse_metabench(int argc, char **argv, int first, void *opts)
{
    struct metabench_opts *o = opts;
    struct bench *b = o->b;
    enum { O_METADATA = 256, O_ENGINES, O_TTL, O_SECONDS, O_CLIENTS, O_JSON };
    static const struct option options[] = {
        {"metadata", required_argument, NULL, O_METADATA}, {"engines", required_argument, NULL, O_ENGINES},
        {"ttl", required_argument, NULL, O_TTL},           {"seconds", required_argument, NULL, O_SECONDS},
        {"clients", required_argument, NULL, O_CLIENTS},   {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},                  {NULL, 0, NULL, 0},
    };
    long v;
    int opt;
    optind = first;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case O_METADATA: b->conn = optarg; break;
        case O_ENGINES:
            if (check_engines(optarg) != 0) return 2;
            o->engines = optarg;
            break;
        case O_TTL: if (opt_long("metabench", "ttl", optarg, 1, 86400, &v)) return 2; o->ttl = (int)v; break;
        case O_SECONDS: if (opt_double("metabench", "seconds", optarg, 0.001, 86400, &b->seconds)) return 2; break;
        case O_CLIENTS:
            if (opt_long("metabench", "clients", optarg, 1, MAX_CLIENTS, &v)) return 2;
            b->clients = (int)v;
            break;
        case O_JSON: o->json = 1; break;
        case 'h': o->help = 1; return 0;
        default: return usage(stderr); /* getopt_long named the problem */
        }
    }
    if (opt_none_left("metabench", argc, argv) != 0) return usage(stderr);
    if (!b->conn) {
        fprintf(stderr, "ferry metabench: --metadata is missing\n");
        return usage(stderr);
    }
    if (o->ttl < 1 || b->seconds <= 0 || b->clients < 1 || b->clients > MAX_CLIENTS) return usage(stderr);
    return 0;
}

int cmd_metabench(int argc, char **argv)
{
    struct bench b = {.seconds = 3, .clients = 4};
    struct metabench_opts o = {.b = &b, .engines = "8,16,64", .ttl = 10};
    int rc = parse_json_aware(args_have(argc, argv, 1, "--json"), parse_metabench, argc, argv, 1, &o);
    if (rc) return rc;
    if (o.help) return usage(stdout);
    pthread_mutex_init(&b.error_mu, NULL);
    const char *engines = o.engines;
    int ttl = o.ttl;
    ferry_meta_t m;
    if (ferry_meta_open(b.conn, 3000, &m) != 0)
        return cli_fail("metabench", o.json, 1, ferry_last_error_code(), "%s", ferry_last_error_detail());
    if (!strcmp(m.ops->scheme, "p2p")) {
        ferry_meta_close(&m);
        return cli_fail("metabench", o.json, 2, FERRY_ERR_INVALID_ARGUMENT,
                        "p2p stores nothing; give etcd://, redis:// or http://");
    }
    /* A descriptor as an engine publishes it (directory.c), same size. */
    snprintf(b.key, sizeof b.key, "%smetabench-%d", FERRY_META_KEY_PREFIX, (int)getpid());
    const char *desc = "{\"name\":\"10.77.0.12:7400\",\"host\":\"10.77.0.12\",\"port\":7400,"
                       "\"epoch\":\"3f2a9c01d2e4b5a6\",\"engine_id\":\"9b1c2d3e4f506172\",\"protocol\":1,\"pid\":12345}";
    if (m.ops->publish(m.state, b.key, desc, 60) != 0) {
        rc = cli_fail("metabench", o.json, 1, ferry_last_error_code(), "%s", ferry_last_error_detail());
        ferry_meta_close(&m);
        return rc;
    }
    double lookups_s = measure(&b, 0);
    uint64_t lookup_failures = atomic_load(&b.failures);
    double keepalives_s = measure(&b, 1);
    uint64_t ka_failures = atomic_load(&b.failures);
    m.ops->remove(m.state, b.key);
    ferry_meta_close(&m);
    if (o.json) {
        pthread_mutex_destroy(&b.error_mu);
        if (lookup_failures || ka_failures)
            return cli_fail("metabench", 1, 1, b.first_code,
                            "%" PRIu64 " lookups and %" PRIu64 " keepalives failed; the first: %s", lookup_failures,
                            ka_failures, b.first_error);
        print_json_line(json_pack("{s:s,s:i,s:f,s:f,s:f}", "metadata", b.conn, "clients", b.clients, "seconds",
                                  b.seconds, "lookups_per_s", lookups_s, "keepalives_per_s", keepalives_s));
        return 0;
    }
    printf("metabench: %s, %d client connection%s, %.1f s each\n", b.conn, b.clients, b.clients == 1 ? "" : "s",
           b.seconds);
    printf("  served: %.0f lookups/s (%" PRIu64 " failed), %.0f lease keepalives/s (%" PRIu64 " failed)\n",
           lookups_s, lookup_failures, keepalives_s, ka_failures);
    if (b.first_error[0]) printf("  first failure: %s\n", b.first_error);
    printf("needed by a cluster (lease ttl %d s: a refresh every %.1f s; peer entries cached %d s):", ttl,
           ttl / 3.0, ttl);
    print_needs(engines, ttl, lookups_s, keepalives_s);
    printf("cluster/s: lease refreshes and the probe, sessions kept open (the cluster's pattern: lookups\n"
           "only at start and after a restart); worst/s adds every engine re-opening a session to every\n"
           "peer all the time, asked once per cache lifetime. headroom: served / needed, the smaller of\n"
           "the two served rates.\n");
    pthread_mutex_destroy(&b.error_mu);
    return lookup_failures || ka_failures ? 1 : 0;
}

FERRY_COMMAND("metabench", cmd_metabench, "metadata operations/s a cluster needs vs what etcd/Redis serves")
