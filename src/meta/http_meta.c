/* SPDX-License-Identifier: Apache-2.0 */
/* The http backend: Mooncake's HTTP metadata server (mooncake-wheel's
 * mooncake_http_metadata_server, a plain key-value store), through libcurl.
 * The protocol, as Mooncake's own HttpMetadataPlugin speaks it:
 *
 *   publish   PUT    <url>?key=<escaped key>   body: the value
 *   lookup    GET    <url>?key=<escaped key>   200 value, 404 no such key
 *   remove    DELETE <url>?key=<escaped key>   200 deleted, 404 no such key
 *
 * <url> is the whole connection string, "http://host:port/metadata".
 *
 * Plain HTTP has no lease: an entry stays until it is deleted. keepalive
 * therefore PUTs again everything this state published, so that a server
 * restarted empty is filled again within one refresh. A killed engine's
 * entry outlives it: a peer that looks it up reaches a closed port (connect
 * fails) or a new process on that port (the epoch in the handshake differs:
 * PEER_RESTARTED). Every request is bounded by CURLOPT_TIMEOUT_MS. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"
#include "curl_client.h"
#include "meta.h"


/* What this state published with a lease, to PUT again on keepalive. */
struct published {
    char *key;
    char *value;
};

struct http_meta {
    char url[600];      /* http://host:port/path, for requests and details */
    CURL *curl;         /* reused: keeps the connection open */
    char curl_err[CURL_ERROR_SIZE];
    pthread_mutex_t mu; /* a curl handle is not for two threads at once */
    struct published *v;
    int n, cap;
};

/* ------------------------------------------------------- published list */

static struct published *find_published(struct http_meta *h, const char *key)
{
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->v[i].key, key) == 0) return &h->v[i];
    return NULL;
}

static int remember(struct http_meta *h, const char *key, const char *value)
{
    char *v = strdup(value);
    if (!v) return ferry_fail(FERRY_ERR_MEMORY, "http metadata at %s: publish '%s'", h->url, key);
    struct published *p = find_published(h, key);
    if (p) {
        free(p->value);
        p->value = v;
        return 0;
    }
    if (h->n == h->cap) {
        int cap = h->cap ? h->cap * 2 : 4;
        struct published *nv = realloc(h->v, (size_t)cap * sizeof *nv);
        if (!nv) {
            free(v);
            return ferry_fail(FERRY_ERR_MEMORY, "http metadata at %s: publish '%s'", h->url, key);
        }
        h->v = nv;
        h->cap = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return ferry_fail(FERRY_ERR_MEMORY, "http metadata at %s: publish '%s'", h->url, key);
    }
    h->v[h->n++] = (struct published){k, v};
    return 0;
}

static void forget(struct http_meta *h, const char *key)
{
    struct published *p = find_published(h, key);
    if (!p) return;
    free(p->key);
    free(p->value);
    *p = h->v[--h->n];
}

/* ------------------------------------------------------------------ HTTP */

/* A short, printable excerpt of an answer for a detail string. */
static const char *excerpt(const char *body, char *buf, size_t len)
{
    snprintf(buf, len, "%s", body ? body : "");
    for (char *c = buf; *c; c++)
        if ((unsigned char)*c < 0x20) *c = ' ';
    return buf;
}

/* One request: method on url?key=<escaped key>, with body for PUT (else
 * NULL). *code is the HTTP status, *out the answer (malloc'd, may be NULL).
 * Only a failure to get an answer at all is an error here. Called locked. */
static int request(struct http_meta *h, const char *method, const char *key, const char *body,
                   long *code, char **out)
{
    *code = 0;
    *out = NULL;
    char *escaped = curl_easy_escape(h->curl, key, 0);
    size_t len = strlen(h->url) + (escaped ? strlen(escaped) : 0) + 8;
    char *url = escaped ? malloc(len) : NULL;
    if (!url) {
        curl_free(escaped);
        return ferry_fail(FERRY_ERR_MEMORY, "http metadata at %s: %s '%s': URL", h->url, method, key);
    }
    snprintf(url, len, "%s?key=%s", h->url, escaped);
    curl_free(escaped);
    CURL *c = h->curl;
    h->curl_err[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, url);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    } else {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L); /* undoes an earlier PUT's body */
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, strcmp(method, "GET") ? method : NULL);
    }
    bool too_big;
    CURLcode res = ferry_curl_perform(c, out, &too_big);
    free(url);
    if (res != CURLE_OK) {
        free(*out);
        *out = NULL;
        if (too_big)
            return ferry_fail(FERRY_ERR_METADATA, "http metadata at %s: %s '%s': answer over %u bytes",
                              h->url, method, key, FERRY_CURL_MAX_BODY);
        return ferry_fail(FERRY_ERR_METADATA, "http metadata at %s: %s '%s' failed: %s", h->url,
                          method, key, h->curl_err[0] ? h->curl_err : curl_easy_strerror(res));
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, code);
    return 0;
}

/* A status the operation does not expect: METADATA naming URL, key and status. */
static int bad_status(struct http_meta *h, const char *method, const char *key, long code,
                      const char *answer)
{
    char ex[160];
    return ferry_fail(FERRY_ERR_METADATA, "http metadata at %s: %s '%s' answered HTTP %ld: %s",
                      h->url, method, key, code, excerpt(answer, ex, sizeof ex));
}

static int put_locked(struct http_meta *h, const char *key, const char *value)
{
    long code;
    char *answer;
    int rc = request(h, "PUT", key, value, &code, &answer);
    if (!rc && code != 200) rc = bad_status(h, "PUT", key, code, answer);
    free(answer);
    return rc;
}

/* -------------------------------------------------------------- backend */

static void http_free(struct http_meta *h)
{
    if (h->curl) curl_easy_cleanup(h->curl);
    while (h->n) forget(h, h->v[0].key);
    free(h->v);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* Mooncake's client sends JSON, with no "Expect: 100-continue" round trip. */
static int setup_curl(struct http_meta *h, int timeout_ms)
{
    h->curl = ferry_curl_handle(timeout_ms, true, h->curl_err);
    return h->curl ? 0
                   : ferry_fail(FERRY_ERR_MEMORY, "http metadata at %s: open: curl_easy_init failed", h->url);
}

/* A GET of a key no engine has: the server is there when it answers 200
 * or 404 (Mooncake's "metadata not found"). */
static int probe(struct http_meta *h)
{
    long code;
    char *answer;
    const char *key = FERRY_META_KEY_PREFIX;
    int rc = request(h, "GET", key, NULL, &code, &answer);
    if (!rc && code != 200 && code != 404) rc = bad_status(h, "GET", key, code, answer);
    free(answer);
    return rc;
}

/* addr: "host:port/path", as ferry_meta_parse leaves it. */
static int http_open(const char *addr, int timeout_ms, void **state)
{
    if (!addr || !strchr(addr, '/'))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "http metadata: open without host:port/path");
    CURLcode init = ferry_curl_global_init();
    if (init != CURLE_OK)
        return ferry_fail(FERRY_ERR_METADATA, "http metadata at http://%s: open: curl_global_init: %s",
                          addr, curl_easy_strerror(init));
    struct http_meta *h = calloc(1, sizeof *h);
    if (!h) return ferry_fail(FERRY_ERR_MEMORY, "http metadata at http://%s: open", addr);
    pthread_mutex_init(&h->mu, NULL);
    snprintf(h->url, sizeof h->url, "http://%s", addr);
    int rc = setup_curl(h, timeout_ms);
    if (!rc) rc = probe(h);
    if (rc) {
        http_free(h);
        return rc;
    }
    *state = h;
    return 0;
}

static int http_publish(void *state, const char *key, const char *value, int ttl_s)
{
    struct http_meta *h = state;
    pthread_mutex_lock(&h->mu);
    int rc = put_locked(h, key, value);
    if (!rc && ttl_s > 0) rc = remember(h, key, value);
    else if (!rc) forget(h, key);
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* No lease to extend: PUT every entry again (a server restarted empty gets
 * them back). The first failure ends the round and is returned. */
static int http_keepalive(void *state)
{
    struct http_meta *h = state;
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    for (int i = 0; i < h->n && !rc; i++) rc = put_locked(h, h->v[i].key, h->v[i].value);
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static int http_lookup(void *state, const char *key, char **value)
{
    struct http_meta *h = state;
    *value = NULL;
    long code;
    char *answer;
    pthread_mutex_lock(&h->mu);
    int rc = request(h, "GET", key, NULL, &code, &answer);
    pthread_mutex_unlock(&h->mu);
    if (rc) return rc;
    if (code == 404) {
        free(answer);
        return ferry_fail(FERRY_ERR_NOT_FOUND, "http metadata at %s: GET '%s': no such key (HTTP 404)",
                          h->url, key);
    }
    if (code != 200) {
        rc = bad_status(h, "GET", key, code, answer);
        free(answer);
        return rc;
    }
    *value = answer ? answer : strdup("");
    return *value ? 0 : ferry_fail(FERRY_ERR_MEMORY, "http metadata at %s: GET '%s'", h->url, key);
}

/* A missing key is not an error: Mooncake's server answers it with 404. */
static int http_remove(void *state, const char *key)
{
    struct http_meta *h = state;
    long code;
    char *answer;
    pthread_mutex_lock(&h->mu);
    forget(h, key);
    int rc = request(h, "DELETE", key, NULL, &code, &answer);
    pthread_mutex_unlock(&h->mu);
    if (!rc && code != 200 && code != 404) rc = bad_status(h, "DELETE", key, code, answer);
    free(answer);
    return rc;
}

static void http_close(void *state)
{
    if (state) http_free(state);
}

const ferry_meta_ops_t ferry_meta_http_ops = {
    .scheme = "http",
    .open = http_open,
    .publish = http_publish,
    .keepalive = http_keepalive,
    .lookup = http_lookup,
    .remove = http_remove,
    .close = http_close,
};
