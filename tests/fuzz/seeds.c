/* SPDX-License-Identifier: Apache-2.0 */
/* Building blocks for fuzz seeds: well-formed frames and hellos. */
#include <string.h>

#include <ferry/ferry.h>

#include "fuzz.h"
#include "util/crc32c.h"
#include "wire/le.h"
#include "wire/wire.h"

void fuzz_put_frame(uint8_t *buf, size_t cap, size_t *pos, uint8_t type, int32_t status, uint64_t req_id,
                    uint64_t addr, uint64_t len, uint64_t aux, const void *payload, uint32_t plen)
{
    if (*pos + FERRY_FRAME_HEADER_SIZE + plen > cap) return;
    ferry_frame_t f = {.type = type, .status = status, .plen = plen, .req_id = req_id, .addr = addr, .len = len,
                       .aux = aux};
    ferry_frame_encode(&f, buf + *pos);
    *pos += FERRY_FRAME_HEADER_SIZE;
    if (plen) {
        if (payload)
            memcpy(buf + *pos, payload, plen);
        else
            memset(buf + *pos, 0x5a, plen);
        *pos += plen;
    }
}

void fuzz_put_hello(uint8_t *buf, size_t cap, size_t *pos, uint8_t type, uint32_t flags, uint64_t epoch)
{
    ferry_hello_t h;
    memset(&h, 0, sizeof h);
    h.proto_min = h.proto_max = FERRY_PROTOCOL_VERSION;
    h.flags = flags;
    h.engine_id = 0x1234;
    h.epoch = epoch;
    h.pid = 1;
    memset(h.nonce, 7, sizeof h.nonce);
    strcpy(h.name, "127.0.0.1:1");
    uint8_t p[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
    int n = ferry_hello_encode(&h, p, sizeof p);
    if (n > 0) fuzz_put_frame(buf, cap, pos, type, 0, 0, 0, 0, 0, p, (uint32_t)n);
}

void fuzz_put_vector(uint8_t *buf, size_t cap, size_t *pos, uint8_t type, uint64_t aux, bool crc, size_t n,
                     const uint64_t *addrs, const uint32_t *lens)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += lens[i];
    bool writev = type == FERRY_FRAME_WRITEV, cma = type == FERRY_FRAME_CMA_VEC;
    size_t plen = n * FERRY_WIRE_VEC_DESC_SIZE + (writev ? total : 0);
    if (*pos + FERRY_FRAME_HEADER_SIZE + plen > cap) return;
    ferry_frame_t f = {.type = type, .flags = crc ? FERRY_FRAME_F_CRC : 0, .req_id = 100, .addr = total, .len = n,
                       .aux = aux, .plen = (uint32_t)plen};
    ferry_frame_encode(&f, buf + *pos);
    *pos += FERRY_FRAME_HEADER_SIZE;
    uint8_t *data = buf + *pos + n * FERRY_WIRE_VEC_DESC_SIZE;
    if (writev) memset(data, 0x5a, total);
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        ferry_vec_desc_t d = {.addr = addrs[i], .len = lens[i], .generation = 0, .req_id = 100 + i};
        if (cma) d.aux = 0x1000 + off;
        else if (crc) d.aux = ferry_crc32c(0, data + off, lens[i]);
        ferry_vec_desc_encode(&d, buf + *pos + i * FERRY_WIRE_VEC_DESC_SIZE);
        off += lens[i];
    }
    *pos += plen;
}

void fuzz_put_compact(uint8_t *buf, size_t cap, size_t *pos, uint8_t type, uint64_t aux, bool crc, size_t n,
                      uint64_t base, uint64_t stride, uint32_t len, const uint32_t *idx)
{
    bool writev = type == FERRY_FRAME_WRITEV, cma = type == FERRY_FRAME_CMA_VEC;
    uint64_t total = (uint64_t)n * len;
    bool gens = n > 2; /* seeds of three pieces or more list a generation per piece */
    ferry_frame_t f = {.type = type,
                       .flags = (uint8_t)((crc ? FERRY_FRAME_F_CRC : 0) | FERRY_FRAME_F_COMPACT | (gens ? FERRY_FRAME_F_GENS : 0)),
                       .req_id = 100, .addr = total, .len = n, .aux = aux};
    size_t dbytes = (size_t)ferry_vec_desc_bytes(&f);
    size_t plen = dbytes + (writev ? total : 0);
    if (*pos + FERRY_FRAME_HEADER_SIZE + plen > cap) return;
    f.plen = (uint32_t)plen;
    ferry_frame_encode(&f, buf + *pos);
    *pos += FERRY_FRAME_HEADER_SIZE;
    uint8_t *p = buf + *pos, *data = p + dbytes;
    ferry_vec_compact_t h = {.base = base, .stride = stride, .len = len};
    if (cma) h.lbase = 0x1000, h.lstride = len;
    ferry_vec_compact_encode(&h, p);
    uint8_t *list = p + FERRY_WIRE_COMPACT_HEAD;
    if (writev) memset(data, 0x5a, total);
    for (size_t i = 0; i < n; i++) {
        put32(list + 4 * i, idx[i]);
        if (cma) put32(list + 4 * (n + i), (uint32_t)i);
        else if (writev && crc) put32(list + 4 * (n + i), ferry_crc32c(0, data + i * len, len));
        if (gens) put32(list + 4 * ((cma || (writev && crc) ? 2 : 1) * n + i), (uint32_t)(i % 2));
    }
    *pos += plen;
}
