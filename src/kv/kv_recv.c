/* SPDX-License-Identifier: Apache-2.0 */
/* The decode side: reading notices off the engine's queue and tracking one
 * request until every prefill source delivered. */
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ferry/ferry.h>

#include "util/fail.h"
#include "link/watch.h"
#include "kv_internal.h"

long ferry_kv_poll(ferry_engine_t *e, ferry_kv_event_t *out, size_t max)
{
    return ferry_kv_poll_from(e, out, NULL, max);
}

long ferry_kv_poll_from(ferry_engine_t *e, ferry_kv_event_t *out, ferry_notification_sender_t *from, size_t max)
{
    if (!e || (max && !out))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv poll: NULL engine or output");
    if (max == 0) return 0;
    ferry_notification_t *raw = ferry_malloc_array(max, sizeof *raw); /* NULL when max * size wraps */
    if (!raw) return ferry_fail(FERRY_ERR_MEMORY, "kv poll: %zu notifications", max);
    long n = ferry_get_notifications_from(e, raw, from, max);
    for (long i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].raw = raw[i];
        /* A damaged notice is handed over as a plain message rather than
         * dropped: the caller may still want to log it. */
        out[i].is_notice = ferry_kv_notice_decode(raw[i].msg, raw[i].len, &out[i].notice) == 1;
    }
    free(raw);
    return n;
}

void ferry_kv_events_free(ferry_kv_event_t *ev, size_t n)
{
    for (size_t i = 0; ev && i < n; i++) {
        ferry_notifications_free(&ev[i].raw, 1);
        ev[i].is_notice = 0;
    }
}

struct ferry_kv_recv {
    pthread_mutex_t lock;  /* threads may offer notices at once */
    uint64_t request_id;
    ferry_kv_plan_t **plans;
    int *delivered;      /* per plan: its source's success notice arrived */
    /* Set by ferry_kv_recv_verify: per plan, its source and the watch
     * counting what that source placed into the plan's destination. */
    ferry_kv_source_t *sources;
    ferry_watch_t **watches;
    uint64_t refused;    /* notices refused (ferry_kv_recv_refused) */
    size_t n;
    size_t remaining;
    int outcome;         /* 0 waiting, 1 complete, or the failure code */
    char failure[FERRY_KV_REASON_MAX + 64];
    unsigned char *aux;
    size_t aux_len;
};

int ferry_kv_recv_create(uint64_t request_id, ferry_kv_plan_t *const *plans, size_t n,
                         ferry_kv_recv_t **out)
{
    if (!out || (n && !plans))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv recv %llu: NULL plans or out",
                          (unsigned long long)request_id);
    *out = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!plans[i] || !plans[i]->receiver_bound)
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                              "kv recv %llu: plan %zu is NULL or not bound (bind_receiver first)",
                              (unsigned long long)request_id, i);
    }
    ferry_kv_recv_t *r = calloc(1, sizeof *r);
    if (r) {
        r->plans = malloc((n ? n : 1) * sizeof *r->plans);
        r->delivered = calloc(n ? n : 1, sizeof *r->delivered);
    }
    if (!r || !r->plans || !r->delivered) {
        ferry_kv_recv_destroy(r);
        return ferry_fail(FERRY_ERR_MEMORY, "kv recv %llu: tracking %zu sources",
                          (unsigned long long)request_id, n);
    }
    if (n) memcpy(r->plans, plans, n * sizeof *plans);
    pthread_mutex_init(&r->lock, NULL);
    r->request_id = request_id;
    r->n = r->remaining = n;
    r->outcome = n == 0 ? 1 : 0;
    *out = r;
    return 0;
}

void ferry_kv_recv_destroy(ferry_kv_recv_t *r)
{
    if (!r) return;
    for (size_t i = 0; r->watches && i < r->n; i++) ferry_watch_destroy(r->watches[i]);
    free(r->watches);
    free(r->sources);
    if (r->plans && r->delivered) pthread_mutex_destroy(&r->lock);
    free(r->plans);
    free(r->delivered);
    free(r->aux);
    free(r);
}

static int current_outcome(const ferry_kv_recv_t *r)
{
    if (r->outcome < 0) return ferry_fail(r->outcome, "%s", r->failure);
    return r->outcome;
}

static int keep_aux(ferry_kv_recv_t *r, const ferry_kv_notice_t *n)
{
    if (r->aux_len || n->aux_len == 0) return 0;
    r->aux = malloc(n->aux_len);
    if (!r->aux) return ferry_fail(FERRY_ERR_MEMORY, "kv recv: aux of %zu bytes", n->aux_len);
    memcpy(r->aux, n->aux, n->aux_len);
    r->aux_len = n->aux_len;
    return 0;
}

static int offer_locked(ferry_kv_recv_t *r, const ferry_kv_notice_t *n, const ferry_notification_sender_t *from);

int ferry_kv_recv_offer(ferry_kv_recv_t *r, const ferry_kv_notice_t *n)
{
    return ferry_kv_recv_offer_from(r, n, NULL);
}

int ferry_kv_recv_offer_from(ferry_kv_recv_t *r, const ferry_kv_notice_t *n, const ferry_notification_sender_t *from)
{
    if (!r || !n) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv recv: NULL tracker or notice");
    pthread_mutex_lock(&r->lock);
    int rc = offer_locked(r, n, from);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

/* ------------------------------------------------------- verification */

/* The destination ranges of plan p on the decode rank: its staging region
 * when it scatters, else the pair's whole pages (its rows are whole there).
 * *out is malloc'd; *count ranges. */
static int plan_ranges(const ferry_kv_plan_t *p, ferry_watch_range_t **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    if (p->info.mode == FERRY_KV_MODE_NONE || p->info.bytes == 0) return 0;
    if (p->info.scatter) {
        *out = malloc(sizeof **out);
        if (!*out) return ferry_fail(FERRY_ERR_MEMORY, "kv recv: watch ranges");
        (*out)[0] = (ferry_watch_range_t){p->dst_staging_local + p->info.dst_staging_offset, p->info.bytes};
        *count = 1;
        return 0;
    }
    uint32_t buffers = p->dst_geo.buffers, layers = p->dst.num_layers;
    uint64_t page_bytes = p->dst_geo.page_bytes, total;
    if (kv_mul_overflows((uint64_t)layers * buffers, p->n, &total) || total > SIZE_MAX / sizeof **out)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv recv: %u layers x %u buffers x %zu pages overflow",
                          layers, buffers, p->n);
    ferry_watch_range_t *r = malloc((size_t)(total ? total : 1) * sizeof *r);
    if (!r) return ferry_fail(FERRY_ERR_MEMORY, "kv recv: %llu watch ranges", (unsigned long long)total);
    size_t k = 0;
    for (uint32_t l = 0; l < layers; l++)
        for (uint32_t b = 0; b < buffers; b++)
            for (size_t j = 0; j < p->n; j++)
                r[k++] = (ferry_watch_range_t){kv_buffer_addr(&p->dst, l, b) + (uint64_t)p->dst_pages[j] * page_bytes,
                                               page_bytes};
    *out = r;
    *count = k;
    return 0;
}

/* The source address in host as 16 bytes (IPv4 as v4-mapped IPv6); 0 or
 * INVALID_ARGUMENT. "" means any. */
static int host_ip(const char *host, uint8_t ip[16], int *any)
{
    memset(ip, 0, 16);
    *any = host[0] == '\0';
    if (*any) return 0;
    struct in_addr v4;
    if (inet_pton(AF_INET, host, &v4) == 1) {
        ip[10] = ip[11] = 0xff;
        memcpy(ip + 12, &v4, 4);
        return 0;
    }
    if (inet_pton(AF_INET6, host, ip) == 1) return 0;
    return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv recv: source host \"%s\" is not an IP address", host);
}

int ferry_kv_recv_verify(ferry_kv_recv_t *r, ferry_engine_t *e, const ferry_kv_source_t *sources)
{
    if (!r || !e || (r->n && !sources))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv recv verify: NULL tracker, engine or sources");
    pthread_mutex_lock(&r->lock);
    if (r->watches) {
        pthread_mutex_unlock(&r->lock);
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv recv %llu: verify was called already",
                          (unsigned long long)r->request_id);
    }
    int rc = 0;
    r->watches = calloc(r->n ? r->n : 1, sizeof *r->watches);
    r->sources = calloc(r->n ? r->n : 1, sizeof *r->sources);
    if (!r->watches || !r->sources) rc = ferry_fail(FERRY_ERR_MEMORY, "kv recv: %zu watches", r->n);
    for (size_t i = 0; rc == 0 && i < r->n; i++) {
        ferry_watch_source_t ws = {.engine_id = sources[i].engine_id, .epoch = sources[i].epoch};
        ferry_watch_range_t *ranges = NULL;
        size_t count = 0;
        r->sources[i] = sources[i];
        r->sources[i].host[sizeof r->sources[i].host - 1] = '\0';
        rc = host_ip(r->sources[i].host, ws.ip, &ws.any_ip);
        if (rc == 0) rc = plan_ranges(r->plans[i], &ranges, &count);
        if (rc == 0) rc = ferry_watch_create(e, &ws, ranges, count, &r->watches[i]);
        free(ranges);
    }
    if (rc != 0) {
        for (size_t i = 0; r->watches && i < r->n; i++) ferry_watch_destroy(r->watches[i]);
        free(r->watches);
        free(r->sources);
        r->watches = NULL;
        r->sources = NULL;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

uint64_t ferry_kv_recv_refused(const ferry_kv_recv_t *r)
{
    if (!r) return 0;
    pthread_mutex_t *lock = (pthread_mutex_t *)&r->lock;
    pthread_mutex_lock(lock);
    uint64_t v = r->refused;
    pthread_mutex_unlock(lock);
    return v;
}

/* The host part of an observed "ip:port" / "[ip6]:port" address. */
static void addr_host(const char *addr, char *host, size_t cap)
{
    const char *start = addr, *end = strrchr(addr, ':');
    if (addr[0] == '[') {
        start = addr + 1;
        end = strchr(addr, ']');
    }
    size_t len = end && end >= start ? (size_t)(end - start) : strlen(start);
    if (len >= cap) len = cap - 1;
    memcpy(host, start, len);
    host[len] = '\0';
}

/* 1 when host1 and host2 name the same IP address. */
static int same_ip(const char *a, const char *b)
{
    uint8_t x[16], y[16];
    int any;
    ferry_clear_last_error();
    if (host_ip(a, x, &any) != 0 || host_ip(b, y, &any) != 0) return strcmp(a, b) == 0;
    return memcmp(x, y, 16) == 0;
}

/* Counts and refuses notice n: code with the detail. */
static int refuse(ferry_kv_recv_t *r, int code, const char *fmt, const char *what)
{
    r->refused++;
    return ferry_fail(code, fmt, (unsigned long long)r->request_id, what);
}

/* For a tracker under verify: whether from is plan i's source. */
static int check_sender(ferry_kv_recv_t *r, size_t i, const ferry_kv_notice_t *n,
                        const ferry_notification_sender_t *from)
{
    char why[FERRY_KV_REASON_MAX];
    const ferry_kv_source_t *want = &r->sources[i];
    if (!from) return refuse(r, FERRY_ERR_ACCESS_DENIED, "kv recv %llu: %s", "a verified tracker needs the notice's "
                             "sender (ferry_kv_poll_from, ferry_kv_recv_offer_from)");
    char host[64];
    addr_host(from->addr, host, sizeof host);
    if (from->engine_id != want->engine_id || from->epoch != want->epoch ||
        (want->host[0] && !same_ip(host, want->host))) {
        snprintf(why, sizeof why,
                 "notice for prefill rank %u from engine %016llx epoch %llu at %s, but that rank's source is "
                 "engine %016llx epoch %llu at %s",
                 n->prefill_rank, (unsigned long long)from->engine_id, (unsigned long long)from->epoch, from->addr,
                 (unsigned long long)want->engine_id, (unsigned long long)want->epoch,
                 want->host[0] ? want->host : "any address");
        return refuse(r, FERRY_ERR_ACCESS_DENIED, "kv recv %llu: refused a %s", why);
    }
    return 0;
}

/* For a tracker under verify: whether plan i's source placed its bytes. */
static int check_landed(ferry_kv_recv_t *r, size_t i, const ferry_kv_notice_t *n)
{
    uint64_t need = r->plans[i]->info.bytes, landed = ferry_watch_bytes(r->watches[i]);
    if (landed >= need) return 0;
    char why[FERRY_KV_REASON_MAX];
    snprintf(why, sizeof why,
             "success notice from prefill rank %u (claiming %llu bytes): only %llu of the pair's %llu bytes were "
             "placed by its source",
             n->prefill_rank, (unsigned long long)n->bytes, (unsigned long long)landed, (unsigned long long)need);
    return refuse(r, FERRY_ERR_ACCESS_DENIED, "kv recv %llu: refused a %s", why);
}

static int offer_locked(ferry_kv_recv_t *r, const ferry_kv_notice_t *n, const ferry_notification_sender_t *from)
{
    if (n->request_id != r->request_id || r->outcome != 0) return current_outcome(r);
    if (!kv_status_known(n->status)) {
        char why[64];
        snprintf(why, sizeof why, "%d", n->status);
        return refuse(r, FERRY_ERR_ACCESS_DENIED,
                      "kv recv %llu: refused a notice with status %s, neither 0 nor a Ferry error code", why);
    }
    size_t i = 0;
    while (i < r->n && r->plans[i]->src.tp_rank != n->prefill_rank) i++;
    if (i == r->n)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv recv %llu: notice from prefill rank %u, which this request does not expect",
                          (unsigned long long)r->request_id, n->prefill_rank);
    if (r->watches) {
        int rc = check_sender(r, i, n, from);
        if (rc == 0 && n->status == 0 && !r->delivered[i]) rc = check_landed(r, i, n);
        if (rc) return rc;
    }
    if (n->status != 0) {
        r->outcome = n->status;
        snprintf(r->failure, sizeof r->failure, "kv recv %llu: prefill rank %u failed: %s",
                 (unsigned long long)r->request_id, n->prefill_rank, n->reason);
        return current_outcome(r);
    }
    if (r->delivered[i]) return 0;
    int rc = keep_aux(r, n);
    if (rc == 0) rc = ferry_kv_scatter(r->plans[i]);
    if (rc != 0) return rc;
    r->delivered[i] = 1;
    if (--r->remaining == 0) r->outcome = 1;
    return r->outcome;
}

const void *ferry_kv_recv_aux(const ferry_kv_recv_t *r, size_t *len)
{
    if (!r) {
        if (len) *len = 0;
        return NULL;
    }
    /* Set once, kept until destroy: the pointer stays valid. */
    pthread_mutex_t *lock = (pthread_mutex_t *)&r->lock;
    pthread_mutex_lock(lock);
    if (len) *len = r->aux_len;
    const void *aux = r->aux;
    pthread_mutex_unlock(lock);
    return aux;
}
