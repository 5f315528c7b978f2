/* SPDX-License-Identifier: Apache-2.0 */
/* Hostile and careless input that test_rogue does not cover (issue 15):
 * a region its owner unmapped while still registered, every frame header
 * cut at each field boundary, lengths that overflow when added, valid
 * frames out of order, notifications before authentication, and requests
 * after the engine began shutting down. The target must answer with a
 * clear code or drop the connection, never crash, and keep serving. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fault.h"
#include "transport/rdma/rdma_wire.h"
#include "harness.h"

#define TIMEOUT_MS 2000
#define MAP_BYTES (64u << 10)

static ferry_engine_t *engine_tcp(int checksum)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.checksum = checksum;
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.connect_timeout_ms = TIMEOUT_MS;
    return harness_engine_cfg(&cfg);
}

/* A registered region whose pages the owner took away. The pages are
 * replaced in one step by an inaccessible mapping (MAP_FIXED), which
 * faults exactly as unmapped memory does, and which no other thread's
 * mmap can take in between, as it could after a munmap. */
static unsigned char *map_then_unmap(ferry_engine_t *tgt)
{
    unsigned char *p = mmap(NULL, MAP_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    assert_int_equal(ferry_register(tgt, p, MAP_BYTES, FERRY_MEM_REMOTE), 0);
    void *q = mmap(p, MAP_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    assert_true(q == p);
    return p;
}

/* Writes and reads into an unmapped registered region, with checksums on
 * and off: the initiator gets a clear code, the target stays up and
 * serves the next request. Issue 15 item 9: with checksums the target
 * died of SIGSEGV in place_staged's memcpy. */
static void unmapped_region(int checksum)
{
    ferry_engine_t *tgt = engine_tcp(checksum), *ini = engine_tcp(checksum);
    const char *peer = ferry_engine_name(tgt);
    unsigned char *gone = map_then_unmap(tgt);
    unsigned char *good = calloc(1, 4096), *src = malloc(8192);
    assert_int_equal(ferry_register(tgt, good, 4096, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_register(ini, src, 8192, FERRY_MEM_LOCAL), 0);
    memset(src, 0x77, 8192);
    for (int round = 0; round < 3; round++) {
        int rc = ferry_transfer_sync(ini, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)gone + 4096, 8192);
        assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
        assert_detail_contains("not mapped");
        rc = ferry_transfer_sync(ini, peer, FERRY_OP_READ, src, (uint64_t)(uintptr_t)gone, 4096);
        assert_true(rc < 0);
        if (checksum) {
            /* Staged before the answer: refused with a code. */
            assert_int_equal(rc, FERRY_ERR_ADDRESS_NOT_REGISTERED);
            assert_detail_contains("not mapped");
        }
        /* The target is alive and still serving. */
        assert_int_equal(ferry_transfer_sync(ini, peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)good, 4096), 0);
        assert_int_equal(good[4095], 0x77);
        memset(good, 0, 4096);
    }
    assert_int_equal(ferry_deregister(tgt, gone), 0);
    munmap(gone, MAP_BYTES);
    ferry_engine_destroy(ini);
    ferry_engine_destroy(tgt);
    free(good);
    free(src);
}

static void unmapped_region_checksum(void **state)
{
    (void)state;
    unmapped_region(1);
}

static void unmapped_region_plain(void **state)
{
    (void)state;
    unmapped_region(0);
}


/* ------------------------------------------------------ raw peers */

typedef struct target {
    ferry_engine_t *e;
    unsigned char *mem;   /* remote read+write, between PROT_NONE guard pages */
    unsigned char *map;
} target_t;

#define MEM_BYTES (64u << 10)

static void target_open(target_t *t, const char *secret)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "tcp";
    cfg.timeout_ms = TIMEOUT_MS;
    cfg.connect_timeout_ms = TIMEOUT_MS;
    cfg.secret = secret;
    t->e = harness_engine_cfg(&cfg);
    t->map = mmap(NULL, MEM_BYTES + 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(t->map != MAP_FAILED);
    assert_int_equal(mprotect(t->map, 4096, PROT_NONE), 0);
    assert_int_equal(mprotect(t->map + 4096 + MEM_BYTES, 4096, PROT_NONE), 0);
    t->mem = t->map + 4096;
    assert_int_equal(ferry_register(t->e, t->mem, MEM_BYTES, FERRY_MEM_REMOTE), 0);
}

static void target_close(target_t *t)
{
    if (t->e) ferry_engine_destroy(t->e);
    munmap(t->map, MEM_BYTES + 8192);
}

static bool untouched(const target_t *t)
{
    for (size_t i = 0; i < MEM_BYTES; i++)
        if (t->mem[i]) return false;
    return true;
}

static int handshaken(const target_t *t)
{
    int fd = raw_handshaken(ferry_engine_port(t->e));
    assert_true(fd >= 0);
    return fd;
}

/* An ERROR frame with code (any code when code is 0), then the close. */
static void expect_dropped(int fd, int code)
{
    ferry_frame_t f;
    char text[1100];
    int rc = raw_recv(fd, &f, text, sizeof text - 1, 5000);
    if (rc == 0) {
        assert_int_equal(f.type, FERRY_FRAME_ERROR);
        if (code) assert_int_equal(f.status, code);
    } else {
        assert_int_equal(rc, -1); /* closed without a word: also a drop */
    }
    assert_true(raw_closed_within(fd, 5000));
    close(fd);
}

/* The target answers a ping on a fresh connection. */
static void still_serving(const target_t *t)
{
    int fd = handshaken(t);
    ferry_frame_t f = {.type = FERRY_FRAME_PING, .req_id = 77};
    assert_int_equal(raw_send(fd, &f, NULL), 0);
    assert_int_equal(raw_recv(fd, &f, NULL, 0, 5000), 0);
    assert_int_equal(f.type, FERRY_FRAME_PONG);
    assert_int_equal(f.req_id, 77);
    close(fd);
}

/* Header field boundaries (wire.h): magic, type, flags, reserved, status,
 * plen, req_id, addr, len, aux, crc, reserved, end. */
static const size_t header_cuts[] = {1, 4, 5, 6, 8, 12, 16, 24, 32, 40, 48, 52, 55};
#define NCUTS (sizeof header_cuts / sizeof header_cuts[0])

/* A header cut at each field boundary: with a hang-up the connection
 * ends at once; with silence it is dropped by the frame deadline, all of
 * them together; before and after the handshake. Nothing is placed. */
static void header_cut_at_every_field(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, NULL);
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .addr = (uint64_t)(uintptr_t)t.mem, .len = 64, .plen = 64};
    ferry_frame_encode(&f, hdr);
    for (size_t i = 0; i < NCUTS; i++) {
        int fd = handshaken(&t);
        assert_int_equal(raw_send_bytes(fd, hdr, header_cuts[i]), 0);
        close(fd);
    }
    int silent[2 * NCUTS];
    uint8_t hello_hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_t h = {.type = FERRY_FRAME_HELLO, .plen = 100};
    ferry_frame_encode(&h, hello_hdr);
    for (size_t i = 0; i < NCUTS; i++) {
        silent[i] = handshaken(&t);
        assert_int_equal(raw_send_bytes(silent[i], hdr, header_cuts[i]), 0);
        silent[NCUTS + i] = raw_connect(ferry_engine_port(t.e));
        assert_int_equal(raw_send_bytes(silent[NCUTS + i], hello_hdr, header_cuts[i]), 0);
    }
    for (size_t i = 0; i < 2 * NCUTS; i++) {
        assert_true(raw_closed_within(silent[i], 10 * TIMEOUT_MS));
        close(silent[i]);
    }
    still_serving(&t);
    assert_true(untouched(&t));
    target_close(&t);
}

/* A HELLO whose payload stops at each field boundary of the hello
 * (wire.h: versions, flags, ids, epochs, counts, pid, host id, nonce,
 * name length), claimed as the whole payload: refused as malformed. And
 * the same cut inside a payload claimed longer, then a hang-up. */
static void hello_cut_at_every_field(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, NULL);
    ferry_hello_t hello;
    memset(&hello, 0, sizeof hello);
    hello.proto_min = hello.proto_max = FERRY_PROTOCOL_VERSION;
    hello.engine_id = 42;
    hello.epoch = 9;
    strcpy(hello.name, "127.0.0.1:9");
    uint8_t p[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    int n = ferry_hello_encode(&hello, p, sizeof p);
    assert_true(n > (int)FERRY_HELLO_FIXED_SIZE);
    const size_t cuts[] = {0, 2, 4, 8, 16, 24, 32, 40, 48, 52, 68, 100, FERRY_HELLO_FIXED_SIZE - 1,
                           FERRY_HELLO_FIXED_SIZE, (size_t)n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        int fd = raw_connect(ferry_engine_port(t.e));
        ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)cuts[i]};
        assert_int_equal(raw_send(fd, &f, p), 0);
        expect_dropped(fd, FERRY_ERR_MALFORMED_FRAME);
        fd = raw_connect(ferry_engine_port(t.e));
        f.plen = (uint32_t)n;
        uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
        ferry_frame_encode(&f, hdr);
        assert_int_equal(raw_send_bytes(fd, hdr, sizeof hdr), 0);
        assert_int_equal(raw_send_bytes(fd, p, cuts[i]), 0);
        close(fd);
    }
    /* A name length past the payload's end. */
    uint8_t bad[sizeof p];
    memcpy(bad, p, (size_t)n);
    bad[FERRY_HELLO_FIXED_SIZE - 2] = 0xff;
    int fd = raw_connect(ferry_engine_port(t.e));
    ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n};
    assert_int_equal(raw_send(fd, &f, bad), 0);
    expect_dropped(fd, FERRY_ERR_MALFORMED_FRAME);
    still_serving(&t);
    target_close(&t);
}

/* Each header field holding a value it may not: refused as malformed. */
static void header_field_values(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, NULL);
    ferry_frame_t f = {.type = FERRY_FRAME_PING};
    uint8_t good[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(&f, good);
    struct {
        size_t at;
        uint8_t value;
    } bad[] = {
        {0, 'X'},                        /* magic */
        {4, 0},                          /* type 0 */
        {4, FERRY_FRAME_TYPE_MAX + 1},   /* type past the last */
        {4, 0xff},
        {5, 0x80},                       /* an unknown flag */
        {6, 1},                          /* reserved */
        {7, 1},
        {8, 1},                          /* status > 0 */
        {11, 0x7f},                      /* status no Ferry code */
        {15, 0x01},                      /* plen of 16 MiB for a PING */
        {52, 1},                         /* reserved */
        {55, 0x80},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int fd = handshaken(&t);
        uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
        memcpy(hdr, good, sizeof hdr);
        hdr[bad[i].at] = bad[i].value;
        assert_int_equal(raw_send_bytes(fd, hdr, sizeof hdr), 0);
        expect_dropped(fd, FERRY_ERR_MALFORMED_FRAME);
    }
    still_serving(&t);
    target_close(&t);
}

/* Address + length past 2^64, or lengths whose sum with the address
 * overflows: refused with a code (or the connection dropped), nothing
 * placed, and the guard pages around the region untouched (a touch would
 * be SIGSEGV). */
static void overflowing_lengths(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, NULL);
    uint64_t base = (uint64_t)(uintptr_t)t.mem;
    uint8_t data[4096];
    memset(data, 0x6b, sizeof data);
    struct {
        uint8_t type;
        uint64_t addr, len, aux;
        uint32_t plen;
    } cases[] = {
        {FERRY_FRAME_WRITE, UINT64_MAX - 10, 64, 0, 64},
        {FERRY_FRAME_WRITE, UINT64_MAX - 4095, 4096, 0, 4096},
        {FERRY_FRAME_WRITE, base + MEM_BYTES - 1, 4096, 0, 4096},
        {FERRY_FRAME_WRITE, base, 1ull << 63, 0, 4096},
        {FERRY_FRAME_READ_REQ, UINT64_MAX - 63, 64, 0, 0},
        {FERRY_FRAME_READ_REQ, base + 64, UINT64_MAX - 63, 0, 0},
        {FERRY_FRAME_READ_REQ, base, (uint64_t)FERRY_WIRE_MAX_DATA + 1, 0, 0},
        {FERRY_FRAME_SEG_QUERY, 0, 0, UINT64_MAX - 1, 0},
        {FERRY_FRAME_SEG_QUERY, UINT64_MAX, UINT64_MAX, 1ull << 40, 0},
        {FERRY_FRAME_CMA_WRITE, base, 64, UINT64_MAX - 10, 0},
        {FERRY_FRAME_CMA_WRITE, UINT64_MAX - 10, 64, base, 0},
        {FERRY_FRAME_CMA_READ, base, UINT64_MAX, base, 0},
        {FERRY_FRAME_RDMA_MR_QUERY, UINT64_MAX - 10, 64, 0, 0},
        {FERRY_FRAME_RDMA_COMMIT, base, UINT64_MAX, 0, 0},
        {FERRY_FRAME_SHM_MAP_REQ, UINT64_MAX - 10, 64, base, 0},
        {FERRY_FRAME_SHM_MAP_REQ, base, UINT64_MAX - base + 1, base, 0},
        {FERRY_FRAME_CANCEL, UINT64_MAX, UINT64_MAX, UINT64_MAX, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fd = handshaken(&t);
        ferry_frame_t f = {.type = cases[i].type, .req_id = 100 + i, .addr = cases[i].addr, .len = cases[i].len,
                           .aux = cases[i].aux, .plen = cases[i].plen};
        assert_int_equal(raw_send(fd, &f, cases[i].plen ? data : NULL), 0);
        ferry_frame_t a;
        char text[1100] = "";
        int rc = raw_recv(fd, &a, text, sizeof text - 1, 5000);
        if (rc == 0 && a.type != FERRY_FRAME_ERROR && a.type != FERRY_FRAME_SEG_PAGE &&
            a.type != FERRY_FRAME_CANCEL_ACK) {
            /* answered: a refusal, never a success */
            if (a.status == 0) fprintf(stderr, "case %zu (%s) accepted\n", i, ferry_frame_type_name(f.type));
            assert_true(a.status < 0);
        } else if (rc == 0 && a.type == FERRY_FRAME_SEG_PAGE) {
            assert_int_equal(a.len, 0); /* an empty page past the end */
        } else if (rc != 0) {
            assert_int_equal(rc, -1);
        }
        close(fd);
    }
    assert_true(untouched(&t));
    still_serving(&t);
    target_close(&t);
}

/* Valid frames in an order the protocol does not allow: before the
 * handshake, answers that only a target sends, AUTH without a secret.
 * And a cancel that arrives before its request: a defined answer. */
static void frames_out_of_order(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, NULL);
    uint64_t base = (uint64_t)(uintptr_t)t.mem;
    const uint8_t before_hello[] = {FERRY_FRAME_PING, FERRY_FRAME_SEG_QUERY, FERRY_FRAME_NOTIFY, FERRY_FRAME_CANCEL,
                                    FERRY_FRAME_AUTH, FERRY_FRAME_READ_REQ, FERRY_FRAME_CMA_WRITE,
                                    FERRY_FRAME_SHM_MAP_REQ, FERRY_FRAME_RDMA_CONNECT};
    for (size_t i = 0; i < sizeof before_hello; i++) {
        int fd = raw_connect(ferry_engine_port(t.e));
        ferry_frame_t f = {.type = before_hello[i], .addr = base, .len = 64};
        if (f.type == FERRY_FRAME_AUTH) f.plen = FERRY_WIRE_MAC_SIZE;
        uint8_t pay[FERRY_WIRE_MAC_SIZE] = {0};
        assert_int_equal(raw_send(fd, &f, f.plen ? pay : NULL), 0);
        expect_dropped(fd, FERRY_ERR_MALFORMED_FRAME);
    }
    const uint8_t after_hello[] = {FERRY_FRAME_AUTH, FERRY_FRAME_AUTH_ACK, FERRY_FRAME_PONG, FERRY_FRAME_NOTIFY_ACK,
                                   FERRY_FRAME_CANCEL_ACK, FERRY_FRAME_READ_RESP, FERRY_FRAME_RDMA_MR_INFO,
                                   FERRY_FRAME_SHM_MAP_RESP, FERRY_FRAME_RDMA_COMMIT_ACK};
    for (size_t i = 0; i < sizeof after_hello; i++) {
        int fd = handshaken(&t);
        ferry_frame_t f = {.type = after_hello[i]};
        if (f.type == FERRY_FRAME_AUTH) f.plen = FERRY_WIRE_MAC_SIZE;
        uint8_t pay[FERRY_WIRE_MAC_SIZE] = {0};
        assert_int_equal(raw_send(fd, &f, f.plen ? pay : NULL), 0);
        expect_dropped(fd, 0);
    }
    /* The cancel first, then the request it names: refused, not placed. */
    int fd = handshaken(&t);
    ferry_frame_t f = {.type = FERRY_FRAME_CANCEL, .req_id = 4242};
    assert_int_equal(raw_send(fd, &f, NULL), 0);
    assert_int_equal(raw_recv(fd, &f, NULL, 0, 5000), 0);
    assert_int_equal(f.type, FERRY_FRAME_CANCEL_ACK);
    uint8_t data[64];
    memset(data, 0x33, sizeof data);
    f = (ferry_frame_t){.type = FERRY_FRAME_WRITE, .req_id = 4242, .addr = base, .len = 64, .plen = 64};
    assert_int_equal(raw_send(fd, &f, data), 0);
    char text[1100] = "";
    assert_int_equal(raw_recv(fd, &f, text, sizeof text - 1, 5000), 0);
    assert_int_equal(f.type, FERRY_FRAME_WRITE_ACK);
    /* A cancel fences what was already on the wire (cancel.h); a request
     * sent after it is a new one to the target, refused only while the
     * entry is kept. Either answer is defined; refused means not placed. */
    assert_true(f.status == FERRY_ERR_CANCELLED || f.status == 0);
    if (f.status == FERRY_ERR_CANCELLED) assert_true(untouched(&t));
    memset(t.mem, 0, 64);
    close(fd);
    assert_true(untouched(&t));
    still_serving(&t);
    target_close(&t);
}

/* Notifications from a peer that never authenticated reach no queue: on
 * an engine with a shared secret, a NOTIFY in place of AUTH, a NOTIFY
 * after a refused hello, and a NOTIFY after a wrong MAC. */
static void unauthenticated_notifications(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, "hostile-secret");
    uint8_t nonce[FERRY_WIRE_NONCE_SIZE], h[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME],
        a[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME + 1];
    size_t hl, al;
    int status;
    memset(nonce, 0x5c, sizeof nonce);
    ferry_frame_t f = {.type = FERRY_FRAME_NOTIFY, .plen = 5};
    /* In place of AUTH. */
    int fd = raw_connect(ferry_engine_port(t.e));
    assert_int_equal(raw_hello(fd, FERRY_HELLO_F_AUTH, nonce, h, &hl, a, &al, &status), 0);
    assert_int_equal(status, 0);
    assert_int_equal(raw_send(fd, &f, "spoof"), 0);
    expect_dropped(fd, FERRY_ERR_AUTH_FAILED);
    /* After a hello refused for lacking the auth flag. */
    fd = raw_connect(ferry_engine_port(t.e));
    assert_int_equal(raw_hello(fd, 0, NULL, h, &hl, a, &al, &status), 0);
    assert_int_equal(status, FERRY_ERR_AUTH_FAILED);
    raw_send(fd, &f, "spoof"); /* may fail: the target already closed */
    assert_true(raw_closed_within(fd, 5000));
    close(fd);
    /* After a wrong MAC. */
    fd = raw_connect(ferry_engine_port(t.e));
    assert_int_equal(raw_hello(fd, FERRY_HELLO_F_AUTH, nonce, h, &hl, a, &al, &status), 0);
    ferry_frame_t auth = {.type = FERRY_FRAME_AUTH, .plen = FERRY_WIRE_MAC_SIZE};
    uint8_t mac[FERRY_WIRE_MAC_SIZE];
    memset(mac, 0x11, sizeof mac);
    assert_int_equal(raw_send(fd, &auth, mac), 0);
    raw_send(fd, &f, "spoof");
    assert_true(raw_closed_within(fd, 5000));
    close(fd);
    ferry_notification_t got[4];
    assert_int_equal(ferry_get_notifications(t.e, got, 4), 0);
    target_close(&t);
}

/* Peers that keep sending while the target shuts down: every connection
 * ends (closed, or an answer then closed), nothing hangs, destroy
 * returns. */
typedef struct sender {
    const target_t *t;
    int fd;
    atomic_int *sent;
    int ended; /* 1: the target closed the connection */
} sender_t;

static void *keep_writing(void *arg)
{
    sender_t *s = arg;
    uint8_t data[4096];
    memset(data, 0x21, sizeof data);
    for (int i = 0; i < 100000; i++) {
        ferry_frame_t f = {.type = i % 3 == 2 ? FERRY_FRAME_NOTIFY : FERRY_FRAME_WRITE, .req_id = (uint64_t)i + 1,
                           .addr = (uint64_t)(uintptr_t)s->t->mem, .len = sizeof data, .plen = sizeof data};
        if (f.type == FERRY_FRAME_NOTIFY) f.len = 0, f.plen = 16;
        if (raw_send(s->fd, &f, data) != 0) break;
        ferry_frame_t a;
        int rc = raw_recv(s->fd, &a, NULL, 0, 10000);
        if (rc == -2) return NULL; /* a hang: s->ended stays 0 */
        if (rc != 0 || a.type == FERRY_FRAME_ERROR) break;
        atomic_fetch_add(s->sent, 1);
    }
    s->ended = 1;
    return NULL;
}

static void requests_during_shutdown(void **state)
{
    (void)state;
    target_t t;
    target_open(&t, NULL);
    enum { SENDERS = 4 };
    pthread_t th[SENDERS];
    sender_t s[SENDERS];
    atomic_int sent = 0;
    for (int i = 0; i < SENDERS; i++) {
        s[i] = (sender_t){&t, handshaken(&t), &sent, 0};
        assert_int_equal(pthread_create(&th[i], NULL, keep_writing, &s[i]), 0);
    }
    /* Let them get going: a bounded number of answered requests. */
    for (int spins = 0; spins < 5000 && atomic_load(&sent) < 200; spins++) usleep(1000);
    assert_true(atomic_load(&sent) > 0);
    ferry_engine_destroy(t.e);
    t.e = NULL;
    for (int i = 0; i < SENDERS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(s[i].ended, 1);
        close(s[i].fd);
    }
    target_close(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(unmapped_region_checksum),
        cmocka_unit_test(unmapped_region_plain),
        cmocka_unit_test(header_cut_at_every_field),
        cmocka_unit_test(hello_cut_at_every_field),
        cmocka_unit_test(header_field_values),
        cmocka_unit_test(overflowing_lengths),
        cmocka_unit_test(frames_out_of_order),
        cmocka_unit_test(unauthenticated_notifications),
        cmocka_unit_test(requests_during_shutdown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
