/* SPDX-License-Identifier: Apache-2.0 */
/* Shared by Ferry's fuzz targets and their replay driver. */
#ifndef FERRY_FUZZ_H
#define FERRY_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fixed address the targets register their remote buffer at (when the
 * kernel allows), so that seeds and mutations can name it. */
#define FUZZ_REMOTE_ADDR 0x20000000ull
#define FUZZ_REMOTE_LEN 65536u

/* Seed inputs for the target this file is linked into: fuzz_seed(i, buf,
 * cap) writes seed i and returns its size, or 0 past the last seed. */
size_t fuzz_seed(int i, uint8_t *buf, size_t cap);

/* Helpers for building seeds: frames and hellos appended at *pos. */
void fuzz_put_frame(uint8_t *buf, size_t cap, size_t *pos, uint8_t type, int32_t status, uint64_t req_id,
                    uint64_t addr, uint64_t len, uint64_t aux, const void *payload, uint32_t plen);
/* A vector frame (WRITEV or CMA_VEC, direction aux) of n pieces at
 * addrs/lens, with crc flags when asked (WRITEV: true CRCs of the payload,
 * bytes 0x5a); CMA_VEC names initiator address 0x1000 + piece offset. */
void fuzz_put_vector(uint8_t *buf, size_t cap, size_t *pos, uint8_t type, uint64_t aux, bool crc, size_t n,
                     const uint64_t *addrs, const uint32_t *lens);
/* The same pieces' compact form (protocol 3): n pieces of len at base +
 * idx[i] * stride; CMA_VEC names initiator address 0x1000 + i * len;
 * three pieces or more also list generations (0, 1, 0, ...: F_GENS). */
void fuzz_put_compact(uint8_t *buf, size_t cap, size_t *pos, uint8_t type, uint64_t aux, bool crc, size_t n,
                      uint64_t base, uint64_t stride, uint32_t len, const uint32_t *idx);
void fuzz_put_hello(uint8_t *buf, size_t cap, size_t *pos, uint8_t type, uint32_t flags, uint64_t epoch);

#endif
