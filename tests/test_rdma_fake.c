/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport end to end, on the software HCA of
 * tests/support/rdma_fake.c (no RDMA hardware or kernel support is
 * needed): two engines in one process, the verbs table replaced by
 * ferry_rdma_test_use_verbs(). The group commit is test_rdma_group.c.
 *
 * Needs <infiniband/verbs.h>; skipped in builds without the verbs code. */
#ifndef FERRY_HAVE_RDMA
#include "harness.h"
static void skipped(void **state)
{
    (void)state;
    skip();
}
int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "transport/rdma/rdma_wire.h"
#include "util/clock.h"
#include "engine/xport.h"
#include "engine/session.h"
#include "link/conn.h"
#include "util/memkind.h"
#include "util/net.h"
#include "engine/testing.h"
#include "harness.h"
#include "transport/rdma/rdma.h"
#include "rdma_fake.h"

/* ============================================================ the tests */


static void auto_selects_rdma(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    char why[128];
    assert_int_equal(ferry_rdma_local(ferry_engine_xport(p.target), why, sizeof why), 1);
    assert_string_equal(why, "fakerdma0 port 1 (InfiniBand, lid 1)");
    assert_int_equal(ferry_session_open(p.initiator, p.peer), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
    assert_string_equal(info.transport, "rdma");
    assert_non_null(strstr(info.transport_reason, "rdma on fakerdma0"));
    pair_end(&p);
}

/* A peer that has RDMA turned off advertises nothing: the next transport in
 * line (shm, the peer being on this host), saying why not rdma. */
static void peer_without_rdma_gets_tcp(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    ferry_rdma_env_t env;
    assert_int_equal(ferry_rdma_env_load(&env), 0);
    env.enabled = 0;
    char why[128];
    assert_int_equal(ferry_rdma_reprobe(ferry_engine_xport(p.target), &env, why, sizeof why), 0);
    assert_int_equal(ferry_session_open(p.initiator, p.peer), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
    assert_string_equal(info.transport, "shm");
    assert_non_null(strstr(info.transport_reason, "not rdma: the peer has no usable RDMA device"));
    pair_end(&p);
}

static void writes_and_reads_of_every_size(void **state)
{
    (void)state;
    pair_t p = pair_make(20000);
    const size_t sizes[] = {1, 4096, (3u << 20) + 5, 64u << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t len = sizes[k];
        unsigned char *src = malloc(len), *dst = calloc(1, len), *back = calloc(1, len);
        assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_register(p.initiator, back, len, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
        harness_fill(src, len, len);
        unsigned long long before = hca_bytes();
        int rc = write_sync(&p, src, dst, len);
        if (rc) fprintf(stderr, "%s\n", ferry_last_error_detail());
        assert_int_equal(rc, 0);
        assert_true(harness_check(dst, len, len));
        rc = ferry_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, back, (uint64_t)(uintptr_t)dst, len);
        assert_int_equal(rc, 0);
        assert_true(harness_check(back, len, len));
        /* Every byte went through the HCA, none inline over TCP. */
        assert_true(hca_bytes() - before == 2ull * len);
        ferry_deregister(p.initiator, src);
        ferry_deregister(p.initiator, back);
        ferry_deregister(p.target, dst);
        free(src);
        free(dst);
        free(back);
    }
    pair_end(&p);
}

/* More pieces than the send queue and the commit window hold. */
static void batches_beyond_every_window(void **state)
{
    (void)state;
    pair_t p = pair_make(20000);
    enum { N = 150, LEN = 8192 };
    unsigned char *src = malloc((size_t)N * LEN), *dst = calloc(N, LEN);
    assert_int_equal(ferry_register(p.initiator, src, (size_t)N * LEN, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, (size_t)N * LEN, FERRY_MEM_REMOTE), 0);
    harness_fill(src, (size_t)N * LEN, 5);
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        locals[i] = src + (size_t)i * LEN;
        remotes[i] = (uint64_t)(uintptr_t)(dst + (size_t)i * LEN);
        lens[i] = LEN;
    }
    long regs = hca_get(&H.regs), imms = hca_get(&H.imms);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
    assert_true(harness_check(dst, (size_t)N * LEN, 5));
    /* The pieces were committed in groups: one immediate (and one
     * RDMA_COMMIT_GROUP) per connection the batch ran on. */
    assert_in_range(hca_get(&H.imms) - imms, 1, 2);
    /* One memory region per registered region and side, made lazily. */
    assert_int_equal(hca_get(&H.regs) - regs, 2);

    /* Async, with progress counted at commit. */
    memset(dst, 0, (size_t)N * LEN);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &b), 0);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++) reqs[i] = (ferry_request_t){FERRY_OP_WRITE, locals[i], remotes[i], LEN};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, N, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 20000), 0);
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        assert_int_equal(st.state, FERRY_STATUS_COMPLETED);
        assert_int_equal(st.bytes, LEN);
    }
    assert_true(harness_check(dst, (size_t)N * LEN, 5));
    assert_int_equal(ferry_batch_free(b), 0);
    assert_int_equal(hca_get(&H.regs) - regs, 2);
    long deregs = hca_get(&H.deregs);
    ferry_deregister(p.target, dst);
    assert_int_equal(hca_get(&H.deregs) - deregs, 1);
    ferry_deregister(p.initiator, src);
    free(src);
    free(dst);
    pair_end(&p);
}

struct async_write {
    pair_t *p;
    void *src, *dst;
    size_t len;
    int rc;
    char detail[1024];
};

static void *async_write_main(void *arg)
{
    struct async_write *a = arg;
    a->rc = write_sync(a->p, a->src, a->dst, a->len);
    snprintf(a->detail, sizeof a->detail, "%s", ferry_last_error_detail());
    return NULL;
}

/* A deregistration while writes to the region are queued at the HCA: once
 * ferry_deregister returns, not one byte lands, and the writer learns the
 * region is gone. */
static void deregistration_stops_queued_writes(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 4u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 1);
    assert_int_equal(write_sync(&p, src, dst, len), 0); /* QPs and keys exist now */
    memset(dst, 0xee, len);
    harness_fill(src, len, 2);
    hca_pause(1);
    struct async_write a = {&p, src, dst, len, 0, ""};
    pthread_t t;
    pthread_create(&t, NULL, async_write_main, &a);
    wait_queued(4); /* all four slices wait at the HCA */
    assert_int_equal(ferry_deregister(p.target, dst), 0);
    hca_pause(0);
    pthread_join(t, NULL);
    assert_int_equal(a.rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    for (size_t i = 0; i < len; i++)
        if (dst[i] != 0xee) fail_msg("byte %zu landed after the deregistration", i);
    ferry_deregister(p.initiator, src);
    free(src);
    free(dst);
    pair_end(&p);
}

/* A target that re-registered the region: the old key fails at the HCA,
 * the call learns the new key and succeeds the first time. */
static void reregistered_region_is_stale_then_works(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 1u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 3);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    assert_int_equal(ferry_deregister(p.target, dst), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    memset(dst, 0, len);
    /* The old key fails at the HCA (nothing placed); the call learns the
     * new key and the write lands, in the same call. */
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    assert_true(harness_check(dst, len, 3));
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* The HCA stalls past the deadline: TIMEOUT, no hang, and the queued
 * writes are flushed, so nothing lands when the HCA wakes up. */
static void stalled_hca_times_out_without_late_writes(void **state)
{
    (void)state;
    pair_t p = pair_make(400);
    size_t len = 2u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 4);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    memset(dst, 0x5a, len);
    hca_pause(1);
    uint64_t t0 = harness_now_ms();
    assert_int_equal(write_sync(&p, src, dst, len), FERRY_ERR_TIMEOUT);
    assert_detail_contains("no RDMA completion");
    assert_true(harness_now_ms() - t0 >= 390);
    assert_int_equal(hca_queued(), 0); /* flushed, none left to run */
    hca_pause(0);
    usleep(20000);
    for (size_t i = 0; i < len; i++)
        if (dst[i] != 0x5a) fail_msg("byte %zu landed after the timeout", i);
    /* The broken QP was dropped: the next write uses a fresh one. */
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    assert_true(harness_check(dst, len, 4));
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

struct resumer {
    int ms;
};
static void *resume_later(void *arg)
{
    usleep((useconds_t)((struct resumer *)arg)->ms * 1000);
    hca_pause(0);
    return NULL;
}

static double thread_cpu_ms(void)
{
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

/* Waiting for completions blocks on the channel: a 300 ms wait costs the
 * waiting thread almost no CPU (a spinning wait would cost ~300 ms). */
static void completion_wait_does_not_spin(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 1u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    hca_pause(1);
    struct resumer r = {300};
    pthread_t t;
    pthread_create(&t, NULL, resume_later, &r);
    double cpu0 = thread_cpu_ms();
    uint64_t t0 = harness_now_ms();
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    double cpu = thread_cpu_ms() - cpu0;
    uint64_t wall = harness_now_ms() - t0;
    pthread_join(t, NULL);
    assert_true(wall >= 250);
    if (cpu > 100.0) fail_msg("the waiting thread used %.1f ms of CPU in %llu ms", cpu, (unsigned long long)wall);
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* A port failure (retry counter exceeded) breaks the QP; Ferry retries on
 * a fresh connection and queue pair and completes. */
static void port_failure_is_retried_on_a_new_queue_pair(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 2u << 20;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 6);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    memset(dst, 0, len);
    long qps = hca_get(&H.qps_made);
    pthread_mutex_lock(&H.lock);
    H.fail_next_wr = 1;
    pthread_mutex_unlock(&H.lock);
    int rc = write_sync(&p, src, dst, len);
    if (rc) fprintf(stderr, "%s\n", ferry_last_error_detail());
    assert_int_equal(rc, 0);
    assert_true(harness_check(dst, len, 6));
    assert_true(hca_get(&H.qps_made) - qps >= 2); /* a new pair of QPs */
    /* With no retries left, the failure is reported with its cause. */
    ferry_engine_destroy(p.initiator);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 10000;
    cfg.retries = 0;
    p.initiator = harness_engine_cfg(&cfg);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    pthread_mutex_lock(&H.lock);
    H.fail_next_wr = 1;
    pthread_mutex_unlock(&H.lock);
    assert_int_equal(write_sync(&p, src, dst, len), FERRY_ERR_PEER_CLOSED);
    assert_detail_contains("stopped answering");
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* The target cannot make its QP: the session moves to TCP, says why, and
 * the transfer completes. */
static void target_qp_failure_falls_back_to_tcp(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = 1u << 20;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 7);
    pthread_mutex_lock(&H.lock);
    H.qp_fail_skip = 1; /* the initiator's QP is made, the target's is not */
    H.qp_fail = 1;
    pthread_mutex_unlock(&H.lock);
    unsigned long long before = hca_bytes();
    assert_int_equal(write_sync(&p, src, dst, len), 0);
    assert_true(harness_check(dst, len, 7));
    assert_true(hca_bytes() == before);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
    assert_string_equal(info.transport, "tcp");
    assert_non_null(strstr(info.transport_reason, "rdma setup failed, fell back to tcp: "));
    assert_non_null(strstr(info.transport_reason, "ibv_create_qp"));
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* Device memory the HCA cannot register (no GPUDirect): those pieces go
 * inline over the same TCP connection with host staging, the others by
 * RDMA, in one batch. */
static void device_memory_moves_over_tcp_with_staging(void **state)
{
    (void)state;
    pair_t p = pair_make(10000);
    size_t len = (1u << 20) + 9;
    int fd = memfd_create("ferry-fake-device", MFD_CLOEXEC);
    assert_int_equal(ftruncate(fd, (off_t)len), 0);
    unsigned char *dev = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
    unsigned char *alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_int_equal(ferry_memkind_fake_add(dev, len, alias), 0);
    unsigned char *src = malloc(2 * len), *hostdst = calloc(1, len);
    assert_int_equal(ferry_register(p.initiator, src, 2 * len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dev, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(p.target, hostdst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, 2 * len, 8);
    void *locals[2] = {src, src + len};
    uint64_t remotes[2] = {(uint64_t)(uintptr_t)dev, (uint64_t)(uintptr_t)hostdst};
    size_t lens[2] = {len, len};
    unsigned long th0, fh0, th1, fh1;
    ferry_memkind_fake_counts(&th0, &fh0);
    unsigned long long before = hca_bytes();
    int rc = ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, locals, remotes, lens, 2);
    if (rc) fprintf(stderr, "%s\n", ferry_last_error_detail());
    assert_int_equal(rc, 0);
    assert_true(harness_check(alias, len, 8));
    unsigned char *expect = malloc(2 * len);
    harness_fill(expect, 2 * len, 8);
    assert_memory_equal(hostdst, expect + len, len);
    ferry_memkind_fake_counts(&th1, &fh1);
    /* Staged into the device: the target lands each slice in pinned pieces
     * of at most 256 KiB (tcp_internal.h, LAND_SLICE): 1 MiB + 9 in 5. */
    assert_int_equal(fh1 - fh0, (len + (256u << 10) - 1) / (256u << 10));
    assert_true(hca_bytes() - before == len);     /* the host piece went by RDMA */
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p.initiator, p.peer, &info), 0);
    assert_string_equal(info.transport, "rdma"); /* the session stays on RDMA */
    /* And back: a read out of device memory. */
    memset(src, 0, len);
    assert_int_equal(ferry_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, src, (uint64_t)(uintptr_t)dev, len), 0);
    assert_memory_equal(src, expect, len);
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dev);
    ferry_deregister(p.target, hostdst);
    ferry_memkind_fake_remove(dev);
    munmap(dev, len);
    munmap(alias, len);
    free(src);
    free(hostdst);
    free(expect);
    pair_end(&p);
}

/* Cancel: when ferry_batch_cancel returns, nothing of the batch is left
 * at the HCA. */
static void cancel_leaves_nothing_on_the_wire(void **state)
{
    (void)state;
    pair_t p = pair_make(20000);
    size_t len = 32u << 20;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p.initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, dst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(write_sync(&p, src, 4096 + dst, 4096), 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, 4, &b), 0);
    ferry_request_t reqs[4];
    for (int i = 0; i < 4; i++)
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)i * (len / 4),
                                    (uint64_t)(uintptr_t)(dst + (size_t)i * (len / 4)), len / 4};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, 4, 0), 0);
    assert_int_equal(ferry_batch_cancel(b), 0);
    assert_int_equal(hca_queued(), 0);
    for (int i = 0; i < 4; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        assert_true(st.state == FERRY_STATUS_CANCELLED || st.state == FERRY_STATUS_COMPLETED);
    }
    assert_int_equal(ferry_batch_free(b), 0);
    ferry_deregister(p.initiator, src);
    ferry_deregister(p.target, dst);
    free(src);
    free(dst);
    pair_end(&p);
}

/* The target's RDMA frames, raw: key queries are validated like any
 * access, and protocol errors close the connection. */
static void target_validates_key_queries(void **state)
{
    (void)state;
    pair_t p = pair_make(5000);
    unsigned char *dst = malloc(8192);
    assert_int_equal(ferry_register(p.target, dst, 8192, FERRY_MEM_REMOTE_READ), 0);
    ferry_session_t *s;
    ferry_conn_t *c;
    uint64_t dl = ferry_deadline_after_ms(5000);
    assert_int_equal(ferry_session_get(p.initiator, p.peer, &s), 0);
    assert_int_equal(ferry_session_checkout(s, dl, &c), 0);
    ferry_frame_t q = {.type = FERRY_FRAME_RDMA_MR_QUERY, .req_id = 1, .addr = (uint64_t)(uintptr_t)dst, .len = 8192,
                       .aux = (uint64_t)FERRY_MEM_REMOTE_READ << 32}, f;
    /* Readable: the key of the whole region. */
    assert_int_equal(ferry_conn_send_frame(c, &q, NULL, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_RDMA_MR_INFO);
    assert_int_equal(f.status, 0);
    assert_int_equal(f.plen, FERRY_RDMA_MR_INFO_SIZE);
    uint8_t buf[FERRY_RDMA_MR_INFO_SIZE];
    assert_int_equal(ferry_net_recv(c->fd, buf, sizeof buf, dl), 0);
    ferry_rdma_mr_info_t m;
    assert_int_equal(ferry_rdma_mr_info_decode(buf, sizeof buf, &m), 0);
    assert_int_equal(m.addr, (uint64_t)(uintptr_t)dst);
    assert_int_equal(m.len, 8192);
    assert_int_equal(m.flags, FERRY_MEM_REMOTE_READ);
    /* Not writable; out of bounds; unregistered; wrong generation. */
    struct {
        uint64_t addr, len, aux;
        int code;
        const char *text;
    } bad[] = {
        {(uint64_t)(uintptr_t)dst, 8192, (uint64_t)FERRY_MEM_REMOTE_WRITE << 32, FERRY_ERR_ACCESS_DENIED,
         "remote read only"},
        {(uint64_t)(uintptr_t)dst + 4096, 8192, (uint64_t)FERRY_MEM_REMOTE_READ << 32, FERRY_ERR_OUT_OF_BOUNDS,
         "past the end"},
        {4096, 1, (uint64_t)FERRY_MEM_REMOTE_READ << 32, FERRY_ERR_ADDRESS_NOT_REGISTERED, "not registered"},
        {(uint64_t)(uintptr_t)dst, 1, ((uint64_t)FERRY_MEM_REMOTE_READ << 32) | (m.generation + 1),
         FERRY_ERR_STALE_SEGMENT, "registered again"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        q.addr = bad[i].addr;
        q.len = bad[i].len;
        q.aux = bad[i].aux;
        assert_int_equal(ferry_conn_send_frame(c, &q, NULL, dl), 0);
        assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
        assert_int_equal(f.status, bad[i].code);
        assert_int_equal(ferry_rdma_read_refusal(c, &f, "the RDMA key", dl), bad[i].code);
        assert_detail_contains(bad[i].text);
    }
    /* A second CONNECT on a connection is refused, the first accepted. */
    ferry_rdma_qp_info_t qi = {.qpn = 0x999, .psn = 1, .lid = 1, .port = 1, .link_layer = FERRY_RDMA_LINK_IB,
                               .mtu = 5, .rd_atom = 1, .recv_depth = 8};
    uint8_t qb[FERRY_RDMA_QP_INFO_SIZE];
    ferry_rdma_qp_info_encode(&qi, qb);
    for (int k = 0; k < 2; k++) {
        ferry_frame_t cf = {.type = FERRY_FRAME_RDMA_CONNECT, .plen = sizeof qb};
        assert_int_equal(ferry_conn_send_frame(c, &cf, qb, dl), 0);
        assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
        assert_int_equal(f.type, FERRY_FRAME_RDMA_CONNECT_ACK);
        if (k == 0) {
            assert_int_equal(f.status, 0);
            assert_int_equal(ferry_conn_discard(c, f.plen, dl), 0);
        } else {
            assert_int_equal(f.status, FERRY_ERR_MALFORMED_FRAME);
            assert_int_equal(ferry_rdma_read_refusal(c, &f, "an RDMA connection", dl), FERRY_ERR_MALFORMED_FRAME);
            assert_detail_contains("second RDMA_CONNECT");
        }
    }
    /* An access that is neither read nor write: the connection closes. */
    q.aux = 3ull << 32;
    assert_int_equal(ferry_conn_send_frame(c, &q, NULL, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_ERROR);
    ferry_session_checkin(s, c, false);
    ferry_session_put(s);
    ferry_deregister(p.target, dst);
    free(dst);
    pair_end(&p);
}

/* ============================================ small pieces as WR chains */


/* 1,024 scattered 2 KiB pieces (the paged-KV shape): byte-exact, and
 * posted as chains: far fewer ibv_post_send calls and signalled work
 * requests than pieces. A structural bound, not a time. */
static void small_scattered_pieces_post_few_chains(void **state)
{
    (void)state;
    enum { N = 1024, LEN = 2048 };
    hca_set_max_wr(1024); /* a device deeper than Ferry's own queue (128) */
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0); /* the QP and the keys */
    long calls, wrs, sig, sges, calls2, wrs2, sig2, sges2;
    hca_counts(&calls, &wrs, &sig, &sges);
    long imms = hca_get(&H.imms);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_int_equal(hca_get(&H.imms) - imms, 1); /* one group commit for all */
    assert_int_equal(wrs2 - wrs, N + 1);          /* scattered both sides: one data WR each, nothing merged */
    fprintf(stderr, "write: %ld post_send calls, %ld WRs, %ld signalled for %d pieces\n", calls2 - calls,
            wrs2 - wrs, sig2 - sig, N);
    assert_true(calls2 - calls <= N / 16);
    assert_true(sig2 - sig <= N / 16);
    /* Reads the same way, into a cleared buffer. */
    memset(s.src, 0, s.cap);
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_int_equal(wrs2 - wrs, N);
    assert_true(calls2 - calls <= N / 32);
    scatter_end(&p, &s);
    pair_end(&p);
    hca_set_max_wr(0);
}

/* Adjacent pieces merge: contiguous on both sides into one entry per
 * slice; scattered locally but contiguous remotely into one work request
 * of up to max_sge (the fake's 4) entries. */
static void adjacent_pieces_merge(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, true);
    assert_int_equal(write_sync(&p, s.src, s.dst + s.cap - 64, 64), 0);
    long calls, wrs, sig, sges, calls2, wrs2, sig2, sges2;
    /* Locally scattered, remotely contiguous: 4 entries per WR. */
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_int_equal(wrs2 - wrs - 1, N / FAKE_MAX_SGE); /* data WRs, after the group commit's immediate */
    assert_int_equal(sges2 - sges, N);
    /* Read back the same way: a scatter list of 4 entries per READ. */
    memset(s.src, 0, s.cap);
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_int_equal(wrs2 - wrs, N / FAKE_MAX_SGE);
    /* Contiguous on both sides: one entry for all 512 KiB (one slice). */
    memset(s.dst, 0, s.cap);
    for (size_t i = 0; i < N; i++) s.locals[i] = s.src + i * LEN;
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    assert_memory_equal(s.src, s.dst, (size_t)N * LEN);
    assert_int_equal(wrs2 - wrs, 2); /* the data, and the group commit's immediate */
    /* Reads merge the same way (a scatter list on the local side). */
    memset(s.src, 0, (size_t)N * LEN);
    hca_counts(&calls, &wrs, &sig, &sges);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, s.locals, s.remotes, s.lens, N), 0);
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    assert_memory_equal(s.src, s.dst, (size_t)N * LEN);
    assert_int_equal(wrs2 - wrs, 1);
    scatter_end(&p, &s);
    pair_end(&p);
}


/* The 100th work request of a chain fails. A fault of its memory fails
 * its piece alone; the unsignalled ones before it in the chain have an
 * unknown outcome and are never reported completed; with retries the
 * others land on a new QP. A fault of the path: everything lands. */
static void error_in_the_middle_of_a_chain(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048, BAD = 99 };
    pair_t p = pair_make_one_conn(20000, 0);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    hca_fail_wr(BAD + 1, IBV_WC_LOC_PROT_ERR);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &b), 0);
    ferry_request_t *reqs = malloc(N * sizeof *reqs);
    for (int i = 0; i < N; i++) reqs[i] = (ferry_request_t){FERRY_OP_WRITE, s.locals[i], s.remotes[i], LEN};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, N, 0), 0);
    assert_int_not_equal(ferry_batch_wait(b, 20000), 0);
    assert_detail_contains("unknown outcome");
    int completed = 0;
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        if (i == BAD) {
            assert_int_equal(st.state, FERRY_STATUS_FAILED);
            assert_int_equal(st.code, FERRY_ERR_ADDRESS_NOT_REGISTERED);
        } else if (st.state == FERRY_STATUS_COMPLETED) {
            assert_true(scatter_landed(&s, (size_t)i)); /* completed means placed */
            completed++;
        } else {
            assert_int_equal(st.state, FERRY_STATUS_FAILED);
            assert_int_not_equal(st.code, 0);
        }
    }
    /* A write completes only when the target confirmed it through a commit
     * on the same QP, which broke: nothing completes in this run, whatever
     * the HCA did. Of the pieces before the failed one, those after the
     * last signalled completion (96..98: Ferry signals every 24th work
     * request on the fake's queue of 48) were not even proven placed; the
     * detail says so. */
    assert_int_equal(completed, 0);
    assert_int_equal(ferry_batch_free(b), 0);
    /* A fault of the path in mid-chain, with retries: all land. */
    ferry_engine_destroy(p.initiator);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 20000;
    cfg.conns_per_peer = 1;
    cfg.retries = 3;
    p.initiator = harness_engine_cfg(&cfg);
    assert_int_equal(ferry_register(p.initiator, s.src, s.cap, FERRY_MEM_LOCAL), 0);
    memset(s.dst, 0, s.cap);
    long qps = hca_get(&H.qps_made);
    assert_int_equal(write_sync(&p, s.src, s.dst + s.cap - 64, 64), 0);
    hca_fail_wr(BAD + 1, IBV_WC_RETRY_EXC_ERR);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_true(hca_get(&H.qps_made) - qps >= 4); /* the first pair, then a new one */
    free(reqs);
    scatter_end(&p, &s);
    pair_end(&p);
}

/* The HCA refuses a chain part way (the 60th work request: the 13th of the
 * second chain, unsignalled; then the 10th commit immediate of an
 * initiator of protocol 2, which commits each piece with its own): the
 * accepted ones end visibly (a signalled marker after the error state, so
 * no wait for a completion that cannot come), the run retries on a new QP,
 * all land. */
static void chain_refused_part_way(void **state)
{
    (void)state;
    enum { N = 256, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    ferry_test_set_protocol_version(p.initiator, 2);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    long marks = hca_get(&H.err_posts), qps = hca_get(&H.qps_made);
    pthread_mutex_lock(&H.lock);
    H.refuse_post_at = 60;
    pthread_mutex_unlock(&H.lock);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_true(hca_get(&H.err_posts) - marks >= 1);
    assert_true(hca_get(&H.qps_made) - qps >= 2);
    /* The same in the commits' chain: the 10th immediate after the 256
     * data work requests. */
    memset(s.dst, 0, s.cap);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, 64);
    marks = hca_get(&H.err_posts);
    qps = hca_get(&H.qps_made);
    pthread_mutex_lock(&H.lock);
    H.refuse_post_at = N + 10;
    pthread_mutex_unlock(&H.lock);
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, s.locals, s.remotes, s.lens, N), 0);
    for (size_t i = 0; i < N; i++) assert_true(scatter_landed(&s, i));
    assert_true(hca_get(&H.err_posts) - marks >= 1);
    assert_true(hca_get(&H.qps_made) - qps >= 2);
    scatter_end(&p, &s);
    pair_end(&p);
}


/* Cancel while a chain is posted and not yet executed: every piece ends
 * COMPLETED (placed) or CANCELLED, nothing is left on the HCA, and no byte
 * lands after the cancel returned. */
static void cancel_mid_chain(void **state)
{
    (void)state;
    enum { N = 1024, LEN = 2048 };
    pair_t p = pair_make_one_conn(20000, 3);
    scatter_t s = scatter_make(&p, N, LEN, false);
    assert_int_equal(write_sync(&p, s.src, s.dst, 64), 0);
    memset(s.dst, 0, s.cap);
    long calls, wrs, sig, sges, calls2, wrs2, sig2, sges2;
    hca_counts(&calls, &wrs, &sig, &sges);
    hca_pause(1);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(p.initiator, N, &b), 0);
    ferry_request_t *reqs = malloc(N * sizeof *reqs);
    for (int i = 0; i < N; i++) reqs[i] = (ferry_request_t){FERRY_OP_WRITE, s.locals[i], s.remotes[i], LEN};
    assert_int_equal(ferry_batch_submit(b, p.peer, reqs, N, 0), 0);
    wait_queued(FAKE_MAX_WR); /* the first chain fills the send queue */
    struct unpause_later u;
    atomic_init(&u.cancel_done, 0);
    pthread_create(&u.t, NULL, unpause_main, &u);
    int rc = ferry_batch_cancel(b);
    atomic_store(&u.cancel_done, 1);
    pthread_join(u.t, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(hca_queued(), 0);
    unsigned char *snap = malloc(s.cap);
    memcpy(snap, s.dst, s.cap);
    int cancelled = 0;
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        if (st.state == FERRY_STATUS_COMPLETED) {
            assert_true(scatter_landed(&s, (size_t)i));
        } else {
            assert_int_equal(st.state, FERRY_STATUS_CANCELLED);
            cancelled++;
        }
    }
    hca_counts(&calls2, &wrs2, &sig2, &sges2);
    fprintf(stderr, "cancel: %d of %d cancelled; %ld WRs posted\n", cancelled, N, wrs2 - wrs);
    /* At most the one chain posted before the cancel ran. */
    assert_true(cancelled >= N - FAKE_MAX_WR);
    assert_int_equal(ferry_batch_free(b), 0);
    usleep(20000);
    assert_memory_equal(snap, s.dst, s.cap); /* no late write */
    assert_int_equal(hca_queued(), 0);
    free(snap);
    free(reqs);
    scatter_end(&p, &s);
    pair_end(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(auto_selects_rdma),
        cmocka_unit_test(peer_without_rdma_gets_tcp),
        cmocka_unit_test(writes_and_reads_of_every_size),
        cmocka_unit_test(batches_beyond_every_window),
        cmocka_unit_test(deregistration_stops_queued_writes),
        cmocka_unit_test(reregistered_region_is_stale_then_works),
        cmocka_unit_test(stalled_hca_times_out_without_late_writes),
        cmocka_unit_test(completion_wait_does_not_spin),
        cmocka_unit_test(port_failure_is_retried_on_a_new_queue_pair),
        cmocka_unit_test(target_qp_failure_falls_back_to_tcp),
        cmocka_unit_test(device_memory_moves_over_tcp_with_staging),
        cmocka_unit_test(cancel_leaves_nothing_on_the_wire),
        cmocka_unit_test(target_validates_key_queries),
        cmocka_unit_test(small_scattered_pieces_post_few_chains),
        cmocka_unit_test(adjacent_pieces_merge),
        cmocka_unit_test(error_in_the_middle_of_a_chain),
        cmocka_unit_test(cancel_mid_chain),
        cmocka_unit_test(chain_refused_part_way),
    };
    return cmocka_run_group_tests(tests, start_hca, stop_hca);
}
#endif
