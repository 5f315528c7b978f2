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

#endif
