/* The decode side: reading notices off the engine's queue and tracking one
 * request until every prefill source delivered. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ferry/ferry.h>

#include "core/fail.h"
#include "kv/kv_internal.h"

long ferry_kv_poll(ferry_engine_t *e, ferry_kv_event_t *out, size_t max)
{
    if (!e || (max && !out))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv poll: NULL engine or output");
    if (max == 0) return 0;
    ferry_notification_t *raw = ferry_malloc_array(max, sizeof *raw); /* NULL when max * size wraps */
    if (!raw) return ferry_fail(FERRY_ERR_MEMORY, "kv poll: %zu notifications", max);
    long n = ferry_get_notifications(e, raw, max);
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

static int offer_locked(ferry_kv_recv_t *r, const ferry_kv_notice_t *n);

int ferry_kv_recv_offer(ferry_kv_recv_t *r, const ferry_kv_notice_t *n)
{
    if (!r || !n) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv recv: NULL tracker or notice");
    pthread_mutex_lock(&r->lock);
    int rc = offer_locked(r, n);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

static int offer_locked(ferry_kv_recv_t *r, const ferry_kv_notice_t *n)
{
    if (n->request_id != r->request_id || r->outcome != 0) return current_outcome(r);
    size_t i = 0;
    while (i < r->n && r->plans[i]->src.tp_rank != n->prefill_rank) i++;
    if (i == r->n)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv recv %llu: notice from prefill rank %u, which this request does not expect",
                          (unsigned long long)r->request_id, n->prefill_rank);
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
