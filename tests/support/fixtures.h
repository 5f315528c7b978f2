/* SPDX-License-Identifier: Apache-2.0 */
/* Set-ups the fault tests share (cmocka: a failed step fails the test):
 * an initiator and a target engine with a fault proxy between them, a
 * registered buffer on each side; initiators with the fault tests' short
 * deadlines; a peer process restarted at its port and buffer address. */
#ifndef FERRY_TEST_FIXTURES_H
#define FERRY_TEST_FIXTURES_H

#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

#include "fault.h"

/* ------------------------------------------- a pair behind a proxy */

typedef struct proxied_pair {
    ferry_engine_t *ini, *tgt;
    proxy_t *px;          /* forwards to tgt; proxy_name(px) is the peer */
    unsigned char *src;   /* len bytes registered at ini (not initialised) */
    unsigned char *dst;   /* len zeroed bytes, remote-accessible at tgt */
    size_t len;
} proxied_pair_t;

/* The initiator from ini_cfg, the target from tgt_cfg (NULL: defaults),
 * both on 127.0.0.1 by harness_engine_cfg, and a proxy with faults o in
 * front of the target. */
proxied_pair_t *proxied_pair_make(ferry_config_t *ini_cfg, ferry_config_t *tgt_cfg, size_t len, proxy_opts_t o);
/* The initiator, the proxy, then the target go; the buffers are freed. */
void proxied_pair_done(proxied_pair_t *w);
/* ferry_transfer_sync of all len bytes between src and dst, through the
 * proxy: op FERRY_OP_WRITE or FERRY_OP_READ. */
int proxied_pair_transfer(proxied_pair_t *w, int op);

/* ------------------------------------- initiators and peer processes */

/* An initiator as the restart and pin tests want it: timeout_ms for each
 * call and connect, one retry, a 300 ms cancel fence; transport and
 * workers as given (NULL, 0: the defaults). */
ferry_engine_t *fault_initiator(const char *transport, int timeout_ms, int workers);

/* malloc'd len bytes registered at e with flags. */
unsigned char *registered_buffer(ferry_engine_t *e, size_t len, unsigned flags);
/* Deregisters buf at e and frees it. */
void registered_buffer_free(ferry_engine_t *e, void *buf);

/* The end of a test against a peer process: p asked to quit, buf
 * deregistered at e and freed, e destroyed. */
void peer_session_end(ferry_engine_t *e, peer_proc_t *p, void *buf);

/* Kills old (SIGKILL) and starts next at its port, its buffer asked for at
 * old's address (the kernel may place it elsewhere: check next->addr where
 * that matters). next has old's name and a new epoch. */
void peer_restart_in_place(peer_proc_t *old, peer_proc_t *next);

#endif
