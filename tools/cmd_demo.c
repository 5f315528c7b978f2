/* ferry demo: Ferry's main job on an embedded default. Forks decode and
 * prefill rank processes, each with its own engine on 127.0.0.1, moves the
 * KV cache of a batch of requests of a realistic shape from prefill to
 * decode, checks every byte on the decode side, and prints throughput and
 * per-request latency.
 *
 * This process is the scheduler and the bootstrap side channel: it picks
 * the prompt lengths, hands out pages on both sides (the decode pool's free
 * list is shuffled in runs, as a busy server's is), relays the decode
 * ranks' engine names and buffer addresses to the prefill ranks, and tells
 * each rank what to do over a pipe. A request's completion reaches the
 * decode rank only through the engine (ferry_kv_send's notice); the pipe
 * carries the decode rank's report afterwards. Every wait here is bounded
 * and the ranks die with this process. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ferry/ferry.h>
#include <ferry/kv.h>

#include "cli.h"
#include "demo.h"

/* ------------------------------------------------------------ options */

struct demo_opts {
    struct demo_shape shape;
    int quiet, json;
    double max_memory_gib;
};

static void usage(FILE *out)
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

/* "--name value" or "--name=value": 1 and *val when argv[*i] is name. */
static int option_value(int argc, char **argv, int *i, const char *name, const char **val, int *missing)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return 0;
    if (argv[*i][n] == '=') {
        *val = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0') return 0;
    if (*i + 1 >= argc) {
        *missing = 1;
        return 1;
    }
    *val = argv[++*i];
    return 1;
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

static int parse_opts(int argc, char **argv, struct demo_opts *o)
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
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int missing = 0, done = 0;
        if (strcmp(argv[i], "--quiet") == 0 || strcmp(argv[i], "-q") == 0) {
            o->quiet = 1;
            continue;
        }
        if (strcmp(argv[i], "--json") == 0) {
            o->json = 1;
            continue;
        }
        if (strcmp(argv[i], "--mla") == 0) {
            s->mla = 1;
            continue;
        }
        for (size_t k = 0; k < sizeof nums / sizeof nums[0] && !done; k++) {
            if (!option_value(argc, argv, &i, nums[k].name, &v, &missing)) continue;
            done = 1;
            if (missing) return bad_option("%s needs a value", nums[k].name);
            uint64_t x = 0;
            if (parse_u64(nums[k].name, v, nums[k].min, nums[k].max, &x) != 0) return 2;
            *nums[k].dst = (uint32_t)x;
            if (nums[k].dst == &s->inject_request) inject_request_set = 1;
        }
        if (done) continue;
        if (option_value(argc, argv, &i, "--seed", &v, &missing)) {
            if (missing) return bad_option("--seed needs a value");
            if (parse_u64("--seed", v, 0, UINT64_MAX, &s->seed) != 0) return 2;
        } else if (option_value(argc, argv, &i, "--timeout-ms", &v, &missing)) {
            uint64_t x = 0;
            if (missing) return bad_option("--timeout-ms needs a value");
            if (parse_u64("--timeout-ms", v, 100, 3600000, &x) != 0) return 2;
            s->timeout_ms = (int)x;
        } else if (option_value(argc, argv, &i, "--transport", &v, &missing)) {
            if (missing) return bad_option("--transport needs a value");
            s->transport = v;
        } else if (option_value(argc, argv, &i, "--max-memory", &v, &missing)) {
            char *end;
            if (missing) return bad_option("--max-memory needs a value");
            o->max_memory_gib = strtod(v, &end);
            if (*end || end == v || !(o->max_memory_gib > 0))
                return bad_option("--max-memory wants a positive number of GiB, got '%s'", v);
        } else if (option_value(argc, argv, &i, "--inject", &v, &missing)) {
            if (missing) return bad_option("--inject needs a value");
            static const char *kinds[] = {"none",        "corrupt",        "stray",        "kill-prefill",
                                          "kill-decode", "freeze-prefill", "freeze-decode"};
            s->inject = -1;
            for (int k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
                if (strcmp(v, kinds[k]) == 0) s->inject = k;
            if (s->inject < 0)
                return bad_option("--inject wants corrupt, stray, kill-prefill, kill-decode, freeze-prefill or "
                                  "freeze-decode, got '%s'", v);
        } else {
            return bad_option("unknown option '%s'", argv[i]);
        }
    }
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

/* ------------------------------------------------------------- output */

static void human_bytes(char *out, size_t cap, double b)
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

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* ------------------------------------------------------------ state */

struct child {
    int decode;
    uint32_t rank;
    pid_t pid;
    int to, from;          /* our ends of its pipes */
    struct demo_lines lines;
    int open;              /* its pipe to us is open */
    int reaped, status;
    int hello, ready, bye;
    int reported;          /* it sent an error line */
    char name[256];
    int rpid;
    uint64_t pool_bytes, staging_bytes;
    uint64_t staging, slot_bytes;
    char *addrs;           /* decode: its K and V addresses, as sent */
};

enum { REQ_WAITING = 0, REQ_ARMING, REQ_SENDING, REQ_DONE, REQ_RETIRING, REQ_RETIRED };

struct request {
    int state;
    uint32_t tokens, npages, slot;
    int32_t *ppages, *dpages;
    uint32_t armed, sent, done, retired;
    uint64_t t_submit, t_sent, t_done;
    uint64_t bytes, before, after, fill_ns, verify_ns, checked;
    uint64_t bad_bytes;   /* mismatched bytes the decode ranks reported */
    int prefill_freed;
};

struct path {
    uint32_t prank, drank;
    char transport[32];
    int same_host;
    unsigned proto;
    char reason[160];
};

struct failure {
    char source[96];
    int code;          /* a Ferry code, or 0 */
    char text[2200];
};

struct alloc {
    int32_t *ring;
    uint32_t cap, head, count;
};

struct demo {
    struct demo_opts o;
    const struct demo_shape *s;
    struct child *kids;
    uint32_t nkids;
    struct request *reqs;
    struct alloc palloc, dalloc;
    unsigned char *slot_busy;
    uint32_t next, inflight, completed, retiring;
    struct path *paths;
    uint32_t npaths;
    struct failure fails[16];
    uint32_t nfails;
    uint64_t mismatch_bytes, verified, rechecked, canary;
    uint32_t finals;
    int phase;
    uint64_t t_start, t_first_submit, t_last_progress;
    int tty, progress_drawn;
};

enum { PHASE_HELLO, PHASE_CONNECT, PHASE_RUN, PHASE_FINISH, PHASE_QUIT };
static const char *const phase_names[] = {"waiting for the ranks to start", "connecting prefill to decode",
                                          "transferring", "final checks", "shutting down"};

static struct demo *the_demo; /* for the exit and signal paths */
static volatile sig_atomic_t interrupted;

static void on_signal(int sig) { interrupted = sig; }

static void kill_children(struct demo *d)
{
    for (uint32_t i = 0; d && i < d->nkids; i++) {
        struct child *c = &d->kids[i];
        if (c->pid > 0 && !c->reaped) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &c->status, 0);
            c->reaped = 1;
        }
    }
}

static void at_exit(void) { kill_children(the_demo); }

static const char *child_label(const struct child *c, char *buf, size_t cap)
{
    if (c->hello)
        snprintf(buf, cap, "%s rank %u (pid %d, %s)", c->decode ? "decode" : "prefill", c->rank, (int)c->pid,
                 c->name);
    else
        snprintf(buf, cap, "%s rank %u (pid %d)", c->decode ? "decode" : "prefill", c->rank, (int)c->pid);
    return buf;
}

static void add_failure(struct demo *d, const char *source, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add_failure(struct demo *d, const char *source, int code, const char *fmt, ...)
{
    if (d->nfails == sizeof d->fails / sizeof d->fails[0]) return;
    struct failure *f = &d->fails[d->nfails++];
    snprintf(f->source, sizeof f->source, "%s", source);
    f->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->text, sizeof f->text, fmt, ap);
    va_end(ap);
}

static void child_failure(struct demo *d, const struct child *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void child_failure(struct demo *d, const struct child *c, int code, const char *fmt, ...)
{
    char label[400], text[2100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    add_failure(d, child_label(c, label, sizeof label), code, "%s", text);
}

/* --------------------------------------------------------- allocators */

static uint64_t rng_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The pool's pages in runs of 1..max_run, the runs shuffled: a free list
 * after some churn. Coalescing finds the runs both sides share. */
static int alloc_init(struct alloc *a, uint32_t pool, uint32_t max_run, uint64_t *rng)
{
    a->ring = malloc(pool * sizeof *a->ring);
    uint32_t *starts = malloc((pool + 1) * sizeof *starts), nruns = 0;
    if (!a->ring || !starts) {
        free(starts);
        return -1;
    }
    for (uint32_t p = 0; p < pool;) {
        starts[nruns++] = p;
        p += 1 + (uint32_t)(rng_next(rng) % max_run);
    }
    starts[nruns] = pool;
    uint32_t *order = malloc(nruns * sizeof *order);
    if (!order) {
        free(starts);
        return -1;
    }
    for (uint32_t i = 0; i < nruns; i++) order[i] = i;
    for (uint32_t i = nruns; i > 1; i--) {
        uint32_t j = (uint32_t)(rng_next(rng) % i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    a->cap = pool;
    a->head = a->count = 0;
    for (uint32_t i = 0; i < nruns; i++) {
        uint32_t r = order[i], end = starts[r + 1] < pool ? starts[r + 1] : pool;
        for (uint32_t p = starts[r]; p < end; p++) a->ring[a->count++] = (int32_t)p;
    }
    free(order);
    free(starts);
    return 0;
}

static int32_t *alloc_take(struct alloc *a, uint32_t n)
{
    if (a->count < n) return NULL;
    int32_t *out = malloc((n ? n : 1) * sizeof *out);
    if (!out) return NULL;
    for (uint32_t i = 0; i < n; i++) out[i] = a->ring[(a->head + i) % a->cap];
    a->head = (a->head + n) % a->cap;
    a->count -= n;
    return out;
}

static void alloc_give(struct alloc *a, const int32_t *pages, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) a->ring[(a->head + a->count + i) % a->cap] = pages[i];
    a->count += n;
}

/* ------------------------------------------------------------ children */

static void tell(struct demo *d, struct child *c, const char *text, size_t len)
{
    if (!c->open || c->to < 0) return;
    if (demo_write_all(c->to, text, len, d->s->timeout_ms) != 0)
        child_failure(d, c, errno == ETIMEDOUT ? FERRY_ERR_TIMEOUT : 0, "%s",
                      errno == ETIMEDOUT ? "stopped reading its commands" : "its command pipe is closed");
}

static void tell_role(struct demo *d, int decode, const char *text, size_t len)
{
    for (uint32_t i = 0; i < d->nkids; i++)
        if (d->kids[i].decode == decode) tell(d, &d->kids[i], text, len);
}

static int spawn(struct demo *d, struct child *c)
{
    int down[2], up[2];
    if (pipe(down) != 0) return -1;
    if (pipe(up) != 0) {
        close(down[0]);
        close(down[1]);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(down[0]);
        close(down[1]);
        close(up[0]);
        close(up[1]);
        return -1;
    }
    if (pid == 0) {
        /* The rank dies with us, whatever way we go. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        the_demo = NULL; /* our exit must not kill our siblings */
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        for (uint32_t i = 0; i < d->nkids; i++) {
            struct child *o = &d->kids[i];
            if (o == c || o->pid <= 0) continue;
            close(o->to);
            close(o->from);
        }
        close(down[1]);
        close(up[0]);
        struct demo_rank_args a = {.shape = d->s, .rank = c->rank, .in_fd = down[0], .out_fd = up[1]};
        if (c->decode) demo_decode_main(&a);
        demo_prefill_main(&a);
    }
    close(down[0]);
    close(up[1]);
    c->pid = pid;
    c->to = down[1];
    c->from = up[0];
    fcntl(c->to, F_SETFL, fcntl(c->to, F_GETFL) | O_NONBLOCK);
    fcntl(c->from, F_SETFL, fcntl(c->from, F_GETFL) | O_NONBLOCK);
    c->lines.fd = c->from;
    c->open = 1;
    return 0;
}

static void describe_status(int status, char *out, size_t cap)
{
    if (WIFEXITED(status)) snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(out, cap, "ended with wait status 0x%x", status);
}

/* Its pipe closed: it exited or died. Waits (bounded) for its status. */
static void child_gone(struct demo *d, struct child *c)
{
    c->open = 0;
    close(c->from);
    close(c->to);
    c->to = c->from = -1;
    for (int i = 0; i < 2000 && !c->reaped; i++) {
        pid_t r = waitpid(c->pid, &c->status, WNOHANG);
        if (r == c->pid) c->reaped = 1;
        else usleep(1000);
    }
    if (!c->reaped) {
        kill(c->pid, SIGKILL);
        waitpid(c->pid, &c->status, 0);
        c->reaped = 1;
    }
    int clean = c->bye && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
    if (clean) return;
    /* A rank that reported its error exits 1: already said. */
    char how[128];
    describe_status(c->status, how, sizeof how);
    if (c->reported && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 1) return;
    char where[160] = "";
    for (uint32_t r = 0; r < d->s->requests; r++)
        if (d->reqs[r].state == REQ_ARMING || d->reqs[r].state == REQ_SENDING) {
            size_t n = strlen(where);
            snprintf(where + n, sizeof where - n, "%s%u", n ? ", " : " while requests ", r);
        }
    if (where[0]) strncat(where, " were in flight", sizeof where - strlen(where) - 1);
    child_failure(d, c, 0, "%s%s", how, where);
}

/* 'T' when the process is stopped (SIGSTOP, a debugger), else its state
 * letter from /proc, or '?' */
static char process_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *close_paren = strrchr(buf, ')');
    return close_paren && close_paren[1] == ' ' && close_paren[2] ? close_paren[2] : '?';
}

/* ------------------------------------------------------------ progress */

/* A TTY gets a bar redrawn at each send and verification; anything else a
 * line per verified request. */
static void progress(struct demo *d, uint32_t req, int verified)
{
    if (d->o.quiet || (!verified && !d->tty)) return;
    const struct demo_shape *s = d->s;
    uint64_t bytes = 0;
    uint32_t sent = 0;
    for (uint32_t r = 0; r < s->requests; r++) {
        if (d->reqs[r].done == s->decode_tp) bytes += d->reqs[r].bytes;
        if (d->reqs[r].sent == s->prefill_tp) sent++;
    }
    double secs = (double)(demo_now_ns() - d->t_first_submit) / 1e9;
    char hb[32];
    human_bytes(hb, sizeof hb, (double)bytes);
    if (d->tty) {
        int width = 30, fill = (int)((uint64_t)width * d->completed / s->requests);
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        fprintf(stderr, "\r  [%s] %u/%u requests verified (%u sent), %s, %.2f GB/s  ", bar, d->completed,
                s->requests, sent, hb, secs > 0 ? (double)bytes / 1e9 / secs : 0.0);
        d->progress_drawn = 1;
    } else {
        const struct request *q = &d->reqs[req];
        double ms = (double)(q->t_done - q->t_submit) / 1e6;
        char rb[32];
        human_bytes(rb, sizeof rb, (double)q->bytes);
        fprintf(stderr, "ferry demo: [%u/%u] request %u verified: %u tokens, %s in %.1f ms\n", d->completed,
                s->requests, req, q->tokens, rb, ms);
    }
    fflush(stderr);
}

static void progress_end(struct demo *d)
{
    if (d->progress_drawn) fprintf(stderr, "\n");
    d->progress_drawn = 0;
}

/* ---------------------------------------------------------- scheduling */

static void admit(struct demo *d)
{
    const struct demo_shape *s = d->s;
    while (d->phase == PHASE_RUN && d->next < s->requests && d->inflight < s->inflight && !d->nfails) {
        struct request *q = &d->reqs[d->next];
        uint32_t slot = 0;
        while (slot < s->inflight && d->slot_busy[slot]) slot++;
        if (slot == s->inflight || d->palloc.count < q->npages || d->dalloc.count < q->npages) return;
        q->ppages = alloc_take(&d->palloc, q->npages);
        q->dpages = alloc_take(&d->dalloc, q->npages);
        if (!q->ppages || !q->dpages) {
            add_failure(d, "ferry demo", FERRY_ERR_MEMORY, "MEMORY (%d): page lists of request %u",
                        FERRY_ERR_MEMORY, d->next);
            return;
        }
        d->slot_busy[slot] = 1;
        q->slot = slot;
        q->state = REQ_ARMING;
        struct demo_str b = {0};
        demo_str_printf(&b, "expect %u %u %u %u", d->next, slot, q->tokens, q->npages);
        demo_str_pages(&b, q->ppages, q->npages);
        demo_str_pages(&b, q->dpages, q->npages);
        demo_str_printf(&b, "\n");
        tell_role(d, 1, b.s, b.len);
        demo_str_free(&b);
        d->inflight++;
        d->next++;
    }
}

static void send_to_prefill(struct demo *d, uint32_t r)
{
    struct request *q = &d->reqs[r];
    if (d->nfails) return; /* stopping: only listening for reports now */
    q->state = REQ_SENDING;
    struct demo_str b = {0};
    demo_str_printf(&b, "send %u %u %u %u", r, q->slot, q->tokens, q->npages);
    demo_str_pages(&b, q->ppages, q->npages);
    demo_str_pages(&b, q->dpages, q->npages);
    demo_str_printf(&b, "\n");
    tell_role(d, 0, b.s, b.len);
    demo_str_free(&b);
}

static void request_complete(struct demo *d, uint32_t r)
{
    struct request *q = &d->reqs[r];
    q->state = REQ_DONE;
    d->slot_busy[q->slot] = 0;
    d->inflight--;
    d->completed++;
    progress(d, r, 1);
    if (d->nfails) return;
    /* Keep this one resident so the next transfer is checked against it;
     * retire the older ones (checked once more, then freed). */
    for (uint32_t o = 0; o < d->s->requests; o++) {
        if (o == r || d->reqs[o].state != REQ_DONE) continue;
        char line[64];
        int n = snprintf(line, sizeof line, "retire %u\n", o);
        d->reqs[o].state = REQ_RETIRING;
        d->retiring++;
        tell_role(d, 1, line, (size_t)n);
    }
}

static void maybe_finish(struct demo *d)
{
    if (d->phase != PHASE_RUN || d->completed < d->s->requests || d->retiring || d->nfails) return;
    d->phase = PHASE_FINISH;
    tell_role(d, 1, "finish\n", 7);
}

static void send_quit(struct demo *d)
{
    d->phase = PHASE_QUIT;
    for (uint32_t i = 0; i < d->nkids; i++) tell(d, &d->kids[i], "quit\n", 5);
}

/* -------------------------------------------------------------- setup */

static void start_connect(struct demo *d)
{
    d->phase = PHASE_CONNECT;
    struct demo_str b = {0};
    for (uint32_t i = 0; i < d->nkids; i++) {
        const struct child *c = &d->kids[i];
        if (!c->decode) continue;
        demo_str_printf(&b, "peer %u %s %llu %llu %s\n", c->rank, c->name, (unsigned long long)c->staging,
                        (unsigned long long)c->slot_bytes, c->addrs);
    }
    demo_str_printf(&b, "connect\n");
    tell_role(d, 0, b.s, b.len);
    demo_str_free(&b);
}

static void print_header(struct demo *d)
{
    const struct demo_shape *s = d->s;
    if (d->o.json) return;
    uint64_t token_bytes = (uint64_t)s->layers * demo_buffers(s) * s->heads * s->head_dim * s->dtype;
    char tb[32], hb[32];
    human_bytes(tb, sizeof tb, (double)token_bytes);
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
            human_bytes(hb, sizeof hb, (double)c->pool_bytes);
            char st[64] = "";
            if (c->staging_bytes) {
                char sb[32];
                human_bytes(sb, sizeof sb, (double)c->staging_bytes);
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
    printf("  latency   prefill submit -> last completion notice on the decode engine\n\n");
    fflush(stdout);
}

/* ------------------------------------------------------ messages in */

static void handle_line(struct demo *d, struct child *c, char *line)
{
    const struct demo_shape *s = d->s;
    struct demo_tok t = {line};
    char *cmd = demo_tok_next(&t);
    if (!cmd) return;
    d->t_last_progress = demo_now_ns();
    uint32_t r = 0;
    if (strcmp(cmd, "error") == 0) {
        int64_t code = 0;
        if (demo_tok_i64(&t, &code) != 0) code = 0;
        c->reported = 1;
        child_failure(d, c, (int)code, "%s", demo_tok_rest(&t));
        return;
    }
    if (strcmp(cmd, "bad") == 0) {
        uint64_t bytes = 0;
        if (demo_tok_u32(&t, &r) != 0 || demo_tok_u64(&t, &bytes) != 0) goto garbled;
        d->mismatch_bytes += bytes;
        if (r < s->requests) d->reqs[r].bad_bytes += bytes;
        add_failure(d, "verification", 0, "%s", demo_tok_rest(&t));
        return;
    }
    if (strcmp(cmd, "bye") == 0) {
        c->bye = 1;
        return;
    }
    if (strcmp(cmd, "hello") == 0) {
        char *name = demo_tok_next(&t);
        uint32_t pid;
        if (!name || demo_tok_u32(&t, &pid) != 0 || demo_tok_u64(&t, &c->pool_bytes) != 0) goto garbled;
        snprintf(c->name, sizeof c->name, "%s", name);
        c->rpid = (int)pid;
        if (c->decode) {
            if (demo_tok_u64(&t, &c->staging) != 0 || demo_tok_u64(&t, &c->slot_bytes) != 0) goto garbled;
            c->staging_bytes = c->slot_bytes * s->inflight;
            c->addrs = strdup(demo_tok_rest(&t));
        } else if (demo_tok_u64(&t, &c->staging_bytes) != 0) {
            goto garbled;
        }
        c->hello = 1;
        for (uint32_t i = 0; i < d->nkids; i++)
            if (!d->kids[i].hello) return;
        start_connect(d);
        return;
    }
    if (strcmp(cmd, "path") == 0) {
        struct path *p = &d->paths[d->npaths];
        char *tr;
        int64_t same;
        if (d->npaths == s->prefill_tp * s->decode_tp || demo_tok_u32(&t, &p->drank) != 0 ||
            !(tr = demo_tok_next(&t)) || demo_tok_i64(&t, &same) != 0 || demo_tok_u32(&t, &p->proto) != 0)
            goto garbled;
        p->prank = c->rank;
        snprintf(p->transport, sizeof p->transport, "%s", tr);
        snprintf(p->reason, sizeof p->reason, "%s", demo_tok_rest(&t));
        p->same_host = (int)same;
        d->npaths++;
        return;
    }
    if (strcmp(cmd, "ready") == 0) {
        c->ready = 1;
        for (uint32_t i = 0; i < d->nkids; i++)
            if (!d->kids[i].decode && !d->kids[i].ready) return;
        print_header(d);
        d->phase = PHASE_RUN;
        admit(d);
        return;
    }
    if (strcmp(cmd, "final") == 0) {
        uint64_t a, b;
        if (demo_tok_u64(&t, &a) != 0 || demo_tok_u64(&t, &b) != 0) goto garbled;
        d->rechecked += a;
        d->canary += b;
        if (++d->finals == s->decode_tp) send_quit(d);
        return;
    }
    if (demo_tok_u32(&t, &r) != 0 || r >= s->requests) goto garbled;
    struct request *q = &d->reqs[r];
    if (strcmp(cmd, "armed") == 0) {
        if (++q->armed == s->decode_tp) send_to_prefill(d, r);
    } else if (strcmp(cmd, "sent") == 0) {
        uint64_t ts, te, bytes, before, after, fill;
        if (demo_tok_u64(&t, &ts) != 0 || demo_tok_u64(&t, &te) != 0 || demo_tok_u64(&t, &bytes) != 0 ||
            demo_tok_u64(&t, &before) != 0 || demo_tok_u64(&t, &after) != 0 || demo_tok_u64(&t, &fill) != 0)
            goto garbled;
        if (!q->t_submit || ts < q->t_submit) q->t_submit = ts;
        if (te > q->t_sent) q->t_sent = te;
        if (!d->t_first_submit || ts < d->t_first_submit) d->t_first_submit = ts;
        q->bytes += bytes;
        q->before += before;
        q->after += after;
        if (fill > q->fill_ns) q->fill_ns = fill;
        if (++q->sent == s->prefill_tp) {
            alloc_give(&d->palloc, q->ppages, q->npages);
            q->prefill_freed = 1;
            progress(d, r, 0);
            admit(d);
        }
    } else if (strcmp(cmd, "done") == 0) {
        uint64_t td, checked, vns;
        if (demo_tok_u64(&t, &td) != 0 || demo_tok_u64(&t, &checked) != 0 || demo_tok_u64(&t, &vns) != 0)
            goto garbled;
        if (td > q->t_done) q->t_done = td;
        q->checked += checked;
        d->verified += checked;
        if (vns > q->verify_ns) q->verify_ns = vns;
        if (++q->done == s->decode_tp) {
            request_complete(d, r);
            admit(d);
            maybe_finish(d);
        }
    } else if (strcmp(cmd, "retired") == 0) {
        uint64_t checked;
        if (demo_tok_u64(&t, &checked) != 0) goto garbled;
        d->rechecked += checked;
        if (++q->retired == s->decode_tp) {
            q->state = REQ_RETIRED;
            d->retiring--;
            alloc_give(&d->dalloc, q->dpages, q->npages);
            admit(d);
            maybe_finish(d);
        }
    } else {
        goto garbled;
    }
    return;
garbled:
    child_failure(d, c, FERRY_ERR_INTERNAL, "INTERNAL (%d): unexpected message '%s'", FERRY_ERR_INTERNAL, cmd);
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

struct totals {
    uint64_t bytes, tokens, pages, before, after;
    double busy_s, wall_s, agg_gbps, p50, p99;
    uint32_t n;
};

static int cmp_interval(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

static void compute_totals(const struct demo *d, struct totals *t)
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

static void print_table(const struct demo *d, const struct totals *t)
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
    printf("  wall       %.3f s from the first submit to the last notice (prefill fill and decode checks overlap)\n",
           t->wall_s);
    printf("  latency    p50 %.2f ms, p99 %.2f ms over %u requests\n", t->p50, t->p99, t->n);
    char rb[32], cb[32];
    human_bytes(rb, sizeof rb, (double)d->rechecked);
    human_bytes(cb, sizeof cb, (double)d->canary);
    printf("  rechecked  %s of verified requests after later transfers, %s of free pages (canary)\n", rb, cb);
    printf("  verified: %llu bytes, %llu mismatches\n", (unsigned long long)d->verified,
           (unsigned long long)d->mismatch_bytes);
}

static void print_json(const struct demo *d, const struct totals *t, int ok)
{
    const struct demo_shape *s = d->s;
    FILE *f = stdout;
    fprintf(f, "{\n  \"ok\": %s,\n", ok ? "true" : "false");
    fprintf(f,
            "  \"shape\": {\"layers\": %u, \"kv_heads\": %u, \"head_dim\": %u, \"dtype_bytes\": %u, "
            "\"page_tokens\": %u, \"requests\": %u, \"tokens_min\": %u, \"tokens_max\": %u, "
            "\"prefill_tp\": %u, \"decode_tp\": %u, \"inflight\": %u, \"seed\": %llu, \"mla\": %s, \"transport\": ",
            s->layers, s->heads, s->head_dim, s->dtype, s->page, s->requests, s->tokens_min, s->tokens_max,
            s->prefill_tp, s->decode_tp, s->inflight, (unsigned long long)s->seed, s->mla ? "true" : "false");
    json_string(f, s->transport ? s->transport : "default");
    fprintf(f, "},\n  \"ranks\": [");
    for (uint32_t i = 0; i < d->nkids; i++) {
        const struct child *c = &d->kids[i];
        fprintf(f, "%s\n    {\"role\": \"%s\", \"rank\": %u, \"pid\": %d, \"engine\": ", i ? "," : "",
                c->decode ? "decode" : "prefill", c->rank, (int)c->pid);
        json_string(f, c->name);
        fprintf(f, ", \"pool_bytes\": %llu, \"staging_bytes\": %llu}", (unsigned long long)c->pool_bytes,
                (unsigned long long)c->staging_bytes);
    }
    fprintf(f, "\n  ],\n  \"paths\": [");
    for (uint32_t i = 0; i < d->npaths; i++) {
        const struct path *p = &d->paths[i];
        fprintf(f, "%s\n    {\"prefill\": %u, \"decode\": %u, \"transport\": ", i ? "," : "", p->prank, p->drank);
        json_string(f, p->transport);
        fprintf(f, ", \"reason\": ");
        json_string(f, p->reason);
        fprintf(f, ", \"same_host\": %s, \"protocol\": %u}", p->same_host ? "true" : "false", p->proto);
    }
    fprintf(f, "\n  ],\n  \"requests\": [");
    int first = 1;
    for (uint32_t r = 0; r < s->requests; r++) {
        const struct request *q = &d->reqs[r];
        if (q->done != s->decode_tp || !q->t_submit) continue;
        double ms = (double)(q->t_done - q->t_submit) / 1e6;
        fprintf(f,
                "%s\n    {\"id\": %u, \"tokens\": %u, \"pages\": %u, \"bytes\": %llu, \"blocks\": %llu, "
                "\"coalesced_blocks\": %llu, \"latency_ms\": %.3f, \"gbps\": %.3f, \"fill_ms\": %.3f, "
                "\"verify_ms\": %.3f, \"mismatches\": %llu}",
                first ? "" : ",", r, q->tokens, q->npages, (unsigned long long)q->bytes,
                (unsigned long long)q->before, (unsigned long long)q->after, ms,
                ms > 0 ? (double)q->bytes / 1e6 / ms : 0.0, (double)q->fill_ns / 1e6, (double)q->verify_ns / 1e6,
                (unsigned long long)q->bad_bytes);
        first = 0;
    }
    fprintf(f, "\n  ],\n");
    fprintf(f,
            "  \"totals\": {\"requests_verified\": %u, \"bytes\": %llu, \"transfer_s\": %.6f, "
            "\"aggregate_gbps\": %.3f, \"wall_s\": %.6f, \"latency_p50_ms\": %.3f, \"latency_p99_ms\": %.3f, "
            "\"verified_bytes\": %llu, \"mismatches\": %llu, \"rechecked_bytes\": %llu, \"canary_bytes\": %llu},\n",
            t->n, (unsigned long long)t->bytes, t->busy_s, t->agg_gbps, t->wall_s, t->p50, t->p99,
            (unsigned long long)d->verified, (unsigned long long)d->mismatch_bytes,
            (unsigned long long)d->rechecked, (unsigned long long)d->canary);
    fprintf(f, "  \"errors\": [");
    for (uint32_t i = 0; i < d->nfails; i++) {
        const struct failure *x = &d->fails[i];
        fprintf(f, "%s\n    {\"source\": ", i ? "," : "");
        json_string(f, x->source);
        fprintf(f, ", \"code\": %d, \"name\": ", x->code);
        json_string(f, x->code ? ferry_error_name(x->code) : "");
        fprintf(f, ", \"detail\": ");
        json_string(f, x->text);
        fprintf(f, "}");
    }
    fprintf(f, "%s]\n}\n", d->nfails ? "\n  " : "");
    fflush(f);
}

static void print_failures(const struct demo *d)
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

/* --------------------------------------------------------------- main */

static int memory_check(struct demo *d)
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
    human_bytes(tb, sizeof tb, total);
    return bad_option("this shape needs %s of KV pools and staging (limit --max-memory %.1f GiB); "
                      "use fewer --layers, a smaller --tokens-max or --inflight, or raise the limit",
                      tb, d->o.max_memory_gib);
}

static int run(struct demo *d)
{
    const struct demo_shape *s = d->s;
    uint64_t rng = s->seed;
    for (uint32_t r = 0; r < s->requests; r++) {
        struct request *q = &d->reqs[r];
        q->tokens = s->tokens_min + (uint32_t)(rng_next(&rng) % ((uint64_t)s->tokens_max - s->tokens_min + 1));
        q->npages = (q->tokens + s->page - 1) / s->page;
    }
    uint64_t prng = s->seed ^ 0x70726566696c6cull, drng = s->seed ^ 0x6465636f6465ull;
    if (alloc_init(&d->palloc, s->prefill_pool, 48, &prng) != 0 ||
        alloc_init(&d->dalloc, s->decode_pool, 12, &drng) != 0) {
        fprintf(stderr, "ferry demo: out of memory for the page lists\n");
        return 1;
    }
    /* Decode ranks first: prefill ranks need their addresses. */
    for (int decode = 1; decode >= 0; decode--) {
        uint32_t tp = decode ? s->decode_tp : s->prefill_tp;
        for (uint32_t r = 0; r < tp; r++) {
            struct child *c = &d->kids[d->nkids];
            *c = (struct child){.decode = decode, .rank = r, .to = -1, .from = -1};
            if (spawn(d, c) != 0) {
                fprintf(stderr, "ferry demo: cannot start the %s rank %u process: %s\n",
                        decode ? "decode" : "prefill", r, strerror(errno));
                return 1;
            }
            d->nkids++;
        }
    }
    d->t_start = d->t_last_progress = demo_now_ns();
    uint64_t abort_at = 0;
    struct pollfd *pfd = calloc(d->nkids, sizeof *pfd);
    uint32_t *who = calloc(d->nkids, sizeof *who);
    if (!pfd || !who) return 1;
    for (;;) {
        if (interrupted) {
            add_failure(d, "ferry demo", 0, "interrupted by signal %d (%s); the ranks were stopped", (int)interrupted,
                        strsignal((int)interrupted));
            break;
        }
        uint64_t now = demo_now_ns();
        if (d->nfails && !abort_at) abort_at = now + 500000000ull; /* let the others say what they saw */
        if (abort_at && now >= abort_at) break;
        uint32_t open = 0;
        for (uint32_t i = 0; i < d->nkids; i++) {
            if (!d->kids[i].open) continue;
            pfd[open] = (struct pollfd){.fd = d->kids[i].from, .events = POLLIN};
            who[open++] = i;
        }
        if (open == 0) break;
        uint64_t limit_ns = ((uint64_t)s->timeout_ms + 5000) * 1000000ull;
        if (!abort_at && now - d->t_last_progress > limit_ns) {
            char what[256] = "";
            for (uint32_t r = 0; r < s->requests; r++) {
                const struct request *q = &d->reqs[r];
                if (q->state != REQ_ARMING && q->state != REQ_SENDING) continue;
                size_t n = strlen(what);
                snprintf(what + n, sizeof what - n, "%s request %u (%s)", n ? "," : " waiting for", r,
                         q->state == REQ_ARMING ? "decode arming" : q->sent < s->prefill_tp ? "prefill send" : "decode notice");
            }
            char stopped[512] = "";
            for (uint32_t i = 0; i < d->nkids; i++) {
                const struct child *c = &d->kids[i];
                if (!c->open || process_state(c->pid) != 'T') continue;
                char label[400];
                size_t n = strlen(stopped);
                snprintf(stopped + n, sizeof stopped - n, "; %s is stopped (SIGSTOP or a debugger)",
                         child_label(c, label, sizeof label));
            }
            add_failure(d, "ferry demo", FERRY_ERR_TIMEOUT,
                        "TIMEOUT (%d): no word from any rank for %.1f s while %s;%s%s", FERRY_ERR_TIMEOUT,
                        (double)(now - d->t_last_progress) / 1e9, phase_names[d->phase],
                        what[0] ? what : " nothing in flight", stopped);
            continue;
        }
        int n = poll(pfd, open, 100);
        if (n < 0 && errno != EINTR) {
            add_failure(d, "ferry demo", 0, "poll: %s", strerror(errno));
            break;
        }
        for (uint32_t k = 0; n > 0 && k < open; k++) {
            if (!pfd[k].revents) continue;
            struct child *c = &d->kids[who[k]];
            ssize_t got = demo_lines_fill(&c->lines);
            char *line;
            while (demo_lines_next(&c->lines, &line)) handle_line(d, c, line);
            if (got == 0 || (got < 0 && errno != EAGAIN)) child_gone(d, c);
        }
        if (d->phase == PHASE_QUIT) {
            int all = 1;
            for (uint32_t i = 0; i < d->nkids; i++) all &= !d->kids[i].open;
            if (all) break;
        }
    }
    free(pfd);
    free(who);
    progress_end(d);
    kill_children(d);
    return d->nfails ? 1 : 0;
}

static int cmd_demo(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
    struct demo *d = calloc(1, sizeof *d);
    if (!d) return 1;
    int rc = parse_opts(argc, argv, &d->o);
    if (rc == 0) {
        d->s = &d->o.shape;
        rc = memory_check(d);
    }
    if (rc != 0) {
        free(d);
        return rc;
    }
    const struct demo_shape *s = d->s;
    d->kids = calloc(s->prefill_tp + s->decode_tp, sizeof *d->kids);
    d->reqs = calloc(s->requests, sizeof *d->reqs);
    d->slot_busy = calloc(s->inflight, 1);
    d->paths = calloc((size_t)s->prefill_tp * s->decode_tp, sizeof *d->paths);
    if (!d->kids || !d->reqs || !d->slot_busy || !d->paths) {
        fprintf(stderr, "ferry demo: out of memory\n");
        return 1;
    }
    d->tty = isatty(STDERR_FILENO);
    the_demo = d;
    atexit(at_exit);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    rc = run(d);
    struct totals t;
    compute_totals(d, &t);
    int ok = rc == 0 && d->mismatch_bytes == 0 && t.n == s->requests;
    if (rc == 0 && !ok)
        add_failure(d, "ferry demo", 0, "only %u of %u requests verified", t.n, s->requests);
    if (d->o.json) print_json(d, &t, ok);
    else if (t.n) print_table(d, &t);
    if (ok) {
        if (!d->o.json) printf("  ferry demo: OK\n");
    } else {
        print_failures(d);
    }
    int status = interrupted ? 130 : ok ? 0 : 1;
    for (uint32_t i = 0; i < d->nkids; i++) {
        demo_lines_free(&d->kids[i].lines);
        free(d->kids[i].addrs);
    }
    for (uint32_t r = 0; r < s->requests; r++) {
        free(d->reqs[r].ppages);
        free(d->reqs[r].dpages);
    }
    free(d->palloc.ring);
    free(d->dalloc.ring);
    the_demo = NULL;
    free(d->kids);
    free(d->reqs);
    free(d->slot_busy);
    free(d->paths);
    free(d);
    return status;
}

FERRY_COMMAND("demo", cmd_demo, "the main job: a verified KV-cache transfer between prefill and decode processes")
