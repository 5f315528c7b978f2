/* SPDX-License-Identifier: Apache-2.0 */
/* CRC-32C (crc32c.c). Private to the library. */
#ifndef FERRY_CORE_CRC32C_H
#define FERRY_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc32c.c: CRC-32C (Castagnoli) of buf, continuing from crc (0 to start;
 * the value of the previous call to chain). The fastest implementation this
 * build and CPU offer. */
uint32_t ferry_crc32c(uint32_t crc, const void *buf, size_t len);

/* Each implementation, for the tests and the benchmark (tests/test_crc32c.c);
 * all give the same value as ferry_crc32c. */
enum ferry_crc32c_impl {
    FERRY_CRC32C_BYTEWISE, /* one table, a byte at a time (the old fallback) */
    FERRY_CRC32C_SLICE8,   /* slicing-by-8: eight tables, 8 bytes a step */
    FERRY_CRC32C_HW,       /* one stream of the CPU's instruction (SSE4.2, ARMv8 CRC) */
    FERRY_CRC32C_ISAL,     /* ISA-L's crc32_iscsi */
    FERRY_CRC32C_IMPLS
};
const char *ferry_crc32c_impl_name(int impl);
/* 1 where this build and CPU have it. */
int ferry_crc32c_impl_available(int impl);
/* The implementation ferry_crc32c uses. */
int ferry_crc32c_impl_chosen(void);
/* crc32c through one implementation; impl must be available. */
uint32_t ferry_crc32c_with(int impl, uint32_t crc, const void *buf, size_t len);

#endif
