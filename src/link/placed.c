/* SPDX-License-Identifier: Apache-2.0 */
/* Exactly-once placement, the target's side: what each served data
 * connection placed for its latest write frames (the placement log), the
 * duplicates it drops, and the report a CANCEL_ACK carries. The protocol
 * is described in cancel.h ("Placement reports"). */
#include "cancel.h"

#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "link.h"
#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/net.h"
#include "wire/le.h"

/* A closed connection's log is kept this long for a late fence to read. */
#define RETAIN_NS (30ull * 1000000000ull)
/* Logs of closed connections kept at most; past it the oldest go (a fence
 * then learns nothing: the initiator does not resend, as with an older
 * target). */
#define RETAIN_MAX 256

enum { ENTRY_PROGRESS = 0, ENTRY_DONE = 1, ENTRY_UNTRACKED = 2 };

typedef struct placed_entry {
    uint64_t req_id, addr, len, placed;
    int32_t status;
    uint8_t type, state;
    bool untracked;            /* its progress cannot be told until it ends */
    bool lost;                 /* out of memory for its bitmap: unknown for good */
    uint8_t *refused;          /* vector frames with refused pieces: a bit per piece */
} placed_entry_t;

struct ferry_placed_log {
    struct ferry_placed_log *next;
    uint64_t peer, key;
    uint64_t retired_ns;       /* 0 while the connection lives */
    pthread_mutex_t lock;
    placed_entry_t *ring;      /* FERRY_PLACED_LOG_MAX entries, made at the first write frame */
    unsigned head, count;      /* the next slot; entries held */
    int cur;                   /* the entry of the frame being served, -1 = none */
};

bool ferry_placed_is_write_frame(const ferry_frame_t *f)
{
    return f->type == FERRY_FRAME_WRITE || f->type == FERRY_FRAME_WRITEV || f->type == FERRY_FRAME_CMA_WRITE ||
           (f->type == FERRY_FRAME_CMA_VEC && f->aux == FERRY_OP_WRITE);
}

bool ferry_placed_is_logged_frame(const ferry_frame_t *f)
{
    return ferry_placed_is_write_frame(f) || f->type == FERRY_FRAME_CMA_READ ||
           (f->type == FERRY_FRAME_CMA_VEC && f->aux == FERRY_OP_READ);
}

static bool is_vec(uint8_t type) { return type == FERRY_FRAME_WRITEV || type == FERRY_FRAME_CMA_VEC; }

static void log_free(struct ferry_placed_log *l)
{
    if (l->ring)
        for (unsigned i = 0; i < FERRY_PLACED_LOG_MAX; i++) free(l->ring[i].refused);
    free(l->ring);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

/* With e->placed_lock held: frees retired logs past their time, then the
 * oldest retired ones beyond RETAIN_MAX. */
static void purge_locked(ferry_link_t *e, uint64_t now)
{
    for (struct ferry_placed_log **pp = &e->placed_logs; *pp;) {
        struct ferry_placed_log *l = *pp;
        if (!l->retired_ns || now - l->retired_ns <= RETAIN_NS) {
            pp = &l->next;
            continue;
        }
        *pp = l->next;
        e->placed_retired--;
        log_free(l);
    }
    while (e->placed_retired > RETAIN_MAX) {
        struct ferry_placed_log **oldest = NULL;
        for (struct ferry_placed_log **pp = &e->placed_logs; *pp; pp = &(*pp)->next)
            if ((*pp)->retired_ns && (!oldest || (*pp)->retired_ns < (*oldest)->retired_ns)) oldest = pp;
        struct ferry_placed_log *l = *oldest;
        *oldest = l->next;
        e->placed_retired--;
        log_free(l);
    }
}

void ferry_placed_open(ferry_conn_t *c)
{
    if (atomic_load_explicit(&c->link->no_placed, memory_order_relaxed)) return; /* acts as an older target */
    struct ferry_placed_log *l = calloc(1, sizeof *l);
    if (!l) return; /* fences of this connection then report nothing: no resend */
    pthread_mutex_init(&l->lock, NULL);
    l->peer = atomic_load(&c->cancel_peer);
    l->key = atomic_load(&c->cancel_key);
    l->cur = -1;
    ferry_link_t *e = c->link;
    pthread_mutex_lock(&e->placed_lock);
    /* Newest first: retired logs sit at the end, the oldest last. */
    l->next = e->placed_logs;
    e->placed_logs = l;
    pthread_mutex_unlock(&e->placed_lock);
    c->placed = l;
}

void ferry_placed_close(ferry_conn_t *c)
{
    struct ferry_placed_log *l = c->placed;
    if (!l) return;
    c->placed = NULL;
    ferry_link_t *e = c->link;
    uint64_t now = ferry_now_ns();
    pthread_mutex_lock(&e->placed_lock);
    l->retired_ns = now ? now : 1;
    e->placed_retired++;
    purge_locked(e, now);
    pthread_mutex_unlock(&e->placed_lock);
}

void ferry_placed_destroy_all(ferry_link_t *e)
{
    while (e->placed_logs) {
        struct ferry_placed_log *l = e->placed_logs;
        e->placed_logs = l->next;
        log_free(l);
    }
    e->placed_retired = 0;
}

/* With l->lock held: whether f repeats a frame this connection placed
 * whole already (same type, request id, address and length). Asked only of
 * initiators that advertise FERRY_HELLO_F_PLACED: they never send one id
 * twice on a connection (a retry takes a new id), so a repeat is a relay's
 * duplicate; raw or older peers may reuse ids and are served as before. */
static bool duplicate_locked(const struct ferry_placed_log *l, const ferry_frame_t *f)
{
    for (unsigned k = 0; k < l->count; k++) {
        const placed_entry_t *p = &l->ring[(l->head + FERRY_PLACED_LOG_MAX - 1 - k) % FERRY_PLACED_LOG_MAX];
        if (p->req_id == f->req_id && p->type == f->type && p->addr == f->addr && p->len == f->len)
            return p->state == ENTRY_DONE && p->status == 0;
    }
    return false;
}

/* Whether c's initiator never sends one id twice for frames of f's type:
 * write frames from initiators advertising FERRY_HELLO_F_PLACED; NOTIFYs
 * only from those advertising FERRY_HELLO_F_NOTIFY_ONCE (older ones send
 * every NOTIFY with id 0). */
static bool repeats_are_duplicates(const ferry_conn_t *c, const ferry_frame_t *f)
{
    uint32_t need = f->type == FERRY_FRAME_NOTIFY ? FERRY_HELLO_F_PLACED | FERRY_HELLO_F_NOTIFY_ONCE
                                                  : FERRY_HELLO_F_PLACED;
    return (c->peer.flags & need) == need;
}

bool ferry_placed_begin(ferry_conn_t *c, const ferry_frame_t *f)
{
    struct ferry_placed_log *l = c->placed;
    if (!l) return false;
    pthread_mutex_lock(&l->lock);
    if (!l->ring) l->ring = calloc(FERRY_PLACED_LOG_MAX, sizeof *l->ring);
    bool dup = false;
    if (!l->ring) {
        l->cur = -1;
    } else if (!(dup = repeats_are_duplicates(c, f) && duplicate_locked(l, f))) {
        placed_entry_t *p = &l->ring[l->head];
        free(p->refused);
        *p = (placed_entry_t){.req_id = f->req_id, .addr = f->addr, .len = f->len, .type = f->type,
                              .state = ENTRY_PROGRESS};
        l->cur = (int)l->head;
        l->head = (l->head + 1) % FERRY_PLACED_LOG_MAX;
        if (l->count < FERRY_PLACED_LOG_MAX) l->count++;
    }
    pthread_mutex_unlock(&l->lock);
    return dup;
}

/* With l->lock held: records the refused pieces of a vector frame. */
static void note_refused_locked(placed_entry_t *p, const int32_t *st, size_t n)
{
    if (!st) return;
    for (size_t i = 0; i < n; i++) {
        if (!st[i]) continue;
        if (!p->refused) p->refused = calloc((n + 7) / 8, 1);
        if (!p->refused) {
            p->lost = true; /* cannot say which: the initiator will not resend */
            return;
        }
        p->refused[i / 8] |= (uint8_t)(1u << (i % 8));
    }
}

void ferry_placed_progress(ferry_conn_t *c, uint64_t placed, const int32_t *st)
{
    struct ferry_placed_log *l = c->placed;
    if (!l) return;
    pthread_mutex_lock(&l->lock);
    if (l->cur >= 0) {
        placed_entry_t *p = &l->ring[l->cur];
        if (!p->untracked) {
            p->placed = placed;
            if (is_vec(p->type)) note_refused_locked(p, st, (size_t)p->len);
        }
    }
    pthread_mutex_unlock(&l->lock);
}

void ferry_placed_untracked(ferry_conn_t *c)
{
    struct ferry_placed_log *l = c->placed;
    if (!l) return;
    pthread_mutex_lock(&l->lock);
    if (l->cur >= 0) l->ring[l->cur].untracked = true;
    pthread_mutex_unlock(&l->lock);
}

void ferry_placed_end(ferry_conn_t *c, int status, uint64_t placed, const int32_t *st)
{
    struct ferry_placed_log *l = c->placed;
    if (!l) return;
    pthread_mutex_lock(&l->lock);
    if (l->cur >= 0) {
        placed_entry_t *p = &l->ring[l->cur];
        if (placed != FERRY_PLACED_KEEP) p->placed = placed;
        p->status = status;
        p->untracked = false;
        if (is_vec(p->type)) note_refused_locked(p, st, (size_t)p->len);
        p->state = ENTRY_DONE;
        l->cur = -1;
    }
    pthread_mutex_unlock(&l->lock);
}

int ferry_placed_drop_duplicate(ferry_conn_t *c, const ferry_frame_t *f)
{
    FERRY_LOG(FERRY_LOG_INFO, "cancel", "dropping a repeated %s of request %llu from %s: placed once already",
              ferry_frame_type_name(f->type), (unsigned long long)f->req_id, c->peer.name);
    uint64_t deadline = ferry_deadline_after_ms(c->link->timeout_ms);
    unsigned char scratch[16384];
    for (uint32_t left = f->plen; left > 0;) {
        uint32_t n = left < sizeof scratch ? left : (uint32_t)sizeof scratch;
        int rc = ferry_net_recv(c->fd, scratch, n, deadline);
        if (rc) return rc;
        left -= n;
    }
    return 0;
}

/* Encodes entry p (see cancel.h for the layout); returns the bytes used. */
static size_t encode_entry(const placed_entry_t *p, uint8_t *out)
{
    size_t bits = p->refused ? ((size_t)p->len + 7) / 8 : 0;
    put64(out, p->req_id);
    put64(out + 8, p->addr);
    put64(out + 16, p->len);
    put64(out + 24, p->placed);
    put32(out + 32, (uint32_t)p->status);
    out[36] = p->type;
    out[37] = p->lost || p->untracked ? ENTRY_UNTRACKED : p->state;
    put16(out + 38, (uint16_t)bits);
    if (bits) memcpy(out + FERRY_PLACED_ENTRY_SIZE, p->refused, bits);
    return FERRY_PLACED_ENTRY_SIZE + bits;
}

int ferry_placed_report(ferry_conn_t *via, uint64_t conn_key, uint8_t **out, size_t *len, uint32_t *count)
{
    ferry_link_t *e = via->link;
    uint64_t peer = via->peer.engine_id;
    *out = NULL;
    *len = 0;
    *count = 0;
    int found = 0;
    pthread_mutex_lock(&e->placed_lock);
    for (struct ferry_placed_log *l = e->placed_logs; l && !found; l = l->next) {
        if (l->peer != peer || l->key != conn_key || conn_key == 0) continue;
        found = 1;
        pthread_mutex_lock(&l->lock);
        size_t cap = 0;
        for (unsigned k = 0; k < l->count; k++) {
            const placed_entry_t *p = &l->ring[(l->head + FERRY_PLACED_LOG_MAX - 1 - k) % FERRY_PLACED_LOG_MAX];
            cap += FERRY_PLACED_ENTRY_SIZE + (p->refused ? ((size_t)p->len + 7) / 8 : 0);
        }
        uint8_t *buf = malloc(cap ? cap : 1);
        if (!buf) {
            found = ferry_fail(FERRY_ERR_MEMORY, "placement report: out of memory");
        } else {
            size_t at = 0;
            for (unsigned k = 0; k < l->count; k++)
                at += encode_entry(&l->ring[(l->head + FERRY_PLACED_LOG_MAX - 1 - k) % FERRY_PLACED_LOG_MAX],
                                   buf + at);
            *out = buf;
            *len = at;
            *count = l->count;
        }
        pthread_mutex_unlock(&l->lock);
    }
    pthread_mutex_unlock(&e->placed_lock);
    return found;
}

int ferry_placed_decode(const uint8_t *in, size_t len, uint32_t count, ferry_placed_t **out)
{
    *out = count ? calloc(count, sizeof **out) : NULL;
    if (count && !*out) return ferry_fail(FERRY_ERR_MEMORY, "placement report: out of memory");
    size_t at = 0;
    for (uint32_t i = 0; i < count; i++) {
        ferry_placed_t *p = &(*out)[i];
        if (len - at < FERRY_PLACED_ENTRY_SIZE) goto bad;
        const uint8_t *q = in + at;
        p->req_id = get64(q);
        p->addr = get64(q + 8);
        p->len = get64(q + 16);
        p->placed = get64(q + 24);
        p->status = (int32_t)get32(q + 32);
        p->type = q[36];
        p->state = q[37];
        size_t bits = get16(q + 38);
        at += FERRY_PLACED_ENTRY_SIZE;
        if (p->state > ENTRY_UNTRACKED || (bits && (!is_vec(p->type) || bits != (p->len + 7) / 8)) ||
            len - at < bits)
            goto bad;
        p->refused = bits ? in + at : NULL;
        at += bits;
    }
    if (at == len) return 0;
bad:
    free(*out);
    *out = NULL;
    return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "CANCEL_ACK carries a malformed placement report");
}

/* ------------------------------------ deadlines the target enforces */

void ferry_deadline_learn(ferry_conn_t *c, uint64_t target_now_ns)
{
    c->clock_known = false;
    if (!(c->peer.flags & FERRY_HELLO_F_DEADLINE) || target_now_ns == 0 || c->hello_sent_ns == 0) return;
    /* The target read its clock after our HELLO left: its clock is ahead
     * of ours by at most T - t0 (wire.h, FERRY_FRAME_F_DEADLINE). */
    c->clock_ahead_ns = (int64_t)(target_now_ns - c->hello_sent_ns);
    c->clock_known = true;
}

/* Deadlines further than this are not sent (the 32-bit milliseconds are
 * compared wrap-aware). */
#define DEADLINE_MAX_MS (1ull << 30)

void ferry_deadline_stamp(const ferry_conn_t *c, ferry_frame_t *f, uint64_t deadline)
{
    if (!c->clock_known || deadline == UINT64_MAX) return;
    uint64_t now = ferry_now_ns();
    if (deadline > now && (deadline - now) / 1000000ull >= DEADLINE_MAX_MS) return;
    uint64_t there = deadline + (uint64_t)c->clock_ahead_ns; /* mod 2^64, as the target's clock */
    f->flags |= FERRY_FRAME_F_DEADLINE;
    f->deadline_ms = (uint32_t)((there + 999999ull) / 1000000ull); /* rounded up: never early */
}

bool ferry_frame_expired(const ferry_frame_t *f)
{
    if (!(f->flags & FERRY_FRAME_F_DEADLINE)) return false;
    uint32_t now_ms = (uint32_t)(ferry_now_ns() / 1000000ull);
    return (int32_t)(now_ms - f->deadline_ms) > 0;
}

int ferry_frame_expired_fail(ferry_conn_t *c, const ferry_frame_t *f)
{
    uint32_t now_ms = (uint32_t)(ferry_now_ns() / 1000000ull);
    return ferry_fail(FERRY_ERR_TIMEOUT,
                      "request %llu from %s: its deadline passed %d ms ago by this target's clock; not %s",
                      (unsigned long long)f->req_id, c->peer.name, (int32_t)(now_ms - f->deadline_ms),
                      ferry_placed_is_write_frame(f) ? "placed" : "served");
}
