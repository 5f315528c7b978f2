/* CUDA device memory (built with -DFERRY_WITH_CUDA=ON): detection of device
 * pointers at registration with cudaPointerGetAttributes, and the host
 * staging copies with cudaMemcpy. Only the CUDA runtime API is used.
 *
 * A process without a CUDA driver or device still registers and moves host
 * memory: the first detection asks cudaGetDeviceCount once, and when that
 * fails every later registration is host memory without further CUDA calls
 * (ferry_memkind_status() says why). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_opt_cuda.h"
#include "fail.h"
#include "memkind.h"

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int cuda_usable;
static char status_text[256];

static void cuda_init(void)
{
    int runtime = 0, driver = 0, n = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n <= 0) {
        snprintf(status_text, sizeof status_text,
                 "CUDA built in (runtime %d, driver %d); unavailable: %s (%s); all memory is host memory", runtime,
                 driver, err != cudaSuccess ? cudaGetErrorName(err) : "no device",
                 err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount found 0 devices");
        (void)cudaGetLastError();
        return;
    }
    cuda_usable = 1;
    snprintf(status_text, sizeof status_text, "CUDA built in (runtime %d, driver %d); %d device(s)", runtime, driver, n);
}

const char *ferry_cuda_status(void)
{
    pthread_once(&init_once, cuda_init);
    return status_text;
}

int ferry_cuda_usable(void)
{
    pthread_once(&init_once, cuda_init);
    return cuda_usable;
}

int ferry_cuda_classify(int err, int type, int device, uint32_t *kind)
{
    *kind = FERRY_MEMKIND_HOST;
    /* An error means CUDA does not know the pointer (or has no device):
     * then it is not device memory, and the CPU may touch it. */
    if (err != cudaSuccess) return 0;
    /* Pinned host, managed and unregistered memory are all CPU-accessible. */
    if (type != cudaMemoryTypeDevice) return 0;
    if (device < 0 || device > 0xffffff)
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT, "register: CUDA reports device ordinal %d", device);
    *kind = FERRY_MEMKIND_MAKE(FERRY_MEMKIND_CUDA, device);
    return 0;
}

int ferry_cuda_detect(const void *addr, size_t len, uint32_t *kind)
{
    *kind = FERRY_MEMKIND_HOST;
    pthread_once(&init_once, cuda_init);
    if (!cuda_usable) return 0;
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    cudaError_t err = cudaPointerGetAttributes(&a, addr);
    if (err != cudaSuccess) (void)cudaGetLastError(); /* not sticky: clear it for the caller */
    int rc = ferry_cuda_classify(err, a.type, a.device, kind);
    if (rc || *kind == FERRY_MEMKIND_HOST) return rc;
    /* The whole range must be memory of that one device. */
    struct cudaPointerAttributes b;
    memset(&b, 0, sizeof b);
    err = cudaPointerGetAttributes(&b, (const char *)addr + len - 1);
    if (err != cudaSuccess) (void)cudaGetLastError();
    if (err != cudaSuccess || b.type != cudaMemoryTypeDevice || b.device != a.device) {
        *kind = FERRY_MEMKIND_HOST;
        return ferry_fail(FERRY_ERR_INVALID_ARGUMENT,
                          "register: [%p+%zu) starts in CUDA device %d memory but its last byte is not (%s)", addr, len,
                          a.device, err != cudaSuccess ? cudaGetErrorName(err) : "another kind or device");
    }
    return 0;
}

int ferry_cuda_error_code(int err)
{
    switch (err) {
    case cudaSuccess: return 0;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice: return FERRY_ERR_DEVICE_NOT_FOUND;
    case cudaErrorInvalidValue: return FERRY_ERR_INVALID_ARGUMENT;
    case cudaErrorMemoryAllocation: return FERRY_ERR_MEMORY;
    default: return FERRY_ERR_INTERNAL;
    }
}

int ferry_cuda_copy(uint32_t kind, void *dst, const void *src, size_t n, int to_host)
{
    int dev = FERRY_MEMKIND_DEVICE(kind), old = -1;
    /* Copies run on Ferry's threads and on the caller's (sync transfers):
     * switch to the region's device and back, so the caller's current
     * device is left as it was. */
    cudaError_t err = cudaGetDevice(&old);
    if (err == cudaSuccess && old != dev) err = cudaSetDevice(dev);
    if (err == cudaSuccess)
        err = cudaMemcpy(dst, src, n, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice);
    if (old >= 0 && old != dev) cudaSetDevice(old);
    if (err == cudaSuccess) return 0;
    (void)cudaGetLastError();
    return ferry_fail(ferry_cuda_error_code(err), "cudaMemcpy %s of %zu bytes on device %d (%p -> %p) failed: %s: %s",
                      to_host ? "device->host" : "host->device", n, dev, src, dst, cudaGetErrorName(err),
                      cudaGetErrorString(err));
}
