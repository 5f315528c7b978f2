/* The CUDA memory kind's decisions, apart from the CUDA calls so that the
 * tests check them with any input (built with FERRY_WITH_CUDA only). */
#ifndef FERRY_CUDA_OPT_CUDA_H
#define FERRY_CUDA_OPT_CUDA_H

#include <stdint.h>

/* From cudaPointerGetAttributes' result (err: its cudaError_t; type and
 * device: the attributes' fields): the memory kind. Errors and every
 * CPU-accessible type give host memory. */
int ferry_cuda_classify(int err, int type, int device, uint32_t *kind);
/* The Ferry code for a cudaError_t. */
int ferry_cuda_error_code(int err);

#endif
