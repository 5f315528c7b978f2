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
/* "4096", "64K", "1M", "2GiB", "1.5MB": bytes; 0 and *out, or -1. */
int parse_size(const char *s, size_t *out);
/* n as "1 MiB" when it is a whole number of KiB, MiB or GiB, else "n B". */
void fmt_size(size_t n, char *out, size_t cap);
/* Prints obj (consumed) as one compact JSON line on stdout. */
void print_json_line(json_t *obj);

#endif
