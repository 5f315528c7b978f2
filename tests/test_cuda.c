/* CUDA device memory (builds with -DFERRY_WITH_CUDA=ON; a skip otherwise).
 *
 * Without a GPU or driver (this machine, CI): the classification of
 * cudaPointerGetAttributes' answers, the error mapping, the status line,
 * and that host memory registers and moves as before. With a GPU: device
 * memory is detected at registration and moved over TCP through host
 * staging, both directions (not run where the tests were written: no GPU). */
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "core/cuda_opt_cuda.h"
#include "core/engine.h"
#include "core/memkind.h"
#include "harness.h"

static int have_gpu(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    (void)cudaGetLastError();
    return err == cudaSuccess && n > 0;
}

static void classification(void **state)
{
    (void)state;
    uint32_t k = 99;
    /* Errors: CUDA does not know the pointer, or has no device: host. */
    assert_int_equal(ferry_cuda_classify(cudaErrorInvalidValue, cudaMemoryTypeDevice, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_cuda_classify(cudaErrorNoDevice, 0, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_cuda_classify(cudaErrorInsufficientDriver, 0, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    /* CPU-accessible kinds: host. */
    assert_int_equal(ferry_cuda_classify(cudaSuccess, cudaMemoryTypeUnregistered, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_cuda_classify(cudaSuccess, cudaMemoryTypeHost, 0, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_cuda_classify(cudaSuccess, cudaMemoryTypeManaged, 1, &k), 0);
    assert_int_equal(k, FERRY_MEMKIND_HOST);
    /* Device memory, with its ordinal. */
    assert_int_equal(ferry_cuda_classify(cudaSuccess, cudaMemoryTypeDevice, 2, &k), 0);
    assert_int_equal(FERRY_MEMKIND_TYPE(k), FERRY_MEMKIND_CUDA);
    assert_int_equal(FERRY_MEMKIND_DEVICE(k), 2);
    assert_int_equal(ferry_cuda_classify(cudaSuccess, cudaMemoryTypeDevice, -1, &k), FERRY_ERR_INVALID_ARGUMENT);
    assert_detail_contains("device ordinal -1");
}

static void error_codes(void **state)
{
    (void)state;
    assert_int_equal(ferry_cuda_error_code(cudaSuccess), 0);
    assert_int_equal(ferry_cuda_error_code(cudaErrorNoDevice), FERRY_ERR_DEVICE_NOT_FOUND);
    assert_int_equal(ferry_cuda_error_code(cudaErrorInsufficientDriver), FERRY_ERR_DEVICE_NOT_FOUND);
    assert_int_equal(ferry_cuda_error_code(cudaErrorInvalidValue), FERRY_ERR_INVALID_ARGUMENT);
    assert_int_equal(ferry_cuda_error_code(cudaErrorMemoryAllocation), FERRY_ERR_MEMORY);
    assert_int_equal(ferry_cuda_error_code(cudaErrorIllegalAddress), FERRY_ERR_INTERNAL);
}

static void host_memory_without_gpu(void **state)
{
    (void)state;
    const char *status = ferry_memkind_status();
    assert_non_null(strstr(status, "CUDA built in"));
    if (!have_gpu()) assert_non_null(strstr(status, "unavailable"));
    ferry_engine_t *a = harness_engine(10000), *b = harness_engine(10000);
    size_t len = (2u << 20) + 1;
    unsigned char *src = malloc(len), *dst = calloc(1, len);
    uint32_t kind = 99;
    assert_int_equal(ferry_memkind_detect(src, len, &kind), 0);
    assert_int_equal(kind, FERRY_MEMKIND_HOST);
    assert_int_equal(ferry_register(a, src, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(b, dst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_registry_device_count(&a->registry), 0);
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

/* Needs a GPU: device memory registered, staged, and moved both ways. */
static void device_memory_with_gpu(void **state)
{
    (void)state;
    if (!have_gpu()) skip();
    size_t len = (3u << 20) + 7;
    void *gsrc = NULL, *gdst = NULL;
    assert_int_equal(cudaMalloc(&gsrc, len), cudaSuccess);
    assert_int_equal(cudaMalloc(&gdst, len), cudaSuccess);
    unsigned char *host = malloc(len), *back = malloc(len);
    harness_fill(host, len, 12);
    assert_int_equal(cudaMemcpy(gsrc, host, len, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemset(gdst, 0, len), cudaSuccess);
    ferry_engine_t *a = harness_engine(20000), *b = harness_engine(20000);
    assert_int_equal(ferry_register(a, gsrc, len, FERRY_MEM_LOCAL), 0);
    assert_int_equal(ferry_register(b, gdst, len, FERRY_MEM_REMOTE), 0);
    assert_int_equal(ferry_registry_device_count(&a->registry), 1);
    assert_int_equal(ferry_transfer_sync(a, ferry_engine_name(b), FERRY_OP_WRITE, gsrc, (uint64_t)(uintptr_t)gdst, len),
                     0);
    assert_int_equal(cudaMemcpy(back, gdst, len, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(harness_check(back, len, 12));
    assert_int_equal(cudaMemset(gsrc, 0, len), cudaSuccess);
    assert_int_equal(ferry_transfer_sync(a, ferry_engine_name(b), FERRY_OP_READ, gsrc, (uint64_t)(uintptr_t)gdst, len),
                     0);
    assert_int_equal(cudaMemcpy(back, gsrc, len, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(harness_check(back, len, 12));
    /* A range running past the allocation is refused at registration. */
    assert_int_equal(ferry_register(a, (char *)gdst + 4096, len, FERRY_MEM_LOCAL), FERRY_ERR_INVALID_ARGUMENT);
    ferry_deregister(a, gsrc);
    ferry_deregister(b, gdst);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
    cudaFree(gsrc);
    cudaFree(gdst);
    free(host);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(classification),
        cmocka_unit_test(error_codes),
        cmocka_unit_test(host_memory_without_gpu),
        cmocka_unit_test(device_memory_with_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
