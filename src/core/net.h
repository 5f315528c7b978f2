/* Blocking socket I/O with deadlines. Every call ends by its deadline. */
#ifndef FERRY_NET_H
#define FERRY_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* Splits "host:port" (IPv6 as "[::1]:port"). INVALID_ARGUMENT on bad form. */
int ferry_parse_hostport(const char *name, char *host, size_t hostlen, uint16_t *port);
/* Listens on host:port (0 = pick); returns fd and the bound port. */
int ferry_net_listen(const char *host, uint16_t port, int *fd_out, uint16_t *port_out);
/* Connects within the deadline: DNS, SOCKET (refused), TIMEOUT. */
int ferry_net_connect(const char *host, uint16_t port, uint64_t deadline, int *fd_out);
/* Sends the whole iovec or fails: PEER_CLOSED, SOCKET, TIMEOUT. */
int ferry_net_sendv(int fd, struct iovec *iov, int iovcnt, uint64_t deadline);
int ferry_net_send(int fd, const void *buf, size_t len, uint64_t deadline);
/* Receives exactly len bytes or fails: PEER_CLOSED, SOCKET, TIMEOUT. */
int ferry_net_recv(int fd, void *buf, size_t len, uint64_t deadline);
/* Waits until fd is readable (1), deadline passed (0), or error (<0). */
int ferry_net_wait_readable(int fd, uint64_t deadline);
/* Polls fd without sleeping for up to spin_us microseconds: 1 as soon as it
 * is readable, 0 when the time is up (config.spin_us: a core for latency). */
int ferry_net_spin_readable(int fd, unsigned spin_us);
/* Sets TCP_NODELAY, buffer sizes and keepalive (idle_ms 0 = off). */
void ferry_net_tune(int fd, int keepalive_ms);
/* Closes with an RST, so that the peer drops what it has not read. */
void ferry_net_abort(int fd);

#endif
