/* SPDX-License-Identifier: Apache-2.0 */
/* The RDMA transport on a machine without an RDMA device (this one, and any
 * CI runner): device discovery through sysfs without loading libibverbs,
 * GID selection, settings, the probe's reasons, the choice of TCP with
 * that reason (auto and forced), and the answers of a target without RDMA
 * to RDMA frames. Runs in every build; with the verbs code built
 * (FERRY_HAVE_RDMA) it also loads the real libibverbs once. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport/rdma/rdma_wire.h"
#include "util/clock.h"
#include "engine/xport.h"
#include "engine/session.h"
#include "link/conn.h"
#include "util/net.h"
#include "harness.h"
#include "transport/rdma/rdma.h"

/* A scratch directory tree for fake sysfs contents. */
static char root[256];

static void mkpath(const char *rel)
{
    char path[512], *p;
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (p = path + strlen(root) + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    mkdir(path, 0755);
}

static void put_file(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", rel);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        mkpath(dir);
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char *at(const char *rel, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", root, rel);
    return buf;
}

static int make_root(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/ferry-rdma-probe-XXXXXX");
    assert_non_null(mkdtemp(root));
    return 0;
}

static int remove_root(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

static int libibverbs_loaded(void)
{
    void *h = dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (h) dlclose(h);
    return h != NULL;
}

/* ---------------------------------------------------------------- sysfs */

static void sysfs_device_count(void **state)
{
    (void)state;
    char p[512], names[64];
    assert_int_equal(ferry_rdma_sysfs_devices(at("absent", p, sizeof p), names, sizeof names), 0);
    assert_string_equal(names, "");
    mkpath("verbs-empty");
    put_file("verbs-empty/abi_version", "6\n");
    assert_int_equal(ferry_rdma_sysfs_devices(at("verbs-empty", p, sizeof p), names, sizeof names), 0);
    mkpath("verbs-two/uverbs0");
    mkpath("verbs-two/uverbs1");
    put_file("verbs-two/abi_version", "6\n");
    assert_int_equal(ferry_rdma_sysfs_devices(at("verbs-two", p, sizeof p), names, sizeof names), 2);
    assert_non_null(strstr(names, "uverbs0"));
    assert_non_null(strstr(names, "uverbs1"));
    assert_non_null(strchr(names, ','));
    assert_int_equal(ferry_rdma_sysfs_devices(at("verbs-two", p, sizeof p), NULL, 0), 2);
}

static void gid(const char *dev, int i, const char *value, const char *type)
{
    char rel[256];
    snprintf(rel, sizeof rel, "ib/%s/ports/1/gids/%d", dev, i);
    put_file(rel, value);
    if (type) {
        snprintf(rel, sizeof rel, "ib/%s/ports/1/gid_attrs/types/%d", dev, i);
        put_file(rel, type);
    }
}

static void roce_gid_choice(void **state)
{
    (void)state;
    char p[512], why[128] = "";
    const char *ib = at("ib", p, sizeof p);
    /* Prefers RoCE v2 carrying an IPv4 address. */
    gid("a", 0, "fe80:0000:0000:0000:0202:c9ff:fe00:0001\n", "IB/RoCE v1\n");
    gid("a", 1, "fe80:0000:0000:0000:0202:c9ff:fe00:0001\n", "RoCE v2\n");
    gid("a", 2, "0000:0000:0000:0000:0000:ffff:c0a8:0101\n", "RoCE v2\n");
    gid("a", 3, "0000:0000:0000:0000:0000:0000:0000:0000\n", NULL);
    assert_int_equal(ferry_rdma_pick_gid(ib, "a", 1, why, sizeof why), 2);
    /* Then any RoCE v2; a malformed entry is skipped. */
    gid("b", 0, "fe80:0000:0000:0000:0202:c9ff:fe00:0001\n", "IB/RoCE v1\n");
    gid("b", 1, "not-a-gid\n", "RoCE v2\n");
    gid("b", 2, "FE80:0000:0000:0000:0202:C9FF:FE00:0002\n", "RoCE v2\n");
    assert_int_equal(ferry_rdma_pick_gid(ib, "b", 1, why, sizeof why), 2);
    /* Then any non-zero GID. */
    gid("c", 0, "0000:0000:0000:0000:0000:0000:0000:0000\n", NULL);
    gid("c", 1, "fe80:0000:0000:0000:0202:c9ff:fe00:0001\n", NULL);
    assert_int_equal(ferry_rdma_pick_gid(ib, "c", 1, why, sizeof why), 1);
    /* None: -1 and a reason. */
    gid("d", 0, "0000:0000:0000:0000:0000:0000:0000:0000\n", NULL);
    assert_int_equal(ferry_rdma_pick_gid(ib, "d", 1, why, sizeof why), -1);
    assert_non_null(strstr(why, "no non-zero GID on d port 1"));
    assert_int_equal(ferry_rdma_pick_gid(ib, "absent", 1, why, sizeof why), -1);
}

static void settings_from_environment(void **state)
{
    (void)state;
    ferry_rdma_env_t env;
    unsetenv("FERRY_RDMA");
    unsetenv("FERRY_RDMA_PORT");
    unsetenv("FERRY_RDMA_GID_INDEX");
    unsetenv("FERRY_RDMA_DEVICE");
    assert_int_equal(ferry_rdma_env_load(&env), 0);
    assert_int_equal(env.enabled, 1);
    assert_int_equal(env.port, 1);
    assert_int_equal(env.gid_index, -1);
    assert_string_equal(env.device, "");
    assert_string_equal(env.libname, "libibverbs.so.1");
    setenv("FERRY_RDMA", "0", 1);
    setenv("FERRY_RDMA_PORT", "2", 1);
    setenv("FERRY_RDMA_GID_INDEX", "3", 1);
    setenv("FERRY_RDMA_DEVICE", "mlx5_1", 1);
    assert_int_equal(ferry_rdma_env_load(&env), 0);
    assert_int_equal(env.enabled, 0);
    assert_int_equal(env.port, 2);
    assert_int_equal(env.gid_index, 3);
    assert_string_equal(env.device, "mlx5_1");
    setenv("FERRY_RDMA_PORT", "0", 1);
    assert_int_equal(ferry_rdma_env_load(&env), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("FERRY_RDMA_PORT='0'");
    setenv("FERRY_RDMA_PORT", "1", 1);
    setenv("FERRY_RDMA_GID_INDEX", "x", 1);
    assert_int_equal(ferry_rdma_env_load(&env), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("FERRY_RDMA_GID_INDEX");
    unsetenv("FERRY_RDMA_GID_INDEX");
    setenv("FERRY_RDMA_DEVICE", "0123456789012345678901234567890123456789012345678901234567890123456789", 1);
    assert_int_equal(ferry_rdma_env_load(&env), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("FERRY_RDMA_DEVICE");
    unsetenv("FERRY_RDMA");
    unsetenv("FERRY_RDMA_PORT");
    unsetenv("FERRY_RDMA_DEVICE");

    /* A bad setting makes the engine's probe say which, and RDMA off. */
    setenv("FERRY_RDMA_PORT", "300", 1);
    ferry_engine_t *e = harness_engine(5000);
    char why[128];
    assert_int_equal(ferry_rdma_local(ferry_engine_xport(e), why, sizeof why), 0);
    assert_non_null(strstr(why, "RDMA off: environment FERRY_RDMA_PORT='300'"));
    ferry_engine_destroy(e);
    unsetenv("FERRY_RDMA_PORT");
}

/* ---------------------------------------------------------------- probe */

static void probe_env(ferry_rdma_env_t *env, const char *verbs_dir)
{
    static char dir[512];
    assert_int_equal(ferry_rdma_env_load(env), 0);
    env->sysfs_verbs = at(verbs_dir, dir, sizeof dir);
}

/* Must run before anything loads libibverbs in this process. */
static void no_device_never_loads_libibverbs(void **state)
{
    (void)state;
    mkpath("verbs-none");
    ferry_engine_t *e = harness_engine(5000);
    ferry_rdma_env_t env;
    probe_env(&env, "verbs-none");
    char why[128];
    assert_int_equal(ferry_rdma_reprobe(ferry_engine_xport(e), &env, why, sizeof why), 0);
    if (ferry_rdma_built()) {
        assert_non_null(strstr(why, "no RDMA device"));
        assert_non_null(strstr(why, "libibverbs not loaded"));
    } else {
        assert_non_null(strstr(why, "this build has no RDMA"));
    }
    assert_false(libibverbs_loaded());
    /* The default probe on this machine says the same (no sysfs list). */
    ferry_engine_t *e2 = harness_engine(5000);
    assert_int_equal(ferry_rdma_local(ferry_engine_xport(e2), why, sizeof why), 0);
    assert_false(libibverbs_loaded());
    ferry_engine_destroy(e2);
    ferry_engine_destroy(e);
}

static void turned_off(void **state)
{
    (void)state;
    ferry_engine_t *e = harness_engine(5000);
    ferry_rdma_env_t env;
    probe_env(&env, "verbs-two");
    env.enabled = 0;
    char why[128];
    assert_int_equal(ferry_rdma_reprobe(ferry_engine_xport(e), &env, why, sizeof why), 0);
    assert_non_null(strstr(why, "turned off (FERRY_RDMA=0)"));
    ferry_engine_destroy(e);
}

static void missing_library_is_a_reason(void **state)
{
    (void)state;
    if (!ferry_rdma_built()) skip();
    ferry_engine_t *e = harness_engine(5000);
    ferry_rdma_env_t env;
    probe_env(&env, "verbs-two");
    env.libname = "libferry-test-no-such-verbs.so.1";
    char why[128];
    assert_int_equal(ferry_rdma_reprobe(ferry_engine_xport(e), &env, why, sizeof why), 0);
    assert_non_null(strstr(why, "cannot load libferry-test-no-such-verbs.so.1"));
    assert_false(libibverbs_loaded());
    ferry_engine_destroy(e);
}

/* sysfs lists a device (faked) but libibverbs finds none (the real sysfs
 * has none): the real library is loaded, asked, and says so. */
static void listed_device_but_libibverbs_finds_none(void **state)
{
    (void)state;
    if (!ferry_rdma_built()) skip();
    ferry_engine_t *e = harness_engine(5000);
    ferry_rdma_env_t env;
    probe_env(&env, "verbs-two");
    char why[128];
    assert_int_equal(ferry_rdma_reprobe(ferry_engine_xport(e), &env, why, sizeof why), 0);
    assert_non_null(strstr(why, "libibverbs found no RDMA device"));
    assert_true(libibverbs_loaded());
    ferry_engine_destroy(e);
}

/* ------------------------------------------------------------ selection */

typedef harness_pair_t pair_t;

static pair_t *pair_new(const char *transport)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 5000;
    cfg.transport = transport;
    return harness_pair_new(&cfg, 5000);
}

static void round_trip(pair_t *p)
{
    size_t len = 3u << 20;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    assert_int_equal(ferry_register(p->initiator, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(p->target, dst, len, FERRY_MEM_REMOTE), 0);
    harness_fill(src, len, 77);
    assert_int_equal(ferry_transfer_sync(p->initiator, p->peer, FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len), 0);
    assert_true(harness_check(dst, len, 77));
    ferry_deregister(p->initiator, src);
    ferry_deregister(p->target, dst);
    free(src);
    free(dst);
}

static void auto_picks_tcp_and_says_why(void **state)
{
    (void)state;
    pair_t *p = pair_new("auto");
    assert_int_equal(ferry_session_open(p->initiator, p->peer), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p->initiator, p->peer, &info), 0);
    /* Without RDMA, auto takes the next in line: shm, the peer being on this host. */
    assert_string_equal(info.transport, "shm");
    assert_non_null(strstr(info.transport_reason, "cross-memory attach; not rdma: "));
    assert_non_null(strstr(info.transport_reason, ferry_rdma_built() ? "no RDMA device" : "no RDMA"));
    /* The target advertised no RDMA in its handshake. */
    ferry_session_t *s;
    assert_int_equal(ferry_session_get(p->initiator, p->peer, &s), 0);
    assert_int_equal(s->peer.flags & FERRY_HELLO_F_RDMA, 0);
    ferry_session_put(s);
    round_trip(p);
    harness_pair_free(p);
}

static void forced_rdma_falls_back_with_the_reason(void **state)
{
    (void)state;
    pair_t *p = pair_new("rdma");
    assert_int_equal(ferry_session_open(p->initiator, p->peer), 0);
    ferry_peer_info_t info;
    assert_int_equal(ferry_session_info(p->initiator, p->peer, &info), 0);
    assert_string_equal(info.transport, "tcp");
    assert_non_null(strstr(info.transport_reason, "rdma forced but unusable ("));
    assert_non_null(strstr(info.transport_reason, "no RDMA"));
    assert_non_null(strstr(info.transport_reason, "fell back to tcp"));
    round_trip(p);
    harness_pair_free(p);
}

static void unknown_transport_lists_rdma(void **state)
{
    (void)state;
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.transport = "infiniband";
    ferry_engine_t *e = NULL;
    assert_int_equal(ferry_engine_create(&cfg, &e), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("unknown transport 'infiniband' (auto, ");
    assert_detail_contains("rdma");
    assert_detail_contains("tcp");
}

/* ------------------------------------------- target without RDMA: frames */

static void target_answers_rdma_frames(void **state)
{
    (void)state;
    pair_t *p = pair_new("tcp");
    ferry_session_t *s;
    ferry_conn_t *c;
    uint64_t dl = ferry_deadline_after_ms(5000);
    assert_int_equal(ferry_session_get(p->initiator, p->peer, &s), 0);
    assert_int_equal(ferry_session_checkout(s, dl, &c), 0);

    /* RDMA_CONNECT: refused with DEVICE_NOT_FOUND and the reason; the
     * connection stays up. */
    ferry_rdma_qp_info_t q = {.qpn = 5, .psn = 1, .lid = 1, .port = 1, .link_layer = FERRY_RDMA_LINK_IB, .mtu = 5,
                              .rd_atom = 1, .recv_depth = 8};
    uint8_t buf[FERRY_RDMA_QP_INFO_SIZE];
    ferry_rdma_qp_info_encode(&q, buf);
    ferry_frame_t f = {.type = FERRY_FRAME_RDMA_CONNECT, .plen = sizeof buf};
    assert_int_equal(ferry_conn_send_frame(c, &f, buf, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_RDMA_CONNECT_ACK);
    assert_int_equal(f.status, FERRY_ERR_DEVICE_NOT_FOUND);
    assert_int_equal(ferry_rdma_read_refusal(c, &f, "an RDMA connection", dl), FERRY_ERR_DEVICE_NOT_FOUND);
    assert_detail_contains("refused an RDMA connection");
    assert_detail_contains("cannot take an RDMA connection");
    assert_detail_contains("no RDMA");

    /* RDMA_MR_QUERY: refused likewise. */
    ferry_frame_t m = {.type = FERRY_FRAME_RDMA_MR_QUERY, .req_id = 7, .addr = 4096, .len = 1,
                       .aux = (uint64_t)FERRY_MEM_REMOTE_WRITE << 32};
    assert_int_equal(ferry_conn_send_frame(c, &m, NULL, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_RDMA_MR_INFO);
    assert_int_equal(f.req_id, 7);
    assert_int_equal(f.status, FERRY_ERR_DEVICE_NOT_FOUND);
    assert_int_equal(ferry_rdma_read_refusal(c, &f, "the RDMA key", dl), FERRY_ERR_DEVICE_NOT_FOUND);
    assert_detail_contains("has no RDMA keys");

    /* Still in step: a ping is answered. */
    ferry_frame_t ping = {.type = FERRY_FRAME_PING, .req_id = 8};
    assert_int_equal(ferry_conn_send_frame(c, &ping, NULL, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_PONG);

    /* RDMA_COMMIT cannot be valid without a queue pair: the target drops
     * the connection, telling why. */
    ferry_frame_t commit = {.type = FERRY_FRAME_RDMA_COMMIT, .req_id = 9, .addr = 4096, .len = 1};
    assert_int_equal(ferry_conn_send_frame(c, &commit, NULL, dl), 0);
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), 0);
    assert_int_equal(f.type, FERRY_FRAME_ERROR);
    assert_int_equal(f.status, FERRY_ERR_MALFORMED_FRAME);
    char text[1100] = "";
    assert_true(f.plen < sizeof text);
    assert_int_equal(ferry_net_recv(c->fd, text, f.plen, dl), 0);
    assert_non_null(strstr(text, "without an RDMA queue pair"));
    assert_int_equal(ferry_conn_recv_frame(c, &f, dl), FERRY_ERR_PEER_CLOSED);
    ferry_session_checkin(s, c, false);
    ferry_session_put(s);
    harness_pair_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_device_never_loads_libibverbs),
        cmocka_unit_test(sysfs_device_count),
        cmocka_unit_test(roce_gid_choice),
        cmocka_unit_test(settings_from_environment),
        cmocka_unit_test(turned_off),
        cmocka_unit_test(missing_library_is_a_reason),
        cmocka_unit_test(auto_picks_tcp_and_says_why),
        cmocka_unit_test(forced_rdma_falls_back_with_the_reason),
        cmocka_unit_test(unknown_transport_lists_rdma),
        cmocka_unit_test(target_answers_rdma_frames),
        /* Loads libibverbs: last. */
        cmocka_unit_test(listed_device_but_libibverbs_finds_none),
    };
    return cmocka_run_group_tests(tests, make_root, remove_root);
}
