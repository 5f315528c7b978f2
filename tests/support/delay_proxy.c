/* SPDX-License-Identifier: Apache-2.0 */
/* The delay proxy of delay_proxy.h: one thread accepts, two threads pump
 * each connection (one a direction). A pump reads as fast as its source
 * gives (up to a cap), stamps each chunk with the time it may leave, and
 * writes chunks out when due and the rate allows. */
#include "delay_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define CHUNK (64u << 10)
#define QUEUE_CAP (96u << 20)

struct chunk {
    struct chunk *next;
    uint64_t due_ns;
    size_t len, off;
    unsigned char data[];
};

struct pump {
    delay_proxy_t *proxy;
    int src, dst;
    bool to_target;
    pthread_t thread;
};

struct link {
    struct link *next;
    int client, server; /* server = -1 for a frozen connection */
    struct pump up, down;
    bool started;
};

struct delay_proxy {
    int listen_fd;
    int stop_pipe[2];
    uint16_t port;
    char name[64];
    uint16_t target_port;
    int latency_ms;
    size_t rate;
    atomic_bool frozen;
    atomic_bool stalled;
    _Atomic uint64_t to_target;
    atomic_int connections;
    pthread_t acceptor;
    pthread_mutex_t lock;
    struct link *links;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *pump_main(void *arg)
{
    struct pump *pu = arg;
    delay_proxy_t *px = pu->proxy;
    struct chunk *head = NULL, *tail = NULL;
    size_t queued = 0;
    bool src_done = false, dst_dead = false;
    uint64_t next_send = 0;
    for (;;) {
        if (src_done && !head) break;
        if (atomic_load(&px->stalled)) {
            /* Nothing read, nothing sent: the far side looks stopped. */
            struct pollfd stop = {.fd = px->stop_pipe[0], .events = POLLIN};
            if (poll(&stop, 1, 10) > 0) break;
            continue;
        }
        uint64_t now = now_ns();
        int timeout = -1;
        if (head) {
            uint64_t when = head->due_ns > next_send ? head->due_ns : next_send;
            timeout = when <= now ? 0 : (int)((when - now) / 1000000u) + 1;
        }
        struct pollfd p[2] = {{.fd = px->stop_pipe[0], .events = POLLIN},
                              {.fd = pu->src, .events = (short)(!src_done && queued < QUEUE_CAP ? POLLIN : 0)}};
        int n = poll(p, 2, timeout);
        if (n < 0 && errno != EINTR) break;
        if (p[0].revents) break;
        if (p[1].revents) {
            struct chunk *c = malloc(sizeof *c + CHUNK);
            ssize_t got = recv(pu->src, c->data, CHUNK, MSG_DONTWAIT);
            if (got > 0) {
                c->next = NULL;
                c->len = (size_t)got;
                c->off = 0;
                c->due_ns = now_ns() + (uint64_t)px->latency_ms * 1000000ull;
                if (tail)
                    tail->next = c;
                else
                    head = c;
                tail = c;
                queued += (size_t)got;
            } else {
                free(c);
                if (got == 0 || (errno != EAGAIN && errno != EINTR)) src_done = true;
            }
        }
        now = now_ns();
        while (head && head->due_ns <= now && next_send <= now) {
            size_t k = head->len - head->off;
            if (px->rate && k > 16384) k = 16384;
            if (dst_dead) {
                /* The far side is gone: swallow what arrives, like a network
                 * whose receiver vanished. */
            } else {
                /* Counted before the send: the target may answer, and the
                 * initiator read the count, before this thread runs again. */
                if (pu->to_target) atomic_fetch_add(&px->to_target, k);
                ssize_t w = send(pu->dst, head->data + head->off, k, MSG_NOSIGNAL);
                size_t sent = w > 0 ? (size_t)w : 0;
                if (pu->to_target && sent < k) atomic_fetch_sub(&px->to_target, k - sent);
                if (w <= 0) {
                    dst_dead = true;
                } else {
                    k = sent;
                }
            }
            head->off += k;
            queued -= k;
            if (px->rate) next_send = (next_send > now ? next_send : now) + (uint64_t)k * 1000000000ull / px->rate;
            if (head->off == head->len) {
                struct chunk *c = head;
                head = c->next;
                if (!head) tail = NULL;
                free(c);
            }
            now = now_ns();
        }
    }
    while (head) {
        struct chunk *c = head;
        head = c->next;
        free(c);
    }
    shutdown(pu->dst, SHUT_WR);
    return NULL;
}

static int connect_target(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void *acceptor_main(void *arg)
{
    delay_proxy_t *px = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = px->stop_pipe[0], .events = POLLIN}, {.fd = px->listen_fd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0 && errno != EINTR) break;
        if (p[0].revents) break;
        if (!(p[1].revents & POLLIN)) continue;
        int fd = accept4(px->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0 && errno == EINVAL) break; /* the listener was shut down */
        if (fd < 0) continue;
        atomic_fetch_add(&px->connections, 1);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct link *l = calloc(1, sizeof *l);
        l->client = fd;
        l->server = atomic_load(&px->frozen) ? -1 : connect_target(px->target_port);
        if (l->server >= 0) {
            l->up = (struct pump){px, l->client, l->server, true, 0};
            l->down = (struct pump){px, l->server, l->client, false, 0};
            pthread_create(&l->up.thread, NULL, pump_main, &l->up);
            pthread_create(&l->down.thread, NULL, pump_main, &l->down);
            l->started = true;
        } else if (!atomic_load(&px->frozen)) {
            close(fd); /* the target is gone: refuse like it would */
            free(l);
            continue;
        }
        pthread_mutex_lock(&px->lock);
        l->next = px->links;
        px->links = l;
        pthread_mutex_unlock(&px->lock);
    }
    return NULL;
}

delay_proxy_t *delay_proxy_start(uint16_t target_port, int latency_ms, size_t rate)
{
    delay_proxy_t *px = calloc(1, sizeof *px);
    assert_non_null(px);
    px->target_port = target_port;
    px->latency_ms = latency_ms;
    px->rate = rate;
    pthread_mutex_init(&px->lock, NULL);
    assert_int_equal(pipe2(px->stop_pipe, O_CLOEXEC), 0);
    px->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(px->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(px->listen_fd, 64), 0);
    socklen_t sl = sizeof a;
    getsockname(px->listen_fd, (struct sockaddr *)&a, &sl);
    px->port = ntohs(a.sin_port);
    snprintf(px->name, sizeof px->name, "127.0.0.1:%u", px->port);
    assert_int_equal(pthread_create(&px->acceptor, NULL, acceptor_main, px), 0);
    return px;
}

const char *delay_proxy_name(const delay_proxy_t *p) { return p->name; }
void delay_proxy_freeze_new(delay_proxy_t *p, bool frozen) { atomic_store(&p->frozen, frozen); }

void delay_proxy_stall(delay_proxy_t *p, bool stalled) { atomic_store(&p->stalled, stalled); }
/* Linux takes a listening socket out of LISTEN on shutdown: connects are
 * refused from then on, and the acceptor's accept fails with EINVAL. */
void delay_proxy_refuse_new(delay_proxy_t *p) { shutdown(p->listen_fd, SHUT_RDWR); }
uint64_t delay_proxy_bytes_to_target(delay_proxy_t *p) { return atomic_load(&p->to_target); }
int delay_proxy_connections(delay_proxy_t *p) { return atomic_load(&p->connections); }

void delay_proxy_stop(delay_proxy_t *px)
{
    if (!px) return;
    if (write(px->stop_pipe[1], "x", 1) != 1) { /* the pumps also end with their sockets */ }
    pthread_join(px->acceptor, NULL);
    struct link *l = px->links;
    while (l) {
        struct link *next = l->next;
        if (l->started) {
            pthread_join(l->up.thread, NULL);
            pthread_join(l->down.thread, NULL);
        }
        close(l->client);
        if (l->server >= 0) close(l->server);
        free(l);
        l = next;
    }
    close(px->listen_fd);
    close(px->stop_pipe[0]);
    close(px->stop_pipe[1]);
    pthread_mutex_destroy(&px->lock);
    free(px);
}
