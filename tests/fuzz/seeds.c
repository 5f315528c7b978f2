/* Building blocks for fuzz seeds: well-formed frames and hellos. */
#include <string.h>

#include <ferry/ferry.h>

#include "fuzz.h"
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
