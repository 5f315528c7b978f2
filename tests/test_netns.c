/* SPDX-License-Identifier: Apache-2.0 */
/* Two network namespaces joined by a veth pair, the target engine in one
 * (a child process), the initiator in the other (this process), and the link
 * made bad: random loss (nftables numgen drop), a rate limit (tc tbf), a
 * blackhole in the middle of a transfer, and latency (a delay proxy of our
 * own; netem is not in this kernel). Transfers complete and verify, or fail
 * with TIMEOUT by their deadline; none hangs. Needs root; skipped without.
 * The namespaces are removed in teardown, at exit, and (for a run that was
 * killed) at the next run's start. */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"
#include "harness.h"

/* How long a fence of bytes in flight may wait for the target (cancel.h). */
#define CANCEL_MS 500
#define A_IP "10.201.0.1"
#define B_IP "10.201.0.2"

static char ns_a[32], ns_b[32], veth_a[16], veth_b[16];
static int home_ns = -1;
static bool available;

typedef struct world {
    peer_proc_t peer;
    ferry_engine_t *e;
    unsigned char *buf;
    size_t len;
} world_t;

static void remove_namespaces(void)
{
    if (!ns_a[0]) return;
    run_cmd("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", ns_a, ns_b);
}

static void on_signal(int sig)
{
    remove_namespaces();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0) return 0;
    /* Left over by a run that was killed: their owner pid is gone. */
    run_cmd("for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^fyt[0-9]*[ab]$'); do "
            "p=${n#fyt}; p=${p%%[ab]}; kill -0 $p 2>/dev/null || ip netns del $n; done");
    int pid = (int)getpid() % 10000000;
    snprintf(ns_a, sizeof ns_a, "fyt%da", pid);
    snprintf(ns_b, sizeof ns_b, "fyt%db", pid);
    snprintf(veth_a, sizeof veth_a, "fy%da", pid);
    snprintf(veth_b, sizeof veth_b, "fy%db", pid);
    atexit(remove_namespaces);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGABRT, on_signal);
    signal(SIGSEGV, on_signal);
    int rc = run_cmd("set -e; ip netns add %s; ip netns add %s; "
                     "ip link add %s type veth peer name %s; "
                     "ip link set %s netns %s; ip link set %s netns %s; "
                     "ip -n %s addr add " A_IP "/24 dev %s; ip -n %s addr add " B_IP "/24 dev %s; "
                     "ip -n %s link set %s up; ip -n %s link set %s up; "
                     "ip -n %s link set lo up; ip -n %s link set lo up",
                     ns_a, ns_b, veth_a, veth_b, veth_a, ns_a, veth_b, ns_b, ns_a, veth_a, ns_b, veth_b, ns_a, veth_a,
                     ns_b, veth_b, ns_a, ns_b);
    char path[64];
    snprintf(path, sizeof path, "/var/run/netns/%s", ns_a);
    int fd = rc == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    home_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    /* This thread (and every thread it starts: the engine's) lives in A. */
    if (fd >= 0 && home_ns >= 0 && setns(fd, CLONE_NEWNET) == 0) available = true;
    if (fd >= 0) close(fd);
    if (!available) {
        fprintf(stderr, "test_netns: network namespaces unavailable; skipping\n");
        remove_namespaces();
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (home_ns >= 0) {
        setns(home_ns, CLONE_NEWNET);
        close(home_ns);
    }
    remove_namespaces();
    return 0;
}

static int setup(void **state)
{
    if (!available) return 0;
    world_t *w = calloc(1, sizeof *w);
    const char *args[] = {"--host", B_IP, "--len", "16777216", "--timeout", "10000", NULL};
    assert_int_equal(peer_spawn(&w->peer, ns_b, B_IP, args), 0);
    w->len = w->peer.len;
    w->buf = malloc(w->len);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world_t *w = *state;
    if (!w || !available) return 0;
    if (w->e) ferry_engine_destroy(w->e);
    peer_end(&w->peer, SIGKILL);
    free(w->buf);
    free(w);
    /* Faults off for the next test. */
    run_cmd("ip netns exec %s nft delete table inet fyt 2>/dev/null; "
            "tc -n %s qdisc del dev %s root 2>/dev/null; true",
            ns_b, ns_a, veth_a);
    return 0;
}

static void start_initiator(world_t *w, int timeout_ms, int retries)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.host = A_IP;
    cfg.timeout_ms = timeout_ms;
    cfg.connect_timeout_ms = timeout_ms < 3000 ? timeout_ms : 3000;
    cfg.retries = retries;
    cfg.checksum = 1;
    cfg.cancel_timeout_ms = CANCEL_MS;
    assert_int_equal(ferry_engine_create(&cfg, &w->e), 0);
    assert_int_equal(ferry_register(w->e, w->buf, w->len, 0), 0);
}

/* nftables in B: drop pct percent of packets both ways (100: all). */
static int drop_percent(int pct)
{
    char rule[64];
    if (pct >= 100)
        snprintf(rule, sizeof rule, "drop");
    else
        snprintf(rule, sizeof rule, "numgen random mod 100 < %d drop", pct);
    return run_cmd("ip netns exec %s nft -f - <<'EOF'\n"
                   "table inet fyt {\n"
                   "  chain in { type filter hook input priority 0; %s; }\n"
                   "  chain out { type filter hook output priority 0; %s; }\n"
                   "}\nEOF",
                   ns_b, rule, rule);
}

static void undrop(void) { run_cmd("ip netns exec %s nft delete table inet fyt", ns_b); }

/* One verified write and read of len bytes at off; 0 or the failure code. */
static int round_trip(world_t *w, const char *peer, size_t off, size_t len, uint64_t seed)
{
    harness_fill(w->buf + off, len, seed);
    int rc = ferry_transfer_sync(w->e, peer, FERRY_OP_WRITE, w->buf + off, w->peer.addr + off, len);
    if (rc) return rc;
    if (peer_cmd(&w->peer, "check %llu %zu %zu", (unsigned long long)seed, off, len) != 0) return FERRY_ERR_INTERNAL;
    memset(w->buf + off, 0, len);
    rc = ferry_transfer_sync(w->e, peer, FERRY_OP_READ, w->buf + off, w->peer.addr + off, len);
    if (rc) return rc;
    return harness_check(w->buf + off, len, seed) ? 0 : FERRY_ERR_INTERNAL;
}

static void lossy_link(void **state)
{
    if (!available) skip();
    world_t *w = *state;
    const int timeout_ms = 15000;
    start_initiator(w, timeout_ms, 2);
    assert_int_equal(round_trip(w, w->peer.name, 0, 4096, 1), 0);
    assert_int_equal(drop_percent(10), 0);
    int ok = 0, timeouts = 0;
    uint64_t t0 = harness_now_ms();
    for (int i = 0; i < 16; i++) {
        uint64_t s = harness_now_ms();
        int rc = round_trip(w, w->peer.name, (size_t)i * (256u << 10), 256u << 10, 100 + (uint64_t)i);
        uint64_t took = harness_now_ms() - s;
        /* Each call ends by its deadline (two calls per round trip). */
        assert_true(took <= 2 * (uint64_t)timeout_ms + 2000);
        if (rc == 0) ok++;
        else if (rc == FERRY_ERR_TIMEOUT) timeouts++;
        else {
            fprintf(stderr, "lossy link: %s\n", ferry_last_error_detail());
            fail(); /* never corrupt (INTERNAL here), never anything but TIMEOUT */
        }
    }
    fprintf(stderr, "10%% loss: %d of 16 round trips of 256 KiB verified, %d timed out, %llu ms\n", ok, timeouts,
            (unsigned long long)(harness_now_ms() - t0));
    assert_true(ok >= 8); /* TCP carries 10% loss: most must get through */
}

static void rate_limited_link(void **state)
{
    if (!available) skip();
    world_t *w = *state;
    start_initiator(w, 15000, 1);
    assert_int_equal(run_cmd("tc -n %s qdisc add dev %s root tbf rate 40mbit burst 32kbit latency 400ms", ns_a, veth_a),
                     0);
    uint64_t t0 = harness_now_ms();
    assert_int_equal(round_trip(w, w->peer.name, 0, 4u << 20, 7), 0);
    uint64_t took = harness_now_ms() - t0;
    fprintf(stderr, "tbf 40mbit: 4 MiB written and read back in %llu ms\n", (unsigned long long)took);
    assert_true(took >= 500); /* the limit really applied (4 MiB at 5 MB/s) */
}

struct bg {
    world_t *w;
    size_t len;
    int rc;
    uint64_t ended;
};

static void *bg_write(void *arg)
{
    struct bg *b = arg;
    b->rc = ferry_transfer_sync(b->w->e, b->w->peer.name, FERRY_OP_WRITE, b->w->buf, b->w->peer.addr, b->len);
    b->ended = harness_now_ms();
    return NULL;
}

static void blackhole_mid_transfer(void **state)
{
    if (!available) skip();
    world_t *w = *state;
    const int timeout_ms = 2500;
    start_initiator(w, timeout_ms, 1);
    assert_int_equal(run_cmd("tc -n %s qdisc add dev %s root tbf rate 20mbit burst 32kbit latency 400ms", ns_a, veth_a),
                     0);
    assert_int_equal(round_trip(w, w->peer.name, 0, 4096, 1), 0);
    harness_fill(w->buf, w->len, 9);
    struct bg b = {.w = w, .len = 8u << 20};
    uint64_t t0 = harness_now_ms();
    pthread_t t;
    pthread_create(&t, NULL, bg_write, &b);
    usleep(400 * 1000);
    int drc = drop_percent(100); /* the peer vanishes: no FIN, no RST, nothing */
    pthread_join(t, NULL);
    assert_int_equal(drc, 0);
    uint64_t took = b.ended - t0;
    fprintf(stderr, "blackhole: 8 MiB write ended %s after %llu ms (deadline %d)\n", ferry_error_name(b.rc),
            (unsigned long long)took, timeout_ms);
    /* Bytes were in flight and the vanished target cannot confirm the
     * fence: CANCEL_UNCONFIRMED, cancel_timeout_ms after the deadline. */
    assert_true(b.rc == FERRY_ERR_TIMEOUT || b.rc == FERRY_ERR_CANCEL_UNCONFIRMED);
    assert_true(took <= (uint64_t)timeout_ms + CANCEL_MS + 1000);
    /* New calls fail by their deadline too, while the hole lasts. */
    t0 = harness_now_ms();
    int rc = ferry_transfer_sync(w->e, w->peer.name, FERRY_OP_READ, w->buf, w->peer.addr, 4096);
    assert_true(rc == FERRY_ERR_TIMEOUT || rc == FERRY_ERR_CANCEL_UNCONFIRMED);
    assert_true(harness_now_ms() - t0 <= (uint64_t)timeout_ms + CANCEL_MS + 1000);
    /* Once the link is back, the session reconnects and the data verifies. */
    undrop();
    rc = round_trip(w, w->peer.name, 0, 1u << 20, 10);
    if (rc) fprintf(stderr, "after the blackhole: %s\n", ferry_last_error_detail());
    assert_int_equal(rc, 0);
}

/* A link that dies while connections sit idle: TCP keepalive finds it on
 * both sides, so the target closes its served connection and the initiator never
 * sends a request into the dead connection. */
static void idle_link_death_found_by_keepalive(void **state)
{
    if (!available) skip();
    world_t *w = *state;
    peer_end(&w->peer, SIGKILL);
    const char *args[] = {"--host", B_IP, "--len", "1048576", "--keepalive", "1000", NULL};
    assert_int_equal(peer_spawn(&w->peer, ns_b, B_IP, args), 0);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.host = A_IP;
    cfg.timeout_ms = 3000;
    cfg.keepalive_ms = 1000;
    cfg.conns_per_peer = 1;
    assert_int_equal(ferry_engine_create(&cfg, &w->e), 0);
    assert_int_equal(ferry_register(w->e, w->buf, w->len, 0), 0);
    long idle_sockets = peer_query(&w->peer, "sockets");
    assert_int_equal(round_trip(w, w->peer.name, 0, 4096, 30), 0);
    long serving = peer_query(&w->peer, "sockets");
    assert_int_equal(serving, idle_sockets + 1); /* one served connection */
    assert_int_equal(drop_percent(100), 0);
    /* 1 s idle + 3 probes 1 s apart: gone after about 4 s on both sides. */
    long now = serving;
    for (int i = 0; i < 100 && now > idle_sockets; i++) {
        usleep(100 * 1000);
        now = peer_query(&w->peer, "sockets");
    }
    assert_int_equal(now, idle_sockets);
    undrop();
    ferry_stats_t st;
    ferry_engine_stats(w->e, &st);
    uint64_t opened = st.connections_opened;
    uint64_t t0 = harness_now_ms();
    assert_int_equal(round_trip(w, w->peer.name, 0, 4096, 31), 0);
    ferry_engine_stats(w->e, &st);
    assert_int_equal(st.connections_opened, opened + 1); /* a fresh connection, */
    assert_int_equal(st.retries, 0);                      /* not a failed try on the dead one */
    assert_true(harness_now_ms() - t0 < 2000);
}

static void delayed_link(void **state)
{
    if (!available) skip();
    world_t *w = *state;
    proxy_t *px = proxy_start(B_IP, w->peer.port, &(proxy_opts_t){.delay_ms = 15});
    assert_non_null(px);
    start_initiator(w, 10000, 1);
    uint64_t t0 = harness_now_ms();
    assert_int_equal(round_trip(w, proxy_name(px), 0, 2u << 20, 20), 0);
    uint64_t took = harness_now_ms() - t0;
    fprintf(stderr, "delay proxy: 2 MiB written and read back in %llu ms\n", (unsigned long long)took);
    assert_true(took >= 100);
    ferry_engine_destroy(w->e);
    /* A deadline shorter than the link needs: TIMEOUT by the deadline. */
    start_initiator(w, 300, 0);
    t0 = harness_now_ms();
    harness_fill(w->buf, 8u << 20, 21);
    int rc = ferry_transfer_sync(w->e, proxy_name(px), FERRY_OP_WRITE, w->buf, w->peer.addr, 8u << 20);
    took = harness_now_ms() - t0;
    assert_int_equal(rc, FERRY_ERR_TIMEOUT);
    assert_true(took <= 300 + 1000);
    ferry_engine_destroy(w->e);
    w->e = NULL;
    proxy_stop(px);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(lossy_link, setup, teardown),
        cmocka_unit_test_setup_teardown(rate_limited_link, setup, teardown),
        cmocka_unit_test_setup_teardown(blackhole_mid_transfer, setup, teardown),
        cmocka_unit_test_setup_teardown(idle_link_death_found_by_keepalive, setup, teardown),
        cmocka_unit_test_setup_teardown(delayed_link, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
