/* The CUDA backend's host-side logic, on any machine: no driver (TILEJIT_LIBCUDA pointing at a
 * missing library), a driver whose cuInit fails, no device, a too-old device, and a pretend sm_90
 * (tests/fake_libcuda.c) on which models load for real through NVRTC and the cache, and every
 * tj_linear call's checks, staging copies, variant selection and launch arguments are observed.
 * Kernels do not run here: their numbers are checked on a GPU by test_cuda_backend. */
#include <dlfcn.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/backend_cuda.h"
#include "fake_libcuda.h"
#include "base/npy.h"
#include "pattern/pattern.h"
#include "pattern/random.h"
#include "base/safetensors.h"
#include "tj_test.h"

static char tmp[256];
static const char *fake_path;
static int (*fake_count)(void);
static const tj_fake_launch *(*fake_launch)(int);
static void (*fake_reset)(void);
static int (*fake_allocs)(void);

static char *path(const char *name)
{
    static char bufs[4][512];
    static int i;
    char *b = bufs[i++ % 4];
    snprintf(b, 512, "%s/%s", tmp, name);
    return b;
}

/* Two layers: A (cols, ew, bias, gelu, odd n and k) and B (tw1, g 16, no bias). */
static tj_layer layers[2];

static int write_model(void)
{
    tj_error err;
    tj_random_spec a = {.n = 300, .k = 200, .g = 128, .sparsity = 0.6, .mode = 2, .seed = 3, .ew_fraction = 0.01,
                        .act = TJ_ACT_GELU};
    tj_random_spec b = {.n = 64, .k = 40, .g = 16, .sparsity = 0.5, .mode = 1, .seed = 4, .empty_tile_fraction = 0.25};
    if (tj_random_layer(&a, "enc.0.fc1", &layers[0], &err) != TJ_OK) return 0;
    if (tj_random_layer(&b, "enc.0.fc2", &layers[1], &err) != TJ_OK) return 0;
    tj_pattern p = {.nlayers = 2, .layers = layers};
    if (tj_pattern_save(&p, path("m.json"), &err) != TJ_OK) return 0;
    tj_rng r = {7};
    float *wa = malloc(300 * 200 * 4), *ba = malloc(300 * 4), *wb = malloc(64 * 40 * 4);
    tj_test_fill(&r, wa, 300 * 200);
    tj_test_fill(&r, ba, 300);
    tj_test_fill(&r, wb, 64 * 40);
    int64_t sa[2] = {300, 200}, sba[1] = {300}, sb[2] = {64, 40};
    tj_st_out_tensor t[3] = {{"enc.0.fc1.weight", "F32", 2, sa, wa, 300 * 200 * 4},
                             {"enc.0.fc1.bias", "F32", 1, sba, ba, 300 * 4},
                             {"enc.0.fc2.weight", "F32", 2, sb, wb, 64 * 40 * 4}};
    int ok = tj_st_write(path("m.safetensors"), t, 3, NULL, &err) == TJ_OK;
    free(wa);
    free(ba);
    free(wb);
    return ok;
}

static tj_status make_context(tj_backend b, int verbose, int device, tj_context **ctx)
{
    tj_options o = tj_options_default();
    o.backend = b;
    o.verbose = verbose;
    o.device = device;
    return tj_context_create(&o, ctx);
}

static void test_no_driver(void)
{
    setenv("TILEJIT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    tj_context *ctx = NULL;
    CHECK(make_context(TJ_BACKEND_CUDA, 0, 0, &ctx) == TJ_ERR_UNSUPPORTED && !ctx);
    CHECKF(strstr(tj_last_error(), "no NVIDIA driver: cannot load /nonexistent/libcuda.so.1"), "%s", tj_last_error());
    CHECK(make_context(TJ_BACKEND_AUTO, 1, 0, &ctx) == TJ_OK);
    if (ctx) {
        CHECK(tj_context_backend(ctx) != TJ_BACKEND_CUDA);
        CHECKF(strstr(tj_context_log(ctx), "auto: backend cuda unavailable: CUDA backend unavailable: no NVIDIA driver"),
               "%s", tj_context_log(ctx));
        /* And the model runs there. */
        tj_model *m = NULL;
        CHECKF(tj_model_load(ctx, path("m.json"), path("m.safetensors"), &m) == TJ_OK, "%s", tj_context_error(ctx));
        float x[3 * 200], y[3 * 300];
        for (int i = 0; i < 3 * 200; i++) x[i] = (float)(i % 7) - 3;
        int64_t xs[2] = {3, 200}, ys[2] = {3, 300};
        DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
        DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
        CHECK(m && tj_linear(m, "enc.0.fc1", &xt, &yt, NULL) == TJ_OK);
        tj_model_destroy(m);
    }
    tj_context_destroy(ctx);
}

static void test_driver_errors(void)
{
    /* A library that is not a CUDA driver: the first missing entry point is named. */
    setenv("TILEJIT_LIBCUDA", "libm.so.6", 1);
    tj_context *c0 = NULL;
    CHECK(make_context(TJ_BACKEND_CUDA, 0, 0, &c0) == TJ_ERR_UNSUPPORTED && !c0);
    CHECKF(strstr(tj_last_error(), "CUDA driver libm.so.6 lacks entry point cuGetErrorName"), "%s", tj_last_error());
    setenv("TILEJIT_LIBCUDA", fake_path, 1);
    static const struct { const char *mode, *msg; } cases[] = {
        {"noinit", "cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"},
        {"nodevice", "no CUDA device found (driver 13.0"},
        {"old", "has compute capability 7.5; tilejit's kernels need 8.0 or newer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        setenv("TJ_FAKE_CUDA", cases[i].mode, 1);
        tj_context *ctx = NULL;
        CHECK(make_context(TJ_BACKEND_CUDA, 0, 0, &ctx) != TJ_OK && !ctx);
        CHECKF(strstr(tj_last_error(), cases[i].msg) && strstr(tj_last_error(), "CUDA backend unavailable"),
               "%s: %s", cases[i].mode, tj_last_error());
        CHECK(make_context(TJ_BACKEND_AUTO, 1, 0, &ctx) == TJ_OK);
        CHECK(ctx && tj_context_backend(ctx) != TJ_BACKEND_CUDA && strstr(tj_context_log(ctx), cases[i].msg));
        tj_context_destroy(ctx);
    }
    setenv("TJ_FAKE_CUDA", "sm90", 1);
    tj_context *ctx = NULL;
    CHECK(make_context(TJ_BACKEND_CUDA, 0, 1, &ctx) != TJ_OK);
    CHECKF(strstr(tj_last_error(), "CUDA device 1 does not exist"), "%s", tj_last_error());
    CHECK(make_context(TJ_BACKEND_AUTO, 1, 0, &ctx) == TJ_OK && ctx && tj_context_backend(ctx) == TJ_BACKEND_CUDA);
    CHECKF(ctx && strstr(tj_context_log(ctx), "cuda: device 0: Fake GPU, sm_90, 132 SMs"), "%s", tj_context_log(ctx));
    tj_context_destroy(ctx);
}

static const tj_cuda_args *args_of(const tj_fake_launch *L) { return (const tj_cuda_args *)(const void *)L->args; }

static int launches_named(int from, const char *a, const char *b, const char *c)
{
    const char *want[3] = {a, b, c};
    int n = fake_count() - from, j = 0;
    for (int i = 0; i < 3 && want[i]; i++, j++)
        if (j >= n || strcmp(fake_launch(from + j)->kernel, want[i]) != 0) return 0;
    return j == n;
}

typedef struct tcase {
    tj_model *m;
    int seed;
    int failures;
} tcase;

/* One call on device tensors (pretend device memory is host memory); x and y start xofs / yofs
 * bytes into their buffers (a slice view). */
static tj_status device_call_at(tj_model *m, int64_t layer, int fm, int64_t M, int bf16x, int f16y, int xofs, int yofs)
{
    const tj_layer *l = &layers[layer];
    int64_t ldx = fm ? (M + 7) / 8 * 8 + 8 : l->k + 3, xr = fm ? l->k : M, ldy = fm ? M : l->n, yr = fm ? l->n : M;
    char *xb = calloc((size_t)(xr * ldx + 8), 2), *yb = calloc((size_t)(yr * ldy + 4), f16y ? 2 : 4);
    int64_t xs[2] = {fm ? l->k : M, fm ? M : l->k}, ys[2] = {fm ? l->n : M, fm ? M : l->n}, xst[2] = {ldx, 1};
    DLTensor xt = {.data = xb, .device = {kDLCUDA, 0}, .ndim = 2, .shape = xs, .strides = xst,
                   .byte_offset = (uint64_t)xofs, .dtype = {bf16x ? kDLBfloat : kDLFloat, 16, 1}};
    DLTensor yt = {.data = yb, .device = {kDLCUDA, 0}, .ndim = 2, .shape = ys, .byte_offset = (uint64_t)yofs,
                   .dtype = {kDLFloat, f16y ? 16 : 32, 1}};
    tj_status s = tj_linear_ex(m, layer, &xt, &yt, fm ? TJ_LAYOUT_FEATURE_MAJOR : TJ_LAYOUT_ROW_MAJOR, (void *)0x1234);
    free(xb);
    free(yb);
    return s;
}

static tj_status device_call(tj_model *m, int64_t layer, int fm, int64_t M, int bf16x, int f16y, int misalign)
{
    return device_call_at(m, layer, fm, M, bf16x, f16y, misalign ? 2 : 0, 0);
}

static void *thread_main(void *arg)
{
    tcase *t = arg;
    tj_rng r = {(uint64_t)t->seed};
    for (int i = 0; i < 24; i++) {
        uint64_t v = tj_rng_next(&r);
        /* Layouts and alignment vary (6 variants over the two layers, compiled once each on a
         * cold cache); dtypes stay fp16 → fp32 to keep the compile count small. */
        if (device_call(t->m, (int64_t)(v & 1), (int)(v >> 1 & 1), 1 + (int64_t)(v >> 8) % 50, 0, 0,
                        (int)(v >> 4 & 1)) != TJ_OK)
            t->failures++;
    }
    return NULL;
}

static void test_fake_gpu(void)
{
    setenv("TILEJIT_LIBCUDA", fake_path, 1);
    setenv("TJ_FAKE_CUDA", "sm90", 1);
    tj_context *ctx = NULL;
    tj_model *m = NULL;
    CHECK(make_context(TJ_BACKEND_CUDA, 1, 0, &ctx) == TJ_OK);
    if (!ctx) return;
    CHECK(tj_cuda_context_device(ctx) && tj_cuda_context_device(ctx)->sm == 90);
    tj_status s = tj_model_load(ctx, path("m.json"), path("m.safetensors"), &m);
    CHECKF(s == TJ_OK, "load: %s", tj_context_error(ctx));
    if (!m) {
        tj_context_destroy(ctx);
        return;
    }
    CHECKF(strstr(tj_context_log(ctx), "cuda: 2 layers compiled for sm_90"), "%s", tj_context_log(ctx));
    const tj_layer *A = &layers[0];

    /* Host tensors, row-major fp32: staged, converted to fp16, launched, copied back. */
    int64_t M = 5;
    float *x = malloc((size_t)(M * A->k) * 4), *y = malloc((size_t)(M * A->n) * 4);
    for (int64_t i = 0; i < M * A->k; i++) x[i] = 1.0f;
    for (int64_t i = 0; i < M * A->n; i++) y[i] = NAN;
    int64_t xs[2] = {M, A->k}, ys[2] = {M, A->n};
    DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
    DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
    fake_reset();
    CHECKF(tj_linear(m, "enc.0.fc1", &xt, &yt, NULL) == TJ_OK, "%s", tj_context_error(ctx));
    CHECKF(launches_named(0, "tj_tiles", "tj_fill", "tj_ew"), "%d launches", fake_count());
    if (fake_count() == 3) {
        const tj_cuda_args *a = args_of(fake_launch(0));
        CHECK(a->m == M && a->ldx == A->k && a->ldy == A->n);
        CHECK(a->x && a->y && a->w && a->bias && a->cols && a->fill_rows && a->ew_ptr && a->ew_idx && a->ew_val && a->ew_rows);
        CHECK(a->n_fill == A->n - A->ncols && a->n_fill > 0 && a->n_ew_rows > 0 && a->reserved == 0);
        /* The staged fp16 copy of x: 1.0 is 0x3c00. */
        CHECK(fake_launch(0)->x_head[0] == 0x00 && fake_launch(0)->x_head[1] == 0x3c);
        CHECK(fake_launch(0)->stream == NULL);
        /* tj_tiles' geometry follows the default config: 8 warps, dynamic shared memory. */
        CHECK(fake_launch(0)->block[0] == 256 && fake_launch(0)->smem > 0);
        CHECK(fake_launch(1)->block[0] == TJ_CUDA_AUX_THREADS);
    }
    int zeros = 1;
    for (int64_t i = 0; i < M * A->n; i++) zeros &= y[i] == 0.0f; /* the pretend kernels write nothing */
    CHECKF(zeros, "y was not copied back from the staging buffer");

    /* Feature-major host tensors: x staged as [k × ldx] with ldx rounded up to 8. */
    int64_t xsf[2] = {A->k, M}, ysf[2] = {A->n, M};
    xt.shape = xsf;
    yt.shape = ysf;
    fake_reset();
    CHECKF(tj_linear_ex(m, 0, &xt, &yt, TJ_LAYOUT_FEATURE_MAJOR, NULL) == TJ_OK, "%s", tj_context_error(ctx));
    CHECK(fake_count() == 3 && args_of(fake_launch(0))->ldx == 8 && args_of(fake_launch(0))->ldy == M);
    free(x);
    free(y);

    /* Device tensors: in place, caller's stream, leading dimension from the strides. */
    fake_reset();
    CHECKF(device_call(m, 0, 1, 13, 0, 0, 0) == TJ_OK, "%s", tj_context_error(ctx));
    CHECK(fake_count() == 3 && args_of(fake_launch(0))->ldx == 24 && fake_launch(0)->stream == (void *)0x1234);
    CHECK(fake_count() == 3 && fake_launch(0)->block[0] == 256);
    /* Persistent tj_tiles: min(work items, 132 SMs × the occupancy calculator's 2 blocks); tj_fill
     * keeps its full grid. Few tokens: one block per work item, as before. */
    tj_cuda_config dc = tj_cuda_config_default(A);
    int64_t Mbig = 17000, work = tj_cuda_tiles_work(A, &dc, Mbig);
    CHECKF(work > 264, "work %lld: too little to test the cap", (long long)work);
    fake_reset();
    CHECKF(device_call(m, 0, 1, Mbig, 0, 0, 0) == TJ_OK, "%s", tj_context_error(ctx));
    CHECKF(fake_count() == 3 && fake_launch(0)->grid[0] == 264 &&
               fake_launch(1)->grid[0] == (unsigned)((A->n - A->ncols) * ((Mbig + 255) / 256)),
           "%d launches, grids %u %u", fake_count(), fake_count() ? fake_launch(0)->grid[0] : 0,
           fake_count() > 1 ? fake_launch(1)->grid[0] : 0);
    fake_reset();
    CHECKF(device_call(m, 0, 1, 13, 0, 0, 0) == TJ_OK, "%s", tj_context_error(ctx));
    CHECK(fake_count() == 3 && fake_launch(0)->grid[0] == (unsigned)tj_cuda_tiles_work(A, &dc, 13));
    /* Unaligned feature-major x: the SIMT variant (4 warps, no shared memory). */
    fake_reset();
    CHECKF(device_call(m, 0, 1, 13, 0, 0, 1) == TJ_OK, "%s", tj_context_error(ctx));
    CHECK(fake_count() == 3 && fake_launch(0)->block[0] == 128 && fake_launch(0)->smem == 0);
    /* Row-major bf16 in, fp16 out; layer B has no bias and no cols: only tj_tiles. */
    fake_reset();
    CHECKF(device_call(m, 1, 0, 7, 1, 1, 0) == TJ_OK, "%s", tj_context_error(ctx));
    CHECK(launches_named(0, "tj_tiles", NULL, NULL));
    CHECK(fake_count() == 1 && !args_of(fake_launch(0))->bias && !args_of(fake_launch(0))->cols &&
          args_of(fake_launch(0))->ldx == layers[1].k + 3);

    /* Argument errors, each one clear line. */
    int64_t s2[2] = {5, A->k}, s3[2] = {5, A->n}, bad_st[2] = {2 * A->k, 2};
    static char buf[1 << 16];
    DLTensor dx = {.data = buf, .device = {kDLCUDA, 0}, .ndim = 2, .shape = s2, .dtype = {kDLFloat, 16, 1}};
    DLTensor dy = {.data = buf, .device = {kDLCUDA, 0}, .ndim = 2, .shape = s3, .dtype = {kDLFloat, 32, 1}};
    struct { const char *what; DLTensor x, y; const char *msg; } bad[] = {
        {"fp32 device x", dx, dy, "float32 device tensors are not supported"},
        {"host y", dx, dy, "x is in device memory but y in host memory"},
        {"other device", dx, dy, "but the context uses device 0"},
        {"strided x", dx, dy, "unit inner stride"},
        {"OpenCL x", dx, dy, "DLPack device type 4 is not supported by the CUDA backend"},
    };
    bad[0].x.dtype.bits = 32;
    bad[1].y.device.device_type = kDLCPU;
    bad[2].x.device.device_id = 3;
    bad[2].y.device.device_id = 3;
    bad[3].x.strides = bad_st;
    bad[4].x.device.device_type = kDLOpenCL;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fake_reset();
        CHECKF(tj_linear_ex(m, 0, &bad[i].x, &bad[i].y, TJ_LAYOUT_ROW_MAJOR, NULL) != TJ_OK, "%s accepted", bad[i].what);
        const char *e = tj_context_error(ctx);
        CHECKF(strstr(e, bad[i].msg) && strstr(e, "layer 'enc.0.fc1'") && !strchr(e, '\n'), "%s: %s", bad[i].what, e);
        CHECK(fake_count() == 0);
    }

    /* Many threads on one model, variants compiled on first use by whichever thread comes first. */
    fake_reset();
    pthread_t th[8];
    tcase tc[8];
    for (int i = 0; i < 8; i++) {
        tc[i] = (tcase){.m = m, .seed = 100 + i};
        pthread_create(&th[i], NULL, thread_main, &tc[i]);
    }
    int failures = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        failures += tc[i].failures;
    }
    CHECKF(failures == 0, "%d threaded calls failed: %s", failures, tj_context_error(ctx));
    CHECK(fake_count() >= 8 * 24);

    tj_model_destroy(m);
    tj_context_destroy(ctx);
    CHECKF(fake_allocs() == 0, "%d device allocations leaked", fake_allocs());
}

/* Views at odd element offsets (a PyTorch slice) run; addresses not aligned to their element are
 * one clear line, never a launch. The epilogue's pair stores test y's alignment in the kernel. */
static void test_alignment(void)
{
    setenv("TILEJIT_LIBCUDA", fake_path, 1);
    setenv("TJ_FAKE_CUDA", "sm90", 1);
    tj_context *ctx = NULL;
    tj_model *m = NULL;
    CHECK(make_context(TJ_BACKEND_CUDA, 0, 0, &ctx) == TJ_OK);
    if (!ctx) return;
    CHECKF(tj_model_load(ctx, path("m.json"), path("m.safetensors"), &m) == TJ_OK, "load: %s", tj_context_error(ctx));
    struct { int fm, f16y, xofs, yofs; int ok; unsigned block; const char *msg; } cases[] = {
        {1, 0, 0, 4, 1, 256, NULL},   /* fp32 y one element in: the mma kernel, scalar-or-pair stores */
        {1, 1, 0, 2, 1, 256, NULL},   /* fp16 y one element in */
        {1, 1, 6, 2, 1, 128, NULL},   /* x three elements in (not 16-byte aligned): the SIMT kernel */
        {0, 0, 2, 4, 1, 256, NULL},   /* row-major x at an odd element: the mma kernel reads it by element */
        {1, 0, 0, 2, 0, 0, "y: device address"},
        {0, 1, 1, 0, 0, 0, "x: device address"},
    };
    for (size_t i = 0; m && i < sizeof cases / sizeof *cases; i++) {
        fake_reset();
        tj_status s = device_call_at(m, 0, cases[i].fm, 13, 0, cases[i].f16y, cases[i].xofs, cases[i].yofs);
        if (cases[i].ok) {
            CHECKF(s == TJ_OK, "case %zu: %s", i, tj_context_error(ctx));
            CHECKF(fake_count() == 3 && fake_launch(0)->block[0] == cases[i].block, "case %zu: %d launches, block %u", i,
                   fake_count(), fake_count() ? fake_launch(0)->block[0] : 0);
            if (fake_count())
                CHECK(((uintptr_t)args_of(fake_launch(0))->y & 15) == (uintptr_t)cases[i].yofs);
        } else {
            const char *e = tj_context_error(ctx);
            CHECKF(s == TJ_ERR_INVALID_ARGUMENT && strstr(e, cases[i].msg) && strstr(e, "not aligned") && !strchr(e, '\n'),
                   "case %zu: %s", i, e);
            CHECK(fake_count() == 0);
        }
    }
    tj_model_destroy(m);
    tj_context_destroy(ctx);
}

/* A faulting kernel: without TILEJIT_SYNC_CHECK the launch returns OK and the fault surfaces at
 * the next synchronisation, in whatever call comes next; with it, the call that launched the
 * kernel fails and the message names the layer and the kernel. */
static void test_sync_check(void)
{
    setenv("TILEJIT_LIBCUDA", fake_path, 1);
    setenv("TJ_FAKE_CUDA", "sm90", 1);
    for (int sync = 0; sync < 2; sync++) {
        /* and TILEJIT_CUDA_GRID: "3" (first round) at most 3 tj_tiles blocks, "full" one per work item */
        if (sync) setenv("TILEJIT_SYNC_CHECK", "1", 1), setenv("TILEJIT_CUDA_GRID", "full", 1);
        else unsetenv("TILEJIT_SYNC_CHECK"), setenv("TILEJIT_CUDA_GRID", "3", 1); /* at most 3 blocks */
        tj_context *ctx = NULL;
        tj_model *m = NULL;
        CHECK(make_context(TJ_BACKEND_CUDA, 1, 0, &ctx) == TJ_OK);
        if (!ctx) continue;
        CHECKF(tj_model_load(ctx, path("m.json"), path("m.safetensors"), &m) == TJ_OK, "load: %s", tj_context_error(ctx));
        if (m) {
            CHECK(!sync == !strstr(tj_context_log(ctx), "TILEJIT_SYNC_CHECK"));
            fake_reset();
            setenv("TJ_FAKE_CUDA_FAULT", "tj_fill", 1);
            tj_status s = device_call(m, 0, 1, 13, 0, 0, 0);
            const char *e = tj_context_error(ctx);
            if (sync) {
                CHECKF(s != TJ_OK && strstr(e, "layer 'enc.0.fc1'") && strstr(e, "kernel tj_fill") &&
                       strstr(e, "CUDA_ERROR_ILLEGAL_ADDRESS") && strstr(e, "TILEJIT_SYNC_CHECK") && !strchr(e, '\n'),
                       "sync check: %s", e);
                CHECKF(launches_named(0, "tj_tiles", "tj_fill", NULL), "%d launches after the fault", fake_count());
            } else {
                CHECKF(s == TJ_OK, "%s", e);
                CHECK(launches_named(0, "tj_tiles", "tj_fill", "tj_ew"));
                /* The fault shows up later, at the next synchronisation: here a host-tensor call of
                 * the other layer, which is blamed for it. */
                float hx[2 * 40] = {0}, hy[2 * 64];
                int64_t xs[2] = {2, 40}, ys[2] = {2, 64};
                DLTensor xt = {.data = hx, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
                DLTensor yt = {.data = hy, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
                CHECK(tj_linear(m, "enc.0.fc2", &xt, &yt, NULL) != TJ_OK);
                e = tj_context_error(ctx);
                CHECKF(strstr(e, "ILLEGAL_ADDRESS") && strstr(e, "enc.0.fc2") && !strstr(e, "tj_fill"), "%s", e);
            }
            unsetenv("TJ_FAKE_CUDA_FAULT");
            fake_reset();
            CHECKF(device_call(m, 1, 1, 13, 0, 0, 0) == TJ_OK, "%s", tj_context_error(ctx));
            tj_cuda_config dc = tj_cuda_config_default(&layers[0]);
            int64_t work = tj_cuda_tiles_work(&layers[0], &dc, 17000);
            fake_reset();
            CHECKF(device_call(m, 0, 1, 17000, 0, 0, 0) == TJ_OK, "%s", tj_context_error(ctx));
            CHECKF(fake_count() == 3 && fake_launch(0)->grid[0] == (unsigned)(sync ? work : 3), "grid %u, work %lld",
                   fake_count() ? fake_launch(0)->grid[0] : 0, (long long)work);
        }
        tj_model_destroy(m);
        unsetenv("TILEJIT_CUDA_GRID");
        tj_context_destroy(ctx);
    }
    unsetenv("TILEJIT_SYNC_CHECK");
}

/* The command line: `--backend cuda` without a driver is one clear line; auto falls back. */
static int run_cli(const char *const *args, char *err, size_t errlen)
{
    char errpath[512];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", tmp);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen(errpath, "w", stderr);
        execv(args[0], (char *const *)args);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    FILE *f = fopen(errpath, "rb");
    size_t got = f ? fread(err, 1, errlen - 1, f) : 0;
    err[got] = '\0';
    if (f) fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_cli(void)
{
    const char *exe = getenv("TJ_TILEJIT");
    if (!exe) return;
    static char err[1 << 16];
    setenv("TILEJIT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    float x[2 * 200];
    for (int i = 0; i < 2 * 200; i++) x[i] = 0.5f;
    tj_error e;
    CHECK_OK(tj_npy_write(path("x.npy"), TJ_F32, 2, 200, x, &e), &e);
    const char *run_cuda[] = {exe, "run", path("m.json"), "--weights", path("m.safetensors"), "--layer", "enc.0.fc1",
                              "--input", path("x.npy"), "--output", path("y.npy"), "--backend", "cuda", NULL};
    int rc = run_cli(run_cuda, err, sizeof err);
    CHECKF(rc == 1 && strstr(err, "no NVIDIA driver") && strchr(err, '\n') == err + strlen(err) - 1, "rc %d: %s", rc, err);
    const char *run_auto[] = {exe, "run", path("m.json"), "--weights", path("m.safetensors"), "--layer", "enc.0.fc1",
                              "--input", path("x.npy"), "--output", path("y.npy"), "--backend", "auto", "-v", NULL};
    rc = run_cli(run_auto, err, sizeof err);
    CHECKF(rc == 0 && strstr(err, "auto: backend cuda unavailable"), "auto rc %d: %s", rc, err);
    const char *bench_help[] = {exe, "bench", "--help", NULL};
    if (run_cli(bench_help, err, sizeof err) == 0) {
        const char *bench[] = {exe, "bench", "--backend", "cuda", "--m", "16", "--n", "64", "--k", "64", "--g", "32", "--sparsity",
                               "0.5", NULL};
        rc = run_cli(bench, err, sizeof err);
        CHECKF(rc == 1 && strstr(err, "no NVIDIA driver") && strchr(err, '\n') == err + strlen(err) - 1, "bench rc %d: %s",
               rc, err);
        /* On the pretend GPU the kernels write nothing: the bench's NaN poisoning must catch it. */
        if (fake_path) {
            setenv("TILEJIT_LIBCUDA", fake_path, 1);
            setenv("TJ_FAKE_CUDA", "sm90", 1);
            rc = run_cli(bench, err, sizeof err);
            CHECKF(rc == 1 && strstr(err, "tilejit's result is wrong") && strstr(err, "1024 NaN outputs"), "bench rc %d: %s",
                   rc, err);
        }
    }
}

/* TILEJIT_CUDA_WGMMA=1 on a 9.0 device: the wgmma kernel (one 128-thread warpgroup, sm_90a, shared
 * memory) for feature-major calls; row-major calls run the mma kernel (8 warps); unaligned x the
 * SIMT kernel. */
static void test_wgmma_default(void)
{
    setenv("TILEJIT_LIBCUDA", fake_path, 1);
    setenv("TJ_FAKE_CUDA", "sm90", 1);
    setenv("TILEJIT_CUDA_WGMMA", "1", 1);
    tj_context *ctx = NULL;
    tj_model *m = NULL;
    CHECK(make_context(TJ_BACKEND_CUDA, 0, 0, &ctx) == TJ_OK);
    if (ctx) CHECKF(tj_model_load(ctx, path("m.json"), path("m.safetensors"), &m) == TJ_OK, "load: %s", tj_context_error(ctx));
    if (m) {
        fake_reset();
        CHECKF(device_call(m, 0, 1, 13, 0, 0, 0) == TJ_OK, "%s", tj_context_error(ctx));
        CHECKF(fake_count() == 3 && fake_launch(0)->block[0] == 128 && fake_launch(0)->smem > 0, "fm: %d launches", fake_count());
        fake_reset();
        CHECKF(device_call(m, 0, 0, 13, 0, 0, 0) == TJ_OK, "%s", tj_context_error(ctx));
        CHECKF(fake_count() == 3 && fake_launch(0)->block[0] == 256, "rm: %d launches", fake_count());
        fake_reset();
        CHECKF(device_call(m, 0, 1, 13, 0, 0, 1) == TJ_OK, "%s", tj_context_error(ctx));
        CHECKF(fake_count() == 3 && fake_launch(0)->block[0] == 128 && fake_launch(0)->smem == 0, "unaligned: %d launches",
               fake_count());
    }
    tj_model_destroy(m);
    tj_context_destroy(ctx);
    unsetenv("TILEJIT_CUDA_WGMMA");
}

/* An unusable cache directory (under a regular file): the model loads without the cache, and the
 * verbose log says so once, at the first load (tj_context_open_cache). */
static void test_cache_note(void)
{
    setenv("TILEJIT_LIBCUDA", fake_path, 1);
    setenv("TJ_FAKE_CUDA", "sm90", 1);
    char bad[700];
    snprintf(bad, sizeof bad, "%s/cache", path("m.json"));
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_CUDA;
    o.verbose = 1;
    o.cache_dir = bad;
    tj_context *ctx = NULL;
    CHECK(tj_context_create(&o, &ctx) == TJ_OK);
    for (int i = 0; ctx && i < 2; i++) {
        tj_model *m = NULL;
        CHECKF(tj_model_load(ctx, path("m.json"), path("m.safetensors"), &m) == TJ_OK, "load %d: %s", i,
               tj_context_error(ctx));
        tj_model_destroy(m);
    }
    if (ctx) {
        const char *log = tj_context_log(ctx), *note = "cuda: kernel cache: kernel cache disabled: cannot create directory";
        const char *first = strstr(log, note);
        CHECKF(first && !strstr(first + 1, note), "%s", log);
    }
    tj_context_destroy(ctx);
}

int main(void)
{
    fake_path = getenv("TJ_FAKE_LIBCUDA");
    snprintf(tmp, sizeof tmp, "/tmp/tj_cuda_host_XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    CHECK(write_model());
    test_no_driver();
    if (fake_path) {
        void *h = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL);
        CHECKF(h != NULL, "%s", dlerror());
        if (h) {
            *(void **)&fake_count = dlsym(h, "tj_fake_cuda_launch_count");
            *(void **)&fake_launch = dlsym(h, "tj_fake_cuda_launch");
            *(void **)&fake_reset = dlsym(h, "tj_fake_cuda_reset");
            *(void **)&fake_allocs = dlsym(h, "tj_fake_cuda_live_allocations");
            test_driver_errors();
            test_fake_gpu();
            test_alignment();
            test_wgmma_default();
            test_sync_check();
            test_cache_note();
        }
    } else {
        fprintf(stderr, "TJ_FAKE_LIBCUDA not set: fake-driver cases skipped\n");
    }
    test_cli();
    tj_layer_free(&layers[0]);
    tj_layer_free(&layers[1]);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) { /* best effort */ }
    return tj_test_end();
}
