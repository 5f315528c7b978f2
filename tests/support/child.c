/* SPDX-License-Identifier: Apache-2.0 */
#include "child.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

void child_fork(void (*body)(int in, int out, void *arg), void *arg, pid_t *pid, int *to, int *from, void *hello,
                size_t hello_size)
{
    int down[2], up[2];
    assert_int_equal(pipe(down), 0);
    assert_int_equal(pipe(up), 0);
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
        close(down[1]);
        close(up[0]);
        body(down[0], up[1], arg);
        _exit(127); /* body must not return */
    }
    close(down[0]);
    close(up[1]);
    *pid = p;
    *to = down[1];
    *from = up[0];
    assert_int_equal(read(*from, hello, hello_size), (ssize_t)hello_size);
}

void child_exchange(int to, int from, const void *cmd, size_t cmd_size, void *reply, size_t reply_size)
{
    assert_int_equal(write(to, cmd, cmd_size), (ssize_t)cmd_size);
    assert_int_equal(read(from, reply, reply_size), (ssize_t)reply_size);
}

int child_end(pid_t pid, int to, int from, const void *quit, size_t quit_size, bool kill_it)
{
    if (kill_it || write(to, quit, quit_size) != (ssize_t)quit_size) kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    close(to);
    close(from);
    return status;
}

target_child_t *target_child_start(void (*body)(int in, int out, void *arg), void *arg)
{
    target_child_t *c = calloc(1, sizeof *c);
    assert_non_null(c);
    struct target_reply r;
    child_fork(body, arg, &c->pid, &c->to, &c->from, &r, sizeof r);
    assert_int_equal(r.rc, 0);
    snprintf(c->peer, sizeof c->peer, "127.0.0.1:%u", r.port);
    c->addr = r.addr;
    c->len = r.len;
    return c;
}

int target_child_do2(target_child_t *c, int op, uint64_t seed, uint64_t off, uint64_t len, uint64_t *addr)
{
    struct target_cmd m = {op, seed, off, len};
    struct target_reply r;
    child_exchange(c->to, c->from, &m, sizeof m, &r, sizeof r);
    if (addr) *addr = r.addr;
    return r.rc;
}

void target_child_stop(target_child_t *c)
{
    struct target_cmd m = {0, 0, 0, 0};
    int status = child_end(c->pid, c->to, c->from, &m, sizeof m, false);
    free(c);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}
