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

/* Calls run in the caller's thread on one connection because their pieces
 * all go through shared-pool mappings (transfer.c), process-wide. */
uint64_t ferry_test_mapped_inline_calls(void);

#endif
