/* SPDX-License-Identifier: Apache-2.0 */
/* The backend table, connection strings, the p2p backend and the lease
 * keeper (publisher). */
#include "meta.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#ifdef FERRY_HAVE_CURL_URL
#include <curl/curl.h>
#endif

#include "util/fail.h"
#include "util/log.h"

#define DEFAULT_TIMEOUT_MS 3000

/* ------------------------------------------------------------------ p2p */

/* Nothing is stored: peers handshake directly at host:port, so lookup never
 * finds anything and the engine falls back to the handshake. */
static int p2p_open(const char *addr, int timeout_ms, void **state)
{
    (void)addr;
    (void)timeout_ms;
    *state = NULL;
    return 0;
}

static int p2p_publish(void *state, const char *key, const char *value, int ttl_s)
{
    (void)state, (void)key, (void)value, (void)ttl_s;
    return 0;
}

static int p2p_keepalive(void *state)
{
    (void)state;
    return 0;
}

static int p2p_lookup(void *state, const char *key, char **value)
{
    (void)state;
    *value = NULL;
    return ferry_fail(FERRY_ERR_NOT_FOUND,
                      "p2p metadata stores nothing: lookup of '%s' (handshake directly)", key);
}

static int p2p_remove(void *state, const char *key)
{
    (void)state, (void)key;
    return 0;
}

static void p2p_close(void *state) { (void)state; }

const ferry_meta_ops_t ferry_meta_p2p_ops = {
    .scheme = "p2p",
    .open = p2p_open,
    .publish = p2p_publish,
    .keepalive = p2p_keepalive,
    .lookup = p2p_lookup,
    .remove = p2p_remove,
    .close = p2p_close,
};

/* ---------------------------------------------------------------- table */

static const ferry_meta_ops_t *const backends[] = {
    &ferry_meta_p2p_ops,
#ifdef FERRY_HAVE_ETCD
    &ferry_meta_etcd_ops,
#endif
#ifdef FERRY_HAVE_REDIS
    &ferry_meta_redis_ops,
#endif
#ifdef FERRY_HAVE_HTTP_META
    &ferry_meta_http_ops,
#endif
};

/* Every scheme Ferry knows, built in or not: tells "not built" (the build
 * lacks it) from "unknown" (a typo in the string). */
static const char *const known_schemes[] = {"p2p", "etcd", "redis", "http"};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const ferry_meta_ops_t *find_backend(const char *scheme)
{
    for (size_t i = 0; i < COUNT(backends); i++)
        if (strcmp(backends[i]->scheme, scheme) == 0) return backends[i];
    return NULL;
}

static int known_scheme(const char *scheme)
{
    for (size_t i = 0; i < COUNT(known_schemes); i++)
        if (strcmp(known_schemes[i], scheme) == 0) return 1;
    return 0;
}

#ifndef FERRY_HAVE_ETCD
int ferry_etcd_range_answer(const char *body, char **value)
{
    (void)body;
    *value = NULL;
    return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "etcd answer: the etcd backend is not built into this library");
}
#endif

int ferry_meta_backend_built(const char *scheme)
{
    return scheme && find_backend(scheme) != NULL;
}

/* -------------------------------------------------------------- parsing */

#define CONN_FORMS "expected p2p, etcd://host:port, redis://host:port or http://host:port/path"

/* Mooncake's HTTP metadata server serves /metadata; "http://h:p" means it. */
#define HTTP_DEFAULT_PATH "/metadata"

static int is_p2p(const char *conn)
{
    /* "P2PHANDSHAKE" is Mooncake's spelling of the same thing. */
    return !conn || !*conn || strcasecmp(conn, "p2p") == 0 ||
           strcasecmp(conn, "P2PHANDSHAKE") == 0;
}

/* Checks "host:port" (host may be "[v6]"); 0 or INVALID_ARGUMENT. */
static int check_addr(const char *conn, const char *addr)
{
    const char *colon;
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close == addr + 1 || close[1] != ':')
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                              "metadata '%s': bad bracketed host in '%s' (%s)", conn, addr,
                              CONN_FORMS);
        colon = close + 1;
    } else {
        colon = strchr(addr, ':');
        if (!colon || colon == addr || strchr(colon + 1, ':'))
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                              "metadata '%s': address '%s' is not host:port (%s)", conn, addr,
                              CONN_FORMS);
    }
    for (const char *c = addr; *c; c++)
        if (isspace((unsigned char)*c) || *c == '/' || *c == '@')
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                              "metadata '%s': unexpected '%c' in address '%s' (%s)", conn, *c,
                              addr, CONN_FORMS);
    const char *port = colon + 1;
    long v = 0;
    int digits = 0;
    for (const char *c = port; *c; c++, digits++) {
        if (!isdigit((unsigned char)*c) || digits >= 5)
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': bad port '%s'", conn,
                              port);
        v = v * 10 + (*c - '0');
    }
    if (digits == 0 || v < 1 || v > 65535)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "metadata '%s': port '%s' is not in 1..65535", conn, port);
    return 0;
}

/* A URL path: '/' then printable characters that need no escaping in a
 * request line; no query or fragment (the backend adds "?key="). */
static int check_path(const char *conn, const char *path)
{
    for (const char *c = path; *c; c++) {
        unsigned char u = (unsigned char)*c;
        if (u <= 0x20 || u >= 0x7f || *c == '?' || *c == '#' || *c == '@')
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                              "metadata '%s': unexpected '%c' in path '%s' (%s)", conn,
                              isprint(u) ? *c : '?', path, CONN_FORMS);
    }
    return 0;
}

#ifdef FERRY_HAVE_CURL_URL
/* A part of u (curl_free'd by the caller), NULL when absent. */
static char *url_part(CURLU *u, CURLUPart what)
{
    char *v = NULL;
    return curl_url_get(u, what, &v, 0) == CURLUE_OK ? v : NULL;
}

/* The split of "http://<a>" by libcurl's URL parser (host, port and path,
 * IPv6 literals checked, the port read whole); Ferry's checks then name
 * what it refuses as ever: no user, query or fragment, a port in 1..65535,
 * a path of plain characters. */
static int split_http_url(const char *conn, const char *a, char *host, size_t host_len, char *path, size_t path_len)
{
    for (const char *c = a; *c; c++) /* curl would refuse these without naming them */
        if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f)
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': unexpected '%c' in '%s' (%s)", conn,
                              isprint((unsigned char)*c) ? *c : '?', a, CONN_FORMS);
    char url[700];
    if ((size_t)snprintf(url, sizeof url, "http://%s", a) >= sizeof url)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': address too long", conn);
    CURLU *u = curl_url();
    if (!u) return ferry_fail(FERRY_ERR_MEMORY, "metadata '%s': URL parser", conn);
    CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, 0);
    char *user = NULL, *query = NULL, *fragment = NULL, *h = NULL, *port = NULL, *p = NULL;
    int rc = 0;
    if (uc != CURLUE_OK) {
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': %s (%s)", conn,
                        uc == CURLUE_BAD_PORT_NUMBER ? "bad port" : curl_url_strerror(uc), CONN_FORMS);
    } else if ((user = url_part(u, CURLUPART_USER)) || (query = url_part(u, CURLUPART_QUERY)) ||
               (fragment = url_part(u, CURLUPART_FRAGMENT))) {
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': unexpected '%c' in '%s' (%s)", conn,
                        user ? '@' : query ? '?' : '#', a, CONN_FORMS);
    } else if (!(h = url_part(u, CURLUPART_HOST)) || !(port = url_part(u, CURLUPART_PORT))) {
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': address '%s' is not host:port (%s)", conn, a,
                        CONN_FORMS);
    } else if (!(p = url_part(u, CURLUPART_PATH))) {
        rc = ferry_fail(FERRY_ERR_MEMORY, "metadata '%s': URL path", conn);
    } else if ((size_t)snprintf(host, host_len, "%s:%s", h, port) >= host_len ||
               (size_t)snprintf(path, path_len, "%s", strcmp(p, "/") ? p : HTTP_DEFAULT_PATH) >= path_len) {
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': address too long", conn);
    }
    curl_free(user);
    curl_free(query);
    curl_free(fragment);
    curl_free(h);
    curl_free(port);
    curl_free(p);
    curl_url_cleanup(u);
    return rc;
}
#endif

/* "host:port/path" (path optional: HTTP_DEFAULT_PATH) into addr as
 * "host:port/path", checked. */
static int parse_http(const char *conn, const char *a, char *addr, size_t addr_len)
{
#ifdef FERRY_HAVE_CURL_URL
    char host[300], path[400];
    if (*a == '/') /* curl would take "http:///metadata" for the host "metadata" */
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': no host:port after 'http://'", conn);
    int rc = split_http_url(conn, a, host, sizeof host, path, sizeof path);
    if (!rc) rc = check_addr(conn, host);
    if (!rc) rc = check_path(conn, path);
    if (!rc && strlen(host) + strlen(path) >= addr_len)
        rc = ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': address too long", conn);
    if (!rc) snprintf(addr, addr_len, "%s%s", host, path);
    return rc;
#else /* without libcurl: the same split by hand */
    const char *slash = strchr(a, '/');
    size_t hlen = slash ? (size_t)(slash - a) : strlen(a);
    const char *path = slash && slash[1] ? slash : HTTP_DEFAULT_PATH;
    char host[300];
    if (hlen == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': no host:port after 'http://'",
                          conn);
    if (hlen >= sizeof host || hlen + strlen(path) >= addr_len)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': address too long", conn);
    memcpy(host, a, hlen);
    host[hlen] = '\0';
    int rc = check_addr(conn, host);
    if (!rc) rc = check_path(conn, path);
    if (rc) return rc;
    snprintf(addr, addr_len, "%s%s", host, path);
    return 0;
#endif
}

int ferry_meta_parse(const char *conn, char *scheme, size_t scheme_len, char *addr,
                     size_t addr_len)
{
    if (!scheme || !addr || scheme_len == 0 || addr_len == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "ferry_meta_parse: NULL or empty buffer");
    if (is_p2p(conn)) {
        snprintf(scheme, scheme_len, "p2p");
        addr[0] = '\0';
        return 0;
    }
    const char *sep = strstr(conn, "://");
    if (!sep)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': no scheme (%s)", conn,
                          CONN_FORMS);
    size_t slen = (size_t)(sep - conn);
    if (slen == 0 || slen >= scheme_len)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': bad scheme (%s)", conn,
                          CONN_FORMS);
    for (size_t i = 0; i < slen; i++) scheme[i] = (char)tolower((unsigned char)conn[i]);
    scheme[slen] = '\0';
    if (!known_scheme(scheme) || strcmp(scheme, "p2p") == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': unknown scheme '%s' (%s)",
                          conn, scheme, CONN_FORMS);
    const char *a = sep + 3;
    if (!*a)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': no host:port after '%s://'",
                          conn, scheme);
    if (strcmp(scheme, "http") == 0) return parse_http(conn, a, addr, addr_len);
    if (strlen(a) >= addr_len)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "metadata '%s': address too long", conn);
    int rc = check_addr(conn, a);
    if (rc) return rc;
    snprintf(addr, addr_len, "%s", a);
    return 0;
}

/* ------------------------------------------------------------ open/close */

int ferry_meta_open(const char *conn, int timeout_ms, ferry_meta_t *out)
{
    if (!out) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "ferry_meta_open: out is NULL");
    out->ops = NULL;
    out->state = NULL;
    char scheme[16], addr[512];
    int rc = ferry_meta_parse(conn, scheme, sizeof scheme, addr, sizeof addr);
    if (rc) return rc;
    const ferry_meta_ops_t *ops = find_backend(scheme);
    if (!ops)
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED,
                          "metadata '%s': the %s backend is not built into this library "
                          "(rebuild with FERRY_WITH_%s=ON and its libraries installed)",
                          conn, scheme,
                          strcmp(scheme, "etcd") == 0    ? "ETCD"
                          : strcmp(scheme, "redis") == 0 ? "REDIS"
                                                         : "HTTP_META");
    if (timeout_ms <= 0) timeout_ms = DEFAULT_TIMEOUT_MS;
    void *state = NULL;
    rc = ops->open(addr[0] ? addr : NULL, timeout_ms, &state);
    if (rc) return rc;
    out->ops = ops;
    out->state = state;
    return 0;
}

void ferry_meta_close(ferry_meta_t *m)
{
    if (!m || !m->ops) return;
    m->ops->close(m->state);
    m->ops = NULL;
    m->state = NULL;
}

/* ------------------------------------------------------------ publisher */

struct ferry_meta_publisher {
    ferry_meta_t *meta;
    char *key;
    char *value;
    int ttl_s;
    int interval_ms;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled by stop; waited on with a deadline */
    int stopping;      /* under mu */
    int failures;      /* refreshes failed in a row; thread only */
    _Atomic uint64_t *refreshed, *republished; /* counters, or NULL */
};

static void count(_Atomic uint64_t *counter)
{
    if (counter) atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
}

/* Warn on the first failure of an outage and every this many after, so a
 * long outage neither goes unnoticed nor floods the log. */
#define WARN_EVERY 30

static void note_failure(struct ferry_meta_publisher *p, const char *step)
{
    p->failures++;
    int level = (p->failures == 1 || p->failures % WARN_EVERY == 0) ? FERRY_LOG_WARN
                                                                     : FERRY_LOG_DEBUG;
    FERRY_LOG(level, "meta", "publisher of '%s': %s failed (%d in a row, retrying every %d ms): %s",
              p->key, step, p->failures, p->interval_ms, ferry_last_error_detail());
}

static void note_success(struct ferry_meta_publisher *p, const char *what)
{
    if (p->failures)
        FERRY_LOG(FERRY_LOG_INFO, "meta", "publisher of '%s': %s after %d failed refreshes",
                  p->key, what, p->failures);
    p->failures = 0;
}

/* One refresh: extend the lease; if that fails for any reason (entry gone,
 * server restarted, connection lost), publish the entry again. */
static void refresh(struct ferry_meta_publisher *p)
{
    const ferry_meta_ops_t *ops = p->meta->ops;
    int rc = ops->keepalive(p->meta->state);
    if (rc == 0) {
        count(p->refreshed);
        note_success(p, "lease refreshed");
        return;
    }
    if (rc == FERRY_ERR_NOT_FOUND)
        FERRY_LOG(FERRY_LOG_INFO, "meta", "publisher of '%s': entry vanished, re-publishing",
                  p->key);
    rc = ops->publish(p->meta->state, p->key, p->value, p->ttl_s);
    if (rc == 0) {
        count(p->republished);
        note_success(p, "re-published");
    }
    else
        note_failure(p, "refresh");
}

static struct timespec deadline_after_ms(int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static void *publisher_main(void *arg)
{
    struct ferry_meta_publisher *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        struct timespec deadline = deadline_after_ms(p->interval_ms);
        int rc = 0;
        while (!p->stopping && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&p->cv, &p->mu, &deadline);
        if (p->stopping) break;
        /* The backend call is made unlocked so that stop can signal at once;
         * it is bounded by the backend's timeout. */
        pthread_mutex_unlock(&p->mu);
        refresh(p);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void publisher_free(struct ferry_meta_publisher *p)
{
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->key);
    free(p->value);
    free(p);
}

static int publisher_init_sync(struct ferry_meta_publisher *p)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr)) return -1;
    /* Monotonic: a wall-clock jump must not stall or rush the refreshes. */
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (!rc) rc = pthread_cond_init(&p->cv, &attr);
    pthread_condattr_destroy(&attr);
    if (rc) return -1;
    if (pthread_mutex_init(&p->mu, NULL)) {
        pthread_cond_destroy(&p->cv);
        return -1;
    }
    return 0;
}

static struct ferry_meta_publisher *publisher_new(ferry_meta_t *m, const char *key,
                                                   const char *value, int ttl_s)
{
    struct ferry_meta_publisher *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->key = strdup(key);
    p->value = strdup(value);
    if (!p->key || !p->value || publisher_init_sync(p)) {
        free(p->key);
        free(p->value);
        free(p);
        return NULL;
    }
    p->meta = m;
    p->ttl_s = ttl_s;
    /* A third of the TTL leaves two more tries before the entry expires. */
    p->interval_ms = ttl_s * 1000 / 3;
    return p;
}

int ferry_meta_publisher_start(ferry_meta_t *m, const char *key, const char *value, int ttl_s,
                               struct ferry_meta_publisher **out)
{
    return ferry_meta_publisher_start_counted(m, key, value, ttl_s, NULL, NULL, out);
}

int ferry_meta_publisher_start_counted(ferry_meta_t *m, const char *key, const char *value, int ttl_s,
                                       _Atomic uint64_t *refreshed, _Atomic uint64_t *republished,
                                       struct ferry_meta_publisher **out)
{
    if (out) *out = NULL;
    if (!m || !m->ops || !key || !*key || !value || !out)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "ferry_meta_publisher_start: NULL or empty argument");
    if (ttl_s < 1 || ttl_s > 24 * 3600)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "ferry_meta_publisher_start of '%s': ttl %d s not in 1..86400", key,
                          ttl_s);
    int rc = m->ops->publish(m->state, key, value, ttl_s);
    if (rc) return rc;
    struct ferry_meta_publisher *p = publisher_new(m, key, value, ttl_s);
    if (!p) {
        m->ops->remove(m->state, key);
        return ferry_fail(FERRY_ERR_MEMORY, "publisher of '%s': allocation failed", key);
    }
    p->refreshed = refreshed;
    p->republished = republished;
    rc = pthread_create(&p->thread, NULL, publisher_main, p);
    if (rc) {
        m->ops->remove(m->state, key);
        publisher_free(p);
        return ferry_fail(FERRY_ERR_MEMORY, "publisher of '%s': pthread_create: %s", key,
                          strerror(rc));
    }
    *out = p;
    return 0;
}

int ferry_meta_publisher_stop(struct ferry_meta_publisher *p)
{
    if (!p) return 0;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    /* Removed after the join, so a late refresh cannot re-create it. */
    int rc = p->meta->ops->remove(p->meta->state, p->key);
    if (rc)
        FERRY_LOG(FERRY_LOG_WARN, "meta", "publisher of '%s': remove on stop failed: %s", p->key,
                  ferry_last_error_detail());
    publisher_free(p);
    return rc;
}
