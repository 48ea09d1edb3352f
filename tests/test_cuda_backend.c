/* GPU correctness (suite 'cuda'; exits 77 without a usable GPU): every template (simt, mma) ×
 * offset mode (table, unrolled) × several configs × layouts (fm, rm, rm_fm, fm_rm) × dtypes,
 * on layers with odd shapes, empty tiles, cols, ew, bias and activations, for M = 1, 16, 333,
 * 4096 and 12800, against the reference on fresh random data (seed printed; TJ_SEED repeats a
 * run). Outputs and their padding are poisoned with NaN first: every output must be written and
 * no padding touched. Then the model API: host and device tensors, and 8 threads at once.
 * `-q` prints only failures and the summary; `--jobs N` runs only the first N kernel jobs.
 * Each job runs in a child process (see main): a faulting kernel costs only its own job. */
#include <pthread.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/backend_cuda.h"
#include "pattern/pattern.h"
#include "pattern/random.h"
#include "base/safetensors.h"
#include "tj_test.h"

static tj_cuda_device *dev;
static tj_cache *cache;
static uint64_t seed;
static int quiet;
static int max_jobs = 1 << 30; /* --jobs N: only the first N kernel jobs (a quick check) */

typedef struct lspec {
    const char *name;
    tj_random_spec spec;
    int bias;
    int big; /* also M = 4096 / 12800 */
} lspec;

static const lspec layer_specs[] = {
    {"bert_768x768_tw2", {.n = 768, .k = 768, .g = 128, .sparsity = 0.75, .mode = 2}, 1, 2},
    {"odd_cols_ew_gelu", {.n = 300, .k = 200, .g = 128, .sparsity = 0.6, .mode = 2, .ew_fraction = 0.01, .act = TJ_ACT_GELU}, 1, 1},
    {"empty_tiles_relu", {.n = 200, .k = 77, .g = 64, .sparsity = 0.5, .mode = 1, .empty_tile_fraction = 0.3, .act = TJ_ACT_RELU}, 0, 0},
    {"tiny_g16_ew", {.n = 37, .k = 45, .g = 16, .sparsity = 0.3, .mode = 1, .ew_fraction = 0.02, .act = TJ_ACT_GELU}, 1, 0},
    {"bert_3072x768_tw1", {.n = 3072, .k = 768, .g = 128, .sparsity = 0.75, .mode = 1}, 0, 2},
};
#define NLAYERS (int)(sizeof layer_specs / sizeof *layer_specs)

/* Configs as JSON over the default; bn is clamped to the layer's g below. */
static const char *configs[] = {
    "{\"template\":\"simt\",\"bm\":32,\"bn\":64,\"bk\":32,\"warps\":4,\"stages\":1}",
    "{\"template\":\"simt\",\"bm\":64,\"bn\":128,\"bk\":16,\"warps\":8,\"stages\":1}",
    "{\"template\":\"mma\"}",
    "{\"template\":\"mma\",\"bm\":64,\"bn\":64,\"bk\":16,\"warps\":4,\"stages\":2}",
    "{\"template\":\"mma\",\"bm\":128,\"bn\":128,\"bk\":64,\"warps\":8,\"stages\":4}",
    "{\"template\":\"mma\",\"bm\":256,\"bn\":64,\"bk\":32,\"warps\":8,\"stages\":3}",
};
#define NCONFIGS (int)(sizeof configs / sizeof *configs)

typedef struct layer_data {
    tj_layer l;
    uint16_t *w[2];   /* W rounded to fp16 / bf16 */
    float *bias;
    tj_cuda_data d[2];
    int uploaded[2];
} layer_data;

static layer_data L[NLAYERS];

static int pow2_at_least(int64_t v)
{
    int p = 16;
    while (p < v && p < 128) p *= 2;
    return p;
}

static double bound_for(tj_dtype in, tj_dtype out)
{
    return in == TJ_BF16 || out == TJ_BF16 ? 1e-2 : 2e-3;
}

static int check_cu(tj_status s, tj_error *e, const char *what)
{
    tj_test_checks++;
    if (s == TJ_OK) return 1;
    fprintf(stderr, "%s: %s\n", what, e->msg);
    tj_test_failures++;
    return 0;
}

/* One run of kernel k on layer li with M tokens; returns 1 if correct. */
static int run_case(const char *label, int li, tj_cuda_kernel *k, int64_t M, int pad, tj_rng *rng)
{
    layer_data *ld = &L[li];
    const tj_layer *l = &ld->l;
    const tj_cuda_config *c = &k->cfg;
    tj_error e;
    int slot = c->dtype == TJ_BF16;
    tj_cu_api *cu = &dev->cu;
    if (!ld->uploaded[slot]) {
        if (!check_cu(tj_cuda_data_upload(dev, l, c->dtype, ld->w[slot], c->dtype, ld->bias, TJ_F32, &ld->d[slot], &e), &e,
                      "upload"))
            return 0;
        ld->uploaded[slot] = 1;
    }
    int64_t ldx = c->x_fm ? (M + 7) / 8 * 8 + (pad ? 8 : 0) : l->k + (pad ? 5 : 0);
    int64_t ldy = c->y_fm ? M + (pad ? 3 : 0) : l->n + (pad ? 3 : 0);
    int64_t xrows = c->x_fm ? l->k : M, yrows = c->y_fm ? l->n : M;
    size_t osz = tj_dtype_size(c->out);
    int64_t xel = xrows * ldx, yel = yrows * ldy;
    /* With padding, y also starts one element into its buffer (a slice view at an odd offset):
     * the epilogue's pair stores must notice and store singly. */
    int64_t ysh = pad ? 1 : 0;
    uint16_t *hx = calloc((size_t)xel, 2);
    void *hy = malloc((size_t)(yel + ysh) * osz);
    float *x32 = malloc((size_t)(M * l->k) * 4);
    int64_t nrows = M < 384 ? M : 384;
    int64_t *rows = malloc((size_t)nrows * sizeof *rows);
    float *xs = malloc((size_t)(nrows * l->k) * 4), *yref = malloc((size_t)(nrows * l->n) * 4),
          *yget = malloc((size_t)(nrows * l->n) * 4);
    CUdeviceptr dx = 0, dy = 0;
    int ok = 0;
    if (!hx || !hy || !x32 || !rows || !xs || !yref || !yget) goto done;
    for (int64_t i = 0; i < M * l->k; i++) {
        float v = tj_rng_uniform(rng);
        uint16_t h = c->dtype == TJ_BF16 ? tj_f32_to_bf16(v) : tj_f32_to_f16(v);
        int64_t m = i / l->k, kk = i % l->k;
        hx[c->x_fm ? kk * ldx + m : m * ldx + kk] = h;
        x32[i] = c->dtype == TJ_BF16 ? tj_bf16_to_f32(h) : tj_f16_to_f32(h);
    }
    if (!check_cu(TJ_CU(cu, &e, MemAlloc(&dx, (size_t)xel * 2)), &e, "alloc") ||
        !check_cu(TJ_CU(cu, &e, MemAlloc(&dy, (size_t)(yel + ysh) * osz)), &e, "alloc") ||
        !check_cu(TJ_CU(cu, &e, MemcpyHtoD(dx, hx, (size_t)xel * 2)), &e, "copy"))
        goto done;
    /* Poison: NaN everywhere, padding included. */
    tj_status s = c->out == TJ_F32 ? TJ_CU(cu, &e, MemsetD32Async(dy, 0x7fc00000u, (size_t)(yel + ysh), NULL))
                                   : TJ_CU(cu, &e, MemsetD16Async(dy, c->out == TJ_F16 ? 0x7e00 : 0x7fc0, (size_t)(yel + ysh), NULL));
    if (!check_cu(s, &e, "poison")) goto done;
    if (!check_cu(tj_cuda_kernel_launch(dev, k, &ld->d[slot], dx, ldx, dy + (CUdeviceptr)(ysh * (int64_t)osz), ldy, M,
                                        NULL, &e), &e, label))
        goto done;
    if (!check_cu(TJ_CU(cu, &e, CtxSynchronize()), &e, label) ||
        !check_cu(TJ_CU(cu, &e, MemcpyDtoH(hy, dy, (size_t)(yel + ysh) * osz)), &e, "copy back"))
        goto done;
    int64_t nan_out = 0, touched_pad = ysh && !isnan(tj_load_f32(hy, c->out, 0));
    if (ysh) memmove(hy, (char *)hy + osz, (size_t)yel * osz);
    for (int64_t r = 0; r < yrows; r++)
        for (int64_t q = 0; q < ldy; q++) {
            int isn = isnan(tj_load_f32(hy, c->out, r * ldy + q)) != 0;
            if (q < (c->y_fm ? M : l->n)) nan_out += isn;
            else touched_pad += !isn;
        }
    for (int64_t q = 0; q < nrows; q++) {
        rows[q] = nrows == 1 ? 0 : q * (M - 1) / (nrows - 1);
        memcpy(xs + q * l->k, x32 + rows[q] * l->k, (size_t)l->k * 4);
    }
    tj_layer_weights lw = {.w = ld->w[slot], .wdt = c->dtype, .bias = ld->bias, .bdt = TJ_F32};
    tj_reference_linear(l, &lw, xs, nrows, yref);
    for (int64_t q = 0; q < nrows; q++)
        for (int64_t n = 0; n < l->n; n++)
            yget[q * l->n + n] = tj_load_f32(hy, c->out, c->y_fm ? n * ldy + rows[q] : rows[q] * ldy + n);
    double rel = tj_test_relerr(yget, yref, nrows * l->n), bound = bound_for(c->dtype, c->out);
    if (isnan(rel)) rel = INFINITY;
    ok = rel <= bound && nan_out == 0 && touched_pad == 0;
    tj_test_checks++;
    if (!ok) tj_test_failures++;
    if (!ok || !quiet)
        printf("%-5s %-18s %-44s M %5lld: relerr %.2e (bound %.0e) unwritten %lld padding-written %lld\n",
               ok ? "ok" : "FAIL", layer_specs[li].name, label, (long long)M, rel, bound, (long long)nan_out,
               (long long)touched_pad);
done:
    if (dx) cu->MemFree(dx);
    if (dy) cu->MemFree(dy);
    free(hx);
    free(hy);
    free(x32);
    free(rows);
    free(xs);
    free(yref);
    free(yget);
    return ok;
}

static const char *layout_names[] = {"fm", "rm", "rm_fm", "fm_rm"};

/* Progress of a child to its parent (see main): one line per finished job. */
static int report_fd = -1;

static void report(const char *fmt, ...)
{
    char line[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fflush(stdout);
    fflush(stderr);
    if (report_fd >= 0 && n > 0 && write(report_fd, line, (size_t)n) != n) _exit(4);
}

/* After job `job`: its failures and checks go to the parent; a context left faulted (a sticky
 * error such as an illegal address) ends this process, and the parent goes on in a fresh one. */
static void job_done(int job, int f0, int c0)
{
    report("done %d %d %d\n", job, tj_test_failures - f0, tj_test_checks - c0);
    if (dev->cu.CtxSynchronize() != CUDA_SUCCESS) {
        fprintf(stderr, "job %d left the CUDA context faulted: continuing in a fresh process\n", job);
        report("fault %d\n", job);
        fflush(NULL);
        _exit(3);
    }
}

static int test_kernels(int from)
{
    /* Every (layer, config, offsets) from job `from` on compiled in parallel, then run with
     * rotating layouts and dtypes. The job list is the same in every process. */
    enum { MAXJ = NLAYERS * NCONFIGS * 2 };
    tj_nvrtc_job jobs[MAXJ];
    tj_cuda_config cfgs[MAXJ];
    int jl[MAXJ], nj = 0;
    char *srcs[MAXJ];
    memset(jobs, 0, sizeof jobs);
    for (int li = 0; li < NLAYERS; li++)
        for (int ci = 0; ci < NCONFIGS; ci++)
            for (int off = 0; off < 2; off++) {
                tj_error e;
                tj_cuda_config c = tj_cuda_config_default(&L[li].l);
                if (tj_cuda_config_from_json(configs[ci], &c, &e) != TJ_OK) {
                    fprintf(stderr, "config %s: %s\n", configs[ci], e.msg);
                    tj_test_failures++;
                    continue;
                }
                int v = li * 7 + ci * 3 + off;
                c.offsets = off ? TJ_CUDA_OFFSETS_UNROLLED : TJ_CUDA_OFFSETS_TABLE;
                if (c.bn > pow2_at_least(L[li].l.g)) c.bn = pow2_at_least(L[li].l.g);
                c.x_fm = (v % 4 == 0 || v % 4 == 3);
                c.y_fm = (v % 4 == 0 || v % 4 == 2);
                c.dtype = v % 3 == 1 ? TJ_BF16 : TJ_F16;
                c.out = (tj_dtype)(v % 3 == 2 ? TJ_F16 : v % 5 == 1 ? TJ_BF16 : TJ_F32);
                if (tj_cuda_config_fits(dev, &L[li].l, &c, &e) != TJ_OK) {
                    printf("skip  %-18s %s: %s\n", layer_specs[li].name, configs[ci], e.msg);
                    continue;
                }
                if (nj >= max_jobs) continue;
                srcs[nj] = NULL;
                if (nj < from) { /* done by an earlier process */
                    cfgs[nj] = c;
                    jl[nj++] = li;
                    continue;
                }
                if (tj_cuda_emit(&L[li].l, &c, &srcs[nj], &e) != TJ_OK) {
                    fprintf(stderr, "emit %s %s: %s\n", layer_specs[li].name, configs[ci], e.msg);
                    tj_test_failures++;
                    continue;
                }
                jobs[nj].source = srcs[nj];
                jobs[nj].label = layer_specs[li].name;
                jobs[nj].sm = dev->sm;
                cfgs[nj] = c;
                jl[nj++] = li;
            }
    tj_error e;
    double t0 = tj_now();
    if (from < nj) tj_nvrtc_compile_all(cache, jobs + from, nj - from, 0, &e);
    printf("compiled %d kernels for sm_%d in %.1f s\n", nj - from, dev->sm, tj_now() - t0);
    report("total %d\n", nj + 1);
    int cases = 0, passed = 0;
    for (int j = from; j < nj; j++) {
        int f0 = tj_test_failures, c0 = tj_test_checks;
        tj_rng rng = {seed + (uint64_t)j * 0x9e3779b97f4a7c15ull}; /* per job: the same data in any process */
        int li = jl[j];
        tj_cuda_config *c = &cfgs[j];
        tj_strbuf sb;
        tj_sb_init(&sb);
        tj_sb_printf(&sb, "%s/%s/%s %s->%s bm%d bn%d bk%d w%d s%d", c->tmpl == TJ_CUDA_TEMPLATE_MMA ? "mma" : "simt",
                     c->offsets == TJ_CUDA_OFFSETS_UNROLLED ? "unrolled" : "table",
                     layout_names[c->x_fm && c->y_fm ? 0 : !c->x_fm && !c->y_fm ? 1 : c->x_fm ? 3 : 2],
                     tj_dtype_name(c->dtype), tj_dtype_name(c->out), c->bm, c->bn, c->bk, c->warps, c->stages);
        const char *label = sb.data ? sb.data : "?";
        if (jobs[j].status != TJ_OK) {
            printf("FAIL  %-18s %s: compile: %.2000s\n", layer_specs[li].name, label, jobs[j].error.msg);
            tj_test_failures++;
            tj_sb_free(&sb);
            job_done(j, f0, c0);
            continue;
        }
        tj_cuda_kernel *k = NULL;
        if (!check_cu(tj_cuda_kernel_load(dev, &L[li].l, c, &jobs[j].result, &k, &e), &e, label)) {
            tj_sb_free(&sb);
            job_done(j, f0, c0);
            continue;
        }
        static const int64_t small_m[] = {1, 16, 333};
        for (int q = 0; q < 3; q++) {
            cases++;
            passed += run_case(label, li, k, small_m[q], (j + q) % 2, &rng);
        }
        if (layer_specs[li].big >= 1) {
            cases++;
            passed += run_case(label, li, k, 4096, j % 2, &rng);
        }
        if (layer_specs[li].big >= 2) {
            cases++;
            passed += run_case(label, li, k, 12800, 0, &rng);
        }
        tj_cuda_kernel_destroy(dev, k);
        tj_sb_free(&sb);
        job_done(j, f0, c0);
    }
    for (int j = from; j < nj; j++) {
        tj_cubin_free(&jobs[j].result);
        free(srcs[j]);
    }
    printf("kernel cases in this process: %d of %d passed\n", passed, cases);
    return nj;
}

/* ---- the model API ---- */

typedef struct thread_case {
    tj_model *m;
    int64_t layer, M;
    int fm, id;
    int failures;
    double worst;
} thread_case;

static char tmpdir[256];

/* x (fp16 device), y (fp32 device) through tj_linear_ex on a stream; checked against the reference. */
static void *model_thread(void *arg)
{
    thread_case *t = arg;
    const tj_layer *l = &t->m->pattern->layers[t->layer];
    const tj_layer_weights *lw = &t->m->lw[t->layer];
    tj_cu_api *cu = &dev->cu;
    tj_error e;
    CUcontext prev;
    CUstream st = NULL;
    CUdeviceptr dx = 0, dy = 0;
    int64_t M = t->M;
    uint16_t *hx = malloc((size_t)(M * l->k) * 2);
    float *x32 = malloc((size_t)(M * l->k) * 4), *y = malloc((size_t)(M * l->n) * 4),
          *yref = malloc((size_t)(M * l->n) * 4), *yt = malloc((size_t)(M * l->n) * 4);
    tj_rng rng = {seed + 1000 + (uint64_t)t->id};
    if (tj_cuda_device_bind(dev, &prev, &e) != TJ_OK || TJ_CU(cu, &e, StreamCreate(&st, CU_STREAM_NON_BLOCKING)) != TJ_OK ||
        TJ_CU(cu, &e, MemAlloc(&dx, (size_t)(M * l->k) * 2)) != TJ_OK || TJ_CU(cu, &e, MemAlloc(&dy, (size_t)(M * l->n) * 4)) != TJ_OK) {
        fprintf(stderr, "thread %d: %s\n", t->id, e.msg);
        t->failures++;
        goto done;
    }
    for (int rep = 0; rep < 6; rep++) {
        for (int64_t i = 0; i < M * l->k; i++) {
            uint16_t h = tj_f32_to_f16(tj_rng_uniform(&rng));
            int64_t m = i / l->k, kk = i % l->k;
            hx[t->fm ? kk * M + m : i] = h;
            x32[i] = tj_f16_to_f32(h);
        }
        tj_reference_linear(l, lw, x32, M, yref);
        cu->MemcpyHtoD(dx, hx, (size_t)(M * l->k) * 2);
        cu->MemsetD32Async(dy, 0x7fc00000u, (size_t)(M * l->n), st);
        int64_t xs[2] = {t->fm ? l->k : M, t->fm ? M : l->k}, ys[2] = {t->fm ? l->n : M, t->fm ? M : l->n};
        DLTensor xt = {.data = (void *)(uintptr_t)dx, .device = {kDLCUDA, dev->ordinal}, .ndim = 2, .shape = xs,
                       .dtype = {kDLFloat, 16, 1}};
        DLTensor ytn = {.data = (void *)(uintptr_t)dy, .device = {kDLCUDA, dev->ordinal}, .ndim = 2, .shape = ys,
                        .dtype = {kDLFloat, 32, 1}};
        if (tj_linear_ex(t->m, t->layer, &xt, &ytn, t->fm, st) != TJ_OK) {
            fprintf(stderr, "thread %d: %s\n", t->id, tj_context_error(t->m->ctx));
            t->failures++;
            break;
        }
        if (TJ_CU(cu, &e, StreamSynchronize(st)) != TJ_OK || TJ_CU(cu, &e, MemcpyDtoH(y, dy, (size_t)(M * l->n) * 4)) != TJ_OK) {
            fprintf(stderr, "thread %d: %s\n", t->id, e.msg);
            t->failures++;
            break;
        }
        for (int64_t i = 0; i < M * l->n; i++) yt[i] = t->fm ? y[(i % l->n) * M + i / l->n] : y[i];
        double rel = tj_test_relerr(yt, yref, M * l->n);
        if (isnan(rel)) rel = INFINITY;
        if (!(rel <= 2e-3) || !tj_test_all_finite(yt, M * l->n)) t->failures++;
        if (!(rel <= t->worst)) t->worst = rel;
    }
done:
    if (dx) cu->MemFree(dx);
    if (dy) cu->MemFree(dy);
    if (st) cu->StreamDestroy(st);
    tj_cuda_device_unbind(dev, prev);
    free(hx);
    free(x32);
    free(y);
    free(yref);
    free(yt);
    return NULL;
}

static void test_model_api(void)
{
    char pat[300], wts[300];
    snprintf(pat, sizeof pat, "%s/m.json", tmpdir);
    snprintf(wts, sizeof wts, "%s/m.safetensors", tmpdir);
    tj_pattern p = {.nlayers = 2, .layers = (tj_layer[]){L[1].l, L[0].l}};
    char *names[2] = {p.layers[0].name, p.layers[1].name};
    p.layers[0].name = "blk.fc1";
    p.layers[1].name = "blk.fc2";
    tj_error e;
    int ok = tj_pattern_save(&p, pat, &e) == TJ_OK;
    p.layers[0].name = names[0];
    p.layers[1].name = names[1];
    int64_t s1[2] = {L[1].l.n, L[1].l.k}, b1[1] = {L[1].l.n}, s0[2] = {L[0].l.n, L[0].l.k};
    tj_st_out_tensor t[3] = {{"blk.fc1.weight", "F16", 2, s1, L[1].w[0], (uint64_t)(s1[0] * s1[1] * 2)},
                             {"blk.fc1.bias", "F32", 1, b1, L[1].bias, (uint64_t)b1[0] * 4},
                             {"blk.fc2.weight", "F16", 2, s0, L[0].w[0], (uint64_t)(s0[0] * s0[1] * 2)}};
    ok = ok && tj_st_write(wts, t, 3, NULL, &e) == TJ_OK;
    CHECKF(ok, "writing the model: %s", e.msg);
    if (!ok) return;
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_CUDA;
    tj_context *ctx = NULL;
    tj_model *m = NULL;
    CHECKF(tj_context_create(&o, &ctx) == TJ_OK, "%s", tj_last_error());
    if (!ctx) return;
    CHECKF(tj_model_load(ctx, pat, wts, &m) == TJ_OK, "%s", tj_context_error(ctx));
    if (m) {
        /* Host tensors, fp32, both layouts, through the staging path. */
        for (int fm = 0; fm < 2; fm++) {
            const tj_layer *l = &m->pattern->layers[0];
            int64_t M = 77;
            float *x = malloc((size_t)(M * l->k) * 4), *xl = malloc((size_t)(M * l->k) * 4),
                  *y = malloc((size_t)(M * l->n) * 4), *yref = malloc((size_t)(M * l->n) * 4), *yt = malloc((size_t)(M * l->n) * 4);
            tj_rng r = {seed + 7 + (uint64_t)fm};
            for (int64_t i = 0; i < M * l->k; i++) xl[i] = tj_f16_to_f32(tj_f32_to_f16(tj_rng_uniform(&r)));
            for (int64_t i = 0; i < M * l->k; i++) x[fm ? (i % l->k) * M + i / l->k : i] = xl[i];
            for (int64_t i = 0; i < M * l->n; i++) y[i] = NAN;
            int64_t xs[2] = {fm ? l->k : M, fm ? M : l->k}, ys[2] = {fm ? l->n : M, fm ? M : l->n};
            DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
            DLTensor ytn = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
            CHECKF(tj_linear_ex(m, 0, &xt, &ytn, fm, NULL) == TJ_OK, "%s", tj_context_error(ctx));
            tj_reference_linear(l, &m->lw[0], xl, M, yref);
            for (int64_t i = 0; i < M * l->n; i++) yt[i] = fm ? y[(i % l->n) * M + i / l->n] : y[i];
            double rel = tj_test_relerr(yt, yref, M * l->n);
            CHECKF(rel <= 2e-3 && tj_test_all_finite(yt, M * l->n), "model host %s: relerr %g", fm ? "fm" : "rm", rel);
            printf("%-5s model API, host fp32 %s, M %lld: relerr %.2e\n", rel <= 2e-3 ? "ok" : "FAIL", fm ? "fm" : "rm",
                   (long long)M, rel);
            free(x);
            free(xl);
            free(y);
            free(yref);
            free(yt);
        }
        /* 8 threads, each its own stream and buffers, both layers and layouts at once. */
        pthread_t th[8];
        thread_case tc[8];
        for (int i = 0; i < 8; i++) {
            tc[i] = (thread_case){.m = m, .layer = i % 2, .M = i % 3 == 0 ? 16 : i % 3 == 1 ? 200 : 1, .fm = (i / 2) % 2, .id = i};
            pthread_create(&th[i], NULL, model_thread, &tc[i]);
        }
        int fails = 0;
        double worst = 0;
        for (int i = 0; i < 8; i++) {
            pthread_join(th[i], NULL);
            fails += tc[i].failures;
            if (tc[i].worst > worst) worst = tc[i].worst;
        }
        CHECKF(fails == 0, "%d threaded calls failed", fails);
        printf("%-5s model API, 8 threads x 6 calls on device tensors: worst relerr %.2e\n", fails ? "FAIL" : "ok", worst);
    }
    tj_model_destroy(m);
    tj_context_destroy(ctx);
}

/* One process: opens the device, runs jobs from `from` (kernel jobs, then the model API as the
 * last job), reporting each to fd. Exit 77: no usable GPU. */
static int child_main(int from, int fd)
{
    report_fd = fd;
    tj_error e;
    tj_status s = tj_cuda_device_open(0, &dev, &e);
    if (s != TJ_OK) {
        printf("skipped: %s\n", e.msg);
        return 77;
    }
    /* The primary context stays current on this thread (allocations and copies below). */
    CUcontext prev;
    if (tj_cuda_device_bind(dev, &prev, &e) != TJ_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    char desc[512];
    tj_cuda_device_describe(dev, desc, sizeof desc);
    if (from == 0)
        printf("device %s; seed %llu (TJ_SEED=%llu repeats this run)\n", desc, (unsigned long long)seed,
               (unsigned long long)seed);
    if (tj_cache_open(NULL, &cache, &e) != TJ_OK) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    tj_rng wr = {seed ^ 0x5eed};
    for (int li = 0; li < NLAYERS; li++) {
        tj_random_spec sp = layer_specs[li].spec;
        sp.seed = seed + (uint64_t)li;
        CHECK_OK(tj_random_layer(&sp, layer_specs[li].name, &L[li].l, &e), &e);
        int64_t nk = L[li].l.n * L[li].l.k;
        float *w = malloc((size_t)nk * 4);
        L[li].w[0] = malloc((size_t)nk * 2);
        L[li].w[1] = malloc((size_t)nk * 2);
        for (int64_t i = 0; i < nk; i++) w[i] = tj_rng_uniform(&wr);
        tj_convert_from_f32(w, nk, TJ_F16, L[li].w[0]);
        tj_convert_from_f32(w, nk, TJ_BF16, L[li].w[1]);
        free(w);
        if (layer_specs[li].bias) {
            L[li].bias = malloc((size_t)L[li].l.n * 4);
            for (int64_t i = 0; i < L[li].l.n; i++) L[li].bias[i] = tj_rng_uniform(&wr);
        }
    }
    int nj = test_kernels(from);
    int f0 = tj_test_failures, c0 = tj_test_checks;
    test_model_api();
    job_done(nj, f0, c0);
    for (int li = 0; li < NLAYERS; li++) {
        for (int t = 0; t < 2; t++) {
            tj_cuda_data_free(dev, &L[li].d[t]);
            free(L[li].w[t]);
        }
        free(L[li].bias);
        tj_layer_free(&L[li].l);
    }
    tj_cache_close(cache);
    tj_cuda_device_close(dev);
    fflush(NULL);
    return 0;
}

/* The parent never touches CUDA: it runs the jobs in child processes, each with its own context,
 * so a kernel that faults (and leaves its context unusable) or kills its process costs that one
 * job, counted as failed; the next child goes on after it. Compiled kernels are shared through
 * the on-disk cache, so a restart recompiles nothing. */
int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-q") == 0) quiet = 1;
        else if (strcmp(argv[i], "--jobs") == 0 && i + 1 < argc) max_jobs = atoi(argv[++i]);
    }
    const char *env = getenv("TJ_SEED");
    seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tj_cuda_backend_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    int from = 0, total = -1, processes = 0, crashed = 0, rc = 0;
    for (;;) {
        int fds[2];
        if (pipe(fds) != 0) return 1;
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            close(fds[0]);
            _exit(child_main(from, fds[1]));
        }
        processes++;
        close(fds[1]);
        FILE *f = fdopen(fds[0], "r");
        char line[128];
        int last = from - 1;
        while (f && fgets(line, sizeof line, f)) {
            int j, fl, ch;
            if (sscanf(line, "total %d", &j) == 1) total = j;
            else if (sscanf(line, "done %d %d %d", &j, &fl, &ch) == 3) {
                tj_test_failures += fl;
                tj_test_checks += ch;
                last = j;
            }
        }
        if (f) fclose(f);
        int st = 0;
        waitpid(pid, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 77 && processes == 1) {
            rc = 77;
            break;
        }
        if (total < 0) { /* died before listing its jobs: nothing to go on with */
            fprintf(stderr, "FAIL  the test process ended before its first job (status 0x%x)\n", st);
            tj_test_failures++;
            break;
        }
        if (last >= total - 1) break;
        /* The process ended early. A job it reported done and then found the context faulted in
         * is already counted; a job it died in (a signal, an abort) is counted here. */
        int next = last + 1;
        if (!(WIFEXITED(st) && WEXITSTATUS(st) == 3)) {
            fprintf(stderr, "FAIL  job %d ended its process (status 0x%x): continuing in a fresh process\n", next, st);
            tj_test_failures++;
            tj_test_checks++;
            crashed++;
            next++;
        }
        if (next > total - 1) break;
        from = next;
    }
    if (rc != 77) printf("isolation: %d process%s, %d crashed\n", processes, processes == 1 ? "" : "es", crashed);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) { /* best effort */ }
    return rc == 77 ? 77 : tj_test_end();
}
