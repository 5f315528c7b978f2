/* SPDX-License-Identifier: Apache-2.0 */
/* The engine-making half of the harness, kept apart so that tests of pure
 * modules link without the engine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

ferry_engine_t *harness_engine_cfg(ferry_config_t *cfg)
{
    cfg->host = "127.0.0.1";
    cfg->port = 0;
    ferry_engine_t *e = NULL;
    if (ferry_engine_create(cfg, &e) != 0) {
        fprintf(stderr, "engine create: %s\n", ferry_last_error_detail());
        fail();
    }
    return e;
}

const char *harness_expected_transport(void)
{
    const char *t = getenv("FERRY_TRANSPORT");
    if (t && strcmp(t, "tcp") == 0) return "tcp";
    return "shm";
}

void harness_reverse_batch_round_trip(ferry_engine_t *e, const char *peer, unsigned char *src, uint64_t remote,
                                      int n, size_t block, uint64_t seed)
{
    void *locals[n];
    uint64_t remotes[n];
    size_t lens[n];
    harness_fill(src, (size_t)n * block, seed);
    for (int i = 0; i < n; i++) {
        locals[i] = src + (size_t)i * block;
        remotes[i] = remote + (uint64_t)(n - 1 - i) * block;
        lens[i] = block;
    }
    assert_int_equal(ferry_batch_transfer_sync(e, peer, FERRY_OP_WRITE, locals, remotes, lens, (size_t)n), 0);
    memset(src, 0, (size_t)n * block);
    assert_int_equal(ferry_batch_transfer_sync(e, peer, FERRY_OP_READ, locals, remotes, lens, (size_t)n), 0);
    assert_true(harness_check(src, (size_t)n * block, seed));
}

harness_pair_t *harness_pair_new(ferry_config_t *cfg, int target_timeout_ms)
{
    harness_pair_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->initiator = harness_engine_cfg(cfg);
    p->target = harness_engine(target_timeout_ms);
    snprintf(p->peer, sizeof p->peer, "%s", ferry_engine_name(p->target));
    return p;
}

void harness_pair_free(harness_pair_t *p)
{
    ferry_engine_destroy(p->initiator);
    ferry_engine_destroy(p->target);
    free(p);
}
