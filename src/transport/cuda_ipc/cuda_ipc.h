/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the CUDA IPC transport (src/transport/cuda_ipc): its frames,
 * its HELLO capability bit, and what cuda_ipc.c (the transport) and
 * cuda_ipc_driver.c (the driver calls, the import cache, the streams)
 * share. Not for other files: the transport table knows only
 * ferry_transport_cuda_ipc (transport.h). */
#ifndef FERRY_TRANSPORT_CUDA_IPC_H
#define FERRY_TRANSPORT_CUDA_IPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "link/transport.h"

/* Frame ids 96..111 belong to this transport (its ops' frame_ranges; the
 * tests' "extra" transport has 80..95). */
#define FERRY_FRAME_CUDA_IPC_FIRST 96
#define FERRY_FRAME_CUDA_IPC_LAST 111
#define FERRY_FRAME_CUDA_IPC_WRITE 96 /* i->t: the target copies the initiator's device bytes into [addr, addr+len) */
#define FERRY_FRAME_CUDA_IPC_READ 97  /* i->t: the target copies [addr, addr+len) into the initiator's device memory */
/* Both: aux = the initiator's address of the bytes, crc = the target
 * region's generation as the initiator learned it (informative: the
 * target checks its registry as it is now); payload = struct
 * cuda_ipc_export and the deadline (CUDA_IPC_EXPORT_SIZE bytes). The
 * header's flags stay 0 (the wire layer allows F_DEADLINE on core data
 * frames only), so the deadline, converted to the target's clock as
 * FERRY_FRAME_F_DEADLINE's, travels in the payload. Answered
 * by WRITE_ACK / READ_RESP (len = the bytes; a refusal's reason as payload),
 * as the shm transport's frames. */

/* The sender serves CUDA_IPC_WRITE / CUDA_IPC_READ: its CUDA driver is
 * usable and has the IPC entry points. This transport's only HELLO bit
 * (its ops' hello_bits; shm has 0x200, the tests' extra transport the top
 * bit). */
#define FERRY_HELLO_F_CUDA_IPC 0x400u
/* The sender also imports VMM exports (CUDA_IPC_KIND_VMM): its driver has
 * the VMM entry points and its kernel headers pidfd_getfd. An initiator
 * sends VMM memory by cuda_ipc only to a target advertising it (to others
 * such pieces go by tcp); whether the kernel lets the target take the
 * descriptor is learned at the first import (refused: NOT_IMPLEMENTED). */
#define FERRY_HELLO_F_CUDA_IPC_VMM 0x800u
#define FERRY_CUDA_IPC_HELLO_BITS (FERRY_HELLO_F_CUDA_IPC | FERRY_HELLO_F_CUDA_IPC_VMM)

/* Its configuration keys (ferry_transport_key), declared in
 * cuda_ipc_driver.c: FERRY_CUDA_IPC (a flag, default 1; 0: this process
 * neither offers nor chooses the transport). */
enum { CUDA_IPC_KEY_ENABLE, CUDA_IPC_NKEYS };
extern const ferry_transport_key_t cuda_ipc_keys[CUDA_IPC_NKEYS];

/* The initiator's allocation holding the bytes, as its driver exported it:
 * the handle (64 bytes), the allocation's base and size in the initiator's
 * address space, its device ordinal there and the export's kind; 88 bytes
 * on the wire (little-endian): handle, base, size, then one 32-bit word
 * with the device in its low 24 bits and the kind in bits 24..30 (0, the
 * legacy kind, is what peers before VMM sent: their exports read as
 * before), the last 4 the frame's deadline in the target's
 * CLOCK_MONOTONIC milliseconds mod 2^32 (0: none).
 *
 * CUDA_IPC_KIND_LEGACY: handle = cuIpcGetMemHandle's 64 bytes.
 * CUDA_IPC_KIND_VMM (cuMemCreate memory mapped with cuMemMap; sent only
 * to targets advertising FERRY_HELLO_F_CUDA_IPC_VMM): handle = struct
 * cuda_ipc_vmm (cuda_ipc_vmm_pack): the exporter's pid and the number of
 * the descriptor cuMemExportToShareableHandle gave it (open in the
 * exporter while the export is cached, closed only when no frame naming
 * it is in flight), the descriptor's inode (the target checks the
 * descriptor it took is that file), and the exporter's region (address
 * and generation) holding the memory; base and size are the mapping's
 * (cuMemGetAddressRange). The target keys its import by all of it but the
 * descriptor's number: the same allocation exported on two connections is
 * one import, and memory of a region registered again is another. */
#define CUDA_IPC_EXPORT_SIZE 88
enum { CUDA_IPC_KIND_LEGACY = 0, CUDA_IPC_KIND_VMM = 1 };
struct cuda_ipc_export {
    uint8_t handle[64];
    uint64_t base, size;
    int32_t device;
    uint32_t kind;
};
struct cuda_ipc_vmm {
    int32_t pid, fd;
    uint64_t ino, region;
    uint32_t generation;
};
void cuda_ipc_vmm_pack(const struct cuda_ipc_vmm *v, uint8_t handle[64]);
void cuda_ipc_vmm_unpack(const uint8_t handle[64], struct cuda_ipc_vmm *v);
void cuda_ipc_export_encode(const struct cuda_ipc_export *x, uint32_t deadline_ms, uint8_t out[CUDA_IPC_EXPORT_SIZE]);
/* MALFORMED_FRAME when the allocation is empty or wraps, the device word's
 * top bit is set, or the kind is unknown. */
int cuda_ipc_export_decode(const uint8_t in[CUDA_IPC_EXPORT_SIZE], struct cuda_ipc_export *x, uint32_t *deadline_ms);

/* ------------------------------------------- cuda_ipc_driver.c */

/* Why this process cannot use CUDA IPC (NULL: it can): the driver is not
 * usable, or lacks an IPC or stream entry point, or FERRY_CUDA_IPC=0. */
const char *cuda_ipc_unusable(void);

/* Per-connection state, both sides: the initiator's exports (by region
 * and generation: a region registered again is exported again) and, at
 * the target, one stream per device and the imports this connection
 * opened (closed with it). */
struct cuda_ipc_conn;
struct cuda_ipc_conn *cuda_ipc_conn_get(ferry_conn_t *c);

/* Whether this process can import VMM exports (FERRY_HELLO_F_CUDA_IPC_VMM). */
bool cuda_ipc_vmm_importable(void);

/* Initiator: the export of the allocation holding [p, p+len), device
 * memory of the region (addr, generation): cached per connection. VMM
 * memory is exported only when peer_vmm (the target advertised
 * FERRY_HELLO_F_CUDA_IPC_VMM). 0, or a Ferry code with its detail (the
 * range is not in one allocation, the driver refused, VMM memory the
 * peer cannot import or not created shareable as a descriptor). */
int cuda_ipc_export_of(struct cuda_ipc_conn *ic, uint64_t region, uint32_t generation, const void *p, uint64_t len,
                       int ordinal, bool peer_vmm, struct cuda_ipc_export *out);

/* Initiator, when no frame of this connection is in flight (the end of a
 * run): closes the descriptors of VMM exports dropped from the cache
 * since (closing one earlier could let its number name another file by
 * the time the target takes it). */
void cuda_ipc_run_end(struct cuda_ipc_conn *ic);

/* Target: copies n bytes between the initiator's allocation x (at offset
 * off from its base) and local memory here (device memory of kind, or host
 * memory), on this connection's stream for the local device, and waits
 * for the copy to be done. to_local: initiator -> here (a write). Opens
 * and caches the import of x. Returns 0 or a Ferry code with its detail;
 * NOT_IMPLEMENTED when the handle cannot be opened in this process (then
 * the initiator moves to tcp). */
int cuda_ipc_copy(struct cuda_ipc_conn *ic, ferry_conn_t *c, const struct cuda_ipc_export *x, uint64_t off,
                  void *local, uint32_t kind, size_t n, bool to_local);

/* Tests: imports open in this process now, and imports opened so far. */
void ferry_cuda_ipc_counts(unsigned long *open_now, unsigned long *opened);
/* Tests: a nonzero errno makes this process's pidfd_getfd fail with it, as
 * the kernel does for a target without ptrace permission over the
 * exporter (the tests run as a user the kernel would let through). */
void ferry_cuda_ipc_testing_refuse_getfd(int err);

#endif
