/* SPDX-License-Identifier: Apache-2.0 */
/* Every failure the core can report, provoked on purpose: each gets its code,
 * a detail naming what went wrong, and touches no memory it should not. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "delay_proxy.h"
#include "harness.h"
#include "engine/testing.h"

#define GUARD 4096
#define BODY 65536

typedef struct fixture {
    ferry_engine_t *initiator, *target;
    char peer[300];
    unsigned char *src;      /* registered locally, BODY bytes */
    unsigned char *arena;    /* GUARD | BODY registered remote | GUARD */
    unsigned char *dst;      /* arena + GUARD */
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    f->initiator = harness_engine(3000);
    f->target = harness_engine(3000);
    snprintf(f->peer, sizeof f->peer, "%s", ferry_engine_name(f->target));
    f->src = malloc(BODY);
    harness_fill(f->src, BODY, 1);
    f->arena = malloc(GUARD + BODY + GUARD);
    memset(f->arena, 0xAB, GUARD + BODY + GUARD);
    f->dst = f->arena + GUARD;
    assert_int_equal(ferry_register(f->initiator, f->src, BODY, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(f->target, f->dst, BODY, FERRY_MEM_REMOTE), 0);
    *state = f;
    return 0;
}

/* Nothing outside, and (unless allowed) nothing inside, was written. */
static void assert_untouched(fixture_t *f, int body_too)
{
    for (size_t i = 0; i < GUARD; i++) {
        assert_int_equal(f->arena[i], 0xAB);
        assert_int_equal(f->arena[GUARD + BODY + i], 0xAB);
    }
    if (body_too)
        for (size_t i = 0; i < BODY; i++) assert_int_equal(f->dst[i], 0xAB);
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    ferry_engine_destroy(f->initiator);
    ferry_engine_destroy(f->target);
    free(f->src);
    free(f->arena);
    free(f);
    return 0;
}

static uint64_t A(const void *p) { return (uint64_t)(uintptr_t)p; }

static void bad_arguments(void **state)
{
    fixture_t *f = *state;
    ferry_engine_t *e = f->initiator;
    assert_int_equal(ferry_transfer_sync(e, f->peer, FERRY_OP_WRITE, NULL, A(f->dst), 16), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("local buffer is NULL");
    assert_int_equal(ferry_transfer_sync(e, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), 0), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("length is 0");
    assert_int_equal(ferry_transfer_sync(e, f->peer, FERRY_OP_WRITE, f->src, UINT64_MAX - 8, 16),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("wraps");
    assert_int_equal(ferry_transfer_sync(e, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), SIZE_MAX),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_transfer_sync(e, f->peer, 7, f->src, A(f->dst), 16), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("opcode 7");
    assert_int_equal(ferry_transfer_sync(e, NULL, FERRY_OP_WRITE, f->src, A(f->dst), 16), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_transfer_sync(e, "no-port", FERRY_OP_WRITE, f->src, A(f->dst), 16),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("has no port");
    assert_int_equal(ferry_transfer_sync(e, "127.0.0.1:99999", FERRY_OP_WRITE, f->src, A(f->dst), 16),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_transfer_sync(NULL, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), 16),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_batch_transfer_sync(e, f->peer, FERRY_OP_WRITE, NULL, NULL, NULL, 1),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_register(e, NULL, 10, 0), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_register(e, f->src, 0, 0), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_register(e, (void *)(uintptr_t)(UINT64_MAX - 4), 10, 0), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_register(e, f->arena, 10, 0x80), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("unknown flags");
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 0;
    ferry_engine_t *bad;
    assert_int_equal(ferry_engine_create(&cfg, &bad), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("timeouts must be positive");
    ferry_config_init(&cfg);
    cfg.transport = "carrier-pigeon";
    assert_int_equal(ferry_engine_create(&cfg, &bad), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("unknown transport");
    assert_untouched(f, 1);
}

static void unregistered_local_source(void **state)
{
    fixture_t *f = *state;
    unsigned char stray[64];
    int rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, stray, A(f->dst), sizeof stray);
    assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("local range");
    assert_detail_contains("must be registered");
    /* Running past the end of the local region is caught too. */
    rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src + BODY - 8, A(f->dst), 16);
    assert_int_equal(rc, FERRY_ERR_OUT_OF_BOUNDS);
    assert_untouched(f, 1);
}

static void remote_not_registered(void **state)
{
    fixture_t *f = *state;
    /* In the guard: not registered at all. */
    int rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->arena), 64);
    assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    char want[64];
    snprintf(want, sizeof want, "[0x%llx+64)", (unsigned long long)A(f->arena));
    assert_detail_contains(want);
    assert_detail_contains(f->peer);
    assert_detail_contains("write of 64 bytes");
    assert_false(ferry_error_retryable(rc));
    assert_untouched(f, 1);
}

static void remote_crosses_region_end(void **state)
{
    fixture_t *f = *state;
    int rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->dst + BODY - 100), 228);
    assert_int_equal(rc, FERRY_ERR_OUT_OF_BOUNDS);
    assert_detail_contains("runs 128 bytes past the end");
    assert_untouched(f, 1);
    rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_READ, f->src, A(f->dst + BODY - 1), 2);
    assert_int_equal(rc, FERRY_ERR_OUT_OF_BOUNDS);
}

static void access_denied_by_flags(void **state)
{
    fixture_t *f = *state;
    unsigned char *ro = malloc(4096), *lo = malloc(4096);
    memset(ro, 0x11, 4096);
    assert_int_equal(ferry_register(f->target, ro, 4096, FERRY_MEM_REMOTE_READ), 0);
    assert_int_equal(ferry_register(f->target, lo, 4096, FERRY_MEM_LOCAL), 0);
    int rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(ro), 128);
    assert_int_equal(rc, FERRY_ERR_ACCESS_DENIED);
    assert_detail_contains("remote write");
    for (int i = 0; i < 4096; i++) assert_int_equal(ro[i], 0x11);
    /* Reading it is allowed. */
    assert_int_equal(ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_READ, f->src, A(ro), 128), 0);
    /* Local-only regions are invisible to peers. */
    rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_READ, f->src, A(lo), 128);
    assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    ferry_deregister(f->target, ro);
    ferry_deregister(f->target, lo);
    free(ro);
    free(lo);
}

static void registration_errors(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(ferry_register(f->target, f->dst + 100, 10, 0), FERRY_ERR_ADDRESS_OVERLAPPED);
    assert_detail_contains("overlaps registered region");
    assert_int_equal(ferry_register(f->target, f->arena, GUARD + 1, 0), FERRY_ERR_ADDRESS_OVERLAPPED);
    assert_int_equal(ferry_deregister(f->target, f->arena), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("no region at");
    assert_int_equal(ferry_deregister(f->target, f->dst + 8), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("not its start");
    /* Batch registration is all or nothing. */
    unsigned char *a = malloc(256), *b = malloc(256);
    void *addrs[3] = {a, b, f->dst + 5};
    size_t lens[3] = {256, 256, 16};
    size_t before = ferry_region_count(f->target);
    assert_int_equal(ferry_register_batch(f->target, addrs, lens, 3, FERRY_MEM_REMOTE), FERRY_ERR_ADDRESS_OVERLAPPED);
    assert_detail_contains("region 2 of 3");
    assert_int_equal(ferry_region_count(f->target), before);
    assert_int_equal(ferry_register_batch(f->target, addrs, lens, 2, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_region_count(f->target), before + 2);
    assert_int_equal(ferry_deregister_batch(f->target, addrs, 3), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(ferry_region_count(f->target), before);
    free(a);
    free(b);
}

static void thousands_of_regions(void **state)
{
    fixture_t *f = *state;
    enum { N = 5000, SZ = 64 };
    unsigned char *pool = malloc((size_t)N * SZ * 2);
    /* Register every other slot, in a scrambled order. */
    for (int k = 0; k < N; k++) {
        int i = (int)(((unsigned)k * 761u) % N); /* 761 is prime to N: a permutation */
        assert_int_equal(ferry_register(f->target, pool + (size_t)i * SZ * 2, SZ, FERRY_MEM_REMOTE), 0);
    }
    int i = N - 3;
    assert_int_equal(ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(pool + (size_t)i * SZ * 2), SZ), 0);
    assert_memory_equal(pool + (size_t)i * SZ * 2, f->src, SZ);
    /* The gap after a region is refused, naming the region below. */
    int rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(pool + (size_t)i * SZ * 2 + SZ), 8);
    assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("nearest below");
    for (int k = 0; k < N; k++) assert_int_equal(ferry_deregister(f->target, pool + (size_t)k * SZ * 2), 0);
    free(pool);
}

static void nobody_listening(void **state)
{
    fixture_t *f = *state;
    /* A port that was just free: bind, note, close. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    bind(s, (struct sockaddr *)&sa, sizeof sa);
    getsockname(s, (struct sockaddr *)&sa, &sl);
    close(s);
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%u", ntohs(sa.sin_port));
    int rc = ferry_transfer_sync(f->initiator, peer, FERRY_OP_WRITE, f->src, A(f->dst), 16);
    assert_int_equal(rc, FERRY_ERR_SOCKET);
    assert_detail_contains("refused");
    assert_detail_contains(peer);
    assert_true(ferry_error_retryable(rc));
}

static void unknown_host(void **state)
{
    fixture_t *f = *state;
    int rc = ferry_transfer_sync(f->initiator, "no-such-host.invalid:7000", FERRY_OP_WRITE, f->src, A(f->dst), 16);
    assert_int_equal(rc, FERRY_ERR_DNS);
    assert_detail_contains("no-such-host.invalid");
}

/* A fake peer: accepts one connection and does what mode says. */
enum fake_mode { FAKE_SILENT, FAKE_GARBAGE, FAKE_CLOSE };

struct fake {
    int listen_fd;
    uint16_t port;
    enum fake_mode mode;
    pthread_t thread;
};

static void *fake_main(void *arg)
{
    struct fake *fk = arg;
    int c = accept(fk->listen_fd, NULL, NULL);
    if (c < 0) return NULL;
    char buf[512];
    ssize_t n = read(c, buf, sizeof buf);
    (void)n;
    if (fk->mode == FAKE_GARBAGE) {
        const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n....................";
        if (write(c, reply, sizeof reply) < 0) {}
        sleep(1);
    } else if (fk->mode == FAKE_SILENT) {
        sleep(4);
    }
    close(c);
    return NULL;
}

static struct fake *fake_start(enum fake_mode mode)
{
    struct fake *fk = calloc(1, sizeof *fk);
    fk->mode = mode;
    fk->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    bind(fk->listen_fd, (struct sockaddr *)&sa, sizeof sa);
    listen(fk->listen_fd, 4);
    getsockname(fk->listen_fd, (struct sockaddr *)&sa, &sl);
    fk->port = ntohs(sa.sin_port);
    pthread_create(&fk->thread, NULL, fake_main, fk);
    return fk;
}

static void fake_stop(struct fake *fk)
{
    pthread_join(fk->thread, NULL);
    close(fk->listen_fd);
    free(fk);
}

static void silent_peer_times_out(void **state)
{
    fixture_t *f = *state;
    struct fake *fk = fake_start(FAKE_SILENT);
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%u", fk->port);
    uint64_t t0 = harness_now_ms();
    int rc = ferry_transfer_sync(f->initiator, peer, FERRY_OP_WRITE, f->src, A(f->dst), 16);
    uint64_t took = harness_now_ms() - t0;
    assert_int_equal(rc, FERRY_ERR_TIMEOUT);
    assert_detail_contains("handshake");
    assert_true(took < 3900); /* the 3 s connect deadline, not the fake's 4 s */
    fake_stop(fk);
}

static void garbage_peer_is_malformed(void **state)
{
    fixture_t *f = *state;
    struct fake *fk = fake_start(FAKE_GARBAGE);
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%u", fk->port);
    int rc = ferry_transfer_sync(f->initiator, peer, FERRY_OP_WRITE, f->src, A(f->dst), 16);
    assert_int_equal(rc, FERRY_ERR_MALFORMED_FRAME);
    assert_detail_contains("not a Ferry peer");
    fake_stop(fk);
}

static void closing_peer_is_peer_closed(void **state)
{
    fixture_t *f = *state;
    struct fake *fk = fake_start(FAKE_CLOSE);
    char peer[64];
    snprintf(peer, sizeof peer, "127.0.0.1:%u", fk->port);
    int rc = ferry_session_open(f->initiator, peer);
    /* The retry finds nobody listening any more: either code is honest. */
    assert_true(rc == FERRY_ERR_PEER_CLOSED || rc == FERRY_ERR_SOCKET);
    fake_stop(fk);
}

static void version_mismatch_is_refused(void **state)
{
    fixture_t *f = *state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    ferry_engine_t *future = harness_engine_cfg(&cfg);
    ferry_test_set_protocol_version(future, FERRY_PROTOCOL_VERSION + 7);
    int rc = ferry_session_open(future, f->peer);
    assert_int_equal(rc, FERRY_ERR_VERSION_MISMATCH);
    char want[64];
    snprintf(want, sizeof want, "speaks protocol 1..%d", FERRY_PROTOCOL_VERSION); /* every version down to 1 */
    assert_detail_contains(want);
    snprintf(want, sizeof want, "this engine speaks %d..%d", FERRY_PROTOCOL_VERSION + 7, FERRY_PROTOCOL_VERSION + 7);
    assert_detail_contains(want);
    assert_false(ferry_error_retryable(rc));
    /* The target keeps serving everybody else. */
    assert_int_equal(ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), 64), 0);
    ferry_engine_destroy(future);
}

static void peer_restart_is_detected(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), 64), 0);
    uint16_t port = ferry_engine_port(f->target);
    uint64_t old_epoch = ferry_engine_epoch(f->target);
    ferry_engine_destroy(f->target);
    /* A new process on the same port, with memory at the very same address. */
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.port = port;
    cfg.timeout_ms = 3000;
    assert_int_equal(ferry_engine_create(&cfg, &f->target), 0);
    assert_true(ferry_engine_epoch(f->target) != old_epoch);
    memset(f->dst, 0xAB, BODY);
    assert_int_equal(ferry_register(f->target, f->dst, BODY, FERRY_MEM_REMOTE), 0);
    int rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), 64);
    assert_int_equal(rc, FERRY_ERR_PEER_RESTARTED);
    assert_detail_contains("restarted");
    assert_false(ferry_error_retryable(rc));
    assert_untouched(f, 1);
    /* The session re-opens by itself: the next call works. */
    assert_int_equal(ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), 64), 0);
    assert_memory_equal(f->dst, f->src, 64);
}

/* SGLang's embedding receiver registers a buffer per request and
 * deregisters it after receipt; the allocator hands the same address back.
 * Each write into the range registered now succeeds the first time (it once
 * failed with STALE_SEGMENT); between registrations nothing is written. */
static void reregistered_region_takes_the_first_write(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), 64), 0);
    for (int request = 0; request < 20; request++) {
        assert_int_equal(ferry_deregister(f->target, f->dst), 0);
        int rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), 64);
        assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED); /* deregistered: refused, never written */
        memset(f->dst, 0xAB, BODY);
        assert_int_equal(ferry_register(f->target, f->dst, BODY, FERRY_MEM_REMOTE), 0);
        harness_fill(f->src, BODY, request + 2);
        rc = ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), BODY);
        if (rc) fail_msg("request %d: %s", request, ferry_last_error_detail());
        assert_true(harness_check(f->dst, BODY, request + 2));
        assert_untouched(f, 0);
    }
    /* Registered again, read-only: the write is denied, nothing placed. */
    assert_int_equal(ferry_deregister(f->target, f->dst), 0);
    memset(f->dst, 0xAB, BODY);
    assert_int_equal(ferry_register(f->target, f->dst, BODY, FERRY_MEM_REMOTE_READ), 0);
    assert_int_equal(ferry_transfer_sync(f->initiator, f->peer, FERRY_OP_WRITE, f->src, A(f->dst), 64),
                     FERRY_ERR_ACCESS_DENIED);
    assert_untouched(f, 1);
    assert_int_equal(ferry_deregister(f->target, f->dst), 0);
    assert_int_equal(ferry_register(f->target, f->dst, BODY, FERRY_MEM_REMOTE), 0);
}

/* A READ into a local buffer registered but mapped read-only: the kernel
 * refuses to write it (EFAULT over TCP; process_vm_writev over shm). That
 * is the caller's error: INVALID_ARGUMENT naming the local address, no
 * retry, no reconnect, and the session goes on (a read into writable
 * memory right after succeeds on it). Before, TCP retried and reported
 * PEER_CLOSED ("went away"), tearing the healthy session down. */
static void read_into_read_only_local_buffer(void **state)
{
    (void)state;
    const char *transports[] = {"tcp", "shm"};
    for (size_t t = 0; t < 2; t++) {
        ferry_config_t cfg;
        ferry_config_init(&cfg);
        cfg.transport = transports[t];
        cfg.timeout_ms = 3000;
        cfg.connect_timeout_ms = 3000;
        ferry_engine_t *a = harness_engine_cfg(&cfg), *b = harness_engine_cfg(&cfg);
        const char *peer = ferry_engine_name(b);
        unsigned char *there = malloc(BODY), *ok = malloc(BODY);
        harness_fill(there, BODY, 7);
        unsigned char *ro = mmap(NULL, BODY, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_true(ro != MAP_FAILED);
        memset(ro, 0x5A, BODY);
        assert_int_equal(ferry_register(b, there, BODY, FERRY_MEM_REMOTE), 0);
        assert_int_equal(ferry_register(a, ro, BODY, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_register(a, ok, BODY, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_transfer_sync(a, peer, FERRY_OP_READ, ok, A(there), BODY), 0); /* session up */
        assert_int_equal(mprotect(ro, BODY, PROT_READ), 0);
        ferry_stats_t before, after;
        assert_int_equal(ferry_engine_stats(a, &before), 0);

        int rc = ferry_transfer_sync(a, peer, FERRY_OP_READ, ro, A(there), BODY);
        if (rc != FERRY_ERR_INVALID_ARGUMENT)
            fail_msg("%s: read into a read-only buffer: %s (%s)", transports[t], ferry_error_name(rc),
                     ferry_last_error_detail());
        assert_detail_contains("not writable");
        /* Small pieces together (a READV frame over TCP): each refused. */
        void *locals[4] = {ro, ro + 4096, ok, ro + 8192};
        uint64_t remotes[4] = {A(there), A(there) + 4096, A(there) + 8192, A(there) + 12288};
        size_t lens[4] = {512, 512, 512, 512};
        rc = ferry_batch_transfer_sync(a, peer, FERRY_OP_READ, locals, remotes, lens, 4);
        if (rc != FERRY_ERR_INVALID_ARGUMENT)
            fail_msg("%s: batch read into a read-only buffer: %s (%s)", transports[t], ferry_error_name(rc),
                     ferry_last_error_detail());
        assert_detail_contains("not writable");

        memset(ok, 0, BODY);
        assert_int_equal(ferry_transfer_sync(a, peer, FERRY_OP_READ, ok, A(there), BODY), 0);
        assert_true(harness_check(ok, BODY, 7));
        assert_int_equal(ferry_engine_stats(a, &after), 0);
        if (after.retries != before.retries || after.reconnects != before.reconnects ||
            after.session_teardowns != before.session_teardowns)
            fail_msg("%s: retries %llu, reconnects %llu, teardowns %llu after a local fault", transports[t],
                     (unsigned long long)(after.retries - before.retries),
                     (unsigned long long)(after.reconnects - before.reconnects),
                     (unsigned long long)(after.session_teardowns - before.session_teardowns));
        ferry_engine_destroy(a);
        ferry_engine_destroy(b);
        munmap(ro, BODY);
        free(there);
        free(ok);
    }
}

static void session_and_batch_errors(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(ferry_session_close(f->initiator, "127.0.0.1:1"), FERRY_ERR_NOT_FOUND);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(f->initiator, f->peer, NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_session_info(f->initiator, f->peer, &info), 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(f->initiator, 0, &b), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_batch_alloc(f->initiator, 2, &b), 0);
    ferry_request_t bad = {FERRY_OP_WRITE, NULL, A(f->dst), 8};
    assert_int_equal(ferry_batch_submit(b, f->peer, &bad, 1, 0), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("request 0 of 1");
    ferry_request_t three[3] = {{FERRY_OP_WRITE, f->src, A(f->dst), 8}, {FERRY_OP_WRITE, f->src, A(f->dst), 8},
                                {FERRY_OP_WRITE, f->src, A(f->dst), 8}};
    assert_int_equal(ferry_batch_submit(b, f->peer, three, 3, 0), FERRY_ERR_TOO_MANY_REQUESTS);
    ferry_status_t st;
    assert_int_equal(ferry_batch_status(b, 0, &st), FERRY_ERR_NOT_FOUND);
    assert_int_equal(ferry_batch_free(b), 0);
}

static void cancelled_batch(void **state)
{
    fixture_t *f = *state;
    size_t len = 128u << 20;
    unsigned char *big = malloc(len), *dst = malloc(len);
    memset(big, 1, len);
    assert_int_equal(ferry_register(f->initiator, big, len, 0), 0);
    assert_int_equal(ferry_register(f->target, dst, len, FERRY_MEM_REMOTE), 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(f->initiator, 8, &b), 0);
    ferry_request_t r[8];
    for (int i = 0; i < 8; i++) r[i] = (ferry_request_t){FERRY_OP_WRITE, big + (size_t)i * (len / 8), A(dst + (size_t)i * (len / 8)), len / 8};
    assert_int_equal(ferry_batch_submit(b, f->peer, r, 8, 0), 0);
    assert_int_equal(ferry_batch_cancel(b), 0);
    int cancelled = 0;
    for (int i = 0; i < 8; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        assert_true(st.state == FERRY_STATUS_COMPLETED || st.state == FERRY_STATUS_CANCELLED);
        if (st.state == FERRY_STATUS_CANCELLED) {
            cancelled++;
            assert_int_equal(st.code, FERRY_ERR_CANCELLED);
        }
    }
    /* On a fast machine everything may finish before the cancel: fine. */
    fprintf(stderr, "cancelled %d of 8 requests\n", cancelled);
    assert_int_equal(ferry_batch_free(b), 0);
    ferry_deregister(f->initiator, big);
    ferry_deregister(f->target, dst);
    free(big);
    free(dst);
}

/* Many small requests in one submission, then the engine destroyed. */
static void many_small_requests_then_destroy(void **state)
{
    fixture_t *f = *state;
    ferry_engine_t *e = harness_engine(3000);
    unsigned char *buf = malloc(1 << 20);
    ferry_register(e, buf, 1 << 20, 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(e, 64, &b), 0);
    ferry_request_t r[64];
    for (int i = 0; i < 64; i++) r[i] = (ferry_request_t){FERRY_OP_WRITE, buf, A(f->dst), 4096};
    assert_int_equal(ferry_batch_submit(b, f->peer, r, 64, 0), 0);
    assert_int_equal(ferry_batch_wait(b, 10000), 0);
    assert_int_equal(ferry_batch_free(b), 0);
    ferry_engine_destroy(e);
    free(buf);
}

/* A link of 1 MB/s: a 4 MiB request stays in flight for seconds. */
static void batch_busy_while_in_flight(void **state)
{
    fixture_t *f = *state;
    delay_proxy_t *px = delay_proxy_start(ferry_engine_port(f->target), 0, 1u << 20);
    size_t len = 4u << 20;
    unsigned char *big = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(f->initiator, big, len, 0), 0);
    assert_int_equal(ferry_register(f->target, dst, len, FERRY_MEM_REMOTE), 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(f->initiator, 1, &b), 0);
    ferry_request_t r = {FERRY_OP_WRITE, big, A(dst), len};
    assert_int_equal(ferry_batch_submit(b, delay_proxy_name(px), &r, 1, 20000), 0);
    assert_int_equal(ferry_batch_free(b), FERRY_ERR_BATCH_BUSY);
    assert_detail_contains("still in flight");
    assert_int_equal(ferry_batch_cancel(b), 0);
    ferry_status_t st;
    assert_int_equal(ferry_batch_status(b, 0, &st), 0);
    assert_int_equal(st.state, FERRY_STATUS_CANCELLED);
    assert_int_equal(ferry_batch_free(b), 0);
    delay_proxy_stop(px);
    ferry_deregister(f->initiator, big);
    ferry_deregister(f->target, dst);
    free(big);
    free(dst);
}

/* Requests still queued when their engine is destroyed end with CONTEXT. */
static void queued_requests_fail_with_context(void **state)
{
    fixture_t *f = *state;
    delay_proxy_t *px = delay_proxy_start(ferry_engine_port(f->target), 0, 1u << 20);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.workers = 1;
    cfg.conns_per_peer = 1;
    cfg.timeout_ms = 1500;
    cfg.cancel_timeout_ms = 200;
    ferry_engine_t *e = harness_engine_cfg(&cfg);
    size_t len = 8u << 20;
    unsigned char *big = malloc(len), *dst = malloc(len);
    assert_int_equal(ferry_register(e, big, len, 0), 0);
    assert_int_equal(ferry_register(f->target, dst, len, FERRY_MEM_REMOTE), 0);
    ferry_batch_t *b;
    assert_int_equal(ferry_batch_alloc(e, 2, &b), 0);
    ferry_request_t r = {FERRY_OP_WRITE, big, A(dst), len};
    /* Two submissions: the first occupies the only worker, the second waits. */
    assert_int_equal(ferry_batch_submit(b, delay_proxy_name(px), &r, 1, 0), 0);
    assert_int_equal(ferry_batch_submit(b, delay_proxy_name(px), &r, 1, 0), 1);
    ferry_engine_destroy(e);
    ferry_status_t st;
    assert_int_equal(ferry_batch_status(b, 1, &st), 0);
    assert_int_equal(st.state, FERRY_STATUS_FAILED);
    assert_int_equal(st.code, FERRY_ERR_CONTEXT);
    assert_detail_contains("shut down before the request ran");
    assert_int_equal(ferry_batch_status(b, 0, &st), 0);
    assert_true(st.state != FERRY_STATUS_PENDING && st.state != FERRY_STATUS_WAITING);
    assert_int_equal(ferry_batch_free(b), 0);
    delay_proxy_stop(px);
    ferry_deregister(f->target, dst);
    free(big);
    free(dst);
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(bad_arguments),          T(unregistered_local_source),  T(remote_not_registered),
        T(remote_crosses_region_end), T(access_denied_by_flags),  T(registration_errors),
        T(thousands_of_regions),   T(nobody_listening),           T(unknown_host),
        T(silent_peer_times_out),  T(garbage_peer_is_malformed),  T(closing_peer_is_peer_closed),
        T(version_mismatch_is_refused), T(peer_restart_is_detected), T(reregistered_region_takes_the_first_write),
        T(session_and_batch_errors), T(cancelled_batch),          T(many_small_requests_then_destroy),
        T(batch_busy_while_in_flight), T(queued_requests_fail_with_context),
        T(read_into_read_only_local_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
