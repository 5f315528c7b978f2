/* SPDX-License-Identifier: Apache-2.0 */
/* Blocking socket I/O with deadlines.
 *
 * Sockets stay in blocking mode; each call first tries the operation with
 * MSG_DONTWAIT and only polls when the kernel has nothing ready. That keeps a
 * small message at one syscall and still bounds every wait by a deadline. */
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "fail.h"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

int ferry_parse_hostport(const char *name, char *host, size_t hostlen, uint16_t *port)
{
    if (!name || !*name) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "peer name is empty (expected host:port)");
    const char *colon;
    const char *hstart = name;
    size_t hlen;
    if (name[0] == '[') {
        const char *close = strchr(name, ']');
        if (!close || close[1] != ':')
            return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "peer name '%s' is not [ipv6]:port", name);
        hstart = name + 1;
        hlen = (size_t)(close - hstart);
        colon = close + 1;
    } else {
        colon = strrchr(name, ':');
        if (!colon) return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "peer name '%s' has no port (expected host:port)", name);
        hlen = (size_t)(colon - name);
    }
    if (hlen == 0 || hlen >= hostlen)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "peer name '%s' has an empty or too long host", name);
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || *end || end == colon + 1 || p <= 0 || p > 65535)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "peer name '%s' has a bad port", name);
    memcpy(host, hstart, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)p;
    return 0;
}

static int resolve(const char *host, uint16_t port, int passive, struct addrinfo **res)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    char service[8];
    snprintf(service, sizeof service, "%u", port);
    int rc = getaddrinfo(host, service, &hints, res);
    if (rc != 0) return ferry_fail(FERRY_ERR_DNS, "cannot resolve '%s': %s", host, gai_strerror(rc));
    return 0;
}

int ferry_net_listen(const char *host, uint16_t port, int *fd_out, uint16_t *port_out)
{
    struct addrinfo *res;
    int rc = resolve(host, port, 1, &res);
    if (rc) return rc;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return ferry_fail(FERRY_ERR_SOCKET, "socket(): %s", strerror(errno));
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 512) != 0) {
        int err = errno;
        freeaddrinfo(res);
        close(fd);
        return ferry_fail(FERRY_ERR_SOCKET, "cannot listen on %s:%u: %s", host, port, strerror(err));
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}

static int connect_one(const struct addrinfo *ai, uint64_t deadline, int *fd_out)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ferry_fail(FERRY_ERR_SOCKET, "socket(): %s", strerror(errno));
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        return ferry_fail(FERRY_ERR_SOCKET, "connect: %s", strerror(err));
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int n;
    do n = poll(&p, 1, ferry_ms_left(deadline));
    while (n < 0 && errno == EINTR);
    if (n == 0) {
        close(fd);
        return ferry_fail(FERRY_ERR_TIMEOUT, "connect did not complete before the deadline");
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    if (n < 0 || soerr) {
        close(fd);
        return ferry_fail(FERRY_ERR_SOCKET, "connect: %s", strerror(soerr ? soerr : errno));
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *fd_out = fd;
    return 0;
}

int ferry_net_connect(const char *host, uint16_t port, uint64_t deadline, int *fd_out)
{
    struct addrinfo *res;
    int rc = resolve(host, port, 0, &res);
    if (rc) return rc;
    rc = FERRY_ERR_SOCKET;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        rc = connect_one(ai, deadline, fd_out);
        if (rc == 0 || rc == FERRY_ERR_TIMEOUT) break;
    }
    freeaddrinfo(res);
    if (rc) ferry_fail_context("connect to %s:%u", host, port);
    return rc;
}

static int wait_fd(int fd, short events, uint64_t deadline)
{
    struct pollfd p = {.fd = fd, .events = events};
    for (;;) {
        int n = poll(&p, 1, ferry_ms_left(deadline));
        if (n > 0) return 1;
        if (n == 0) return 0;
        if (errno != EINTR) return -1;
    }
}

int ferry_net_wait_readable(int fd, uint64_t deadline)
{
    return wait_fd(fd, POLLIN, deadline);
}

int ferry_net_nap_readable(int fd, unsigned nap_us)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    struct timespec ts = {.tv_sec = nap_us / 1000000u, .tv_nsec = (long)(nap_us % 1000000u) * 1000};
    /* With the default timer slack (50 us) a nap overran by ~75 us on a
     * small VM, with 1 ns by ~20-40 us: this thread's slack is 1 ns for the
     * nap, then set back (the thread is the application's). */
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > 1) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    int n = ppoll(&p, 1, &ts, NULL);
    if (slack > 1) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    return n > 0 ? 1 : 0; /* an interrupted nap ends like an expired one */
}

int ferry_net_spin_readable(int fd, unsigned spin_us)
{
    uint64_t until = ferry_now_ns() + (uint64_t)spin_us * 1000u;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    do {
        if (poll(&p, 1, 0) > 0) return 1;
    } while (ferry_now_ns() < until);
    return 0;
}

static int io_error(int err, const char *what);

int ferry_net_recv_spin(int fd, void *buf, size_t len, unsigned spin_us, size_t *got)
{
    char *p = buf;
    *got = 0;
    if (spin_us == 0 || len == 0) return 0;
    uint64_t until = 0;
    for (unsigned i = 0; *got < len; i++) {
        ssize_t n = recv(fd, p + *got, len - *got, MSG_DONTWAIT);
        if (n > 0) {
            *got += (size_t)n;
            continue;
        }
        if (n == 0) return ferry_fail(FERRY_ERR_PEER_CLOSED, "the peer closed the connection");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return io_error(errno, "recv");
        /* The one who will answer may share this CPU (two spinners on one
         * core of a small machine take turns only at preemption): let it
         * run. With nobody else runnable here this returns at once. */
        sched_yield();
        if ((i & 7) == 0) {
            uint64_t now = ferry_now_ns();
            if (!until) until = now + (uint64_t)spin_us * 1000u;
            else if (now >= until) break;
        }
    }
    return 0;
}

static int io_error(int err, const char *what)
{
    if (err == EPIPE || err == ECONNRESET)
        return ferry_fail(FERRY_ERR_PEER_CLOSED, "%s: connection reset by peer", what);
    return ferry_fail(FERRY_ERR_SOCKET, "%s: %s", what, strerror(err));
}

/* Moves *iov and *cnt past the n bytes just sent or received: the entries
 * they filled are skipped, the one they ended in starts where they stopped. */
static void iov_advance(struct iovec **iov, size_t *cnt, size_t n)
{
    while (*cnt > 0 && n >= (*iov)->iov_len) {
        n -= (*iov)->iov_len;
        (*iov)++;
        (*cnt)--;
    }
    if (*cnt > 0) {
        (*iov)->iov_base = (char *)(*iov)->iov_base + n;
        (*iov)->iov_len -= n;
    }
}

int ferry_net_sendv(int fd, struct iovec *iov, int iovcnt, uint64_t deadline)
{
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    size_t cnt = iovcnt > 0 ? (size_t)iovcnt : 0;
    while (cnt > 0) {
        mh.msg_iov = iov;
        mh.msg_iovlen = cnt;
        ssize_t n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return io_error(errno, "send");
            int w = wait_fd(fd, POLLOUT, deadline);
            if (w == 0) return ferry_fail(FERRY_ERR_TIMEOUT, "send stalled: the peer stopped reading before the deadline");
            if (w < 0) return io_error(errno, "poll");
            continue;
        }
        iov_advance(&iov, &cnt, (size_t)n);
    }
    return 0;
}

int ferry_net_send(int fd, const void *buf, size_t len, uint64_t deadline)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return ferry_net_sendv(fd, &iov, 1, deadline);
}

/* Receives until *left bytes arrived at p (advancing both) or the deadline.
 * With stop_on_efault, a receive the kernel cannot write into the caller's
 * memory (EFAULT) stops early with 0, *left > 0 and the bytes still in the
 * socket; without it EFAULT is an I/O error like any other. */
static int recv_loop(int fd, char **p, size_t *left, uint64_t deadline, bool stop_on_efault)
{
    while (*left > 0) {
        ssize_t n = recv(fd, *p, *left, MSG_DONTWAIT);
        if (n > 0) {
            *p += n;
            *left -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EFAULT && stop_on_efault) return 0;
        if (n == 0) return ferry_fail(FERRY_ERR_PEER_CLOSED, "the peer closed the connection");
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return io_error(errno, "recv");
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 0) return ferry_fail(FERRY_ERR_TIMEOUT, "no answer from the peer before the deadline");
        if (w < 0) return io_error(errno, "poll");
    }
    return 0;
}

int ferry_net_recv(int fd, void *buf, size_t len, uint64_t deadline)
{
    char *p = buf;
    return recv_loop(fd, &p, &len, deadline, false);
}

int ferry_net_recv_local(int fd, void *buf, size_t len, uint64_t deadline, bool *stream_ok)
{
    char *p = buf;
    *stream_ok = false;
    size_t left = len;
    int rc = recv_loop(fd, &p, &left, deadline, true); /* EFAULT: the bytes stay in the socket */
    if (rc) return rc;
    if (left == 0) {
        *stream_ok = true;
        return 0;
    }
    /* The kernel could not write the caller's memory: the rest of the
     * answer is read and dropped, so the connection stays at a frame
     * boundary and the peer, which did nothing wrong, keeps its session. */
    char scratch[16384];
    size_t bad = len - left;
    for (size_t k; left > 0; left -= k) {
        k = left < sizeof scratch ? left : sizeof scratch;
        if (ferry_net_recv(fd, scratch, k, deadline) != 0) break;
    }
    *stream_ok = left == 0;
    return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                      "local buffer at %p (byte %zu of %zu) is registered but not writable here (a read-only or "
                      "unmapped page): the read's answer was %s",
                      (void *)((char *)buf + bad), bad, len,
                      *stream_ok ? "dropped, the connection kept" : "cut off, the connection dropped");
}

int ferry_net_recvv_local(int fd, struct iovec *iov, size_t cnt, uint64_t deadline)
{
    while (cnt > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = cnt < IOV_MAX ? cnt : IOV_MAX};
        ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT);
        if (n > 0) {
            iov_advance(&iov, &cnt, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EFAULT) {
            /* The kernel consumed nothing; the entry it stopped at may be
             * a good one before a bad one: each is received alone. */
            bool stream_ok;
            int rc = ferry_net_recv_local(fd, iov->iov_base, iov->iov_len, deadline, &stream_ok);
            if (rc && !stream_ok) return rc;
            if (rc) iov->iov_base = NULL;
            iov++;
            cnt--;
            continue;
        }
        if (n == 0) return ferry_fail(FERRY_ERR_PEER_CLOSED, "the peer closed the connection mid-answer");
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return io_error(errno, "recvmsg");
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 0) return ferry_fail(FERRY_ERR_TIMEOUT, "answer stalled: no bytes before the deadline");
        if (w < 0) return io_error(errno, "poll");
    }
    return 0;
}

void ferry_net_tune(int fd, int keepalive_ms)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int buf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    if (keepalive_ms > 0) {
        int idle = keepalive_ms / 1000 > 0 ? keepalive_ms / 1000 : 1;
        int intvl = idle, cnt = 3;
        unsigned int user_timeout = (unsigned)(keepalive_ms * 4);
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
        /* Unacknowledged data for this long kills the connection: a dead
         * peer surfaces even while we only send. */
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
    }
}

void ferry_net_abort(int fd)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}
