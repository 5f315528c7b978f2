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
typedef struct CUstream_st *FERRY_CUstream;

/* CUipcMemHandle: 64 opaque bytes, passed by value to cuIpcOpenMemHandle. */
#define FERRY_CU_IPC_HANDLE_SIZE 64
typedef struct FERRY_CUipcMemHandle {
    char reserved[FERRY_CU_IPC_HANDLE_SIZE];
} FERRY_CUipcMemHandle;
#define FERRY_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define FERRY_CU_STREAM_NON_BLOCKING 0x1
#define FERRY_CU_MEMHOSTREGISTER_PORTABLE 0x1

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
#define FERRY_CUDA_ERROR_MAP_FAILED 205
#define FERRY_CUDA_ERROR_ALREADY_MAPPED 208
#define FERRY_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED 217
#define FERRY_CUDA_ERROR_INVALID_HANDLE 400
#define FERRY_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define FERRY_CUDA_ERROR_NOT_SUPPORTED 801
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

/* Same-host device-to-device (src/transport/cuda_ipc) and pinned staging:
 * resolved when used, by the names below, so that a driver without them
 * still serves the staging copies above. */
typedef FERRY_CUresult (*ferry_cuMemGetAddressRange_fn)(FERRY_CUdeviceptr *base, size_t *size,
                                                        FERRY_CUdeviceptr p);                  /* _v2 */
typedef FERRY_CUresult (*ferry_cuIpcGetMemHandle_fn)(FERRY_CUipcMemHandle *handle, FERRY_CUdeviceptr p);
typedef FERRY_CUresult (*ferry_cuIpcOpenMemHandle_fn)(FERRY_CUdeviceptr *p, FERRY_CUipcMemHandle handle,
                                                      unsigned int flags);                     /* _v2 */
typedef FERRY_CUresult (*ferry_cuIpcCloseMemHandle_fn)(FERRY_CUdeviceptr p);
typedef FERRY_CUresult (*ferry_cuCtxGetCurrent_fn)(FERRY_CUcontext *ctx);
typedef FERRY_CUresult (*ferry_cuStreamCreate_fn)(FERRY_CUstream *stream, unsigned int flags);
typedef FERRY_CUresult (*ferry_cuStreamDestroy_fn)(FERRY_CUstream stream);                     /* _v2 */
typedef FERRY_CUresult (*ferry_cuStreamQuery_fn)(FERRY_CUstream stream);
/* Any two addresses under unified addressing (device, pinned or pageable host). */
typedef FERRY_CUresult (*ferry_cuMemcpyAsync_fn)(FERRY_CUdeviceptr dst, FERRY_CUdeviceptr src, size_t n,
                                                 FERRY_CUstream stream);
typedef FERRY_CUresult (*ferry_cuMemHostRegister_fn)(void *p, size_t n, unsigned int flags); /* _v2 */
typedef FERRY_CUresult (*ferry_cuMemHostUnregister_fn)(void *p);
typedef FERRY_CUresult (*ferry_cuMemAllocHost_fn)(void **p, size_t n);                       /* _v2 */
typedef FERRY_CUresult (*ferry_cuMemFreeHost_fn)(void *p);

/* Virtual memory management (cuMemCreate / cuMemMap, CUDA 10.2; PyTorch's
 * expandable segments): optional, resolved when used (a driver without
 * them: no VMM export or import, legacy IPC as before). The structs are
 * cuda.h's CUmemLocation, CUmemAllocationProp_v1 and CUmemAccessDesc. */
typedef unsigned long long FERRY_CUmemGenericAllocationHandle;
#define FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define FERRY_CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define FERRY_CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define FERRY_CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
typedef struct FERRY_CUmemLocation {
    int type; /* CUmemLocationType */
    int id;   /* the device ordinal for FERRY_CU_MEM_LOCATION_TYPE_DEVICE */
} FERRY_CUmemLocation;
typedef struct FERRY_CUmemAllocationProp {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType bits */
    FERRY_CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} FERRY_CUmemAllocationProp;
typedef struct FERRY_CUmemAccessDesc {
    FERRY_CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} FERRY_CUmemAccessDesc;
typedef FERRY_CUresult (*ferry_cuMemCreate_fn)(FERRY_CUmemGenericAllocationHandle *h, size_t size,
                                               const FERRY_CUmemAllocationProp *prop, unsigned long long flags);
typedef FERRY_CUresult (*ferry_cuMemRelease_fn)(FERRY_CUmemGenericAllocationHandle h);
typedef FERRY_CUresult (*ferry_cuMemAddressReserve_fn)(FERRY_CUdeviceptr *p, size_t size, size_t alignment,
                                                       FERRY_CUdeviceptr addr, unsigned long long flags);
typedef FERRY_CUresult (*ferry_cuMemAddressFree_fn)(FERRY_CUdeviceptr p, size_t size);
typedef FERRY_CUresult (*ferry_cuMemMap_fn)(FERRY_CUdeviceptr p, size_t size, size_t offset,
                                            FERRY_CUmemGenericAllocationHandle h, unsigned long long flags);
typedef FERRY_CUresult (*ferry_cuMemUnmap_fn)(FERRY_CUdeviceptr p, size_t size);
typedef FERRY_CUresult (*ferry_cuMemSetAccess_fn)(FERRY_CUdeviceptr p, size_t size, const FERRY_CUmemAccessDesc *desc,
                                                  size_t count);
/* Works only for VMM memory: how the exporter tells it from cuMemAlloc's. */
typedef FERRY_CUresult (*ferry_cuMemRetainAllocationHandle_fn)(FERRY_CUmemGenericAllocationHandle *h, void *addr);
typedef FERRY_CUresult (*ferry_cuMemGetAllocationPropertiesFromHandle_fn)(FERRY_CUmemAllocationProp *prop,
                                                                         FERRY_CUmemGenericAllocationHandle h);
/* For a POSIX file descriptor, shareable points to an int; os_handle is
 * the descriptor itself, cast to a pointer. */
typedef FERRY_CUresult (*ferry_cuMemExportToShareableHandle_fn)(void *shareable, FERRY_CUmemGenericAllocationHandle h,
                                                                int type, unsigned long long flags);
typedef FERRY_CUresult (*ferry_cuMemImportFromShareableHandle_fn)(FERRY_CUmemGenericAllocationHandle *h,
                                                                  void *os_handle, int type);

#endif
