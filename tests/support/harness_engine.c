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
