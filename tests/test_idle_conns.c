/* SPDX-License-Identifier: Apache-2.0 */
/* 10,000 idle handshaken connections into one engine (issue 13, item 1):
 * the target serves them from its fixed set of serving threads (evloop.c),
 * so they cost no thread and no CPU; the engine still serves transfers with
 * them open. Their memory (RSS growth / N) is printed, never asserted (it
 * depends on the allocator and the sanitizer); docs/BENCHMARKS.md quotes it
 * from a Release build.
 *
 * The connections come from a child process forked before any thread, so
 * that the target's process holds only its own end of each; both raise
 * their descriptor limit to the hard limit, and the test skips when that is
 * too low for N.
 *
 * With every thread data frames may hold stalled in a write, handshakes,
 * PINGs and CANCELs are still answered at once, and the writes queued
 * behind them are served once a thread comes free. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/testing.h"
#include "serve/evloop.h"
#include "fault.h"
#include "harness.h"

enum { N = 10000, BUF = 1 << 20 };

/* Raises the soft descriptor limit to the hard one; whether it allows n. */
static bool fds_for(int n)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return false;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return false;
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (rlim_t)n;
}

static long rss_bytes(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    fclose(f);
    return resident < 0 ? -1 : resident * sysconf(_SC_PAGESIZE);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* The child: reads the port, opens n handshaken connections, reports how
 * many it made, and holds them until the parent closes its pipe. */
static void opener(int port_in, int done_out, int n)
{
    uint16_t port = 0;
    if (read(port_in, &port, sizeof port) != sizeof port) _exit(1);
    int made = 0;
    for (; made < n; made++)
        if (raw_handshaken(port) < 0) break;
    if (write(done_out, &made, sizeof made) != sizeof made) _exit(1);
    char c;
    while (read(port_in, &c, 1) > 0) {
    }
    _exit(0);
}

static int established(ferry_engine_t *t)
{
    ferry_test_conns_t n = ferry_test_conns(t);
    return n.handshaking == 0 ? n.established : -1;
}

static int write_round_trip(ferry_engine_t *ini, ferry_engine_t *tgt, unsigned char *src, unsigned char *dst,
                            uint64_t seed)
{
    harness_fill(src, BUF, seed);
    int rc = ferry_transfer_sync(ini, ferry_engine_name(tgt), FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, BUF);
    if (rc == 0 && !harness_check(dst, BUF, seed)) rc = -1000;
    return rc;
}

static void ten_thousand_idle_connections(void **state)
{
    (void)state;
    if (!fds_for(N + 512)) {
        fprintf(stderr, "skipped: RLIMIT_NOFILE's hard limit is below %d (ulimit -Hn)\n", N + 512);
        skip();
    }
    int to_child[2], from_child[2];
    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(from_child), 0);
    pid_t pid = fork(); /* before any thread of ours */
    assert_true(pid >= 0);
    if (pid == 0) {
        close(to_child[1]);
        close(from_child[0]);
        opener(to_child[0], from_child[1], N);
    }
    close(to_child[0]);
    close(from_child[1]);

    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 20000;
    cfg.connect_timeout_ms = 30000;
    cfg.max_connections = N + 64;
    cfg.max_connections_per_source = N + 64;
    ferry_engine_t *tgt = harness_engine_cfg(&cfg);
    cfg.max_connections = 0;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 20000;
    ferry_engine_t *ini = harness_engine_cfg(&cfg);
    unsigned char *src = malloc(BUF), *dst = calloc(1, BUF);
    assert_int_equal(ferry_register(ini, src, BUF, 0), 0);
    assert_int_equal(ferry_register(tgt, dst, BUF, FERRY_MEM_REMOTE), 0);
    assert_int_equal(write_round_trip(ini, tgt, src, dst, 1), 0);
    int threads = thread_count(), before = established(tgt);
    long rss0 = rss_bytes();

    uint16_t port = ferry_engine_port(tgt);
    assert_int_equal(write(to_child[1], &port, sizeof port), (ssize_t)sizeof port);
    int made = 0;
    uint64_t open0 = harness_now_ms();
    assert_int_equal(read(from_child[0], &made, sizeof made), (ssize_t)sizeof made);
    fprintf(stderr, "%d connections opened and handshaken one after another in %llu ms\n", made,
            (unsigned long long)(harness_now_ms() - open0));
    assert_int_equal(made, N);
    int n = -1;
    for (int i = 0; i < 3000 && (n = established(tgt)) < before + N; i++) usleep(10000);
    assert_int_equal(n, before + N); /* the initiator's own, plus N */
    long rss1 = rss_bytes();
    int threads_open = thread_count();
    fprintf(stderr, "%d idle connections: %d threads in the process (before: %d, target serving threads: %d), "
                    "RSS +%.1f MiB, %.0f bytes per idle connection\n",
            N, threads_open, threads, ferry_evloop_threads(tgt), (double)(rss1 - rss0) / (1 << 20),
            (double)(rss1 - rss0) / N);
    assert_int_equal(threads_open, threads);
    assert_true(threads_open <= 64);

    /* Idle: the loop sleeps (the listener looks once a second). */
    double cpu0 = cpu_seconds();
    uint64_t t0 = harness_now_ms();
    sleep(1);
    double cpu = (cpu_seconds() - cpu0) / ((double)(harness_now_ms() - t0) / 1000.0);
    fprintf(stderr, "idle CPU with %d connections open: %.2f%% of one core\n", N, cpu * 100);
    assert_true(cpu < 0.2);

    /* Still serving, on the pooled connections and on a fresh session. */
    assert_int_equal(write_round_trip(ini, tgt, src, dst, 2), 0);
    ferry_engine_destroy(ini);
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    ini = harness_engine_cfg(&cfg);
    assert_int_equal(ferry_register(ini, src, BUF, 0), 0);
    assert_int_equal(write_round_trip(ini, tgt, src, dst, 3), 0);
    ferry_engine_destroy(ini);

    close(to_child[1]);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    close(from_child[0]);
    ferry_engine_destroy(tgt);
    free(src);
    free(dst);
}

/* A WRITE of len bytes into addr whose header and first kilobyte are sent,
 * the rest held back. */
static void start_write(int fd, uint64_t req_id, uint64_t addr, uint32_t len, const unsigned char *data)
{
    ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = req_id, .addr = addr, .len = len, .plen = len};
    assert_int_equal(raw_send(fd, &f, NULL), 0);
    assert_int_equal(raw_send_bytes(fd, data, 1024), 0);
}

static void control_frames_pass_stalled_writes(void **state)
{
    (void)state;
    enum { THREADS = 4, STALLED = THREADS, LEN = 64 << 10 };
    setenv("FERRY_SERVE_THREADS", "1", 1);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    ferry_engine_t *tgt = NULL;
    assert_int_equal(ferry_engine_create(&cfg, &tgt), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("FERRY_SERVE_THREADS");
    setenv("FERRY_SERVE_THREADS", "4", 1);
    cfg.timeout_ms = 20000;
    tgt = harness_engine_cfg(&cfg);
    unsetenv("FERRY_SERVE_THREADS");
    assert_int_equal(ferry_evloop_threads(tgt), THREADS);
    unsigned char *remote = calloc(1, STALLED * LEN), *data = malloc(LEN);
    assert_int_equal(ferry_register(tgt, remote, STALLED * LEN, FERRY_MEM_REMOTE), 0);
    harness_fill(data, LEN, 5);
    uint16_t port = ferry_engine_port(tgt);

    /* As many stalled writes as there are threads: two hold the threads
     * data frames may take, two wait for them. */
    int stalled[STALLED];
    for (int i = 0; i < STALLED; i++) {
        assert_true((stalled[i] = raw_handshaken(port)) >= 0);
        start_write(stalled[i], 100 + (uint64_t)i, (uint64_t)(uintptr_t)(remote + i * LEN), LEN, data);
    }
    usleep(200000);

    /* Still answered at once: a handshake, a PING, a CANCEL. */
    uint64_t t0 = harness_now_ms();
    int ctl = raw_handshaken(port);
    assert_true(ctl >= 0);
    ferry_frame_t f = {.type = FERRY_FRAME_PING, .req_id = 7}, got;
    assert_int_equal(raw_send(ctl, &f, NULL), 0);
    assert_int_equal(raw_recv(ctl, &got, NULL, 0, 2000), 0);
    assert_int_equal(got.type, FERRY_FRAME_PONG);
    f = (ferry_frame_t){.type = FERRY_FRAME_CANCEL, .req_id = 999};
    assert_int_equal(raw_send(ctl, &f, NULL), 0);
    assert_int_equal(raw_recv(ctl, &got, NULL, 0, 2000), 0);
    assert_int_equal(got.type, FERRY_FRAME_CANCEL_ACK);
    fprintf(stderr, "with %d writes stalled on %d threads: handshake, PING and CANCEL answered in %llu ms\n", STALLED,
            THREADS, (unsigned long long)(harness_now_ms() - t0));

    /* The rest of each write comes: all four are placed and acknowledged,
     * the queued ones once a thread came free. */
    for (int i = 0; i < STALLED; i++) assert_int_equal(raw_send_bytes(stalled[i], data + 1024, LEN - 1024), 0);
    for (int i = 0; i < STALLED; i++) {
        assert_int_equal(raw_recv(stalled[i], &got, NULL, 0, 10000), 0);
        assert_int_equal(got.type, FERRY_FRAME_WRITE_ACK);
        assert_int_equal(got.status, 0);
        assert_true(harness_check(remote + i * LEN, LEN, 5));
        close(stalled[i]);
    }
    close(ctl);
    ferry_engine_destroy(tgt);
    free(remote);
    free(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ten_thousand_idle_connections), /* first: it forks */
        cmocka_unit_test(control_frames_pass_stalled_writes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
