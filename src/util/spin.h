/* SPDX-License-Identifier: Apache-2.0 */
/* Adaptive spin-before-block for waits on one connection (config.spin_us).
 *
 * A wait that ends within a few microseconds costs more in the wake-up of a
 * sleeping thread (tens of microseconds on a small machine) than the wait
 * itself. So by default (spin_us = 0) a wait first busy-polls, yielding the
 * CPU at each turn, for a budget learnt from the recent waits of the same
 * connection: twice their median, at most FERRY_SPIN_CAP_US, and nothing
 * when that median is above the cap (long waits gain nothing from a spin),
 * when nothing was measured yet, or on a single CPU (the answer needs it).
 * Then it blocks as before. An idle connection's waits are long, so its
 * budget is 0: an idle engine never spins. spin_us > 0 spins that long
 * always; spin_us < 0 never spins. */
#ifndef FERRY_CORE_SPIN_H
#define FERRY_CORE_SPIN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define FERRY_SPIN_WINDOW 8   /* recent waits kept per connection */
#define FERRY_SPIN_CAP_US 100 /* the longest adaptive spin */
#define FERRY_SPIN_FLOOR_US 10 /* the shortest, against scheduling jitter */

/* Relaxed atomics: written by the one thread using the connection, but a
 * sampler may read them (and zeroed memory is a valid empty estimator). */
typedef struct ferry_spin {
    _Atomic uint32_t wait_ns[FERRY_SPIN_WINDOW];
    atomic_uint count; /* waits recorded so far (the ring's next slot) */
} ferry_spin_t;

/* Records one wait's length: from its start until the data was there. */
void ferry_spin_record(ferry_spin_t *s, uint64_t wait_ns);
/* The adaptive budget, in microseconds, for n recent waits (pure). */
unsigned ferry_spin_budget(const uint32_t *wait_ns, size_t n, int ncpus);
/* The CPUs this process may run on (counted once). */
int ferry_spin_cpus(void);
/* How long the next wait spins, given config.spin_us. */
unsigned ferry_spin_us(ferry_spin_t *s, int config_spin_us);

#endif
