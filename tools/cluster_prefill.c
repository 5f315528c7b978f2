/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry cluster node --role prefill`: serves the decodes' asks, one queue
 * per decode peer, served in turn by a pool of --send-slots sender threads
 * (the KV sends at once), at most --streams of them on one peer's queue
 * (see cmd_cluster.c for the roles). */
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

static atomic_uint prefill_sends;

struct job {
    uint64_t req, epoch;
    uint32_t dst_num_pages;
    uint64_t addrs[64];
    int32_t *pages;
    bool stale; /* from an incarnation of the decode that has since restarted */
    struct job *next;
};

/* One decode peer's asks. The queues and the pool share one lock. */
struct peerq {
    char name[256];
    ferry_engine_t *e;
    const struct node_opts *o;
    struct job *head, *tail;
    uint64_t latest_epoch; /* of the newest ask: older ones are stale */
    int active;            /* its asks being sent now, at most o->streams */
    struct peerq *next;
};

/* A fixed pool of sender threads, not one per peer: a prefill serving 63
 * decodes (the 64-engine mesh) runs --send-slots senders, not 63 or more.
 * A dead peer holds at most --streams of them, until its deadline. */
static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static struct peerq *queues;
static struct peerq *turn; /* the queue to look at first: after the one served last */
static pthread_t *senders;
static int nsenders;

static void job_free(struct job *j)
{
    if (!j) return;
    free(j->pages);
    free(j);
}

/* The next ask to send: from the peer queues in turn, among those with
 * fewer than --streams asks being sent. Waits for one; NULL once stopping. */
static struct job *job_next(struct peerq **from)
{
    pthread_mutex_lock(&q_lock);
    for (;;) {
        struct peerq *start = turn ? turn : queues;
        for (struct peerq *q = start; q;) {
            if (q->head && q->active < q->o->streams) {
                struct job *j = q->head;
                q->head = j->next;
                if (!q->head) q->tail = NULL;
                q->active++;
                turn = q->next;
                pthread_mutex_unlock(&q_lock);
                *from = q;
                return j;
            }
            q = q->next ? q->next : queues; /* wraps round the list once */
            if (q == start) break;
        }
        if (atomic_load(&stopping)) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&q_cond, &q_lock, &ts);
    }
    pthread_mutex_unlock(&q_lock);
    return NULL;
}

static void job_done(struct peerq *q)
{
    pthread_mutex_lock(&q_lock);
    q->active--;
    pthread_cond_broadcast(&q_cond); /* its queue may be eligible again */
    pthread_mutex_unlock(&q_lock);
}

/* The session must talk to the incarnation that asked: a session still on
 * the previous one (PEER_RESTARTED seen, or not yet) is closed and opened
 * afresh, through the metadata service. 0, or the code to record. */
static int session_for(struct peerq *q, const struct job *j, bool *stale)
{
    ferry_peer_info_t info;
    for (int attempt = 0; attempt < 2; attempt++) {
        int rc = ferry_session_open(q->e, q->name);
        if (rc == 0) rc = ferry_session_info(q->e, q->name, &info);
        if (rc == 0 && info.epoch == j->epoch) return 0;
        if (rc != 0 && rc != FERRY_ERR_PEER_RESTARTED && rc != FERRY_ERR_SESSION_INVALID) return rc;
        ferry_session_close(q->e, q->name);
    }
    *stale = true;
    return FERRY_ERR_PEER_RESTARTED;
}

static int send_job(struct peerq *q, struct pool *src, const struct job *j, bool *stale)
{
    const struct node_opts *o = q->o;
    int rc = session_for(q, j, stale);
    if (rc) return rc;
    uint64_t seed = request_seed(ferry_engine_name(q->e), j->req);
    size_t words = o->page_bytes / 8;
    int32_t *src_pages = malloc(sizeof *src_pages * o->pages);
    if (!src_pages) return FERRY_ERR_MEMORY;
    for (uint32_t l = 0; l < o->layers; l++)
        for (uint32_t pos = 0; pos < o->pages; pos++) {
            src_pages[pos] = (int32_t)pos;
            fill_page(pool_page(src, l, (int32_t)pos), words, seed, ((uint64_t)l * o->pages + pos) * words);
        }
    unsigned nth = atomic_fetch_add(&prefill_sends, 1) + 1;
    bool corrupt = o->inject && !strcmp(o->inject, "corrupt") && nth == 20;
    bool stray = o->inject && !strcmp(o->inject, "stray") && nth >= 20 && nth <= 22;
    if (corrupt) ((unsigned char *)pool_page(src, 0, 0))[100] ^= 0x01;
    ferry_kv_cache_desc_t sd = pool_desc(o->layers, src->num_pages, o->page_bytes, src->addrs);
    ferry_kv_cache_desc_t dd = pool_desc(o->layers, j->dst_num_pages, o->page_bytes, j->addrs);
    ferry_kv_plan_t *plan = NULL;
    rc = ferry_kv_plan_create(&sd, &dd, src_pages, j->pages, o->pages, &plan);
    if (rc == 0) rc = ferry_kv_plan_bind_sender(plan, 0, 0, 0, 0);
    if (rc == 0) {
        ferry_kv_send_args_t args = {.request_id = j->req, .timeout_ms = o->timeout_ms};
        rc = ferry_kv_send(q->e, q->name, plan, &args);
    }
    if (rc == 0 && stray) {
        /* Bytes that are not this request's, written where it was: a
         * late writer the decode must catch (verify or canary check). */
        fill_page(pool_page(src, 0, 0), words, seed + 1, 0);
        ferry_transfer_sync(q->e, q->name, FERRY_OP_WRITE, pool_page(src, 0, 0),
                            j->addrs[0] + (uint64_t)j->pages[0] * o->page_bytes, o->page_bytes);
    }
    ferry_kv_plan_destroy(plan);
    free(src_pages);
    /* The peer restarted under us: the next ask comes from the new one. */
    if (rc == FERRY_ERR_PEER_RESTARTED || rc == FERRY_ERR_SESSION_INVALID) ferry_session_close(q->e, q->name);
    return rc;
}

struct sender_arg {
    ferry_engine_t *e;
    const struct node_opts *o;
};

static void *prefill_sender(void *arg)
{
    const struct sender_arg *sa = arg;
    const struct node_opts *o = sa->o;
    struct pool src;
    pool_create(&src, sa->e, o, o->pages, FERRY_MEM_LOCAL, 0);
    uint64_t bytes = (uint64_t)o->layers * o->pages * o->page_bytes;
    struct job *j;
    struct peerq *q;
    while ((j = job_next(&q)) != NULL) {
        uint64_t t0 = mono_us();
        bool stale = j->stale;
        int rc = FERRY_ERR_PEER_RESTARTED;
        if (!stale) rc = send_job(q, &src, j, &stale);
        if (rc && !stale) {
            char detail[512];
            snprintf(detail, sizeof detail, "%s", ferry_last_error_detail());
            for (char *p = detail; *p; p++)
                if (*p == '\n') *p = ' ';
            fprintf(stderr, "prefill %s: request %" PRIx64 " to %s: %s: %s\n", ferry_engine_name(q->e), j->req,
                    q->name, ferry_error_name(rc), detail);
        }
        logline("R %" PRIu64 " %" PRIu64 " %s %" PRIu64 " %d %d\n", wall_ms(), mono_us() - t0, q->name,
                rc == 0 ? bytes : 0, rc, stale ? 1 : 0);
        job_free(j);
        job_done(q);
    }
    return NULL;
}

/* The queue of a peer, made at its first ask. Called with q_lock held. */
static struct peerq *peerq_get(ferry_engine_t *e, const struct node_opts *o, const char *name)
{
    for (struct peerq *q = queues; q; q = q->next)
        if (strcmp(q->name, name) == 0) return q;
    struct peerq *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    snprintf(q->name, sizeof q->name, "%s", name);
    q->e = e;
    q->o = o;
    q->next = queues;
    queues = q;
    return q;
}

/* "FCREQ REQ EPOCH DST_NUM_PAGES LAYERS ADDR... PAGE..." (hex addresses). */
static struct job *parse_ask(const struct node_opts *o, const unsigned char *msg, size_t len)
{
    char *text = malloc(len + 1);
    if (!text) return NULL;
    memcpy(text, msg, len);
    text[len] = 0;
    struct job *j = calloc(1, sizeof *j);
    char *save = NULL, *tok = strtok_r(text, " ", &save);
    bool ok = j && tok && strcmp(tok, REQ_TAG) == 0;
    uint64_t v[4];
    for (int i = 0; ok && i < 4; i++) {
        tok = strtok_r(NULL, " ", &save);
        ok = tok != NULL;
        if (ok) v[i] = strtoull(tok, NULL, 16);
    }
    ok = ok && v[3] == o->layers;
    if (ok) {
        j->req = v[0];
        j->epoch = v[1];
        j->dst_num_pages = (uint32_t)v[2];
        j->pages = calloc(o->pages, sizeof *j->pages);
        ok = j->pages != NULL;
    }
    for (uint32_t l = 0; ok && l < o->layers; l++) {
        tok = strtok_r(NULL, " ", &save);
        ok = tok != NULL;
        if (ok) j->addrs[l] = strtoull(tok, NULL, 16);
    }
    for (uint32_t p = 0; ok && p < o->pages; p++) {
        tok = strtok_r(NULL, " ", &save);
        ok = tok != NULL;
        if (ok) j->pages[p] = (int32_t)strtol(tok, NULL, 16);
    }
    free(text);
    if (!ok) {
        job_free(j);
        return NULL;
    }
    return j;
}

/* Called with q_lock held. */
static void prefill_enqueue(struct peerq *q, struct job *j)
{
    if (j->epoch != q->latest_epoch) {
        /* A new incarnation asks: what the old one asked is void. */
        for (struct job *o = q->head; o; o = o->next) o->stale = true;
        q->latest_epoch = j->epoch;
    }
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    pthread_cond_signal(&q_cond);
}

static struct sender_arg sender_arg;

void prefill_begin(const struct node_opts *o, ferry_engine_t *e)
{
    queues = turn = NULL;
    sender_arg = (struct sender_arg){e, o};
    senders = calloc((size_t)o->send_slots, sizeof *senders);
    nsenders = 0;
    for (int i = 0; senders && i < o->send_slots; i++)
        if (pthread_create(&senders[i], NULL, prefill_sender, &sender_arg) == 0) nsenders++;
    if (nsenders == 0) die("prefill sender threads", FERRY_ERR_MEMORY);
    atomic_fetch_add(&node_threads, nsenders);
}

/* One notification: an ask goes to its decode's queue. */
void prefill_take(const struct node_opts *o, ferry_engine_t *e, const ferry_notification_t *n)
{
    struct job *j = parse_ask(o, n->msg, n->len);
    pthread_mutex_lock(&q_lock);
    struct peerq *q = j ? peerq_get(e, o, n->peer) : NULL;
    if (q) prefill_enqueue(q, j);
    pthread_mutex_unlock(&q_lock);
    if (q) return;
    fprintf(stderr, "prefill %s: unreadable ask from %s (%zu bytes)\n", ferry_engine_name(e), n->peer, n->len);
    job_free(j);
}

/* After `stopping`: the sender threads end, the queues are dropped. */
void prefill_end(void)
{
    pthread_mutex_lock(&q_lock);
    pthread_cond_broadcast(&q_cond);
    pthread_mutex_unlock(&q_lock);
    for (int i = 0; i < nsenders; i++) pthread_join(senders[i], NULL);
    atomic_fetch_sub(&node_threads, nsenders);
    free(senders);
    senders = NULL;
    nsenders = 0;
    while (queues) {
        struct peerq *q = queues;
        queues = q->next;
        while (q->head) {
            struct job *j = q->head;
            q->head = j->next;
            job_free(j);
        }
        free(q);
    }
    turn = NULL;
}

int prefill_main(const struct node_opts *o, ferry_engine_t *e)
{
    prefill_begin(o, e);
    uint64_t next_sample = 0;
    ferry_notification_t n[64];
    int idle_ms = 0;
    while (!atomic_load(&stopping)) {
        long got = ferry_get_notifications(e, n, 64);
        for (long i = 0; i < got; i++) prefill_take(o, e, &n[i]);
        if (got > 0) ferry_notifications_free(n, (size_t)got);
        if (wall_ms() >= next_sample) {
            sample_process(e);
            next_sample = wall_ms() + 1000;
        }
        idle_backoff(&idle_ms, got > 0);
    }
    prefill_end();
    sample_process(e);
    logline("E %" PRIu64 "\n", wall_ms());
    return 0;
}
