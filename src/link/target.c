/* SPDX-License-Identifier: Apache-2.0 */
/* What the transports' target sides share (target.h). */
#include "target.h"

#include <string.h>

#include "cancel.h"
#include "util/fail.h"
#include "util/memkind.h"
#include "wire/wire.h"

int ferry_target_send_status(ferry_conn_t *c, uint8_t type, const ferry_frame_t *req, int status, uint64_t deadline)
{
    const char *why = status ? ferry_fail_message() : "";
    size_t n = strlen(why);
    if (n > FERRY_WIRE_MAX_REASON) n = FERRY_WIRE_MAX_REASON;
    ferry_frame_t f = {.type = type, .status = status, .req_id = req->req_id, .addr = req->addr,
                       .len = status ? 0 : req->len, .plen = (uint32_t)n};
    return ferry_conn_send_frame(c, &f, why, deadline);
}

int ferry_target_check_locked(ferry_conn_t *c, ferry_registry_t *r, const ferry_frame_t *f, uint32_t need)
{
    if (ferry_conn_is_cancelled(c, f->req_id))
        return ferry_fail(FERRY_ERR_CANCELLED, "request %llu was cancelled", (unsigned long long)f->req_id);
    /* A deadline that passed by our clock: the initiator has given up on
     * it, nothing more of it may land or be sent. */
    if (ferry_frame_expired(f)) return ferry_frame_expired_fail(c, f);
    return ferry_registry_check_locked(r, f->addr, f->len, need, 0, "target");
}

uint32_t ferry_registry_kind_of(ferry_registry_t *r, uint64_t p, uint64_t n, bool locked)
{
    if (ferry_registry_device_count(r) == 0) return FERRY_MEMKIND_HOST;
    if (!locked) ferry_registry_read_lock(r);
    const ferry_region_t *reg = ferry_registry_lookup_locked(r, p, n);
    uint32_t k = reg ? reg->kind : FERRY_MEMKIND_HOST;
    if (!locked) ferry_registry_unlock(r);
    return k;
}
