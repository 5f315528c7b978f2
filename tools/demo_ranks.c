/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry demo`: the prefill and decode rank processes.
 *
 * Each rank owns a Ferry engine on 127.0.0.1 (port picked by the OS) and
 * its paged K and V pools, registered once. The orchestrator tells it, over
 * a pipe, which pages each request uses (the bootstrap side channel);
 * prefill ranks fill their pages with the reference pattern and send them
 * with ferry_kv_send; decode ranks learn that a request landed only from
 * the completion notices on their engine, then check every byte. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "demo.h"

static void say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(int fd, const char *fmt, ...)
{
    struct demo_str b = {0};
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    b.s = malloc((size_t)n + 2);
    if (!b.s) _exit(1);
    va_start(ap, fmt);
    vsnprintf(b.s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b.s[n] = '\n';
    /* The orchestrator always reads; failing to write means it is gone. */
    if (demo_write_all(fd, b.s, (size_t)n + 1, -1) != 0) _exit(1);
    free(b.s);
}

void demo_rank_fail(int out_fd, int code, const char *text)
{
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", text ? text : ferry_last_error_detail());
    if (!msg[0]) snprintf(msg, sizeof msg, "%s (%d): (no detail)", ferry_error_name(code), code);
    demo_one_line(msg);
    say(out_fd, "error %d %s", code, msg);
    exit(1);
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static ferry_engine_t *rank_engine(const struct demo_rank_args *a)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    int rc = ferry_config_from_env(&cfg);
    if (rc != 0) demo_rank_fail(a->out_fd, rc, NULL);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    if (a->shape->transport) cfg.transport = a->shape->transport;
    cfg.timeout_ms = a->shape->timeout_ms;
    ferry_engine_t *e = NULL;
    rc = ferry_engine_create(&cfg, &e);
    if (rc != 0) demo_rank_fail(a->out_fd, rc, NULL);
    return e;
}

/* A SIGKILL (or SIGSTOP) of our own a little later, from a thread, so
 * that it lands in the middle of a transfer: the faults the kill-* and
 * freeze-* injections simulate. */
struct later {
    long us;
    int sig;
};

static void *signal_later(void *arg)
{
    struct later l = *(struct later *)arg;
    free(arg);
    sleep_us(l.us);
    kill(getpid(), l.sig); /* the whole process, not this thread */
    return NULL;
}

static void signal_soon(int sig, long us)
{
    struct later *l = malloc(sizeof *l);
    pthread_t t;
    if (!l) {
        kill(getpid(), sig);
        return;
    }
    *l = (struct later){us, sig};
    if (pthread_create(&t, NULL, signal_later, l) != 0) {
        free(l);
        kill(getpid(), sig);
        return;
    }
    pthread_detach(t);
}

static void bad_line(const struct demo_rank_args *a, const char *what)
{
    char text[256];
    snprintf(text, sizeof text, "INVALID_ARGUMENT (%d): rank %u could not parse the orchestrator's '%s' line",
             FERRY_ERR_INVALID_ARGUMENT, a->rank, what);
    demo_rank_fail(a->out_fd, FERRY_ERR_INVALID_ARGUMENT, text);
}

/* ================================================================ prefill */

struct decode_peer {
    int known;
    char name[256];
    uint64_t staging, slot_bytes;
    uint64_t *k_addrs, *v_addrs;
};

struct send_job {
    ferry_engine_t *engine;
    const char *peer;
    const ferry_kv_plan_t *plan;
    uint64_t request_id;
    int timeout_ms;
    int rc;
    char detail[1200];
};

static void *send_thread(void *arg)
{
    struct send_job *j = arg;
    ferry_kv_send_args_t args = {.request_id = j->request_id, .timeout_ms = j->timeout_ms};
    j->rc = ferry_kv_send(j->engine, j->peer, j->plan, &args);
    if (j->rc != 0) snprintf(j->detail, sizeof j->detail, "%s", ferry_last_error_detail());
    return NULL;
}

struct prefill {
    const struct demo_rank_args *a;
    const struct demo_shape *s;
    ferry_engine_t *e;
    struct demo_pool pool;
    ferry_kv_head_slice_t *targets;
    long ntargets;
    unsigned char **gather;   /* per target, NULL when that pair does not gather */
    uint64_t *gather_bytes;
    struct decode_peer *peers; /* by decode rank */
    int32_t *prev_dst;        /* the previous request's decode pages (for the stray write) */
    uint32_t prev_n;
};

static void prefill_peer(struct prefill *P, struct demo_tok *t)
{
    uint32_t d;
    if (demo_tok_u32(t, &d) != 0 || d >= P->s->decode_tp) bad_line(P->a, "peer");
    struct decode_peer *p = &P->peers[d];
    char *name = demo_tok_next(t);
    if (!name || demo_tok_u64(t, &p->staging) != 0 || demo_tok_u64(t, &p->slot_bytes) != 0)
        bad_line(P->a, "peer");
    snprintf(p->name, sizeof p->name, "%s", name);
    p->k_addrs = calloc(P->s->layers, sizeof *p->k_addrs);
    p->v_addrs = calloc(P->s->layers, sizeof *p->v_addrs);
    if (!p->k_addrs || !p->v_addrs) demo_rank_fail(P->a->out_fd, FERRY_ERR_MEMORY, "MEMORY: peer addresses");
    for (uint32_t l = 0; l < P->s->layers; l++)
        if (demo_tok_u64(t, &p->k_addrs[l]) != 0) bad_line(P->a, "peer");
    for (uint32_t l = 0; l < P->s->layers; l++)
        if (demo_tok_u64(t, &p->v_addrs[l]) != 0) bad_line(P->a, "peer");
    p->known = 1;
}

static void prefill_connect(struct prefill *P)
{
    for (long i = 0; i < P->ntargets; i++) {
        const struct decode_peer *p = &P->peers[P->targets[i].decode_rank];
        if (!p->known) bad_line(P->a, "connect (a decode peer is missing)");
        int rc = ferry_session_open(P->e, p->name);
        ferry_peer_info_t info;
        if (rc == 0) rc = ferry_session_info(P->e, p->name, &info);
        if (rc != 0) demo_rank_fail(P->a->out_fd, rc, NULL);
        char reason[sizeof info.transport_reason];
        snprintf(reason, sizeof reason, "%s", info.transport_reason);
        demo_one_line(reason);
        say(P->a->out_fd, "path %u %s %d %u %s", P->targets[i].decode_rank, info.transport,
            info.same_host, info.protocol_version, reason);
    }
    say(P->a->out_fd, "ready");
}

/* The injected faults of prefill rank 0, before the request is sent. */
static void prefill_inject(struct prefill *P, uint32_t req, const int32_t *src, uint32_t n)
{
    const struct demo_shape *s = P->s;
    if (P->a->rank != 0 || req != s->inject_request) return;
    if (s->inject == DEMO_INJECT_CORRUPT) {
        /* One bit of one element, as a broken link or a bad copy would. */
        unsigned char *page = demo_pool_page(&P->pool, s->layers / 2, 1, src[n / 2]);
        page[P->pool.page_bytes / 2 + 3] ^= 0x10;
    } else if (s->inject == DEMO_INJECT_STRAY && P->prev_dst && P->ntargets > 0) {
        /* A page written to the wrong place: into the previous request's
         * pages, which the decode side has verified or is about to. */
        const struct decode_peer *p = &P->peers[P->targets[0].decode_rank];
        ferry_kv_cache_desc_t d = demo_desc(s, 1, P->targets[0].decode_rank, NULL, NULL);
        uint64_t len = ferry_kv_page_bytes(&d);
        if (len > P->pool.page_bytes) len = P->pool.page_bytes;
        uint64_t dst = p->k_addrs[0] + (uint64_t)P->prev_dst[P->prev_n / 2] * ferry_kv_page_bytes(&d);
        int rc = ferry_transfer_sync(P->e, p->name, FERRY_OP_WRITE, demo_pool_page(&P->pool, 0, 0, src[0]),
                                     dst, (size_t)len);
        if (rc != 0) demo_rank_fail(P->a->out_fd, rc, NULL);
    }
}

static void prefill_send(struct prefill *P, struct demo_tok *t)
{
    const struct demo_shape *s = P->s;
    uint32_t req, slot, tokens, n;
    if (demo_tok_u32(t, &req) != 0 || demo_tok_u32(t, &slot) != 0 || demo_tok_u32(t, &tokens) != 0 ||
        demo_tok_u32(t, &n) != 0)
        bad_line(P->a, "send");
    int32_t *src = demo_tok_pages(t, n), *dst = src ? demo_tok_pages(t, n) : NULL;
    if (!dst) bad_line(P->a, "send");

    /* "Prefill": the KV of the prompt, as the model would have written it. */
    uint64_t t0 = demo_now_ns();
    demo_fill_request(s, &P->pool, req, src, n);
    uint64_t fill_ns = demo_now_ns() - t0;
    prefill_inject(P, req, src, n);

    ferry_kv_plan_t **plans = calloc((size_t)P->ntargets, sizeof *plans);
    struct send_job *jobs = calloc((size_t)P->ntargets, sizeof *jobs);
    if (!plans || !jobs) demo_rank_fail(P->a->out_fd, FERRY_ERR_MEMORY, "MEMORY: send plans");
    uint64_t bytes = 0, before = 0, after = 0;
    for (long i = 0; i < P->ntargets; i++) {
        const struct decode_peer *p = &P->peers[P->targets[i].decode_rank];
        ferry_kv_cache_desc_t d = demo_desc(s, 1, P->targets[i].decode_rank, p->k_addrs, p->v_addrs);
        int rc = ferry_kv_plan_create(&P->pool.desc, &d, src, dst, n, &plans[i]);
        ferry_kv_plan_info_t in;
        if (rc == 0) {
            ferry_kv_plan_get_info(plans[i], &in);
            rc = ferry_kv_plan_bind_sender(plans[i], (uint64_t)(uintptr_t)P->gather[i], P->gather_bytes[i],
                                           in.scatter ? p->staging + (uint64_t)slot * p->slot_bytes : 0,
                                           in.scatter ? p->slot_bytes : 0);
        }
        if (rc != 0) demo_rank_fail(P->a->out_fd, rc, NULL);
        ferry_kv_plan_get_info(plans[i], &in);
        bytes += in.bytes;
        /* Without coalescing: one block per page per buffer of every layer. */
        before += (uint64_t)n * demo_buffers(s) * s->layers;
        after += in.blocks;
        jobs[i] = (struct send_job){.engine = P->e, .peer = p->name, .plan = plans[i],
                                    .request_id = req, .timeout_ms = s->timeout_ms};
    }

    if (P->a->rank == 0 && req == s->inject_request && s->inject == DEMO_INJECT_KILL_PREFILL)
        signal_soon(SIGKILL, 300);
    if (P->a->rank == 0 && req == s->inject_request && s->inject == DEMO_INJECT_FREEZE_PREFILL)
        signal_soon(SIGSTOP, 300);
    uint64_t t_submit = demo_now_ns();
    if (P->ntargets == 1) {
        send_thread(&jobs[0]);
    } else {
        pthread_t *th = calloc((size_t)P->ntargets, sizeof *th);
        if (!th) demo_rank_fail(P->a->out_fd, FERRY_ERR_MEMORY, "MEMORY: send threads");
        for (long i = 0; i < P->ntargets; i++)
            if (pthread_create(&th[i], NULL, send_thread, &jobs[i]) != 0) {
                send_thread(&jobs[i]);
                th[i] = 0;
            }
        for (long i = 0; i < P->ntargets; i++)
            if (th[i]) pthread_join(th[i], NULL);
        free(th);
    }
    uint64_t t_end = demo_now_ns();
    /* The freeze must land before this request is reported sent (the
     * orchestrator then sees a rank stopped while transferring): on a
     * loaded machine the timed SIGSTOP can come after every send ended. */
    if (P->a->rank == 0 && req == s->inject_request && s->inject == DEMO_INJECT_FREEZE_PREFILL)
        kill(getpid(), SIGSTOP);
    for (long i = 0; i < P->ntargets; i++) {
        if (jobs[i].rc == 0) continue;
        char text[1400];
        snprintf(text, sizeof text, "%s", jobs[i].detail);
        demo_rank_fail(P->a->out_fd, jobs[i].rc, text);
    }
    say(P->a->out_fd, "sent %u %llu %llu %llu %llu %llu %llu", req, (unsigned long long)t_submit,
        (unsigned long long)t_end, (unsigned long long)bytes, (unsigned long long)before,
        (unsigned long long)after, (unsigned long long)fill_ns);
    for (long i = 0; i < P->ntargets; i++) ferry_kv_plan_destroy(plans[i]);
    free(plans);
    free(jobs);
    free(src);
    free(P->prev_dst);
    P->prev_dst = dst;
    P->prev_n = n;
}

void demo_prefill_main(const struct demo_rank_args *a)
{
    const struct demo_shape *s = a->shape;
    struct prefill P = {.a = a, .s = s};
    P.e = rank_engine(a);
    int rc = demo_pool_create(&P.pool, s, 0, a->rank, P.e, FERRY_MEM_LOCAL, -1);
    if (rc != 0) demo_rank_fail(a->out_fd, rc, NULL);
    P.targets = calloc(s->decode_tp, sizeof *P.targets);
    P.peers = calloc(s->decode_tp, sizeof *P.peers);
    if (!P.targets || !P.peers) demo_rank_fail(a->out_fd, FERRY_ERR_MEMORY, "MEMORY: targets");
    P.ntargets = ferry_kv_tp_targets(s->heads, s->prefill_tp, s->decode_tp, a->rank, P.targets, s->decode_tp);
    if (P.ntargets < 0) demo_rank_fail(a->out_fd, (int)P.ntargets, NULL);
    P.gather = calloc((size_t)P.ntargets + 1, sizeof *P.gather);
    P.gather_bytes = calloc((size_t)P.ntargets + 1, sizeof *P.gather_bytes);
    if (!P.gather || !P.gather_bytes) demo_rank_fail(a->out_fd, FERRY_ERR_MEMORY, "MEMORY: staging");
    uint64_t staging_total = 0;
    for (long i = 0; i < P.ntargets; i++) {
        /* A rank that sends part of its heads to a decode rank gathers them
         * into a staging buffer first: one per target, registered once. */
        uint64_t src_need = 0, dst_need = 0;
        rc = demo_staging_need(s, a->rank, P.targets[i].decode_rank, &src_need, &dst_need);
        if (rc != 0) demo_rank_fail(a->out_fd, rc, NULL);
        if (src_need == 0) continue;
        P.gather[i] = demo_map(src_need);
        if (!P.gather[i]) demo_rank_fail(a->out_fd, FERRY_ERR_MEMORY, "MEMORY: mapping the gather staging");
        memset(P.gather[i], 0, src_need); /* touched now, not inside the first send */
        P.gather_bytes[i] = src_need;
        staging_total += src_need;
        rc = ferry_register(P.e, P.gather[i], src_need, FERRY_MEM_LOCAL);
        if (rc != 0) demo_rank_fail(a->out_fd, rc, NULL);
    }
    say(a->out_fd, "hello %s %d %llu %llu", ferry_engine_name(P.e), (int)getpid(),
        (unsigned long long)demo_pool_bytes(s, 0, a->rank), (unsigned long long)staging_total);

    struct demo_lines in = {.fd = a->in_fd};
    char *line;
    int r;
    while ((r = demo_lines_read(&in, &line)) == 1) {
        struct demo_tok t = {line};
        char *cmd = demo_tok_next(&t);
        if (!cmd) continue;
        if (strcmp(cmd, "peer") == 0) prefill_peer(&P, &t);
        else if (strcmp(cmd, "connect") == 0) prefill_connect(&P);
        else if (strcmp(cmd, "send") == 0) prefill_send(&P, &t);
        else if (strcmp(cmd, "quit") == 0) break;
        else bad_line(a, cmd);
    }
    if (r != 1) _exit(1); /* the orchestrator is gone */
    ferry_engine_destroy(P.e);
    demo_pool_destroy(&P.pool, NULL);
    for (long i = 0; i < P.ntargets; i++) demo_unmap(P.gather[i], P.gather_bytes[i]);
    for (uint32_t d = 0; d < s->decode_tp; d++) {
        free(P.peers[d].k_addrs);
        free(P.peers[d].v_addrs);
    }
    free(P.peers);
    free(P.targets);
    free(P.gather);
    free(P.gather_bytes);
    free(P.prev_dst);
    demo_lines_free(&in);
    say(a->out_fd, "bye");
    exit(0);
}

/* ================================================================= decode */

/* Notices are taken off the engine by a thread of their own, every 100 us,
 * and stamped on arrival: the latency measured is the engine's, not the
 * time the main thread spent checking the previous request. */
struct stamped {
    ferry_kv_event_t ev;
    ferry_notification_sender_t from; /* who sent it, as the engine observed */
    uint64_t t_ns;
    struct stamped *next;
};

struct inbox {
    ferry_engine_t *e;
    pthread_mutex_t lock;
    struct stamped *head, *tail;
    atomic_int stop;
    int error;              /* a poll failure: its code */
    char detail[1200];
};

static void *notice_thread(void *arg)
{
    struct inbox *b = arg;
    while (!atomic_load(&b->stop)) {
        ferry_kv_event_t ev[16];
        ferry_notification_sender_t from[16];
        long n = ferry_kv_poll_from(b->e, ev, from, 16);
        uint64_t now = demo_now_ns();
        if (n < 0) {
            pthread_mutex_lock(&b->lock);
            b->error = (int)n;
            snprintf(b->detail, sizeof b->detail, "%s", ferry_last_error_detail());
            pthread_mutex_unlock(&b->lock);
            break;
        }
        for (long i = 0; i < n; i++) {
            struct stamped *s = calloc(1, sizeof *s);
            if (!s) {
                ferry_kv_events_free(&ev[i], 1);
                continue;
            }
            s->ev = ev[i];
            s->from = from[i];
            s->t_ns = now;
            pthread_mutex_lock(&b->lock);
            if (b->tail) b->tail->next = s;
            else b->head = s;
            b->tail = s;
            pthread_mutex_unlock(&b->lock);
        }
        if (n == 0) sleep_us(100);
    }
    return NULL;
}

enum { DREQ_NONE = 0, DREQ_ARMED, DREQ_DONE, DREQ_RETIRED };

struct dreq {
    int state;
    uint32_t slot, tokens, n;
    int32_t *src, *dst;
    ferry_kv_plan_t **plans;
    ferry_kv_recv_t *tracker;
};

struct decode {
    const struct demo_rank_args *a;
    const struct demo_shape *s;
    ferry_engine_t *e;
    struct demo_pool pool;
    ferry_kv_head_slice_t *sources;
    long nsources;
    /* Per prefill rank: its engine's name (the orchestrator's "source"
     * line) and, once a session to it learned them, its engine id and
     * epoch: what a verified tracker checks notices and bytes against. */
    char (*prefill_names)[256];
    ferry_kv_source_t *prefill_ids;
    int *prefill_known;
    unsigned char *staging;
    uint64_t slot_bytes;
    struct dreq *reqs;
};

static void dreq_release(struct decode *D, struct dreq *q)
{
    for (long i = 0; q->plans && i < D->nsources; i++) ferry_kv_plan_destroy(q->plans[i]);
    free(q->plans);
    ferry_kv_recv_destroy(q->tracker);
    free(q->src);
    free(q->dst);
    q->plans = NULL;
    q->tracker = NULL;
    q->src = q->dst = NULL;
}

static void report_bad(struct decode *D, uint32_t req, const char *what, const struct demo_mismatch *mm)
{
    char text[512];
    demo_mismatch_text(mm, text, sizeof text);
    say(D->a->out_fd, "bad %u %llu decode rank %u, request %u: %s: %s", req, (unsigned long long)mm->bytes,
        D->a->rank, req, what, text);
}

/* "source <prefill rank> <engine name>": who sends this rank its KV. */
static void decode_source(struct decode *D, struct demo_tok *t)
{
    uint32_t r;
    char *name;
    if (demo_tok_u32(t, &r) != 0 || r >= D->s->prefill_tp || !(name = demo_tok_next(t))) bad_line(D->a, "source");
    snprintf(D->prefill_names[r], sizeof D->prefill_names[r], "%s", name);
}

/* Makes q's tracker a verified one (<ferry/kv.h>): a notice counts only
 * from the prefill engine each source is, and a success only once that
 * engine's bytes landed here. The identities come from this rank's own
 * session to each prefill engine, opened at the first request. */
static void verify_tracker(struct decode *D, struct dreq *q)
{
    ferry_kv_source_t *srcs = calloc((size_t)D->nsources + 1, sizeof *srcs);
    if (!srcs) demo_rank_fail(D->a->out_fd, FERRY_ERR_MEMORY, "MEMORY: tracker sources");
    for (long i = 0; i < D->nsources; i++) {
        uint32_t r = D->sources[i].prefill_rank;
        if (!D->prefill_known[r]) {
            if (!D->prefill_names[r][0])
                demo_rank_fail(D->a->out_fd, FERRY_ERR_INTERNAL, "INTERNAL: no source line for prefill rank");
            ferry_peer_info_t info;
            int rc = ferry_session_open(D->e, D->prefill_names[r]);
            if (rc == 0) rc = ferry_session_info(D->e, D->prefill_names[r], &info);
            if (rc != 0) demo_rank_fail(D->a->out_fd, rc, NULL);
            D->prefill_ids[r] = (ferry_kv_source_t){.engine_id = info.engine_id, .epoch = info.epoch};
            D->prefill_known[r] = 1;
        }
        srcs[i] = D->prefill_ids[r];
    }
    int rc = ferry_kv_recv_verify(q->tracker, D->e, srcs);
    free(srcs);
    if (rc != 0) demo_rank_fail(D->a->out_fd, rc, NULL);
}

static void decode_expect(struct decode *D, struct demo_tok *t)
{
    const struct demo_shape *s = D->s;
    uint32_t req, slot, tokens, n;
    if (demo_tok_u32(t, &req) != 0 || demo_tok_u32(t, &slot) != 0 || demo_tok_u32(t, &tokens) != 0 ||
        demo_tok_u32(t, &n) != 0 || req >= s->requests || slot >= s->inflight)
        bad_line(D->a, "expect");
    struct dreq *q = &D->reqs[req];
    q->src = demo_tok_pages(t, n);
    q->dst = q->src ? demo_tok_pages(t, n) : NULL;
    if (!q->dst) bad_line(D->a, "expect");
    q->slot = slot;
    q->tokens = tokens;
    q->n = n;
    /* The pages handed to this request are free: they must still hold the
     * canary, or something wrote where it had no business to. */
    struct demo_mismatch mm = {0};
    demo_check_canary(&D->pool, q->dst, n, &mm);
    if (mm.found) report_bad(D, req, "a free page given to it already holds stray bytes", &mm);

    q->plans = calloc((size_t)D->nsources, sizeof *q->plans);
    if (!q->plans) demo_rank_fail(D->a->out_fd, FERRY_ERR_MEMORY, "MEMORY: receive plans");
    for (long i = 0; i < D->nsources; i++) {
        ferry_kv_cache_desc_t src = demo_desc(s, 0, D->sources[i].prefill_rank, NULL, NULL);
        int rc = ferry_kv_plan_create(&src, &D->pool.desc, q->src, q->dst, n, &q->plans[i]);
        if (rc == 0) {
            ferry_kv_plan_info_t in;
            ferry_kv_plan_get_info(q->plans[i], &in);
            uint64_t staging = in.scatter ? (uint64_t)(uintptr_t)D->staging + (uint64_t)slot * D->slot_bytes : 0;
            rc = ferry_kv_plan_bind_receiver(q->plans[i], staging, in.scatter ? D->slot_bytes : 0);
        }
        if (rc != 0) demo_rank_fail(D->a->out_fd, rc, NULL);
    }
    int rc = ferry_kv_recv_create(req, q->plans, (size_t)D->nsources, &q->tracker);
    if (rc != 0) demo_rank_fail(D->a->out_fd, rc, NULL);
    verify_tracker(D, q);
    q->state = DREQ_ARMED;
    say(D->a->out_fd, "armed %u", req);
    if (D->a->rank == 0 && req == s->inject_request && s->inject == DEMO_INJECT_KILL_DECODE)
        signal_soon(SIGKILL, 1000);
    if (D->a->rank == 0 && req == s->inject_request && s->inject == DEMO_INJECT_FREEZE_DECODE)
        signal_soon(SIGSTOP, 1000);
}

static void decode_notice(struct decode *D, const ferry_kv_notice_t *n, const ferry_notification_sender_t *from,
                          uint64_t t_ns)
{
    const struct demo_shape *s = D->s;
    struct dreq *q = n->request_id < s->requests ? &D->reqs[n->request_id] : NULL;
    if (!q || q->state != DREQ_ARMED) {
        char text[FERRY_KV_REASON_MAX + 256];
        snprintf(text, sizeof text,
                 "INTERNAL (%d): decode rank %u got a notice for request %llu from prefill rank %u "
                 "(status %d%s%s) that it does not expect",
                 FERRY_ERR_INTERNAL, D->a->rank, (unsigned long long)n->request_id, n->prefill_rank,
                 n->status, n->reason[0] ? ": " : "", n->reason);
        demo_rank_fail(D->a->out_fd, n->status ? n->status : FERRY_ERR_INTERNAL, text);
    }
    CROSS_PROCESS_BEGIN(); /* a success notice scatters the staging region */
    int rc = ferry_kv_recv_offer_from(q->tracker, n, from);
    CROSS_PROCESS_END();
    if (rc < 0) demo_rank_fail(D->a->out_fd, rc, NULL);
    if (rc == 0) return;
    /* Every source delivered: check every byte of the request. */
    uint64_t t0 = demo_now_ns();
    struct demo_mismatch mm = {0};
    uint64_t checked = demo_check_request(s, &D->pool, (uint32_t)n->request_id, q->dst, q->n, &mm);
    uint64_t verify_ns = demo_now_ns() - t0;
    if (mm.found) report_bad(D, (uint32_t)n->request_id, "on arrival, its KV differs from the reference prefill wrote", &mm);
    q->state = DREQ_DONE;
    say(D->a->out_fd, "done %llu %llu %llu %llu", (unsigned long long)n->request_id,
        (unsigned long long)t_ns, (unsigned long long)checked, (unsigned long long)verify_ns);
}

static void decode_retire(struct decode *D, struct demo_tok *t)
{
    uint32_t req;
    if (demo_tok_u32(t, &req) != 0 || req >= D->s->requests || D->reqs[req].state != DREQ_DONE)
        bad_line(D->a, "retire");
    struct dreq *q = &D->reqs[req];
    /* Checked once more before its pages are freed: later transfers must
     * not have touched it. */
    struct demo_mismatch mm = {0};
    uint64_t checked = demo_check_request(D->s, &D->pool, req, q->dst, q->n, &mm);
    if (mm.found) report_bad(D, req, "its pages changed after it was verified (a later write landed in them)", &mm);
    demo_fill_canary(&D->pool, q->dst, q->n);
    q->state = DREQ_RETIRED;
    dreq_release(D, q);
    say(D->a->out_fd, "retired %u %llu", req, (unsigned long long)checked);
}

static void decode_finish(struct decode *D)
{
    const struct demo_shape *s = D->s;
    unsigned char *used = calloc(s->decode_pool, 1);
    int32_t *free_pages = malloc(s->decode_pool * sizeof *free_pages);
    if (!used || !free_pages) demo_rank_fail(D->a->out_fd, FERRY_ERR_MEMORY, "MEMORY: final sweep");
    uint64_t resident = 0, canary = 0;
    for (uint32_t r = 0; r < s->requests; r++) {
        struct dreq *q = &D->reqs[r];
        if (q->state != DREQ_DONE && q->state != DREQ_ARMED) continue;
        for (uint32_t i = 0; i < q->n; i++) used[q->dst[i]] = 1;
        if (q->state != DREQ_DONE) continue;
        struct demo_mismatch mm = {0};
        resident += demo_check_request(s, &D->pool, r, q->dst, q->n, &mm);
        if (mm.found) report_bad(D, r, "its pages changed after it was verified (a later write landed in them)", &mm);
    }
    uint32_t nfree = 0;
    for (uint32_t p = 0; p < s->decode_pool; p++)
        if (!used[p]) free_pages[nfree++] = (int32_t)p;
    struct demo_mismatch mm = {0};
    canary = demo_check_canary(&D->pool, free_pages, nfree, &mm);
    if (mm.found) {
        char text[512];
        demo_mismatch_text(&mm, text, sizeof text);
        say(D->a->out_fd, "bad %u %llu decode rank %u: a free page holds stray bytes: %s", s->requests,
            (unsigned long long)mm.bytes, D->a->rank, text);
    }
    free(used);
    free(free_pages);
    say(D->a->out_fd, "final %llu %llu", (unsigned long long)resident, (unsigned long long)canary);
}

void demo_decode_main(const struct demo_rank_args *a)
{
    const struct demo_shape *s = a->shape;
    struct decode D = {.a = a, .s = s};
    D.e = rank_engine(a);
    int rc = demo_pool_create(&D.pool, s, 1, a->rank, D.e, FERRY_MEM_REMOTE_WRITE, DEMO_CANARY);
    if (rc != 0) demo_rank_fail(a->out_fd, rc, NULL);
    D.sources = calloc(s->prefill_tp, sizeof *D.sources);
    D.reqs = calloc(s->requests, sizeof *D.reqs);
    D.prefill_names = calloc(s->prefill_tp, sizeof *D.prefill_names);
    D.prefill_ids = calloc(s->prefill_tp, sizeof *D.prefill_ids);
    D.prefill_known = calloc(s->prefill_tp, sizeof *D.prefill_known);
    if (!D.sources || !D.reqs || !D.prefill_names || !D.prefill_ids || !D.prefill_known)
        demo_rank_fail(a->out_fd, FERRY_ERR_MEMORY, "MEMORY: sources");
    D.nsources = ferry_kv_tp_sources(s->heads, s->prefill_tp, s->decode_tp, a->rank, D.sources, s->prefill_tp);
    if (D.nsources < 0) demo_rank_fail(a->out_fd, (int)D.nsources, NULL);
    /* When the sources fill only part of each row, they write into staging
     * and the notice scatters it: one slot per request in flight, the
     * whole buffer registered for remote write once. */
    for (long i = 0; i < D.nsources; i++) {
        uint64_t src_need = 0, dst_need = 0;
        rc = demo_staging_need(s, D.sources[i].prefill_rank, a->rank, &src_need, &dst_need);
        if (rc != 0) demo_rank_fail(a->out_fd, rc, NULL);
        if (dst_need > D.slot_bytes) D.slot_bytes = dst_need;
    }
    if (D.slot_bytes) {
        D.staging = demo_map(D.slot_bytes * s->inflight);
        if (!D.staging) demo_rank_fail(a->out_fd, FERRY_ERR_MEMORY, "MEMORY: mapping the decode staging");
        /* Touched now, as a server's would be: first-touch faults inside
         * the engine's recv would otherwise be counted as latency. */
        memset(D.staging, 0, D.slot_bytes * s->inflight);
        rc = ferry_register(D.e, D.staging, D.slot_bytes * s->inflight, FERRY_MEM_REMOTE_WRITE);
        if (rc != 0) demo_rank_fail(a->out_fd, rc, NULL);
    }

    struct inbox box = {.e = D.e};
    pthread_mutex_init(&box.lock, NULL);
    pthread_t poller;
    if (pthread_create(&poller, NULL, notice_thread, &box) != 0)
        demo_rank_fail(a->out_fd, FERRY_ERR_INTERNAL, "INTERNAL: cannot start the notice thread");

    struct demo_str hello = {0};
    demo_str_printf(&hello, "hello %s %d %llu %llu %llu", ferry_engine_name(D.e), (int)getpid(),
                    (unsigned long long)demo_pool_bytes(s, 1, a->rank),
                    (unsigned long long)(uintptr_t)D.staging, (unsigned long long)D.slot_bytes);
    for (uint32_t l = 0; l < s->layers; l++) demo_str_printf(&hello, " %llu", (unsigned long long)D.pool.k_addrs[l]);
    for (uint32_t l = 0; l < s->layers; l++) demo_str_printf(&hello, " %llu", (unsigned long long)D.pool.v_addrs[l]);
    say(a->out_fd, "%s", hello.s);
    demo_str_free(&hello);

    struct demo_lines in = {.fd = a->in_fd};
    int quit = 0;
    while (!quit) {
        pthread_mutex_lock(&box.lock);
        struct stamped *got = box.head;
        box.head = box.tail = NULL;
        int poll_error = box.error;
        pthread_mutex_unlock(&box.lock);
        if (poll_error) demo_rank_fail(a->out_fd, poll_error, box.detail);
        for (struct stamped *n = got, *next; n; n = next) {
            next = n->next;
            if (n->ev.is_notice) decode_notice(&D, &n->ev.notice, &n->from, n->t_ns);
            ferry_kv_events_free(&n->ev, 1);
            free(n);
        }
        struct pollfd p = {.fd = a->in_fd, .events = POLLIN};
        if (poll(&p, 1, 1) <= 0) continue;
        ssize_t r = demo_lines_fill(&in);
        if (r == 0 || (r < 0 && errno != EAGAIN)) _exit(1); /* the orchestrator is gone */
        char *line;
        while (!quit && demo_lines_next(&in, &line)) {
            struct demo_tok t = {line};
            char *cmd = demo_tok_next(&t);
            if (!cmd) continue;
            if (strcmp(cmd, "expect") == 0) decode_expect(&D, &t);
            else if (strcmp(cmd, "source") == 0) decode_source(&D, &t);
            else if (strcmp(cmd, "retire") == 0) decode_retire(&D, &t);
            else if (strcmp(cmd, "finish") == 0) decode_finish(&D);
            else if (strcmp(cmd, "quit") == 0) quit = 1;
            else bad_line(a, cmd);
        }
    }
    atomic_store(&box.stop, 1);
    pthread_join(poller, NULL);
    for (struct stamped *n = box.head, *next; n; n = next) {
        next = n->next;
        ferry_kv_events_free(&n->ev, 1);
        free(n);
    }
    pthread_mutex_destroy(&box.lock);
    ferry_engine_destroy(D.e);
    for (uint32_t r = 0; r < s->requests; r++) dreq_release(&D, &D.reqs[r]);
    demo_pool_destroy(&D.pool, NULL);
    demo_unmap(D.staging, D.slot_bytes * s->inflight);
    free(D.sources);
    free(D.prefill_names);
    free(D.prefill_ids);
    free(D.prefill_known);
    free(D.reqs);
    demo_lines_free(&in);
    say(a->out_fd, "bye");
    exit(0);
}
