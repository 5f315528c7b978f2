/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the target side of a connection, handshake first. The
 * input is the byte stream an initiator sends (the first byte picks an
 * engine without or with a shared secret); the engine serves it over a
 * socketpair until it ends, as it would a TCP connection. The engine must
 * never crash, hang, allocate without bound, or touch memory outside its
 * remote-accessible registration. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ferry/ferry.h>

#include "engine/testing.h"
#include "link/conn.h"
#include "util/crc32c.h"
#include "fuzz.h"
#include "serve/serve.h"
#include "wire/wire.h"

static ferry_engine_t *engines[2];
static unsigned char *remote, *local_only, *guard;

static void setup(void)
{
    for (int i = 0; i < 2; i++) {
        ferry_config_t cfg;
        ferry_config_init(&cfg);
        cfg.timeout_ms = 100;
        cfg.connect_timeout_ms = 100;
        cfg.log_level = -1; /* quiet: every drop would log a warning */
        cfg.secret = i ? "fuzz-secret" : NULL;
        if (ferry_engine_create(&cfg, &engines[i]) != 0) abort();
    }
    /* The remote buffer at a fixed address if possible (so that inputs can
     * name it), between two guard pages that nothing may touch. */
    unsigned char *m = mmap((void *)(FUZZ_REMOTE_ADDR - 4096), FUZZ_REMOTE_LEN + 8192, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED) m = mmap(NULL, FUZZ_REMOTE_LEN + 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) abort();
    mprotect(m, 4096, PROT_NONE);
    mprotect(m + 4096 + FUZZ_REMOTE_LEN, 4096, PROT_NONE);
    remote = m + 4096;
    guard = m;
    local_only = malloc(4096);
    for (int i = 0; i < 2; i++) {
        if (ferry_register(engines[i], remote, FUZZ_REMOTE_LEN, FERRY_MEM_REMOTE) != 0) abort();
        if (ferry_register(engines[i], local_only, 4096, FERRY_MEM_LOCAL) != 0) abort();
    }
}

static void *drain(void *arg)
{
    int fd = *(int *)arg;
    char buf[65536];
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, setup);
    if (size < 1 || size > (1u << 20)) return 0;
    ferry_engine_t *e = engines[data[0] & 1];
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    int big = 4 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    /* The whole stream is queued first, then the initiator half-closes:
     * the engine sees every byte, then EOF, and never waits on us. */
    size_t off = 1;
    while (off < size) {
        ssize_t n = send(sv[0], data + off, size - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n <= 0) break;
        off += (size_t)n;
    }
    shutdown(sv[0], SHUT_WR);
    pthread_t t;
    pthread_create(&t, NULL, drain, &sv[0]);
    ferry_conn_t *c = calloc(1, sizeof *c);
    c->fd = sv[1];
    ferry_test_conn_bind(c, e);
    strcpy(c->remote, "fuzz");
    ferry_serve_connection(c);
    shutdown(c->fd, SHUT_RDWR);
    ferry_conn_free(c); /* closes sv[1] */
    pthread_join(t, NULL);
    close(sv[0]);
    /* Notifications queue up: drop them, as an application would read them. */
    ferry_notification_t got[64];
    long k;
    while ((k = ferry_get_notifications(e, got, 64)) > 0) ferry_notifications_free(got, (size_t)k);
    return 0;
}

size_t fuzz_seed(int i, uint8_t *buf, size_t cap)
{
    size_t pos = 0;
    if (i > 16) return 0;
    buf[pos++] = i == 9 ? 1 : 0; /* engine: 0 plain, 1 with a secret */
    fuzz_put_hello(buf, cap, &pos, FERRY_FRAME_HELLO, i == 9 ? FERRY_HELLO_F_AUTH : 0, 1);
    switch (i) {
    case 0: break;
    case 1: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_SEG_QUERY, 0, 1, 0, 0, 0, NULL, 0); break;
    case 2: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_WRITE, 0, 2, FUZZ_REMOTE_ADDR, 64, 0, NULL, 64); break;
    case 3: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_READ_REQ, 0, 3, FUZZ_REMOTE_ADDR + 100, 64, 0, NULL, 0); break;
    case 4: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_NOTIFY, 0, 4, 0, 0, 0, "done", 4); break;
    case 5: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_PING, 0, 5, 0, 0, 0, NULL, 0); break;
    case 6: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_CANCEL, 0, 6, 0, 0, 0, NULL, 0); break;
    case 7: {
        /* A checksummed write and a few frames in a row. */
        uint8_t d[32];
        memset(d, 1, sizeof d);
        size_t at = pos;
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_WRITE, 0, 7, FUZZ_REMOTE_ADDR + 8, 32, 0, d, 32);
        ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .flags = FERRY_FRAME_F_CRC, .req_id = 7,
                           .addr = FUZZ_REMOTE_ADDR + 8, .len = 32, .plen = 32, .crc = ferry_crc32c(0, d, 32)};
        ferry_frame_encode(&f, buf + at);
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_SEG_QUERY, 0, 8, 0, 0, 1, NULL, 0);
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_READ_REQ, 0, 9, FUZZ_REMOTE_ADDR, 4096, 0, NULL, 0);
        break;
    }
    case 8: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_WRITE, 0, 10, FUZZ_REMOTE_ADDR + FUZZ_REMOTE_LEN - 8, 64, 0, NULL, 64); break;
    case 9: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_AUTH, 0, 0, 0, 0, 0, NULL, 32); break;
    case 10:
    case 11: {
        /* Vector frames: a piece in range, one running past the region's
         * end, one unregistered, one in range again (11: checksummed). */
        uint64_t a[4] = {FUZZ_REMOTE_ADDR, FUZZ_REMOTE_ADDR + FUZZ_REMOTE_LEN - 8, 0x1000, FUZZ_REMOTE_ADDR + 512};
        uint32_t l[4] = {64, 64, 16, 100};
        fuzz_put_vector(buf, cap, &pos, FERRY_FRAME_WRITEV, 0, i == 11, 4, a, l);
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_PING, 0, 11, 0, 0, 0, NULL, 0);
        break;
    }
    case 12: {
        uint64_t a[2] = {FUZZ_REMOTE_ADDR, FUZZ_REMOTE_ADDR + 4096};
        uint32_t l[2] = {128, 2048};
        fuzz_put_vector(buf, cap, &pos, FERRY_FRAME_CMA_VEC, FERRY_OP_WRITE, false, 2, a, l);
        break;
    }
    case 13: {
        /* A vector read: served, past the end, and unregistered pieces. */
        uint64_t a[3] = {FUZZ_REMOTE_ADDR + 64, FUZZ_REMOTE_ADDR + FUZZ_REMOTE_LEN - 4, 0x2000};
        uint32_t l[3] = {256, 64, 32};
        fuzz_put_vector(buf, cap, &pos, FERRY_FRAME_READV, 0, false, 3, a, l);
        break;
    }
    case 14:
    case 15: {
        /* Compact (protocol 3): pieces in range, one past the end, one far
         * out; 15: a checksummed WRITEV, else a READV. */
        uint32_t idx[4] = {0, 3, FUZZ_REMOTE_LEN / 64, 1000000};
        fuzz_put_compact(buf, cap, &pos, i == 15 ? FERRY_FRAME_WRITEV : FERRY_FRAME_READV, 0, i == 15, 4,
                         FUZZ_REMOTE_ADDR, 64, 64, idx);
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_PING, 0, 12, 0, 0, 0, NULL, 0);
        break;
    }
    case 16: {
        /* Whole-connection fences (core/cancel.h): a key no connection
         * has, a write after it, then key 0 (refused). */
        ferry_frame_t c = {.type = FERRY_FRAME_CANCEL, .flags = FERRY_FRAME_F_CONN, .req_id = 13, .aux = 0x1234};
        if (pos + 2 * FERRY_FRAME_HEADER_SIZE + 64 > cap) break;
        ferry_frame_encode(&c, buf + pos);
        pos += FERRY_FRAME_HEADER_SIZE;
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_WRITE, 0, 14, FUZZ_REMOTE_ADDR, 64, 0, NULL, 64);
        c.aux = 0;
        ferry_frame_encode(&c, buf + pos);
        pos += FERRY_FRAME_HEADER_SIZE;
        break;
    }
    }
    return pos;
}
