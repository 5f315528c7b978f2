/* SPDX-License-Identifier: Apache-2.0 */
/* The engine's configuration (config.c). Private to the library. */
#ifndef FERRY_CORE_CONFIG_H
#define FERRY_CORE_CONFIG_H

#include <ferry/ferry.h>

#include "util/env.h" /* ferry_env_long */

/* config.c */
int ferry_config_copy(ferry_config_t *out, char **strings, const ferry_config_t *cfg);
/* The newest protocol version e speaks: FERRY_PROTOCOL_VERSION, or what a
 * test pinned (ferry_test_set_protocol_version, testing.h). */
unsigned ferry_engine_proto_max(const ferry_engine_t *e);

/* Upper bound of config.max_connections. Each served connection costs a
 * descriptor and its buffers (no thread: evloop.c); the limits (listener.c)
 * keep peers opening connections without end from exhausting them. */
#define FERRY_MAX_CONNECTIONS_LIMIT 65536

#endif
