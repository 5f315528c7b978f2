/* SPDX-License-Identifier: Apache-2.0 */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <ferry/ferry.h>

_Atomic int ferry_log_level = FERRY_LOG_WARN;

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

/* The application's handler (ferry_log_set_handler). Messages hold the read
 * side while they call it, so that setting a new one (the write side) waits
 * for calls in flight: after ferry_log_set_handler returns, the old handler
 * and its ctx are never used again. */
static pthread_rwlock_t handler_lock = PTHREAD_RWLOCK_INITIALIZER;
static ferry_log_handler_t handler_fn;
static void *handler_ctx;

int ferry_log_set_handler(ferry_log_handler_t fn, void *ctx)
{
    pthread_rwlock_wrlock(&handler_lock);
    handler_fn = fn;
    handler_ctx = fn ? ctx : NULL;
    pthread_rwlock_unlock(&handler_lock);
    return 0;
}

void ferry_log_write(int level, const char *component, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (level < 0) level = 0;
    if (level > 4) level = 4;
    pthread_rwlock_rdlock(&handler_lock);
    if (handler_fn) {
        handler_fn(level, component, msg, handler_ctx);
        pthread_rwlock_unlock(&handler_lock);
        return;
    }
    pthread_rwlock_unlock(&handler_lock);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* One fprintf so that lines from several threads do not interleave. */
    fprintf(stderr, "ferry %s %lld.%03ld %d %s: %s\n", level_names[level], (long long)ts.tv_sec,
            ts.tv_nsec / 1000000, (int)getpid(), component, msg);
}
