/* SPDX-License-Identifier: Apache-2.0 */
/* Adaptive spin-before-block (spin.h). */
#include "spin.h"

#include <sched.h>
#include <unistd.h>

void ferry_spin_record(ferry_spin_t *s, uint64_t wait_ns)
{
    unsigned i = atomic_fetch_add_explicit(&s->count, 1, memory_order_relaxed);
    uint32_t v = wait_ns > UINT32_MAX ? UINT32_MAX : (uint32_t)wait_ns;
    atomic_store_explicit(&s->wait_ns[i % FERRY_SPIN_WINDOW], v, memory_order_relaxed);
}

unsigned ferry_spin_budget(const uint32_t *wait_ns, size_t n, int ncpus)
{
    if (n == 0 || ncpus < 2) return 0;
    if (n > FERRY_SPIN_WINDOW) n = FERRY_SPIN_WINDOW;
    uint32_t v[FERRY_SPIN_WINDOW];
    for (size_t i = 0; i < n; i++) { /* insertion sort: n is 8 */
        size_t j = i;
        for (; j > 0 && v[j - 1] > wait_ns[i]; j--) v[j] = v[j - 1];
        v[j] = wait_ns[i];
    }
    uint64_t median_ns = v[n / 2]; /* the upper median: half the waits slow is enough to stop */
    if (median_ns > (uint64_t)FERRY_SPIN_CAP_US * 1000u) return 0;
    uint64_t us = 2 * median_ns / 1000u;
    if (us < FERRY_SPIN_FLOOR_US) us = FERRY_SPIN_FLOOR_US;
    return us > FERRY_SPIN_CAP_US ? FERRY_SPIN_CAP_US : (unsigned)us;
}

/* CPUs this process may run on, counted once. */
static int usable_cpus(void)
{
    static atomic_int cached;
    int n = atomic_load_explicit(&cached, memory_order_relaxed);
    if (n == 0) {
        cpu_set_t set;
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 1) n = 1;
        atomic_store_explicit(&cached, n, memory_order_relaxed);
    }
    return n;
}

int ferry_spin_cpus(void) { return usable_cpus(); }

unsigned ferry_spin_us(ferry_spin_t *s, int config_spin_us)
{
    if (config_spin_us > 0) return (unsigned)config_spin_us;
    if (config_spin_us < 0) return 0;
    unsigned count = atomic_load_explicit(&s->count, memory_order_relaxed);
    size_t n = count < FERRY_SPIN_WINDOW ? count : FERRY_SPIN_WINDOW;
    uint32_t w[FERRY_SPIN_WINDOW];
    for (size_t i = 0; i < n; i++) w[i] = atomic_load_explicit(&s->wait_ns[i], memory_order_relaxed);
    return ferry_spin_budget(w, n, usable_cpus());
}
