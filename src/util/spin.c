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

/* v = wait_ns[0..n) sorted (insertion sort: n is at most 8). */
static void sort_waits(const uint32_t *wait_ns, size_t n, uint32_t *v)
{
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        for (; j > 0 && v[j - 1] > wait_ns[i]; j--) v[j] = v[j - 1];
        v[j] = wait_ns[i];
    }
}

unsigned ferry_spin_budget(const uint32_t *wait_ns, size_t n, int ncpus)
{
    if (n == 0 || ncpus < 2) return 0;
    if (n > FERRY_SPIN_WINDOW) n = FERRY_SPIN_WINDOW;
    uint32_t v[FERRY_SPIN_WINDOW];
    sort_waits(wait_ns, n, v);
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

/* Copies the recorded waits (at most FERRY_SPIN_WINDOW) into w; how many. */
static size_t recorded_waits(ferry_spin_t *s, uint32_t w[FERRY_SPIN_WINDOW])
{
    unsigned count = atomic_load_explicit(&s->count, memory_order_relaxed);
    size_t n = count < FERRY_SPIN_WINDOW ? count : FERRY_SPIN_WINDOW;
    for (size_t i = 0; i < n; i++) w[i] = atomic_load_explicit(&s->wait_ns[i], memory_order_relaxed);
    return n;
}

unsigned ferry_spin_us(ferry_spin_t *s, int config_spin_us)
{
    if (config_spin_us > 0) return (unsigned)config_spin_us;
    if (config_spin_us < 0) return 0;
    uint32_t w[FERRY_SPIN_WINDOW];
    size_t n = recorded_waits(s, w);
    return ferry_spin_budget(w, n, usable_cpus());
}

unsigned ferry_spin_nap_plan(const uint32_t *wait_ns, size_t n, int ncpus, unsigned *tail_us)
{
    *tail_us = 0;
    if (n < FERRY_SPIN_WINDOW || ncpus < 2) return 0;
    uint32_t v[FERRY_SPIN_WINDOW];
    sort_waits(wait_ns, FERRY_SPIN_WINDOW, v);
    uint64_t median = v[FERRY_SPIN_WINDOW / 2] / 1000u, low = v[1] / 1000u;
    if (median <= FERRY_SPIN_CAP_US || median > FERRY_NAP_MAX_US) return 0; /* spun whole, or too long */
    if (median - low > FERRY_SPIN_CAP_US || low <= FERRY_NAP_LEAD_US) return 0; /* irregular */
    uint64_t tail = median + 2 * FERRY_NAP_LEAD_US - low;
    *tail_us = (unsigned)(tail > FERRY_SPIN_CAP_US ? FERRY_SPIN_CAP_US : tail);
    return (unsigned)(low - FERRY_NAP_LEAD_US);
}

unsigned ferry_spin_nap(ferry_spin_t *s, int config_spin_us, unsigned *tail_us)
{
    *tail_us = 0;
    if (config_spin_us != 0) return 0;
    uint32_t w[FERRY_SPIN_WINDOW];
    size_t n = recorded_waits(s, w);
    unsigned nap = ferry_spin_nap_plan(w, n, usable_cpus(), tail_us);
    unsigned trim = atomic_load_explicit(&s->nap_trim_us, memory_order_relaxed);
    if (nap && trim >= nap) {
        atomic_store_explicit(&s->nap_trim_us, trim - 1, memory_order_relaxed);
        *tail_us = 0;
        return 0;
    }
    return nap ? nap - trim : 0;
}

void ferry_spin_nap_outcome(ferry_spin_t *s, ferry_nap_outcome_t how)
{
    unsigned trim = atomic_load_explicit(&s->nap_trim_us, memory_order_relaxed);
    if (how == FERRY_NAP_WOKEN && trim < FERRY_NAP_MAX_US) trim += FERRY_NAP_TRIM_STEP_US;
    else if (how == FERRY_NAP_CAUGHT && trim > 0) trim--;
    atomic_store_explicit(&s->nap_trim_us, trim, memory_order_relaxed);
}
