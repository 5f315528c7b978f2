/* SPDX-License-Identifier: Apache-2.0 */
/* A hostile same-host peer against shared pools (ferry_pool_create_shared):
 * a program that speaks the map protocol itself (HELLO with its real pid,
 * SHM_MAP_REQ over a connection the target verifies) and then does with
 * what it was given whatever the kernel lets it: map a local-only pool,
 * write a read-only one, write after the owner's ferry_deregister returned,
 * set the control word back to live, and raise the old in-use count to
 * stall the deregistration. Each abuse must find nothing to abuse. The
 * target runs in this process: the peer reaches its memfds only as any
 * peer would, through the fds passed to it (SCM_RIGHTS) and by reopening
 * them through /proc in another mode. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/testing.h"
#include "fault.h"
#include "harness.h"
#include "transport/shm/shm_wire.h"
#include "wire/le.h"

#include <ferry/pool.h>

#define POOL (1u << 20)

static ferry_engine_t *target(void)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 5000;
    return harness_engine_cfg(&cfg);
}

/* A raw connection whose HELLO tells the truth about this process: the
 * target verifies it (same host, our pid owns the socket, attach works). */
static int hostile_connect(ferry_engine_t *tgt)
{
    int fd = raw_connect(ferry_engine_port(tgt));
    assert_true(fd >= 0);
    ferry_hello_t h;
    memset(&h, 0, sizeof h);
    h.proto_min = h.proto_max = FERRY_PROTOCOL_VERSION;
    h.flags = FERRY_HELLO_F_CMA;
    h.engine_id = 0x6ad6ad;
    h.epoch = 7;
    h.pid = (int32_t)getpid();
    memcpy(h.host_id, ferry_test_host_id(tgt), sizeof h.host_id);
    snprintf(h.name, sizeof h.name, "hostile:1");
    uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME + 1];
    int n = ferry_hello_encode(&h, buf, sizeof buf);
    assert_true(n > 0);
    ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n};
    assert_int_equal(raw_send(fd, &f, buf), 0);
    ferry_frame_t a;
    assert_int_equal(raw_recv(fd, &a, buf, sizeof buf, 5000), 0);
    assert_int_equal(a.type, FERRY_FRAME_HELLO_ACK);
    assert_int_equal(a.status, 0);
    return fd;
}

/* The memfds the target passed with its last answer: data, control header. */
static int passed[2] = {-1, -1};

/* Listens where the target passes a map request's memfds (shm.c). */
static int listen_for_fds(uint64_t req_id, const void *addr)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int n = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "ferry-map/%d/%llx/%llx", (int)getpid(),
                     (unsigned long long)req_id, (unsigned long long)(uintptr_t)addr);
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(l >= 0);
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sl), 0);
    assert_int_equal(listen(l, 1), 0);
    return l;
}

static void receive_fds(int l)
{
    int s = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    assert_true(s >= 0);
    char byte;
    struct iovec iov = {&byte, 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(2 * sizeof(int))];
    } ctl;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    assert_int_equal(recvmsg(s, &m, MSG_CMSG_CLOEXEC), 1);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    assert_non_null(cm);
    assert_int_equal(cm->cmsg_type, SCM_RIGHTS);
    memcpy(passed, CMSG_DATA(cm), sizeof passed);
    close(s);
}

static void close_passed(void)
{
    for (int i = 0; i < 2; i++) {
        if (passed[i] >= 0) close(passed[i]);
        passed[i] = -1;
    }
}

/* SHM_MAP_REQ for [addr, addr+1): the answer's status, info on success;
 * with fds, the memfds are expected passed (into passed[]). */
static int map_req(int fd, const void *addr, uint8_t info[FERRY_SHM_MAP_INFO_SIZE], bool fds)
{
    static unsigned char probe = 1;
    int l = fds ? listen_for_fds(77, addr) : -1;
    ferry_frame_t q = {.type = FERRY_FRAME_SHM_MAP_REQ, .req_id = 77, .addr = (uint64_t)(uintptr_t)addr, .len = 1,
                       .aux = (uint64_t)(uintptr_t)&probe};
    assert_int_equal(raw_send(fd, &q, NULL), 0);
    ferry_frame_t a;
    char buf[FERRY_WIRE_MAX_REASON + 64];
    assert_int_equal(raw_recv(fd, &a, buf, sizeof buf - 1, 5000), 0);
    assert_int_equal(a.type, FERRY_FRAME_SHM_MAP_RESP);
    if (a.status == 0) {
        assert_int_equal(a.plen, FERRY_SHM_MAP_INFO_SIZE);
        memcpy(info, buf, FERRY_SHM_MAP_INFO_SIZE);
        if (fds) {
            assert_true((int32_t)get32(info + 24) >= 0);
            receive_fds(l);
        }
    } else {
        buf[a.plen < sizeof buf - 1 ? a.plen : sizeof buf - 1] = 0;
        printf("# map of %p refused (%d): %s\n", addr, a.status, buf);
    }
    if (l >= 0) close(l);
    return a.status;
}

/* Reopens a passed fd read-write through /proc (as any process holding
 * it, or reading the target's /proc/<pid>/fd, can). */
static int reopen_rw(int fd)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return open(path, O_RDWR | O_CLOEXEC);
}

/* The peer tries to write the control header: map it writable, reopen it
 * read-write, map that writable, write(2) to it. All refused. */
static void control_header_is_the_owners(void)
{
    assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, passed[1], 0) == MAP_FAILED);
    int fd = reopen_rw(passed[1]);
    assert_true(fd >= 0);
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(m == MAP_FAILED);
    assert_int_equal(errno, EPERM);
    uint32_t live = 1;
    assert_int_equal(pwrite(fd, &live, sizeof live, 4), -1);
    close(fd);
}

/* Whether the mapping holding addr in this process is a memfd's. */
static bool mapped_from_memfd(const void *addr)
{
    FILE *f = fopen("/proc/self/maps", "re");
    assert_non_null(f);
    char line[512];
    bool memfd = false;
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) memfd = strstr(line, "memfd:") != NULL;
    }
    fclose(f);
    return memfd;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* ------------------------------------------------------------- tests */

/* A local-only pool: no memfd behind it, and the map request is refused. */
static void local_pool_is_not_answered(void **state)
{
    (void)state;
    ferry_engine_t *tgt = target();
    ferry_pool_t *p;
    void *buf;
    assert_int_equal(ferry_pool_create_shared(tgt, POOL, FERRY_MEM_LOCAL, &p), 0);
    assert_int_equal(ferry_pool_alloc(p, POOL, &buf), 0);
    assert_false(mapped_from_memfd(buf));
    int fd = hostile_connect(tgt);
    uint8_t info[FERRY_SHM_MAP_INFO_SIZE];
    assert_int_equal(map_req(fd, buf, info, false), FERRY_ERR_ACCESS_DENIED);
    close(fd);
    ferry_pool_destroy(p);
    ferry_engine_destroy(tgt);
}

/* A read-only pool: the peer may map it, but no way it tries makes it
 * writable, and the pool's bytes stay as the owner wrote them. */
static void read_only_pool_stays_read_only(void **state)
{
    (void)state;
    ferry_engine_t *tgt = target();
    ferry_pool_t *p;
    void *buf;
    assert_int_equal(ferry_pool_create_shared(tgt, POOL, FERRY_MEM_REMOTE_READ, &p), 0);
    assert_int_equal(ferry_pool_alloc(p, POOL, &buf), 0);
    harness_fill(buf, POOL, 41);
    int fd = hostile_connect(tgt);
    uint8_t info[FERRY_SHM_MAP_INFO_SIZE];
    assert_int_equal(map_req(fd, buf, info, true), 0);
    /* The fd it was given is read-only... */
    assert_true(mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, passed[0], 0) == MAP_FAILED);
    assert_int_equal(pwrite(passed[0], "x", 1, 0), -1);
    /* ...and reopened read-write, the seal refuses the rest. */
    int rw = reopen_rw(passed[0]);
    if (rw >= 0) {
        void *m = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        assert_true(m == MAP_FAILED);
        assert_int_equal(errno, EPERM);
        assert_int_equal(pwrite(rw, "x", 1, 0), -1);
        close(rw);
    }
    unsigned char *m = mmap(NULL, POOL, PROT_READ, MAP_SHARED, passed[0], 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(mprotect(m, POOL, PROT_READ | PROT_WRITE), -1);
    assert_true(harness_check(m, POOL, 41)); /* reading is what it may do */
    munmap(m, POOL);
    assert_true(harness_check(buf, POOL, 41));
    control_header_is_the_owners();
    close_passed();
    close(fd);
    ferry_pool_destroy(p);
    ferry_engine_destroy(tgt);
}

/* A writable pool, mapped by the peer, then deregistered by its owner:
 * the peer cannot touch the control header (to raise an in-use count or
 * set a revoked pool live), the deregistration waits for nothing, and
 * afterwards the peer's writes do not reach the owner's memory; asking
 * again is refused. */
static void deregistered_pool_is_out_of_reach(void **state)
{
    (void)state;
    ferry_engine_t *tgt = target();
    ferry_pool_t *p;
    void *buf;
    assert_int_equal(ferry_pool_create_shared(tgt, POOL, FERRY_MEM_REMOTE, &p), 0);
    assert_int_equal(ferry_pool_alloc(p, POOL, &buf), 0);
    harness_fill(buf, POOL, 42);
    int fd = hostile_connect(tgt);
    uint8_t info[FERRY_SHM_MAP_INFO_SIZE];
    assert_int_equal(map_req(fd, buf, info, true), 0);
    unsigned char *m = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED, passed[0], 0);
    assert_true(m != MAP_FAILED);
    /* While registered, the peer's mapping is the pool (writable: allowed). */
    assert_true(harness_check(m, POOL, 42));
    control_header_is_the_owners();

    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(ferry_deregister(tgt, buf), 0);
    double took = seconds_since(&t0);
    printf("# deregistration took %.3f s\n", took);
    assert_true(took < 5.0); /* a peer's raised in-use count held it 10 s before */

    control_header_is_the_owners();
    memset(m, 0xee, 64u << 10);
    assert_true(harness_check(buf, POOL, 42));
    assert_int_equal(map_req(fd, buf, info, false), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    munmap(m, POOL);
    close_passed();
    close(fd);
    ferry_pool_destroy(p);
    ferry_engine_destroy(tgt);
}

/* A peer that does not listen for the fds (or lets another process take
 * the socket's name) is answered "not shareable": nothing is passed. */
static void nothing_passed_to_a_peer_not_listening(void **state)
{
    (void)state;
    ferry_engine_t *tgt = target();
    ferry_pool_t *p;
    void *buf;
    assert_int_equal(ferry_pool_create_shared(tgt, POOL, FERRY_MEM_REMOTE, &p), 0);
    assert_int_equal(ferry_pool_alloc(p, POOL, &buf), 0);
    int fd = hostile_connect(tgt);
    uint8_t info[FERRY_SHM_MAP_INFO_SIZE];
    assert_int_equal(map_req(fd, buf, info, false), 0);
    assert_int_equal((int32_t)get32(info + 24), -1);
    assert_int_equal((int32_t)get32(info + 36), -1);
    close(fd);
    ferry_pool_destroy(p);
    ferry_engine_destroy(tgt);
}

/* Another process squats the socket name the verified peer would listen
 * on: the target sees (SO_PEERCRED) that the verified pid does not hold
 * it, passes nothing, and answers "not shareable". */
static void nothing_passed_to_a_squatter(void **state)
{
    (void)state;
    ferry_engine_t *tgt = target();
    ferry_pool_t *p;
    void *buf;
    assert_int_equal(ferry_pool_create_shared(tgt, POOL, FERRY_MEM_REMOTE, &p), 0);
    assert_int_equal(ferry_pool_alloc(p, POOL, &buf), 0);
    int ready[2], done[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(done), 0);
    pid_t me = getpid();
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        int n = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "ferry-map/%d/%llx/%llx", (int)me, 77ull,
                         (unsigned long long)(uintptr_t)buf);
        int l = socket(AF_UNIX, SOCK_STREAM, 0);
        socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
        int ok = l >= 0 && bind(l, (struct sockaddr *)&sa, sl) == 0 && listen(l, 1) == 0;
        char c = ok ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) != 1) _exit(2);
        /* Whatever connected, it passed no fd. */
        int s = accept4(l, NULL, NULL, SOCK_NONBLOCK);
        int got = 0;
        if (s >= 0) {
            char byte;
            struct iovec iov = {&byte, 1};
            char cbuf[CMSG_SPACE(4 * sizeof(int))];
            struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
            if (recvmsg(s, &m, 0) > 0 && CMSG_FIRSTHDR(&m)) got = 1;
        }
        _exit(got);
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    int fd = hostile_connect(tgt);
    uint8_t info[FERRY_SHM_MAP_INFO_SIZE];
    assert_int_equal(map_req(fd, buf, info, false), 0);
    assert_int_equal((int32_t)get32(info + 24), -1);
    assert_int_equal(write(done[1], "x", 1), 1);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0); /* the squatter received no fd */
    close(fd);
    for (int i = 0; i < 2; i++) {
        close(ready[i]);
        close(done[i]);
    }
    ferry_pool_destroy(p);
    ferry_engine_destroy(tgt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(local_pool_is_not_answered),
        cmocka_unit_test(read_only_pool_stays_read_only),
        cmocka_unit_test(deregistered_pool_is_out_of_reach),
        cmocka_unit_test(nothing_passed_to_a_peer_not_listening),
        cmocka_unit_test(nothing_passed_to_a_squatter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
