/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry cluster node`: what its files share. cmd_cluster.c has the decode
 * and probe roles, the options and main; cluster_prefill.c the prefill role;
 * cluster_node.c the plumbing (clocks, the log, the engine), the content
 * pattern and the pools. The log format is in cluster.h. */
#ifndef FERRY_CLUSTER_NODE_H
#define FERRY_CLUSTER_NODE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <ferry/ferry.h>
#include <ferry/kv.h>

#define TOKENS_PER_PAGE 16u
#define CANARY_BYTE 0xEE
#define CANARY_WORD 0xEEEEEEEEEEEEEEEEull
#define REQ_TAG "FCREQ"
#define MAX_PEERS 256

struct node_opts {
    const char *role, *host, *dir;
    int index;
    uint16_t port;
    const char *peers[MAX_PEERS];
    int npeers;
    unsigned incarnation;
    uint64_t until_ms;  /* decode: stop asking at this wall-clock time */
    int window;         /* decode: asks in flight per prefill peer */
    int inflight;       /* decode: asks in flight in all, like a server's admission limit:
                           more than its link carries within the deadline only times out */
    uint32_t layers, page_bytes, pages; /* one request: pages pages of page_bytes in each layer */
    int timeout_ms;     /* the engine's request deadline */
    int streams;        /* prefill: KV sends at once to one decode peer */
    int send_slots;     /* prefill: KV sends at once, all peers together (its sender threads) */
    const char *go_file; /* decode: wait for "START_MS END_MS" in it before asking */
    const char *inject; /* prefill, to show the checks can fail: "corrupt" flips a byte of
                           its 20th request; "stray" writes other bytes into the pages of its
                           20th to 22nd requests after their success notice */
};

/* One mapping per layer of num_pages pages, registered with flags. */
struct pool {
    uint32_t layers, num_pages, page_bytes;
    uint64_t addrs[64];
};

/* Set by SIGTERM/SIGINT (on_term): every loop ends. */
extern atomic_bool stopping;
/* DIR/node-INDEX.log, line-buffered (logline). */
extern FILE *node_log;

/* cluster_node.c */
uint64_t wall_ms(void);
uint64_t mono_us(void);
void sleep_ms(int ms);
void idle_backoff(int *idle_ms, bool got_work);
void logline(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void on_term(int sig);
void die(const char *what, int rc);
void sample_process(ferry_engine_t *e);
/* Threads the node itself runs besides its main thread (prefill senders):
 * sample_process logs them, so that the report tells the engine's own. */
extern atomic_int node_threads;
/* The engines' port (all listen on the same one, each at its own address). */
extern uint16_t node_port;
/* The content pattern (sender, request, offset) both roles derive. */
uint64_t mix64(uint64_t x);
uint64_t name_hash(const char *s);
uint64_t request_seed(const char *sender, uint64_t req);
void fill_page(uint64_t *page, size_t words, uint64_t seed, uint64_t first_word);
uint64_t bad_bytes_in(uint64_t want, uint64_t got);
/* The pools: one mapping per layer, registered. */
void pool_create(struct pool *p, ferry_engine_t *e, const struct node_opts *o, uint32_t num_pages,
                 unsigned flags, int fill);
uint64_t *pool_page(const struct pool *p, uint32_t layer, int32_t page);
ferry_kv_cache_desc_t pool_desc(uint32_t layers, uint32_t num_pages, uint32_t page_bytes,
                                const uint64_t *addrs);
ferry_engine_t *node_engine(const struct node_opts *o);

/* cluster_prefill.c: prefill_main serves asks until `stopping`; a mesh
 * node (decode and prefill in one engine) calls the three parts itself. */
int prefill_main(const struct node_opts *o, ferry_engine_t *e);
void prefill_begin(const struct node_opts *o, ferry_engine_t *e);
void prefill_take(const struct node_opts *o, ferry_engine_t *e, const ferry_notification_t *n);
void prefill_end(void);

#endif
