/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA IPC transport (src/transport/cuda_ipc) between two processes
 * (fork), over the stub driver (tests/support/cuda_stub.c: "device" memory
 * is a memfd the CPU cannot touch, an IPC handle names it by pid,
 * descriptor and inode, stream copies happen only when the stream is
 * synchronized). The target, a child, owns device memory on its device 0;
 * the initiator's is on its device 1.
 *
 *  - writes and reads device<->device by IPC: no staging copy on either
 *    side, one import in the target for the initiator's allocation; a
 *    host buffer to the same peer goes by tcp in the same session;
 *  - the owner's checks: a deregistered range, a read-only one (nothing
 *    written);
 *  - a region deregistered and its memory allocated again: the stale
 *    import is closed and the new allocation's handle opened;
 *  - a restarted target: PEER_RESTARTED, nothing written; then it works;
 *  - cancel while copies run at the target: every request COMPLETED or
 *    CANCELLED, and nothing lands afterwards;
 *  - a target with FERRY_CUDA_IPC=0 does not offer it: the session takes
 *    another transport and the device memory is staged;
 *  - a hostile initiator's CUDA_IPC frame then a CMA_WRITE or CMA_VEC on
 *    one connection: shm does not take cuda_ipc's state for its own, the
 *    target closes it;
 *  - VMM memory (cuMemCreate + cuMemMap, as PyTorch's expandable
 *    segments) exported as a descriptor the target takes with
 *    pidfd_getfd: written and read by IPC without staging; a region
 *    registered again exports again and the stale import is unmapped; a
 *    target the kernel refuses the descriptor falls back to tcp with the
 *    reason; memory not created shareable goes by tcp.
 * Skipped without CUDA in the build. */
#ifndef FERRY_HAVE_CUDA
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

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "child.h"
#include "fault.h"

#include "transport/cuda_ipc/cuda_ipc.h"
#include "engine/hello.h"
#include "wire/wire.h"
#include "util/cuda_driver.h"
#include "util/memkind.h"

static void *(*stub_alloc)(size_t, int, int);
static void *(*stub_alloc_at)(void *, size_t, int);
static void *(*stub_alias)(void *);
static void (*stub_free)(void *);
static void (*stub_counts)(unsigned long[7]);
static void (*stub_more_counts)(unsigned long[8]);
static void (*stub_lock)(void), (*stub_unlock)(void);
static void (*stub_vmm_counts)(unsigned long[3]);
static ferry_cuMemCreate_fn vmm_create;
static ferry_cuMemRelease_fn vmm_release;
static ferry_cuMemAddressReserve_fn vmm_reserve;
static ferry_cuMemAddressFree_fn vmm_address_free;
static ferry_cuMemMap_fn vmm_map;
static ferry_cuMemUnmap_fn vmm_unmap;
static ferry_cuMemSetAccess_fn vmm_set_access;

/* What an application using CUDA does first: load the driver. */
static void load_stub(void)
{
    const char *path = getenv("FERRY_CUDA_STUB");
    assert_non_null(path);
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    assert_non_null(h);
    stub_alloc = (void *(*)(size_t, int, int))dlsym(h, "cuda_stub_alloc");
    stub_alloc_at = (void *(*)(void *, size_t, int))dlsym(h, "cuda_stub_alloc_at");
    stub_alias = (void *(*)(void *))dlsym(h, "cuda_stub_alias");
    stub_free = (void (*)(void *))dlsym(h, "cuda_stub_free");
    stub_counts = (void (*)(unsigned long[7]))dlsym(h, "cuda_stub_counts");
    stub_more_counts = (void (*)(unsigned long[8]))dlsym(h, "cuda_stub_more_counts");
    stub_lock = (void (*)(void))dlsym(h, "cuda_stub_lock");
    stub_unlock = (void (*)(void))dlsym(h, "cuda_stub_unlock");
    assert_true(stub_alloc && stub_alloc_at && stub_alias && stub_free && stub_counts && stub_more_counts && stub_lock &&
                stub_unlock);
    stub_vmm_counts = (void (*)(unsigned long[3]))dlsym(h, "cuda_stub_vmm_counts");
    vmm_create = (ferry_cuMemCreate_fn)dlsym(h, "cuMemCreate");
    vmm_release = (ferry_cuMemRelease_fn)dlsym(h, "cuMemRelease");
    vmm_reserve = (ferry_cuMemAddressReserve_fn)dlsym(h, "cuMemAddressReserve");
    vmm_address_free = (ferry_cuMemAddressFree_fn)dlsym(h, "cuMemAddressFree");
    vmm_map = (ferry_cuMemMap_fn)dlsym(h, "cuMemMap");
    vmm_unmap = (ferry_cuMemUnmap_fn)dlsym(h, "cuMemUnmap");
    vmm_set_access = (ferry_cuMemSetAccess_fn)dlsym(h, "cuMemSetAccess");
    assert_true(stub_vmm_counts && vmm_create && vmm_release && vmm_reserve && vmm_address_free && vmm_map &&
                vmm_unmap && vmm_set_access);
}

/* VMM memory as PyTorch's expandable segments make it: cuMemCreate (with
 * the given shareable handle types), an address range reserved (at want
 * if free), the allocation mapped there and made accessible to its device;
 * the allocation's handle released (the mapping holds it). */
static unsigned char *vmm_alloc(size_t len, int device, int handle_types, void *want)
{
    FERRY_CUmemAllocationProp prop = {.type = FERRY_CU_MEM_ALLOCATION_TYPE_PINNED,
                                      .requestedHandleTypes = handle_types,
                                      .location = {FERRY_CU_MEM_LOCATION_TYPE_DEVICE, device}};
    FERRY_CUmemGenericAllocationHandle h;
    FERRY_CUdeviceptr va = 0;
    assert_int_equal(vmm_create(&h, len, &prop, 0), 0);
    assert_int_equal(vmm_reserve(&va, len, 0, (FERRY_CUdeviceptr)(uintptr_t)want, 0), 0);
    assert_int_equal(vmm_map(va, len, 0, h, 0), 0);
    FERRY_CUmemAccessDesc access = {{FERRY_CU_MEM_LOCATION_TYPE_DEVICE, device},
                                    FERRY_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    assert_int_equal(vmm_set_access(va, len, &access, 1), 0);
    assert_int_equal(vmm_release(h), 0);
    return (unsigned char *)(uintptr_t)va;
}

static void vmm_free(void *p, size_t len)
{
    assert_int_equal(vmm_unmap((FERRY_CUdeviceptr)(uintptr_t)p, len), 0);
    assert_int_equal(vmm_address_free((FERRY_CUdeviceptr)(uintptr_t)p, len), 0);
}

/* ------------------------------------------------- a target in a child */

enum {
    CMD_QUIT = 0,
    CMD_CHECK,       /* the device bytes [off, off+len) are seed's pattern */
    CMD_FILL,
    CMD_ZERO,
    CMD_ISZERO,
    CMD_DEREGISTER,
    CMD_REREGISTER_RO,
    CMD_RESTART,     /* a new engine on the same port, the buffer registered again */
    CMD_IMPORTS,     /* rc = imports open now, addr = opened so far */
    CMD_DELAY,       /* each stream copy takes seed microseconds */
    CMD_STAGED,      /* rc = staging copies (dtoh + htod, and pipelined ones) done here */
    CMD_PLACED,      /* addr = the engine's bytes_placed */
    CMD_VMM,         /* rc = VMM allocations imported so far, addr = those released */
};

static ferry_engine_t *child_engine(uint16_t port)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 10000;
    cfg.port = port;
    ferry_engine_t *e = NULL;
    return ferry_engine_create(&cfg, &e) == 0 ? e : NULL;
}

static int region_is_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 1;
    return 0;
}

/* The device bytes, touched in step with the stub's stream copies. */
static int device_bytes(const struct target_cmd *c, unsigned char *bytes)
{
    int rc = 0;
    stub_lock();
    switch (c->op) {
    case CMD_CHECK: rc = harness_check(bytes + c->off, c->len, c->seed) ? 0 : 1; break;
    case CMD_FILL: harness_fill(bytes + c->off, c->len, c->seed); break;
    case CMD_ZERO: memset(bytes + c->off, 0, c->len); break;
    case CMD_ISZERO: rc = region_is_zero(bytes + c->off, c->len); break;
    }
    stub_unlock();
    return rc;
}

static int child_run(struct target_cmd *c, ferry_engine_t **e, unsigned char *dev, size_t len, struct target_reply *a)
{
    unsigned char *bytes = stub_alias(dev);
    unsigned long counts[7], opened;
    switch (c->op) {
    case CMD_CHECK:
    case CMD_FILL:
    case CMD_ZERO:
    case CMD_ISZERO: return device_bytes(c, bytes);
    case CMD_DEREGISTER: return ferry_deregister(*e, dev);
    case CMD_REREGISTER_RO: return ferry_register(*e, dev, len, FERRY_MEM_REMOTE_READ);
    case CMD_RESTART: {
        uint16_t port = ferry_engine_port(*e);
        ferry_engine_destroy(*e);
        *e = child_engine(port);
        return *e ? ferry_register(*e, dev, len, FERRY_MEM_REMOTE) : -1;
    }
    case CMD_IMPORTS: {
        unsigned long open_now;
        ferry_cuda_ipc_counts(&open_now, &opened);
        a->addr = opened;
        return (int)open_now;
    }
    case CMD_DELAY: {
        char v[32];
        snprintf(v, sizeof v, "%llu", (unsigned long long)c->seed);
        return setenv("FERRY_CUDA_STUB_COPY_DELAY_US", v, 1);
    }
    case CMD_STAGED: { /* synchronous, and pipelined through pinned buffers (memkind.h) */
        ferry_staging_totals_t t;
        ferry_staging_totals(&t);
        stub_counts(counts);
        return (int)(counts[0] + counts[1] + t.take_prefetched + t.land_queued);
    }
    case CMD_VMM: {
        unsigned long v[3];
        stub_vmm_counts(v);
        a->addr = v[2];
        return (int)v[1];
    }
    case CMD_PLACED: {
        ferry_stats_t st;
        int rc = ferry_engine_stats(*e, &st);
        a->addr = st.bytes_placed;
        return rc;
    }
    }
    return -1;
}

static void child_main(int in, int out, size_t len, bool no_ipc, int refuse_getfd)
{
    if (no_ipc) setenv("FERRY_CUDA_IPC", "0", 1);
    ferry_cuda_ipc_testing_refuse_getfd(refuse_getfd);
    struct target_reply r = {0};
    unsigned char *dev = stub_alloc(len, 0, 0);
    ferry_engine_t *e = dev ? child_engine(0) : NULL;
    r.rc = e ? ferry_register(e, dev, len, FERRY_MEM_REMOTE) : -1;
    r.port = e ? ferry_engine_port(e) : 0;
    r.addr = (uint64_t)(uintptr_t)dev;
    r.len = len;
    r.pid = (int32_t)getpid();
    if (write(out, &r, sizeof r) != sizeof r) _exit(1);
    struct target_cmd c;
    while (read(in, &c, sizeof c) == sizeof c && c.op != CMD_QUIT) {
        struct target_reply a = {0};
        a.rc = child_run(&c, &e, dev, len, &a);
        if (write(out, &a, sizeof a) != sizeof a) break;
    }
    ferry_engine_destroy(e);
    unsigned long open_now, opened;
    ferry_cuda_ipc_counts(&open_now, &opened);
    stub_free(dev);
    _exit(open_now == 0 ? 0 : 3); /* every import closed with its connections */
}

struct child_args {
    size_t len;
    bool no_ipc;
    int refuse_getfd; /* errno for pidfd_getfd in the target (0: the kernel's answer) */
};

static void child_body(int in, int out, void *arg)
{
    const struct child_args *a = arg;
    child_main(in, out, a->len, a->no_ipc, a->refuse_getfd);
}

static target_child_t *child_start_with(size_t len, bool no_ipc, int refuse_getfd)
{
    return target_child_start(child_body, &(struct child_args){len, no_ipc, refuse_getfd});
}

static target_child_t *child_start(size_t len, bool no_ipc) { return child_start_with(len, no_ipc, 0); }

static ferry_engine_t *initiator(void)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 10000;
    cfg.connect_timeout_ms = 5000;
    return harness_engine_cfg(&cfg);
}

static void expect_transport(ferry_engine_t *e, const char *peer, const char *name)
{
    ferry_peer_info_t info;
    if (ferry_session_info(e, peer, &info)) fail_msg("session info: %s", ferry_last_error_detail());
    if (strcmp(info.transport, name) != 0)
        fail_msg("transport %s (%s), expected %s", info.transport, info.transport_reason, name);
}

/* Device memory of len bytes (device 1), registered with e as a source. */
static unsigned char *device_source(ferry_engine_t *e, size_t len)
{
    unsigned char *p = stub_alloc(len, 1, 0);
    assert_non_null(p);
    assert_int_equal(ferry_register(e, p, len, FERRY_MEM_LOCAL), 0);
    return p;
}

/* Fills src's len bytes (device memory, any kind) with seed's pattern,
 * writes them to the child's buffer at 0 and finds them there. */
static void write_verified(ferry_engine_t *e, target_child_t *c, unsigned char *src, size_t len, uint64_t seed)
{
    harness_fill(stub_alias(src), len, seed);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, len), 0);
    assert_int_equal(target_child_do(c, CMD_CHECK, seed, 0, len), 0);
}

/* One round trip of len bytes: seed's pattern written from src + off to the
 * child's buffer at at, and found there on the device; then the child's
 * bytes of seed + 100 read back into src + back (the rest of src's cap
 * bytes zeroed first) and found there. */
static void round_trip(ferry_engine_t *e, target_child_t *c, unsigned char *src, size_t cap, size_t off, uint64_t at,
                       size_t back, size_t len, uint64_t seed)
{
    harness_fill((unsigned char *)stub_alias(src) + off, len, seed);
    int rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src + off, c->addr + at, len);
    if (rc) fail_msg("write %zu: %s", len, ferry_last_error_detail());
    assert_int_equal(target_child_do(c, CMD_CHECK, seed, at, len), 0); /* on the device when complete */
    assert_int_equal(target_child_do(c, CMD_FILL, seed + 100, 0, len), 0);
    memset(stub_alias(src), 0, cap);
    rc = ferry_transfer_sync(e, c->peer, FERRY_OP_READ, src + back, c->addr, len);
    if (rc) fail_msg("read %zu: %s", len, ferry_last_error_detail());
    assert_true(harness_check((unsigned char *)stub_alias(src) + back, len, seed + 100));
}

static int setup(void **state)
{
    (void)state;
    load_stub();
    return 0;
}

/* ------------------------------------------------------------- tests */

static void write_and_read_device_to_device(void **state)
{
    (void)state;
    size_t cap = (64u << 20) + 4096;
    target_child_t *c = child_start(cap, false);
    ferry_engine_t *e = initiator();
    unsigned char *src = device_source(e, cap);
    expect_transport(e, c->peer, "cuda_ipc");
    unsigned long before[7], after[7];
    stub_counts(before);
    /* One byte, unaligned sizes, more than one chunk, and more than one
     * frame (64 MiB + 5; under TSan, whose copies are slow, one chunk more
     * than one only). */
#ifdef __SANITIZE_THREAD__
    const size_t sizes[] = {1, 4096 + 7, (1u << 20) + 3, (17u << 20) + 5};
#else
    const size_t sizes[] = {1, 4096 + 7, (17u << 20) + 3, (64u << 20) + 5};
#endif
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        round_trip(e, c, src, cap, k * 8, 3, 11, sizes[k], 100 + k);
    expect_transport(e, c->peer, "cuda_ipc");
    /* Device to device: no staging through host memory on either side. */
    stub_counts(after);
    assert_int_equal(after[0] - before[0], 0);
    assert_int_equal(after[1] - before[1], 0);
    assert_int_equal(target_child_do(c, CMD_STAGED, 0, 0, 0), 0);
    /* The target opened the initiator's allocation once, and keeps it. */
    uint64_t opened = 0;
    assert_int_equal(target_child_do2(c, CMD_IMPORTS, 0, 0, 0, &opened), 1);
    assert_int_equal(opened, 1);

    /* A host buffer to the same peer goes by tcp in the same session. */
    size_t hlen = (1u << 20) + 1;
    unsigned char *host = malloc(hlen);
    assert_int_equal(ferry_register(e, host, hlen, FERRY_MEM_LOCAL), 0);
    harness_fill(host, hlen, 77);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, host, c->addr + 100, hlen), 0);
    assert_int_equal(target_child_do(c, CMD_CHECK, 77, 100, hlen), 0);
    expect_transport(e, c->peer, "cuda_ipc");

    ferry_engine_destroy(e);
    stub_free(src);
    free(host);
    target_child_stop(c); /* the child checks its imports were closed with the connections */
}

/* The owner's checks hold for every copy: a deregistered range, a
 * read-only one. Nothing is written. */
static void target_refuses_by_its_registry(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    target_child_t *c = child_start(cap, false);
    ferry_engine_t *e = initiator();
    unsigned char *src = device_source(e, cap);
    harness_fill(stub_alias(src), cap, 1);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, cap), 0);
    expect_transport(e, c->peer, "cuda_ipc");

    assert_int_equal(target_child_do(c, CMD_DEREGISTER, 0, 0, 0), 0);
    assert_int_equal(target_child_do(c, CMD_FILL, 9, 0, cap), 0);
    int rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, 4096);
    assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains("target range");
    assert_int_equal(target_child_do(c, CMD_CHECK, 9, 0, cap), 0);

    assert_int_equal(target_child_do(c, CMD_REREGISTER_RO, 0, 0, 0), 0);
    rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, 4096);
    if (rc != FERRY_ERR_ACCESS_DENIED) fail_msg("write to read-only: %d %s", rc, ferry_last_error_detail());
    assert_int_equal(target_child_do(c, CMD_CHECK, 9, 0, cap), 0);
    /* Reads are allowed. */
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_READ, src, c->addr, cap), 0);
    assert_true(harness_check(stub_alias(src), cap, 9));
    expect_transport(e, c->peer, "cuda_ipc");
    ferry_engine_destroy(e);
    stub_free(src);
    target_child_stop(c);
}

/* The initiator deregisters its region and allocates the memory again: the
 * next write exports the new allocation (the per-connection export cache
 * is keyed by region and generation; without that, the target would copy
 * the old allocation's bytes), and an import the new allocation overlaps
 * is closed at the target. */
static void deregistration_invalidates_the_handle(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    target_child_t *c = child_start(cap, false);
    ferry_engine_t *e = initiator();
    unsigned char *src = device_source(e, cap);
    write_verified(e, c, src, cap, 21);

    assert_int_equal(ferry_deregister(e, src), 0);
    unsigned char *again = stub_alloc(cap, 1, 0);
    stub_free(src); /* freed after the new one exists: a different memfd */
    assert_int_equal(ferry_register(e, again, cap, FERRY_MEM_LOCAL), 0);
    write_verified(e, c, again, cap, 22);
    /* The new allocation's handle was opened (the bytes above are its);
     * the freed one's mapping stays until something overlaps it or the
     * connection closes: the driver cannot tell it was freed. */
    uint64_t opened = 0;
    assert_int_equal(target_child_do2(c, CMD_IMPORTS, 0, 0, 0, &opened), 2);
    assert_int_equal(opened, 2);
    /* Freed first this time, and allocated again at the same address: the
     * import of the freed one is stale. */
    assert_int_equal(ferry_deregister(e, again), 0);
    stub_free(again);
    unsigned char *third = stub_alloc_at(again, cap, 1);
    assert_ptr_equal(third, again);
    assert_int_equal(ferry_register(e, third, cap, FERRY_MEM_LOCAL), 0);
    write_verified(e, c, third, cap, 23);
    assert_int_equal(target_child_do2(c, CMD_IMPORTS, 0, 0, 0, &opened), 2); /* the stale one closed, the new one open */
    assert_int_equal(opened, 3);
    ferry_engine_destroy(e);
    stub_free(third);
    target_child_stop(c);
}

/* Imports are bounded (32 per process): the least recently used one no
 * copy uses is closed, and opened again when named again. */
static void imports_are_bounded(void **state)
{
    (void)state;
    enum { N = 40, LEN = 4096 };
    target_child_t *c = child_start((size_t)N * LEN, false);
    ferry_engine_t *e = initiator();
    unsigned char *bufs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = stub_alloc(LEN, 1, 0);
        assert_non_null(bufs[i]);
        harness_fill(stub_alias(bufs[i]), LEN, 70 + (uint64_t)i);
        assert_int_equal(ferry_register(e, bufs[i], LEN, FERRY_MEM_LOCAL), 0);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, bufs[i], c->addr + (uint64_t)i * LEN, LEN), 0);
    expect_transport(e, c->peer, "cuda_ipc");
    for (int i = 0; i < N; i++) assert_int_equal(target_child_do(c, CMD_CHECK, 70 + (uint64_t)i, (uint64_t)i * LEN, LEN), 0);
    uint64_t opened = 0;
    assert_int_equal(target_child_do2(c, CMD_IMPORTS, 0, 0, 0, &opened), 32);
    assert_int_equal(opened, N);
    /* The first one was closed; named again, it is opened again. */
    assert_int_equal(target_child_do(c, CMD_ZERO, 0, 0, LEN), 0);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, bufs[0], c->addr, LEN), 0);
    assert_int_equal(target_child_do(c, CMD_CHECK, 70, 0, LEN), 0);
    assert_int_equal(target_child_do2(c, CMD_IMPORTS, 0, 0, 0, &opened), 32);
    assert_int_equal(opened, N + 1);
    ferry_engine_destroy(e);
    for (int i = 0; i < N; i++) stub_free(bufs[i]);
    target_child_stop(c);
}

/* A target restarted on the same port with its buffer at the same address:
 * the call that meets the new engine gets PEER_RESTARTED and writes
 * nothing; the next one goes by CUDA IPC again. */
static void restarted_peer_gets_nothing(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    target_child_t *c = child_start(cap, false);
    ferry_engine_t *e = initiator();
    unsigned char *src = device_source(e, cap);
    harness_fill(stub_alias(src), cap, 31);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, cap), 0);
    assert_int_equal(target_child_do(c, CMD_RESTART, 0, 0, 0), 0);
    assert_int_equal(target_child_do(c, CMD_IMPORTS, 0, 0, 0), 0); /* closed with the old engine's connections */
    assert_int_equal(target_child_do(c, CMD_ZERO, 0, 0, cap), 0);
    harness_fill(stub_alias(src), cap, 32);
    int rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, cap);
    if (rc != FERRY_ERR_PEER_RESTARTED) fail_msg("after restart: %d %s", rc, ferry_last_error_detail());
    assert_int_equal(target_child_do(c, CMD_ISZERO, 0, 0, cap), 0); /* nothing landed */
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, cap), 0);
    assert_int_equal(target_child_do(c, CMD_CHECK, 32, 0, cap), 0);
    expect_transport(e, c->peer, "cuda_ipc");
    ferry_engine_destroy(e);
    stub_free(src);
    target_child_stop(c);
}

/* Cancel while the target's copies run (each takes 40 ms): every request
 * ends COMPLETED (its bytes there) or CANCELLED, and after the cancel
 * returned nothing more lands. */
static void cancel_leaves_no_late_write(void **state)
{
    (void)state;
    enum { N = 16, PIECE = 256 << 10 };
    size_t cap = (size_t)N * PIECE;
    target_child_t *c = child_start(cap, false);
    ferry_engine_t *e = initiator();
    unsigned char *src = device_source(e, cap);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, 1), 0); /* session up */
    expect_transport(e, c->peer, "cuda_ipc");
    for (int i = 0; i < N; i++) harness_fill((unsigned char *)stub_alias(src) + (size_t)i * PIECE, PIECE, 41 + i);
    assert_int_equal(target_child_do(c, CMD_ZERO, 0, 0, cap), 0);
    assert_int_equal(target_child_do(c, CMD_DELAY, 40000, 0, 0), 0);
    ferry_batch_t *b = NULL;
    assert_int_equal(ferry_batch_alloc(e, N, &b), 0);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)i * PIECE, c->addr + (uint64_t)i * PIECE, PIECE};
    assert_true(ferry_batch_submit(b, c->peer, reqs, N, 20000) >= 0);
    usleep(150 * 1000);
    int rc = ferry_batch_cancel(b);
    if (rc) fail_msg("cancel: %d %s", rc, ferry_last_error_detail());
    int completed = 0, cancelled = 0;
    bool landed[N];
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(b, (size_t)i, &st), 0);
        if (st.state == FERRY_STATUS_COMPLETED) {
            completed++;
            assert_int_equal(target_child_do(c, CMD_CHECK, 41 + (uint64_t)i, (uint64_t)i * PIECE, PIECE), 0);
        } else {
            if (st.state != FERRY_STATUS_CANCELLED) fail_msg("request %d ended in state %d", i, st.state);
            cancelled++;
        }
        landed[i] = target_child_do(c, CMD_ISZERO, 0, (uint64_t)i * PIECE, PIECE) != 0;
    }
    assert_true(cancelled > 0);
    assert_int_equal(completed + cancelled, N);
    /* Nothing lands after the cancel returned. */
    usleep(300 * 1000);
    for (int i = 0; i < N; i++) {
        bool now = target_child_do(c, CMD_ISZERO, 0, (uint64_t)i * PIECE, PIECE) != 0;
        if (now != landed[i]) fail_msg("request %d landed after the cancel returned", i);
    }
    assert_int_equal(target_child_do(c, CMD_DELAY, 0, 0, 0), 0);
    ferry_batch_free(b);
    ferry_engine_destroy(e);
    stub_free(src);
    target_child_stop(c);
}

/* A target that turned CUDA IPC off does not offer it: another transport is
 * chosen and the device memory is staged; the bytes arrive. */
static void target_without_ipc(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    target_child_t *c = child_start(cap, true);
    ferry_engine_t *e = initiator();
    unsigned char *src = device_source(e, cap);
    write_verified(e, c, src, cap, 51);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(e, c->peer, &info), 0);
    assert_string_not_equal(info.transport, "cuda_ipc");
    assert_true(target_child_do(c, CMD_STAGED, 0, 0, 0) > 0);
    ferry_engine_destroy(e);
    stub_free(src);
    target_child_stop(c);
}

/* A raw initiator sends a CUDA_IPC_WRITE (the target makes cuda_ipc's
 * state for the connection, and refuses the unregistered range), then a
 * CMA_WRITE, or a CMA_VEC of one piece, on the same connection: shm must
 * not read cuda_ipc's state as its own (it did: it took the state for an
 * unchecked trust record and wrote its verdict into it, then answered).
 * The target closes the connection. */
static void other_transports_frames_on_one_connection(void **state)
{
    (void)state;
    ferry_engine_t *t = initiator();
    for (int vec = 0; vec < 2; vec++) {
        int fd = raw_handshaken(ferry_engine_port(t));
        assert_true(fd >= 0);
        struct cuda_ipc_export x = {.base = 0x7f0000000000ull, .size = 1u << 20, .device = 0};
        uint8_t payload[CUDA_IPC_EXPORT_SIZE];
        cuda_ipc_export_encode(&x, 0, payload);
        ferry_frame_t f = {.type = FERRY_FRAME_CUDA_IPC_WRITE, .req_id = 1, .addr = 0x10000, .len = 4096,
                           .aux = x.base, .plen = CUDA_IPC_EXPORT_SIZE};
        assert_int_equal(raw_send(fd, &f, payload), 0);
        ferry_frame_t a = raw_recv_frame(fd, NULL, 0);
        assert_int_equal(a.type, FERRY_FRAME_WRITE_ACK);
        assert_int_equal(a.status, FERRY_ERR_ADDRESS_NOT_REGISTERED);
        if (vec) {
            ferry_vec_desc_t d = {.addr = 0x10000, .len = 64, .req_id = 2, .aux = x.base};
            uint8_t desc[FERRY_WIRE_VEC_DESC_SIZE];
            ferry_vec_desc_encode(&d, desc);
            ferry_frame_t g = {.type = FERRY_FRAME_CMA_VEC, .req_id = 2, .len = 1, .addr = 64, .aux = FERRY_OP_WRITE,
                               .plen = FERRY_WIRE_VEC_DESC_SIZE};
            assert_int_equal(raw_send(fd, &g, desc), 0);
        } else {
            ferry_frame_t g = {.type = FERRY_FRAME_CMA_WRITE, .req_id = 2, .addr = 0x10000, .len = 4096,
                               .aux = x.base};
            assert_int_equal(raw_send(fd, &g, NULL), 0);
        }
        if (!raw_closed_within(fd, 5000)) fail_msg("%s on a cuda_ipc connection: not closed", vec ? "CMA_VEC" : "CMA_WRITE");
        close(fd);
    }
    ferry_engine_destroy(t);
}

/* Exactly once over CUDA IPC (cancel.h, "Placement reports"): through a
 * proxy that loses the answer to a write and cuts the link, or replays a
 * write or read frame, every byte is placed once and the call succeeds; a
 * replayed read lands nothing in the caller's buffer after it returned. */
static uint64_t child_placed(target_child_t *c)
{
    uint64_t placed = 0;
    assert_int_equal(target_child_do2(c, CMD_PLACED, 0, 0, 0, &placed), 0);
    return placed;
}

static void exactly_once_through(proxy_opts_t o, int op)
{
    enum { LEN = 1 << 20 };
    target_child_t *c = child_start(LEN, false);
    proxy_t *px = proxy_start("127.0.0.1", (uint16_t)atoi(strchr(c->peer, ':') + 1), &o);
    assert_non_null(px);
    ferry_engine_t *e = initiator();
    unsigned char *src = device_source(e, LEN);
    assert_int_equal(ferry_session_open(e, proxy_name(px)), 0);
    expect_transport(e, proxy_name(px), "cuda_ipc");
    unsigned char *bytes = stub_alias(src);
    int rc;
    if (op == FERRY_OP_WRITE) {
        harness_fill(bytes, LEN, 61);
        rc = ferry_transfer_sync(e, proxy_name(px), FERRY_OP_WRITE, src, c->addr, LEN);
    } else {
        assert_int_equal(target_child_do(c, CMD_FILL, 62, 0, LEN), 0);
        /* Each copy takes 30 ms: a replay served after the first answer
         * lands well after the call returned. */
        assert_int_equal(target_child_do(c, CMD_DELAY, 30000, 0, 0), 0);
        rc = ferry_transfer_sync(e, proxy_name(px), FERRY_OP_READ, src, c->addr, LEN);
    }
    if (rc) fail_msg("%s: %s", op == FERRY_OP_WRITE ? "write" : "read", ferry_last_error_detail());
    if (op == FERRY_OP_WRITE) {
        assert_int_equal(target_child_do(c, CMD_CHECK, 61, 0, LEN), 0);
        usleep(200 * 1000); /* a replay would be placed by now */
        uint64_t placed = child_placed(c);
        if (placed != LEN) fail_msg("the target placed %llu bytes of a %u-byte write", (unsigned long long)placed, LEN);
    } else {
        stub_lock();
        bool ok = harness_check(bytes, LEN, 62);
        memset(bytes, 0xEE, LEN); /* the caller reuses its buffer */
        stub_unlock();
        assert_true(ok);
        usleep(200 * 1000);
        stub_lock();
        size_t again = 0;
        for (size_t i = 0; i < LEN; i++) again += bytes[i] != 0xEE;
        stub_unlock();
        if (again) fail_msg("%zu bytes landed in the read's buffer after it returned", again);
        assert_int_equal(target_child_do(c, CMD_DELAY, 0, 0, 0), 0);
    }
    assert_int_equal(proxy_dropped(px) + proxy_duplicated(px), 1);
    ferry_engine_destroy(e);
    proxy_stop(px);
    stub_free(src);
    target_child_stop(c);
}

static void lost_write_answer_placed_once(void **state)
{
    (void)state;
    exactly_once_through((proxy_opts_t){.drop_answer = 1}, FERRY_OP_WRITE);
}

static void replayed_write_placed_once(void **state)
{
    (void)state;
    exactly_once_through((proxy_opts_t){.dup_write = 1, .dup_type = FERRY_FRAME_CUDA_IPC_WRITE}, FERRY_OP_WRITE);
}

static void replayed_read_lands_nothing_late(void **state)
{
    (void)state;
    exactly_once_through((proxy_opts_t){.dup_write = 1, .dup_type = FERRY_FRAME_CUDA_IPC_READ}, FERRY_OP_READ);
}


/* ---------------------------------------------------------------- VMM */

/* A process that names another's pid and descriptor in a VMM export must
 * not make the target take that descriptor: a victim (a child of ours)
 * exports a VMM allocation holding a secret; this process connects
 * claiming the victim's pid and asks the target to copy the victim's
 * allocation into the target's memory. The target refuses with the
 * reason, copying nothing: it verifies, as shm does, that the claimed pid
 * owns the connection's socket (link/peer_pid.c). (Before: it took the
 * descriptor with pidfd_getfd and copied the secret.) */
static int spoofed_write(const char *peer, int32_t claimed_pid, uint64_t dst, const struct cuda_ipc_export *x,
                         char *reason, size_t cap)
{
    ferry_engine_t *me = initiator();
    ferry_hello_t h;
    ferry_hello_fill(me, &h);
    h.pid = claimed_pid;
    uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    ferry_frame_t f;
    int fd = raw_hello_with((uint16_t)atoi(strchr(peer, ':') + 1), &h, &f, buf, sizeof buf);
    assert_int_equal(f.type, FERRY_FRAME_HELLO_ACK);
    uint8_t payload[CUDA_IPC_EXPORT_SIZE];
    cuda_ipc_export_encode(x, 0, payload);
    raw_send_frame(fd,
                   (ferry_frame_t){.type = FERRY_FRAME_CUDA_IPC_WRITE, .req_id = 77, .addr = dst, .len = 64,
                                   .aux = x->base, .plen = CUDA_IPC_EXPORT_SIZE},
                   payload);
    f = raw_recv_frame(fd, reason, cap);
    assert_true(f.plen < cap);
    reason[f.plen] = '\0';
    close(fd);
    ferry_engine_destroy(me);
    return f.status;
}

struct victim {
    int fd;
    uint64_t ino, base;
};

static void vmm_spoofed_pid_is_refused(void **state)
{
    (void)state;
    size_t cap = 2u << 20;
    target_child_t *c = child_start(cap, false);
    assert_int_equal(target_child_do(c, CMD_ZERO, 0, 0, cap), 0);
    int up[2];
    assert_int_equal(pipe(up), 0);
    pid_t victim = fork();
    assert_true(victim >= 0);
    if (victim == 0) { /* exports a VMM allocation holding a secret, then waits to be robbed */
        unsigned char *secret = vmm_alloc(cap, 1, FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, NULL);
        memset(stub_alias(secret), 0x5e, 64);
        void *h = dlopen(getenv("FERRY_CUDA_STUB"), RTLD_NOW | RTLD_NOLOAD);
        ferry_cuMemRetainAllocationHandle_fn retain =
            (ferry_cuMemRetainAllocationHandle_fn)dlsym(h, "cuMemRetainAllocationHandle");
        ferry_cuMemExportToShareableHandle_fn export_fd =
            (ferry_cuMemExportToShareableHandle_fn)dlsym(h, "cuMemExportToShareableHandle");
        FERRY_CUmemGenericAllocationHandle ah;
        struct victim v = {.fd = -1, .base = (uint64_t)(uintptr_t)secret};
        struct stat st;
        if (!retain || !export_fd || retain(&ah, secret) != 0 ||
            export_fd(&v.fd, ah, FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != 0 || fstat(v.fd, &st) != 0)
            v.fd = -1;
        v.ino = (uint64_t)st.st_ino;
        if (write(up[1], &v, sizeof v) != sizeof v) _exit(1);
        pause();
        _exit(0);
    }
    struct victim v;
    assert_int_equal(read(up[0], &v, sizeof v), sizeof v);
    close(up[0]);
    close(up[1]);
    assert_true(v.fd >= 0);
    struct cuda_ipc_vmm vm = {.pid = (int32_t)victim, .fd = v.fd, .ino = v.ino, .region = 1, .generation = 1};
    struct cuda_ipc_export x = {.base = v.base, .size = cap, .device = 1, .kind = CUDA_IPC_KIND_VMM};
    cuda_ipc_vmm_pack(&vm, x.handle);
    char reason[FERRY_WIRE_MAX_REASON + 1] = "";
    int st = spoofed_write(c->peer, (int32_t)victim, c->addr, &x, reason, sizeof reason);
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
    if (st != FERRY_ERR_NOT_IMPLEMENTED || !strstr(reason, "does not own"))
        fail_msg("the target answered %d: %s", st, reason);
    assert_int_equal(target_child_do(c, CMD_ISZERO, 0, 0, 64), 0); /* nothing copied */
    target_child_stop(c);
}

/* VMM memory (cuMemCreate + cuMemMap) at the initiator: written and read
 * device to device by CUDA IPC, no staging on either side; the target
 * imported the allocation once (by the descriptor it took from the
 * initiator) and unmapped it when the connection closed. Before VMM
 * export, such pieces went by tcp through host staging. */
static void vmm_memory_by_cuda_ipc(void **state)
{
    (void)state;
    size_t cap = (32u << 20) + 4096;
    target_child_t *c = child_start(cap, false);
    ferry_engine_t *e = initiator();
    unsigned char *src = vmm_alloc(cap, 1, FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, NULL);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    expect_transport(e, c->peer, "cuda_ipc");
    unsigned long before[7], after[7], v0[3], v1[3];
    stub_counts(before);
    stub_vmm_counts(v0);
    ferry_staging_totals_t t0, t1;
    ferry_staging_totals(&t0);
    int staged_there = target_child_do(c, CMD_STAGED, 0, 0, 0); /* the child's counters start as this process's */
#ifdef __SANITIZE_THREAD__
    const size_t sizes[] = {1, 4096 + 7, (1u << 20) + 3};
#else
    const size_t sizes[] = {1, 4096 + 7, (17u << 20) + 3};
#endif
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        round_trip(e, c, src, cap, k * 8, 5, 13, sizes[k], 300 + k);
    expect_transport(e, c->peer, "cuda_ipc");
    stub_counts(after);
    assert_int_equal(after[0] - before[0], 0); /* no staging here */
    assert_int_equal(after[1] - before[1], 0);
    ferry_staging_totals(&t1);
    assert_int_equal(t1.take_prefetched - t0.take_prefetched, 0);
    assert_int_equal(t1.land_queued - t0.land_queued, 0);
    assert_int_equal(target_child_do(c, CMD_STAGED, 0, 0, 0) - staged_there, 0); /* nor there */
    /* Exported once per connection of the session (the export cache is
     * the connection's), imported once, not released yet. */
    stub_vmm_counts(v1);
    unsigned long exported = v1[0] - v0[0];
    uint64_t released = 0, opened = 0;
    int imported = target_child_do2(c, CMD_VMM, 0, 0, 0, &released);
    if (exported < 1 || exported > 4 || imported != 1 || released != 0)
        fail_msg("%lu exports, %d imports, %llu released", exported, imported, (unsigned long long)released);
    assert_int_equal(target_child_do2(c, CMD_IMPORTS, 0, 0, 0, &opened), imported);
    assert_int_equal(opened, imported);
    ferry_engine_destroy(e);
    /* The connections closed: the target unmapped and released the imports. */
    for (int i = 0; i < 200 && released < (uint64_t)imported; i++) {
        usleep(10 * 1000);
        target_child_do2(c, CMD_VMM, 0, 0, 0, &released);
    }
    assert_int_equal(released, imported);
    vmm_free(src, cap);
    target_child_stop(c);
}

/* A VMM region deregistered and its memory made again: the next write
 * exports the new allocation (the bytes are its), and when the new one is
 * mapped where the old one was, the target's stale import is unmapped and
 * its allocation released. */
static void vmm_deregistration_invalidates_the_import(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    int fd_type = FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    target_child_t *c = child_start(cap, false);
    ferry_engine_t *e = initiator();
    unsigned char *a = vmm_alloc(cap, 1, fd_type, NULL);
    assert_int_equal(ferry_register(e, a, cap, FERRY_MEM_LOCAL), 0);
    write_verified(e, c, a, cap, 501);

    /* Made again elsewhere first: a second import; the first stays mapped
     * (nothing tells the target it was freed). */
    assert_int_equal(ferry_deregister(e, a), 0);
    unsigned char *b = vmm_alloc(cap, 1, fd_type, NULL);
    vmm_free(a, cap);
    assert_int_equal(ferry_register(e, b, cap, FERRY_MEM_LOCAL), 0);
    write_verified(e, c, b, cap, 502);
    uint64_t opened = 0, released = 0;
    assert_int_equal(target_child_do2(c, CMD_IMPORTS, 0, 0, 0, &opened), 2);
    assert_int_equal(opened, 2);

    /* Then freed and made again at the same address: the stale import is
     * unmapped and released at once. */
    assert_int_equal(ferry_deregister(e, b), 0);
    vmm_free(b, cap);
    unsigned char *again = vmm_alloc(cap, 1, fd_type, b);
    assert_ptr_equal(again, b);
    assert_int_equal(ferry_register(e, again, cap, FERRY_MEM_LOCAL), 0);
    write_verified(e, c, again, cap, 503);
    assert_int_equal(target_child_do2(c, CMD_IMPORTS, 0, 0, 0, &opened), 2);
    assert_int_equal(opened, 3);
    assert_int_equal(target_child_do2(c, CMD_VMM, 0, 0, 0, &released), 3);
    assert_int_equal(released, 1);
    expect_transport(e, c->peer, "cuda_ipc");
    ferry_engine_destroy(e);
    vmm_free(again, cap);
    target_child_stop(c);
}

/* One region over two VMM allocations mapped side by side in one reserved
 * range, as PyTorch's expandable segments map their 2 or 20 MiB chunks;
 * the second created with second_types. A write and a read across the
 * seam, bytes checked; returns the staging copies both sides made and
 * sets *imported to the target's VMM imports. */
static unsigned long across_the_seam(int second_types, int *imported)
{
    size_t chunk = 1u << 20, cap = 2 * chunk;
    target_child_t *c = child_start(cap, false);
    ferry_engine_t *e = initiator();
    FERRY_CUdeviceptr va = 0;
    FERRY_CUmemGenericAllocationHandle h[2];
    assert_int_equal(vmm_reserve(&va, cap, 0, 0, 0), 0);
    for (int i = 0; i < 2; i++) {
        FERRY_CUmemAllocationProp prop = {
            .type = FERRY_CU_MEM_ALLOCATION_TYPE_PINNED,
            .requestedHandleTypes = i ? second_types : FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            .location = {FERRY_CU_MEM_LOCATION_TYPE_DEVICE, 1}};
        assert_int_equal(vmm_create(&h[i], chunk, &prop, 0), 0);
        assert_int_equal(vmm_map(va + i * chunk, chunk, 0, h[i], 0), 0);
        FERRY_CUmemAccessDesc access = {{FERRY_CU_MEM_LOCATION_TYPE_DEVICE, 1},
                                        FERRY_CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        assert_int_equal(vmm_set_access(va + i * chunk, chunk, &access, 1), 0);
        assert_int_equal(vmm_release(h[i]), 0);
    }
    unsigned char *src = (unsigned char *)(uintptr_t)va;
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    expect_transport(e, c->peer, "cuda_ipc");
    unsigned long before[7], after[7];
    ferry_staging_totals_t t0, t1;
    stub_counts(before);
    ferry_staging_totals(&t0);
    int staged_there = target_child_do(c, CMD_STAGED, 0, 0, 0);
    size_t off = chunk - 4096 - 3, len = 8192 + 7, head = chunk - off; /* across the seam */
    /* The two allocations' aliases are not contiguous: the pattern goes through one buffer. */
    unsigned char *pat = malloc(len);
    harness_fill(pat, len, 801);
    memcpy(stub_alias(src + off), pat, head);
    memcpy(stub_alias(src + chunk), pat + head, len - head);
    int rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src + off, c->addr + 1, len);
    if (rc) fail_msg("write: %s", ferry_last_error_detail());
    assert_int_equal(target_child_do(c, CMD_CHECK, 801, 1, len), 0);
    assert_int_equal(target_child_do(c, CMD_FILL, 802, 0, len), 0);
    memset(stub_alias(src + off), 0, head);
    memset(stub_alias(src + chunk), 0, len - head);
    rc = ferry_transfer_sync(e, c->peer, FERRY_OP_READ, src + off, c->addr, len);
    if (rc) fail_msg("read: %s", ferry_last_error_detail());
    memcpy(pat, stub_alias(src + off), head);
    memcpy(pat + head, stub_alias(src + chunk), len - head);
    assert_true(harness_check(pat, len, 802));
    free(pat);
    stub_counts(after);
    ferry_staging_totals(&t1);
    unsigned long staged = after[0] - before[0] + after[1] - before[1] + t1.take_prefetched - t0.take_prefetched +
                           t1.land_queued - t0.land_queued +
                           (unsigned long)(target_child_do(c, CMD_STAGED, 0, 0, 0) - staged_there);
    uint64_t released = 0;
    *imported = target_child_do2(c, CMD_VMM, 0, 0, 0, &released);
    expect_transport(e, c->peer, "cuda_ipc");
    ferry_engine_destroy(e);
    for (int i = 0; i < 2; i++) assert_int_equal(vmm_unmap(va + i * chunk, chunk), 0);
    assert_int_equal(vmm_address_free(va, cap), 0);
    target_child_stop(c);
    return staged;
}

/* Across the seam of two shareable allocations: by CUDA IPC in slices cut
 * at it (each allocation exported and imported once), no staging.
 * Before, the piece was "not in one allocation" and went by tcp through
 * host staging. */
static void vmm_region_over_two_allocations(void **state)
{
    (void)state;
    int imported = 0;
    assert_int_equal(across_the_seam(FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &imported), 0);
    assert_int_equal(imported, 2);
}

/* The second allocation not shareable: the first's bytes go by CUDA IPC,
 * the rest of the piece by tcp with staging, in the same call. */
static void vmm_seam_to_an_unshareable_allocation(void **state)
{
    (void)state;
    int imported = 0;
    assert_true(across_the_seam(0, &imported) > 0);
    assert_int_equal(imported, 1);
}

/* A target the kernel does not let take the initiator's descriptor (no
 * ptrace permission: simulated, the tests run as a user it would let
 * through) answers NOT_IMPLEMENTED: the call completes by tcp, the
 * session moves to tcp with the reason, nothing was imported. */
static void vmm_getfd_refused_falls_back_to_tcp(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    target_child_t *c = child_start_with(cap, false, EPERM);
    ferry_engine_t *e = initiator();
    unsigned char *src = vmm_alloc(cap, 1, FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, NULL);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    expect_transport(e, c->peer, "cuda_ipc");
    harness_fill(stub_alias(src), cap, 601);
    int rc = ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, cap);
    if (rc) fail_msg("write: %s", ferry_last_error_detail());
    assert_int_equal(target_child_do(c, CMD_CHECK, 601, 0, cap), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(e, c->peer, &info), 0);
    if (strcmp(info.transport, "tcp") != 0 || !strstr(info.transport_reason, "pidfd_getfd") ||
        !strstr(info.transport_reason, "ptrace"))
        fail_msg("transport %s (%s), expected tcp for the refused descriptor", info.transport, info.transport_reason);
    uint64_t released = 0;
    assert_int_equal(target_child_do2(c, CMD_VMM, 0, 0, 0, &released), 0);
    ferry_engine_destroy(e);
    vmm_free(src, cap);
    target_child_stop(c);
}

/* VMM memory not created shareable as a descriptor cannot be exported: it
 * goes by tcp (staged) in the cuda_ipc session, and the bytes arrive. */
static void vmm_not_shareable_goes_by_tcp(void **state)
{
    (void)state;
    size_t cap = 1u << 20;
    target_child_t *c = child_start(cap, false);
    ferry_engine_t *e = initiator();
    unsigned char *src = vmm_alloc(cap, 1, 0, NULL);
    assert_int_equal(ferry_register(e, src, cap, FERRY_MEM_LOCAL), 0);
    harness_fill(stub_alias(src), cap, 701);
    unsigned long before[7], after[7];
    stub_counts(before);
    assert_int_equal(ferry_transfer_sync(e, c->peer, FERRY_OP_WRITE, src, c->addr, cap), 0);
    assert_int_equal(target_child_do(c, CMD_CHECK, 701, 0, cap), 0);
    stub_counts(after);
    ferry_staging_totals_t t;
    ferry_staging_totals(&t);
    assert_true(after[0] - before[0] + t.take_prefetched > 0); /* staged here */
    expect_transport(e, c->peer, "cuda_ipc");
    assert_int_equal(target_child_do(c, CMD_VMM, 0, 0, 0), 0);
    ferry_engine_destroy(e);
    vmm_free(src, cap);
    target_child_stop(c);
}

/* The export's wire form: round trip and every refusal. */
static void export_codec(void **state)
{
    (void)state;
    struct cuda_ipc_export x = {.base = 0x7f0000000000ull, .size = 1u << 20, .device = 3}, y;
    for (int i = 0; i < 64; i++) x.handle[i] = (uint8_t)(i * 7);
    uint8_t wire[CUDA_IPC_EXPORT_SIZE];
    uint32_t dl = 0;
    cuda_ipc_export_encode(&x, 0xdeadbeef, wire);
    assert_int_equal(cuda_ipc_export_decode(wire, &y, &dl), 0);
    assert_memory_equal(x.handle, y.handle, 64);
    assert_true(y.base == x.base && y.size == x.size && y.device == 3 && dl == 0xdeadbeef);
    x.size = 0;
    cuda_ipc_export_encode(&x, 0, wire);
    assert_int_equal(cuda_ipc_export_decode(wire, &y, &dl), FERRY_ERR_MALFORMED_FRAME);
    x.size = 2;
    x.base = UINT64_MAX;
    cuda_ipc_export_encode(&x, 0, wire);
    assert_int_equal(cuda_ipc_export_decode(wire, &y, &dl), FERRY_ERR_MALFORMED_FRAME);
    x.base = 4096;
    x.device = -1;
    cuda_ipc_export_encode(&x, 0, wire);
    assert_int_equal(cuda_ipc_export_decode(wire, &y, &dl), FERRY_ERR_MALFORMED_FRAME);
    /* The kind: legacy is what older peers send (device word < 2^24); a
     * VMM export round trips with its descriptor; unknown kinds refused. */
    x.device = 2;
    x.kind = CUDA_IPC_KIND_LEGACY;
    cuda_ipc_export_encode(&x, 0, wire);
    assert_int_equal(wire[80] | wire[81] << 8 | wire[82] << 16 | wire[83] << 24, 2);
    struct cuda_ipc_vmm v = {.pid = 4242, .fd = 17, .ino = 0x123456789aull, .region = 0x7f00000000ull, .generation = 9}, w;
    cuda_ipc_vmm_pack(&v, x.handle);
    x.kind = CUDA_IPC_KIND_VMM;
    cuda_ipc_export_encode(&x, 7, wire);
    assert_int_equal(cuda_ipc_export_decode(wire, &y, &dl), 0);
    assert_true(y.kind == CUDA_IPC_KIND_VMM && y.device == 2 && dl == 7);
    cuda_ipc_vmm_unpack(y.handle, &w);
    assert_true(w.pid == 4242 && w.fd == 17 && w.ino == 0x123456789aull && w.region == 0x7f00000000ull &&
                w.generation == 9);
    wire[83] = 2;
    assert_int_equal(cuda_ipc_export_decode(wire, &y, &dl), FERRY_ERR_MALFORMED_FRAME);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(export_codec),
        cmocka_unit_test(write_and_read_device_to_device),
        cmocka_unit_test(target_refuses_by_its_registry),
        cmocka_unit_test(deregistration_invalidates_the_handle),
        cmocka_unit_test(imports_are_bounded),
        cmocka_unit_test(restarted_peer_gets_nothing),
        cmocka_unit_test(cancel_leaves_no_late_write),
        cmocka_unit_test(target_without_ipc),
        cmocka_unit_test(other_transports_frames_on_one_connection),
        cmocka_unit_test(vmm_spoofed_pid_is_refused),
        cmocka_unit_test(lost_write_answer_placed_once),
        cmocka_unit_test(replayed_write_placed_once),
        cmocka_unit_test(replayed_read_lands_nothing_late),
        cmocka_unit_test(vmm_memory_by_cuda_ipc),
        cmocka_unit_test(vmm_deregistration_invalidates_the_import),
        cmocka_unit_test(vmm_region_over_two_allocations),
        cmocka_unit_test(vmm_seam_to_an_unshareable_allocation),
        cmocka_unit_test(vmm_getfd_refused_falls_back_to_tcp),
        cmocka_unit_test(vmm_not_shareable_goes_by_tcp),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
#endif
