/* Helpers the ferry subcommands share: clocks, CPU time, sizes, JSON lines. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include <jansson.h>

#include "util.h"

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    default: break;
    }
    if (*end == 'i' && end[1] == 'B') end += 2;
    else if (*end == 'B') end++;
    if (*end) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

void fmt_size(size_t n, char *out, size_t cap)
{
    if (n >= (1u << 30) && n % (1u << 30) == 0) snprintf(out, cap, "%zu GiB", n >> 30);
    else if (n >= (1u << 20) && n % (1u << 20) == 0) snprintf(out, cap, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0) snprintf(out, cap, "%zu KiB", n >> 10);
    else snprintf(out, cap, "%zu B", n);
}

/* Prints obj (consumed) as one compact JSON line on stdout. */
void print_json_line(json_t *obj)
{
    json_dumpf(obj, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(obj);
    printf("\n");
}

double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
