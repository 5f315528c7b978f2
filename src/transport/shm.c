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
 * (the discipline of tcp.c's place_direct: a deregistration waits for the
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
 * only once the target confirmed, by answering the same request again, that
 * the region is still registered at their generation (a killed target
 * answers nothing). FERRY_SHM_NOMAP=1 at the initiator keeps such regions
 * on cross-memory attach. */
#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <limits.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/mman.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fail.h"
#include "core/log.h"
#include "core/memkind.h"
#include "core/net.h"
#include "core/share.h"
#include "wire/le.h"
#include "transport.h"
#include "vec.h"

/* Bytes per frame: large, since no socket buffer sits in between; one
 * frame is one serving-thread turn at the target. */
#define SHM_SLICE (16u << 20)
/* Bytes copied per registry read-lock hold at the target: bounds how long
 * a deregistration or cancel waits (well under a millisecond). */
#define SHM_CHUNK (4u << 20)
/* Frames in flight per connection: hides the control round trip. */
#define SHM_WINDOW 64
/* Waiting on at most this many bytes being copied, the answer is due within
 * tens of microseconds: spin for it rather than sleep. */
#define SHM_SPIN_INFLIGHT (256u << 10)

/* ------------------------------------------------------ target: trust */

struct shm_conn {
    int state;          /* 0 unchecked, 1 verified, -1 refused */
    pid_t pid;
    int pidfd;          /* the verified initiator, -1 if pidfd_open is missing */
    char reason[200];   /* why refused */
    uint32_t passed_gen; /* the region (generation) whose memfds were last passed, 0 none */
};

static void shm_conn_free(void *p)
{
    struct shm_conn *sc = p;
    if (sc && sc->pidfd >= 0) close(sc->pidfd);
    free(sc);
}

/* Addresses in one form: IPv6, with IPv4 as ::ffff:a.b.c.d. */
struct addr6 {
    uint8_t a[16];
    uint16_t port;
};

static int to_addr6(const struct sockaddr_storage *ss, struct addr6 *out)
{
    memset(out, 0, sizeof *out);
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        out->a[10] = out->a[11] = 0xff;
        memcpy(out->a + 12, &s4->sin_addr, 4);
        out->port = ntohs(s4->sin_port);
        return 0;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        memcpy(out->a, &s6->sin6_addr, 16);
        out->port = ntohs(s6->sin6_port);
        return 0;
    }
    return -1;
}

static bool is_loopback(const struct addr6 *x)
{
    static const uint8_t v6lo[16] = {[15] = 1};
    static const uint8_t v4pre[12] = {[10] = 0xff, [11] = 0xff};
    if (memcmp(x->a, v6lo, 16) == 0) return true;
    return memcmp(x->a, v4pre, 12) == 0 && x->a[12] == 127;
}


/* Whether x is loopback or assigned to one of this host's interfaces: then
 * the connection never left the host. */
static bool is_local_address(const struct addr6 *x)
{
    if (is_loopback(x)) return true;
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) return false;
    bool found = false;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr) continue;
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof ss);
        size_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                     : i->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : 0;
        if (!len) continue;
        memcpy(&ss, i->ifa_addr, len);
        struct addr6 y;
        if (to_addr6(&ss, &y) == 0 && memcmp(x->a, y.a, 16) == 0) found = true;
    }
    freeifaddrs(ifs);
    return found;
}

/* Parses a /proc/net/tcp{,6} address "0100007F:1F90" (IPv4: one native
 * 32-bit word in hex; IPv6: four) into an addr6. */
static int parse_proc_addr(const char *text, bool v6, struct addr6 *out)
{
    memset(out, 0, sizeof *out);
    size_t hexlen = v6 ? 32 : 8;
    if (strlen(text) < hexlen + 2 || text[hexlen] != ':') return -1;
    uint8_t raw[16];
    for (size_t w = 0; w < hexlen / 8; w++) {
        char word[9];
        memcpy(word, text + w * 8, 8);
        word[8] = '\0';
        char *end;
        uint32_t v = (uint32_t)strtoul(word, &end, 16);
        if (*end) return -1;
        memcpy(raw + w * 4, &v, 4);
    }
    if (v6) {
        memcpy(out->a, raw, 16);
    } else {
        out->a[10] = out->a[11] = 0xff;
        memcpy(out->a + 12, raw, 4);
    }
    char *end;
    unsigned long port = strtoul(text + hexlen + 1, &end, 16);
    if (port > 65535) return -1;
    out->port = (uint16_t)port;
    return 0;
}

static bool is_v4mapped(const struct addr6 *x)
{
    static const uint8_t v4pre[12] = {[10] = 0xff, [11] = 0xff};
    return memcmp(x->a, v4pre, 12) == 0;
}

/* One exact lookup through NETLINK_SOCK_DIAG (a hash lookup in the kernel;
 * /proc/net/tcp walks every bucket and takes milliseconds). 0 if not found
 * or unavailable. */
static unsigned long diag_lookup(int family, const struct addr6 *local, const struct addr6 *remote, uid_t *uid)
{
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0) return 0;
    struct {
        struct nlmsghdr nh;
        struct inet_diag_req_v2 req;
    } msg;
    memset(&msg, 0, sizeof msg);
    msg.nh.nlmsg_len = sizeof msg;
    msg.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    msg.nh.nlmsg_flags = NLM_F_REQUEST;
    msg.req.sdiag_family = (uint8_t)family;
    msg.req.sdiag_protocol = IPPROTO_TCP;
    msg.req.idiag_states = ~0u;
    msg.req.id.idiag_sport = htons(local->port);
    msg.req.id.idiag_dport = htons(remote->port);
    if (family == AF_INET) {
        memcpy(msg.req.id.idiag_src, local->a + 12, 4);
        memcpy(msg.req.id.idiag_dst, remote->a + 12, 4);
    } else {
        memcpy(msg.req.id.idiag_src, local->a, 16);
        memcpy(msg.req.id.idiag_dst, remote->a, 16);
    }
    msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    unsigned long inode = 0;
    struct timeval tv = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (sendto(fd, &msg, sizeof msg, 0, (struct sockaddr *)&kernel, sizeof kernel) == (ssize_t)sizeof msg) {
        union {
            struct nlmsghdr nh;
            char buf[8192];
        } ans;
        ssize_t n = recv(fd, &ans, sizeof ans, 0);
        for (struct nlmsghdr *h = &ans.nh; n > 0 && NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
                break;
            const struct inet_diag_msg *d = NLMSG_DATA(h);
            inode = d->idiag_inode;
            *uid = d->idiag_uid;
            break;
        }
    }
    close(fd);
    return inode;
}

/* The inode of the socket whose local end is `local` and remote end is
 * `remote`, in this network namespace: sock_diag first, /proc/net/tcp{,6}
 * where netlink is unavailable (e.g. filtered in a container). */
static unsigned long find_socket_inode(const struct addr6 *local, const struct addr6 *remote, uid_t *uid)
{
    bool v4 = is_v4mapped(local) && is_v4mapped(remote);
    /* FERRY_SHM_PROC_LOOKUP=1 skips netlink (tests the fallback). */
    const char *proc_only = getenv("FERRY_SHM_PROC_LOOKUP");
    unsigned long ino = 0;
    if (!proc_only || strcmp(proc_only, "1") != 0) {
        ino = diag_lookup(v4 ? AF_INET : AF_INET6, local, remote, uid);
        if (!ino && v4) ino = diag_lookup(AF_INET6, local, remote, uid);
    }
    if (ino) return ino;
    static const char *const files[2] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(files[k], "re");
        if (!f) continue;
        char line[512];
        unsigned long inode = 0;
        if (!fgets(line, sizeof line, f)) line[0] = '\0'; /* the header */
        while (!inode && fgets(line, sizeof line, f)) {
            char la[64], ra[64];
            unsigned long ino;
            unsigned int owner;
            if (sscanf(line, " %*u: %63s %63s %*x %*s %*s %*s %u %*u %lu", la, ra, &owner, &ino) != 4) continue;
            struct addr6 l, r;
            if (parse_proc_addr(la, k == 1, &l) || parse_proc_addr(ra, k == 1, &r)) continue;
            if (ino && l.port == local->port && r.port == remote->port && memcmp(l.a, local->a, 16) == 0 &&
                memcmp(r.a, remote->a, 16) == 0)
                inode = ino, *uid = (uid_t)owner;
        }
        fclose(f);
        if (inode) return inode;
    }
    return 0;
}

static int cmp_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

/* 1 if pid holds socket:[inode] among its fds, 0 if not, -errno if its fd
 * table cannot be read. The newest fds are looked at first: the socket was
 * opened moments ago, and a process may hold thousands of older ones. */
static int pid_owns_socket(pid_t pid, unsigned long inode)
{
    char dir[64], want[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    DIR *d = opendir(dir);
    if (!d) return -errno;
    int *fds = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            int *m = realloc(fds, cap * sizeof *fds);
            if (!m) break;
            fds = m;
        }
        fds[n++] = atoi(de->d_name);
    }
    closedir(d);
    qsort(fds, n, sizeof *fds, cmp_desc);
    int found = 0;
    size_t wl = strlen(want);
    for (size_t i = 0; i < n && !found; i++) {
        char path[96], target[64];
        snprintf(path, sizeof path, "%s/%d", dir, fds[i]);
        ssize_t k = readlink(path, target, sizeof target);
        if (k == (ssize_t)wl && memcmp(target, want, wl) == 0) found = 1;
    }
    free(fds);
    return found;
}

static int open_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* Whether the process behind pidfd has exited (its pid may be reused). */
static bool pidfd_exited(int pidfd)
{
    if (pidfd < 0) return false;
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

static bool shm_disabled_here(void)
{
    const char *v = getenv("FERRY_SHM_DISABLE");
    return v && *v && strcmp(v, "0") != 0;
}

/* Decides once per connection whether the initiator's claimed pid may be
 * attached. probe is an address the initiator named as its own buffer. */
static void verify_peer(ferry_conn_t *c, struct shm_conn *sc, uint64_t probe)
{
    const ferry_hello_t *h = &c->peer;
    sc->state = -1;
    sc->pid = h->pid;
    if (shm_disabled_here()) {
        snprintf(sc->reason, sizeof sc->reason, "cross-memory attach disabled at the target (FERRY_SHM_DISABLE)");
        return;
    }
    if (memcmp(h->host_id, c->engine->host_id, sizeof h->host_id) != 0 || h->pid <= 0) {
        snprintf(sc->reason, sizeof sc->reason, "the initiator is not on this host (boot id or pid %d)", (int)h->pid);
        return;
    }
    struct sockaddr_storage peer_ss, self_ss;
    socklen_t pl = sizeof peer_ss, sl = sizeof self_ss;
    struct addr6 peer, self;
    if (getpeername(c->fd, (struct sockaddr *)&peer_ss, &pl) != 0 ||
        getsockname(c->fd, (struct sockaddr *)&self_ss, &sl) != 0 || to_addr6(&peer_ss, &peer) ||
        to_addr6(&self_ss, &self)) {
        snprintf(sc->reason, sizeof sc->reason, "the connection's addresses cannot be read: %s", strerror(errno));
        return;
    }
    if (!is_local_address(&peer)) {
        snprintf(sc->reason, sizeof sc->reason, "the connection comes from an address that is not this host's");
        return;
    }
    /* The initiator's socket: local end = its address, remote end = ours. */
    uid_t sock_uid = (uid_t)-1;
    unsigned long inode = find_socket_inode(&peer, &self, &sock_uid);
    if (!inode) {
        snprintf(sc->reason, sizeof sc->reason,
                 "the initiator's socket is not in this network namespace's /proc/net/tcp");
        return;
    }
    int pidfd = open_pidfd(h->pid);
    if (pidfd < 0 && errno == ESRCH) {
        snprintf(sc->reason, sizeof sc->reason, "claimed pid %d does not exist here (another pid namespace?)",
                 (int)h->pid);
        return;
    }
    int own = pid_owns_socket(h->pid, inode);
    /* The owner must also run as the user who made the socket: a socket
     * handed to another user's process (SCM_RIGHTS) must not let its sender
     * have us read that process. /proc/<pid> belongs to its effective uid. */
    char procdir[32];
    snprintf(procdir, sizeof procdir, "/proc/%d", (int)h->pid);
    struct stat st;
    if (own > 0 && (stat(procdir, &st) != 0 || st.st_uid != sock_uid)) {
        snprintf(sc->reason, sizeof sc->reason, "claimed pid %d runs as uid %d, its socket belongs to uid %d",
                 (int)h->pid, stat(procdir, &st) == 0 ? (int)st.st_uid : -1, (int)sock_uid);
        if (pidfd >= 0) close(pidfd);
        return;
    }
    if (own <= 0 || pidfd_exited(pidfd)) {
        if (own < 0)
            snprintf(sc->reason, sizeof sc->reason, "cannot read /proc/%d/fd to verify the claimed pid: %s",
                     (int)h->pid, strerror(-own));
        else
            snprintf(sc->reason, sizeof sc->reason, "claimed pid %d does not own the connection's socket",
                     (int)h->pid);
        if (pidfd >= 0) close(pidfd);
        return;
    }
    /* The kernel's own check (ptrace access mode ATTACH, Yama): one byte of
     * the initiator's buffer into a scratch byte here. */
    unsigned char scratch;
    struct iovec mine = {&scratch, 1}, theirs = {(void *)(uintptr_t)probe, 1};
    if (process_vm_readv(h->pid, &mine, 1, &theirs, 1, 0) != 1 && errno != EFAULT) {
        /* EFAULT: attaching is allowed, the address is bad; the copy reports it. */
        int err = errno;
        snprintf(sc->reason, sizeof sc->reason, "the kernel refuses cross-memory attach to pid %d: %s%s", (int)h->pid,
                 strerror(err),
                 err == EPERM ? " (different user, container, or Yama ptrace_scope)" : "");
        if (pidfd >= 0) close(pidfd);
        return;
    }
    sc->pidfd = pidfd;
    sc->state = 1;
    FERRY_LOG(FERRY_LOG_DEBUG, "shm", "verified %s as pid %d (socket inode %lu)", h->name, (int)h->pid, inode);
}

/* -------------------------------------------------------- target: copy */

static int send_status(ferry_conn_t *c, uint8_t type, const ferry_frame_t *req, int status, uint64_t deadline)
{
    const char *why = status ? ferry_fail_message() : "";
    size_t n = strlen(why);
    if (n > FERRY_WIRE_MAX_REASON) n = FERRY_WIRE_MAX_REASON;
    ferry_frame_t f = {.type = type, .status = status, .req_id = req->req_id, .addr = req->addr,
                       .len = status ? 0 : req->len, .plen = (uint32_t)n};
    return ferry_conn_send_frame(c, &f, why, deadline);
}

/* Maps a failed process_vm_* errno to the answer's status. */
static int cma_error(struct shm_conn *sc, const ferry_frame_t *f, bool write, uint64_t done, size_t n, int err)
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
    default:
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "%s initiator memory [0x%llx+%zu) by cross-memory attach failed after %llu of %llu "
                          "bytes: %s (is the buffer unmapped while registered?)",
                          write ? "reading" : "writing", (unsigned long long)(f->aux + done), n,
                          (unsigned long long)done, (unsigned long long)f->len, strerror(err));
    }
}

/* Moves n bytes between the initiator (theirs) and here (mine) once,
 * retrying EINTR; the count moved, or -errno (a fault at the very start
 * reads as -EFAULT). */
static ssize_t cma_once(pid_t pid, bool write, void *mine, uint64_t theirs, size_t n)
{
    struct iovec l = {mine, n}, r = {(void *)(uintptr_t)theirs, n};
    for (;;) {
        ssize_t got = write ? process_vm_readv(pid, &l, 1, &r, 1, 0) : process_vm_writev(pid, &l, 1, &r, 1, 0);
        if (got > 0) return got;
        if (got == 0) return -EFAULT;
        if (errno != EINTR && errno != EAGAIN) return -errno;
    }
}

/* Re-validation of the frame's range with the read lock held: the cancel
 * set first (a CANCEL's barrier relies on it), then the registry. */
static int check_locked(ferry_conn_t *c, const ferry_frame_t *f, uint32_t need)
{
    ferry_engine_t *e = c->engine;
    if (ferry_conn_is_cancelled(c, f->req_id))
        return ferry_fail(FERRY_ERR_CANCELLED, "request %llu was cancelled", (unsigned long long)f->req_id);
    /* The registry as it is now, whatever generation the initiator learned
     * (as tcp.c): a range registered again takes the access. */
    return ferry_registry_check_locked(&e->registry, f->addr, f->len, need, 0, "target");
}

/* The memory kind of the target range (host without a lookup when no
 * device memory is registered), with the read lock held. */
static uint32_t kind_locked(ferry_registry_t *r, const ferry_frame_t *f)
{
    if (ferry_registry_device_count(r) == 0) return FERRY_MEMKIND_HOST;
    const ferry_region_t *reg = ferry_registry_lookup_locked(r, f->addr, f->len);
    return reg ? reg->kind : FERRY_MEMKIND_HOST;
}

/* Copies the frame's range chunk by chunk, each under the registry's read
 * lock after re-validating the range. Host memory moves in one copy, the
 * kernel's; device memory (which the kernel cannot reach) is staged in the
 * connection's bounce buffer, the attach outside the lock on the bounce
 * side. Returns the answer's status. */
static int copy_chunks(ferry_conn_t *c, struct shm_conn *sc, const ferry_frame_t *f, bool write)
{
    ferry_registry_t *r = &c->engine->registry;
    uint32_t need = write ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
    uint64_t done = 0;
    while (done < f->len) {
        uint64_t left = f->len - done;
        size_t n = left < SHM_CHUNK ? (size_t)left : SHM_CHUNK;
        unsigned char *here = (unsigned char *)(uintptr_t)(f->addr + done);
        uint64_t there = f->aux + done;
        ssize_t got = 0;
        ferry_registry_read_lock(r);
        int rc = check_locked(c, f, need);
        uint32_t kind = rc ? FERRY_MEMKIND_HOST : kind_locked(r, f);
        if (rc == 0 && kind == FERRY_MEMKIND_HOST) got = cma_once(sc->pid, write, here, there, n);
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
                got = cma_once(sc->pid, true, b, there, n);
                if (got > 0) {
                    ferry_registry_read_lock(r);
                    rc = check_locked(c, f, need);
                    if (rc == 0) rc = ferry_memkind_from_host(kind, here, b, (size_t)got);
                    ferry_registry_unlock(r);
                }
            } else {
                ferry_registry_read_lock(r);
                rc = check_locked(c, f, need);
                if (rc == 0) rc = ferry_memkind_to_host(kind, b, here, n);
                ferry_registry_unlock(r);
                if (rc == 0) got = cma_once(sc->pid, false, b, there, n);
            }
            if (rc) return rc;
        }
        if (got < 0) return cma_error(sc, f, write, done, n, (int)-got);
        done += (uint64_t)got;
    }
    return 0;
}

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
 * Asked again after mapped copies, the same answer is the owner's
 * confirmation that the region is still registered at the generation (crc)
 * the copies began under: a killed owner gives none. Regions no peer may
 * access (FERRY_MEM_LOCAL) are refused. */
static int serve_map(ferry_conn_t *c, struct shm_conn *sc, const ferry_frame_t *f, uint64_t deadline)
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
        ferry_registry_t *r = &c->engine->registry;
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
            put64(info + 16, reg->share_off);
            put32(info + 28, reg->generation);
            put32(info + 32, reg->flags);
            /* Opened under the lock: a pool destroyed meanwhile closes its fds. */
            if (reg->share_ctl && receiver >= 0) {
                sc->passed_gen = reg->generation;
                fds[0] = reopen_fd(reg->share_fd, (reg->flags & FERRY_MEM_REMOTE_WRITE) != 0);
                fds[1] = reopen_fd(reg->share_ctl_fd, false);
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
    if (status) return send_status(c, FERRY_FRAME_SHM_MAP_RESP, f, status, deadline);
    ferry_frame_t a = {.type = FERRY_FRAME_SHM_MAP_RESP, .req_id = f->req_id, .addr = f->addr, .len = f->len,
                       .plen = FERRY_SHM_MAP_INFO_SIZE};
    return ferry_conn_send_frame(c, &a, info, deadline);
}

/* ------------------------------------------------ target: vector frames */

/* The connection's trust record, made and decided at first use (probe: an
 * address the initiator named as its own); NULL when out of memory. */
static struct shm_conn *vec_trust(ferry_conn_t *c, uint64_t probe)
{
    struct shm_conn *sc = c->xport;
    if (!sc) {
        sc = calloc(1, sizeof *sc);
        if (!sc) return NULL;
        sc->pidfd = -1;
        c->xport = sc;
        c->xport_free = shm_conn_free;
    }
    if (sc->state == 0) verify_peer(c, sc, probe);
    if (sc->state == 1 && pidfd_exited(sc->pidfd)) {
        sc->state = -1;
        snprintf(sc->reason, sizeof sc->reason, "the verified initiator pid %d has exited", (int)sc->pid);
    }
    return sc;
}

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
    const ferry_vec_desc_t *d = &v->d[i];
    while (q < d->len) {
        ssize_t got = cma_once(sc->pid, write, (unsigned char *)(uintptr_t)d->addr + q, d->aux + q, d->len - q);
        if (got < 0) {
            ferry_frame_t pf = vec_piece_frame(v, i);
            return cma_error(sc, &pf, write, q, d->len - q, (int)-got);
        }
        q += (uint64_t)got;
    }
    return 0;
}

/* Copies the pieces of host memory with one process_vm_readv/writev per up
 * to IOV_MAX pieces (and SHM_CHUNK bytes), each call under the registry's
 * read lock after the pieces were checked (again when the registry or the
 * cancel set changed). A call that stops short fails the piece it stopped
 * in (its own error) and goes on after it. */
static int vec_copy_host(ferry_conn_t *c, struct shm_conn *sc, struct ferry_vec_scratch *v, size_t n, bool write,
                         bool *device)
{
    ferry_engine_t *e = c->engine;
    ferry_registry_t *r = &e->registry;
    uint32_t need = write ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
    uint64_t version = 0;
    bool checked = false;
    size_t i = 0;
    while (i < n && sc->state >= 0) { /* refused mid-way: the caller refuses the rest */
        ferry_registry_read_lock(r);
        if (!checked || r->version != version || ferry_vec_cancels_pending(c)) {
            ferry_vec_validate_locked(c, v, i, n, need, device);
            version = r->version;
            checked = true;
        }
        if (*device) {
            ferry_registry_unlock(r);
            return 0; /* the caller copies piece by piece */
        }
        size_t cnt = 0, j = i;
        uint64_t bytes = 0;
        for (; j < n && cnt < IOV_MAX && bytes < SHM_CHUNK; j++) {
            if (v->st[j]) continue;
            v->iov[cnt] = (struct iovec){(void *)(uintptr_t)v->d[j].addr, v->d[j].len};
            v->riov[cnt++] = (struct iovec){(void *)(uintptr_t)v->d[j].aux, v->d[j].len};
            bytes += v->d[j].len;
        }
        ssize_t got = 0;
        int err = 0;
        if (cnt) {
            do {
                got = write ? process_vm_readv(sc->pid, v->iov, cnt, v->riov, cnt, 0)
                            : process_vm_writev(sc->pid, v->iov, cnt, v->riov, cnt, 0);
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
            int st = vec_piece_rest(sc, v, p, k, write);
            ferry_registry_unlock(r);
            if (st == FERRY_ERR_PEER_CLOSED) return st;
            if (st) ferry_vec_fail_piece(v, p, st);
            i = p + 1;
            continue;
        }
        ferry_registry_unlock(r);
        if (got < 0) {
            /* Nothing moved: the first piece names the error. */
            size_t p = i;
            while (v->st[p]) p++;
            ferry_frame_t pf = vec_piece_frame(v, p);
            int st = cma_error(sc, &pf, write, 0, v->d[p].len, err);
            if (st == FERRY_ERR_PEER_CLOSED) return st;
            ferry_vec_fail_piece(v, p, st);
            i = p + 1;
            continue;
        }
        i = j;
    }
    return 0;
}

/* CMA_VEC: many pieces by cross-memory attach, one answer (vec.h). */
static int serve_cma_vec(ferry_conn_t *c, const ferry_frame_t *f)
{
    uint64_t deadline = ferry_deadline_after_ms(c->engine->cfg.timeout_ms);
    struct ferry_vec_scratch *v = ferry_vec_scratch(c);
    if (!v) return FERRY_ERR_MEMORY;
    int rc = ferry_vec_recv_descs(c, f, v, deadline);
    if (rc) return rc;
    size_t n = (size_t)f->len;
    bool write = f->aux == FERRY_OP_WRITE;
    struct shm_conn *sc = vec_trust(c, v->d[0].aux);
    if (!sc) return ferry_fail(FERRY_ERR_MEMORY, "shm: out of memory");
    bool device = false;
    if (sc->state >= 0) rc = vec_copy_host(c, sc, v, n, write, &device);
    if (rc) return rc; /* the initiator is gone */
    for (size_t i = 0; i < n; i++) {
        if (sc->state < 0 && !v->st[i]) {
            ferry_vec_fail_piece(v, i, ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "%s", sc->reason));
        } else if (device && !v->st[i]) {
            ferry_frame_t pf = vec_piece_frame(v, i);
            int st = copy_chunks(c, sc, &pf, write);
            if (st == FERRY_ERR_PEER_CLOSED) return st;
            if (st) ferry_vec_fail_piece(v, i, st);
        }
    }
    uint64_t moved = 0;
    for (size_t i = 0; i < n; i++)
        if (!v->st[i]) moved += v->d[i].len;
    if (write) FERRY_STAT_ADD(&c->engine->stats, bytes_placed, moved);
    else FERRY_STAT_ADD(&c->engine->stats, bytes_served, moved);
    return ferry_vec_send_ack(c, f, v, n, deadline);
}

static int shm_serve(ferry_conn_t *c, const ferry_frame_t *f)
{
    if (f->type == FERRY_FRAME_CMA_VEC) return serve_cma_vec(c, f);
    uint64_t deadline = ferry_deadline_after_ms(c->engine->cfg.timeout_ms);
    bool write = f->type == FERRY_FRAME_CMA_WRITE;
    bool map = f->type == FERRY_FRAME_SHM_MAP_REQ;
    uint8_t answer = write ? FERRY_FRAME_WRITE_ACK : FERRY_FRAME_READ_RESP;
    if (f->plen != 0 || f->flags != 0 || f->len == 0 || f->len > FERRY_WIRE_MAX_DATA || f->aux == 0 ||
        f->aux + f->len < f->aux)
        return ferry_fail(FERRY_ERR_MALFORMED_FRAME, "%s of %llu bytes from 0x%llx (payload %u, flags 0x%x)",
                          ferry_frame_type_name(f->type), (unsigned long long)f->len, (unsigned long long)f->aux,
                          f->plen, f->flags);
    struct shm_conn *sc = c->xport;
    if (!sc) {
        sc = calloc(1, sizeof *sc);
        if (!sc) return ferry_fail(FERRY_ERR_MEMORY, "shm: out of memory");
        sc->pidfd = -1;
        c->xport = sc;
        c->xport_free = shm_conn_free;
    }
    if (sc->state == 0) verify_peer(c, sc, f->aux);
    if (sc->state == 1 && pidfd_exited(sc->pidfd)) {
        sc->state = -1;
        snprintf(sc->reason, sizeof sc->reason, "the verified initiator pid %d has exited", (int)sc->pid);
    }
    if (map) return serve_map(c, sc, f, deadline);
    int status;
    if (sc->state < 0)
        status = ferry_fail(FERRY_ERR_NOT_IMPLEMENTED, "%s", sc->reason);
    else
        status = copy_chunks(c, sc, f, write);
    if (status == FERRY_ERR_PEER_CLOSED) return status;
    if (status == 0) {
        if (write) FERRY_STAT_ADD(&c->engine->stats, bytes_placed, f->len);
        else FERRY_STAT_ADD(&c->engine->stats, bytes_served, f->len);
    }
    return send_status(c, answer, f, status, deadline);
}

/* --------------------------------------------------- initiator side */


static int send_cma(ferry_conn_t *c, ferry_xfer_t *x, uint64_t off, uint64_t n)
{
    ferry_frame_t f = {.type = x->opcode == FERRY_OP_WRITE ? FERRY_FRAME_CMA_WRITE : FERRY_FRAME_CMA_READ,
                       .req_id = x->req_id, .addr = x->remote + off, .len = n,
                       .aux = (uint64_t)(uintptr_t)(x->local + off), .crc = x->generation};
    return ferry_conn_send_frame(c, &f, NULL, x->deadline);
}

/* Receives one answer. 0, a piece failure, or (with *broken) a connection
 * failure; *refused when the target declined cross-memory attach. */
static int recv_answer(ferry_conn_t *c, const struct inflight *in, int *broken, bool *refused, char *reason,
                       size_t cap, unsigned spin_us)
{
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

/* The target refused: this session moves to tcp for good, and the pieces
 * go again over TCP from their confirmed prefix. */
static int fall_back(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, const char *why)
{
    ferry_session_t *s = c->session;
    if (s) {
        pthread_mutex_lock(&s->lock);
        if (s->transport == &ferry_transport_shm) {
            s->transport = &ferry_transport_tcp;
            snprintf(s->transport_reason, sizeof s->transport_reason, "%s; fell back to tcp", why);
            FERRY_LOG(FERRY_LOG_WARN, "shm", "%s: %s; using tcp", s->name, why);
        }
        pthread_mutex_unlock(&s->lock);
    }
    ferry_clear_last_error();
    return ferry_transport_tcp.run(c, xs, nx, broken);
}

/* Whether the connection goes through something (a proxy, a port
 * forward): the port we dialed is not the one the peer listens on. Then
 * the bytes stay on the connection, where that something wants them. */
static bool via_intermediary(ferry_conn_t *c, char *why, size_t cap)
{
    char host[256];
    uint16_t port = 0;
    if (!c->session || ferry_parse_hostport(c->peer.name, host, sizeof host, &port) != 0) return false;
    if (port == c->session->port) return false;
    snprintf(why, cap, "shm not used: connected through an intermediary (dialed port %u, the peer listens on %u)",
             (unsigned)c->session->port, (unsigned)port);
    return true;
}

/* Whether a piece's local buffer is device memory: the target's attach
 * cannot reach it, so such a stream goes over TCP, which stages it. */
static bool any_device_local(ferry_engine_t *e, const ferry_xfer_t *xs, size_t nx)
{
    ferry_registry_t *r = &e->registry;
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

struct shm_icache {
    int state;                /* 0 unchecked, 1 the target pid verified, -1 mapping off */
    int pidfd;                /* the verified target, -1 if pidfd_open is missing */
    struct shm_map *maps;
    size_t nmaps;
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
    const char *v = getenv("FERRY_SHM_NOMAP");
    return v && *v && strcmp(v, "0") != 0;
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
    struct addr6 peer, self;
    if (getpeername(c->fd, (struct sockaddr *)&peer_ss, &pl) != 0 ||
        getsockname(c->fd, (struct sockaddr *)&self_ss, &sl) != 0 || to_addr6(&peer_ss, &peer) ||
        to_addr6(&self_ss, &self) || !is_local_address(&peer))
        return false;
    uid_t uid;
    unsigned long inode = find_socket_inode(&peer, &self, &uid);
    return inode && c->peer.pid > 0 && pid_owns_socket(c->peer.pid, inode) > 0 && uid == getuid();
}

/* Sends SHM_MAP_REQ for [addr, addr+len) at generation and receives the
 * answer: 0 with info filled; the target's refusal (its reason logged); or,
 * with *broken, a connection failure. */
static int map_ask(ferry_conn_t *c, const ferry_xfer_t *x, uint64_t addr, uint64_t len, uint32_t generation,
                   uint8_t info[FERRY_SHM_MAP_INFO_SIZE], int *broken)
{
    ferry_frame_t q = {.type = FERRY_FRAME_SHM_MAP_REQ, .req_id = x->req_id, .addr = addr, .len = len,
                       .aux = (uint64_t)(uintptr_t)x->local, .crc = generation};
    int rc = ferry_conn_send_frame(c, &q, NULL, x->deadline);
    ferry_frame_t a;
    if (rc == 0) rc = ferry_conn_recv_frame(c, &a, x->deadline);
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
    int rc = map_ask(c, x, addr, 1, x->generation, info, broken);
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

/* Bytes copied through a mapping, not yet confirmed by the owner. */
struct mapped {
    uint64_t n;                 /* 0: nothing copied for this piece */
    uint64_t addr, len;         /* the region, as mapped */
    uint32_t generation;
};

/* Asks the owner to confirm each region that pieces were copied into or
 * out of: it answers only while its threads run (a process killed during
 * the copy answers nothing, although its pages took the bytes) and while
 * the region is registered at the generation the copies began under.
 * Confirmed pieces advance; the others fail with the owner's reason. 0, or
 * a connection failure with *broken (nothing advanced). */
static int map_confirm(ferry_conn_t *c, struct shm_icache *ic, ferry_xfer_t *xs, size_t nx, struct mapped *mp,
                       int *broken)
{
    for (size_t i = 0; i < nx; i++) {
        if (!mp[i].n) continue;
        struct mapped r = mp[i];
        uint8_t info[FERRY_SHM_MAP_INFO_SIZE];
        /* One byte names the region; the generation says it is the same. */
        int rc = map_ask(c, &xs[i], r.addr, 1, r.generation, info, broken);
        if (*broken) return rc;
        if (rc == 0 && get32(info + 28) != r.generation)
            rc = ferry_fail(FERRY_ERR_STALE_SEGMENT, "region [0x%llx+%llu) changed generation %u -> %u",
                            (unsigned long long)r.addr, (unsigned long long)r.len, r.generation, get32(info + 28));
        if (rc) {
            for (struct shm_map *m = ic->maps; m; m = m->next)
                if (m->addr == r.addr && m->generation == r.generation) {
                    icache_drop(ic, m);
                    break;
                }
        }
        for (size_t k = i; k < nx; k++) {
            if (!mp[k].n || mp[k].addr != r.addr || mp[k].generation != r.generation) continue;
            ferry_xfer_t *x = &xs[k];
            if (rc) {
                if (x->rc == 0) {
                    ferry_fail_context("copied %llu bytes through the mapping of [0x%llx+%llu), unconfirmed",
                                       (unsigned long long)mp[k].n, (unsigned long long)r.addr,
                                       (unsigned long long)r.len);
                    ferry_xfer_fail(x, rc);
                }
            } else {
                x->done += mp[k].n;
                if (x->progress) atomic_fetch_add(x->progress, mp[k].n);
            }
            mp[k].n = 0;
        }
    }
    ferry_clear_last_error();
    return 0;
}

/* Copies what it can of each piece through a mapping; the rest stays for
 * cross-memory attach. A copy counts only once the owner confirmed it
 * (map_confirm). 0, or a connection failure with *broken. */
static int map_pass(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken)
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
        if (owns) ic->pidfd = open_pidfd(c->peer.pid);
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
    if (pidfd_exited(ic->pidfd)) {
        ic->state = -1;
        while (ic->maps) icache_drop(ic, ic->maps);
        return 0;
    }
    struct mapped *mp = NULL;
    for (size_t i = 0; i < nx && ic->state > 0; i++) {
        ferry_xfer_t *x = &xs[i];
        if (!ferry_piece_sendable(x, x->done)) continue;
        uint64_t at = x->remote + x->done, left = x->len - x->done;
        struct shm_map *m = ic->maps;
        while (m && !(at >= m->addr && at - m->addr < m->len)) m = m->next;
        if (m && x->generation && m->generation != x->generation) {
            icache_drop(ic, m); /* a newer registration, maybe */
            m = NULL;
        }
        if (!m) m = map_fetch(c, ic, x, at, broken);
        if (*broken) {
            free(mp);
            return ferry_last_error_code() ? ferry_last_error_code() : FERRY_ERR_PEER_CLOSED;
        }
        if (!m || !m->shareable) continue;
        uint32_t need = x->opcode == FERRY_OP_WRITE ? FERRY_MEM_REMOTE_WRITE : FERRY_MEM_REMOTE_READ;
        if ((m->flags & need) != need || left > m->addr + m->len - at ||
            (x->generation && x->generation != m->generation))
            continue; /* cross-memory attach: the target names the error */
        if (!mp && !(mp = calloc(nx, sizeof *mp))) break;
        ferry_share_ctl_t *ctl = m->ctl;
        uint64_t copied = 0;
        bool revoked = false;
        while (ferry_piece_sendable(x, x->done + copied)) {
            uint64_t off = x->done + copied;
            uint64_t n = x->len - off < SHM_SLICE ? x->len - off : SHM_SLICE;
            unsigned char *there = m->map + (x->remote + off - m->addr);
            /* A hint (the owner's confirmation decides): stop early into a
             * pool being deregistered. */
            if (atomic_load(&ctl->state) != FERRY_SHARE_LIVE || atomic_load(&ctl->generation) != m->generation) {
                revoked = true;
                break;
            }
            if (x->opcode == FERRY_OP_WRITE) memcpy(there, x->local + off, (size_t)n);
            else memcpy(x->local + off, there, (size_t)n);
            copied += n;
        }
        mp[i] = (struct mapped){copied, m->addr, m->len, m->generation};
        if (revoked && !copied) icache_drop(ic, m); /* the attach path reports it */
    }
    int rc = mp ? map_confirm(c, ic, xs, nx, mp, broken) : 0;
    free(mp);
    return rc;
}

static int shm_run(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken)
{
    if (any_device_local(c->engine, xs, nx)) return ferry_transport_tcp.run(c, xs, nx, broken);
    char why[200];
    if (via_intermediary(c, why, sizeof why)) return fall_back(c, xs, nx, broken, why);
    *broken = 0;
    int mrc = map_pass(c, xs, nx, broken);
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
    unsigned spin_us = (unsigned)c->engine->cfg.spin_us;
    *broken = 0;
    for (;;) {
        while (cur < nx && !ferry_piece_sendable(&xs[cur], cur_off)) {
            if (++cur < nx) cur_off = xs[cur].done;
        }
        if (!refused && cur < nx && count < SHM_WINDOW && cur_off == 0 && cur + 1 < nx &&
            xs[cur + 1].opcode == xs[cur].opcode && ferry_vec_eligible(c, &xs[cur]) &&
            ferry_piece_sendable(&xs[cur + 1], xs[cur + 1].done) && ferry_vec_eligible(c, &xs[cur + 1])) {
            /* Small pieces go together: one CMA_VEC, one answer. */
            size_t g = ferry_vec_collect(c, xs + cur, nx - cur, SHM_CHUNK);
            int rc = ferry_vec_send(c, FERRY_FRAME_CMA_VEC, xs + cur, g);
            if (rc) {
                *broken = 1;
                free(tainted);
                return rc;
            }
            uint64_t bytes = 0;
            for (size_t i = 0; i < g; i++) bytes += xs[cur + i].len;
            ring[(head + count++) % SHM_WINDOW] = (struct inflight){&xs[cur], 0, bytes, (uint32_t)g};
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
            ring[(head + count++) % SHM_WINDOW] = (struct inflight){x, cur_off, n, 0};
            cur_off += n;
            inflight += n;
            continue;
        }
        if (count == 0) break;
        struct inflight in = ring[head];
        head = (head + 1) % SHM_WINDOW;
        count--;
        unsigned spin = inflight <= SHM_SPIN_INFLIGHT ? spin_us : 0;
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
        return fall_back(c, xs, nx, broken, why);
    }
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

static int shm_usable(ferry_engine_t *e, const ferry_hello_t *peer, char *why, size_t cap)
{
    static const uint8_t zero[16];
    const char *t = e->cfg.transport;
    if (t && strcmp(t, "auto") != 0 && strcmp(t, "shm") != 0) {
        snprintf(why, cap, "transport forced to %s", t);
        return 0;
    }
    if (!(peer->flags & FERRY_HELLO_F_CMA)) {
        snprintf(why, cap, "the peer does not offer cross-memory attach");
        return 0;
    }
    if (memcmp(e->host_id, zero, sizeof zero) == 0 || memcmp(peer->host_id, e->host_id, sizeof e->host_id) != 0) {
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

static uint32_t shm_hello_flags(ferry_engine_t *e)
{
    (void)e;
    return FERRY_HELLO_F_SHMPOOL2;
}

const ferry_transport_ops_t ferry_transport_shm = {
    .name = "shm",
    .usable = shm_usable,
    .run = shm_run,
    .serve = shm_serve,
    .serve_types = (1u << FERRY_FRAME_CMA_WRITE) | (1u << FERRY_FRAME_CMA_READ) | (1u << FERRY_FRAME_SHM_MAP_REQ) |
                   (1u << FERRY_FRAME_CMA_VEC),
    .hello_flags = shm_hello_flags,
};
