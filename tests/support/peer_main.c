/* ferry_test_peer: a target engine in its own process, for tests that kill,
 * stop or restart it, or run it in another network namespace.
 *
 *   ferry_test_peer [--host H] [--port P] [--len N] [--at ADDR] [--secret S]
 *                   [--timeout MS] [--keepalive MS]
 *
 * Registers one remote-accessible buffer of N bytes (at ADDR if that address
 * is free, else anywhere), prints "READY port addr len epoch" and serves.
 * Commands on stdin, one a line, each answered by a line starting OK or BAD:
 *   fill SEED | check SEED OFF LEN | zero | iszero OFF LEN | dereg | reg |
 *   threads | sockets (answer "OK n") | quit
 * It exits when stdin closes or its parent dies. */
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "harness.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

static void sync_with_engine(ferry_engine_t *e, void *buf)
{
    if (ferry_register(e, buf, 1, FERRY_MEM_LOCAL) == 0) ferry_deregister(e, buf);
}

int main(int argc, char **argv)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 10000;
    cfg.connect_timeout_ms = 5000;
    size_t len = 1u << 20;
    uintptr_t at = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--host")) cfg.host = v;
        else if (!strcmp(k, "--port")) cfg.port = (uint16_t)atoi(v);
        else if (!strcmp(k, "--len")) len = strtoull(v, NULL, 0);
        else if (!strcmp(k, "--at")) at = (uintptr_t)strtoull(v, NULL, 0);
        else if (!strcmp(k, "--secret")) cfg.secret = v;
        else if (!strcmp(k, "--timeout")) cfg.timeout_ms = atoi(v);
        else if (!strcmp(k, "--keepalive")) cfg.keepalive_ms = atoi(v);
        else {
            fprintf(stderr, "ferry_test_peer: unknown option %s\n", k);
            return 2;
        }
    }
    ferry_engine_t *e;
    /* The port may still be held by a just-killed predecessor's sockets;
     * SO_REUSEADDR covers TIME_WAIT, so a few tries suffice. */
    int rc = -1;
    for (int tries = 0; tries < 50 && rc != 0; tries++) {
        rc = ferry_engine_create(&cfg, &e);
        if (rc) usleep(100000);
    }
    if (rc) {
        fprintf(stderr, "ferry_test_peer: %s\n", ferry_last_error_detail());
        return 1;
    }
    unsigned char *buf = mmap((void *)at, len, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    if (buf == MAP_FAILED || (at && (uintptr_t)buf != at)) {
        if (buf != MAP_FAILED) munmap(buf, len);
        buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (buf == MAP_FAILED || ferry_register(e, buf, len, FERRY_MEM_REMOTE) != 0) {
        fprintf(stderr, "ferry_test_peer: buffer: %s\n", ferry_last_error_detail());
        return 1;
    }
    printf("READY %u 0x%" PRIxPTR " %zu %016" PRIx64 "\n", ferry_engine_port(e), (uintptr_t)buf, len,
           ferry_engine_epoch(e));
    fflush(stdout);
    char line[256];
    bool registered = true;
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long seed = 0, off = 0, n = 0;
        bool ok = true;
        /* A failing registration of an overlapping byte takes and drops the
         * registry's write lock, which orders our access to the buffer after
         * every placement so far and before every later one (placements hold
         * its read lock) for TSan, which cannot see the order that the
         * network and our stdin give. */
        sync_with_engine(e, buf);
        if (sscanf(line, "fill %llu", &seed) == 1) {
            harness_fill(buf, len, seed);
        } else if (sscanf(line, "check %llu %llu %llu", &seed, &off, &n) == 3) {
            ok = off + n <= len && harness_check(buf + off, n, seed);
        } else if (!strncmp(line, "zero", 4)) {
            memset(buf, 0, len);
        } else if (sscanf(line, "iszero %llu %llu", &off, &n) == 2) {
            for (unsigned long long i = off; ok && i < off + n && i < len; i++) ok = buf[i] == 0;
        } else if (!strncmp(line, "dereg", 5)) {
            ok = registered && ferry_deregister(e, buf) == 0;
            registered = false;
        } else if (!strncmp(line, "reg", 3)) {
            ok = !registered && ferry_register(e, buf, len, FERRY_MEM_REMOTE) == 0;
            registered = true;
        } else if (!strncmp(line, "threads", 7)) {
            int n = 0;
            DIR *d = opendir("/proc/self/task");
            struct dirent *de;
            while (d && (de = readdir(d)))
                if (de->d_name[0] != '.') n++;
            if (d) closedir(d);
            printf("OK %d\n", n);
            fflush(stdout);
            continue;
        } else if (!strncmp(line, "sockets", 7)) {
            /* Open sockets: the listener's and one per served connection
             * (serving has no thread of its own to count: evloop.c). */
            int n = 0;
            DIR *d = opendir("/proc/self/fd");
            struct dirent *de;
            char path[300], target[64];
            while (d && (de = readdir(d))) {
                if (de->d_name[0] == '.') continue;
                snprintf(path, sizeof path, "/proc/self/fd/%s", de->d_name);
                ssize_t k = readlink(path, target, sizeof target - 1);
                if (k > 0 && (target[k] = 0, !strncmp(target, "socket:", 7))) n++;
            }
            if (d) closedir(d);
            printf("OK %d\n", n);
            fflush(stdout);
            continue;
        } else if (!strncmp(line, "quit", 4)) {
            break;
        } else {
            ok = false;
        }
        sync_with_engine(e, buf);
        printf("%s\n", ok ? "OK" : "BAD");
        fflush(stdout);
    }
    ferry_engine_destroy(e);
    return 0;
}
