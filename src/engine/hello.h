/* SPDX-License-Identifier: Apache-2.0 */
/* The HELLO this engine sends, as initiator (session_pool.c) and as target
 * (engine.c). Private to the library. */
#ifndef FERRY_CORE_HELLO_H
#define FERRY_CORE_HELLO_H

#include <ferry/ferry.h>

#include "wire/wire.h"

/* Fills h with this engine's versions, flags (its transports' included),
 * identity, segment summary, a fresh nonce when authenticating, and name. */
void ferry_hello_fill(ferry_engine_t *e, ferry_hello_t *h);

#endif
