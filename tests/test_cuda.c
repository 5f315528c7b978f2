/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA device memory through the driver API loaded at run time (built with
 * FERRY_WITH_CUDA, the default; a skip otherwise). No GPU is needed:
 *
 *  - without a driver in the process (always here, and in this test process
 *    on a GPU machine too: nothing loads libcuda.so.1) all memory is host
 *    memory, ferry_device_memory_supported() says why, and transfers work;
 *  - with the stub driver (tests/support/cuda_stub.c, loaded by the test as
 *    an application would load libcuda.so.1, named by FERRY_CUDA_DRIVER) the
 *    real code path runs: detection at registration, staged TCP transfers
 *    both ways with the allocation's context pushed and popped, the primary
 *    context for memory without one, and every refusal;
 *  - the classification of the driver's answers, the error mapping, and,
 *    where a cuda.h is at hand, Ferry's own declarations against it.
 * What needs a real GPU (cuMemAlloc'd memory, a real driver's answers) is
 * not run here; see docs/RDMA_AND_GPU.md. */
#ifndef FERRY_HAVE_CUDA
#include "harness.h"
static void skipped(void **state)
{
    (void)state;
    skip();
}
int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef FERRY_TEST_CUDA_H
#include <cuda.h>
#endif

#include "util/cuda_driver.h"
#include "util/cuda_memory.h"
#include "engine/testing.h"
#include "link/registry.h"
#include "util/memkind.h"
#include "fault.h"
#include "harness.h"

#ifdef FERRY_TEST_CUDA_H
/* Ferry declares the driver API itself (src/util/cuda_driver.h): the values
 * must be cuda.h's. Checked when this file compiles. */
_Static_assert(FERRY_CUDA_SUCCESS == CUDA_SUCCESS, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_INVALID_VALUE == CUDA_ERROR_INVALID_VALUE, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_OUT_OF_MEMORY == CUDA_ERROR_OUT_OF_MEMORY, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_NOT_INITIALIZED == CUDA_ERROR_NOT_INITIALIZED, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_DEINITIALIZED == CUDA_ERROR_DEINITIALIZED, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_STUB_LIBRARY == CUDA_ERROR_STUB_LIBRARY, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_NO_DEVICE == CUDA_ERROR_NO_DEVICE, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_INVALID_DEVICE == CUDA_ERROR_INVALID_DEVICE, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_INVALID_CONTEXT == CUDA_ERROR_INVALID_CONTEXT, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_ILLEGAL_ADDRESS == CUDA_ERROR_ILLEGAL_ADDRESS, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_SYSTEM_DRIVER_MISMATCH == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUresult");
_Static_assert(FERRY_CU_POINTER_ATTRIBUTE_CONTEXT == CU_POINTER_ATTRIBUTE_CONTEXT, "attribute");
_Static_assert(FERRY_CU_POINTER_ATTRIBUTE_MEMORY_TYPE == CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "attribute");
_Static_assert(FERRY_CU_POINTER_ATTRIBUTE_IS_MANAGED == CU_POINTER_ATTRIBUTE_IS_MANAGED, "attribute");
_Static_assert(FERRY_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, "attribute");
_Static_assert(FERRY_CU_MEMORYTYPE_HOST == CU_MEMORYTYPE_HOST, "memory type");
_Static_assert(FERRY_CU_MEMORYTYPE_DEVICE == CU_MEMORYTYPE_DEVICE, "memory type");
_Static_assert(FERRY_CU_MEMORYTYPE_ARRAY == CU_MEMORYTYPE_ARRAY, "memory type");
_Static_assert(FERRY_CU_MEMORYTYPE_UNIFIED == CU_MEMORYTYPE_UNIFIED, "memory type");
_Static_assert(sizeof(FERRY_CUdeviceptr) == sizeof(CUdeviceptr), "CUdeviceptr");
_Static_assert(sizeof(FERRY_CUdevice) == sizeof(CUdevice), "CUdevice");
_Static_assert(sizeof(CUpointer_attribute) == sizeof(int), "enum passed as int");
_Static_assert(FERRY_CUDA_ERROR_MAP_FAILED == CUDA_ERROR_MAP_FAILED, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_ALREADY_MAPPED == CUDA_ERROR_ALREADY_MAPPED, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_INVALID_HANDLE == CUDA_ERROR_INVALID_HANDLE, "CUresult");
_Static_assert(FERRY_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
               "CUresult");
_Static_assert(FERRY_CUDA_ERROR_NOT_SUPPORTED == CUDA_ERROR_NOT_SUPPORTED, "CUresult");
_Static_assert(FERRY_CU_IPC_HANDLE_SIZE == CU_IPC_HANDLE_SIZE, "IPC handle");
_Static_assert(sizeof(FERRY_CUipcMemHandle) == sizeof(CUipcMemHandle), "IPC handle");
_Static_assert(FERRY_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS == CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, "IPC flag");
_Static_assert(FERRY_CU_STREAM_NON_BLOCKING == CU_STREAM_NON_BLOCKING, "stream flag");
_Static_assert(FERRY_CU_MEMHOSTREGISTER_PORTABLE == CU_MEMHOSTREGISTER_PORTABLE, "host register flag");
/* The entry points' types, by the names libcuda exports (cuda.h's macros
 * map the plain names to them). */
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuIpcOpenMemHandle_v2),
                                            CUresult (*)(CUdeviceptr *, CUipcMemHandle, unsigned int)),
               "cuIpcOpenMemHandle_v2");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuIpcGetMemHandle), CUresult (*)(CUipcMemHandle *, CUdeviceptr)),
               "cuIpcGetMemHandle");
_Static_assert(__builtin_types_compatible_p(__typeof__(&cuMemGetAddressRange_v2),
                                            CUresult (*)(CUdeviceptr *, size_t *, CUdeviceptr)),
               "cuMemGetAddressRange_v2");
/* VMM (cuda_ipc's export of cuMemCreate memory): values, struct layouts,
 * entry points. */
#include <stddef.h>
_Static_assert(FERRY_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, "handle type");
_Static_assert(FERRY_CU_MEM_ALLOCATION_TYPE_PINNED == CU_MEM_ALLOCATION_TYPE_PINNED, "allocation type");
_Static_assert(FERRY_CU_MEM_LOCATION_TYPE_DEVICE == CU_MEM_LOCATION_TYPE_DEVICE, "location type");
_Static_assert(FERRY_CU_MEM_ACCESS_FLAGS_PROT_READWRITE == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access flags");
_Static_assert(sizeof(FERRY_CUmemGenericAllocationHandle) == sizeof(CUmemGenericAllocationHandle), "handle");
_Static_assert(sizeof(FERRY_CUmemLocation) == sizeof(CUmemLocation), "CUmemLocation");
_Static_assert(sizeof(FERRY_CUmemAccessDesc) == sizeof(CUmemAccessDesc), "CUmemAccessDesc");
_Static_assert(sizeof(FERRY_CUmemAllocationProp) == sizeof(CUmemAllocationProp), "CUmemAllocationProp");
_Static_assert(offsetof(FERRY_CUmemAllocationProp, requestedHandleTypes) ==
                   offsetof(CUmemAllocationProp, requestedHandleTypes), "CUmemAllocationProp");
_Static_assert(offsetof(FERRY_CUmemAllocationProp, location) == offsetof(CUmemAllocationProp, location),
               "CUmemAllocationProp");
_Static_assert(offsetof(FERRY_CUmemAllocationProp, allocFlags) == offsetof(CUmemAllocationProp, allocFlags),
               "CUmemAllocationProp");
_Static_assert(offsetof(FERRY_CUmemAccessDesc, flags) == offsetof(CUmemAccessDesc, flags), "CUmemAccessDesc");
_Static_assert(sizeof(CUmemAllocationHandleType) == sizeof(int), "enum passed as int");
#define FERRY_SAME_TYPE(fn, type) _Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type), #fn)
FERRY_SAME_TYPE(cuMemCreate, CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                          unsigned long long));
FERRY_SAME_TYPE(cuMemRelease, CUresult (*)(CUmemGenericAllocationHandle));
FERRY_SAME_TYPE(cuMemAddressReserve, CUresult (*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long));
FERRY_SAME_TYPE(cuMemAddressFree, CUresult (*)(CUdeviceptr, size_t));
FERRY_SAME_TYPE(cuMemMap, CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long));
FERRY_SAME_TYPE(cuMemUnmap, CUresult (*)(CUdeviceptr, size_t));
FERRY_SAME_TYPE(cuMemSetAccess, CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t));
FERRY_SAME_TYPE(cuMemRetainAllocationHandle, CUresult (*)(CUmemGenericAllocationHandle *, void *));
FERRY_SAME_TYPE(cuMemGetAllocationPropertiesFromHandle,
                CUresult (*)(CUmemAllocationProp *, CUmemGenericAllocationHandle));
FERRY_SAME_TYPE(cuMemExportToShareableHandle,
                CUresult (*)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long));
FERRY_SAME_TYPE(cuMemImportFromShareableHandle,
                CUresult (*)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType));
#endif

#define STUB_MANAGED 1
#define STUB_NO_CONTEXT 2

static void *stub;
static void *(*stub_alloc)(size_t, int, int);
static void *(*stub_alias)(void *);
static void (*stub_free)(void *);
static void (*stub_counts)(unsigned long[7]);

/* The driver named anew (NULL: the default, libcuda.so.1), and forgotten. */
static void use_driver(const char *path)
{
    if (path)
        setenv("FERRY_CUDA_DRIVER", path, 1);
    else
        unsetenv("FERRY_CUDA_DRIVER");
    unsetenv("FERRY_CUDA_STUB_INIT_ERROR");
    unsetenv("FERRY_CUDA_STUB_DEVICES");
    ferry_cuda_forget_driver();
}

/* What an application using CUDA does: load the driver (here the stub). */
static void load_stub(void)
{
    const char *path = getenv("FERRY_CUDA_STUB");
    assert_non_null(path);
    stub = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    assert_non_null(stub);
    stub_alloc = (void *(*)(size_t, int, int))dlsym(stub, "cuda_stub_alloc");
    stub_alias = (void *(*)(void *))dlsym(stub, "cuda_stub_alias");
    stub_free = (void (*)(void *))dlsym(stub, "cuda_stub_free");
    stub_counts = (void (*)(unsigned long[7]))dlsym(stub, "cuda_stub_counts");
    assert_true(stub_alloc && stub_alias && stub_free && stub_counts);
}

static void classification(void **state)
{
    (void)state;
    uint32_t k = 99;
    /* Errors: the driver does not know the pointer: host. */
    assert_int_equal(ferry_cuda_classify(FERRY_CUDA_ERROR_INVALID_VALUE, FERRY_CU_MEMORYTYPE_DEVICE, 0, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_cuda_classify(FERRY_CUDA_ERROR_NOT_INITIALIZED, 0, 0, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    /* CPU-accessible kinds: unknown (0), pinned host, managed, unified. */
    assert_int_equal(ferry_cuda_classify(FERRY_CUDA_SUCCESS, 0, 0, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_cuda_classify(FERRY_CUDA_SUCCESS, FERRY_CU_MEMORYTYPE_HOST, 0, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_cuda_classify(FERRY_CUDA_SUCCESS, FERRY_CU_MEMORYTYPE_DEVICE, 1, 1, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_cuda_classify(FERRY_CUDA_SUCCESS, FERRY_CU_MEMORYTYPE_UNIFIED, 0, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    /* Device memory, with its ordinal. */
    assert_int_equal(ferry_cuda_classify(FERRY_CUDA_SUCCESS, FERRY_CU_MEMORYTYPE_DEVICE, 0, 2, &k), 0);
    assert_int_equal(FERRY_MEMKIND_TYPE(k), FERRY_MEMKIND_CUDA);
    assert_int_equal(FERRY_MEMKIND_DEVICE(k), 2);
    assert_int_equal(ferry_cuda_classify(FERRY_CUDA_SUCCESS, FERRY_CU_MEMORYTYPE_DEVICE, 0, -1, &k),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("device ordinal -1");
}

static void error_codes(void **state)
{
    (void)state;
    assert_int_equal(ferry_cuda_error_code(FERRY_CUDA_SUCCESS), 0);
    assert_int_equal(ferry_cuda_error_code(FERRY_CUDA_ERROR_NO_DEVICE), FERRY_ERR_DEVICE_NOT_FOUND);
    assert_int_equal(ferry_cuda_error_code(FERRY_CUDA_ERROR_NOT_INITIALIZED), FERRY_ERR_DEVICE_NOT_FOUND);
    assert_int_equal(ferry_cuda_error_code(FERRY_CUDA_ERROR_SYSTEM_DRIVER_MISMATCH), FERRY_ERR_DEVICE_NOT_FOUND);
    assert_int_equal(ferry_cuda_error_code(FERRY_CUDA_ERROR_INVALID_VALUE), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_cuda_error_code(FERRY_CUDA_ERROR_OUT_OF_MEMORY), FERRY_ERR_MEMORY);
    assert_int_equal(ferry_cuda_error_code(FERRY_CUDA_ERROR_ILLEGAL_ADDRESS), FERRY_ERR_INTERNAL);
}

/* Host memory registers and moves, whatever the driver's state. */
static void host_transfer(void)
{
    ferry_engine_t *a = harness_engine(10000), *b = harness_engine(10000);
    size_t len = (2u << 20) + 1;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    uint32_t kind = 99;
    assert_int_equal(ferry_memkind_detect(src, len, &kind), 0);
    assert_int_equal(kind, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_register(a, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(b, dst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_registry_device_count(ferry_test_registry(a)), 0);
    harness_fill(src, len, 11);
    assert_int_equal(ferry_transfer_sync(a, ferry_engine_name(b), FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, len), 0);
    assert_true(harness_check(dst, len, 11));
    ferry_deregister(a, src);
    ferry_deregister(b, dst);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
    free(src);
    free(dst);
}

/* No driver in this process (runs first: nothing has loaded the stub). */
static void no_driver_is_host_only(void **state)
{
    (void)state;
    use_driver(NULL);
    const char *why = NULL;
    assert_int_equal(ferry_device_memory_supported(&why), 0);
    assert_non_null(strstr(why, "libcuda.so.1 is not loaded in this process"));
    assert_non_null(strstr(why, "all memory is host memory"));
    host_transfer();
    /* A driver path that does not exist: the same, naming it. */
    use_driver("/nonexistent/libcuda.so.1");
    assert_int_equal(ferry_device_memory_supported(&why), 0);
    assert_non_null(strstr(why, "/nonexistent/libcuda.so.1 is not loaded"));
    /* The stub named but not loaded by the application: still host only. */
    use_driver(getenv("FERRY_CUDA_STUB"));
    assert_int_equal(ferry_device_memory_supported(&why), 0);
    assert_non_null(strstr(why, "is not loaded in this process"));
    /* A copy of a CUDA kind without a driver: DEVICE_NOT_FOUND, not a crash. */
    unsigned char buf[8];
    assert_int_equal(ferry_memkind_to_host(FERRY_MEMKIND_MAKE(FERRY_MEMKIND_CUDA, 0), buf, buf, 8),
                     FERRY_ERR_DEVICE_NOT_FOUND);
    assert_detail_contains("not loaded");
}

/* Registration does not ask the loader for the driver by name while the
 * process has not loaded it (that dlopen(RTLD_NOLOAD) searched the disk
 * each time: ~125 us a registration where a CUDA toolkit is installed),
 * and a driver loaded later is still seen at the next registration. Runs
 * before the stub is loaded. Before the fix, every one of the N
 * registrations asked (N probes). */
static void registration_probes_only_when_the_loader_changes(void **state)
{
    (void)state;
    use_driver(NULL);
    enum { N = 2000, PAGE = 4096 };
    unsigned char *mem = aligned_alloc(PAGE, (size_t)N * PAGE);
    assert_non_null(mem);
    ferry_engine_t *e = harness_engine(5000);
    unsigned long before = ferry_cuda_driver_probes();
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(ferry_register(e, mem + i * PAGE, PAGE, FERRY_MEM_LOCAL), 0);
        assert_int_equal(ferry_deregister(e, mem + i * PAGE), 0);
    }
    unsigned long probes = ferry_cuda_driver_probes() - before;
    if (probes > 1) fail_msg("%lu loader look-ups for %d registrations without a driver (want at most 1)", probes, N);

    /* The application loads CUDA now: the next registration sees it. */
    load_stub();
    size_t len = 1u << 16;
    unsigned char *dev = stub_alloc(len, 1, 0);
    assert_non_null(dev);
    assert_int_equal(ferry_register(e, dev, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_registry_device_count(ferry_test_registry(e)), 1);
    const char *why = NULL;
    assert_int_equal(ferry_device_memory_supported(&why), 1);
    assert_non_null(strstr(why, "libcuda.so.1, driver version 13000"));
    assert_int_equal(ferry_deregister(e, dev), 0);
    ferry_engine_destroy(e);
    stub_free(dev);
    free(mem);
}

static void expect_counts(const unsigned long before[7], long dtoh, long htod)
{
    unsigned long now[7];
    stub_counts(now);
    assert_int_equal((long)(now[0] - before[0]), dtoh);
    assert_int_equal((long)(now[1] - before[1]), htod);
    assert_true(now[2] - before[2] >= (unsigned long)(htod > 0)); /* a stream sync after host->device */
    assert_int_equal(now[3] - before[3], now[4] - before[4]);     /* every push popped */
    assert_int_equal(now[5] - before[5], now[6] - before[6]);     /* every retain released */
}

/* The driver-API path, over the stub: device memory on two devices, moved
 * over TCP through host staging, both ways. */
static void stub_driver_moves_device_memory(void **state)
{
    (void)state;
    load_stub();
    use_driver(getenv("FERRY_CUDA_STUB"));
    const char *why = NULL;
    assert_int_equal(ferry_device_memory_supported(&why), 1);
    assert_non_null(strstr(why, "2 device(s)"));
    /* By the default name too: the stub's soname is libcuda.so.1. */
    use_driver(NULL);
    assert_int_equal(ferry_device_memory_supported(&why), 1);
    assert_non_null(strstr(why, "libcuda.so.1, driver version 13000"));

    size_t len = (3u << 20) + 7;
    unsigned char *gsrc = stub_alloc(len, 1, 0), *gdst = stub_alloc(len, 0, 0);
    assert_true(gsrc && gdst);
    harness_fill(stub_alias(gsrc), len, 12);
    memset(stub_alias(gdst), 0, len);
    ferry_engine_t *a = harness_engine(20000), *b = harness_engine(20000);
    assert_int_equal(ferry_register(a, gsrc, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(b, gdst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_registry_device_count(ferry_test_registry(a)), 1);
    uint32_t kind = 0;
    assert_int_equal(ferry_memkind_detect(gsrc, len, &kind), 0);
    assert_int_equal(kind, FERRY_MEMKIND_MAKE(FERRY_MEMKIND_CUDA, 1));

    unsigned long before[7], more_before[8], more_after[8];
    void (*more)(unsigned long[8]) = (void (*)(unsigned long[8]))dlsym(stub, "cuda_stub_more_counts");
    assert_non_null(more);
    ferry_staging_totals_t t0, t1;
    more(more_before);
    stub_counts(before);
    ferry_staging_totals(&t0);
    assert_int_equal(ferry_transfer_sync(a, ferry_engine_name(b), FERRY_OP_WRITE, gsrc, (uint64_t)(uintptr_t)gdst, len),
                     0);
    /* The initiator staged through pinned buffers, each slice after the
     * first copied while the one before it was sent (4 slices of 1 MiB);
     * the target received each slice's 256 KiB sub-slices into its own
     * pinned buffers and copied them in on its streams (3 x 4 + 1), every
     * copy waited for before the ack (the stub copies only then: the bytes
     * check below fails otherwise). */
    more(more_after);
    ferry_staging_totals(&t1);
    assert_int_equal(t1.take_prefetched - t0.take_prefetched, 3);
    assert_int_equal(t1.take_copied - t0.take_copied, 1);
    assert_int_equal(t1.land_queued - t0.land_queued, 13);
    assert_int_equal(t1.land_copied - t0.land_copied, 0);
    assert_true(t1.land_overlapped - t0.land_overlapped >= 1); /* received while a copy ran (9 when the bytes wait) */
    assert_int_equal(more_after[3] - more_before[3], 3 + 13);
    assert_int_equal(more_after[6] - more_before[6], 2 + 2);
    assert_true(harness_check(stub_alias(gdst), len, 12));
    unsigned long after_write[7];
    stub_counts(after_write);
    assert_true(after_write[0] > before[0]);
    expect_counts(before, (long)(after_write[0] - before[0]), 0);

    /* Read back into device memory: the initiator lands the answers the
     * same way (13 sub-slices on its streams), complete before the call
     * returns. */
    memset(stub_alias(gsrc), 0, len);
    ferry_staging_totals(&t0);
    assert_int_equal(ferry_transfer_sync(a, ferry_engine_name(b), FERRY_OP_READ, gsrc, (uint64_t)(uintptr_t)gdst, len),
                     0);
    ferry_staging_totals(&t1);
    assert_int_equal(t1.land_queued - t0.land_queued, 13);
    assert_int_equal(t1.land_overlapped - t0.land_overlapped, 3 * 3); /* sub-slices 2..4 of each whole slice */
    /* The target served it from its device memory the same way: each
     * answer's 256 KiB sub-slices staged, the next one's copy started
     * before this one is sent (all but the first of each answer, unless
     * a full socket parked the answer between them). */
    assert_true(t1.take_prefetched - t0.take_prefetched >= 1);
    assert_int_equal(t1.take_prefetched - t0.take_prefetched + t1.take_copied - t0.take_copied, 13);
    assert_true(harness_check(stub_alias(gsrc), len, 12));

    /* A range running past the allocation is refused at registration. */
    assert_int_equal(ferry_register(a, gdst + 4096, len, FERRY_MEM_LOCAL), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("starts in CUDA device 0 memory but its last byte is not");

    ferry_deregister(a, gsrc);
    ferry_deregister(b, gdst);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
    stub_free(gsrc);
    stub_free(gdst);
}

/* Memory without a context attribute: the device's primary context,
 * retained and released around each copy. Managed memory: host. */
static void stub_driver_primary_context_and_managed(void **state)
{
    (void)state;
    load_stub();
    use_driver(getenv("FERRY_CUDA_STUB"));
    size_t len = 65536;
    unsigned char *g = stub_alloc(len, 1, STUB_NO_CONTEXT), host[256];
    harness_fill(stub_alias(g), len, 13);
    uint32_t kind = 0;
    assert_int_equal(ferry_memkind_detect(g, len, &kind), 0);
    unsigned long before[7], now[7];
    stub_counts(before);
    assert_int_equal(ferry_memkind_to_host(kind, host, g + 100, sizeof host), 0);
    assert_int_equal(memcmp(host, (unsigned char *)stub_alias(g) + 100, sizeof host), 0);
    memset(host, 0x5a, sizeof host);
    assert_int_equal(ferry_memkind_from_host(kind, g + 1000, host, sizeof host), 0);
    assert_int_equal(memcmp(host, (unsigned char *)stub_alias(g) + 1000, sizeof host), 0);
    expect_counts(before, 1, 1);
    stub_counts(now);
    assert_int_equal(now[5] - before[5], 2);
    stub_free(g);

    unsigned char *m = stub_alloc(len, 0, STUB_MANAGED);
    assert_int_equal(ferry_memkind_detect(m, len, &kind), 0);
    assert_int_equal(kind, FERRY_MEMKIND_HOST);
    stub_free(m);

    /* Copies the driver refuses: a clear code and the driver's words. */
    assert_int_equal(ferry_memkind_to_host(FERRY_MEMKIND_MAKE(FERRY_MEMKIND_CUDA, 0), host, host + 8, 8),
                     FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("CUDA device->host copy of 8 bytes on device 0");
    assert_detail_contains("CUDA_ERROR_INVALID_VALUE");
    assert_int_equal(ferry_memkind_from_host(FERRY_MEMKIND_MAKE(FERRY_MEMKIND_CUDA, 3), host + 8, host, 8),
                     FERRY_ERR_DEVICE_NOT_FOUND);
    assert_detail_contains("CUDA_ERROR_INVALID_DEVICE");
    stub_counts(now);
    assert_int_equal(now[3], now[4]);
    assert_int_equal(now[5], now[6]);
}

/* Pinned, pipelined staging (ferry_stage_*): slice n+1's device->host copy
 * is queued on the stager's stream while slice n is "sent", into the other
 * page-locked buffer, and the next take waits for it. The stub's stream
 * copies happen only at the stream's synchronize, so a take that did not
 * wait would see the wrong bytes. */
static void stub_stage_prefetches_into_pinned_buffers(void **state)
{
    (void)state;
    load_stub();
    use_driver(getenv("FERRY_CUDA_STUB"));
    enum { SLICE = 256 << 10, N = 16 };
    unsigned char *g = stub_alloc((size_t)SLICE * N, 1, 0);
    assert_non_null(g);
    harness_fill(stub_alias(g), (size_t)SLICE * N, 61);
    uint32_t kind = 0;
    assert_int_equal(ferry_memkind_detect(g, (size_t)SLICE * N, &kind), 0);
    void (*more)(unsigned long[8]) = (void (*)(unsigned long[8]))dlsym(stub, "cuda_stub_more_counts");
    assert_non_null(more);
    unsigned long m0[8], m1[8], c0[7], c1[7];
    more(m0);
    stub_counts(c0);
    unsigned char *sent = malloc((size_t)SLICE * N);
    ferry_stage_t *s = ferry_stage_new();
    assert_non_null(s);
    for (int i = 0; i < N; i++) {
        unsigned char *b = NULL;
        assert_int_equal(ferry_stage_take(s, kind, g + (size_t)i * SLICE, SLICE, &b), 0);
        if (i + 1 < N) ferry_stage_prefetch(s, kind, g + (size_t)(i + 1) * SLICE, SLICE);
        memcpy(sent + (size_t)i * SLICE, b, SLICE); /* "the send of slice i" */
    }
    assert_true(harness_check(sent, (size_t)SLICE * N, 61));
    unsigned long prefetched, copied;
    ferry_stage_counts(s, &prefetched, &copied);
    assert_int_equal(prefetched, N - 1);
    assert_int_equal(copied, 1);
    more(m1);
    stub_counts(c1);
    assert_int_equal(m1[6] - m0[6], 2);     /* two page-locked buffers (cuMemAllocHost) */
    assert_int_equal(m1[3] - m0[3], N - 1); /* N-1 stream copies */
    assert_int_equal(c1[0] - c0[0], 1);     /* one synchronous copy, the first slice */

    /* A take of another range than the prefetch's: copied now, correct. */
    unsigned char *b = NULL;
    ferry_stage_prefetch(s, kind, g, SLICE);
    assert_int_equal(ferry_stage_take(s, kind, g + SLICE, SLICE, &b), 0);
    assert_int_equal(memcmp(b, (unsigned char *)stub_alias(g) + SLICE, SLICE), 0);
    /* A failing copy (a range past the allocation) fails the take. */
    assert_int_not_equal(ferry_stage_take(s, kind, g + (size_t)SLICE * N - 8, SLICE, &b), 0);
    ferry_stage_free(s);
    more(m1);
    assert_int_equal(m1[7] - m0[7], 2); /* both buffers freed (cuMemFreeHost) */
    stub_counts(c1);
    assert_int_equal(c1[3], c1[4]); /* every push popped */
    assert_int_equal(c1[5], c1[6]); /* every retain released */

    /* Host memory needs no driver: taken by a plain copy. */
    s = ferry_stage_new();
    assert_int_equal(ferry_stage_take(s, FERRY_MEMKIND_HOST, sent, SLICE, &b), 0);
    assert_int_equal(memcmp(b, sent, SLICE), 0);
    ferry_stage_prefetch(s, FERRY_MEMKIND_HOST, sent + SLICE, SLICE); /* nothing to overlap */
    assert_int_equal(ferry_stage_take(s, FERRY_MEMKIND_HOST, sent + SLICE, SLICE, &b), 0);
    assert_int_equal(memcmp(b, sent + SLICE, SLICE), 0);
    ferry_stage_free(s);
    free(sent);
    stub_free(g);
}

/* The device bytes of [p, p+n) copied out in step with the stub's "device"
 * (its stream copies run under the same lock). */
static void device_snapshot(unsigned char *p, size_t n, unsigned char *out)
{
    void (*lock)(void) = (void (*)(void))dlsym(stub, "cuda_stub_lock");
    void (*unlock)(void) = (void (*)(void))dlsym(stub, "cuda_stub_unlock");
    assert_true(lock && unlock);
    const unsigned char *bytes = stub_alias(p); /* takes the lock itself */
    lock();
    memcpy(out, bytes, n);
    unlock();
}

static ferry_engine_t *tcp_initiator(void)
{
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 20000;
    cfg.transport = "tcp";
    return harness_engine_cfg(&cfg);
}

/* A batch of writes into the target's device memory, cancelled while the
 * target's host->device copies run (each 256 KiB copy takes 20 ms on the
 * stub's stream): every request ends COMPLETED (its bytes there) or
 * CANCELLED, and once the cancel returned nothing more lands: the
 * target waits for its copies in flight before the cancel's barrier
 * passes (tcp_target.c, place_device). */
static void stub_target_landing_cancel_leaves_no_late_write(void **state)
{
    (void)state;
    load_stub();
    use_driver(getenv("FERRY_CUDA_STUB"));
    enum { N = 8, PIECE = 1 << 20 };
    size_t cap = (size_t)N * PIECE;
    unsigned char *src = malloc(cap), *dst = stub_alloc(cap, 0, 0), *seen = malloc(cap), *later = malloc(cap);
    assert_true(src && dst && seen && later);
    ferry_engine_t *a = tcp_initiator(), *b = harness_engine(20000);
    assert_int_equal(ferry_register(a, src, cap, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(b, dst, cap, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_transfer_sync(a, ferry_engine_name(b), FERRY_OP_WRITE, src, (uint64_t)(uintptr_t)dst, 1),
                     0); /* session up */
    for (int i = 0; i < N; i++) harness_fill(src + (size_t)i * PIECE, PIECE, 71 + (uint64_t)i);
    memset(stub_alias(dst), 0, cap);
    setenv("FERRY_CUDA_STUB_COPY_DELAY_US", "20000", 1);
    ferry_batch_t *batch = NULL;
    assert_int_equal(ferry_batch_alloc(a, N, &batch), 0);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){FERRY_OP_WRITE, src + (size_t)i * PIECE, (uint64_t)(uintptr_t)dst + (uint64_t)i * PIECE,
                                    PIECE};
    assert_true(ferry_batch_submit(batch, ferry_engine_name(b), reqs, N, 20000) >= 0);
    usleep(150 * 1000);
    int rc = ferry_batch_cancel(batch);
    if (rc) fail_msg("cancel: %d %s", rc, ferry_last_error_detail());
    device_snapshot(dst, cap, seen);
    int completed = 0, cancelled = 0;
    for (int i = 0; i < N; i++) {
        ferry_status_t st;
        assert_int_equal(ferry_batch_status(batch, (size_t)i, &st), 0);
        if (st.state == FERRY_STATUS_COMPLETED) {
            completed++;
            assert_true(harness_check(seen + (size_t)i * PIECE, PIECE, 71 + (uint64_t)i));
        } else {
            if (st.state != FERRY_STATUS_CANCELLED) fail_msg("request %d ended in state %d", i, st.state);
            cancelled++;
        }
    }
    assert_true(cancelled > 0);
    assert_int_equal(completed + cancelled, N);
    usleep(400 * 1000); /* longer than a hold's copies take */
    device_snapshot(dst, cap, later);
    for (int i = 0; i < N; i++)
        if (memcmp(seen + (size_t)i * PIECE, later + (size_t)i * PIECE, PIECE) != 0)
            fail_msg("request %d: bytes landed after the cancel returned", i);
    unsetenv("FERRY_CUDA_STUB_COPY_DELAY_US");
    ferry_batch_free(batch);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
    stub_free(dst);
    free(src);
    free(seen);
    free(later);
}

/* Small pieces into the target's device memory travel in vector frames
 * (WRITEV): the target receives each frame's payload into its pinned
 * buffer and queues every device piece's copy on its stream, waiting for
 * them once before the answer (the stub copies only then: the bytes check
 * fails without the wait); and back out (READV) the same way. */
static void stub_target_lands_vector_frames(void **state)
{
    (void)state;
    load_stub();
    use_driver(getenv("FERRY_CUDA_STUB"));
    enum { N = 64, PIECE = 4096 };
    size_t cap = (size_t)N * PIECE;
    unsigned char *src = malloc(cap), *dst = stub_alloc(cap, 0, 0);
    assert_true(src && dst);
    ferry_engine_t *a = tcp_initiator(), *b = harness_engine(20000);
    assert_int_equal(ferry_register(a, src, cap, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(b, dst, cap, FERRY_MEM_REMOTE), 0);
    harness_fill(src, cap, 91);
    memset(stub_alias(dst), 0, cap);
    void *locals[N];
    uint64_t remotes[N];
    size_t lens[N];
    for (int i = 0; i < N; i++) {
        locals[i] = src + (size_t)i * PIECE;
        remotes[i] = (uint64_t)(uintptr_t)dst + (uint64_t)i * PIECE;
        lens[i] = PIECE;
    }
    ferry_staging_totals_t t0, t1;
    ferry_staging_totals(&t0);
    assert_int_equal(ferry_batch_transfer_sync(a, ferry_engine_name(b), FERRY_OP_WRITE, locals, remotes, lens, N), 0);
    ferry_staging_totals(&t1);
    assert_int_equal(t1.land_queued - t0.land_queued, N);
    assert_int_equal(t1.land_copied - t0.land_copied, 0);
    unsigned char *seen = malloc(cap);
    device_snapshot(dst, cap, seen);
    assert_true(harness_check(seen, cap, 91));
    /* Read back (READV): the target gathers the device pieces into its
     * pinned buffer, every copy queued and waited for before it sends. */
    memset(src, 0, cap);
    ferry_staging_totals(&t0);
    assert_int_equal(ferry_batch_transfer_sync(a, ferry_engine_name(b), FERRY_OP_READ, locals, remotes, lens, N), 0);
    ferry_staging_totals(&t1);
    assert_int_equal(t1.land_queued - t0.land_queued, N);
    assert_int_equal(t1.land_copied - t0.land_copied, 0);
    assert_true(harness_check(src, cap, 91));
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
    stub_free(dst);
    free(src);
    free(seen);
}

/* An initiator that dies mid-slice (a raw peer sends a WRITE's header and
 * 600 KiB of its 1 MiB, then closes): the target lands the two whole
 * 256 KiB sub-slices it received, waiting for their copies before it
 * drops the connection, and nothing else: the cut sub-slice is dropped
 * and no byte lands later. */
static void stub_target_landing_dead_peer(void **state)
{
    (void)state;
    load_stub();
    use_driver(getenv("FERRY_CUDA_STUB"));
    enum { LEN = 1 << 20, SENT = 600 << 10, LANDED = 512 << 10 };
    unsigned char *dst = stub_alloc(LEN, 0, 0), *data = malloc(LEN), *seen = malloc(LEN), *later = malloc(LEN);
    assert_true(dst && data && seen && later);
    ferry_engine_t *t = harness_engine(20000);
    assert_int_equal(ferry_register(t, dst, LEN, FERRY_MEM_REMOTE), 0);
    memset(stub_alias(dst), 0, LEN);
    harness_fill(data, LEN, 81);
    ferry_staging_totals_t t0, t1;
    ferry_staging_totals(&t0);
    setenv("FERRY_CUDA_STUB_COPY_DELAY_US", "20000", 1);
    int fd = raw_handshaken(ferry_engine_port(t));
    assert_true(fd >= 0);
    ferry_frame_t f = {.type = FERRY_FRAME_WRITE, .req_id = 1, .addr = (uint64_t)(uintptr_t)dst, .len = LEN,
                       .plen = LEN};
    uint8_t hdr[FERRY_FRAME_HEADER_SIZE];
    ferry_frame_encode(&f, hdr);
    assert_int_equal(raw_send_bytes(fd, hdr, sizeof hdr), 0);
    assert_int_equal(raw_send_bytes(fd, data, SENT), 0);
    usleep(100 * 1000); /* the target received what came */
    close(fd);
    /* The connection's end waits for the copies: both whole sub-slices
     * land, and only they. */
    for (int waited = 0; waited < 5000; waited += 20) {
        device_snapshot(dst, LEN, seen);
        if (memcmp(seen, data, LANDED) == 0) break;
        usleep(20 * 1000);
    }
    assert_int_equal(memcmp(seen, data, LANDED), 0);
    usleep(300 * 1000);
    device_snapshot(dst, LEN, later);
    assert_int_equal(memcmp(seen, later, LEN), 0);
    static const unsigned char zero[LEN - LANDED];
    assert_int_equal(memcmp(later + LANDED, zero, sizeof zero), 0);
    ferry_staging_totals(&t1);
    assert_int_equal(t1.land_queued - t0.land_queued, 2);
    unsetenv("FERRY_CUDA_STUB_COPY_DELAY_US");
    ferry_engine_destroy(t);
    stub_free(dst);
    free(data);
    free(seen);
    free(later);
}

static void *cut_later(void *px)
{
    usleep(150 * 1000);
    proxy_cut_all(px);
    return NULL;
}

/* A read into device memory whose connection is cut mid-answer (a proxy
 * forwarding 64 KiB every 5 ms, cut at 150 ms): the call fails, and the
 * copies the initiator had started were waited for before it returned:
 * freeing its connections (whose landers a pending copy would drain into
 * the memory: the stub copies at the stream's synchronize or destroy)
 * changes no byte afterwards. */
static void stub_initiator_landing_dead_peer(void **state)
{
    (void)state;
    load_stub();
    use_driver(getenv("FERRY_CUDA_STUB"));
    enum { LEN = 8 << 20 };
    unsigned char *src = malloc(LEN), *dst = stub_alloc(LEN, 0, 0), *seen = malloc(LEN), *later = malloc(LEN);
    assert_true(src && dst && seen && later);
    ferry_engine_t *b = harness_engine(20000);
    assert_int_equal(ferry_register(b, src, LEN, FERRY_MEM_REMOTE), 0);
    harness_fill(src, LEN, 95);
    proxy_t *px = proxy_start("127.0.0.1", ferry_engine_port(b), &(proxy_opts_t){.delay_ms = 5});
    assert_non_null(px);
    ferry_config_t cfg;
    ferry_config_init(&cfg);
    cfg.timeout_ms = 20000;
    cfg.transport = "tcp";
    cfg.retries = 0;
    ferry_engine_t *a = harness_engine_cfg(&cfg);
    assert_int_equal(ferry_register(a, dst, LEN, FERRY_MEM_LOCAL), 0);
    memset(stub_alias(dst), 0, LEN);
    ferry_staging_totals_t t0, t1;
    ferry_staging_totals(&t0);
    pthread_t cutter;
    assert_int_equal(pthread_create(&cutter, NULL, cut_later, px), 0);
    int rc = ferry_transfer_sync(a, proxy_name(px), FERRY_OP_READ, dst, (uint64_t)(uintptr_t)src, LEN);
    pthread_join(cutter, NULL);
    assert_int_not_equal(rc, 0);
    ferry_staging_totals(&t1);
    assert_true(t1.land_queued - t0.land_queued >= 1); /* copies had started before the cut */
    device_snapshot(dst, LEN, seen);
    ferry_engine_destroy(a);
    device_snapshot(dst, LEN, later);
    assert_int_equal(memcmp(seen, later, LEN), 0);
    proxy_stop(px);
    ferry_engine_destroy(b);
    stub_free(dst);
    free(src);
    free(seen);
    free(later);
}

/* A driver that is loaded but unusable: host only, and why. */
static void stub_driver_unusable(void **state)
{
    (void)state;
    load_stub();
    const char *why = NULL;
    use_driver(getenv("FERRY_CUDA_STUB"));
    setenv("FERRY_CUDA_STUB_INIT_ERROR", "100", 1);
    assert_int_equal(ferry_device_memory_supported(&why), 0);
    assert_non_null(strstr(why, "cuInit"));
    assert_non_null(strstr(why, "CUDA_ERROR_NO_DEVICE"));
    host_transfer();

    use_driver(getenv("FERRY_CUDA_STUB"));
    setenv("FERRY_CUDA_STUB_DEVICES", "0", 1);
    assert_int_equal(ferry_device_memory_supported(&why), 0);
    assert_non_null(strstr(why, "found 0 devices"));

    const char *partial = getenv("FERRY_CUDA_STUB_PARTIAL");
    assert_non_null(partial);
    void *h = dlopen(partial, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    use_driver(partial);
    assert_int_equal(ferry_device_memory_supported(&why), 0);
    assert_non_null(strstr(why, "lacks cuMemcpyHtoD_v2"));
    use_driver(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(classification),
        cmocka_unit_test(error_codes),
        cmocka_unit_test(no_driver_is_host_only),
        cmocka_unit_test(registration_probes_only_when_the_loader_changes),
        cmocka_unit_test(stub_driver_moves_device_memory),
        cmocka_unit_test(stub_driver_primary_context_and_managed),
        cmocka_unit_test(stub_stage_prefetches_into_pinned_buffers),
        cmocka_unit_test(stub_target_landing_cancel_leaves_no_late_write),
        cmocka_unit_test(stub_target_landing_dead_peer),
        cmocka_unit_test(stub_target_lands_vector_frames),
        cmocka_unit_test(stub_initiator_landing_dead_peer),
        cmocka_unit_test(stub_driver_unusable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
