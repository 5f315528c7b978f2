/* SPDX-License-Identifier: Apache-2.0 */
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

#include "bench.h"
#include "cli.h"
#include "opts.h"
#include "util.h"

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) { (void)sig; stop_requested = 1; }

static int usage(FILE *out, int rc)
{
    fprintf(out,
            "usage: ferry serve [--bind ADDR] [--port P] [--buffer-size S] [--duration SEC]\n"
            "Registers a buffer for remote read and write and serves peers until SIGINT/SIGTERM\n"
            "or --duration seconds, as `ferry bench target` does, with the same options and line:\n"
            "  --bind ADDR        address to listen on (0.0.0.0: every interface; --host is the same)\n"
            "  --port P           port (%d, as `ferry bench target`; 0: any free port)\n"
            "  --buffer-size S    bytes, K/M/G suffixes (64M); --size MiB is the older spelling\n"
            "  --duration SEC     serve this long (until stopped)\n"
            "Prints one JSON line {\"name\",\"addr\",\"len\",\"pid\",\"epoch\",\"port\",\"metrics_port\"}\n"
            "(on failure, bad usage included, {\"error\": {\"code\",\"name\",\"detail\"}} instead)\n"
            "once it serves (metrics_port: the Prometheus port, FERRY_METRICS_PORT=-1 picks a free one;\n"
            "null when off), and where it listens on stderr. Other settings come from FERRY_*\n"
            "environment variables (see README).\n",
            FERRY_BENCH_DEFAULT_PORT);
    return rc;
}

struct serve_opts {
    const char *host;
    long port, mib;
    size_t len;
    double duration;
    int help;
};

static int parse_serve(int argc, char **argv, int first, void *opts)
{
    struct serve_opts *o = opts;
    static const struct option options[] = {
        {"host", required_argument, NULL, 'H'},     {"bind", required_argument, NULL, 'H'},
        {"port", required_argument, NULL, 'p'},     {"size", required_argument, NULL, 's'},
        {"buffer-size", required_argument, NULL, 'b'}, {"duration", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    int opt;
    optind = first;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case 'H': o->host = optarg; break;
        case 'p': if (opt_long("serve", "port", optarg, 0, 65535, &o->port)) return 2; break;
        case 's': if (opt_long("serve", "size", optarg, 1, 1L << 20, &o->mib)) return 2; break;
        case 'b':
            if (parse_size(optarg, &o->len) != 0 || o->len == 0) {
                fprintf(stderr, "ferry serve: --buffer-size '%s' is not a size: a positive number of bytes, with an "
                                "optional K, M or G suffix (64M)\n", optarg);
                return 2;
            }
            break;
        case 'd': if (opt_double("serve", "duration", optarg, 0, 86400.0 * 365, &o->duration)) return 2; break;
        case 'h': o->help = 1; return 0;
        default: return usage(stderr, 2);
        }
    }
    if (opt_none_left("serve", argc, argv) != 0) return usage(stderr, 2);
    return 0;
}

/* Its stdout is JSON lines: the ready line, or on failure (bad usage
 * included) the {"error"} object `ferry bench --json` prints. */
static int cmd_serve(int argc, char **argv)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    if (ferry_config_from_env(&cfg) != 0)
        return cli_fail("serve", 1, 1, ferry_last_error_code(), "%s", ferry_last_error_detail());
    struct serve_opts o = {.mib = 64, .port = getenv("FERRY_PORT") ? cfg.port : FERRY_BENCH_DEFAULT_PORT,
                           .duration = -1};
    int rc = parse_json_aware(1, parse_serve, argc, argv, 1, &o);
    if (rc) return rc;
    if (o.help) return usage(stdout, 0);
    /* Every interface unless --bind or FERRY_HOST says otherwise. */
    cfg.host = o.host ? o.host : getenv("FERRY_HOST") ? cfg.host : "0.0.0.0";
    cfg.port = (uint16_t)o.port;
    size_t len = o.len ? o.len : (size_t)o.mib << 20;
    ferry_engine_t *e;
    if (ferry_engine_create(&cfg, &e) != 0)
        return cli_fail("serve", 1, 1, ferry_last_error_code(), "%s", ferry_last_error_detail());
    unsigned char *buf = calloc(1, len);
    if (!buf || ferry_register(e, buf, len, FERRY_MEM_REMOTE) != 0) {
        rc = buf ? cli_fail("serve", 1, 1, ferry_last_error_code(), "%s", ferry_last_error_detail())
                 : cli_fail("serve", 1, 1, FERRY_ERR_MEMORY, "out of memory for a %zu-byte buffer", len);
        ferry_engine_destroy(e);
        free(buf);
        return rc;
    }
    fflush(stdout);
    if (write_ready_line(STDOUT_FILENO, e, buf, len) != 0) {
        ferry_engine_destroy(e);
        free(buf);
        return 1;
    }
    print_listening("serve", e, len);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    double end = o.duration >= 0 ? now_s() + o.duration : 0;
    while (!stop_requested && (end == 0 || now_s() < end)) usleep(50000);
    ferry_engine_destroy(e);
    free(buf);
    return 0;
}

FERRY_COMMAND("serve", cmd_serve, "serve a registered buffer to peers (as `bench target`, on every interface, port 7070)")
