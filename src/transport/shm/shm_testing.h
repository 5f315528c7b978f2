/* SPDX-License-Identifier: Apache-2.0 */
/* What tests and benchmarks read of the shm transport: counters of its
 * copies. Not for the library's other layers. */
#ifndef FERRY_TRANSPORT_SHM_TESTING_H
#define FERRY_TRANSPORT_SHM_TESTING_H

#include <stdint.h>

/* The cross-memory attach calls of vector frames this process made and
 * their iovec entries on each side, after merging adjacent pieces
 * (shm_vec.c). */
void ferry_shm_vec_entries(uint64_t *calls, uint64_t *local, uint64_t *remote);
/* The shares of a frame's copy the copy helpers of this process took
 * (shm_helper.c). */
uint64_t ferry_shm_helper_shares(void);

#endif
