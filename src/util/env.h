/* SPDX-License-Identifier: Apache-2.0 */
/* Settings read from the environment (env.c), for any layer. Private to
 * the library. */
#ifndef FERRY_UTIL_ENV_H
#define FERRY_UTIL_ENV_H

/* Reads integer environment variable name into *out when set: 1 set, 0
 * unset, INVALID_ARGUMENT (naming it) when not an integer in [lo, hi]. */
int ferry_env_long(const char *name, long lo, long hi, long *out);

#endif
