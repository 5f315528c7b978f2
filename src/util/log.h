/* SPDX-License-Identifier: Apache-2.0 */
/* Logging: levels, one stable line format, quiet by default.
 *   ferry <level> <unix-time.ms> <pid> <component>: message
 * The level comes from config.log_level or FERRY_LOG (0 error .. 4 trace). */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

#include <stdatomic.h>

enum { FERRY_LOG_ERROR = 0, FERRY_LOG_WARN = 1, FERRY_LOG_INFO = 2, FERRY_LOG_DEBUG = 3, FERRY_LOG_TRACE = 4 };

/* Process-wide, set by every ferry_engine_create while other engines'
 * threads log: atomic (relaxed loads below). */
extern _Atomic int ferry_log_level;

void ferry_log_write(int level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define FERRY_LOG(level, component, ...)                                            \
    do {                                                                            \
        if ((level) <= atomic_load_explicit(&ferry_log_level, memory_order_relaxed)) \
            ferry_log_write((level), (component), __VA_ARGS__);                     \
    } while (0)

#endif
