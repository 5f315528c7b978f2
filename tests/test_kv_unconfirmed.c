/* SPDX-License-Identifier: Apache-2.0 */
/* ferry_kv_send must not report a plain TIMEOUT when the target could not
 * confirm that no more of the request can land: the decode side frees the
 * pages of a TIMEOUT failure, and late bytes then land in pages that belong
 * to someone else (found by scripts/cluster.sh at 64 engines: stale bytes
 * in free pages after TIMEOUT notices, "could not be fenced" in the log).
 * The code must be CANCEL_UNCONFIRMED, in the return and in the notice. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ferry/kv.h>

#include "delay_proxy.h"
#include "harness.h"

#define PAGES 64
#define PAGE_BYTES (64u << 10)

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* New connections to the target hang from 150 ms on: the fence after the
 * deadline cannot reach it, while the transfer's own connection is slow. */
static void *freeze_new_soon(void *arg)
{
    sleep_ms(150);
    delay_proxy_freeze_new(arg, true);
    return NULL;
}

static ferry_kv_cache_desc_t desc(const uint64_t *addr)
{
    ferry_kv_cache_desc_t d = {0};
    d.kind = FERRY_KV_MLA;
    d.num_layers = 1;
    d.num_pages = PAGES;
    d.page_size = 16;
    d.mla_row_bytes = PAGE_BYTES / 16;
    d.tp_size = 1;
    d.k_addrs = addr;
    return d;
}

static void kv_send_reports_unconfirmed_cancel(void **state)
{
    (void)state;
    ferry_engine_t *target = harness_engine(20000);
    delay_proxy_t *px = delay_proxy_start(ferry_engine_port(target), 10, 1u << 20);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = 1500;
    cfg.connect_timeout_ms = 1500;
    cfg.conns_per_peer = 1;
    cfg.cancel_timeout_ms = 300;
    ferry_engine_t *init = harness_engine_cfg(&cfg);
    size_t len = (size_t)PAGES * PAGE_BYTES;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_non_null(src);
    assert_non_null(dst);
    harness_fill(src, len, 7);
    assert_int_equal(ferry_register(init, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(target, dst, len, FERRY_MEM_REMOTE_WRITE), 0);
    uint64_t src_addr = (uint64_t)(uintptr_t)src, dst_addr = (uint64_t)(uintptr_t)dst;
    ferry_kv_cache_desc_t sd = desc(&src_addr), dd = desc(&dst_addr);
    int32_t pages[PAGES];
    for (int i = 0; i < PAGES; i++) pages[i] = PAGES - 1 - i; /* reversed: one block a page */
    ferry_kv_plan_t *plan = NULL;
    assert_int_equal(ferry_kv_plan_create(&sd, &dd, pages, pages, PAGES, &plan), 0);
    assert_int_equal(ferry_kv_plan_bind_sender(plan, 0, 0, 0, 0), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, freeze_new_soon, px), 0);
    ferry_kv_send_args_t args = {.request_id = 42, .timeout_ms = 500};
    /* 4 MiB through a 1 MiB/s proxy: the 500 ms deadline passes mid-way. */
    int rc = ferry_kv_send(init, delay_proxy_name(px), plan, &args);
    pthread_join(t, NULL);
    printf("kv send past its deadline, fence unreachable: %s\n", ferry_last_error_detail());
    assert_int_equal(rc, FERRY_ERR_CANCEL_UNCONFIRMED);
    assert_detail_contains("do not reuse");
    ferry_kv_plan_destroy(plan);
    ferry_engine_destroy(init);
    delay_proxy_stop(px);
    ferry_engine_destroy(target);
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kv_send_reports_unconfirmed_cancel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
