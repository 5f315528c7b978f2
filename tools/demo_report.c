/* SPDX-License-Identifier: Apache-2.0 */
/* `ferry demo` output: the header before the run, the per-request table,
 * the JSON summary and the failures (see cmd_demo.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <ferry/ferry.h>

#include "demo_orch.h"

/* ------------------------------------------------------------- output */

void demo_human_bytes(char *out, size_t cap, double b)
{
    if (b >= 1024.0 * 1024 * 1024) snprintf(out, cap, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(out, cap, "%.1f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0) snprintf(out, cap, "%.1f KiB", b / 1024.0);
    else snprintf(out, cap, "%.0f B", b);
}

static const char *dtype_name(uint32_t size)
{
    switch (size) {
    case 1: return "fp8";
    case 2: return "fp16";
    case 4: return "fp32";
    default: return "elements";
    }
}

void demo_print_header(struct demo *d)
{
    const struct demo_shape *s = d->s;
    if (d->o.json) return;
    uint64_t token_bytes = (uint64_t)s->layers * demo_buffers(s) * s->heads * s->head_dim * s->dtype;
    char tb[32], hb[32];
    demo_human_bytes(tb, sizeof tb, (double)token_bytes);
    printf("ferry demo: KV cache of %u requests, prefill -> decode over Ferry engines, every byte verified\n",
           s->requests);
    if (s->mla)
        printf("  model     %u layers, MLA: one %u-element latent per token, %s (%u B), one buffer a layer,\n"
               "            %u-token pages: %s of KV a token\n",
               s->layers, s->head_dim, dtype_name(s->dtype), s->dtype, s->page, tb);
    else
        printf("  model     %u layers x %u KV heads x %u dims, %s (%u B), K and V in separate buffers,\n"
               "            %u-token pages: %s of KV a token\n",
               s->layers, s->heads, s->head_dim, dtype_name(s->dtype), s->dtype, s->page, tb);
    printf("  prompts   %u..%u tokens (seed %llu):", s->tokens_min, s->tokens_max, (unsigned long long)s->seed);
    for (uint32_t r = 0; r < s->requests && r < 32; r++) printf(" %u", d->reqs[r].tokens);
    if (s->requests > 32) printf(" ... (%u more)", s->requests - 32);
    printf("\n");
    for (int decode = 0; decode < 2; decode++) {
        uint32_t tp = decode ? s->decode_tp : s->prefill_tp;
        for (uint32_t i = 0; i < d->nkids; i++) {
            const struct child *c = &d->kids[i];
            if (c->decode != decode) continue;
            demo_human_bytes(hb, sizeof hb, (double)c->pool_bytes);
            char st[64] = "";
            if (c->staging_bytes) {
                char sb[32];
                demo_human_bytes(sb, sizeof sb, (double)c->staging_bytes);
                snprintf(st, sizeof st, " + %s staging", sb);
            }
            printf("  %-9s rank %u/%u  engine %-21s pid %-7d pool %u pages, %s%s\n",
                   c->rank == 0 ? (decode ? "decode" : "prefill") : "", c->rank, tp, c->name, c->rpid,
                   decode ? s->decode_pool : s->prefill_pool, hb, st);
        }
    }
    for (uint32_t i = 0; i < d->npaths; i++) {
        const struct path *p = &d->paths[i];
        printf("  %-9s prefill %u -> decode %u: %s (%s), %s, protocol %u\n", i == 0 ? "path" : "", p->prank,
               p->drank, p->transport, p->reason, p->same_host ? "same host" : "other host", p->proto);
    }
    printf("  window    %u requests in flight; decode pages come from a shuffled free list\n", s->inflight);
    printf("  timing    %s\n", s->overlap ? "transfers overlap the ranks' fill and checks (--overlap): GB/s includes their CPU"
                                           : "each transfer runs alone; fill and checks run between transfers (--overlap: not)");
    printf("  latency   prefill submit -> last completion notice on the decode engine\n\n");
    fflush(stdout);
}


/* ------------------------------------------------------------ results */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest rank. */
static double percentile(const double *sorted, size_t n, double p)
{
    if (n == 0) return 0;
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return sorted[k ? k - 1 : 0];
}

static int cmp_interval(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

void demo_compute_totals(const struct demo *d, struct totals *t)
{
    const struct demo_shape *s = d->s;
    memset(t, 0, sizeof *t);
    double *lat = malloc((s->requests ? s->requests : 1) * sizeof *lat);
    uint64_t *iv = malloc((s->requests ? s->requests : 1) * 2 * sizeof *iv);
    uint64_t last = 0;
    for (uint32_t r = 0; lat && iv && r < s->requests; r++) {
        const struct request *q = &d->reqs[r];
        if (q->done != s->decode_tp || !q->t_submit) continue;
        t->bytes += q->bytes;
        t->tokens += q->tokens;
        t->pages += q->npages;
        t->before += q->before;
        t->after += q->after;
        lat[t->n] = (double)(q->t_done - q->t_submit) / 1e6;
        iv[2 * t->n] = q->t_submit;
        iv[2 * t->n + 1] = q->t_done;
        if (q->t_done > last) last = q->t_done;
        t->n++;
    }
    if (t->n) {
        /* Time with at least one transfer on the wire: the union of the
         * requests' [submit, notice] intervals. */
        qsort(iv, t->n, 2 * sizeof *iv, cmp_interval);
        uint64_t busy = 0, cs = iv[0], ce = iv[1];
        for (uint32_t i = 1; i < t->n; i++) {
            if (iv[2 * i] > ce) {
                busy += ce - cs;
                cs = iv[2 * i];
                ce = iv[2 * i + 1];
            } else if (iv[2 * i + 1] > ce) {
                ce = iv[2 * i + 1];
            }
        }
        busy += ce - cs;
        t->busy_s = (double)busy / 1e9;
        t->wall_s = (double)(last - d->t_first_submit) / 1e9;
        t->agg_gbps = t->busy_s > 0 ? (double)t->bytes / 1e9 / t->busy_s : 0;
        qsort(lat, t->n, sizeof *lat, cmp_double);
        t->p50 = percentile(lat, t->n, 50);
        t->p99 = percentile(lat, t->n, 99);
    }
    free(lat);
    free(iv);
}

void demo_print_table(const struct demo *d, const struct totals *t)
{
    const struct demo_shape *s = d->s;
    printf("  %5s %7s %6s %10s %9s %10s %11s %7s %10s\n", "req", "tokens", "pages", "MiB", "blocks", "coalesced",
           "latency ms", "GB/s", "verify ms");
    for (uint32_t r = 0; r < s->requests; r++) {
        const struct request *q = &d->reqs[r];
        if (q->done != s->decode_tp || !q->t_submit) continue;
        double ms = (double)(q->t_done - q->t_submit) / 1e6;
        printf("  %5u %7u %6u %10.1f %9llu %10llu %11.2f %7.2f %10.1f%s\n", r, q->tokens, q->npages,
               (double)q->bytes / (1024.0 * 1024), (unsigned long long)q->before, (unsigned long long)q->after, ms,
               ms > 0 ? (double)q->bytes / 1e6 / ms : 0.0, (double)q->verify_ns / 1e6,
               q->bad_bytes ? "  MISMATCH" : "");
    }
    printf("  %5s %7llu %6llu %10.1f %9llu %10llu\n\n", "total", (unsigned long long)t->tokens,
           (unsigned long long)t->pages, (double)t->bytes / (1024.0 * 1024), (unsigned long long)t->before,
           (unsigned long long)t->after);
    printf("  moved      %.3f GB in %.3f s with transfers on the wire: %.2f GB/s aggregate\n", (double)t->bytes / 1e9,
           t->busy_s, t->agg_gbps);
    printf("  wall       %.3f s from the first submit to the last notice (%s)\n",
           t->wall_s, d->s->overlap ? "prefill fill and decode checks overlap" : "with the fill and checks between transfers");
    printf("  latency    p50 %.2f ms, p99 %.2f ms over %u requests\n", t->p50, t->p99, t->n);
    char rb[32], cb[32];
    demo_human_bytes(rb, sizeof rb, (double)d->rechecked);
    demo_human_bytes(cb, sizeof cb, (double)d->canary);
    printf("  rechecked  %s of verified requests after later transfers, %s of free pages (canary)\n", rb, cb);
    printf("  verified: %llu bytes, %llu mismatches\n", (unsigned long long)d->verified,
           (unsigned long long)d->mismatch_bytes);
}

/* A count as a JSON integer (jansson's are signed 64-bit: a larger one, a
 * --seed past 2^63, becomes a real). */
static json_t *json_u64(uint64_t v)
{
    return v <= INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

static json_t *shape_json(const struct demo_shape *s)
{
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:b,s:b,s:s}", "layers", (json_int_t)s->layers,
                     "kv_heads", (json_int_t)s->heads, "head_dim", (json_int_t)s->head_dim, "dtype_bytes",
                     (json_int_t)s->dtype, "page_tokens", (json_int_t)s->page, "requests", (json_int_t)s->requests,
                     "tokens_min", (json_int_t)s->tokens_min, "tokens_max", (json_int_t)s->tokens_max, "prefill_tp",
                     (json_int_t)s->prefill_tp, "decode_tp", (json_int_t)s->decode_tp, "inflight",
                     (json_int_t)s->inflight, "seed", json_u64(s->seed), "mla", (int)s->mla, "overlap", (int)s->overlap, "transport",
                     s->transport ? s->transport : "default");
}

static json_t *ranks_json(const struct demo *d)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < d->nkids; i++) {
        const struct child *c = &d->kids[i];
        json_array_append_new(a, json_pack("{s:s,s:I,s:i,s:s,s:o,s:o}", "role", c->decode ? "decode" : "prefill",
                                           "rank", (json_int_t)c->rank, "pid", (int)c->pid, "engine", c->name, "pool_bytes",
                                           json_u64(c->pool_bytes), "staging_bytes", json_u64(c->staging_bytes)));
    }
    return a;
}

static json_t *paths_json(const struct demo *d)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < d->npaths; i++) {
        const struct path *p = &d->paths[i];
        json_array_append_new(a, json_pack("{s:I,s:I,s:s,s:s,s:b,s:I}", "prefill", (json_int_t)p->prank, "decode",
                                           (json_int_t)p->drank, "transport", p->transport, "reason", p->reason,
                                           "same_host", p->same_host, "protocol", (json_int_t)p->proto));
    }
    return a;
}

static json_t *requests_json(const struct demo *d)
{
    const struct demo_shape *s = d->s;
    json_t *a = json_array();
    for (uint32_t r = 0; r < s->requests; r++) {
        const struct request *q = &d->reqs[r];
        if (q->done != s->decode_tp || !q->t_submit) continue;
        double ms = (double)(q->t_done - q->t_submit) / 1e6;
        json_array_append_new(
            a, json_pack("{s:I,s:I,s:I,s:o,s:o,s:o,s:f,s:f,s:f,s:f,s:o}", "id", (json_int_t)r, "tokens",
                         (json_int_t)q->tokens, "pages", (json_int_t)q->npages, "bytes", json_u64(q->bytes),
                         "blocks", json_u64(q->before), "coalesced_blocks", json_u64(q->after), "latency_ms", ms,
                         "gb_per_s", ms > 0 ? (double)q->bytes / 1e6 / ms : 0.0, "fill_ms", (double)q->fill_ns / 1e6,
                         "verify_ms", (double)q->verify_ns / 1e6, "mismatches", json_u64(q->bad_bytes)));
    }
    return a;
}

static json_t *totals_json(const struct demo *d, const struct totals *t)
{
    return json_pack("{s:I,s:o,s:f,s:f,s:f,s:f,s:f,s:o,s:o,s:o,s:o}", "requests_verified", (json_int_t)t->n,
                     "bytes", json_u64(t->bytes), "transfer_s", t->busy_s, "aggregate_gb_per_s", t->agg_gbps, "wall_s",
                     t->wall_s, "latency_p50_ms", t->p50, "latency_p99_ms", t->p99, "verified_bytes",
                     json_u64(d->verified), "mismatches", json_u64(d->mismatch_bytes), "rechecked_bytes",
                     json_u64(d->rechecked), "canary_bytes", json_u64(d->canary));
}

static json_t *errors_json(const struct demo *d)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < d->nfails; i++) {
        const struct failure *x = &d->fails[i];
        json_array_append_new(a, json_pack("{s:s,s:i,s:s,s:s}", "source", x->source, "code", x->code, "name",
                                           x->code ? ferry_error_name(x->code) : "", "detail", x->text));
    }
    return a;
}

/* The --json summary on stdout. jansson escapes every string (engine names,
 * transport reasons and error details come from elsewhere). */
void demo_print_json(const struct demo *d, const struct totals *t, int ok)
{
    json_t *root = json_pack("{s:b,s:o,s:o,s:o,s:o,s:o,s:o}", "ok", ok, "shape", shape_json(d->s), "ranks",
                             ranks_json(d), "paths", paths_json(d), "requests", requests_json(d), "totals",
                             totals_json(d, t), "errors", errors_json(d));
    if (!root) {
        fprintf(stderr, "ferry demo: cannot build the JSON summary (out of memory?)\n");
        return;
    }
    json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(root);
    printf("\n");
    fflush(stdout);
}

void demo_print_failures(const struct demo *d)
{
    fprintf(stderr, "ferry demo: FAILED\n");
    for (uint32_t i = 0; i < d->nfails; i++) {
        const struct failure *f = &d->fails[i];
        fprintf(stderr, "  %s: %s\n", f->source, f->text);
        if (f->code && strstr(f->text, ferry_error_name(f->code)) == NULL)
            fprintf(stderr, "    (%s, code %d)\n", ferry_error_name(f->code), f->code);
        if (f->code)
            fprintf(stderr, "    %s %s; `ferry explain %s` says more\n", ferry_error_name(f->code),
                    ferry_error_retryable(f->code) ? "is retryable" : "is not retryable", ferry_error_name(f->code));
    }
    fprintf(stderr, "  verified before stopping: %llu bytes, %llu mismatches\n", (unsigned long long)d->verified,
            (unsigned long long)d->mismatch_bytes);
}
