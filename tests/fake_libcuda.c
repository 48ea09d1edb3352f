/* A stand-in for libcuda.so.1 (loaded through TILEJIT_LIBCUDA) so the CUDA backend's host-side
 * logic runs on machines without a GPU: driver errors, device checks, model loading (the real
 * NVRTC compiles; module loading is pretended), argument checks, staging, launch arguments and
 * the persistent grid (occupancy: 2 blocks per SM).
 * "Device memory" is host memory; launches are recorded, not run. TJ_FAKE_CUDA selects the
 * machine: "noinit" (cuInit fails), "nodevice" (0 devices), "old" (one sm_75), default one sm_90.
 * TJ_FAKE_CUDA_FAULT=KERNEL makes every launch of that kernel "fault" as a real one would: the
 * launch succeeds, and the context's sticky CUDA_ERROR_ILLEGAL_ADDRESS comes from the next
 * synchronisation or copy (and every call after it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "fake_libcuda.h"

static const char *mode(void)
{
    const char *m = getenv("TJ_FAKE_CUDA");
    return m ? m : "sm90";
}

static tj_fake_launch log_[TJ_FAKE_MAX_LAUNCHES];
static int nlog;
static int allocs;
static char fake_ctx, fake_mod;
/* A fault is pending from the faulting launch to the next synchronisation or copy, which
 * reports it; from then on the context stays faulted and every call fails. */
static CUresult pending, sticky;
static const char *fn_names[] = {"tj_tiles", "tj_fill", "tj_ew"};

int tj_fake_cuda_launch_count(void) { return __atomic_load_n(&nlog, __ATOMIC_SEQ_CST); }
const tj_fake_launch *tj_fake_cuda_launch(int i) { return i >= 0 && i < nlog ? &log_[i] : NULL; }
void tj_fake_cuda_reset(void)
{
    __atomic_store_n(&nlog, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&sticky, CUDA_SUCCESS, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pending, CUDA_SUCCESS, __ATOMIC_SEQ_CST);
}
/* At a synchronisation point: the pending fault becomes the context's sticky error. */
static CUresult fault(void)
{
    CUresult p = __atomic_exchange_n(&pending, CUDA_SUCCESS, __ATOMIC_SEQ_CST);
    if (p) __atomic_store_n(&sticky, p, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&sticky, __ATOMIC_SEQ_CST);
}
int tj_fake_cuda_live_allocations(void) { return __atomic_load_n(&allocs, __ATOMIC_SEQ_CST); }

CUresult CUDAAPI cuGetErrorName(CUresult e, const char **s)
{
    *s = e == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
       : e == CUDA_ERROR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : e == CUDA_ERROR_INVALID_CONTEXT ? "CUDA_ERROR_INVALID_CONTEXT"
       : e == CUDA_ERROR_NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED"
       : e == CUDA_ERROR_ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_UNKNOWN";
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGetErrorString(CUresult e, const char **s)
{
    *s = e == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable device is detected"
       : e == CUDA_ERROR_ILLEGAL_ADDRESS ? "an illegal memory access was encountered" : "fake driver error";
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuInit(unsigned int f) { (void)f; return strcmp(mode(), "noinit") ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE; }
CUresult CUDAAPI cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDeviceGetCount(int *n) { *n = strcmp(mode(), "nodevice") ? 1 : 0; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDeviceGet(CUdevice *d, int o) { *d = o; return o == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice d)
{
    (void)d;
    strncpy(name, "Fake GPU", (size_t)len);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    (void)d;
    int old = strcmp(mode(), "old") == 0;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = old ? 7 : 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = old ? 5 : 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 60 << 20; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 227 << 10; break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceTotalMem(size_t *b, CUdevice d) { (void)d; *b = (size_t)1 << 34; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)&fake_ctx; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice d) { (void)d; return CUDA_SUCCESS; }
/* The current context is per thread in the real driver. */
static _Thread_local CUcontext tls_current;
CUresult CUDAAPI cuCtxSetCurrent(CUcontext c) { tls_current = c; return CUDA_SUCCESS; }
CUresult CUDAAPI cuCtxGetCurrent(CUcontext *c) { *c = tls_current; return CUDA_SUCCESS; }
CUresult CUDAAPI cuCtxSynchronize(void) { return fault(); }
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *p, size_t n)
{
    if (tls_current != (CUcontext)&fake_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    void *q = calloc(1, n ? n : 1);
    if (!q) return CUDA_ERROR_OUT_OF_MEMORY;
    __atomic_add_fetch(&allocs, 1, __ATOMIC_SEQ_CST);
    *p = (CUdeviceptr)(uintptr_t)q;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemFree(CUdeviceptr p)
{
    if (p) __atomic_sub_fetch(&allocs, 1, __ATOMIC_SEQ_CST);
    free((void *)(uintptr_t)p);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemGetInfo(size_t *f, size_t *t) { *f = *t = (size_t)1 << 34; return CUDA_SUCCESS; }
CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return CUDA_SUCCESS; }
CUresult CUDAAPI cuMemcpyDtoH(void *d, CUdeviceptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return CUDA_SUCCESS; }
CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr d, const void *s, size_t n, CUstream st) { (void)st; return fault() ? fault() : cuMemcpyHtoD(d, s, n); }
CUresult CUDAAPI cuMemcpyDtoHAsync(void *d, CUdeviceptr s, size_t n, CUstream st) { (void)st; return fault() ? fault() : cuMemcpyDtoH(d, s, n); }
CUresult CUDAAPI cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { memset((void *)(uintptr_t)d, v, n); return CUDA_SUCCESS; }
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s)
{
    (void)s;
    for (size_t i = 0; i < n; i++) ((unsigned short *)(uintptr_t)d)[i] = v;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
    (void)s;
    for (size_t i = 0; i < n; i++) ((unsigned int *)(uintptr_t)d)[i] = v;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuPointerGetAttribute(void *d, CUpointer_attribute a, CUdeviceptr p) { (void)d; (void)a; (void)p; return CUDA_ERROR_INVALID_VALUE; }
CUresult CUDAAPI cuModuleLoadData(CUmodule *m, const void *image)
{
    /* A CUBIN is an ELF file: check the magic, so a wrong buffer fails as it would. */
    if (!image || memcmp(image, "\177ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
    *m = (CUmodule)&fake_mod;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleUnload(CUmodule m) { (void)m; return CUDA_SUCCESS; }
CUresult CUDAAPI cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    (void)m;
    for (int i = 0; i < 3; i++)
        if (strcmp(name, fn_names[i]) == 0) {
            *f = (CUfunction)&fn_names[i];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}
CUresult CUDAAPI cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) { (void)f; (void)a; (void)v; return CUDA_SUCCESS; }
CUresult CUDAAPI cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) { (void)f; *v = a == CU_FUNC_ATTRIBUTE_NUM_REGS ? 42 : 0; return CUDA_SUCCESS; }
/* Two resident blocks per SM for every kernel: what the mma kernel's 128-register cap gives
 * 256-thread blocks. The persistent grid of tj_tiles is then 132 × 2 = 264 blocks. */
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block, size_t smem)
{
    (void)f;
    (void)smem;
    if (tls_current != (CUcontext)&fake_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    *n = block > 0 && block <= 1024 ? 2 : 0;
    return block > 0 && block <= 1024 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                unsigned smem, CUstream s, void **params, void **extra)
{
    (void)extra;
    if (tls_current != (CUcontext)&fake_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (__atomic_load_n(&sticky, __ATOMIC_SEQ_CST)) return sticky;
    const char *faulty = getenv("TJ_FAKE_CUDA_FAULT");
    if (faulty && strcmp(faulty, *(const char *const *)f) == 0)
        __atomic_store_n(&pending, CUDA_ERROR_ILLEGAL_ADDRESS, __ATOMIC_SEQ_CST);
    int i = __atomic_fetch_add(&nlog, 1, __ATOMIC_SEQ_CST);
    if (i >= TJ_FAKE_MAX_LAUNCHES) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    tj_fake_launch *L = &log_[i];
    strncpy(L->kernel, *(const char *const *)f, sizeof L->kernel - 1);
    L->grid[0] = gx; L->grid[1] = gy; L->grid[2] = gz;
    L->block[0] = bx; L->block[1] = by; L->block[2] = bz;
    L->smem = smem;
    L->stream = s;
    memcpy(L->args, params[0], sizeof L->args);
    const void *x = *(const void *const *)params[0];
    if (x) memcpy(L->x_head, x, sizeof L->x_head);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuStreamCreate(CUstream *s, unsigned f) { (void)f; *s = (CUstream)malloc(1); return CUDA_SUCCESS; }
CUresult CUDAAPI cuStreamDestroy(CUstream s) { free(s); return CUDA_SUCCESS; }
CUresult CUDAAPI cuStreamSynchronize(CUstream s) { (void)s; return fault(); }
CUresult CUDAAPI cuEventCreate(CUevent *e, unsigned f) { (void)f; *e = (CUevent)malloc(1); return CUDA_SUCCESS; }
CUresult CUDAAPI cuEventDestroy(CUevent e) { free(e); return CUDA_SUCCESS; }
CUresult CUDAAPI cuEventRecord(CUevent e, CUstream s) { (void)e; (void)s; return CUDA_SUCCESS; }
CUresult CUDAAPI cuEventSynchronize(CUevent e) { (void)e; return fault(); }
CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent a, CUevent b) { (void)a; (void)b; *ms = 1.0f; return CUDA_SUCCESS; }
CUresult CUDAAPI cuStreamBeginCapture(CUstream s, CUstreamCaptureMode m) { (void)s; (void)m; return CUDA_ERROR_NOT_SUPPORTED; }
CUresult CUDAAPI cuStreamEndCapture(CUstream s, CUgraph *g) { (void)s; *g = NULL; return CUDA_ERROR_NOT_SUPPORTED; }
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *e, CUgraph g, unsigned long long f) { (void)g; (void)f; *e = NULL; return CUDA_ERROR_NOT_SUPPORTED; }
CUresult CUDAAPI cuGraphLaunch(CUgraphExec e, CUstream s) { (void)e; (void)s; return CUDA_ERROR_NOT_SUPPORTED; }
CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec e) { (void)e; return CUDA_SUCCESS; }
CUresult CUDAAPI cuGraphDestroy(CUgraph g) { (void)g; return CUDA_SUCCESS; }
