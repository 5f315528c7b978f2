/* SPDX-License-Identifier: Apache-2.0 */
/* Shared-secret authentication: a mutual HMAC-SHA256 challenge-response at
 * each connection's handshake. Matching secrets work; a wrong or missing
 * secret on either side fails with AUTH_FAILED and a detail saying which;
 * rogue clients and rogue targets are refused; the target keeps serving. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "link/auth.h"
#include "fault.h"
#include "harness.h"

static ferry_engine_t *engine_with(const char *secret)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 5000;
    cfg.connect_timeout_ms = 3000;
    cfg.secret = secret;
    return harness_engine_cfg(&cfg);
}

static uint64_t stat_of(ferry_engine_t *e, int which)
{
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(e, &st), 0);
    return which == 0 ? st.auth_failures : st.connections_opened;
}

/* The target counts on its serving thread: wait for it. */
static uint64_t wait_auth_failures(ferry_engine_t *e, uint64_t atleast)
{
    uint64_t v = 0;
    for (int i = 0; i < 200 && (v = stat_of(e, 0)) < atleast; i++) usleep(10000);
    return v;
}

static void round_trip(ferry_engine_t *ini, ferry_engine_t *tgt, uint64_t seed)
{
    size_t len = 3u << 20;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(ini, src, len, 0), 0);
    assert_int_equal(ferry_register(tgt, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, seed);
    int rc = ferry_transfer_sync(ini, ferry_engine_name(tgt), FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len);
    if (rc) fprintf(stderr, "%s\n", ferry_last_error_detail());
    assert_int_equal(rc, 0);
    assert_true(harness_check(dst, len, seed));
    memset(src, 0, len);
    assert_int_equal(ferry_transfer_sync(ini, ferry_engine_name(tgt), FERRY_OP_READ, src, (uint64_t)(uintptr_t)dst, len), 0);
    assert_true(harness_check(src, len, seed));
    ferry_deregister(ini, src);
    ferry_deregister(tgt, dst);
    free(src);
    free(dst);
}

static void same_secret_works(void **state)
{
    (void)state;
    ferry_engine_t *a = engine_with("correct horse battery staple"), *b = engine_with("correct horse battery staple");
    round_trip(a, b, 11);
    round_trip(b, a, 12); /* both directions */
    assert_int_equal(stat_of(a, 0), 0);
    assert_int_equal(stat_of(b, 0), 0);
    assert_true(stat_of(a, 1) >= 1);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
}

static void different_secrets_refused(void **state)
{
    (void)state;
    ferry_engine_t *ini = engine_with("secret-one"), *tgt = engine_with("secret-two");
    ferry_engine_t *good = engine_with("secret-two");
    assert_int_equal(ferry_session_open(ini, ferry_engine_name(tgt)), FERRY_ERR_AUTH_FAILED);
    assert_detail_contains("secrets differ");
    assert_detail_contains(ferry_engine_name(tgt));
    /* Transfers say the same, every time, and never reach memory. */
    unsigned char *src = malloc(4096), *dst = calloc(1, 4096);
    ferry_register(ini, src, 4096, 0);
    ferry_register(tgt, dst, 4096, FERRY_MEM_REMOTE);
    memset(src, 0xab, 4096);
    for (int i = 0; i < 2; i++) {
        int rc = ferry_transfer_sync(ini, ferry_engine_name(tgt), FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 4096);
        assert_int_equal(rc, FERRY_ERR_AUTH_FAILED);
        assert_false(ferry_error_retryable(rc));
    }
    for (int i = 0; i < 4096; i++) assert_int_equal(dst[i], 0);
    assert_true(stat_of(ini, 0) >= 3);
    assert_true(wait_auth_failures(tgt, 3) >= 3);
    ferry_stats_t st;
    ferry_engine_stats(ini, &st);
    int seen = 0;
    for (size_t i = 0; i < st.ncodes; i++)
        if (st.codes[i].code == FERRY_ERR_AUTH_FAILED) seen = (int)st.codes[i].failures;
    assert_int_equal(seen, 3); /* one open and two transfers */
    /* The target still serves an engine holding its secret. */
    round_trip(good, tgt, 13);
    ferry_deregister(ini, src);
    ferry_deregister(tgt, dst);
    free(src);
    free(dst);
    ferry_engine_destroy(ini);
    ferry_engine_destroy(tgt);
    ferry_engine_destroy(good);
}

static void missing_secret_either_side(void **state)
{
    (void)state;
    ferry_engine_t *with = engine_with("s3cret"), *without = engine_with(NULL);
    assert_int_equal(ferry_session_open(without, ferry_engine_name(with)), FERRY_ERR_AUTH_FAILED);
    assert_detail_contains("requires a shared secret and this engine has none");
    assert_int_equal(ferry_session_open(with, ferry_engine_name(without)), FERRY_ERR_AUTH_FAILED);
    assert_detail_contains("has no shared secret");
    assert_true(wait_auth_failures(with, 1) >= 1);
    ferry_engine_destroy(with);
    ferry_engine_destroy(without);
}

static void mac_properties(void **state)
{
    (void)state;
    uint8_t h[100], a[120], m1[32], m2[32];
    for (int i = 0; i < 100; i++) h[i] = (uint8_t)i;
    for (int i = 0; i < 120; i++) a[i] = (uint8_t)(i * 7);
    assert_int_equal(ferry_auth_mac("k", FERRY_AUTH_INITIATOR, h, 100, a, 120, m1), 0);
    assert_int_equal(ferry_auth_mac("k", FERRY_AUTH_INITIATOR, h, 100, a, 120, m2), 0);
    assert_true(ferry_auth_equal(m1, m2));
    assert_int_equal(ferry_auth_mac("k", FERRY_AUTH_TARGET, h, 100, a, 120, m2), 0);
    assert_false(ferry_auth_equal(m1, m2)); /* roles differ: no reflection */
    assert_int_equal(ferry_auth_mac("K", FERRY_AUTH_INITIATOR, h, 100, a, 120, m2), 0);
    assert_false(ferry_auth_equal(m1, m2));
    a[119] ^= 1;
    assert_int_equal(ferry_auth_mac("k", FERRY_AUTH_INITIATOR, h, 100, a, 120, m2), 0);
    assert_false(ferry_auth_equal(m1, m2));
    a[119] ^= 1;
    /* Moving a byte between the two payloads changes the MAC too. */
    assert_int_equal(ferry_auth_mac("k", FERRY_AUTH_INITIATOR, h, 99, a, 120, m2), 0);
    assert_false(ferry_auth_equal(m1, m2));
    uint8_t n1[32], n2[32];
    assert_int_equal(ferry_auth_nonce(n1), 0);
    assert_int_equal(ferry_auth_nonce(n2), 0);
    assert_memory_not_equal(n1, n2, 32);
}

/* A client speaking the protocol by hand: wrong MAC, right MAC, no AUTH. */
static void rogue_client(void **state)
{
    (void)state;
    const char *secret = "the-real-one";
    ferry_engine_t *tgt = engine_with(secret);
    uint8_t nonce[32], hello[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME],
        ack[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME + 1], mac[32];
    size_t hlen, alen;
    int status;
    ferry_frame_t f;

    /* Wrong secret: AUTH_ACK says AUTH_FAILED and the connection closes. */
    int fd = raw_connect(ferry_engine_port(tgt));
    ferry_auth_nonce(nonce);
    assert_int_equal(raw_hello(fd, FERRY_HELLO_F_AUTH, nonce, hello, &hlen, ack, &alen, &status), 0);
    assert_int_equal(status, 0);
    ferry_auth_mac("a-guess", FERRY_AUTH_INITIATOR, hello, hlen, ack, alen, mac);
    f = (ferry_frame_t){.type = FERRY_FRAME_AUTH, .plen = 32};
    assert_int_equal(raw_send(fd, &f, mac), 0);
    assert_int_equal(raw_recv(fd, &f, mac, sizeof mac, 5000), 0);
    assert_int_equal(f.type, FERRY_FRAME_AUTH_ACK);
    assert_int_equal(f.status, FERRY_ERR_AUTH_FAILED);
    assert_int_equal(f.plen, 0); /* no MAC for strangers */
    assert_true(raw_closed_within(fd, 5000));
    close(fd);

    /* A replayed MAC from another connection (other nonces) fails too. */
    uint8_t old_mac[32];
    ferry_auth_mac(secret, FERRY_AUTH_INITIATOR, hello, hlen, ack, alen, old_mac);
    fd = raw_connect(ferry_engine_port(tgt));
    assert_int_equal(raw_hello(fd, FERRY_HELLO_F_AUTH, nonce, hello, &hlen, ack, &alen, &status), 0);
    f = (ferry_frame_t){.type = FERRY_FRAME_AUTH, .plen = 32};
    assert_int_equal(raw_send(fd, &f, old_mac), 0);
    assert_int_equal(raw_recv(fd, &f, mac, sizeof mac, 5000), 0);
    assert_int_equal(f.status, FERRY_ERR_AUTH_FAILED);
    close(fd);

    /* No AUTH flag at all: refused in HELLO_ACK. */
    fd = raw_connect(ferry_engine_port(tgt));
    assert_int_equal(raw_hello(fd, 0, NULL, hello, &hlen, ack, &alen, &status), 0);
    assert_int_equal(status, FERRY_ERR_AUTH_FAILED);
    assert_true(raw_closed_within(fd, 5000));
    close(fd);

    /* AUTH flag but a zero nonce: refused. */
    uint8_t zero[32] = {0};
    fd = raw_connect(ferry_engine_port(tgt));
    assert_int_equal(raw_hello(fd, FERRY_HELLO_F_AUTH, zero, hello, &hlen, ack, &alen, &status), 0);
    assert_int_equal(status, FERRY_ERR_AUTH_FAILED);
    close(fd);

    /* Skipping AUTH and sending a data frame instead: dropped. */
    fd = raw_connect(ferry_engine_port(tgt));
    assert_int_equal(raw_hello(fd, FERRY_HELLO_F_AUTH, nonce, hello, &hlen, ack, &alen, &status), 0);
    f = (ferry_frame_t){.type = FERRY_FRAME_SEG_QUERY};
    assert_int_equal(raw_send(fd, &f, NULL), 0);
    assert_int_equal(raw_recv(fd, &f, ack, sizeof ack - 1, 5000), 0);
    assert_int_equal(f.type, FERRY_FRAME_ERROR);
    assert_int_equal(f.status, FERRY_ERR_AUTH_FAILED);
    assert_true(raw_closed_within(fd, 5000));
    close(fd);

    /* The right secret, computed independently: accepted, and the target's
     * own MAC proves it holds the secret. */
    fd = raw_connect(ferry_engine_port(tgt));
    ferry_auth_nonce(nonce);
    assert_int_equal(raw_hello(fd, FERRY_HELLO_F_AUTH, nonce, hello, &hlen, ack, &alen, &status), 0);
    assert_int_equal(status, 0);
    ferry_auth_mac(secret, FERRY_AUTH_INITIATOR, hello, hlen, ack, alen, mac);
    f = (ferry_frame_t){.type = FERRY_FRAME_AUTH, .plen = 32};
    assert_int_equal(raw_send(fd, &f, mac), 0);
    uint8_t theirs[32], want[32];
    assert_int_equal(raw_recv(fd, &f, theirs, sizeof theirs, 5000), 0);
    assert_int_equal(f.type, FERRY_FRAME_AUTH_ACK);
    assert_int_equal(f.status, 0);
    assert_int_equal(f.plen, 32);
    ferry_auth_mac(secret, FERRY_AUTH_TARGET, hello, hlen, ack, alen, want);
    assert_memory_equal(theirs, want, 32);
    f = (ferry_frame_t){.type = FERRY_FRAME_PING, .req_id = 5};
    assert_int_equal(raw_send(fd, &f, NULL), 0);
    assert_int_equal(raw_recv(fd, &f, NULL, 0, 5000), 0);
    assert_int_equal(f.type, FERRY_FRAME_PONG);
    close(fd);

    assert_true(wait_auth_failures(tgt, 5) >= 5);
    ferry_engine_destroy(tgt);
}

/* A fake target that cannot prove the secret: it answers with the AUTH
 * flag and a fresh nonce, then a made-up MAC. */
struct fake_target {
    int lfd;
    uint16_t port;
    int mode; /* 0: bogus MAC; 1: PEER_RESTARTED with no expected epoch */
};

static void *fake_target_main(void *arg)
{
    struct fake_target *ft = arg;
    int fd = accept(ft->lfd, NULL, NULL);
    if (fd < 0) return NULL;
    ferry_frame_t f;
    uint8_t buf[2048];
    if (raw_recv(fd, &f, buf, sizeof buf, 5000) == 0 && f.type == FERRY_FRAME_HELLO) {
        ferry_hello_t h;
        memset(&h, 0, sizeof h);
        h.proto_min = h.proto_max = FERRY_PROTOCOL_VERSION;
        h.flags = FERRY_HELLO_F_AUTH;
        h.engine_id = 99;
        h.epoch = 77;
        ferry_auth_nonce(h.nonce);
        snprintf(h.name, sizeof h.name, "fake:1");
        int n = ferry_hello_encode(&h, buf, sizeof buf);
        ferry_frame_t a = {.type = FERRY_FRAME_HELLO_ACK, .plen = (uint32_t)n,
                           .status = ft->mode == 1 ? FERRY_ERR_PEER_RESTARTED : 0};
        raw_send(fd, &a, buf);
        if (ft->mode == 0 && raw_recv(fd, &f, buf, sizeof buf, 5000) == 0 && f.type == FERRY_FRAME_AUTH) {
            uint8_t mac[32];
            ferry_auth_nonce(mac);
            ferry_frame_t r = {.type = FERRY_FRAME_AUTH_ACK, .plen = 32};
            raw_send(fd, &r, mac);
        }
        raw_closed_within(fd, 5000);
    }
    close(fd);
    return NULL;
}

static void rogue_target(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        struct fake_target ft = {.mode = mode};
        ft.lfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET};
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        socklen_t sl = sizeof sa;
        assert_int_equal(bind(ft.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
        listen(ft.lfd, 4);
        getsockname(ft.lfd, (struct sockaddr *)&sa, &sl);
        ft.port = ntohs(sa.sin_port);
        pthread_t t;
        pthread_create(&t, NULL, fake_target_main, &ft);
        ferry_engine_t *ini = engine_with("mine");
        char peer[64];
        snprintf(peer, sizeof peer, "127.0.0.1:%u", ft.port);
        int rc = ferry_session_open(ini, peer);
        if (mode == 0) {
            assert_int_equal(rc, FERRY_ERR_AUTH_FAILED);
            assert_detail_contains("failed to prove");
        } else {
            /* A restart claim on a first contact is nonsense, not a restart. */
            assert_int_equal(rc, FERRY_ERR_MALFORMED_FRAME);
            assert_detail_contains("PEER_RESTARTED");
        }
        ferry_engine_destroy(ini);
        pthread_join(t, NULL);
        close(ft.lfd);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_secret_works),
        cmocka_unit_test(different_secrets_refused),
        cmocka_unit_test(missing_secret_either_side),
        cmocka_unit_test(mac_properties),
        cmocka_unit_test(rogue_client),
        cmocka_unit_test(rogue_target),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
