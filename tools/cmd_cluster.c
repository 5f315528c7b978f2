/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry cluster node`: one engine of the cluster that scripts/cluster.sh
 * builds, one per network namespace, in one of four roles.
 *
 * decode   owns a paged KV pool (registered for remote write) and drives the
 *          work, as a decode server does: it takes free pages, checks that
 *          they still hold the canary (a byte there is a stale or stray
 *          write), and asks a prefill engine, through a Ferry notification,
 *          to fill them for a request. The prefill's KV notice says when
 *          every byte landed; the decode then checks every byte against a
 *          pattern derived from (sender, request, offset), puts the canary
 *          back and frees the pages. After a failure notice the pages are
 *          freed too, unless the code was CANCEL_UNCONFIRMED: then late
 *          writes are possible and the pages stay quarantined for the run.
 * prefill  serves those asks: fills its source pages with the pattern and
 *          moves them with ferry_kv_plan + ferry_kv_send (the demo's path:
 *          many page-sized pieces, then a KV notice). One queue per decode
 *          peer, served in turn by `--send-slots` sender threads, at most
 *          `--streams` of them on one peer, so a dead peer holds only those
 *          until their deadline. An ask from an incarnation of the decode that is
 *          not the one the session talks to is refused before any byte moves.
 * mesh     both: asks every other engine and serves their asks (the full
 *          mesh of N engines, N(N-1) sessions).
 * probe    opens a new session to one of its peers every 300 ms and closes
 *          it: it shows what a new session does while etcd is down. It
 *          caches no peer entry (FERRY_METADATA_CACHE_S=0), so each session
 *          asks etcd, as the first session of a new engine does.
 *
 * Every request and fault-relevant event is one line in DIR/node-N.log
 * (format in cluster.h); `ferry cluster report` reads them. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
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

#include "cli.h"
#include "cluster.h"
#include "cluster_node.h"
#include "opts.h"

/* ================================================================ decode */

struct ask {
    bool used;
    int peer;
    uint64_t req;
    uint64_t t_us;
    int32_t *pages;
};

struct decode {
    const struct node_opts *o;
    ferry_engine_t *e;
    struct pool pool;
    int32_t *free_pages;
    uint32_t nfree;
    struct ask *asks;
    int nasks, busy;
    int *inflight;           /* per peer */
    uint64_t *backoff_until; /* per peer, mono us */
    int next_peer;           /* whose turn it is to be asked */
    bool serve;              /* mesh: also a prefill; other messages are asks */
    uint64_t seq;
    uint64_t verified, bad, stale, quarantined, abandoned;
    size_t words;
};

/* Bytes of the page (every layer) that are not the canary. */
static uint64_t canary_misses(const struct decode *D, int32_t page)
{
    uint64_t n = 0;
    for (uint32_t l = 0; l < D->o->layers; l++) {
        const uint64_t *w = pool_page(&D->pool, l, page);
        for (size_t i = 0; i < D->words; i++)
            if (w[i] != CANARY_WORD) n += bad_bytes_in(CANARY_WORD, w[i]);
    }
    return n;
}

static void canary_fill(struct decode *D, const int32_t *pages)
{
    for (uint32_t l = 0; l < D->o->layers; l++)
        for (uint32_t p = 0; p < D->o->pages; p++) memset(pool_page(&D->pool, l, pages[p]), CANARY_BYTE, D->o->page_bytes);
}

static void pages_free(struct decode *D, int32_t *pages)
{
    for (uint32_t p = 0; p < D->o->pages; p++) D->free_pages[D->nfree++] = pages[p];
    free(pages);
}

static void pages_quarantine(struct decode *D, int32_t *pages)
{
    D->quarantined += D->o->pages;
    free(pages);
}

/* Takes pages for one request, checking that nothing wrote them since they
 * were freed. NULL when the pool is short. */
static int32_t *pages_take(struct decode *D)
{
    if (D->nfree < D->o->pages) return NULL;
    int32_t *pages = malloc(sizeof *pages * D->o->pages);
    if (!pages) return NULL;
    uint64_t stale = 0;
    for (uint32_t p = 0; p < D->o->pages; p++) {
        /* Random pick: requests get scattered pages (many pieces). */
        uint32_t k = (uint32_t)(mix64(D->seq * 131 + p) % D->nfree);
        pages[p] = D->free_pages[k];
        D->free_pages[k] = D->free_pages[--D->nfree];
        stale += canary_misses(D, pages[p]);
    }
    if (stale) {
        D->stale += stale;
        logline("X %" PRIu64 " %" PRIu64 "\n", wall_ms(), stale);
        canary_fill(D, pages);
    }
    return pages;
}

static void decode_ask(struct decode *D, int peer)
{
    const struct node_opts *o = D->o;
    int slot = -1;
    for (int i = 0; i < D->nasks && slot < 0; i++)
        if (!D->asks[i].used) slot = i;
    if (slot < 0) return;
    int32_t *pages = pages_take(D);
    if (!pages) return;
    uint64_t req = ((uint64_t)o->incarnation << 40) | ++D->seq;
    size_t cap = 128 + (size_t)o->layers * 20 + (size_t)o->pages * 10;
    char *msg = malloc(cap);
    if (!msg) {
        pages_free(D, pages);
        return;
    }
    size_t len = (size_t)snprintf(msg, cap, REQ_TAG " %" PRIx64 " %" PRIx64 " %x %x", req, ferry_engine_epoch(D->e),
                                  D->pool.num_pages, o->layers);
    for (uint32_t l = 0; l < o->layers; l++) len += (size_t)snprintf(msg + len, cap - len, " %" PRIx64, D->pool.addrs[l]);
    for (uint32_t p = 0; p < o->pages; p++) len += (size_t)snprintf(msg + len, cap - len, " %x", (unsigned)pages[p]);
    struct ask *a = &D->asks[slot];
    *a = (struct ask){.used = true, .peer = peer, .req = req, .t_us = mono_us(), .pages = pages};
    D->inflight[peer]++;
    D->busy++;
    int rc = ferry_notify(D->e, o->peers[peer], msg, len);
    free(msg);
    if (rc) {
        /* It may have been delivered: its pages stay out of use. */
        logline("N %" PRIu64 " %s %d\n", wall_ms(), o->peers[peer], rc);
        fprintf(stderr, "decode %s: ask %s: %s: %s\n", ferry_engine_name(D->e), o->peers[peer], ferry_error_name(rc),
                ferry_last_error_detail());
        pages_quarantine(D, pages);
        a->used = false;
        D->inflight[peer]--;
        D->busy--;
        D->backoff_until[peer] = mono_us() + 500000;
    }
}

static uint64_t verify_request(struct decode *D, const struct ask *a)
{
    uint64_t seed = request_seed(D->o->peers[a->peer], a->req), bad = 0;
    for (uint32_t l = 0; l < D->o->layers; l++)
        for (uint32_t pos = 0; pos < D->o->pages; pos++) {
            const uint64_t *w = pool_page(&D->pool, l, a->pages[pos]);
            uint64_t first = ((uint64_t)l * D->o->pages + pos) * D->words;
            for (size_t i = 0; i < D->words; i++) {
                uint64_t want = mix64(seed + first + i);
                if (w[i] != want) bad += bad_bytes_in(want, w[i]);
            }
        }
    return bad;
}

static void decode_notice(struct decode *D, const ferry_kv_notice_t *n)
{
    struct ask *a = NULL;
    for (int i = 0; i < D->nasks && !a; i++)
        if (D->asks[i].used && D->asks[i].req == n->request_id) a = &D->asks[i];
    if (!a) return; /* an earlier incarnation's, or one given up on */
    const char *peer = D->o->peers[a->peer];
    if (n->status == 0) {
        uint64_t bytes = (uint64_t)D->o->layers * D->o->pages * D->o->page_bytes;
        uint64_t bad = verify_request(D, a);
        D->verified += bytes;
        D->bad += bad;
        logline("V %" PRIu64 " %s %" PRIu64 " %" PRIu64 "\n", wall_ms(), peer, bytes, bad);
        if (bad)
            fprintf(stderr, "decode %s: request %" PRIx64 " from %s: %" PRIu64 " bytes differ from the pattern\n",
                    ferry_engine_name(D->e), a->req, peer, bad);
        canary_fill(D, a->pages);
        pages_free(D, a->pages);
    } else {
        /* No late write after any code but CANCEL_UNCONFIRMED (ferry.h). */
        bool unsafe = n->status == FERRY_ERR_CANCEL_UNCONFIRMED;
        logline("F %" PRIu64 " %s %d %d\n", wall_ms(), peer, n->status, unsafe ? 1 : 0);
        if (unsafe) {
            pages_quarantine(D, a->pages);
        } else {
            canary_fill(D, a->pages);
            pages_free(D, a->pages);
        }
    }
    a->used = false;
    D->inflight[a->peer]--;
    D->busy--;
}

static void decode_expire(struct decode *D, uint64_t limit_us)
{
    uint64_t now = mono_us();
    for (int i = 0; i < D->nasks; i++) {
        struct ask *a = &D->asks[i];
        if (!a->used || now - a->t_us < limit_us) continue;
        logline("A %" PRIu64 " %s\n", wall_ms(), D->o->peers[a->peer]);
        D->abandoned++;
        pages_quarantine(D, a->pages);
        a->used = false;
        D->inflight[a->peer]--;
        D->busy--;
    }
}

/* Asks in strict round robin: one ask per peer per turn, the turn passing
 * to the peer after the one last asked, skipping peers at their window or
 * backing off. (Starting each poll at the next peer, as before, picked
 * peers by the timing of the loop: with fewer asks in flight than peers,
 * which sender got the next one was a matter of chance, and over a run of
 * ~50 requests per sender that alone spread their shares 1.4-1.9x.) */
static void decode_asks(struct decode *D)
{
    const struct node_opts *o = D->o;
    bool asked = true;
    while (asked && D->busy < o->inflight) {
        asked = false;
        uint64_t now = mono_us();
        for (int k = 0; k < o->npeers && !asked; k++) {
            int p = (D->next_peer + k) % o->npeers;
            if (D->inflight[p] >= o->window || now < D->backoff_until[p]) continue;
            int before = D->inflight[p];
            decode_ask(D, p);
            if (D->inflight[p] != before) {
                D->next_peer = (p + 1) % o->npeers;
                asked = true;
            }
        }
    }
}

/* The script starts the clock once every engine is up: until then, and at
 * most 10 minutes, a decode waits for the go file. */
static void wait_for_go(struct node_opts *o)
{
    for (int i = 0; o->go_file && i < 60000 && !atomic_load(&stopping); i++) {
        FILE *f = fopen(o->go_file, "r");
        unsigned long long start, end;
        int n = f ? fscanf(f, "%llu %llu", &start, &end) : 0;
        if (f) fclose(f);
        if (n == 2) {
            o->until_ms = end;
            return;
        }
        sleep_ms(10);
    }
}

static int decode_main(struct node_opts *o, ferry_engine_t *e, bool serve)
{
    wait_for_go(o);
    /* Each decode's turn starts at a peer of its own: starting all at the
     * first would have every decode ask the same few prefills at once and
     * go round the rest in a convoy (seen in the 64-engine mesh: 17 s
     * queues at the first prefills while the last ones idled). */
    struct decode D = {.o = o, .e = e, .words = o->page_bytes / 8, .serve = serve, .next_peer = o->index % o->npeers};
    /* Room for every ask in flight three times over: quarantined pages
     * (CANCEL_UNCONFIRMED, abandoned asks) never come back. */
    uint32_t num_pages = (uint32_t)o->npeers * (uint32_t)o->window * o->pages * 3;
    pool_create(&D.pool, e, o, num_pages, FERRY_MEM_REMOTE_WRITE, CANARY_BYTE);
    D.free_pages = malloc(sizeof *D.free_pages * num_pages);
    D.nasks = o->npeers * o->window;
    D.asks = calloc((size_t)D.nasks, sizeof *D.asks);
    D.inflight = calloc((size_t)o->npeers, sizeof *D.inflight);
    D.backoff_until = calloc((size_t)o->npeers, sizeof *D.backoff_until);
    if (!D.free_pages || !D.asks || !D.inflight || !D.backoff_until) die("decode state", FERRY_ERR_MEMORY);
    for (uint32_t p = 0; p < num_pages; p++) D.free_pages[D.nfree++] = (int32_t)p;
    /* Give up on an ask with no notice well after the sender's deadline,
     * its cancel confirmation and the notice itself. */
    uint64_t abandon_us = (uint64_t)(3 * o->timeout_ms + 5000) * 1000u;
    uint64_t next_sample = 0, drain_until = 0;
    int idle_ms = 0;
    for (;;) {
        uint64_t now = wall_ms();
        bool asking = now < o->until_ms && !atomic_load(&stopping);
        if (!asking && drain_until == 0) drain_until = now + abandon_us / 1000;
        if (!asking && (D.busy == 0 || now >= drain_until)) break;
        if (asking) decode_asks(&D);
        ferry_kv_event_t ev[64];
        long got = ferry_kv_poll(e, ev, 64);
        for (long i = 0; i < got; i++)
            if (ev[i].is_notice)
                decode_notice(&D, &ev[i].notice);
            else if (serve)
                prefill_take(o, e, &ev[i].raw);
        if (got > 0) ferry_kv_events_free(ev, (size_t)got);
        decode_expire(&D, abandon_us);
        if (now >= next_sample) {
            sample_process(e);
            next_sample = now + 1000;
        }
        idle_backoff(&idle_ms, got > 0);
    }
    decode_expire(&D, 0);
    /* Free pages must still hold the canary: anything else is a write that
     * no live request owns. */
    uint64_t stale = 0;
    for (uint32_t i = 0; i < D.nfree; i++) stale += canary_misses(&D, D.free_pages[i]);
    if (stale) logline("X %" PRIu64 " %" PRIu64 "\n", wall_ms(), stale);
    D.stale += stale;
    sample_process(e);
    logline("E %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", wall_ms(), D.verified, D.bad,
            D.stale, D.quarantined, D.abandoned);
    for (int i = 0; i < D.nasks; i++) free(D.asks[i].used ? D.asks[i].pages : NULL);
    free(D.asks);
    free(D.inflight);
    free(D.backoff_until);
    free(D.free_pages);
    return D.bad || D.stale ? 4 : 0;
}

/* ================================================================ mesh */

/* Decode and prefill in one engine (the full mesh: every engine asks every
 * other and serves every other's asks). It asks until the end of the run,
 * logs its decode totals ("E" with six fields), then serves the others'
 * asks until SIGTERM, which the script sends once every engine logged its
 * totals. */
static int mesh_main(struct node_opts *o, ferry_engine_t *e)
{
    prefill_begin(o, e);
    int rc = decode_main(o, e, true);
    uint64_t next_sample = 0;
    int idle_ms = 0;
    while (!atomic_load(&stopping)) {
        ferry_kv_event_t ev[64];
        long got = ferry_kv_poll(e, ev, 64);
        for (long i = 0; i < got; i++)
            if (!ev[i].is_notice) prefill_take(o, e, &ev[i].raw);
        if (got > 0) ferry_kv_events_free(ev, (size_t)got);
        if (wall_ms() >= next_sample) {
            sample_process(e);
            next_sample = wall_ms() + 1000;
        }
        idle_backoff(&idle_ms, got > 0);
    }
    prefill_end();
    sample_process(e);
    logline("E %" PRIu64 "\n", wall_ms());
    return rc;
}

/* ================================================================ probe */

static int probe_main(const struct node_opts *o, ferry_engine_t *e)
{
    uint64_t next_sample = 0;
    for (unsigned i = 0; !atomic_load(&stopping); i++) {
        const char *peer = o->peers[i % (unsigned)o->npeers];
        uint64_t t0 = mono_us();
        int rc = ferry_session_open(e, peer);
        logline("P %" PRIu64 " %s %d %" PRIu64 "\n", wall_ms(), peer, rc, mono_us() - t0);
        ferry_session_close(e, peer);
        if (wall_ms() >= next_sample) {
            sample_process(e);
            next_sample = wall_ms() + 1000;
        }
        sleep_ms(300);
    }
    return 0;
}

/* ================================================================ options */

static int usage(FILE *out)
{
    fprintf(out,
            "usage: ferry cluster node --role prefill|decode|mesh|probe --index N --host IP --port P --dir DIR\n"
            "           [--peers NAME,NAME...] [--incarnation K] [--until-ms WALL_MS] [--go-file F]\n"
            "           [--window W] [--inflight N] [--streams S] [--send-slots N]\n"
            "           [--layers L] [--page-bytes B] [--pages N] [--timeout-ms T] [--inject corrupt|stray]\n"
            "       ferry cluster report --dir DIR\n"
            "One engine of the cluster scripts/cluster.sh builds (metadata from FERRY_METADATA), or the\n"
            "report over the logs they wrote. Run scripts/cluster.sh --help for the cluster itself.\n");
    return out == stdout ? 0 : 2;
}

static int parse_peers(struct node_opts *o, char *list)
{
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->npeers == MAX_PEERS) return -1;
        o->peers[o->npeers++] = t;
    }
    return 0;
}

static int node_main(int argc, char **argv)
{
    struct node_opts o = {.role = "", .index = -1, .incarnation = 1, .window = 2, .inflight = 8, .send_slots = 4, .streams = 2, .layers = 4,
                          .page_bytes = 4096, .pages = 16, .timeout_ms = 2000};
    enum { O_ROLE = 256, O_INDEX, O_HOST, O_PORT, O_DIR, O_PEERS, O_INCARNATION, O_UNTIL_MS, O_WINDOW,
           O_INFLIGHT, O_SEND_SLOTS, O_GO_FILE, O_STREAMS, O_LAYERS, O_PAGE_BYTES, O_PAGES, O_TIMEOUT_MS,
           O_INJECT };
    static const struct option options[] = {
        {"role", required_argument, NULL, O_ROLE},
        {"index", required_argument, NULL, O_INDEX},
        {"host", required_argument, NULL, O_HOST},
        {"port", required_argument, NULL, O_PORT},
        {"dir", required_argument, NULL, O_DIR},
        {"peers", required_argument, NULL, O_PEERS},
        {"incarnation", required_argument, NULL, O_INCARNATION},
        {"until-ms", required_argument, NULL, O_UNTIL_MS},
        {"window", required_argument, NULL, O_WINDOW},
        {"inflight", required_argument, NULL, O_INFLIGHT},
        {"send-slots", required_argument, NULL, O_SEND_SLOTS},
        {"go-file", required_argument, NULL, O_GO_FILE},
        {"streams", required_argument, NULL, O_STREAMS},
        {"layers", required_argument, NULL, O_LAYERS},
        {"page-bytes", required_argument, NULL, O_PAGE_BYTES},
        {"pages", required_argument, NULL, O_PAGES},
        {"timeout-ms", required_argument, NULL, O_TIMEOUT_MS},
        {"inject", required_argument, NULL, O_INJECT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* Whole numbers are checked for form and type here (a bad one is an
     * error, not a silent 0); the limits of the run are checked below. */
    const char *cmd = "cluster node";
    long v;
    unsigned long long u;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case O_ROLE: o.role = optarg; break;
        case O_INDEX: if (opt_long(cmd, "index", optarg, 0, INT_MAX, &v)) return 2; o.index = (int)v; break;
        case O_HOST: o.host = optarg; break;
        case O_PORT: if (opt_long(cmd, "port", optarg, 0, 65535, &v)) return 2; o.port = (uint16_t)v; break;
        case O_DIR: o.dir = optarg; break;
        case O_PEERS: if (parse_peers(&o, optarg) != 0) return usage(stderr); break;
        case O_INCARNATION:
            if (opt_long(cmd, "incarnation", optarg, 0, UINT_MAX, &v)) return 2;
            o.incarnation = (unsigned)v;
            break;
        case O_UNTIL_MS: if (opt_u64(cmd, "until-ms", optarg, &u)) return 2; o.until_ms = u; break;
        case O_WINDOW: if (opt_long(cmd, "window", optarg, INT_MIN, INT_MAX, &v)) return 2; o.window = (int)v; break;
        case O_INFLIGHT:
            if (opt_long(cmd, "inflight", optarg, INT_MIN, INT_MAX, &v)) return 2;
            o.inflight = (int)v;
            break;
        case O_SEND_SLOTS:
            if (opt_long(cmd, "send-slots", optarg, INT_MIN, INT_MAX, &v)) return 2;
            o.send_slots = (int)v;
            break;
        case O_GO_FILE: o.go_file = optarg; break;
        case O_STREAMS: if (opt_long(cmd, "streams", optarg, INT_MIN, INT_MAX, &v)) return 2; o.streams = (int)v; break;
        case O_LAYERS: if (opt_long(cmd, "layers", optarg, 0, UINT32_MAX, &v)) return 2; o.layers = (uint32_t)v; break;
        case O_PAGE_BYTES:
            if (opt_long(cmd, "page-bytes", optarg, 0, UINT32_MAX, &v)) return 2;
            o.page_bytes = (uint32_t)v;
            break;
        case O_PAGES: if (opt_long(cmd, "pages", optarg, 0, UINT32_MAX, &v)) return 2; o.pages = (uint32_t)v; break;
        case O_TIMEOUT_MS:
            if (opt_long(cmd, "timeout-ms", optarg, INT_MIN, INT_MAX, &v)) return 2;
            o.timeout_ms = (int)v;
            break;
        case O_INJECT: o.inject = optarg; break;
        case 'h': return usage(stdout);
        default: return usage(stderr); /* getopt_long named the problem */
        }
    }
    if (opt_none_left(cmd, argc, argv) != 0) return usage(stderr);
    bool known_role = !strcmp(o.role, "prefill") || !strcmp(o.role, "decode") || !strcmp(o.role, "mesh") ||
                      !strcmp(o.role, "probe");
    if (!known_role || o.index < 0 || !o.host || !o.port || !o.dir || o.window < 1 || o.inflight < 1 || o.send_slots < 1 || o.streams < 1 ||
        o.layers < 1 || o.layers > 64 || o.pages < 1 || o.page_bytes < TOKENS_PER_PAGE * 8 ||
        o.page_bytes % (TOKENS_PER_PAGE * 8) != 0 || o.timeout_ms < 1 ||
        (strcmp(o.role, "prefill") != 0 && o.npeers == 0)) {
        fprintf(stderr, "cluster node: missing or bad option (page bytes must be a multiple of %u)\n",
                TOKENS_PER_PAGE * 8);
        return usage(stderr);
    }
    /* The probe shows what a new engine's first session does (one that has
     * looked nobody up yet): no cached entries, every session asks etcd.
     * The other engines keep their cache, which serves through an outage. */
    if (!strcmp(o.role, "probe")) setenv("FERRY_METADATA_CACHE_S", "0", 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/node-%d.log", o.dir, o.index);
    node_log = fopen(path, "a");
    if (!node_log) {
        fprintf(stderr, "cluster node: %s: %s\n", path, strerror(errno));
        return 3;
    }
    setvbuf(node_log, NULL, _IOLBF, 0);
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    node_port = o.port;
    ferry_engine_t *e = node_engine(&o);
    logline("B %" PRIu64 " %u\n", wall_ms(), o.incarnation);
    int rc;
    if (strcmp(o.role, "prefill") == 0)
        rc = prefill_main(&o, e);
    else if (strcmp(o.role, "decode") == 0)
        rc = decode_main(&o, e, false);
    else if (strcmp(o.role, "mesh") == 0)
        rc = mesh_main(&o, e);
    else
        rc = probe_main(&o, e);
    ferry_engine_destroy(e);
    fclose(node_log);
    return rc;
}

static int cmd_cluster(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "node") == 0) return node_main(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "report") == 0) return cluster_report_main(argc - 1, argv + 1);
    int help = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
    return usage(help ? stdout : stderr);
}

FERRY_COMMAND("cluster", cmd_cluster, "one engine of a namespaced cluster, or its report (scripts/cluster.sh)")
