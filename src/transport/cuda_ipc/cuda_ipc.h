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
#define FERRY_CUDA_IPC_HELLO_BITS FERRY_HELLO_F_CUDA_IPC

/* Its configuration keys (ferry_transport_key), declared in
 * cuda_ipc_driver.c: FERRY_CUDA_IPC (a flag, default 1; 0: this process
 * neither offers nor chooses the transport). */
enum { CUDA_IPC_KEY_ENABLE, CUDA_IPC_NKEYS };
extern const ferry_transport_key_t cuda_ipc_keys[CUDA_IPC_NKEYS];

/* The initiator's allocation holding the bytes, as its driver exported it:
 * the IPC handle (64 bytes), the allocation's base and size in the
 * initiator's address space, its device ordinal there; 88 bytes on the
 * wire (little-endian), the last 4 the frame's deadline in the target's
 * CLOCK_MONOTONIC milliseconds mod 2^32 (0: none). */
#define CUDA_IPC_EXPORT_SIZE 88
struct cuda_ipc_export {
    uint8_t handle[64];
    uint64_t base, size;
    int32_t device;
};
void cuda_ipc_export_encode(const struct cuda_ipc_export *x, uint32_t deadline_ms, uint8_t out[CUDA_IPC_EXPORT_SIZE]);
/* MALFORMED_FRAME when the allocation is empty or wraps, or the device is
 * negative. */
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

/* Initiator: the export of the allocation holding [p, p+len), device
 * memory of the region (addr, generation): cached per connection. 0, or a
 * Ferry code with its detail (the range is not in one allocation, the
 * driver refused). */
int cuda_ipc_export_of(struct cuda_ipc_conn *ic, uint64_t region, uint32_t generation, const void *p, uint64_t len,
                       int ordinal, struct cuda_ipc_export *out);

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

#endif
