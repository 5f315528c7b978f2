/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the wire decoders (frame header, hello, segment entry).
 * Whatever the bytes, decoding must not crash, read out of bounds or
 * allocate, and whatever decodes must re-encode to the same meaning. */
#include <stdlib.h>
#include <string.h>

#include <ferry/ferry.h>

#include "fuzz.h"
#include "link/transport.h"
#include "wire/wire.h"

static void check(int ok)
{
    if (!ok) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The transports' frames are named and sized by the transport table;
     * this program may not link it otherwise (static library). */
    ferry_wire_set_frame_lookup(ferry_transport_frame_def);
    if (size >= FERRY_FRAME_HEADER_SIZE) {
        ferry_frame_t f;
        if (ferry_frame_decode(data, &f) == 0) {
            /* A valid header is its own canonical encoding. */
            uint8_t again[FERRY_FRAME_HEADER_SIZE];
            ferry_frame_encode(&f, again);
            check(memcmp(again, data, sizeof again) == 0);
            check(f.plen <= ferry_frame_max_payload(f.type));
            check(f.status <= 0);
            /* A vector frame's descriptors or statuses after it. */
            size_t avail = size - FERRY_FRAME_HEADER_SIZE;
            const uint8_t *body = data + FERRY_FRAME_HEADER_SIZE;
            if ((f.type == FERRY_FRAME_WRITEV || f.type == FERRY_FRAME_CMA_VEC || f.type == FERRY_FRAME_READV) &&
                ferry_vec_frame_check(&f) == 0 && avail >= ferry_vec_desc_bytes(&f)) {
                static ferry_vec_desc_t d[FERRY_WIRE_VEC_MAX];
                bool compact = (f.flags & FERRY_FRAME_F_COMPACT) != 0;
                uint64_t lo = 0, hi = 0;
                int rc = compact ? ferry_vec_compact_decode(&f, body, d, &lo, &hi) : ferry_vec_desc_decode(&f, body, d);
                if (rc == 0) {
                    uint64_t total = 0;
                    for (uint64_t i = 0; i < f.len; i++) {
                        check(d[i].len > 0 && d[i].len <= (f.type == FERRY_FRAME_CMA_VEC ? FERRY_WIRE_CMA_PIECE_MAX : FERRY_WIRE_VEC_PIECE_MAX));
                        check(d[i].addr + d[i].len > d[i].addr);
                        total += d[i].len;
                        if (compact) {
                            /* Every expanded piece lies in the span the target checks. */
                            check(d[i].addr >= lo && d[i].addr + d[i].len <= hi && d[i].req_id == f.req_id + i);
                            check(f.type != FERRY_FRAME_CMA_VEC || (d[i].aux && d[i].aux + d[i].len > d[i].aux));
                            continue;
                        }
                        uint8_t again[FERRY_WIRE_VEC_DESC_SIZE];
                        ferry_vec_desc_encode(&d[i], again);
                        check(memcmp(again, body + i * FERRY_WIRE_VEC_DESC_SIZE, sizeof again) == 0);
                    }
                    check(total == f.addr && total <= FERRY_WIRE_MAX_DATA);
                }
            }
            if (f.type == FERRY_FRAME_VEC_ACK && f.len <= FERRY_WIRE_VEC_MAX &&
                ferry_vec_ack_check(&f, (uint32_t)f.len) == 0 && f.status < 0 && avail >= 4 * f.len) {
                int32_t st[FERRY_WIRE_VEC_MAX];
                if (ferry_vec_statuses_decode(body, (uint32_t)f.len, st) == 0)
                    for (uint64_t i = 0; i < f.len; i++) check(st[i] <= 0);
            }
            if (f.type == FERRY_FRAME_VEC_ACK && f.len <= FERRY_WIRE_VEC_MAX &&
                ferry_vec_read_ack_check(&f, (uint32_t)f.len, f.addr) == 0)
                check(f.aux <= FERRY_WIRE_MAX_REASON && f.plen >= f.addr);
            /* The hello payload after it, if it is one. */
            if (f.type == FERRY_FRAME_HELLO || f.type == FERRY_FRAME_HELLO_ACK) {
                size_t n = size - FERRY_FRAME_HEADER_SIZE < f.plen ? size - FERRY_FRAME_HEADER_SIZE : f.plen;
                ferry_hello_t h;
                (void)ferry_hello_decode(data + FERRY_FRAME_HEADER_SIZE, n, &h);
            }
        }
    }
    ferry_hello_t h;
    if (ferry_hello_decode(data, size, &h) == 0) {
        check(h.proto_min <= h.proto_max);
        check(strlen(h.name) <= FERRY_WIRE_MAX_NAME);
        uint8_t buf[FERRY_HELLO_FIXED_SIZE + FERRY_WIRE_MAX_NAME];
        int n = ferry_hello_encode(&h, buf, sizeof buf);
        check(n == (int)size && memcmp(buf, data, size) == 0);
    }
    for (size_t off = 0; off + FERRY_WIRE_SEGMENT_SIZE <= size && off < 64 * FERRY_WIRE_SEGMENT_SIZE;
         off += FERRY_WIRE_SEGMENT_SIZE) {
        ferry_wire_segment_t s;
        if (ferry_segment_decode(data + off, &s) == 0) {
            check(s.len > 0 && s.addr + s.len > s.addr);
            uint8_t again[FERRY_WIRE_SEGMENT_SIZE];
            ferry_segment_encode(&s, again);
            check(memcmp(again, data + off, sizeof again) == 0);
        }
    }
    return 0;
}

size_t fuzz_seed(int i, uint8_t *buf, size_t cap)
{
    size_t pos = 0;
    switch (i) {
    case 0: fuzz_put_hello(buf, cap, &pos, FERRY_FRAME_HELLO, 0, 1); break;
    case 1: fuzz_put_hello(buf, cap, &pos, FERRY_FRAME_HELLO_ACK, FERRY_HELLO_F_AUTH, 2); break;
    case 2: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_WRITE, 0, 1, FUZZ_REMOTE_ADDR, 16, 1, NULL, 16); break;
    case 3: fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_WRITE_ACK, FERRY_ERR_OUT_OF_BOUNDS, 1, 0, 0, 0, "why", 3); break;
    case 4: {
        ferry_wire_segment_t s[2] = {{0x1000, 4096, FERRY_MEM_REMOTE, 1}, {0x4000, 100, FERRY_MEM_REMOTE_READ, 2}};
        ferry_segment_encode(&s[0], buf);
        ferry_segment_encode(&s[1], buf + FERRY_WIRE_SEGMENT_SIZE);
        pos = 2 * FERRY_WIRE_SEGMENT_SIZE;
        break;
    }
    case 5: {
        uint64_t a[3] = {FUZZ_REMOTE_ADDR, FUZZ_REMOTE_ADDR + 4096, FUZZ_REMOTE_ADDR + 64};
        uint32_t l[3] = {2048, 1152, 8};
        fuzz_put_vector(buf, cap, &pos, FERRY_FRAME_WRITEV, 0, true, 3, a, l);
        break;
    }
    case 6: {
        uint64_t a[2] = {FUZZ_REMOTE_ADDR, FUZZ_REMOTE_ADDR + 8192};
        uint32_t l[2] = {4096, 4096};
        fuzz_put_vector(buf, cap, &pos, FERRY_FRAME_CMA_VEC, FERRY_OP_READ, false, 2, a, l);
        break;
    }
    case 7: {
        uint8_t p[4 * 3 + 3];
        memset(p, 0, sizeof p);
        uint32_t bad = (uint32_t)FERRY_ERR_OUT_OF_BOUNDS;
        for (int k = 0; k < 4; k++) p[4 + k] = (uint8_t)(bad >> (8 * k));
        memcpy(p + 12, "why", 3);
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_VEC_ACK, FERRY_ERR_OUT_OF_BOUNDS, 100, 0, 3, 0, p, sizeof p);
        break;
    }
    case 8: {
        uint64_t a[2] = {FUZZ_REMOTE_ADDR, FUZZ_REMOTE_ADDR + 100};
        uint32_t l[2] = {64, 64};
        fuzz_put_vector(buf, cap, &pos, FERRY_FRAME_READV, 0, true, 2, a, l);
        break;
    }
    case 9: {
        uint32_t idx[4] = {7, 0, 3, 1000};
        fuzz_put_compact(buf, cap, &pos, FERRY_FRAME_WRITEV, 0, true, 4, FUZZ_REMOTE_ADDR, 2048, 64, idx);
        break;
    }
    case 10: {
        uint32_t idx[3] = {2, 1, 0};
        fuzz_put_compact(buf, cap, &pos, FERRY_FRAME_CMA_VEC, FERRY_OP_WRITE, false, 3, FUZZ_REMOTE_ADDR, 1152,
                         1152, idx);
        break;
    }
    case 11: {
        uint32_t idx[2] = {0, UINT32_MAX};
        fuzz_put_compact(buf, cap, &pos, FERRY_FRAME_READV, 0, true, 2, FUZZ_REMOTE_ADDR, 1ull << 40, 64, idx);
        break;
    }
    case 12: {
        /* A whole-connection CANCEL (the flag is for CANCEL only). */
        ferry_frame_t c = {.type = FERRY_FRAME_CANCEL, .flags = FERRY_FRAME_F_CONN, .req_id = 9, .aux = 0xfeed};
        if (cap < FERRY_FRAME_HEADER_SIZE) return 0;
        ferry_frame_encode(&c, buf);
        pos = FERRY_FRAME_HEADER_SIZE;
        break;
    }
    default: return 0;
    }
    return pos;
}
