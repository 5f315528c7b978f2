/* SPDX-License-Identifier: Apache-2.0 */
/* The few CUDA driver API declarations Ferry uses, written out here instead
 * of including <cuda.h>.
 *
 * Why: cuda.h comes only with the whole CUDA toolkit (Debian has no package
 * with the header alone), and Ferry needs nothing else from it: libcuda is
 * dlopen()ed at run time (cuda_memory.c), so no CUDA library is linked
 * and every build can carry CUDA support. The driver API is a stable C ABI:
 * these names, values and signatures are those of cuda.h since CUDA 9.2
 * (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) and have not changed since. Where a
 * cuda.h is at hand, tests/test_cuda.c checks every value below against it
 * at compile time (test_cuda_header_matches). The stub driver of the tests
 * (tests/cuda_stub.c) implements them over host memory. */
#ifndef FERRY_CUDA_DRIVER_H
#define FERRY_CUDA_DRIVER_H

#include <stddef.h>

typedef int FERRY_CUresult;
typedef int FERRY_CUdevice;
typedef struct CUctx_st *FERRY_CUcontext;
typedef unsigned long long FERRY_CUdeviceptr; /* 64-bit builds only, as cuda.h's CUdeviceptr_v2 there */

/* CUresult values (cuda.h enum cudaError_enum). */
#define FERRY_CUDA_SUCCESS 0
#define FERRY_CUDA_ERROR_INVALID_VALUE 1
#define FERRY_CUDA_ERROR_OUT_OF_MEMORY 2
#define FERRY_CUDA_ERROR_NOT_INITIALIZED 3
#define FERRY_CUDA_ERROR_DEINITIALIZED 4
#define FERRY_CUDA_ERROR_STUB_LIBRARY 34
#define FERRY_CUDA_ERROR_NO_DEVICE 100
#define FERRY_CUDA_ERROR_INVALID_DEVICE 101
#define FERRY_CUDA_ERROR_INVALID_CONTEXT 201
#define FERRY_CUDA_ERROR_ILLEGAL_ADDRESS 700
#define FERRY_CUDA_ERROR_SYSTEM_DRIVER_MISMATCH 803

/* CUpointer_attribute values. */
#define FERRY_CU_POINTER_ATTRIBUTE_CONTEXT 1
#define FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define FERRY_CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define FERRY_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9

/* CUmemorytype values. */
#define FERRY_CU_MEMORYTYPE_HOST 1
#define FERRY_CU_MEMORYTYPE_DEVICE 2
#define FERRY_CU_MEMORYTYPE_ARRAY 3
#define FERRY_CU_MEMORYTYPE_UNIFIED 4

/* The entry points, by the symbol names libcuda.so.1 exports (cuda.h maps
 * cuMemcpyDtoH to cuMemcpyDtoH_v2 and so on). Enum parameters are passed as
 * int: a C enum with these values has int's size and calling convention. */
typedef FERRY_CUresult (*ferry_cuInit_fn)(unsigned int flags);
typedef FERRY_CUresult (*ferry_cuDriverGetVersion_fn)(int *version);
typedef FERRY_CUresult (*ferry_cuDeviceGetCount_fn)(int *count);
typedef FERRY_CUresult (*ferry_cuDeviceGet_fn)(FERRY_CUdevice *dev, int ordinal);
typedef FERRY_CUresult (*ferry_cuGetErrorName_fn)(FERRY_CUresult err, const char **name);
typedef FERRY_CUresult (*ferry_cuGetErrorString_fn)(FERRY_CUresult err, const char **text);
typedef FERRY_CUresult (*ferry_cuPointerGetAttributes_fn)(unsigned int n, int *attributes, void **data,
                                                          FERRY_CUdeviceptr ptr);
typedef FERRY_CUresult (*ferry_cuDevicePrimaryCtxRetain_fn)(FERRY_CUcontext *ctx, FERRY_CUdevice dev);
typedef FERRY_CUresult (*ferry_cuDevicePrimaryCtxRelease_fn)(FERRY_CUdevice dev); /* _v2 */
typedef FERRY_CUresult (*ferry_cuCtxPushCurrent_fn)(FERRY_CUcontext ctx);         /* _v2 */
typedef FERRY_CUresult (*ferry_cuCtxPopCurrent_fn)(FERRY_CUcontext *ctx);         /* _v2 */
typedef FERRY_CUresult (*ferry_cuMemcpyDtoH_fn)(void *dst, FERRY_CUdeviceptr src, size_t n);       /* _v2 */
typedef FERRY_CUresult (*ferry_cuMemcpyHtoD_fn)(FERRY_CUdeviceptr dst, const void *src, size_t n); /* _v2 */
typedef FERRY_CUresult (*ferry_cuStreamSynchronize_fn)(void *stream); /* CUstream; NULL: the legacy stream */

#endif
