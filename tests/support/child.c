/* SPDX-License-Identifier: Apache-2.0 */
#include "child.h"

#include <signal.h>
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
