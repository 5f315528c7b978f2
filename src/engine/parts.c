/* SPDX-License-Identifier: Apache-2.0 */
/* Narrow views of the engine (parts.h), the public calls' entry and exit
 * (formerly calls.c), and the hooks through which tests look into it
 * (testing.h, some formerly in config.c), so that none of their users needs
 * the engine struct. */
#include "parts.h"

#include "engine.h"
#include "testing.h"
#include "util/fail.h"

ferry_registry_t *ferry_engine_part_registry(ferry_engine_t *e) { return &e->registry; }
const ferry_config_t *ferry_engine_part_config(const ferry_engine_t *e) { return &e->cfg; }
ferry_metrics_t *ferry_engine_part_metrics(ferry_engine_t *e) { return &e->metrics; }
ferry_counters_t *ferry_engine_part_stats(ferry_engine_t *e) { return &e->stats; }
uint16_t ferry_metrics_port(const ferry_engine_t *e) { return e ? e->metrics.http_port : 0; } /* public (ferry.h) */
uint64_t ferry_engine_part_id(const ferry_engine_t *e) { return e->engine_id; }
const uint8_t *ferry_engine_part_host_id(const ferry_engine_t *e) { return e->host_id; }

ferry_notify_queue_t *ferry_engine_part_notify(ferry_engine_t *e) { return &e->notify; }
ferry_workers_t *ferry_engine_part_work(ferry_engine_t *e) { return &e->work; }
ferry_spin_t *ferry_engine_part_batch_spin(ferry_engine_t *e) { return &e->batch_spin; }
ferry_directory_t *ferry_engine_part_dir(ferry_engine_t *e) { return &e->dir; }
bool ferry_engine_part_stopping(const ferry_engine_t *e) { return atomic_load(&e->stopping); }
void ferry_engine_part_set_stopping(ferry_engine_t *e) { atomic_store(&e->stopping, true); }
uint64_t ferry_engine_part_req_ids(ferry_engine_t *e, uint64_t n) { return atomic_fetch_add(&e->next_req_id, n); }

/* -------------------------------------------------- calls in progress */

int ferry_engine_enter(ferry_engine_t *e)
{
    atomic_fetch_add(&e->calls, 1);
    if (atomic_load(&e->stopping))
        return ferry_engine_leave(e, ferry_fail(FERRY_ERR_CONTEXT, "the engine is shutting down"));
    return 0;
}

int ferry_engine_leave(ferry_engine_t *e, int rc)
{
    bool ours = rc == FERRY_ERR_PEER_CLOSED || rc == FERRY_ERR_SOCKET || rc == FERRY_ERR_TIMEOUT;
    if (ours && atomic_load(&e->stopping))
        rc = ferry_fail(FERRY_ERR_CONTEXT, "the engine was destroyed during the call (%s)", ferry_last_error_detail());
    /* The last one out while destroy waits tells it; nothing of e is
     * touched after that. */
    if (atomic_fetch_sub(&e->calls, 1) == 1 && atomic_load(&e->stopping)) {
        pthread_mutex_lock(&e->calls_lock);
        pthread_cond_broadcast(&e->calls_cond);
        pthread_mutex_unlock(&e->calls_lock);
    }
    return rc;
}

/* ------------------------------------------------------------ testing.h */

void ferry_test_set_protocol_version(ferry_engine_t *e, int version)
{
    __atomic_store_n(&e->test_protocol_version, version, __ATOMIC_RELAXED);
    atomic_store_explicit(&e->link.proto_max, version ? version : FERRY_PROTOCOL_VERSION, memory_order_relaxed);
}

int ferry_test_protocol_version(const ferry_engine_t *e)
{
    return __atomic_load_n(&e->test_protocol_version, __ATOMIC_RELAXED);
}

void ferry_test_set_no_conn_fence(ferry_engine_t *e, bool off)
{
    __atomic_store_n(&e->test_no_conn_fence, off ? 1 : 0, __ATOMIC_RELAXED);
}

void ferry_test_set_no_placed(ferry_engine_t *e, bool off)
{
    atomic_store_explicit(&e->link.no_placed, off, memory_order_relaxed);
}

bool ferry_test_no_placed(const ferry_engine_t *e)
{
    return atomic_load_explicit(&e->link.no_placed, memory_order_relaxed);
}

size_t ferry_cancel_engine_count(ferry_engine_t *e) { return atomic_load(&e->link.cancels_held); }

bool ferry_test_no_conn_fence(const ferry_engine_t *e)
{
    return __atomic_load_n(&e->test_no_conn_fence, __ATOMIC_RELAXED) != 0;
}

int ferry_protocol_version_advertised(const ferry_engine_t *e)
{
    int v = ferry_test_protocol_version(e);
    return v ? v : FERRY_PROTOCOL_VERSION;
}

unsigned ferry_engine_proto_max(const ferry_engine_t *e)
{
    return (unsigned)ferry_protocol_version_advertised(e);
}


ferry_test_conns_t ferry_test_conns(ferry_engine_t *e)
{
    pthread_mutex_lock(&e->conns_lock);
    ferry_test_conns_t n = {e->nconns_served, e->nhandshaking, e->nestablished};
    pthread_mutex_unlock(&e->conns_lock);
    return n;
}

void ferry_test_each_conn(ferry_engine_t *e, void (*fn)(ferry_conn_t *c, void *arg), void *arg)
{
    pthread_mutex_lock(&e->conns_lock);
    for (ferry_conn_t *c = e->conns; c; c = c->next) fn(c, arg);
    pthread_mutex_unlock(&e->conns_lock);
}

void ferry_test_conn_bind(ferry_conn_t *c, ferry_engine_t *e)
{
    c->engine = e;
    c->link = &e->link;
    c->ctx = &e->xport;
}

ferry_registry_t *ferry_test_registry(ferry_engine_t *e) { return &e->registry; }
const uint8_t *ferry_test_host_id(const ferry_engine_t *e) { return e->host_id; }
ferry_spin_t *ferry_test_batch_spin(ferry_engine_t *e) { return &e->batch_spin; }
ferry_meta_t *ferry_test_meta(ferry_engine_t *e) { return &e->dir.meta; }
int ferry_test_calls(ferry_engine_t *e) { return atomic_load(&e->calls); }
int ferry_test_sessions(ferry_engine_t *e) { return atomic_load(&e->nsessions); }
