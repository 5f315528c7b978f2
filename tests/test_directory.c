/* Engines publishing themselves in etcd and Redis and finding each other:
 * publish/lookup, clean removal, a killed engine's lease expiring, the
 * service down at start (clear error) and during a run (sessions go on). */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    /* Clean shutdown removes the entry: a new session finds nobody. */
    ferry_engine_destroy(target);
    ferry_session_close(initiator, peer);
    int rc = ferry_session_open(initiator, peer);
    assert_int_equal(rc, FERRY_ERR_METADATA);
    assert_detail_contains("holds no entry");
    assert_detail_contains(peer);
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

/* A private redis-server we may kill. */
static pid_t start_redis(int port)
{
    pid_t pid = fork();
    if (pid == 0) {
        char p[16];
        snprintf(p, sizeof p, "%d", port);
        int devnull = open("/dev/null", 1);
        dup2(devnull, 1);
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void service_down_during_run(void **state)
{
    (void)state;
    int port = 20000 + (int)(getpid() % 10000); /* below the ephemeral range */
    pid_t redis = start_redis(port);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
    ferry_engine_t *target = NULL, *initiator = NULL;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.metadata = url;
    cfg.timeout_ms = 3000;
    for (int i = 0; i < 50 && !target; i++) {
        if (ferry_engine_create(&cfg, &target) != 0) usleep(100 * 1000);
    }
    assert_non_null(target);
    assert_int_equal(ferry_engine_create(&cfg, &initiator), 0);
    char peer[300];
    snprintf(peer, sizeof peer, "%s", ferry_engine_name(target));
    unsigned char *src = malloc(4096), *dst = calloc(1, 4096);
    ferry_register(initiator, src, 4096, 0);
    ferry_register(target, dst, 4096, FERRY_MEM_REMOTE);
    assert_int_equal(ferry_session_open(initiator, peer), 0);
    kill(redis, SIGKILL);
    waitpid(redis, NULL, 0);
    /* The open session does not need the service. */
    harness_fill(src, 4096, 11);
    assert_int_equal(ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096), 0);
    assert_true(harness_check(dst, 4096, 11));
    /* A new session does, and says so. */
    ferry_session_close(initiator, peer);
    int rc = ferry_session_open(initiator, peer);
    assert_int_equal(rc, FERRY_ERR_METADATA);
    ferry_engine_destroy(target);
    ferry_engine_destroy(initiator);
    free(src);
    free(dst);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(publish_and_find_redis),   cmocka_unit_test(publish_and_find_etcd),
        cmocka_unit_test(killed_engine_expires_redis), cmocka_unit_test(killed_engine_expires_etcd),
        cmocka_unit_test(service_down_at_start),    cmocka_unit_test(service_down_during_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
