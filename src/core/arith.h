/* Small integer helpers shared by the core, the transports and the KV layer. */
#ifndef FERRY_ARITH_H
#define FERRY_ARITH_H

#include <stdint.h>

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

#endif
