/* Backend `cuda`: per model, every layer's kernel is emitted (gen/emit_cuda.c), compiled to a
 * CUBIN for the device's own sm_XX through the kernel cache (jit/nvrtc.c), loaded with
 * cuModuleLoadData, and its packed weights uploaded once. tj_linear then launches tj_tiles,
 * tj_fill and tj_ew on the caller's stream. The driver is opened with dlopen (cuda_driver.c).
 *
 * Layouts and dtypes: the layer's config (tuning record, override or default) is compiled at
 * load; a call whose tensors need another variant (row-major vs feature-major, fp16 vs bf16
 * input, fp32 vs fp16 output, or the SIMT kernel for unaligned feature-major input) compiles it
 * on first use, under the model's lock, and publishes it with a release store: kernels are
 * immutable once visible, so dispatch from many threads takes no lock. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend_cuda.h"

/* ---- device ---------------------------------------------------------------------------- */

static tj_status device_attr(tj_cuda_device *d, CUdevice_attribute a, int *out, tj_error *err)
{
    return TJ_CU(&d->cu, err, DeviceGetAttribute(out, a, d->dev));
}

tj_status tj_cuda_device_open(int ordinal, tj_cuda_device **out, tj_error *err)
{
    *out = NULL;
    tj_cuda_device *d = calloc(1, sizeof *d);
    if (!d) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    tj_status s = tj_cu_open(&d->cu, err);
    if (s != TJ_OK) {
        free(d);
        return s;
    }
    int count = 0, major = 0, minor = 0, sms = 0, l2 = 0, optin = 0;
    size_t total = 0;
    s = TJ_CU(&d->cu, err, DeviceGetCount(&count));
    if (s != TJ_OK) goto fail;
    if (count == 0) {
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "no CUDA device found (driver %d.%d loaded from %s)",
                    d->cu.driver_version / 1000, d->cu.driver_version % 1000 / 10, d->cu.libname);
        goto fail;
    }
    if (ordinal < 0 || ordinal >= count) {
        s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "CUDA device %d does not exist (this machine has %d)", ordinal, count);
        goto fail;
    }
    d->ordinal = ordinal;
    if ((s = TJ_CU(&d->cu, err, DeviceGet(&d->dev, ordinal))) != TJ_OK) goto fail;
    if ((s = TJ_CU(&d->cu, err, DeviceGetName(d->name, (int)sizeof d->name, d->dev))) != TJ_OK) goto fail;
    if ((s = device_attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &major, err)) != TJ_OK) goto fail;
    if ((s = device_attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &minor, err)) != TJ_OK) goto fail;
    if ((s = device_attr(d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &sms, err)) != TJ_OK) goto fail;
    if ((s = device_attr(d, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, &l2, err)) != TJ_OK) goto fail;
    if ((s = device_attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &optin, err)) != TJ_OK) goto fail;
    if ((s = TJ_CU(&d->cu, err, DeviceTotalMem(&total, d->dev))) != TJ_OK) goto fail;
    d->sm = major * 10 + minor;
    d->sm_count = sms;
    d->l2_bytes = l2;
    d->smem_optin = optin;
    d->total_mem = (int64_t)total;
    const char *sync = getenv("TILEJIT_SYNC_CHECK");
    d->sync_check = sync && *sync && strcmp(sync, "0") != 0;
    d->grid = tj_cuda_grid_mode_parse(getenv("TILEJIT_CUDA_GRID"));
    /* Opt-in until a GPU run has measured it: the wgmma kernel is verified by the CPU executor and
     * compiled by NVRTC, never yet timed (docs/kernels.md). A tuned config may pick it regardless. */
    const char *wg = getenv("TILEJIT_CUDA_WGMMA");
    d->wgmma_default = d->sm == 90 && wg && *wg && strcmp(wg, "0") != 0;
    if (d->sm < TJ_CUDA_MIN_SM) {
        s = tj_fail(err, TJ_ERR_UNSUPPORTED,
                    "CUDA device %d (%s) has compute capability %d.%d; tilejit's kernels need %d.%d or newer",
                    ordinal, d->name, major, minor, TJ_CUDA_MIN_SM / 10, TJ_CUDA_MIN_SM % 10);
        goto fail;
    }
    if ((s = TJ_CU(&d->cu, err, DevicePrimaryCtxRetain(&d->ctx, d->dev))) != TJ_OK) goto fail;
    *out = d;
    return TJ_OK;
fail:
    tj_cuda_device_close(d);
    return s;
}

void tj_cuda_device_close(tj_cuda_device *d)
{
    if (!d) return;
    if (d->ctx) d->cu.DevicePrimaryCtxRelease(d->dev);
    tj_cu_close(&d->cu);
    free(d);
}

tj_status tj_cuda_device_bind(tj_cuda_device *d, CUcontext *prev, tj_error *err)
{
    *prev = NULL;
    TJ_TRY_CU(&d->cu, err, CtxGetCurrent(prev));
    if (*prev != d->ctx) TJ_TRY_CU(&d->cu, err, CtxSetCurrent(d->ctx));
    return TJ_OK;
}

void tj_cuda_device_unbind(tj_cuda_device *d, CUcontext prev)
{
    if (prev != d->ctx) d->cu.CtxSetCurrent(prev);
}

void tj_cuda_device_describe(const tj_cuda_device *d, char *buf, size_t size)
{
    snprintf(buf, size, "%s, sm_%d, %d SMs, %.0f GiB, L2 %.0f MiB, driver %d.%d", d->name, d->sm, d->sm_count,
             (double)d->total_mem / (1 << 30), (double)d->l2_bytes / (1 << 20), d->cu.driver_version / 1000,
             d->cu.driver_version % 1000 / 10);
}

/* ---- layer data -------------------------------------------------------------------------- */

static tj_status upload(tj_cuda_device *d, CUdeviceptr *dst, const void *src, int64_t bytes, int64_t *total,
                        tj_error *err)
{
    *dst = 0;
    if (!src || bytes <= 0) return TJ_OK;
    TJ_TRY_CU(&d->cu, err, MemAlloc(dst, (size_t)bytes));
    *total += bytes;
    return TJ_CU(&d->cu, err, MemcpyHtoD(*dst, src, (size_t)bytes));
}

tj_status tj_cuda_data_upload(tj_cuda_device *d, const tj_layer *l, tj_dtype dtype, const void *w, tj_dtype wdt,
                              const void *bias, tj_dtype bdt, tj_cuda_data *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    out->dtype = dtype;
    tj_cuda_config c = tj_cuda_config_default(l);
    c.dtype = dtype; /* the packing depends on the dtype alone */
    tj_cuda_host_data h;
    TJ_TRY(tj_cuda_pack(l, &c, w, wdt, bias, bdt, &h, err));
    CUcontext prev;
    tj_status s = tj_cuda_device_bind(d, &prev, err);
    if (s != TJ_OK) {
        tj_cuda_host_data_free(&h);
        return s;
    }
    int64_t *t = &out->bytes;
    if (s == TJ_OK) s = upload(d, &out->w, h.w, h.w_elems * 2, t, err);
    if (s == TJ_OK) s = upload(d, &out->bias, h.bias, l->n * 4, t, err);
    if (s == TJ_OK) s = upload(d, &out->cols, h.cols, h.ncols * 4, t, err);
    if (s == TJ_OK) s = upload(d, &out->fill_rows, h.fill_rows, h.n_fill * 4, t, err);
    if (s == TJ_OK) s = upload(d, &out->ew_ptr, h.ew_ptr, h.ew_nnz ? (l->n + 1) * 4 : 0, t, err);
    if (s == TJ_OK) s = upload(d, &out->ew_idx, h.ew_idx, h.ew_nnz * 4, t, err);
    if (s == TJ_OK) s = upload(d, &out->ew_val, h.ew_val, h.ew_nnz * 4, t, err);
    if (s == TJ_OK) s = upload(d, &out->ew_rows, h.ew_rows, h.n_ew_rows * 4, t, err);
    out->n_fill = h.n_fill;
    out->n_ew_rows = h.n_ew_rows;
    tj_cuda_device_unbind(d, prev);
    tj_cuda_host_data_free(&h);
    if (s != TJ_OK) {
        tj_error_prefix(err, "layer '%s': uploading weights", l->name);
        tj_cuda_data_free(d, out);
    }
    return s;
}

void tj_cuda_data_free(tj_cuda_device *d, tj_cuda_data *data)
{
    if (!d || !data) return;
    CUdeviceptr *p[] = {&data->w, &data->bias, &data->cols, &data->fill_rows,
                        &data->ew_ptr, &data->ew_idx, &data->ew_val, &data->ew_rows};
    CUcontext prev = NULL;
    int bound = tj_cuda_device_bind(d, &prev, NULL) == TJ_OK;
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) {
        if (*p[i]) d->cu.MemFree(*p[i]);
        *p[i] = 0;
    }
    if (bound) tj_cuda_device_unbind(d, prev);
    data->bytes = 0;
}

/* ---- kernels ------------------------------------------------------------------------------- */

tj_status tj_cuda_config_fits(const tj_cuda_device *d, const tj_layer *l, const tj_cuda_config *cfg, tj_error *err)
{
    tj_status s = tj_cuda_config_check(cfg, err);
    if (s == TJ_OK) s = tj_cuda_config_fits_arch(cfg, d->sm, d->smem_optin, d->name, err);
    if (s != TJ_OK) tj_error_prefix(err, "layer '%s'", l->name);
    return s;
}

static tj_status get_function(tj_cuda_device *d, CUmodule mod, const char *name, int needed, CUfunction *out,
                              tj_error *err)
{
    *out = NULL;
    CUresult r = d->cu.ModuleGetFunction(out, mod, name);
    if (r == CUDA_ERROR_NOT_FOUND && !needed) {
        *out = NULL;
        return TJ_OK;
    }
    return tj_cu_result(&d->cu, r, "cuModuleGetFunction", __FILE__, __LINE__, err);
}

tj_status tj_cuda_kernel_load(tj_cuda_device *d, const tj_layer *l, const tj_cuda_config *cfg, const tj_cubin *bin,
                              tj_cuda_kernel **out, tj_error *err)
{
    *out = NULL;
    tj_cuda_launch launches[TJ_CUDA_MAX_LAUNCHES];
    int count = 0;
    TJ_TRY(tj_cuda_geometry(l, cfg, 1, launches, &count, err));
    int need_tiles = 0, need_fill = 0, need_ew = 0;
    for (int i = 0; i < count; i++) {
        need_tiles |= strcmp(launches[i].kernel, "tj_tiles") == 0;
        need_fill |= strcmp(launches[i].kernel, "tj_fill") == 0;
        need_ew |= strcmp(launches[i].kernel, "tj_ew") == 0;
    }
    tj_cuda_kernel *k = calloc(1, sizeof *k);
    if (!k) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    k->layer = l;
    k->cfg = *cfg;
    k->compile_seconds = bin->seconds;
    k->cache = bin->cache;
    k->spill_bytes = bin->spill_bytes;
    CUcontext prev;
    tj_status s = tj_cuda_device_bind(d, &prev, err);
    if (s != TJ_OK) {
        free(k);
        return s;
    }
    s = TJ_CU(&d->cu, err, ModuleLoadData(&k->mod, bin->data));
    if (s == TJ_OK) s = get_function(d, k->mod, "tj_tiles", need_tiles, &k->tiles, err);
    if (s == TJ_OK) s = get_function(d, k->mod, "tj_fill", need_fill, &k->fill, err);
    if (s == TJ_OK) s = get_function(d, k->mod, "tj_ew", need_ew, &k->ew, err);
    int64_t smem = tj_cuda_smem_bytes(cfg);
    if (s == TJ_OK && k->tiles && smem > 48 * 1024)
        s = TJ_CU(&d->cu, err, FuncSetAttribute(k->tiles, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem));
    if (s == TJ_OK && k->tiles) s = TJ_CU(&d->cu, err, FuncGetAttribute(&k->registers, CU_FUNC_ATTRIBUTE_NUM_REGS, k->tiles));
    /* Resident blocks per SM with this block size and shared memory: the persistent grid's size. */
    if (s == TJ_OK && k->tiles)
        s = TJ_CU(&d->cu, err, OccupancyMaxActiveBlocksPerMultiprocessor(&k->blocks_per_sm, k->tiles, 32 * cfg->warps,
                                                                        (size_t)smem));
    tj_cuda_device_unbind(d, prev);
    /* Persistent tj_tiles: as many blocks as are resident at once, each looping over work items
     * (docs/cuda-runtime.md); the occupancy calculator's 0 (cannot fit) leaves the full grid. */
    if (s == TJ_OK && k->tiles) k->max_grid = tj_cuda_tiles_grid_limit(cfg->tmpl, d->grid, d->sm_count, k->blocks_per_sm);
    if (s != TJ_OK) {
        tj_error_prefix(err, "layer '%s': loading its module", l->name);
        tj_cuda_kernel_destroy(d, k);
        return s;
    }
    *out = k;
    return TJ_OK;
}

tj_status tj_cuda_kernel_build(tj_cuda_device *d, tj_cache *cache, const tj_layer *l, const tj_cuda_config *cfg,
                               tj_cuda_kernel **out, tj_error *err)
{
    *out = NULL;
    TJ_TRY(tj_cuda_config_fits(d, l, cfg, err));
    char *src = NULL;
    TJ_TRY(tj_cuda_emit(l, cfg, &src, err));
    tj_cubin bin;
    memset(&bin, 0, sizeof bin);
    tj_status s = tj_nvrtc_compile(cache, src, l->name, tj_cuda_target_sm(cfg, d->sm), &bin, err);
    free(src);
    if (s == TJ_OK) s = tj_cuda_kernel_load(d, l, cfg, &bin, out, err);
    tj_cubin_free(&bin);
    return s;
}

void tj_cuda_kernel_destroy(tj_cuda_device *d, tj_cuda_kernel *k)
{
    if (!k) return;
    if (k->mod && d) {
        CUcontext prev = NULL;
        int bound = tj_cuda_device_bind(d, &prev, NULL) == TJ_OK;
        d->cu.ModuleUnload(k->mod);
        if (bound) tj_cuda_device_unbind(d, prev);
    }
    free(k);
}

tj_status tj_cuda_kernel_launch(tj_cuda_device *d, const tj_cuda_kernel *k, const tj_cuda_data *data, CUdeviceptr x,
                                int64_t ldx, CUdeviceptr y, int64_t ldy, int64_t m, CUstream stream, tj_error *err)
{
    const tj_layer *l = k->layer;
    if (data->dtype != k->cfg.dtype)
        return tj_fail(err, TJ_ERR_INTERNAL, "layer '%s': weights packed as %s for a %s kernel", l->name,
                       tj_dtype_name(data->dtype), tj_dtype_name(k->cfg.dtype));
    if (ldx < (k->cfg.x_fm ? m : l->k) || ldy < (k->cfg.y_fm ? m : l->n))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "layer '%s': leading dimensions ldx %lld / ldy %lld too small for M = %lld",
                       l->name, (long long)ldx, (long long)ldy, (long long)m);
    tj_cuda_launch launches[TJ_CUDA_MAX_LAUNCHES];
    int count = 0;
    TJ_TRY(tj_cuda_geometry(l, &k->cfg, m, launches, &count, err));
    tj_cuda_args a;
    memset(&a, 0, sizeof a);
    a.x = (const void *)(uintptr_t)x;
    a.y = (void *)(uintptr_t)y;
    a.w = (const void *)(uintptr_t)data->w;
    a.bias = (const float *)(uintptr_t)data->bias;
    a.cols = (const int32_t *)(uintptr_t)data->cols;
    a.fill_rows = (const int32_t *)(uintptr_t)data->fill_rows;
    a.ew_ptr = (const int32_t *)(uintptr_t)data->ew_ptr;
    a.ew_idx = (const int32_t *)(uintptr_t)data->ew_idx;
    a.ew_val = (const float *)(uintptr_t)data->ew_val;
    a.ew_rows = (const int32_t *)(uintptr_t)data->ew_rows;
    a.ldx = ldx;
    a.ldy = ldy;
    a.m = (int32_t)m;
    a.n_fill = (int32_t)data->n_fill;
    a.n_ew_rows = (int32_t)data->n_ew_rows;
    /* A misaligned or short view is a message here, never a fault in the kernel. */
    tj_status s = tj_cuda_args_check(l, &k->cfg, &a, err);
    if (s != TJ_OK) return s;
    void *params[] = {&a};
    CUcontext prev = NULL;
    TJ_TRY(tj_cuda_device_bind(d, &prev, err));
    for (int i = 0; i < count && s == TJ_OK; i++) {
        const tj_cuda_launch *L = &launches[i];
        CUfunction f = strcmp(L->kernel, "tj_tiles") == 0 ? k->tiles : strcmp(L->kernel, "tj_fill") == 0 ? k->fill : k->ew;
        if (!f) {
            s = tj_fail(err, TJ_ERR_INTERNAL, "layer '%s': module has no %s", l->name, L->kernel);
            break;
        }
        uint32_t gx = L->grid[0];
        if (f == k->tiles) gx = tj_cuda_tiles_grid(gx, k->max_grid);
        s = TJ_CU(&d->cu, err, LaunchKernel(f, gx, L->grid[1], L->grid[2], L->block[0], L->block[1], L->block[2],
                                            L->smem, stream, params, NULL));
        if (s != TJ_OK) {
            tj_error_prefix(err, "layer '%s': launching %s (grid %u, block %u, smem %u)", l->name, L->kernel,
                            gx, L->block[0], L->smem);
            break;
        }
        /* Sync-check mode: a fault surfaces here, attributed to this layer and kernel, instead of
         * at some later call of some other layer (errors of asynchronous launches are sticky). */
        if (d->sync_check && (s = TJ_CU(&d->cu, err, StreamSynchronize(stream))) != TJ_OK)
            tj_error_prefix(err, "layer '%s': kernel %s (grid %u, block %u, smem %u, M %lld) failed on the device "
                            "(TILEJIT_SYNC_CHECK)", l->name, L->kernel, gx, L->block[0], L->smem, (long long)m);
    }
    tj_cuda_device_unbind(d, prev);
    return s;
}

/* ---- the backend ------------------------------------------------------------------------------ */

/* Variants of a layer's kernel a call may need, beyond the one compiled at load. */
#define VAR_SIMT 2  /* 0: the layer's config, 1: the SIMT fallback (unaligned feature-major x) */
#define VAR_COUNT (VAR_SIMT * 2 * 2 * 2 * 3)

typedef struct cuda_ctx {
    tj_cuda_device *dev;
    tj_cache *cache;      /* opened at the first model load */
    int cache_opened;
} cuda_ctx;

typedef struct cuda_layer {
    tj_cuda_config cfg;   /* the layer's config: what load compiles */
    _Atomic(tj_cuda_data *) data[2];          /* packed weights: [0] fp16, [1] bf16 */
    _Atomic(tj_cuda_kernel *) var[VAR_COUNT]; /* by variant_index */
} cuda_layer;

typedef struct cuda_model {
    cuda_ctx *cc;
    pthread_mutex_t lock; /* serialises lazy variant builds and uploads */
    cuda_layer *layers;
    int64_t nlayers;
} cuda_model;

static int out_kind(tj_dtype d) { return d == TJ_F32 ? 0 : d == TJ_F16 ? 1 : 2; }

static int variant_index(const tj_cuda_config *c, int simt)
{
    return (((simt * 2 + !!c->x_fm) * 2 + !!c->y_fm) * 2 + (c->dtype == TJ_BF16)) * 3 + out_kind(c->out);
}

/* The wgmma default (sm_90a): one warpgroup, 64 features x 128 tokens, 64 kept rows per stage. */
static tj_cuda_config wgmma_default(const tj_layer *l)
{
    tj_cuda_config c = tj_cuda_config_default(l);
    c.tmpl = TJ_CUDA_TEMPLATE_WGMMA;
    c.bm = 128;
    c.bn = 64;
    c.bk = 64;
    c.warps = 4;
    c.stages = 4;
    return c;
}

/* wgmma gathers feature-major x only: a row-major call runs the layer's mma default instead. */
static void wgmma_row_major_fallback(const tj_layer *l, tj_cuda_config *c)
{
    if (c->tmpl != TJ_CUDA_TEMPLATE_WGMMA || c->x_fm) return;
    tj_cuda_config m = tj_cuda_config_default(l);
    m.x_fm = c->x_fm;
    m.y_fm = c->y_fm;
    m.dtype = c->dtype;
    m.out = c->out;
    *c = m;
}

/* The SIMT kernel with the same tiling along features: correct for any alignment. */
static tj_cuda_config simt_fallback(const tj_cuda_config *c)
{
    tj_cuda_config s = *c;
    s.tmpl = TJ_CUDA_TEMPLATE_SIMT;
    s.warps = 4;
    s.bm = 32;
    s.stages = 1;
    return s;
}

tj_cuda_device *tj_cuda_context_device(tj_context *c)
{
    return c && c->cuda ? ((cuda_ctx *)c->cuda)->dev : NULL;
}

void tj_cuda_context_release(tj_context *c)
{
    if (!c || !c->cuda) return;
    cuda_ctx *cc = c->cuda;
    tj_cache_close(cc->cache);
    tj_cuda_device_close(cc->dev);
    free(cc);
    c->cuda = NULL;
}

static tj_status cuda_available(tj_context *c, tj_error *err)
{
    if (c->cuda) return TJ_OK;
    cuda_ctx *cc = calloc(1, sizeof *cc);
    if (!cc) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    tj_status s = tj_cuda_device_open(c->opt.device, &cc->dev, err);
    if (s != TJ_OK) {
        free(cc);
        tj_error_prefix(err, "CUDA backend unavailable");
        return s;
    }
    c->cuda = cc;
    char desc[512];
    tj_cuda_device_describe(cc->dev, desc, sizeof desc);
    tj_context_note(c, "cuda: device %d: %s", c->opt.device, desc);
    if (cc->dev->sync_check) tj_context_note(c, "cuda: TILEJIT_SYNC_CHECK: synchronising after every kernel launch");
    return TJ_OK;
}

static void cuda_unload(tj_model *m)
{
    cuda_model *cm = m->state;
    if (!cm) return;
    tj_cuda_device *d = cm->cc->dev;
    for (int64_t i = 0; i < cm->nlayers; i++) {
        cuda_layer *L = &cm->layers[i];
        for (int v = 0; v < VAR_COUNT; v++) tj_cuda_kernel_destroy(d, atomic_load(&L->var[v]));
        for (int t = 0; t < 2; t++) {
            tj_cuda_data *data = atomic_load(&L->data[t]);
            tj_cuda_data_free(d, data);
            free(data);
        }
    }
    free(cm->layers);
    pthread_mutex_destroy(&cm->lock);
    free(cm);
    m->state = NULL;
}

/* The packed weights of layer i in dtype dt, uploaded on first use (caller holds cm->lock, or
 * is the loader). */
static tj_status layer_data_locked(tj_model *m, int64_t i, tj_dtype dt, tj_cuda_data **out, tj_error *err)
{
    cuda_model *cm = m->state;
    cuda_layer *L = &cm->layers[i];
    int slot = dt == TJ_BF16;
    tj_cuda_data *data = atomic_load_explicit(&L->data[slot], memory_order_acquire);
    if (!data) {
        data = calloc(1, sizeof *data);
        if (!data) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        const tj_layer_weights *w = &m->lw[i];
        tj_status s = tj_cuda_data_upload(cm->cc->dev, &m->pattern->layers[i], dt, w->w, w->wdt, w->bias, w->bdt, data, err);
        if (s != TJ_OK) {
            free(data);
            return s;
        }
        atomic_store_explicit(&L->data[slot], data, memory_order_release);
    }
    *out = data;
    return TJ_OK;
}

static tj_status cuda_load(tj_model *m, tj_error *err)
{
    tj_context *c = m->ctx;
    cuda_ctx *cc = c->cuda;
    if (!cc) return tj_fail(err, TJ_ERR_INTERNAL, "CUDA backend used without a device");
    TJ_TRY(tj_context_open_cache(c, "cuda", &cc->cache, &cc->cache_opened, err));
    tj_cuda_device *d = cc->dev;
    const tj_pattern *p = m->pattern;
    cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_init(&cm->lock, NULL);
    cm->cc = cc;
    cm->layers = calloc((size_t)(p->nlayers ? p->nlayers : 1), sizeof *cm->layers);
    m->state = cm;
    if (!cm->layers) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    cm->nlayers = p->nlayers;

    char arch[16];
    snprintf(arch, sizeof arch, "sm_%d", d->sm);
    tj_nvrtc_job *jobs = calloc((size_t)(p->nlayers ? p->nlayers : 1), sizeof *jobs);
    char **sources = calloc((size_t)(p->nlayers ? p->nlayers : 1), sizeof *sources);
    tj_status s = jobs && sources ? TJ_OK : tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < p->nlayers && s == TJ_OK; i++) {
        const tj_layer *l = &p->layers[i];
        cuda_layer *L = &cm->layers[i];
        L->cfg = d->wgmma_default ? wgmma_default(l) : tj_cuda_config_default(l);
        const char *json = tj_context_config_for(c, "cuda", d->name, arch, l, 0);
        if (json) {
            s = tj_cuda_config_from_json(json, &L->cfg, err);
            if (s != TJ_OK) {
                tj_error_prefix(err, "layer '%s'", l->name);
                break;
            }
        }
        s = tj_cuda_config_fits(d, l, &L->cfg, err);
        if (s == TJ_OK) s = tj_cuda_emit(l, &L->cfg, &sources[i], err);
        jobs[i].source = sources[i];
        jobs[i].label = l->name;
        jobs[i].sm = tj_cuda_target_sm(&L->cfg, d->sm);
    }
    double t0 = tj_now();
    if (s == TJ_OK) {
        s = tj_nvrtc_compile_all(cc->cache, jobs, p->nlayers, c->opt.threads, err);
        for (int64_t i = 0; s != TJ_OK && i < p->nlayers; i++)
            if (jobs[i].status != TJ_OK) {
                *err = jobs[i].error;
                break;
            }
    }
    double t_compile = tj_now() - t0;
    int64_t hits = 0;
    for (int64_t i = 0; i < p->nlayers && s == TJ_OK; i++) {
        const tj_layer *l = &p->layers[i];
        cuda_layer *L = &cm->layers[i];
        tj_cuda_kernel *k = NULL;
        hits += jobs[i].result.cache == TJ_CACHE_HIT;
        s = tj_cuda_kernel_load(d, l, &L->cfg, &jobs[i].result, &k, err);
        if (s == TJ_OK) atomic_store(&L->var[variant_index(&L->cfg, 0)], k);
        tj_cuda_data *data;
        if (s == TJ_OK) s = layer_data_locked(m, i, L->cfg.dtype, &data, err);
    }
    for (int64_t i = 0; jobs && i < p->nlayers; i++) tj_cubin_free(&jobs[i].result);
    for (int64_t i = 0; sources && i < p->nlayers; i++) free(sources[i]);
    free(jobs);
    free(sources);
    if (s == TJ_OK)
        tj_context_note(c, "cuda: %lld layers compiled for %s in %.3f s (%lld cache hits)", (long long)p->nlayers, arch,
                        t_compile, (long long)hits);
    /* On failure model.c calls cuda_unload, which frees what was made. */
    return s;
}

/* The kernel for (layer i, variant cfg), compiled on first use. */
static tj_status layer_kernel(tj_model *m, int64_t i, const tj_cuda_config *cfg, int simt, tj_cuda_kernel **out,
                              tj_error *err)
{
    cuda_model *cm = m->state;
    cuda_layer *L = &cm->layers[i];
    int v = variant_index(cfg, simt);
    tj_cuda_kernel *k = atomic_load_explicit(&L->var[v], memory_order_acquire);
    if (k) {
        *out = k;
        return TJ_OK;
    }
    tj_status s = TJ_OK;
    pthread_mutex_lock(&cm->lock);
    k = atomic_load_explicit(&L->var[v], memory_order_acquire);
    if (!k) {
        tj_cuda_config vc = simt ? simt_fallback(cfg) : *cfg;
        s = tj_cuda_kernel_build(cm->cc->dev, cm->cc->cache, &m->pattern->layers[i], &vc, &k, err);
        if (s == TJ_OK) {
            atomic_store_explicit(&L->var[v], k, memory_order_release);
            tj_strbuf sb;
            tj_sb_init(&sb);
            tj_cuda_config_to_json(&vc, &sb);
            tj_context_note(m->ctx, "cuda: layer '%s': compiled variant %s in %.3f s", m->pattern->layers[i].name,
                            sb.data ? sb.data : "", k->compile_seconds);
            tj_sb_free(&sb);
        }
    }
    pthread_mutex_unlock(&cm->lock);
    *out = k;
    return s;
}

static tj_status layer_data(tj_model *m, int64_t i, tj_dtype dt, tj_cuda_data **out, tj_error *err)
{
    cuda_model *cm = m->state;
    tj_cuda_data *data = atomic_load_explicit(&cm->layers[i].data[dt == TJ_BF16], memory_order_acquire);
    if (data) {
        *out = data;
        return TJ_OK;
    }
    pthread_mutex_lock(&cm->lock);
    tj_status s = layer_data_locked(m, i, dt, out, err);
    pthread_mutex_unlock(&cm->lock);
    return s;
}

/* ---- tensors ---- */

static int is_host_dev(DLDeviceType t) { return t == kDLCPU || t == kDLCUDAHost; }
static int is_cuda_dev(DLDeviceType t) { return t == kDLCUDA || t == kDLCUDAManaged; }

/* Leading dimension of a device tensor the kernels can address directly: unit inner stride. */
static tj_status device_ld(const DLTensor *t, const char *what, int64_t *ld, tj_error *err)
{
    int64_t st[2];
    tj_dl_strides(t, st);
    if (t->shape[0] <= 1) st[0] = st[0] > t->shape[1] ? st[0] : t->shape[1];
    if (st[1] != 1 || st[0] < t->shape[1])
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "%s: device tensor strides [%lld, %lld] not supported: the CUDA kernels need a unit inner stride "
                       "and an outer stride >= %lld",
                       what, (long long)st[0], (long long)st[1], (long long)t->shape[1]);
    *ld = st[0];
    return TJ_OK;
}

/* Device tensors: launched in place on the caller's stream. */
static tj_status linear_device(tj_model *m, int64_t layer, const tj_linear_args *a, tj_dtype xdt, tj_dtype ydt,
                               tj_error *err)
{
    cuda_model *cm = m->state;
    tj_cuda_device *d = cm->cc->dev;
    const DLTensor *x = a->x;
    DLTensor *y = a->y;
    int fm = a->layout == TJ_LAYOUT_FEATURE_MAJOR;
    if (x->device.device_id != d->ordinal || y->device.device_id != d->ordinal)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "x/y are on CUDA device %d/%d, but the context uses device %d",
                       x->device.device_id, y->device.device_id, d->ordinal);
    if (xdt == TJ_F32)
        return tj_fail(err, TJ_ERR_UNSUPPORTED,
                       "x: float32 device tensors are not supported by the CUDA kernels; pass float16 or bfloat16 "
                       "(or a host tensor, converted on the way)");
    int64_t ldx = 0, ldy = 0;
    TJ_TRY(device_ld(x, "x", &ldx, err));
    TJ_TRY(device_ld(y, "y", &ldy, err));
    CUdeviceptr xp = (CUdeviceptr)(uintptr_t)x->data + x->byte_offset;
    CUdeviceptr yp = (CUdeviceptr)(uintptr_t)y->data + y->byte_offset;
    /* Views at any element offset are fine (the kernels check vector alignment themselves or the
     * SIMT kernel runs); a pointer that is not even aligned to its element is a caller's bug. */
    size_t ysz = tj_dtype_size(ydt);
    if ((xp & 1) || (yp & (ysz - 1)))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: device address 0x%llx (data + byte_offset) is not aligned to its "
                       "%zu-byte elements", (xp & 1) ? "x" : "y", (unsigned long long)((xp & 1) ? xp : yp),
                       (xp & 1) ? (size_t)2 : ysz);
    tj_cuda_config cfg = cm->layers[layer].cfg;
    cfg.x_fm = cfg.y_fm = fm;
    cfg.dtype = xdt;
    cfg.out = ydt;
    wgmma_row_major_fallback(&m->pattern->layers[layer], &cfg);
    int simt = cfg.tmpl != TJ_CUDA_TEMPLATE_SIMT && fm && ((xp % 16) != 0 || (ldx % 8) != 0);
    tj_cuda_kernel *k;
    tj_cuda_data *data;
    TJ_TRY(layer_kernel(m, layer, &cfg, simt, &k, err));
    TJ_TRY(layer_data(m, layer, xdt, &data, err));
    return tj_cuda_kernel_launch(d, k, data, xp, ldx, yp, ldy, a->m, (CUstream)a->stream, err);
}

/* Host tensors: converted into a contiguous staging copy in the kernel's dtype, run, copied back;
 * synchronous on the caller's stream. */
static tj_status linear_staged(tj_model *m, int64_t layer, const tj_linear_args *a, tj_dtype xdt, tj_dtype ydt,
                               tj_error *err)
{
    cuda_model *cm = m->state;
    tj_cuda_device *d = cm->cc->dev;
    const tj_layer *l = &m->pattern->layers[layer];
    int fm = a->layout == TJ_LAYOUT_FEATURE_MAJOR;
    tj_cuda_config cfg = cm->layers[layer].cfg;
    cfg.x_fm = cfg.y_fm = fm;
    cfg.dtype = xdt == TJ_F32 ? cfg.dtype : xdt;
    cfg.out = ydt;
    wgmma_row_major_fallback(l, &cfg);
    /* Staging layouts: x as [K × ldx] (fm, ldx = M rounded up to 8 for 16-byte rows) or [M × K]. */
    int64_t xr = fm ? l->k : a->m, xc = fm ? a->m : l->k, ldx = fm ? (a->m + 7) / 8 * 8 : l->k;
    int64_t yr = fm ? l->n : a->m, yc = fm ? a->m : l->n, ldy = yc;
    int64_t xbytes, ybytes;
    if (!tj_mul_ok(xr, ldx, &xbytes) || !tj_mul_ok(xbytes, 2, &xbytes) || !tj_mul_ok(yr, ldy, &ybytes) ||
        !tj_mul_ok(ybytes, (int64_t)tj_dtype_size(ydt), &ybytes))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "M = %lld is too large", (long long)a->m);
    tj_cuda_kernel *k;
    tj_cuda_data *data;
    TJ_TRY(layer_kernel(m, layer, &cfg, 0, &k, err));
    TJ_TRY(layer_data(m, layer, cfg.dtype, &data, err));

    uint16_t *hx = calloc((size_t)xbytes / 2 + 1, 2);
    void *hy = malloc((size_t)ybytes + 4);
    if (!hx || !hy) {
        free(hx);
        free(hy);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory staging x and y");
    }
    {
        tj_dtype sdt = TJ_F32;
        tj_dl_dtype(a->x, &sdt);
        int64_t st[2];
        tj_dl_strides(a->x, st);
        const char *base = (const char *)a->x->data + a->x->byte_offset;
        for (int64_t i = 0; i < xr; i++)
            for (int64_t j = 0; j < xc; j++) {
                float v = tj_load_f32(base, sdt, i * st[0] + j * st[1]);
                hx[i * ldx + j] = cfg.dtype == TJ_BF16 ? tj_f32_to_bf16(v) : tj_f32_to_f16(v);
            }
    }
    CUstream stream = (CUstream)a->stream;
    CUdeviceptr dx = 0, dy = 0;
    CUcontext prev;
    tj_status s = tj_cuda_device_bind(d, &prev, err);
    if (s != TJ_OK) goto done;
    s = TJ_CU(&d->cu, err, MemAlloc(&dx, (size_t)xbytes));
    if (s == TJ_OK) s = TJ_CU(&d->cu, err, MemAlloc(&dy, (size_t)ybytes));
    if (s == TJ_OK) s = TJ_CU(&d->cu, err, MemcpyHtoDAsync(dx, hx, (size_t)xbytes, stream));
    if (s == TJ_OK) s = tj_cuda_kernel_launch(d, k, data, dx, ldx, dy, ldy, a->m, stream, err);
    if (s == TJ_OK) s = TJ_CU(&d->cu, err, MemcpyDtoHAsync(hy, dy, (size_t)ybytes, stream));
    if (s == TJ_OK) s = TJ_CU(&d->cu, err, StreamSynchronize(stream));
    if (dx) d->cu.MemFree(dx);
    if (dy) d->cu.MemFree(dy);
    tj_cuda_device_unbind(d, prev);
    if (s == TJ_OK) {
        tj_dtype odt = ydt;
        int64_t st[2];
        tj_dl_strides(a->y, st);
        char *base = (char *)a->y->data + a->y->byte_offset;
        for (int64_t i = 0; i < yr; i++)
            for (int64_t j = 0; j < yc; j++) {
                float v = tj_load_f32(hy, odt, i * ldy + j);
                int64_t e = i * st[0] + j * st[1];
                if (odt == TJ_F32) memcpy(base + 4 * e, &v, 4);
                else {
                    uint16_t h = odt == TJ_F16 ? tj_f32_to_f16(v) : tj_f32_to_bf16(v);
                    memcpy(base + 2 * e, &h, 2);
                }
            }
    }
done:
    free(hx);
    free(hy);
    return s;
}

static tj_status cuda_linear(tj_model *m, int64_t layer, const tj_linear_args *a, tj_error *err)
{
    tj_dtype xdt, ydt;
    if (!m->state) return tj_fail(err, TJ_ERR_INTERNAL, "CUDA model not loaded");
    if (!tj_dl_dtype(a->x, &xdt) || !tj_dl_dtype(a->y, &ydt))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "unsupported dtype");
    DLDeviceType xt = a->x->device.device_type, yt = a->y->device.device_type;
    if (!is_host_dev(xt) && !is_cuda_dev(xt))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "x: DLPack device type %d is not supported by the CUDA backend (kDLCUDA, kDLCUDAManaged, kDLCPU "
                       "or kDLCUDAHost)", (int)xt);
    if (!is_host_dev(yt) && !is_cuda_dev(yt))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "y: DLPack device type %d is not supported by the CUDA backend (kDLCUDA, kDLCUDAManaged, kDLCPU "
                       "or kDLCUDAHost)", (int)yt);
    if (is_cuda_dev(xt) != is_cuda_dev(yt))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "x is in %s memory but y in %s memory: pass both on the device or both on the host",
                       is_cuda_dev(xt) ? "device" : "host", is_cuda_dev(yt) ? "device" : "host");
    return is_cuda_dev(xt) ? linear_device(m, layer, a, xdt, ydt, err) : linear_staged(m, layer, a, xdt, ydt, err);
}

const tj_backend_ops tj_backend_cuda_ops = {
    .name = "cuda",
    .kind = TJ_BACKEND_CUDA,
    .host_f32 = 0,
    .available = cuda_available,
    .load = cuda_load,
    .linear = cuda_linear,
    .unload = cuda_unload,
    .release = tj_cuda_context_release,
};
