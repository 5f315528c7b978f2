/* SPDX-License-Identifier: Apache-2.0 */
/* Engines publishing themselves in etcd and Redis and finding each other:
 * publish/lookup, clean removal, a killed engine's lease expiring, the
 * service down at start (clear error) and during a run (sessions go on,
 * known peers are served from the cache, entries are published again once
 * it is back), and the cache dropping a restarted peer's entry. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

struct backend {
    const char *env;
    const char *scheme;
};

static const struct backend backends[] = {{"FERRY_TEST_REDIS", "redis"}, {"FERRY_TEST_ETCD", "etcd"}};

static int service_url(const struct backend *b, char *url, size_t cap)
{
    const char *addr = getenv(b->env);
    if (!addr || !*addr) {
        if (getenv("FERRY_TEST_ALLOW_SKIP_SERVICES")) return 0;
        fprintf(stderr, "%s is not set: run the suite with `make test`, or start the servers with "
                        "scripts/services.sh start DIR and source DIR/services.env\n", b->env);
        fail();
    }
    snprintf(url, cap, "%s://%s", b->scheme, addr);
    return 1;
}

static ferry_engine_t *engine_with(const char *url, int ttl_s)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.metadata = url;
    cfg.metadata_ttl_s = ttl_s;
    cfg.timeout_ms = 3000;
    cfg.connect_timeout_ms = 2000;
    return harness_engine_cfg(&cfg);
}

struct meta_counts {
    uint64_t lookups, hits, fetches, stale, invalidations, refreshes, republishes;
};

static struct meta_counts counts(ferry_engine_t *e)
{
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(e, &st), 0);
    struct meta_counts c = {st.metadata_lookups, st.metadata_cache_hits, st.metadata_fetches,
                            st.metadata_stale_served, st.metadata_invalidations,
                            st.metadata_lease_refreshes, st.metadata_republishes};
    return c;
}

static void publish_and_find(const struct backend *b)
{
    char url[300];
    if (!service_url(b, url, sizeof url)) return;
    ferry_engine_t *target = engine_with(url, 10), *initiator = engine_with(url, 10);
    char peer[300];
    snprintf(peer, sizeof peer, "%s", ferry_engine_name(target));
    unsigned char *src = malloc(4096), *dst = calloc(1, 4096);
    harness_fill(src, 4096, 3);
    ferry_register(initiator, src, 4096, 0);
    ferry_register(target, dst, 4096, FERRY_MEM_REMOTE);
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096), 0);
    assert_true(harness_check(dst, 4096, 3));
    struct meta_counts c0 = counts(initiator);
    assert_int_equal(c0.lookups, 1);
    assert_int_equal(c0.fetches, 1);
    /* A second session to the same peer is served by the cache. */
    ferry_session_close(initiator, peer);
    assert_int_equal(ferry_session_open(initiator, peer), 0);
    struct meta_counts c1 = counts(initiator);
    assert_int_equal(c1.lookups, 2);
    assert_int_equal(c1.hits, 1);
    assert_int_equal(c1.fetches, 1);
    /* Clean shutdown removes the entry: a new session finds nobody, though
     * the cache still held the peer (its refused address drops the entry
     * and the service is asked again). */
    ferry_engine_destroy(target);
    ferry_session_close(initiator, peer);
    int rc = ferry_session_open(initiator, peer);
    assert_int_equal(rc, FERRY_ERR_METADATA);
    assert_detail_contains("holds no entry");
    assert_detail_contains(peer);
    struct meta_counts c2 = counts(initiator);
    assert_int_equal(c2.hits, 2);
    assert_int_equal(c2.invalidations, 1);
    assert_int_equal(c2.fetches, 2);
    ferry_engine_destroy(initiator);
    free(src);
    free(dst);
}

static void publish_and_find_redis(void **s) { (void)s; publish_and_find(&backends[0]); }
static void publish_and_find_etcd(void **s) { (void)s; publish_and_find(&backends[1]); }

/* A child engine killed with SIGKILL: its entry outlives it by the lease only. */
static void killed_engine_expires(const struct backend *b)
{
    char url[300];
    if (!service_url(b, url, sizeof url)) return;
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        ferry_config_t cfg;
        ferry_config_init(&cfg);
        cfg.metadata = url;
        cfg.metadata_ttl_s = 2;
        ferry_engine_t *e;
        if (ferry_engine_create(&cfg, &e) != 0) _exit(1);
        dprintf(p[1], "%s\n", ferry_engine_name(e));
        pause();
        _exit(0);
    }
    close(p[1]);
    char name[300] = {0};
    FILE *f = fdopen(p[0], "r");
    assert_non_null(fgets(name, sizeof name, f));
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
    ferry_engine_t *initiator = engine_with(url, 10);
    assert_int_equal(ferry_session_open(initiator, name), 0);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ferry_session_close(initiator, name);
    /* Within the lease (2 s) plus etcd's own granularity, it is gone. */
    int rc = 0;
    for (int i = 0; i < 80; i++) {
        rc = ferry_session_open(initiator, name);
        if (rc == FERRY_ERR_METADATA) break;
        ferry_session_close(initiator, name);
        usleep(100 * 1000);
    }
    assert_int_equal(rc, FERRY_ERR_METADATA);
    assert_detail_contains("lease expired");
    ferry_engine_destroy(initiator);
}

static void killed_engine_expires_redis(void **s) { (void)s; killed_engine_expires(&backends[0]); }
static void killed_engine_expires_etcd(void **s) { (void)s; killed_engine_expires(&backends[1]); }

static void service_down_at_start(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.metadata = "redis://127.0.0.1:1";
    cfg.connect_timeout_ms = 500;
    ferry_engine_t *e;
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_ERR_METADATA);
    assert_true(harness_now_ms() - t0 < 3000);
    assert_detail_contains("127.0.0.1:1");
    cfg.metadata = "etcd://127.0.0.1:1";
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_ERR_METADATA);
    assert_detail_contains("127.0.0.1:1");
    cfg.metadata = "zookeeper://127.0.0.1:2181";
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_ERR_INVALID_ARGUMENT);
}

/* A peer restarted on its address: the session finds the new epoch
 * (PEER_RESTARTED), which drops the cached entry, so the next session asks
 * the service and learns the new process. */
static void restart_invalidates(const struct backend *b)
{
    char url[300];
    if (!service_url(b, url, sizeof url)) return;
    ferry_engine_t *target = engine_with(url, 10), *initiator = engine_with(url, 10);
    char peer[300];
    snprintf(peer, sizeof peer, "%s", ferry_engine_name(target));
    uint16_t port = ferry_engine_port(target);
    unsigned char *src = malloc(4096), *dst = calloc(1, 4096);
    harness_fill(src, 4096, 5);
    ferry_register(initiator, src, 4096, 0);
    ferry_register(target, dst, 4096, FERRY_MEM_REMOTE);
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096), 0);
    ferry_engine_destroy(target);
    /* The same name, a new process (epoch). */
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.metadata = url;
    cfg.metadata_ttl_s = 10;
    cfg.host = "127.0.0.1";
    cfg.port = port;
    cfg.timeout_ms = 3000;
    cfg.connect_timeout_ms = 2000;
    assert_int_equal(ferry_engine_create(&cfg, &target), 0);
    assert_string_equal(ferry_engine_name(target), peer);
    ferry_register(target, dst, 4096, FERRY_MEM_REMOTE);
    struct meta_counts before = counts(initiator);
    int rc = ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096);
    assert_int_equal(rc, FERRY_ERR_PEER_RESTARTED);
    struct meta_counts after = counts(initiator);
    assert_int_equal(after.invalidations, before.invalidations + 1);
    /* The next session fetches the new entry instead of using the cache. */
    ferry_session_close(initiator, peer);
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096), 0);
    struct meta_counts last = counts(initiator);
    assert_int_equal(last.fetches, after.fetches + 1);
    assert_int_equal(last.hits, after.hits);
    ferry_engine_destroy(target);
    ferry_engine_destroy(initiator);
    free(src);
    free(dst);
}

static void restart_invalidates_redis(void **s) { (void)s; restart_invalidates(&backends[0]); }
static void restart_invalidates_etcd(void **s) { (void)s; restart_invalidates(&backends[1]); }

/* Threads opening sessions to different peers share the engine's cache:
 * each peer is fetched at least once, every other lookup is a hit, and
 * no session fails (TSan checks the cache's locking). */
#define CACHE_THREADS 4
#define CACHE_ROUNDS 25

struct cache_worker {
    ferry_engine_t *initiator;
    char peer[300];
    int failures;
};

static void *cache_worker_main(void *arg)
{
    struct cache_worker *w = arg;
    for (int i = 0; i < CACHE_ROUNDS; i++) {
        if (ferry_session_open(w->initiator, w->peer) != 0) w->failures++;
        ferry_session_close(w->initiator, w->peer);
    }
    return NULL;
}

static void cache_shared_by_threads(void **state)
{
    (void)state;
    char url[300];
    if (!service_url(&backends[0], url, sizeof url)) return;
    ferry_engine_t *initiator = engine_with(url, 10), *targets[CACHE_THREADS];
    struct cache_worker w[CACHE_THREADS];
    pthread_t th[CACHE_THREADS];
    for (int i = 0; i < CACHE_THREADS; i++) {
        targets[i] = engine_with(url, 10);
        w[i].initiator = initiator;
        w[i].failures = 0;
        snprintf(w[i].peer, sizeof w[i].peer, "%s", ferry_engine_name(targets[i]));
    }
    for (int i = 0; i < CACHE_THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, cache_worker_main, &w[i]), 0);
    for (int i = 0; i < CACHE_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    struct meta_counts c = counts(initiator);
    assert_int_equal(c.lookups, CACHE_THREADS * CACHE_ROUNDS);
    assert_int_equal(c.fetches, CACHE_THREADS);
    assert_int_equal(c.hits, CACHE_THREADS * (CACHE_ROUNDS - 1));
    for (int i = 0; i < CACHE_THREADS; i++) ferry_engine_destroy(targets[i]);
    ferry_engine_destroy(initiator);
}

/* ------------------------------------------- a private server, stopped */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

struct server {
    const struct backend *b;
    pid_t pid;
    int port, peer_port;
    char dir[64];
    char url[96];
};

/* Starts the server (a fresh, empty one: data from an earlier run is
 * wiped) and waits until it answers, bounded. */
static void server_start(struct server *s)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s/data", s->dir);
    assert_int_equal(system(cmd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        char port[16], data[128], curl[80], purl[80], cluster[120], log[128];
        snprintf(port, sizeof port, "%d", s->port);
        snprintf(data, sizeof data, "%s/data", s->dir);
        snprintf(curl, sizeof curl, "http://127.0.0.1:%d", s->port);
        snprintf(purl, sizeof purl, "http://127.0.0.1:%d", s->peer_port);
        snprintf(cluster, sizeof cluster, "t=%s", purl);
        snprintf(log, sizeof log, "%s/server.log", s->dir);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        if (strcmp(s->b->scheme, "redis") == 0)
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", s->dir, (char *)NULL);
        else
            execlp("etcd", "etcd", "--name", "t", "--data-dir", data, "--listen-client-urls", curl,
                   "--advertise-client-urls", curl, "--listen-peer-urls", purl, "--initial-advertise-peer-urls",
                   purl, "--initial-cluster", cluster, (char *)NULL);
        _exit(127);
    }
    s->pid = pid;
    for (int i = 0; i < 150; i++) {
        ferry_config_t cfg;
        ferry_config_init(&cfg);
        cfg.metadata = s->url;
        cfg.connect_timeout_ms = 300;
        ferry_engine_t *e;
        if (ferry_engine_create(&cfg, &e) == 0) {
            ferry_engine_destroy(e);
            return;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) fail_msg("%s exited at start-up; see %s/server.log", s->url, s->dir);
        usleep(100 * 1000);
    }
    fail_msg("%s not answering after 15 s; see %s/server.log", s->url, s->dir);
}

/* A crash, not a shutdown: by the pid this test started. */
static void server_kill(struct server *s)
{
    if (s->pid <= 0) return;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

static struct server outage_server; /* killed by the teardown if a check failed */

static int outage_teardown(void **state)
{
    (void)state;
    server_kill(&outage_server);
    if (outage_server.dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", outage_server.dir);
        if (system(cmd) != 0) return -1;
    }
    memset(&outage_server, 0, sizeof outage_server);
    return 0;
}

/* The service down during a run: open sessions keep working, new
 * sessions to peers already looked up are served from the cache, a peer
 * never looked up fails with METADATA naming the service. Once the
 * service is back (empty: it lost every entry), each engine publishes
 * itself again and new engines find it. */
static void service_down_during_run(const struct backend *b)
{
    struct server *s = &outage_server;
    memset(s, 0, sizeof *s);
    s->b = b;
    s->port = free_port();
    s->peer_port = free_port();
    snprintf(s->dir, sizeof s->dir, "/tmp/ferry-test-dir-XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->url, sizeof s->url, "%s://127.0.0.1:%d", b->scheme, s->port);
    server_start(s);
    ferry_engine_t *target = engine_with(s->url, 2), *initiator = engine_with(s->url, 2),
                   *other = engine_with(s->url, 2);
    char peer[300], stranger[300], addr[64];
    snprintf(peer, sizeof peer, "%s", ferry_engine_name(target));
    snprintf(stranger, sizeof stranger, "%s", ferry_engine_name(other));
    snprintf(addr, sizeof addr, "127.0.0.1:%d", s->port);
    unsigned char *src = malloc(4096), *dst = calloc(1, 4096);
    ferry_register(initiator, src, 4096, 0);
    ferry_register(target, dst, 4096, FERRY_MEM_REMOTE);
    assert_int_equal(ferry_session_open(initiator, peer), 0);
    server_kill(s);
    /* The open session does not need the service. */
    harness_fill(src, 4096, 11);
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096), 0);
    assert_true(harness_check(dst, 4096, 11));
    /* A new session to a known peer is served by the cache, also once the
     * entry is older than its lifetime (2 s): better stale than nothing. */
    ferry_session_close(initiator, peer);
    assert_int_equal(ferry_session_open(initiator, peer), 0);
    usleep(2200 * 1000);
    ferry_session_close(initiator, peer);
    assert_int_equal(ferry_session_open(initiator, peer), 0);
    assert_int_equal(counts(initiator).stale, 1);
    harness_fill(src, 4096, 12);
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096), 0);
    assert_true(harness_check(dst, 4096, 12));
    /* A peer never looked up: METADATA, naming the service. */
    assert_int_equal(ferry_session_open(initiator, stranger), FERRY_ERR_METADATA);
    assert_detail_contains(addr);
    /* Back, empty: the engines publish themselves again (lease 2 s, so
     * a refresh every 0.67 s); a new engine finds both, bounded. */
    server_start(s);
    ferry_engine_t *late = engine_with(s->url, 2);
    int rc_peer = -1, rc_other = -1;
    for (int i = 0; i < 100 && (rc_peer || rc_other); i++) {
        if (rc_peer) rc_peer = ferry_session_open(late, peer);
        if (rc_other) rc_other = ferry_session_open(initiator, stranger);
        if (rc_peer || rc_other) usleep(100 * 1000);
    }
    if (rc_peer || rc_other)
        fail_msg("%s: not re-published 10 s after the restart: %d %d (%s)", b->scheme, rc_peer, rc_other,
                 ferry_last_error_detail());
    /* Counted: the re-publish after the outage, and refreshes (one every
     * 0.67 s once it is back; waited for, bounded). */
    struct meta_counts c = counts(target);
    for (int i = 0; i < 50 && c.refreshes < 1; i++) {
        usleep(100 * 1000);
        c = counts(target);
    }
    if (c.refreshes < 1 || c.republishes < 1)
        fail_msg("%s: lease refreshes %llu, republishes %llu", b->scheme, (unsigned long long)c.refreshes,
                 (unsigned long long)c.republishes);
    ferry_engine_destroy(late);
    ferry_engine_destroy(other);
    ferry_engine_destroy(target);
    ferry_engine_destroy(initiator);
    free(src);
    free(dst);
}

static void service_down_during_run_redis(void **s) { (void)s; service_down_during_run(&backends[0]); }
static void service_down_during_run_etcd(void **s) { (void)s; service_down_during_run(&backends[1]); }

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(publish_and_find_redis),   cmocka_unit_test(publish_and_find_etcd),
        cmocka_unit_test(killed_engine_expires_redis), cmocka_unit_test(killed_engine_expires_etcd),
        cmocka_unit_test(service_down_at_start),
        cmocka_unit_test(restart_invalidates_redis), cmocka_unit_test(restart_invalidates_etcd),
        cmocka_unit_test(cache_shared_by_threads),
        cmocka_unit_test_teardown(service_down_during_run_redis, outage_teardown),
        cmocka_unit_test_teardown(service_down_during_run_etcd, outage_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
