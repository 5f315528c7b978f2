/* SPDX-License-Identifier: Apache-2.0 */
/* What the libcurl-based metadata backends (etcd, http) share: the one
 * process-wide curl_global_init, a handle with their settings, and the
 * collection of an answer. Not a public header. */
#ifndef FERRY_META_CURL_CLIENT_H
#define FERRY_META_CURL_CLIENT_H

#include <curl/curl.h>
#include <stdbool.h>

#define FERRY_CURL_MAX_BODY (16u << 20) /* a larger answer is not a descriptor */

/* curl_global_init, once per process whichever backend opens first (it is
 * not safe to call from two threads at once). CURLE_OK or its failure. */
CURLcode ferry_curl_global_init(void);

/* A handle for requests with a JSON body: no signals (threads), timeout_ms
 * for the connection and for each whole request, no proxy (loopback must
 * not be caught by an http_proxy), http only, errors written to errbuf
 * (CURL_ERROR_SIZE bytes), answers collected by ferry_curl_perform.
 * no_expect: no "Expect: 100-continue" round trip before a large body.
 * NULL when out of memory. */
CURL *ferry_curl_handle(int timeout_ms, bool no_expect, char *errbuf);

/* Performs the request set up on c. *body: the answer, malloc'd and
 * NUL-terminated (NULL when empty; free it either way); *too_big when it
 * passed FERRY_CURL_MAX_BODY (the request then fails). */
CURLcode ferry_curl_perform(CURL *c, char **body, bool *too_big);

#endif
