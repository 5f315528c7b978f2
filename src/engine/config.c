/* SPDX-License-Identifier: Apache-2.0 */
/* Configuration: defaults, FERRY_* environment variables, owned copies. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "util/env.h"
#include "wire/wire.h"
#include "util/fail.h"
#include "util/sized.h"

const char *ferry_version(void)
{
    return FERRY_VERSION_STRING;
}

unsigned ferry_version_number(void)
{
    return FERRY_VERSION_NUMBER;
}

/* The defaults, in this library's full struct. */
static void config_defaults(ferry_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
    cfg->host = "127.0.0.1";
    cfg->port = 0;
    cfg->metadata = "p2p";
    cfg->transport = "auto";
    cfg->timeout_ms = 30000;
    cfg->connect_timeout_ms = 5000;
    cfg->conns_per_peer = 2;
    cfg->workers = 2;
    cfg->slice_size = 1u << 20;
    cfg->retries = 1;
    cfg->retry_backoff_ms = 10;
    cfg->checksum = 0;
    cfg->keepalive_ms = 5000;
    cfg->secret = NULL;
    cfg->log_level = 1;
    cfg->max_sessions = 4096;
    cfg->metadata_ttl_s = 10;
    cfg->cancel_timeout_ms = 1000;
    cfg->spin_us = 0;
    cfg->max_connections = 2048;
    cfg->max_connections_per_source = 0;
    cfg->metrics_host = NULL;
}

/* Writes the defaults into the fields the caller's struct_size covers (a
 * size below every published layout, or above a page, gets nothing:
 * ferry_engine_create then names the problem). */
void (ferry_config_init)(ferry_config_t *cfg)
{
    if (!cfg || !ferry_sized_ok(cfg, FERRY_CONFIG_SIZE_0_1)) return;
    ferry_config_t all;
    config_defaults(&all);
    ferry_sized_export(cfg, &all, sizeof all);
}

#define ENV_INT(var, field, lo, hi)                         \
    do {                                                    \
        long v_;                                            \
        int r_ = ferry_env_long(var, lo, hi, &v_);                \
        if (r_ < 0) return r_;                              \
        if (r_) cfg->field = (__typeof__(cfg->field))v_;    \
    } while (0)

#define ENV_STR(var, field)                         \
    do {                                            \
        const char *s_ = getenv(var);               \
        if (s_ && *s_) cfg->field = s_;             \
    } while (0)

/* Applies the environment to this library's full struct. */
static int config_from_env(ferry_config_t *cfg)
{
    ENV_STR("FERRY_HOST", host);
    ENV_INT("FERRY_PORT", port, 0, 65535);
    ENV_STR("FERRY_METADATA", metadata);
    ENV_STR("FERRY_TRANSPORT", transport);
    ENV_INT("FERRY_TIMEOUT_MS", timeout_ms, 1, 86400000);
    ENV_INT("FERRY_CONNECT_TIMEOUT_MS", connect_timeout_ms, 1, 600000);
    ENV_INT("FERRY_CONNS_PER_PEER", conns_per_peer, 1, 64);
    ENV_INT("FERRY_WORKERS", workers, 1, 64);
    ENV_INT("FERRY_SLICE_SIZE", slice_size, 4096, FERRY_WIRE_MAX_DATA);
    ENV_INT("FERRY_RETRIES", retries, 0, 100);
    ENV_INT("FERRY_RETRY_BACKOFF_MS", retry_backoff_ms, 0, 60000);
    ENV_INT("FERRY_CHECKSUM", checksum, 0, 1);
    ENV_INT("FERRY_KEEPALIVE_MS", keepalive_ms, 0, 3600000);
    ENV_STR("FERRY_SECRET", secret);
    ENV_INT("FERRY_LOG", log_level, 0, 4);
    ENV_INT("FERRY_METADATA_TTL_S", metadata_ttl_s, 1, 3600);
    ENV_INT("FERRY_METRICS_PORT", metrics_port, -1, 65535);
    ENV_INT("FERRY_CANCEL_TIMEOUT_MS", cancel_timeout_ms, 1, 600000);
    ENV_INT("FERRY_SPIN_US", spin_us, -1, 1000000);
    ENV_INT("FERRY_MAX_CONNECTIONS", max_connections, 1, FERRY_MAX_CONNECTIONS_LIMIT);
    ENV_INT("FERRY_MAX_CONNECTIONS_PER_SOURCE", max_connections_per_source, 0, FERRY_MAX_CONNECTIONS_LIMIT);
    ENV_STR("FERRY_METRICS_HOST", metrics_host);
    return 0;
}

int (ferry_config_from_env)(ferry_config_t *cfg)
{
    if (!cfg) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config from env: cfg is NULL");
    ferry_config_t all;
    config_defaults(&all);
    int rc = ferry_sized_import(&all, sizeof all, cfg, FERRY_CONFIG_SIZE_0_1, "config");
    if (rc == 0) rc = config_from_env(&all);
    if (rc == 0) ferry_sized_export(cfg, &all, sizeof all);
    return rc;
}

static int check_config(const ferry_config_t *c)
{
    if (!c->host || !*c->host) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: host is empty");
    if (c->timeout_ms <= 0 || c->connect_timeout_ms <= 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: timeouts must be positive (timeout_ms=%d, connect_timeout_ms=%d)",
                          c->timeout_ms, c->connect_timeout_ms);
    if (c->conns_per_peer < 1 || c->conns_per_peer > 64)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: conns_per_peer=%d not in [1, 64]", c->conns_per_peer);
    if (c->workers < 1 || c->workers > 64)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: workers=%d not in [1, 64]", c->workers);
    if (c->slice_size < 4096 || c->slice_size > FERRY_WIRE_MAX_DATA)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: slice_size=%zu not in [4096, %u]", c->slice_size,
                          FERRY_WIRE_MAX_DATA);
    if (c->retries < 0 || c->retry_backoff_ms < 0)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: retries and retry_backoff_ms must be >= 0");
    if (c->metrics_port < -1 || c->metrics_port > 65535)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: metrics_port=%d not in [-1, 65535]", c->metrics_port);
    if (c->metadata_ttl_s < 1) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: metadata_ttl_s must be >= 1");
    if (c->max_sessions < 1) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: max_sessions must be >= 1");
    if (c->cancel_timeout_ms < 1 || c->cancel_timeout_ms > 600000)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: cancel_timeout_ms=%d not in [1, 600000]",
                          c->cancel_timeout_ms);
    if (c->spin_us < -1 || c->spin_us > 1000000)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: spin_us=%d not in [-1, 1000000]", c->spin_us);
    if (c->max_connections < 1 || c->max_connections > FERRY_MAX_CONNECTIONS_LIMIT)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: max_connections=%d not in [1, %d]", c->max_connections,
                          FERRY_MAX_CONNECTIONS_LIMIT);
    if (c->max_connections_per_source < 0 || c->max_connections_per_source > FERRY_MAX_CONNECTIONS_LIMIT)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "config: max_connections_per_source=%d not in [0, %d]",
                          c->max_connections_per_source, FERRY_MAX_CONNECTIONS_LIMIT);
    return 0;
}

/* Copies cfg into *out, duplicating its strings (into *strings, which
 * the caller frees) so callers may free theirs; fields beyond the caller's
 * struct_size take their defaults. */
int ferry_config_copy(ferry_config_t *out, char **strings, const ferry_config_t *theirs)
{
    ferry_config_t all;
    config_defaults(&all);
    int rc = ferry_sized_import(&all, sizeof all, theirs, FERRY_CONFIG_SIZE_0_1, "config");
    if (rc) return rc;
    const ferry_config_t *cfg = &all;
    rc = check_config(cfg);
    if (rc) return rc;
    *out = *cfg;
    const char *strs[5] = {cfg->host, cfg->metadata ? cfg->metadata : "p2p",
                           cfg->transport ? cfg->transport : "auto", cfg->secret ? cfg->secret : "",
                           cfg->metrics_host && *cfg->metrics_host ? cfg->metrics_host : cfg->host};
    size_t total = 0;
    for (int i = 0; i < 5; i++) total += strlen(strs[i]) + 1;
    *strings = malloc(total);
    if (!*strings) return ferry_fail(FERRY_ERR_MEMORY, "config: out of memory");
    char *p = *strings;
    const char **dst[5] = {&out->host, &out->metadata, &out->transport, &out->secret, &out->metrics_host};
    for (int i = 0; i < 5; i++) {
        size_t n = strlen(strs[i]) + 1;
        memcpy(p, strs[i], n);
        *dst[i] = p;
        p += n;
    }
    if (!*out->secret) out->secret = NULL;
    return 0;
}
