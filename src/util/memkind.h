/* SPDX-License-Identifier: Apache-2.0 */
/* Memory kinds: where a registered region's bytes live.
 *
 * Host memory is read and written in place by every transport. Device
 * memory (CUDA, built with FERRY_WITH_CUDA) cannot be touched by the CPU, so
 * transports that move bytes with the CPU (tcp) stage them through a host
 * buffer: device->host before sending, host->device after receiving. The
 * kind is detected once, at registration, and kept in the region
 * (ferry_region_t.kind); the data paths ask for it only when the registry
 * holds a non-host region (ferry_registry_device_count), so a process that
 * registers no device memory pays one relaxed load per slice.
 *
 * A kind value is the type in bits 0..7 and the device ordinal above. */
#ifndef FERRY_MEMKIND_H
#define FERRY_MEMKIND_H

#include <stddef.h>
#include <stdint.h>

#define FERRY_MEMKIND_HOST 0u
#define FERRY_MEMKIND_CUDA 1u
/* Tests only: "device" memory the CPU must not touch (mapped PROT_NONE),
 * whose bytes the kind's copy functions reach through a host alias. */
#define FERRY_MEMKIND_FAKE 2u

#define FERRY_MEMKIND_TYPE(k) ((k) & 0xffu)
#define FERRY_MEMKIND_DEVICE(k) ((int)((k) >> 8))
#define FERRY_MEMKIND_MAKE(type, dev) ((uint32_t)(type) | ((uint32_t)(dev) << 8))

/* The kind of [addr, addr+len), detected at registration. INVALID_ARGUMENT
 * when the range mixes kinds or devices. Without CUDA in the build (or with
 * no usable CUDA driver or device) everything not faked is host memory. */
int ferry_memkind_detect(const void *addr, size_t len, uint32_t *kind);
/* Copies n bytes from memory of kind (src) into host memory (dst). */
int ferry_memkind_to_host(uint32_t kind, void *dst, const void *src, size_t n);
/* Copies n bytes from host memory (src) into memory of kind (dst). */
int ferry_memkind_from_host(uint32_t kind, void *dst, const void *src, size_t n);
/* "host", "cuda:0", "fake:0". */
const char *ferry_memkind_name(uint32_t kind, char *buf, size_t cap);
/* One line on device-memory support in this build and process, e.g.
 * "CUDA built in (driver API ...); the CUDA driver libcuda.so.1 is not loaded
 * in this process ...". */
const char *ferry_memkind_status(void);
/* 1 when device memory is told from host memory at registration: CUDA built
 * in and a driver and device usable in this process. */
int ferry_memkind_device_usable(void);

/* ---- pinned, pipelined staging ----
 * A stream of slices of device memory leaving through host memory (a
 * sender's slices): ferry_stage_take gives slice n in a host buffer,
 * ferry_stage_prefetch starts the device->host copy of slice n+1 into the
 * other buffer while slice n is sent, and the next take waits for it. With
 * CUDA the two buffers are page-locked (cuMemAllocHost in the memory's
 * context) and the prefetch is a cuMemcpyAsync on a stream of the
 * stager's own; other kinds are copied at take. One user at a time. */
typedef struct ferry_stage ferry_stage_t;
ferry_stage_t *ferry_stage_new(void);
void ferry_stage_free(ferry_stage_t *s);
/* The n bytes at src (memory of kind) in a host buffer (*out), valid until
 * the next take on s: the prefetch of exactly that range, waited for, or a
 * copy made now. 0 or the copy's failure. */
int ferry_stage_take(ferry_stage_t *s, uint32_t kind, const void *src, size_t n, unsigned char **out);
/* Starts copying the n bytes at src into the buffer the next take gives
 * (the one the last take gave stays untouched). Best effort: a prefetch
 * that cannot start leaves the copy to the take. */
void ferry_stage_prefetch(ferry_stage_t *s, uint32_t kind, const void *src, size_t n);
/* Waits for a prefetch in flight, whose bytes are then dropped: before the
 * memory it reads may be freed (a sender's call ends). */
void ferry_stage_settle(ferry_stage_t *s);
/* Takes that found their bytes prefetched, and those that copied. */
void ferry_stage_counts(const ferry_stage_t *s, unsigned long *prefetched, unsigned long *copied);

/* ---- pinned, pipelined landing ----
 * The other direction: a stream of slices arriving in host memory for
 * device memory (a receiver's slices). ferry_land_buffer gives the host
 * buffer to receive slice n into, ferry_land_put starts its host->device
 * copy, and the next ferry_land_buffer gives the other buffer, so slice
 * n+1 is received while slice n is copied. With CUDA the buffers are
 * page-locked and each has a stream of the lander's own, so that waiting
 * for one buffer's copy does not wait for the other's; other kinds (and
 * pageable buffers) are copied at put. A copy is complete on the device
 * only once ferry_land_finish returned 0: a receiver reports its bytes
 * placed after that, and calls it (or ferry_land_settle) before the
 * destination may be released or reused (no late write). One user at a
 * time. */
typedef struct ferry_land ferry_land_t;
ferry_land_t *ferry_land_new(void);
/* Waits for the copies in flight, then frees. */
void ferry_land_free(ferry_land_t *l);
/* The host buffer (*out, room for n bytes) the next put copies from: the
 * same one until that put (a receive may fill it in several steps), then
 * the other, after waiting for the copy that last read it. 0, or the
 * failure of that copy or of the allocation. */
int ferry_land_buffer(ferry_land_t *l, uint32_t kind, size_t n, unsigned char **out);
/* Starts copying the first n bytes of the buffer the last ferry_land_buffer
 * gave into dst (memory of kind). 0 or the failure of a copy made now. */
int ferry_land_put(ferry_land_t *l, uint32_t kind, void *dst, size_t n);
/* Starts copying n bytes at offset off of the buffer being filled (the last
 * ferry_land_buffer's) into dst, and keeps that buffer given: a receiver
 * scattering one buffer to many places (asynchronous on its stream when
 * pinned, else done now), then finishes and drops it. */
int ferry_land_put_part(ferry_land_t *l, uint32_t kind, void *dst, size_t off, size_t n);
/* The other way, for a sender gathering many pieces of memory of kind
 * into the buffer being filled: n bytes from src to offset off (queued on
 * its stream when pinned, else done now); ferry_land_finish waits. */
int ferry_land_get_part(ferry_land_t *l, uint32_t kind, const void *src, size_t off, size_t n);
/* The buffer being filled, or NULL. */
unsigned char *ferry_land_current(const ferry_land_t *l);
/* Forgets the buffer being filled (its copies, if any, still run). */
void ferry_land_drop(ferry_land_t *l);
/* Waits for every copy started: 0 once all are complete on the device, or
 * the first failure among them. The buffer being filled stays given. */
int ferry_land_finish(ferry_land_t *l);
/* The same, for a receiver that gives up (its failure says why): the
 * copies' outcome is dropped, and the buffer being filled forgotten. */
void ferry_land_settle(ferry_land_t *l);
/* Copies (puts and gets) queued asynchronously, copies made at once, and
 * buffers given while the other buffer's copy was still in flight
 * (receives overlapped with a copy). */
void ferry_land_counts(const ferry_land_t *l, unsigned long *queued, unsigned long *copied, unsigned long *overlapped);

/* Process-wide totals of both stagers, for tests and statistics: takes
 * prefetched, takes copied; lands queued, copied, overlapped. */
typedef struct ferry_staging_totals {
    unsigned long take_prefetched, take_copied;
    unsigned long land_queued, land_copied, land_overlapped;
} ferry_staging_totals_t;
void ferry_staging_totals(ferry_staging_totals_t *t);

/* ---- test hooks: a fake device kind backed by host memory ----
 * [base, base+len) is declared fake device memory whose bytes live at
 * alias (a second mapping of the same pages). Registration detects it as
 * FERRY_MEMKIND_FAKE; the copy functions go through alias and count. */
int ferry_memkind_fake_add(void *base, size_t len, void *alias);
/* Forgets the fake range starting at base (before unmapping it). */
void ferry_memkind_fake_remove(void *base);
void ferry_memkind_fake_clear(void);
/* Staging copies done through fake kinds so far (to_host, from_host). */
void ferry_memkind_fake_counts(unsigned long *to_host, unsigned long *from_host);

/* cuda_memory.c, when built with FERRY_WITH_CUDA. */
#ifdef FERRY_HAVE_CUDA
int ferry_cuda_detect(const void *addr, size_t len, uint32_t *kind);
int ferry_cuda_copy(uint32_t kind, void *dst, const void *src, size_t n, int to_host);
const char *ferry_cuda_status(void);
int ferry_cuda_usable(void);
/* Pinned buffers and asynchronous copies (device->host when to_host, else
 * host->device, in the device memory's context) for the stagers. */
int ferry_cuda_host_alloc(int ordinal, size_t n, void **out, void **ctx);
void ferry_cuda_host_free(void *p, void *ctx);
/* Queues the copy on the stager's stream (*stream, made in the memory's
 * context at first use; *stream_ctx its context), or waits for it. */
int ferry_cuda_copy_async(uint32_t kind, void *dst, const void *src, size_t n, int to_host, void **stream,
                          void **stream_ctx);
int ferry_cuda_stream_wait(void *stream, void *stream_ctx);
void ferry_cuda_stream_free(void *stream, void *stream_ctx);
#endif

#endif
