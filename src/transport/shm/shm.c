/* SPDX-License-Identifier: Apache-2.0 */
/* The shared-memory transport: single-copy transfers between processes of
 * one host by cross-memory attach (process_vm_readv / process_vm_writev).
 *
 * The TCP connection stays the control channel; only the bytes take the
 * short way. The initiator sends CMA_WRITE / CMA_READ frames naming the
 * target range (addr, len), its own buffer (aux) and the region generation
 * (crc field). The TARGET does every copy: for a write it pulls the bytes
 * out of the initiator with process_vm_readv straight into its validated
 * registered range, for a read it pushes them with process_vm_writev; then
 * it answers WRITE_ACK / READ_RESP (no payload). So, as over TCP, a peer can
 * only ever touch the target's registered remote-accessible memory, and the
 * target re-validates under the registry's read lock before every chunk
 * (the discipline of tcp_target.c's place_direct: a deregistration waits for the
 * chunk in progress, later chunks see it; cancelled requests are refused).
 *
 * Trust: the pid in HELLO is only a claim. Before the first copy on a
 * connection the target checks that the connection comes from an address of
 * this host and that the claimed pid owns the peer's socket (its inode,
 * found by the 4-tuple with sock_diag or in /proc/net/tcp{,6}, is among the
 * links in /proc/<pid>/fd), and probes that the kernel lets it attach.
 * Otherwise it refuses cross-memory attach on that connection: it answers
 * NOT_IMPLEMENTED with the reason, having placed nothing, and the initiator
 * moves the session to tcp and resends the same pieces there.
 *
 * FERRY_SHM_DISABLE=1 in a target's environment makes it refuse (to test or
 * to force the fallback); config.transport = "tcp" keeps an initiator off
 * shm altogether.
 *
 * Shared pools (ferry_pool_create_shared, core/share.h) take a shorter way
 * still: the initiator asks once per connection and region (SHM_MAP_REQ,
 * served only on verified connections, only for regions peers may access,
 * and only by targets advertising FERRY_HELLO_F_SHMPOOL2), checks that the
 * target's pid owns the other end of the connection, receives the pool's
 * memfds with SCM_RIGHTS on a unix socket that only the verified pids on
 * either end may use (the data read-only unless the pool is remote-writable,
 * and sealed so; the control header read-only, sealed so for everyone but
 * the owner), maps them and copies with memcpy itself. The copies count
 * only once, after them and a fence, the pool's control header still says
 * live at their generation (the owner marks it revoked, and fences, before
 * it detaches the pool), the target's pidfd says it has not exited and
 * the connection has not hung up (an exec leaves the pid): no frame, no
 * round trip (shm_pool.c, "when mapped copies count", has the
 * argument). Copies into a revoked pool go again by cross-memory attach,
 * where the target's registry decides. Without pidfd_open, or with
 * FERRY_SHM_CONFIRM=1 at the initiator, the target confirms instead, by
 * answering the same request again (a killed target answers nothing).
 * FERRY_SHM_NOMAP=1 at the initiator keeps such regions on cross-memory
 * attach.
 *
 * Files: this one holds the transport's table and the copies of single
 * frames; shm_vec.c the vector frames (CMA_VEC); shm_helper.c the target's
 * copy helper, a second thread for large frames; shm_trust.c verifies the
 * same-host peer; shm_pool.c maps shared pools; shm_internal.h is what they
 * share. */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <limits.h>
#include <sys/uio.h>
#include <stdatomic.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/memkind.h"
#include "util/net.h"
#include "link/share.h"
#include "util/tsan.h"
#include "link/watch.h"
#include "wire/le.h"
#include "link/target.h"
#include "link/transport.h"
#include "link/vec.h"

/* Frames in flight per connection: hides the control round trip. */
#define SHM_WINDOW 64
/* Waiting on at most this many bytes being copied, the answer is due within
 * tens of microseconds: spin for it rather than sleep. */
#define SHM_SPIN_INFLIGHT (256u << 10)

#include "shm_internal.h"

/* -------------------------------------------------------- target: copy */

/* Maps a failed process_vm_* errno to the answer's status. */
int shm_cma_error(struct shm_conn *sc, const ferry_frame_t *f, bool write, uint64_t done, size_t n, int err)
{
    switch (err) {
    case EPERM:
    case EACCES:
        sc->state = -1;
        snprintf(sc->reason, sizeof sc->reason, "the kernel stopped allowing cross-memory attach to pid %d: %s",
                 (int)sc->pid, strerror(err));
        return ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "%s", sc->reason);
    case ESRCH:
        return ferry_fail(FERRY_ERR_PEER_CLOSED, "initiator pid %d exited during a transfer", (int)sc->pid);
    case ENOMEM:
        return ferry_fail(FERRY_ERR_MEMORY, "cross-memory attach: out of memory");
    default: /* the initiator's own memory: its caller's error, not retried */
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "%s initiator memory [0x%llx+%zu) by cross-memory attach failed after %llu of %llu "
                          "bytes: %s (is the local buffer %s while registered?)",
                          write ? "reading" : "writing", (unsigned long long)(f->aux + done), n,
                          (unsigned long long)done, (unsigned long long)f->len, strerror(err),
                          write ? "unmapped" : "unmapped or not writable");
    }
}

/* Moves n bytes between the initiator (theirs) and here (mine) once,
 * retrying EINTR; the count moved, or -errno (a fault at the very start
 * reads as -EFAULT). */
ssize_t shm_cma_once(pid_t pid, bool write, void *mine, uint64_t theirs, size_t n)
{
    struct iovec l = {mine, n}, r = {(void *)(uintptr_t)theirs, n};
    for (;;) {
        ssize_t got = write ? process_vm_readv(pid, &l, 1, &r, 1, 0) : process_vm_writev(pid, &l, 1, &r, 1, 0);
        if (got > 0) return got;
        if (got == 0) return -EFAULT;
        if (errno != EINTR && errno != EAGAIN) return -errno;
    }
}

/* Copies the frame's range chunk by chunk, each under the registry's read
 * lock after re-validating the range. Host memory moves in one copy, the
 * kernel's; device memory (which the kernel cannot reach) is staged in the
 * connection's bounce buffer, the attach outside the lock on the bounce
 * side. Returns the answer's status. */
int shm_copy_chunks(ferry_conn_t *c, struct shm_conn *sc, const ferry_frame_t *f, bool write)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    ferry_registry_t *r = c->ctx->registry;
    uint32_t need = write ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
    uint64_t done = 0;
    while (done < f->len) {
        uint64_t left = f->len - done;
        size_t n = left < SHM_CHUNK ? (size_t)left : SHM_CHUNK;
        unsigned char *here = (unsigned char *)(uintptr_t)(f->addr + done);
        uint64_t there = f->aux + done;
        ssize_t got = 0;
        ferry_registry_read_lock(r);
        int rc = ferry_target_check_locked(c, r, f, need);
        uint32_t kind = rc ? FERRY_MEMKIND_HOST : ferry_registry_kind_of(r, f->addr, f->len, true);
        if (rc == 0 && kind == FERRY_MEMKIND_HOST) got = shm_cma_once(sc->pid, write, here, there, n);
        if (write && got > 0) ferry_placed_progress(c, done + (uint64_t)got, NULL); /* under the lock (cancel.h) */
        ferry_registry_unlock(r);
        if (rc) {
            if (done && rc == FERRY_ERR_ADDRESS_NOT_REGISTERED)
                ferry_fail_context("region deregistered during the transfer");
            return rc;
        }
        if (kind != FERRY_MEMKIND_HOST) {
            unsigned char *b = ferry_conn_bounce(c, n);
            if (!b) return ferry_fail(FERRY_ERR_MEMORY, "staging buffer of %zu bytes: out of memory", n);
            if (write) {
                got = shm_cma_once(sc->pid, true, b, there, n);
                if (got > 0) {
                    ferry_registry_read_lock(r);
                    rc = ferry_target_check_locked(c, r, f, need);
                    if (rc == 0) rc = ferry_memkind_from_host(kind, here, b, (size_t)got);
                    if (rc == 0) ferry_placed_progress(c, done + (uint64_t)got, NULL);
                    ferry_registry_unlock(r);
                }
            } else {
                ferry_registry_read_lock(r);
                rc = ferry_target_check_locked(c, r, f, need);
                if (rc == 0) rc = ferry_memkind_to_host(kind, b, here, n);
                ferry_registry_unlock(r);
                if (rc == 0) got = shm_cma_once(sc->pid, false, b, there, n);
            }
            if (rc) return rc;
        }
        if (got < 0) return shm_cma_error(sc, f, write, done, n, (int)-got);
        done += (uint64_t)got;
    }
    return 0;
}

static int shm_serve(ferry_conn_t *c, const ferry_frame_t *f)
{
    if (f->type == FERRY_FRAME_CMA_VEC)
        return shm_serve_vec(c, f, c->ctx->registry, c->ctx->counters);
    uint64_t deadline = ferry_deadline_after_ms(c->ctx->timeout_ms);
    bool write = f->type == FERRY_FRAME_CMA_WRITE;
    bool map = f->type == FERRY_FRAME_SHM_MAP_REQ;
    uint8_t answer = write ? FERRY_FRAME_WRITE_ACK : FERRY_FRAME_READ_RESP;
    if (f->plen != 0 || (f->flags & ~FERRY_FRAME_F_DEADLINE) != 0 || f->len == 0 || f->len > FERRY_WIRE_MAX_DATA ||
        f->aux == 0 || f->aux + f->len < f->aux)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s of %llu bytes from 0x%llx (payload %u, flags 0x%x)",
                          ferry_frame_type_name(f->type), (unsigned long long)f->len, (unsigned long long)f->aux,
                          f->plen, f->flags);
    struct shm_conn *sc;
    int trc = shm_trusted_conn(c, f->aux, &sc);
    if (trc) return trc;
    if (map) return shm_serve_map(c, sc, f, deadline);
    int status;
    if (sc->state < 0)
        status = ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "%s", sc->reason);
    else
        status = shm_copy_chunks(c, sc, f, write);
    if (status == FERRY_ERR_PEER_CLOSED) return status;
    /* A read's entry too: its repeat would write into the initiator's buffer again. */
    ferry_placed_end(c, status, write ? FERRY_PLACED_KEEP : status == 0 ? f->len : 0, NULL);
    if (status == 0) {
        if (write) {
            FERRY_STAT_ADD(c->ctx->counters, bytes_placed, f->len);
            ferry_watch_placed(c, f->addr, f->len);
        } else FERRY_STAT_ADD(c->ctx->counters, bytes_served, f->len);
    }
    return ferry_target_send_status(c, answer, f, status, deadline);
}

/* --------------------------------------------------- initiator side */


static int send_cma(ferry_conn_t *c, ferry_xfer_t *x, uint64_t off, uint64_t n)
{
    ferry_frame_t f = {.type = x->opcode == FERRY_OP_WRITE ? FERRY_FRAME_CMA_WRITE : FERRY_FRAME_CMA_READ,
                       .req_id = x->req_id, .addr = x->remote + off, .len = n,
                       .aux = (uint64_t)(uintptr_t)(x->local + off), .crc = x->generation};
    x->vec_first = 0; /* in slices (cancel.h) */
    ferry_deadline_stamp(c, &f, x->deadline);
    return ferry_conn_send_frame(c, &f, NULL, x->deadline);
}

/* Receives one answer. 0, a piece failure, or (with *broken) a connection
 * failure; *refused when the target declined cross-memory attach. */
static int recv_answer(ferry_conn_t *c, const struct inflight *in, int *broken, bool *refused, char *reason,
                       size_t cap, unsigned spin_us)
{
    FERRY_TSAN_PAYLOAD_SCOPE();
    ferry_xfer_t *x = in->x;
    ferry_frame_t f;
    int rc = ferry_recv_answer(c, x, spin_us, &f, broken, reason, cap);
    if (rc == FERRY_ERR_NOT_IMPLEMENTED && !*broken) *refused = true;
    if (rc) return rc;
    if (f.plen != 0 || f.len != in->n) {
        *broken = 1;
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s for %llu bytes with %u payload bytes, slice was %llu",
                          ferry_frame_type_name(f.type), (unsigned long long)f.len, f.plen,
                          (unsigned long long)in->n);
    }
    return 0;
}

/* The target refused, or cannot be reached by attach: the verdict moves
 * this session to tcp for good, and the pieces go again over TCP from their
 * confirmed prefix (transport.h). */
static int fall_back(ferry_verdict_t *verdict, const char *why)
{
    ferry_clear_last_error();
    return ferry_verdict_fall_back(verdict, "%s; fell back to tcp", why);
}

/* Whether the connection goes through something (a proxy, a port
 * forward): the port we dialed is not the one the peer listens on. Then
 * the bytes stay on the connection, where that something wants them. */
static bool via_intermediary(ferry_conn_t *c, char *why, size_t cap)
{
    char host[256];
    uint16_t port = 0;
    if (!c->session || ferry_parse_hostport(c->peer.name, host, sizeof host, &port) != 0) return false;
    if (port == c->session_port) return false;
    snprintf(why, cap, "shm not used: connected through an intermediary (dialed port %u, the peer listens on %u)",
             (unsigned)c->session_port, (unsigned)port);
    return true;
}

/* Whether a piece's local buffer is device memory: the target's attach
 * cannot reach it, so such a stream goes over TCP, which stages it. */
static bool any_device_local(ferry_xport_ctx_t *ctx, const ferry_xfer_t *xs, size_t nx)
{
    ferry_registry_t *r = ctx->registry;
    if (ferry_registry_device_count(r) == 0) return false;
    bool found = false;
    ferry_registry_read_lock(r);
    for (size_t i = 0; i < nx && !found; i++) {
        const ferry_region_t *reg = ferry_registry_lookup_locked(r, (uint64_t)(uintptr_t)xs[i].local, xs[i].len);
        found = reg && reg->kind != FERRY_MEMKIND_HOST;
    }
    ferry_registry_unlock(r);
    return found;
}


/* Whether the target copies the vector frame of xs[0..n) (bytes in all) on
 * one thread: it shares a frame with its copy helper only from
 * SHM_SHARE_MIN bytes, and only when the frame's initiator side crosses a
 * page-table page (SHM_PT_SPAN; shm_vec.c, halves_apart). A frame of small
 * pieces copied on one thread leaves this CPU idle through the copy (such
 * copies take turns at the target): the wait for its answer may nap and
 * spin over its end (FERRY_SPIN_NAP). On two CPUs, a spin against a copy
 * on both cost it 2-3%. */
static bool copied_on_one_thread(const ferry_xfer_t *xs, size_t n, uint64_t bytes)
{
    if (bytes < SHM_SHARE_MIN) return true;
    uintptr_t page = (uintptr_t)xs[0].local / SHM_PT_SPAN;
    for (size_t i = 0; i < n; i++) {
        uintptr_t a = (uintptr_t)xs[i].local;
        if (a / SHM_PT_SPAN != page || (a + xs[i].len - 1) / SHM_PT_SPAN != page) return false;
    }
    return true;
}

static int shm_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, ferry_verdict_t *verdict)
{
    if (any_device_local(c->ctx, xs, nx))
        return ferry_verdict_by_tcp(verdict, "a local buffer is device memory, which the target's attach cannot reach");
    char why[200];
    if (via_intermediary(c, why, sizeof why)) return fall_back(verdict, why);
    *broken = 0;
    int mrc = shm_map_pass(c, xs, nx, broken, &verdict->copied_inline);
    if (*broken) return mrc;
    struct inflight ring[SHM_WINDOW];
    unsigned head = 0, count = 0;
    size_t cur = 0;
    uint64_t cur_off = nx ? xs[0].done : 0;
    bool refused = false;
    char reason[200] = "";
    /* Pieces with a refused slice: later acks must not extend their
     * confirmed prefix. */
    bool *tainted = NULL;
    uint64_t inflight = 0;
    unsigned spin_us = ferry_conn_spin_us(c);
    size_t slice = c->ctx->slice_size;
    size_t small_vec = 0; /* pieces sent in CMA_VEC frames of small entries (SHM_SMALL_ENTRY) */
    size_t in_vec = 0;    /* pieces sent in CMA_VEC frames */
    *broken = 0;
    for (;;) {
        while (cur < nx && !ferry_piece_sendable(&xs[cur], cur_off)) {
            if (++cur < nx) cur_off = xs[cur].done;
        }
        if (!refused && cur < nx && count < SHM_WINDOW && cur_off == 0 && cur + 1 < nx &&
            xs[cur + 1].opcode == xs[cur].opcode && shm_vec_eligible(c, &xs[cur], slice) &&
            ferry_piece_sendable(&xs[cur + 1], xs[cur + 1].done) && shm_vec_eligible(c, &xs[cur + 1], slice)) {
            /* Pieces go together: one CMA_VEC, one answer. */
            size_t g = shm_vec_collect(c, xs + cur, nx - cur, slice);
            int rc = ferry_vec_send(c, FERRY_FRAME_CMA_VEC, xs + cur, g);
            if (rc) {
                *broken = 1;
                free(tainted);
                return rc;
            }
            uint64_t bytes = 0;
            for (size_t i = 0; i < g; i++) bytes += xs[cur + i].len;
            bool small = bytes / g < SHM_SMALL_ENTRY;
            small_vec += small ? g : 0;
            in_vec += g;
            ring[(head + count++) % SHM_WINDOW] =
                (struct inflight){.x = &xs[cur], .n = bytes, .count = (uint32_t)g,
                                 .nap = small && copied_on_one_thread(xs + cur, g, bytes)};
            inflight += bytes;
            cur += g;
            cur_off = cur < nx ? xs[cur].done : 0;
            continue;
        }
        if (!refused && cur < nx && count < SHM_WINDOW) {
            ferry_xfer_t *x = &xs[cur];
            uint64_t n = x->len - cur_off < SHM_SLICE ? x->len - cur_off : SHM_SLICE;
            x->inflight++; /* before the first byte leaves (cancel.h) */
            int rc = send_cma(c, x, cur_off, n);
            if (rc) {
                *broken = 1;
                free(tainted);
                return rc;
            }
            ring[(head + count++) % SHM_WINDOW] = (struct inflight){.x = x, .off = cur_off, .n = n};
            cur_off += n;
            inflight += n;
            continue;
        }
        if (count == 0) break;
        struct inflight in = ring[head];
        head = (head + 1) % SHM_WINDOW;
        count--;
        unsigned spin = in.nap ? FERRY_SPIN_NAP : inflight <= SHM_SPIN_INFLIGHT ? spin_us : 0;
        inflight -= in.n;
        bool this_refused = false;
        if (in.count) {
            /* Refused pieces stay pending (done 0) for the fallback. */
            int rc = ferry_vec_recv_ack(c, in.x, in.count, spin, broken, true, &this_refused, reason, sizeof reason);
            if (*broken) {
                free(tainted);
                return rc;
            }
            refused |= this_refused;
            continue;
        }
        int rc = recv_answer(c, &in, broken, &this_refused, reason, sizeof reason, spin);
        if (*broken) {
            free(tainted);
            return rc;
        }
        in.x->inflight--;
        size_t idx = (size_t)(in.x - xs);
        if (this_refused) {
            refused = true;
            if (!tainted) tainted = calloc(nx, sizeof *tainted);
            if (!tainted) {
                *broken = 1; /* answers still in flight: the connection is out of step */
                return ferry_fail(FERRY_ERR_MEMORY, "shm fallback: out of memory");
            }
            tainted[idx] = true;
        } else if (rc) {
            if (in.x->rc == 0) ferry_xfer_fail(in.x, rc);
        } else if (in.x->rc == 0 && !(tainted && tainted[idx])) {
            in.x->done += in.n;
            if (in.x->progress) atomic_fetch_add(in.x->progress, in.n);
        }
    }
    free(tainted);
    if (refused) {
        char why[256];
        snprintf(why, sizeof why, "shm refused by the target: %s", reason);
        return fall_back(verdict, why);
    }
    /* Every piece in frames whose copies take turns at the target: the
     * next such call gains nothing from being split (transport.h). */
    verdict->small_serial = nx > 1 && small_vec == nx;
    /* Every piece in frames the target shares between two threads where
     * that pays (FERRY_HELLO_F_CMA_SHARE): no need to split such a call. */
    verdict->shares_frames = nx > 1 && in_vec == nx && (c->peer.flags & FERRY_HELLO_F_CMA_SHARE);
    for (size_t i = 0; i < nx; i++) {
        ferry_xfer_t *x = &xs[i];
        if (x->rc == 0 && x->done < x->len)
            ferry_xfer_fail(x, ferry_fail(FERRY_ERR_CANCELLED, "cancelled after %llu of %llu bytes",
                                          (unsigned long long)x->done, (unsigned long long)x->len));
    }
    return 0;
}

/* Yama's ptrace_scope 1 lets only ancestors attach; the target must attach
 * to us, so we name "any" as our ptracer, once, and only then. */
static int yama_scope(void)
{
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (!f) return 0;
    int v = 0;
    if (fscanf(f, "%d", &v) != 1) v = 0;
    fclose(f);
    return v;
}

static pthread_once_t yama_once = PTHREAD_ONCE_INIT;
static int yama_level;

static void yama_setup(void)
{
    yama_level = yama_scope();
    if (yama_level == 1) {
        if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0)
            FERRY_LOG(FERRY_LOG_INFO, "shm", "Yama ptrace_scope=1: allowed same-user peers to attach (PR_SET_PTRACER)");
        else
            yama_level = 2;
    }
}

static int shm_usable(ferry_xport_ctx_t *ctx, const ferry_hello_t *peer, char *why, size_t cap)
{
    static const uint8_t zero[16];
    const char *t = ctx->transport;
    if (t && strcmp(t, "auto") != 0 && strcmp(t, "shm") != 0) {
        snprintf(why, cap, "transport forced to %s", t);
        return 0;
    }
    if (!(peer->flags & FERRY_HELLO_F_CMA)) {
        snprintf(why, cap, "the peer does not offer cross-memory attach");
        return 0;
    }
    if (memcmp(ctx->host_id, zero, sizeof zero) == 0 || memcmp(peer->host_id, ctx->host_id, sizeof peer->host_id) != 0) {
        snprintf(why, cap, "the peer is on another host");
        return 0;
    }
    if (peer->pid <= 0) {
        snprintf(why, cap, "the peer sent no pid");
        return 0;
    }
    pthread_once(&yama_once, yama_setup);
    if (yama_level >= 2) {
        snprintf(why, cap, "Yama ptrace_scope=%d forbids cross-memory attach", yama_level);
        return 0;
    }
    snprintf(why, cap, "peer on this host (pid %d): single-copy cross-memory attach", (int)peer->pid);
    return 1;
}

static uint32_t shm_hello_flags(ferry_xport_ctx_t *ctx)
{
    (void)ctx;
    return FERRY_HELLO_F_CMA | FERRY_HELLO_F_SHMPOOL2 | FERRY_HELLO_F_CMA_BIG | FERRY_HELLO_F_CMA_SHARE;
}

/* The frames shm declares (wire.h); CMA_VEC, a vector frame, is the core's
 * (wire.c decodes its descriptors with WRITEV's), though shm serves it. */
static const ferry_frame_def_t shm_frame_defs[] = {
    {FERRY_FRAME_CMA_WRITE, "CMA_WRITE", 0, FERRY_FRAME_PLACES_TARGET},
    {FERRY_FRAME_CMA_READ, "CMA_READ", 0, FERRY_FRAME_PLACES_INITIATOR}, /* the target writes the initiator's memory */
    {FERRY_FRAME_SHM_MAP_REQ, "SHM_MAP_REQ", 0, 0},
    {FERRY_FRAME_SHM_MAP_RESP, "SHM_MAP_RESP", FERRY_WIRE_MAX_REASON, 0}, /* map info, or the reason text */
};

/* shm's frame ids, all of the core range (the wire format predates the
 * ranges): CMA_WRITE, CMA_READ; SHM_MAP_REQ, SHM_MAP_RESP. */
static const ferry_frame_range_t shm_frame_ranges[] = {{FERRY_FRAME_CMA_WRITE, FERRY_FRAME_CMA_READ},
                                                      {FERRY_FRAME_SHM_MAP_REQ, FERRY_FRAME_SHM_MAP_RESP}};

static const uint8_t shm_frames[] = {FERRY_FRAME_CMA_WRITE, FERRY_FRAME_CMA_READ, FERRY_FRAME_SHM_MAP_REQ,
                                     FERRY_FRAME_CMA_VEC};

const ferry_transport_ops_t ferry_transport_shm = {
    .name = "shm",
    .usable = shm_usable,
    .run = shm_run,
    .serve = shm_serve,
    .serve_types = shm_frames,
    .nserve_types = sizeof shm_frames,
    .frames = shm_frame_defs,
    .nframes = sizeof shm_frame_defs / sizeof shm_frame_defs[0],
    .hello_flags = shm_hello_flags,
    .engine_fini = shm_helper_fini,
    .version = FERRY_TRANSPORT_OPS_VERSION,
    .frame_ranges = shm_frame_ranges,
    .nframe_ranges = sizeof shm_frame_ranges / sizeof shm_frame_ranges[0],
    .hello_bits = FERRY_SHM_HELLO_BITS,
    .keys = shm_keys,
    .nkeys = SHM_NKEYS,
};
