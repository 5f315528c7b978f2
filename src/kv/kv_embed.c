/* SPDX-License-Identifier: Apache-2.0 */
/* Per-request embedding buffers: registered once, reused by every send. */
#include <stdlib.h>

#include <ferry/ferry.h>

#include "util/fail.h"
#include "kv_internal.h"

struct ferry_kv_embed {
    ferry_engine_t *engine;
    void *data;
    size_t capacity;
};

int ferry_kv_embed_create(ferry_engine_t *e, size_t capacity, ferry_kv_embed_t **out)
{
    if (!e || !out || capacity == 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv embed: NULL engine or out, or capacity %zu", capacity);
    *out = NULL;
    ferry_kv_embed_t *b = calloc(1, sizeof *b);
    if (b) b->data = malloc(capacity);
    if (!b || !b->data) {
        if (b) free(b);
        return ferry_fail(FERRY_ERR_MEMORY, "kv embed: %zu bytes", capacity);
    }
    int rc = ferry_register(e, b->data, capacity, FERRY_MEM_LOCAL);
    if (rc != 0) {
        free(b->data);
        free(b);
        return ferry_fail_context("kv embed: registering %zu bytes", capacity);
    }
    b->engine = e;
    b->capacity = capacity;
    *out = b;
    return 0;
}

void ferry_kv_embed_destroy(ferry_kv_embed_t *b)
{
    if (!b) return;
    ferry_deregister(b->engine, b->data);
    free(b->data);
    free(b);
}

void *ferry_kv_embed_data(ferry_kv_embed_t *b)
{
    return b ? b->data : NULL;
}

size_t ferry_kv_embed_capacity(const ferry_kv_embed_t *b)
{
    return b ? b->capacity : 0;
}

int ferry_kv_embed_send(ferry_kv_embed_t *b, const char *peer, size_t len, uint64_t remote,
                        const ferry_kv_send_args_t *args)
{
    if (!b || !peer || !args)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv embed send: NULL buffer, peer or args");
    if (len == 0 || len > b->capacity)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv embed send request %llu: length %zu outside (0, %zu]",
                          (unsigned long long)args->request_id, len, b->capacity);
    if (args->aux_len > FERRY_KV_AUX_MAX || (args->aux_len && !args->aux))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv embed send request %llu: aux of %zu bytes (limit %u) must be non-NULL",
                          (unsigned long long)args->request_id, args->aux_len, FERRY_KV_AUX_MAX);
    ferry_kv_notice_t n = {.request_id = args->request_id, .bytes = len,
                           .aux_len = args->aux_len, .aux = args->aux};
    ferry_request_t req = {FERRY_OP_WRITE, b->data, remote, len};
    int rc = kv_write_requests(b->engine, peer, &req, 1, args->timeout_ms);
    if (rc != 0) return kv_report_failure(b->engine, peer, &n, "embedding transfer", rc);
    rc = kv_notify_success(b->engine, peer, &n);
    if (rc != 0)
        return ferry_fail_context("kv embed send request %llu to %s: success notice",
                                  (unsigned long long)args->request_id, peer);
    return 0;
}
