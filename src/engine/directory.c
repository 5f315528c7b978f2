/* SPDX-License-Identifier: Apache-2.0 */
/* Engine <-> metadata service. The descriptor is a small JSON object
 * (jansson builds and parses it):
 *   {"name":"10.0.0.7:7000","host":"10.0.0.7","port":7000,
 *    "epoch":"3f2a...","engine_id":"...","protocol":1,"pid":1234} */
#include "directory.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"
#include "parts.h"
#include "util/fail.h"
#include "util/net.h"
#include "util/log.h"
#include "meta/meta.h"

int ferry_directory_enabled(ferry_engine_t *e)
{
    const ferry_directory_t *d = ferry_engine_part_dir(e);
    return d->meta_open && strcmp(d->meta.ops->scheme, "p2p") != 0;
}

static char *describe(ferry_engine_t *e)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    char epoch[17], id[17];
    snprintf(epoch, sizeof epoch, "%016llx", (unsigned long long)ferry_engine_epoch(e));
    snprintf(id, sizeof id, "%016llx", (unsigned long long)ferry_engine_part_id(e));
    json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:i, s:i}", "name", ferry_engine_name(e), "host", cfg->host,
                          "port", (int)ferry_engine_port(e), "epoch", epoch, "engine_id", id, "protocol",
                          FERRY_PROTOCOL_VERSION, "pid", (int)getpid());
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

/* ---------------------------------------------------------------- cache */

/* Peers an engine looked up. A plain array searched linearly: it is used
 * only when a session to a new peer opens, and holds one entry per peer
 * (a few hundred at most), so a hash table would buy nothing. */
struct cached_peer {
    char *name;
    ferry_directory_entry_t entry;
    uint64_t fetched_ns; /* when the service gave it */
};

struct ferry_directory_cache {
    uint64_t max_age_ns; /* 0: every lookup asks the service */
    pthread_mutex_t mu;
    struct cached_peer *v;
    int n, cap;
};

/* Entries live metadata_ttl_s: no longer than a dead peer's lease keeps
 * its entry. FERRY_METADATA_CACHE_S overrides it (0: no cache, every new
 * session asks the service, as a fresh engine would). */
static struct ferry_directory_cache *cache_new(const ferry_engine_t *e)
{
    struct ferry_directory_cache *c = calloc(1, sizeof *c);
    if (c && pthread_mutex_init(&c->mu, NULL)) {
        free(c);
        return NULL;
    }
    if (!c) return NULL;
    long s = ferry_engine_part_config(e)->metadata_ttl_s;
    const char *env = getenv("FERRY_METADATA_CACHE_S");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v > 86400)
            FERRY_LOG(FERRY_LOG_WARN, "directory", "FERRY_METADATA_CACHE_S='%s' is not 0..86400: ignored", env);
        else
            s = v;
    }
    c->max_age_ns = (uint64_t)s * 1000000000ull;
    return c;
}

static void cache_free(struct ferry_directory_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->n; i++) free(c->v[i].name);
    free(c->v);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static struct cached_peer *cache_find_locked(struct ferry_directory_cache *c, const char *peer)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->v[i].name, peer) == 0) return &c->v[i];
    return NULL;
}

/* Copies peer's entry into *out: 1 fresh, 0 expired (copied all the same,
 * for use while the service is down), -1 absent. */
static int cache_get(ferry_engine_t *e, const char *peer, ferry_directory_entry_t *out)
{
    ferry_directory_t *d = ferry_engine_part_dir(e);
    struct ferry_directory_cache *c = d->cache;
    if (!c || c->max_age_ns == 0) return -1;
    pthread_mutex_lock(&c->mu);
    struct cached_peer *p = cache_find_locked(c, peer);
    int found = -1;
    if (p) {
        *out = p->entry;
        found = ferry_now_ns() - p->fetched_ns < c->max_age_ns;
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}

/* Stores peer's entry; a full cache (no memory) just stays as it was. */
static void cache_put(ferry_engine_t *e, const char *peer, const ferry_directory_entry_t *entry)
{
    ferry_directory_t *d = ferry_engine_part_dir(e);
    struct ferry_directory_cache *c = d->cache;
    if (!c || c->max_age_ns == 0) return;
    pthread_mutex_lock(&c->mu);
    struct cached_peer *p = cache_find_locked(c, peer);
    if (!p && c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        struct cached_peer *v = realloc(c->v, (size_t)cap * sizeof *v);
        if (v) {
            c->v = v;
            c->cap = cap;
        }
    }
    if (!p && c->n < c->cap) {
        char *name = strdup(peer);
        if (name) {
            p = &c->v[c->n++];
            p->name = name;
        }
    }
    if (p) {
        p->entry = *entry;
        p->fetched_ns = ferry_now_ns();
    }
    pthread_mutex_unlock(&c->mu);
}

/* Removes peer's entry; 1 when there was one. */
static int cache_drop(ferry_engine_t *e, const char *peer)
{
    ferry_directory_t *d = ferry_engine_part_dir(e);
    struct ferry_directory_cache *c = d->cache;
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    struct cached_peer *p = cache_find_locked(c, peer);
    if (p) {
        free(p->name);
        *p = c->v[--c->n]; /* order does not matter */
    }
    pthread_mutex_unlock(&c->mu);
    return p != NULL;
}

/* ------------------------------------------------------------- service */

int ferry_directory_start(ferry_engine_t *e)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    ferry_directory_t *d = ferry_engine_part_dir(e);
    int rc = ferry_meta_open(cfg->metadata, cfg->connect_timeout_ms, &d->meta);
    if (rc) return ferry_fail_context("metadata service '%s'", cfg->metadata);
    d->meta_open = true;
    if (!ferry_directory_enabled(e)) return 0;
    d->cache = cache_new(e);
    if (!d->cache) return ferry_fail(FERRY_ERR_MEMORY, "metadata cache: out of memory");
    char *value = describe(e);
    if (!value) return ferry_fail(FERRY_ERR_MEMORY, "metadata descriptor: out of memory");
    char key[400];
    snprintf(key, sizeof key, "%s%s", FERRY_META_KEY_PREFIX, ferry_engine_name(e));
    ferry_counters_t *st = ferry_engine_part_stats(e);
    rc = ferry_meta_publisher_start_counted(&d->meta, key, value, cfg->metadata_ttl_s,
                                            &st->metadata_lease_refreshes, &st->metadata_republishes, &d->publisher);
    free(value);
    if (rc) return ferry_fail_context("publishing %s in %s", ferry_engine_name(e), cfg->metadata);
    FERRY_LOG(FERRY_LOG_INFO, "directory", "published %s in %s (lease %d s)", ferry_engine_name(e), cfg->metadata,
              cfg->metadata_ttl_s);
    return 0;
}

void ferry_directory_unpublish(ferry_engine_t *e)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    ferry_directory_t *d = ferry_engine_part_dir(e);
    if (d->publisher) {
        if (ferry_meta_publisher_stop(d->publisher) != 0)
            FERRY_LOG(FERRY_LOG_WARN, "directory", "removing %s from %s: %s", ferry_engine_name(e), cfg->metadata,
                      ferry_last_error_detail());
        d->publisher = NULL;
    }
}

void ferry_directory_stop(ferry_engine_t *e)
{
    ferry_directory_t *d = ferry_engine_part_dir(e);
    ferry_directory_unpublish(e);
    if (d->meta_open) ferry_meta_close(&d->meta);
    d->meta_open = false;
    cache_free(d->cache);
    d->cache = NULL;
}

/* A JSON integer field of o in [lo, hi]: jansson's "i" would convert a
 * larger value to int silently (a port of 2^32 + p read as p), so the
 * field is read whole and range-checked. */
static bool int_field(json_t *o, const char *key, json_int_t lo, json_int_t hi, json_int_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    *out = json_integer_value(v);
    return *out >= lo && *out <= hi;
}

/* The epoch: 1 to 16 hex digits, nothing else (strtoull would take a
 * prefix, or saturate a longer number). */
static bool epoch_field(const char *text, uint64_t *out)
{
    size_t n = strlen(text);
    if (n == 0 || n > 16 || strspn(text, "0123456789abcdefABCDEF") != n) return false;
    *out = strtoull(text, NULL, 16);
    return true;
}

int ferry_directory_parse_entry(const char *peer, const char *text, ferry_directory_entry_t *out)
{
    json_error_t err;
    json_t *o = json_loads(text, 0, &err);
    const char *host = NULL, *epoch = NULL;
    json_int_t port = 0, protocol = 0;
    uint64_t epoch_value = 0;
    bool ok = o && json_unpack(o, "{s:s, s:s}", "host", &host, "epoch", &epoch) == 0 &&
              strlen(host) < sizeof out->host && int_field(o, "port", 1, 65535, &port) &&
              int_field(o, "protocol", 1, INT32_MAX, &protocol) && epoch_field(epoch, &epoch_value);
    if (ok) {
        snprintf(out->host, sizeof out->host, "%s", host);
        out->port = (uint16_t)port;
        out->epoch = epoch_value;
        out->protocol = (int)protocol;
    }
    json_decref(o);
    if (!ok)
        return ferry_fail(FERRY_ERR_METADATA,
                          "the metadata entry of %s is not a Ferry descriptor (host, port in 1..65535, epoch of 1-16 "
                          "hex digits, protocol): %.200s",
                          peer, text);
    return 0;
}

/* Asks the service for peer's entry. *gone is set when the service
 * answered that it holds none (as opposed to not answering). */
static int fetch(ferry_engine_t *e, const char *peer, ferry_directory_entry_t *out, int *gone)
{
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    ferry_directory_t *d = ferry_engine_part_dir(e);
    *gone = 0;
    char key[400];
    snprintf(key, sizeof key, "%s%s", FERRY_META_KEY_PREFIX, peer);
    char *value = NULL;
    FERRY_STAT_ADD(ferry_engine_part_stats(e), metadata_fetches, 1);
    int rc = d->meta.ops->lookup(d->meta.state, key, &value);
    if (rc == FERRY_ERR_NOT_FOUND) {
        *gone = 1;
        return ferry_fail(FERRY_ERR_METADATA,
                          "%s holds no entry for %s: the peer never started, or it died and its lease expired",
                          cfg->metadata, peer);
    }
    if (rc) return ferry_fail_context("looking up %s in %s", peer, cfg->metadata);
    rc = ferry_directory_parse_entry(peer, value, out);
    free(value);
    return rc;
}

static int lookup(ferry_engine_t *e, const char *peer, ferry_directory_entry_t *out, int *cached, int *gone)
{
    *cached = 0;
    *gone = 0;
    FERRY_STAT_ADD(ferry_engine_part_stats(e), metadata_lookups, 1);
    ferry_directory_entry_t old;
    int found = cache_get(e, peer, &old);
    if (found == 1) {
        FERRY_STAT_ADD(ferry_engine_part_stats(e), metadata_cache_hits, 1);
        *out = old;
        *cached = 1;
        return 0;
    }
    int rc = fetch(e, peer, out, gone);
    if (rc == 0) {
        cache_put(e, peer, out);
        return 0;
    }
    /* An expired entry beats none while the service is unreachable; an
     * entry the service says is gone is dropped. */
    if (found == 0 && !*gone) {
        FERRY_LOG(FERRY_LOG_WARN, "directory", "using the expired entry of %s: %s", peer, ferry_last_error_detail());
        FERRY_STAT_ADD(ferry_engine_part_stats(e), metadata_stale_served, 1);
        *out = old;
        *cached = 1;
        return 0;
    }
    if (found == 0) cache_drop(e, peer);
    return rc;
}

int ferry_directory_lookup(ferry_engine_t *e, const char *peer, ferry_directory_entry_t *out, int *cached)
{
    int dummy, gone;
    return lookup(e, peer, out, cached ? cached : &dummy, &gone);
}

void ferry_directory_forget(ferry_engine_t *e, const char *peer)
{
    if (!ferry_directory_enabled(e)) return;
    if (cache_drop(e, peer)) {
        FERRY_STAT_ADD(ferry_engine_part_stats(e), metadata_invalidations, 1);
        FERRY_LOG(FERRY_LOG_DEBUG, "directory", "forgot the cached entry of %s", peer);
    }
}

int ferry_directory_connect(ferry_engine_t *e, const char *peer, uint64_t deadline, int *fd)
{
    ferry_directory_entry_t entry;
    int cached = 0, gone = 0;
    int rc = lookup(e, peer, &entry, &cached, &gone);
    if (rc) return rc;
    rc = ferry_net_connect(entry.host, entry.port, deadline, fd);
    if (rc == 0 || !cached) {
        if (rc) ferry_directory_forget(e, peer);
        return rc;
    }
    /* The cached address failed: drop it and ask the service once. Its
     * answer (gone, or moved) explains more than the refused connect; if
     * it cannot answer either, the connect's own error stands. */
    char saved[512];
    snprintf(saved, sizeof saved, "%s", ferry_fail_message());
    ferry_directory_forget(e, peer);
    ferry_directory_entry_t fresh;
    int lrc = lookup(e, peer, &fresh, &cached, &gone);
    if (lrc == 0) {
        rc = ferry_net_connect(fresh.host, fresh.port, deadline, fd);
        if (rc) ferry_directory_forget(e, peer);
        return rc;
    }
    if (gone) return lrc;
    return ferry_fail(rc, "%s", saved);
}
