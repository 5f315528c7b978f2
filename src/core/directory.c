/* Engine <-> metadata service. The descriptor is a small JSON object
 * (jansson builds and parses it):
 *   {"name":"10.0.0.7:7000","host":"10.0.0.7","port":7000,
 *    "epoch":"3f2a...","engine_id":"...","protocol":1,"pid":1234} */
#include "directory.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "fail.h"
#include "log.h"
#include "meta/meta.h"

int ferry_directory_enabled(const ferry_engine_t *e) { return e->meta_open && strcmp(e->meta.ops->scheme, "p2p") != 0; }

static char *describe(ferry_engine_t *e)
{
    char epoch[17], id[17];
    snprintf(epoch, sizeof epoch, "%016llx", (unsigned long long)e->epoch);
    snprintf(id, sizeof id, "%016llx", (unsigned long long)e->engine_id);
    json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:i, s:i}", "name", e->name, "host", e->cfg.host, "port",
                          (int)e->port, "epoch", epoch, "engine_id", id, "protocol", FERRY_PROTOCOL_VERSION, "pid",
                          (int)getpid());
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

int ferry_directory_start(ferry_engine_t *e)
{
    int rc = ferry_meta_open(e->cfg.metadata, e->cfg.connect_timeout_ms, &e->meta);
    if (rc) return ferry_fail_context("metadata service '%s'", e->cfg.metadata);
    e->meta_open = true;
    if (!ferry_directory_enabled(e)) return 0;
    char *value = describe(e);
    if (!value) return ferry_fail(FERRY_ERR_MEMORY, "metadata descriptor: out of memory");
    char key[400];
    snprintf(key, sizeof key, "%s%s", FERRY_META_KEY_PREFIX, e->name);
    rc = ferry_meta_publisher_start(&e->meta, key, value, e->cfg.metadata_ttl_s, &e->publisher);
    free(value);
    if (rc) return ferry_fail_context("publishing %s in %s", e->name, e->cfg.metadata);
    FERRY_LOG(FERRY_LOG_INFO, "directory", "published %s in %s (lease %d s)", e->name, e->cfg.metadata,
              e->cfg.metadata_ttl_s);
    return 0;
}

void ferry_directory_unpublish(ferry_engine_t *e)
{
    if (e->publisher) {
        if (ferry_meta_publisher_stop(e->publisher) != 0)
            FERRY_LOG(FERRY_LOG_WARN, "directory", "removing %s from %s: %s", e->name, e->cfg.metadata,
                      ferry_last_error_detail());
        e->publisher = NULL;
    }
}

void ferry_directory_stop(ferry_engine_t *e)
{
    ferry_directory_unpublish(e);
    if (e->meta_open) ferry_meta_close(&e->meta);
    e->meta_open = false;
}

static int parse_entry(const char *peer, const char *text, ferry_directory_entry_t *out)
{
    json_error_t err;
    json_t *o = json_loads(text, 0, &err);
    const char *host = NULL, *epoch = NULL;
    int port = 0, protocol = 0;
    int ok = o && json_unpack(o, "{s:s, s:i, s:s, s:i}", "host", &host, "port", &port, "epoch", &epoch, "protocol",
                              &protocol) == 0 && port > 0 && port < 65536 && strlen(host) < sizeof out->host;
    if (ok) {
        snprintf(out->host, sizeof out->host, "%s", host);
        out->port = (uint16_t)port;
        out->epoch = strtoull(epoch, NULL, 16);
        out->protocol = protocol;
    }
    json_decref(o);
    if (!ok) return ferry_fail(FERRY_ERR_METADATA, "the metadata entry of %s is not a Ferry descriptor: %.200s", peer, text);
    return 0;
}

int ferry_directory_lookup(ferry_engine_t *e, const char *peer, ferry_directory_entry_t *out)
{
    char key[400];
    snprintf(key, sizeof key, "%s%s", FERRY_META_KEY_PREFIX, peer);
    char *value = NULL;
    int rc = e->meta.ops->lookup(e->meta.state, key, &value);
    if (rc == FERRY_ERR_NOT_FOUND)
        return ferry_fail(FERRY_ERR_METADATA,
                          "%s holds no entry for %s: the peer never started, or it died and its lease expired",
                          e->cfg.metadata, peer);
    if (rc) return ferry_fail_context("looking up %s", peer);
    rc = parse_entry(peer, value, out);
    free(value);
    return rc;
}
