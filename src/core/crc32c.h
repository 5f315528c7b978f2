/* CRC-32C (crc32c.c). Private to the library. */
#ifndef FERRY_CORE_CRC32C_H
#define FERRY_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc32c.c */
uint32_t ferry_crc32c(uint32_t crc, const void *buf, size_t len);

#endif
