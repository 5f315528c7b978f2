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
    atomic_uint nap_trim_us; /* taken off the planned nap (ferry_spin_nap_outcome) */
} ferry_spin_t;

/* Records one wait's length: from its start until the data was there. */
void ferry_spin_record(ferry_spin_t *s, uint64_t wait_ns);
/* The adaptive budget, in microseconds, for n recent waits (pure). */
unsigned ferry_spin_budget(const uint32_t *wait_ns, size_t n, int ncpus);
/* The CPUs this process may run on (counted once). */
int ferry_spin_cpus(void);
/* How long the next wait spins, given config.spin_us. */
unsigned ferry_spin_us(ferry_spin_t *s, int config_spin_us);

/* A nap, then a spin over the wait's end: for a wait too long to spin
 * whole but regular, an answer to work that takes about as long each time
 * (a copy of the same size), where the other side leaves this thread's
 * CPU idle. Asleep, the thread would pay a wake-up when the answer comes
 * (an idle CPU of a small VM woken by another took 30-70 us, the wake-up
 * itself ~7% of a small-piece call's samples on the sending side); napping
 * through the known part of the wait and spinning over its end, it is
 * running when the answer comes. ferry_spin_nap returns how long to nap
 * (0: no nap) and sets *tail_us, how long to spin after it, from the
 * connection's recent waits: only when all FERRY_SPIN_WINDOW were
 * recorded, their median is over FERRY_SPIN_CAP_US and at most
 * FERRY_NAP_MAX_US, and the second shortest is within FERRY_SPIN_CAP_US
 * of the median (regular); the nap ends FERRY_NAP_LEAD_US before the
 * second shortest (what a timed sleep overruns by), the spin
 * FERRY_NAP_LEAD_US after the median, FERRY_SPIN_CAP_US at most. Only in
 * the adaptive mode (config_spin_us 0) and with two CPUs or more. */
#define FERRY_NAP_MAX_US 5000
#define FERRY_NAP_LEAD_US 40
unsigned ferry_spin_nap(ferry_spin_t *s, int config_spin_us, unsigned *tail_us);
/* The same from n recorded waits, before the trim (pure). */
unsigned ferry_spin_nap_plan(const uint32_t *wait_ns, size_t n, int ncpus, unsigned *tail_us);
/* How a planned nap went. A recorded wait that ended in a sleep includes
 * the sleeper's wake-up, so naps planned from such waits run long; each
 * nap the answer cut short takes FERRY_NAP_TRIM_STEP_US more off the next
 * ones, each answer a spin caught after a nap gives 1 us back (and a nap
 * the trim swallows whole gives 1 us back too, so naps come back when the
 * waits shrink). */
typedef enum ferry_nap_outcome {
    FERRY_NAP_WOKEN, /* the answer came during the nap */
    FERRY_NAP_CAUGHT, /* the spin after it caught the answer */
    FERRY_NAP_MISSED, /* the spin ran out first */
} ferry_nap_outcome_t;
#define FERRY_NAP_TRIM_STEP_US 10
void ferry_spin_nap_outcome(ferry_spin_t *s, ferry_nap_outcome_t how);

#endif
