/* SPDX-License-Identifier: Apache-2.0 */
/* Encoding and validation of Ferry frames. Hand-written: it is the hot path
 * (one header per slice) and the format is a fixed little-endian struct. */
#include "le.h"
#include "wire.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "util/fail.h"
#include <ferry/ferry.h>


/* The core frames' names; NULL: an id of the core range that a transport
 * declares (wire.h), named and sized by it. */
static const char *const type_names[] = {
    NULL, "HELLO", "HELLO_ACK", "SEG_QUERY", "SEG_PAGE", "WRITE", "WRITE_ACK",
    "READ_REQ", "READ_RESP", "NOTIFY", "NOTIFY_ACK", "PING", "PONG", "CANCEL",
    "CANCEL_ACK", NULL /* CMA_WRITE */, NULL /* CMA_READ */, "AUTH", "AUTH_ACK", "ERROR",
    NULL, NULL, NULL, NULL, NULL, NULL /* RDMA_CONNECT .. RDMA_COMMIT_ACK */, NULL, NULL /* SHM_MAP_* */,
    "WRITEV", "VEC_ACK", "CMA_VEC", "READV"};
_Static_assert(sizeof type_names / sizeof type_names[0] == FERRY_FRAME_TYPE_MAX + 1, "a frame type has no name");

static _Atomic(ferry_frame_lookup_fn) frame_lookup;

void ferry_wire_set_frame_lookup(ferry_frame_lookup_fn lookup)
{
    atomic_store(&frame_lookup, lookup);
}

bool ferry_frame_is_core(uint8_t type)
{
    if (type == 0) return false;
    if (type <= FERRY_FRAME_TYPE_MAX) return type_names[type] != NULL;
    return type < FERRY_FRAME_TRANSPORT_FIRST;
}

/* A frame a transport declares, or NULL: a core frame or an unknown one. */
static const ferry_frame_def_t *transport_frame(uint8_t type)
{
    if (type == 0 || (type <= FERRY_FRAME_TYPE_MAX && type_names[type])) return NULL;
    ferry_frame_lookup_fn lookup = atomic_load(&frame_lookup);
    return lookup ? lookup(type) : NULL;
}

static bool known_type(uint8_t type)
{
    return (type != 0 && type <= FERRY_FRAME_TYPE_MAX && type_names[type]) || transport_frame(type);
}

const char *ferry_frame_type_name(uint8_t type)
{
    if (type != 0 && type <= FERRY_FRAME_TYPE_MAX && type_names[type]) return type_names[type];
    const ferry_frame_def_t *def = transport_frame(type);
    return def ? def->name : "INVALID";
}

uint32_t ferry_frame_places(uint8_t type)
{
    const ferry_frame_def_t *def = transport_frame(type);
    return def ? def->places : 0;
}

uint32_t ferry_frame_max_payload(uint8_t type)
{
    const ferry_frame_def_t *def = transport_frame(type);
    if (def) return def->max_payload;
    switch (type) {
    case FERRY_FRAME_WRITE:
    case FERRY_FRAME_READ_RESP:
        return FERRY_WIRE_MAX_DATA;
    case FERRY_FRAME_HELLO:
    case FERRY_FRAME_HELLO_ACK:
    case FERRY_FRAME_SEG_PAGE:
    case FERRY_FRAME_ERROR:
    case FERRY_FRAME_CANCEL_ACK: /* a placement report (core/cancel.h) */
        return FERRY_WIRE_MAX_CONTROL;
    case FERRY_FRAME_NOTIFY:
        return FERRY_WIRE_MAX_NOTIFY;
    case FERRY_FRAME_WRITEV:
        return FERRY_WIRE_MAX_DATA + FERRY_WIRE_VEC_MAX * FERRY_WIRE_VEC_DESC_SIZE;
    case FERRY_FRAME_CMA_VEC:
    case FERRY_FRAME_READV:
        return FERRY_WIRE_VEC_MAX * FERRY_WIRE_VEC_DESC_SIZE;
    case FERRY_FRAME_VEC_ACK: /* statuses, reason, CRCs, and a READV's bytes */
        return FERRY_WIRE_MAX_DATA + FERRY_WIRE_VEC_MAX * 8 + FERRY_WIRE_MAX_REASON;
    case FERRY_FRAME_AUTH:
    case FERRY_FRAME_AUTH_ACK:
        return FERRY_WIRE_MAC_SIZE;
    case FERRY_FRAME_WRITE_ACK:
        return FERRY_WIRE_MAX_REASON; /* the target's detail when status < 0 */
    default:
        return 0;
    }
}

void ferry_frame_encode(const ferry_frame_t *f, uint8_t out[FERRY_FRAME_HEADER_SIZE])
{
    put32(out, FERRY_WIRE_MAGIC);
    out[4] = f->type;
    out[5] = f->flags;
    put16(out + 6, 0);
    put32(out + 8, (uint32_t)f->status);
    put32(out + 12, f->plen);
    put64(out + 16, f->req_id);
    put64(out + 24, f->addr);
    put64(out + 32, f->len);
    put64(out + 40, f->aux);
    put32(out + 48, f->crc);
    put32(out + 52, (f->flags & FERRY_FRAME_F_DEADLINE) ? f->deadline_ms : 0);
}

int ferry_frame_decode(const uint8_t in[FERRY_FRAME_HEADER_SIZE], ferry_frame_t *f)
{
    uint32_t magic = get32(in);
    if (magic != FERRY_WIRE_MAGIC)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "bad frame magic 0x%08x (not a Ferry peer?)", magic);
    f->type = in[4];
    f->flags = in[5];
    if (!known_type(f->type))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "unknown frame type %u", f->type);
    bool vec = f->type == FERRY_FRAME_WRITEV || f->type == FERRY_FRAME_READV || f->type == FERRY_FRAME_CMA_VEC;
    bool data = vec || f->type == FERRY_FRAME_WRITE || f->type == FERRY_FRAME_READ_REQ ||
                f->type == FERRY_FRAME_CMA_WRITE || f->type == FERRY_FRAME_CMA_READ;
    uint8_t allowed = FERRY_FRAME_F_CRC | (vec ? FERRY_FRAME_F_COMPACT | FERRY_FRAME_F_GENS : 0) |
                      (f->type == FERRY_FRAME_CANCEL ? FERRY_FRAME_F_CONN | FERRY_FRAME_F_PLACED : 0) |
                      (f->type == FERRY_FRAME_CANCEL_ACK ? FERRY_FRAME_F_PLACED : 0) |
                      (data || f->type == FERRY_FRAME_NOTIFY ? FERRY_FRAME_F_DEADLINE : 0);
    if (f->flags & ~allowed)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "unknown frame flags 0x%02x", f->flags);
    f->deadline_ms = (f->flags & FERRY_FRAME_F_DEADLINE) ? get32(in + 52) : 0;
    if (get16(in + 6) != 0 || (!(f->flags & FERRY_FRAME_F_DEADLINE) && get32(in + 52) != 0))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "reserved header bytes are not zero");
    f->status = (int32_t)get32(in + 8);
    f->plen = get32(in + 12);
    f->req_id = get64(in + 16);
    f->addr = get64(in + 24);
    f->len = get64(in + 32);
    f->aux = get64(in + 40);
    f->crc = get32(in + 48);
    uint32_t max = ferry_frame_max_payload(f->type);
    if (f->plen > max)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s frame payload of %u bytes exceeds its limit of %u",
                          ferry_frame_type_name(f->type), f->plen, max);
    if (f->status > 0 || (f->status < 0 && strcmp(ferry_error_name(f->status), "UNKNOWN") == 0))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "status %d in %s frame is no Ferry error code", f->status,
                          ferry_frame_type_name(f->type));
    return 0;
}

int ferry_hello_encode(const ferry_hello_t *h, uint8_t *out, size_t cap)
{
    size_t nlen = strnlen(h->name, FERRY_WIRE_MAX_NAME + 1);
    if (nlen > FERRY_WIRE_MAX_NAME || cap < FERRY_HELLO_FIXED_SIZE + nlen)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "engine name too long for the handshake");
    uint8_t *p = out;
    put16(p, h->proto_min); p += 2;
    put16(p, h->proto_max); p += 2;
    put32(p, h->flags); p += 4;
    put64(p, h->engine_id); p += 8;
    put64(p, h->epoch); p += 8;
    put64(p, h->expect_epoch); p += 8;
    put64(p, h->segment_version); p += 8;
    put64(p, h->segment_count); p += 8;
    put32(p, (uint32_t)h->pid); p += 4;
    memcpy(p, h->host_id, 16); p += 16;
    memcpy(p, h->nonce, FERRY_WIRE_NONCE_SIZE); p += FERRY_WIRE_NONCE_SIZE;
    put16(p, (uint16_t)nlen); p += 2;
    memcpy(p, h->name, nlen); p += nlen;
    return (int)(p - out);
}

int ferry_hello_decode(const uint8_t *in, size_t len, ferry_hello_t *h)
{
    if (len < FERRY_HELLO_FIXED_SIZE)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "handshake payload truncated (%zu bytes)", len);
    const uint8_t *p = in;
    h->proto_min = get16(p); p += 2;
    h->proto_max = get16(p); p += 2;
    h->flags = get32(p); p += 4;
    h->engine_id = get64(p); p += 8;
    h->epoch = get64(p); p += 8;
    h->expect_epoch = get64(p); p += 8;
    h->segment_version = get64(p); p += 8;
    h->segment_count = get64(p); p += 8;
    h->pid = (int32_t)get32(p); p += 4;
    memcpy(h->host_id, p, 16); p += 16;
    memcpy(h->nonce, p, FERRY_WIRE_NONCE_SIZE); p += FERRY_WIRE_NONCE_SIZE;
    size_t nlen = get16(p); p += 2;
    if (nlen > FERRY_WIRE_MAX_NAME || FERRY_HELLO_FIXED_SIZE + nlen != len)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "handshake name length %zu does not match payload %zu",
                          nlen, len);
    if (h->proto_min > h->proto_max)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "handshake version range %u..%u is empty", h->proto_min,
                          h->proto_max);
    memcpy(h->name, p, nlen);
    h->name[nlen] = '\0';
    if (strlen(h->name) != nlen)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "handshake name contains a NUL byte");
    return 0;
}

void ferry_segment_encode(const ferry_wire_segment_t *s, uint8_t out[FERRY_WIRE_SEGMENT_SIZE])
{
    put64(out, s->addr);
    put64(out + 8, s->len);
    put32(out + 16, s->flags);
    put32(out + 20, s->generation);
}

int ferry_segment_decode(const uint8_t in[FERRY_WIRE_SEGMENT_SIZE], ferry_wire_segment_t *s)
{
    s->addr = get64(in);
    s->len = get64(in + 8);
    s->flags = get32(in + 16);
    s->generation = get32(in + 20);
    if (s->len == 0 || s->addr + s->len < s->addr)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "segment [0x%llx+%llu) is empty or wraps",
                          (unsigned long long)s->addr, (unsigned long long)s->len);
    if (s->flags & ~(uint32_t)FERRY_MEM_REMOTE)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "segment flags 0x%x unknown", s->flags);
    return 0;
}

/* ---------------------------------------------------------------- vectors */

void ferry_vec_desc_encode(const ferry_vec_desc_t *d, uint8_t out[FERRY_WIRE_VEC_DESC_SIZE])
{
    put64(out, d->addr);
    put32(out + 8, d->len);
    put32(out + 12, d->generation);
    put64(out + 16, d->req_id);
    put64(out + 24, d->aux);
}

int ferry_vec_frame_check(const ferry_frame_t *f)
{
    const char *name = ferry_frame_type_name(f->type);
    if (f->len == 0 || f->len > FERRY_WIRE_VEC_MAX)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s of %llu pieces (1..%u)", name, (unsigned long long)f->len,
                          FERRY_WIRE_VEC_MAX);
    if (f->addr == 0 || f->addr > FERRY_WIRE_MAX_DATA)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s of %llu bytes (1..%u)", name, (unsigned long long)f->addr,
                          FERRY_WIRE_MAX_DATA);
    if ((f->flags & FERRY_FRAME_F_GENS) && !(f->flags & FERRY_FRAME_F_COMPACT))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s lists generations but is not compact", name);
    uint64_t want = ferry_vec_desc_bytes(f) + (f->type == FERRY_FRAME_WRITEV ? f->addr : 0);
    if (f->plen != want)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s of %llu pieces, %llu bytes carries %u payload bytes, not %llu",
                          name, (unsigned long long)f->len, (unsigned long long)f->addr, f->plen,
                          (unsigned long long)want);
    if (f->type == FERRY_FRAME_READV && f->aux != 0)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "READV with aux %llu", (unsigned long long)f->aux);
    if (f->type == FERRY_FRAME_CMA_VEC && ((f->flags & FERRY_FRAME_F_CRC) || (f->aux != 0 && f->aux != 1)))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "CMA_VEC with flags 0x%x, direction %llu", f->flags,
                          (unsigned long long)f->aux);
    return 0;
}

/* The longest piece a vector frame of f's type may carry (wire.h). */
static uint32_t piece_max(const ferry_frame_t *f)
{
    return f->type == FERRY_FRAME_CMA_VEC ? FERRY_WIRE_CMA_PIECE_MAX : FERRY_WIRE_VEC_PIECE_MAX;
}

int ferry_vec_desc_decode(const ferry_frame_t *f, const uint8_t *in, ferry_vec_desc_t *out)
{
    uint64_t total = 0;
    bool cma = f->type == FERRY_FRAME_CMA_VEC, crc = (f->flags & FERRY_FRAME_F_CRC) != 0;
    for (uint64_t i = 0; i < f->len; i++, in += FERRY_WIRE_VEC_DESC_SIZE) {
        ferry_vec_desc_t *d = &out[i];
        d->addr = get64(in);
        d->len = get32(in + 8);
        d->generation = get32(in + 12);
        d->req_id = get64(in + 16);
        d->aux = get64(in + 24);
        if (d->len == 0 || d->len > piece_max(f) || d->addr == 0 || d->addr + d->len < d->addr)
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s piece %llu: [0x%llx+%u) is empty, too long or wraps",
                              ferry_frame_type_name(f->type), (unsigned long long)i, (unsigned long long)d->addr,
                              d->len);
        if (cma ? d->aux == 0 || d->aux + d->len < d->aux
                : d->aux >> 32 || ((!crc || f->type == FERRY_FRAME_READV) && d->aux))
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s piece %llu: bad aux field 0x%llx",
                              ferry_frame_type_name(f->type), (unsigned long long)i, (unsigned long long)d->aux);
        total += d->len;
    }
    if (total != f->addr)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s pieces add up to %llu bytes, the header says %llu",
                          ferry_frame_type_name(f->type), (unsigned long long)total, (unsigned long long)f->addr);
    return 0;
}

int ferry_vec_read_ack_check(const ferry_frame_t *f, uint32_t n, uint64_t total)
{
    if (f->len != n)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "VEC_ACK for %llu pieces, %u were asked for",
                          (unsigned long long)f->len, n);
    uint64_t meta = (f->status < 0 ? 4ull * n + f->aux : 0) + ((f->flags & FERRY_FRAME_F_CRC) ? 4ull * n : 0);
    /* plen - meta, not meta + addr: a hostile addr near 2^64 would wrap the sum. */
    if (f->aux > FERRY_WIRE_MAX_REASON || (f->status == 0 && f->aux) || f->addr > total || f->plen < meta ||
        f->plen - meta != f->addr || (f->status == 0 && f->addr != total))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                          "VEC_ACK with status %d, %llu data bytes, reason of %llu and %u payload bytes for %u "
                          "pieces of %llu bytes",
                          f->status, (unsigned long long)f->addr, (unsigned long long)f->aux, f->plen, n,
                          (unsigned long long)total);
    return 0;
}

int ferry_vec_ack_check(const ferry_frame_t *f, uint32_t n)
{
    if (f->len != n)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "VEC_ACK for %llu pieces, %u were sent", (unsigned long long)f->len,
                          n);
    if (f->status == 0 ? f->plen != 0 : f->plen < 4u * n || f->plen > 4u * n + FERRY_WIRE_MAX_REASON)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "VEC_ACK with status %d and %u payload bytes for %u pieces",
                          f->status, f->plen, n);
    return 0;
}

int ferry_vec_statuses_decode(const uint8_t *in, uint32_t n, int32_t *st)
{
    bool failed = false;
    for (uint32_t i = 0; i < n; i++) {
        st[i] = (int32_t)get32(in + 4 * i);
        if (st[i] > 0 || (st[i] < 0 && strcmp(ferry_error_name(st[i]), "UNKNOWN") == 0))
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "VEC_ACK status %d of piece %u is no Ferry error code",
                              st[i], i);
        failed |= st[i] != 0;
    }
    if (!failed) return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "failing VEC_ACK names no failed piece");
    return 0;
}

/* ------------------------------------------------ compact vector frames */

void ferry_vec_compact_encode(const ferry_vec_compact_t *h, uint8_t out[FERRY_WIRE_COMPACT_HEAD])
{
    put64(out, h->base);
    put64(out + 8, h->stride);
    put64(out + 16, h->lbase);
    put64(out + 24, h->lstride);
    put32(out + 32, h->len);
    put32(out + 36, h->generation);
}

uint64_t ferry_vec_desc_bytes(const ferry_frame_t *f)
{
    if (!(f->flags & FERRY_FRAME_F_COMPACT)) return f->len * FERRY_WIRE_VEC_DESC_SIZE;
    uint64_t lists = 1 + (f->type == FERRY_FRAME_CMA_VEC) +
                     (f->type == FERRY_FRAME_WRITEV && (f->flags & FERRY_FRAME_F_CRC) != 0) +
                     ((f->flags & FERRY_FRAME_F_GENS) != 0);
    return FERRY_WIRE_COMPACT_HEAD + 4 * lists * f->len;
}

/* base + idx * stride, a range of len that neither overflows nor wraps:
 * true and *out. */
static bool strided_addr(uint64_t base, uint64_t stride, uint32_t idx, uint32_t len, uint64_t *out)
{
    uint64_t off;
    if (__builtin_mul_overflow((uint64_t)idx, stride, &off) || __builtin_add_overflow(base, off, out)) return false;
    return *out + len > *out;
}

int ferry_vec_compact_decode(const ferry_frame_t *f, const uint8_t *in, ferry_vec_desc_t *out, uint64_t *lo,
                             uint64_t *hi)
{
    const char *name = ferry_frame_type_name(f->type);
    bool cma = f->type == FERRY_FRAME_CMA_VEC;
    bool crc = f->type == FERRY_FRAME_WRITEV && (f->flags & FERRY_FRAME_F_CRC);
    ferry_vec_compact_t h = {.base = get64(in), .stride = get64(in + 8), .lbase = get64(in + 16),
                             .lstride = get64(in + 24), .len = get32(in + 32), .generation = get32(in + 36)};
    uint64_t n = f->len;
    bool gens = (f->flags & FERRY_FRAME_F_GENS) != 0;
    if (h.len == 0 || h.len > piece_max(f) || h.base == 0 || (cma ? h.lbase == 0 : h.lbase || h.lstride) ||
        (gens && h.generation))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                          "compact %s: pieces of %u bytes (1..%u) at 0x%llx, initiator base 0x%llx stride %llu, "
                          "generation %u%s",
                          name, h.len, piece_max(f), (unsigned long long)h.base,
                          (unsigned long long)h.lbase, (unsigned long long)h.lstride, h.generation,
                          gens ? " (listed per piece: must be 0)" : "");
    if (n * h.len != f->addr)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "compact %s: %llu pieces of %u bytes, the header says %llu bytes",
                          name, (unsigned long long)n, h.len, (unsigned long long)f->addr);
    const uint8_t *idx = in + FERRY_WIRE_COMPACT_HEAD, *lidx = idx + 4 * n, *crcs = idx + 4 * n;
    const uint8_t *genl = idx + 4 * n * (1 + (cma || crc)); /* after the other lists */
    *lo = UINT64_MAX;
    *hi = 0;
    for (uint64_t i = 0; i < n; i++) {
        ferry_vec_desc_t *d = &out[i];
        uint32_t k = get32(idx + 4 * i);
        if (!strided_addr(h.base, h.stride, k, h.len, &d->addr))
            return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                              "compact %s piece %llu: index %u at 0x%llx + %u * %llu overflows the address space", name,
                              (unsigned long long)i, k, (unsigned long long)h.base, k, (unsigned long long)h.stride);
        d->len = h.len;
        d->generation = gens ? get32(genl + 4 * i) : h.generation;
        d->req_id = f->req_id + i;
        d->aux = 0;
        if (cma) {
            uint32_t m = get32(lidx + 4 * i);
            if (!strided_addr(h.lbase, h.lstride, m, h.len, &d->aux))
                return ferry_fail(FERRY_ERR_MALFORMED_FRAME,
                                  "compact %s piece %llu: initiator index %u at 0x%llx + %u * %llu overflows", name,
                                  (unsigned long long)i, m, (unsigned long long)h.lbase, m,
                                  (unsigned long long)h.lstride);
        } else if (crc) {
            d->aux = get32(crcs + 4 * i);
        }
        if (d->addr < *lo) *lo = d->addr;
        if (d->addr + d->len > *hi) *hi = d->addr + d->len;
    }
    return 0;
}
