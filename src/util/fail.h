/* SPDX-License-Identifier: Apache-2.0 */
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

/* The thread's current message without the "NAME (code): " prefix, for
 * saving a failure and raising it again later with ferry_fail(code, "%s", m). */
const char *ferry_fail_message(void);

#endif
