/* SPDX-License-Identifier: Apache-2.0 */
/* A TCP relay for tests of slow and broken links: it sits between an
 * initiator and a target on loopback, holds what it reads for latency_ms,
 * and forwards each direction of each connection at no more than
 * rate bytes a second. Like a real network path, bytes it has already
 * taken keep arriving at the far side after the near side closed or reset
 * its socket; so a test can see whether late bytes are refused. */
#ifndef FERRY_TEST_DELAY_PROXY_H
#define FERRY_TEST_DELAY_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct delay_proxy delay_proxy_t;

/* Listens on 127.0.0.1 (a free port) and relays to 127.0.0.1:target_port.
 * rate 0 = unlimited. Fails the test on failure. */
delay_proxy_t *delay_proxy_start(uint16_t target_port, int latency_ms, size_t rate);
/* "127.0.0.1:port": the peer name to use instead of the target's. */
const char *delay_proxy_name(const delay_proxy_t *p);
/* While frozen, new connections are accepted but nothing passes through
 * them (a black hole); existing ones go on. */
void delay_proxy_freeze_new(delay_proxy_t *p, bool frozen);
/* While stalled, no byte moves on any connection, old or new, in either
 * direction, though new connections are still accepted: like a target
 * process stopped with SIGSTOP (its kernel still accepts). */
void delay_proxy_stall(delay_proxy_t *p, bool stalled);
/* Stops listening: new connections are refused, as when the target's host
 * has nothing on the port any more. */
void delay_proxy_refuse_new(delay_proxy_t *p);
/* Bytes forwarded towards the target so far, all connections. */
uint64_t delay_proxy_bytes_to_target(delay_proxy_t *p);
/* Connections accepted so far. */
int delay_proxy_connections(delay_proxy_t *p);
/* Closes everything and joins its threads. */
void delay_proxy_stop(delay_proxy_t *p);

#endif
