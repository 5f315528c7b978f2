/* SPDX-License-Identifier: Apache-2.0 */
/* The completion notice's wire form. Fixed little-endian header, then the
 * auxiliary bytes, then the reason (no NUL):
 *   0 magic "FKV" + version 1 | 4 request_id u64 | 12 status i32
 *   16 prefill_rank u32 | 20 decode_rank u32 | 24 bytes u64
 *   32 aux_len u32 | 36 reason_len u32 | 40 aux | 40+aux_len reason */
#include <string.h>

#include "util/fail.h"
#include "kv_internal.h"

static const unsigned char notice_magic[4] = {'F', 'K', 'V', 1};

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static size_t reason_len(const ferry_kv_notice_t *n)
{
    return strnlen(n->reason, FERRY_KV_REASON_MAX - 1);
}

int kv_status_known(int status)
{
    return status == 0 || (status < 0 && strcmp(ferry_error_name(status), "UNKNOWN") != 0);
}

size_t ferry_kv_notice_size(const ferry_kv_notice_t *n)
{
    return FERRY_KV_NOTICE_HEADER + n->aux_len + reason_len(n);
}

long ferry_kv_notice_encode(const ferry_kv_notice_t *n, void *buf, size_t cap)
{
    if (!n || !buf) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv notice: NULL notice or buffer");
    if (n->aux_len > FERRY_KV_AUX_MAX || (n->aux_len && !n->aux))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "kv notice: aux of %zu bytes (limit %u) must be non-NULL", n->aux_len,
                          FERRY_KV_AUX_MAX);
    if (!kv_status_known(n->status))
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv notice: status %d is neither 0 nor a Ferry error code",
                          n->status);
    size_t size = ferry_kv_notice_size(n);
    if (cap < size)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "kv notice: %zu bytes needed, room for %zu",
                          size, cap);
    unsigned char *p = buf;
    memcpy(p, notice_magic, 4);
    put_u64(p + 4, n->request_id);
    put_u32(p + 12, (uint32_t)n->status);
    put_u32(p + 16, n->prefill_rank);
    put_u32(p + 20, n->decode_rank);
    put_u64(p + 24, n->bytes);
    put_u32(p + 32, (uint32_t)n->aux_len);
    put_u32(p + 36, (uint32_t)reason_len(n));
    if (n->aux_len) memcpy(p + FERRY_KV_NOTICE_HEADER, n->aux, n->aux_len);
    memcpy(p + FERRY_KV_NOTICE_HEADER + n->aux_len, n->reason, reason_len(n));
    return (long)size;
}

int ferry_kv_notice_decode(const void *msg, size_t len, ferry_kv_notice_t *out)
{
    const unsigned char *p = msg;
    if (!p || len < 4 || memcmp(p, notice_magic, 3) != 0) return 0;
    if (p[3] != notice_magic[3])
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "kv notice: version %u, this build reads %u",
                          p[3], notice_magic[3]);
    if (len < FERRY_KV_NOTICE_HEADER)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "kv notice: %zu bytes, header needs %u", len,
                          FERRY_KV_NOTICE_HEADER);
    uint32_t aux_len = get_u32(p + 32), why_len = get_u32(p + 36);
    if (aux_len > FERRY_KV_AUX_MAX || why_len >= FERRY_KV_REASON_MAX ||
        len != (size_t)FERRY_KV_NOTICE_HEADER + aux_len + why_len)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                          "kv notice: %zu bytes do not hold aux %u + reason %u after the header",
                          len, aux_len, why_len);
    int status = (int)get_u32(p + 12);
    if (!kv_status_known(status))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "kv notice: status %d is neither 0 nor a Ferry error code",
                          status);
    memset(out, 0, sizeof *out);
    out->request_id = get_u64(p + 4);
    out->status = status;
    out->prefill_rank = get_u32(p + 16);
    out->decode_rank = get_u32(p + 20);
    out->bytes = get_u64(p + 24);
    out->aux_len = aux_len;
    out->aux = aux_len ? p + FERRY_KV_NOTICE_HEADER : NULL;
    memcpy(out->reason, p + FERRY_KV_NOTICE_HEADER + aux_len, why_len);
    out->reason[why_len] = '\0';
    return 1;
}
