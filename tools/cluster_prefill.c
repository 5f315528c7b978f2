/* `ferry cluster node --role prefill`: serves the decodes' asks, one queue
 * and --streams sender threads per decode peer, --send-slots KV sends at once
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

/* prefill: at most --send-slots KV sends at once, like a server's send
 * queue; the others wait their turn before their deadline starts. */
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slots_cond = PTHREAD_COND_INITIALIZER;
static int slots_free;

static void slot_take(void)
{
    pthread_mutex_lock(&slots_lock);
    while (slots_free == 0) pthread_cond_wait(&slots_cond, &slots_lock);
    slots_free--;
    pthread_mutex_unlock(&slots_lock);
}

static void slot_give(void)
{
    pthread_mutex_lock(&slots_lock);
    slots_free++;
    pthread_cond_signal(&slots_cond);
    pthread_mutex_unlock(&slots_lock);
}

struct job {
    uint64_t req, epoch;
    uint32_t dst_num_pages;
    uint64_t addrs[64];
    int32_t *pages;
    bool stale; /* from an incarnation of the decode that has since restarted */
    struct job *next;
};

struct peerq {
    char name[256];
    ferry_engine_t *e;
    const struct node_opts *o;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct job *head, *tail;
    uint64_t latest_epoch; /* of the newest ask: older ones are stale */
    pthread_t *threads;
    int nthreads;
    struct peerq *next;
};

static void job_free(struct job *j)
{
    if (!j) return;
    free(j->pages);
    free(j);
}

static struct job *peerq_pop(struct peerq *q)
{
    pthread_mutex_lock(&q->lock);
    while (!q->head && !atomic_load(&stopping)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&q->cond, &q->lock, &ts);
    }
    struct job *j = q->head;
    if (j) {
        q->head = j->next;
        if (!q->head) q->tail = NULL;
    }
    pthread_mutex_unlock(&q->lock);
    return j;
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

static void *prefill_sender(void *arg)
{
    struct peerq *q = arg;
    const struct node_opts *o = q->o;
    struct pool src;
    pool_create(&src, q->e, o, o->pages, FERRY_MEM_LOCAL, 0);
    uint64_t bytes = (uint64_t)o->layers * o->pages * o->page_bytes;
    struct job *j;
    while ((j = peerq_pop(q)) != NULL) {
        uint64_t t0 = mono_us();
        bool stale = j->stale;
        int rc = FERRY_ERR_PEER_RESTARTED;
        if (!stale) {
            slot_take();
            rc = send_job(q, &src, j, &stale);
            slot_give();
        }
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
    }
    return NULL;
}

static struct peerq *peerq_get(struct peerq **list, ferry_engine_t *e, const struct node_opts *o, const char *name)
{
    for (struct peerq *q = *list; q; q = q->next)
        if (strcmp(q->name, name) == 0) return q;
    struct peerq *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    snprintf(q->name, sizeof q->name, "%s", name);
    q->e = e;
    q->o = o;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    q->threads = calloc((size_t)o->streams, sizeof *q->threads);
    for (int i = 0; q->threads && i < o->streams; i++)
        if (pthread_create(&q->threads[i], NULL, prefill_sender, q) == 0) {
            q->nthreads++;
            atomic_fetch_add(&node_threads, 1);
        }
    q->next = *list;
    *list = q;
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

static void prefill_enqueue(struct peerq *q, struct job *j)
{
    pthread_mutex_lock(&q->lock);
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
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

static struct peerq *queues;

void prefill_begin(const struct node_opts *o)
{
    slots_free = o->send_slots;
    queues = NULL;
}

/* One notification: an ask goes to its decode's queue. */
void prefill_take(const struct node_opts *o, ferry_engine_t *e, const ferry_notification_t *n)
{
    struct job *j = parse_ask(o, n->msg, n->len);
    struct peerq *q = j ? peerq_get(&queues, e, o, n->peer) : NULL;
    if (q) {
        prefill_enqueue(q, j);
        return;
    }
    fprintf(stderr, "prefill %s: unreadable ask from %s (%zu bytes)\n", ferry_engine_name(e), n->peer, n->len);
    job_free(j);
}

/* After `stopping`: the sender threads end, their queues are dropped. */
void prefill_end(void)
{
    for (struct peerq *q = queues; q; q = q->next) {
        pthread_mutex_lock(&q->lock);
        pthread_cond_broadcast(&q->cond);
        pthread_mutex_unlock(&q->lock);
    }
    while (queues) {
        struct peerq *q = queues;
        queues = q->next;
        for (int i = 0; i < q->nthreads; i++) pthread_join(q->threads[i], NULL);
        atomic_fetch_sub(&node_threads, q->nthreads);
        while (q->head) {
            struct job *j = q->head;
            q->head = j->next;
            job_free(j);
        }
        free(q->threads);
        free(q);
    }
}

int prefill_main(const struct node_opts *o, ferry_engine_t *e)
{
    prefill_begin(o);
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
