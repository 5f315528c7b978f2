/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry demo` options: the usage text, parsing and the checks on the
 * shape they give (see cmd_demo.c). */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ferry/kv.h>

#include "demo_orch.h"

/* ------------------------------------------------------------ options */

void demo_usage(FILE *out)
{
    fprintf(out,
            "usage: ferry demo [OPTIONS]\n"
            "\n"
            "Starts decode and prefill rank processes, each with its own Ferry engine on\n"
            "127.0.0.1, moves the KV cache of a batch of requests from prefill to decode,\n"
            "verifies every byte on the decode side and prints throughput and latency.\n"
            "Exit status 0 only when every byte of every request verified.\n"
            "\n"
            "Model and batch:\n"
            "  --layers N          transformer layers (32)\n"
            "  --heads N           KV heads of the model (8)\n"
            "  --head-dim N        elements per head (128)\n"
            "  --mla               DeepSeek-style MLA: one 576-element latent per token per layer in one\n"
            "                      buffer, every TP rank holding it whole (--heads/--head-dim ignored)\n"
            "  --dtype-size N      bytes per element (2, fp16)\n"
            "  --page N            tokens per KV page (16)\n"
            "  --requests N        requests in the batch (8)\n"
            "  --tokens-min N      shortest prompt (2000)\n"
            "  --tokens-max N      longest prompt (4000); lengths are drawn from --seed\n"
            "  --prefill-tp N      prefill tensor-parallel ranks, one process each (1)\n"
            "  --decode-tp N       decode tensor-parallel ranks, one process each (1)\n"
            "                      (each must divide --heads, or be a multiple of it)\n"
            "  --inflight N        requests admitted at once (2)\n"
            "  --overlap           start a transfer while the ranks still fill and check other requests\n"
            "                      (as a busy server's compute would); by default each transfer runs\n"
            "                      alone, so GB/s times the engines, not the demo's own checks\n"
            "  --seed N            prompt lengths, page lists and KV contents (1)\n"
            "Engine:\n"
            "  --transport NAME    auto, tcp, shm (default: FERRY_TRANSPORT, else auto)\n"
            "  --timeout-ms N      engine deadline; no progress for this long (+5 s) fails (30000)\n"
            "Output:\n"
            "  --quiet             no progress on stderr\n"
            "  --json              a machine-readable summary on stdout instead of the table\n"
            "  --max-memory GIB    refuse shapes whose pools need more (8)\n"
            "Fault injection (to show that each failure is caught and explained):\n"
            "  --inject KIND       corrupt: prefill rank 0 flips a bit of a request's KV\n"
            "                      stray: prefill rank 0 writes a page over another request's\n"
            "                      kill-prefill, kill-decode: rank 0 of that side dies mid-transfer\n"
            "                      freeze-prefill, freeze-decode: it stops (SIGSTOP) instead\n"
            "  --inject-request N  the request it happens to (1)\n");
}

static int bad_option(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int bad_option(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ferry demo: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (ferry demo --help lists the options)\n");
    return 2;
}

static int parse_u64(const char *name, const char *val, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno || end == val || *end || *val == '-' || v < min || v > max)
        return bad_option("%s wants a whole number in [%llu, %llu], got '%s'", name,
                          (unsigned long long)min, (unsigned long long)max, val);
    *out = v;
    return 0;
}

int demo_parse_opts(int argc, char **argv, struct demo_opts *o)
{
    struct demo_shape *s = &o->shape;
    *s = (struct demo_shape){.layers = 32, .heads = 8, .head_dim = 128, .dtype = 2, .page = 16,
                             .requests = 8, .tokens_min = 2000, .tokens_max = 4000,
                             .prefill_tp = 1, .decode_tp = 1, .inflight = 2, .seed = 1,
                             .timeout_ms = 30000, .inject_request = 1};
    o->max_memory_gib = 8;
    int inject_request_set = 0;
    struct {
        const char *name;
        uint32_t *dst;
        uint64_t min, max;
    } nums[] = {
        {"--layers", &s->layers, 1, 4096},         {"--heads", &s->heads, 1, 4096},
        {"--head-dim", &s->head_dim, 1, 65536},    {"--dtype-size", &s->dtype, 1, 16},
        {"--page", &s->page, 1, 65536},            {"--requests", &s->requests, 1, 1000000},
        {"--tokens-min", &s->tokens_min, 1, 1u << 24}, {"--tokens-max", &s->tokens_max, 1, 1u << 24},
        {"--prefill-tp", &s->prefill_tp, 1, 64},   {"--decode-tp", &s->decode_tp, 1, 64},
        {"--inflight", &s->inflight, 1, 1024},     {"--inject-request", &s->inject_request, 0, 1000000},
    };
    /* getopt_long's value for each option: an index into nums[] for the
     * whole-number ones, O_* for the others. */
    enum { O_QUIET = 'q', O_JSON = 256, O_MLA, O_OVERLAP, O_SEED, O_TIMEOUT_MS, O_TRANSPORT, O_MAX_MEMORY, O_INJECT };
    static const struct option options[] = {
        {"layers", required_argument, NULL, 0},       {"heads", required_argument, NULL, 1},
        {"head-dim", required_argument, NULL, 2},     {"dtype-size", required_argument, NULL, 3},
        {"page", required_argument, NULL, 4},         {"requests", required_argument, NULL, 5},
        {"tokens-min", required_argument, NULL, 6},   {"tokens-max", required_argument, NULL, 7},
        {"prefill-tp", required_argument, NULL, 8},   {"decode-tp", required_argument, NULL, 9},
        {"inflight", required_argument, NULL, 10},    {"inject-request", required_argument, NULL, 11},
        {"quiet", no_argument, NULL, O_QUIET},        {"json", no_argument, NULL, O_JSON},
        {"mla", no_argument, NULL, O_MLA},            {"seed", required_argument, NULL, O_SEED},
        {"overlap", no_argument, NULL, O_OVERLAP},
        {"timeout-ms", required_argument, NULL, O_TIMEOUT_MS},
        {"transport", required_argument, NULL, O_TRANSPORT},
        {"max-memory", required_argument, NULL, O_MAX_MEMORY},
        {"inject", required_argument, NULL, O_INJECT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    optind = 1;
    opterr = 0; /* bad_option says what is wrong, in the demo's words */
    while ((opt = getopt_long(argc, argv, ":qh", options, NULL)) != -1) {
        const char *v = optarg;
        if (opt >= 0 && opt < (int)(sizeof nums / sizeof nums[0])) {
            uint64_t x = 0;
            if (parse_u64(nums[opt].name, v, nums[opt].min, nums[opt].max, &x) != 0) return 2;
            *nums[opt].dst = (uint32_t)x;
            if (nums[opt].dst == &s->inject_request) inject_request_set = 1;
            continue;
        }
        switch (opt) {
        case 'h': demo_usage(stdout); return -1;
        case O_QUIET: o->quiet = 1; break;
        case O_JSON: o->json = 1; break;
        case O_MLA: s->mla = 1; break;
        case O_OVERLAP: s->overlap = 1; break;
        case O_SEED:
            if (parse_u64("--seed", v, 0, UINT64_MAX, &s->seed) != 0) return 2;
            break;
        case O_TIMEOUT_MS: {
            uint64_t x = 0;
            if (parse_u64("--timeout-ms", v, 100, 3600000, &x) != 0) return 2;
            s->timeout_ms = (int)x;
            break;
        }
        case O_TRANSPORT: s->transport = v; break;
        case O_MAX_MEMORY: {
            char *end;
            o->max_memory_gib = strtod(v, &end);
            if (*end || end == v || !(o->max_memory_gib > 0))
                return bad_option("--max-memory wants a positive number of GiB, got '%s'", v);
            break;
        }
        case O_INJECT: {
            static const char *kinds[] = {"none",        "corrupt",        "stray",        "kill-prefill",
                                          "kill-decode", "freeze-prefill", "freeze-decode"};
            s->inject = -1;
            for (int k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
                if (strcmp(v, kinds[k]) == 0) s->inject = k;
            if (s->inject < 0)
                return bad_option("--inject wants corrupt, stray, kill-prefill, kill-decode, freeze-prefill or "
                                  "freeze-decode, got '%s'", v);
            break;
        }
        case ':': return bad_option("%s needs a value", argv[optind - 1]);
        default: return bad_option("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return bad_option("unexpected argument '%s'", argv[optind]);
    if (s->mla) { /* the latent row as one "head" of 576 elements */
        s->heads = 1;
        s->head_dim = 576;
    }
    if (s->tokens_min > s->tokens_max)
        return bad_option("--tokens-min %u is more than --tokens-max %u", s->tokens_min, s->tokens_max);
    uint32_t first, count;
    if (ferry_kv_rank_heads(s->heads, s->prefill_tp, 0, &first, &count) != 0 ||
        ferry_kv_rank_heads(s->heads, s->decode_tp, 0, &first, &count) != 0)
        return bad_option("--prefill-tp %u and --decode-tp %u must each divide --heads %u or be a multiple of it",
                          s->prefill_tp, s->decode_tp, s->heads);
    if (!inject_request_set) s->inject_request = s->requests > 1 ? 1 : 0;
    if (s->inject && s->inject_request >= s->requests)
        return bad_option("--inject-request %u: the batch has requests 0..%u", s->inject_request, s->requests - 1);
    if (s->inject == DEMO_INJECT_STRAY && s->inject_request == 0)
        return bad_option("--inject stray needs --inject-request >= 1 (it writes into the previous request)");
    uint64_t row = (uint64_t)s->head_dim * s->dtype * s->heads;
    if (row * s->page > (1ull << 32))
        return bad_option("a page of %u tokens x %llu bytes is too large", s->page, (unsigned long long)row);
    demo_shape_derive(s);
    return 0;
}

/* ------------------------------------------------------------ memory */

int demo_memory_check(struct demo *d)
{
    const struct demo_shape *s = d->s;
    double total = 0;
    for (uint32_t r = 0; r < s->prefill_tp; r++) total += (double)demo_pool_bytes(s, 0, r);
    for (uint32_t r = 0; r < s->decode_tp; r++) total += (double)demo_pool_bytes(s, 1, r);
    for (uint32_t p = 0; p < s->prefill_tp; p++) {
        for (uint32_t q = 0; q < s->decode_tp; q++) {
            uint64_t src = 0, dst = 0;
            if (demo_staging_need(s, p, q, &src, &dst) != 0) continue;
            total += (double)src;
            /* Counted once per decode rank below. */
        }
    }
    for (uint32_t q = 0; q < s->decode_tp; q++) {
        uint64_t most = 0;
        for (uint32_t p = 0; p < s->prefill_tp; p++) {
            uint64_t src = 0, dst = 0;
            if (demo_staging_need(s, p, q, &src, &dst) == 0 && dst > most) most = dst;
        }
        total += (double)most * s->inflight;
    }
    double limit = d->o.max_memory_gib * 1024 * 1024 * 1024;
    if (total <= limit) return 0;
    char tb[32];
    demo_human_bytes(tb, sizeof tb, total);
    return bad_option("this shape needs %s of KV pools and staging (limit --max-memory %.1f GiB); "
                      "use fewer --layers, a smaller --tokens-max or --inflight, or raise the limit",
                      tb, d->o.max_memory_gib);
}
