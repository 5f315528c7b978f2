/* SPDX-License-Identifier: Apache-2.0 */
/* Public calls in progress (engine.h): a call that may block on a peer
 * enters and leaves, so that destroy can wake them and wait for them. */
#include "engine.h"
#include "util/fail.h"

int ferry_engine_enter(ferry_engine_t *e)
{
    atomic_fetch_add(&e->calls, 1);
    if (atomic_load(&e->stopping))
        return ferry_engine_leave(e, ferry_fail(FERRY_ERR_CONTEXT, "the engine is shutting down"));
    return 0;
}

int ferry_engine_leave(ferry_engine_t *e, int rc)
{
    bool ours = rc == FERRY_ERR_PEER_CLOSED || rc == FERRY_ERR_SOCKET || rc == FERRY_ERR_TIMEOUT;
    if (ours && atomic_load(&e->stopping))
        rc = ferry_fail(FERRY_ERR_CONTEXT, "the engine was destroyed during the call (%s)", ferry_last_error_detail());
    /* The last one out while destroy waits tells it; nothing of e is
     * touched after that. */
    if (atomic_fetch_sub(&e->calls, 1) == 1 && atomic_load(&e->stopping)) {
        pthread_mutex_lock(&e->calls_lock);
        pthread_cond_broadcast(&e->calls_cond);
        pthread_mutex_unlock(&e->calls_lock);
    }
    return rc;
}
