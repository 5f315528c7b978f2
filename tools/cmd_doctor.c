/* SPDX-License-Identifier: Apache-2.0 */
/* ferry doctor host:port: connects to a peer and reports what a user needs
 * to know when transfers to it fail: reachability, protocol, epoch,
 * transport and why, segments, round trip, a small bandwidth probe. Every
 * failure is explained with the texts of `ferry explain`. With --json the
 * same report is one JSON object on stdout (keys below, in report_*). */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include <ferry/ferry.h>

#include "cli.h"
#include "opts.h"
#include "util.h"

/* The report: lines of text, or the "checks" array of a JSON object. */
struct report {
    json_t *root;   /* NULL: text */
    json_t *checks;
    int failed;
};

/* One check's entry: {"check": name, "status": status, "message": text, ...data};
 * data (may be NULL) is consumed. */
static void report_add(struct report *r, const char *name, const char *status, json_t *data, const char *text)
{
    json_t *c = json_pack("{s:s,s:s,s:s}", "check", name, "status", status, "message", text);
    if (data) json_object_update(c, data);
    json_decref(data);
    json_array_append_new(r->checks, c);
}

/* A passed check: "ok    <text>" or a JSON entry carrying data (owned). */
static void report_ok(struct report *r, const char *name, json_t *data, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void report_ok(struct report *r, const char *name, json_t *data, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (!r->root) {
        printf("ok    %s\n", text);
        json_decref(data);
        return;
    }
    report_add(r, name, "ok", data, text);
}

static void report_skip(struct report *r, const char *name, const char *text)
{
    if (!r->root) printf("skip  %s\n", text);
    else report_add(r, name, "skip", NULL, text);
}

static void report_note(struct report *r, const char *name, json_t *data, const char *text)
{
    if (!r->root) {
        printf("note  %s\n", text);
        json_decref(data);
        return;
    }
    report_add(r, name, "note", data, text);
}

/* A failed step, explained with the code's meaning, retry verdict and
 * advice. Returns 1 (for `failed |= ...`). */
static int report_fail(struct report *r, const char *name, const char *step, int rc)
{
    r->failed = 1;
    const char *advice = ferry_error_advice(rc);
    if (r->root) {
        json_t *c = json_object();
        json_object_set_new(c, "step", json_string(step));
        json_object_set_new(c, "code", json_integer(rc));
        json_object_set_new(c, "error", json_string(ferry_error_name(rc)));
        json_object_set_new(c, "meaning", json_string(ferry_strerror(rc)));
        json_object_set_new(c, "retryable", json_boolean(ferry_error_retryable(rc)));
        json_object_set_new(c, "advice", json_string(advice));
        /* The first failure is also the report's "error", the object
         * `ferry bench --json` prints on failure. */
        if (!json_object_get(r->root, "error"))
            json_object_set_new(r->root, "error", json_error_value(rc, ferry_last_error_detail()));
        report_add(r, name, "fail", c, ferry_last_error_detail());
        return 1;
    }
    printf("FAIL  %s\n      %s\n", step, ferry_last_error_detail());
    printf("      %s (%d): %s; %s\n", ferry_error_name(rc), rc, ferry_strerror(rc),
           ferry_error_retryable(rc) ? "retryable" : "not retryable");
    for (const char *line = advice; *line;) {
        const char *nl = strchr(line, '\n');
        int n = nl ? (int)(nl - line) : (int)strlen(line);
        printf("      %.*s\n", n, line);
        line += n + (nl ? 1 : 0);
    }
    return 1;
}

static const char *flags_text(uint32_t f)
{
    return (f & FERRY_MEM_REMOTE) == FERRY_MEM_REMOTE ? "rw" : (f & FERRY_MEM_REMOTE_READ) ? "r-" : "-w";
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int check_rtt(struct report *r, ferry_engine_t *e, const char *peer)
{
    uint64_t rtt[21];
    for (int i = 0; i < 21; i++) {
        int rc = ferry_session_ping(e, peer, &rtt[i]);
        if (rc) return report_fail(r, "rtt", "round trip (ping)", rc);
    }
    qsort(rtt, 21, sizeof rtt[0], cmp_u64);
    report_ok(r, "rtt",
              json_pack("{s:I,s:I,s:I,s:i}", "min_us", (json_int_t)rtt[0], "median_us", (json_int_t)rtt[10],
                        "max_us", (json_int_t)rtt[20], "pings", 21),
              "round trip: min %llu us, median %llu us, max %llu us (21 pings, blocking waits)",
              (unsigned long long)rtt[0], (unsigned long long)rtt[10], (unsigned long long)rtt[20]);
    return 0;
}

static int probe_bandwidth(struct report *r, ferry_engine_t *e, const char *peer, const ferry_segment_t *segs,
                           long n, size_t probe)
{
    const ferry_segment_t *best = NULL;
    for (long i = 0; i < n; i++)
        if ((segs[i].flags & FERRY_MEM_REMOTE_READ) && (!best || segs[i].len > best->len)) best = &segs[i];
    if (!best) {
        report_skip(r, "bandwidth", "bandwidth probe: the peer exports no remote-readable segment");
        return 0;
    }
    size_t len = best->len < probe ? (size_t)best->len : probe;
    unsigned char *buf = malloc(len);
    if (!buf || ferry_register(e, buf, len, FERRY_MEM_LOCAL) != 0) {
        free(buf);
        char text[128];
        snprintf(text, sizeof text, "bandwidth probe: cannot allocate %zu bytes", len);
        report_skip(r, "bandwidth", text);
        return 0;
    }
    int rounds = 4, rc = 0;
    double t0 = now_s();
    for (int i = 0; i < rounds && rc == 0; i++) rc = ferry_transfer_sync(e, peer, FERRY_OP_READ, buf, best->addr, len);
    double dt = now_s() - t0;
    ferry_deregister(e, buf);
    free(buf);
    if (rc) return report_fail(r, "bandwidth", "bandwidth probe (read)", rc);
    double gbps = (double)len * rounds / dt / 1e9;
    report_ok(r, "bandwidth",
              json_pack("{s:s,s:I,s:I,s:i,s:f}", "opcode", "read", "addr", (json_int_t)best->addr, "bytes",
                        (json_int_t)len, "rounds", rounds, "gb_per_s", gbps),
              "bandwidth probe: read %d x %.1f MiB from [0x%llx+%llu) at %.2f GB/s (reads never modify the peer)",
              rounds, (double)len / (1 << 20), (unsigned long long)best->addr, (unsigned long long)best->len, gbps);
    return 0;
}

static json_t *session_json(const ferry_peer_info_t *info)
{
    char id[32], epoch[32];
    snprintf(id, sizeof id, "%016llx", (unsigned long long)info->engine_id);
    snprintf(epoch, sizeof epoch, "%016llx", (unsigned long long)info->epoch);
    return json_pack("{s:i,s:i,s:s,s:s,s:i,s:b,s:s,s:s,s:I}", "protocol_version", (int)info->protocol_version,
                     "our_protocol_version", FERRY_PROTOCOL_VERSION, "engine_id", id, "epoch", epoch, "pid",
                     (int)info->pid, "same_host", info->same_host, "transport", info->transport,
                     "transport_reason", info->transport_reason, "segment_version",
                     (json_int_t)info->segment_version);
}

static int check_segments(struct report *r, ferry_engine_t *e, const char *peer, const ferry_peer_info_t *info,
                          ferry_segment_t *segs, long *count)
{
    long n = ferry_session_segments(e, peer, segs, 16);
    *count = n;
    if (n < 0) return report_fail(r, "segments", "segment table", (int)n);
    if (r->root) {
        json_t *list = json_array();
        for (long i = 0; i < n && i < 16; i++)
            json_array_append_new(list, json_pack("{s:I,s:I,s:s,s:i}", "addr", (json_int_t)segs[i].addr, "len",
                                                  (json_int_t)segs[i].len, "flags", flags_text(segs[i].flags),
                                                  "generation", (int)segs[i].generation));
        report_ok(r, "segments",
                  json_pack("{s:I,s:I,s:o}", "count", (json_int_t)n, "segment_version",
                            (json_int_t)info->segment_version, "listed", list),
                  "segments: %ld remote-accessible region%s", n, n == 1 ? "" : "s");
        return 0;
    }
    printf("ok    segments: %ld remote-accessible region%s (segment version %llu)\n", n, n == 1 ? "" : "s",
           (unsigned long long)info->segment_version);
    for (long i = 0; i < n && i < 16; i++)
        printf("        [0x%llx+%llu) %s gen %u\n", (unsigned long long)segs[i].addr,
               (unsigned long long)segs[i].len, flags_text(segs[i].flags), segs[i].generation);
    if (n > 16) printf("        ... %ld more\n", n - 16);
    return 0;
}

/* The checks against peer, through the engine e. */
static void diagnose(struct report *r, ferry_engine_t *e, const char *peer, size_t probe)
{
    double t0 = now_s();
    int rc = ferry_session_open(e, peer);
    if (rc) {
        report_fail(r, "connect", "connect and handshake", rc);
        return;
    }
    double ms = (now_s() - t0) * 1e3;
    report_ok(r, "connect", json_pack("{s:f}", "ms", ms), "reachable: connected and handshaked in %.1f ms", ms);
    ferry_peer_info_t info;
    memset(&info, 0, sizeof info);
    if ((rc = ferry_session_info(e, peer, &info)) != 0) {
        report_fail(r, "session", "session info", rc);
    } else {
        report_ok(r, "session", session_json(&info),
                  "protocol %u (ours %d), engine id %016llx, epoch %016llx, pid %d, %s", info.protocol_version,
                  FERRY_PROTOCOL_VERSION, (unsigned long long)info.engine_id, (unsigned long long)info.epoch,
                  info.pid, info.same_host ? "same host" : "another host");
        char reason[400];
        int cut = fmt_transport_reason(info.transport_reason, sizeof info.transport_reason, reason, sizeof reason);
        report_ok(r, "transport",
                  json_pack("{s:s,s:s,s:b}", "transport", info.transport, "reason", info.transport_reason, "reason_cut",
                            cut),
                  "transport: %s (%s)", info.transport, reason);
    }
    ferry_segment_t segs[16];
    long n = 0;
    check_segments(r, e, peer, &info, segs, &n);
    check_rtt(r, e, peer);
    if (n > 0) probe_bandwidth(r, e, peer, segs, n < 16 ? n : 16, probe);
    /* The first transfers may have moved the session off shm (the target
     * refused cross-memory attach): say so. */
    ferry_peer_info_t after;
    if (ferry_session_info(e, peer, &after) == 0 && strcmp(after.transport, info.transport) != 0) {
        char text[512], reason[400];
        fmt_transport_reason(after.transport_reason, sizeof after.transport_reason, reason, sizeof reason);
        snprintf(text, sizeof text, "transport after the probe: %s (%s)", after.transport, reason);
        report_note(r, "transport_after", json_pack("{s:s,s:s}", "transport", after.transport, "reason",
                                                    after.transport_reason), text);
    }
}

static int usage(FILE *out, int rc)
{
    fprintf(out, "usage: ferry doctor HOST:PORT [--timeout MS] [--probe-mib N] [--json]\n"
                 "Checks a peer step by step and explains each failure. Exit 0 when all checks pass,\n"
                 "1 when one failed, 2 on bad usage.\n"
                 "  --timeout MS    connect, handshake and request deadline (default 3000)\n"
                 "  --probe-mib N   bytes the bandwidth probe reads, in MiB (default 16)\n"
                 "  --json          one JSON object on stdout: {\"local\", \"peer\", \"ok\", \"checks\": [\n"
                 "                  {\"check\", \"status\": ok|fail|skip|note, \"message\", ...}]}; a failed\n"
                 "                  check adds step, code, error, meaning, retryable and advice, and the report\n"
                 "                  \"error\": {\"code\", \"name\", \"detail\"} of the first; bad usage prints that\n"
                 "                  {\"error\"} object alone\n");
    return rc;
}

struct doctor_opts {
    long timeout, probe_mib;
    int json, help;
    const char *peer;
};

static int parse_doctor(int argc, char **argv, int first, void *opts)
{
    struct doctor_opts *o = opts;
    static const struct option options[] = {
        {"timeout", required_argument, NULL, 't'}, {"probe-mib", required_argument, NULL, 'p'},
        {"json", no_argument, NULL, 'j'},          {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    optind = first;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
        case 't': if (opt_long("doctor", "timeout", optarg, 1, 3600000, &o->timeout)) return 2; break;
        case 'p': if (opt_long("doctor", "probe-mib", optarg, 1, 1 << 20, &o->probe_mib)) return 2; break;
        case 'j': o->json = 1; break;
        case 'h': o->help = 1; return 0;
        default: return usage(stderr, 2);
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "ferry doctor: give one peer, HOST:PORT\n");
        return usage(stderr, 2);
    }
    o->peer = argv[optind];
    return 0;
}

static int cmd_doctor(int argc, char **argv)
{
    struct doctor_opts o = {.timeout = 3000, .probe_mib = 16};
    /* With --json, bad usage is the {"error"} object too. */
    int rc = parse_json_aware(args_have(argc, argv, 1, "--json"), parse_doctor, argc, argv, 1, &o);
    if (rc) return rc;
    if (o.help) return usage(stdout, 0);
    long timeout = o.timeout, probe_mib = o.probe_mib;
    int json = o.json;
    const char *peer = o.peer;

    struct report r = {0};
    if (json) {
        r.root = json_object();
        r.checks = json_array();
        json_object_set_new(r.root, "peer", json_string(peer));
        json_object_set_new(r.root, "local", json_null()); /* set below, in this place */
        json_object_set_new(r.root, "ok", json_false());
        json_object_set_new(r.root, "checks", r.checks); /* the root owns it; r.checks stays usable */
    }
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    ferry_engine_t *e = NULL;
    rc = ferry_config_from_env(&cfg);
    if (rc) {
        report_fail(&r, "local", "configuration from FERRY_* variables", rc);
    } else {
        cfg.port = 0;
        cfg.timeout_ms = (int)timeout;
        cfg.connect_timeout_ms = (int)timeout;
        cfg.retries = 0; /* report the first failure as it is */
        rc = ferry_engine_create(&cfg, &e);
        if (rc) report_fail(&r, "local", "local engine", rc);
    }
    if (e) {
        if (r.root) json_object_set_new(r.root, "local", json_string(ferry_engine_name(e)));
        else printf("ferry doctor %s -> %s\n", ferry_engine_name(e), peer);
        diagnose(&r, e, peer, (size_t)probe_mib << 20);
        ferry_engine_destroy(e);
    }
    if (r.root) {
        json_object_set_new(r.root, "ok", json_boolean(!r.failed));
        json_dumpf(r.root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
        printf("\n");
        json_decref(r.root);
    } else if (e) {
        printf("%s\n", r.failed ? "doctor: problems found (see FAIL lines)" : "doctor: all checks passed");
    }
    return r.failed;
}

FERRY_COMMAND("doctor", cmd_doctor, "check a peer step by step and explain what fails")
