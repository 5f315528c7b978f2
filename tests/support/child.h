/* SPDX-License-Identifier: Apache-2.0 */
/* A forked child a test talks to over two pipes in fixed-size messages
 * (a target engine in another process: test_shm, test_shm_pool,
 * test_cuda_ipc): the child runs its body with the pipes' ends and
 * _exits; the test sends a command and reads the answer. Every failed
 * step ends the test (cmocka). */
#ifndef FERRY_TEST_CHILD_H
#define FERRY_TEST_CHILD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Forks; the child calls body(in, out, arg), which must not return. The
 * parent gets the child's pid and its ends (to: commands, from: answers)
 * and reads the child's first message, hello_size bytes into hello. */
void child_fork(void (*body)(int in, int out, void *arg), void *arg, pid_t *pid, int *to, int *from, void *hello,
                size_t hello_size);
/* Sends cmd and reads the answer into reply. */
void child_exchange(int to, int from, const void *cmd, size_t cmd_size, void *reply, size_t reply_size);
/* Sends quit (SIGKILL instead when kill_it, or when quit cannot be sent),
 * waits for the child and closes both ends: its wait status. */
int child_end(pid_t pid, int to, int from, const void *quit, size_t quit_size, bool kill_it);

#endif
