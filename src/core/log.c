#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

_Atomic int ferry_log_level = FERRY_LOG_WARN;

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

void ferry_log_write(int level, const char *component, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (level < 0) level = 0;
    if (level > 4) level = 4;
    /* One fprintf so that lines from several threads do not interleave. */
    fprintf(stderr, "ferry %s %lld.%03ld %d %s: %s\n", level_names[level], (long long)ts.tv_sec,
            ts.tv_nsec / 1000000, (int)getpid(), component, msg);
}
