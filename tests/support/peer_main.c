/* SPDX-License-Identifier: Apache-2.0 */
/* ferry_test_peer: a target engine in its own process, for tests that kill,
 * stop or restart it, or run it in another network namespace.
 *
 *   ferry_test_peer [--host H] [--port P] [--len N] [--at ADDR] [--secret S]
 *                   [--timeout MS] [--keepalive MS] [--guard G]
 *
 * Registers one remote-accessible buffer of N bytes (at ADDR if that address
 * is free, else anywhere), prints "READY port addr len epoch" and serves.
 * --guard G: the buffer lies inside one mapping of N + 2G bytes whose G
 * bytes on either side stay unregistered, filled with 0x5a (a write outside
 * the registered range changes them).
 * Commands on stdin, one a line, each answered by a line starting OK or BAD:
 *   fill SEED | check SEED OFF LEN | zero | iszero OFF LEN | dereg | reg |
 *   threads | sockets (answer "OK n") | quit
 * and, for the fault explorer (tests/explore):
 *   watch SEED OFF LEN PARTS: a thread watches [OFF, OFF+LEN), cut in PARTS
 *     equal parts; once a part holds harness_fill(SEED)'s bytes for the whole
 *     range it is "placed", and the thread at once reuses it (overwrites it
 *     with those bytes inverted), as a decode acting on its KV would, so a
 *     later placement of the same bytes shows;
 *   watchend: stops it; "OK n s:t:a ..." per part: s 0 never placed, 1 placed
 *     once, 2 placed and written again after its reuse; t the CLOCK_MONOTONIC
 *     millisecond it was placed, a when it was first seen written again;
 *   notes: takes every queued notification; "OK total*1000 + kv_successes".
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
#include <ferry/kv.h>
#include <pthread.h>
#include <time.h>

/* ------------------------------------------- placement watcher (explore) */

#define WATCH_MAX_PARTS 64

static struct watch {
    pthread_t thread;
    bool running;
    volatile bool stop;
    unsigned char *base;      /* the watched range in the buffer */
    unsigned char *expected;  /* harness_fill(seed) over the whole range */
    size_t len, parts, part_len;
    unsigned char *reused;    /* the same inverted: what a placed part holds after its reuse */
    int state[WATCH_MAX_PARTS];
    unsigned long long placed_ms[WATCH_MAX_PARTS];
    unsigned long long again_ms[WATCH_MAX_PARTS]; /* first seen written again after the reuse */
} watch;

static unsigned long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000;
}

static size_t part_size(size_t i)
{
    return i + 1 == watch.parts ? watch.len - i * watch.part_len : watch.part_len;
}

/* Whether the n bytes at (volatile) p equal want, each word read once.
 * Not memcmp: on a mismatching chunk an optimized memcmp re-reads the first
 * differing bytes to compute its sign, and when placement wrote them in
 * between it returns 0 without looking further, so a range still being
 * received looked complete, was reused, and its tail then "landed again". */
static bool same_bytes(const unsigned char *p, const unsigned char *want, size_t n)
{
    size_t i = 0;
    for (; ((uintptr_t)(p + i) & 7) == 0 && i + 8 <= n; i += 8) {
        uint64_t a, b;
        memcpy(&b, want + i, 8);
        a = *(const volatile uint64_t *)(const void *)(p + i);
        if (a != b) return false;
    }
    for (; i < n; i++)
        if (((const volatile unsigned char *)p)[i] != want[i]) return false;
    return true;
}

/* Polls the parts not yet placed; reuses each at once when its bytes are all
 * there. Races with placement on purpose (volatile reads): it only looks. */
static void *watch_main(void *arg)
{
    (void)arg;
    while (!watch.stop) {
        for (size_t i = 0; i < watch.parts; i++) {
            unsigned char *at = watch.base + i * watch.part_len;
            size_t n = part_size(i);
            if (watch.state[i] == 1) {
                if (!same_bytes(at, watch.reused + i * watch.part_len, n)) {
                    watch.again_ms[i] = mono_ms();
                    watch.state[i] = 2;
                }
                continue;
            }
            if (watch.state[i] || !same_bytes(at, watch.expected + i * watch.part_len, n)) continue;
            watch.placed_ms[i] = mono_ms();
            memcpy(at, watch.reused + i * watch.part_len, n);
            watch.state[i] = 1;
        }
        usleep(200);
    }
    return NULL;
}

static bool watch_start(unsigned char *buf, size_t buflen, unsigned long long seed, size_t off, size_t n,
                        size_t parts)
{
    if (watch.running || parts == 0 || parts > WATCH_MAX_PARTS || off > buflen || n > buflen - off || n < parts)
        return false;
    memset(&watch, 0, sizeof watch);
    watch.expected = malloc(n);
    watch.reused = malloc(n);
    if (!watch.expected || !watch.reused) {
        free(watch.expected);
        free(watch.reused);
        return false;
    }
    harness_fill(watch.expected, n, seed);
    for (size_t k = 0; k < n; k++) watch.reused[k] = (unsigned char)~watch.expected[k];
    watch.base = buf + off;
    watch.len = n;
    watch.parts = parts;
    watch.part_len = n / parts;
    if (pthread_create(&watch.thread, NULL, watch_main, NULL) != 0) {
        free(watch.expected);
        free(watch.reused);
        return false;
    }
    watch.running = true;
    return true;
}

static bool watch_end(void)
{
    if (!watch.running) return false;
    watch.stop = true;
    pthread_join(watch.thread, NULL);
    watch.running = false;
    printf("OK %zu", watch.parts);
    for (size_t i = 0; i < watch.parts; i++) {
        /* A last look: written again since the thread's last pass? */
        if (watch.state[i] == 1 &&
            memcmp(watch.base + i * watch.part_len, watch.reused + i * watch.part_len, part_size(i)) != 0) {
            watch.again_ms[i] = mono_ms();
            watch.state[i] = 2;
        }
        printf(" %d:%llu:%llu", watch.state[i], watch.placed_ms[i], watch.again_ms[i]);
    }
    printf("\n");
    fflush(stdout);
    free(watch.expected);
    free(watch.reused);
    watch.expected = watch.reused = NULL;
    return true;
}

/* Drains the notification queue: total * 1000 + KV success notices. */
static long drain_notes(ferry_engine_t *e)
{
    long total = 0, kv_ok = 0;
    ferry_notification_t n[64];
    long got;
    while ((got = ferry_get_notifications(e, n, 64)) > 0) {
        for (long i = 0; i < got; i++) {
            ferry_kv_notice_t kn;
            if (ferry_kv_notice_decode(n[i].msg, n[i].len, &kn) == 1 && kn.status == 0) kv_ok++;
        }
        total += got;
        ferry_notifications_free(n, (size_t)got);
    }
    return total * 1000 + kv_ok;
}

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
    size_t guard = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--host")) cfg.host = v;
        else if (!strcmp(k, "--port")) cfg.port = (uint16_t)atoi(v);
        else if (!strcmp(k, "--len")) len = strtoull(v, NULL, 0);
        else if (!strcmp(k, "--at")) at = (uintptr_t)strtoull(v, NULL, 0);
        else if (!strcmp(k, "--secret")) cfg.secret = v;
        else if (!strcmp(k, "--timeout")) cfg.timeout_ms = atoi(v);
        else if (!strcmp(k, "--keepalive")) cfg.keepalive_ms = atoi(v);
        else if (!strcmp(k, "--guard")) guard = strtoull(v, NULL, 0);
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
    /* With guards the mapping starts guard bytes before the buffer. */
    uintptr_t map_at = at && at > guard ? at - guard : 0;
    size_t map_len = len + 2 * guard;
    unsigned char *map = mmap((void *)map_at, map_len, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | (map_at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    if (map == MAP_FAILED || (map_at && (uintptr_t)map != map_at)) {
        if (map != MAP_FAILED) munmap(map, map_len);
        map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    unsigned char *buf = map == MAP_FAILED ? MAP_FAILED : map + guard;
    if (map != MAP_FAILED && guard) {
        memset(map, 0x5a, guard);
        memset(buf + len, 0x5a, guard);
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
        size_t parts = 0;
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
        } else if (sscanf(line, "watch %llu %llu %llu %zu", &seed, &off, &n, &parts) == 4) {
            ok = watch_start(buf, len, seed, (size_t)off, (size_t)n, parts);
        } else if (!strncmp(line, "watchend", 8)) {
            if (watch_end()) continue;
            ok = false;
        } else if (!strncmp(line, "notes", 5)) {
            printf("OK %ld\n", drain_notes(e));
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
