/* SPDX-License-Identifier: Apache-2.0 */
/* The http metadata backend (Mooncake's HTTP metadata server) against
 * tests/http_meta_server.py, a stand-in with Mooncake's semantics that each
 * test starts itself (python3, on a free loopback port) and kills by pid:
 * the backend's operations and URL escaping, the server down at open,
 * hung, down during a run and restarted empty (keepalive stores the entries
 * again), engines finding each other through it, a killed engine's stale
 * entry (no lease over HTTP) failing cleanly at connect, and a restarted
 * peer told by its epoch. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/fail.h"
#include "harness.h"
#include "meta/meta.h"

extern char **environ;

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* ------------------------------------------------------------- the server */

struct server {
    pid_t pid;
    int port;
    char url[96];
};

static struct server srv; /* killed by the teardown if a check failed */

/* Starts a fresh (empty) server on srv.port and waits until it answers. */
static void server_start(void)
{
    const char *src = getenv("FERRY_SOURCE_DIR");
    char script[512], port[16];
    snprintf(script, sizeof script, "%s/tests/http_meta_server.py", src ? src : "..");
    snprintf(port, sizeof port, "%d", srv.port);
    char *argv[] = {"python3", script, "--port", port, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    int rc = posix_spawnp(&srv.pid, "python3", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) fail_msg("posix_spawnp python3 %s: %s", script, strerror(rc));
    for (int i = 0; i < 150; i++) {
        ferry_meta_t m;
        if (ferry_meta_open(srv.url, 300, &m) == 0) {
            ferry_meta_close(&m);
            return;
        }
        if (waitpid(srv.pid, NULL, WNOHANG) == srv.pid) {
            srv.pid = 0;
            fail_msg("%s exited at start-up", script);
        }
        usleep(100 * 1000);
    }
    fail_msg("%s not answering at %s after 15 s", script, srv.url);
}

/* A crash, not a shutdown: by the pid this test started. */
static void server_kill(void)
{
    if (srv.pid <= 0) return;
    kill(srv.pid, SIGKILL);
    waitpid(srv.pid, NULL, 0);
    srv.pid = 0;
}

static int server_setup(void **state)
{
    (void)state;
    memset(&srv, 0, sizeof srv);
    srv.port = free_port();
    snprintf(srv.url, sizeof srv.url, "http://127.0.0.1:%d/metadata", srv.port);
    server_start();
    return 0;
}

static int server_teardown(void **state)
{
    (void)state;
    server_kill();
    return 0;
}

/* ------------------------------------------------------------ the backend */

static void open_meta(ferry_meta_t *m)
{
    int rc = ferry_meta_open(srv.url, 2000, m);
    if (rc) fail_msg("open %s: %s", srv.url, ferry_last_error_detail());
    assert_string_equal(m->ops->scheme, "http");
}

static void check_value(ferry_meta_t *m, const char *key, const char *want)
{
    char *got = NULL;
    int rc = m->ops->lookup(m->state, key, &got);
    if (rc) fail_msg("lookup %s: %s", key, ferry_last_error_detail());
    assert_string_equal(got, want);
    free(got);
}

static void check_missing(ferry_meta_t *m, const char *key)
{
    char *got = NULL;
    int rc = m->ops->lookup(m->state, key, &got);
    if (rc != FERRY_ERR_NOT_FOUND)
        fail_msg("lookup %s: want NOT_FOUND, got %d (%s)", key, rc, ferry_last_error_detail());
    assert_null(got);
}

static void backend_operations(void **state)
{
    (void)state;
    ferry_meta_t m;
    open_meta(&m);
    const char *key = FERRY_META_KEY_PREFIX "http-ops";
    check_missing(&m, key);
    assert_detail_contains("HTTP 404");
    assert_detail_contains(srv.url);
    assert_int_equal(m.ops->publish(m.state, key, "{\"a\":1}", 5), 0);
    check_value(&m, key, "{\"a\":1}");
    assert_int_equal(m.ops->publish(m.state, key, "{\"a\":2}", 5), 0);
    check_value(&m, key, "{\"a\":2}");
    assert_int_equal(m.ops->keepalive(m.state), 0);
    check_value(&m, key, "{\"a\":2}");
    /* An empty value is a value. */
    const char *empty = FERRY_META_KEY_PREFIX "http-empty";
    assert_int_equal(m.ops->publish(m.state, empty, "", 0), 0);
    check_value(&m, empty, "");
    assert_int_equal(m.ops->remove(m.state, empty), 0);
    assert_int_equal(m.ops->remove(m.state, key), 0);
    check_missing(&m, key);
    /* Deleting a missing key (the server answers 404) is not an error. */
    assert_int_equal(m.ops->remove(m.state, key), 0);
    /* Removed: keepalive does not bring it back. */
    assert_int_equal(m.ops->keepalive(m.state), 0);
    check_missing(&m, key);
    ferry_meta_close(&m);
}

/* Keys travel URL-encoded: '&', '=', '+', '%', ' ', '/', '#' and non-ASCII
 * stay in the key. Unescaped, "k&key=x" would reach the server as "k". */
static void keys_are_escaped(void **state)
{
    (void)state;
    ferry_meta_t m;
    open_meta(&m);
    const char *odd = FERRY_META_KEY_PREFIX "a b&key=x+y%20z/#\xc3\xa9";
    assert_int_equal(m.ops->publish(m.state, odd, "odd", 0), 0);
    check_value(&m, odd, "odd");
    check_missing(&m, FERRY_META_KEY_PREFIX "a b");
    check_missing(&m, FERRY_META_KEY_PREFIX "a");
    assert_int_equal(m.ops->remove(m.state, odd), 0);
    check_missing(&m, odd);
    ferry_meta_close(&m);
}

/* A status other than the expected ones is METADATA naming URL, key and
 * status: Mooncake's server refuses a second, different value of an
 * "rpc_meta" key with 400. */
static void bad_status_is_reported(void **state)
{
    (void)state;
    ferry_meta_t m;
    open_meta(&m);
    const char *key = "mooncake/rpc_meta/ferry-test";
    assert_int_equal(m.ops->publish(m.state, key, "one", 0), 0);
    assert_int_equal(m.ops->publish(m.state, key, "two", 0), FERRY_ERR_METADATA);
    assert_detail_contains("HTTP 400");
    assert_detail_contains(srv.url);
    assert_detail_contains("rpc_meta");
    assert_detail_contains("Duplicate");
    assert_int_equal(m.ops->remove(m.state, key), 0);
    ferry_meta_close(&m);
    /* The wrong path: the server answers 404 to everything; a PUT says so. */
    char wrong[128];
    snprintf(wrong, sizeof wrong, "http://127.0.0.1:%d/elsewhere", srv.port);
    assert_int_equal(ferry_meta_open(wrong, 2000, &m), 0);
    assert_int_equal(m.ops->publish(m.state, FERRY_META_KEY_PREFIX "x", "v", 0), FERRY_ERR_METADATA);
    assert_detail_contains("HTTP 404");
    assert_detail_contains("/elsewhere");
    ferry_meta_close(&m);
}

/* Nobody listening: METADATA naming the URL, at once. */
static void down_at_open(void **state)
{
    (void)state;
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metadata", free_port());
    ferry_meta_t m;
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_meta_open(url, 2000, &m), FERRY_ERR_METADATA);
    assert_detail_contains(url);
    assert_true(harness_now_ms() - t0 < 2000);
    assert_null(m.ops);
    /* An engine too. */
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.metadata = url;
    cfg.connect_timeout_ms = 500;
    ferry_engine_t *e;
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_ERR_METADATA);
    assert_detail_contains(url);
}

/* A server that accepts but never answers: the open's timeout bounds it. */
static void hung_server_times_out(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0); /* the kernel completes connects; nobody reads */
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metadata", ntohs(a.sin_port));
    ferry_meta_t m;
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_meta_open(url, 300, &m), FERRY_ERR_METADATA);
    uint64_t took = harness_now_ms() - t0;
    assert_detail_contains(url);
    assert_detail_contains("imed out"); /* curl: "Operation timed out ..." */
    /* Bounded by the timeout, not hung (generous: a loaded machine). */
    assert_true(took < 10000);
    close(fd);
}

/* Killed while in use: every operation fails with METADATA naming the URL,
 * none hangs; restarted empty, keepalive stores the entries again. */
static void down_and_restarted_empty(void **state)
{
    (void)state;
    ferry_meta_t m;
    open_meta(&m);
    const char *key = FERRY_META_KEY_PREFIX "http-restart";
    assert_int_equal(m.ops->publish(m.state, key, "v1", 5), 0);
    server_kill();
    char *got = NULL;
    assert_int_equal(m.ops->lookup(m.state, key, &got), FERRY_ERR_METADATA);
    assert_null(got);
    assert_detail_contains(srv.url);
    assert_int_equal(m.ops->keepalive(m.state), FERRY_ERR_METADATA);
    assert_detail_contains(srv.url);
    assert_int_equal(m.ops->publish(m.state, key, "v2", 5), FERRY_ERR_METADATA);
    assert_detail_contains("PUT");
    server_start();
    check_missing(&m, key); /* empty */
    assert_int_equal(m.ops->keepalive(m.state), 0);
    check_value(&m, key, "v1"); /* what was last published successfully */
    assert_int_equal(m.ops->remove(m.state, key), 0);
    ferry_meta_close(&m);
}

/* ------------------------------------------------------------- engines */

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

static void write_and_check(ferry_engine_t *initiator, const char *peer, unsigned char *src,
                            unsigned char *dst, int seed)
{
    harness_fill(src, 4096, seed);
    int rc = ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096);
    if (rc) fail_msg("write to %s: %d %s", peer, rc, ferry_last_error_detail());
    assert_true(harness_check(dst, 4096, seed));
}

/* Two engines find each other through the server and transfer; a clean
 * shutdown removes the entry. */
static void engines_find_each_other(void **state)
{
    (void)state;
    ferry_engine_t *target = engine_with(srv.url, 10), *initiator = engine_with(srv.url, 10);
    char peer[300];
    snprintf(peer, sizeof peer, "%s", ferry_engine_name(target));
    unsigned char *src = malloc(4096), *dst = calloc(1, 4096);
    ferry_register(initiator, src, 4096, 0);
    ferry_register(target, dst, 4096, FERRY_MEM_REMOTE);
    write_and_check(initiator, peer, src, dst, 3);
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(initiator, &st), 0);
    assert_int_equal(st.metadata_fetches, 1);
    ferry_engine_destroy(target);
    ferry_session_close(initiator, peer);
    assert_int_equal(ferry_session_open(initiator, peer), FERRY_ERR_METADATA);
    assert_detail_contains("holds no entry");
    assert_detail_contains(peer);
    ferry_engine_destroy(initiator);
    free(src);
    free(dst);
}

/* No lease over HTTP: a SIGKILLed engine's entry stays. A lookup of it
 * still fails cleanly, when connecting to its closed port, not by hanging. */
static void killed_engine_fails_at_connect(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        ferry_config_t cfg;
        ferry_config_init(&cfg);
        cfg.metadata = srv.url;
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
    ferry_engine_t *initiator = engine_with(srv.url, 10);
    assert_int_equal(ferry_session_open(initiator, name), 0);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ferry_session_close(initiator, name);
    /* The entry outlives the process... */
    ferry_meta_t m;
    open_meta(&m);
    char key[400], *got = NULL;
    snprintf(key, sizeof key, "%s%s", FERRY_META_KEY_PREFIX, name);
    sleep(3); /* beyond its ttl: nothing expires over HTTP */
    assert_int_equal(m.ops->lookup(m.state, key, &got), 0);
    free(got);
    /* ...and the session fails at connect, bounded. */
    uint64_t t0 = harness_now_ms();
    int rc = ferry_session_open(initiator, name);
    if (rc != FERRY_ERR_SOCKET && rc != FERRY_ERR_ENDPOINT && rc != FERRY_ERR_PEER_CLOSED)
        fail_msg("session to killed %s: %d %s", name, rc, ferry_last_error_detail());
    assert_true(harness_now_ms() - t0 < 10000);
    assert_int_equal(m.ops->remove(m.state, key), 0); /* tidy */
    ferry_meta_close(&m);
    ferry_engine_destroy(initiator);
}

/* A peer restarted on its address under the same name: its new entry
 * replaces the old (PUT), and the handshake tells the new epoch. */
static void restarted_peer_by_epoch(void **state)
{
    (void)state;
    ferry_engine_t *target = engine_with(srv.url, 10), *initiator = engine_with(srv.url, 10);
    char peer[300];
    snprintf(peer, sizeof peer, "%s", ferry_engine_name(target));
    uint16_t port = ferry_engine_port(target);
    unsigned char *src = malloc(4096), *dst = calloc(1, 4096);
    ferry_register(initiator, src, 4096, 0);
    ferry_register(target, dst, 4096, FERRY_MEM_REMOTE);
    write_and_check(initiator, peer, src, dst, 5);
    ferry_engine_destroy(target);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.metadata = srv.url;
    cfg.metadata_ttl_s = 10;
    cfg.host = "127.0.0.1";
    cfg.port = port;
    cfg.timeout_ms = 3000;
    cfg.connect_timeout_ms = 2000;
    assert_int_equal(ferry_engine_create(&cfg, &target), 0);
    assert_string_equal(ferry_engine_name(target), peer);
    ferry_register(target, dst, 4096, FERRY_MEM_REMOTE);
    int rc = ferry_transfer_sync(initiator, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096);
    assert_int_equal(rc, FERRY_ERR_PEER_RESTARTED);
    ferry_session_close(initiator, peer);
    write_and_check(initiator, peer, src, dst, 6);
    ferry_engine_destroy(target);
    ferry_engine_destroy(initiator);
    free(src);
    free(dst);
}

/* The server down during a run: open sessions go on, a peer never looked
 * up fails with METADATA naming the URL; restarted empty, each engine's
 * refresh stores its entry again and a new engine finds it. */
static void server_down_during_run(void **state)
{
    (void)state;
    ferry_engine_t *target = engine_with(srv.url, 2), *initiator = engine_with(srv.url, 2),
                   *other = engine_with(srv.url, 2);
    char peer[300], stranger[300];
    snprintf(peer, sizeof peer, "%s", ferry_engine_name(target));
    snprintf(stranger, sizeof stranger, "%s", ferry_engine_name(other));
    unsigned char *src = malloc(4096), *dst = calloc(1, 4096);
    ferry_register(initiator, src, 4096, 0);
    ferry_register(target, dst, 4096, FERRY_MEM_REMOTE);
    assert_int_equal(ferry_session_open(initiator, peer), 0);
    server_kill();
    write_and_check(initiator, peer, src, dst, 11);
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_session_open(initiator, stranger), FERRY_ERR_METADATA);
    assert_detail_contains(srv.url);
    assert_true(harness_now_ms() - t0 < 10000);
    server_start();
    ferry_engine_t *late = engine_with(srv.url, 2);
    int rc_peer = -1, rc_other = -1;
    for (int i = 0; i < 100 && (rc_peer || rc_other); i++) {
        if (rc_peer) rc_peer = ferry_session_open(late, peer);
        if (rc_other) rc_other = ferry_session_open(initiator, stranger);
        if (rc_peer || rc_other) usleep(100 * 1000);
    }
    if (rc_peer || rc_other)
        fail_msg("not stored again 10 s after the restart: %d %d (%s)", rc_peer, rc_other,
                 ferry_last_error_detail());
    ferry_engine_destroy(late);
    ferry_engine_destroy(other);
    ferry_engine_destroy(target);
    ferry_engine_destroy(initiator);
    free(src);
    free(dst);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (!ferry_meta_backend_built("http")) {
        ferry_meta_t m;
        int rc = ferry_meta_open("http://127.0.0.1:1/metadata", 100, &m);
        fprintf(stderr, "http backend not built into this library: open gave %d (%s)\n", rc,
                ferry_last_error_detail());
        return rc == FERRY_ERR_NOT_IMPLEMENTED ? 0 : 1;
    }
#define T(f) cmocka_unit_test_setup_teardown(f, server_setup, server_teardown)
    const struct CMUnitTest tests[] = {
        T(backend_operations),
        T(keys_are_escaped),
        T(bad_status_is_reported),
        cmocka_unit_test(down_at_open),
        cmocka_unit_test(hung_server_times_out),
        T(down_and_restarted_empty),
        T(engines_find_each_other),
        T(killed_engine_fails_at_connect),
        T(restarted_peer_by_epoch),
        T(server_down_during_run),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
