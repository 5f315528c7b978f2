/* SPDX-License-Identifier: Apache-2.0 */
/* The shared-memory transport (shm.c): shared pools. The target serves
 * SHM_MAP_REQ (passing a pool's memfds with SCM_RIGHTS to the verified
 * initiator); the initiator maps them, copies with memcpy and counts the
 * copies once the pool's control header, the target's pidfd and the
 * connection show them placed ("when mapped copies count" below), or, without a pidfd, once the
 * target confirmed. The why is in the comment at the top of shm.c. */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/fail.h"
#include "util/log.h"
#include "util/memkind.h"
#include "util/net.h"
#include "link/share.h"
#include "link/target.h"
#include "wire/le.h"
#include "shm_internal.h"

/* The abstract unix socket an initiator listens on for the memfds of one
 * map request: named by its pid, the request and the address asked. */
static void map_socket_name(struct sockaddr_un *sa, socklen_t *len, pid_t pid, uint64_t req_id, uint64_t addr)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "ferry-map/%d/%llx/%llx", (int)pid,
                     (unsigned long long)req_id, (unsigned long long)addr);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* A new open file of fd: read-only (a peer given it cannot map it
 * writable, whatever the seals), or as fd is. -1 on failure. */
static int reopen_fd(int fd, bool rw)
{
    if (rw) return fcntl(fd, F_DUPFD_CLOEXEC, 0);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* Connects to the socket the verified initiator listens on for this map
 * request's memfds and checks (SO_PEERCRED) that the listener is the
 * verified pid, not someone who took the name first. The socket, or -1
 * (no listener: the request only confirms, or the initiator maps nothing)
 * with the reason in why. Never blocks. */
static int fd_receiver(struct shm_conn *sc, const ferry_frame_t *f, char *why, size_t cap)
{
    struct sockaddr_un sa;
    socklen_t sl;
    map_socket_name(&sa, &sl, sc->pid, f->req_id, f->addr);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct ucred cred = {0};
    socklen_t cl = sizeof cred;
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sl) != 0) {
        snprintf(why, cap, "no listener on @%s: %s", sa.sun_path + 1, strerror(errno));
    } else if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.pid != sc->pid) {
        snprintf(why, cap, "@%s is held by pid %d, not the verified initiator %d", sa.sun_path + 1, (int)cred.pid,
                 (int)sc->pid);
    } else {
        return s;
    }
    if (s >= 0) close(s);
    return -1;
}

/* Sends fds[2] (data, control header) on s with SCM_RIGHTS. 0, or -1 with
 * the reason in why. */
static int pass_fds(int s, const int fds[2], char *why, size_t cap)
{
    char byte = 'F';
    struct iovec iov = {&byte, 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(2 * sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, 2 * sizeof(int));
    if (sendmsg(s, &m, MSG_NOSIGNAL) == 1) return 0;
    snprintf(why, cap, "sending the pool's fds: %s", strerror(errno));
    return -1;
}

/* SHM_MAP_REQ, on a verified connection: where the region holding
 * [addr, addr+len) lives, and, if it is a shared pool's and the initiator
 * listens for them, its memfds passed to it (pass_fds): the data read-only
 * unless the region is remote-writable, the control header read-only.
 * Asked again after mapped copies (by an initiator without a pidfd), the
 * same answer is the owner's confirmation that the region is still
 * registered at the generation (crc) the copies began under: a killed
 * owner gives none. Regions no peer may
 * access (FERRY_MEM_LOCAL) are refused. */
int shm_serve_map(ferry_conn_t *c, struct shm_conn *sc, const ferry_frame_t *f, uint64_t deadline)
{
    int status = 0;
    uint8_t info[FERRY_SHM_MAP_INFO_SIZE] = {0};
    int fds[2] = {-1, -1};
    bool shared = false;
    char why[200] = "";
    /* Asked again about the region whose memfds it last received (the
     * confirmation after copies; generations are unique): no fds to pass,
     * no socket to try. */
    bool again = f->crc && f->crc == sc->passed_gen;
    int receiver = sc->state < 0 || again ? -1 : fd_receiver(sc, f, why, sizeof why);
    if (sc->state < 0) {
        status = ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "%s", sc->reason);
    } else {
        ferry_registry_t *r = c->ctx->registry;
        ferry_registry_read_lock(r);
        status = ferry_registry_check_locked(r, f->addr, f->len, 0, f->crc, "target");
        const ferry_region_t *reg = status ? NULL : ferry_registry_lookup_locked(r, f->addr, f->len);
        if (reg && !(reg->flags & FERRY_MEM_REMOTE)) {
            status = ferry_fail(FERRY_ERR_ACCESS_DENIED,
                                "map of [0x%llx+%llu) refused: its region is local-only (FERRY_MEM_LOCAL)",
                                (unsigned long long)f->addr, (unsigned long long)f->len);
            reg = NULL;
        }
        if (reg) {
            put64(info, reg->addr);
            put64(info + 8, reg->len);
            const ferry_share_t *sh = reg->slot[FERRY_REGION_SLOT_SHARE];
            put64(info + 16, sh ? sh->off : 0);
            put32(info + 28, reg->generation);
            put32(info + 32, reg->flags);
            /* Opened under the lock: a pool destroyed meanwhile closes its fds. */
            if (sh && receiver >= 0) {
                sc->passed_gen = reg->generation;
                fds[0] = reopen_fd(sh->fd, (reg->flags & FERRY_MEM_REMOTE_WRITE) != 0);
                fds[1] = reopen_fd(sh->ctl_fd, false);
            }
        }
        ferry_registry_unlock(r);
    }
    if (fds[0] >= 0 && fds[1] >= 0) shared = pass_fds(receiver, fds, why, sizeof why) == 0;
    if (!shared && why[0])
        FERRY_LOG(FERRY_LOG_DEBUG, "shm", "%s: shared pool not passed: %s", c->peer.name, why);
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) close(fds[i]);
    if (receiver >= 0) close(receiver);
    /* The passed fds' numbers at the initiator are its own business: 0
     * says "passed", -1 "not shareable". */
    put32(info + 24, shared ? 0 : UINT32_MAX);
    put32(info + 36, shared ? 0 : UINT32_MAX);
    if (status) return ferry_target_send_status(c, FERRY_FRAME_SHM_MAP_RESP, f, status, deadline);
    ferry_frame_t a = {.type = FERRY_FRAME_SHM_MAP_RESP, .req_id = f->req_id, .addr = f->addr, .len = f->len,
                       .plen = FERRY_SHM_MAP_INFO_SIZE};
    return ferry_conn_send_frame(c, &a, info, deadline);
}

/* ------------------------------------- initiator: shared-pool mappings */

/* Regions of the target that live in a shared pool are mapped here (one
 * mapping per region generation, cached per connection: a peer restart
 * breaks the connection and so drops its mappings) and written or read
 * with one memcpy, no frame at all. Anything unusual (not shareable, a
 * stale generation, a revoked region, missing flags) leaves the piece to
 * cross-memory attach, whose target-side checks give the proper error. */
#define SHM_MAPS_MAX 32

struct shm_map {
    uint64_t addr, len;       /* the region, in the target's address space */
    uint32_t generation, flags;
    bool shareable;
    unsigned char *map;       /* the region (its memfd from offset 0), map_len bytes */
    size_t map_len;
    ferry_share_ctl_t *ctl;   /* the control header, mapped read-only (the owner's to write) */
    struct shm_map *next;
};

/* Bytes copied through a mapping in this call, not yet counted. */
struct mapped {
    uint64_t n;        /* 0: nothing copied for this piece, or settled */
    struct shm_map *m; /* the mapping they went through: kept until settled */
};

struct shm_icache {
    int state;                /* 0 unchecked, 1 the target pid verified, -1 mapping off */
    int pidfd;                /* the verified target, -1 if pidfd_open is missing */
    struct shm_map *maps;
    size_t nmaps;
    struct mapped *mp;        /* a call's copies to settle (shm_map_pass), all zero between calls */
    size_t mp_cap;
};

static void map_free(struct shm_map *m)
{
    if (m->map) munmap(m->map, m->map_len);
    if (m->ctl) munmap(m->ctl, FERRY_SHARE_HEADER);
    free(m);
}

static void icache_free(void *p)
{
    struct shm_icache *ic = p;
    if (!ic) return;
    for (struct shm_map *m = ic->maps, *n; m; m = n) {
        n = m->next;
        map_free(m);
    }
    if (ic->pidfd >= 0) close(ic->pidfd);
    free(ic->mp);
    free(ic);
}

static void icache_drop(struct shm_icache *ic, struct shm_map *m)
{
    for (struct shm_map **pp = &ic->maps; *pp; pp = &(*pp)->next)
        if (*pp == m) {
            *pp = m->next;
            ic->nmaps--;
            map_free(m);
            return;
        }
}

static bool map_disabled_here(void)
{
    return shm_key_set(SHM_KEY_NOMAP);
}

/* Maps len bytes of a memfd the target passed (writable only with rw):
 * the mapping, or NULL with the reason in why. */
static void *map_passed_fd(int fd, size_t len, bool rw, char *why, size_t cap)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    void *mem = MAP_FAILED;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < len)
        snprintf(why, cap, "the passed fd is not a memfd of %zu bytes", len);
    else if (seals < 0 || !(seals & F_SEAL_SHRINK))
        snprintf(why, cap, "the passed memfd is not sealed against shrinking");
    else if ((mem = mmap(NULL, len, rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
        snprintf(why, cap, "mmap of the passed memfd: %s", strerror(errno));
    return mem == MAP_FAILED ? NULL : mem;
}

/* Listens for the memfds of one map request (map_socket_name): the
 * listening socket, or -1 (then nothing is mapped). */
static int map_listen(uint64_t req_id, uint64_t addr)
{
    struct sockaddr_un sa;
    socklen_t sl;
    map_socket_name(&sa, &sl, getpid(), req_id, addr);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s >= 0 && (bind(s, (struct sockaddr *)&sa, sl) != 0 || listen(s, 1) != 0)) {
        FERRY_LOG(FERRY_LOG_DEBUG, "shm", "cannot listen on @%s: %s", sa.sun_path + 1, strerror(errno));
        close(s);
        s = -1;
    }
    return s;
}

/* Receives the two memfds the target passed on listener l (it sent them
 * before its answer): checks that the sender is the target's pid.
 * 0 with fds set, or -1 with the reason in why. */
static int map_receive(int l, pid_t target, int fds[2], uint64_t deadline, char *why, size_t cap)
{
    fds[0] = fds[1] = -1;
    int s = -1;
    for (;;) {
        s = accept4(l, NULL, NULL, SOCK_CLOEXEC);
        if (s >= 0 || (errno != EAGAIN && errno != EINTR)) break;
        uint64_t now = ferry_now_ns();
        if (now >= deadline) break;
        struct pollfd p = {.fd = l, .events = POLLIN};
        poll(&p, 1, (int)((deadline - now) / 1000000 + 1));
    }
    if (s < 0) {
        snprintf(why, cap, "the target did not pass the pool's fds: %s", strerror(errno));
        return -1;
    }
    struct ucred cred = {0};
    socklen_t cl = sizeof cred;
    char byte;
    struct iovec iov = {&byte, 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(2 * sizeof(int))];
    } ctl;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    int rc = -1;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.pid != target) {
        snprintf(why, cap, "the pool's fds came from pid %d, not the target %d", (int)cred.pid, (int)target);
    } else if (recvmsg(s, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT) != 1) {
        snprintf(why, cap, "receiving the pool's fds: %s", strerror(errno));
    } else {
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int got[2] = {-1, -1};
            memcpy(got, CMSG_DATA(cm), (n < 2 ? n : 2) * sizeof(int));
            for (size_t i = 2; i < n; i++) { /* more than asked: not ours to keep */
                int extra;
                memcpy(&extra, CMSG_DATA(cm) + i * sizeof(int), sizeof extra);
                close(extra);
            }
            if (n == 2 && !(m.msg_flags & MSG_CTRUNC)) {
                fds[0] = got[0];
                fds[1] = got[1];
                rc = 0;
            } else {
                for (int i = 0; i < 2; i++)
                    if (got[i] >= 0 && i < (int)n) close(got[i]);
            }
        }
        if (rc) snprintf(why, cap, "the target passed no pair of fds");
    }
    close(s);
    return rc;
}

/* Whether the target's claimed pid owns the other end of our connection:
 * what we map is then that process's memory, not someone else's. */
static bool target_owns_conn(ferry_conn_t *c)
{
    struct sockaddr_storage peer_ss, self_ss;
    socklen_t pl = sizeof peer_ss, sl = sizeof self_ss;
    struct ferry_addr6 peer, self;
    if (getpeername(c->fd, (struct sockaddr *)&peer_ss, &pl) != 0 ||
        getsockname(c->fd, (struct sockaddr *)&self_ss, &sl) != 0 || ferry_addr6_of(&peer_ss, &peer) ||
        ferry_addr6_of(&self_ss, &self) || !ferry_addr6_is_local(&peer))
        return false;
    uid_t uid;
    unsigned long inode = ferry_socket_inode(&peer, &self, shm_key_set(SHM_KEY_PROC_LOOKUP), &uid);
    return inode && c->peer.pid > 0 && ferry_pid_owns_socket(c->peer.pid, inode) > 0 && uid == getuid();
}

/* Sends SHM_MAP_REQ for [addr, addr+len) at generation and receives the
 * answer: 0 with info filled; the target's refusal (its reason logged); or,
 * with *broken, a connection failure. A confirmation (spin) is due within
 * microseconds, so it is awaited with the connection's adaptive spin (a
 * wake-up from sleep costs more than the owner's answer), which learns
 * from these waits. */
static int map_ask(ferry_conn_t *c, const ferry_xfer_t *x, uint64_t addr, uint64_t len, uint32_t generation,
                   uint8_t info[FERRY_SHM_MAP_INFO_SIZE], bool spin, int *broken)
{
    ferry_frame_t q = {.type = FERRY_FRAME_SHM_MAP_REQ, .req_id = x->req_id, .addr = addr, .len = len,
                       .aux = (uint64_t)(uintptr_t)x->local, .crc = generation};
    int rc = ferry_conn_send_frame(c, &q, NULL, x->deadline);
    ferry_frame_t a;
    if (rc == 0) rc = spin ? ferry_conn_recv_frame_spin(c, &a, x->deadline, ferry_conn_spin_us(c))
                           : ferry_conn_recv_frame(c, &a, x->deadline);
    if (rc == 0 && (a.type != FERRY_FRAME_SHM_MAP_RESP || a.req_id != x->req_id))
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "expected SHM_MAP_RESP for request %llu, got %s",
                        (unsigned long long)x->req_id, ferry_frame_type_name(a.type));
    if (rc == 0 && a.status == 0 && a.plen != FERRY_SHM_MAP_INFO_SIZE)
        rc = ferry_fail(FERRY_ERR_MALFORMED_FRAME, "SHM_MAP_RESP with %u payload bytes", a.plen);
    if (rc) {
        *broken = 1;
        return rc;
    }
    if (a.status < 0) {
        char reason[200];
        int st = ferry_conn_fail_from_target(c, &a, x->deadline, reason, sizeof reason);
        FERRY_LOG(FERRY_LOG_DEBUG, "shm", "%s: map of [0x%llx+%llu) refused: %s", c->peer.name,
                  (unsigned long long)addr, (unsigned long long)len, reason);
        return st ? st : FERRY_ERR_INTERNAL;
    }
    if (ferry_net_recv(c->fd, info, FERRY_SHM_MAP_INFO_SIZE, x->deadline) != 0) {
        *broken = 1;
        return ferry_last_error_code() ? ferry_last_error_code() : FERRY_ERR_PEER_CLOSED;
    }
    return 0;
}

/* Asks the target about the region holding addr and maps it if shareable.
 * NULL with *broken on a connection failure; NULL otherwise when there is
 * nothing to map (the reason logged). */
static struct shm_map *map_fetch(ferry_conn_t *c, struct shm_icache *ic, ferry_xfer_t *x, uint64_t addr,
                                 int *broken)
{
    uint8_t info[FERRY_SHM_MAP_INFO_SIZE];
    int l = map_listen(x->req_id, addr);
    int rc = map_ask(c, x, addr, 1, x->generation, info, false, broken);
    if (*broken || rc) {
        if (l >= 0) close(l);
        if (*broken) return NULL;
        if (rc == FERRY_ERR_NOT_IMPLEMENTED) ic->state = -1; /* the target refuses this connection */
        ferry_clear_last_error();
        return NULL;
    }
    struct shm_map *m = calloc(1, sizeof *m);
    if (!m) {
        if (l >= 0) close(l);
        return NULL;
    }
    m->addr = get64(info);
    m->len = get64(info + 8);
    uint64_t off = get64(info + 16);
    bool passed = (int32_t)get32(info + 24) >= 0 && (int32_t)get32(info + 36) >= 0;
    m->generation = get32(info + 28);
    m->flags = get32(info + 32);
    m->shareable = passed && l >= 0;
    char why[200] = "";
    if (m->len == 0 || m->addr + m->len < m->addr || addr < m->addr || addr >= m->addr + m->len || off != 0) {
        snprintf(why, sizeof why, "inconsistent map info");
        m->shareable = false;
    }
    int fds[2] = {-1, -1};
    if (m->shareable && map_receive(l, c->peer.pid, fds, x->deadline, why, sizeof why) != 0) m->shareable = false;
    if (l >= 0) close(l);
    if (m->shareable) {
        /* Writable only where the pool allows peers to write (the target
         * passes a read-only fd otherwise, and the memfd is sealed so); the
         * control header is the owner's alone (sealed so). */
        bool rw = (m->flags & FERRY_MEM_REMOTE_WRITE) != 0;
        m->map_len = (size_t)m->len;
        m->ctl = map_passed_fd(fds[1], FERRY_SHARE_HEADER, false, why, sizeof why);
        if (m->ctl) m->map = map_passed_fd(fds[0], m->map_len, rw, why, sizeof why);
        if (m->map && (atomic_load(&m->ctl->magic) != FERRY_SHARE_MAGIC ||
                       atomic_load(&m->ctl->state) != FERRY_SHARE_LIVE ||
                       atomic_load(&m->ctl->generation) != m->generation))
            snprintf(why, sizeof why, "control header does not say live at generation %u", m->generation);
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) close(fds[i]);
    if (why[0]) {
        m->shareable = false;
        if (m->map) munmap(m->map, m->map_len);
        if (m->ctl) munmap(m->ctl, FERRY_SHARE_HEADER);
        m->map = NULL;
        m->ctl = NULL;
        FERRY_LOG(FERRY_LOG_INFO, "shm", "%s: not mapping region [0x%llx+%llu): %s; using cross-memory attach",
                  c->peer.name, (unsigned long long)m->addr, (unsigned long long)m->len, why);
    }
    if (ic->nmaps >= SHM_MAPS_MAX) { /* drop the oldest (the list's tail) */
        struct shm_map *t = ic->maps;
        while (t->next) t = t->next;
        icache_drop(ic, t);
    }
    m->next = ic->maps;
    ic->maps = m;
    ic->nmaps++;
    return m;
}

/* ------------------------------------ initiator: when mapped copies count
 *
 * A copy through a mapping is complete only once its bytes are known to be
 * in the owner's registered memory: the region still registered (not
 * revoked, not detached) and the owner still alive when the copy ended.
 * Both are read here, without asking the owner, after every copy of the
 * call (settle):
 *
 * Registered. The owner marks the header REVOKED (ferry_share_revoke: a
 * seq_cst store, then a seq_cst fence) before it detaches the pool (moves
 * its range onto private pages, copying the bytes) or unmaps it. Here: the
 * copies, a seq_cst fence, then the header is read. Store buffering: with
 * both fences, the initiator cannot read LIVE while the owner's detach
 * misses a byte copied before the fence. So LIVE at the mapping's
 * generation means every copy landed before the revoke, in pages the
 * owner's range still maps (the detach carries them over). REVOKED, or
 * another generation, means the copies may have gone to pages no longer
 * the owner's: they do not count, the mapping is dropped and the pieces go
 * again by cross-memory attach, where the target's registry decides (not
 * registered: the call fails with the target's detail, as a refused
 * confirmation did). The header memfd is sealed so only the owner writes
 * it, and REVOKED is final, so a peer cannot fake LIVE.
 *
 * Alive. One poll, without waiting, after the fence (owner_gone), of the
 * owner's pidfd (opened when the connection was checked, target_owns_conn;
 * it names that process, never a later one with its pid) and of the
 * connection for a hang-up. The pidfd readable: the owner exited while we
 * copied (or before). The connection hung up: the owner may have exec'd
 * another program (same pid, its memory and its close-on-exec sockets
 * gone) or closed the connection. Either way nothing counts and the
 * connection is given up (the pieces are retried on a new one, which finds
 * the peer gone or restarted: PEER_CLOSED / PEER_RESTARTED, as when a
 * confirmation never came; a connection closed for another reason, e.g.
 * evicted as idle, costs a retry). Neither: the owner's death (or exec),
 * if under way, is later than the copies as anyone can observe it (wait,
 * the pidfd, its sockets' EOF all come after its memory is released, and
 * its threads run no user code once SIGKILL is taken, so none of them can
 * tell whether bytes reached its pages just before or just after); a core
 * dump of the owner is a snapshot taken before. A stopped owner (SIGSTOP)
 * is alive: the bytes are in its memory when it resumes.
 * Why the pidfd and not the hang-up alone: the socket may outlive the
 * owner (a child it forked and that has not exec'd holds it). Why not a
 * heartbeat: it proves liveness only a period ago, so the call would wait
 * a period.
 *
 * Without a pidfd (pidfd_open missing: kernels before 5.3; or
 * FERRY_SHM_CONFIRM=1 at the initiator) the owner is asked instead, one
 * SHM_MAP_REQ round trip per region a call (confirm_by_owner): it answers
 * only while its threads run and while the region is registered at the
 * copies' generation. */

/* Whether the owner is gone (see "Alive" above): its pidfd readable, or
 * its end of the connection closed. One poll, no waiting; a failing poll
 * counts as gone (the pieces are retried). */
static bool owner_gone(ferry_conn_t *c, const struct shm_icache *ic)
{
    struct pollfd p[2] = {{.fd = ic->pidfd, .events = POLLIN}, {.fd = c->fd, .events = POLLRDHUP}};
    int n;
    do {
        n = poll(p, 2, 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return n < 0;
    return (p[0].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) ||
           (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void count_copied(ferry_xfer_t *x, uint64_t n)
{
    x->done += n;
    if (x->progress) atomic_fetch_add(x->progress, n);
}

/* Whether the mapping's control header says live at its generation (a
 * read of the owner's header: the fence before it is the caller's). */
static bool header_live(const struct shm_map *m)
{
    return atomic_load_explicit(&m->ctl->state, memory_order_relaxed) == FERRY_SHARE_LIVE &&
           atomic_load_explicit(&m->ctl->generation, memory_order_relaxed) == m->generation;
}

/* Drops the mappings whose header no longer says live: a later piece into
 * them asks the owner again (a new registration maps anew). */
static void drop_revoked(struct shm_icache *ic)
{
    for (struct shm_map *m = ic->maps, *n; m; m = n) {
        n = m->next;
        if (m->shareable && !header_live(m)) icache_drop(ic, m);
    }
}

/* Without a pidfd: asks the owner to confirm each region that pieces were
 * copied into or out of (one round trip per region). Confirmed pieces
 * advance; the others fail with the owner's reason. 0, or a connection
 * failure with *broken (nothing advanced). */
static int confirm_by_owner(ferry_conn_t *c, struct shm_icache *ic, ferry_xfer_t *xs, size_t nx, struct mapped *mp,
                            int *broken)
{
    for (size_t i = 0; i < nx; i++) {
        if (!mp[i].n) continue;
        struct shm_map *m = mp[i].m;
        uint8_t info[FERRY_SHM_MAP_INFO_SIZE];
        /* One byte names the region; the generation says it is the same. */
        int rc = map_ask(c, &xs[i], m->addr, 1, m->generation, info, true, broken);
        if (*broken) return rc;
        if (rc == 0 && get32(info + 28) != m->generation)
            rc = ferry_fail(FERRY_ERR_STALE_SEGMENT, "region [0x%llx+%llu) changed generation %u -> %u",
                            (unsigned long long)m->addr, (unsigned long long)m->len, m->generation, get32(info + 28));
        for (size_t k = i; k < nx; k++) {
            if (!mp[k].n || mp[k].m != m) continue;
            ferry_xfer_t *x = &xs[k];
            if (rc == 0) {
                count_copied(x, mp[k].n);
            } else if (x->rc == 0) {
                ferry_fail_context("copied %llu bytes through the mapping of [0x%llx+%llu), unconfirmed",
                                   (unsigned long long)mp[k].n, (unsigned long long)m->addr,
                                   (unsigned long long)m->len);
                ferry_xfer_fail(x, rc);
            }
            mp[k].n = 0;
        }
        if (rc) icache_drop(ic, m);
    }
    ferry_clear_last_error();
    return 0;
}

/* Settles the pieces copied so far (see "when mapped copies count" above):
 * those into a live region of a live owner count, those into a revoked one
 * stay for cross-memory attach. 0; or, the owner having exited, a
 * connection failure with *broken (nothing counted). */
static int settle(ferry_conn_t *c, struct shm_icache *ic, ferry_xfer_t *xs, size_t nx, struct mapped *mp,
                  size_t *pending, int *broken)
{
    if (*pending == 0) return 0;
    *pending = 0;
    if (ic->pidfd < 0) return confirm_by_owner(c, ic, xs, nx, mp, broken);
    ferry_share_fence(); /* the copies, then the header, the pidfd and the connection */
    if (owner_gone(c, ic)) {
        uint64_t bytes = 0;
        for (size_t i = 0; i < nx; i++) bytes += mp[i].n;
        ic->state = -1;
        while (ic->maps) icache_drop(ic, ic->maps);
        *broken = 1;
        return ferry_fail(FERRY_ERR_PEER_CLOSED,
                          "%s (pid %d) exited or hung up while %llu bytes were copied through its shared "
                          "pool's mapping: not counted",
                          c->peer.name, (int)c->peer.pid, (unsigned long long)bytes);
    }
    for (size_t i = 0; i < nx; i++) {
        if (!mp[i].n) continue;
        /* Not live: the bytes may have missed the owner's pages; the piece
         * stays pending (done unchanged) for cross-memory attach. */
        if (header_live(mp[i].m)) count_copied(&xs[i], mp[i].n);
        mp[i].n = 0;
    }
    return 0;
}

/* The connection's array of a call's copies to settle, for nx pieces (kept
 * from call to call: no allocation, no clearing, once it is large enough;
 * settle leaves it zero). NULL when out of memory. */
static struct mapped *copies_to_settle(struct shm_icache *ic, size_t nx)
{
    if (ic->mp_cap < nx) {
        struct mapped *mp = calloc(nx, sizeof *mp);
        if (!mp) return NULL;
        free(ic->mp);
        ic->mp = mp;
        ic->mp_cap = nx;
    }
    return ic->mp;
}

/* Copies what it can of each piece through a mapping; the rest stays for
 * cross-memory attach. A copy counts only once settled (settle). 0, or a
 * connection failure with *broken. *whole: every piece to send went
 * through a mapping (left false on the early returns). */
static int map_pass(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, bool *whole)
{
    struct shm_icache *ic = c->xport;
    if (!ic) {
        if (c->xport_free && c->xport_free != icache_free) return 0; /* another transport's state */
        ic = calloc(1, sizeof *ic);
        if (!ic) return 0;
        ic->pidfd = -1;
        c->xport = ic;
        c->xport_free = icache_free;
    }
    if (ic->state < 0) return 0;
    if (ic->state == 0) {
        /* An older target does not know SHM_MAP_REQ (it would drop us), or
         * lets peers write its control header. */
        bool offered = (c->peer.flags & FERRY_HELLO_F_SHMPOOL2) != 0;
        bool owns = offered && !map_disabled_here() && target_owns_conn(c);
        /* FERRY_SHM_CONFIRM=1: no pidfd, so copies are confirmed by the
         * owner, as on a kernel without pidfd_open (to compare, to test). */
        if (owns && !shm_key_set(SHM_KEY_CONFIRM)) ic->pidfd = ferry_pidfd_open(c->peer.pid);
        ic->state = owns ? 1 : -1;
        if (ic->state < 0) {
            FERRY_LOG(FERRY_LOG_INFO, "shm", "%s: shared-pool mapping off for this connection (%s)", c->peer.name,
                      !offered              ? "the peer does not serve shared-pool mappings"
                      : map_disabled_here() ? "FERRY_SHM_NOMAP"
                                            : "the peer's pid does not own the connection");
            return 0;
        }
    }
    /* A target that died never revoked its pools: its mappings would take
     * writes that nobody reads. The pidfd also survives pid reuse. */
    if (ferry_pidfd_exited(ic->pidfd)) {
        ic->state = -1;
        while (ic->maps) icache_drop(ic, ic->maps);
        return 0;
    }
    struct mapped *mp = NULL;
    size_t pending = 0;
    int rc = 0;
    bool mapped_all = true;
    for (size_t i = 0; i < nx && ic->state > 0; i++) {
        ferry_xfer_t *x = &xs[i];
        if (!ferry_piece_sendable(x, x->done)) continue;
        uint64_t at = x->remote + x->done, left = x->len - x->done;
        struct shm_map *m = ic->maps;
        while (m && !(at >= m->addr && at - m->addr < m->len)) m = m->next;
        bool stale = m && x->generation && m->generation != x->generation;
        /* Mappings are dropped or evicted below only with nothing copied
         * through them still to settle. */
        if ((stale || !m) && (rc = settle(c, ic, xs, nx, mp, &pending, broken)) != 0) break;
        if (stale) {
            icache_drop(ic, m); /* a newer registration, maybe */
            m = NULL;
        }
        if (!m) m = map_fetch(c, ic, x, at, broken);
        if (*broken) {
            rc = ferry_last_error_code() ? ferry_last_error_code() : FERRY_ERR_PEER_CLOSED;
            break;
        }
        uint32_t need = x->opcode == FERRY_OP_WRITE ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
        if (!m || !m->shareable || (m->flags & need) != need || left > m->addr + m->len - at ||
            (x->generation && x->generation != m->generation)) {
            mapped_all = false;
            continue; /* cross-memory attach: the target names the error */
        }
        if (!mp && !(mp = copies_to_settle(ic, nx))) {
            mapped_all = false;
            break;
        }
        uint64_t copied = 0;
        while (ferry_piece_sendable(x, x->done + copied)) {
            uint64_t off = x->done + copied;
            uint64_t n = x->len - off < SHM_SLICE ? x->len - off : SHM_SLICE;
            unsigned char *there = m->map + (x->remote + off - m->addr);
            /* A hint (settle decides): stop early into a pool being
             * deregistered; the rest goes by cross-memory attach. */
            if (!header_live(m)) break;
            if (x->opcode == FERRY_OP_WRITE) memcpy(there, x->local + off, (size_t)n);
            else memcpy(x->local + off, there, (size_t)n);
            copied += n;
        }
        if (copied) {
            mp[i] = (struct mapped){copied, m};
            pending++;
        }
        if (copied < left) mapped_all = false;
    }
    if (rc == 0 && mp) rc = settle(c, ic, xs, nx, mp, &pending, broken);
    if (rc == 0 && ic->state > 0) drop_revoked(ic);
    if (rc && mp) memset(mp, 0, nx * sizeof *mp); /* what a failure left unsettled */
    *whole = rc == 0 && mapped_all && ic->state > 0;
    return rc;
}

int shm_map_pass(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, bool *whole)
{
    *whole = false;
    return map_pass(c, xs, nx, broken, whole);
}
