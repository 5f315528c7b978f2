/* SPDX-License-Identifier: Apache-2.0 */
/* Cancel and expiry without late writes, the target's side: the cancel
 * set each served connection keeps. The initiator's fence and the interrupt
 * that wakes a blocked stream are in fence.c. The protocol is described in
 * cancel.h. */
#include "cancel.h"

#include <search.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "conn.h"
#include "link.h"
#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"

/* ------------------------------------------------------- the cancel set */

/* The tree holds ids themselves as keys (no allocation per entry but the
 * node); 0 is never a request id. */
static int compare_ids(const void *pa, const void *pb)
{
    uint64_t a = (uint64_t)(uintptr_t)pa, b = (uint64_t)(uintptr_t)pb;
    return a < b ? -1 : a > b;
}

void ferry_cancel_set_init(ferry_cancel_set_t *cs)
{
    memset(cs, 0, sizeof *cs);
    pthread_mutex_init(&cs->lock, NULL);
    atomic_store(&cs->count, 0);
}

static void free_nothing(void *p) { (void)p; }

void ferry_cancel_set_destroy(ferry_cancel_set_t *cs)
{
    tdestroy(cs->root, free_nothing);
    cs->root = NULL;
    atomic_store(&cs->count, 0);
    pthread_mutex_destroy(&cs->lock);
}

int ferry_cancel_set_add(ferry_cancel_set_t *cs, uint64_t req_id)
{
    _Static_assert(sizeof(uintptr_t) >= sizeof(uint64_t), "request ids are kept as tree keys");
    void *key = (void *)(uintptr_t)req_id;
    pthread_mutex_lock(&cs->lock);
    int rc = 0;
    if (!tfind(key, &cs->root, compare_ids)) {
        if (tsearch(key, &cs->root, compare_ids)) {
            atomic_fetch_add(&cs->count, 1);
            rc = 1;
        } else {
            rc = ferry_fail(FERRY_ERR_MEMORY, "cancel of request %llu: out of memory", (unsigned long long)req_id);
        }
    }
    pthread_mutex_unlock(&cs->lock);
    return rc;
}

bool ferry_cancel_set_has(ferry_cancel_set_t *cs, uint64_t req_id)
{
    /* The common case, nothing cancelled, costs one load per chunk. A racing
     * add is ordered by the registry barrier that follows it (cancel.h). */
    if (atomic_load(&cs->count) == 0) return false;
    pthread_mutex_lock(&cs->lock);
    bool found = tfind((void *)(uintptr_t)req_id, &cs->root, compare_ids) != NULL;
    pthread_mutex_unlock(&cs->lock);
    return found;
}

size_t ferry_cancel_set_count(ferry_cancel_set_t *cs) { return atomic_load(&cs->count); }

/* ------------------------------------------- the target's cancel sets */

/* One warning a second at most, with the count of those it stands for: a
 * peer flooding CANCELs must not flood the log too. */
static void warn_refused(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn_refused(const char *fmt, ...)
{
    static _Atomic uint64_t last_ns, suppressed;
    uint64_t now = ferry_now_ns(), last = atomic_load(&last_ns);
    if ((last && now - last < 1000000000ull) || !atomic_compare_exchange_strong(&last_ns, &last, now)) {
        atomic_fetch_add(&suppressed, 1);
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    uint64_t more = atomic_exchange(&suppressed, 0);
    FERRY_LOG(FERRY_LOG_WARN, "cancel", "%s (%llu more refused since the last warning)", msg,
              (unsigned long long)more);
}

uint64_t ferry_cancel_conn_open(ferry_conn_t *c)
{
    uint64_t key = 0;
    while (key == 0)
        if (getrandom(&key, sizeof key, 0) != sizeof key) key = ferry_now_ns() ^ ((uint64_t)(uintptr_t)c << 16);
    atomic_store(&c->cancel_peer, c->peer.engine_id);
    atomic_store(&c->cancel_key, key);
    ferry_placed_open(c);
    return key;
}

bool ferry_conn_is_cancelled(ferry_conn_t *c, uint64_t req_id)
{
    if (atomic_load_explicit(&c->fenced, memory_order_acquire)) return true;
    ferry_cancel_set_t *cs = atomic_load_explicit(&c->cancels, memory_order_acquire);
    return req_id && cs && ferry_cancel_set_has(cs, req_id);
}

void ferry_cancel_conn_close(ferry_conn_t *c)
{
    ferry_placed_close(c);
    ferry_cancel_set_t *cs = atomic_exchange(&c->cancels, NULL);
    if (!cs) return;
    atomic_fetch_sub(&c->link->cancels_held, ferry_cancel_set_count(cs));
    ferry_cancel_set_destroy(cs);
    free(cs);
}

/* With the served connections' lock held: refuses frames of req_id on data connection c. */
static int record_on(ferry_link_t *e, ferry_conn_t *c, uint64_t req_id)
{
    ferry_cancel_set_t *cs = atomic_load(&c->cancels);
    if (!cs) {
        cs = malloc(sizeof *cs);
        if (!cs) return ferry_fail(FERRY_ERR_MEMORY, "cancel of request %llu: out of memory", (unsigned long long)req_id);
        ferry_cancel_set_init(cs);
        atomic_store_explicit(&c->cancels, cs, memory_order_release);
    }
    if (ferry_cancel_set_has(cs, req_id)) return 0;
    int rc = 0;
    if (ferry_cancel_set_count(cs) >= FERRY_CANCEL_CONN_MAX)
        rc = ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS,
                        "cancel of request %llu refused: the connection from %s (calling itself %s) already "
                        "refuses %u cancelled requests",
                        (unsigned long long)req_id, c->remote, c->peer.name, FERRY_CANCEL_CONN_MAX);
    else if (atomic_load(&e->cancels_held) >= FERRY_CANCEL_ENGINE_MAX)
        rc = ferry_fail(FERRY_ERR_TOO_MANY_REQUESTS,
                        "cancel of request %llu refused: this engine's connections already refuse %u cancelled "
                        "requests",
                        (unsigned long long)req_id, FERRY_CANCEL_ENGINE_MAX);
    if (rc) {
        warn_refused("%s", ferry_fail_message());
        return rc;
    }
    rc = ferry_cancel_set_add(cs, req_id);
    if (rc == 1) atomic_fetch_add(&e->cancels_held, 1);
    return rc < 0 ? rc : 0;
}

int ferry_cancel_record(ferry_conn_t *via, uint64_t req_id, uint64_t conn_key)
{
    ferry_link_t *e = via->link;
    uint64_t peer = via->peer.engine_id;
    int rc = 0;
    pthread_mutex_lock(e->conns_lock);
    for (ferry_conn_t *c = *e->conns; c && rc == 0; c = c->next) {
        /* Another engine's connection is never touched, whatever it names. */
        if (atomic_load(&c->cancel_peer) != peer || atomic_load(&c->done)) continue;
        uint64_t key = atomic_load(&c->cancel_key);
        if (key == 0 || (conn_key && key != conn_key)) continue;
        rc = record_on(e, c, req_id);
    }
    pthread_mutex_unlock(e->conns_lock);
    return rc;
}

int ferry_cancel_fence_conn(ferry_conn_t *via, uint64_t conn_key)
{
    if (conn_key == 0)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                          "CANCEL of a whole connection from %s (calling itself %s) names no connection (key 0)",
                          via->remote, via->peer.name);
    ferry_link_t *e = via->link;
    uint64_t peer = via->peer.engine_id;
    pthread_mutex_lock(e->conns_lock);
    for (ferry_conn_t *c = *e->conns; c; c = c->next) {
        /* Another engine's connection is never touched, whatever it names. */
        if (atomic_load(&c->cancel_peer) != peer || atomic_load(&c->done)) continue;
        if (atomic_load(&c->cancel_key) != conn_key) continue;
        atomic_store_explicit(&c->fenced, true, memory_order_release);
        break;
    }
    pthread_mutex_unlock(e->conns_lock);
    return 0;
}
