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
#endif

#endif
