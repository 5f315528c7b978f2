/* SPDX-License-Identifier: Apache-2.0 */
/* Blocking socket I/O with deadlines. Every call ends by its deadline. */
#ifndef FERRY_NET_H
#define FERRY_NET_H

#include <stdbool.h>
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
/* As ferry_net_recv, into the caller's registered memory (a READ's
 * answer): where the kernel cannot write buf (EFAULT: a read-only or
 * unmapped page) the rest of the len bytes are read and dropped, and the
 * call fails INVALID_ARGUMENT naming the local address: the caller's
 * error, not the peer's, so not retried. *stream_ok: true on success, or
 * when the failure left the stream at a frame boundary (the connection
 * stays usable); false when it must be dropped. */
int ferry_net_recv_local(int fd, void *buf, size_t len, uint64_t deadline, bool *stream_ok);
/* Receives exactly the bytes of iov[0..cnt) into the caller's registered
 * memory (a READV's answer), a socketful (up to IOV_MAX entries) a recvmsg,
 * advancing iov's entries as bytes land. An entry the kernel cannot write
 * (EFAULT: a read-only or unmapped page) has its bytes read and dropped
 * (ferry_net_recv_local) and its iov_base set to NULL, the mark its caller
 * fails it by; the others are received. Fails (PEER_CLOSED, SOCKET,
 * TIMEOUT) only when the stream is lost. */
int ferry_net_recvv_local(int fd, struct iovec *iov, size_t cnt, uint64_t deadline);
/* Waits until fd is readable (1), deadline passed (0), or error (<0). */
int ferry_net_wait_readable(int fd, uint64_t deadline);
/* Polls fd without sleeping for up to spin_us microseconds: 1 as soon as it
 * is readable, 0 when the time is up (config.spin_us: a core for latency). */
int ferry_net_spin_readable(int fd, unsigned spin_us);
/* Sleeps until fd is readable or nap_us have passed (microsecond
 * resolution, the thread's timer slack at 1 ns meanwhile); 1 if readable,
 * else 0. */
int ferry_net_nap_readable(int fd, unsigned nap_us);
/* Busy-polls recv for up to spin_us microseconds, reading at most len bytes
 * into buf; *got says how many came (maybe 0, maybe fewer than len). 0, or
 * PEER_CLOSED / SOCKET. For answers due within microseconds: a cross-CPU
 * wake-up from a blocking poll costs tens of microseconds on small machines
 * and VMs, more than a loopback round trip. */
int ferry_net_recv_spin(int fd, void *buf, size_t len, unsigned spin_us, size_t *got);
/* Sets TCP_NODELAY, buffer sizes and keepalive (idle_ms 0 = off). */
void ferry_net_tune(int fd, int keepalive_ms);
/* Closes with an RST, so that the peer drops what it has not read. */
void ferry_net_abort(int fd);

#endif
