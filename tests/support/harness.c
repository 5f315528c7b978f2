/* SPDX-License-Identifier: Apache-2.0 */
#include "harness.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void harness_assert_detail(const char *needle, const char *file, int line)
{
    const char *d = ferry_last_error_detail();
    if (!strstr(d, needle)) {
        fprintf(stderr, "%s:%d: detail \"%s\" lacks \"%s\"\n", file, line, d, needle);
        fail();
    }
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void harness_fill(void *buf, size_t len, uint64_t seed)
{
    unsigned char *p = buf;
    uint64_t s = seed;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = splitmix(&s);
        memcpy(p + i, &v, 8);
    }
    uint64_t v = splitmix(&s);
    memcpy(p + i, &v, len - i);
}

int harness_check(const void *buf, size_t len, uint64_t seed)
{
    const unsigned char *p = buf;
    uint64_t s = seed;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v = splitmix(&s);
        if (memcmp(p + i, &v, 8) != 0) return 0;
    }
    uint64_t v = splitmix(&s);
    return memcmp(p + i, &v, len - i) == 0;
}

int harness_all_equal(const void *buf, size_t n, unsigned char v)
{
    const unsigned char *p = buf;
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

int harness_wait_filled(const void *buf, size_t n, unsigned char v, int ms)
{
    uint64_t until = harness_now_ms() + (uint64_t)ms;
    while (harness_now_ms() < until) {
        if (harness_all_equal(buf, n, v)) return 1;
        usleep(5000);
    }
    return 0;
}

uint64_t harness_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void harness_stop_process(int pid)
{
    kill(pid, SIGSTOP);
    for (int tries = 0; tries < 200; tries++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/task", pid);
        DIR *d = opendir(path);
        if (!d) return;
        int running = 0;
        struct dirent *ent;
        while ((ent = readdir(d)) != NULL) {
            if (ent->d_name[0] == '.') continue;
            char stat[128], buf[256];
            snprintf(stat, sizeof stat, "/proc/%d/task/%s/stat", pid, ent->d_name);
            FILE *f = fopen(stat, "r");
            if (!f) continue;
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = '\0';
            const char *close_paren = strrchr(buf, ')');
            if (close_paren && close_paren[1] == ' ' && close_paren[2] != 'T' && close_paren[2] != 't') running++;
        }
        closedir(d);
        if (!running) return;
        nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
    }
}

