/* SPDX-License-Identifier: Apache-2.0 */
/* Small integer helpers shared by the core, the transports and the KV layer. */
#ifndef FERRY_ARITH_H
#define FERRY_ARITH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Greatest common divisor (gcd(a, 0) = a): the common stride of addresses. */
static inline uint64_t ferry_gcd64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Checked products: every size computed as a count times a size goes
 * through these, so a count from a caller (or a peer) cannot wrap the
 * result into a small allocation that later loops overrun. */

/* *out = a * b; true when the product overflows 64 bits (*out is then
 * the wrapped value and must not be used). */
static inline bool ferry_mul_overflows_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

/* *out = a * b; true when the product overflows size_t. */
static inline bool ferry_mul_overflows(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

/* malloc(n * size), or NULL when the product overflows size_t (as
 * calloc does) or memory is short. */
static inline void *ferry_malloc_array(size_t n, size_t size)
{
    size_t bytes;
    return ferry_mul_overflows(n, size, &bytes) ? NULL : malloc(bytes);
}

#endif
