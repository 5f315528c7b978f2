/* SPDX-License-Identifier: Apache-2.0 */
/* Sessions' copies of their peers' segment tables (session.h): fetched
 * page by page, refreshed on a miss, and resolving a remote range. */
#include <stdlib.h>

#include "session.h"
#include "link/conn.h"
#include "util/fail.h"
#include "util/net.h"

/* ------------------------------------------------------------- segments */

static const char *s_name(const ferry_conn_t *c) { return c->session ? c->session->name : c->peer.name; }

static int fetch_page(ferry_conn_t *c, size_t start, ferry_segment_t **segs, size_t *cap, size_t *total,
                      uint64_t *version, size_t *got, uint64_t deadline)
{
    ferry_frame_t q = {.type = FERRY_FRAME_SEG_QUERY, .aux = start};
    int rc = ferry_conn_send_frame(c, &q, NULL, deadline);
    if (rc) return rc;
    ferry_frame_t f;
    rc = ferry_conn_recv_frame(c, &f, deadline);
    if (rc) return rc;
    if (f.type != FERRY_FRAME_SEG_PAGE || f.len > FERRY_WIRE_SEGMENTS_PER_PAGE ||
        f.plen != f.len * FERRY_WIRE_SEGMENT_SIZE || start + f.len > f.addr)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "bad segment page (%s, %llu entries of %llu)",
                          ferry_frame_type_name(f.type), (unsigned long long)f.len, (unsigned long long)f.addr);
    if (f.addr > FERRY_WIRE_MAX_SEGMENTS)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s claims %llu segments (limit %u)", s_name(c),
                          (unsigned long long)f.addr, FERRY_WIRE_MAX_SEGMENTS);
    *total = (size_t)f.addr;
    *version = f.aux;
    /* Grown by what arrived, never by what the peer claims. */
    if (start + f.len > *cap) {
        size_t want = *cap ? *cap : 64;
        while (want < start + f.len) want *= 2;
        ferry_segment_t *n = realloc(*segs, want * sizeof **segs);
        if (!n) return ferry_fail(FERRY_ERR_MEMORY, "segment table of %zu entries: out of memory", want);
        *segs = n;
        *cap = want;
    }
    uint8_t *buf = malloc(f.plen + 1);
    if (!buf) return ferry_fail(FERRY_ERR_MEMORY, "segment page: out of memory");
    rc = ferry_net_recv(c->fd, buf, f.plen, deadline);
    for (size_t i = 0; rc == 0 && i < f.len; i++) {
        ferry_wire_segment_t w;
        rc = ferry_segment_decode(buf + i * FERRY_WIRE_SEGMENT_SIZE, &w);
        if (rc) break;
        size_t k = start + i;
        /* Sorted and disjoint, or lookups would be wrong. */
        if (k > 0 && (*segs)[k - 1].addr + (*segs)[k - 1].len > w.addr)
            rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s sent segment %zu [0x%llx+%llu) out of order", s_name(c), k,
                            (unsigned long long)w.addr, (unsigned long long)w.len);
        (*segs)[k] = (ferry_segment_t){w.addr, w.len, w.flags, w.generation};
    }
    free(buf);
    *got = (size_t)f.len;
    return rc;
}

/* Pages the whole table in; restarts if the peer's registry changed midway. */
static int fetch_segments(ferry_conn_t *c, ferry_session_t *s, uint64_t deadline)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        ferry_segment_t *segs = NULL;
        size_t cap = 0, total = 0, got = 0, pos = 0;
        uint64_t version = 0, first_version = 0;
        int rc = 0;
        do {
            rc = fetch_page(c, pos, &segs, &cap, &total, &version, &got, deadline);
            if (rc) break;
            if (pos == 0) first_version = version;
            pos += got;
        } while (version == first_version && pos < total && got > 0);
        if (rc) {
            free(segs);
            return rc;
        }
        if (version != first_version) {
            free(segs);
            continue;
        }
        /* Concurrent fetches may finish out of order: never put an older
         * table over a newer one (a region registered between them would
         * vanish from the cache, and its writes fail as unregistered). */
        pthread_rwlock_wrlock(&s->seg_lock);
        if (!s->segs || version >= s->seg_version) {
            ferry_segment_t *old = s->segs;
            s->segs = segs;
            s->nsegs = pos;
            s->seg_version = version;
            segs = old;
        }
        pthread_rwlock_unlock(&s->seg_lock);
        free(segs);
        return 0;
    }
    return ferry_fail(FERRY_ERR_TIMEOUT, "segments of %s kept changing while being fetched", s->name);
}

int ferry_session_refresh_segments(ferry_session_t *s, uint64_t deadline)
{
    ferry_conn_t *c;
    int rc = ferry_session_checkout(s, deadline, &c);
    if (rc) return rc;
    rc = fetch_segments(c, s, deadline);
    ferry_session_checkin(s, c, rc == 0);
    if (rc) ferry_fail_context("fetching the segments of %s", s->name);
    return rc;
}

/* Index of the segment containing addr, or the insertion point (negative). */
static long find_segment(const ferry_segment_t *segs, size_t n, uint64_t addr)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid].addr + segs[mid].len <= addr)
            lo = mid + 1;
        else if (segs[mid].addr > addr)
            hi = mid;
        else
            return (long)mid;
    }
    return -(long)lo - 1;
}

bool ferry_session_segment_of(ferry_session_t *s, uint64_t addr, ferry_segment_t *out)
{
    pthread_rwlock_rdlock(&s->seg_lock);
    long i = find_segment(s->segs, s->nsegs, addr);
    if (i >= 0) *out = s->segs[i];
    pthread_rwlock_unlock(&s->seg_lock);
    return i >= 0;
}

static int resolve_cached(ferry_session_t *s, int opcode, uint64_t remote, uint64_t len, uint32_t *generation)
{
    const unsigned long long a = remote, l = len;
    uint32_t need = opcode == FERRY_OP_WRITE ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
    pthread_rwlock_rdlock(&s->seg_lock);
    long i = find_segment(s->segs, s->nsegs, remote);
    int rc = 0;
    if (i < 0) {
        long below = -i - 2;
        if (below >= 0)
            rc = ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                            "remote range [0x%llx+%llu) is not in any region %s registered; nearest below is "
                            "[0x%llx+%llu) (%zu remote regions)",
                            a, l, s->name, (unsigned long long)s->segs[below].addr,
                            (unsigned long long)s->segs[below].len, s->nsegs);
        else
            rc = ferry_fail(FERRY_ERR_ADDRESS_NOT_REGISTERED,
                            "remote range [0x%llx+%llu) is not in any region %s registered (%zu remote regions)", a,
                            l, s->name, s->nsegs);
    } else {
        const ferry_segment_t *g = &s->segs[i];
        if (remote + len > g->addr + g->len)
            rc = ferry_fail(FERRY_ERR_OUT_OF_BOUNDS,
                            "remote range [0x%llx+%llu) runs %llu bytes past the end of %s's region [0x%llx+%llu)",
                            a, l, (unsigned long long)(remote + len - g->addr - g->len), s->name,
                            (unsigned long long)g->addr, (unsigned long long)g->len);
        else if ((g->flags & need) != need)
            rc = ferry_fail(FERRY_ERR_ACCESS_DENIED, "remote range [0x%llx+%llu) of %s is not registered for remote %s",
                            a, l, s->name, opcode == FERRY_OP_WRITE ? "write" : "read");
        else
            *generation = g->generation;
    }
    pthread_rwlock_unlock(&s->seg_lock);
    return rc;
}

int ferry_session_resolve(ferry_session_t *s, int opcode, uint64_t remote, uint64_t len, uint32_t *generation,
                          uint64_t deadline)
{
    if (remote + len < remote)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "remote range [0x%llx+%llu) wraps the address space",
                          (unsigned long long)remote, (unsigned long long)len);
    bool known = ferry_session_known(s);
    if (!known || atomic_exchange(&s->segs_stale, false)) {
        /* First use (the handshake, in checkout, and a segment fetch), or
         * the first after a teardown. */
        int rc = ferry_session_refresh_segments(s, deadline);
        if (rc) return rc;
    }
    if (resolve_cached(s, opcode, remote, len, generation) == 0) return 0;
    /* The peer may have registered since we looked: ask once more. */
    int rc = ferry_session_refresh_segments(s, deadline);
    if (rc) return rc;
    return resolve_cached(s, opcode, remote, len, generation);
}
