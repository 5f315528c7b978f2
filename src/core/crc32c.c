/* CRC32C (Castagnoli). Hardware crc32 instructions where the CPU has SSE4.2,
 * a slice-by-1 table otherwise. Written here because it sits on the data
 * path of every checksummed slice and no Debian library exports a fast one. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "crc32c.h"

static uint32_t table[256];
static int have_hw;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
        table[i] = c;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len--) crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t len)
{
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

uint32_t ferry_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&init_once, init_table);
    crc = ~crc;
#if defined(__x86_64__)
    if (have_hw) return ~crc_hw(crc, buf, len);
#endif
    return ~crc_sw(crc, buf, len);
}
