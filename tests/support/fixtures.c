/* SPDX-License-Identifier: Apache-2.0 */
/* Set-ups the fault tests share: fixtures.h. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "fixtures.h"
#include "harness.h"

proxied_pair_t *proxied_pair_make(ferry_config_t *ini_cfg, ferry_config_t *tgt_cfg, size_t len, proxy_opts_t o)
{
    proxied_pair_t *w = calloc(1, sizeof *w);
    assert_non_null(w);
    ferry_config_t defaults;
    ferry_config_init(&defaults);
    w->ini = harness_engine_cfg(ini_cfg);
    w->tgt = harness_engine_cfg(tgt_cfg ? tgt_cfg : &defaults);
    w->px = proxy_start("127.0.0.1", ferry_engine_port(w->tgt), &o);
    assert_non_null(w->px);
    w->len = len;
    w->src = malloc(len);
    w->dst = calloc(1, len);
    assert_non_null(w->src);
    assert_non_null(w->dst);
    assert_int_equal(ferry_register(w->ini, w->src, len, 0), 0);
    assert_int_equal(ferry_register(w->tgt, w->dst, len, FERRY_MEM_REMOTE), 0);
    return w;
}

void proxied_pair_done(proxied_pair_t *w)
{
    ferry_engine_destroy(w->ini);
    proxy_stop(w->px);
    ferry_engine_destroy(w->tgt);
    free(w->src);
    free(w->dst);
    free(w);
}

int proxied_pair_transfer(proxied_pair_t *w, int op)
{
    return ferry_transfer_sync(w->ini, proxy_name(w->px), op, w->src, (uint64_t)(uintptr_t)w->dst, w->len);
}

ferry_engine_t *fault_initiator(const char *transport, int timeout_ms, int workers)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = timeout_ms;
    cfg.connect_timeout_ms = timeout_ms;
    cfg.retries = 1;
    cfg.cancel_timeout_ms = 300;
    if (workers) cfg.workers = workers;
    if (transport) cfg.transport = transport;
    return harness_engine_cfg(&cfg);
}

unsigned char *registered_buffer(ferry_engine_t *e, size_t len, unsigned flags)
{
    unsigned char *buf = malloc(len);
    assert_non_null(buf);
    assert_int_equal(ferry_register(e, buf, len, flags), 0);
    return buf;
}

void registered_buffer_free(ferry_engine_t *e, void *buf)
{
    ferry_deregister(e, buf);
    free(buf);
}

void peer_restart_in_place(peer_proc_t *old, peer_proc_t *next)
{
    peer_end(old, SIGKILL);
    char port[16], at[32];
    snprintf(port, sizeof port, "%u", old->port);
    snprintf(at, sizeof at, "0x%llx", (unsigned long long)old->addr);
    const char *args[] = {"--port", port, "--at", at, NULL};
    assert_int_equal(peer_spawn(next, NULL, NULL, args), 0);
    assert_int_equal(next->port, old->port);
    assert_string_equal(next->name, old->name);
    assert_true(next->epoch != old->epoch);
}

void peer_session_end(ferry_engine_t *e, peer_proc_t *p, void *buf)
{
    peer_end(p, 0);
    registered_buffer_free(e, buf);
    ferry_engine_destroy(e);
}
