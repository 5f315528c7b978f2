/* ferry serve: an engine that registers one remote-accessible buffer and
 * serves peers until stopped; prints one JSON line with its name and buffer. */
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include <ferry/ferry.h>

#include "cli.h"
#include "opts.h"
#include "util.h"

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
    static const struct option options[] = {
        {"host", required_argument, NULL, 'H'},     {"port", required_argument, NULL, 'p'},
        {"size", required_argument, NULL, 's'},     {"duration", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    long mib = 64, duration = -1, port = cfg.port;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'H': cfg.host = optarg; break;
        case 'p': if (opt_long("serve", "port", optarg, 0, 65535, &port)) return 2; break;
        case 's': if (opt_long("serve", "size", optarg, 1, 1L << 20, &mib)) return 2; break;
        case 'd': if (opt_long("serve", "duration", optarg, 0, 86400L * 365, &duration)) return 2; break;
        case 'h': return usage(stdout, 0);
        default: return usage(stderr, 2);
        }
    }
    if (opt_none_left("serve", argc, argv) != 0) return usage(stderr, 2);
    cfg.port = (uint16_t)port;
    ferry_engine_t *e;
    if (ferry_engine_create(&cfg, &e) != 0) {
        fprintf(stderr, "ferry serve: %s\n", ferry_last_error_detail());
        return 1;
    }
    size_t len = (size_t)mib << 20;
    unsigned char *buf = calloc(1, len);
    if (!buf || ferry_register(e, buf, len, FERRY_MEM_REMOTE) != 0) {
        fprintf(stderr, "ferry serve: %s\n", buf ? ferry_last_error_detail() : "out of memory");
        ferry_engine_destroy(e);
        free(buf);
        return 1;
    }
    char epoch[32];
    snprintf(epoch, sizeof epoch, "%016llx", (unsigned long long)ferry_engine_epoch(e));
    json_t *line = json_pack("{s:s,s:I,s:I,s:s}", "name", ferry_engine_name(e), "addr",
                             (json_int_t)(uintptr_t)buf, "len", (json_int_t)len, "epoch", epoch);
    print_json_line(line);
    fflush(stdout);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    for (long waited = 0; !stop_requested && (duration < 0 || waited < duration * 10); waited++) usleep(100000);
    ferry_engine_destroy(e);
    free(buf);
    return 0;
}

FERRY_COMMAND("serve", cmd_serve, "serve a registered buffer to peers (a target for tests and benchmarks)")
