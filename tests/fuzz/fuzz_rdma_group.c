/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: the RDMA group commit's parsers (rdma_wire.h), as the
 * target reads an RDMA_COMMIT_GROUP (header, then n descriptors) and the
 * initiator its RDMA_COMMIT_GROUP_ACK (header, then n statuses and the
 * reason). Whatever the bytes, parsing must not crash, read past what it
 * was given or allocate, and whatever decodes must re-encode to the same
 * bytes and keep the limits the serving code relies on. */
#include <stdlib.h>
#include <string.h>

#include <ferry/ferry.h>

#include "fuzz.h"
#include "link/transport.h"
#include "transport/rdma/rdma_wire.h"
#include "wire/wire.h"

static void check(int ok)
{
    if (!ok) __builtin_trap();
}

static void group(const ferry_frame_t *f, const uint8_t *body, size_t avail)
{
    if (ferry_rdma_commit_group_check(f) != 0) return;
    check(f->len >= 1 && f->len <= FERRY_RDMA_GROUP_MAX && f->plen == f->len * FERRY_RDMA_COMMIT_DESC_SIZE);
    if (avail < f->plen) return; /* the target reads exactly plen bytes first */
    static ferry_rdma_commit_desc_t d[FERRY_RDMA_GROUP_MAX];
    if (ferry_rdma_commit_group_decode(f, body, d) != 0) return;
    uint64_t total = 0;
    for (uint64_t i = 0; i < f->len; i++) {
        check(d[i].len > 0 && d[i].addr != 0 && d[i].addr + d[i].len > d[i].addr);
        total += d[i].len;
        check(total >= d[i].len); /* no wrap of the sum either */
        uint8_t again[FERRY_RDMA_COMMIT_DESC_SIZE];
        ferry_rdma_commit_desc_encode(&d[i], again);
        check(memcmp(again, body + i * FERRY_RDMA_COMMIT_DESC_SIZE, sizeof again) == 0);
    }
    check(total == f->addr);
}

static void ack(const ferry_frame_t *f, const uint8_t *body, size_t avail)
{
    /* The initiator knows n and the total; here the header's own. */
    if (f->len == 0 || f->len > FERRY_RDMA_GROUP_MAX) return;
    uint32_t n = (uint32_t)f->len;
    uint64_t total = f->status < 0 ? f->addr + 1 : f->addr;
    if (ferry_rdma_commit_group_ack_check(f, n, total) != 0) return;
    if (f->status == 0) {
        check(f->plen == 0);
        return;
    }
    check(f->plen >= 4u * n && f->plen - 4u * n <= FERRY_WIRE_MAX_REASON);
    if (avail < 4u * n) return;
    int32_t st[FERRY_RDMA_GROUP_MAX];
    if (ferry_vec_statuses_decode(body, n, st) != 0) return;
    int failed = 0;
    for (uint32_t i = 0; i < n; i++) {
        check(st[i] <= 0);
        failed |= st[i] != 0;
    }
    check(failed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The transports' frames are named and sized by the transport table;
     * this program may not link it otherwise (static library). */
    ferry_wire_set_frame_lookup(ferry_transport_frame_def);
    if (size < FERRY_FRAME_HEADER_SIZE) return 0;
    ferry_frame_t f;
    if (ferry_frame_decode(data, &f) != 0) return 0;
    check(f.plen <= ferry_frame_max_payload(f.type));
    const uint8_t *body = data + FERRY_FRAME_HEADER_SIZE;
    size_t avail = size - FERRY_FRAME_HEADER_SIZE;
    if (f.type == FERRY_FRAME_RDMA_COMMIT_GROUP) group(&f, body, avail);
    if (f.type == FERRY_FRAME_RDMA_COMMIT_GROUP_ACK) ack(&f, body, avail);
    return 0;
}

size_t fuzz_seed(int i, uint8_t *buf, size_t cap)
{
    size_t pos = 0;
    switch (i) {
    case 0: { /* a group of three pieces */
        ferry_rdma_commit_desc_t d[3] = {{FUZZ_REMOTE_ADDR, 2048, 7, 1},
                                         {FUZZ_REMOTE_ADDR + 8192, 1152, 8, 1},
                                         {FUZZ_REMOTE_ADDR + 4096, 4096, 9, 1}};
        uint8_t p[3 * FERRY_RDMA_COMMIT_DESC_SIZE];
        for (int k = 0; k < 3; k++) ferry_rdma_commit_desc_encode(&d[k], p + k * FERRY_RDMA_COMMIT_DESC_SIZE);
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_RDMA_COMMIT_GROUP, 0, 7, 2048 + 1152 + 4096, 3, 0, p, sizeof p);
        break;
    }
    case 1: /* all confirmed */
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_RDMA_COMMIT_GROUP_ACK, 0, 7, 7296, 3, 0, NULL, 0);
        break;
    case 2: { /* the second piece refused, with a reason */
        uint8_t p[4 * 3 + 3];
        memset(p, 0, sizeof p);
        uint32_t bad = (uint32_t)FERRY_ERR_ADDRESS_NOT_REGISTERED;
        for (int k = 0; k < 4; k++) p[4 + k] = (uint8_t)(bad >> (8 * k));
        memcpy(p + 12, "why", 3);
        fuzz_put_frame(buf, cap, &pos, FERRY_FRAME_RDMA_COMMIT_GROUP_ACK, FERRY_ERR_ADDRESS_NOT_REGISTERED, 7, 6144,
                       3, 0, p, sizeof p);
        break;
    }
    default: return 0;
    }
    return pos;
}
