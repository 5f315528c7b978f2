/* ferry doctor host:port: connects to a peer and reports what a user needs
 * to know when transfers to it fail: reachability, protocol, epoch,
 * transport and why, segments, round trip, a small bandwidth probe. Every
 * failure is explained with the texts of `ferry explain`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ferry/ferry.h>

#include "cli.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int explain_failure(const char *step, int rc)
{
    printf("FAIL  %s\n      %s\n", step, ferry_last_error_detail());
    printf("      %s (%d): %s; %s\n", ferry_error_name(rc), rc, ferry_strerror(rc),
           ferry_error_retryable(rc) ? "retryable" : "not retryable");
    const char *advice = ferry_error_advice(rc);
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

static int check_rtt(ferry_engine_t *e, const char *peer)
{
    uint64_t rtt[21];
    for (int i = 0; i < 21; i++) {
        int rc = ferry_session_ping(e, peer, &rtt[i]);
        if (rc) return explain_failure("round trip (ping)", rc);
    }
    qsort(rtt, 21, sizeof rtt[0], cmp_u64);
    printf("ok    round trip: min %llu us, median %llu us, max %llu us (21 pings, blocking waits)\n",
           (unsigned long long)rtt[0], (unsigned long long)rtt[10], (unsigned long long)rtt[20]);
    return 0;
}

static int probe_bandwidth(ferry_engine_t *e, const char *peer, const ferry_segment_t *segs, long n, size_t probe)
{
    const ferry_segment_t *best = NULL;
    for (long i = 0; i < n; i++)
        if ((segs[i].flags & FERRY_MEM_REMOTE_READ) && (!best || segs[i].len > best->len)) best = &segs[i];
    if (!best) {
        printf("skip  bandwidth probe: the peer exports no remote-readable segment\n");
        return 0;
    }
    size_t len = best->len < probe ? (size_t)best->len : probe;
    unsigned char *buf = malloc(len);
    if (!buf || ferry_register(e, buf, len, FERRY_MEM_LOCAL) != 0) {
        free(buf);
        printf("skip  bandwidth probe: cannot allocate %zu bytes\n", len);
        return 0;
    }
    int rounds = 4, rc = 0;
    double t0 = now_s();
    for (int i = 0; i < rounds && rc == 0; i++) rc = ferry_transfer_sync(e, peer, FERRY_OP_READ, buf, best->addr, len);
    double dt = now_s() - t0;
    ferry_deregister(e, buf);
    free(buf);
    if (rc) return explain_failure("bandwidth probe (read)", rc);
    printf("ok    bandwidth probe: read %d x %.1f MiB from [0x%llx+%llu) at %.2f GB/s (reads never modify the peer)\n",
           rounds, (double)len / (1 << 20), (unsigned long long)best->addr, (unsigned long long)best->len,
           (double)len * rounds / dt / 1e9);
    return 0;
}

static int usage(FILE *out, int rc)
{
    fprintf(out, "usage: ferry doctor HOST:PORT [--timeout MS] [--probe-mib N]\n"
                 "Checks a peer step by step and explains each failure. Exit 0 when all checks pass.\n");
    return rc;
}

static int cmd_doctor(int argc, char **argv)
{
    const char *peer = NULL;
    int timeout = 3000;
    size_t probe = 16u << 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) return usage(stdout, 0);
        if (!strcmp(argv[i], "--timeout") && i + 1 < argc) timeout = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--probe-mib") && i + 1 < argc) probe = (size_t)atol(argv[++i]) << 20;
        else if (!peer && argv[i][0] != '-') peer = argv[i];
        else return usage(stderr, 2);
    }
    if (!peer || timeout <= 0) return usage(stderr, 2);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    if (ferry_config_from_env(&cfg) != 0) return explain_failure("configuration from FERRY_* variables", ferry_last_error_code());
    cfg.port = 0;
    cfg.timeout_ms = timeout;
    cfg.connect_timeout_ms = timeout;
    cfg.retries = 0; /* report the first failure as it is */
    ferry_engine_t *e;
    int rc = ferry_engine_create(&cfg, &e);
    if (rc) return explain_failure("local engine", rc);
    printf("ferry doctor %s -> %s\n", ferry_engine_name(e), peer);
    int failed = 0;
    double t0 = now_s();
    rc = ferry_session_open(e, peer);
    if (rc) {
        failed = explain_failure("connect and handshake", rc);
        ferry_engine_destroy(e);
        return failed;
    }
    printf("ok    reachable: connected and handshaked in %.1f ms\n", (now_s() - t0) * 1e3);
    ferry_peer_info_t info;
    if ((rc = ferry_session_info(e, peer, &info)) != 0) {
        failed |= explain_failure("session info", rc);
    } else {
        printf("ok    protocol %u (ours %d), engine id %016llx, epoch %016llx, pid %d, %s\n", info.protocol_version,
               FERRY_PROTOCOL_VERSION, (unsigned long long)info.engine_id, (unsigned long long)info.epoch, info.pid,
               info.same_host ? "same host" : "another host");
        printf("ok    transport: %s (%s)\n", info.transport, info.transport_reason);
    }
    ferry_segment_t segs[16];
    long n = ferry_session_segments(e, peer, segs, 16);
    if (n < 0) {
        failed |= explain_failure("segment table", (int)n);
    } else {
        printf("ok    segments: %ld remote-accessible region%s (segment version %llu)\n", n, n == 1 ? "" : "s",
               (unsigned long long)info.segment_version);
        for (long i = 0; i < n && i < 16; i++)
            printf("        [0x%llx+%llu) %s gen %u\n", (unsigned long long)segs[i].addr,
                   (unsigned long long)segs[i].len, flags_text(segs[i].flags), segs[i].generation);
        if (n > 16) printf("        ... %ld more\n", n - 16);
    }
    failed |= check_rtt(e, peer);
    if (n > 0) failed |= probe_bandwidth(e, peer, segs, n < 16 ? n : 16, probe);
    printf("%s\n", failed ? "doctor: problems found (see FAIL lines)" : "doctor: all checks passed");
    ferry_engine_destroy(e);
    return failed;
}

FERRY_COMMAND("doctor", cmd_doctor, "check a peer step by step and explain what fails")
