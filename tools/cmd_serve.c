/* ferry serve: an engine that registers one remote-accessible buffer and
 * serves peers until stopped; prints one JSON line with its name and buffer. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ferry/ferry.h>

#include "cli.h"

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static int usage(FILE *out, int rc)
{
    fprintf(out, "usage: ferry serve [--host H] [--port P] [--size MiB] [--duration S]\n"
                 "Registers a buffer of --size MiB (default 64) for remote read and write and serves\n"
                 "until SIGINT/SIGTERM or --duration seconds. Prints {\"name\":..,\"addr\":..,\"len\":..}.\n"
                 "Other settings come from FERRY_* environment variables (see README).\n");
    return rc;
}

static int cmd_serve(int argc, char **argv)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    if (ferry_config_from_env(&cfg) != 0) {
        fprintf(stderr, "ferry serve: %s\n", ferry_last_error_detail());
        return 1;
    }
    size_t mib = 64;
    long duration = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) return usage(stdout, 0);
        if (!v) return usage(stderr, 2);
        if (!strcmp(a, "--host")) cfg.host = v;
        else if (!strcmp(a, "--port")) cfg.port = (uint16_t)atoi(v);
        else if (!strcmp(a, "--size")) mib = (size_t)atol(v);
        else if (!strcmp(a, "--duration")) duration = atol(v);
        else return usage(stderr, 2);
        i++;
    }
    if (mib == 0) return usage(stderr, 2);
    ferry_engine_t *e;
    if (ferry_engine_create(&cfg, &e) != 0) {
        fprintf(stderr, "ferry serve: %s\n", ferry_last_error_detail());
        return 1;
    }
    size_t len = mib << 20;
    unsigned char *buf = calloc(1, len);
    if (!buf || ferry_register(e, buf, len, FERRY_MEM_REMOTE) != 0) {
        fprintf(stderr, "ferry serve: %s\n", buf ? ferry_last_error_detail() : "out of memory");
        ferry_engine_destroy(e);
        free(buf);
        return 1;
    }
    printf("{\"name\":\"%s\",\"addr\":%llu,\"len\":%zu,\"epoch\":\"%016llx\"}\n", ferry_engine_name(e),
           (unsigned long long)(uintptr_t)buf, len, (unsigned long long)ferry_engine_epoch(e));
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    for (long waited = 0; !stop_requested && (duration < 0 || waited < duration * 10); waited++) usleep(100000);
    ferry_engine_destroy(e);
    free(buf);
    return 0;
}

FERRY_COMMAND("serve", cmd_serve, "serve a registered buffer to peers (a target for tests and benchmarks)")
