/* SPDX-License-Identifier: Apache-2.0 */
/* Monotonic time and deadlines, in nanoseconds. */
#ifndef FERRY_CLOCK_H
#define FERRY_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t ferry_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A deadline timeout_ms from now; timeout_ms < 0 means never. */
static inline uint64_t ferry_deadline_after_ms(int timeout_ms)
{
    if (timeout_ms < 0) return UINT64_MAX;
    return ferry_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

/* Milliseconds left until deadline, for poll(): 0 when passed, -1 never. */
static inline int ferry_ms_left(uint64_t deadline)
{
    if (deadline == UINT64_MAX) return -1;
    uint64_t now = ferry_now_ns();
    if (now >= deadline) return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

/* Absolute CLOCK_MONOTONIC timespec for pthread_cond_timedwait. */
static inline struct timespec ferry_deadline_timespec(uint64_t deadline)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline / 1000000000ull);
    ts.tv_nsec = (long)(deadline % 1000000000ull);
    return ts;
}

/* A condition variable whose timed waits use CLOCK_MONOTONIC deadlines
 * (ferry_deadline_timespec), immune to wall-clock jumps. */
static inline void ferry_cond_init_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &ca);
    pthread_condattr_destroy(&ca);
}

#endif
