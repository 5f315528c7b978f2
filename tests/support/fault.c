/* SPDX-License-Identifier: Apache-2.0 */
/* Fault-injection helpers (see fault.h). */
#include "fault.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ferry/ferry.h>

#include "wire/wire.h"

extern char **environ;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ------------------------------------------------ peer processes */

/* Reads one line within ms; 0 or -1. */
static int read_line(FILE *f, char *buf, size_t cap, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    for (;;) {
        struct pollfd p = {.fd = fileno(f), .events = POLLIN};
        int left = (int)(end > now_ms() ? end - now_ms() : 0);
        int n = poll(&p, 1, left);
        if (n <= 0) return -1;
        if (fgets(buf, (int)cap, f)) return 0;
        return -1;
    }
}

static void peer_path(char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) n = 0;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    snprintf(out, cap, "%s/ferry_test_peer", self);
}

int peer_spawn(peer_proc_t *p, const char *netns, const char *host, const char *const *args)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    char path[PATH_MAX];
    peer_path(path, sizeof path);
    const char *argv[64];
    int k = 0;
    if (netns) {
        argv[k++] = "ip";
        argv[k++] = "netns";
        argv[k++] = "exec";
        argv[k++] = netns;
    }
    argv[k++] = path;
    for (int i = 0; args && args[i] && k < 62; i++) argv[k++] = args[i];
    argv[k] = NULL;
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    int rc = posix_spawnp(&p->pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    if (rc != 0) {
        close(in[1]);
        close(out[0]);
        p->pid = -1;
        return -1;
    }
    p->in = fdopen(in[1], "w");
    p->out = fdopen(out[0], "r");
    /* Unbuffered: fgets then never reads past a line, so poll() tells
     * the truth about what is left. */
    setvbuf(p->out, NULL, _IONBF, 0);
    char line[256];
    unsigned port = 0;
    unsigned long long addr = 0, len = 0, epoch = 0;
    if (read_line(p->out, line, sizeof line, 30000) != 0 ||
        sscanf(line, "READY %u %llx %llu %llx", &port, &addr, &len, &epoch) != 4) {
        fprintf(stderr, "peer_spawn: no READY from %s\n", path);
        peer_end(p, SIGKILL);
        return -1;
    }
    p->port = (uint16_t)port;
    p->addr = addr;
    p->len = len;
    p->epoch = epoch;
    snprintf(p->name, sizeof p->name, "%s:%u", host ? host : "127.0.0.1", port);
    return 0;
}

int peer_cmd(peer_proc_t *p, const char *fmt, ...)
{
    if (!p->in) return -1;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->in, fmt, ap);
    va_end(ap);
    fputc('\n', p->in);
    if (fflush(p->in) != 0) return -1;
    char line[64];
    if (read_line(p->out, line, sizeof line, 30000) != 0) return -1;
    return strncmp(line, "OK", 2) == 0 ? 0 : 1;
}

long peer_query(peer_proc_t *p, const char *cmd)
{
    if (!p->in) return -1;
    fprintf(p->in, "%s\n", cmd);
    if (fflush(p->in) != 0) return -1;
    char line[64];
    long v = -1;
    if (read_line(p->out, line, sizeof line, 30000) != 0 || sscanf(line, "OK %ld", &v) != 1) return -1;
    return v;
}

void peer_end(peer_proc_t *p, int sig)
{
    if (p->pid > 0) {
        if (sig == 0 && p->in) {
            fputs("quit\n", p->in);
            fflush(p->in);
        } else {
            kill(p->pid, sig);
        }
        int status;
        uint64_t end = now_ms() + 10000;
        while (waitpid(p->pid, &status, WNOHANG) == 0) {
            if (now_ms() > end) {
                kill(p->pid, SIGKILL);
                waitpid(p->pid, &status, 0);
                break;
            }
            usleep(2000);
        }
    }
    if (p->in) fclose(p->in);
    if (p->out) fclose(p->out);
    p->in = p->out = NULL;
    p->pid = -1;
}

/* ------------------------------------------------------ proxy */

struct pair;

struct dir {
    struct pair *pair;
    int from, to;
    bool i2t;          /* initiator to target */
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    size_t hlen;
    uint64_t payload_left;
    bool corrupt_next;
    bool vector;            /* the current frame is a WRITEV */
    uint64_t rng;
    /* Frame faults (proxy_opts_t.drop_answer, dup_write, dup_answer): what goes out of
     * this chunk, the frame being copied for a repeat, and whether the
     * current frame is dropped. */
    uint8_t *out;
    size_t olen, ocap;
    uint8_t *dup;
    size_t dlen, dcap;
    bool duping, dropping;
};

struct pair {
    proxy_t *px;
    int a, b; /* a: initiator side, b: target side */
    pthread_t t[2];
    struct dir d[2];
    atomic_int running;
    atomic_bool cut;
    atomic_bool held;
    struct pair *next;
};

struct proxy {
    proxy_opts_t o;
    char host[64];
    uint16_t port;
    int lfd;
    char name[64];
    pthread_t acceptor;
    atomic_bool stopping, stalled;
    atomic_int corrupt_writes, corrupt_reads, cut_writes;
    atomic_int answers_seen, writes_seen, notify_answers_seen, notifies_seen, any_answers_seen;
    _Atomic uint64_t corrupted, cuts, dropped, duplicated;
    pthread_mutex_t lock;
    struct pair *pairs;
};

static double rand01(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (double)(*s >> 11) / 9007199254740992.0;
}

/* A well-mixed, non-zero xorshift state from (seed, stream). */
static uint64_t mix(uint64_t seed, uint64_t stream)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}

static void cut_pair(struct pair *pr)
{
    if (atomic_exchange(&pr->cut, true)) return;
    struct linger lg = {1, 0};
    setsockopt(pr->a, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    setsockopt(pr->b, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    shutdown(pr->a, SHUT_RDWR);
    shutdown(pr->b, SHUT_RDWR);
}

static bool take(atomic_int *budget)
{
    int v = atomic_load(budget);
    while (v != 0) {
        if (v < 0) return true;
        if (atomic_compare_exchange_weak(budget, &v, v - 1)) return true;
    }
    return false;
}

static void append(uint8_t **b, size_t *len, size_t *cap, const uint8_t *p, size_t n)
{
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 65536;
        while (c < *len + n) c *= 2;
        uint8_t *g = realloc(*b, c);
        if (!g) abort();
        *b = g;
        *cap = c;
    }
    memcpy(*b + *len, p, n);
    *len += n;
}

/* Frame faults: passes n bytes of the current frame on (or drops them). */
static void emit(struct dir *d, const uint8_t *p, size_t n)
{
    if (d->dropping) return;
    append(&d->out, &d->olen, &d->ocap, p, n);
    if (d->duping) append(&d->dup, &d->dlen, &d->dcap, p, n);
}

/* Frame faults: the current frame ended. True: cut the connection now. */
static bool frame_end(struct dir *d)
{
    if (d->duping) {
        append(&d->out, &d->olen, &d->ocap, d->dup, d->dlen);
        d->duping = false;
        d->dlen = 0;
        atomic_fetch_add(&d->pair->px->duplicated, 1);
    }
    if (!d->dropping) return false;
    d->dropping = false;
    atomic_fetch_add(&d->pair->px->dropped, 1);
    return true;
}

static bool frame_faults(const proxy_t *px)
{
    return px->o.drop_answer > 0 || px->o.dup_write > 0 || px->o.drop_notify_answer > 0 || px->o.dup_notify > 0 ||
           px->o.dup_answer > 0;
}

/* Follows the frame stream and flips one payload byte of chosen frames.
 * Returns true when the connection is to be cut before forwarding. With
 * frame faults (proxy_opts_t), what to forward is left in d->out, d->olen:
 * cut after forwarding it. */
static bool parse(struct dir *d, uint8_t *buf, size_t n)
{
    bool cut = false;
    proxy_t *px = d->pair->px;
    bool faults = frame_faults(px);
    d->olen = 0;
    size_t i = 0;
    while (i < n && !(faults && cut)) {
        if (d->payload_left > 0) {
            size_t k = n - i < d->payload_left ? n - i : (size_t)d->payload_left;
            /* A WRITEV's payload starts with its descriptors: corrupt the
             * last byte, a piece's, as the frame's end passes. */
            if (d->corrupt_next && (!d->vector || k == d->payload_left)) {
                buf[d->vector ? i + k - 1 : i + k / 2] ^= 0x20;
                d->corrupt_next = false;
                atomic_fetch_add(&px->corrupted, 1);
            }
            if (faults) emit(d, buf + i, k);
            i += k;
            d->payload_left -= k;
            if (faults && d->payload_left == 0) cut = frame_end(d);
            continue;
        }
        size_t k = FERRY_FRAME_HEADER_SIZE - d->hlen;
        if (k > n - i) k = n - i;
        memcpy(d->hdr + d->hlen, buf + i, k);
        d->hlen += k;
        i += k;
        if (d->hlen < FERRY_FRAME_HEADER_SIZE) break;
        d->hlen = 0;
        uint8_t type = d->hdr[4];
        uint32_t plen = (uint32_t)d->hdr[12] | (uint32_t)d->hdr[13] << 8 | (uint32_t)d->hdr[14] << 16 |
                        (uint32_t)d->hdr[15] << 24;
        d->payload_left = plen;
        d->corrupt_next = false;
        uint64_t data = 0; /* a VEC_ACK's bytes (the answer to a READV) */
        for (int b = 7; b >= 0; b--) data = data << 8 | d->hdr[24 + b];
        d->vector = type == FERRY_FRAME_WRITEV || (type == FERRY_FRAME_VEC_ACK && data > 0);
        if (faults) {
            /* A WRITEV's VEC_ACK says in addr how many bytes were placed
             * and carries at most statuses; a READV's carries its bytes. */
            bool answer = type == FERRY_FRAME_WRITE_ACK || (type == FERRY_FRAME_VEC_ACK && plen < data);
            if (!d->i2t && answer && px->o.drop_answer > 0 && atomic_fetch_add(&px->answers_seen, 1) + 1 == px->o.drop_answer)
                d->dropping = true;
            bool write = px->o.dup_type ? type == px->o.dup_type
                                        : type == FERRY_FRAME_WRITE || type == FERRY_FRAME_WRITEV;
            if (d->i2t && write && px->o.dup_write > 0 && atomic_fetch_add(&px->writes_seen, 1) + 1 == px->o.dup_write)
                d->duping = true;
            if (!d->i2t && type == FERRY_FRAME_NOTIFY_ACK && px->o.drop_notify_answer > 0 &&
                atomic_fetch_add(&px->notify_answers_seen, 1) + 1 == px->o.drop_notify_answer)
                d->dropping = true;
            if (d->i2t && type == FERRY_FRAME_NOTIFY && px->o.dup_notify > 0 &&
                atomic_fetch_add(&px->notifies_seen, 1) + 1 == px->o.dup_notify)
                d->duping = true;
            bool any_answer = type == FERRY_FRAME_READ_RESP || type == FERRY_FRAME_WRITE_ACK ||
                              type == FERRY_FRAME_VEC_ACK || type == FERRY_FRAME_NOTIFY_ACK;
            if (!d->i2t && any_answer && px->o.dup_answer > 0 &&
                atomic_fetch_add(&px->any_answers_seen, 1) + 1 == px->o.dup_answer)
                d->duping = true;
            emit(d, d->hdr, FERRY_FRAME_HEADER_SIZE);
            if (plen == 0) cut = frame_end(d);
        }
        if (plen == 0) continue;
        if (d->i2t && type == FERRY_FRAME_WRITE && take(&px->cut_writes)) cut = true;
        if (d->i2t && (type == FERRY_FRAME_WRITE || type == FERRY_FRAME_WRITEV))
            d->corrupt_next = take(&px->corrupt_writes) || rand01(&d->rng) < px->o.corrupt_prob;
        else if (!d->i2t && (type == FERRY_FRAME_READ_RESP || d->vector))
            d->corrupt_next = take(&px->corrupt_reads) || rand01(&d->rng) < px->o.corrupt_prob;
    }
    return cut;
}

static int send_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) {
            if (k < 0 && errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void *pump(void *arg)
{
    struct dir *d = arg;
    struct pair *pr = d->pair;
    proxy_t *px = pr->px;
    static const size_t cap = 64 << 10;
    uint8_t *buf = malloc(cap);
    while (buf && !atomic_load(&pr->cut) && !atomic_load(&px->stopping)) {
        if (atomic_load(&px->stalled) || atomic_load(&pr->held)) {
            usleep(2000);
            continue;
        }
        struct pollfd p = {.fd = d->from, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0) continue;
        ssize_t n = recv(d->from, buf, cap, 0);
        if (n <= 0) break;
        if (px->o.delay_ms) usleep((useconds_t)px->o.delay_ms * 1000);
        while ((atomic_load(&px->stalled) || atomic_load(&pr->held)) && !atomic_load(&px->stopping)) usleep(2000);
        bool cut = parse(d, buf, (size_t)n);
        if (frame_faults(px)) {
            /* What came before the fault goes on; then the cut. */
            if (d->olen && send_all(d->to, d->out, d->olen) != 0) break;
            if (cut) {
                atomic_fetch_add(&px->cuts, 1);
                break;
            }
            continue;
        }
        if (cut || (px->o.cut_prob > 0 && rand01(&d->rng) < px->o.cut_prob)) {
            atomic_fetch_add(&px->cuts, 1);
            break;
        }
        if (send_all(d->to, buf, (size_t)n) != 0) break;
    }
    free(buf);
    free(d->out);
    free(d->dup);
    cut_pair(pr);
    atomic_fetch_sub(&pr->running, 1);
    return NULL;
}

/* Joins and frees finished pairs (all of them when all is set). */
static void reap(proxy_t *px, bool all)
{
    pthread_mutex_lock(&px->lock);
    struct pair **pp = &px->pairs;
    while (*pp) {
        struct pair *pr = *pp;
        if (all) cut_pair(pr);
        if (all || atomic_load(&pr->running) == 0) {
            *pp = pr->next;
            pthread_join(pr->t[0], NULL);
            pthread_join(pr->t[1], NULL);
            close(pr->a);
            close(pr->b);
            free(pr);
        } else {
            pp = &pr->next;
        }
    }
    pthread_mutex_unlock(&px->lock);
}

static int connect_to(const char *host, uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void *acceptor(void *arg)
{
    proxy_t *px = arg;
    uint64_t serial = 0;
    while (!atomic_load(&px->stopping)) {
        struct pollfd p = {.fd = px->lfd, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0) {
            reap(px, false);
            continue;
        }
        int a = accept4(px->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (a < 0) continue;
        int one = 1;
        setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int b = connect_to(px->host, px->port);
        if (b < 0) {
            close(a);
            continue;
        }
        struct pair *pr = calloc(1, sizeof *pr);
        pr->px = px;
        pr->a = a;
        pr->b = b;
        atomic_store(&pr->running, 2);
        pr->d[0] = (struct dir){.pair = pr, .from = a, .to = b, .i2t = true, .rng = mix(px->o.seed, 2 * serial)};
        pr->d[1] = (struct dir){.pair = pr, .from = b, .to = a, .i2t = false, .rng = mix(px->o.seed, 2 * serial + 1)};
        serial++;
        pthread_mutex_lock(&px->lock);
        pthread_create(&pr->t[0], NULL, pump, &pr->d[0]);
        pthread_create(&pr->t[1], NULL, pump, &pr->d[1]);
        pr->next = px->pairs;
        px->pairs = pr;
        pthread_mutex_unlock(&px->lock);
    }
    return NULL;
}

proxy_t *proxy_start(const char *host, uint16_t port, const proxy_opts_t *o)
{
    proxy_t *px = calloc(1, sizeof *px);
    if (o) px->o = *o;
    if (!px->o.seed) px->o.seed = 1;
    snprintf(px->host, sizeof px->host, "%s", host);
    px->port = port;
    atomic_store(&px->corrupt_writes, px->o.corrupt_writes);
    atomic_store(&px->corrupt_reads, px->o.corrupt_reads);
    atomic_store(&px->cut_writes, px->o.cut_writes);
    pthread_mutex_init(&px->lock, NULL);
    px->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    if (bind(px->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(px->lfd, 128) != 0 ||
        getsockname(px->lfd, (struct sockaddr *)&sa, &sl) != 0) {
        close(px->lfd);
        free(px);
        return NULL;
    }
    snprintf(px->name, sizeof px->name, "127.0.0.1:%u", ntohs(sa.sin_port));
    pthread_create(&px->acceptor, NULL, acceptor, px);
    return px;
}

const char *proxy_name(const proxy_t *p) { return p->name; }
void proxy_stall(proxy_t *p, bool on) { atomic_store(&p->stalled, on); }
uint64_t proxy_corrupted(const proxy_t *p) { return atomic_load(&((proxy_t *)p)->corrupted); }
uint64_t proxy_cuts(const proxy_t *p) { return atomic_load(&((proxy_t *)p)->cuts); }
uint64_t proxy_dropped(const proxy_t *p) { return atomic_load(&((proxy_t *)p)->dropped); }
uint64_t proxy_duplicated(const proxy_t *p) { return atomic_load(&((proxy_t *)p)->duplicated); }

void proxy_hold(proxy_t *p, bool on)
{
    pthread_mutex_lock(&p->lock);
    for (struct pair *pr = p->pairs; pr; pr = pr->next) atomic_store(&pr->held, on);
    pthread_mutex_unlock(&p->lock);
}

void proxy_cut_all(proxy_t *p)
{
    pthread_mutex_lock(&p->lock);
    for (struct pair *pr = p->pairs; pr; pr = pr->next) {
        if (!atomic_load(&pr->cut)) atomic_fetch_add(&p->cuts, 1);
        cut_pair(pr);
    }
    pthread_mutex_unlock(&p->lock);
}

void proxy_stop(proxy_t *p)
{
    if (!p) return;
    atomic_store(&p->stopping, true);
    pthread_join(p->acceptor, NULL);
    reap(p, true);
    close(p->lfd);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* ------------------------------------------------------ misc */

int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void *nothing(void *arg) { return arg; }

int thread_baseline(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) == 0) pthread_join(t, NULL);
    return wait_thread_count(0, 50);
}

int wait_thread_count(int n, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    int c;
    while ((c = thread_count()) > n && now_ms() < end) usleep(5000);
    return c;
}

int run_cmd(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return st < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ------------------------------------------- raw peers (rogue clients) */

int raw_connect(uint16_t port) { return connect_to("127.0.0.1", port); }

int raw_send_bytes(int fd, const void *p, size_t n) { return send_all(fd, p, n); }

int raw_send(int fd, const ferry_frame_t *f, const void *payload)
{
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(f, hdr);
    if (send_all(fd, hdr, sizeof hdr) != 0) return -1;
    return f->plen && payload ? send_all(fd, payload, f->plen) : 0;
}

static int recv_all(int fd, void *buf, size_t n, uint64_t end)
{
    uint8_t *p = buf;
    while (n > 0) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = (int)(end > now_ms() ? end - now_ms() : 0);
        int r = poll(&pf, 1, left);
        if (r == 0) return -2;
        if (r < 0) return -1;
        ssize_t k = recv(fd, p, n, 0);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int raw_recv(int fd, ferry_frame_t *f, void *payload, size_t cap, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    int rc = recv_all(fd, hdr, sizeof hdr, end);
    if (rc) return rc;
    if (ferry_frame_decode(hdr, f) != 0) return -3;
    size_t take_n = f->plen < cap ? f->plen : cap;
    if (take_n && (rc = recv_all(fd, payload, take_n, end)) != 0) return rc;
    uint8_t scratch[4096];
    for (size_t left = f->plen - take_n; left > 0;) {
        size_t k = left < sizeof scratch ? left : sizeof scratch;
        if ((rc = recv_all(fd, scratch, k, end)) != 0) return rc;
        left -= k;
    }
    if (payload && take_n < cap) ((char *)payload)[take_n] = '\0';
    return 0;
}

void raw_send_frame(int fd, ferry_frame_t f, const void *payload)
{
    if (raw_send(fd, &f, payload) == 0) return;
    fprintf(stderr, "raw_send_frame: sending frame type %u (%u payload bytes) on fd %d failed: %s\n", f.type, f.plen,
            fd, strerror(errno));
    abort();
}

ferry_frame_t raw_recv_frame(int fd, void *payload, size_t cap)
{
    ferry_frame_t f = {0};
    int rc = raw_recv(fd, &f, payload, cap, 30000);
    if (rc == -1) return (ferry_frame_t){0};
    if (rc == 0) return f;
    fprintf(stderr, "raw_recv_frame: on fd %d: %s\n", fd,
            rc == -2 ? "no frame within 30 s" : "undecodable frame header");
    abort();
}

int raw_hello_with(uint16_t port, const ferry_hello_t *h, ferry_frame_t *ack, void *ackbuf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "raw_hello: connecting to 127.0.0.1:%u failed: %s\n", port, strerror(errno));
        abort();
    }
    uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    int n = ferry_hello_encode(h, buf, sizeof buf);
    if (n <= 0) {
        fprintf(stderr, "raw_hello: encoding the HELLO of engine %llu failed\n", (unsigned long long)h->engine_id);
        abort();
    }
    raw_send_frame(fd, (ferry_frame_t){.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n}, buf);
    *ack = raw_recv_frame(fd, ackbuf, cap);
    return fd;
}

int raw_hello_as(uint16_t port, uint64_t engine_id, ferry_frame_t *ack, void *ackbuf, size_t cap)
{
    ferry_hello_t h;
    memset(&h, 0, sizeof h);
    h.proto_min = h.proto_max = FERRY_PROTOCOL_VERSION;
    h.engine_id = engine_id;
    h.epoch = 1;
    snprintf(h.name, sizeof h.name, "raw-%llu", (unsigned long long)engine_id);
    return raw_hello_with(port, &h, ack, ackbuf, cap);
}

bool raw_closed_within(int fd, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    uint8_t scratch[4096];
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int left = (int)(end > now_ms() ? end - now_ms() : 0);
        int r = poll(&pf, 1, left);
        if (r <= 0) return false;
        ssize_t k = recv(fd, scratch, sizeof scratch, 0);
        if (k <= 0) return true; /* EOF or reset; data before it is skipped */
    }
}

int raw_hello(int fd, uint32_t flags, const uint8_t *nonce, uint8_t *hello, size_t *hlen, uint8_t *ack,
              size_t *alen, int *status)
{
    ferry_hello_t h;
    memset(&h, 0, sizeof h);
    h.proto_min = h.proto_max = FERRY_PROTOCOL_VERSION;
    h.flags = flags;
    h.engine_id = 0x0badc0de;
    h.epoch = 1;
    h.pid = 1;
    if (nonce) memcpy(h.nonce, nonce, FERRY_WIRE_NONCE_SIZE);
    snprintf(h.name, sizeof h.name, "rogue:1");
    int n = ferry_hello_encode(&h, hello, FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME);
    if (n < 0) return -1;
    *hlen = (size_t)n;
    ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n};
    if (raw_send(fd, &f, hello) != 0) return -1;
    ferry_frame_t a;
    int rc = raw_recv(fd, &a, ack, FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME, 5000);
    if (rc) return rc;
    if (a.type != FERRY_FRAME_HELLO_ACK) return -3;
    *alen = a.plen;
    *status = a.status;
    return 0;
}

/* fd after a plain HELLO the target accepted, or -1 (fd closed). */
static int handshaken_or_closed(int fd)
{
    if (fd < 0) return -1;
    uint8_t h[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME], a[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME + 1];
    size_t hl, al;
    int status = -1;
    if (raw_hello(fd, 0, NULL, h, &hl, a, &al, &status) != 0 || status != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int raw_handshaken(uint16_t port) { return handshaken_or_closed(raw_connect(port)); }

int raw_connect_from(int last, uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)last)};
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(fd, (struct sockaddr *)&me, sizeof me) != 0 || connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int raw_handshaken_from(int last, uint16_t port) { return handshaken_or_closed(raw_connect_from(last, port)); }
