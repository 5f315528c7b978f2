/* SPDX-License-Identifier: Apache-2.0 */
/* The compatibility rules of docs/ABI.md: ferry_version(), and the structs
 * that begin with struct_size, seen from callers newer and older than the
 * library (a caller's struct is simulated by a larger buffer or a size
 * field set by hand). */
#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <ferry/ferry.h>
#include <ferry/kv.h>

/* A caller compiled against a later header: the struct has grown. */
struct newer_config {
    ferry_config_t known;
    uint64_t added[4];
};
struct newer_stats {
    ferry_stats_t known;
    uint64_t added[4];
};
struct newer_pool_stats {
    ferry_pool_stats_t known;
    uint64_t added[4];
};

static void assert_detail_has(const char *what)
{
    const char *d = ferry_last_error_detail();
    if (!strstr(d, what)) fail_msg("detail '%s' lacks '%s'", d, what);
}

static ferry_engine_t *engine(void)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    ferry_engine_t *e = NULL;
    assert_int_equal(ferry_engine_create(&cfg, &e), 0);
    return e;
}

static void version_matches_the_header(void **state)
{
    (void)state;
    assert_string_equal(ferry_version(), FERRY_VERSION_STRING);
    assert_int_equal(ferry_version_number(), FERRY_VERSION_NUMBER);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FERRY_VERSION_MAJOR, FERRY_VERSION_MINOR, FERRY_VERSION_PATCH);
    assert_string_equal(ferry_version(), want);
}

static void config_init_sets_the_size(void **state)
{
    (void)state;
    ferry_config_t cfg;
    memset(&cfg, 0xEE, sizeof cfg);
    ferry_config_init(&cfg);
    assert_int_equal(cfg.struct_size, sizeof cfg);
    assert_string_equal(cfg.host, "127.0.0.1");
    assert_int_equal(cfg.timeout_ms, 30000);
}

/* A newer caller's unknown fields are zeroed by init (0 = their default)
 * and accepted by create while they stay zero. */
static void newer_config_with_zero_tail_works(void **state)
{
    (void)state;
    struct newer_config n;
    memset(&n, 0xEE, sizeof n);
    n.known.struct_size = sizeof n;
    (ferry_config_init)(&n.known);
    assert_int_equal(n.known.struct_size, sizeof n);
    for (int i = 0; i < 4; i++) assert_int_equal(n.added[i], 0);
    assert_int_equal(n.known.workers, 2);
    assert_int_equal((ferry_config_from_env)(&n.known), 0);
    assert_int_equal(n.known.struct_size, sizeof n);
    ferry_engine_t *e = NULL;
    assert_int_equal(ferry_engine_create(&n.known, &e), 0);
    ferry_engine_destroy(e);
}

/* ... but a field this library does not have, set, is refused: the caller
 * asks for something this build cannot do. */
static void newer_config_with_unknown_field_is_refused(void **state)
{
    (void)state;
    struct newer_config n;
    n.known.struct_size = sizeof n;
    (ferry_config_init)(&n.known);
    n.added[1] = 7;
    ferry_engine_t *e = NULL;
    assert_int_equal(ferry_engine_create(&n.known, &e), FERRY_ERR_NOT_IMPLEMENTED);
    assert_null(e);
    assert_detail_has("knows only the first");
    assert_int_equal((ferry_config_from_env)(&n.known), FERRY_ERR_NOT_IMPLEMENTED);
}

/* A caller that never set struct_size (a foreign-language binding that
 * forgot) gets a clear error, not a guess. */
static void unset_struct_size_is_refused(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.struct_size = 0;
    ferry_engine_t *e = NULL;
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_has("struct_size=0");

    e = engine();
    ferry_stats_t st;
    st.struct_size = 16;
    assert_int_equal((ferry_engine_stats)(e, &st), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_has("engine stats: struct_size=16");
    ferry_peer_info_t info;
    info.struct_size = 0;
    assert_int_equal((ferry_session_info)(e, ferry_engine_name(e), &info), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_has("session info: struct_size=0");
    ferry_pool_t *p = NULL;
    assert_int_equal(ferry_pool_create(e, 1 << 20, FERRY_MEM_REMOTE, &p), 0);
    ferry_pool_stats_t ps;
    ps.struct_size = sizeof(size_t);
    assert_int_equal((ferry_pool_stats)(p, &ps), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_has("pool stats: struct_size=8");
    ferry_pool_destroy(p);
    assert_int_equal(ferry_config_from_env(NULL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_has("config from env: cfg is NULL");
    ferry_engine_destroy(e);
}

/* A garbage struct_size (an uninitialized field: 1 GiB here) is refused
 * with INVALID_ARGUMENT before a byte past the caller's struct is read or
 * written; sizes up to a page stay accepted. Before the cap, stats,
 * session info and config init wrote (or read) a GiB past the struct. */
static void huge_struct_size_is_refused(void **state)
{
    (void)state;
    const size_t garbage = (size_t)1 << 30;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    ferry_config_t bad = cfg;
    bad.struct_size = garbage;
    (ferry_config_init)(&bad); /* leaves it untouched */
    assert_int_equal(bad.struct_size, garbage);
    ferry_engine_t *e = NULL;
    assert_int_equal(ferry_engine_create(&bad, &e), FERRY_ERR_INVALID_ARGUMENT);
    assert_null(e);
    assert_detail_has("struct_size=1073741824 is larger than any struct");
    assert_int_equal((ferry_config_from_env)(&bad), FERRY_ERR_INVALID_ARGUMENT);

    e = engine();
    ferry_stats_t st;
    st.struct_size = garbage;
    assert_int_equal((ferry_engine_stats)(e, &st), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_has("engine stats: struct_size=1073741824");
    ferry_peer_info_t info;
    info.struct_size = garbage;
    assert_int_equal((ferry_session_info)(e, ferry_engine_name(e), &info), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_has("session info: struct_size=1073741824");
    ferry_pool_t *p = NULL;
    assert_int_equal(ferry_pool_create(e, 1 << 20, FERRY_MEM_REMOTE, &p), 0);
    ferry_pool_stats_t ps;
    ps.struct_size = garbage;
    assert_int_equal((ferry_pool_stats)(p, &ps), FERRY_ERR_INVALID_ARGUMENT);
    ferry_pool_destroy(p);

    /* A page is still accepted (a much newer caller, zero tail). */
    union { ferry_stats_t known; unsigned char page[4096]; } big;
    memset(&big, 0, sizeof big);
    big.known.struct_size = sizeof big;
    assert_int_equal((ferry_engine_stats)(e, &big.known), 0);
    assert_int_equal(big.known.struct_size, sizeof big);
    ferry_engine_destroy(e);
}

/* Output structs: the library fills what it knows, zeroes a newer caller's
 * fields it does not know and writes nothing past the caller's size. */
static void outputs_respect_the_callers_size(void **state)
{
    (void)state;
    ferry_engine_t *e = engine();
    static char buf[4096];
    assert_int_equal(ferry_register(e, buf, sizeof buf, FERRY_MEM_REMOTE), 0);

    struct {
        struct newer_stats n;
        uint64_t canary;
    } s;
    memset(&s, 0xEE, sizeof s);
    s.n.known.struct_size = sizeof s.n;
    assert_int_equal((ferry_engine_stats)(e, &s.n.known), 0);
    assert_int_equal(s.n.known.struct_size, sizeof s.n);
    assert_true(s.n.known.ncodes > 0);
    for (int i = 0; i < 4; i++) assert_int_equal(s.n.added[i], 0);
    assert_int_equal(s.canary, 0xEEEEEEEEEEEEEEEEull);

    ferry_pool_t *p = NULL;
    assert_int_equal(ferry_pool_create(e, 1 << 20, FERRY_MEM_REMOTE, &p), 0);
    struct {
        struct newer_pool_stats n;
        uint64_t canary;
    } ps;
    memset(&ps, 0xEE, sizeof ps);
    ps.n.known.struct_size = sizeof ps.n;
    assert_int_equal((ferry_pool_stats)(p, &ps.n.known), 0);
    assert_int_equal(ps.n.known.size, 1 << 20);
    for (int i = 0; i < 4; i++) assert_int_equal(ps.n.added[i], 0);
    assert_int_equal(ps.canary, 0xEEEEEEEEEEEEEEEEull);
    ferry_pool_destroy(p);

    /* The header's macros set struct_size themselves. */
    ferry_stats_t st;
    st.struct_size = 0;
    assert_int_equal(ferry_engine_stats(e, &st), 0);
    assert_int_equal(st.struct_size, sizeof st);
    ferry_engine_destroy(e);
}

/* ferry_kv_plan_get_info returns nothing: a struct_size it cannot serve
 * leaves the struct untouched; a newer caller's tail is zeroed. */
static void kv_plan_info_respects_the_callers_size(void **state)
{
    (void)state;
    static uint64_t k[2] = {0x10000, 0x20000}, v[2] = {0x30000, 0x40000};
    ferry_kv_cache_desc_t d = {
        .kind = FERRY_KV_SPLIT, .num_layers = 2, .num_pages = 8, .page_size = 16, .kv_heads = 2,
        .total_kv_heads = 2, .head_dim = 64, .dtype_size = 2, .tp_rank = 0, .tp_size = 1,
        .k_addrs = k, .v_addrs = v,
    };
    int32_t pages[] = {0, 1, 2};
    ferry_kv_plan_t *p = NULL;
    assert_int_equal(ferry_kv_plan_create(&d, &d, pages, pages, 3, &p), 0);

    struct {
        ferry_kv_plan_info_t known;
        uint64_t added[2];
    } n;
    memset(&n, 0xEE, sizeof n);
    n.known.struct_size = sizeof n;
    (ferry_kv_plan_get_info)(p, &n.known);
    assert_int_equal(n.known.pages, 3);
    assert_int_equal(n.known.struct_size, sizeof n);
    assert_int_equal(n.added[0], 0);
    assert_int_equal(n.added[1], 0);

    ferry_kv_plan_info_t small;
    memset(&small, 0xEE, sizeof small);
    small.struct_size = 4;
    (ferry_kv_plan_get_info)(p, &small);
    assert_int_equal(small.struct_size, 4);
    assert_int_equal(small.pages, (size_t)0xEEEEEEEEEEEEEEEEull);

    ferry_kv_plan_info_t info;
    ferry_kv_plan_get_info(p, &info);
    assert_int_equal(info.struct_size, sizeof info);
    assert_int_equal(info.pages, 3);
    ferry_kv_plan_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version_matches_the_header),
        cmocka_unit_test(config_init_sets_the_size),
        cmocka_unit_test(newer_config_with_zero_tail_works),
        cmocka_unit_test(newer_config_with_unknown_field_is_refused),
        cmocka_unit_test(unset_struct_size_is_refused),
        cmocka_unit_test(huge_struct_size_is_refused),
        cmocka_unit_test(outputs_respect_the_callers_size),
        cmocka_unit_test(kv_plan_info_respects_the_callers_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
