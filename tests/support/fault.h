/* SPDX-License-Identifier: Apache-2.0 */
/* Fault-injection helpers for Ferry's tests: target engines in child
 * processes (to kill, stop, restart, or run in a network namespace), a TCP
 * proxy that delays, stalls, cuts and corrupts, and thread counting. */
#ifndef FERRY_TEST_FAULT_H
#define FERRY_TEST_FAULT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* ------------------------------------------------ peer processes */

typedef struct peer_proc {
    pid_t pid;
    FILE *in, *out;     /* its stdin (commands) and stdout (answers) */
    uint16_t port;
    uint64_t addr, len; /* its registered buffer */
    uint64_t epoch;
    char name[64];      /* "host:port" */
} peer_proc_t;

/* Starts tests/ferry_test_peer with args (NULL-terminated), inside network
 * namespace netns unless NULL, and waits for READY. 0 or -1. host names
 * the address the peer listens on (for name). */
int peer_spawn(peer_proc_t *p, const char *netns, const char *host, const char *const *args);
/* Sends one command line; 0 when answered OK, 1 when BAD, -1 when the peer is gone. */
int peer_cmd(peer_proc_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like peer_cmd, and returns the number after "OK" (or -1). */
long peer_query(peer_proc_t *p, const char *cmd);
/* Sends sig (0: ask it to quit), waits for it to end, closes its pipes. */
void peer_end(peer_proc_t *p, int sig);

/* ------------------------------------------------------ proxy */

typedef struct proxy proxy_t;

typedef struct proxy_opts {
    int delay_ms;           /* sleep before forwarding each chunk, both ways */
    int corrupt_writes;     /* flip a payload byte in this many WRITE frames (-1: every one) */
    int corrupt_reads;      /* ... in this many READ_RESP frames */
    int cut_writes;         /* cut the connection at this many WRITE frames (-1: every one) */
    double cut_prob;        /* chance per forwarded chunk to cut the connection */
    double corrupt_prob;    /* chance per WRITE / READ_RESP frame to corrupt it */
    uint64_t seed;
    /* Frame faults, counted over all connections from 1 (0: none). The
     * drop_answer-th write answer (WRITE_ACK, or a WRITEV's VEC_ACK: one whose
     * payload is smaller than the bytes it reports placed) is not forwarded and its connection is cut right after: a lost
     * answer on a link that then broke. The dup_write-th write frame (WRITE,
     * WRITEV) is forwarded twice in a row: a duplicating relay. The
     * dup_answer-th answer (READ_RESP, WRITE_ACK, VEC_ACK, NOTIFY_ACK) is
     * forwarded twice in a row. */
    int drop_answer;
    int dup_write;
    /* Nonzero: dup_write counts frames of this type instead (e.g. a
     * transport's own request frame, such as CUDA_IPC_READ). */
    uint8_t dup_type;
    /* The same for notifications: the drop_notify_answer-th NOTIFY_ACK is
     * lost with its link, the dup_notify-th NOTIFY is forwarded twice. */
    int drop_notify_answer;
    int dup_notify;
    int dup_answer;
} proxy_opts_t;

/* Listens on 127.0.0.1 (any port) and forwards to host:port. */
proxy_t *proxy_start(const char *host, uint16_t port, const proxy_opts_t *o);
const char *proxy_name(const proxy_t *p);
/* While stalled, nothing is forwarded and connections stay open. */
void proxy_stall(proxy_t *p, bool on);
/* Holds (on) or releases the connections that exist now; new ones flow.
 * Held data is forwarded on release even if the sender has gone: a router
 * delivering stale packets late. */
void proxy_hold(proxy_t *p, bool on);
/* Cuts every proxied connection now. */
void proxy_cut_all(proxy_t *p);
/* Frames corrupted and connections cut so far. */
uint64_t proxy_corrupted(const proxy_t *p);
uint64_t proxy_cuts(const proxy_t *p);
/* Write answers dropped and write frames duplicated so far. */
uint64_t proxy_dropped(const proxy_t *p);
uint64_t proxy_duplicated(const proxy_t *p);
void proxy_stop(proxy_t *p);

/* ------------------------------------------------------ misc */

/* Threads of this process. */
int thread_count(void);
/* Threads of this process at rest, once a sanitizer's helper threads (TSan
 * starts one at the first pthread_create) exist. */
int thread_baseline(void);
/* Waits up to ms for thread_count() to drop to at most n; returns the count. */
int wait_thread_count(int n, int ms);
/* Runs a shell command; its exit status (or -1). Output goes to stderr. */
int run_cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

/* ------------------------------------------- raw peers (rogue clients) */

#include "wire/wire.h"

/* A plain TCP connection to 127.0.0.1:port (or -1). */
int raw_connect(uint16_t port);
/* Sends a frame: header f, then plen bytes of payload. 0 or -1. */
int raw_send(int fd, const ferry_frame_t *f, const void *payload);
/* Sends n raw bytes. */
int raw_send_bytes(int fd, const void *p, size_t n);
/* Receives a frame within ms and up to cap payload bytes (the rest is
 * dropped). 0, -1 on EOF/reset, -2 on timeout, -3 on an undecodable header. */
int raw_recv(int fd, ferry_frame_t *f, void *payload, size_t cap, int ms);
/* For tests that expect the exchange to work. raw_send_frame: raw_send of a
 * frame built inline; raw_recv_frame: raw_recv within 30 s, the payload kept
 * in payload (cap bytes; the rest dropped): the frame, or type 0 when the
 * peer closed (EOF or reset) first. A failed send, a timeout or an
 * undecodable header ends the test (abort, with a message). */
void raw_send_frame(int fd, ferry_frame_t f, const void *payload);
ferry_frame_t raw_recv_frame(int fd, void *payload, size_t cap);
/* A raw initiator: a TCP connection to 127.0.0.1:port that said HELLO as
 * engine engine_id (epoch 1, name "raw-<id>"): the fd, and the target's
 * answer in *ack (type 0 when it closed instead), its payload in ackbuf
 * (cap bytes; NULL: dropped). A failed connect or send, or no answer within
 * 30 s, ends the test (abort, with a message). */
int raw_hello_as(uint16_t port, uint64_t engine_id, ferry_frame_t *ack, void *ackbuf, size_t cap);
/* The same with a HELLO of the caller's making (e.g. an engine's, with a
 * field lied about). */
int raw_hello_with(uint16_t port, const ferry_hello_t *h, ferry_frame_t *ack, void *ackbuf, size_t cap);
/* True when the peer closed (EOF or reset) within ms. */
bool raw_closed_within(int fd, int ms);
/* Sends a HELLO (flags, nonce) and receives HELLO_ACK: 0 and its status in
 * *status; the encoded payloads in hello/ack (FERRY_HELLO_FIXED_SIZE +
 * FERRY_WIRE_MAX_NAME bytes each) for auth MACs. */
int raw_hello(int fd, uint32_t flags, const uint8_t *nonce, uint8_t *hello, size_t *hlen, uint8_t *ack,
              size_t *alen, int *status);
/* raw_connect and a plain HELLO (no auth) that the target accepted: the fd,
 * or -1 (closed) when either failed. */
int raw_handshaken(uint16_t port);
/* raw_connect and raw_handshaken from source address 127.0.0.<last> (a
 * peer of its own for per-address limits), or -1. */
int raw_connect_from(int last, uint16_t port);
int raw_handshaken_from(int last, uint16_t port);
