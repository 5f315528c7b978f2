/* Recording a failure: the code is returned, the detail kept per thread. */
#ifndef FERRY_FAIL_H
#define FERRY_FAIL_H

#include <ferry/error.h>

/* Sets the calling thread's last error to code with a printf-style detail
 * and returns code, so that call sites read `return ferry_fail(...)`. */
int ferry_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends context ("write to peer X: ") to the thread's current detail,
 * keeping its code; returns that code. */
int ferry_fail_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Restores a detail saved from ferry_last_error_detail() with its code,
 * verbatim (for code that must make calls in between). */
void ferry_fail_restore(int code, const char *detail);

#endif
