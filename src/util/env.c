/* SPDX-License-Identifier: Apache-2.0 */
/* Settings read from the environment (env.h). */
#include "env.h"

#include <errno.h>
#include <stdlib.h>

#include "fail.h"

int ferry_env_long(const char *name, long lo, long hi, long *out)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 0);
    if (errno || *end || x < lo || x > hi)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "environment %s='%s' is not an integer in [%ld, %ld]", name, v,
                          lo, hi);
    *out = x;
    return 1;
}
