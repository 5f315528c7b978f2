/* SPDX-License-Identifier: Apache-2.0 */
/* The etcd backend: etcd v3 through its HTTP/JSON gateway (libcurl +
 * jansson). Keys and values travel base64-encoded in that API; int64s
 * (lease ids, TTLs) come back as JSON strings.
 *
 *   publish   POST /v3/lease/grant {TTL}, then /v3/kv/put {key, value, lease}
 *   keepalive POST /v3/lease/keepalive {ID} per published lease
 *   lookup    POST /v3/kv/range {key}
 *   remove    POST /v3/kv/deleterange {key}
 *
 * etcd 3.4 serves the gateway at /v3 (and the older /v3beta); open probes
 * /v3 and falls back to /v3beta for older servers. Every request is bounded
 * by CURLOPT_TIMEOUT_MS. */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"
#include "curl_client.h"
#include "entries.h"
#include "meta.h"


struct etcd {
    char addr[256];    /* host:port, for details */
    char base[300];    /* http://host:port */
    const char *api;   /* "/v3" or "/v3beta" */
    CURL *curl;        /* reused: keeps the connection open */
    char curl_err[CURL_ERROR_SIZE];
    pthread_mutex_t mu; /* a curl handle is not for two threads at once */
    struct meta_entries entries;
};

/* ---------------------------------------------------------------- base64 */

/* etcd's JSON gateway carries keys and values in standard base64 with
 * padding. OpenSSL (linked for authentication) does the coding; the checks
 * here are the ones EVP_DecodeBlock leaves out. */

/* NUL-terminated malloc'd base64 of in[0..n); NULL when out of memory or
 * too long for OpenSSL's int lengths. */
static char *b64_encode(const char *in, size_t n)
{
    if (n > (size_t)INT_MAX / 4 * 3) return NULL;
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (out) EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)in, (int)n); /* writes the NUL */
    return out;
}

/* Decodes to a NUL-terminated malloc'd string; NULL on bad input: a length
 * not a multiple of 4, a character outside the alphabet, or '=' anywhere
 * but the last two places (EVP_DecodeBlock reads an inner '=' as 'A'). Its
 * output counts the padding as zero bytes: those are cut off. */
static char *b64_decode(const char *in)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = strlen(in), body = strspn(in, alphabet);
    size_t pad = n - body;
    if (n % 4 || n > (size_t)INT_MAX || pad > 2 || strspn(in + body, "=") != pad) return NULL;
    unsigned char *out = malloc(n / 4 * 3 + 1);
    if (!out) return NULL;
    int got = EVP_DecodeBlock(out, (const unsigned char *)in, (int)n);
    if (got < 0 || (size_t)got < pad) {
        free(out);
        return NULL;
    }
    out[(size_t)got - pad] = '\0';
    return (char *)out;
}

/* ------------------------------------------------------------------ HTTP */

/* POSTs text to path; *code is the HTTP status, *out the body (malloc'd).
 * step names the operation for the detail ("put 'k'"). */
static int http_post(struct etcd *e, const char *path, const char *text, const char *step,
                     long *code, char **out)
{
    char url[400];
    snprintf(url, sizeof url, "%s%s", e->base, path);
    e->curl_err[0] = '\0';
    curl_easy_setopt(e->curl, CURLOPT_URL, url);
    curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(e->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(text));
    char *answer;
    bool too_big;
    CURLcode res = ferry_curl_perform(e->curl, &answer, &too_big);
    if (res != CURLE_OK) {
        free(answer);
        if (too_big)
            return ferry_fail(FERRY_ERR_METADATA, "etcd at %s: %s: answer over %u bytes at %s",
                              e->addr, step, FERRY_CURL_MAX_BODY, path);
        return ferry_fail(FERRY_ERR_METADATA, "etcd at %s: %s: POST %s failed: %s", e->addr, step,
                          path, e->curl_err[0] ? e->curl_err : curl_easy_strerror(res));
    }
    curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, code);
    *out = answer ? answer : strdup("");
    return *out ? 0 : ferry_fail(FERRY_ERR_MEMORY, "etcd at %s: %s: answer", e->addr, step);
}

/* A short, printable excerpt of an answer for a detail string. */
static const char *excerpt(const char *body, char *buf, size_t len)
{
    snprintf(buf, len, "%s", body);
    for (char *c = buf; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    return buf;
}

/* POSTs req (consumed) to e->api + path and parses the JSON answer into
 * *resp. Any HTTP status but 200, or an "error" member, is a failure. */
static int etcd_call(struct etcd *e, const char *path, json_t *req, const char *step,
                     json_t **resp)
{
    *resp = NULL;
    char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!text) return ferry_fail(FERRY_ERR_MEMORY, "etcd at %s: %s: request JSON", e->addr, step);
    char full[64];
    snprintf(full, sizeof full, "%s%s", e->api, path);
    long code = 0;
    char *body = NULL;
    int rc = http_post(e, full, text, step, &code, &body);
    free(text);
    if (rc) return rc;
    char ex[200];
    json_error_t jerr;
    json_t *j = json_loads(body, 0, &jerr);
    if (code != 200 || !json_is_object(j)) {
        json_t *msg = json_is_object(j) ? json_object_get(j, "error") : NULL;
        rc = ferry_fail(FERRY_ERR_METADATA, "etcd at %s: %s: POST %s answered HTTP %ld: %s",
                        e->addr, step, full, code,
                        json_is_string(msg) ? json_string_value(msg)
                                            : excerpt(body, ex, sizeof ex));
        json_decref(j);
        free(body);
        return rc;
    }
    free(body);
    json_t *err = json_object_get(j, "error");
    if (err) {
        rc = ferry_fail(FERRY_ERR_METADATA, "etcd at %s: %s: %s", e->addr, step,
                        json_is_string(err) ? json_string_value(err) : "error in answer");
        json_decref(j);
        return rc;
    }
    *resp = j;
    return 0;
}

/* An int64 member, which the gateway writes as a string ("123"). 0 when
 * absent (proto3 JSON leaves out zero values) or not a whole decimal
 * int64 (strtoll alone would take a prefix or saturate): a lease ID of 0
 * fails the grant, a TTL of 0 reads as expired. */
static long long json_int64(json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    if (json_is_integer(v)) return (long long)json_integer_value(v);
    if (!json_is_string(v)) return 0;
    const char *text = json_string_value(v);
    char *end;
    errno = 0;
    long long n = strtoll(text, &end, 10);
    return errno || end == text || *end ? 0 : n;
}

/* {"key": b64(key)} plus, when value is given, "value". */
static json_t *kv_request(const char *key, const char *value)
{
    char *k = b64_encode(key, strlen(key));
    char *v = value ? b64_encode(value, strlen(value)) : NULL;
    json_t *req = NULL;
    if (k && (v || !value)) {
        req = json_pack("{s:s}", "key", k);
        if (req && v && json_object_set_new(req, "value", json_string(v))) {
            json_decref(req);
            req = NULL;
        }
    }
    free(k);
    free(v);
    return req;
}

/* -------------------------------------------------------------- backend */

static void etcd_free(struct etcd *e)
{
    if (e->curl) curl_easy_cleanup(e->curl);
    meta_entries_free(&e->entries);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static int setup_curl(struct etcd *e, int timeout_ms)
{
    e->curl = ferry_curl_handle(timeout_ms, false, e->curl_err);
    return e->curl ? 0 : ferry_fail(FERRY_ERR_MEMORY, "etcd at %s: open: curl_easy_init failed", e->addr);
}

/* Finds the gateway prefix with a harmless range request. */
static int probe_api(struct etcd *e)
{
    static const char *const apis[] = {"/v3", "/v3beta"};
    int rc = 0;
    for (size_t i = 0; i < sizeof apis / sizeof apis[0]; i++) {
        e->api = apis[i];
        json_t *resp = NULL;
        rc = etcd_call(e, "/kv/range", kv_request(FERRY_META_KEY_PREFIX, NULL), "open", &resp);
        json_decref(resp);
        if (rc == 0) return 0;
        /* Only a missing path is worth the next prefix; a dead server is not. */
        if (!strstr(ferry_last_error_detail(), "HTTP 404")) return rc;
    }
    return rc;
}

static int etcd_open(const char *addr, int timeout_ms, void **state)
{
    if (!addr) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "etcd: open without host:port");
    CURLcode init = ferry_curl_global_init();
    if (init != CURLE_OK)
        return ferry_fail(FERRY_ERR_METADATA, "etcd at %s: open: curl_global_init: %s", addr,
                          curl_easy_strerror(init));
    struct etcd *e = calloc(1, sizeof *e);
    if (!e) return ferry_fail(FERRY_ERR_MEMORY, "etcd at %s: open", addr);
    pthread_mutex_init(&e->mu, NULL);
    snprintf(e->addr, sizeof e->addr, "%s", addr);
    snprintf(e->base, sizeof e->base, "http://%s", addr);
    int rc = setup_curl(e, timeout_ms);
    if (!rc) rc = probe_api(e);
    if (rc) {
        etcd_free(e);
        return rc;
    }
    *state = e;
    return 0;
}

static int grant_lease(struct etcd *e, const char *key, int ttl_s, long long *lease)
{
    char step[300];
    snprintf(step, sizeof step, "lease grant for '%s'", key);
    json_t *resp = NULL;
    int rc = etcd_call(e, "/lease/grant", json_pack("{s:i}", "TTL", ttl_s), step, &resp);
    if (rc) return rc;
    *lease = json_int64(resp, "ID");
    json_decref(resp);
    if (*lease == 0)
        return ferry_fail(FERRY_ERR_METADATA, "etcd at %s: %s: answer has no lease ID", e->addr,
                          step);
    return 0;
}

static int put_locked(struct etcd *e, const char *key, const char *value, int ttl_s)
{
    long long lease = 0;
    if (ttl_s > 0) {
        int rc = grant_lease(e, key, ttl_s, &lease);
        if (rc) return rc;
    }
    json_t *req = kv_request(key, value);
    if (req && lease) json_object_set_new(req, "lease", json_integer(lease));
    char step[300];
    snprintf(step, sizeof step, "put '%s'", key);
    json_t *resp = NULL;
    int rc = etcd_call(e, "/kv/put", req, step, &resp);
    json_decref(resp);
    if (rc) return rc;
    /* The lease of an overwritten entry is left to expire on its own. */
    if (ttl_s > 0) return meta_entries_set(&e->entries, key, ttl_s, lease);
    meta_entries_drop(&e->entries, key);
    return 0;
}

static int etcd_publish(void *state, const char *key, const char *value, int ttl_s)
{
    struct etcd *e = state;
    pthread_mutex_lock(&e->mu);
    int rc = put_locked(e, key, value, ttl_s);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* 1 alive, 0 expired/unknown (TTL absent or <= 0), <0 failure. */
static int keepalive_one(struct etcd *e, const struct meta_entry *en)
{
    char step[300];
    snprintf(step, sizeof step, "keepalive of lease %lld for '%s'", en->lease, en->key);
    json_t *resp = NULL;
    int rc = etcd_call(e, "/lease/keepalive", json_pack("{s:I}", "ID", (json_int_t)en->lease),
                       step, &resp);
    if (rc) return rc;
    json_t *result = json_object_get(resp, "result");
    long long ttl = json_int64(json_is_object(result) ? result : resp, "TTL");
    json_decref(resp);
    return ttl > 0;
}

static int etcd_keepalive(void *state)
{
    struct etcd *e = state;
    pthread_mutex_lock(&e->mu);
    char gone[300] = "";
    int missing = 0, rc = 0;
    for (int i = 0; i < e->entries.n && rc >= 0;) {
        rc = keepalive_one(e, &e->entries.v[i]);
        if (rc == 0) {
            /* Forgotten: its owner re-publishes, and it must not make every
             * later keepalive fail. */
            missing++;
            snprintf(gone, sizeof gone, "%s", e->entries.v[i].key);
            meta_entries_drop(&e->entries, gone);
            continue; /* the drop moved another entry into slot i */
        }
        if (rc > 0) i++;
    }
    pthread_mutex_unlock(&e->mu);
    if (rc < 0) return rc;
    if (missing)
        return ferry_fail(FERRY_ERR_NOT_FOUND,
                          "etcd at %s: keepalive: lease of '%s' expired or unknown (%d gone)",
                          e->addr, gone, missing);
    return 0;
}

/* The first value of a range answer into *value (malloc'd): 0,
 * FERRY_ERR_NOT_FOUND (no key), or FERRY_ERR_METADATA (not base64 text);
 * no detail set. The answer is whatever the server (or whoever wrote the
 * key) sent: fuzzed by tests/fuzz/fuzz_meta.c. */
static int range_value(json_t *resp, char **value)
{
    json_t *kvs = json_object_get(resp, "kvs");
    json_t *v = json_object_get(json_array_get(kvs, 0), "value");
    if (!json_is_array(kvs) || json_array_size(kvs) == 0) return FERRY_ERR_NOT_FOUND;
    /* An empty value is left out of the JSON altogether. */
    *value = v ? (json_is_string(v) ? b64_decode(json_string_value(v)) : NULL) : strdup("");
    return *value ? 0 : FERRY_ERR_METADATA;
}

static int etcd_lookup(void *state, const char *key, char **value)
{
    struct etcd *e = state;
    *value = NULL;
    char step[300];
    snprintf(step, sizeof step, "lookup '%s'", key);
    json_t *resp = NULL;
    pthread_mutex_lock(&e->mu);
    int rc = etcd_call(e, "/kv/range", kv_request(key, NULL), step, &resp);
    pthread_mutex_unlock(&e->mu);
    if (rc) return rc;
    rc = range_value(resp, value);
    json_decref(resp);
    if (rc == FERRY_ERR_NOT_FOUND) return ferry_fail(rc, "etcd at %s: %s: no such key", e->addr, step);
    if (rc) return ferry_fail(rc, "etcd at %s: %s: value is not base64 text", e->addr, step);
    return 0;
}

int ferry_etcd_range_answer(const char *body, char **value)
{
    *value = NULL;
    json_error_t jerr;
    json_t *j = json_loads(body, 0, &jerr);
    if (!json_is_object(j)) {
        json_decref(j);
        return ferry_fail(FERRY_ERR_METADATA, "etcd answer is not a JSON object");
    }
    int rc = range_value(j, value);
    json_decref(j);
    if (rc == FERRY_ERR_NOT_FOUND) return ferry_fail(rc, "etcd answer: no such key");
    if (rc) return ferry_fail(rc, "etcd answer: value is not base64 text");
    return 0;
}

static int etcd_remove(void *state, const char *key)
{
    struct etcd *e = state;
    char step[300];
    snprintf(step, sizeof step, "remove '%s'", key);
    json_t *resp = NULL;
    pthread_mutex_lock(&e->mu);
    int rc = etcd_call(e, "/kv/deleterange", kv_request(key, NULL), step, &resp);
    if (!rc) meta_entries_drop(&e->entries, key);
    pthread_mutex_unlock(&e->mu);
    json_decref(resp);
    return rc;
}

static void etcd_close(void *state)
{
    if (state) etcd_free(state);
}

const ferry_meta_ops_t ferry_meta_etcd_ops = {
    .scheme = "etcd",
    .open = etcd_open,
    .publish = etcd_publish,
    .keepalive = etcd_keepalive,
    .lookup = etcd_lookup,
    .remove = etcd_remove,
    .close = etcd_close,
};
