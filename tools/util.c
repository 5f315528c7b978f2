/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers the ferry subcommands share: clocks, CPU time, sizes, JSON lines. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include <jansson.h>
#include <string.h>
#include <unistd.h>

#include <ferry/ferry.h>

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
    /* !(v >= 0) also refuses nan; inf and overflow fail the cap below. */
    if (errno || end == s || !(v >= 0)) return -1;
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
    /* Up to 2^50 (1 PiB): larger is no buffer size but a typo, and keeps the
     * conversion to size_t defined. */
    if (!(v * mul <= (double)((size_t)1 << 50))) return -1;
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

json_t *json_error_value(int code, const char *detail)
{
    return json_pack("{s:i,s:s,s:s}", "code", code, "name", ferry_error_name(code), "detail", detail ? detail : "");
}

void print_json_error(int code, const char *detail)
{
    print_json_line(json_pack("{s:o}", "error", json_error_value(code, detail)));
}

int cli_vfail(const char *cmd, int json, int status, int code, const char *fmt, va_list ap)
{
    char detail[1024];
    vsnprintf(detail, sizeof detail, fmt, ap);
    fprintf(stderr, "ferry %s: %s\n", cmd, detail);
    if (json) print_json_error(code, detail);
    return status;
}

int cli_fail(const char *cmd, int json, int status, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    status = cli_vfail(cmd, json, status, code, fmt, ap);
    va_end(ap);
    return status;
}

int args_have(int argc, char **argv, int first, const char *word)
{
    for (int i = first; i < argc; i++)
        if (strcmp(argv[i], word) == 0) return 1;
    return 0;
}

int parse_json_aware(int json, cli_parse_fn parse, int argc, char **argv, int first, void *opts)
{
    if (!json) return parse(argc, argv, first, opts);
    char *said = NULL;
    size_t n = 0;
    FILE *real = stderr, *mem = open_memstream(&said, &n);
    if (mem) stderr = mem;
    int rc = parse(argc, argv, first, opts);
    if (mem) {
        fclose(mem);
        stderr = real;
        fputs(said ? said : "", stderr);
    }
    if (rc) {
        char *line = said ? strtok(said, "\n") : NULL;
        print_json_error(FERRY_ERR_INVALID_ARGUMENT, line ? line : "bad options");
    }
    free(said);
    return rc;
}

int write_ready_line(int fd, struct ferry_engine *e, const void *buf, size_t len)
{
    char epoch[32];
    snprintf(epoch, sizeof epoch, "%016llx", (unsigned long long)ferry_engine_epoch(e));
    uint16_t mport = ferry_metrics_port(e);
    json_t *ready = json_pack("{s:s,s:I,s:I,s:i,s:s,s:i,s:o}", "name", ferry_engine_name(e), "addr",
                              (json_int_t)(uintptr_t)buf, "len", (json_int_t)len, "pid", (int)getpid(), "epoch", epoch,
                              "port", (int)ferry_engine_port(e), "metrics_port",
                              mport ? json_integer(mport) : json_null());
    char *line = json_dumps(ready, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(ready);
    if (!line) return -1;
    size_t n = strlen(line);
    int ok = write(fd, line, n) == (ssize_t)n && write(fd, "\n", 1) == 1;
    free(line);
    return ok ? 0 : -1;
}

void print_listening(const char *cmd, struct ferry_engine *e, size_t len)
{
    char size[32];
    fmt_size(len, size, sizeof size);
    const char *name = ferry_engine_name(e);
    fprintf(stderr, "ferry %s: serving %s on %s%s; initiators: ferry bench initiator --peer HOST:%u\n", cmd, size,
            name, strncmp(name, "0.0.0.0:", 8) == 0 || strncmp(name, "[::]:", 5) == 0 ? " (all interfaces)" : "",
            (unsigned)ferry_engine_port(e));
    uint16_t mport = ferry_metrics_port(e);
    if (mport) fprintf(stderr, "ferry %s: Prometheus metrics on port %u (GET /metrics)\n", cmd, (unsigned)mport);
    fprintf(stderr, "ferry %s: Ctrl-C stops it\n", cmd);
}

int fmt_transport_reason(const char *reason, size_t field_size, char *out, size_t cap)
{
    size_t n = strlen(reason);
    if (n + 1 < field_size) {
        snprintf(out, cap, "%s", reason);
        return 0;
    }
    size_t keep = n;
    while (keep > 0 && reason[keep] != ' ') keep--; /* back to the last whole word */
    while (keep > 0 && (reason[keep - 1] == ' ' || reason[keep - 1] == ';' || reason[keep - 1] == ',')) keep--;
    snprintf(out, cap, "%.*s ... [cut at the %zu-byte peer-info field; `ferry info` shows each transport's whole "
             "reason on this host, FERRY_LOG=2 logs it]", (int)keep, reason, field_size);
    return 1;
}
