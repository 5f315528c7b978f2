/* SPDX-License-Identifier: Apache-2.0 */
/* Notifications from peers that lie or flood (issue 15, item 8): a raw
 * connection claiming another engine's name is told apart by what the
 * receiver observed (its source address, its engine id; with a secret it
 * gets no connection at all), and one sender filling its share of the
 * queue is refused alone: other senders' notifications keep arriving, also
 * when the flooder mints a new engine id per connection. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fault.h"
#include "harness.h"

static ferry_engine_t *engine_with(const char *secret)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 5000;
    cfg.connect_timeout_ms = 5000;
    cfg.secret = secret;
    return harness_engine_cfg(&cfg);
}

/* A TCP connection to 127.0.0.1:port from source address src. */
static int connect_from(const char *src, uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    assert_int_equal(inet_pton(AF_INET, src, &a.sin_addr), 1);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct sockaddr_in t = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &t.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&t, sizeof t), 0);
    int one = 1; /* the flood's small frames go out at once */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* The hello flags raw peers advertise. */
static uint32_t raw_flags;

/* A raw peer from src calling itself name, engine id id: the handshake's
 * status (0: the connection is served). */
static int raw_peer(uint16_t port, const char *src, const char *name, uint64_t id, int *out)
{
    int fd = connect_from(src, port);
    ferry_hello_t h;
    memset(&h, 0, sizeof h);
    h.proto_min = h.proto_max = FERRY_PROTOCOL_VERSION;
    h.flags = raw_flags;
    h.engine_id = id;
    h.epoch = 1;
    h.pid = 1;
    snprintf(h.name, sizeof h.name, "%s", name);
    uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME + 1];
    int n = ferry_hello_encode(&h, buf, sizeof buf);
    assert_true(n > 0);
    ferry_frame_t f = {.type = FERRY_FRAME_HELLO, .plen = (uint32_t)n};
    assert_int_equal(raw_send(fd, &f, buf), 0);
    ferry_frame_t a;
    assert_int_equal(raw_recv(fd, &a, buf, sizeof buf, 5000), 0);
    assert_int_equal(a.type, FERRY_FRAME_HELLO_ACK);
    *out = fd;
    return a.status;
}

/* Sends up to max notifications, 128 at a time before reading their
 * acks; how many were queued before the first refusal. */
static long flood(int fd, long max)
{
    long queued = 0;
    bool refused = false;
    while (queued < max && !refused) {
        long k = max - queued < 128 ? max - queued : 128;
        ferry_frame_t f = {.type = FERRY_FRAME_NOTIFY, .plen = 8};
        for (long i = 0; i < k; i++) assert_int_equal(raw_send(fd, &f, "flooding"), 0);
        for (long i = 0; i < k; i++) {
            ferry_frame_t a;
            assert_int_equal(raw_recv(fd, &a, NULL, 0, 5000), 0);
            assert_int_equal(a.type, FERRY_FRAME_NOTIFY_ACK);
            if (a.status == 0 && !refused) queued++;
            else if (a.status) {
                assert_int_equal(a.status, FERRY_ERR_TOO_MANY_REQUESTS);
                refused = true;
            }
        }
    }
    return queued;
}

static void local_address(int fd, char *out, size_t cap)
{
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a.sin_addr, host, sizeof host);
    snprintf(out, cap, "%s:%u", host, ntohs(a.sin_port));
}

/* ------------------------------------------------------------- tests */

/* An initiator that keeps placement logs but predates NOTIFY ids
 * (FERRY_HELLO_F_PLACED without F_NOTIFY_ONCE) sends every NOTIFY with id
 * 0: each is queued and answered, none taken for a duplicate (they were
 * dropped unanswered while repeats of NOTIFYs counted for such peers). */
static void notifies_from_an_initiator_without_ids_all_queued(void **state)
{
    (void)state;
    ferry_engine_t *decode = engine_with(NULL);
    int fd;
    raw_flags = FERRY_HELLO_F_PLACED | FERRY_HELLO_F_DEADLINE;
    assert_int_equal(raw_peer(ferry_engine_port(decode), "127.0.0.1", "older", 7, &fd), 0);
    raw_flags = 0;
    for (int i = 0; i < 3; i++) {
        ferry_frame_t f = {.type = FERRY_FRAME_NOTIFY, .plen = 5};
        assert_int_equal(raw_send(fd, &f, "older"), 0);
        ferry_frame_t a;
        assert_int_equal(raw_recv(fd, &a, NULL, 0, 5000), 0);
        assert_int_equal(a.type, FERRY_FRAME_NOTIFY_ACK);
        assert_int_equal(a.status, 0);
    }
    ferry_notification_t got[4];
    long k = ferry_get_notifications(decode, got, 4);
    assert_int_equal(k, 3);
    ferry_notifications_free(got, (size_t)k);
    close(fd);
    ferry_engine_destroy(decode);
}

/* Without a secret a raw peer may call itself "prefill" (the genuine
 * engine's name): its notification says so in peer, but addr is the
 * spoofer's own socket, the engine id its own, and authenticated 0. */
static void impersonation_is_told_apart(void **state)
{
    (void)state;
    ferry_engine_t *decode = engine_with(NULL), *prefill = engine_with(NULL);
    const char *name = ferry_engine_name(prefill);
    assert_int_equal(ferry_notify(prefill, ferry_engine_name(decode), "genuine", 7), 0);
    int fd;
    assert_int_equal(raw_peer(ferry_engine_port(decode), "127.0.0.1", name, 0xbad, &fd), 0);
    ferry_frame_t f = {.type = FERRY_FRAME_NOTIFY, .plen = 6};
    assert_int_equal(raw_send(fd, &f, "forged"), 0);
    ferry_frame_t a;
    assert_int_equal(raw_recv(fd, &a, NULL, 0, 5000), 0);
    assert_int_equal(a.status, 0);
    char spoofer[64];
    local_address(fd, spoofer, sizeof spoofer);

    ferry_notification_t got[4];
    ferry_notification_sender_t from[4];
    assert_int_equal(ferry_get_notifications_from(decode, got, from, 4), 2);
    assert_string_equal(got[0].peer, name);
    assert_string_equal(got[1].peer, name); /* the claim, as claimed */
    assert_int_equal(from[0].authenticated, 0);
    assert_int_equal(from[1].authenticated, 0);
    assert_string_equal(from[1].addr, spoofer);
    assert_string_not_equal(from[0].addr, spoofer);
    assert_true(strncmp(from[0].addr, "127.0.0.1:", 10) == 0);
    assert_int_equal(from[1].engine_id, 0xbad);
    assert_int_not_equal(from[0].engine_id, 0xbad);
    assert_memory_equal(got[1].msg, "forged", 6);
    ferry_notifications_free(got, 2);
    close(fd);
    ferry_engine_destroy(prefill);
    ferry_engine_destroy(decode);
}

/* With a secret, the impersonator without it gets no connection, so no
 * notification; the genuine sender's arrive authenticated. */
static void impersonation_without_the_secret_is_refused(void **state)
{
    (void)state;
    ferry_engine_t *decode = engine_with("s3cret"), *prefill = engine_with("s3cret");
    int fd;
    int st = raw_peer(ferry_engine_port(decode), "127.0.0.1", ferry_engine_name(prefill), 0xbad, &fd);
    assert_int_equal(st, FERRY_ERR_AUTH_FAILED);
    ferry_frame_t f = {.type = FERRY_FRAME_NOTIFY, .plen = 6};
    raw_send(fd, &f, "forged"); /* the connection is closing: whatever happens, nothing is queued */
    assert_true(raw_closed_within(fd, 5000));
    close(fd);
    assert_int_equal(ferry_notify(prefill, ferry_engine_name(decode), "genuine", 7), 0);
    ferry_notification_t got[4];
    ferry_notification_sender_t from[4];
    assert_int_equal(ferry_get_notifications_from(decode, got, from, 4), 1);
    assert_int_equal(from[0].authenticated, 1);
    assert_string_equal(got[0].peer, ferry_engine_name(prefill));
    assert_memory_equal(got[0].msg, "genuine", 7);
    ferry_notifications_free(got, 1);
    ferry_engine_destroy(prefill);
    ferry_engine_destroy(decode);
}

/* One raw peer floods: it is refused once it holds its share, and a
 * genuine engine's notifications still arrive. Then the flooder mints a
 * new engine id per connection: it is held to its address's share, and a
 * sender from another address (127.0.0.2) still gets in. */
static void a_flooder_only_loses_its_own(void **state)
{
    (void)state;
    ferry_engine_t *decode = engine_with(NULL), *prefill = engine_with(NULL);
    uint16_t port = ferry_engine_port(decode);
    int fd;
    assert_int_equal(raw_peer(port, "127.0.0.1", "flooder", 1, &fd), 0);
    long queued = flood(fd, FERRY_NOTIFY_PEER_BACKLOG + 1);
    printf("# one flooder: %ld queued before it was refused\n", queued);
    assert_int_equal(queued, FERRY_NOTIFY_PEER_BACKLOG);
    assert_int_equal(ferry_notify(prefill, ferry_engine_name(decode), "genuine", 7), 0);
    close(fd);
    /* The drop is visible: counted, and in the metrics. */
    ferry_stats_t st;
    assert_int_equal(ferry_engine_stats(decode, &st), 0);
    assert_int_equal(st.notifies_dropped, 1);
    char *text = malloc(1 << 20);
    assert_true(ferry_metrics_prometheus(decode, text, 1 << 20) > 0);
    assert_non_null(strstr(text, "\nferry_engine_notifies_dropped_total 1\n"));
    free(text);

    long total = queued;
    for (uint64_t id = 2; total < FERRY_NOTIFY_ADDRESS_BACKLOG + 1; id++) {
        assert_true(id < 64);
        assert_int_equal(raw_peer(port, "127.0.0.1", "flooder", id, &fd), 0);
        long k = flood(fd, FERRY_NOTIFY_PEER_BACKLOG);
        close(fd);
        total += k;
        if (k < FERRY_NOTIFY_PEER_BACKLOG) break;
    }
    printf("# flooder minting engine ids: %ld queued from its address\n", total);
    assert_int_equal(total + 1, FERRY_NOTIFY_ADDRESS_BACKLOG); /* the genuine one shares the address */
    assert_int_equal(raw_peer(port, "127.0.0.2", "elsewhere", 99, &fd), 0);
    assert_int_equal(flood(fd, 3), 3);
    close(fd);

    /* Reading frees the shares: the first flooder may send again. */
    ferry_notification_t *got = malloc(4096 * sizeof *got);
    long n, all = 0;
    while ((n = ferry_get_notifications(decode, got, 4096)) > 0) {
        ferry_notifications_free(got, (size_t)n);
        all += n;
    }
    assert_int_equal(all, total + 1 + 3);
    free(got);
    assert_int_equal(raw_peer(port, "127.0.0.1", "flooder", 1, &fd), 0);
    assert_int_equal(flood(fd, 5), 5);
    close(fd);
    ferry_engine_destroy(prefill);
    ferry_engine_destroy(decode);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(notifies_from_an_initiator_without_ids_all_queued),
        cmocka_unit_test(impersonation_is_told_apart),
        cmocka_unit_test(impersonation_without_the_secret_is_refused),
        cmocka_unit_test(a_flooder_only_loses_its_own),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
