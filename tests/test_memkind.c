/* SPDX-License-Identifier: Apache-2.0 */
/* Memory kinds and the TCP transport's host staging, exercised for real with
 * the test-only fake device kind: its "device" pages are mapped PROT_NONE
 * (the CPU cannot touch them, as with GPU memory), and the kind's copy
 * functions reach them through a second mapping of the same memfd. A
 * transfer can only succeed if every byte goes through the staging copies.
 * Also: the registry's kind bookkeeping and release hook. Every build. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/testing.h"
#include "util/memkind.h"
#include "link/registry.h"
#include "fake_dev.h"
#include "harness.h"

static int teardown_fakes(void **state)
{
    (void)state;
    ferry_memkind_fake_clear();
    return 0;
}

static uint32_t kind_at(ferry_engine_t *e, const void *p)
{
    ferry_registry_read_lock(ferry_test_registry(e));
    ferry_region_t *r = ferry_registry_lookup_locked(ferry_test_registry(e), (uint64_t)(uintptr_t)p, 1);
    uint32_t k = r ? r->kind : 0xffffffffu;
    ferry_registry_unlock(ferry_test_registry(e));
    return k;
}

/* The fake pages really are out of the CPU's reach: a socket send from
 * them fails, so only staged copies can move them. */
static void fake_memory_is_unreachable(void **state)
{
    (void)state;
    fake_dev_t d = fake_dev_new(4096);
    int p[2];
    assert_int_equal(pipe(p), 0);
    errno = 0;
    assert_int_equal(write(p[1], d.base, 16), -1);
    assert_int_equal(errno, EFAULT);
    close(p[0]);
    close(p[1]);
    fake_dev_free(&d);
}

static void registration_detects_kinds(void **state)
{
    (void)state;
    ferry_engine_t *e = harness_engine(5000);
    fake_dev_t d = fake_dev_new(1u << 20);
    unsigned char *host = malloc(4096);
    assert_int_equal(ferry_register(e, d.base, d.len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(e, host, 4096, FERRY_MEM_LOCAL), 0);
    assert_int_equal(FERRY_MEMKIND_TYPE(kind_at(e, d.base)), FERRY_MEMKIND_FAKE);
    assert_int_equal(kind_at(e, host), FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_registry_device_count(ferry_test_registry(e)), 1);
    char name[32];
    assert_string_equal(ferry_memkind_name(kind_at(e, d.base), name, sizeof name), "fake:0");
    assert_string_equal(ferry_memkind_name(FERRY_MEMKIND_MAKE(FERRY_MEMKIND_CUDA, 3), name, sizeof name), "cuda:3");
    assert_string_equal(ferry_memkind_name(FERRY_MEMKIND_HOST, name, sizeof name), "host");
    assert_int_equal(ferry_deregister(e, d.base), 0);
    assert_int_equal(ferry_registry_device_count(ferry_test_registry(e)), 0);

    /* A range starting in device memory and running past it is refused. */
    assert_int_equal(ferry_register(e, d.base + 4096, d.len, FERRY_MEM_REMOTE), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("runs past the end of its fake device range");

    /* Batches detect each region; a bad one registers none. */
    void *addrs[2] = {d.base, d.base + 8192};
    size_t lens[2] = {4096, d.len};
    assert_int_equal(ferry_register_batch(e, addrs, lens, 2, FERRY_MEM_REMOTE), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("region 1 of 2 (none registered)");
    assert_int_equal(ferry_region_count(e), 1);
    lens[1] = 4096;
    assert_int_equal(ferry_register_batch(e, addrs, lens, 2, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_registry_device_count(ferry_test_registry(e)), 2);
    assert_int_equal(ferry_deregister_batch(e, addrs, 2), 0);
    assert_int_equal(ferry_registry_device_count(ferry_test_registry(e)), 0);

    /* Without CUDA in the build, or without a driver, host memory stays
     * host memory and the status says why. */
    const char *status = ferry_memkind_status();
    assert_true(strstr(status, "CUDA not built in") || strstr(status, "CUDA built in"));
    ferry_engine_destroy(e);
    free(host);
    fake_dev_free(&d);
}

/* --------------------------------------------------- staging over TCP */

typedef struct pair {
    ferry_engine_t *initiator, *target;
    char peer[300];
} pair_t;

static pair_t pair_make(int checksum)
{
    pair_t p;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 10000;
    cfg.checksum = checksum;
    cfg.transport = "tcp";
    p.initiator = harness_engine_cfg(&cfg);
    ferry_config_init(&cfg);
    cfg.timeout_ms = 10000;
    cfg.checksum = checksum;
    p.target = harness_engine_cfg(&cfg);
    snprintf(p.peer, sizeof p.peer, "%s", ferry_engine_name(p.target));
    return p;
}

static void pair_end(pair_t *p)
{
    ferry_engine_destroy(p->initiator);
    ferry_engine_destroy(p->target);
}

/* A buffer of either kind: bytes() is where the test reads and writes. */
typedef struct buf {
    fake_dev_t dev;
    unsigned char *host;
    int is_dev;
} buf_t;

static buf_t buf_new(size_t len, int is_dev)
{
    buf_t b = {.is_dev = is_dev};
    if (is_dev)
        b.dev = fake_dev_new(len);
    else
        b.host = malloc(len);
    return b;
}
static unsigned char *buf_ptr(buf_t *b) { return b->is_dev ? b->dev.base : b->host; }
static unsigned char *buf_bytes(buf_t *b) { return b->is_dev ? b->dev.alias : b->host; }
static void buf_free(buf_t *b)
{
    if (b->is_dev)
        fake_dev_free(&b->dev);
    else
        free(b->host);
}

/* Moves len bytes initiator->target (write) or target->initiator (read)
 * between buffers of the given kinds and checks them, and that staging
 * copies happened where device memory was involved. */
static void move(int checksum, int opcode, int local_dev, int remote_dev, size_t len)
{
    pair_t p = pair_make(checksum);
    buf_t local = buf_new(len, local_dev), remote = buf_new(len, remote_dev);
    assert_int_equal(ferry_register(p.initiator, buf_ptr(&local), len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p.target, buf_ptr(&remote), len, FERRY_MEM_REMOTE), 0);
    buf_t *from = opcode == FERRY_OP_WRITE ? &local : &remote, *to = opcode == FERRY_OP_WRITE ? &remote : &local;
    harness_fill(buf_bytes(from), len, len + (size_t)opcode);
    memset(buf_bytes(to), 0, len);
    unsigned long th0, fh0, th1, fh1;
    ferry_memkind_fake_counts(&th0, &fh0);
    int rc = ferry_transfer_sync(p.initiator, p.peer, opcode, buf_ptr(&local), (uint64_t)(uintptr_t)buf_ptr(&remote),
                                 len);
    if (rc) fprintf(stderr, "%s\n", ferry_last_error_detail());
    assert_int_equal(rc, 0);
    assert_true(harness_check(buf_bytes(to), len, len + (size_t)opcode));
    ferry_memkind_fake_counts(&th1, &fh1);
    size_t slices = (len + (1u << 20) - 1) >> 20, subs = (len + (256u << 10) - 1) >> 18;
    /* Out of the device side, one staging copy per slice at the
     * initiator, per 256 KiB sub-slice of a target's unchecksummed answer
     * (memkind.h, ferry_stage); into it, one per slice verified whole
     * (checksums), else one per sub-slice of the receiver's pipeline
     * (ferry_land). */
    size_t outs = opcode == FERRY_OP_READ && !checksum ? subs : slices;
    assert_int_equal(th1 - th0, (from->is_dev ? outs : 0));
    assert_int_equal(fh1 - fh0, (to->is_dev ? (checksum ? slices : subs) : 0));
    ferry_deregister(p.initiator, buf_ptr(&local));
    ferry_deregister(p.target, buf_ptr(&remote));
    buf_free(&local);
    buf_free(&remote);
    pair_end(&p);
}

static void write_from_device(void **state)
{
    (void)state;
    move(0, FERRY_OP_WRITE, 1, 0, (3u << 20) + 5);
    move(0, FERRY_OP_WRITE, 1, 0, 1);
}

static void write_into_device(void **state)
{
    (void)state;
    move(0, FERRY_OP_WRITE, 0, 1, (3u << 20) + 5);
}

static void read_from_device(void **state)
{
    (void)state;
    move(0, FERRY_OP_READ, 0, 1, (2u << 20) + 17);
}

static void read_into_device(void **state)
{
    (void)state;
    move(0, FERRY_OP_READ, 1, 0, (2u << 20) + 17);
}

static void device_to_device_both_ways(void **state)
{
    (void)state;
    move(0, FERRY_OP_WRITE, 1, 1, (1u << 20) + 1);
    move(0, FERRY_OP_READ, 1, 1, (1u << 20) + 1);
}

static void staging_with_checksums(void **state)
{
    (void)state;
    move(1, FERRY_OP_WRITE, 1, 1, (2u << 20) + 3);
    move(1, FERRY_OP_READ, 1, 1, (2u << 20) + 3);
    move(1, FERRY_OP_WRITE, 0, 1, 4096);
    move(1, FERRY_OP_READ, 1, 0, 4096);
}

/* A batch mixing kinds on both sides, in one pipelined stream. */
static void mixed_batch(void **state)
{
    (void)state;
    pair_t p = pair_make(0);
    enum { N = 6, LEN = 300000 };
    buf_t local[N], remote[N];
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        local[i] = buf_new(LEN, i % 2);
        remote[i] = buf_new(LEN, i % 3 == 0);
        assert_int_equal(ferry_register(p.initiator, buf_ptr(&local[i]), LEN, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_register(p.target, buf_ptr(&remote[i]), LEN, FERRY_MEM_REMOTE), 0);
        harness_fill(buf_bytes(&local[i]), LEN, (uint64_t)i);
        memset(buf_bytes(&remote[i]), 0, LEN);
        locals[i] = buf_ptr(&local[i]);
        remotes[i] = (uint64_t)(uintptr_t)buf_ptr(&remote[i]);
        lens[i] = LEN;
    }
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
    for (int i = 0; i < N; i++) {
        assert_true(harness_check(buf_bytes(&remote[i]), LEN, (uint64_t)i));
        memset(buf_bytes(&local[i]), 0, LEN);
    }
    assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, locals, remotes, lens, N), 0);
    for (int i = 0; i < N; i++) {
        assert_true(harness_check(buf_bytes(&local[i]), LEN, (uint64_t)i));
        assert_int_equal(ferry_deregister(p.initiator, locals[i]), 0);
        assert_int_equal(ferry_deregister(p.target, buf_ptr(&remote[i])), 0);
        buf_free(&local[i]);
        buf_free(&remote[i]);
    }
    pair_end(&p);
}

/* Small pieces into and out of device memory travel in vector frames
 * (WRITEV, READV): the target lands and gathers them through its landing
 * buffer (tcp_device.c), one copy per device piece each way, with and
 * without checksums; host pieces in the same frames are copied in place. */
static void vector_frames_with_device_pieces(void **state)
{
    (void)state;
    for (int checksum = 0; checksum < 2; checksum++) {
        pair_t p = pair_make(checksum);
        enum { N = 48, PIECE = 3000 };
        buf_t local = buf_new((size_t)N * PIECE, 0), dev = buf_new((size_t)N * PIECE, 1),
              host = buf_new((size_t)N * PIECE, 0);
        assert_int_equal(ferry_register(p.initiator, buf_ptr(&local), (size_t)N * PIECE, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_register(p.target, buf_ptr(&dev), (size_t)N * PIECE, FERRY_MEM_REMOTE), 0);
        assert_int_equal(ferry_register(p.target, buf_ptr(&host), (size_t)N * PIECE, FERRY_MEM_REMOTE), 0);
        void *locals[N];
        uint64_t remotes[N];
        size_t lens[N];
        for (int i = 0; i < N; i++) { /* every third piece to host memory, the rest to device memory */
            locals[i] = buf_ptr(&local) + (size_t)i * PIECE;
            remotes[i] = (uint64_t)(uintptr_t)(buf_ptr(i % 3 ? &dev : &host) + (size_t)i * PIECE);
            lens[i] = PIECE;
        }
        harness_fill(buf_bytes(&local), (size_t)N * PIECE, 33);
        memset(buf_bytes(&dev), 0, (size_t)N * PIECE);
        memset(buf_bytes(&host), 0, (size_t)N * PIECE);
        unsigned long th0, fh0, th1, fh1;
        ferry_memkind_fake_counts(&th0, &fh0);
        assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_WRITE, locals, remotes, lens, N), 0);
        ferry_memkind_fake_counts(&th1, &fh1);
        assert_int_equal(fh1 - fh0, N - N / 3);
        for (int i = 0; i < N; i++) {
            const unsigned char *at = buf_bytes(i % 3 ? &dev : &host) + (size_t)i * PIECE;
            assert_memory_equal(at, buf_bytes(&local) + (size_t)i * PIECE, PIECE);
        }
        memset(buf_bytes(&local), 0, (size_t)N * PIECE);
        assert_int_equal(ferry_batch_transfer_sync(p.initiator, p.peer, FERRY_OP_READ, locals, remotes, lens, N), 0);
        ferry_memkind_fake_counts(&th0, &fh0);
        assert_int_equal(th0 - th1, N - N / 3);
        assert_true(harness_check(buf_bytes(&local), (size_t)N * PIECE, 33));
        ferry_deregister(p.initiator, buf_ptr(&local));
        ferry_deregister(p.target, buf_ptr(&dev));
        ferry_deregister(p.target, buf_ptr(&host));
        buf_free(&local);
        buf_free(&dev);
        buf_free(&host);
        pair_end(&p);
    }
}

/* ------------------------------------------------------ registry hooks */

/* The owner's view of its registered memory (what the Python binding's
 * write_bytes_to_buffer / read_bytes_from_buffer use): a lookup that names
 * host or device memory, and copies that check the registration first and
 * go through the kind's copy functions, so a careless address is an error
 * and device memory is reached without the CPU touching it. */
static void region_access_checks_and_reaches_device_memory(void **state)
{
    (void)state;
    ferry_engine_t *e = harness_engine(2000);
    fake_dev_t d = fake_dev_new(8192);
    unsigned char *host = calloc(1, 4096), out[64];
    assert_int_equal(ferry_register(e, d.base, d.len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(e, host, 4096, FERRY_MEM_LOCAL), 0);

    ferry_region_info_t info;
    assert_int_equal(ferry_region_query(e, d.base + 100, 64, &info), 0);
    assert_int_equal(info.addr, (uint64_t)(uintptr_t)d.base);
    assert_int_equal(info.len, 8192);
    assert_int_equal(info.flags, FERRY_MEM_REMOTE);
    assert_int_equal(info.device, 0);
    assert_string_equal(info.kind, "fake:0");
    assert_int_equal(ferry_region_query(e, host, 0, &info), 0);
    assert_int_equal(info.device, -1);
    assert_string_equal(info.kind, "host");

    /* Into and out of "device" memory: only through the staging copies. */
    unsigned long to0, from0, to1, from1;
    ferry_memkind_fake_counts(&to0, &from0);
    assert_int_equal(ferry_region_write(e, d.base + 10, "device bytes", 12), 0);
    assert_memory_equal(d.alias + 10, "device bytes", 12);
    assert_int_equal(ferry_region_read(e, out, d.base + 10, 12), 0);
    assert_memory_equal(out, "device bytes", 12);
    ferry_memkind_fake_counts(&to1, &from1);
    assert_int_equal(to1 - to0, 1);
    assert_int_equal(from1 - from0, 1);
    assert_int_equal(ferry_region_write(e, host + 4090, "abcdef", 6), 0);
    assert_memory_equal(host + 4090, "abcdef", 6);

    /* Careless addresses: named, nothing touched. */
    assert_int_equal(ferry_region_write(e, NULL, "x", 1), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_non_null(strstr(ferry_last_error_detail(), "not registered"));
    assert_int_equal(ferry_region_read(e, out, (void *)8, 8), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(ferry_region_read(e, out, (void *)1, 16), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(ferry_region_write(e, host + 4090, "abcdefg", 7), FERRY_ERR_OUT_OF_BOUNDS);
    assert_int_equal(ferry_region_query(e, out, 8, &info), FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_int_equal(ferry_region_read(e, NULL, host, 8), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_region_query(NULL, host, 8, &info), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_region_write(e, NULL, NULL, 0), 0); /* zero bytes: nothing to do */
    assert_int_equal(ferry_deregister(e, host), 0);
    assert_int_equal(ferry_region_write(e, host, "x", 1), FERRY_ERR_ADDRESS_NOT_REGISTERED);

    /* Device-memory support is reported (no CUDA device here: 0, and why). */
    const char *why = NULL;
    int support = ferry_device_memory_supported(&why);
    assert_true(support == 0 || support == 1);
    assert_non_null(why);
    assert_non_null(strstr(why, "CUDA"));

    ferry_deregister(e, d.base);
    fake_dev_free(&d);
    free(host);
    ferry_engine_destroy(e);
}

/* Two owners' slots: 1 releases under the lock only, 2 also after it. */
static int released, released_after;
static void count_release(void *ctx, const ferry_region_t *reg, void *state)
{
    assert_ptr_equal(ctx, &released);
    assert_ptr_equal(state, (void *)0x1);
    assert_ptr_equal(reg->slot[1], (void *)0x1);
    released++;
}

static void count_release_other(void *ctx, const ferry_region_t *reg, void *state)
{
    (void)ctx, (void)reg;
    assert_ptr_equal(state, (void *)0x2);
}

static void count_released_after(void *ctx, const ferry_region_t *reg, void *state)
{
    (void)ctx;
    assert_ptr_equal(state, (void *)0x2);
    assert_int_equal(reg->addr, 0x10000); /* a copy: the region is gone */
    released_after++;
}

static void set_slot(ferry_registry_t *r, uint64_t addr, unsigned slot, void *state)
{
    ferry_registry_read_lock(r);
    ferry_region_t *reg = ferry_registry_lookup_locked(r, addr, 1);
    assert_non_null(reg);
    reg->slot[slot] = state;
    ferry_registry_unlock(r);
}

static int mark_updated(void *arg, ferry_region_t *reg)
{
    *(uint64_t *)arg = reg->addr;
    return 0;
}

static void registry_release_hook(void **state)
{
    (void)state;
    ferry_registry_t r;
    ferry_registry_init(&r);
    ferry_registry_set_hook(&r, 1, &(ferry_region_hook_t){.release = count_release, .ctx = &released});
    ferry_registry_set_hook(&r, 2, &(ferry_region_hook_t){.release = count_release_other,
                                                          .released = count_released_after});
    released = released_after = 0;
    assert_int_equal(ferry_registry_add_kind(&r, 0x10000, 0x1000, FERRY_MEM_REMOTE, FERRY_MEMKIND_FAKE), 0);
    assert_int_equal(ferry_registry_add(&r, 0x20000, 0x1000, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_registry_add(&r, 0x30000, 0x1000, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_registry_device_count(&r), 1);
    /* lookup_locked: only whole containment. */
    ferry_registry_read_lock(&r);
    assert_non_null(ferry_registry_lookup_locked(&r, 0x10800, 0x800));
    assert_null(ferry_registry_lookup_locked(&r, 0x10800, 0x801));
    assert_null(ferry_registry_lookup_locked(&r, 0x18000, 1));
    assert_null(ferry_registry_lookup_locked(&r, 0x10000, 0));
    ferry_registry_unlock(&r);
    /* update: only a region's start. */
    uint64_t seen = 0;
    assert_int_equal(ferry_registry_update(&r, 0x20000, mark_updated, &seen, "test"), 0);
    assert_int_equal(seen, 0x20000);
    assert_int_equal(ferry_registry_update(&r, 0x20800, mark_updated, &seen, "test"), FERRY_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ferry_last_error_detail(), "test: no region starting at 0x20800"));
    /* Only regions with state are released; once each, per slot. */
    set_slot(&r, 0x10000, 1, (void *)0x1);
    set_slot(&r, 0x10000, 2, (void *)0x2);
    assert_int_equal(ferry_registry_remove(&r, 0x20000), 0);
    assert_int_equal(released, 0);
    assert_int_equal(ferry_registry_remove(&r, 0x10000), 0);
    assert_int_equal(released, 1);
    assert_int_equal(released_after, 1);
    assert_int_equal(ferry_registry_device_count(&r), 0);
    set_slot(&r, 0x30000, 1, (void *)0x1);
    ferry_registry_release_slot(&r, 1);
    assert_int_equal(released, 2);
    /* The slot's hook is gone after release_slot: destroy releases nothing more. */
    set_slot(&r, 0x30000, 1, (void *)0x1);
    ferry_registry_destroy(&r);
    assert_int_equal(released, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(fake_memory_is_unreachable, teardown_fakes),
        cmocka_unit_test_teardown(registration_detects_kinds, teardown_fakes),
        cmocka_unit_test_teardown(write_from_device, teardown_fakes),
        cmocka_unit_test_teardown(write_into_device, teardown_fakes),
        cmocka_unit_test_teardown(read_from_device, teardown_fakes),
        cmocka_unit_test_teardown(read_into_device, teardown_fakes),
        cmocka_unit_test_teardown(device_to_device_both_ways, teardown_fakes),
        cmocka_unit_test_teardown(staging_with_checksums, teardown_fakes),
        cmocka_unit_test_teardown(mixed_batch, teardown_fakes),
        cmocka_unit_test_teardown(vector_frames_with_device_pieces, teardown_fakes),
        cmocka_unit_test_teardown(region_access_checks_and_reaches_device_memory, teardown_fakes),
        cmocka_unit_test(registry_release_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
