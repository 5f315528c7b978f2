/* SPDX-License-Identifier: Apache-2.0 */
/* Replay driver for a fuzz target, built in every build and run by ctest:
 * runs the target on its seeds, on any files or directories given, and on
 * a bounded number of deterministic mutations of the seeds (bit flips,
 * truncations, splices, boundary values), so the harness and the code under
 * it are exercised without clang or libFuzzer.
 *   fuzz_X_replay [--mutations N] [--write-seeds DIR] [FILE|DIR ...] */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

#define CAP (1u << 17)

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return;
    uint8_t *b = malloc(CAP);
    size_t n = fread(b, 1, CAP, f);
    fclose(f);
    LLVMFuzzerTestOneInput(b, n);
    free(b);
}

static void run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        run_file(path);
        return;
    }
    DIR *d = opendir(path);
    struct dirent *de;
    char full[4096];
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(full, sizeof full, "%s/%s", path, de->d_name);
        run_file(full);
    }
    if (d) closedir(d);
}

static void mutate(uint8_t *b, size_t *n)
{
    static const uint64_t edges[] = {0, 1, 0x7f, 0xff, 0xffff, 0xffffffffull, 0x80000000ull, 1ull << 40,
                                     UINT64_MAX, 56, 64u << 20, (64u << 20) + 1};
    int k = 1 + (int)(next() % 4);
    while (k--) {
        if (*n == 0) return;
        size_t at = next() % *n;
        switch (next() % 5) {
        case 0: b[at] ^= (uint8_t)(1u << (next() % 8)); break;
        case 1: *n = at; break;
        case 2: b[at] = (uint8_t)next(); break;
        case 3: {
            uint64_t v = edges[next() % (sizeof edges / sizeof edges[0])];
            size_t w = (size_t)(1u << (next() % 4));
            for (size_t i = 0; i < w && at + i < *n; i++) b[at + i] = (uint8_t)(v >> (8 * i));
            break;
        }
        case 4: /* duplicate a tail: frames repeated */
            if (*n + (*n - at) <= CAP) {
                memcpy(b + *n, b + at, *n - at);
                *n += *n - at;
            }
            break;
        }
    }
}

int main(int argc, char **argv)
{
    long mutations = 2000;
    const char *write_dir = NULL;
    int first_path = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mutations") && i + 1 < argc) mutations = atol(argv[++i]);
        else if (!strcmp(argv[i], "--write-seeds") && i + 1 < argc) write_dir = argv[++i];
        else {
            first_path = i;
            break;
        }
    }
    uint8_t *seed = malloc(CAP), *b = malloc(CAP);
    int nseeds = 0;
    while (fuzz_seed(nseeds, seed, CAP) > 0) nseeds++;
    if (write_dir) {
        for (int i = 0; i < nseeds; i++) {
            size_t n = fuzz_seed(i, seed, CAP);
            char path[4096];
            snprintf(path, sizeof path, "%s/seed-%02d", write_dir, i);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(seed, 1, n, f) != n) {
                fprintf(stderr, "cannot write %s\n", path);
                return 1;
            }
            fclose(f);
        }
        free(seed);
        free(b);
        return 0;
    }
    for (int i = 0; i < nseeds; i++) {
        size_t n = fuzz_seed(i, seed, CAP);
        memcpy(b, seed, n);
        LLVMFuzzerTestOneInput(b, n);
        /* Every prefix: truncated streams. */
        for (size_t k = 0; k < n; k += 1 + n / 64) LLVMFuzzerTestOneInput(b, k);
    }
    for (long m = 0; m < mutations && nseeds > 0; m++) {
        size_t n = fuzz_seed((int)(next() % (uint64_t)nseeds), seed, CAP);
        memcpy(b, seed, n);
        mutate(b, &n);
        LLVMFuzzerTestOneInput(b, n);
    }
    for (int i = first_path; i < argc; i++) run_path(argv[i]);
    printf("replayed %d seeds, their prefixes and %ld mutations\n", nseeds, mutations);
    free(seed);
    free(b);
    return 0;
}
