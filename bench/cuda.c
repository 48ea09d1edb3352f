/* `tilejit bench --backend cuda`: one random tile-wise layer (pattern/random.c, the CPU
 * bench's generator) compiled for this GPU, timed with CUDA events against dense cublasGemmEx on
 * tensor cores over the same data, and checked against the reference. Also the GPU timing hook
 * of `tilejit model`.
 *
 * Timing (docs/kernels.md): a warm-up, then samples of one full rotation over R input/output/weight
 * sets each (R chosen so a rotation's data is ≥ 3× the L2, the H200's is 60 MB, capped at 32),
 * until the samples cover ≥ --min-time seconds (0.2 s) and at least 10 samples; the median
 * sample divided by R is the time per call. Each rotation is captured once as a CUDA graph and
 * replayed (tilejit's 1–3 launches and cuBLAS's alike), so launch gaps do not count: at decode
 * sizes they would otherwise dominate both; --no-graph times plain stream launches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/args.h"
#include "runtime/backend_cuda.h"
#include "pattern/random.h"
#include "base/rng.h"
#include "tj_config.h"

/* The driver's streams: the report and its messages (NULL outside tj_bench_cuda_main). */
static FILE *out_, *errs_;
#if TJ_HAVE_CUBLAS
#include <cublas_v2.h>
#include <dlfcn.h>
#endif

static const char *help =
    "usage: tilejit bench --backend cuda --m M --n N --k K --sparsity S [--g 128] [--mode tw1|tw2]\n"
    "                     [--dtype fp16|bf16] [--config JSON] [--seed N] [--min-time SEC]\n"
    "                     [--device I] [--cache-dir DIR] [--no-graph] [-v]\n\n"
    "Times one random tile-wise sparse layer Y = X · (W ⊙ mask)ᵀ (n × k, tiles of g, overall\n"
    "sparsity S; tw2 prunes 1 − sqrt(1 − S) of the columns and of each tile's rows, tw1 only\n"
    "rows) on the GPU against dense cublasGemmEx (tensor cores, fp32 accumulation) on the same\n"
    "data and layout, after checking both against the reference (relative error ≤ 2e-3 for\n"
    "fp16, ≤ 1e-2 for bf16; outputs poisoned with NaN first). The output dtype is the input's\n"
    "unless --config sets \"out\"; --config is a CUDA config JSON (see `tilejit gen --help`).\n"
    "Timing: CUDA events over a CUDA graph of one rotation through several input, output and\n"
    "weight buffers (together ≥ 3× the L2), median of samples covering --min-time (0.2 s);\n"
    "--no-graph launches on the stream instead.\n"
    "Ends with one line:\n"
    "  speedup <dense/tilejit> tilejit_us <µs> dense_us <µs> kept_tflops <TFLOP/s of kept work>\n";

#define MAX_ROT 32

typedef struct gpu {
    tj_cuda_device *dev;
    int own_dev;
    CUstream stream;
    CUevent e0, e1;
#if TJ_HAVE_CUBLAS
    cublasHandle_t blas;
#endif
    char err[TJ_ERROR_MSG_MAX];
} gpu;

/* One timed operation: launch number i of a rotation. */
typedef int (*launch_fn)(void *user, int i, char *err, size_t errlen);

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Captures one rotation of fn into a graph (CUDA graph replay hides launch gaps, docs/kernels.md);
 * NULL with a note on the report stream when capture is not possible (timing then uses plain launches). */
static CUgraphExec capture(gpu *g, launch_fn fn, void *user, int rot, char *err, size_t errlen)
{
    tj_error e;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    if (TJ_CU(&g->dev->cu, &e, StreamBeginCapture(g->stream, CU_STREAM_CAPTURE_MODE_RELAXED)) != TJ_OK) goto fail;
    int bad = 0;
    for (int i = 0; i < rot && !bad; i++) bad = fn(user, i, err, errlen);
    tj_status s = TJ_CU(&g->dev->cu, &e, StreamEndCapture(g->stream, &graph));
    if (bad) snprintf(e.msg, sizeof e.msg, "%s", err);
    if (bad || s != TJ_OK) goto fail;
    if (TJ_CU(&g->dev->cu, &e, GraphInstantiate(&exec, graph, 0)) != TJ_OK) goto fail;
    g->dev->cu.GraphDestroy(graph);
    return exec;
fail:
    if (graph) g->dev->cu.GraphDestroy(graph);
    if (out_) fprintf(out_, "note        graph capture failed (%s): timing plain launches\n", e.msg);
    return NULL;
}

/* Median seconds per launch (see the file comment); with use_graph, each sample replays one
 * captured rotation. Returns < 0 with a message on failure. */
static double time_loop(gpu *g, launch_fn fn, void *user, int rot, int use_graph, double min_time, int *nsamples,
                        char *err, size_t errlen)
{
    tj_error e;
    CUgraphExec exec = NULL;
    double *samples = NULL;
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < rot; i++)
            if (fn(user, i, err, errlen)) return -1;
    if (TJ_CU(&g->dev->cu, &e, StreamSynchronize(g->stream)) != TJ_OK) goto cu_fail;
    if (use_graph && (exec = capture(g, fn, user, rot, err, errlen)) != NULL) {
        if (TJ_CU(&g->dev->cu, &e, GraphLaunch(exec, g->stream)) != TJ_OK) goto cu_fail;
        if (TJ_CU(&g->dev->cu, &e, StreamSynchronize(g->stream)) != TJ_OK) goto cu_fail;
    }
    int cap = 4096, n = 0;
    double total = 0;
    samples = malloc(sizeof *samples * (size_t)cap);
    if (!samples) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    while ((total < min_time || n < 10) && n < cap) {
        if (TJ_CU(&g->dev->cu, &e, EventRecord(g->e0, g->stream)) != TJ_OK) goto cu_fail;
        if (exec) {
            if (TJ_CU(&g->dev->cu, &e, GraphLaunch(exec, g->stream)) != TJ_OK) goto cu_fail;
        } else {
            for (int i = 0; i < rot; i++)
                if (fn(user, i, err, errlen)) goto fail;
        }
        if (TJ_CU(&g->dev->cu, &e, EventRecord(g->e1, g->stream)) != TJ_OK) goto cu_fail;
        if (TJ_CU(&g->dev->cu, &e, EventSynchronize(g->e1)) != TJ_OK) goto cu_fail;
        float ms = 0;
        if (TJ_CU(&g->dev->cu, &e, EventElapsedTime(&ms, g->e0, g->e1)) != TJ_OK) goto cu_fail;
        samples[n++] = 1e-3 * ms / rot;
        total += 1e-3 * ms;
    }
    qsort(samples, (size_t)n, sizeof *samples, cmpd);
    double med = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
    free(samples);
    if (exec) g->dev->cu.GraphExecDestroy(exec);
    *nsamples = n;
    return med;
cu_fail:
    snprintf(err, errlen, "%s", e.msg);
fail:
    free(samples);
    if (exec) g->dev->cu.GraphExecDestroy(exec);
    return -1;
}

static int gpu_open(gpu *g, int device, tj_cuda_device *shared, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    g->dev = shared;
    tj_error e;
    CUcontext prev;
    if (device >= 0) {
        if (tj_cuda_device_open(device, &g->dev, &e) != TJ_OK) goto fail;
        g->own_dev = 1;
    }
    /* The CLI keeps the primary context current for its whole run (cuBLAS uses it too). */
    if (tj_cuda_device_bind(g->dev, &prev, &e) != TJ_OK) goto fail;
    if (TJ_CU(&g->dev->cu, &e, StreamCreate(&g->stream, CU_STREAM_NON_BLOCKING)) != TJ_OK) goto fail;
    if (TJ_CU(&g->dev->cu, &e, EventCreate(&g->e0, CU_EVENT_DEFAULT)) != TJ_OK) goto fail;
    if (TJ_CU(&g->dev->cu, &e, EventCreate(&g->e1, CU_EVENT_DEFAULT)) != TJ_OK) goto fail;
    return 0;
fail:
    snprintf(err, errlen, "%s", e.msg);
    return 1;
}

#if TJ_HAVE_CUBLAS
/* cuBLAS is opened at run time, like the driver: every other command then starts without
 * loading it (and cublasLt's start-up code), and tilejit runs where cuBLAS is absent. */
static struct {
    void *lib;
    __typeof__(&cublasCreate) create;
    __typeof__(&cublasDestroy) destroy;
    __typeof__(&cublasSetStream) set_stream;
    __typeof__(&cublasGemmEx) gemm_ex;
    __typeof__(&cublasGetStatusString) status_string;
} blas;

static int blas_open(char *err, size_t errlen)
{
    static const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    if (blas.lib) return 0;
    for (size_t i = 0; i < sizeof names / sizeof *names && !blas.lib; i++) blas.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!blas.lib) {
        snprintf(err, errlen, "cannot load cuBLAS for the dense baseline (%s)", dlerror());
        return 1;
    }
    *(void **)&blas.create = dlsym(blas.lib, "cublasCreate_v2");
    *(void **)&blas.destroy = dlsym(blas.lib, "cublasDestroy_v2");
    *(void **)&blas.set_stream = dlsym(blas.lib, "cublasSetStream_v2");
    *(void **)&blas.gemm_ex = dlsym(blas.lib, "cublasGemmEx");
    *(void **)&blas.status_string = dlsym(blas.lib, "cublasGetStatusString");
    if (!blas.create || !blas.destroy || !blas.set_stream || !blas.gemm_ex || !blas.status_string) {
        snprintf(err, errlen, "cuBLAS lacks an entry point the baseline needs (cublasCreate_v2, cublasGemmEx, ...)");
        dlclose(blas.lib);
        memset(&blas, 0, sizeof blas);
        return 1;
    }
    return 0;
}

/* cuBLAS on the same stream, created on first use (after tilejit's own checks). */
static int gpu_blas(gpu *g, char *err, size_t errlen)
{
    if (g->blas) return 0;
    if (blas_open(err, errlen)) return 1;
    cublasStatus_t bs = blas.create(&g->blas);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = blas.set_stream(g->blas, (cudaStream_t)g->stream);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cublasCreate/cublasSetStream failed: %s", blas.status_string(bs));
        return 1;
    }
    return 0;
}
#endif

static void gpu_close(gpu *g)
{
    if (!g->dev) return;
#if TJ_HAVE_CUBLAS
    if (g->blas) blas.destroy(g->blas);
#endif
    if (g->e0) g->dev->cu.EventDestroy(g->e0);
    if (g->e1) g->dev->cu.EventDestroy(g->e1);
    if (g->stream) g->dev->cu.StreamDestroy(g->stream);
    if (g->own_dev) tj_cuda_device_close(g->dev);
    memset(g, 0, sizeof *g);
}

static CUdeviceptr dev_alloc(gpu *g, int64_t bytes, tj_error *e)
{
    CUdeviceptr p = 0;
    if (TJ_CU(&g->dev->cu, e, MemAlloc(&p, (size_t)(bytes > 0 ? bytes : 1))) != TJ_OK) return 0;
    return p;
}

/* NaN in every element of a buffer of `elems` elements of dtype d. */
static tj_status poison(gpu *g, CUdeviceptr p, int64_t elems, tj_dtype d, tj_error *e)
{
    if (d == TJ_F32) return TJ_CU(&g->dev->cu, e, MemsetD32Async(p, 0x7fc00000u, (size_t)elems, g->stream));
    return TJ_CU(&g->dev->cu, e, MemsetD16Async(p, d == TJ_F16 ? 0x7e00 : 0x7fc0, (size_t)elems, g->stream));
}

#if TJ_HAVE_CUBLAS
static cudaDataType_t blas_type(tj_dtype d)
{
    return d == TJ_F32 ? CUDA_R_32F : d == TJ_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

/* Y = X · Wᵀ with W dense [n × k]: feature-major (Xᵀ [k × M], Y [n × M]) is the column-major
 * product X (M × k) · Wᵀ (k × n); row-major is the column-major Yᵀ = W · Xᵀ (TN). */
static int dense_gemm(gpu *g, int fm, int64_t M, int64_t n, int64_t k, tj_dtype in, tj_dtype out, CUdeviceptr w,
                      CUdeviceptr x, int64_t ldx, CUdeviceptr y, int64_t ldy, char *err, size_t errlen)
{
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s;
    if (fm)
        s = blas.gemm_ex(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)M, (int)n, (int)k, &one, (const void *)(uintptr_t)x,
                         blas_type(in), (int)ldx, (const void *)(uintptr_t)w, blas_type(in), (int)k, &zero,
                         (void *)(uintptr_t)y, blas_type(out), (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
        s = blas.gemm_ex(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)M, (int)k, &one, (const void *)(uintptr_t)w,
                         blas_type(in), (int)k, (const void *)(uintptr_t)x, blas_type(in), (int)ldx, &zero,
                         (void *)(uintptr_t)y, blas_type(out), (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cublasGemmEx failed: %s", blas.status_string(s));
        return 1;
    }
    return 0;
}
#endif

/* ---- tilejit bench --backend cuda ---- */

typedef struct bench {
    gpu *g;
    const tj_layer *l;
    tj_cuda_kernel *kern;
    tj_cuda_data data[MAX_ROT];
    CUdeviceptr x[MAX_ROT], y[MAX_ROT], wd[MAX_ROT];
    int64_t M, ldx, ldy;
    tj_dtype in, out;
    int fm;
} bench;

static int launch_tilejit(void *user, int i, char *err, size_t errlen)
{
    bench *b = user;
    tj_error e;
    if (tj_cuda_kernel_launch(b->g->dev, b->kern, &b->data[i], b->x[i], b->ldx, b->y[i], b->ldy, b->M, b->g->stream,
                              &e) != TJ_OK) {
        snprintf(err, errlen, "%s", e.msg);
        return 1;
    }
    return 0;
}

#if TJ_HAVE_CUBLAS
static int launch_dense(void *user, int i, char *err, size_t errlen)
{
    bench *b = user;
    return dense_gemm(b->g, b->fm, b->M, b->l->n, b->l->k, b->in, b->out, b->wd[i], b->x[i], b->ldx, b->y[i], b->ldy,
                      err, errlen);
}
#endif

/* Y from the device (layout fm or row-major) into host fp32 rows `rows` ([nrows × n]); counts
 * NaNs over the whole output. */
static int check_output(gpu *g, const bench *b, CUdeviceptr y, const int64_t *rows, int64_t nrows, float *out,
                        int64_t *nan_count, char *err, size_t errlen)
{
    const tj_layer *l = b->l;
    int64_t elems = b->fm ? l->n * b->ldy : b->M * b->ldy;
    size_t esz = tj_dtype_size(b->out);
    void *h = malloc((size_t)elems * esz + 4);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    tj_error e;
    if (TJ_CU(&g->dev->cu, &e, StreamSynchronize(g->stream)) != TJ_OK ||
        TJ_CU(&g->dev->cu, &e, MemcpyDtoH(h, y, (size_t)elems * esz)) != TJ_OK) {
        snprintf(err, errlen, "%s", e.msg);
        free(h);
        return 1;
    }
    *nan_count = 0;
    for (int64_t n = 0; n < l->n; n++)
        for (int64_t m = 0; m < b->M; m++) {
            float v = tj_load_f32(h, b->out, b->fm ? n * b->ldy + m : m * b->ldy + n);
            *nan_count += isnan(v) != 0;
        }
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t n = 0; n < l->n; n++)
            out[r * l->n + n] = tj_load_f32(h, b->out, b->fm ? n * b->ldy + rows[r] : rows[r] * b->ldy + n);
    free(h);
    return 0;
}

static int parse_dtype(const char *s, tj_dtype *out)
{
    if (!strcmp(s, "fp16") || !strcmp(s, "f16") || !strcmp(s, "float16")) *out = TJ_F16;
    else if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) *out = TJ_BF16;
    else return 1;
    return 0;
}

int tj_bench_cuda_main(int argc, char **argv, FILE *report, FILE *errs)
{
    out_ = report;
    errs_ = errs;
    const char *C = "tilejit bench";
    const char *sm = NULL, *sn = NULL, *sk = NULL, *ss = NULL, *sg = "128", *smode = "tw1", *sdt = NULL,
               *cfgjson = NULL, *sseed = "1", *smin = "0.2", *sdev = "0", *backend = "cuda", *cache_dir = NULL,
               *pos[1];
    int verbose = 0, npos = 0, no_graph = 0;
    tj_arg_opt opts[] = {{"backend", 1, &backend, NULL}, {"m", 1, &sm, NULL}, {"n", 1, &sn, NULL}, {"k", 1, &sk, NULL},
                      {"sparsity", 1, &ss, NULL}, {"g", 1, &sg, NULL}, {"mode", 1, &smode, NULL},
                      {"dtype", 1, &sdt, NULL}, {"config", 1, &cfgjson, NULL}, {"seed", 1, &sseed, NULL},
                      {"min-time", 1, &smin, NULL}, {"device", 1, &sdev, NULL}, {"cache-dir", 1, &cache_dir, NULL},
                      {"v", 0, NULL, &verbose}, {"verbose", 0, NULL, &verbose}, {"no-graph", 0, NULL, &no_graph}, {0}};
    int r = tj_args_parse(errs_, C, argc, argv, opts, pos, 0, &npos);
    if (r == 2) {
        fputs(help, out_);
        return 0;
    }
    if (r) return 1;
    if (strcmp(backend, "cuda") != 0) return tj_args_fail(errs_, C, "bench_cuda handles --backend cuda only (got '%s')", backend);
    if (!sm || !sn || !sk || !ss) return tj_args_fail(errs_, C, "--m, --n, --k and --sparsity are required (see --help)");
    int64_t M, n, k, g, seed, devno;
    double sparsity, min_time;
    if (tj_args_parse_int(errs_, C, "m", sm, 1, INT32_MAX, &M) || tj_args_parse_int(errs_, C, "n", sn, 1, TJ_MAX_DIM, &n) ||
        tj_args_parse_int(errs_, C, "k", sk, 1, 65536 * 256, &k) || tj_args_parse_int(errs_, C, "g", sg, 1, TJ_MAX_DIM, &g) ||
        tj_args_parse_double(errs_, C, "sparsity", ss, 0, 0.999, &sparsity) || tj_args_parse_int(errs_, C, "seed", sseed, 0, INT64_MAX, &seed) ||
        tj_args_parse_double(errs_, C, "min-time", smin, 0, 3600, &min_time) || tj_args_parse_int(errs_, C, "device", sdev, 0, 1024, &devno))
        return 1;
    int mode = !strcmp(smode, "tw1") ? 1 : !strcmp(smode, "tw2") ? 2 : 0;
    if (!mode) return tj_args_fail(errs_, C, "--mode must be tw1 or tw2 (got '%s')", smode);
    tj_dtype in = TJ_F16;
    if (sdt && parse_dtype(sdt, &in)) return tj_args_fail(errs_, C, "--dtype must be fp16 or bf16 (got '%s')", sdt);

    tj_error e;
    tj_layer l;
    memset(&l, 0, sizeof l);
    tj_random_spec spec = {.n = n, .k = k, .g = g, .sparsity = sparsity, .mode = mode, .seed = (uint64_t)seed};
    if (tj_random_layer(&spec, "bench", &l, &e) != TJ_OK) return tj_args_fail(errs_, C, "%s", e.msg);
    tj_cuda_config cfg = tj_cuda_config_default(&l);
    cfg.dtype = in;
    cfg.out = in;
    if (cfgjson && tj_cuda_config_from_json(cfgjson, &cfg, &e) != TJ_OK) {
        tj_layer_free(&l);
        return tj_args_fail(errs_, C, "--config: %s", e.msg);
    }
    if (sdt) cfg.dtype = in;
    in = cfg.dtype;
    tj_dtype out = cfg.out;
    if (cfg.x_fm != cfg.y_fm) {
        tj_layer_free(&l);
        return tj_args_fail(errs_, C, "--config: the bench times the layouts fm and rm only (the dense baseline has one layout)");
    }
    int fm = cfg.x_fm;

    gpu G;
    bench B;
    memset(&B, 0, sizeof B);
    char msg[TJ_ERROR_MSG_MAX] = "";
    int rc = 1, rot = 0;
    tj_cache *cache = NULL;
    float *w32 = NULL, *x32 = NULL, *yref = NULL, *yget = NULL, *xs = NULL;
    uint16_t *wq = NULL, *wdense = NULL, *xq = NULL;
    int64_t *rows = NULL;
    if (gpu_open(&G, (int)devno, NULL, msg, sizeof msg)) goto done;
    B.g = &G;
    B.l = &l;
    B.M = M;
    B.in = in;
    B.out = out;
    B.fm = fm;
    char desc[512];
    tj_cuda_device_describe(G.dev, desc, sizeof desc);
    fprintf(out_, "device      %s\n", desc);
    tj_strbuf sb;
    tj_sb_init(&sb);
    tj_cuda_config_to_json(&cfg, &sb);
    int64_t kept = tj_layer_kept(&l);
    fprintf(out_, "layer       M %lld  n %lld  k %lld  g %lld  %s  sparsity %.3f (kept %lld of %lld weights, %lld of %lld columns)\n",
           (long long)M, (long long)n, (long long)k, (long long)g, smode, 1.0 - (double)kept / ((double)n * k),
           (long long)kept, (long long)(n * k), (long long)l.ncols, (long long)n);
    fprintf(out_, "config      %s\n", sb.data ? sb.data : "");
    tj_sb_free(&sb);

    /* Compile (through the cache). */
    if (tj_cache_open(cache_dir, &cache, &e) != TJ_OK) goto tj_fail;
    {
        char *wmsg = tj_cache_take_warning(cache);
        if (wmsg) fprintf(errs_, "tilejit bench: warning: %s\n", wmsg);
        free(wmsg);
    }
    if (tj_cuda_kernel_build(G.dev, cache, &l, &cfg, &B.kern, &e) != TJ_OK) goto tj_fail;
    fprintf(out_, "compile     %.3f s (%s), %d registers, %lld spill bytes\n", B.kern->compile_seconds,
           B.kern->cache == TJ_CACHE_HIT ? "cache hit" : "cache miss", B.kern->registers, (long long)B.kern->spill_bytes);

    /* Host data: W and X rounded to the input dtype, so the reference sees what the GPU sees. */
    int64_t nk = n * k;
    w32 = malloc((size_t)nk * 4);
    wq = malloc((size_t)nk * 2);
    wdense = calloc((size_t)nk, 2);
    B.ldx = fm ? (M + 7) / 8 * 8 : k;
    B.ldy = fm ? M : n;
    int64_t xelems = fm ? k * B.ldx : M * k, yelems = fm ? n * B.ldy : M * B.ldy;
    xq = calloc((size_t)xelems, 2);
    x32 = malloc((size_t)(M * k) * 4);
    if (!w32 || !wq || !wdense || !xq || !x32) {
        snprintf(msg, sizeof msg, "out of memory");
        goto done;
    }
    tj_rng rng = {(uint64_t)seed * 7919 + 17};
    for (int64_t i = 0; i < nk; i++) w32[i] = tj_rng_uniform(&rng);
    tj_convert_from_f32(w32, nk, in, wq);
    for (int64_t j = 0; j < l.ncols; j++) {
        int64_t col = tj_layer_col(&l, j), t = j / l.g;
        for (int64_t r2 = l.tile_ptr[t]; r2 < l.tile_ptr[t + 1]; r2++)
            wdense[col * k + l.tile_rows[r2]] = wq[col * k + l.tile_rows[r2]];
    }
    for (int64_t c = 0; l.ew_indptr && c < n; c++)
        for (int64_t q = l.ew_indptr[c]; q < l.ew_indptr[c + 1]; q++)
            wdense[c * k + l.ew_indices[q]] = wq[c * k + l.ew_indices[q]];

    /* Rotation sets: x, y, packed weights (tilejit) and dense weights (cuBLAS). */
    int64_t set_bytes = 2 * xelems + (int64_t)tj_dtype_size(out) * yelems + 2 * nk;
    rot = (int)((3 * G.dev->l2_bytes + set_bytes - 1) / set_bytes);
    rot = rot < 2 ? 2 : rot > MAX_ROT ? MAX_ROT : rot;
    {
        size_t free_b = 0, total_b = 0;
        if (G.dev->cu.MemGetInfo(&free_b, &total_b) == CUDA_SUCCESS)
            while (rot > 1 && (double)rot * (set_bytes + 2 * nk) > 0.8 * (double)free_b) rot--;
    }
    for (int i = 0; i < rot; i++) {
        for (int64_t q = 0; q < M * k; q++) x32[q] = tj_rng_uniform(&rng);
        for (int64_t mm = 0; mm < M; mm++)
            for (int64_t kk = 0; kk < k; kk++) {
                float v = x32[mm * k + kk];
                xq[fm ? kk * B.ldx + mm : mm * k + kk] = in == TJ_BF16 ? tj_f32_to_bf16(v) : tj_f32_to_f16(v);
            }
        if (!(B.x[i] = dev_alloc(&G, 2 * xelems, &e))) goto tj_fail;
        if (!(B.y[i] = dev_alloc(&G, (int64_t)tj_dtype_size(out) * yelems, &e))) goto tj_fail;
        if (!(B.wd[i] = dev_alloc(&G, 2 * nk, &e))) goto tj_fail;
        if (TJ_CU(&G.dev->cu, &e, MemcpyHtoD(B.x[i], xq, (size_t)(2 * xelems))) != TJ_OK) goto tj_fail;
        if (TJ_CU(&G.dev->cu, &e, MemcpyHtoD(B.wd[i], wdense, (size_t)(2 * nk))) != TJ_OK) goto tj_fail;
        if (tj_cuda_data_upload(G.dev, &l, in, wq, in, NULL, TJ_F32, &B.data[i], &e) != TJ_OK) goto tj_fail;
    }
    /* x32 now holds the last set's inputs; rebuild set 0's, as the GPU sees them, for the check. */
    if (TJ_CU(&G.dev->cu, &e, MemcpyDtoH(xq, B.x[0], (size_t)(2 * xelems))) != TJ_OK) goto tj_fail;
    for (int64_t mm = 0; mm < M; mm++)
        for (int64_t kk = 0; kk < k; kk++) x32[mm * k + kk] = tj_load_f32(xq, in, fm ? kk * B.ldx + mm : mm * k + kk);

    /* Reference on up to 256 rows spread over M (first and last included). */
    int64_t nrows = M < 256 ? M : 256;
    rows = malloc((size_t)nrows * sizeof *rows);
    xs = malloc((size_t)(nrows * k) * 4);
    yref = malloc((size_t)(nrows * n) * 4);
    yget = malloc((size_t)(nrows * n) * 4);
    if (!rows || !xs || !yref || !yget) {
        snprintf(msg, sizeof msg, "out of memory");
        goto done;
    }
    for (int64_t q = 0; q < nrows; q++) {
        rows[q] = nrows == 1 ? 0 : q * (M - 1) / (nrows - 1);
        memcpy(xs + q * k, x32 + rows[q] * k, (size_t)k * 4);
    }
    tj_layer_weights lw = {.w = wq, .wdt = in, .bias = NULL, .bdt = TJ_F32};
    tj_reference_linear(&l, &lw, xs, nrows, yref);
    double bound = tj_check_bound(in); /* the one bound per compute dtype (runtime/check.c) */

    int64_t nans = 0;
    if (poison(&G, B.y[0], yelems, out, &e) != TJ_OK) goto tj_fail;
    if (launch_tilejit(&B, 0, msg, sizeof msg)) goto done;
    if (check_output(&G, &B, B.y[0], rows, nrows, yget, &nans, msg, sizeof msg)) goto done;
    double err_tj = tj_rel_error(yget, yref, nrows * n);
    fprintf(out_, "check       tilejit: relative error %.3g on %lld sampled rows (bound %.0e), %lld unwritten (NaN) of %lld outputs: %s\n",
           err_tj, (long long)nrows, bound, (long long)nans, (long long)(M * n),
           err_tj <= bound && nans == 0 ? "ok" : "FAILED");
    if (!(err_tj <= bound) || nans) {
        snprintf(msg, sizeof msg, "tilejit's result is wrong: relative error %.3g (bound %.0e), %lld NaN outputs", err_tj,
                 bound, (long long)nans);
        goto done;
    }
    double t_dense = NAN;
    int ns_tj = 0, ns_dense = 0;
#if TJ_HAVE_CUBLAS
    if (gpu_blas(&G, msg, sizeof msg)) goto done;
    if (poison(&G, B.y[0], yelems, out, &e) != TJ_OK) goto tj_fail;
    if (launch_dense(&B, 0, msg, sizeof msg)) goto done;
    if (check_output(&G, &B, B.y[0], rows, nrows, yget, &nans, msg, sizeof msg)) goto done;
    double err_dense = tj_rel_error(yget, yref, nrows * n);
    fprintf(out_, "check       cuBLAS:  relative error %.3g (bound %.0e): %s\n", err_dense, bound,
           err_dense <= bound && nans == 0 ? "ok" : "FAILED");
    if (!(err_dense <= bound) || nans) {
        snprintf(msg, sizeof msg, "the cuBLAS baseline's result is wrong: relative error %.3g", err_dense);
        goto done;
    }
    t_dense = time_loop(&G, launch_dense, &B, rot, !no_graph, min_time, &ns_dense, msg, sizeof msg);
    if (t_dense < 0) goto done;
#endif
    double t_tj = time_loop(&G, launch_tilejit, &B, rot, !no_graph, min_time, &ns_tj, msg, sizeof msg);
    if (t_tj < 0) goto done;
    /* Re-check after timing: a fault or race during the timed launches shows here. */
    if (poison(&G, B.y[0], yelems, out, &e) != TJ_OK) goto tj_fail;
    if (launch_tilejit(&B, 0, msg, sizeof msg)) goto done;
    if (check_output(&G, &B, B.y[0], rows, nrows, yget, &nans, msg, sizeof msg)) goto done;
    double err2 = tj_rel_error(yget, yref, nrows * n);
    if (!(err2 <= bound) || nans) {
        snprintf(msg, sizeof msg, "tilejit's result changed after timing: relative error %.3g, %lld NaN", err2,
                 (long long)nans);
        goto done;
    }
    double kept_tflops = 2.0 * (double)M * (double)kept / t_tj / 1e12;
    double dense_tflops = 2.0 * (double)M * (double)n * (double)k / t_dense / 1e12;
    fprintf(out_, "timing      %s, rotation over %d sets (%.1f MB each), %d / %d samples, min %.2f s\n",
           no_graph ? "plain stream launches" : "CUDA graph replay of each rotation", rot, set_bytes / 1e6, ns_tj, ns_dense,
           min_time);
    fprintf(out_, "tilejit     %.2f us  (%.1f TFLOP/s on kept weights)\n", 1e6 * t_tj, kept_tflops);
    fprintf(out_, "dense       %.2f us  (%.1f TFLOP/s, cublasGemmEx %s)\n", 1e6 * t_dense, dense_tflops,
           fm ? "NN on feature-major" : "TN on row-major");
    fprintf(out_, "speedup %.3f tilejit_us %.2f dense_us %.2f kept_tflops %.2f\n", t_dense / t_tj, 1e6 * t_tj, 1e6 * t_dense,
           kept_tflops);
    fflush(out_);
    rc = 0;
    goto done;
tj_fail:
    snprintf(msg, sizeof msg, "%s", e.msg);
done:
    if (G.dev) {
        G.dev->cu.CtxSynchronize();
        for (int i = 0; i < MAX_ROT; i++) {
            if (B.x[i]) G.dev->cu.MemFree(B.x[i]);
            if (B.y[i]) G.dev->cu.MemFree(B.y[i]);
            if (B.wd[i]) G.dev->cu.MemFree(B.wd[i]);
            tj_cuda_data_free(G.dev, &B.data[i]);
        }
        tj_cuda_kernel_destroy(G.dev, B.kern);
    }
    gpu_close(&G);
    tj_cache_close(cache);
    free(w32);
    free(wq);
    free(wdense);
    free(xq);
    free(x32);
    free(xs);
    free(yref);
    free(yget);
    free(rows);
    tj_layer_free(&l);
    if (rc) tj_args_fail(errs_, C, "%s", msg[0] ? msg : "failed");
    return rc;
}

/* ---- the hook of `tilejit model` ---- */

typedef struct hook {
    gpu *g;
    tj_model *m;
    int64_t layer;
    DLTensor *x, *y;
    CUdeviceptr w, xp, yp;
    int64_t M, n, k;
    int failed;
} hook;

static int launch_model(void *user, int i, char *err, size_t errlen)
{
    (void)i;
    hook *h = user;
    if (tj_linear_ex(h->m, h->layer, h->x, h->y, TJ_LAYOUT_ROW_MAJOR, h->g->stream) != TJ_OK) {
        snprintf(err, errlen, "%s", tj_context_error(h->m->ctx));
        return 1;
    }
    return 0;
}

#if TJ_HAVE_CUBLAS
static int launch_model_dense(void *user, int i, char *err, size_t errlen)
{
    (void)i;
    hook *h = user;
    return dense_gemm(h->g, 0, h->M, h->n, h->k, TJ_F16, TJ_F32, h->w, h->xp, h->k, h->yp, h->n, err, errlen);
}
#endif

static int time_layer(tj_model *m, int64_t layer, int64_t M, double min_time, double *tilejit_s, double *dense_s,
                      char *err, size_t errlen)
{
    *tilejit_s = *dense_s = -1;
    tj_cuda_device *dev = m ? tj_cuda_context_device(m->ctx) : NULL;
    if (!dev || m->ops->kind != TJ_BACKEND_CUDA) {
        snprintf(err, errlen, "the model is not loaded on the cuda backend");
        return 1;
    }
    const tj_layer *l = &m->pattern->layers[layer];
    gpu G;
    hook H = {.g = &G, .m = m, .layer = layer, .M = M, .n = l->n, .k = l->k};
    tj_error e;
    int rc = 1, ns = 0;
    uint16_t *hx = NULL, *hw = NULL;
    CUcontext prev = NULL;
    if (tj_cuda_device_bind(dev, &prev, &e) != TJ_OK) {
        snprintf(err, errlen, "%s", e.msg);
        return 1;
    }
    if (gpu_open(&G, -1, dev, err, errlen)) goto done;
    hx = malloc((size_t)(M * l->k) * 2);
    hw = malloc((size_t)(l->n * l->k) * 2);
    if (!hx || !hw) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    tj_rng rng = {12345};
    for (int64_t i = 0; i < M * l->k; i++) hx[i] = tj_f32_to_f16(tj_rng_uniform(&rng));
    for (int64_t i = 0; i < l->n * l->k; i++) hw[i] = tj_f32_to_f16(tj_load_f32(m->lw[layer].w, m->lw[layer].wdt, i));
    if (!(H.xp = dev_alloc(&G, M * l->k * 2, &e)) || !(H.yp = dev_alloc(&G, M * l->n * 4, &e)) ||
        !(H.w = dev_alloc(&G, l->n * l->k * 2, &e)) ||
        TJ_CU(&dev->cu, &e, MemcpyHtoD(H.xp, hx, (size_t)(M * l->k * 2))) != TJ_OK ||
        TJ_CU(&dev->cu, &e, MemcpyHtoD(H.w, hw, (size_t)(l->n * l->k * 2))) != TJ_OK) {
        snprintf(err, errlen, "%s", e.msg);
        goto done;
    }
    int64_t xs[2] = {M, l->k}, ys[2] = {M, l->n};
    DLTensor xt = {.data = (void *)(uintptr_t)H.xp, .device = {kDLCUDA, dev->ordinal}, .ndim = 2, .shape = xs,
                   .dtype = {kDLFloat, 16, 1}};
    DLTensor yt = {.data = (void *)(uintptr_t)H.yp, .device = {kDLCUDA, dev->ordinal}, .ndim = 2, .shape = ys,
                   .dtype = {kDLFloat, 32, 1}};
    H.x = &xt;
    H.y = &yt;
    double t = time_loop(&G, launch_model, &H, 8, 0, min_time, &ns, err, errlen);
    if (t < 0) goto done;
    *tilejit_s = t;
#if TJ_HAVE_CUBLAS
    if (gpu_blas(&G, err, errlen)) goto done;
    t = time_loop(&G, launch_model_dense, &H, 8, 0, min_time, &ns, err, errlen);
    if (t < 0) goto done;
    *dense_s = t;
#endif
    rc = 0;
done:
    if (G.dev) G.dev->cu.CtxSynchronize();
    if (H.xp) dev->cu.MemFree(H.xp);
    if (H.yp) dev->cu.MemFree(H.yp);
    if (H.w) dev->cu.MemFree(H.w);
    gpu_close(&G);
    tj_cuda_device_unbind(dev, prev);
    free(hx);
    free(hw);
    return rc;
}

tj_status tj_bench_cuda_time_layer(tj_model *m, int64_t layer, int64_t M, double min_time, double *tilejit_s,
                                   double *dense_s, tj_error *err)
{
    if (!m || !tilejit_s || !dense_s || layer < 0 || layer >= m->pattern->nlayers)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tj_bench_cuda_time_layer: bad model, layer or output");
    char msg[TJ_ERROR_MSG_MAX] = "";
    if (time_layer(m, layer, M, min_time, tilejit_s, dense_s, msg, sizeof msg))
        return tj_fail(err, TJ_ERR_DEVICE, "%s", msg[0] ? msg : "GPU timing failed");
    return TJ_OK;
}
