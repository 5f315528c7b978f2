/* SPDX-License-Identifier: Apache-2.0 */
/* The HELLO this engine sends, as initiator and as target (hello.h). */
#include "hello.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "link/auth.h"
#include "parts.h"
#include "testing.h"
#include "xport.h"
#include "link/transport.h"

void ferry_hello_fill(ferry_engine_t *e, ferry_hello_t *h)
{
    memset(h, 0, sizeof *h);
    const ferry_config_t *cfg = ferry_engine_part_config(e);
    uint16_t v = (uint16_t)ferry_protocol_version_advertised(e);
    /* Every version down to 1 (older peers keep their framing), unless a
     * test pinned one (core/testing.h). */
    h->proto_min = ferry_test_protocol_version(e) ? v : 1;
    h->proto_max = v;
    h->flags = cfg->secret ? FERRY_HELLO_F_AUTH : 0;
    if (!ferry_test_no_conn_fence(e)) h->flags |= FERRY_HELLO_F_CONNFENCE;
    if (!ferry_test_no_placed(e)) h->flags |= FERRY_HELLO_F_PLACED | FERRY_HELLO_F_DEADLINE | FERRY_HELLO_F_NOTIFY_ONCE;
    for (int i = 0; ferry_transports[i]; i++)
        if (ferry_transports[i]->hello_flags) /* only the bits it declares as its own */
            h->flags |= ferry_transports[i]->hello_flags(ferry_engine_xport(e)) & ferry_transports[i]->hello_bits;
    h->engine_id = ferry_engine_part_id(e);
    h->epoch = ferry_engine_epoch(e);
    h->pid = (int32_t)getpid();
    memcpy(h->host_id, ferry_engine_part_host_id(e), sizeof h->host_id);
    uint64_t version;
    size_t count;
    ferry_registry_summary(ferry_engine_part_registry(e), &version, &count);
    h->segment_version = version;
    h->segment_count = count;
    /* Only authentication needs the nonce; a failure leaves zeros, which
     * ferry_serve_hello and the initiator's handshake refuse to MAC. */
    if (cfg->secret && ferry_auth_nonce(h->nonce) != 0) memset(h->nonce, 0, sizeof h->nonce);
    snprintf(h->name, sizeof h->name, "%s", ferry_engine_name(e));
}
