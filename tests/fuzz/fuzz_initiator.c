/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the initiator side against a hostile target. The input is
 * the byte stream a "target" answers with (handshake, segment pages,
 * acks, read data); the initiator opens a session and moves a write and a
 * read through it. It must never crash, hang past its deadlines, or
 * allocate by what the peer claims (segment counts, payload lengths). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ferry/ferry.h>

#include "fuzz.h"
#include "wire/wire.h"

static ferry_engine_t *ini;
static int lfd;
static char peer[64];
static unsigned char *buf;

static void setup(void)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 100;
    cfg.connect_timeout_ms = 100;
    cfg.retries = 0;
    cfg.conns_per_peer = 1;
    cfg.cancel_timeout_ms = 20; /* fences to the fake target never confirm */
    cfg.log_level = -1;
    if (ferry_engine_create(&cfg, &ini) != 0) abort();
    buf = malloc(8192);
    if (ferry_register(ini, buf, 8192, FERRY_MEM_LOCAL) != 0) abort();
    lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 16) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0)
        abort();
    snprintf(peer, sizeof peer, "127.0.0.1:%u", ntohs(sa.sin_port));
}

struct fake {
    const uint8_t *data;
    size_t size;
    atomic_bool stop;
};

/* The first connection gets the input, then EOF; later ones are closed. */
static void *fake_target(void *arg)
{
    struct fake *fk = arg;
    bool served = false;
    while (!atomic_load(&fk->stop)) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, 1) <= 0) continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        if (!served) {
            served = true;
            size_t off = 0;
            while (off < fk->size) {
                ssize_t n = send(fd, fk->data + off, fk->size - off, MSG_NOSIGNAL);
                if (n <= 0) break;
                off += (size_t)n;
            }
            shutdown(fd, SHUT_WR);
            char scratch[65536];
            struct pollfd q = {.fd = fd, .events = POLLIN};
            while (!atomic_load(&fk->stop) && poll(&q, 1, 1) >= 0) {
                if (!(q.revents & POLLIN)) continue;
                if (recv(fd, scratch, sizeof scratch, 0) <= 0) break;
            }
        }
        close(fd);
    }
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, setup);
    if (size > (256u << 10)) return 0;
    struct fake fk = {.data = data, .size = size};
    pthread_t t;
    pthread_create(&t, NULL, fake_target, &fk);
    if (ferry_session_open(ini, peer) == 0) {
        ferry_transfer_sync(ini, peer, FERRY_OP_WRITE, buf, FUZZ_REMOTE_ADDR, 4096);
        ferry_transfer_sync(ini, peer, FERRY_OP_READ, buf + 4096, FUZZ_REMOTE_ADDR, 4096);
        ferry_notify(ini, peer, "x", 1);
    }
    ferry_session_close(ini, peer);
    atomic_store(&fk.stop, true);
    pthread_join(t, NULL);
    return 0;
}

size_t fuzz_seed(int i, uint8_t *out, size_t cap)
{
    size_t pos = 0;
    if (i > 4) return 0;
    fuzz_put_hello(out, cap, &pos, FERRY_FRAME_HELLO_ACK, 0, 9);
    if (i == 0) return pos;
    uint8_t seg[FERRY_WIRE_SEGMENT_SIZE];
    ferry_wire_segment_t s = {FUZZ_REMOTE_ADDR, FUZZ_REMOTE_LEN, FERRY_MEM_REMOTE, 1};
    ferry_segment_encode(&s, seg);
    /* The initiator's request ids start at 1; the seeds follow its order. */
    fuzz_put_frame(out, cap, &pos, FERRY_FRAME_SEG_PAGE, 0, 0, 1, 1, 1, seg, sizeof seg);
    if (i == 1) return pos;
    if (i == 4) {
        fuzz_put_frame(out, cap, &pos, FERRY_FRAME_SEG_PAGE, 0, 0, 1ull << 40, 1, 1, seg, sizeof seg);
        return pos;
    }
    fuzz_put_frame(out, cap, &pos, FERRY_FRAME_SEG_PAGE, 0, 0, 1, 1, 1, seg, sizeof seg); /* refresh by open */
    fuzz_put_frame(out, cap, &pos, FERRY_FRAME_WRITE_ACK, i == 3 ? FERRY_ERR_OUT_OF_BOUNDS : 0, 1,
                   FUZZ_REMOTE_ADDR, 4096, 0, NULL, 0);
    fuzz_put_frame(out, cap, &pos, FERRY_FRAME_READ_RESP, 0, 2, FUZZ_REMOTE_ADDR, 4096, 0, NULL, 4096);
    fuzz_put_frame(out, cap, &pos, FERRY_FRAME_NOTIFY_ACK, 0, 0, 0, 0, 0, NULL, 0);
    return pos;
}
