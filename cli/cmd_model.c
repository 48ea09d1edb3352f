/* `tilejit model`: every layer of a pruned model on random input, checked against the reference
 * and timed against the dense baseline (the faster of oneDNN and OpenBLAS computing the same layer
 * on the CPU, cuBLAS on the GPU): the paper's per-model table, with the path each layer took (its
 * kernel or the dense path). Load time is reported cold (empty kernel cache) and warm. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "tj_config.h"
#if TJ_HAVE_LLVM
#include "tilejit/bench.h"
#endif

/* The GPU timing comes from tj_bench_cuda_time_layer (tilejit/bench.h): device-resident X [M × k]
 * / Y (tilejit, seconds per call, median) and cuBLAS on the same dense shape (fp16 in, fp32
 * accumulate). When it fails (no CUDA in the build, no cuBLAS), host tensors through staging
 * copies and no dense column. */

static const char *help =
    "usage: tilejit model PATTERN --weights W.safetensors [--backend auto|cpu|cuda|reference]\n"
    "                     [--m M] [--threads T] [--min-time S] [--tuning-log LOG]\n"
    "                     [--cache-dir DIR] [--reference-weights DENSE.safetensors]\n"
    "                     [--precision auto|f32|bf16] [-v]\n\n"
    "Loads every layer of the model, runs each on random input X [M × k] (M = batch × tokens,\n"
    "default 128), checks Y against the reference backend (relative error ≤ 1e-5 in fp32,\n"
    "≤ 1e-2 for layers computing in bf16, ≤ 2e-3 on the GPU's fp16 path) and times it against\n"
    "the dense baseline of the same precision on the same shape: on the CPU the faster of\n"
    "oneDNN's fp32 matmul (bias and activation fused) and OpenBLAS sgemm (then a bias and\n"
    "activation pass), oneDNN bf16 for layers computing in bf16, each computing the whole layer\n"
    "with the same thread count; cuBLAS on the GPU. Column 'path': what the layer ran at this M,\n"
    "its generated kernel or the dense path (onednn, openblas; docs/dense-path.md), where that is\n"
    "faster; column 'prec': the precision it computed in (f32, bf16). --precision (CPU backend):\n"
    "auto (default) computes a layer in bf16 where the CPU has avx512_bf16 or AMX and its weights\n"
    "are BF16, else fp32; each layer's config at M is printed after the table.\n"
    "Timing: a warm-up, then at least 5 repeats and --min-time seconds (default 0.1), median\n"
    "per call; on the CPU tilejit and oneDNN in 3 interleaved rounds (each a third of --min-time),\n"
    "then OpenBLAS, the median round. Prints one row per layer and the total; exits 1 if any\n"
    "layer is out of bounds.\n\n"
    "Load time is shown cold and warm: without --cache-dir the model is loaded into a fresh\n"
    "temporary kernel cache (cold), then loaded again from it (warm).\n\n"
    "--reference-weights DENSE.safetensors: also compare each layer's output with the dense\n"
    "checkpoint's (NAME.weight and NAME.bias there) on the same random X: the cosine of the two\n"
    "outputs per layer (column 'cos.dense') and over all layers together. Random X is not the\n"
    "model's real input: for the model's own agreement see python -m tilejit.calibrate\n"
    "--evaluate or scripts/quality.\n";

/* cos(Y, X · Wdᵀ + bd) for the reference checkpoint's layer, accumulated into the overall sums.
 * Returns NAN when the checkpoint has no usable NAME.weight of the layer's shape. */
static double dense_agreement(const tj_st_file *ref, const tj_layer_info *li, const float *x, int64_t M,
                              const float *y, double *dot_all, double *yy_all, double *dd_all)
{
    char name[1100];
    snprintf(name, sizeof name, "%s.weight", li->name);
    const tj_st_tensor *w = tj_st_find(ref, name);
    snprintf(name, sizeof name, "%s.bias", li->name);
    const tj_st_tensor *b = tj_st_find(ref, name);
    if (!w || !w->dtype_ok || w->ndim != 2 || w->shape[0] != li->n || w->shape[1] != li->k) return NAN;
    if (b && (!b->dtype_ok || b->ndim != 1 || b->shape[0] != li->n)) b = NULL;
    float *wr = malloc((size_t)li->k * sizeof *wr);
    if (!wr) return NAN;
    double dot = 0, yy = 0, dd = 0;
    for (int64_t n = 0; n < li->n; n++) {
        tj_convert_to_f32((const char *)w->data + (size_t)(n * li->k) * tj_dtype_size(w->dtype), w->dtype, li->k, wr);
        double bias = b ? tj_load_f32(b->data, b->dtype, n) : 0;
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * li->k;
            double d = bias;
            for (int64_t k = 0; k < li->k; k++) d += (double)xm[k] * wr[k];
            double v = y[m * li->n + n];
            dot += v * d;
            yy += v * v;
            dd += d * d;
        }
    }
    free(wr);
    *dot_all += dot;
    *yy_all += yy;
    *dd_all += dd;
    return yy > 0 && dd > 0 ? dot / sqrt(yy * dd) : 0;
}

typedef struct timed {
    tj_model *model;
    int64_t layer;
    DLTensor *x, *y;
    int failed;
#if TJ_HAVE_LLVM
    tj_dense *dense; /* the dense baseline being timed */
#endif
} timed;

static int run_tilejit(timed *t)
{
    if (tj_linear_ex(t->model, t->layer, t->x, t->y, TJ_LAYOUT_ROW_MAJOR, NULL) != TJ_OK) {
        t->failed = 1;
        return 1;
    }
    return 0;
}

#if TJ_HAVE_LLVM
static int run_dense(timed *t) { return tj_dense_run(t->dense); }
#endif

/* Uniform in [-1, 1) from a splitmix64 stream: the random X of every layer. */
static float uniform(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((z >> 40) * (2.0 / 16777216.0) - 1.0);
}

static int run_tilejit_fn(void *t) { return run_tilejit(t); }
#if TJ_HAVE_LLVM
static int run_dense_fn(void *t) { return run_dense(t); }
#endif

/* The harness's timing loop (tj_time_calls): two warm-up calls size a batch of calls taking
 * about min_time / 10, then at least 5 samples and min_time seconds (at most 200 samples).
 * Returns the median seconds per call, or -1 if a call failed. */
static double measure(tj_timed_fn fn, timed *t, double min_time)
{
    tj_time_options o = tj_time_options_default();
    o.warmup_s = 0;
    o.min_time_s = min_time;
    o.min_reps = 5;
    o.max_reps = 200;
    o.batch = 0;
    tj_timing tm;
    return tj_time_calls(fn, t, &o, &tm, NULL, 0, NULL) == TJ_OK ? tm.median_s : -1;
}

/* Rounds of interleaved timing per layer (CPU): tilejit and oneDNN, ROUNDS times. */
#define ROUNDS 3
_Static_assert(ROUNDS == 3, "median3 takes three rounds");

#if TJ_HAVE_LLVM
/* The median of ROUNDS times; -1 when any is missing. */
static double median3(const double v[ROUNDS])
{
    double a = v[0], b = v[1], c = v[2];
    if (a < 0 || b < 0 || c < 0) return -1;
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}
#endif

/* Removes a temporary cache directory tree (two levels are enough for the kernel cache, but
 * recurse anyway). Best effort. */
static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[4096];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            struct stat st;
            if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(sub);
            else unlink(sub);
        }
        closedir(d);
    }
    rmdir(path);
}

static void fmt_ms(char *buf, size_t len, double s)
{
    if (s < 0) snprintf(buf, len, "-");
    else snprintf(buf, len, "%.4f", 1e3 * s);
}

int cmd_model(int argc, char **argv)
{
    const char *weights = NULL, *backend = "auto", *threads_s = NULL, *m_s = NULL, *min_time_s = NULL;
    const char *tlog = NULL, *cache = NULL, *refw = NULL, *prec_s = "auto", *pos[1];
    int verbose = 0, npos;
    cli_opt opts[] = {{"weights", 1, &weights, NULL},   {"backend", 1, &backend, NULL},
                      {"m", 1, &m_s, NULL},             {"threads", 1, &threads_s, NULL},
                      {"min-time", 1, &min_time_s, NULL}, {"tuning-log", 1, &tlog, NULL},
                      {"cache-dir", 1, &cache, NULL},   {"v", 0, NULL, &verbose},
                      {"verbose", 0, NULL, &verbose},   {"reference-weights", 1, &refw, NULL},
                      {"precision", 1, &prec_s, NULL},  {0}};
    int r = cli_parse("model", argc, argv, opts, pos, 1, &npos);
    if (r == 2) { fputs(help, stdout); return 0; }
    if (r) return 1;
    if (npos != 1) return cli_fail("model", "expected one PATTERN file (see --help)");
    if (!weights) return cli_fail("model", "--weights is required");
    tj_options opt = tj_options_default();
    if (cli_parse_backend("model", backend, &opt.backend) || cli_parse_precision("model", prec_s, &opt.precision)) return 1;
    int64_t M = 128, threads = 0;
    double min_time = 0.1;
    if (m_s && cli_parse_int("model", "m", m_s, 1, 1 << 20, &M)) return 1;
    if (threads_s && cli_parse_int("model", "threads", threads_s, 0, 1024, &threads)) return 1;
    if (min_time_s && cli_parse_double("model", "min-time", min_time_s, 0, 60, &min_time)) return 1;
    opt.threads = (int)threads;
    opt.tuning_log = tlog;
    opt.verbose = verbose;

    char tmpdir[] = "/tmp/tilejit-model-XXXXXX";
    int own_cache = 0;
    if (!cache) {
        if (!mkdtemp(tmpdir)) return cli_fail("model", "cannot create a temporary kernel cache directory");
        own_cache = 1;
        cache = tmpdir;
    }
    opt.cache_dir = cache;

    tj_context *ctx = NULL;
    tj_model *model = NULL;
    tj_st_file *ref = NULL;
    double agree_dot = 0, agree_yy = 0, agree_dd = 0, agree_min = INFINITY;
    float *x = NULL, *y = NULL, *yref = NULL, *wf = NULL, *bf = NULL;
    int rc = 1;
    if (refw) {
        tj_error rerr = {0};
        if (tj_st_open(refw, &ref, &rerr) != TJ_OK) { cli_fail("model", "--reference-weights: %s", rerr.msg); goto done; }
    }
    if (tj_context_create(&opt, &ctx) != TJ_OK) { cli_fail("model", "%s", tj_last_error()); goto done; }
    tj_backend be = tj_context_backend(ctx);

    /* Cold: empty cache (when ours). Warm: the same model again, kernels now cached. */
    double t0 = tj_now();
    if (tj_model_load(ctx, pos[0], weights, &model) != TJ_OK) { cli_fail("model", "%s", tj_context_error(ctx)); goto done; }
    double cold_wall = tj_now() - t0, cold = tj_model_load_seconds(model);
    tj_model_destroy(model);
    model = NULL;
    t0 = tj_now();
    if (tj_model_load(ctx, pos[0], weights, &model) != TJ_OK) { cli_fail("model", "%s", tj_context_error(ctx)); goto done; }
    double warm_wall = tj_now() - t0, warm = tj_model_load_seconds(model);
    if (verbose) fputs(tj_context_log(ctx), stderr);

    const int gpu = be == TJ_BACKEND_CUDA;
    const double bound = tj_check_bound(gpu ? TJ_F16 : TJ_F32); /* the GPU path computes in fp16 */
    int64_t nl = tj_model_layer_count(model), maxk = 1, maxn = 1;
    for (int64_t i = 0; i < nl; i++) {
        tj_layer_info li;
        tj_model_layer_info(model, i, &li);
        if (li.k > maxk) maxk = li.k;
        if (li.n > maxn) maxn = li.n;
    }
    x = malloc((size_t)(M * maxk) * sizeof *x);
    y = malloc((size_t)(M * maxn) * sizeof *y);
    yref = malloc((size_t)(M * maxn) * sizeof *yref);
    wf = malloc((size_t)(maxn * maxk) * sizeof *wf);
    bf = malloc((size_t)maxn * sizeof *bf);
    if (!x || !y || !yref || !wf || !bf) { cli_fail("model", "out of memory (M = %lld)", (long long)M); goto done; }

    int nthreads = threads ? (int)threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    char dname[3][200] = {"", "", ""}, dense_name[800] = "cuBLAS";
    int dwins[3] = {0, 0, 0}, nbf16 = 0;
    (void)nthreads;
    printf("tilejit model: %s, %lld layers, backend %s, M = %lld, threads %s\n", pos[0], (long long)nl,
           tj_backend_name(be), (long long)M, threads ? threads_s : "all");
    printf("load: cold %.3f s, warm %.3f s (backend preparation; %.3f s / %.3f s with parsing and mapping)\n",
           cold, warm, cold_wall, warm_wall);
    printf("%-44s %6s %6s %8s %10s %-8s %-4s %10s %10s %8s%s\n", "layer", "n", "k", "density", "rel.err", "path", "prec",
           "tilejit ms", "dense ms", "speedup", ref ? "  cos.dense" : "");

    uint64_t rng = 0x5eed0f7173ull;
    double tot_tj = 0, tot_dense = 0, tot_kept = 0, tot_w = 0;
    int bad = 0, have_dense = 1, staged = 0, npaths[2] = {0, 0};
    char dense_lib[200] = "";
    for (int64_t i = 0; i < nl; i++) {
        tj_layer_info li;
        tj_model_layer_info(model, i, &li);
        for (int64_t j = 0; j < M * li.k; j++) x[j] = uniform(&rng);
        for (int64_t j = 0; j < M * li.n; j++) y[j] = NAN; /* poison: unwritten outputs show */
        int64_t xs[2] = {M, li.k}, ys[2] = {M, li.n};
        DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
        DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
        if (tj_linear_ex(model, i, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) != TJ_OK) {
            cli_fail("model", "%s", tj_context_error(ctx));
            goto done;
        }
        tj_model_reference(model, i, x, M, yref);
        double e = tj_rel_error(y, yref, M * li.n);
        tj_precision lp = TJ_PRECISION_F32;
        tj_model_layer_precision(model, i, M, &lp);
        nbf16 += lp == TJ_PRECISION_BF16;
        double lbound = lp == TJ_PRECISION_BF16 ? tj_check_bound(TJ_BF16) : bound;
        double agree = ref ? dense_agreement(ref, &li, x, M, y, &agree_dot, &agree_yy, &agree_dd) : NAN;
        if (agree < agree_min) agree_min = agree;
        if (!(e <= lbound)) bad++;

        double t_tj = -1, t_dense = -1;
        timed t = {.model = model, .layer = i, .x = &xt, .y = &yt};
        tj_error hook;
        hook.msg[0] = '\0';
        const char *herr = hook.msg;
        if (gpu && tj_bench_cuda_time_layer(model, i, M, min_time, &t_tj, &t_dense, &hook) == TJ_OK) {
            /* device-resident timing from the CUDA runtime's hook */
        } else {
            if (gpu && !staged && herr[0]) fprintf(stderr, "tilejit model: GPU timing hook: %s; timing through staging copies\n", herr);
            if (gpu) staged = 1;
#if TJ_HAVE_LLVM
            if (!gpu) { /* tilejit and the fastest dense baseline of this layer's precision (bias and
                         * activation too), timed in interleaved rounds: drift of the machine during the
                         * row (other jobs, clocks) then falls on both sides, not on whichever ran second */
                tj_model_dense_weights(model, i, wf);
                const float *bias = tj_model_dense_bias(model, i, bf) == TJ_OK ? bf : NULL;
                static const tj_dense_kind kinds[3] = {TJ_DENSE_ONEDNN_F32, TJ_DENSE_OPENBLAS, TJ_DENSE_ONEDNN_BF16};
                /* fp32 layers: oneDNN fp32 and OpenBLAS; bf16 layers: oneDNN bf16 (indexes into kinds) */
                const int use[2] = {lp == TJ_PRECISION_BF16 ? 2 : 0, lp == TJ_PRECISION_BF16 ? -1 : 1};
                tj_dense *dk[2] = {NULL, NULL};
                for (int kd = 0; kd < 2; kd++) {
                    if (use[kd] < 0) continue;
                    tj_error derr;
                    /* into tilejit's own y (checked above): the same input and output memory on
                     * both sides (a separate buffer measurably changed the times, by up to 5 %) */
                    if (tj_dense_create_layer(kinds[use[kd]], x, wf, bias, li.activation, y, M, li.n, li.k, nthreads,
                                              &dk[kd], &derr) == TJ_OK)
                        snprintf(dname[use[kd]], sizeof dname[use[kd]], "%s", tj_dense_name(dk[kd]));
                }
                /* tilejit and oneDNN interleaved; OpenBLAS after them (its workers spin after a call
                 * and would slow a oneDNN call that follows: destroying it stops them) */
                double rt[ROUNDS], rd[2][ROUNDS];
                for (int r = 0; r < ROUNDS && !t.failed; r++) {
                    rt[r] = measure(run_tilejit_fn, &t, min_time / ROUNDS);
                    t.dense = dk[0];
                    rd[0][r] = dk[0] ? measure(run_dense_fn, &t, min_time / ROUNDS) : -1;
                }
                for (int r = 0; r < ROUNDS; r++) {
                    t.dense = dk[1];
                    rd[1][r] = dk[1] ? measure(run_dense_fn, &t, min_time / ROUNDS) : -1;
                }
                t.dense = NULL;
                tj_dense_destroy(dk[0]);
                tj_dense_destroy(dk[1]);
                if (t.failed) { cli_fail("model", "%s", tj_context_error(ctx)); goto done; }
                t_tj = median3(rt);
                int win = -1;
                for (int kd = 0; kd < 2; kd++) {
                    double td = median3(rd[kd]);
                    if (td > 0 && (t_dense < 0 || td < t_dense)) {
                        t_dense = td;
                        win = kd;
                    }
                }
                if (win >= 0) dwins[use[win]]++;
            } else
#endif
            {
                t_tj = measure(run_tilejit_fn, &t, min_time);
                if (t.failed) { cli_fail("model", "%s", tj_context_error(ctx)); goto done; }
            }
        }
        if (t_dense < 0) have_dense = 0;
        double dens = (double)li.kept_weights / (double)(li.n * li.k);
        tot_kept += (double)li.kept_weights;
        tot_w += (double)(li.n * li.k);
        tot_tj += t_tj;
        tot_dense += t_dense;
        char a[32], b[32], sp[32];
        fmt_ms(a, sizeof a, t_tj);
        fmt_ms(b, sizeof b, t_dense);
        if (t_dense > 0 && t_tj > 0) snprintf(sp, sizeof sp, "%.2fx", t_dense / t_tj);
        else snprintf(sp, sizeof sp, "-");
        tj_path path = TJ_PATH_KERNEL;
        const char *lib = "kernel";
        tj_model_layer_path(model, i, M, &path, &lib, NULL);
        const char *pw = path == TJ_PATH_KERNEL ? "kernel" : strncmp(lib, "oneDNN", 6) == 0 ? "onednn"
                                                             : strncmp(lib, "OpenBLAS", 8) == 0 ? "openblas" : "dense";
        npaths[path]++;
        if (path == TJ_PATH_DENSE) snprintf(dense_lib, sizeof dense_lib, "%s", lib);
        printf("%-44s %6lld %6lld %8.4f %9.2e%s %-8s %-4s %10s %10s %8s", li.name, (long long)li.n, (long long)li.k,
               dens, e, e <= lbound ? " " : "!", pw, tj_precision_name(lp), a, b, sp);
        if (ref && isnan(agree)) printf("  %9s", "no layer");
        else if (ref) printf("  %9.4f", agree);
        printf("\n");
        fflush(stdout);
    }
    char a[32], b[32], sp[32];
    fmt_ms(a, sizeof a, tot_tj);
    fmt_ms(b, sizeof b, have_dense ? tot_dense : -1);
    if (have_dense && tot_tj > 0) snprintf(sp, sizeof sp, "%.2fx", tot_dense / tot_tj);
    else snprintf(sp, sizeof sp, "-");
    double dens = tot_w > 0 ? tot_kept / tot_w : 0;
    printf("%-44s %6s %6s %8.4f %10s %-8s %-4s %10s %10s %8s\n", "total", "", "", dens, "", "", "", a, b, sp);
    if (!gpu) { /* the faster library per layer: say which, and how often */
        int o = snprintf(dense_name, sizeof dense_name, "the whole layer (bias, activation)");
        if (nbf16 < nl && o > 0 && (size_t)o < sizeof dense_name)
            o += snprintf(dense_name + o, sizeof dense_name - (size_t)o, ", fastest fp32 of %s (%d layers) and %s (%d layers)",
                          dname[0][0] ? dname[0] : "oneDNN (unavailable)", dwins[0],
                          dname[1][0] ? dname[1] : "OpenBLAS (unavailable)", dwins[1]);
        if (nbf16 && o > 0 && (size_t)o < sizeof dense_name)
            snprintf(dense_name + o, sizeof dense_name - (size_t)o, "%s %s for the %d bf16 layers", nbf16 < nl ? ";" : ",",
                     dname[2][0] ? dname[2] : "oneDNN bf16 (unavailable)", nbf16);
    }
    printf("dense baseline: %s; ideal speedup 1/density = %.2fx\n", dense_name, dens > 0 ? 1 / dens : 0);
    printf("paths at M = %lld: %d layers on their kernel, %d on the dense path%s%s%s (docs/dense-path.md; -v says why)\n",
           (long long)M, npaths[0], npaths[1], npaths[1] ? " (" : "", dense_lib, npaths[1] ? ")" : "");
    if (!gpu) { /* which config each layer ran at this M (backends that pick one per M) */
        for (int64_t i = 0; i < nl; i++) {
            tj_layer_info li;
            tj_model_layer_info(model, i, &li);
            const char *cj = NULL;
            if (tj_model_layer_config(model, i, M, &cj) == TJ_ERR_UNSUPPORTED) break;
            tj_precision lp = TJ_PRECISION_F32;
            tj_model_layer_precision(model, i, M, &lp);
            printf("config at M = %lld: %-44s %-4s %s\n", (long long)M, li.name, tj_precision_name(lp), cj ? cj : "(default)");
        }
    }
    if (ref)
        printf("output agreement with %s on the same random X: cosine overall %.4f, lowest layer %.4f\n", refw,
               agree_yy > 0 && agree_dd > 0 ? agree_dot / sqrt(agree_yy * agree_dd) : 0.0, agree_min);
    if (staged)
        printf("note: GPU times include host<->device staging copies (no device-buffer timing hook in this build)\n");
    if (bad) {
        cli_fail("model", "%d of %lld layers exceed the reference bound %.0e%s (marked '!')", bad, (long long)nl, bound,
                 nbf16 ? " (1e-02 for bf16 layers)" : "");
        goto done;
    }
    printf("all %lld layers within %.0e of the reference%s\n", (long long)nl, bound, nbf16 ? " (bf16 layers within 1e-02)" : "");
    rc = 0;
done:
    free(x);
    free(y);
    free(yref);
    free(wf);
    free(bf);
    tj_model_destroy(model);
    tj_context_destroy(ctx);
    tj_st_close(ref);
    if (own_cache) remove_tree(tmpdir);
    return rc;
}
