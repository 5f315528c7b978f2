/* SPDX-License-Identifier: Apache-2.0 */
/* The shared-memory transport's vector frames (CMA_VEC, vec.h): many pieces
 * in one frame and one answer. The initiator groups a stream's consecutive
 * pieces (small ones as over tcp; to targets advertising
 * FERRY_HELLO_F_CMA_BIG also whole pieces of up to FERRY_WIRE_CMA_PIECE_MAX,
 * so a call of 16 x 1 MiB costs a frame, an answer and the wake-ups they
 * bring per connection, not per piece); the target checks the pieces under
 * its registry's read lock and copies them with one process_vm_readv/writev
 * per SHM_CHUNK bytes (and IOV_MAX entries a side), logging a write's
 * progress in descriptor order (cancel.h). See shm.c for the transport. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "util/fail.h"
#include "util/spin.h"
#include "util/tsan.h"
#include "link/watch.h"
#include "link/transport.h"
#include "link/vec.h"

#include "shm_internal.h"
#include "shm_testing.h"

/* --------------------------------------------------------- initiator */

/* Whether piece x may travel in a CMA_VEC frame: a small one as over tcp
 * (vec.h), or, to a target that takes them (FERRY_HELLO_F_CMA_BIG), a
 * whole piece of up to FERRY_WIRE_CMA_PIECE_MAX bytes of host memory (the
 * caller sends device memory by tcp). Large pieces then go many to a frame:
 * one frame, one gathered copy per SHM_CHUNK and one answer for all of
 * them, where one frame and one answer each cost a wake-up on either side. */
bool shm_vec_eligible(ferry_conn_t *c, const ferry_xfer_t *x, size_t slice)
{
    if (x->len <= FERRY_WIRE_VEC_PIECE_MAX) return ferry_vec_eligible(c, x);
    return (c->peer.flags & FERRY_HELLO_F_CMA_BIG) && x->done == 0 && x->len <= FERRY_WIRE_CMA_PIECE_MAX &&
           x->len <= slice && ferry_conn_version(c) >= FERRY_PROTOCOL_VEC;
}

/* The count of consecutive pieces from xs[0] (at most n) that go in one
 * CMA_VEC frame (ferry_vec_collect with shm_vec_eligible): at most
 * FERRY_WIRE_VEC_MAX pieces and SHM_SLICE bytes; the target copies them
 * SHM_CHUNK at a time under its registry's read lock (vec_gather). */
size_t shm_vec_collect(ferry_conn_t *c, ferry_xfer_t *xs, size_t n, size_t slice)
{
    uint64_t bytes = xs[0].len;
    size_t k = 1;
    while (k < n && k < FERRY_WIRE_VEC_MAX) {
        const ferry_xfer_t *x = &xs[k];
        if (x->opcode != xs[0].opcode || bytes + x->len > SHM_SLICE || !ferry_piece_sendable(x, x->done) ||
            !shm_vec_eligible(c, x, slice))
            break;
        bytes += x->len;
        k++;
    }
    return k;
}

/* ------------------------------------------------ target: vector frames */

/* Piece i as a one-piece frame, for the per-piece paths and messages. */
static ferry_frame_t vec_piece_frame(const struct ferry_vec_scratch *v, size_t i)
{
    const ferry_vec_desc_t *d = &v->d[i];
    return (ferry_frame_t){.req_id = d->req_id, .addr = d->addr, .len = d->len, .aux = d->aux,
                           .crc = d->generation};
}

/* Moves piece i from byte q on, alone (after a gathered call stopped in
 * it): its status, or PEER_CLOSED when the initiator is gone. */
static int vec_piece_rest(struct shm_conn *sc, struct ferry_vec_scratch *v, size_t i, uint64_t q, bool write)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    const ferry_vec_desc_t *d = &v->d[i];
    while (q < d->len) {
        ssize_t got = shm_cma_once(sc->pid, write, (unsigned char *)(uintptr_t)d->addr + q, d->aux + q, d->len - q);
        if (got < 0) {
            ferry_frame_t pf = vec_piece_frame(v, i);
            return shm_cma_error(sc, &pf, write, q, d->len - q, (int)-got);
        }
        q += (uint64_t)got;
    }
    return 0;
}

/* Appends [base, base+len) to the iovec list iov[0..*cnt): extends the last
 * entry when the range follows it. False when a new entry is due and the
 * list holds IOV_MAX already. */
static bool iov_append(struct iovec *iov, size_t *cnt, uint64_t base, uint64_t len)
{
    if (*cnt && (uint64_t)(uintptr_t)iov[*cnt - 1].iov_base + iov[*cnt - 1].iov_len == base) {
        iov[*cnt - 1].iov_len += len;
        return true;
    }
    if (*cnt == IOV_MAX) return false;
    iov[(*cnt)++] = (struct iovec){(void *)(uintptr_t)base, len};
    return true;
}

/* Gathers the pieces not yet failed from *j on into one call's lists, each
 * side merged on its own (pieces adjacent here become one local entry even
 * where the initiator's are not, and the other way round): the kernel pins
 * and walks pages per entry, so fewer entries cost less. Stops when either
 * list is full or SHM_CHUNK bytes are in; the bytes gathered (*j: the next
 * piece). The bytes keep the pieces' order on both sides, so a short count
 * still maps back to the piece it stopped in by the pieces' lengths. */
static uint64_t vec_gather(struct ferry_vec_scratch *v, size_t *j, size_t n, size_t *lcnt, size_t *rcnt)
{
    uint64_t bytes = 0;
    for (; *j < n && bytes < SHM_CHUNK; ++*j) {
        const ferry_vec_desc_t *d = &v->d[*j];
        if (v->st[*j]) continue;
        if (bytes && bytes + d->len > SHM_CHUNK) break; /* large pieces: SHM_CHUNK a lock hold, as copy_chunks */
        size_t l = *lcnt;
        if (!iov_append(v->iov, lcnt, d->addr, d->len)) break;
        if (!iov_append(v->riov, rcnt, d->aux, d->len)) {
            if (*lcnt > l) --*lcnt;               /* take back the local entry just added */
            else v->iov[l - 1].iov_len -= d->len; /* or the extension */
            break;
        }
        bytes += d->len;
    }
    return bytes;
}

/* Cross-memory attach calls of vector frames this process made, and their
 * iovec entries on each side (for tests and benchmarks). */
static _Atomic uint64_t vec_calls, vec_local_entries, vec_remote_entries;

void ferry_shm_vec_entries(uint64_t *calls, uint64_t *local, uint64_t *remote)
{
    *calls = atomic_load_explicit(&vec_calls, memory_order_relaxed);
    *local = atomic_load_explicit(&vec_local_entries, memory_order_relaxed);
    *remote = atomic_load_explicit(&vec_remote_entries, memory_order_relaxed);
}

static void count_vec_call(size_t lcnt, size_t rcnt)
{
    atomic_fetch_add_explicit(&vec_calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&vec_local_entries, lcnt, memory_order_relaxed);
    atomic_fetch_add_explicit(&vec_remote_entries, rcnt, memory_order_relaxed);
}

/* Locks that make the small-entry copies from one initiator process take
 * turns across this process's connection threads, by pid (a collision only
 * makes two initiators take turns). Taken before the registry's read lock,
 * never inside it. */
#define SHM_PID_LOCKS 64
static pthread_mutex_t pid_locks[SHM_PID_LOCKS];
static pthread_once_t pid_locks_once = PTHREAD_ONCE_INIT;

static void pid_locks_init(void)
{
    for (size_t i = 0; i < SHM_PID_LOCKS; i++) pthread_mutex_init(&pid_locks[i], NULL);
}

/* The lock the copy of pieces [i, n) takes (NULL: none, the entries being
 * large): judged by the pieces' average length, which the gathered
 * entries' can only exceed where pieces merge. */
static pthread_mutex_t *small_copy_lock(const struct shm_conn *sc, const struct ferry_vec_scratch *v, size_t i,
                                        size_t n)
{
    uint64_t bytes = 0;
    for (size_t k = i; k < n; k++) bytes += v->d[k].len;
    if (n <= i + 1 || bytes / (n - i) >= SHM_SMALL_ENTRY) return NULL;
    pthread_once(&pid_locks_once, pid_locks_init);
    return &pid_locks[(unsigned)sc->pid % SHM_PID_LOCKS];
}

/* The byte offset, in descriptor order, of the end of pieces [0, j) given
 * that of [0, i) (at): the prefix a placement report names (cancel.h). */
static uint64_t vec_prefix(const struct ferry_vec_scratch *v, size_t i, size_t j, uint64_t at)
{
    for (; i < j; i++) at += v->d[i].len;
    return at;
}

/* ------------------------------------ target: copies in the initiator's order
 *
 * The kernel's cross-memory attach pins and walks the other process's pages
 * per entry of the remote list (it takes that process's mmap lock, pins the
 * entry's pages, copies, unpins), while the local list is a plain copy to
 * or from this process's memory. Pieces whose initiator buffers lie close
 * together but in another order than their targets (paged KV: a permutation
 * of the source pages) make one remote entry each in descriptor order, and
 * few in the initiator's address order, where neighbours merge: a copy of
 * 1,024 x 2 KiB whose initiator side is one permuted 2 MiB buffer takes
 * ~180 us as one remote entry, ~360 us as 1,024 (process_vm_readv, measured
 * alone; docs/BENCHMARKS.md, issue 23). So a frame that fits one gathered
 * copy is copied in the initiator's address order when that merges more of
 * its remote side. All of it moves under one hold of the registry's read
 * lock, faults included: a fence or deregistration sees the frame either
 * untouched or settled, so its placement log still goes from nothing to
 * the whole frame in descriptor order (placed, or refused in the bitmap). */

/* Sorts idx[0..m) by d[idx[k]].aux (least significant digit first, 11
 * bits a pass over the keys' span above the bits they all share: 1,024
 * pieces of one 2 MiB or 4 MiB buffer sort in one or two passes; tmp: m
 * entries of scratch). */
#define SORT_DIGIT 11
static void sort_by_key(uint32_t *idx, uint32_t *tmp, size_t m, const ferry_vec_desc_t *d, uint64_t lo,
                        uint64_t span, uint64_t varying)
{
    unsigned shift = varying ? (unsigned)__builtin_ctzll(varying) : 64;
    for (; shift < 64 && (span >> shift) != 0; shift += SORT_DIGIT) {
        uint32_t count[(1u << SORT_DIGIT) + 1];
        memset(count, 0, sizeof count);
        const uint64_t mask = (1u << SORT_DIGIT) - 1;
        for (size_t k = 0; k < m; k++) count[((d[idx[k]].aux - lo) >> shift & mask) + 1]++;
        for (size_t b = 1; b <= mask + 1; b++) count[b] += count[b - 1];
        for (size_t k = 0; k < m; k++) tmp[count[(d[idx[k]].aux - lo) >> shift & mask]++] = idx[k];
        memcpy(idx, tmp, m * sizeof *idx);
    }
}

/* Entries of a list of the ranges [key, key + len) of the pieces idx[0..m)
 * in that order, adjacent ones merged. */
static size_t remote_entries(const ferry_vec_desc_t *d, const uint32_t *idx, size_t m)
{
    size_t e = 0;
    for (size_t k = 0; k < m; k++)
        if (k == 0 || d[idx[k - 1]].aux + d[idx[k - 1]].len != d[idx[k]].aux) e++;
    return e;
}

/* sc->order, made at first use: two FERRY_WIRE_VEC_MAX-entry halves (an
 * order and a sort's scratch); NULL when out of memory. */
static uint32_t *order_scratch(struct shm_conn *sc)
{
    if (!sc->order) sc->order = malloc(2 * (size_t)FERRY_WIRE_VEC_MAX * sizeof *sc->order);
    return sc->order;
}

/* Whether pieces [0, n) (none failed yet) go as one copy in the initiator's
 * address order: they fit one gathered copy (SHM_CHUNK bytes, IOV_MAX
 * entries a side) and that order merges more of the remote list than
 * descriptor order. Then sc->order holds that order (n entries) and
 * *total their bytes. */
static bool sorted_copy_fits(struct shm_conn *sc, const struct ferry_vec_scratch *v, size_t n, uint64_t *total)
{
    if (n < 2 || n > IOV_MAX) return false;
    uint64_t bytes = 0, lo = UINT64_MAX, hi = 0;
    bool ascending = true;
    for (size_t k = 0; k < n; k++) {
        const ferry_vec_desc_t *d = &v->d[k];
        if (v->st[k]) return false;
        bytes += d->len;
        if (d->aux < lo) lo = d->aux;
        if (d->aux > hi) hi = d->aux;
        if (k && d->aux < v->d[k - 1].aux) ascending = false;
    }
    if (ascending || bytes > SHM_CHUNK) return false; /* already in order, or more than one copy */
    if (!order_scratch(sc)) return false;
    uint32_t *idx = sc->order, *tmp = sc->order + FERRY_WIRE_VEC_MAX;
    for (size_t k = 0; k < n; k++) idx[k] = tmp[k] = (uint32_t)k;
    size_t before = remote_entries(v->d, tmp, n);
    uint64_t varying = 0; /* the bits in which the pieces' offsets from lo differ */
    for (size_t k = 0; k < n; k++) varying |= v->d[k].aux - lo;
    sort_by_key(idx, tmp, n, v->d, lo, hi - lo, varying);
    *total = bytes;
    return remote_entries(v->d, idx, n) < before;
}

/* Copies the pieces order[from..to) not failed with one process_vm_* call,
 * its lists in iov / riov (to - from entries at most): the bytes asked
 * (*asked) and the call's count or -errno. */
static ssize_t sorted_copy_once(const struct shm_conn *sc, const struct ferry_vec_scratch *v, const uint32_t *order,
                                size_t from, size_t to, bool write, struct iovec *iov, struct iovec *riov,
                                uint64_t *asked)
{
    size_t lcnt = 0, rcnt = 0;
    uint64_t bytes = 0;
    for (size_t k = from; k < to; k++) {
        const ferry_vec_desc_t *d = &v->d[order[k]];
        if (v->st[order[k]]) continue;
        iov_append(iov, &lcnt, d->addr, d->len); /* to - from <= IOV_MAX entries: never full */
        iov_append(riov, &rcnt, d->aux, d->len);
        bytes += d->len;
    }
    *asked = bytes;
    if (!bytes) return 0;
    count_vec_call(lcnt, rcnt);
    ssize_t got;
    do {
        got = write ? process_vm_readv(sc->pid, iov, lcnt, riov, rcnt, 0)
                    : process_vm_writev(sc->pid, iov, lcnt, riov, rcnt, 0);
    } while (got < 0 && (errno == EINTR || errno == EAGAIN));
    return got < 0 ? -errno : got;
}

/* A frame's copy in the initiator's order, cut into parts of about
 * SHM_PART bytes. Two threads may share it (shm_helper.c): the serving
 * thread claims parts from the front, the helper from the back, so that
 * they pin the initiator's pages far apart (two threads pinning pages under
 * one page-table page contend on its lock: halves of one 2 MiB buffer
 * copied no faster than one thread, halves of 4 MiB 1.8x faster, measured
 * alone) and no part waits for a wake-up: a helper that wakes late finds
 * fewer parts, or none. */
#define SHM_PART (256u << 10)
#define SORTED_PARTS_MAX (SHM_CHUNK / SHM_PART + 1)

struct sorted_copy {
    struct ferry_vec_scratch *v;
    const uint32_t *order;
    bool write;
    size_t nparts;
    uint32_t bound[SORTED_PARTS_MAX + 1]; /* part k: order[bound[k], bound[k + 1]) */
    _Atomic uint64_t unclaimed;           /* parts not claimed yet: from the low 32 bits to the high */
    atomic_bool gone;                     /* the initiator is gone: claim no more */
    pthread_mutex_t fail_lock;            /* ferry_vec_fail_piece writes v's first reason */
    struct shm_conn side[2];              /* each thread's copy of the trust record (its refusal) */
    int st[2];                            /* each thread's end: 0 or PEER_CLOSED */
};

/* Whether the pieces order[0..n) (bytes in all, in the initiator's order)
 * cross a page-table page's boundary near their middle: at least a quarter
 * of the bytes on either side. Only then do the two threads, starting at
 * either end, pin pages under different page-table locks until they meet:
 * a frame within one such page (1,024 x 2 KiB out of one 2 MiB buffer)
 * copied no faster on two threads than on one (docs/BENCHMARKS.md). */
static bool halves_apart(const struct ferry_vec_scratch *v, const uint32_t *order, size_t n, uint64_t bytes)
{
    uint64_t below = 0;
    for (size_t k = 0; k + 1 < n; k++) {
        below += v->d[order[k]].len;
        const ferry_vec_desc_t *a = &v->d[order[k]], *b = &v->d[order[k + 1]];
        if ((a->aux + a->len - 1) / SHM_PT_SPAN != b->aux / SHM_PT_SPAN && below >= bytes / 4 && bytes - below >= bytes / 4)
            return true;
    }
    return false;
}

/* Cuts order[0..n) into parts (pieces failed already count nothing). */
static void sorted_parts(struct sorted_copy *j, size_t n, bool shared)
{
    j->nparts = 0;
    j->bound[0] = 0;
    uint64_t bytes = 0;
    for (size_t k = 0; k < n; k++) {
        if (!j->v->st[j->order[k]]) bytes += j->v->d[j->order[k]].len;
        if (shared && bytes >= SHM_PART && k + 1 < n && j->nparts + 1 < SORTED_PARTS_MAX) {
            j->bound[++j->nparts] = (uint32_t)(k + 1);
            bytes = 0;
        }
    }
    j->bound[++j->nparts] = (uint32_t)n;
    atomic_init(&j->unclaimed, (uint64_t)j->nparts << 32);
}

/* The next part for side 0 (the front) or 1 (the back), or -1 when none is left. */
static long claim_part(struct sorted_copy *j, int side)
{
    uint64_t u = atomic_load_explicit(&j->unclaimed, memory_order_relaxed);
    for (;;) {
        uint32_t lo = (uint32_t)u, hi = (uint32_t)(u >> 32);
        if (lo >= hi || atomic_load_explicit(&j->gone, memory_order_relaxed)) return -1;
        uint64_t next = side == 0 ? u + 1 : u - ((uint64_t)1 << 32);
        if (atomic_compare_exchange_weak_explicit(&j->unclaimed, &u, next, memory_order_relaxed,
                                                  memory_order_relaxed))
            return side == 0 ? (long)lo : (long)hi - 1;
    }
}

static void sorted_fail(struct sorted_copy *j, size_t i, int st)
{
    pthread_mutex_lock(&j->fail_lock);
    ferry_vec_fail_piece(j->v, i, st);
    pthread_mutex_unlock(&j->fail_lock);
}

/* Copies part [from, to) of the order, all of it: a call that stops short
 * fails the piece it stopped in (its own error, as vec_copy_host) and goes
 * on after it in that order; a refusal of attach mid-way refuses the
 * pieces not moved. 0, or PEER_CLOSED when the initiator is gone. */
static int sorted_part(struct sorted_copy *j, struct shm_conn *sc, size_t from, size_t to)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    struct ferry_vec_scratch *v = j->v;
    const uint32_t *order = j->order;
    size_t pos = from;
    while (pos < to) {
        if (sc->state < 0) { /* attach refused: the rest is not moved */
            for (size_t k = pos; k < to; k++)
                if (!v->st[order[k]]) sorted_fail(j, order[k], ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "%s", sc->reason));
            break;
        }
        uint64_t asked;
        ssize_t got = sorted_copy_once(sc, v, order, pos, to, j->write, v->iov + from, v->riov + from, &asked);
        if (got >= 0 && (uint64_t)got == asked) break;
        size_t p = pos; /* the piece it stopped in, and the bytes of it moved */
        uint64_t k = got > 0 ? (uint64_t)got : 0;
        for (;; p++) {
            if (v->st[order[p]]) continue;
            if (k < v->d[order[p]].len) break;
            k -= v->d[order[p]].len;
        }
        int st;
        if (got < 0) {
            ferry_frame_t pf = vec_piece_frame(v, order[p]);
            st = shm_cma_error(sc, &pf, j->write, 0, v->d[order[p]].len, (int)-got);
        } else {
            st = vec_piece_rest(sc, v, order[p], k, j->write);
        }
        if (st == FERRY_ERR_PEER_CLOSED) return st;
        if (st) sorted_fail(j, order[p], st);
        pos = p + 1;
    }
    return 0;
}

/* One thread's share: parts from its end until none is left. */
static void sorted_share(void *arg, int side)
{
    struct sorted_copy *j = arg;
    long k;
    while ((k = claim_part(j, side)) >= 0) {
        int st = sorted_part(j, &j->side[side], j->bound[k], j->bound[k + 1]);
        if (st) {
            j->st[side] = st;
            atomic_store_explicit(&j->gone, true, memory_order_relaxed);
        }
    }
}

/* With the registry's read lock held: copies pieces [0, n) (checked, none
 * failed; bytes in all) in sc->order, all of them (sorted_part), a large
 * frame with the copy helper's help. 0, or PEER_CLOSED when the initiator
 * is gone (the frame's log then says untracked: what landed is no prefix). */
static int vec_copy_parts_locked(ferry_conn_t *c, struct shm_conn *sc, struct ferry_vec_scratch *v, size_t n,
                                 bool shared, bool write)
{
    struct sorted_copy j = {.v = v, .order = sc->order, .write = write, .side = {*sc, *sc}};
    sorted_parts(&j, n, shared);
    atomic_init(&j.gone, false);
    pthread_mutex_init(&j.fail_lock, NULL);
    if (j.nparts > 1) shm_helper_share(c->ctx, sorted_share, &j);
    else sorted_share(&j, 0);
    pthread_mutex_destroy(&j.fail_lock);
    for (int s = 0; s < 2; s++)
        if (j.side[s].state < 0 && sc->state >= 0) {
            sc->state = j.side[s].state;
            memcpy(sc->reason, j.side[s].reason, sizeof sc->reason);
        }
    if (j.st[0] || j.st[1]) {
        if (write) ferry_placed_untracked(c);
        return FERRY_ERR_PEER_CLOSED;
    }
    return 0;
}

static int vec_copy_sorted_locked(ferry_conn_t *c, struct shm_conn *sc, struct ferry_vec_scratch *v, size_t n,
                                  uint64_t bytes, bool write)
{
    return vec_copy_parts_locked(c, sc, v, n, bytes >= SHM_SHARE_MIN && halves_apart(v, sc->order, n, bytes), write);
}

/* Serving threads of this process copying vector frames now (shm_serve_vec):
 * a gathered copy of large entries is shared with the helper only while
 * they leave a CPU idle. On two CPUs, two connections' copies and a helper
 * made three threads for two CPUs (1 MiB pieces: 0.7x). */
static _Atomic int vec_copiers;

/* Whether the pieces [i, k) (those failed skipped) write disjoint ranges
 * (a write's here, a read's in the initiator): two threads writing the
 * same lines pass them between their caches (16 x 1 MiB into 2 blocks, 8
 * pieces a block, shared: 0.45x), and one thread writes overlapping pieces
 * in their order. At most SHM_SHARE_PIECES pieces are compared, pairwise. */
#define SHM_SHARE_PIECES 64
static bool chunk_disjoint(const struct ferry_vec_scratch *v, size_t i, size_t k, bool write)
{
    if (k - i > SHM_SHARE_PIECES) return false;
    for (size_t a = i; a < k; a++)
        for (size_t b = a + 1; b < k; b++) {
            if (v->st[a] || v->st[b]) continue;
            uint64_t x = write ? v->d[a].addr : v->d[a].aux, y = write ? v->d[b].addr : v->d[b].aux;
            if (x < y + v->d[b].len && y < x + v->d[a].len) return false;
        }
    return true;
}

/* Whether the copy of pieces from i on, a gathered copy's worth (SHM_CHUNK
 * bytes), goes shared with the copy helper (shm_helper.c): at least two
 * pieces and SHM_SHARE_MIN bytes, disjoint here, and a CPU idle besides
 * this thread's. Then sc->order holds them in descriptor order (*m entries:
 * i, i + 1, ...) and *j names the piece after them. Frames of large entries
 * are copied in descriptor order, one gathered copy after another, by the
 * serving thread alone otherwise; a call of 16 x 1 MiB then went over two
 * connections to use two threads, paying the initiator's hand-off between
 * them and the wait for the slower half (shared: 1.3-1.8x, cold data). */
static bool large_chunk_shared(struct shm_conn *sc, const struct ferry_vec_scratch *v, size_t i, size_t n, bool write,
                               size_t *m, size_t *j)
{
    /* Counting this thread: no idle CPU, no share (and no scan). */
    if (atomic_load_explicit(&vec_copiers, memory_order_relaxed) >= ferry_spin_cpus()) return false;
    uint64_t bytes = 0;
    size_t k = i, live = 0;
    for (; k < n; k++) {
        if (v->st[k]) continue;
        if (bytes && bytes + v->d[k].len > SHM_CHUNK) break;
        bytes += v->d[k].len;
        live++;
    }
    if (live < 2 || bytes < SHM_SHARE_MIN || !chunk_disjoint(v, i, k, write)) return false;
    if (!order_scratch(sc)) return false;
    for (size_t q = i; q < k; q++) sc->order[q - i] = (uint32_t)q;
    *m = k - i;
    *j = k;
    return true;
}

/* Takes the initiator's turn (if any), then the registry's read lock. */
static void copy_lock(ferry_registry_t *r, pthread_mutex_t *turn)
{
    if (turn) pthread_mutex_lock(turn);
    ferry_registry_read_lock(r);
}

static void copy_unlock(ferry_registry_t *r, pthread_mutex_t *turn)
{
    ferry_registry_unlock(r);
    if (turn) pthread_mutex_unlock(turn);
}

/* Copies the pieces of host memory with one process_vm_readv/writev per up to
 * IOV_MAX merged entries a side (and SHM_CHUNK bytes), each call under the registry's
 * read lock after the pieces were checked (again when the registry or the
 * cancel set changed). A call that stops short fails the piece it stopped
 * in (its own error) and goes on after it. Pieces move in descriptor order,
 * so a write's placement log follows them (cancel.h): after each call, under
 * the lock, the prefix settled (placed, or refused in the bitmap). Copies
 * of small entries take turns with this initiator's other connections
 * (small_copy_lock). */
static int vec_copy_host(ferry_conn_t *c, ferry_registry_t *r, const ferry_frame_t *f, struct shm_conn *sc,
                         struct ferry_vec_scratch *v, size_t n, bool write, bool *device)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    uint32_t need = write ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
    uint64_t version = 0;
    bool checked = false;
    size_t i = 0;
    uint64_t at = 0; /* the byte offset of piece i in descriptor order */
    pthread_mutex_t *turn = small_copy_lock(sc, v, 0, n);
    while (i < n && sc->state >= 0) { /* refused mid-way: the caller refuses the rest */
        copy_lock(r, turn);
        if (!checked || r->version != version || ferry_vec_cancels_pending(c)) {
            ferry_vec_validate_locked(c, v, i, n, need, device);
            version = r->version;
            checked = true;
        }
        ferry_vec_expire(c, f, v, i, n); /* past its deadline: nothing more moves */
        if (*device) {
            copy_unlock(r, turn);
            return 0; /* the caller copies piece by piece */
        }
        uint64_t total;
        if (i == 0 && sorted_copy_fits(sc, v, n, &total)) {
            int st = vec_copy_sorted_locked(c, sc, v, n, total, write);
            if (write && st == 0) ferry_placed_progress(c, vec_prefix(v, 0, n, 0), v->st); /* under the lock */
            copy_unlock(r, turn);
            return st;
        }
        size_t m, j = i;
        if (!turn && large_chunk_shared(sc, v, i, n, write, &m, &j)) {
            int st = vec_copy_parts_locked(c, sc, v, m, true, write);
            uint64_t end = vec_prefix(v, i, j, at);
            if (write && st == 0) ferry_placed_progress(c, end, v->st); /* under the lock */
            copy_unlock(r, turn);
            if (st) return st;
            at = end;
            i = j;
            continue;
        }
        size_t lcnt = 0, rcnt = 0;
        j = i;
        uint64_t bytes = vec_gather(v, &j, n, &lcnt, &rcnt);
        ssize_t got = 0;
        int err = 0;
        if (bytes) {
            count_vec_call(lcnt, rcnt);
            do {
                got = write ? process_vm_readv(sc->pid, v->iov, lcnt, v->riov, rcnt, 0)
                            : process_vm_writev(sc->pid, v->iov, lcnt, v->riov, rcnt, 0);
            } while (got < 0 && (errno == EINTR || errno == EAGAIN));
            err = got < 0 ? errno : 0;
        }
        if (got >= 0 && (uint64_t)got < bytes) {
            /* Stopped in some piece: find it, and move its rest alone to
             * learn its own error. */
            uint64_t k = (uint64_t)got;
            size_t p = i;
            for (;; p++) {
                if (v->st[p]) continue;
                if (k < v->d[p].len) break;
                k -= v->d[p].len;
            }
            uint64_t p_at = vec_prefix(v, i, p, at);
            if (write) ferry_placed_progress(c, p_at + k, v->st); /* what landed, under the lock */
            int st = vec_piece_rest(sc, v, p, k, write);
            if (st == FERRY_ERR_PEER_CLOSED) {
                copy_unlock(r, turn);
                return st;
            }
            if (st) ferry_vec_fail_piece(v, p, st);
            if (write) ferry_placed_progress(c, p_at + v->d[p].len, v->st);
            copy_unlock(r, turn);
            i = p + 1;
            at = p_at + v->d[p].len;
            continue;
        }
        if (write && got > 0) ferry_placed_progress(c, vec_prefix(v, i, j, at), v->st); /* under the lock */
        copy_unlock(r, turn);
        if (got < 0) {
            /* Nothing moved: the first piece names the error. */
            size_t p = i;
            while (v->st[p]) p++;
            ferry_frame_t pf = vec_piece_frame(v, p);
            int st = shm_cma_error(sc, &pf, write, 0, v->d[p].len, err);
            if (st == FERRY_ERR_PEER_CLOSED) return st;
            ferry_vec_fail_piece(v, p, st);
            at = vec_prefix(v, i, p + 1, at);
            i = p + 1;
            continue;
        }
        at = vec_prefix(v, i, j, at);
        i = j;
    }
    return 0;
}

/* CMA_VEC: many pieces by cross-memory attach, one answer (vec.h). */
int shm_serve_vec(ferry_conn_t *c, const ferry_frame_t *f, ferry_registry_t *r, ferry_counters_t *counters)
{
    uint64_t deadline;
    struct ferry_vec_scratch *v;
    int rc = ferry_vec_recv_descs(c, f, &deadline, &v);
    if (rc) return rc;
    size_t n = (size_t)f->len;
    bool write = f->aux == FERRY_OP_WRITE;
    struct shm_conn *sc;
    if ((rc = shm_trusted_conn(c, v->d[0].aux, &sc)) != 0) return rc;
    bool device = false;
    if (sc->state >= 0) {
        atomic_fetch_add_explicit(&vec_copiers, 1, memory_order_relaxed);
        rc = vec_copy_host(c, r, f, sc, v, n, write, &device);
        atomic_fetch_sub_explicit(&vec_copiers, 1, memory_order_relaxed);
    }
    if (rc) return rc; /* the initiator is gone */
    /* Device pieces move one by one after the host ones, out of descriptor
     * order: the log then says only how the frame ended (cancel.h). */
    if (write && device) ferry_placed_untracked(c);
    for (size_t i = 0; i < n; i++) {
        if (sc->state < 0 && !v->st[i]) {
            ferry_vec_fail_piece(v, i, ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "%s", sc->reason));
        } else if (device && !v->st[i]) {
            ferry_frame_t pf = vec_piece_frame(v, i);
            int st = shm_copy_chunks(c, sc, &pf, write);
            if (st == FERRY_ERR_PEER_CLOSED) return st;
            if (st) ferry_vec_fail_piece(v, i, st);
        }
    }
    uint64_t moved = 0;
    for (size_t i = 0; i < n; i++)
        if (!v->st[i]) {
            moved += v->d[i].len;
            if (write) ferry_watch_placed(c, v->d[i].addr, v->d[i].len);
        }
    if (write) FERRY_STAT_ADD(counters, bytes_placed, moved);
    else FERRY_STAT_ADD(counters, bytes_served, moved);
    /* A read's entry too: its repeat would write into the initiator's buffers again. */
    int32_t status = 0;
    for (size_t i = 0; i < n && !status; i++) status = v->st[i];
    ferry_placed_end(c, status, f->addr, v->st);
    return ferry_vec_send_ack(c, f, v, n, deadline);
}
