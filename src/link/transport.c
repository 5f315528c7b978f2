/* SPDX-License-Identifier: Apache-2.0 */
/* The choice of a transport per peer, the lookups by frame, and the checks
 * of the table. The table itself, ferry_transports[], is generated from the
 * list of transport folders (cmake/transports.cmake): no transport is named
 * here. */
#include "transport.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fail.h"
#include "util/log.h"

const ferry_transport_ops_t *ferry_transport_find(const char *name)
{
    for (int i = 0; name && ferry_transports[i]; i++)
        if (strcmp(ferry_transports[i]->name, name) == 0) return ferry_transports[i];
    return NULL;
}

const ferry_transport_ops_t *ferry_transport_choose(ferry_xport_ctx_t *ctx, const ferry_hello_t *peer, char *why,
                                                     size_t cap)
{
    const char *forced = ctx->transport;
    if (forced && strcmp(forced, "auto") != 0) {
        const ferry_transport_ops_t *t = ferry_transport_find(forced);
        if (t && t->usable(ctx, peer, why, cap)) {
            char reason[128];
            snprintf(reason, sizeof reason, "forced by config; %s", why);
            snprintf(why, cap, "%s", reason);
            return t;
        }
        /* Forced but unusable: say so and fall back to the transport every
         * peer can be reached by. */
        char reason[128];
        snprintf(reason, sizeof reason, "%s forced but unusable (%s); fell back to %s", forced, t ? why : "unknown",
                 ferry_transport_fallback->name);
        snprintf(why, cap, "%s", reason);
        FERRY_LOG(FERRY_LOG_WARN, "transport", "peer %s: %s", peer->name, why);
        return ferry_transport_fallback;
    }
    /* Auto: the first usable; the reason names the one passed over last,
     * the nearest better choice (shm chosen: why not rdma; tcp: why not
     * shm), which says more than the first (cuda_ipc, where no device
     * memory is registered). */
    char skipped[128] = "";
    for (int i = 0; ferry_transports[i]; i++) {
        if (ferry_transports[i]->usable(ctx, peer, why, cap)) {
            if (skipped[0]) {
                char reason[128];
                snprintf(reason, sizeof reason, "%s; %s", why, skipped);
                snprintf(why, cap, "%s", reason);
            }
            return ferry_transports[i];
        }
        snprintf(skipped, sizeof skipped, "not %s: %s", ferry_transports[i]->name, why);
    }
    snprintf(why, cap, "no transport is usable");
    return NULL;
}

const ferry_transport_ops_t *ferry_transport_for_frame(uint8_t type)
{
    for (int i = 0; ferry_transports[i]; i++)
        for (size_t k = 0; k < ferry_transports[i]->nserve_types; k++)
            if (ferry_transports[i]->serve_types[k] == type) return ferry_transports[i];
    return NULL;
}

unsigned ferry_transport_region_slot(const ferry_transport_ops_t *t)
{
    for (unsigned i = 0; ferry_transports[i]; i++)
        if (ferry_transports[i] == t) return 1 + i;
    return FERRY_REGION_SLOTS;
}

const ferry_frame_def_t *ferry_transport_frame_def(uint8_t type)
{
    for (int i = 0; ferry_transports[i]; i++)
        for (size_t k = 0; k < ferry_transports[i]->nframes; k++)
            if (ferry_transports[i]->frames[k].type == type) return &ferry_transports[i]->frames[k];
    return NULL;
}

/* The wire layer names and sizes the transports' frames through the table
 * (wire.h); set before main, so before any frame is decoded. */
__attribute__((constructor)) static void install_frame_lookup(void)
{
    ferry_wire_set_frame_lookup(ferry_transport_frame_def);
}

/* ------------------------------------------------------ the table's checks */

#define REFUSE(t, fmt, ...) \
    ferry_fail(FERRY_ERR_INTERNAL, "transport table: %s " fmt, (t)->name ? (t)->name : "(unnamed)", __VA_ARGS__)

static bool in_ranges(const ferry_transport_ops_t *t, uint8_t type)
{
    for (size_t r = 0; r < t->nframe_ranges; r++)
        if (type >= t->frame_ranges[r].first && type <= t->frame_ranges[r].last) return true;
    return false;
}

/* Its frame ranges hold no core id (wire.h), and its frames lie in them. */
static int check_frames(const ferry_transport_ops_t *t)
{
    for (size_t r = 0; r < t->nframe_ranges; r++) {
        const ferry_frame_range_t *g = &t->frame_ranges[r];
        if (g->first == 0 || g->first > g->last) return REFUSE(t, "declares the empty range %u..%u", g->first, g->last);
        for (unsigned id = g->first; id <= g->last; id++)
            if (ferry_frame_is_core((uint8_t)id))
                return REFUSE(t, "declares the range %u..%u, which holds the core's frame %u", g->first, g->last, id);
    }
    for (size_t k = 0; k < t->nframes; k++)
        if (!in_ranges(t, t->frames[k].type))
            return REFUSE(t, "declares frame %u (%s) out of its ranges", t->frames[k].type, t->frames[k].name);
    for (size_t k = 0; k < t->nserve_types; k++)
        if (!in_ranges(t, t->serve_types[k]) && !ferry_frame_is_core(t->serve_types[k]))
            return REFUSE(t, "serves frame %u, neither its own nor the core's", t->serve_types[k]);
    return 0;
}

/* One transport's own declarations. */
static int check_one(const ferry_transport_ops_t *t)
{
    if (t->version != FERRY_TRANSPORT_OPS_VERSION)
        return REFUSE(t, "has ops version %u, this library's is %u", t->version, FERRY_TRANSPORT_OPS_VERSION);
    if (!t->name || !t->usable || !t->run || !t->serve) return REFUSE(t, "lacks %s", "a name, usable, run or serve");
    if (t->hello_bits & FERRY_HELLO_F_CORE)
        return REFUSE(t, "declares the core's HELLO bits 0x%x", t->hello_bits & FERRY_HELLO_F_CORE);
    for (size_t k = 0; k < t->nkeys; k++) {
        const ferry_transport_key_t *key = &t->keys[k];
        if (!key->name || !key->help) return REFUSE(t, "has key %zu without a name or help", k);
        if (key->type != FERRY_KEY_STRING && key->def && *key->def) {
            char *end;
            long d = strtol(key->def, &end, 0);
            if (*end || d < key->min || d > key->max)
                return REFUSE(t, "key %s has the default '%s', not an integer in [%ld, %ld]", key->name, key->def,
                              key->min, key->max);
        }
    }
    return check_frames(t);
}

/* Two transports declare nothing in common: name, frame ids, HELLO bits,
 * configuration keys. */
static int check_pair(const ferry_transport_ops_t *t, const ferry_transport_ops_t *u)
{
    if (strcmp(t->name, u->name) == 0) return REFUSE(t, "is in the table %s", "twice");
    for (size_t r = 0; r < t->nframe_ranges; r++)
        for (size_t q = 0; q < u->nframe_ranges; q++) {
            const ferry_frame_range_t *a = &t->frame_ranges[r], *b = &u->frame_ranges[q];
            if (a->first <= b->last && b->first <= a->last)
                return REFUSE(t, "and %s share frame ids (%u..%u, %u..%u)", u->name, a->first, a->last, b->first,
                              b->last);
        }
    if (t->hello_bits & u->hello_bits)
        return REFUSE(t, "and %s share HELLO bits 0x%x", u->name, t->hello_bits & u->hello_bits);
    for (size_t a = 0; a < t->nkeys; a++)
        for (size_t b = 0; b < u->nkeys; b++)
            if (strcmp(t->keys[a].name, u->keys[b].name) == 0)
                return REFUSE(t, "and %s both declare the key %s", u->name, t->keys[a].name);
    return 0;
}

int ferry_transport_table_check(const ferry_transport_ops_t *const *table, const ferry_transport_ops_t *fallback)
{
    size_t n = 0;
    bool has_fallback = false;
    for (; table[n]; n++) has_fallback |= table[n] == fallback;
    if (n + 1 > FERRY_REGION_SLOTS)
        return ferry_fail(FERRY_ERR_INTERNAL, "transport table: %zu transports, %d per-region slots", n,
                          FERRY_REGION_SLOTS - 1);
    for (size_t i = 0; i < n; i++) {
        int rc = check_one(table[i]);
        for (size_t j = i + 1; rc == 0 && j < n; j++) rc = check_pair(table[i], table[j]);
        if (rc) return rc;
    }
    if (!has_fallback) return ferry_fail(FERRY_ERR_INTERNAL, "transport table: its fallback is not in it");
    return 0;
}

/* The table is fixed at link time: checked once, its verdict kept. */
static pthread_once_t check_once = PTHREAD_ONCE_INIT;
static int check_rc;
static char check_detail[256];

static void check_table(void)
{
    check_rc = ferry_transport_table_check(ferry_transports, ferry_transport_fallback);
    if (check_rc) snprintf(check_detail, sizeof check_detail, "%s", ferry_fail_message());
}

int ferry_transports_engine_init(ferry_xport_ctx_t *ctx)
{
    pthread_once(&check_once, check_table);
    if (check_rc) return ferry_fail(check_rc, "%s", check_detail);
    for (int i = 0; ferry_transports[i]; i++) {
        if (!ferry_transports[i]->engine_init) continue;
        int rc = ferry_transports[i]->engine_init(ctx);
        if (rc) return rc;
    }
    return 0;
}

void ferry_transports_engine_fini(ferry_xport_ctx_t *ctx)
{
    for (int i = 0; ferry_transports[i]; i++)
        if (ferry_transports[i]->engine_fini) ferry_transports[i]->engine_fini(ctx);
}

/* ---------------------------------------------------- configuration keys */

static bool key_declared(const ferry_transport_key_t *k)
{
    for (int i = 0; ferry_transports[i]; i++)
        if (k >= ferry_transports[i]->keys && k < ferry_transports[i]->keys + ferry_transports[i]->nkeys) return true;
    return false;
}

int ferry_transport_key(const ferry_transport_key_t *k, long *num, const char **str)
{
    if (!k || !key_declared(k))
        return ferry_fail(FERRY_ERR_INTERNAL, "configuration key %s is in no transport's keys table",
                          k && k->name ? k->name : "(null)");
    const char *v = getenv(k->name);
    if (!v || !*v) {
        /* Unset: the default, when the key has one. */
        if (!k->def || !*k->def) return 0;
        if (k->type == FERRY_KEY_STRING) {
            if (str) *str = k->def;
        } else if (num) {
            *num = strtol(k->def, NULL, 0);
        }
        return 0;
    }
    switch (k->type) {
    case FERRY_KEY_STRING:
        if (str) *str = v;
        return 1;
    case FERRY_KEY_FLAG:
        if (num) *num = strcmp(v, "0") != 0;
        return 1;
    case FERRY_KEY_LONG: {
        char *end;
        errno = 0;
        long x = strtol(v, &end, 0);
        if (errno || *end || x < k->min || x > k->max)
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "environment %s='%s' is not an integer in [%ld, %ld]",
                              k->name, v, k->min, k->max);
        if (num) *num = x;
        return 1;
    }
    }
    return ferry_fail(FERRY_ERR_INTERNAL, "configuration key %s has no type", k->name);
}
