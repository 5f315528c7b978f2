/* SPDX-License-Identifier: Apache-2.0 */
/* KV transfer over real engines in one process: a small but realistic paged
 * cache (4 layers, 8 KV heads of 64 fp16 elements, 16-token pages) moved
 * prefill -> decode and checked byte for byte, with matching and mismatched
 * tensor parallelism; completion and failure notices; the staging
 * registration check; the embeddings buffer. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "link/vec.h"
#include "transport/shm/shm_testing.h"

#include <ferry/kv.h>

#define LAYERS 4
#define HEADS 8
#define HEAD_DIM 64
#define DTYPE 2
#define PAGE_SIZE 16
#define POOL 64
#define UNTOUCHED 0xEE
#define WAIT_MS 20000

/* A request of 24 pages: runs of both, of one side only, and singletons. */
static const int32_t prefill_pages[] = {10, 11, 12, 13, 40, 41, 2,  3,  4,  5,  6,  7,
                                        60, 61, 62, 20, 22, 24, 26, 30, 31, 32, 33, 0};
static const int32_t decode_pages[] = {0,  1,  2,  3,  4,  5,  50, 51, 52, 53, 54, 55,
                                       8,  9,  10, 11, 12, 13, 14, 40, 41, 42, 43, 63};
#define NPAGES (sizeof prefill_pages / sizeof prefill_pages[0])

/* One TP rank: its engine and its paged K and V pools, registered. */
struct kv_rank {
    ferry_engine_t *engine;
    ferry_kv_cache_desc_t desc;
    uint64_t k_addrs[LAYERS];
    uint64_t v_addrs[LAYERS];
    unsigned char *mem[LAYERS][2];
    uint64_t buffer_bytes;
};

static unsigned char reference_byte(uint32_t l, uint32_t b, uint64_t tok, uint32_t h, uint64_t j)
{
    uint64_t x = (((l * 2 + b) * 1000003ull + tok) * 131 + h) * 4099 + j + 1;
    x ^= x >> 31;
    x *= 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return (unsigned char)x;
}

/* Makes the pools of rank tp_rank of tp; registers them with flags unless
 * flags is ~0u (a decode rank that forgot to register). */
static const char *rank_secret; /* the engines' shared secret, when a test sets one */

static ferry_engine_t *rank_engine(void)
{
    if (!rank_secret) return harness_engine(WAIT_MS);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    const char *transport = getenv("FERRY_TRANSPORT");
    if (transport && *transport) cfg.transport = transport;
    cfg.timeout_ms = WAIT_MS;
    cfg.connect_timeout_ms = 5000;
    cfg.secret = rank_secret;
    return harness_engine_cfg(&cfg);
}

static void rank_make(struct kv_rank *r, uint32_t tp_rank, uint32_t tp, unsigned flags)
{
    memset(r, 0, sizeof *r);
    r->engine = rank_engine();
    ferry_kv_cache_desc_t *d = &r->desc;
    *d = (ferry_kv_cache_desc_t){.kind = FERRY_KV_SPLIT, .num_layers = LAYERS, .num_pages = POOL,
                                 .page_size = PAGE_SIZE, .kv_heads = HEADS / tp,
                                 .total_kv_heads = HEADS, .head_dim = HEAD_DIM,
                                 .dtype_size = DTYPE, .tp_rank = tp_rank, .tp_size = tp,
                                 .k_addrs = r->k_addrs, .v_addrs = r->v_addrs};
    r->buffer_bytes = ferry_kv_page_bytes(d) * POOL;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < 2; b++) {
            r->mem[l][b] = malloc(r->buffer_bytes);
            assert_non_null(r->mem[l][b]);
            memset(r->mem[l][b], UNTOUCHED, r->buffer_bytes);
            (b ? r->v_addrs : r->k_addrs)[l] = (uint64_t)(uintptr_t)r->mem[l][b];
            if (flags != ~0u)
                assert_int_equal(ferry_register(r->engine, r->mem[l][b], r->buffer_bytes, flags), 0);
        }
}

static void rank_free(struct kv_rank *r)
{
    ferry_engine_destroy(r->engine);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < 2; b++) free(r->mem[l][b]);
}

/* Writes the reference of the rank's heads for the request into images
 * laid out like the rank's pools. */
static void write_reference(const ferry_kv_cache_desc_t *d, unsigned char *image[LAYERS][2],
                            const int32_t *pages)
{
    uint32_t first, count;
    assert_int_equal(ferry_kv_rank_heads(HEADS, d->tp_size, d->tp_rank, &first, &count), 0);
    uint64_t hb = HEAD_DIM * DTYPE, row = ferry_kv_token_bytes(d);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < 2; b++)
            for (size_t i = 0; i < NPAGES; i++)
                for (uint32_t t = 0; t < PAGE_SIZE; t++) {
                    unsigned char *r = image[l][b] + ((uint64_t)pages[i] * PAGE_SIZE + t) * row;
                    for (uint32_t h = 0; h < count; h++)
                        for (uint64_t j = 0; j < hb; j++)
                            r[h * hb + j] = reference_byte(l, b, i * PAGE_SIZE + t, first + h, j);
                }
}

/* 1 when the decode pools hold exactly the reference in the request's
 * pages and UNTOUCHED everywhere else. */
static int decode_matches_reference(const struct kv_rank *r)
{
    unsigned char *image[LAYERS][2];
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < 2; b++) {
            image[l][b] = malloc(r->buffer_bytes);
            assert_non_null(image[l][b]);
            memset(image[l][b], UNTOUCHED, r->buffer_bytes);
        }
    write_reference(&r->desc, image, decode_pages);
    int same = 1;
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < 2; b++) {
            if (same && memcmp(image[l][b], r->mem[l][b], r->buffer_bytes) != 0) {
                fprintf(stderr, "decode rank %u layer %u buffer %u differs\n", r->desc.tp_rank, l, b);
                same = 0;
            }
            free(image[l][b]);
        }
    return same;
}

static ferry_kv_plan_t *plan_for(const struct kv_rank *src, const struct kv_rank *dst)
{
    ferry_kv_plan_t *p = NULL;
    assert_int_equal(ferry_kv_plan_create(&src->desc, &dst->desc, prefill_pages, decode_pages,
                                          NPAGES, &p),
                     0);
    return p;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Polls the decode engine, feeding notices to the tracker, until it
 * completes (1), fails (its code) or WAIT_MS pass (TIMEOUT). */
static int wait_for_request(ferry_engine_t *e, ferry_kv_recv_t *r)
{
    uint64_t deadline = harness_now_ms() + WAIT_MS;
    while (harness_now_ms() < deadline) {
        ferry_kv_event_t ev[8];
        long n = ferry_kv_poll(e, ev, 8);
        assert_true(n >= 0);
        int outcome = 0;
        for (long i = 0; i < n && outcome == 0; i++)
            if (ev[i].is_notice) outcome = ferry_kv_recv_offer(r, &ev[i].notice);
        ferry_kv_events_free(ev, (size_t)n);
        if (outcome != 0) return outcome;
        sleep_ms(1);
    }
    return FERRY_ERR_TIMEOUT;
}

/* ferry_kv_poll with a max whose notification buffer (max times the size
 * of a ferry_notification_t) wraps 64 bits to a few bytes: refused, not a
 * buffer a pending notification overruns (heap-buffer-overflow under ASan
 * before the checked product). */
static void poll_with_a_wrapping_max_is_refused(void **state)
{
    (void)state;
    ferry_engine_t *a = harness_engine(3000), *b = harness_engine(3000);
    assert_int_equal(ferry_notify(a, ferry_engine_name(b), "x", 1), 0);
    sleep_ms(50); /* ferry_notify returned once b queued it: margin only */
    /* max * S = 2^tz(S) (mod 2^64): the odd part of S inverted mod 2^64. */
    uint64_t size = sizeof(ferry_notification_t), odd = size, low = 1;
    while (!(odd & 1)) odd >>= 1, low <<= 1;
    uint64_t inv = odd; /* Newton: each step doubles the correct low bits */
    for (int i = 0; i < 6; i++) inv *= 2 - odd * inv;
    size_t max = (size_t)inv;
    assert_true((uint64_t)max * size == low && low < size);
    ferry_kv_event_t ev[1];
    long n = ferry_kv_poll(b, ev, max);
    assert_true(n < 0);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
}

static void direct_1_1_moves_every_byte_and_the_first_token(void **state)
{
    (void)state;
    struct kv_rank pre, dec;
    rank_make(&pre, 0, 1, FERRY_MEM_LOCAL);
    rank_make(&dec, 0, 1, FERRY_MEM_REMOTE_WRITE);
    write_reference(&pre.desc, pre.mem, prefill_pages);

    ferry_kv_plan_t *send_plan = plan_for(&pre, &dec);
    assert_int_equal(ferry_kv_plan_bind_sender(send_plan, 0, 0, 0, 0), 0);
    ferry_kv_plan_info_t in;
    ferry_kv_plan_get_info(send_plan, &in);
    assert_int_equal(in.mode, FERRY_KV_MODE_DIRECT);
    /* Both-consecutive runs: 10-13|0-3, 40-41|4-5, 2-7|50-55, 60-62|8-10,
     * 20|11, 22|12, 24|13, 26|14, 30-33|40-43, 0|63: 10 per buffer. */
    assert_int_equal(in.blocks, 10 * LAYERS * 2);

    ferry_kv_plan_t *recv_plan = plan_for(&pre, &dec);
    assert_int_equal(ferry_kv_plan_bind_receiver(recv_plan, 0, 0), 0);
    ferry_kv_recv_t *tracker = NULL;
    assert_int_equal(ferry_kv_recv_create(77, &recv_plan, 1, &tracker), 0);

    int32_t first_token = 31337;
    ferry_kv_send_args_t args = {.request_id = 77, .aux = &first_token, .aux_len = sizeof first_token};
    assert_int_equal(ferry_kv_send(pre.engine, ferry_engine_name(dec.engine), send_plan, &args), 0);
    assert_int_equal(wait_for_request(dec.engine, tracker), 1);
    assert_true(decode_matches_reference(&dec));
    size_t aux_len = 0;
    const void *aux = ferry_kv_recv_aux(tracker, &aux_len);
    assert_int_equal(aux_len, sizeof first_token);
    assert_memory_equal(aux, &first_token, sizeof first_token);

    ferry_kv_recv_destroy(tracker);
    ferry_kv_plan_destroy(send_plan);
    ferry_kv_plan_destroy(recv_plan);
    rank_free(&pre);
    rank_free(&dec);
}

struct send_job {
    ferry_engine_t *engine;
    char peer[300];
    const ferry_kv_plan_t *plan;
    uint64_t request_id;
    int rc;
};

static void *send_thread(void *arg)
{
    struct send_job *j = arg;
    ferry_kv_send_args_t args = {.request_id = j->request_id};
    j->rc = ferry_kv_send(j->engine, j->peer, j->plan, &args);
    return NULL;
}

/* 4:2 on decode rank 1: two prefill engines send concurrently into the
 * decode rank's registered staging buffer; each region is scattered as its
 * notice arrives. */
static void staged_4_to_2_scatters_on_the_receiver(void **state)
{
    (void)state;
    struct kv_rank pre[2], dec;
    for (uint32_t i = 0; i < 2; i++) {
        rank_make(&pre[i], 2 + i, 4, FERRY_MEM_LOCAL);
        write_reference(&pre[i].desc, pre[i].mem, prefill_pages);
    }
    rank_make(&dec, 1, 2, FERRY_MEM_REMOTE_WRITE);

    ferry_kv_plan_t *send_plans[2], *recv_plans[2];
    ferry_kv_plan_info_t in;
    for (int i = 0; i < 2; i++) {
        send_plans[i] = plan_for(&pre[i], &dec);
        recv_plans[i] = plan_for(&pre[i], &dec);
    }
    ferry_kv_plan_get_info(send_plans[0], &in);
    assert_true(in.scatter);
    unsigned char *staging = malloc(in.dst_staging_bytes);
    assert_non_null(staging);
    assert_int_equal(ferry_register(dec.engine, staging, in.dst_staging_bytes, FERRY_MEM_REMOTE_WRITE), 0);
    uint64_t staging_addr = (uint64_t)(uintptr_t)staging;
    struct send_job jobs[2];
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ferry_kv_plan_bind_sender(send_plans[i], 0, 0, staging_addr, in.dst_staging_bytes), 0);
        assert_int_equal(ferry_kv_plan_bind_receiver(recv_plans[i], staging_addr, in.dst_staging_bytes), 0);
        jobs[i] = (struct send_job){.engine = pre[i].engine, .plan = send_plans[i], .request_id = 5};
        snprintf(jobs[i].peer, sizeof jobs[i].peer, "%s", ferry_engine_name(dec.engine));
    }
    ferry_kv_recv_t *tracker = NULL;
    assert_int_equal(ferry_kv_recv_create(5, recv_plans, 2, &tracker), 0);
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&threads[i], NULL, send_thread, &jobs[i]), 0);
    int outcome = wait_for_request(dec.engine, tracker);
    for (int i = 0; i < 2; i++) {
        pthread_join(threads[i], NULL);
        assert_int_equal(jobs[i].rc, 0);
    }
    assert_int_equal(outcome, 1);
    assert_true(decode_matches_reference(&dec));

    ferry_kv_recv_destroy(tracker);
    for (int i = 0; i < 2; i++) {
        ferry_kv_plan_destroy(send_plans[i]);
        ferry_kv_plan_destroy(recv_plans[i]);
        rank_free(&pre[i]);
    }
    rank_free(&dec);
    free(staging);
}

/* 2:4 from prefill rank 1: it gathers its rows' halves into its own
 * (registered) staging and writes them straight into two decode engines. */
static void gathered_2_to_4_writes_decode_pages(void **state)
{
    (void)state;
    struct kv_rank pre, dec[2];
    rank_make(&pre, 1, 2, FERRY_MEM_LOCAL);
    write_reference(&pre.desc, pre.mem, prefill_pages);
    for (uint32_t i = 0; i < 2; i++) rank_make(&dec[i], 2 + i, 4, FERRY_MEM_REMOTE_WRITE);
    for (int i = 0; i < 2; i++) {
        ferry_kv_plan_t *send_plan = plan_for(&pre, &dec[i]), *recv_plan = plan_for(&pre, &dec[i]);
        ferry_kv_plan_info_t in;
        ferry_kv_plan_get_info(send_plan, &in);
        assert_true(in.gather);
        assert_false(in.scatter);
        unsigned char *staging = malloc(in.src_staging_bytes);
        assert_non_null(staging);
        assert_int_equal(ferry_register(pre.engine, staging, in.src_staging_bytes, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_kv_plan_bind_sender(send_plan, (uint64_t)(uintptr_t)staging,
                                                   in.src_staging_bytes, 0, 0),
                         0);
        assert_int_equal(ferry_kv_plan_bind_receiver(recv_plan, 0, 0), 0);
        ferry_kv_recv_t *tracker = NULL;
        assert_int_equal(ferry_kv_recv_create(9, &recv_plan, 1, &tracker), 0);
        ferry_kv_send_args_t args = {.request_id = 9};
        assert_int_equal(ferry_kv_send(pre.engine, ferry_engine_name(dec[i].engine), send_plan, &args), 0);
        assert_int_equal(wait_for_request(dec[i].engine, tracker), 1);
        assert_true(decode_matches_reference(&dec[i]));
        ferry_kv_recv_destroy(tracker);
        ferry_kv_plan_destroy(send_plan);
        ferry_kv_plan_destroy(recv_plan);
        assert_int_equal(ferry_deregister(pre.engine, staging), 0);
        free(staging);
    }
    rank_free(&pre);
    for (int i = 0; i < 2; i++) rank_free(&dec[i]);
}

/* The decode staging buffer is not registered, then registered without
 * remote write: the sender refuses before moving a byte, naming the
 * staging range, and the decode side hears the same reason. */
static void unregistered_staging_fails_on_both_sides(void **state)
{
    (void)state;
    struct kv_rank pre, dec;
    rank_make(&pre, 0, 2, FERRY_MEM_LOCAL);
    write_reference(&pre.desc, pre.mem, prefill_pages);
    rank_make(&dec, 0, 1, FERRY_MEM_REMOTE_WRITE);
    ferry_kv_plan_t *send_plan = plan_for(&pre, &dec), *recv_plan = plan_for(&pre, &dec);
    ferry_kv_plan_info_t in;
    ferry_kv_plan_get_info(send_plan, &in);
    assert_true(in.scatter);
    unsigned char *staging = malloc(in.dst_staging_bytes);
    assert_non_null(staging);
    memset(staging, UNTOUCHED, in.dst_staging_bytes);
    uint64_t staging_addr = (uint64_t)(uintptr_t)staging;
    assert_int_equal(ferry_kv_plan_bind_sender(send_plan, 0, 0, staging_addr, in.dst_staging_bytes), 0);
    assert_int_equal(ferry_kv_plan_bind_receiver(recv_plan, staging_addr, in.dst_staging_bytes), 0);
    char range[64];
    snprintf(range, sizeof range, "decode staging [0x%llx+%llu)",
             (unsigned long long)(staging_addr + in.dst_staging_offset), (unsigned long long)in.bytes);
    const char *peer = ferry_engine_name(dec.engine);

    for (int attempt = 0; attempt < 2; attempt++) {
        if (attempt == 1)
            assert_int_equal(ferry_register(dec.engine, staging, in.dst_staging_bytes, FERRY_MEM_REMOTE_READ), 0);
        ferry_kv_recv_t *tracker = NULL;
        assert_int_equal(ferry_kv_recv_create(11, &recv_plan, 1, &tracker), 0);
        ferry_kv_send_args_t args = {.request_id = 11};
        assert_int_equal(ferry_kv_send(pre.engine, peer, send_plan, &args), FERRY_ERR_ADDRESS_NOT_REGISTERED);
        assert_detail_contains("kv send request 11 to ");
        assert_detail_contains("staging check");
        assert_detail_contains(range);
        assert_detail_contains("registered for remote write");
        assert_int_equal(wait_for_request(dec.engine, tracker), FERRY_ERR_ADDRESS_NOT_REGISTERED);
        assert_detail_contains("prefill rank 0 failed");
        assert_detail_contains(range);
        /* Later notices do not change a failed request's outcome. */
        ferry_kv_notice_t late = {.request_id = 11, .prefill_rank = 0};
        assert_int_equal(ferry_kv_recv_offer(tracker, &late), FERRY_ERR_ADDRESS_NOT_REGISTERED);
        ferry_kv_recv_destroy(tracker);
    }
    /* Nothing was written into the staging buffer or the pages. */
    for (uint64_t i = 0; i < in.dst_staging_bytes; i++) assert_int_equal(staging[i], UNTOUCHED);
    for (uint32_t l = 0; l < LAYERS; l++) assert_int_equal(dec.mem[l][0][0], UNTOUCHED);

    ferry_kv_plan_destroy(send_plan);
    ferry_kv_plan_destroy(recv_plan);
    rank_free(&pre);
    rank_free(&dec);
    free(staging);
}

/* The decode rank forgot to register its pools: the engine refuses the
 * writes at the target, and the failure reaches the decode side. */
static void failed_transfer_is_notified(void **state)
{
    (void)state;
    struct kv_rank pre, dec;
    rank_make(&pre, 0, 1, FERRY_MEM_LOCAL);
    rank_make(&dec, 0, 1, ~0u);
    ferry_kv_plan_t *send_plan = plan_for(&pre, &dec), *recv_plan = plan_for(&pre, &dec);
    assert_int_equal(ferry_kv_plan_bind_sender(send_plan, 0, 0, 0, 0), 0);
    assert_int_equal(ferry_kv_plan_bind_receiver(recv_plan, 0, 0), 0);
    ferry_kv_recv_t *tracker = NULL;
    assert_int_equal(ferry_kv_recv_create(12, &recv_plan, 1, &tracker), 0);
    ferry_kv_send_args_t args = {.request_id = 12, .timeout_ms = 5000};
    int rc = ferry_kv_send(pre.engine, ferry_engine_name(dec.engine), send_plan, &args);
    assert_true(rc < 0);
    assert_detail_contains("kv send request 12 to ");
    assert_detail_contains(": transfer: request 0 of 80: remote range "); /* the first refused */
    assert_detail_contains("is not in any region"); /* the engine's own words, kept */
    assert_int_equal(wait_for_request(dec.engine, tracker), rc);
    assert_detail_contains("prefill rank 0 failed: kv send request 12");

    ferry_kv_recv_destroy(tracker);
    ferry_kv_plan_destroy(send_plan);
    ferry_kv_plan_destroy(recv_plan);
    rank_free(&pre);
    rank_free(&dec);
}

/* The decode side checks every byte the moment the notice shows up: were
 * the notice sent before the batch was acknowledged, a 32 MiB transfer in
 * 1024 blocks would still be on the wire. */
struct big_job {
    ferry_engine_t *engine;
    char peer[300];
    unsigned char *src;
    uint64_t dst;
    int rc;
};

#define BIG_BLOCK (32u << 10)
#define BIG_BLOCKS 1024u

static void *big_send_thread(void *arg)
{
    struct big_job *j = arg;
    /* Every other 32 KiB block of the source goes, in reverse order, to the
     * destination: nothing coalesces, a plan of 1024 blocks. */
    static int32_t src_pages[BIG_BLOCKS], dst_pages[BIG_BLOCKS];
    for (uint32_t i = 0; i < BIG_BLOCKS; i++) {
        src_pages[i] = (int32_t)(2 * i);
        dst_pages[i] = (int32_t)(BIG_BLOCKS - 1 - i);
    }
    uint64_t src_addr = (uint64_t)(uintptr_t)j->src;
    ferry_kv_cache_desc_t s = {.kind = FERRY_KV_MLA, .num_layers = 1, .num_pages = 2 * BIG_BLOCKS,
                               .page_size = 1, .mla_row_bytes = BIG_BLOCK, .tp_size = 1,
                               .k_addrs = &src_addr};
    ferry_kv_cache_desc_t d = s;
    d.num_pages = BIG_BLOCKS;
    d.k_addrs = &j->dst;
    ferry_kv_plan_t *p = NULL;
    j->rc = ferry_kv_plan_create(&s, &d, src_pages, dst_pages, BIG_BLOCKS, &p);
    if (j->rc == 0) j->rc = ferry_kv_plan_bind_sender(p, 0, 0, 0, 0);
    ferry_kv_send_args_t args = {.request_id = 99};
    if (j->rc == 0) j->rc = ferry_kv_send(j->engine, j->peer, p, &args);
    ferry_kv_plan_destroy(p);
    return NULL;
}

static void notice_arrives_only_after_the_last_byte(void **state)
{
    (void)state;
    ferry_engine_t *pre = harness_engine(WAIT_MS), *dec = harness_engine(WAIT_MS);
    size_t src_len = (size_t)2 * BIG_BLOCKS * BIG_BLOCK, dst_len = (size_t)BIG_BLOCKS * BIG_BLOCK;
    unsigned char *src = malloc(src_len), *dst = malloc(dst_len), *expect = malloc(dst_len);
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(expect);
    harness_fill(src, src_len, 2024);
    memset(dst, 0, dst_len);
    for (uint32_t i = 0; i < BIG_BLOCKS; i++)
        memcpy(expect + (size_t)(BIG_BLOCKS - 1 - i) * BIG_BLOCK, src + (size_t)2 * i * BIG_BLOCK, BIG_BLOCK);
    assert_int_equal(ferry_register(pre, src, src_len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(dec, dst, dst_len, FERRY_MEM_REMOTE_WRITE), 0);

    struct big_job job = {.engine = pre, .src = src, .dst = (uint64_t)(uintptr_t)dst};
    snprintf(job.peer, sizeof job.peer, "%s", ferry_engine_name(dec));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, big_send_thread, &job), 0);
    int seen = 0, complete_when_seen = 0;
    uint64_t deadline = harness_now_ms() + WAIT_MS;
    while (!seen && harness_now_ms() < deadline) {
        ferry_kv_event_t ev[4];
        long n = ferry_kv_poll(dec, ev, 4);
        for (long i = 0; i < n; i++) {
            if (!ev[i].is_notice || ev[i].notice.request_id != 99) continue;
            assert_int_equal(ev[i].notice.status, 0);
            assert_int_equal(ev[i].notice.bytes, dst_len);
            complete_when_seen = memcmp(dst, expect, dst_len) == 0;
            seen = 1;
        }
        ferry_kv_events_free(ev, (size_t)n);
    }
    pthread_join(t, NULL);
    assert_int_equal(job.rc, 0);
    assert_true(seen);
    assert_true(complete_when_seen);

    ferry_engine_destroy(pre);
    ferry_engine_destroy(dec);
    free(src);
    free(dst);
    free(expect);
}

static void sender_abort_reaches_the_decode_side(void **state)
{
    (void)state;
    ferry_engine_t *pre = harness_engine(WAIT_MS), *dec = harness_engine(WAIT_MS);
    assert_int_equal(ferry_kv_send_failure(pre, ferry_engine_name(dec), 21, 3, 0, FERRY_ERR_CANCELLED,
                                           "prefill aborted the request"),
                     0);
    assert_int_equal(ferry_kv_send_failure(pre, ferry_engine_name(dec), 21, 3, 0, 0, "x"),
                     FERRY_ERR_INVALID_ARGUMENT);
    /* A plain message on the same queue survives the KV poll. */
    assert_int_equal(ferry_notify(pre, ferry_engine_name(dec), "hello", 5), 0);
    ferry_kv_event_t ev[4];
    long n = 0;
    uint64_t deadline = harness_now_ms() + WAIT_MS;
    while (n < 2 && harness_now_ms() < deadline) {
        n += ferry_kv_poll(dec, ev + n, (size_t)(4 - n));
        sleep_ms(1);
    }
    assert_int_equal(n, 2);
    /* Two notifications need not arrive in the order they were sent. */
    const ferry_kv_event_t *notice = ev[0].is_notice ? &ev[0] : &ev[1];
    const ferry_kv_event_t *plain = ev[0].is_notice ? &ev[1] : &ev[0];
    assert_true(notice->is_notice);
    assert_int_equal(notice->notice.request_id, 21);
    assert_int_equal(notice->notice.prefill_rank, 3);
    assert_int_equal(notice->notice.status, FERRY_ERR_CANCELLED);
    assert_string_equal(notice->notice.reason, "prefill aborted the request");
    assert_false(plain->is_notice);
    assert_int_equal(plain->raw.len, 5);
    assert_memory_equal(plain->raw.msg, "hello", 5);
    assert_string_equal(plain->raw.peer, ferry_engine_name(pre));
    ferry_kv_events_free(ev, (size_t)n);
    ferry_engine_destroy(pre);
    ferry_engine_destroy(dec);
}

static void tracker_rejects_unexpected_source(void **state)
{
    (void)state;
    ferry_kv_cache_desc_t d = {.kind = FERRY_KV_SPLIT, .num_layers = 1, .num_pages = 4,
                               .page_size = 1, .kv_heads = 4, .total_kv_heads = 8, .head_dim = 1,
                               .dtype_size = 1, .tp_rank = 1, .tp_size = 2};
    uint64_t addrs[1] = {0x1000};
    /* Decode tp 1 takes heads 4..7 from prefill rank 1 of 2, into staging. */
    ferry_kv_cache_desc_t dec = d;
    dec.tp_rank = 0;
    dec.tp_size = 1;
    dec.kv_heads = 8;
    dec.k_addrs = dec.v_addrs = addrs;
    int32_t pages[] = {0};
    ferry_kv_plan_t *p = NULL;
    assert_int_equal(ferry_kv_plan_create(&d, &dec, pages, pages, 1, &p), 0);
    ferry_kv_recv_t *r = NULL;
    assert_int_equal(ferry_kv_recv_create(1, &p, 1, &r), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("not bound");
    ferry_kv_plan_info_t in;
    ferry_kv_plan_get_info(p, &in);
    assert_int_equal(ferry_kv_plan_bind_receiver(p, 0x9000, in.dst_staging_bytes), 0);
    assert_int_equal(ferry_kv_recv_create(1, &p, 1, &r), 0);
    ferry_kv_notice_t other_request = {.request_id = 2, .prefill_rank = 1};
    assert_int_equal(ferry_kv_recv_offer(r, &other_request), 0);
    ferry_kv_notice_t stranger = {.request_id = 1, .prefill_rank = 0};
    assert_int_equal(ferry_kv_recv_offer(r, &stranger), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("prefill rank 0, which this request does not expect");
    ferry_kv_recv_destroy(r);
    ferry_kv_plan_destroy(p);
}

/* ------------------------------------------- verified completion (issue 20, item 4) */

/* The identity the decode engine sees for the engine peer: what its own
 * session to it learned at the handshake, on 127.0.0.1. */
static ferry_kv_source_t source_of_engine(ferry_engine_t *decode, ferry_engine_t *peer)
{
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_open(decode, ferry_engine_name(peer)), 0);
    assert_int_equal(ferry_session_info(decode, ferry_engine_name(peer), &info), 0);
    ferry_kv_source_t src = {.engine_id = info.engine_id, .epoch = info.epoch};
    snprintf(src.host, sizeof src.host, "127.0.0.1");
    return src;
}

/* Polls e once (waiting up to WAIT_MS for at least one notification) and
 * offers each notice with its sender; the last offer's result, and the
 * number of plain messages in *plain. */
static int offer_next(ferry_engine_t *e, ferry_kv_recv_t *r, int *plain)
{
    uint64_t deadline = harness_now_ms() + WAIT_MS;
    *plain = 0;
    while (harness_now_ms() < deadline) {
        ferry_kv_event_t ev[8];
        ferry_notification_sender_t from[8];
        long n = ferry_kv_poll_from(e, ev, from, 8);
        assert_true(n >= 0);
        int rc = 0;
        for (long i = 0; i < n; i++) {
            if (ev[i].is_notice)
                rc = ferry_kv_recv_offer_from(r, &ev[i].notice, &from[i]);
            else
                (*plain)++;
        }
        ferry_kv_events_free(ev, (size_t)n);
        if (n > 0) return rc;
        sleep_ms(1);
    }
    return FERRY_ERR_TIMEOUT;
}

/* Polls until the verified tracker completes or fails; refused notices
 * (ACCESS_DENIED) are skipped, as a decode loop would. */
static int wait_verified(ferry_engine_t *e, ferry_kv_recv_t *r)
{
    uint64_t deadline = harness_now_ms() + WAIT_MS;
    while (harness_now_ms() < deadline) {
        int plain, rc = offer_next(e, r, &plain);
        if (rc != 0 && rc != FERRY_ERR_ACCESS_DENIED) return rc;
    }
    return FERRY_ERR_TIMEOUT;
}

/* A success notice for request id from prefill rank rank, sent by engine
 * from to decode without moving a byte; status_override, when nonzero, is
 * patched into the encoded notice (bypassing encode's check). */
static void forge_notice(ferry_engine_t *from, ferry_engine_t *decode, uint64_t id, uint32_t rank,
                         uint32_t status_override)
{
    ferry_kv_notice_t n = {.request_id = id, .prefill_rank = rank, .decode_rank = 1, .bytes = 1u << 20};
    unsigned char msg[FERRY_KV_NOTICE_HEADER + 8];
    long len = ferry_kv_notice_encode(&n, msg, sizeof msg);
    assert_true(len > 0);
    if (status_override)
        for (int i = 0; i < 4; i++) msg[12 + i] = (unsigned char)(status_override >> (8 * i));
    assert_int_equal(ferry_notify(from, ferry_engine_name(decode), msg, (size_t)len), 0);
}

/* The 4:2 staged layout with every engine holding the secret: forged
 * notices are refused, counted, leave the tracker incomplete and the decode
 * pages untouched although the staging holds stale bytes (what a wrongly
 * scattered region would copy in): wrong statuses, a success notice from an
 * authenticated engine that is not the rank's source, a failure notice from
 * it, and a success notice from the true source before any byte moved.
 * Then the honest sends complete, byte for byte. */
static void verified_tracker_refuses_forged_notices(void **state)
{
    (void)state;
    rank_secret = "kv-s3cret";
    struct kv_rank pre[2], dec, rogue;
    for (uint32_t i = 0; i < 2; i++) {
        rank_make(&pre[i], 2 + i, 4, FERRY_MEM_LOCAL);
        write_reference(&pre[i].desc, pre[i].mem, prefill_pages);
    }
    rank_make(&dec, 1, 2, FERRY_MEM_REMOTE_WRITE);
    rank_make(&rogue, 2, 4, FERRY_MEM_LOCAL);
    rank_secret = NULL;

    ferry_kv_plan_t *send_plans[2], *recv_plans[2];
    for (int i = 0; i < 2; i++) {
        send_plans[i] = plan_for(&pre[i], &dec);
        recv_plans[i] = plan_for(&pre[i], &dec);
    }
    ferry_kv_plan_info_t in;
    ferry_kv_plan_get_info(send_plans[0], &in);
    assert_true(in.scatter);
    unsigned char *staging = malloc(in.dst_staging_bytes);
    assert_non_null(staging);
    memset(staging, 0x5A, in.dst_staging_bytes); /* stale bytes of an earlier request */
    assert_int_equal(ferry_register(dec.engine, staging, in.dst_staging_bytes, FERRY_MEM_REMOTE_WRITE), 0);
    uint64_t staging_addr = (uint64_t)(uintptr_t)staging;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ferry_kv_plan_bind_sender(send_plans[i], 0, 0, staging_addr, in.dst_staging_bytes), 0);
        assert_int_equal(ferry_kv_plan_bind_receiver(recv_plans[i], staging_addr, in.dst_staging_bytes), 0);
    }
    ferry_kv_recv_t *tracker = NULL;
    assert_int_equal(ferry_kv_recv_create(9, recv_plans, 2, &tracker), 0);
    ferry_kv_source_t sources[2] = {source_of_engine(dec.engine, pre[0].engine),
                                    source_of_engine(dec.engine, pre[1].engine)};
    assert_int_equal(ferry_kv_recv_verify(tracker, dec.engine, sources), 0);
    assert_int_equal(ferry_kv_recv_verify(tracker, dec.engine, sources), FERRY_ERR_INVALID_ARGUMENT);
    int plain;

    /* A status that is no Ferry code never reaches the tracker as a notice... */
    forge_notice(pre[0].engine, dec.engine, 9, 2, 5);
    assert_int_equal(offer_next(dec.engine, tracker, &plain), 0);
    assert_int_equal(plain, 1);
    forge_notice(pre[0].engine, dec.engine, 9, 2, (uint32_t)-999);
    assert_int_equal(offer_next(dec.engine, tracker, &plain), 0);
    assert_int_equal(plain, 1);
    /* ... and one offered by hand is refused, counted. */
    ferry_kv_notice_t odd = {.request_id = 9, .prefill_rank = 2, .status = 5};
    assert_int_equal(ferry_kv_recv_offer(tracker, &odd), FERRY_ERR_ACCESS_DENIED);
    assert_detail_contains("status 5");
    assert_int_equal(ferry_kv_recv_refused(tracker), 1);

    /* An authenticated engine that is not rank 2's source: success, then failure. */
    forge_notice(rogue.engine, dec.engine, 9, 2, 0);
    assert_int_equal(offer_next(dec.engine, tracker, &plain), FERRY_ERR_ACCESS_DENIED);
    assert_detail_contains("that rank's source is");
    ferry_kv_notice_t fail = {.request_id = 9, .prefill_rank = 3, .status = FERRY_ERR_CANCELLED};
    unsigned char msg[FERRY_KV_NOTICE_HEADER];
    long len = ferry_kv_notice_encode(&fail, msg, sizeof msg);
    assert_int_equal(ferry_notify(rogue.engine, ferry_engine_name(dec.engine), msg, (size_t)len), 0);
    assert_int_equal(offer_next(dec.engine, tracker, &plain), FERRY_ERR_ACCESS_DENIED);
    /* The true sources, claiming completion with no byte written. */
    forge_notice(pre[0].engine, dec.engine, 9, 2, 0);
    assert_int_equal(offer_next(dec.engine, tracker, &plain), FERRY_ERR_ACCESS_DENIED);
    assert_detail_contains("only 0 of the pair's");
    forge_notice(pre[1].engine, dec.engine, 9, 3, 0);
    assert_int_equal(offer_next(dec.engine, tracker, &plain), FERRY_ERR_ACCESS_DENIED);
    /* Without the sender a verified tracker takes nothing. */
    ferry_kv_notice_t bare = {.request_id = 9, .prefill_rank = 2};
    assert_int_equal(ferry_kv_recv_offer(tracker, &bare), FERRY_ERR_ACCESS_DENIED);
    assert_int_equal(ferry_kv_recv_refused(tracker), 6);

    /* Nothing was scattered: the decode pools are as they were. */
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t b = 0; b < 2; b++)
            for (uint64_t k = 0; k < dec.buffer_bytes; k++)
                if (dec.mem[l][b][k] != UNTOUCHED) fail_msg("decode layer %u buffer %u byte %llu was written", l, b,
                                                              (unsigned long long)k);

    /* The honest sends complete. */
    struct send_job jobs[2];
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = (struct send_job){.engine = pre[i].engine, .plan = send_plans[i], .request_id = 9};
        snprintf(jobs[i].peer, sizeof jobs[i].peer, "%s", ferry_engine_name(dec.engine));
        assert_int_equal(pthread_create(&threads[i], NULL, send_thread, &jobs[i]), 0);
    }
    int outcome = wait_verified(dec.engine, tracker);
    for (int i = 0; i < 2; i++) {
        pthread_join(threads[i], NULL);
        assert_int_equal(jobs[i].rc, 0);
    }
    assert_int_equal(outcome, 1);
    assert_true(decode_matches_reference(&dec));
    assert_int_equal(ferry_kv_recv_refused(tracker), 6);

    ferry_kv_recv_destroy(tracker);
    for (int i = 0; i < 2; i++) {
        ferry_kv_plan_destroy(send_plans[i]);
        ferry_kv_plan_destroy(recv_plans[i]);
        rank_free(&pre[i]);
    }
    rank_free(&rogue);
    rank_free(&dec);
    free(staging);
}

/* A direct 1:1 pair under verify: the source's writes into the decode
 * pages back its notice; a failure notice from the verified source fails
 * the request. */
static void verified_direct_pair_completes_and_fails_honestly(void **state)
{
    (void)state;
    struct kv_rank pre, dec;
    rank_make(&pre, 0, 1, FERRY_MEM_LOCAL);
    rank_make(&dec, 0, 1, FERRY_MEM_REMOTE_WRITE);
    write_reference(&pre.desc, pre.mem, prefill_pages);
    ferry_kv_plan_t *send_plan = plan_for(&pre, &dec), *recv_plan = plan_for(&pre, &dec);
    assert_int_equal(ferry_kv_plan_bind_sender(send_plan, 0, 0, 0, 0), 0);
    assert_int_equal(ferry_kv_plan_bind_receiver(recv_plan, 0, 0), 0);
    ferry_kv_source_t src = source_of_engine(dec.engine, pre.engine);

    ferry_kv_recv_t *tracker = NULL;
    assert_int_equal(ferry_kv_recv_create(78, &recv_plan, 1, &tracker), 0);
    assert_int_equal(ferry_kv_recv_verify(tracker, dec.engine, &src), 0);
    ferry_kv_send_args_t args = {.request_id = 78};
    assert_int_equal(ferry_kv_send(pre.engine, ferry_engine_name(dec.engine), send_plan, &args), 0);
    assert_int_equal(wait_verified(dec.engine, tracker), 1);
    assert_true(decode_matches_reference(&dec));
    assert_int_equal(ferry_kv_recv_refused(tracker), 0);
    ferry_kv_recv_destroy(tracker);

    assert_int_equal(ferry_kv_recv_create(79, &recv_plan, 1, &tracker), 0);
    assert_int_equal(ferry_kv_recv_verify(tracker, dec.engine, &src), 0);
    assert_int_equal(ferry_kv_send_failure(pre.engine, ferry_engine_name(dec.engine), 79, 0, 0, FERRY_ERR_CANCELLED,
                                           "aborted"),
                     0);
    assert_int_equal(wait_verified(dec.engine, tracker), FERRY_ERR_CANCELLED);
    ferry_kv_recv_destroy(tracker);

    ferry_kv_plan_destroy(send_plan);
    ferry_kv_plan_destroy(recv_plan);
    rank_free(&pre);
    rank_free(&dec);
}

/* An unverified tracker still refuses a status that is no Ferry code (it
 * used to take a positive status as the request's outcome). */
static void unverified_tracker_refuses_unknown_statuses(void **state)
{
    (void)state;
    ferry_kv_cache_desc_t d = {.kind = FERRY_KV_SPLIT, .num_layers = 1, .num_pages = 4, .page_size = 1,
                               .kv_heads = 8, .total_kv_heads = 8, .head_dim = 1, .dtype_size = 1,
                               .tp_rank = 0, .tp_size = 1};
    uint64_t addrs[1] = {0x1000};
    d.k_addrs = d.v_addrs = addrs;
    int32_t pages[] = {0};
    ferry_kv_plan_t *p = NULL;
    assert_int_equal(ferry_kv_plan_create(&d, &d, pages, pages, 1, &p), 0);
    assert_int_equal(ferry_kv_plan_bind_receiver(p, 0, 0), 0);
    ferry_kv_recv_t *r = NULL;
    assert_int_equal(ferry_kv_recv_create(1, &p, 1, &r), 0);
    int statuses[] = {1, 5, 0x7fffffff, -5, -999, -2000000000};
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++) {
        ferry_kv_notice_t n = {.request_id = 1, .prefill_rank = 0, .status = statuses[i]};
        assert_int_equal(ferry_kv_recv_offer(r, &n), FERRY_ERR_ACCESS_DENIED);
        unsigned char buf[FERRY_KV_NOTICE_HEADER];
        assert_int_equal(ferry_kv_notice_encode(&n, buf, sizeof buf), FERRY_ERR_INVALID_ARGUMENT);
    }
    assert_int_equal(ferry_kv_recv_refused(r), sizeof statuses / sizeof statuses[0]);
    ferry_kv_notice_t ok = {.request_id = 1, .prefill_rank = 0, .status = FERRY_ERR_TIMEOUT};
    assert_int_equal(ferry_kv_recv_offer(r, &ok), FERRY_ERR_TIMEOUT);
    ferry_kv_recv_destroy(r);
    ferry_kv_plan_destroy(p);
}

/* The embeddings buffer is registered once and reused: three sends, one
 * registration, each landing whole before its notice. */
static void embeddings_reuse_one_registration(void **state)
{
    (void)state;
    ferry_engine_t *enc = harness_engine(WAIT_MS), *pre = harness_engine(WAIT_MS);
    size_t cap = 3u << 20;
    unsigned char *dst = malloc(cap);
    assert_non_null(dst);
    assert_int_equal(ferry_register(pre, dst, cap, FERRY_MEM_REMOTE_WRITE), 0);
    ferry_kv_embed_t *b = NULL;
    assert_int_equal(ferry_kv_embed_create(enc, cap, &b), 0);
    assert_int_equal(ferry_kv_embed_capacity(b), cap);
    assert_int_equal(ferry_region_count(enc), 1);
    const char *peer = ferry_engine_name(pre);
    for (uint64_t round = 1; round <= 3; round++) {
        size_t len = cap - round * 1000;
        harness_fill(ferry_kv_embed_data(b), len, round);
        ferry_kv_send_args_t args = {.request_id = 500 + round};
        assert_int_equal(ferry_kv_embed_send(b, peer, len, (uint64_t)(uintptr_t)dst, &args), 0);
        assert_int_equal(ferry_region_count(enc), 1);
        ferry_kv_event_t ev[2];
        long n = 0;
        uint64_t deadline = harness_now_ms() + WAIT_MS;
        while (n == 0 && harness_now_ms() < deadline) {
            n = ferry_kv_poll(pre, ev, 2);
            if (n == 0) sleep_ms(1);
        }
        assert_int_equal(n, 1);
        assert_true(ev[0].is_notice);
        assert_int_equal(ev[0].notice.request_id, 500 + round);
        assert_int_equal(ev[0].notice.bytes, len);
        assert_true(harness_check(dst, len, round));
        ferry_kv_events_free(ev, 1);
    }
    ferry_kv_send_args_t args = {.request_id = 1};
    assert_int_equal(ferry_kv_embed_send(b, peer, cap + 1, (uint64_t)(uintptr_t)dst, &args),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("outside (0, 3145728]");
    ferry_kv_embed_destroy(b);
    assert_int_equal(ferry_region_count(enc), 0);
    ferry_engine_destroy(enc);
    ferry_engine_destroy(pre);
    free(dst);
}

/* A request whose coalesced blocks have many distinct lengths (runs of
 * 1..70 pages): every byte lands where it belongs. */
static void many_run_lengths_all_land(void **state)
{
    (void)state;
    enum { RUNS = 70, MANY_POOL = 2600, ROW = 8 };
    int32_t *src_pages = malloc(MANY_POOL * sizeof *src_pages), *dst_pages = malloc(MANY_POOL * sizeof *dst_pages);
    assert_non_null(src_pages);
    assert_non_null(dst_pages);
    size_t n = 0;
    int32_t gap = 0;
    for (int32_t run = 1; run <= RUNS; run++, gap++) /* one free prefill page between runs */
        for (int32_t k = 0; k < run; k++, n++) {
            src_pages[n] = (int32_t)n + gap;
            dst_pages[n] = (int32_t)n;
        }
    ferry_engine_t *engines[2];
    unsigned char *mem[2][2];
    uint64_t addrs[2][2];
    ferry_kv_cache_desc_t d[2];
    for (int side = 0; side < 2; side++) {
        engines[side] = harness_engine(WAIT_MS);
        for (int b = 0; b < 2; b++) {
            mem[side][b] = malloc(MANY_POOL * ROW);
            assert_non_null(mem[side][b]);
            if (side == 0) harness_fill(mem[side][b], MANY_POOL * ROW, 40 + (uint64_t)b);
            else memset(mem[side][b], UNTOUCHED, MANY_POOL * ROW);
            addrs[side][b] = (uint64_t)(uintptr_t)mem[side][b];
            assert_int_equal(ferry_register(engines[side], mem[side][b], MANY_POOL * ROW,
                                            side ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_LOCAL),
                             0);
        }
        d[side] = (ferry_kv_cache_desc_t){.kind = FERRY_KV_SPLIT, .num_layers = 1, .num_pages = MANY_POOL,
                                          .page_size = 1, .kv_heads = 1, .total_kv_heads = 1, .head_dim = ROW,
                                          .dtype_size = 1, .tp_rank = 0, .tp_size = 1,
                                          .k_addrs = &addrs[side][0], .v_addrs = &addrs[side][1]};
    }
    ferry_kv_plan_t *send_plan = NULL, *recv_plan = NULL;
    assert_int_equal(ferry_kv_plan_create(&d[0], &d[1], src_pages, dst_pages, n, &send_plan), 0);
    assert_int_equal(ferry_kv_plan_create(&d[0], &d[1], src_pages, dst_pages, n, &recv_plan), 0);
    assert_int_equal(ferry_kv_plan_bind_sender(send_plan, 0, 0, 0, 0), 0);
    assert_int_equal(ferry_kv_plan_bind_receiver(recv_plan, 0, 0), 0);
    ferry_kv_plan_info_t in;
    ferry_kv_plan_get_info(send_plan, &in);
    assert_int_equal(in.blocks, 2 * RUNS);
    ferry_kv_recv_t *tracker = NULL;
    assert_int_equal(ferry_kv_recv_create(9, &recv_plan, 1, &tracker), 0);
    ferry_kv_send_args_t args = {.request_id = 9};
    assert_int_equal(ferry_kv_send(engines[0], ferry_engine_name(engines[1]), send_plan, &args), 0);
    assert_int_equal(wait_for_request(engines[1], tracker), 1);
    for (int b = 0; b < 2; b++) {
        for (size_t i = 0; i < n; i++)
            assert_memory_equal(mem[1][b] + (size_t)dst_pages[i] * ROW, mem[0][b] + (size_t)src_pages[i] * ROW,
                                ROW);
        for (size_t p = n; p < MANY_POOL; p++) assert_int_equal(mem[1][b][p * ROW], UNTOUCHED);
    }
    ferry_kv_recv_destroy(tracker);
    ferry_kv_plan_destroy(send_plan);
    ferry_kv_plan_destroy(recv_plan);
    for (int side = 0; side < 2; side++) {
        ferry_engine_destroy(engines[side]);
        for (int b = 0; b < 2; b++) free(mem[side][b]);
    }
    free(src_pages);
    free(dst_pages);
}

/* Two engines with MLA pools (1,152 B rows, one latent buffer a layer,
 * 1-token pages): the prefill side filled, the decode side UNTOUCHED and
 * registered for remote writes unless told otherwise. */
enum { MLA_LAYERS = 4, MLA_ROW = 1152, MLA_POOL = 200 };
struct mla_pair {
    ferry_engine_t *engines[2];
    unsigned char *mem[2][MLA_LAYERS];
    uint64_t addrs[2][MLA_LAYERS];
    ferry_kv_cache_desc_t desc[2];
};

static void mla_pair_make(struct mla_pair *m, bool register_decode)
{
    for (int side = 0; side < 2; side++) {
        m->engines[side] = harness_engine(WAIT_MS);
        for (int l = 0; l < MLA_LAYERS; l++) {
            m->mem[side][l] = malloc(MLA_POOL * MLA_ROW);
            assert_non_null(m->mem[side][l]);
            if (side == 0) harness_fill(m->mem[side][l], MLA_POOL * MLA_ROW, 70 + (uint64_t)l);
            else memset(m->mem[side][l], UNTOUCHED, MLA_POOL * MLA_ROW);
            m->addrs[side][l] = (uint64_t)(uintptr_t)m->mem[side][l];
            if (side == 1 && !register_decode) continue;
            assert_int_equal(ferry_register(m->engines[side], m->mem[side][l], MLA_POOL * MLA_ROW,
                                            side ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_LOCAL),
                             0);
        }
        m->desc[side] = (ferry_kv_cache_desc_t){.kind = FERRY_KV_MLA, .num_layers = MLA_LAYERS,
                                                .num_pages = MLA_POOL, .page_size = 1, .mla_row_bytes = MLA_ROW,
                                                .tp_rank = 0, .tp_size = 1, .k_addrs = m->addrs[side]};
    }
}

static void mla_pair_free(struct mla_pair *m)
{
    for (int side = 0; side < 2; side++) {
        ferry_engine_destroy(m->engines[side]);
        for (int l = 0; l < MLA_LAYERS; l++) free(m->mem[side][l]);
    }
}

/* Sends pages src[i] -> dst[i] (n of them) as request id over the pair and
 * checks that exactly those decode pages changed, to the prefill bytes;
 * returns the plan's block count. */
static size_t mla_send_and_check(struct mla_pair *m, uint64_t id, const int32_t *src, const int32_t *dst, size_t n)
{
    ferry_kv_plan_t *send_plan = NULL, *recv_plan = NULL;
    assert_int_equal(ferry_kv_plan_create(&m->desc[0], &m->desc[1], src, dst, n, &send_plan), 0);
    assert_int_equal(ferry_kv_plan_create(&m->desc[0], &m->desc[1], src, dst, n, &recv_plan), 0);
    assert_int_equal(ferry_kv_plan_bind_sender(send_plan, 0, 0, 0, 0), 0);
    assert_int_equal(ferry_kv_plan_bind_receiver(recv_plan, 0, 0), 0);
    ferry_kv_plan_info_t in;
    ferry_kv_plan_get_info(send_plan, &in);
    ferry_kv_recv_t *tracker = NULL;
    assert_int_equal(ferry_kv_recv_create(id, &recv_plan, 1, &tracker), 0);
    ferry_kv_send_args_t args = {.request_id = id};
    assert_int_equal(ferry_kv_send(m->engines[0], ferry_engine_name(m->engines[1]), send_plan, &args), 0);
    assert_int_equal(wait_for_request(m->engines[1], tracker), 1);
    bool used[MLA_POOL] = {false};
    for (size_t i = 0; i < n; i++) used[dst[i]] = true;
    for (int l = 0; l < MLA_LAYERS; l++) {
        for (size_t i = 0; i < n; i++)
            assert_memory_equal(m->mem[1][l] + (size_t)dst[i] * MLA_ROW, m->mem[0][l] + (size_t)src[i] * MLA_ROW,
                                MLA_ROW);
        for (int32_t p = 0; p < MLA_POOL; p++)
            if (!used[p]) assert_int_equal(m->mem[1][l][(size_t)p * MLA_ROW], UNTOUCHED);
    }
    ferry_kv_recv_destroy(tracker);
    ferry_kv_plan_destroy(send_plan);
    ferry_kv_plan_destroy(recv_plan);
    return in.blocks;
}

/* The prefill pages are one run, the decode pages runs of 1..5 pages with
 * a free page after each, so every coalesced block follows the previous
 * one in prefill memory but not in decode memory, and the blocks have five
 * lengths. Sent in the plan's order, the shm target folds each layer's
 * blocks into one remote iovec entry (the kernel pins pages per entry);
 * grouped by length, as the send did before, every block was an entry of
 * its own (200 of 200). */
static void neighbour_blocks_stay_together_over_shm(void **state)
{
    (void)state;
    enum { CYCLES = 10 };
    int32_t src_pages[MLA_POOL], dst_pages[MLA_POOL];
    size_t n = 0, blocks_per_layer = 0;
    int32_t next_dst = 0;
    for (int c = 0; c < CYCLES; c++)
        for (int run = 1; run <= 5; run++, blocks_per_layer++, next_dst++)
            for (int k = 0; k < run; k++, n++) {
                src_pages[n] = (int32_t)n;
                dst_pages[n] = next_dst++;
            }
    struct mla_pair m;
    mla_pair_make(&m, true);
    uint64_t calls0, local0, remote0, calls, local, remote;
    ferry_shm_vec_entries(&calls0, &local0, &remote0);
    assert_int_equal(mla_send_and_check(&m, 5, src_pages, dst_pages, n), MLA_LAYERS * blocks_per_layer);
    ferry_shm_vec_entries(&calls, &local, &remote);
    if (strcmp(harness_expected_transport(), "shm") == 0) {
        calls -= calls0;
        remote -= remote0;
        assert_true(calls > 0);
        /* One entry a layer, plus one where a call (or a connection's
         * share of the batch) cut a layer's run. */
        assert_in_range(remote, MLA_LAYERS, MLA_LAYERS + calls);
        assert_true(local - local0 >= MLA_LAYERS * blocks_per_layer); /* no two decode runs touch */
    }
    mla_pair_free(&m);
}

/* Pages adjacent on neither side: every block is one page long, so they
 * go as one strided descriptor, in their order (its bounds check names
 * it when the decode pools are not registered), and travel compactly. */
static void lone_pages_go_as_one_strided_descriptor(void **state)
{
    (void)state;
    enum { LONE = 40 };
    int32_t src_pages[LONE], dst_pages[LONE];
    for (int i = 0; i < LONE; i++) {
        src_pages[i] = 2 * i;
        dst_pages[i] = MLA_POOL - 1 - 3 * i;
    }
    struct mla_pair m;
    mla_pair_make(&m, true);
    uint64_t compact = ferry_vec_compact_served();
    assert_int_equal(mla_send_and_check(&m, 6, src_pages, dst_pages, LONE), MLA_LAYERS * LONE);
    assert_true(ferry_vec_compact_served() > compact);
    mla_pair_free(&m);

    mla_pair_make(&m, false);
    ferry_kv_plan_t *p = NULL;
    assert_int_equal(ferry_kv_plan_create(&m.desc[0], &m.desc[1], src_pages, dst_pages, LONE, &p), 0);
    assert_int_equal(ferry_kv_plan_bind_sender(p, 0, 0, 0, 0), 0);
    ferry_kv_send_args_t args = {.request_id = 7, .timeout_ms = 5000};
    assert_int_equal(ferry_kv_send(m.engines[0], ferry_engine_name(m.engines[1]), p, &args),
                     FERRY_ERR_ADDRESS_NOT_REGISTERED);
    assert_detail_contains(": transfer: strided submit: strided piece 0 of 160");
    ferry_kv_plan_destroy(p);
    mla_pair_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(poll_with_a_wrapping_max_is_refused),
        cmocka_unit_test(direct_1_1_moves_every_byte_and_the_first_token),
        cmocka_unit_test(staged_4_to_2_scatters_on_the_receiver),
        cmocka_unit_test(gathered_2_to_4_writes_decode_pages),
        cmocka_unit_test(unregistered_staging_fails_on_both_sides),
        cmocka_unit_test(failed_transfer_is_notified),
        cmocka_unit_test(notice_arrives_only_after_the_last_byte),
        cmocka_unit_test(sender_abort_reaches_the_decode_side),
        cmocka_unit_test(tracker_rejects_unexpected_source),
        cmocka_unit_test(verified_tracker_refuses_forged_notices),
        cmocka_unit_test(verified_direct_pair_completes_and_fails_honestly),
        cmocka_unit_test(unverified_tracker_refuses_unknown_statuses),
        cmocka_unit_test(embeddings_reuse_one_registration),
        cmocka_unit_test(many_run_lengths_all_land),
        cmocka_unit_test(neighbour_blocks_stay_together_over_shm),
        cmocka_unit_test(lone_pages_go_as_one_strided_descriptor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
