/* SPDX-License-Identifier: Apache-2.0 */
/* ferry_log_set_handler: library messages reach the application's handler
 * (level, component, message, ctx) instead of stderr, from any thread; NULL
 * restores stderr; once a new handler is set the old one is never called. */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util/log.h"

struct seen {
    _Atomic int calls;
    int level;
    char component[32];
    char message[256];
};

static void record(int level, const char *component, const char *message, void *ctx)
{
    struct seen *s = ctx;
    if (atomic_fetch_add(&s->calls, 1) == 0) {
        s->level = level;
        snprintf(s->component, sizeof s->component, "%s", component);
        snprintf(s->message, sizeof s->message, "%s", message);
    }
}

/* Reads what fd 2 received while fn ran (a pipe stands in for stderr). */
static size_t stderr_bytes_during(void (*fn)(void))
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(p[1], 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    char buf[4096];
    size_t total = 0;
    ssize_t k;
    while ((k = read(p[0], buf, sizeof buf)) > 0) total += (size_t)k;
    close(p[0]);
    return total;
}

static void log_one_warning(void) { FERRY_LOG(FERRY_LOG_WARN, "unit", "disk %d of %d is full", 3, 4); }

static void handler_gets_level_component_message(void **state)
{
    (void)state;
    struct seen s = {0};
    assert_int_equal(ferry_log_set_handler(record, &s), 0);
    assert_int_equal(stderr_bytes_during(log_one_warning), 0); /* nothing on stderr */
    assert_int_equal(atomic_load(&s.calls), 1);
    assert_int_equal(s.level, FERRY_LOG_LEVEL_WARN);
    assert_string_equal(s.component, "unit");
    assert_string_equal(s.message, "disk 3 of 4 is full");
    /* Below the level filter (warn by default): not delivered. */
    FERRY_LOG(FERRY_LOG_TRACE, "unit", "too chatty");
    assert_int_equal(atomic_load(&s.calls), 1);
    /* NULL restores stderr, and the old handler is not called again. */
    assert_int_equal(ferry_log_set_handler(NULL, NULL), 0);
    assert_true(stderr_bytes_during(log_one_warning) > 0);
    assert_int_equal(atomic_load(&s.calls), 1);
}

/* Several threads log while the handler is swapped back and forth: every
 * message goes to exactly one of the two handlers, and none after both are
 * gone (the handler's ctx could be freed at that point). */
static _Atomic int keep_logging;

static void *logger_thread(void *arg)
{
    (void)arg;
    while (atomic_load(&keep_logging)) FERRY_LOG(FERRY_LOG_ERROR, "unit", "busy");
    return NULL;
}

static void swapped_under_load(void **state)
{
    (void)state;
    struct seen a = {0}, b = {0};
    ferry_log_set_handler(record, &a);
    atomic_store(&keep_logging, 1);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, logger_thread, NULL);
    /* Swap until both handlers have had messages (the threads take a
     * moment to start), 200 times at least. */
    for (int round = 0; round < 200 || !atomic_load(&a.calls) || !atomic_load(&b.calls); round++) {
        ferry_log_set_handler(record, round % 2 ? &a : &b);
        if (round >= 200) usleep(100);
    }
    /* Quiet the threads through a handler before they stop, so that no
     * message reaches stderr. */
    atomic_store(&keep_logging, 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    ferry_log_set_handler(NULL, NULL);
    int total = atomic_load(&a.calls) + atomic_load(&b.calls);
    FERRY_LOG(FERRY_LOG_DEBUG, "unit", "filtered out, and no handler");
    assert_int_equal(atomic_load(&a.calls) + atomic_load(&b.calls), total);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(handler_gets_level_component_message),
        cmocka_unit_test(swapped_under_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
