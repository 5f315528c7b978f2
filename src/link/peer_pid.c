/* SPDX-License-Identifier: Apache-2.0 */
/* Same-host peers: whether a target's connection comes from the process
 * its HELLO claims. The connection's two addresses give the initiator's
 * socket (its inode, by sock_diag or /proc/net/tcp{,6}); the claimed pid
 * must hold that socket among its fds and run as the socket's user. What
 * a transport may then do to that process (attach to its memory: shm;
 * take its descriptors: cuda_ipc's VMM imports) the kernel checks again
 * (ptrace access). Moved from the shm transport, which used it first. */
#include "peer_pid.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "conn.h"
#include "xport.h"
#include "util/log.h"

int ferry_addr6_of(const struct sockaddr_storage *ss, struct ferry_addr6 *out)
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

static bool is_loopback(const struct ferry_addr6 *x)
{
    static const uint8_t v6lo[16] = {[15] = 1};
    static const uint8_t v4pre[12] = {[10] = 0xff, [11] = 0xff};
    if (memcmp(x->a, v6lo, 16) == 0) return true;
    return memcmp(x->a, v4pre, 12) == 0 && x->a[12] == 127;
}


/* Whether x is loopback or assigned to one of this host's interfaces: then
 * the connection never left the host. */
bool ferry_addr6_is_local(const struct ferry_addr6 *x)
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
        struct ferry_addr6 y;
        if (ferry_addr6_of(&ss, &y) == 0 && memcmp(x->a, y.a, 16) == 0) found = true;
    }
    freeifaddrs(ifs);
    return found;
}

/* Parses a /proc/net/tcp{,6} address "0100007F:1F90" (IPv4: one native
 * 32-bit word in hex; IPv6: four) into an addr6. */
static int parse_proc_addr(const char *text, bool v6, struct ferry_addr6 *out)
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

static bool is_v4mapped(const struct ferry_addr6 *x)
{
    static const uint8_t v4pre[12] = {[10] = 0xff, [11] = 0xff};
    return memcmp(x->a, v4pre, 12) == 0;
}

/* One exact lookup through NETLINK_SOCK_DIAG (a hash lookup in the kernel;
 * /proc/net/tcp walks every bucket and takes milliseconds). 0 if not found
 * or unavailable. */
static unsigned long diag_lookup(int family, const struct ferry_addr6 *local, const struct ferry_addr6 *remote, uid_t *uid)
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
unsigned long ferry_socket_inode(const struct ferry_addr6 *local, const struct ferry_addr6 *remote, bool proc_only,
                                 uid_t *uid)
{
    bool v4 = is_v4mapped(local) && is_v4mapped(remote);
    unsigned long ino = 0;
    if (!proc_only) {
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
            struct ferry_addr6 l, r;
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
int ferry_pid_owns_socket(pid_t pid, unsigned long inode)
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

int ferry_pidfd_open(pid_t pid)
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
bool ferry_pidfd_exited(int pidfd)
{
    if (pidfd < 0) return false;
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

int ferry_peer_verify_pid(ferry_conn_t *c, bool proc_only, int *pidfd_out, char *why, size_t cap)
{
    const ferry_hello_t *h = &c->peer;
    *pidfd_out = -1;
    if (memcmp(h->host_id, c->ctx->host_id, sizeof h->host_id) != 0 || h->pid <= 0) {
        snprintf(why, cap, "the initiator is not on this host (boot id or pid %d)", (int)h->pid);
        return -1;
    }
    struct sockaddr_storage peer_ss, self_ss;
    socklen_t pl = sizeof peer_ss, sl = sizeof self_ss;
    struct ferry_addr6 peer, self;
    if (getpeername(c->fd, (struct sockaddr *)&peer_ss, &pl) != 0 ||
        getsockname(c->fd, (struct sockaddr *)&self_ss, &sl) != 0 || ferry_addr6_of(&peer_ss, &peer) ||
        ferry_addr6_of(&self_ss, &self)) {
        snprintf(why, cap, "the connection's addresses cannot be read: %s", strerror(errno));
        return -1;
    }
    if (!ferry_addr6_is_local(&peer)) {
        snprintf(why, cap, "the connection comes from an address that is not this host's");
        return -1;
    }
    /* The initiator's socket: local end = its address, remote end = ours. */
    uid_t sock_uid = (uid_t)-1;
    unsigned long inode = ferry_socket_inode(&peer, &self, proc_only, &sock_uid);
    if (!inode) {
        snprintf(why, cap, "the initiator's socket is not in this network namespace's /proc/net/tcp");
        return -1;
    }
    int pidfd = ferry_pidfd_open(h->pid);
    if (pidfd < 0 && errno == ESRCH) {
        snprintf(why, cap, "claimed pid %d does not exist here (another pid namespace?)", (int)h->pid);
        return -1;
    }
    int own = ferry_pid_owns_socket(h->pid, inode);
    /* The owner must also run as the user who made the socket: a socket
     * handed to another user's process (SCM_RIGHTS) must not let its sender
     * have us act on that process. /proc/<pid> belongs to its effective uid. */
    char procdir[32];
    snprintf(procdir, sizeof procdir, "/proc/%d", (int)h->pid);
    struct stat st;
    if (own > 0 && (stat(procdir, &st) != 0 || st.st_uid != sock_uid)) {
        snprintf(why, cap, "claimed pid %d runs as uid %d, its socket belongs to uid %d", (int)h->pid,
                 stat(procdir, &st) == 0 ? (int)st.st_uid : -1, (int)sock_uid);
        if (pidfd >= 0) close(pidfd);
        return -1;
    }
    if (own <= 0 || ferry_pidfd_exited(pidfd)) {
        if (own < 0)
            snprintf(why, cap, "cannot read /proc/%d/fd to verify the claimed pid: %s", (int)h->pid, strerror(-own));
        else
            snprintf(why, cap, "claimed pid %d does not own the connection's socket", (int)h->pid);
        if (pidfd >= 0) close(pidfd);
        return -1;
    }
    FERRY_LOG(FERRY_LOG_DEBUG, "peer", "verified %s as pid %d (socket inode %lu)", h->name, (int)h->pid, inode);
    *pidfd_out = pidfd;
    return 0;
}
