/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers the ferry subcommands share (util.c). */
#ifndef FERRY_TOOLS_UTIL_H
#define FERRY_TOOLS_UTIL_H

#include <stddef.h>

#include <jansson.h>

/* Monotonic clock, seconds. */
double now_s(void);
/* This process's CPU time (user + system), seconds. */
double self_cpu_s(void);
/* qsort comparator for doubles, ascending. */
int cmp_double(const void *a, const void *b);
/* "4096", "64K", "1M", "2GiB", "1.5MB": bytes; 0 and *out, or -1 (also for
 * nan, inf, negative and anything over 2^50). */
int parse_size(const char *s, size_t *out);
/* n as "1 MiB" when it is a whole number of KiB, MiB or GiB, else "n B". */
void fmt_size(size_t n, char *out, size_t cap);
/* Prints obj (consumed) as one compact JSON line on stdout. */
void print_json_line(json_t *obj);
/* A failure under --json: {"error": {"code": -400, "name": "TIMEOUT",
 * "detail": "..."}} as one line on stdout (iperf3 prints {"error": ...}). */
void print_json_error(int code, const char *detail);

/* A session's transport reason for people: the peer-info field holds 127
 * bytes, so a reason that fills it was cut; such a one is cut back to a
 * word, ends with "...", and says where the whole text is. Returns 1 when
 * it was cut. */
int fmt_transport_reason(const char *reason, size_t field_size, char *out, size_t cap);

struct ferry_engine;
/* The line `ferry serve` and `ferry bench target` print once they serve, to
 * fd: {"name","addr","len","pid","epoch","port","metrics_port"} (metrics_port
 * null when off). 0, or -1 when it cannot be written. */
int write_ready_line(int fd, struct ferry_engine *e, const void *buf, size_t len);
/* The same for people, on stderr: where it listens, how big, how to stop. */
void print_listening(const char *cmd, struct ferry_engine *e, size_t len);

#endif
