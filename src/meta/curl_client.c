/* SPDX-License-Identifier: Apache-2.0 */
/* The libcurl client the etcd and http metadata backends share (curl_client.h). */
#include "curl_client.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CURLcode init_rc;

static void global_init(void) { init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

CURLcode ferry_curl_global_init(void)
{
    pthread_once(&init_once, global_init);
    return init_rc;
}

/* The header lists, one of each for every handle, made once, never freed. */
static struct curl_slist *json_headers(bool no_expect)
{
    static struct curl_slist *lists[2];
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    struct curl_slist **l = &lists[no_expect];
    if (!*l) {
        struct curl_slist *a = curl_slist_append(NULL, "Content-Type: application/json");
        struct curl_slist *b = a && no_expect ? curl_slist_append(a, "Expect:") : a;
        if (b) *l = b;
        else curl_slist_free_all(a);
    }
    pthread_mutex_unlock(&mu);
    return *l;
}

struct body {
    char *p;
    size_t n;
    bool too_big;
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct body *b = arg;
    size_t len = size * nmemb;
    if (b->n + len > FERRY_CURL_MAX_BODY) {
        b->too_big = true;
        return 0; /* makes curl fail the transfer */
    }
    char *p = realloc(b->p, b->n + len + 1);
    if (!p) return 0;
    memcpy(p + b->n, data, len);
    b->n += len;
    p[b->n] = '\0';
    b->p = p;
    return len;
}

CURL *ferry_curl_handle(int timeout_ms, bool no_expect, char *errbuf)
{
    struct curl_slist *headers = json_headers(no_expect);
    CURL *c = headers ? curl_easy_init() : NULL;
    if (!c) return NULL;
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* no SIGALRM timeouts: threads */
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*"); /* an http_proxy must not catch loopback */
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
#endif
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    return c;
}

CURLcode ferry_curl_perform(CURL *c, char **body, bool *too_big)
{
    struct body b = {0};
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    CURLcode res = curl_easy_perform(c);
    *body = b.p;
    *too_big = b.too_big;
    return res;
}
