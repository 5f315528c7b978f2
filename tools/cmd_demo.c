/* SPDX-License-Identifier: Apache-2.0 */
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
#include "demo_orch.h"

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
    demo_human_bytes(hb, sizeof hb, (double)bytes);
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
        demo_human_bytes(rb, sizeof rb, (double)q->bytes);
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

/* Unless --overlap, a transfer is on the wire alone: a request is sent only
 * when no other one is between its send and its verified notice, and no
 * decode rank is checking pages (arming, retiring); those start only
 * between transfers. The ranks' own work takes the same cores as the
 * engines, and on small pages it costs more per byte (a 2 KiB page is a
 * short scattered read for the checker as for a copy): running during a
 * transfer, it was timed as the engine's, and made --page 1 look up to
 * twice as slow as the engines are. The prefill's fill of a request
 * happens before its submit stamp either way. */
static int transfer_on_wire(const struct demo *d)
{
    for (uint32_t r = 0; r < d->s->requests; r++)
        if (d->reqs[r].state == REQ_SENDING) return 1;
    return 0;
}

static int ranks_checking(const struct demo *d)
{
    for (uint32_t r = 0; r < d->s->requests; r++) {
        const struct request *q = &d->reqs[r];
        if (q->state == REQ_RETIRING || (q->state == REQ_ARMING && q->armed < d->s->decode_tp)) return 1;
    }
    return 0;
}

static void send_to_prefill(struct demo *d, uint32_t r);

/* Sends the armed requests in order: all of them with --overlap, else the
 * first one once nothing else is on the wire or being checked. */
static void send_armed(struct demo *d)
{
    const struct demo_shape *s = d->s;
    if (!s->overlap && (transfer_on_wire(d) || ranks_checking(d))) return;
    for (uint32_t r = 0; r < s->requests; r++) {
        const struct request *q = &d->reqs[r];
        if (q->state != REQ_ARMING || q->armed < s->decode_tp) continue;
        send_to_prefill(d, r);
        if (!s->overlap) return;
    }
}

static void admit(struct demo *d)
{
    const struct demo_shape *s = d->s;
    if (!s->overlap && transfer_on_wire(d)) return; /* arming checks pages: after this transfer */
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
    /* The decode ranks learn who their prefill sources are, to verify
     * their notices (<ferry/kv.h>, ferry_kv_recv_verify). */
    struct demo_str src = {0};
    for (uint32_t i = 0; i < d->nkids; i++)
        if (!d->kids[i].decode) demo_str_printf(&src, "source %u %s\n", d->kids[i].rank, d->kids[i].name);
    tell_role(d, 1, src.s, src.len);
    demo_str_free(&src);
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
        demo_print_header(d);
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
        if (++q->armed == s->decode_tp) send_armed(d);
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
            send_armed(d);
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
            send_armed(d);
            maybe_finish(d);
        }
    } else {
        goto garbled;
    }
    return;
garbled:
    child_failure(d, c, FERRY_ERR_INTERNAL, "INTERNAL (%d): unexpected message '%s'", FERRY_ERR_INTERNAL, cmd);
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
                const char *stage = q->state == REQ_SENDING ? (q->sent < s->prefill_tp ? "prefill send" : "decode notice")
                                    : q->armed < s->decode_tp ? "decode arming"
                                                              : "armed, waiting its turn";
                snprintf(what + n, sizeof what - n, "%s request %u (%s)", n ? "," : " waiting for", r, stage);
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
    struct demo *d = calloc(1, sizeof *d);
    if (!d) return 1;
    int rc = demo_parse_opts(argc, argv, &d->o);
    if (rc < 0) { /* --help */
        free(d);
        return 0;
    }
    if (rc == 0) {
        d->s = &d->o.shape;
        rc = demo_memory_check(d);
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
    demo_compute_totals(d, &t);
    int ok = rc == 0 && d->mismatch_bytes == 0 && t.n == s->requests;
    if (rc == 0 && !ok)
        add_failure(d, "ferry demo", 0, "only %u of %u requests verified", t.n, s->requests);
    if (d->o.json) demo_print_json(d, &t, ok);
    else if (t.n) demo_print_table(d, &t);
    if (ok) {
        if (!d->o.json) printf("  ferry demo: OK\n");
    } else {
        demo_print_failures(d);
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
