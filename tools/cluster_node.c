/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry cluster node`: plumbing (clocks, the log, signals, the engine), the
 * content pattern both sides derive, and the registered pools. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <ferry/ferry.h>
#include <ferry/kv.h>

#include "cluster_node.h"

atomic_bool stopping;
FILE *node_log;

/* ------------------------------------------------------------ plumbing */

uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !atomic_load(&stopping)) {
    }
}

/* Ferry has no blocking wait for notifications: poll, backing off while
 * idle (1, 2, 4, 5 ms) so that 64 idle engines do not wake 64,000 times a
 * second on a 2-core machine, and at once again when work arrives. */
void idle_backoff(int *idle_ms, bool got_work)
{
    if (got_work) {
        *idle_ms = 0;
        return;
    }
    *idle_ms = *idle_ms ? (*idle_ms * 2 > 5 ? 5 : *idle_ms * 2) : 1;
    sleep_ms(*idle_ms);
}

void logline(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(node_log, fmt, ap); /* one locked stdio call per line; line-buffered */
    va_end(ap);
}

void on_term(int sig)
{
    (void)sig;
    atomic_store(&stopping, true);
}

void die(const char *what, int rc)
{
    fprintf(stderr, "cluster node: %s: %s (%d): %s\n", what, ferry_error_name(rc), rc, ferry_last_error_detail());
    if (node_log) fflush(node_log);
    exit(3);
}

atomic_int node_threads;
uint16_t node_port;

/* This engine's TCP connections, from /proc/self/net/tcp: the engine is
 * alone in its network namespace, so every socket there is its own (and
 * etcd's client's). Established ones to a peer's port (initiator side; the
 * distinct peers among them are the sessions with a connection up) and
 * into ours (the target side). */
static void count_conns(long *sessions, long *out, long *in)
{
    FILE *f = fopen("/proc/self/net/tcp", "r");
    static unsigned long seen[MAX_PEERS * 2];
    size_t nseen = 0;
    char line[512];
    *sessions = *out = *in = 0;
    if (!f) {
        *sessions = *out = *in = -1;
        return;
    }
    while (fgets(line, sizeof line, f)) {
        unsigned long lip, lport, rip, rport, st;
        if (sscanf(line, " %*d: %lx:%lx %lx:%lx %lx", &lip, &lport, &rip, &rport, &st) != 5 || st != 1) continue;
        if (lport == node_port) {
            (*in)++;
        } else if (rport == node_port) {
            (*out)++;
            size_t k = 0;
            while (k < nseen && seen[k] != rip) k++;
            if (k == nseen && nseen < sizeof seen / sizeof *seen) seen[nseen++] = rip;
        }
    }
    fclose(f);
    *sessions = (long)nseen;
}

/* Threads and resident memory of this process, from /proc, the threads of
 * it that are ours, not the engine's, and its sessions and connections. */
void sample_process(ferry_engine_t *e)
{
    FILE *f = fopen("/proc/self/status", "r");
    long threads = -1, rss = -1, sessions, out, in;
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "Threads:", 8) == 0) threads = strtol(line + 8, NULL, 10);
        if (strncmp(line, "VmRSS:", 6) == 0) rss = strtol(line + 6, NULL, 10);
    }
    if (f) fclose(f);
    count_conns(&sessions, &out, &in);
    logline("S %" PRIu64 " %ld %ld %ld %d %ld %ld %ld\n", wall_ms(), threads, rss, ferry_metrics_peers(e, NULL, 0),
            atomic_load(&node_threads) + 1, sessions, out, in);
}

/* ------------------------------------------------------------ pattern */

uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The seed of one request's content: sender and request id. Word w of
 * position pos (in the request's page list) of layer l is
 * mix64(seed + (l * pages + pos) * words_per_page + w). */
uint64_t request_seed(const char *sender, uint64_t req)
{
    return mix64(name_hash(sender) ^ mix64(req));
}

void fill_page(uint64_t *page, size_t words, uint64_t seed, uint64_t first_word)
{
    for (size_t w = 0; w < words; w++) page[w] = mix64(seed + first_word + w);
}

uint64_t bad_bytes_in(uint64_t want, uint64_t got)
{
    uint64_t n = 0;
    for (int b = 0; b < 8; b++) n += ((want >> (8 * b)) & 0xFF) != ((got >> (8 * b)) & 0xFF);
    return n;
}

/* ------------------------------------------------------------ pools */

void pool_create(struct pool *p, ferry_engine_t *e, const struct node_opts *o, uint32_t num_pages,
                        unsigned flags, int fill)
{
    p->layers = o->layers;
    p->num_pages = num_pages;
    p->page_bytes = o->page_bytes;
    size_t len = (size_t)num_pages * o->page_bytes;
    for (uint32_t l = 0; l < o->layers; l++) {
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "cluster node: mmap of %zu bytes: %s\n", len, strerror(errno));
            exit(3);
        }
        if (fill >= 0) memset(m, fill, len);
        int rc = ferry_register(e, m, len, flags);
        if (rc) die("register pool", rc);
        p->addrs[l] = (uint64_t)(uintptr_t)m;
    }
}

uint64_t *pool_page(const struct pool *p, uint32_t layer, int32_t page)
{
    return (uint64_t *)(uintptr_t)(p->addrs[layer] + (uint64_t)page * p->page_bytes);
}

ferry_kv_cache_desc_t pool_desc(uint32_t layers, uint32_t num_pages, uint32_t page_bytes,
                                       const uint64_t *addrs)
{
    ferry_kv_cache_desc_t d = {0};
    d.kind = FERRY_KV_MLA;
    d.num_layers = layers;
    d.num_pages = num_pages;
    d.page_size = TOKENS_PER_PAGE;
    d.mla_row_bytes = page_bytes / TOKENS_PER_PAGE;
    d.tp_rank = 0;
    d.tp_size = 1;
    d.k_addrs = addrs;
    return d;
}

ferry_engine_t *node_engine(const struct node_opts *o)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    int rc = ferry_config_from_env(&cfg);
    if (rc) die("config from environment", rc);
    cfg.host = o->host;
    cfg.port = o->port;
    cfg.transport = "tcp"; /* the namespaces share a kernel: shm would bypass the links */
    cfg.timeout_ms = o->timeout_ms;
    ferry_engine_t *e = NULL;
    rc = ferry_engine_create(&cfg, &e);
    if (rc) die("engine create", rc);
    return e;
}

/* ================================================================ prefill */
