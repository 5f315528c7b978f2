/* SPDX-License-Identifier: Apache-2.0 */
/* The shared-memory transport between two processes (fork): round trips,
 * target-side validation over cross-memory attach, the automatic fallback to
 * TCP when the target refuses, forcing by config, and a spoofed pid. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_dev.h"
#include "harness.h"
#include "child.h"

#include "util/clock.h"
#include "link/conn.h"
#include "util/spin.h"
#include "util/memkind.h"
#include "delay_proxy.h"
#include "fault.h"
#include "engine/hello.h"
#include "engine/testing.h"
#include "util/net.h"
#include "wire/wire.h"
#include "link/vec.h"
#include "transport/shm/shm_testing.h"

/* ------------------------------------------------- a target in a child */

enum {
    CMD_QUIT = 0,
    CMD_CHECK,
    CMD_FILL,
    CMD_DEREGISTER,
    CMD_REREGISTER_RO,
    CMD_VEC_CALLS,
    CMD_VEC_REMOTE,
    CMD_DEREGISTER_STILL,
    CMD_HELPER_SHARES
};

/* disable_shm: 1 sets FERRY_SHM_DISABLE, 2 FERRY_SHM_PROC_LOOKUP (the
 * target verifies peers through /proc/net/tcp instead of sock_diag). */
static void child_main(int in, int out, size_t len, int disable_shm)
{
    if (disable_shm == 1) setenv("FERRY_SHM_DISABLE", "1", 1);
    if (disable_shm == 2) setenv("FERRY_SHM_PROC_LOOKUP", "1", 1);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 10000;
    ferry_engine_t *e = NULL;
    struct target_reply r = {0};
    unsigned char *buf = malloc(len);
    r.rc = buf ? ferry_engine_create(&cfg, &e) : -1;
    if (r.rc == 0) r.rc = ferry_register(e, buf, len, FERRY_MEM_REMOTE);
    r.port = ferry_engine_port(e);
    r.addr = (uint64_t)(uintptr_t)buf;
    r.len = len;
    r.pid = (int32_t)getpid();
    if (write(out, &r, sizeof r) != sizeof r) _exit(1);
    struct target_cmd c;
    while (read(in, &c, sizeof c) == sizeof c && c.op != CMD_QUIT) {
        struct target_reply a = {0};
        switch (c.op) {
        case CMD_CHECK: a.rc = harness_check(buf + c.off, c.len, c.seed) ? 0 : 1; break;
        case CMD_FILL: harness_fill(buf + c.off, c.len, c.seed); break;
        case CMD_DEREGISTER: a.rc = ferry_deregister(e, buf); break;
        case CMD_REREGISTER_RO: a.rc = ferry_register(e, buf, len, FERRY_MEM_REMOTE_READ); break;
        case CMD_VEC_CALLS: { /* gathered copies of vector frames this target made */
            uint64_t calls, l, r;
            ferry_shm_vec_entries(&calls, &l, &r);
            a.rc = (int)calls;
            break;
        }
        case CMD_VEC_REMOTE: { /* their entries on the initiator's side */
            uint64_t calls, l, r;
            ferry_shm_vec_entries(&calls, &l, &r);
            a.rc = (int)r;
            break;
        }
        case CMD_HELPER_SHARES: a.rc = (int)ferry_shm_helper_shares(); break; /* its copy helper's shares */
        case CMD_DEREGISTER_STILL: { /* deregister; then nothing may land (1: something did) */
            a.rc = ferry_deregister(e, buf);
            unsigned char *was = malloc(len);
            if (!was) _exit(1);
            memcpy(was, buf, len);
            usleep(100 * 1000);
            if (a.rc == 0 && memcmp(was, buf, len) != 0) a.rc = 1;
            free(was);
            break;
        }
        }
        if (write(out, &a, sizeof a) != sizeof a) break;
    }
    ferry_engine_destroy(e);
    free(buf);
    _exit(0);
}

struct child_args {
    size_t len;
    int disable_shm;
};

static void child_body(int in, int out, void *arg)
{
    const struct child_args *a = arg;
    child_main(in, out, a->len, a->disable_shm);
}

static target_child_t *child_start(size_t len, int disable_shm)
{
    return target_child_start(child_body, &(struct child_args){len, disable_shm});
}

static ferry_engine_t *initiator(const char *transport, int conns)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 10000;
    cfg.connect_timeout_ms = 5000;
    if (transport) cfg.transport = transport;
    if (conns) cfg.conns_per_peer = conns;
    return harness_engine_cfg(&cfg);
}

static void info_of(ferry_engine_t *e, const char *peer, ferry_peer_info_t *info)
{
    int rc = ferry_session_info(e, peer, info);
    if (rc) fail_msg("session info: %s", ferry_last_error_detail());
}

/* ------------------------------------------------------------- tests */

static void round_trip(int how)
{
    size_t cap = 64u << 20;
    target_child_t *c = child_start(cap, how);
    ferry_engine_t *e = initiator(NULL, 0);
    unsigned char *src = malloc(cap);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    ferry_peer_info_t info;
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "shm");
    assert_int_equal(info.pid, c->pid);
    assert_non_null(strstr(info.transport_reason, "cross-memory attach"));
    const size_t sizes[] = {1, 4096 + 7, (1u << 20) + 3, 64u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t len = sizes[k];
        harness_fill(src, len, 100 + k);
        int rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, len);
        if (rc) fail_msg("write %zu: %s", len, ferry_last_error_detail());
        /* Complete means placed in the other process's memory. */
        assert_int_equal(target_child_do(c, CMD_CHECK, 100 + k, 0, len), 0);
        assert_int_equal(target_child_do(c, CMD_FILL, 200 + k, 0, len), 0);
        memset(src, 0, len);
        rc = ferry_transfer_sync(e, c->peer, FERRY_OP_READ, src, c->addr, len);
        if (rc) fail_msg("read %zu: %s", len, ferry_last_error_detail());
        assert_true(harness_check(src, len, 200 + k));
    }
    /* A batch scattering 64 blocks of 64 KiB in reverse order. */
    harness_reverse_batch_round_trip(e, c->peer, src, c->addr, 64, 65536, 7);
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "shm"); /* no fallback happened */
    ferry_engine_destroy(e);
    free(src);
    target_child_stop(c);
}

static void two_processes_round_trip(void **state)
{
    (void)state;
    round_trip(0);
}

/* The same with the target finding the peer's socket in /proc/net/tcp, as
 * where netlink sock_diag is filtered. */
static void verified_through_proc(void **state)
{
    (void)state;
    round_trip(2);
}

/* The target validates every CMA frame against its own registry, even when
 * the initiator's cached segment table says the range is fine. */
static void target_validates_over_shm(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    target_child_t *c = child_start(cap, 0);
    ferry_engine_t *e = initiator("shm", 1);
    unsigned char *src = malloc(cap);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    harness_fill(src, cap, 1);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, cap), 0);
    ferry_peer_info_t info;
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "shm");
    assert_non_null(strstr(info.transport_reason, "forced by config"));

    /* Deregistered behind the initiator's back: the target refuses. */
    assert_int_equal(target_child_do(c, CMD_DEREGISTER, 0, 0, 0), 0);
    assert_int_equal(target_child_do(c, CMD_FILL, 9, 0, cap), 0);
    int rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, 4096);
    assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("target range");
    assert_int_equal(target_child_do(c, CMD_CHECK, 9, 0, cap), 0); /* nothing placed */
    rc = ferry_transfer_sync(e, c->peer, FERRY_OP_READ, src, c->addr, 4096);
    assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);

    /* Registered again, read-only: writes are denied, reads work. */
    assert_int_equal(target_child_do(c, CMD_REREGISTER_RO, 0, 0, 0), 0);
    rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, 4096);
    if (rc != FERRY_ERR_ACCESS_DENIED) fail_msg("write to read-only: %s", ferry_last_error_detail());
    assert_int_equal(target_child_do(c, CMD_CHECK, 9, 0, cap), 0);
    /* Registered again (a new generation): the first read works. */
    memset(src, 0, cap);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_READ, src, c->addr, cap), 0);
    assert_true(harness_check(src, cap, 9));

    /* Out of the region's bounds. */
    rc = ferry_transfer_sync(e, c->peer, FERRY_OP_READ, src, c->addr + cap - 10, 4096);
    assert_int_equal(rc, FERRY_ERR_OUT_OF_BOUNDS);
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "shm");
    ferry_engine_destroy(e);
    free(src);
    target_child_stop(c);
}

/* The target refuses cross-memory attach (FERRY_SHM_DISABLE=1 in its
 * environment): the initiator chose shm, gets the refusal on its first
 * transfer, moves the session to tcp with the reason, and the data arrives. */
static void fallback_when_target_refuses(void **state)
{
    (void)state;
    size_t cap = 16u << 20;
    target_child_t *c = child_start(cap, 1);
    ferry_engine_t *e = initiator(NULL, 0);
    unsigned char *src = malloc(cap);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    ferry_peer_info_t info;
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "shm"); /* chosen at the handshake */
    harness_fill(src, cap, 3);
    int rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, cap);
    if (rc) fail_msg("write: %s", ferry_last_error_detail());
    assert_int_equal(target_child_do(c, CMD_CHECK, 3, 0, cap), 0);
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "tcp");
    assert_non_null(strstr(info.transport_reason, "refused"));
    assert_non_null(strstr(info.transport_reason, "FERRY_SHM_DISABLE"));
    /* Reads go over TCP from now on. */
    assert_int_equal(target_child_do(c, CMD_FILL, 4, 0, cap), 0);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_READ, src, c->addr, cap), 0);
    assert_true(harness_check(src, cap, 4));
    ferry_engine_destroy(e);

    /* A read as the first transfer falls back the same way. */
    e = initiator(NULL, 1);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    memset(src, 0, cap);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_READ, src, c->addr, cap), 0);
    assert_true(harness_check(src, cap, 4));
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "tcp");
    ferry_engine_destroy(e);
    free(src);
    target_child_stop(c);
}

static void transport_forced_by_config(void **state)
{
    (void)state;
    ferry_engine_t *t = initiator(NULL, 0);
    ferry_engine_t *e = initiator("tcp", 0);
    char peer[300];
    snprintf(peer, sizeof peer, "%s", ferry_engine_name(t));
    ferry_peer_info_t info;
    info_of(e, peer, &info);
    assert_string_equal(info.transport, "tcp");
    assert_non_null(strstr(info.transport_reason, "forced by config"));
    ferry_engine_destroy(e);
    e = initiator("shm", 0);
    info_of(e, peer, &info);
    assert_string_equal(info.transport, "shm");
    ferry_engine_destroy(e);
    ferry_engine_destroy(t);
}

/* ---------------------------------------------- a hand-made initiator */

static int connect_claiming_as(ferry_engine_t *target, ferry_engine_t *as, int32_t claimed_pid, const uint8_t *host_id,
                          ferry_hello_t *ack);

static int connect_claiming(ferry_engine_t *target, ferry_engine_t *as, int32_t claimed_pid, ferry_hello_t *ack)
{
    return connect_claiming_as(target, as, claimed_pid, NULL, ack);
}

static int connect_claiming_as(ferry_engine_t *target, ferry_engine_t *as, int32_t claimed_pid, const uint8_t *host_id,
                          ferry_hello_t *ack)
{
    ferry_hello_t h;
    ferry_hello_fill(as, &h);
    h.pid = claimed_pid;
    if (host_id) memcpy(h.host_id, host_id, sizeof h.host_id);
    uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    ferry_frame_t f;
    int fd = raw_hello_with(ferry_engine_port(target), &h, &f, buf, sizeof buf);
    assert_int_equal(f.type, FERRY_FRAME_HELLO_ACK);
    assert_int_equal(f.status, 0);
    assert_true(f.plen <= sizeof buf);
    assert_int_equal(ferry_hello_decode(buf, f.plen, ack), 0);
    return fd;
}

/* Sends one CMA frame; returns the answer's status, its text in reason. */
static int raw_cma(int fd, uint8_t type, uint64_t addr, uint64_t len, uint64_t aux, char *reason, size_t cap)
{
    uint64_t dl = ferry_deadline_after_ms(5000);
    ferry_frame_t f = {.type = type, .req_id = 77, .addr = addr, .len = len, .aux = aux};
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(&f, hdr);
    assert_int_equal(ferry_net_send(fd, hdr, sizeof hdr, dl), 0);
    assert_int_equal(ferry_net_recv(fd, hdr, sizeof hdr, dl), 0);
    assert_int_equal(ferry_frame_decode(hdr, &f), 0);
    assert_int_equal(f.type, type == FERRY_FRAME_CMA_WRITE ? FERRY_FRAME_WRITE_ACK : FERRY_FRAME_READ_RESP);
    assert_true(f.plen < cap);
    assert_int_equal(ferry_net_recv(fd, reason, f.plen, dl), 0);
    reason[f.plen] = '\0';
    return f.status;
}

static char secret[64] = "the victim's secret, never to be copied";

/* A peer claiming another process's pid must not make the target read that
 * process's memory: the claimed pid does not own the connection's socket. */
static void spoofed_pid_is_refused(void **state)
{
    (void)state;
    pid_t victim = fork();
    assert_true(victim >= 0);
    if (victim == 0) { /* has `secret` at the same address, like us */
        pause();
        _exit(0);
    }
    ferry_engine_t *t = initiator(NULL, 0);
    ferry_engine_t *me = initiator(NULL, 0);
    unsigned char dst[64];
    memset(dst, 0, sizeof dst);
    assert_int_equal(ferry_register(t, dst, sizeof dst, FERRY_MEM_REMOTE), 0);
    ferry_hello_t ack;
    int fd = connect_claiming(t, me, (int32_t)victim, &ack);
    char reason[FERRY_WIRE_MAX_REASON + 1];
    int st = raw_cma(fd, FERRY_FRAME_CMA_WRITE, (uint64_t)(uintptr_t)dst, sizeof dst, (uint64_t)(uintptr_t)secret,
                     reason, sizeof reason);
    assert_int_equal(st, FERRY_ERR_NOT_IMPLEMENTED);
    if (!strstr(reason, "does not own")) fail_msg("reason: %s", reason);
    unsigned char zero[64] = {0};
    assert_memory_equal(dst, zero, sizeof dst);
    /* The refusal sticks to the connection. */
    st = raw_cma(fd, FERRY_FRAME_CMA_READ, (uint64_t)(uintptr_t)dst, sizeof dst, (uint64_t)(uintptr_t)secret, reason,
                 sizeof reason);
    assert_int_equal(st, FERRY_ERR_NOT_IMPLEMENTED);
    close(fd);

    /* Other lies are refused the same way, each with its reason. */
    static const uint8_t elsewhere[16] = {1, 2, 3};
    fd = connect_claiming_as(t, me, (int32_t)getpid(), elsewhere, &ack);
    st = raw_cma(fd, FERRY_FRAME_CMA_WRITE, (uint64_t)(uintptr_t)dst, 8, (uint64_t)(uintptr_t)secret, reason,
                 sizeof reason);
    assert_int_equal(st, FERRY_ERR_NOT_IMPLEMENTED);
    if (!strstr(reason, "not on this host")) fail_msg("reason: %s", reason);
    close(fd);
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    waitpid(gone, NULL, 0); /* reaped: the pid names no process now */
    fd = connect_claiming(t, me, (int32_t)gone, &ack);
    st = raw_cma(fd, FERRY_FRAME_CMA_READ, (uint64_t)(uintptr_t)dst, 8, (uint64_t)(uintptr_t)secret, reason,
                 sizeof reason);
    assert_int_equal(st, FERRY_ERR_NOT_IMPLEMENTED);
    if (!strstr(reason, "does not exist") && !strstr(reason, "does not own")) fail_msg("reason: %s", reason);
    close(fd);
    assert_memory_equal(dst, zero, sizeof dst);

    /* The same peer telling the truth is served. */
    fd = connect_claiming(t, me, (int32_t)getpid(), &ack);
    static char mine[64] = "our own bytes";
    st = raw_cma(fd, FERRY_FRAME_CMA_WRITE, (uint64_t)(uintptr_t)dst, sizeof dst, (uint64_t)(uintptr_t)mine, reason,
                 sizeof reason);
    assert_int_equal(st, 0);
    assert_memory_equal(dst, mine, sizeof dst);
    /* Outside registered memory: refused with the registry's reason. */
    st = raw_cma(fd, FERRY_FRAME_CMA_WRITE, (uint64_t)(uintptr_t)secret, 16, (uint64_t)(uintptr_t)mine, reason,
                 sizeof reason);
    assert_int_equal(st, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_string_equal(secret, "the victim's secret, never to be copied");
    /* A malformed CMA frame (a payload) drops the connection. */
    uint64_t dl = ferry_deadline_after_ms(5000);
    ferry_frame_t f = {.type = FERRY_FRAME_CMA_WRITE, .req_id = 78, .addr = (uint64_t)(uintptr_t)dst, .len = 8,
                       .aux = 0};
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(&f, hdr);
    assert_int_equal(ferry_net_send(fd, hdr, sizeof hdr, dl), 0);
    assert_int_equal(ferry_net_recv(fd, hdr, sizeof hdr, dl), 0);
    assert_int_equal(ferry_frame_decode(hdr, &f), 0);
    assert_int_equal(f.type, FERRY_FRAME_ERROR);
    assert_int_equal(f.status, FERRY_ERR_MALFORMED_FRAME);
    close(fd);
    ferry_engine_destroy(me);
    ferry_engine_destroy(t);
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
}

/* A socket handed to a process of another user (here: inherited by a child
 * that then dropped to nobody): that process owns the socket, but the target
 * must not read its memory for the socket's creator. Needs root. */
static void socket_of_another_user(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "  (skipped: needs root to make a process of another user)\n");
        return;
    }
    ferry_engine_t *t = initiator(NULL, 0);
    ferry_engine_t *me = initiator(NULL, 0);
    unsigned char dst[64];
    memset(dst, 0, sizeof dst);
    assert_int_equal(ferry_register(t, dst, sizeof dst, FERRY_MEM_REMOTE), 0);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    /* The connection whose frames claim the child: made before the fork so
     * that the child inherits it. */
    pid_t child;
    {
        int s2;
        uint64_t dl = ferry_deadline_after_ms(5000);
        assert_int_equal(ferry_net_connect("127.0.0.1", ferry_engine_port(t), dl, &s2), 0);
        child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0) _exit(1);
            if (write(ready[1], "x", 1) != 1) _exit(1);
            pause();
            _exit(0);
        }
        char x;
        assert_int_equal(read(ready[0], &x, 1), 1);
        ferry_hello_t h;
        ferry_hello_fill(me, &h);
        h.pid = (int32_t)child;
        uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
        int n = ferry_hello_encode(&h, buf, sizeof buf);
        ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n};
        uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
        ferry_frame_encode(&f, hdr);
        assert_int_equal(ferry_net_send(s2, hdr, sizeof hdr, dl), 0);
        assert_int_equal(ferry_net_send(s2, buf, (size_t)n, dl), 0);
        assert_int_equal(ferry_net_recv(s2, hdr, sizeof hdr, dl), 0);
        assert_int_equal(ferry_frame_decode(hdr, &f), 0);
        assert_int_equal(ferry_net_recv(s2, buf, f.plen, dl), 0);
        char reason[FERRY_WIRE_MAX_REASON + 1];
        int st = raw_cma(s2, FERRY_FRAME_CMA_WRITE, (uint64_t)(uintptr_t)dst, 8, (uint64_t)(uintptr_t)secret,
                         reason, sizeof reason);
        assert_int_equal(st, FERRY_ERR_NOT_IMPLEMENTED);
        if (!strstr(reason, "runs as uid 65534")) fail_msg("reason: %s", reason);
        close(s2);
    }
    unsigned char zero[64] = {0};
    assert_memory_equal(dst, zero, sizeof dst);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    close(ready[0]);
    close(ready[1]);
    ferry_engine_destroy(me);
    ferry_engine_destroy(t);
}

/* A registered local buffer that was unmapped: the target's copy faults and
 * says so; nothing outside the registered ranges is touched. */
static void unmapped_local_buffer(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    target_child_t *c = child_start(cap, 0);
    ferry_engine_t *e = initiator("shm", 1);
    unsigned char *ok = malloc(4096);
    assert_int_equal(ferry_register(e, ok, 4096, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, ok, c->addr, 4096), 0);
    unsigned char *gone = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(gone != MAP_FAILED);
    assert_int_equal(ferry_register(e, gone, cap, FERRY_MEM_LOCAL), 0);
    munmap(gone, cap);
    int rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, gone, c->addr, cap);
    assert_int_equal(rc, FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("cross-memory attach");
    rc = ferry_transfer_sync(e, c->peer, FERRY_OP_READ, gone, c->addr, cap);
    assert_int_equal(rc, FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("unmapped");
    /* The connection stays good. */
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_READ, ok, c->addr, 4096), 0);
    ferry_engine_destroy(e);
    free(ok);
    target_child_stop(c);
}

/* ------------------------------------------------------ small pieces */

/* Runs batch reqs[0..n) (one opcode) and checks each piece's status:
 * failed with INVALID_ARGUMENT where hole says so, else completed. */
static void run_pieces_expecting(ferry_engine_t *e, target_child_t *c, const ferry_request_t *reqs, size_t n,
                                 const bool *hole)
{
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(e, n, &b), 0);
    assert_int_equal(ferry_batch_submit(b, c->peer, reqs, n, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 10000), FERRY_ERR_INVALID_ARGUMENT);
    for (size_t i = 0; i < n; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, i, &st), 0);
        if (hole[i]) {
            if (st.code != FERRY_ERR_INVALID_ARGUMENT) fail_msg("piece %zu: code %d, not refused", i, st.code);
            assert_detail_contains("cross-memory attach");
        } else {
            if (st.code) fail_msg("piece %zu: %s", i, ferry_last_error_detail());
            assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
        }
    }
    assert_int_equal(ferry_batch_free(b), 0);
}

/* Pieces of 1,152 B adjacent on both sides (the target merges each side's
 * pieces into one iovec) across an unmapped initiator page (page 5 of
 * pages): the gathered call stops in the middle of a merged entry, inside a
 * piece; exactly the pieces touching the hole fail, every other one, before
 * and after it in the same frame, is placed (write) or arrives (read). */
static void adjacent_pieces_around_a_hole(ferry_engine_t *e, target_child_t *c, unsigned char *pages)
{
    enum { PIECE = 1152, N = 64 };
    ferry_request_t reqs[N];
    bool hole[N];
    for (int i = 0; i < N; i++) {
        size_t at = (size_t)i * PIECE;
        hole[i] = at < 6 * 4096 && at + PIECE > 5 * 4096;
        if (!hole[i]) harness_fill(pages + at, PIECE, 2000 + (uint64_t)i);
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, pages + at, c->addr + at, PIECE};
    }
    assert_true(hole[17] && hole[21] && !hole[16] && !hole[22]);
    run_pieces_expecting(e, c, reqs, N, hole);
    for (int i = 0; i < N; i++)
        if (!hole[i]) assert_int_equal(target_child_do(c, CMD_CHECK, 2000 + (uint64_t)i, (uint64_t)i * PIECE, PIECE), 0);

    for (int i = 0; i < N; i++) {
        assert_int_equal(target_child_do(c, CMD_FILL, 3000 + (uint64_t)i, (uint64_t)i * PIECE, PIECE), 0);
        reqs[i].opcode = FERRY_OP_READ;
    }
    run_pieces_expecting(e, c, reqs, N, hole);
    for (int i = 0; i < N; i++)
        if (!hole[i] && !harness_check(pages + (size_t)i * PIECE, PIECE, 3000 + (uint64_t)i))
            fail_msg("piece %d read back wrong", i);
}

/* Batches of small pieces (CMA_VEC frames: one process_vm_readv/writev
 * for many pieces) between two processes: placed where they belong; a
 * piece whose local page is gone fails alone with the target's reason while
 * the pieces around it, in the same call, are placed; a deregistered
 * target region refuses every piece, placing nothing. */
static void small_pieces_over_shm(void **state)
{
    (void)state;
    enum { PIECE = 2048, N = 64 };
    size_t cap = 4u << 20;
    target_child_t *c = child_start(cap, 0);
    ferry_engine_t *e = initiator("shm", 1);
    unsigned char *src = malloc(cap);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    harness_reverse_batch_round_trip(e, c->peer, src, c->addr, 1000, 2048, 21);
    harness_reverse_batch_round_trip(e, c->peer, src, c->addr, 1000, 1152, 22);
    harness_reverse_batch_round_trip(e, c->peer, src, c->addr, 1000, 4096, 23);

    /* Two pieces a page; page 5 unmapped after registration. */
    size_t span = N / 2 * 4096;
    unsigned char *pages = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(pages != MAP_FAILED);
    for (int i = 0; i < N; i++) harness_fill(pages + (size_t)i * PIECE, PIECE, 1000 + (uint64_t)i);
    assert_int_equal(ferry_register(e, pages, span, FERRY_MEM_LOCAL), 0);
    assert_int_equal(target_child_do(c, CMD_FILL, 5, 0, cap), 0);
    munmap(pages + 5 * 4096, 4096);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(e, N, &b), 0);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++) /* piece i into slot N-1-i */
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, pages + (size_t)i * PIECE, c->addr + (uint64_t)(N - 1 - i) * PIECE,
                                    PIECE};
    assert_int_equal(ferry_batch_submit(b, c->peer, reqs, N, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 10000), FERRY_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        uint64_t off = (uint64_t)(N - 1 - i) * PIECE;
        if (i / 2 == 5) {
            assert_int_equal(st.code, FERRY_ERR_INVALID_ARGUMENT);
            assert_detail_contains("cross-memory attach");
        } else {
            if (st.code) fail_msg("piece %d: %s", i, ferry_last_error_detail());
            assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
            assert_int_equal(target_child_do(c, CMD_CHECK, 1000 + (uint64_t)i, off, PIECE), 0);
        }
    }
    assert_int_equal(ferry_batch_free(b), 0);
    adjacent_pieces_around_a_hole(e, c, pages);

    /* Deregistered behind the initiator's back: every piece refused. */
    assert_int_equal(target_child_do(c, CMD_DEREGISTER, 0, 0, 0), 0);
    assert_int_equal(target_child_do(c, CMD_FILL, 6, 0, cap), 0);
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        locals[i] = src + (size_t)i * PIECE;
        remotes[i] = c->addr + (uint64_t)(N - 1 - i) * PIECE;
        lens[i] = PIECE;
    }
    int rc = ferry_batch_transfer_sync(e, c->peer, FERRY_OP_WRITE, locals, remotes, lens, N);
    assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("target range");
    assert_int_equal(target_child_do(c, CMD_CHECK, 6, 0, cap), 0); /* nothing placed */
    ferry_peer_info_t info;
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "shm");
    ferry_engine_destroy(e);
    munmap(pages, span);
    free(src);
    target_child_stop(c);
}

/* Runs a batch of n writes of `piece` bytes from local[i] to remote[i] and
 * returns the batch's code; st[i] gets each piece's status code. */
static int write_batch(ferry_engine_t *e, target_child_t *c, unsigned char *const *local, const uint64_t *remote, size_t n,
                       size_t piece, int *st)
{
    ferry_request_t reqs[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) reqs[i] = (ferry_request_t){FERRY_OP_WRITE, local[i], remote[i], piece};
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(e, n, &b), 0);
    assert_int_equal(ferry_batch_submit(b, c->peer, reqs, n, 0), 0);
    int rc = ferry_batch_wait(b, 10000);
    for (size_t i = 0; i < n; i++) {
        ferry_status_t s;
        assert_int_equal(ferry_batch_status(b, i, &s), 0);
        st[i] = s.code;
        if (s.code == 0) assert_int_equal(s.state, FERRY_STATUS_COMPLETED);
    }
    assert_int_equal(ferry_batch_free(b), 0);
    return rc;
}

/* cap bytes of fresh anonymous memory, registered with e as a local
 * buffer (munmap it after the engine is destroyed). */
static unsigned char *registered_mapping(ferry_engine_t *e, size_t cap)
{
    unsigned char *src = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(src != MAP_FAILED);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    return src;
}

/* A target child with cap bytes, and an initiator over shm with conns
 * connections and cap bytes of its own mapped and registered (returned):
 * where the vector-frame tests below start. */
static unsigned char *shm_pair_start(size_t cap, int conns, target_child_t **c, ferry_engine_t **e)
{
    *c = child_start(cap, 0);
    *e = initiator("shm", conns);
    return registered_mapping(*e, cap);
}

/* Ends what shm_pair_start made; still_shm: the session must still be on shm. */
static void shm_pair_stop(target_child_t *c, ferry_engine_t *e, unsigned char *src, size_t cap, bool still_shm)
{
    if (still_shm) {
        ferry_peer_info_t info;
        info_of(e, c->peer, &info);
        assert_string_equal(info.transport, "shm");
    }
    ferry_engine_destroy(e);
    munmap(src, cap);
    target_child_stop(c);
}

/* Maps [at, at + len) again (zero-filled), after a test unmapped it. */
static void map_again(unsigned char *at, size_t len)
{
    assert_true(mmap(at, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == at);
}

/* Pieces of 1 MiB (over FERRY_WIRE_VEC_PIECE_MAX) go many to a CMA_VEC
 * frame to targets advertising FERRY_HELLO_F_CMA_BIG: the target copies
 * them with gathered calls of up to 4 MiB, or a piece a call in copies it
 * shares with its copy helper (before, each went as its own CMA_WRITE: no
 * vector copy at all) and checks each piece as before: a
 * piece whose local page is gone fails alone while the others of its frame
 * are placed; deregistered or re-registered read-only, every piece is
 * refused and nothing is placed. */
static void large_pieces_in_vector_frames(void **state)
{
    (void)state;
    enum { N = 8 };
    size_t piece = 1u << 20, cap = N * piece;
    target_child_t *c;
    ferry_engine_t *e;
    unsigned char *src = shm_pair_start(cap, 1, &c, &e);
    unsigned char *local[N];
    uint64_t remote[N];
    int st[N];
    for (int i = 0; i < N; i++) { /* piece i into slot N-1-i */
        local[i] = src + (size_t)i * piece;
        remote[i] = c->addr + (uint64_t)(N - 1 - i) * piece;
        harness_fill(local[i], piece, 100 + (uint64_t)i);
    }
    int calls0 = target_child_do(c, CMD_VEC_CALLS, 0, 0, 0);
    assert_int_equal(write_batch(e, c, local, remote, N, piece, st), 0);
    int calls = target_child_do(c, CMD_VEC_CALLS, 0, 0, 0) - calls0;
    /* 4 MiB a gathered copy, or a piece a call where the copy helper may
     * share the copy (large_pieces_share_their_copy); one CMA_WRITE a
     * piece would count none. */
    if (calls < 2 || calls > N)
        fail_msg("%d gathered copies for %d pieces of 1 MiB (2..%d expected)", calls, N, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(target_child_do(c, CMD_CHECK, 100 + (uint64_t)i, (uint64_t)(N - 1 - i) * piece, piece), 0);

    /* A page in the middle of piece 5 unmapped: piece 5 fails alone (the
     * gathered copy stops in it), pieces 0-4 and 6-7 are placed. */
    assert_int_equal(target_child_do(c, CMD_FILL, 7, 0, cap), 0);
    for (int i = 0; i < N; i++) harness_fill(local[i], piece, 200 + (uint64_t)i);
    munmap(local[5] + piece / 2, 4096);
    assert_int_equal(write_batch(e, c, local, remote, N, piece, st), FERRY_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < N; i++) {
        if (i == 5) {
            assert_int_equal(st[i], FERRY_ERR_INVALID_ARGUMENT);
            continue;
        }
        if (st[i]) fail_msg("piece %d: %s", i, ferry_error_name(st[i]));
        assert_int_equal(target_child_do(c, CMD_CHECK, 200 + (uint64_t)i, (uint64_t)(N - 1 - i) * piece, piece), 0);
    }

    /* Deregistered behind the initiator's back, then registered again
     * read-only: every piece refused by the target, nothing placed. */
    local[5] = src; /* a mapped buffer again */
    assert_int_equal(target_child_do(c, CMD_DEREGISTER, 0, 0, 0), 0);
    assert_int_equal(target_child_do(c, CMD_FILL, 8, 0, cap), 0);
    assert_int_equal(write_batch(e, c, local, remote, N, piece, st), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    for (int i = 0; i < N; i++) assert_int_equal(st[i], FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(target_child_do(c, CMD_CHECK, 8, 0, cap), 0);
    assert_int_equal(target_child_do(c, CMD_REREGISTER_RO, 0, 0, 0), 0);
    assert_int_equal(write_batch(e, c, local, remote, N, piece, st), FERRY_ERR_ACCESS_DENIED);
    for (int i = 0; i < N; i++) assert_int_equal(st[i], FERRY_ERR_ACCESS_DENIED);
    assert_int_equal(target_child_do(c, CMD_CHECK, 8, 0, cap), 0);
    shm_pair_stop(c, e, src, cap, true);
}

/* A thread writing the same pieces again and again until a call fails. */
struct racing_writer {
    ferry_engine_t *e;
    const char *peer;
    int n, rc, calls;
    void *locals[1024];
    uint64_t remotes[1024];
    size_t lens[1024];
};

static void *write_until_refused(void *arg)
{
    struct racing_writer *w = arg;
    do {
        w->rc = ferry_batch_transfer_sync(w->e, w->peer, FERRY_OP_WRITE, w->locals, w->remotes, w->lens, (size_t)w->n);
        w->calls++;
    } while (w->rc == 0);
    return NULL;
}

/* Writes the n pieces in calls over and over from a second thread while
 * the target deregisters its buffer: the writes end refused, after at
 * least two calls, and nothing lands after the deregistration returned. */
static void deregistration_races_writes(ferry_engine_t *e, target_child_t *c, const ferry_request_t *reqs, int n)
{
    static struct racing_writer w;
    w = (struct racing_writer){.e = e, .peer = c->peer, .n = n};
    for (int i = 0; i < n; i++) {
        w.locals[i] = reqs[i].local;
        w.remotes[i] = reqs[i].remote;
        w.lens[i] = reqs[i].len;
    }
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, write_until_refused, &w), 0);
    usleep(100 * 1000);
    assert_int_equal(target_child_do(c, CMD_DEREGISTER_STILL, 0, 0, 0), 0);
    pthread_join(t, NULL);
    if (w.rc != FERRY_ERR_ADDRESS_NOT_REGISTERED) fail_msg("racing writes ended with %s", ferry_error_name(w.rc));
    if (w.calls < 2) fail_msg("only %d calls raced the deregistration", w.calls);
}

/* The initiator's pieces a permutation of one buffer, the target's
 * scattered elsewhere (paged KV): the target copies the frame in the
 * initiator's address order, where the pieces merge into one remote entry
 * (before: one per piece, the kernel pinning and walking the initiator's
 * pages entry by entry). Each piece still lands where it belongs; a hole
 * in the initiator's buffer fails exactly the pieces on it, as in
 * descriptor order; reads come back whole; a deregistered target refuses
 * every piece; and a deregistration racing a stream of such frames is
 * never followed by a byte landing (the whole frame moves under one hold
 * of the registry's read lock). */
static void pieces_copied_in_the_initiators_order(void **state)
{
    (void)state;
    enum { PIECE = 2048, N = 64, PER_PAGE = 4096 / PIECE };
    size_t cap = (size_t)N * PIECE;
    target_child_t *c;
    ferry_engine_t *e;
    unsigned char *src = shm_pair_start(cap, 1, &c, &e);
    ferry_request_t reqs[N];
    bool hole[N];
    for (int i = 0; i < N; i++) { /* piece i: initiator slot i*13+5, target slot i*29+3 (mod N) */
        size_t from = (size_t)((i * 13 + 5) % N) * PIECE;
        uint64_t to = (uint64_t)((i * 29 + 3) % N) * PIECE;
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + from, c->addr + to, PIECE};
        harness_fill(src + from, PIECE, 500 + (uint64_t)i);
        hole[i] = from / 4096 == 9; /* the initiator's page 9, unmapped below */
    }
    int calls0 = target_child_do(c, CMD_VEC_CALLS, 0, 0, 0), remote0 = target_child_do(c, CMD_VEC_REMOTE, 0, 0, 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(e, N, &b), 0);
    assert_int_equal(ferry_batch_submit(b, c->peer, reqs, N, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 10000), 0);
    assert_int_equal(ferry_batch_free(b), 0);
    int calls = target_child_do(c, CMD_VEC_CALLS, 0, 0, 0) - calls0, remote = target_child_do(c, CMD_VEC_REMOTE, 0, 0, 0) - remote0;
    if (calls != 1 || remote != 1)
        fail_msg("%d gathered copies with %d remote entries for %d permuted pieces of one buffer (1 and 1 expected)",
                 calls, remote, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(target_child_do(c, CMD_CHECK, 500 + (uint64_t)i, reqs[i].remote - c->addr, PIECE), 0);

    /* A hole: the copy stops in the first piece on page 9 (in the
     * initiator's order); it and its page mate fail, the rest land. */
    assert_int_equal(target_child_do(c, CMD_FILL, 9, 0, cap), 0);
    for (int i = 0; i < N; i++)
        if (!hole[i]) harness_fill(reqs[i].local, PIECE, 600 + (uint64_t)i);
    munmap(src + 9 * 4096, 4096);
    int holes = 0;
    for (int i = 0; i < N; i++) holes += hole[i];
    assert_int_equal(holes, PER_PAGE);
    run_pieces_expecting(e, c, reqs, N, hole);
    for (int i = 0; i < N; i++)
        if (!hole[i]) assert_int_equal(target_child_do(c, CMD_CHECK, 600 + (uint64_t)i, reqs[i].remote - c->addr, PIECE), 0);
    /* Reads: the same pieces back, the hole's refused. */
    for (int i = 0; i < N; i++) {
        assert_int_equal(target_child_do(c, CMD_FILL, 700 + (uint64_t)i, reqs[i].remote - c->addr, PIECE), 0);
        reqs[i].opcode = FERRY_OP_READ;
    }
    run_pieces_expecting(e, c, reqs, N, hole);
    for (int i = 0; i < N; i++)
        if (!hole[i] && !harness_check(reqs[i].local, PIECE, 700 + (uint64_t)i)) fail_msg("piece %d read back wrong", i);

    /* Page 9 back; a deregistration racing a stream of such writes: after
     * it returns, nothing lands. */
    map_again(src + 9 * 4096, 4096);
    deregistration_races_writes(e, c, reqs, N);
    shm_pair_stop(c, e, src, cap, true);
}

/* Runs the n pieces as one batch while the target's copy helper takes a
 * share of some call (up to tries calls; one is enough with two CPUs),
 * expecting the pieces marked in hole to fail and the rest to arrive;
 * fill(k, i): the seed of piece i in try k. The calls whose copy the
 * helper shared. */
static int shared_calls(ferry_engine_t *e, target_child_t *c, ferry_request_t *reqs, size_t n, const bool *hole,
                        int tries, uint64_t seed)
{
    int shared = 0;
    for (int k = 0; k < tries && !shared; k++) {
        for (size_t i = 0; i < n; i++) {
            if (reqs[i].opcode == FERRY_OP_WRITE && !hole[i]) harness_fill(reqs[i].local, reqs[i].len, seed + i);
            if (reqs[i].opcode == FERRY_OP_READ)
                assert_int_equal(target_child_do(c, CMD_FILL, seed + i, reqs[i].remote - c->addr, reqs[i].len), 0);
        }
        int before = target_child_do(c, CMD_HELPER_SHARES, 0, 0, 0);
        bool any_hole = false;
        for (size_t i = 0; i < n; i++) any_hole |= hole[i];
        if (any_hole) {
            run_pieces_expecting(e, c, reqs, n, hole);
        } else {
            ferry_batch_t *b;
            assert_int_equal(ferry_batch_alloc(e, n, &b), 0);
            assert_int_equal(ferry_batch_submit(b, c->peer, reqs, n, 0), 0);
            assert_int_equal(ferry_batch_wait(b, 10000), 0);
            assert_int_equal(ferry_batch_free(b), 0);
        }
        shared += target_child_do(c, CMD_HELPER_SHARES, 0, 0, 0) > before;
        for (size_t i = 0; i < n; i++) {
            if (hole[i]) continue;
            if (reqs[i].opcode == FERRY_OP_WRITE)
                assert_int_equal(target_child_do(c, CMD_CHECK, seed + i, reqs[i].remote - c->addr, reqs[i].len), 0);
            else if (!harness_check(reqs[i].local, reqs[i].len, seed + i))
                fail_msg("try %d: piece %zu read back wrong", k, i);
        }
    }
    return shared;
}

/* A frame of 1,024 x 4 KiB (4 MiB) whose initiator side is a permutation
 * of one buffer: the target copies it in the initiator's order in parts,
 * its serving thread from the front and, with two CPUs or more, its copy
 * helper from the back (shm_helper.c). Every piece lands where it belongs,
 * whichever thread moved it; holes at both ends of the initiator's buffer
 * fail exactly their pieces, in the helper's parts as in the serving
 * thread's; reads come back whole; and a deregistration racing a stream of
 * such frames is never followed by a byte landing (the helper copies only
 * while the serving thread holds the registry's read lock and waits for
 * it). */
/* Runs calls synchronous calls of the n writes: one frame and one answer
 * a call, as the engine runs small pieces unsplit. The waits for those
 * answers this process let nap meanwhile (FERRY_SPIN_NAP, link/conn.h),
 * and in *naps those that did (which takes long, regular waits). */
static unsigned long nap_waits_in_calls(ferry_engine_t *e, target_child_t *c, const ferry_request_t *reqs, size_t n,
                                        int calls, unsigned long *naps)
{
    void **locals = calloc(n, sizeof *locals);
    uint64_t *remotes = calloc(n, sizeof *remotes);
    size_t *lens = calloc(n, sizeof *lens);
    assert_non_null(locals);
    assert_non_null(remotes);
    assert_non_null(lens);
    for (size_t i = 0; i < n; i++) locals[i] = reqs[i].local, remotes[i] = reqs[i].remote, lens[i] = reqs[i].len;
    unsigned long waits0, waits1, naps0 = ferry_conn_naps(&waits0);
    for (int k = 0; k < calls; k++)
        assert_int_equal(ferry_batch_transfer_sync(e, c->peer, FERRY_OP_WRITE, locals, remotes, lens, n), 0);
    *naps = ferry_conn_naps(&waits1) - naps0;
    free(locals);
    free(remotes);
    free(lens);
    return waits1 - waits0;
}

static void large_frames_copy_on_two_threads(void **state)
{
    (void)state;
    enum { PIECE = 4096, N = 1024 };
    size_t cap = (size_t)N * PIECE;
    target_child_t *c;
    ferry_engine_t *e;
    unsigned char *src = shm_pair_start(cap, 1, &c, &e);
    static ferry_request_t reqs[N];
    static bool none[N], hole[N];
    for (int i = 0; i < N; i++) { /* piece i: initiator page i*613+7, target page i*733+7 (mod N) */
        size_t from = (size_t)((i * 613 + 7) % N);
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + from * PIECE, c->addr + (uint64_t)((i * 733 + 7) % N) * PIECE,
                                    PIECE};
        hole[i] = from == 2 || from == N - 3; /* unmapped below: one in the first part, one in the last */
    }
    bool two_cpus = ferry_spin_cpus() >= 2;
    int shared = shared_calls(e, c, reqs, N, none, 200, 100000);
    if (two_cpus && !shared) fail_msg("the copy helper took no share of 200 frames of 4 MiB");
    /* The initiator's CPU is not idle through a shared copy: its waits
     * for the answers never nap (shm.c, copied_on_one_thread). */
    unsigned long naps, waits = nap_waits_in_calls(e, c, reqs, N, 50, &naps);
    if (waits || naps) fail_msg("%lu waits (%lu naps) let nap for frames the copy helper shares", waits, naps);
    int calls0 = target_child_do(c, CMD_VEC_CALLS, 0, 0, 0);
    shared_calls(e, c, reqs, N, none, 1, 200000);
    int calls = target_child_do(c, CMD_VEC_CALLS, 0, 0, 0) - calls0;
    if (calls < 2) fail_msg("a frame of 4 MiB copied in %d calls (parts of 256 KiB expected)", calls);

    assert_int_equal(target_child_do(c, CMD_FILL, 9, 0, cap), 0);
    munmap(src + 2 * PIECE, PIECE);
    munmap(src + (size_t)(N - 3) * PIECE, PIECE);
    shared = shared_calls(e, c, reqs, N, hole, 50, 300000);
    if (two_cpus && !shared) fail_msg("the copy helper took no share of 50 frames with holes");
    for (int i = 0; i < N; i++) reqs[i].opcode = FERRY_OP_READ;
    shared = shared_calls(e, c, reqs, N, hole, 50, 400000);
    if (two_cpus && !shared) fail_msg("the copy helper took no share of 50 read frames");

    map_again(src + 2 * PIECE, PIECE);
    map_again(src + (size_t)(N - 3) * PIECE, PIECE);
    deregistration_races_writes(e, c, reqs, N);
    shm_pair_stop(c, e, src, cap, false);
}

/* 1,024 x 2 KiB out of one 2 MiB-aligned buffer: all of the initiator's
 * side lies under one page-table page, where two threads pinning at once
 * contend on its lock and gain nothing, so the target copies such a frame
 * in its serving thread alone (shm_vec.c, halves_apart); every piece lands. */
static void frames_under_one_page_table_copy_alone(void **state)
{
    (void)state;
    enum { PIECE = 2048, N = 1024 };
    size_t span = (size_t)N * PIECE; /* 2 MiB */
    target_child_t *c = child_start(span, 0);
    ferry_engine_t *e = initiator("shm", 1);
    unsigned char *map = mmap(NULL, 2 * span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(map != MAP_FAILED);
    unsigned char *src = (unsigned char *)(((uintptr_t)map + span - 1) & ~(uintptr_t)(span - 1));
    assert_int_equal(ferry_register(e, src, span, FERRY_MEM_LOCAL), 0);
    static ferry_request_t reqs[N];
    static bool none[N];
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)((i * 613 + 7) % N) * PIECE,
                                    c->addr + (uint64_t)((i * 733 + 7) % N) * PIECE, PIECE};
    int before = target_child_do(c, CMD_HELPER_SHARES, 0, 0, 0);
    if (shared_calls(e, c, reqs, N, none, 20, 500000) != 0)
        fail_msg("the copy helper shared a frame whose initiator side lies under one page-table page");
    assert_int_equal(target_child_do(c, CMD_HELPER_SHARES, 0, 0, 0), before);
    /* Copied on one thread, the frame leaves the initiator's CPU idle: the
     * waits for its answers may nap (when long and regular: spin.h). */
    unsigned long naps, waits = nap_waits_in_calls(e, c, reqs, N, 50, &naps);
    printf("50 calls of 1,024 x 2 KiB: %lu waits let nap, %lu napped\n", waits, naps);
    if (waits < 49) fail_msg("%lu of 50 answers to frames copied on one thread were let nap", waits);
    ferry_engine_destroy(e);
    munmap(map, 2 * span);
    target_child_stop(c);
}

/* Calls of 1 MiB pieces to distinct slots: the target shares each
 * gathered copy (4 MiB here) with its copy helper where a CPU is idle
 * (shm_vec.c, large_chunk_shared), and an initiator told so
 * (FERRY_HELLO_F_CMA_SHARE) runs such calls in the caller's thread on one
 * connection instead of splitting them over two (transfer.c, run_inline).
 * Every piece lands where it belongs, whichever thread moved it; a hole in
 * a piece at either end of a gathered copy fails exactly that piece; reads
 * come back whole; pieces writing over one another are copied by one
 * thread, in the caller's order, and such a call stays split; and a
 * deregistration racing a stream of such calls is never followed by a
 * byte landing. */
static void large_pieces_share_their_copy(void **state)
{
    (void)state;
    enum { N = 8 };
    size_t piece = 1u << 20, cap = N * piece;
    target_child_t *c;
    ferry_engine_t *e;
    unsigned char *src = shm_pair_start(cap, 2, &c, &e);
    static ferry_request_t reqs[N];
    static bool none[N], hole[N];
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) { /* piece i into slot N-1-i */
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)i * piece, c->addr + (uint64_t)(N - 1 - i) * piece,
                                    piece};
        locals[i] = reqs[i].local, remotes[i] = reqs[i].remote, lens[i] = piece;
        hole[i] = i == 0 || i == 3 || i == 6; /* both ends of the first copy, and the second's */
    }
    bool two_cpus = ferry_spin_cpus() >= 2;
    if (two_cpus && !shared_calls(e, c, reqs, N, none, 200, 100000))
        fail_msg("the copy helper took no share of 200 frames of 8 x 1 MiB");

    uint64_t unsplit0 = ferry_test_shared_inline_calls();
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N; i++) harness_fill(locals[i], piece, 1000 * (uint64_t)k + (uint64_t)i);
        assert_int_equal(ferry_batch_transfer_sync(e, c->peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
    }
    uint64_t unsplit = ferry_test_shared_inline_calls() - unsplit0;
    if (unsplit < 2) fail_msg("%llu of 3 calls of 1 MiB pieces ran unsplit (2 expected)", (unsigned long long)unsplit);
    for (int i = 0; i < N; i++)
        assert_int_equal(target_child_do(c, CMD_CHECK, 2000 + (uint64_t)i, remotes[i] - c->addr, piece), 0);

    for (int i = 0; i < N; i++)
        if (hole[i]) munmap((unsigned char *)locals[i] + piece / 2, 4096);
    if (two_cpus && !shared_calls(e, c, reqs, N, hole, 50, 300000))
        fail_msg("the copy helper took no share of 50 frames with holes");
    for (int i = 0; i < N; i++) reqs[i].opcode = FERRY_OP_READ;
    if (two_cpus && !shared_calls(e, c, reqs, N, hole, 50, 400000))
        fail_msg("the copy helper took no share of 50 read frames");
    for (int i = 0; i < N; i++) {
        reqs[i].opcode = FERRY_OP_WRITE;
        if (hole[i]) map_again((unsigned char *)locals[i] + piece / 2, 4096);
    }

    /* Pieces 2k and 2k+1 into one slot: never shared, never unsplit; the
     * later piece of each pair is what the slot holds. */
    for (int i = 0; i < N; i++) {
        remotes[i] = c->addr + (uint64_t)(i / 2) * piece;
        harness_fill(locals[i], piece, 5000 + (uint64_t)i);
    }
    int shares0 = target_child_do(c, CMD_HELPER_SHARES, 0, 0, 0);
    unsplit0 = ferry_test_shared_inline_calls();
    for (int k = 0; k < 20; k++)
        assert_int_equal(ferry_batch_transfer_sync(e, c->peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
    assert_int_equal(target_child_do(c, CMD_HELPER_SHARES, 0, 0, 0), shares0);
    assert_int_equal(ferry_test_shared_inline_calls(), unsplit0);
    for (int i = 1; i < N; i += 2)
        assert_int_equal(target_child_do(c, CMD_CHECK, 5000 + (uint64_t)i, remotes[i] - c->addr, piece), 0);

    deregistration_races_writes(e, c, reqs, N);
    shm_pair_stop(c, e, src, cap, true);
}

/* Calls of small pieces over two connections: the target copies them one
 * call at a time per initiator whichever connection they come on (two at
 * once contend in the kernel's walk of the initiator's pages), so after
 * the first such call the engine runs them in the caller's thread on one
 * connection (transport.h, small_serial), not half on a worker; calls of
 * 1 MiB pieces, which the target copies in parallel, stay split. */
static void small_pieces_run_unsplit(void **state)
{
    (void)state;
    enum { PIECE = 2048, N = 256, BIG = 8 };
    size_t cap = BIG << 20;
    target_child_t *c = child_start(cap, 0);
    ferry_engine_t *e = initiator("shm", 2);
    unsigned char *src = malloc(cap);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        locals[i] = src + (size_t)((i * 37 + 1) % N) * PIECE;
        remotes[i] = c->addr + (uint64_t)((i * 91 + 5) % N) * PIECE;
        lens[i] = PIECE;
    }
    uint64_t inline0 = ferry_test_small_inline_calls();
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N; i++) harness_fill(locals[i], PIECE, 1000 * (uint64_t)k + (uint64_t)i);
        assert_int_equal(ferry_batch_transfer_sync(e, c->peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
    }
    uint64_t unsplit = ferry_test_small_inline_calls() - inline0;
    if (unsplit < 2) fail_msg("%llu of the 3 calls of small pieces ran unsplit (2 expected)", (unsigned long long)unsplit);
    for (int i = 0; i < N; i++) /* the last call's pieces landed */
        assert_int_equal(target_child_do(c, CMD_CHECK, 2000 + (uint64_t)i, remotes[i] - c->addr, PIECE), 0);
    void *big_l[BIG];
    uint64_t big_r[BIG];
    size_t big_n[BIG];
    for (int i = 0; i < BIG; i++) {
        big_l[i] = src + ((size_t)i << 20);
        big_r[i] = c->addr + ((uint64_t)(BIG - 1 - i) << 20);
        big_n[i] = 1u << 20;
    }
    inline0 = ferry_test_small_inline_calls();
    harness_fill(src, cap, 77);
    assert_int_equal(ferry_batch_transfer_sync(e, c->peer, FERRY_OP_WRITE, big_l, big_r, big_n, BIG), 0);
    assert_int_equal(ferry_batch_transfer_sync(e, c->peer, FERRY_OP_WRITE, big_l, big_r, big_n, BIG), 0);
    assert_int_equal(ferry_test_small_inline_calls(), inline0);
    ferry_engine_destroy(e);
    free(src);
    target_child_stop(c);
}

/* A target that refuses cross-memory attach answers a frame of small
 * pieces with the refusal: the session moves to tcp and the same pieces
 * arrive. */
static void small_pieces_fall_back(void **state)
{
    (void)state;
    size_t cap = 4u << 20;
    target_child_t *c = child_start(cap, 1);
    ferry_engine_t *e = initiator(NULL, 0);
    unsigned char *src = malloc(cap);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    ferry_peer_info_t info;
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "shm");
    harness_reverse_batch_round_trip(e, c->peer, src, c->addr, 500, 2048, 31);
    info_of(e, c->peer, &info);
    assert_string_equal(info.transport, "tcp");
    assert_non_null(strstr(info.transport_reason, "FERRY_SHM_DISABLE"));
    ferry_engine_destroy(e);
    free(src);
    target_child_stop(c);
}

/* ----------------------------------------------- device memory, relays */

/* "Device" memory the CPU cannot touch (PROT_NONE; the fake kind's copy
 * functions reach it through a second mapping): the kernel's attach cannot
 * either, so only staging gets the bytes there. */
/* Target device memory: the target stages each chunk (attach into its
 * bounce buffer, then the kind's copy); the session stays on shm. Initiator
 * device memory: those pieces go over TCP, which stages them. */
static void device_memory_over_shm(void **state)
{
    (void)state;
    ferry_engine_t *t = initiator(NULL, 0), *e = initiator("shm", 0);
    char peer[300];
    snprintf(peer, sizeof peer, "%s", ferry_engine_name(t));
    size_t len = (9u << 20) + 5;
    fake_dev_t dev = fake_dev_new(len);
    unsigned char *host = malloc(len);
    assert_int_equal(ferry_register(t, dev.base, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(e, host, len, FERRY_MEM_LOCAL), 0);
    unsigned long th0, fh0, th1, fh1;
    ferry_memkind_fake_counts(&th0, &fh0);
    harness_fill(host, len, 5);
    int rc = ferry_transfer_sync(e, peer, FERRY_OP_WRITE, host, (uint64_t)(uintptr_t)dev.base, len);
    if (rc) fail_msg("write into device memory: %s", ferry_last_error_detail());
    assert_true(harness_check(dev.alias, len, 5));
    harness_fill(dev.alias, len, 6);
    memset(host, 0, len);
    rc = ferry_transfer_sync(e, peer, FERRY_OP_READ, host, (uint64_t)(uintptr_t)dev.base, len);
    if (rc) fail_msg("read from device memory: %s", ferry_last_error_detail());
    assert_true(harness_check(host, len, 6));
    ferry_memkind_fake_counts(&th1, &fh1);
    assert_true(fh1 > fh0 && th1 > th0); /* staged both ways */
    ferry_peer_info_t info;
    info_of(e, peer, &info);
    assert_string_equal(info.transport, "shm");
    ferry_deregister(t, dev.base);
    ferry_deregister(e, host);

    /* The initiator's buffer in device memory, the target's in host memory. */
    unsigned char *dst = malloc(len);
    assert_int_equal(ferry_register(t, dst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(e, dev.base, len, FERRY_MEM_LOCAL), 0);
    harness_fill(dev.alias, len, 7);
    rc = ferry_transfer_sync(e, peer, FERRY_OP_WRITE, dev.base, (uint64_t)(uintptr_t)dst, len);
    if (rc) fail_msg("write from device memory: %s", ferry_last_error_detail());
    assert_true(harness_check(dst, len, 7));
    memset(dev.alias, 0, len);
    rc = ferry_transfer_sync(e, peer, FERRY_OP_READ, dev.base, (uint64_t)(uintptr_t)dst, len);
    if (rc) fail_msg("read into device memory: %s", ferry_last_error_detail());
    assert_true(harness_check(dev.alias, len, 7));
    ferry_engine_destroy(e);
    ferry_engine_destroy(t);
    fake_dev_free(&dev);
    free(host);
    free(dst);
}

/* Through a relay (the dialed port is not the peer's): the bytes stay on
 * the connection, as whoever put the relay there wants. */
static void relay_keeps_bytes_on_tcp(void **state)
{
    (void)state;
    ferry_engine_t *t = initiator(NULL, 0), *e = initiator(NULL, 0);
    delay_proxy_t *px = delay_proxy_start(ferry_engine_port(t), 0, 0);
    size_t len = 1u << 20;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(e, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(t, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 8);
    uint64_t before = delay_proxy_bytes_to_target(px);
    assert_int_equal(ferry_transfer_sync(e, delay_proxy_name(px), FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len),
                     0);
    assert_true(harness_check(dst, len, 8));
    assert_true(delay_proxy_bytes_to_target(px) - before >= len); /* the bytes went through the relay */
    ferry_peer_info_t info;
    info_of(e, delay_proxy_name(px), &info);
    assert_string_equal(info.transport, "tcp");
    assert_non_null(strstr(info.transport_reason, "intermediary"));
    ferry_engine_destroy(e);
    delay_proxy_stop(px);
    ferry_engine_destroy(t);
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_processes_round_trip),
        cmocka_unit_test(verified_through_proc),
        cmocka_unit_test(target_validates_over_shm),
        cmocka_unit_test(fallback_when_target_refuses),
        cmocka_unit_test(transport_forced_by_config),
        cmocka_unit_test(spoofed_pid_is_refused),
        cmocka_unit_test(socket_of_another_user),
        cmocka_unit_test(unmapped_local_buffer),
        cmocka_unit_test(small_pieces_over_shm),
        cmocka_unit_test(small_pieces_fall_back),
        cmocka_unit_test(large_pieces_in_vector_frames),
        cmocka_unit_test(pieces_copied_in_the_initiators_order),
        cmocka_unit_test(small_pieces_run_unsplit),
        cmocka_unit_test(large_frames_copy_on_two_threads),
        cmocka_unit_test(frames_under_one_page_table_copy_alone),
        cmocka_unit_test(large_pieces_share_their_copy),
        cmocka_unit_test(device_memory_over_shm),
        cmocka_unit_test(relay_keeps_bytes_on_tcp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
