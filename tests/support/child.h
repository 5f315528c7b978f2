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
#include <stdint.h>
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

/* A target engine in a child (test_shm, test_cuda_ipc): commands of one
 * shape (op 0 = quit), answers of one shape, the first answer giving the
 * child's port, the address and length of its registered buffer. */
struct target_cmd {
    int op;
    uint64_t seed, off, len;
};

struct target_reply {
    int rc;
    uint16_t port;
    uint64_t addr, len;
    int32_t pid;
};

typedef struct target_child {
    pid_t pid;
    int to, from;     /* command pipe, reply pipe */
    char peer[64];    /* "127.0.0.1:port" */
    uint64_t addr, len;
} target_child_t;

/* Forks body (child_fork) and takes its first answer, which must have rc 0. */
target_child_t *target_child_start(void (*body)(int in, int out, void *arg), void *arg);
/* One command: the answer's rc, its addr in *addr (NULL: not wanted). */
int target_child_do2(target_child_t *c, int op, uint64_t seed, uint64_t off, uint64_t len, uint64_t *addr);
static inline int target_child_do(target_child_t *c, int op, uint64_t seed, uint64_t off, uint64_t len)
{
    return target_child_do2(c, op, seed, off, len, NULL);
}
/* Sends quit and waits: the child must exit 0. Frees c. */
void target_child_stop(target_child_t *c);

#endif
