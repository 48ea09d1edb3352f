/* `tilejit bench --backend cpu`: one random tile-wise layer like the paper's harness (every tile
 * keeps the same number of random rows; tw2 also drops columns), JIT-compiled by the CPU backend,
 * checked against the reference, and timed against the dense baselines of bench/dense_cpu.c on
 * the same X and W with the same thread count: oneDNN fp32 (and bf16 where the CPU has bf16
 * instructions) and OpenBLAS; the speedup is against the fastest fp32 one, named with its rate,
 * next to the host's measured FMA peak. Sweep mode writes CSV and a gnuplot PNG.
 *
 * Timing: one warm-up call, then repeats of back-to-back calls lasting ≥ --min-time seconds
 * (0.2) each; the time per call of a repeat is its mean, the reported time the median of the
 * repeats (--repeats, 5). Data stays the same between calls (warm caches for both sides). The
 * dense baselines do not depend on the sparsity: a sweep times them once, at its first point.
 * Memory-bound calls (small M) are judged by the kept weights' bytes per second against the
 * host's read bandwidth measured at the same footprint (tj_dense_read_bandwidth).
 * --clock thread counts the calling thread's CPU time instead of wall time (--threads 1 only):
 * on a machine shared with other jobs it leaves out the time the thread was descheduled. */
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "base/host.h"
#include "runtime/backend_cpu.h"
#include "runtime/dense_path.h"
#include "runtime/dense_rule.h"
#include "tuning/tuning.h"
#include "bench/args.h"
#include "tilejit/bench.h"
#include "tilejit/tune.h"
#include "pattern/random.h"
#include "base/rng.h"
#include "tj_config.h"

static FILE *out_, *errs_;

static const char *help =
    "usage: tilejit bench --backend cpu --m M --n N --k K --sparsity S [--g 128] [--threads T]\n"
    "                     [--mode tw1|tw2] [--seed X] [--config JSON] [--min-time SEC] [--repeats R]\n"
    "                     [--tuning-log LOG] [--clock wall|thread] [--dtype f32|bf16] [-v]\n"
    "       tilejit bench --backend cpu --m M --n N --k K --sweep S1,S2,... --csv OUT.csv\n"
    "                     [--plot OUT.png] [same options]\n\n"
    "Times one random tile-wise sparse layer Y = X · (W ⊙ mask)ᵀ (n × k, tiles of g, overall\n"
    "sparsity S; every tile keeps the same number of random rows, tw2 also drops 1 − sqrt(1 − S) of\n"
    "the columns) with the CPU backend's JIT-compiled kernel against dense OpenBLAS cblas_sgemm on\n"
    "the same fp32 X and W with the same thread count (default: all cores). The result is checked\n"
    "against the reference first (relative error ≤ 1e-5, on up to 64 sampled token rows). Times: median over R repeats of the mean\n"
    "of back-to-back calls lasting ≥ SEC seconds each; --clock thread (with --threads 1) counts\n"
    "the thread's CPU time instead, for machines shared with other jobs. --config: a CPU config JSON\n"
    "({\"mr\":6,\"nr\":64,\"offsets\":\"table\"|\"unrolled\",\"unroll\":4,\"mb\":0,\"kc\":0}); without it, the best\n"
    "record of --tuning-log LOG (or $TILEJIT_TUNING_LOG) for this host and shape is used (-v says which).\n"
    "Dense baselines (each on the same X, W and threads): oneDNN matmul fp32 (weights reordered\n"
    "once to its preferred layout), oneDNN bf16 (only where the CPU has bf16 instructions),\n"
    "OpenBLAS sgemm (sgemv at M = 1) with the core kernel it picked; oneDNN is libdnnl.so.3 opened\n"
    "at run time ($TILEJIT_ONEDNN: another path). `dense` is the fastest fp32 one. The host's fp32\n"
    "FMA peak is measured first, so a weak baseline is visible.\n"
    "run_ms / path: the time of the path the runtime takes for such a layer at this M, and which:\n"
    "its kernel (run_ms = tilejit_ms) or the dense path, oneDNN or OpenBLAS on the masked weights\n"
    "(timed here, checked first), as a forced --config ({\"path\":\"dense\"} forces it), else the\n"
    "tuning log, else the measured rule decides (docs/dense-path.md; -v says why per sparsity). The\n"
    "latency table of a measured allocation wants run_ms: the time that will actually run.\n"
    "--dtype bf16: X rounded to bf16 (the kernel reads bf16 X and weights, accumulates in fp32,\n"
    "writes fp32 Y; its config's dot resolved for this M: AMX tiles, vdpbf16ps or fp32 FMA on\n"
    "widened values) and timed against oneDNN bf16 only, which is then `dense`.\n"
    "Ends with one line (in sweep mode, for the last sparsity):\n"
    "  speedup <dense/tilejit> tilejit_ms <ms> dense_ms <ms> kept_gflops <GFLOP/s of kept work>\n"
    "  baseline <onednn_f32|onednn_bf16|openblas> baseline_gflops <GF/s> peak_gflops <GF/s>\n"
    "  onednn_f32_ms <ms> onednn_bf16_ms <ms> openblas_ms <ms> speedup_bf16 <onednn_bf16/tilejit>\n"
    "  run_ms <ms> path <kernel|onednn|openblas> weights_gbps <kept weight bytes / tilejit time>\n"
    "  read_gbps <host read bandwidth at that footprint, same threads> dtype <f32|bf16>\n"
    "  efficiency <dense·density/tilejit>   (nan: unavailable; 1 is the ideal 1/density speedup)\n"
    "The CSV (sweep mode) has one row per sparsity with the same fields and the baseline's name.\n";

typedef struct bopts {
    int64_t m, n, k, g;
    int mode, threads, repeats, thread_clock, bf16;
    uint64_t seed;
    double min_time;
    const char *config;
    const char *tuning_log; /* --tuning-log, else $TILEJIT_TUNING_LOG: the tuned config when no --config */
    int verbose;
} bopts;

typedef struct bresult {
    double sparsity, density, tj_s, dense_s, relerr, jit_s, emit_s;
    double run_s;       /* the path the runtime takes at this M (kernel: tj_s; or the dense path's time) */
    char path[16];      /* "kernel", "onednn", "openblas" */
    char path_why[1024];
    double wbytes, read_gbps; /* kept weights' bytes as packed; read bandwidth at that footprint */
    double base_s[TJ_DENSE_NKINDS]; /* per baseline, NAN when unavailable */
    char base_name[TJ_DENSE_NKINDS][200];
    char base_why[TJ_DENSE_NKINDS][300];
    int best; /* fastest fp32 baseline (dense_s), -1 if none */
    int64_t kept;
    char cfg[400];
} bresult;

typedef void (*timed_fn)(void *);

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int use_thread_clock;

static double now(void)
{
    if (!use_thread_clock) return tj_now();
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double time_it(timed_fn fn, void *arg, double min_time, int repeats)
{
    double t[64];
    if (repeats > 64) repeats = 64;
    fn(arg); /* warm-up */
    for (int r = 0; r < repeats; r++) {
        int64_t calls = 0;
        double t0 = now(), el;
        do {
            fn(arg);
            calls++;
            el = now() - t0;
        } while (el < min_time);
        t[r] = el / (double)calls;
    }
    qsort(t, (size_t)repeats, sizeof *t, cmpd);
    return t[repeats / 2];
}

typedef struct tj_run {
    const tj_cpu_layer *cl;
    tj_pool *pool;
    int threads;
    const void *x;
    void *y;
    int64_t m;
} tj_run;

static void run_tj(void *vp)
{
    tj_run *r = vp;
    tj_cpu_layer_run(r->cl, r->pool, r->threads, r->x, r->m, r->y);
}

static void run_dense(void *vp) { tj_dense_run(vp); }

typedef struct dense_path_run {
    const tj_dense_layer *d;
    const float *x;
    float *y;
    int64_t m;
} dense_path_run;

static void run_dense_path(void *vp)
{
    dense_path_run *r = vp;
    tj_error err;
    tj_dense_layer_run(r->d, r->x, r->y, r->m, &err);
}

/* The token rows a result is checked on (tj_check_rows: all of them up to 64, else a sample) and
 * the reference's values there, packed; scratch: 64 × n. */
typedef struct sampled_rows {
    int64_t rows[64], n;
    const float *ref;
    float *scratch;
} sampled_rows;

/* Relative error of y's sampled rows against the reference's. */
static double rows_error(const bopts *o, const float *y, const sampled_rows *c)
{
    for (int64_t i = 0; i < c->n; i++) memcpy(c->scratch + i * o->n, y + c->rows[i] * o->n, (size_t)o->n * sizeof(float));
    return tj_rel_error(c->scratch, c->ref, c->n * o->n);
}

/* The path the runtime takes for this layer at this M, as runtime/dense_path.c decides it (a forced
 * config, else the tuning log, else the rule; a kernel computing in bf16 keeps the kernel) and,
 * when it is the dense path, that path timed on the same X (checked against the reference first). */
static int run_path(const char *C, const bopts *o, const tj_layer *l, const tj_layer_weights *lw, const tj_cpu_layer *cl,
                    const float *x, float *y, const sampled_rows *chk, bresult *res)
{
    tj_error err;
    int dense = -1;
    snprintf(res->path, sizeof res->path, "kernel");
    res->run_s = res->tj_s;
    if (o->config) {
        dense = tj_tune_config_is_dense(o->config);
        snprintf(res->path_why, sizeof res->path_why, "forced by --config");
    } else if (tj_tune_path_from_log(o->tuning_log, "cpu", l, o->m, &dense, res->path_why, sizeof res->path_why, &err) != TJ_OK) {
        return tj_args_fail(errs_, C, "%s", err.msg);
    }
    if (dense < 0 && (cl->cfg.dtype == TJ_CPU_ACT_BF16 || cl->cfg.out == TJ_CPU_ACT_BF16 || cl->cfg.weights == TJ_CPU_WEIGHTS_BF16)) {
        dense = 0;
        snprintf(res->path_why, sizeof res->path_why, "the kernel computes in bf16 (the rule is fp32's)");
    }
    if (dense < 0) {
        double xo = tj_dense_rule_crossover(o->m, o->n, o->k, o->threads);
        dense = res->density >= xo;
        snprintf(res->path_why, sizeof res->path_why, "rule: density %.4f %s crossover %.3f at M %lld, k %lld, %d thread(s)",
                 res->density, dense ? "≥" : "<", xo, (long long)o->m, (long long)o->k, o->threads);
    }
    if (!dense) return 0;
    tj_dense_layer *d = NULL;
    tj_status s = tj_dense_layer_create(l, lw, o->threads, &d, &err);
    if (s == TJ_ERR_UNSUPPORTED && !o->config) { /* no dense library: the runtime keeps the kernel */
        snprintf(res->path_why + strlen(res->path_why), sizeof res->path_why - strlen(res->path_why), "; but %s", err.msg);
        return 0;
    }
    if (s != TJ_OK) return tj_args_fail(errs_, C, "dense path: %s", err.msg);
    for (int64_t i = 0; i < o->m * o->n; i++) y[i] = NAN;
    double e = tj_dense_layer_run(d, x, y, o->m, &err) == TJ_OK ? rows_error(o, y, chk) : INFINITY;
    if (!(e <= tj_check_bound(TJ_F32))) {
        tj_dense_layer_free(d);
        return tj_args_fail(errs_, C, "the dense path is wrong: relative error %.3g against the reference", e);
    }
    dense_path_run r = {d, x, y, o->m};
    res->run_s = time_it(run_dense_path, &r, o->min_time, o->repeats);
    snprintf(res->path, sizeof res->path, "%s", tj_dense_layer_word(d));
    tj_dense_layer_free(d);
    return 0;
}

/* A wrong baseline time is worthless: each baseline's Y is checked on three token rows against
 * a double-precision dot product, fp32 within 1e-4, bf16 within 2e-2 (bf16-rounded X and W). */
static double dense_rows_error(const bopts *o, const float *x, const float *w, const float *y)
{
    int64_t rows[3] = {0, o->m / 2, o->m - 1};
    double num = 0, den = 0;
    for (int r = 0; r < 3; r++)
        for (int64_t n = 0; n < o->n; n++) {
            double ref = 0;
            for (int64_t k = 0; k < o->k; k++) ref += (double)x[rows[r] * o->k + k] * w[n * o->k + k];
            float v = y[rows[r] * o->n + n];
            num += isfinite(v) ? (v - ref) * (v - ref) : INFINITY;
            den += ref * ref;
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Times every dense baseline available on x and w; y is scratch. */
static int time_baselines(const char *C, const bopts *o, const float *x, const float *w, float *y, bresult *res)
{
    res->best = -1;
    res->dense_s = NAN;
    for (int kd = 0; kd < TJ_DENSE_NKINDS; kd++) {
        tj_error err;
        tj_dense *d = NULL;
        res->base_s[kd] = NAN;
        res->base_name[kd][0] = '\0';
        if (o->bf16 && kd != TJ_DENSE_ONEDNN_BF16) { /* --dtype bf16: the bf16 library only */
            snprintf(res->base_why[kd], sizeof res->base_why[kd], "not timed with --dtype bf16");
            continue;
        }
        if (tj_dense_create((tj_dense_kind)kd, x, w, y, o->m, o->n, o->k, o->threads, &d, &err) != TJ_OK) {
            snprintf(res->base_why[kd], sizeof res->base_why[kd], "%.290s", err.msg);
            continue;
        }
        snprintf(res->base_name[kd], sizeof res->base_name[kd], "%s", tj_dense_name(d));
        for (int64_t i = 0; i < o->m * o->n; i++) y[i] = NAN;
        double e = tj_dense_run(d) == 0 ? dense_rows_error(o, x, w, y) : INFINITY;
        double lim = kd == TJ_DENSE_ONEDNN_BF16 ? 2e-2 : 1e-4;
        if (!(e <= lim)) {
            tj_dense_destroy(d);
            return tj_args_fail(errs_, C, "dense baseline %s is wrong: relative error %.3g (limit %.0e)", res->base_name[kd], e, lim);
        }
        res->base_s[kd] = time_it(run_dense, d, o->min_time, o->repeats);
        tj_dense_destroy(d);
        if ((kd != TJ_DENSE_ONEDNN_BF16) != o->bf16 && (res->best < 0 || res->base_s[kd] < res->dense_s)) {
            res->best = kd;
            res->dense_s = res->base_s[kd];
        }
    }
    if (res->best < 0 && o->bf16)
        return tj_args_fail(errs_, C, "--dtype bf16 needs oneDNN's bf16 matmul as its baseline: %s", res->base_why[TJ_DENSE_ONEDNN_BF16]);
    if (res->best < 0)
        return tj_args_fail(errs_, C, "no fp32 dense baseline: %s; %s", res->base_why[TJ_DENSE_ONEDNN_F32],
                        res->base_why[TJ_DENSE_OPENBLAS]);
    return 0;
}

/* Buffers aligned to a cache line, as NumPy, PyTorch and OpenBLAS allocate them: with malloc's
 * 16-byte alignment a vector store to y splits across two lines and tiles written by different
 * threads share lines at their edges. Both tilejit and OpenBLAS get the same buffers. */
static float *alloc_floats(int64_t n)
{
    size_t bytes = ((size_t)n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

/* One sparsity point; prev: an earlier point of the same run whose baselines it reuses, or
 * NULL to time them. Returns 0, or 1 after printing a message. */
static int bench_point(const char *C, const bopts *o, double s, tj_cpu_jit *jit, tj_pool *pool, const bresult *prev,
                       bresult *res)
{
    int rc = 1;
    tj_error err;
    tj_layer l;
    tj_random_spec sp = {o->n, o->k, o->g, s, o->mode, o->seed, 0, 0, TJ_ACT_NONE};
    memset(res, 0, sizeof *res);
    res->sparsity = s;
    if (tj_random_layer(&sp, "bench", &l, &err) != TJ_OK) return tj_args_fail(errs_, C, "%s", err.msg);
    float *w = alloc_floats(o->n * o->k), *x = alloc_floats(o->m * o->k);
    float *y = alloc_floats(o->m * o->n), *ref = alloc_floats(64 * o->n), *ys = alloc_floats(64 * o->n);
    float *xs = alloc_floats(64 * o->k);
    tj_cpu_layer *cl = NULL;
    uint16_t *xb = NULL, *yb = NULL;
    if (!w || !x || !y || !ref || !ys || !xs) {
        tj_args_fail(errs_, C, "out of memory for %lld × %lld data", (long long)o->m, (long long)o->n);
        goto done;
    }
    tj_rng r = {o->seed * 31 + 7};
    for (int64_t i = 0; i < o->n * o->k; i++) w[i] = tj_rng_uniform(&r);
    for (int64_t i = 0; i < o->m * o->k; i++) x[i] = tj_rng_uniform(&r);
    tj_cpu_config cfg;
    char *tuned = NULL, note[1024] = "";
    if (!o->config && tj_tune_config_from_log(o->tuning_log, "cpu", &l, o->m, &tuned, note, sizeof note, &err) != TJ_OK) {
        tj_args_fail(errs_, C, "%s", err.msg);
        goto done;
    }
    if (o->verbose && note[0] && !o->config) fprintf(errs_, "tilejit bench: %s\n", note);
    /* a forced dense path ({"path":"dense"}) still builds the default kernel, timed beside it */
    const char *cjson = o->config && !tj_tune_config_is_dense(o->config) ? o->config : tuned;
    tj_status cs = tj_cpu_config_from_json(cjson, &cfg, &err);
    if (cs == TJ_OK && o->bf16 && !tj_cpu_config_json_has(cjson, "dtype")) { /* --dtype bf16, unless the config says */
        cfg.dtype = TJ_CPU_ACT_BF16;
        if (!tj_cpu_config_json_has(cjson, "dot")) cfg.dot = TJ_CPU_DOT_AUTO;
    }
    tj_cpu_config_resolve_m(&cfg, &l, o->m); /* the runtime's choice for this M */
    free(tuned);
    if (cs != TJ_OK) {
        tj_args_fail(errs_, C, "--config: %s", err.msg);
        goto done;
    }
    char prefix[32];
    static int counter;
    snprintf(prefix, sizeof prefix, "bench%d", counter++);
    tj_layer_weights lw = {w, TJ_F32, NULL, TJ_F32};
    if (tj_cpu_layer_build(jit, &l, &lw, &cfg, prefix, &cl, &err) != TJ_OK) {
        tj_args_fail(errs_, C, "%s", err.msg);
        goto done;
    }
    res->jit_s = cl->emit_seconds + cl->compile_seconds;
    res->emit_s = cl->emit_seconds;
    char *cj = tj_cpu_config_to_json(&cl->cfg);
    snprintf(res->cfg, sizeof res->cfg, "%s", cj ? cj : "?");
    free(cj);
    res->kept = tj_layer_kept(&l);
    res->density = (double)res->kept / ((double)o->n * (double)o->k);

    /* bf16 activations: X rounded once here (the caller's data is bf16); bf16 Y widened for
     * the check only (the timed runs write bf16) */
    if (cl->cfg.dtype == TJ_CPU_ACT_BF16 || cl->cfg.out == TJ_CPU_ACT_BF16) {
        xb = malloc((size_t)(o->m * o->k) * 2 + 2);
        yb = malloc((size_t)(o->m * o->n) * 2 + 2);
        if (!xb || !yb) {
            tj_args_fail(errs_, C, "out of memory for bf16 data");
            goto done;
        }
        tj_convert_from_f32(x, o->m * o->k, TJ_BF16, xb);
        for (int64_t i = 0; i < o->m * o->n; i++) yb[i] = 0x7fc0; /* NaN */
    }
    const void *xin = cl->cfg.dtype == TJ_CPU_ACT_BF16 ? (const void *)xb : x;
    void *yout = cl->cfg.out == TJ_CPU_ACT_BF16 ? (void *)yb : y;
    /* correctness first: poisoned output, then the reference */
    for (int64_t i = 0; i < o->m * o->n; i++) y[i] = NAN;
    tj_cpu_layer_run(cl, pool, o->threads, xin, o->m, yout);
    if (yout == yb) tj_convert_to_f32(yb, TJ_BF16, o->m * o->n, y);
    /* the reference on sampled token rows (all of them up to 64): the plain loop would take
     * longer than all the timing at M = 512 on LLaMA shapes */
    sampled_rows chk = {.ref = ref, .scratch = ys};
    chk.n = tj_check_rows(o->m, o->seed, chk.rows);
    for (int64_t i = 0; i < chk.n; i++) memcpy(xs + i * o->k, x + chk.rows[i] * o->k, (size_t)o->k * sizeof(float));
    tj_reference_linear(&l, &lw, xs, chk.n, ref);
    res->relerr = rows_error(o, y, &chk);
    /* bf16-stored weights or activations round fp32 ones (8 significant bits): a bf16 bound */
    double lim = cl->cfg.weights == TJ_CPU_WEIGHTS_BF16 ? tj_check_bound(TJ_BF16) : tj_check_bound(TJ_F32);
    if (!(res->relerr <= lim)) {
        tj_args_fail(errs_, C, "wrong result: relative error %.3g against the reference (limit %.0e)", res->relerr, lim);
        goto done;
    }
    tj_run tr = {cl, pool, o->threads, xin, yout, o->m};
    res->tj_s = time_it(run_tj, &tr, o->min_time, o->repeats);
    if (run_path(C, o, &l, &lw, cl, x, y, &chk, res)) goto done;
    res->wbytes = (double)res->kept * (cl->cfg.weights == TJ_CPU_WEIGHTS_BF16 ? 2 : 4);
    res->read_gbps = tj_dense_read_bandwidth(o->threads, res->wbytes, 0.1);
    if (prev) { /* the same X and W: the baselines of the sweep's first point */
        memcpy(res->base_s, prev->base_s, sizeof res->base_s);
        memcpy(res->base_name, prev->base_name, sizeof res->base_name);
        memcpy(res->base_why, prev->base_why, sizeof res->base_why);
        res->best = prev->best;
        res->dense_s = prev->dense_s;
    } else if (time_baselines(C, o, x, w, y, res)) { /* into tilejit's own y: the same memory on both sides */
        goto done;
    }
    rc = 0;
done:
    tj_cpu_layer_free(cl);
    tj_layer_free(&l);
    free(w);
    free(x);
    free(y);
    free(ref);
    free(ys);
    free(xs);
    free(xb);
    free(yb);
    return rc;
}

/* s as one CSV field: quoted, inner quotes doubled (config JSON, library names) */
static void csv_field(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void print_row(const bopts *o, const bresult *r)
{
    double kept_flop = 2.0 * (double)o->m * (double)r->kept, dense_flop = 2.0 * (double)o->m * (double)o->n * (double)o->k;
    fprintf(out_, "%-6.3f %-8.4f %11.4f %11.4f %9.1f %9.1f %8.3f %7.2f %8.1f %9.2e %11.4f %-8s %7.1f %7.1f\n", r->sparsity,
           r->density, r->tj_s * 1e3, r->dense_s * 1e3, kept_flop / r->tj_s * 1e-9, dense_flop / r->dense_s * 1e-9,
           r->dense_s / r->tj_s, 1.0 / r->density, r->jit_s * 1e3, r->relerr, r->run_s * 1e3, r->path,
           r->wbytes / r->tj_s * 1e-9, r->read_gbps);
}

static int parse_list(const char *C, const char *s, double *out, int max)
{
    int n = 0;
    char *copy = strdup(s), *save = NULL;
    if (!copy) return -1;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n >= max || tj_args_parse_double(errs_, C, "sweep", t, 0.0, 0.999, &out[n])) {
            if (n >= max) tj_args_fail(errs_, C, "--sweep: at most %d values", max);
            free(copy);
            return -1;
        }
        n++;
    }
    free(copy);
    if (!n) tj_args_fail(errs_, C, "--sweep: no values");
    return n ? n : -1;
}

static int write_plot(const char *C, const char *csv, const char *png, const bopts *o)
{
    char script[2048];
    snprintf(script, sizeof script,
             "set terminal pngcairo size 900,600 noenhanced\n"
             "set output '%s'\n"
             "set datafile separator ','\n"
             "set title 'tilejit cpu vs OpenBLAS sgemm: M=%lld N=%lld K=%lld g=%lld tw%d, %d thread(s)'\n"
             "set xlabel 'sparsity'\nset ylabel 'speedup over dense'\nset key left top\nset grid\n"
             "set xrange [0:1]\nset logscale y 2\n"
             "plot '%s' every ::1 using 6:10 with linespoints lw 2 title 'tilejit', "
             "1/(1-x) with lines dt 2 title 'ideal 1/(1-s)', 1 with lines lc rgb 'gray' title 'dense'\n",
             png, (long long)o->m, (long long)o->n, (long long)o->k, (long long)o->g, o->mode, o->threads, csv);
    FILE *p = popen("gnuplot 2>&1", "w");
    if (!p) return tj_args_fail(errs_, C, "cannot run gnuplot (Debian gnuplot-nox)");
    fputs(script, p);
    int st = pclose(p);
    if (st != 0) return tj_args_fail(errs_, C, "gnuplot failed (exit status %d) writing %s", st, png);
    return 0;
}

int tj_bench_cpu_main(int argc, char **argv, FILE *out, FILE *errs)
{
    out_ = out;
    errs_ = errs;
    const char *C = "tilejit bench";
    const char *backend = NULL, *m_s = NULL, *n_s = NULL, *k_s = NULL, *s_s = NULL, *g_s = "128", *t_s = NULL,
               *mode_s = "tw1", *seed_s = "1", *config = NULL, *mt_s = "0.2", *rep_s = "5", *sweep = NULL, *csv = NULL,
               *plot = NULL, *tlog = NULL, *clock_s = "wall", *dtype_s = "f32";
    int verbose = 0;
    tj_arg_opt opts[] = {
        {"backend", 1, &backend, NULL}, {"m", 1, &m_s, NULL},       {"n", 1, &n_s, NULL},
        {"k", 1, &k_s, NULL},           {"sparsity", 1, &s_s, NULL}, {"g", 1, &g_s, NULL},
        {"threads", 1, &t_s, NULL},     {"mode", 1, &mode_s, NULL},  {"seed", 1, &seed_s, NULL},
        {"config", 1, &config, NULL},   {"min-time", 1, &mt_s, NULL}, {"repeats", 1, &rep_s, NULL},
        {"sweep", 1, &sweep, NULL},     {"csv", 1, &csv, NULL},      {"plot", 1, &plot, NULL},
        {"tuning-log", 1, &tlog, NULL}, {"v", 0, NULL, &verbose},    {"verbose", 0, NULL, &verbose},
        {"clock", 1, &clock_s, NULL},   {"dtype", 1, &dtype_s, NULL},
        {NULL, 0, NULL, NULL},
    };
    const char *pos[1];
    int npos;
    int pr = tj_args_parse(errs_, C, argc, argv, opts, pos, 0, &npos);
    if (pr == 2) {
        fputs(help, out_);
        return 0;
    }
    if (pr) return 1;
    if (!m_s || !n_s || !k_s || (!s_s && !sweep))
        return tj_args_fail(errs_, C, "--m, --n, --k and --sparsity (or --sweep) are required (see --help)");
    bopts o;
    memset(&o, 0, sizeof o);
    o.tuning_log = tlog;
    o.verbose = verbose;
    int64_t v;
    double d;
    if (tj_args_parse_int(errs_, C, "m", m_s, 1, 1 << 20, &o.m) || tj_args_parse_int(errs_, C, "n", n_s, 1, TJ_MAX_DIM, &o.n) ||
        tj_args_parse_int(errs_, C, "k", k_s, 1, TJ_MAX_DIM, &o.k) || tj_args_parse_int(errs_, C, "g", g_s, 1, TJ_MAX_DIM, &o.g))
        return 1;
    if (o.g > o.n) return tj_args_fail(errs_, C, "--g %lld is larger than --n %lld", (long long)o.g, (long long)o.n);
    if ((double)o.m * (double)(o.n > o.k ? o.n : o.k) > 1e9 || (double)o.n * (double)o.k > 1e9)
        return tj_args_fail(errs_, C, "problem too large for a benchmark (M·max(n,k) and n·k must be ≤ 1e9)");
    if (strcmp(mode_s, "tw1") == 0) o.mode = 1;
    else if (strcmp(mode_s, "tw2") == 0) o.mode = 2;
    else return tj_args_fail(errs_, C, "--mode: '%s' is not tw1 or tw2", mode_s);
    if (tj_args_parse_int(errs_, C, "seed", seed_s, 0, INT64_MAX, &v)) return 1;
    o.seed = (uint64_t)v;
    o.threads = tj_cpu_count();
    if (t_s) {
        if (tj_args_parse_int(errs_, C, "threads", t_s, 1, 1024, &v)) return 1;
        o.threads = (int)v;
    }
    if (tj_args_parse_double(errs_, C, "min-time", mt_s, 0.0, 60.0, &o.min_time)) return 1;
    if (strcmp(clock_s, "thread") == 0) {
        if (o.threads != 1) return tj_args_fail(errs_, C, "--clock thread needs --threads 1 (other threads' time is not counted)");
        o.thread_clock = 1;
    } else if (strcmp(clock_s, "wall") != 0) {
        return tj_args_fail(errs_, C, "--clock: '%s' is not wall or thread", clock_s);
    }
    use_thread_clock = o.thread_clock;
    if (strcmp(dtype_s, "bf16") == 0) o.bf16 = 1;
    else if (strcmp(dtype_s, "f32") != 0 && strcmp(dtype_s, "fp32") != 0)
        return tj_args_fail(errs_, C, "--dtype: '%s' is not f32 or bf16", dtype_s);
    if (tj_args_parse_int(errs_, C, "repeats", rep_s, 1, 64, &v)) return 1;
    o.repeats = (int)v;
    char *cfg_text = NULL;
    if (config) {
        cfg_text = bench_read_config(errs_, C, config);
        if (!cfg_text) return 1;
        o.config = cfg_text;
    }
    double sp[64];
    int ns = 1;
    if (sweep) {
        if (!csv) { free(cfg_text); return tj_args_fail(errs_, C, "--sweep needs --csv FILE"); }
        ns = parse_list(C, sweep, sp, 64);
        if (ns < 0) { free(cfg_text); return 1; }
    } else {
        if (tj_args_parse_double(errs_, C, "sparsity", s_s, 0.0, 0.999, &d)) { free(cfg_text); return 1; }
        sp[0] = d;
    }

    tj_error err;
    tj_cpu_jit *jit = NULL;
    tj_pool *pool = NULL;
    FILE *cf = NULL;
    int rc = 1;
    if (tj_cpu_jit_create(&jit, &err) != TJ_OK || tj_pool_create(o.threads, &pool, &err) != TJ_OK) {
        tj_args_fail(errs_, C, "%s", err.msg);
        goto out;
    }
    if (csv && !(cf = fopen(csv, "w"))) {
        tj_args_fail(errs_, C, "cannot write %s", csv);
        goto out;
    }
    if (cf) fprintf(cf, "m,n,k,g,mode,sparsity,density,threads,tilejit_ms,speedup,dense_ms,kept_gflops,dense_gflops,jit_ms,relerr,config,baseline,onednn_f32_ms,onednn_bf16_ms,openblas_ms,run_ms,path,weights_gbps,read_gbps,baseline_name\n");
    fprintf(out_, "tilejit bench: cpu %s, M=%lld N=%lld K=%lld g=%lld tw%d, %d thread(s), seed %llu, %s clock\n",
           tj_host_cpu_name(), (long long)o.m, (long long)o.n, (long long)o.k, (long long)o.g, o.mode, o.threads,
           (unsigned long long)o.seed, o.thread_clock ? "thread CPU" : "wall");
    double peak = tj_dense_fma_peak(o.threads, 0.3);
    fprintf(out_, "fp32 FMA peak (measured): %.1f GFLOP/s on %d thread(s)\n", peak, o.threads);
    bresult res, first;
    for (int i = 0; i < ns; i++) {
        if (bench_point(C, &o, sp[i], jit, pool, i ? &first : NULL, &res)) goto out;
        if (i == 0) first = res;
        if (i == 0) {
            double dflop = 2.0 * (double)o.m * (double)o.n * (double)o.k;
            for (int kd = 0; kd < TJ_DENSE_NKINDS; kd++) {
                if (isnan(res.base_s[kd]))
                    fprintf(out_, "baseline %-11s unavailable: %s\n", tj_dense_kind_word((tj_dense_kind)kd), res.base_why[kd]);
                else
                    fprintf(out_, "baseline %-11s %s: %.4f ms, %.1f GFLOP/s%s\n", tj_dense_kind_word((tj_dense_kind)kd),
                           res.base_name[kd], res.base_s[kd] * 1e3, dflop / res.base_s[kd] * 1e-9,
                           kd == res.best ? (o.bf16 ? "  <- dense (bf16)" : "  <- dense (fastest fp32)") : "");
            }
            fprintf(out_, "%-6s %-8s %11s %11s %9s %9s %8s %7s %8s %9s %11s %-8s %7s %7s\n", "sparse", "density", "tilejit_ms",
                   "dense_ms", "kept_GF/s", "dense_GF/s", "speedup", "ideal", "jit_ms", "relerr", "run_ms", "path", "w_GB/s",
                   "rd_GB/s");
        }
        print_row(&o, &res);
        fflush(out_);
        if (cf) {
            fprintf(cf, "%lld,%lld,%lld,%lld,tw%d,%.4f,%.6f,%d,%.5f,%.4f,%.5f,%.2f,%.2f,%.2f,%.3g,", (long long)o.m,
                    (long long)o.n, (long long)o.k, (long long)o.g, o.mode, res.sparsity, res.density, o.threads,
                    res.tj_s * 1e3, res.dense_s / res.tj_s, res.dense_s * 1e3,
                    2.0 * (double)o.m * (double)res.kept / res.tj_s * 1e-9,
                    2.0 * (double)o.m * (double)o.n * (double)o.k / res.dense_s * 1e-9, res.jit_s * 1e3, res.relerr);
            csv_field(cf, res.cfg);
            fprintf(cf, ",%s,%.5f,%.5f,%.5f,%.5f,%s,%.2f,%.2f,", tj_dense_kind_word((tj_dense_kind)res.best),
                    res.base_s[TJ_DENSE_ONEDNN_F32] * 1e3, res.base_s[TJ_DENSE_ONEDNN_BF16] * 1e3,
                    res.base_s[TJ_DENSE_OPENBLAS] * 1e3, res.run_s * 1e3, res.path, res.wbytes / res.tj_s * 1e-9,
                    res.read_gbps);
            csv_field(cf, res.base_name[res.best]);
            fputc('\n', cf);
        }
        if (o.verbose) fprintf(errs_, "tilejit bench: sparsity %.4f: path %s: %s\n", res.sparsity, res.path, res.path_why);
    }
    if (cf) {
        if (fclose(cf) != 0) { cf = NULL; tj_args_fail(errs_, C, "error writing %s", csv); goto out; }
        cf = NULL;
        if (plot && write_plot(C, csv, plot, &o)) goto out;
    }
    fprintf(out_, "config %s\n", res.cfg);
    double dflop = 2.0 * (double)o.m * (double)o.n * (double)o.k;
    fprintf(out_, "speedup %.3f tilejit_ms %.4f dense_ms %.4f kept_gflops %.2f baseline %s baseline_gflops %.2f peak_gflops %.2f "
           "onednn_f32_ms %.4f onednn_bf16_ms %.4f openblas_ms %.4f speedup_bf16 %.3f run_ms %.4f path %s weights_gbps %.2f "
           "read_gbps %.2f dtype %s efficiency %.3f\n",
           res.dense_s / res.tj_s, res.tj_s * 1e3, res.dense_s * 1e3, 2.0 * (double)o.m * (double)res.kept / res.tj_s * 1e-9,
           tj_dense_kind_word((tj_dense_kind)res.best), dflop / res.dense_s * 1e-9, peak,
           res.base_s[TJ_DENSE_ONEDNN_F32] * 1e3, res.base_s[TJ_DENSE_ONEDNN_BF16] * 1e3,
           res.base_s[TJ_DENSE_OPENBLAS] * 1e3, res.base_s[TJ_DENSE_ONEDNN_BF16] / res.tj_s, res.run_s * 1e3, res.path,
           res.wbytes / res.tj_s * 1e-9, res.read_gbps, o.bf16 ? "bf16" : "f32", res.dense_s * res.density / res.tj_s);
    rc = 0;
out:
    if (cf) fclose(cf);
    tj_pool_destroy(pool);
    tj_cpu_jit_destroy(jit);
    free(cfg_text);
    return rc;
}
