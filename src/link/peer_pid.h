/* SPDX-License-Identifier: Apache-2.0 */
/* Same-host peers (peer_pid.c): whether a target's connection comes from
 * the process its HELLO claims. Not a public header. */
#ifndef FERRY_LINK_PEER_PID_H
#define FERRY_LINK_PEER_PID_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

struct ferry_conn;

/* Addresses in one form: IPv6, with IPv4 as ::ffff:a.b.c.d. */
struct ferry_addr6 {
    uint8_t a[16];
    uint16_t port;
};

/* 0, or -1 for a family other than IPv4/IPv6. */
int ferry_addr6_of(const struct sockaddr_storage *ss, struct ferry_addr6 *out);
/* Whether x is loopback or one of this host's interfaces' addresses. */
bool ferry_addr6_is_local(const struct ferry_addr6 *x);
/* The inode of the TCP socket local -> remote in this network namespace
 * (sock_diag; /proc/net/tcp{,6} where netlink is unavailable, or only
 * there with proc_only), its owner's uid in *uid; 0 if not found. */
unsigned long ferry_socket_inode(const struct ferry_addr6 *local, const struct ferry_addr6 *remote, bool proc_only,
                                 uid_t *uid);
/* 1 if pid holds socket:[inode] among its fds, 0 if not, -errno if its
 * fd table cannot be read. */
int ferry_pid_owns_socket(pid_t pid, unsigned long inode);
/* pidfd_open(pid) (-1 with errno ENOSYS where the headers lack it). */
int ferry_pidfd_open(pid_t pid);
/* Whether the process behind pidfd has exited (its pid may be reused). */
bool ferry_pidfd_exited(int pidfd);
/* The whole check for connection c (target side): the initiator is on
 * this host (boot id), the connection never left it, and the pid its HELLO
 * claims holds the connection's socket and runs as its user. 0 with
 * *pidfd open on that process (the caller closes it; -1 where pidfd_open
 * is unavailable), or -1 with why filled. proc_only: look in /proc only. */
int ferry_peer_verify_pid(struct ferry_conn *c, bool proc_only, int *pidfd, char *why, size_t cap);

#endif
