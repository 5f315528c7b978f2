/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: a whole session on one connection, as a sequence of frames.
 * Where fuzz_handshake mutates raw bytes (and so mostly breaks framing on
 * the first header), here the input is a list of 8-byte operations that
 * are each encoded into a well-framed frame: the fuzzer explores orders
 * and combinations of valid and nearly valid frames -- data before the
 * handshake, a second HELLO, AUTH at the wrong time, writes and reads at
 * every edge of the registered range, lengths that overflow when added to
 * the address, cancels of requests not yet sent, notifications, segment
 * queries past the end -- and the state they leave behind. The engine
 * must never crash, hang, allocate without bound, or touch memory outside
 * its remote-accessible registration (guard pages around it).
 *
 * Input: byte 0 bit 0 picks the engine (plain or with a shared secret),
 * bit 1 whether a HELLO comes first; then operations of 8 bytes:
 *   type, flags, addr selector, len selector, plen selector, req_id,
 *   aux selector, payload fill byte. */
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

#define MAX_OPS 64
#define MAX_PAYLOAD 8192u

static ferry_engine_t *engines[2];
static unsigned char *remote, *local_only;

static void setup(void)
{
    for (int i = 0; i < 2; i++) {
        ferry_config_t cfg;
        ferry_config_init(&cfg);
        cfg.timeout_ms = 100;
        cfg.connect_timeout_ms = 100;
        cfg.log_level = -1;
        cfg.secret = i ? "fuzz-secret" : NULL;
        if (ferry_engine_create(&cfg, &engines[i]) != 0) abort();
    }
    unsigned char *m = mmap((void *)(FUZZ_REMOTE_ADDR - 4096), FUZZ_REMOTE_LEN + 8192, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (m == MAP_FAILED) m = mmap(NULL, FUZZ_REMOTE_LEN + 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) abort();
    mprotect(m, 4096, PROT_NONE);
    mprotect(m + 4096 + FUZZ_REMOTE_LEN, 4096, PROT_NONE);
    remote = m + 4096;
    local_only = malloc(4096);
    for (int i = 0; i < 2; i++) {
        if (ferry_register(engines[i], remote, FUZZ_REMOTE_LEN, FERRY_MEM_REMOTE) != 0) abort();
        if (ferry_register(engines[i], local_only, 4096, FERRY_MEM_LOCAL) != 0) abort();
    }
}

static uint64_t pick_addr(uint8_t sel)
{
    uint64_t base = (uint64_t)(uintptr_t)remote, end = base + FUZZ_REMOTE_LEN;
    switch (sel % 12) {
    case 0: return base;
    case 1: return base + (sel >> 4) * 64u;
    case 2: return end - 1;
    case 3: return end - 64;
    case 4: return end;
    case 5: return base - 1;
    case 6: return (uint64_t)(uintptr_t)local_only;
    case 7: return 0;
    case 8: return UINT64_MAX - (sel >> 4);
    case 9: return end - 8;
    case 10: return base + FUZZ_REMOTE_LEN / 2;
    default: return 0x1000;
    }
}

static uint64_t pick_len(uint8_t sel)
{
    static const uint64_t lens[] = {0, 1, 8, 64, 4096, FUZZ_REMOTE_LEN, FUZZ_REMOTE_LEN + 1, 0xffffffffull,
                                    1ull << 40, UINT64_MAX, UINT64_MAX - 63, FERRY_WIRE_MAX_DATA,
                                    FERRY_WIRE_MAX_DATA + 1ull, 65, 4095, 100};
    return lens[sel % 16];
}

static uint64_t pick_aux(uint8_t sel)
{
    switch (sel % 6) {
    case 0: return 0;
    case 1: return 1;
    case 2: return sel >> 3;
    case 3: return UINT64_MAX;
    case 4: return (uint64_t)(uintptr_t)remote;
    default: return 0xffffffffull;
    }
}

/* Appends one operation's frame. The payload length follows the frame's
 * len (capped) unless the selector says otherwise, so most frames are
 * well framed and the stream stays in step. */
static void put_op(uint8_t *out, size_t cap, size_t *pos, const uint8_t op[8])
{
    uint8_t type = (uint8_t)(op[0] % (FERRY_FRAME_TYPE_MAX + 2));
    ferry_frame_t f = {.type = type, .flags = op[1] & 0x03, .req_id = op[5], .addr = pick_addr(op[2]),
                       .len = pick_len(op[3]), .aux = pick_aux(op[6])};
    uint32_t plen;
    switch (op[4] % 4) {
    case 0: plen = f.len < MAX_PAYLOAD ? (uint32_t)f.len : MAX_PAYLOAD; break;
    case 1: plen = 0; break;
    case 2: plen = op[4] >> 2; break;
    default: plen = (uint32_t)(f.len < MAX_PAYLOAD ? f.len : MAX_PAYLOAD) + 1; break;
    }
    if (type == FERRY_FRAME_HELLO) {
        /* a well-formed hello, at whatever point it comes */
        ferry_hello_t h;
        memset(&h, 0, sizeof h);
        h.proto_min = h.proto_max = FERRY_PROTOCOL_VERSION;
        h.flags = op[1] >> 4;
        h.engine_id = op[5];
        h.epoch = op[6];
        h.expect_epoch = op[7] & 1 ? 0 : op[7];
        h.pid = op[7];
        memset(h.nonce, op[7], sizeof h.nonce);
        strcpy(h.name, "127.0.0.1:1");
        uint8_t p[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
        int n = ferry_hello_encode(&h, p, sizeof p);
        if (n > 0) fuzz_put_frame(out, cap, pos, type, 0, 0, 0, 0, 0, p, (uint32_t)n);
        return;
    }
    if (type == FERRY_FRAME_AUTH) plen = FERRY_WIRE_MAC_SIZE;
    /* A CRC that matches the payload when the fill byte says so. */
    if (*pos + FERRY_FRAME_HEADER_SIZE + plen > cap) return;
    uint8_t *payload = out + *pos + FERRY_FRAME_HEADER_SIZE;
    memset(payload, op[7], plen);
    f.plen = plen;
    if (f.flags & FERRY_FRAME_F_CRC) f.crc = op[7] & 1 ? ferry_crc32c(0, payload, plen) : op[7];
    ferry_frame_encode(&f, out + *pos);
    *pos += FERRY_FRAME_HEADER_SIZE + plen;
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
    if (size < 1) return 0;
    ferry_engine_t *e = engines[data[0] & 1];
    size_t cap = 2 * FERRY_FRAME_HEADER_SIZE + (size_t)MAX_OPS * (FERRY_FRAME_HEADER_SIZE + MAX_PAYLOAD + 1) + 1024;
    uint8_t *stream = malloc(cap);
    if (!stream) return 0;
    size_t pos = 0;
    if (data[0] & 2) fuzz_put_hello(stream, cap, &pos, FERRY_FRAME_HELLO, (data[0] >> 2) & 0x0f, 1);
    for (size_t i = 1, k = 0; i + 8 <= size && k < MAX_OPS; i += 8, k++) put_op(stream, cap, &pos, data + i);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        free(stream);
        return 0;
    }
    int big = 4 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    size_t off = 0;
    while (off < pos) {
        ssize_t n = send(sv[0], stream + off, pos - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n <= 0) break;
        off += (size_t)n;
    }
    free(stream);
    shutdown(sv[0], SHUT_WR);
    pthread_t t;
    pthread_create(&t, NULL, drain, &sv[0]);
    ferry_conn_t *c = calloc(1, sizeof *c);
    c->fd = sv[1];
    ferry_test_conn_bind(c, e);
    strcpy(c->remote, "fuzz");
    ferry_serve_connection(c);
    shutdown(c->fd, SHUT_RDWR);
    ferry_conn_free(c);
    pthread_join(t, NULL);
    close(sv[0]);
    ferry_notification_t got[64];
    long k;
    while ((k = ferry_get_notifications(e, got, 64)) > 0) ferry_notifications_free(got, (size_t)k);
    return 0;
}

/* Seeds: op lists that reach each state a session has. */
size_t fuzz_seed(int i, uint8_t *buf, size_t cap)
{
    static const uint8_t seeds[][1 + 8 * 6] = {
        /* hello, write, read back, ping */
        {2, 5, 0, 0, 3, 0, 1, 0, 0xab, 7, 0, 0, 3, 1, 2, 0, 0, 11, 0, 0, 0, 1, 3, 0, 0},
        /* hello, checksummed write (good CRC), segment query, cancel, notify */
        {2, 5, 1, 1, 3, 0, 4, 0, 0x11, 3, 0, 0, 0, 1, 5, 2, 0, 13, 0, 0, 0, 1, 9, 0, 0, 9, 0, 0, 2, 0, 6, 0, 0x41},
        /* no hello: a write first, then a hello */
        {0, 5, 0, 0, 3, 0, 1, 0, 0xab, 1, 0, 0, 0, 1, 0, 0, 0},
        /* hello, writes at the end of the region and past it, a wrapping read */
        {2, 5, 0, 3, 3, 0, 1, 0, 1, 5, 0, 2, 3, 0, 2, 0, 1, 7, 0, 8, 3, 1, 3, 0, 0, 5, 0, 4, 1, 0, 4, 0, 1},
        /* secret engine: hello with auth, auth with a bad MAC, then data */
        {1 | 2 | 4, 17, 0, 0, 0, 1, 0, 0, 0x22, 5, 0, 0, 3, 0, 1, 0, 0xab},
        /* hello, frames only a target sends, a second hello */
        {2, 6, 0, 0, 0, 1, 1, 0, 0, 19, 0, 0, 0, 1, 2, 0, 0, 1, 0, 0, 0, 1, 3, 0, 0},
        /* hello, a checksummed write with a wrong CRC, then the same with a right one */
        {2, 5, 1, 1, 3, 0, 4, 0, 0x10, 5, 1, 1, 3, 0, 4, 0, 0x11},
        /* hello, lengths that overflow when added to the address */
        {2, 5, 0, 8, 9, 1, 1, 0, 1, 7, 0, 8, 10, 1, 2, 0, 1, 5, 0, 2, 8, 1, 3, 0, 1},
    };
    if (i >= (int)(sizeof seeds / sizeof seeds[0])) return 0;
    size_t n = sizeof seeds[i];
    /* the rows are padded with all-zero operations: leave them off */
    while (n >= 9) {
        int zero = 1;
        for (size_t j = n - 8; j < n; j++) zero &= seeds[i][j] == 0;
        if (!zero) break;
        n -= 8;
    }
    if (n > cap) return 0;
    memcpy(buf, seeds[i], n);
    return n;
}
