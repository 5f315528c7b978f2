/* SPDX-License-Identifier: Apache-2.0 */
/* Metadata backends: connection strings, p2p, the publisher, and etcd and
 * Redis against real servers.
 *
 * The shared servers come from scripts/services.sh (FERRY_TEST_ETCD,
 * FERRY_TEST_REDIS). The outage tests start their own private server on a
 * free port, kill it and start it again. Without the variables the
 * server tests fail, unless FERRY_TEST_ALLOW_SKIP_SERVICES=1. */
#include "harness.h"

#include <dirent.h>
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
#include <time.h>
#include <unistd.h>

#include "engine/directory.h"
#include "util/fail.h"
#include "meta/meta.h"

extern char **environ;

struct backend {
    const char *scheme;
    const char *env; /* the variable naming the shared server */
};

static struct backend etcd_backend = {"etcd", "FERRY_TEST_ETCD"};
static struct backend redis_backend = {"redis", "FERRY_TEST_REDIS"};

/* ---------------------------------------------------------------- helpers */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void make_key(char *buf, size_t len, const char *tag)
{
    static int seq;
    snprintf(buf, len, FERRY_META_KEY_PREFIX "test-%d-%d-%s", (int)getpid(), ++seq, tag);
}

/* An ephemeral port nothing listens on (bound, read back, released). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t len = sizeof sa;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

/* A backend that is not built must say so; the test then has nothing to do. */
static void require_built(const struct backend *b)
{
    if (ferry_meta_backend_built(b->scheme)) return;
    char conn[64];
    snprintf(conn, sizeof conn, "%s://127.0.0.1:1", b->scheme);
    ferry_meta_t m;
    assert_int_equal(ferry_meta_open(conn, 500, &m), FERRY_ERR_NOT_IMPLEMENTED);
    assert_detail_contains("not built");
    fprintf(stderr, "%s backend not built into this library: checked NOT_IMPLEMENTED only\n",
            b->scheme);
    skip();
}

/* The shared server's address, or a failure that says how to get one. */
static const char *service_addr(const struct backend *b)
{
    const char *addr = getenv(b->env);
    if (addr && *addr) return addr;
    const char *allow = getenv("FERRY_TEST_ALLOW_SKIP_SERVICES");
    if (allow && strcmp(allow, "1") == 0) {
        fprintf(stderr, "%s unset: skipped (FERRY_TEST_ALLOW_SKIP_SERVICES=1)\n", b->env);
        skip();
    }
    fail_msg("%s is not set. Start the test servers with `scripts/services.sh start DIR` and "
             "run with `set -a; . DIR/services.env; set +a` (or set "
             "FERRY_TEST_ALLOW_SKIP_SERVICES=1 to skip these tests).",
             b->env);
    return NULL;
}

/* A peer's record as etcd or Redis returns it: every field range-checked.
 * Before, jansson's "i" read a port of 2^32 + 7000 as 7000 (and a
 * protocol of 2^32 + 3 as 3), and a non-hex epoch as 0. */
static void directory_records_range_checked(void **state)
{
    (void)state;
    ferry_directory_entry_t en;
    const char *good = "{\"name\":\"h:7000\",\"host\":\"10.0.0.7\",\"port\":7000,\"epoch\":\"3f2a\","
                       "\"engine_id\":\"1\",\"protocol\":3,\"pid\":1}";
    assert_int_equal(ferry_directory_parse_entry("h:7000", good, &en), 0);
    assert_string_equal(en.host, "10.0.0.7");
    assert_int_equal(en.port, 7000);
    assert_int_equal(en.epoch, 0x3f2a);
    assert_int_equal(en.protocol, 3);
    const char *bad[] = {
        "{\"host\":\"10.0.0.7\",\"port\":4294974296,\"epoch\":\"3f2a\",\"protocol\":3}", /* 2^32 + 7000 */
        "{\"host\":\"10.0.0.7\",\"port\":-58536,\"epoch\":\"3f2a\",\"protocol\":3}",
        "{\"host\":\"10.0.0.7\",\"port\":65536,\"epoch\":\"3f2a\",\"protocol\":3}",
        "{\"host\":\"10.0.0.7\",\"port\":0,\"epoch\":\"3f2a\",\"protocol\":3}",
        "{\"host\":\"10.0.0.7\",\"port\":\"7000\",\"epoch\":\"3f2a\",\"protocol\":3}",
        "{\"host\":\"10.0.0.7\",\"port\":7000,\"epoch\":\"3f2a\",\"protocol\":4294967299}", /* 2^32 + 3 */
        "{\"host\":\"10.0.0.7\",\"port\":7000,\"epoch\":\"3f2a\",\"protocol\":0}",
        "{\"host\":\"10.0.0.7\",\"port\":7000,\"epoch\":\"zz\",\"protocol\":3}",
        "{\"host\":\"10.0.0.7\",\"port\":7000,\"epoch\":\"\",\"protocol\":3}",
        "{\"host\":\"10.0.0.7\",\"port\":7000,\"epoch\":\"3f2a3f2a3f2a3f2a1\",\"protocol\":3}",
        "{\"host\":\"10.0.0.7\",\"port\":7000,\"protocol\":3}",
        "not json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&en, 0, sizeof en);
        int rc = ferry_directory_parse_entry("h:7000", bad[i], &en);
        if (rc != FERRY_ERR_METADATA) fail_msg("record %zu accepted (port %u): %s", i, en.port, bad[i]);
        assert_non_null(strstr(ferry_last_error_detail(), "not a Ferry descriptor"));
    }
}

static void open_at(const struct backend *b, const char *addr, int timeout_ms, ferry_meta_t *m)
{
    char conn[300];
    snprintf(conn, sizeof conn, "%s://%s", b->scheme, addr);
    int rc = ferry_meta_open(conn, timeout_ms, m);
    if (rc) fail_msg("open %s: %s", conn, ferry_last_error_detail());
}

static void open_service(const struct backend *b, ferry_meta_t *m)
{
    require_built(b);
    open_at(b, service_addr(b), 2000, m);
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
        fail_msg("lookup %s: want NOT_FOUND, got %d (%s) value %s", key, rc,
                 ferry_last_error_detail(), got ? got : "(null)");
    assert_null(got);
}

/* Polls until key is gone; its age in ms then, or -1 after max_ms. */
static int wait_gone(ferry_meta_t *m, const char *key, int max_ms)
{
    uint64_t t0 = harness_now_ms();
    while (harness_now_ms() - t0 < (uint64_t)max_ms) {
        char *got = NULL;
        int rc = m->ops->lookup(m->state, key, &got);
        free(got);
        if (rc == FERRY_ERR_NOT_FOUND) return (int)(harness_now_ms() - t0);
        assert_int_equal(rc, 0);
        sleep_ms(100);
    }
    return -1;
}

/* Polls until key holds want; 1 found, 0 not within max_ms. */
static int wait_value(ferry_meta_t *m, const char *key, const char *want, int max_ms)
{
    uint64_t t0 = harness_now_ms();
    while (harness_now_ms() - t0 < (uint64_t)max_ms) {
        char *got = NULL;
        int rc = m->ops->lookup(m->state, key, &got);
        int ok = rc == 0 && strcmp(got, want) == 0;
        free(got);
        if (ok) return 1;
        sleep_ms(100);
    }
    return 0;
}

/* --------------------------------------------------------------- parsing */

static void expect_parse(const char *conn, const char *scheme, const char *addr)
{
    char s[16], a[256];
    int rc = ferry_meta_parse(conn, s, sizeof s, a, sizeof a);
    if (rc) fail_msg("parse '%s': %s", conn ? conn : "(null)", ferry_last_error_detail());
    assert_string_equal(s, scheme);
    assert_string_equal(a, addr);
}

static void expect_bad(const char *conn, const char *needle)
{
    char s[16], a[256];
    int rc = ferry_meta_parse(conn, s, sizeof s, a, sizeof a);
    if (rc != FERRY_ERR_INVALID_ARGUMENT) fail_msg("parse '%s' gave %d, not INVALID_ARGUMENT", conn, rc);
    assert_detail_contains(conn);
    assert_detail_contains(needle);
    ferry_meta_t m;
    assert_int_equal(ferry_meta_open(conn, 100, &m), FERRY_ERR_INVALID_ARGUMENT);
    assert_null(m.ops);
}

static void parse_good_strings(void **state)
{
    (void)state;
    expect_parse(NULL, "p2p", "");
    expect_parse("", "p2p", "");
    expect_parse("p2p", "p2p", "");
    expect_parse("P2P", "p2p", "");
    expect_parse("P2PHANDSHAKE", "p2p", "");
    expect_parse("etcd://127.0.0.1:2379", "etcd", "127.0.0.1:2379");
    expect_parse("ETCD://meta.local:1", "etcd", "meta.local:1");
    expect_parse("redis://localhost:6379", "redis", "localhost:6379");
    expect_parse("redis://[::1]:65535", "redis", "[::1]:65535");
    expect_parse("http://127.0.0.1:8080/metadata", "http", "127.0.0.1:8080/metadata");
    expect_parse("HTTP://meta.local:1", "http", "meta.local:1/metadata"); /* Mooncake's path */
    expect_parse("http://h:1/", "http", "h:1/metadata");
    expect_parse("http://[::1]:80/a/b-c_d.e~f", "http", "[::1]:80/a/b-c_d.e~f");
}

static void parse_bad_strings(void **state)
{
    (void)state;
    expect_bad("zk://h:1", "unknown scheme");
    expect_bad("https://h:1/metadata", "unknown scheme");
    expect_bad("p2p://h:1", "unknown scheme");
    expect_bad("127.0.0.1:2379", "no scheme");
    expect_bad("etcd", "no scheme");
    expect_bad("://h:1", "bad scheme");
    expect_bad("etcd://", "no host:port");
    expect_bad("etcd://host", "not host:port");
    expect_bad("etcd://:2379", "not host:port");
    expect_bad("etcd://a:b:1", "not host:port");
    expect_bad("etcd://host:", "port");
    expect_bad("etcd://host:0", "1..65535");
    expect_bad("etcd://host:65536", "1..65535");
    expect_bad("etcd://host:123456", "bad port");
    expect_bad("redis://host:12a", "bad port");
    expect_bad("redis://host:1/db", "unexpected '/'");
    expect_bad("redis://user@host:1", "unexpected '@'");
    expect_bad("redis://[::1:1", "bracketed");
    expect_bad("http://", "no host:port");
    expect_bad("http:///metadata", "no host:port");
    expect_bad("http://h/metadata", "not host:port");
    expect_bad("http://h:0/metadata", "1..65535");
    expect_bad("http://h:1/a b", "unexpected ' '");
    expect_bad("http://h:1/metadata?key=x", "unexpected '?'");
    expect_bad("http://h:1/m#x", "unexpected '#'");
    expect_bad("http://u@h:1/m", "unexpected '@'");
    if (ferry_meta_backend_built("http")) { /* libcurl's URL parser splits http:// strings */
        expect_bad("http://[zz]:80/m", "IPv6");  /* the hand split took any bracketed host */
        expect_bad("http://h:99999999999999999999/m", "bad port");
        expect_parse("http://h:01/m", "http", "h:1/m"); /* the port read whole, as a number */
    }
}

static void open_reports_unbuilt_or_unknown(void **state)
{
    (void)state;
    ferry_meta_t m;
    assert_int_equal(ferry_meta_open("consul://h:1", 100, &m), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_meta_open("etcd://h:1", 100, NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_true(ferry_meta_backend_built("p2p"));
    assert_false(ferry_meta_backend_built("consul"));
    assert_false(ferry_meta_backend_built(NULL));
    const char *conns[] = {"etcd://127.0.0.1:1", "redis://127.0.0.1:1", "http://127.0.0.1:1/metadata"};
    const char *schemes[] = {"etcd", "redis", "http"};
    for (int i = 0; i < 3; i++) {
        if (ferry_meta_backend_built(schemes[i])) continue;
        assert_int_equal(ferry_meta_open(conns[i], 100, &m), FERRY_ERR_NOT_IMPLEMENTED);
        assert_detail_contains(schemes[i]);
    }
    ferry_meta_close(NULL);
    ferry_meta_t zero = {0};
    ferry_meta_close(&zero);
}

/* ------------------------------------------------------------------- p2p */

static void p2p_stores_nothing(void **state)
{
    (void)state;
    ferry_meta_t m;
    assert_int_equal(ferry_meta_open(NULL, 0, &m), 0);
    assert_string_equal(m.ops->scheme, "p2p");
    const char *key = FERRY_META_KEY_PREFIX "p2p";
    assert_int_equal(m.ops->publish(m.state, key, "{}", 5), 0);
    assert_int_equal(m.ops->keepalive(m.state), 0);
    check_missing(&m, key);
    assert_detail_contains("handshake directly");
    assert_int_equal(m.ops->remove(m.state, key), 0);
    struct ferry_meta_publisher *p = NULL;
    assert_int_equal(ferry_meta_publisher_start(&m, key, "{}", 3, &p), 0);
    assert_int_equal(ferry_meta_publisher_stop(p), 0);
    ferry_meta_close(&m);
    assert_null(m.ops);
}

static void publisher_bad_arguments(void **state)
{
    (void)state;
    ferry_meta_t m;
    assert_int_equal(ferry_meta_open("p2p", 0, &m), 0);
    struct ferry_meta_publisher *p = (void *)1;
    assert_int_equal(ferry_meta_publisher_start(&m, "k", "v", 0, &p), FERRY_ERR_INVALID_ARGUMENT);
    assert_null(p);
    assert_detail_contains("ttl");
    assert_int_equal(ferry_meta_publisher_start(&m, "", "v", 3, &p), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_meta_publisher_start(&m, "k", NULL, 3, &p), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_meta_publisher_start(NULL, "k", "v", 3, &p), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_meta_publisher_stop(NULL), 0);
    ferry_meta_close(&m);
}

/* ------------------------------------------------- against shared servers */

static void round_trip(void **state)
{
    const struct backend *b = *state;
    ferry_meta_t m;
    open_service(b, &m);
    char key[200];
    make_key(key, sizeof key, "rt");
    /* A descriptor is JSON: quotes, braces, non-ASCII must survive. */
    const char *value = "{\"addr\":\"127.0.0.1:7001\",\"epoch\":42,\"name\":\"gr\xc3\xbc\xc3\x9f\"}";
    assert_int_equal(m.ops->publish(m.state, key, value, 0), 0);
    check_value(&m, key, value);
    assert_int_equal(m.ops->publish(m.state, key, "", 0), 0); /* empty value */
    check_value(&m, key, "");
    /* Every length mod 3: etcd's base64 with no, one and two '=' of padding. */
    const char *lengths[] = {"a", "ab", "abc", "abcd", "abcde", "abcdef"};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
        assert_int_equal(m.ops->publish(m.state, key, lengths[i], 0), 0);
        check_value(&m, key, lengths[i]);
    }
    assert_int_equal(m.ops->remove(m.state, key), 0);
    ferry_meta_close(&m);
}

static void overwrite(void **state)
{
    const struct backend *b = *state;
    ferry_meta_t m;
    open_service(b, &m);
    char key[200];
    make_key(key, sizeof key, "ow");
    assert_int_equal(m.ops->publish(m.state, key, "first", 0), 0);
    assert_int_equal(m.ops->publish(m.state, key, "second, longer", 30), 0);
    check_value(&m, key, "second, longer");
    assert_int_equal(m.ops->publish(m.state, key, "3", 0), 0);
    check_value(&m, key, "3");
    assert_int_equal(m.ops->remove(m.state, key), 0);
    ferry_meta_close(&m);
}

static void remove_then_missing(void **state)
{
    const struct backend *b = *state;
    ferry_meta_t m, other;
    open_service(b, &m);
    open_service(b, &other); /* another engine sees the removal */
    char key[200];
    make_key(key, sizeof key, "rm");
    assert_int_equal(m.ops->publish(m.state, key, "v", 30), 0);
    check_value(&other, key, "v");
    assert_int_equal(m.ops->remove(m.state, key), 0);
    check_missing(&other, key);
    assert_int_equal(m.ops->remove(m.state, key), 0); /* missing: not an error */
    assert_int_equal(m.ops->keepalive(m.state), 0);   /* removed: not kept alive */
    ferry_meta_close(&other);
    ferry_meta_close(&m);
}

static void lookup_missing(void **state)
{
    const struct backend *b = *state;
    ferry_meta_t m;
    open_service(b, &m);
    char key[200];
    make_key(key, sizeof key, "never-published");
    check_missing(&m, key);
    assert_detail_contains(key);
    assert_detail_contains(service_addr(b));
    ferry_meta_close(&m);
}

/* Peer death: an entry whose lease nobody refreshes expires. etcd rounds
 * TTLs up to its minimum (about 2 s with default timing), hence ttl 2. */
static void ttl_expires_without_keepalive(void **state)
{
    const struct backend *b = *state;
    ferry_meta_t m, other;
    open_service(b, &m);
    open_service(b, &other);
    char key[200];
    make_key(key, sizeof key, "ttl");
    assert_int_equal(m.ops->publish(m.state, key, "short-lived", 2), 0);
    check_value(&other, key, "short-lived");
    int gone_ms = wait_gone(&other, key, 8000);
    if (gone_ms < 0) fail_msg("%s: entry with ttl 2 s still there after 8 s", b->scheme);
    assert_true(gone_ms >= 1000); /* not removed early */
    /* Its owner is told on the next keepalive, so that it can re-publish. */
    assert_int_equal(m.ops->keepalive(m.state), FERRY_ERR_NOT_FOUND);
    assert_detail_contains(key);
    assert_int_equal(m.ops->keepalive(m.state), 0); /* reported once */
    ferry_meta_close(&other);
    ferry_meta_close(&m);
}

static void publisher_keeps_alive_and_removes(void **state)
{
    const struct backend *b = *state;
    ferry_meta_t m, other;
    open_service(b, &m);
    open_service(b, &other);
    char key[200];
    make_key(key, sizeof key, "pub");
    struct ferry_meta_publisher *p = NULL;
    assert_int_equal(ferry_meta_publisher_start(&m, key, "alive", 2, &p), 0);
    /* Well past the TTL: only the refreshes keep it. */
    for (int i = 0; i < 10; i++) {
        sleep_ms(500);
        check_value(&other, key, "alive");
    }
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_meta_publisher_stop(p), 0);
    uint64_t stop_ms = harness_now_ms() - t0;
    if (stop_ms > 500) fail_msg("publisher_stop took %llu ms", (unsigned long long)stop_ms);
    check_missing(&other, key);
    ferry_meta_close(&other);
    ferry_meta_close(&m);
}

/* Nothing listens at the port: fails at once, naming the address. */
static void down_at_start(void **state)
{
    const struct backend *b = *state;
    require_built(b);
    char addr[64], conn[100];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    snprintf(conn, sizeof conn, "%s://%s", b->scheme, addr);
    ferry_meta_t m;
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_meta_open(conn, 2000, &m), FERRY_ERR_METADATA);
    uint64_t ms = harness_now_ms() - t0;
    assert_detail_contains(addr);
    assert_detail_contains(b->scheme);
    if (ms > 1000) fail_msg("open of %s took %llu ms", conn, (unsigned long long)ms);
    assert_null(m.ops);
}

/* Something accepts connections but never answers: the timeout holds. */
static void hung_server_times_out(void **state)
{
    const struct backend *b = *state;
    require_built(b);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 8), 0); /* the kernel completes connects; no one reads */
    socklen_t len = sizeof sa;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    char addr[64], conn[100];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    snprintf(conn, sizeof conn, "%s://%s", b->scheme, addr);
    ferry_meta_t m;
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_meta_open(conn, 300, &m), FERRY_ERR_METADATA);
    uint64_t ms = harness_now_ms() - t0;
    close(fd);
    assert_detail_contains(addr);
    if (ms < 250 || ms > 1500)
        fail_msg("open of hung %s took %llu ms with a 300 ms timeout", conn, (unsigned long long)ms);
}

/* ----------------------------------------------- private server, outages */

struct server {
    const struct backend *b;
    pid_t pid;
    int port, peer_port;
    char dir[64]; /* etcd data, logs */
    char addr[64];
};

static void server_spawn(struct server *s)
{
    char port[16], peer[16], data[128], curl[80], purl[80], cluster[120], log[128];
    snprintf(port, sizeof port, "%d", s->port);
    snprintf(peer, sizeof peer, "%d", s->peer_port);
    snprintf(data, sizeof data, "%s/data", s->dir);
    snprintf(curl, sizeof curl, "http://127.0.0.1:%d", s->port);
    snprintf(purl, sizeof purl, "http://127.0.0.1:%d", s->peer_port);
    snprintf(cluster, sizeof cluster, "t=%s", purl);
    snprintf(log, sizeof log, "%s/server.log", s->dir);
    char *redis_argv[] = {"redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "",
                          "--appendonly", "no", "--dir", s->dir, NULL};
    char *etcd_argv[] = {"etcd", "--name", "t", "--data-dir", data, "--listen-client-urls", curl,
                         "--advertise-client-urls", curl, "--listen-peer-urls", purl,
                         "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
                         NULL};
    char **argv = strcmp(s->b->scheme, "redis") == 0 ? redis_argv : etcd_argv;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rc = posix_spawnp(&s->pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) fail_msg("cannot start %s: %s (run scripts/deps.sh)", argv[0], strerror(rc));
}

/* Starts the server and waits until it answers (bounded). */
static void server_start(struct server *s)
{
    server_spawn(s);
    uint64_t t0 = harness_now_ms();
    while (harness_now_ms() - t0 < 15000) {
        ferry_meta_t m;
        char conn[100];
        snprintf(conn, sizeof conn, "%s://%s", s->b->scheme, s->addr);
        if (ferry_meta_open(conn, 300, &m) == 0) {
            ferry_meta_close(&m);
            return;
        }
        if (waitpid(s->pid, NULL, WNOHANG) == s->pid)
            fail_msg("private %s on %s exited at start-up; see %s/server.log", s->b->scheme,
                     s->addr, s->dir);
        sleep_ms(100);
    }
    fail_msg("private %s on %s not answering after 15 s; see %s/server.log", s->b->scheme,
             s->addr, s->dir);
}

/* Kills the server the hard way (a crash, not a shutdown) and, for etcd,
 * wipes its data: the restarted server has lost every entry and lease. */
static void server_kill(struct server *s)
{
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s/data", s->dir);
    assert_int_equal(system(cmd), 0);
}

static void server_init(struct server *s, const struct backend *b)
{
    memset(s, 0, sizeof *s);
    s->b = b;
    s->port = free_port();
    s->peer_port = free_port();
    snprintf(s->dir, sizeof s->dir, "/tmp/ferry-test-meta-XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%d", s->port);
}

static void server_cleanup(struct server *s)
{
    if (s->pid) server_kill(s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s->dir);
    assert_int_equal(system(cmd), 0);
}

/* Calls while the server is down fail with METADATA, quickly: a lookup from
 * other, and a keepalive from m (which holds the publisher's lease). */
static void expect_down(ferry_meta_t *m, ferry_meta_t *other, const char *key,
                        const struct server *s)
{
    char *got = NULL;
    uint64_t t0 = harness_now_ms();
    int rc = other->ops->lookup(other->state, key, &got);
    uint64_t ms = harness_now_ms() - t0;
    if (rc != FERRY_ERR_METADATA)
        fail_msg("lookup with %s down: got %d (%s)", s->b->scheme, rc, ferry_last_error_detail());
    assert_detail_contains(s->addr);
    assert_true(ms < 1500);
    t0 = harness_now_ms();
    assert_int_equal(other->ops->publish(other->state, key, "x", 2), FERRY_ERR_METADATA);
    assert_int_equal(m->ops->keepalive(m->state), FERRY_ERR_METADATA);
    assert_detail_contains(s->addr);
    assert_true(harness_now_ms() - t0 < 3000);
}

/* What an outage test holds, released by its teardown even when it fails
 * half-way (a publisher thread must not outlive the metas it uses). */
static struct outage {
    struct server s;
    ferry_meta_t m, other;
    struct ferry_meta_publisher *p;
} outage;

static int outage_teardown(void **state)
{
    (void)state;
    ferry_meta_publisher_stop(outage.p);
    ferry_meta_close(&outage.other);
    ferry_meta_close(&outage.m);
    if (outage.s.dir[0]) server_cleanup(&outage.s);
    memset(&outage, 0, sizeof outage);
    return 0;
}

static void outage_and_republish(void **state)
{
    const struct backend *b = *state;
    require_built(b);
    struct outage *o = &outage;
    server_init(&o->s, b);
    server_start(&o->s);
    open_at(b, o->s.addr, 500, &o->m);
    open_at(b, o->s.addr, 500, &o->other);
    char key[200];
    make_key(key, sizeof key, "outage");
    assert_int_equal(ferry_meta_publisher_start(&o->m, key, "survivor", 2, &o->p), 0);
    check_value(&o->other, key, "survivor");

    server_kill(&o->s);
    expect_down(&o->m, &o->other, key, &o->s);
    sleep_ms(1500); /* the publisher fails a few refreshes meanwhile */

    /* Back, empty: the publisher notices and publishes again. */
    server_start(&o->s);
    if (!wait_value(&o->other, key, "survivor", 5000))
        fail_msg("%s: publisher did not re-publish within 5 s of the restart", b->scheme);

    /* Frozen (alive, connections open, nothing answered): calls time out. */
    harness_stop_process(o->s.pid);
    char *got = NULL;
    uint64_t t_freeze = harness_now_ms();
    int rc = o->other.ops->lookup(o->other.state, key, &got);
    uint64_t freeze_ms = harness_now_ms() - t_freeze;
    kill(o->s.pid, SIGCONT);
    if (rc != FERRY_ERR_METADATA || freeze_ms > 1500)
        fail_msg("lookup on frozen %s: rc %d after %llu ms (%s)", b->scheme, rc,
                 (unsigned long long)freeze_ms, ferry_last_error_detail());
    assert_detail_contains(o->s.addr);
    assert_true(wait_value(&o->other, key, "survivor", 3000)); /* and recover */

    /* Down again: stop does not hang, it reports the failed removal. */
    server_kill(&o->s);
    uint64_t t0 = harness_now_ms();
    struct ferry_meta_publisher *p = o->p;
    o->p = NULL;
    assert_int_equal(ferry_meta_publisher_stop(p), FERRY_ERR_METADATA);
    assert_true(harness_now_ms() - t0 < 2500);
}

/* Named "<backend>/<test>" so that the two runs tell apart. */
#define BT(b, f, teardown) {#b "/" #f, f, NULL, teardown, &b##_backend}
#define BACKEND_TESTS(b)                                    \
    BT(b, round_trip, NULL),                                \
    BT(b, overwrite, NULL),                                 \
    BT(b, remove_then_missing, NULL),                       \
    BT(b, lookup_missing, NULL),                            \
    BT(b, ttl_expires_without_keepalive, NULL),             \
    BT(b, publisher_keeps_alive_and_removes, NULL),         \
    BT(b, down_at_start, NULL),                             \
    BT(b, hung_server_times_out, NULL),                     \
    BT(b, outage_and_republish, outage_teardown)

int main(void)
{
    /* SIGPIPE keeps its default action on purpose: a backend writing to a
     * killed server must not let it kill the process. */
#if defined(__aarch64__)
    setenv("ETCD_UNSUPPORTED_ARCH", "arm64", 0); /* for the private etcd */
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_good_strings),
        cmocka_unit_test(directory_records_range_checked),
        cmocka_unit_test(parse_bad_strings),
        cmocka_unit_test(open_reports_unbuilt_or_unknown),
        cmocka_unit_test(p2p_stores_nothing),
        cmocka_unit_test(publisher_bad_arguments),
        BACKEND_TESTS(etcd),
        BACKEND_TESTS(redis),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
