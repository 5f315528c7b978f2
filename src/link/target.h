/* SPDX-License-Identifier: Apache-2.0 */
/* What the transports' target sides share (tcp, shm): the answer that
 * carries a frame's status, and the check a range passes before any byte
 * of it is touched (the cancel set, the frame's deadline, the registry).
 * Private to the library. */
#ifndef FERRY_LINK_TARGET_H
#define FERRY_LINK_TARGET_H

#include <stdbool.h>
#include <stdint.h>

#include "conn.h"
#include "registry.h"

/* Answers frame req with an answer of type type carrying status (0, or a
 * failure whose detail, the thread's ferry_fail_message, follows as its
 * payload), its req_id and addr, and its len when served. */
int ferry_target_send_status(ferry_conn_t *c, uint8_t type, const ferry_frame_t *req, int status, uint64_t deadline);

/* Validation of frame f's range [addr, addr+len) with r's read lock held:
 * the cancel set first (a CANCEL's barrier relies on it), then the frame's
 * deadline (wire.h, cancel.h), then the registry as it is now, whatever
 * generation the initiator learned (a range registered again at the same
 * address takes the access; one deregistered is refused) for access need
 * (FERRY_MEM_REMOTE_*). 0 or the refusal. */
int ferry_target_check_locked(ferry_conn_t *c, ferry_registry_t *r, const ferry_frame_t *f, uint32_t need);

/* The memory kind (memkind.h) of the registered range [p, p+n) of r; host,
 * without a lookup, when no device memory is registered. locked: the
 * caller holds r's read lock. */
uint32_t ferry_registry_kind_of(ferry_registry_t *r, uint64_t p, uint64_t n, bool locked);

#endif
