/* SPDX-License-Identifier: Apache-2.0 */
/* The transport table and the choice of a transport per peer. */
#include "transport.h"

#include <stdio.h>
#include <string.h>

#include "util/log.h"

const ferry_transport_ops_t *const ferry_transports[] = {
    &ferry_transport_cuda_ipc, /* usable between processes of one host with device memory (transport/cuda_ipc) */
    &ferry_transport_rdma, /* usable only when both ends have an RDMA device */
    &ferry_transport_shm,  /* usable between processes of one host */
    &ferry_transport_tcp,
#ifdef FERRY_TEST_TRANSPORT_EXTRA
    &ferry_transport_extra, /* tests/test_transport_extra.c: only that test's build has it */
#endif
    NULL,
};
/* Each transport has a per-region slot after the core's (registry.h). */
_Static_assert(sizeof ferry_transports / sizeof ferry_transports[0] - 1 + 1 <= FERRY_REGION_SLOTS,
               "more transports than per-region slots: raise FERRY_REGION_SLOTS");

const ferry_transport_ops_t *ferry_transport_find(const char *name)
{
    for (int i = 0; name && ferry_transports[i]; i++)
        if (strcmp(ferry_transports[i]->name, name) == 0) return ferry_transports[i];
    return NULL;
}

const ferry_transport_ops_t *ferry_transport_choose(ferry_engine_t *e, const ferry_hello_t *peer, char *why,
                                                     size_t cap)
{
    const char *forced = ferry_engine_config(e)->transport;
    if (forced && strcmp(forced, "auto") != 0) {
        const ferry_transport_ops_t *t = ferry_transport_find(forced);
        if (t && t->usable(e, peer, why, cap)) {
            char reason[128];
            snprintf(reason, sizeof reason, "forced by config; %s", why);
            snprintf(why, cap, "%s", reason);
            return t;
        }
        /* Forced but unusable: say so and fall back to TCP, which always works. */
        char reason[128];
        snprintf(reason, sizeof reason, "%s forced but unusable (%s); fell back to tcp", forced, t ? why : "unknown");
        snprintf(why, cap, "%s", reason);
        FERRY_LOG(FERRY_LOG_WARN, "transport", "peer %s: %s", peer->name, why);
        return &ferry_transport_tcp;
    }
    /* Auto: the first usable; the reason names the first one passed over. */
    char skipped[128] = "";
    for (int i = 0; ferry_transports[i]; i++) {
        if (ferry_transports[i]->usable(e, peer, why, cap)) {
            if (skipped[0]) {
                char reason[128];
                snprintf(reason, sizeof reason, "%s; %s", why, skipped);
                snprintf(why, cap, "%s", reason);
            }
            return ferry_transports[i];
        }
        if (!skipped[0]) snprintf(skipped, sizeof skipped, "not %s: %s", ferry_transports[i]->name, why);
    }
    snprintf(why, cap, "no transport is usable");
    return NULL;
}

const ferry_transport_ops_t *ferry_transport_for_frame(uint8_t type)
{
    for (int i = 0; ferry_transports[i]; i++)
        for (size_t k = 0; k < ferry_transports[i]->nserve_types; k++)
            if (ferry_transports[i]->serve_types[k] == type) return ferry_transports[i];
    return NULL;
}

unsigned ferry_transport_region_slot(const ferry_transport_ops_t *t)
{
    for (unsigned i = 0; ferry_transports[i]; i++)
        if (ferry_transports[i] == t) return 1 + i;
    return FERRY_REGION_SLOTS;
}

const ferry_frame_def_t *ferry_transport_frame_def(uint8_t type)
{
    for (int i = 0; ferry_transports[i]; i++)
        for (size_t k = 0; k < ferry_transports[i]->nframes; k++)
            if (ferry_transports[i]->frames[k].type == type) return &ferry_transports[i]->frames[k];
    return NULL;
}

/* The wire layer names and sizes the transports' frames through the table
 * (wire.h); set before main, so before any frame is decoded. */
__attribute__((constructor)) static void install_frame_lookup(void)
{
    ferry_wire_set_frame_lookup(ferry_transport_frame_def);
}
