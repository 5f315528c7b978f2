/* SPDX-License-Identifier: Apache-2.0 */
/* The shm transport's configuration keys, read through the link layer
 * (ferry_transport_key); its ops list them (`ferry info`). */
#include <string.h>

#include "shm_internal.h"

const ferry_transport_key_t shm_keys[SHM_NKEYS] = {
    [SHM_KEY_DISABLE] = {"FERRY_SHM_DISABLE", FERRY_KEY_FLAG, 0, 1, "0",
                         "1: this engine refuses cross-memory attach as a target (its initiators fall back to tcp)"},
    [SHM_KEY_NOMAP] = {"FERRY_SHM_NOMAP", FERRY_KEY_FLAG, 0, 1, "0",
                       "1: the initiator maps no shared pool; copies go by cross-memory attach"},
    [SHM_KEY_CONFIRM] = {"FERRY_SHM_CONFIRM", FERRY_KEY_FLAG, 0, 1, "0",
                         "1: the pool's owner confirms the initiator's copies (one round trip) instead of its pidfd"},
    [SHM_KEY_PROC_LOOKUP] = {"FERRY_SHM_PROC_LOOKUP", FERRY_KEY_STRING, 0, 0, "",
                             "1: a target finds a peer's socket in /proc/net/tcp, not by netlink (tests the fallback)"},
};

bool shm_key_set(int key)
{
    long v = 0;
    const char *s = NULL;
    if (shm_keys[key].type == FERRY_KEY_STRING) /* exactly "1", as before */
        return ferry_transport_key(&shm_keys[key], NULL, &s) > 0 && strcmp(s, "1") == 0;
    return ferry_transport_key(&shm_keys[key], &v, NULL) > 0 && v;
}
