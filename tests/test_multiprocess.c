/* SPDX-License-Identifier: Apache-2.0 */
/* Two engines in two processes: the target is a forked child that owns its
 * memory; the parent writes, reads, and has the child verify what landed. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define LEN (64u << 20)

struct child {
    pid_t pid;
    int to_child, from_child;
    char name[300];
    uint64_t addr;
};

static void child_main(int in, int out)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    ferry_engine_t *e;
    if (ferry_engine_create(&cfg, &e) != 0) _exit(10);
    unsigned char *buf = malloc(LEN);
    harness_fill(buf, LEN, 99);
    if (ferry_register(e, buf, LEN, FERRY_MEM_REMOTE) != 0) _exit(11);
    dprintf(out, "%s %llu\n", ferry_engine_name(e), (unsigned long long)(uintptr_t)buf);
    char cmd[64];
    FILE *f = fdopen(in, "r");
    while (fgets(cmd, sizeof cmd, f)) {
        unsigned long long seed;
        if (sscanf(cmd, "verify %llu", &seed) == 1) {
            dprintf(out, "%s\n", harness_check(buf, LEN, seed) ? "ok" : "bad");
        } else if (strncmp(cmd, "quit", 4) == 0) {
            break;
        }
    }
    ferry_engine_destroy(e);
    free(buf);
    _exit(0);
}

static void spawn(struct child *c)
{
    int a[2], b[2];
    assert_int_equal(pipe(a), 0);
    assert_int_equal(pipe(b), 0);
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        close(a[1]);
        close(b[0]);
        child_main(a[0], b[1]);
    }
    close(a[0]);
    close(b[1]);
    c->to_child = a[1];
    c->from_child = b[0];
    char line[400];
    FILE *f = fdopen(dup(c->from_child), "r");
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    unsigned long long addr;
    assert_int_equal(sscanf(line, "%299s %llu", c->name, &addr), 2);
    c->addr = addr;
}

static int ask(struct child *c, const char *cmd)
{
    dprintf(c->to_child, "%s\n", cmd);
    char reply[16] = {0};
    ssize_t n = read(c->from_child, reply, sizeof reply - 1);
    return n > 0 && strncmp(reply, "ok", 2) == 0;
}

static void finish(struct child *c)
{
    dprintf(c->to_child, "quit\n");
    int status;
    waitpid(c->pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(c->to_child);
    close(c->from_child);
}

static void round_trip_across_processes(void **state)
{
    (void)state;
    struct child c;
    spawn(&c);
    ferry_engine_t *e = harness_engine(20000);
    unsigned char *src = malloc(LEN);
    assert_int_equal(ferry_register(e, src, LEN, 0), 0);
    /* Read what the child wrote at start. */
    assert_int_equal(ferry_transfer_sync(e, c.name, FERRY_OP_READ, src, c.addr, LEN), 0);
    assert_true(harness_check(src, LEN, 99));
    /* Write ours, and let the child check its own memory. */
    harness_fill(src, LEN, 5);
    uint64_t t0 = harness_now_ms();
    assert_int_equal(ferry_transfer_sync(e, c.name, FERRY_OP_WRITE, src, c.addr, LEN), 0);
    uint64_t ms = harness_now_ms() - t0;
    fprintf(stderr, "64 MiB write across processes: %llu ms\n", (unsigned long long)ms);
    assert_true(ask(&c, "verify 5"));
    /* A batch of scattered blocks. */
    enum { N = 64 };
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    harness_fill(src, LEN, 6);
    for (int i = 0; i < N; i++) {
        locals[i] = src + (size_t)i * (LEN / N);
        remotes[i] = c.addr + (uint64_t)i * (LEN / N);
        lens[i] = LEN / N;
    }
    assert_int_equal(ferry_batch_transfer_sync(e, c.name, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
    assert_true(ask(&c, "verify 6"));
    /* Past the child's region: refused by the child, which stays intact. */
    int rc = ferry_transfer_sync(e, c.name, FERRY_OP_WRITE, src, c.addr + LEN - 16, 32);
    assert_int_equal(rc, FERRY_ERR_OUT_OF_BOUNDS);
    assert_true(ask(&c, "verify 6"));
    finish(&c);
    ferry_engine_destroy(e);
    free(src);
}

static void killed_peer_fails_fast(void **state)
{
    (void)state;
    struct child c;
    spawn(&c);
    ferry_engine_t *e = harness_engine(5000);
    unsigned char *src = malloc(LEN);
    assert_int_equal(ferry_register(e, src, LEN, 0), 0);
    assert_int_equal(ferry_transfer_sync(e, c.name, FERRY_OP_WRITE, src, c.addr, 4096), 0);
    kill(c.pid, SIGKILL);
    waitpid(c.pid, NULL, 0);
    uint64_t t0 = harness_now_ms();
    int rc = ferry_transfer_sync(e, c.name, FERRY_OP_WRITE, src, c.addr, LEN);
    uint64_t ms = harness_now_ms() - t0;
    /* The pooled connection breaks and the reconnect is refused: a peer
     * this engine knew went away, PEER_CLOSED (never a bare SOCKET). */
    assert_int_equal(rc, FERRY_ERR_PEER_CLOSED);
    assert_detail_contains("went away");
    assert_true(ferry_error_retryable(rc));
    assert_true(ms < 5000);
    assert_detail_contains(c.name);
    close(c.to_child);
    close(c.from_child);
    ferry_engine_destroy(e);
    free(src);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip_across_processes),
        cmocka_unit_test(killed_peer_fails_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
