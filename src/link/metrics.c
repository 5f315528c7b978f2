/* SPDX-License-Identifier: Apache-2.0 */
/* Counting (metrics.h): the engine-wide counters, the per-peer counters
 * and latency histograms, the events that feed them, and their Prometheus
 * text form. */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"

/* ------------------------------------------------- engine-wide counters */

static const int table_codes[] = {
#define FERRY_X_CODE(name, value, retry, text) (value),
    FERRY_ERROR_TABLE(FERRY_X_CODE)
#undef FERRY_X_CODE
};

_Static_assert(FERRY_ERROR_TABLE_SIZE - 1 <= FERRY_STATS_MAX_CODES, "raise FERRY_STATS_MAX_CODES");

/* Position of code in the error table; codes outside it count as INTERNAL. */
static int code_index(int code)
{
    for (int i = 0; i < FERRY_ERROR_TABLE_SIZE; i++)
        if (table_codes[i] == code) return i;
    for (int i = 0; i < FERRY_ERROR_TABLE_SIZE; i++)
        if (table_codes[i] == FERRY_ERR_INTERNAL) return i;
    return 0;
}

static void count_code_failure(ferry_counters_t *c, int code)
{
    if (code >= 0) return;
    atomic_fetch_add_explicit(&c->failures[code_index(code)], 1, memory_order_relaxed);
}

static void count_code_retry(ferry_counters_t *c, int code)
{
    atomic_fetch_add_explicit(&c->retries, 1, memory_order_relaxed);
    if (code < 0) atomic_fetch_add_explicit(&c->code_retries[code_index(code)], 1, memory_order_relaxed);
}

void ferry_stats_read(ferry_counters_t *c, ferry_stats_t *out)
{
    memset(out, 0, sizeof *out);
#define FERRY_X_COPY(f, help) out->f = atomic_load_explicit(&c->f, memory_order_relaxed);
    FERRY_STATS_FIELDS(FERRY_X_COPY)
#undef FERRY_X_COPY
    size_t k = 0;
    for (int i = 0; i < FERRY_ERROR_TABLE_SIZE && k < FERRY_STATS_MAX_CODES; i++) {
        if (table_codes[i] == 0) continue;
        out->codes[k].code = table_codes[i];
        out->codes[k].failures = atomic_load_explicit(&c->failures[i], memory_order_relaxed);
        out->codes[k].retries = atomic_load_explicit(&c->code_retries[i], memory_order_relaxed);
        k++;
    }
    out->ncodes = k;
}

/* ---------------------------------------------------------- peer entries */

const uint64_t ferry_latency_bounds_us[FERRY_LATENCY_BUCKETS] = {
    10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000, 500000,
    1000000, 2000000, 5000000, UINT64_MAX};

void ferry_metrics_init(ferry_metrics_t *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
}

void ferry_metrics_destroy(ferry_metrics_t *m)
{
    ferry_peer_stats_t *p = m->peers;
    while (p) {
        ferry_peer_stats_t *next = p->next;
        pthread_mutex_destroy(&p->lock);
        free(p);
        p = next;
    }
    m->peers = NULL;
    pthread_mutex_destroy(&m->lock);
}

ferry_peer_stats_t *ferry_metrics_peer(ferry_metrics_t *m, const char *peer)
{
    pthread_mutex_lock(&m->lock);
    ferry_peer_stats_t *p = m->peers;
    while (p && strcmp(p->m.peer, peer) != 0) p = p->next;
    if (!p && (p = calloc(1, sizeof *p)) != NULL) {
        pthread_mutex_init(&p->lock, NULL);
        snprintf(p->m.peer, sizeof p->m.peer, "%s", peer);
        snprintf(p->m.transport, sizeof p->m.transport, "none");
        p->next = m->peers;
        m->peers = p;
    }
    pthread_mutex_unlock(&m->lock);
    return p;
}

static void count_error(ferry_peer_metrics_t *m, int rc)
{
    for (size_t i = 0; i < m->nerrors; i++) {
        if (m->error_codes[i] == rc) {
            m->error_counts[i]++;
            return;
        }
    }
    if (m->nerrors < FERRY_METRICS_MAX_CODES) {
        m->error_codes[m->nerrors] = rc;
        m->error_counts[m->nerrors++] = 1;
    }
}

static void peer_request(ferry_peer_stats_t *p, const char *transport, int opcode, uint64_t bytes,
                         uint64_t latency_ns, int rc)
{
    if (!p) return;
    uint64_t us = latency_ns / 1000;
    int op = opcode == FERRY_OP_WRITE ? 1 : 0;
    pthread_mutex_lock(&p->lock);
    if (transport) snprintf(p->m.transport, sizeof p->m.transport, "%s", transport);
    p->m.requests[op]++;
    p->m.bytes[op] += bytes;
    if (rc) {
        p->m.failures++;
        count_error(&p->m, rc);
    }
    int b = 0;
    while (us > ferry_latency_bounds_us[b]) b++;
    p->m.latency[b]++;
    p->m.latency_sum_us += us;
    pthread_mutex_unlock(&p->lock);
}

static void peer_retry(ferry_peer_stats_t *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->m.retries++;
    pthread_mutex_unlock(&p->lock);
}

/* ---------------------------------------------------------------- events */

void ferry_count_request_in(ferry_counters_t *stats, ferry_peer_stats_t *p, const char *transport, int opcode,
                            uint64_t bytes, uint64_t latency_ns, int rc)
{
    peer_request(p, transport, opcode, bytes, latency_ns, rc);
    if (rc) {
        FERRY_STAT_ADD(stats, requests_failed, 1);
        count_code_failure(stats, rc);
    } else {
        FERRY_STAT_ADD(stats, requests_completed, 1);
    }
}

void ferry_count_requests_ok_in(ferry_counters_t *stats, ferry_peer_stats_t *p, const char *transport, int opcode,
                                uint64_t count, uint64_t bytes, uint64_t latency_ns)
{
    if (count == 0) return;
    if (p) {
        uint64_t us = latency_ns / 1000;
        int op = opcode == FERRY_OP_WRITE ? 1 : 0;
        int b = 0;
        while (us > ferry_latency_bounds_us[b]) b++;
        pthread_mutex_lock(&p->lock);
        if (transport) snprintf(p->m.transport, sizeof p->m.transport, "%s", transport);
        p->m.requests[op] += count;
        p->m.bytes[op] += bytes;
        p->m.latency[b] += count;
        p->m.latency_sum_us += us * count;
        pthread_mutex_unlock(&p->lock);
    }
    FERRY_STAT_ADD(stats, requests_completed, count);
}

void ferry_count_retry_in(ferry_counters_t *stats, ferry_peer_stats_t *p, int code)
{
    peer_retry(p);
    count_code_retry(stats, code);
}

void ferry_count_failure_in(ferry_counters_t *stats, int code) { count_code_failure(stats, code); }

/* ------------------------------------------------------------ the readers */

long ferry_metrics_copy_peers(ferry_metrics_t *m, ferry_peer_metrics_t *out, size_t max)
{
    long n = 0;
    pthread_mutex_lock(&m->lock);
    for (ferry_peer_stats_t *p = m->peers; p; p = p->next, n++) {
        if ((size_t)n >= max) continue;
        pthread_mutex_lock(&p->lock);
        out[n] = p->m;
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&m->lock);
    return n;
}

static void add_into(ferry_peer_metrics_t *sum, const ferry_peer_metrics_t *m)
{
    for (int i = 0; i < 2; i++) {
        sum->requests[i] += m->requests[i];
        sum->bytes[i] += m->bytes[i];
    }
    sum->failures += m->failures;
    sum->retries += m->retries;
    for (int b = 0; b < FERRY_LATENCY_BUCKETS; b++) sum->latency[b] += m->latency[b];
    sum->latency_sum_us += m->latency_sum_us;
    for (size_t i = 0; i < m->nerrors; i++)
        for (uint64_t k = 0; k < m->error_counts[i]; k++) count_error(sum, m->error_codes[i]);
}

void ferry_metrics_sum_transport(ferry_metrics_t *m, const char *transport, ferry_peer_metrics_t *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->peer, sizeof out->peer, "*");
    snprintf(out->transport, sizeof out->transport, "%s", transport);
    pthread_mutex_lock(&m->lock);
    for (ferry_peer_stats_t *p = m->peers; p; p = p->next) {
        pthread_mutex_lock(&p->lock);
        if (strcmp(p->m.transport, transport) == 0) add_into(out, &p->m);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&m->lock);
}

/* ------------------------------------------------------------ Prometheus */

struct text {
    char *buf;
    size_t cap, len;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = t->len < t->cap ? t->cap - t->len : 0;
    int n = vsnprintf(room ? t->buf + t->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) t->len += (size_t)n;
}

static void render_peer(struct text *t, const ferry_peer_metrics_t *m)
{
    const char *ops[2] = {"read", "write"};
    for (int op = 0; op < 2; op++) {
        put(t, "ferry_requests_total{peer=\"%s\",transport=\"%s\",op=\"%s\"} %llu\n", m->peer, m->transport, ops[op],
            (unsigned long long)m->requests[op]);
        put(t, "ferry_bytes_total{peer=\"%s\",transport=\"%s\",op=\"%s\"} %llu\n", m->peer, m->transport, ops[op],
            (unsigned long long)m->bytes[op]);
    }
    put(t, "ferry_request_failures_total{peer=\"%s\",transport=\"%s\"} %llu\n", m->peer, m->transport,
        (unsigned long long)m->failures);
    put(t, "ferry_retries_total{peer=\"%s\",transport=\"%s\"} %llu\n", m->peer, m->transport,
        (unsigned long long)m->retries);
    for (size_t i = 0; i < m->nerrors; i++)
        put(t, "ferry_errors_total{peer=\"%s\",transport=\"%s\",code=\"%s\"} %llu\n", m->peer, m->transport,
            ferry_error_name(m->error_codes[i]), (unsigned long long)m->error_counts[i]);
    uint64_t cum = 0;
    for (int b = 0; b < FERRY_LATENCY_BUCKETS; b++) {
        cum += m->latency[b];
        if (ferry_latency_bounds_us[b] == UINT64_MAX)
            put(t, "ferry_request_latency_seconds_bucket{peer=\"%s\",transport=\"%s\",le=\"+Inf\"} %llu\n", m->peer,
                m->transport, (unsigned long long)cum);
        else
            put(t, "ferry_request_latency_seconds_bucket{peer=\"%s\",transport=\"%s\",le=\"%g\"} %llu\n", m->peer,
                m->transport, (double)ferry_latency_bounds_us[b] / 1e6, (unsigned long long)cum);
    }
    put(t, "ferry_request_latency_seconds_sum{peer=\"%s\",transport=\"%s\"} %.6f\n", m->peer, m->transport,
        (double)m->latency_sum_us / 1e6);
    put(t, "ferry_request_latency_seconds_count{peer=\"%s\",transport=\"%s\"} %llu\n", m->peer, m->transport,
        (unsigned long long)cum);
}

/* The engine-wide counters of ferry_engine_stats(), one metric each. */
static void render_engine_stats(struct text *t, ferry_counters_t *stats)
{
    ferry_stats_t st;
    ferry_stats_read(stats, &st);
    const struct {
        const char *name, *help;
        uint64_t v;
    } rows[] = {
#define FERRY_X_ROW(f, help) {"ferry_engine_" #f "_total", help, st.f},
        FERRY_STATS_FIELDS(FERRY_X_ROW)
#undef FERRY_X_ROW
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        put(t, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", rows[i].name, rows[i].help, rows[i].name, rows[i].name,
            (unsigned long long)rows[i].v);
    put(t, "# HELP ferry_engine_failures_by_code_total Failures by error code.\n"
           "# TYPE ferry_engine_failures_by_code_total counter\n");
    for (size_t i = 0; i < st.ncodes; i++)
        if (st.codes[i].failures)
            put(t, "ferry_engine_failures_by_code_total{code=\"%s\"} %llu\n", ferry_error_name(st.codes[i].code),
                (unsigned long long)st.codes[i].failures);
}

long ferry_metrics_render(const ferry_metrics_source_t *src, char *buf, size_t cap)
{
    ferry_metrics_t *m = src->metrics;
    struct text t = {buf, cap, 0};
    put(&t, "# HELP ferry_requests_total Requests finished, by peer, transport and opcode.\n"
            "# TYPE ferry_requests_total counter\n"
            "# HELP ferry_bytes_total Bytes confirmed, by peer, transport and opcode.\n"
            "# TYPE ferry_bytes_total counter\n"
            "# HELP ferry_request_failures_total Requests that ended with an error.\n"
            "# TYPE ferry_request_failures_total counter\n"
            "# HELP ferry_retries_total Automatic retries of transient failures.\n"
            "# TYPE ferry_retries_total counter\n"
            "# HELP ferry_errors_total Request failures by error code.\n"
            "# TYPE ferry_errors_total counter\n"
            "# HELP ferry_request_latency_seconds Request latency, submit to completion.\n"
            "# TYPE ferry_request_latency_seconds histogram\n");
    pthread_mutex_lock(&m->lock);
    for (ferry_peer_stats_t *p = m->peers; p; p = p->next) {
        pthread_mutex_lock(&p->lock);
        ferry_peer_metrics_t snap = p->m;
        pthread_mutex_unlock(&p->lock);
        render_peer(&t, &snap);
    }
    pthread_mutex_unlock(&m->lock);
    render_engine_stats(&t, src->stats);
    put(&t, "# HELP ferry_registered_regions Memory regions registered with this engine.\n"
            "# TYPE ferry_registered_regions gauge\nferry_registered_regions %zu\n",
        src->regions);
    put(&t, "# HELP ferry_engine_info This engine's name and epoch.\n# TYPE ferry_engine_info gauge\n"
            "ferry_engine_info{name=\"%s\",epoch=\"%016llx\",version=\"%s\"} 1\n",
        src->name, (unsigned long long)src->epoch, FERRY_VERSION_STRING);
    return (long)t.len;
}
