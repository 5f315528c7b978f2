/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA memory kind's decisions, apart from the driver calls so that the
 * tests check them with any input (built with FERRY_WITH_CUDA only). */
#ifndef FERRY_CUDA_OPT_CUDA_H
#define FERRY_CUDA_OPT_CUDA_H

#include <stdint.h>

/* From cuPointerGetAttributes' result (err: its CUresult; type, managed and
 * device: CU_POINTER_ATTRIBUTE_MEMORY_TYPE, _IS_MANAGED, _DEVICE_ORDINAL):
 * the memory kind. Errors and every CPU-accessible type give host memory. */
int ferry_cuda_classify(int err, int type, int managed, int device, uint32_t *kind);
/* The Ferry code for a CUresult. */
int ferry_cuda_error_code(int err);
/* Tests: forget the driver (usable or not), so that the next registration
 * looks for it again, e.g. after FERRY_CUDA_DRIVER changed. The symbols of
 * a driver in use are dropped: call it with no device region registered. */
void ferry_cuda_forget_driver(void);
/* Tests: how many times this process asked the loader for the driver by
 * name (dlopen with RTLD_NOLOAD, which searches the disk when the name is
 * not loaded). It asks only when the loader's objects changed and one of
 * them may be the driver. */
unsigned long ferry_cuda_driver_probes(void);

/* For the parts that call the driver themselves (src/transport/cuda_ipc):
 * an entry point of the usable driver by its exported name (e.g.
 * "cuIpcOpenMemHandle_v2"), or NULL when the driver is not usable in this
 * process or lacks it. */
void *ferry_cuda_symbol(const char *name);
/* Pushes on this thread the context that device memory at device_ptr
 * belongs to (its device's primary context, retained, when it has none:
 * *primary is then that device, else -1): a CUresult. Every success is
 * followed by ferry_cuda_context_leave(*primary). */
int ferry_cuda_context_enter(const void *device_ptr, int ordinal, int *primary);
void ferry_cuda_context_leave(int primary);
/* "CUDA_ERROR_X (the driver's words)" for a CUresult, in buf. */
const char *ferry_cuda_error_text(int err, char *buf, size_t cap);

#endif
