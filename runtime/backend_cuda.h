/* Backend `cuda`: NVRTC-compiled kernels launched through the driver API (opened with dlopen).
 *
 *   tj_cuda_device   one GPU: the driver table, its primary context, sm_XX read from the device
 *   tj_cuda_data     one layer's packed weights and index arrays in device memory (per dtype)
 *   tj_cuda_kernel   one layer × one config: emitted source → NVRTC CUBIN (through the cache)
 *                    → loaded module and its functions; immutable once built, so many threads
 *                    may launch it at once
 *
 * The backend (tj_backend_cuda_ops) builds these per model; `tilejit bench --backend cuda` and
 * the GPU tests use them directly on random layers. All functions bind the device's primary
 * context to the calling thread for the duration of the call and restore the previous one. */
#ifndef TJ_BACKEND_CUDA_H
#define TJ_BACKEND_CUDA_H

#include "gen/emit_cuda.h"
#include "jit/cache.h"
#include "base/cuda_driver.h"
#include "runtime/model.h"
#include "jit/nvrtc.h"

/* The oldest compute capability the kernels target (cp.async, mma.sync bf16, ldmatrix). */
#define TJ_CUDA_MIN_SM 80

typedef struct tj_cuda_device {
    tj_cu_api cu;
    CUdevice dev;
    CUcontext ctx;        /* the device's primary context (retained) */
    int ordinal;
    int sm;               /* compute capability major·10 + minor, e.g. 90 */
    int sm_count;
    int64_t l2_bytes;
    int64_t smem_optin;   /* largest dynamic shared memory a block may opt in to */
    int64_t total_mem;
    char name[256];
    int sync_check;       /* TILEJIT_SYNC_CHECK=1: synchronise after every launch, name the faulting one */
    tj_cuda_grid_mode grid; /* TILEJIT_CUDA_GRID: "full" one work item per tj_tiles block, N at most N blocks */
    int wgmma_default;    /* TILEJIT_CUDA_WGMMA=1 on a 9.0 device: the wgmma kernel (sm_90a) is the untuned default */
} tj_cuda_device;

/* Opens the driver and device `ordinal` and retains its primary context. Fails with
 * TJ_ERR_UNSUPPORTED and one clear line when there is no driver, no device, or the device is
 * older than TJ_CUDA_MIN_SM. Caller owns *out (tj_cuda_device_close). */
tj_status tj_cuda_device_open(int ordinal, tj_cuda_device **out, tj_error *err);
void tj_cuda_device_close(tj_cuda_device *d);
/* Makes the primary context current on this thread; *prev receives the previous one. */
tj_status tj_cuda_device_bind(tj_cuda_device *d, CUcontext *prev, tj_error *err);
void tj_cuda_device_unbind(tj_cuda_device *d, CUcontext prev);
/* "NVIDIA H200, sm_90, 132 SMs, 140 GiB, driver 13.0" */
void tj_cuda_device_describe(const tj_cuda_device *d, char *buf, size_t size);

/* Device copies of tj_cuda_host_data for one layer in one dtype (TJ_F16 or TJ_BF16). */
typedef struct tj_cuda_data {
    tj_dtype dtype;
    CUdeviceptr w, bias, cols, fill_rows, ew_ptr, ew_idx, ew_val, ew_rows;
    int64_t n_fill, n_ew_rows;
    int64_t bytes;        /* device memory held */
} tj_cuda_data;

/* Packs (tj_cuda_pack) and uploads one layer's weights ([n, k] of wdt) and bias ([n] of bdt,
 * or NULL). Synchronous. */
tj_status tj_cuda_data_upload(tj_cuda_device *d, const tj_layer *l, tj_dtype dtype, const void *w, tj_dtype wdt,
                              const void *bias, tj_dtype bdt, tj_cuda_data *out, tj_error *err);
void tj_cuda_data_free(tj_cuda_device *d, tj_cuda_data *data);

typedef struct tj_cuda_kernel {
    const tj_layer *layer; /* borrowed: must outlive the kernel */
    tj_cuda_config cfg;
    CUmodule mod;
    CUfunction tiles, fill, ew; /* NULL where the module has none */
    /* From the compile: */
    double compile_seconds;
    tj_cache_result cache;
    int registers;         /* of tj_tiles */
    int blocks_per_sm;     /* of tj_tiles, from the driver's occupancy calculator */
    uint32_t max_grid;     /* persistent tj_tiles: at most this many blocks (0: the full grid) */
    int64_t spill_bytes;
} tj_cuda_kernel;

/* Checks cfg (tj_cuda_config_check) and that the device can run it (shared memory); the
 * message names the layer. */
tj_status tj_cuda_config_fits(const tj_cuda_device *d, const tj_layer *l, const tj_cuda_config *cfg, tj_error *err);
/* Loads an already compiled module for (l, cfg). Caller owns *out. */
tj_status tj_cuda_kernel_load(tj_cuda_device *d, const tj_layer *l, const tj_cuda_config *cfg, const tj_cubin *bin,
                              tj_cuda_kernel **out, tj_error *err);
/* Emits, compiles for d->sm through `cache` (may be NULL) and loads. */
tj_status tj_cuda_kernel_build(tj_cuda_device *d, tj_cache *cache, const tj_layer *l, const tj_cuda_config *cfg,
                               tj_cuda_kernel **out, tj_error *err);
void tj_cuda_kernel_destroy(tj_cuda_device *d, tj_cuda_kernel *k);

/* Enqueues the layer on `stream` (NULL: the legacy default stream): x and y are device pointers
 * in the kernel's layouts and dtypes (k->cfg), ldx/ldy their leading dimensions in elements,
 * `data` in k->cfg.dtype. Asynchronous (launch errors are reported, faults surface at the next
 * synchronisation). Binds d's primary context for the call. Thread-safe. */
tj_status tj_cuda_kernel_launch(tj_cuda_device *d, const tj_cuda_kernel *k, const tj_cuda_data *data, CUdeviceptr x,
                                int64_t ldx, CUdeviceptr y, int64_t ldy, int64_t m, CUstream stream, tj_error *err);

/* The per-context device (created by the backend's available()); NULL when none. Borrowed. */
tj_cuda_device *tj_cuda_context_device(tj_context *c);
/* Frees the context's CUDA state (device, kernel cache); safe when none was made. */
void tj_cuda_context_release(tj_context *c);

#endif
