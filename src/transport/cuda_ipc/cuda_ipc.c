/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA IPC transport: device memory between processes of one host,
 * copied by the GPU (NVLink or PCIe peer-to-peer, or within one GPU), never
 * through host memory.
 *
 * The TCP connection stays the control channel. The initiator exports the
 * CUDA allocation that holds its bytes (cuIpcGetMemHandle of the
 * allocation's base, cached per connection by region and generation, so a
 * region registered again is exported again) and sends CUDA_IPC_WRITE /
 * CUDA_IPC_READ frames naming the target range (addr, len), its own
 * address (aux) and, as payload, the handle with the allocation's base,
 * size and device. The TARGET does every copy, as in the shm transport:
 * it opens the handle (once per process and allocation, cuda_ipc_driver.c),
 * and for each chunk takes the registry's read lock, checks the request is
 * not cancelled or past its deadline and the range still registered with
 * the access the operation needs, copies on a stream of its own
 * (cuMemcpyAsync) and waits for the copy to be done on the device before
 * it drops the lock. So the owner's registration and permission checks
 * hold for every byte, a deregistration or a CANCEL's barrier waits for
 * the chunk in progress and no later chunk lands (no late write: the
 * mapping gives the initiator no access of its own to the target's
 * memory), and the answer (WRITE_ACK / READ_RESP) means the bytes are on
 * the device.
 *
 * Chosen ("auto") before shm for a peer of this host, in another process,
 * that advertises FERRY_HELLO_F_CUDA_IPC (its driver is usable and has
 * the IPC entry points), when this engine can use CUDA IPC too and has
 * device memory registered when the session opens. Pieces whose local
 * buffer is not CUDA device memory, or whose allocation the driver will
 * not export (e.g. cuMemCreate memory), go by tcp for that call (the
 * verdict's by_tcp); the target's side may be device or host memory. A
 * target that cannot open the handle answers NOT_IMPLEMENTED, placing
 * nothing, and the session moves to tcp with the reason. VMM memory
 * (cuMemCreate + cuMemMap, e.g. PyTorch's expandable segments) has no
 * legacy handle: it is exported as a file descriptor that the target takes
 * from the initiator with pidfd_getfd (cuda_ipc_driver.c), to targets
 * advertising FERRY_HELLO_F_CUDA_IPC_VMM (to others it goes by tcp); a
 * target the kernel refuses the descriptor (no ptrace permission over the
 * initiator) answers NOT_IMPLEMENTED as above. FERRY_CUDA_IPC=0
 * turns the transport off in a process (it then neither offers nor
 * chooses it). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_ipc.h"
#include "util/clock.h"
#include "util/fail.h"
#include "util/memkind.h"
#include "util/net.h"
#include "link/cancel.h"
#include "link/target.h"
#include "link/watch.h"
#include "wire/wire.h"

/* Bytes per frame (the wire's limit) and per registry read-lock hold at
 * the target: a chunk is one copy and one wait, so this bounds how long a
 * deregistration or a cancel waits (tens of microseconds on a GPU). */
#define IPC_SLICE FERRY_WIRE_MAX_DATA
#define IPC_CHUNK (16u << 20)
/* Frames in flight per connection: hides the control round trip. */
#define IPC_WINDOW 16

/* ------------------------------------------------------------ target */

/* Copies the frame's range chunk by chunk, each under the registry's read
 * lock after re-validating it, and done on the device before the lock
 * goes. Returns the answer's status. */
static int copy_chunks(ferry_conn_t *c, struct cuda_ipc_conn *ic, const ferry_frame_t *f,
                       const struct cuda_ipc_export *x, bool write)
{
    ferry_registry_t *r = c->ctx->registry;
    uint32_t need = write ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
    uint64_t done = 0;
    while (done < f->len) {
        uint64_t left = f->len - done;
        size_t n = left < IPC_CHUNK ? (size_t)left : IPC_CHUNK;
        ferry_registry_read_lock(r);
        int rc = ferry_target_check_locked(c, r, f, need);
        if (rc == 0)
            rc = cuda_ipc_copy(ic, c, x, f->aux - x->base + done, (unsigned char *)(uintptr_t)(f->addr + done),
                               ferry_registry_kind_of(r, f->addr, f->len, true), n, write);
        /* Done on the device: the log's prefix grows under the lock (cancel.h). */
        if (rc == 0 && write) ferry_placed_progress(c, done + n, NULL);
        ferry_registry_unlock(r);
        if (rc) {
            if (done && rc == FERRY_ERR_ADDRESS_NOT_REGISTERED)
                ferry_fail_context("region deregistered during the transfer");
            return rc;
        }
        done += n;
    }
    return 0;
}

static int ipc_serve(ferry_conn_t *c, const ferry_frame_t *f)
{
    uint64_t deadline = ferry_deadline_after_ms(c->ctx->timeout_ms);
    bool write = f->type == FERRY_FRAME_CUDA_IPC_WRITE;
    if (f->plen != CUDA_IPC_EXPORT_SIZE || f->flags != 0 || f->len == 0 ||
        f->len > IPC_SLICE || f->aux == 0 || f->aux + f->len < f->aux)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s of %llu bytes from 0x%llx (payload %u, flags 0x%x)",
                          ferry_frame_type_name(f->type), (unsigned long long)f->len, (unsigned long long)f->aux,
                          f->plen, f->flags);
    uint8_t buf[CUDA_IPC_EXPORT_SIZE];
    int rc = ferry_net_recv(c->fd, buf, sizeof buf, deadline);
    if (rc) return rc;
    struct cuda_ipc_export x;
    uint32_t deadline_ms;
    if ((rc = cuda_ipc_export_decode(buf, &x, &deadline_ms)) != 0) return rc;
    /* The frame as the core's deadline checks read it (placed.c). */
    ferry_frame_t g = *f;
    if (deadline_ms) {
        g.flags |= FERRY_FRAME_F_DEADLINE;
        g.deadline_ms = deadline_ms;
    }
    if (f->aux < x.base || f->aux - x.base > x.size || f->len > x.size - (f->aux - x.base))
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s: [0x%llx+%llu) is not in the allocation it names",
                          ferry_frame_type_name(f->type), (unsigned long long)f->aux, (unsigned long long)f->len);
    const char *why = cuda_ipc_unusable();
    struct cuda_ipc_conn *ic = why ? NULL : cuda_ipc_conn_get(c);
    int status;
    if (why)
        status = ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC refused by the target: %s", why);
    else if (!ic)
        status = ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "CUDA IPC refused by the target: the connection carries "
                                                       "another transport's frames");
    else
        status = copy_chunks(c, ic, &g, &x, write);
    /* The log's entry (begun by the core: frames that place are logged, and
     * a repeat dropped): a write's prefix as the chunks left it, a read's
     * bytes delivered into the initiator's memory. */
    ferry_placed_end(c, status, write ? FERRY_PLACED_KEEP : status == 0 ? f->len : 0, NULL);
    if (status == 0) {
        if (write) {
            FERRY_STAT_ADD(c->ctx->counters, bytes_placed, f->len);
            ferry_watch_placed(c, f->addr, f->len);
        } else {
            FERRY_STAT_ADD(c->ctx->counters, bytes_served, f->len);
        }
    }
    return ferry_target_send_status(c, write ? FERRY_FRAME_WRITE_ACK : FERRY_FRAME_READ_RESP, f, status, deadline);
}

/* --------------------------------------------------------- initiator */

static int send_slice(ferry_conn_t *c, ferry_xfer_t *x, const struct cuda_ipc_export *ex, uint64_t off, uint64_t n)
{
    ferry_frame_t f = {.type = x->opcode == FERRY_OP_WRITE ? FERRY_FRAME_CUDA_IPC_WRITE : FERRY_FRAME_CUDA_IPC_READ,
                       .req_id = x->req_id, .addr = x->remote + off, .len = n,
                       .aux = (uint64_t)(uintptr_t)(x->local + off), .crc = x->generation,
                       .plen = CUDA_IPC_EXPORT_SIZE};
    x->vec_first = 0; /* in slices (cancel.h) */
    ferry_deadline_stamp(c, &f, x->deadline); /* computes it: it travels in the payload, f's flags stay 0 */
    uint8_t payload[CUDA_IPC_EXPORT_SIZE];
    cuda_ipc_export_encode(ex, (f.flags & FERRY_FRAME_F_DEADLINE) ? f.deadline_ms : 0, payload);
    f.flags = 0;
    f.deadline_ms = 0;
    return ferry_conn_send_frame(c, &f, payload, x->deadline);
}

/* Whether piece x can go by CUDA IPC from offset off: its local buffer is
 * CUDA device memory and the driver exports the allocation holding byte
 * off (*ex filled; the slices from off stop at its end, where the next
 * allocation is exported: VMM memory such as PyTorch's expandable
 * segments maps each 2 or 20 MiB chunk as its own allocation). Otherwise
 * the rest goes by tcp, and why says why (the first such reason is kept). */
static bool piece_exportable(ferry_conn_t *c, struct cuda_ipc_conn *ic, const ferry_xfer_t *x, uint64_t off,
                             struct cuda_ipc_export *ex, char *why, size_t cap)
{
    ferry_registry_t *r = c->ctx->registry;
    ferry_registry_read_lock(r);
    const ferry_region_t *reg = ferry_registry_lookup_locked(r, (uint64_t)(uintptr_t)x->local, x->len);
    ferry_region_t found = reg ? *reg : (ferry_region_t){0};
    ferry_registry_unlock(r);
    if (!reg || FERRY_MEMKIND_TYPE(found.kind) != FERRY_MEMKIND_CUDA) {
        if (!why[0]) snprintf(why, cap, "a local buffer is not CUDA device memory");
        return false;
    }
    if (cuda_ipc_export_of(ic, found.addr, found.generation, x->local + off, 1, FERRY_MEMKIND_DEVICE(found.kind),
                           (c->peer.flags & FERRY_HELLO_F_CUDA_IPC_VMM) != 0, ex) != 0) {
        if (!why[0]) snprintf(why, cap, "%s", ferry_fail_message());
        ferry_clear_last_error();
        return false;
    }
    return true;
}

struct slice {
    ferry_xfer_t *x;
    uint64_t n;
};

/* Receives the answer to slice s: 0, the piece's failure, or (*broken) the
 * connection's; *refused when the target declined CUDA IPC. */
static int recv_answer(ferry_conn_t *c, const struct slice *s, int *broken, bool *refused, char *reason, size_t cap)
{
    ferry_frame_t f;
    int rc = ferry_recv_answer(c, s->x, ferry_conn_spin_us(c), &f, broken, reason, cap);
    if (rc == FERRY_ERR_NOT_IMPLEMENTED && !*broken) *refused = true;
    if (rc) return rc;
    if (f.plen != 0 || f.len != s->n) {
        *broken = 1;
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s for %llu bytes with %u payload bytes, slice was %llu",
                          ferry_frame_type_name(f.type), (unsigned long long)f.len, f.plen, (unsigned long long)s->n);
    }
    return 0;
}

/* The pieces' ends: a cancelled piece fails CANCELLED; those never sent
 * (not exportable) go by tcp. */
static int finish(ferry_xfer_t *xs, size_t nx, ferry_verdict_t *verdict, const char *why)
{
    size_t left = 0;
    for (size_t i = 0; i < nx; i++) {
        ferry_xfer_t *x = &xs[i];
        if (x->rc != 0 || x->done >= x->len) continue;
        if (x->cancel && atomic_load(x->cancel))
            ferry_xfer_fail(x, ferry_fail(FERRY_ERR_CANCELLED, "cancelled after %llu of %llu bytes",
                                          (unsigned long long)x->done, (unsigned long long)x->len));
        else
            left++;
    }
    if (left) return ferry_verdict_by_tcp(verdict, "%zu piece(s) not by CUDA IPC: %s", left, why);
    return 0;
}

static int run_slices(ferry_conn_t *c, struct cuda_ipc_conn *ic, ferry_xfer_t *xs, size_t nx, int *broken,
                      ferry_verdict_t *verdict)
{
    struct slice ring[IPC_WINDOW];
    unsigned head = 0, count = 0;
    size_t cur = 0;
    uint64_t cur_off = 0;
    bool cur_ready = false, refused = false;
    bool *tainted = NULL; /* pieces with a refused slice: later answers must not extend their prefix */
    struct cuda_ipc_export ex;
    char why[200] = "", reason[200] = "";
    for (;;) {
        /* The next piece to send: sendable and exportable. */
        while (!refused && cur < nx && !cur_ready) {
            cur_off = xs[cur].done;
            if (ferry_piece_sendable(&xs[cur], cur_off) &&
                piece_exportable(c, ic, &xs[cur], cur_off, &ex, why, sizeof why))
                cur_ready = true;
            else
                cur++;
        }
        if (cur_ready && !ferry_piece_sendable(&xs[cur], cur_off)) {
            cur_ready = false; /* all of it sent, or cancelled */
            cur++;
            continue;
        }
        if (cur_ready && count < IPC_WINDOW) {
            ferry_xfer_t *x = &xs[cur];
            uint64_t at = (uint64_t)(uintptr_t)(x->local + cur_off);
            if (at - ex.base >= ex.size && !piece_exportable(c, ic, x, cur_off, &ex, why, sizeof why)) {
                cur_ready = false; /* the next allocation does not export: the rest by tcp */
                cur++;
                continue;
            }
            uint64_t n = x->len - cur_off < IPC_SLICE ? x->len - cur_off : IPC_SLICE;
            if (n > ex.base + ex.size - at) n = ex.base + ex.size - at; /* this allocation's bytes only */
            x->inflight++; /* before the first byte leaves (cancel.h) */
            int rc = send_slice(c, x, &ex, cur_off, n);
            if (rc) {
                *broken = 1;
                free(tainted);
                return rc;
            }
            ring[(head + count++) % IPC_WINDOW] = (struct slice){x, n};
            cur_off += n;
            continue;
        }
        if (count == 0) break;
        struct slice s = ring[head];
        head = (head + 1) % IPC_WINDOW;
        count--;
        bool this_refused = false;
        int rc = recv_answer(c, &s, broken, &this_refused, reason, sizeof reason);
        if (*broken) {
            free(tainted);
            return rc;
        }
        s.x->inflight--;
        size_t idx = (size_t)(s.x - xs);
        if (this_refused) {
            refused = true;
            cur_ready = false;
            if (!tainted) tainted = calloc(nx, sizeof *tainted);
            if (!tainted) {
                *broken = 1; /* answers still in flight: the connection is out of step */
                return ferry_fail(FERRY_ERR_MEMORY, "cuda_ipc fallback: out of memory");
            }
            tainted[idx] = true;
        } else if (rc) {
            if (s.x->rc == 0) ferry_xfer_fail(s.x, rc);
        } else if (s.x->rc == 0 && !(tainted && tainted[idx])) {
            s.x->done += s.n;
            if (s.x->progress) atomic_fetch_add(s.x->progress, s.n);
        }
    }
    free(tainted);
    if (refused) {
        ferry_clear_last_error();
        return ferry_verdict_fall_back(verdict, "cuda_ipc refused by the target: %s; fell back to tcp", reason);
    }
    return finish(xs, nx, verdict, why);
}

static int ipc_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, ferry_verdict_t *verdict)
{
    *broken = 0;
    struct cuda_ipc_conn *ic = cuda_ipc_conn_get(c);
    if (!ic) return ferry_verdict_by_tcp(verdict, "CUDA IPC: no connection state");
    int rc = run_slices(c, ic, xs, nx, broken, verdict);
    cuda_ipc_run_end(ic); /* no frame in flight now (or the connection is broken) */
    return rc;
}

/* ---------------------------------------------------------- selection */

static int ipc_usable(ferry_xport_ctx_t *ctx, const ferry_hello_t *peer, char *why, size_t cap)
{
    static const uint8_t zero[16];
    const char *t = ctx->transport;
    bool forced = t && strcmp(t, "cuda_ipc") == 0;
    if (t && strcmp(t, "auto") != 0 && !forced) {
        snprintf(why, cap, "transport forced to %s", t);
        return 0;
    }
    if (!(peer->flags & FERRY_HELLO_F_CUDA_IPC)) {
        snprintf(why, cap, "the peer does not serve CUDA IPC");
        return 0;
    }
    if (memcmp(ctx->host_id, zero, sizeof zero) == 0 || memcmp(peer->host_id, ctx->host_id, sizeof peer->host_id) != 0) {
        snprintf(why, cap, "the peer is on another host");
        return 0;
    }
    if (peer->pid <= 0 || peer->pid == (int32_t)getpid()) {
        snprintf(why, cap, "the peer is in this process (CUDA IPC is between processes)");
        return 0;
    }
    const char *no = cuda_ipc_unusable();
    if (no) {
        snprintf(why, cap, "CUDA IPC unusable here: %s", no);
        return 0;
    }
    if (!forced && ferry_registry_device_count(ctx->registry) == 0) {
        snprintf(why, cap, "no device memory registered here when the session opened");
        return 0;
    }
    snprintf(why, cap, "peer on this host (pid %d): device-to-device copies by CUDA IPC", (int)peer->pid);
    return 1;
}

static uint32_t ipc_hello_flags(ferry_xport_ctx_t *ctx)
{
    (void)ctx;
    if (cuda_ipc_unusable()) return 0;
    return FERRY_HELLO_F_CUDA_IPC | (cuda_ipc_vmm_importable() ? FERRY_HELLO_F_CUDA_IPC_VMM : 0);
}

static const ferry_frame_def_t ipc_frame_defs[] = {
    {FERRY_FRAME_CUDA_IPC_WRITE, "CUDA_IPC_WRITE", CUDA_IPC_EXPORT_SIZE, FERRY_FRAME_PLACES_TARGET},
    {FERRY_FRAME_CUDA_IPC_READ, "CUDA_IPC_READ", CUDA_IPC_EXPORT_SIZE, FERRY_FRAME_PLACES_INITIATOR},
};

static const ferry_frame_range_t ipc_frame_ranges[] = {{FERRY_FRAME_CUDA_IPC_FIRST, FERRY_FRAME_CUDA_IPC_LAST}};

static const uint8_t ipc_frames[] = {FERRY_FRAME_CUDA_IPC_WRITE, FERRY_FRAME_CUDA_IPC_READ};

const ferry_transport_ops_t ferry_transport_cuda_ipc = {
    .name = "cuda_ipc",
    .usable = ipc_usable,
    .run = ipc_run,
    .serve = ipc_serve,
    .serve_types = ipc_frames,
    .nserve_types = sizeof ipc_frames,
    .frames = ipc_frame_defs,
    .nframes = sizeof ipc_frame_defs / sizeof ipc_frame_defs[0],
    .hello_flags = ipc_hello_flags,
    .version = FERRY_TRANSPORT_OPS_VERSION,
    .frame_ranges = ipc_frame_ranges,
    .nframe_ranges = sizeof ipc_frame_ranges / sizeof ipc_frame_ranges[0],
    .hello_bits = FERRY_CUDA_IPC_HELLO_BITS,
    .keys = cuda_ipc_keys,
    .nkeys = CUDA_IPC_NKEYS,
};
