/* SPDX-License-Identifier: Apache-2.0 */
/* The test's transport "extra" (extra.c): what the test reads of it. */
#ifndef FERRY_TEST_EXTRA_H
#define FERRY_TEST_EXTRA_H

#include <pthread.h>

#include "link/transport.h"

/* Its frames: ids of the range it declares (80..95, past RDMA's). */
enum { FRAME_EXTRA_PING = 80, FRAME_EXTRA_PONG = 81, FRAME_EXTRA_LAST = 95 };
/* Its HELLO bit: this engine serves EXTRA_PING. */
#define EXTRA_HELLO_F_PING 0x80000000u /* the top bit: a test's, never a real transport's */

extern const ferry_transport_ops_t ferry_transport_extra;
/* Its configuration key: the number each EXTRA_PING carries. */
extern const ferry_transport_key_t extra_keys[];

/* What it did, under extra_lock. */
extern pthread_mutex_t extra_lock;
extern int extra_runs, extra_pings_served, extra_states_kept, extra_states_released, extra_inits, extra_finis;

#endif
