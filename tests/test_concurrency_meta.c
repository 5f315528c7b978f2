/* SPDX-License-Identifier: Apache-2.0 */
/* The metadata client shared by threads (issue 15's concurrency layer):
 * one etcd / Redis client state used by 8 threads at once (publish, lookup,
 * keepalive, remove, a lease keeper starting and stopping), and two engines
 * that find each other through the service while 8 threads open and close
 * sessions and transfer. Needs FERRY_TEST_ETCD / FERRY_TEST_REDIS from
 * `scripts/services.sh start DIR` (FERRY_TEST_ALLOW_SKIP_SERVICES=1 skips). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "meta/meta.h"

#define THREADS 8
#define ITERS 40

typedef struct world {
    ferry_meta_t m;
    ferry_engine_t *ini, *tgt;
    unsigned char *src, *dst;
    atomic_int errors;
} world_t;

typedef struct worker {
    world_t *w;
    int id;
} worker_t;

static const char *service(const char *env)
{
    const char *addr = getenv(env);
    if (addr && *addr) return addr;
    const char *allow = getenv("FERRY_TEST_ALLOW_SKIP_SERVICES");
    if (allow && strcmp(allow, "1") == 0) {
        fprintf(stderr, "%s unset: skipped\n", env);
        skip();
    }
    fail_msg("%s is not set: start `scripts/services.sh start DIR` and source DIR/services.env", env);
    return NULL;
}

static void count_error(worker_t *k, const char *what, int rc)
{
    fprintf(stderr, "thread %d: %s: %d (%s) %s\n", k->id, what, rc, ferry_error_name(rc), ferry_last_error_detail());
    atomic_fetch_add(&k->w->errors, 1);
}

static void *client_worker(void *arg)
{
    worker_t *k = arg;
    world_t *w = k->w;
    char key[128], value[64], other[128];
    snprintf(key, sizeof key, FERRY_META_KEY_PREFIX "conc-%d-%d", (int)getpid(), k->id);
    snprintf(other, sizeof other, FERRY_META_KEY_PREFIX "conc-%d-%d", (int)getpid(), (k->id + 1) % THREADS);
    for (int i = 0; i < ITERS; i++) {
        snprintf(value, sizeof value, "{\"thread\":%d,\"i\":%d}", k->id, i);
        int rc = w->m.ops->publish(w->m.state, key, value, 30);
        if (rc) count_error(k, "publish", rc);
        char *got = NULL;
        rc = w->m.ops->lookup(w->m.state, key, &got);
        if (rc || !got || strcmp(got, value) != 0) count_error(k, "lookup own key", rc ? rc : FERRY_ERR_INTERNAL);
        free(got);
        got = NULL;
        rc = w->m.ops->lookup(w->m.state, other, &got);
        if (rc && rc != FERRY_ERR_NOT_FOUND) count_error(k, "lookup other key", rc);
        free(got);
        if (i % 8 == 3) {
            rc = w->m.ops->keepalive(w->m.state);
            /* another thread's key may be removed under the keepalive */
            if (rc && rc != FERRY_ERR_NOT_FOUND) count_error(k, "keepalive", rc);
        }
        if (i % 8 == 5) {
            struct ferry_meta_publisher *p;
            char pkey[160];
            snprintf(pkey, sizeof pkey, "%s-pub", key);
            rc = ferry_meta_publisher_start(&w->m, pkey, value, 5, &p);
            if (rc) count_error(k, "publisher start", rc);
            else if ((rc = ferry_meta_publisher_stop(p)) != 0) count_error(k, "publisher stop", rc);
        }
        if (i % 2) {
            rc = w->m.ops->remove(w->m.state, key);
            if (rc) count_error(k, "remove", rc);
        }
    }
    w->m.ops->remove(w->m.state, key);
    return NULL;
}

static void run_threads(world_t *w, void *(*fn)(void *))
{
    pthread_t t[THREADS];
    worker_t k[THREADS];
    for (int i = 0; i < THREADS; i++) {
        k[i] = (worker_t){w, i};
        assert_int_equal(pthread_create(&t[i], NULL, fn, &k[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
}

static void client_shared(const char *scheme, const char *env)
{
    if (!ferry_meta_backend_built(scheme)) skip();
    const char *addr = service(env);
    world_t w;
    memset(&w, 0, sizeof w);
    char conn[300];
    snprintf(conn, sizeof conn, "%s://%s", scheme, addr);
    assert_int_equal(ferry_meta_open(conn, 5000, &w.m), 0);
    run_threads(&w, client_worker);
    ferry_meta_close(&w.m);
    assert_int_equal(atomic_load(&w.errors), 0);
}

static void etcd_client_shared(void **state)
{
    (void)state;
    client_shared("etcd", "FERRY_TEST_ETCD");
}

static void redis_client_shared(void **state)
{
    (void)state;
    client_shared("redis", "FERRY_TEST_REDIS");
}

/* Engines that publish to and look each other up in the service, with
 * sessions closed and reopened under the transfers. */
static void *engine_worker(void *arg)
{
    worker_t *k = arg;
    world_t *w = k->w;
    const char *peer = ferry_engine_name(w->tgt);
    unsigned char *mine = w->src + (size_t)k->id * 4096;
    uint64_t remote = (uint64_t)(uintptr_t)(w->dst + (size_t)k->id * 4096);
    for (int i = 0; i < ITERS; i++) {
        int rc;
        if (i % 10 == 9 && k->id == 0) {
            rc = ferry_session_close(w->ini, peer);
            if (rc && rc != FERRY_ERR_NOT_FOUND) count_error(k, "session close", rc);
            continue;
        }
        harness_fill(mine, 4096, (uint64_t)(i * THREADS + k->id));
        rc = ferry_transfer_sync(w->ini, peer, FERRY_OP_WRITE, mine, remote, 4096);
        if (rc == FERRY_ERR_SESSION_INVALID) continue; /* closed under it: documented */
        if (rc) count_error(k, "write", rc);
        else if (!harness_check(w->dst + (size_t)k->id * 4096, 4096, (uint64_t)(i * THREADS + k->id)))
            count_error(k, "data", FERRY_ERR_INTERNAL);
    }
    return NULL;
}

static void engines_through(const char *scheme, const char *env)
{
    if (!ferry_meta_backend_built(scheme)) skip();
    const char *addr = service(env);
    char conn[300];
    snprintf(conn, sizeof conn, "%s://%s", scheme, addr);
    world_t w;
    memset(&w, 0, sizeof w);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.metadata = conn;
    cfg.timeout_ms = 10000;
    cfg.connect_timeout_ms = 5000;
    w.tgt = harness_engine_cfg(&cfg);
    w.ini = harness_engine_cfg(&cfg);
    w.src = calloc(THREADS, 4096);
    w.dst = calloc(THREADS, 4096);
    assert_int_equal(ferry_register(w.ini, w.src, THREADS * 4096, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(w.tgt, w.dst, THREADS * 4096, FERRY_MEM_REMOTE), 0);
    run_threads(&w, engine_worker);
    ferry_engine_destroy(w.ini);
    ferry_engine_destroy(w.tgt);
    free(w.src);
    free(w.dst);
    assert_int_equal(atomic_load(&w.errors), 0);
}

static void etcd_engines_shared(void **state)
{
    (void)state;
    engines_through("etcd", "FERRY_TEST_ETCD");
}

static void redis_engines_shared(void **state)
{
    (void)state;
    engines_through("redis", "FERRY_TEST_REDIS");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(etcd_client_shared),
        cmocka_unit_test(redis_client_shared),
        cmocka_unit_test(etcd_engines_shared),
        cmocka_unit_test(redis_engines_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
