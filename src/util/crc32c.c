/* SPDX-License-Identifier: Apache-2.0 */
/* CRC32C (Castagnoli), on the data path of every checksummed slice.
 * Fastest first, chosen once per process:
 *   ISA-L's crc32_iscsi, where the build found libisal (Debian libisal-dev);
 *   one stream of the CPU's CRC32C instruction (x86 SSE4.2, ARMv8 CRC);
 *   slicing-by-8 (eight 256-entry tables, 8 bytes a step), any CPU.
 * The byte-at-a-time table stays for the tests and the benchmark. */
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7) /* <asm/hwcap.h> on arm64 */
#endif
#endif

#ifdef FERRY_HAVE_ISAL
#include <isa-l/crc.h>
#endif

#include "crc32c.h"

#define CRC32C_POLY_REFLECTED 0x82F63B78u

static uint32_t tables[8][256]; /* tables[0]: the byte-at-a-time table */
static int have_hw;
static int chosen = FERRY_CRC32C_SLICE8;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (CRC32C_POLY_REFLECTED & (0u - (c & 1)));
        tables[0][i] = c;
    }
    /* tables[k][i]: the CRC of byte i followed by k zero bytes. */
    for (int k = 1; k < 8; k++)
        for (int i = 0; i < 256; i++)
            tables[k][i] = (tables[k - 1][i] >> 8) ^ tables[0][tables[k - 1][i] & 0xff];
}

static void init(void)
{
    init_tables();
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2");
#elif defined(__aarch64__)
    have_hw = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#endif
#ifdef FERRY_HAVE_ISAL
    chosen = FERRY_CRC32C_ISAL;
#else
    chosen = have_hw ? FERRY_CRC32C_HW : FERRY_CRC32C_SLICE8;
#endif
}

/* The three software/hardware paths below work on the inverted register
 * (crc ^ 0xFFFFFFFF in, out); ferry_crc32c_with inverts around them. */
static uint32_t crc_bytewise(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len--) crc = tables[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

static uint32_t crc_slice8(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len >= 8) {
        /* Little-endian assembly: one load on little-endian CPUs, correct on any. */
        uint32_t lo = ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24) ^ crc;
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = tables[7][lo & 0xff] ^ tables[6][(lo >> 8) & 0xff] ^ tables[5][(lo >> 16) & 0xff] ^
              tables[4][lo >> 24] ^ tables[3][hi & 0xff] ^ tables[2][(hi >> 8) & 0xff] ^
              tables[1][(hi >> 16) & 0xff] ^ tables[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    return crc_bytewise(crc, p, len);
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
#elif defined(__aarch64__)
/* The compilers' own builtins: <arm_acle.h> declares __crc32cd only when the
 * whole file is built for +crc (clang), which would leave CPUs without it. */
#if defined(__clang__)
#define FERRY_CRC_TARGET "crc"
#define crc32c_u64(c, v) __builtin_arm_crc32cd((c), (v))
#define crc32c_u8(c, b) __builtin_arm_crc32cb((c), (b))
#else
#define FERRY_CRC_TARGET "+crc"
#define crc32c_u64(c, v) __builtin_aarch64_crc32cx((c), (v))
#define crc32c_u8(c, b) __builtin_aarch64_crc32cb((c), (b))
#endif
__attribute__((target(FERRY_CRC_TARGET))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        crc = crc32c_u64(crc, v);
        p += 8;
        len -= 8;
    }
    while (len--) crc = crc32c_u8(crc, *p++);
    return crc;
}
#endif

#ifdef FERRY_HAVE_ISAL
/* crc32_iscsi(buf, len, init) neither inverts its input nor its output
 * (crc32_iscsi(s, n, 0xFFFFFFFF) ^ 0xFFFFFFFF is the standard CRC32C), so
 * it takes the inverted register as the paths above do; its length is an
 * int, so longer buffers go in pieces. */
static uint32_t crc_isal(uint32_t crc, const unsigned char *p, size_t len)
{
    const size_t piece = (size_t)1 << 30;
    while (len > 0) {
        size_t n = len < piece ? len : piece;
        crc = crc32_iscsi((unsigned char *)p, (int)n, crc);
        p += n;
        len -= n;
    }
    return crc;
}
#endif

const char *ferry_crc32c_impl_name(int impl)
{
    switch (impl) {
    case FERRY_CRC32C_BYTEWISE: return "bytewise";
    case FERRY_CRC32C_SLICE8: return "slicing-by-8";
#if defined(__aarch64__)
    case FERRY_CRC32C_HW: return "armv8-crc";
#else
    case FERRY_CRC32C_HW: return "sse4.2";
#endif
    case FERRY_CRC32C_ISAL: return "isa-l";
    default: return "?";
    }
}

int ferry_crc32c_impl_available(int impl)
{
    pthread_once(&init_once, init);
    switch (impl) {
    case FERRY_CRC32C_BYTEWISE:
    case FERRY_CRC32C_SLICE8: return 1;
    case FERRY_CRC32C_HW: return have_hw;
#ifdef FERRY_HAVE_ISAL
    case FERRY_CRC32C_ISAL: return 1;
#endif
    default: return 0;
    }
}

int ferry_crc32c_impl_chosen(void)
{
    pthread_once(&init_once, init);
    return chosen;
}

uint32_t ferry_crc32c_with(int impl, uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&init_once, init);
    const unsigned char *p = buf;
    crc = ~crc;
    switch (impl) {
#ifdef FERRY_HAVE_ISAL
    case FERRY_CRC32C_ISAL: return ~crc_isal(crc, p, len);
#endif
#if defined(__x86_64__) || defined(__aarch64__)
    case FERRY_CRC32C_HW:
        if (have_hw) return ~crc_hw(crc, p, len);
        break;
#endif
    case FERRY_CRC32C_BYTEWISE: return ~crc_bytewise(crc, p, len);
    default: break;
    }
    return ~crc_slice8(crc, p, len);
}

uint32_t ferry_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&init_once, init);
    return ferry_crc32c_with(chosen, crc, buf, len);
}
