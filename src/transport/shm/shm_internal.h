/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the shared-memory transport: what shm.c (the transport and
 * its copies), shm_trust.c (verifying the same-host peer) and shm_pool.c
 * (shared-pool mappings) share. Not for other files. */
#ifndef FERRY_TRANSPORT_SHM_INTERNAL_H
#define FERRY_TRANSPORT_SHM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "link/peer_pid.h"
#include "link/transport.h"
#include "shm_wire.h"

/* Bytes per frame: large, since no socket buffer sits in between; one
 * frame is one serving-thread turn at the target. */
#define SHM_SLICE (16u << 20)
/* Bytes copied per registry read-lock hold at the target: bounds how long
 * a deregistration or cancel waits (well under a millisecond). */
#define SHM_CHUNK (4u << 20)

/* A gathered copy whose entries on the initiator's side average under this
 * many bytes costs more in the kernel's page walk than in the copy: per
 * entry it takes the initiator's mmap lock, walks and pins its pages under
 * their page-table lock and unpins them. Two connection threads doing that
 * at once against one initiator contend on those locks (a call of 1,024 x
 * 2 KiB split over 2 connections: 16% of all samples in up_read, 14% in
 * the page-table spinlock; 1.4x slower than one connection), so such
 * copies from one initiator take turns (small_copy_lock). Larger entries
 * copy in parallel: there the copy dominates and two threads gain. An
 * initiator whose calls are such pieces runs them unsplit (shm_run's
 * verdict: small_serial). */
#define SHM_SMALL_ENTRY (64u << 10)
/* Frames of fewer bytes copy in the serving thread alone: waking the copy
 * helper (shm_helper.c) would cost about what its share saves. */
#define SHM_SHARE_MIN (1u << 20)
/* The span of initiator memory one page-table page maps (x86-64, 4 KiB
 * pages: 512 entries): a frame whose initiator side lies within one is
 * copied by one thread (shm_vec.c, halves_apart). */
#define SHM_PT_SPAN (2u << 20)

struct shm_conn {
    int state;          /* 0 unchecked, 1 verified, -1 refused */
    pid_t pid;
    int pidfd;          /* the verified initiator, -1 if pidfd_open is missing */
    char reason[200];   /* why refused */
    uint32_t passed_gen; /* the region (generation) whose memfds were last passed, 0 none */
    uint32_t *order;    /* a vector frame's pieces by the initiator's address (shm_vec.c), made at first use */
};

/* shm_trust.c */
void shm_conn_free(void *p);
void shm_verify_peer(ferry_conn_t *c, struct shm_conn *sc, uint64_t probe);
/* Target: the connection's trust record in *out, made and decided at first
 * use (probe: an address the initiator named as its own), marked refused
 * once the verified initiator has exited. 0; MEMORY; MALFORMED_FRAME when
 * the connection holds another transport's state (its frames came first:
 * no honest initiator mixes them), which closes the connection. */
int shm_trusted_conn(ferry_conn_t *c, uint64_t probe, struct shm_conn **out);

/* shm.c */
/* Moves n bytes between the initiator (theirs) and here (mine) once: the
 * count moved, or -errno. */
ssize_t shm_cma_once(pid_t pid, bool write, void *mine, uint64_t theirs, size_t n);
/* A failed process_vm_* errno as the answer's status (refusal recorded in sc). */
int shm_cma_error(struct shm_conn *sc, const ferry_frame_t *f, bool write, uint64_t done, size_t n, int err);
/* Copies frame f's range chunk by chunk under the registry's read lock: its status. */
int shm_copy_chunks(ferry_conn_t *c, struct shm_conn *sc, const ferry_frame_t *f, bool write);

/* shm_vec.c (the registry, counters and slice size come from shm.c) */
bool shm_vec_eligible(ferry_conn_t *c, const ferry_xfer_t *x, size_t slice);
size_t shm_vec_collect(ferry_conn_t *c, ferry_xfer_t *xs, size_t n, size_t slice);
int shm_serve_vec(ferry_conn_t *c, const ferry_frame_t *f, ferry_registry_t *r, ferry_counters_t *counters);

/* shm_helper.c: the target's copy helper, a second thread per engine.
 * Runs work(arg, 0) in this thread and offers work(arg, 1) to the helper,
 * which takes it if it is idle and wakes in time; returns once both are
 * done (true when the helper took its share). */
bool shm_helper_share(ferry_xport_ctx_t *ctx, void (*work)(void *arg, int side), void *arg);
/* Stops the engine's helper (the transport's engine_fini). */
void shm_helper_fini(ferry_xport_ctx_t *ctx);

/* shm_pool.c */
int shm_serve_map(ferry_conn_t *c, struct shm_conn *sc, const ferry_frame_t *f, uint64_t deadline);
/* Copies what it can of the pieces through shared-pool mappings, settling
 * them with the target; *whole: every piece went so, whole. */
int shm_map_pass(ferry_conn_t *c, ferry_xfer_t *xs, size_t nx, int *broken, bool *whole);

/* The configuration keys (shm_keys.c). */
enum { SHM_KEY_DISABLE, SHM_KEY_NOMAP, SHM_KEY_CONFIRM, SHM_KEY_PROC_LOOKUP, SHM_NKEYS };
extern const ferry_transport_key_t shm_keys[SHM_NKEYS];
/* Whether flag key `key` is set (FERRY_SHM_PROC_LOOKUP: to exactly "1"). */
bool shm_key_set(int key);

#endif
