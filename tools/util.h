/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers the ferry subcommands share (util.c). */
#ifndef FERRY_TOOLS_UTIL_H
#define FERRY_TOOLS_UTIL_H

#include <stdarg.h>
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
/* The same object, {"code", "name", "detail"}, as a JSON value (for a
 * report that carries it as its "error" member). */
json_t *json_error_value(int code, const char *detail);
/* A subcommand's failure: "ferry CMD: detail" on stderr and, with json,
 * print_json_error(code, detail) on stdout. Returns status (the exit
 * status to give). */
int cli_fail(const char *cmd, int json, int status, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int cli_vfail(const char *cmd, int json, int status, int code, const char *fmt, va_list ap);
/* Whether word is one of argv[first], ..., argv[argc - 1]. */
int args_have(int argc, char **argv, int first, const char *word);
/* An option parser: 0, or non-zero (the exit status) after saying on
 * stderr what is wrong. */
typedef int (*cli_parse_fn)(int argc, char **argv, int first, void *opts);
/* parse(argc, argv, first, opts); with json, what it says on stderr is
 * held (stderr may be assigned in glibc: getopt's own messages are caught
 * too), passed on to stderr, and on failure its first line becomes the
 * detail of an INVALID_ARGUMENT {"error"} object on stdout. Returns what
 * parse returned. */
int parse_json_aware(int json, cli_parse_fn parse, int argc, char **argv, int first, void *opts);

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
