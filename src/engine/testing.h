/* SPDX-License-Identifier: Apache-2.0 */
/* Hooks for tests: internal (hidden) functions, which tests and tools reach
 * by linking the static library; libferry.so does not export them. Test
 * knobs live here, never in the public config. */
#ifndef FERRY_CORE_TESTING_H
#define FERRY_CORE_TESTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ferry/ferry.h>

struct ferry_conn;
struct ferry_meta;
struct ferry_registry;
struct ferry_spin;

/* From now on e advertises protocol version `version` (0: its own,
 * FERRY_PROTOCOL_VERSION) in the handshakes it starts and answers: how a
 * test meets an engine from the future. */
void ferry_test_set_protocol_version(ferry_engine_t *e, int version);
/* The knob itself: 0, or the version a test set (what the public config's
 * test_protocol_version field used to hold). */
int ferry_test_protocol_version(const ferry_engine_t *e);
/* The version e advertises: the knob, or FERRY_PROTOCOL_VERSION. */
int ferry_protocol_version_advertised(const ferry_engine_t *e);
/* From now on e acts as a peer that predates connection fences (cancel.h):
 * it neither advertises FERRY_HELLO_F_CONNFENCE nor sends CANCEL with
 * FERRY_FRAME_F_CONN; its fences name each request. */
void ferry_test_set_no_conn_fence(ferry_engine_t *e, bool off);
bool ferry_test_no_conn_fence(const ferry_engine_t *e);
/* From now on e acts as a peer that predates placement reports (cancel.h):
 * it does not advertise FERRY_HELLO_F_PLACED nor ask for reports. */
void ferry_test_set_no_placed(ferry_engine_t *e, bool off);
bool ferry_test_no_placed(const ferry_engine_t *e);

/* Cancelled request ids remembered by all of e's served connections
 * together (link/cancel.h). */
size_t ferry_cancel_engine_count(ferry_engine_t *e);

/* e's served connections, counted under their lock (listener.c): all of
 * them, those in their handshake, those past it. */
typedef struct ferry_test_conns {
    int served, handshaking, established;
} ferry_test_conns_t;
ferry_test_conns_t ferry_test_conns(ferry_engine_t *e);
/* Calls fn on each of e's served connections, under their lock. */
void ferry_test_each_conn(ferry_engine_t *e, void (*fn)(struct ferry_conn *c, void *arg), void *arg);
/* A fuzz target's connection (zeroed, its own fd) made one of e's, as the
 * listener makes those it accepts (engine and link set). */
void ferry_test_conn_bind(struct ferry_conn *c, ferry_engine_t *e);
/* The parts of e that tests look into (engine.h stays the engine's). */
struct ferry_registry *ferry_test_registry(ferry_engine_t *e);
const uint8_t *ferry_test_host_id(const ferry_engine_t *e);
struct ferry_spin *ferry_test_batch_spin(ferry_engine_t *e); /* workers.c's waits for batches */
struct ferry_meta *ferry_test_meta(ferry_engine_t *e);
int ferry_test_calls(ferry_engine_t *e); /* public calls in progress (parts.c) */
int ferry_test_sessions(ferry_engine_t *e); /* sessions open (session.c) */

/* Calls run in the caller's thread on one connection because their pieces
 * all go through shared-pool mappings (transfer.c), process-wide. */
uint64_t ferry_test_mapped_inline_calls(void);
/* Calls of small pieces run in the caller's thread on the small_serial hint (transfer.c). */
uint64_t ferry_test_small_inline_calls(void);
/* Calls of large pieces run in the caller's thread on the shares_frames hint (transfer.c). */
uint64_t ferry_test_shared_inline_calls(void);

#endif
