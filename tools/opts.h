/* SPDX-License-Identifier: Apache-2.0 */
/* Checked parsing of option values for the CLI's getopt_long loops:
 * a value that is not a whole number in range is an error naming the
 * option, never a silent 0 (what atoi gives). */
#ifndef FERRY_TOOLS_OPTS_H
#define FERRY_TOOLS_OPTS_H

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

/* 0 and *out, or -1 after telling stderr what is wrong with --opt's value. */
static inline int opt_long(const char *cmd, const char *opt, const char *arg, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < lo || v > hi) {
        fprintf(stderr, "ferry %s: --%s '%s' is not a whole number in [%ld, %ld]\n", cmd, opt, arg, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* The same for a fraction (--duration 0.5). */
static inline int opt_double(const char *cmd, const char *opt, const char *arg, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "ferry %s: --%s '%s' is not a number in [%g, %g]\n", cmd, opt, arg, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* An address or other unsigned 64-bit value, decimal or 0x-hex. */
static inline int opt_u64(const char *cmd, const char *opt, const char *arg, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 0);
    if (errno || end == arg || *end || arg[0] == '-') {
        fprintf(stderr, "ferry %s: --%s '%s' is not an unsigned number (decimal or 0x...)\n", cmd, opt, arg);
        return -1;
    }
    *out = v;
    return 0;
}

/* After the getopt_long loop: 0 when it took every argument, or -1 after
 * naming the first word it left (the commands take no positional ones). */
static inline int opt_none_left(const char *cmd, int argc, char **argv)
{
    if (optind >= argc) return 0;
    fprintf(stderr, "ferry %s: unexpected argument '%s'\n", cmd, argv[optind]);
    return -1;
}

#endif
