/* The dense path (runtime/dense_path.c, docs/dense-path.md): a layer on a dense library against the
 * reference on fresh random data (masked weights, with weights outside the mask that must be
 * ignored; bias; every activation; fp32, fp16 and bf16 weights; M values that make new
 * primitives), the choice per layer and M class by the measured rule, by tuning records (which
 * override the rule both ways), by a forced config, and without a library.
 *
 *   test_dense_path              all of the above (the libraries this machine has)
 *   test_dense_path concurrency  16 threads on one model, dense and kernel layers: one primitive run
 *                                by all at once, and 40 distinct M (more than a matmul keeps
 *                                primitives for); each call checked
 *
 * With TILEJIT_ONEDNN pointing nowhere (test dense_path_no_onednn) the dense path is OpenBLAS's,
 * or, in a build without OpenBLAS, absent: every layer keeps its kernel and a forced dense path
 * fails to load with a reason. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/model.h"
#include "runtime/dense_path.h"
#include "runtime/dense_rule.h"
#include "pattern/random.h"
#include "base/dense.h"
#include "base/threadpool.h"
#include "base/safetensors.h"
#include "tuning/tuning.h"
#include "tj_config.h"
#include "rel_common.h"

#define NL 4
static char dir[64], pat[128], wts[128];

/* Layer i: density 1 with bias and gelu (fp32; k 90, not a multiple of a vector); tw2 + ew with relu (bf16, no bias); density 0.1
 * (fp16, bias); density 0.5 with relu (fp32, bias). Every weight is random, also outside the
 * mask. */
static tj_random_spec spec(int i)
{
    static const tj_random_spec s[NL] = {
        {.n = 96, .k = 90, .g = 32, .sparsity = 0.0, .mode = 1, .seed = 11, .act = TJ_ACT_GELU},
        {.n = 130, .k = 64, .g = 32, .sparsity = 0.3, .mode = 2, .seed = 12, .ew_fraction = 0.02, .act = TJ_ACT_RELU},
        {.n = 64, .k = 200, .g = 16, .sparsity = 0.9, .mode = 1, .seed = 13, .act = TJ_ACT_NONE},
        {.n = 128, .k = 128, .g = 32, .sparsity = 0.5, .mode = 1, .seed = 14, .act = TJ_ACT_RELU},
    };
    return s[i];
}

static int write_model(void)
{
    snprintf(pat, sizeof pat, "%s/m.json", dir);
    snprintf(wts, sizeof wts, "%s/m.safetensors", dir);
    tj_random_spec specs[NL];
    for (int i = 0; i < NL; i++) specs[i] = spec(i);
    static const tj_dtype dts[NL] = {TJ_F32, TJ_BF16, TJ_F16, TJ_F32};
    static const int bias[NL] = {1, 0, 1, 1};
    return rel_write_layers(pat, wts, "l%d", specs, dts, bias, NL);
}

/* y = the model's layer on fresh random x [m × k] (poisoned y first), against the reference. */
static double run_check(tj_model *m, int64_t layer, int64_t rows, uint64_t seed)
{
    tj_layer_info li;
    tj_model_layer_info(m, layer, &li);
    float *x = malloc((size_t)(rows * li.k) * 4), *y = malloc((size_t)(rows * li.n) * 4),
          *ref = malloc((size_t)(rows * li.n) * 4);
    tj_rng r = {seed};
    tj_test_fill(&r, x, rows * li.k);
    for (int64_t i = 0; i < rows * li.n; i++) y[i] = NAN;
    int64_t xs[2] = {rows, li.k}, ys[2] = {rows, li.n};
    DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
    DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
    double e = INFINITY;
    if (tj_linear_ex(m, layer, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) == TJ_OK) {
        tj_model_reference(m, layer, x, rows, ref);
        e = tj_test_all_finite(y, rows * li.n) ? tj_test_relerr(y, ref, rows * li.n) : INFINITY;
    } else {
        fprintf(stderr, "tj_linear_ex: %s\n", tj_context_error(m->ctx));
    }
    free(x);
    free(y);
    free(ref);
    return e;
}

static int have_library(void)
{
    tj_error err;
    return tj_onednn_open(&err) == TJ_OK || tj_openblas_built();
}

/* One layer on the dense path directly: masked weights, bias, activation, several M. */
static void test_layers(const tj_pattern *p, const tj_layer_weights *lw)
{
    int threads = tj_cpu_count();
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        tj_error err;
        tj_dense_layer *d = NULL;
        tj_status s = tj_dense_layer_create(l, &lw[i], threads, &d, &err);
        if (!have_library()) {
            CHECKF(s == TJ_ERR_UNSUPPORTED && strstr(err.msg, "no dense library"), "no library, yet %s: %s",
                   tj_status_string(s), err.msg);
            continue;
        }
        CHECK_OK(s, &err);
        if (s != TJ_OK) continue;
        if (i == 0) printf("dense path: %s\n", tj_dense_layer_name(d));
        static const int64_t ms[] = {1, 3, 17, 64, 130, 3};
        for (size_t j = 0; j < sizeof ms / sizeof *ms; j++) {
            int64_t m = ms[j];
            float *x = malloc((size_t)(m * l->k) * 4), *y = malloc((size_t)(m * l->n) * 4), *ref = malloc((size_t)(m * l->n) * 4);
            tj_rng r = {1000 * (uint64_t)i + (uint64_t)j};
            tj_test_fill(&r, x, m * l->k);
            for (int64_t e = 0; e < m * l->n; e++) y[e] = NAN;
            CHECK_OK(tj_dense_layer_run(d, x, y, m, &err), &err);
            tj_reference_linear(l, &lw[i], x, m, ref);
            double e = tj_test_all_finite(y, m * l->n) ? tj_test_relerr(y, ref, m * l->n) : INFINITY;
            CHECKF(e <= 1e-5, "layer %s M %lld: relative error %g (%s)", l->name, (long long)m, e, tj_dense_layer_name(d));
            free(x);
            free(y);
            free(ref);
        }
        tj_dense_layer_free(d);
    }
    /* the mask: a kept weight stays, a dropped one is zero whatever the file holds */
    const tj_layer *l = &p->layers[2];
    float *w = malloc((size_t)(l->n * l->k) * 4);
    tj_dense_masked_weights(l, &lw[2], w);
    int64_t kept = 0, nonzero_dropped = 0;
    for (int64_t n = 0; n < l->n; n++)
        for (int64_t k = 0; k < l->k; k++) kept += w[n * l->k + k] != 0;
    const int32_t *rows = l->tile_rows + l->tile_ptr[0];
    for (int64_t c = 0; c < tj_tile_width(l, 0); c++) {
        int64_t n = tj_layer_col(l, c);
        CHECK(w[n * l->k + rows[0]] == tj_load_f32(lw[2].w, lw[2].wdt, n * l->k + rows[0]));
        for (int64_t k = 0; k < l->k; k++) {
            int in = 0;
            for (int64_t r = 0; r < tj_tile_nrows(l, 0); r++) in |= rows[r] == k;
            nonzero_dropped += !in && w[n * l->k + k] != 0;
        }
    }
    CHECKF(kept <= tj_layer_kept(l) && kept > tj_layer_kept(l) * 9 / 10 && nonzero_dropped == 0,
           "masked weights: %lld nonzero of %lld kept, %lld outside the mask", (long long)kept, (long long)tj_layer_kept(l),
           (long long)nonzero_dropped);
    free(w);
}

static tj_context *context(const char *log, const char *config)
{
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_CPU;
    o.tuning_log = log ? log : "";
    o.verbose = 1;
    tj_context *c = NULL;
    if (tj_context_create(&o, &c) != TJ_OK) return NULL;
    tj_error err;
    if (config) tj_context_set_config(c, config, &err);
    return c;
}

static double density(const tj_layer *l) { return (double)tj_layer_kept(l) / ((double)l->n * (double)l->k); }

/* Layer 1's bf16 weights compute in bf16 by default where the CPU has bf16 instructions: then its
 * kernel (the rule is fp32's) and the bf16 bound. */
static int computes_bf16(tj_model *m, int64_t layer, int64_t M)
{
    tj_precision p = TJ_PRECISION_F32;
    return tj_model_layer_precision(m, layer, M, &p) == TJ_OK && p == TJ_PRECISION_BF16;
}

static double bound_at(tj_model *m, int64_t layer, int64_t M, tj_path path)
{
    return path == TJ_PATH_KERNEL && computes_bf16(m, layer, M) ? tj_check_bound(TJ_BF16) : 1e-5;
}

/* The rule decides without records; both paths give the reference's result. */
static void test_rule(void)
{
    tj_context *c = context(NULL, NULL);
    tj_model *m = NULL;
    if (!c || tj_model_load(c, pat, wts, &m) != TJ_OK) {
        CHECKF(0, "load: %s", c ? tj_context_error(c) : tj_last_error());
        tj_context_destroy(c);
        return;
    }
    int threads = tj_context_threads(c), dense_seen = 0, kernel_seen = 0; /* what the rule was asked with */
    static const int64_t ms[] = {1, 2, 16, 100, 128, 512, 5000};
    for (int64_t i = 0; i < NL; i++) {
        const tj_layer *l = &m->pattern->layers[i];
        for (size_t j = 0; j < sizeof ms / sizeof *ms; j++) {
            int b = tj_path_bucket(ms[j]);
            int64_t mclass = (int64_t)1 << b;
            int bf = computes_bf16(m, i, ms[j]);
            int want = !bf && have_library() && density(l) >= tj_dense_rule_crossover(mclass, l->n, l->k, threads);
            tj_path path;
            const char *lib = NULL, *why = NULL;
            CHECK(tj_model_layer_path(m, i, ms[j], &path, &lib, &why) == TJ_OK);
            CHECKF((path == TJ_PATH_DENSE) == want, "layer %s (density %.3f) M %lld: path %d, the rule says %d: %s",
                   l->name, density(l), (long long)ms[j], (int)path, want, why);
            CHECKF(strstr(why, bf ? "bf16" : "rule") != NULL, "why: %s", why);
            CHECK(path == TJ_PATH_DENSE ? strcmp(lib, "kernel") != 0 : strcmp(lib, "kernel") == 0);
            const char *cfg = NULL;
            CHECK(tj_model_layer_config(m, i, ms[j], &cfg) == TJ_OK);
            CHECK((path == TJ_PATH_DENSE) == (cfg && strcmp(cfg, TJ_TUNE_DENSE_CONFIG) == 0));
            dense_seen += path == TJ_PATH_DENSE;
            kernel_seen += path == TJ_PATH_KERNEL;
            if (ms[j] <= 512) {
                double e = run_check(m, i, ms[j], 77 + (uint64_t)(i * 10 + (int64_t)j));
                CHECKF(e <= bound_at(m, i, ms[j], path), "layer %s M %lld (%s%s): relative error %g", l->name, (long long)ms[j],
                       lib, bf ? ", bf16" : "", e);
            }
        }
    }
    /* density 1 at M = 128 on this machine's table takes the dense path; density 0.1 never */
    CHECKF(!have_library() || dense_seen > 0, "no layer took the dense path");
    CHECK(kernel_seen > 0);
    tj_path p2;
    CHECK(tj_model_layer_path(m, 2, 128, &p2, NULL, NULL) == TJ_OK && p2 == TJ_PATH_KERNEL);
    CHECK(tj_model_layer_path(m, 0, 128, &p2, NULL, NULL) == TJ_OK && (p2 == TJ_PATH_DENSE) == have_library());
    CHECK(tj_model_layer_path(m, NL, 128, &p2, NULL, NULL) == TJ_ERR_INVALID_ARGUMENT);
    CHECK(tj_model_layer_path(m, 0, 0, &p2, NULL, NULL) == TJ_ERR_INVALID_ARGUMENT);
    /* the load notes the dense layers */
    CHECKF(!have_library() || strstr(tj_context_log(c), "path: layer 'l0'") != NULL, "%s", tj_context_log(c));
    tj_model_destroy(m);
    tj_context_destroy(c);
}

static void append(const char *log, const tj_layer *l, int64_t m, const char *config, double median)
{
    tj_tune_record r;
    memset(&r, 0, sizeof r);
    tj_tune_host_target(&r.target);
    snprintf(r.target.backend, sizeof r.target.backend, "cpu");
    tj_tune_workload_of(l, m, &r.wl);
    r.config = (char *)config;
    r.status = TJ_TUNE_OK;
    r.median = median;
    tj_error err;
    CHECK_OK(tj_tune_log_append(log, &r, &err), &err);
}

/* Tuning records override the rule both ways; a forced config decides everything. */
static void test_records(void)
{
    char log[160];
    snprintf(log, sizeof log, "%s/tune.jsonl", dir);
    tj_pattern *p = NULL;
    tj_error err;
    CHECK_OK(tj_pattern_load(pat, &p, &err), &err);
    if (!p) return;
    /* layer 2 (density 0.1: the rule's kernel) measured faster dense at M 128; layer 0 (density
     * 1: the rule's dense path) measured faster as a kernel */
    append(log, &p->layers[2], 128, "{}", 2e-3);
    append(log, &p->layers[2], 128, TJ_TUNE_DENSE_CONFIG, 1e-3);
    append(log, &p->layers[0], 128, "{}", 1e-3);
    append(log, &p->layers[0], 128, TJ_TUNE_DENSE_CONFIG, 2e-3);
    /* layer 3: a dense record alone decides nothing (the rule's answer stays) */
    append(log, &p->layers[3], 128, TJ_TUNE_DENSE_CONFIG, 1e-9);
    tj_context *c = context(log, NULL);
    tj_model *m = NULL;
    if (!c || tj_model_load(c, pat, wts, &m) != TJ_OK) {
        CHECKF(0, "load: %s", c ? tj_context_error(c) : tj_last_error());
        tj_context_destroy(c);
        tj_pattern_destroy(p);
        return;
    }
    tj_path path;
    const char *why = NULL, *cfg = NULL;
    CHECK(tj_model_layer_path(m, 2, 128, &path, NULL, &why) == TJ_OK);
    CHECKF((path == TJ_PATH_DENSE) == have_library() && strstr(why, "tuning records"), "layer 2: %d: %s", (int)path, why);
    CHECK(tj_model_layer_config(m, 2, 128, &cfg) == TJ_OK && (strcmp(cfg ? cfg : "", TJ_TUNE_DENSE_CONFIG) == 0) == have_library());
    CHECK(tj_model_layer_path(m, 0, 128, &path, NULL, &why) == TJ_OK);
    CHECKF(path == TJ_PATH_KERNEL && strstr(why, "tuning records"), "layer 0: %d: %s", (int)path, why);
    /* the kernel config of a layer never is the dense record, whatever the records say */
    CHECK(tj_model_layer_config(m, 0, 128, &cfg) == TJ_OK && (!cfg || !strstr(cfg, "path")));
    CHECK(tj_model_layer_path(m, 3, 128, &path, NULL, &why) == TJ_OK);
    CHECKF(strstr(why, "rule") != NULL, "layer 3: %s", why);
    for (int64_t i = 0; i < NL; i++) {
        double e = run_check(m, i, 128, 900 + (uint64_t)i);
        CHECK(tj_model_layer_path(m, i, 128, &path, NULL, NULL) == TJ_OK);
        CHECKF(e <= bound_at(m, i, 128, path), "records: layer %lld: relative error %g", (long long)i, e);
    }
    tj_model_destroy(m);
    tj_context_destroy(c);

    /* forced: the dense path everywhere (the tuner's candidate), or a kernel config everywhere */
    c = context(log, TJ_TUNE_DENSE_CONFIG);
    tj_status s = c ? tj_model_load(c, pat, wts, &m) : TJ_ERR_INTERNAL;
    if (have_library()) {
        CHECKF(s == TJ_OK, "forced dense: %s", c ? tj_context_error(c) : "");
        for (int64_t i = 0; s == TJ_OK && i < NL; i++) {
            CHECK(tj_model_layer_path(m, i, 1 + 50 * i, &path, NULL, &why) == TJ_OK && path == TJ_PATH_DENSE && strstr(why, "forced"));
            double e = run_check(m, i, 1 + 50 * i, 950 + (uint64_t)i);
            CHECKF(e <= 1e-5, "forced dense: layer %lld: relative error %g", (long long)i, e);
        }
    } else {
        CHECKF(s == TJ_ERR_UNSUPPORTED && strstr(tj_context_error(c), "dense"), "forced dense without a library: %s: %s",
               tj_status_string(s), c ? tj_context_error(c) : "");
    }
    if (s == TJ_OK) tj_model_destroy(m);
    tj_context_destroy(c);
    c = context(log, "{\"mr\":4}");
    m = NULL;
    CHECK(c && tj_model_load(c, pat, wts, &m) == TJ_OK);
    for (int64_t i = 0; m && i < NL; i++)
        CHECK(tj_model_layer_path(m, i, 128, &path, NULL, &why) == TJ_OK && path == TJ_PATH_KERNEL && strstr(why, "forced"));
    tj_model_destroy(m);
    tj_context_destroy(c);
    tj_pattern_destroy(p);
}

/* TILEJIT_DENSE_PATH=off: kernels only, whatever the rule says. */
static void test_off(void)
{
    setenv("TILEJIT_DENSE_PATH", "off", 1);
    tj_context *c = context(NULL, NULL);
    tj_model *m = NULL;
    CHECK(c && tj_model_load(c, pat, wts, &m) == TJ_OK);
    for (int64_t i = 0; m && i < NL; i++) {
        tj_path path;
        const char *why = NULL;
        CHECK(tj_model_layer_path(m, i, 128, &path, NULL, &why) == TJ_OK);
        CHECKF(path == TJ_PATH_KERNEL && strstr(why, "off"), "layer %lld: %s", (long long)i, why);
        double e = run_check(m, i, 128, 990 + (uint64_t)i);
        CHECKF(e <= bound_at(m, i, 128, path), "off: layer %lld: relative error %g", (long long)i, e);
    }
    tj_model_destroy(m);
    tj_context_destroy(c);
    unsetenv("TILEJIT_DENSE_PATH");
}

/* ---- concurrency ------------------------------------------------------------------------- */

typedef struct worker_arg {
    tj_model *m;
    int id, calls;
    int failures;
} worker_arg;

/* The hot call: layer 0 at M = 3 on the same x, expected bit for bit as one thread computed it. */
static float hot_x[3 * 90], hot_want[3 * 96]; /* k 90: oneDNN copies x's K tail into its scratchpad */

static int hot_call(tj_model *m, float *y)
{
    int64_t xs[2] = {3, 90}, ys[2] = {3, 96};
    DLTensor xt = {.data = hot_x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
    DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
    for (int i = 0; i < 3 * 96; i++) y[i] = NAN;
    return tj_linear_ex(m, 0, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) == TJ_OK;
}

static void *worker(void *vp)
{
    worker_arg *a = vp;
    float y[3 * 96];
    for (int i = 0; i < a->calls; i++) {
        if (i % 8) { /* one primitive (or kernel) run by every thread at once */
            if (!hot_call(a->m, y) || memcmp(y, hot_want, sizeof y) != 0) {
                if (a->failures++ < 3) fprintf(stderr, "thread %d call %d: the hot call differs\n", a->id, i);
            }
            continue;
        }
        /* 40 distinct M over every layer (more than a matmul keeps primitives for), checked */
        int64_t layer = (a->id + i) % NL, rows = 1 + (a->id * 7 + i * 13) % 40;
        double e = run_check(a->m, layer, rows, (uint64_t)(a->id * 100000 + i));
        tj_path path = TJ_PATH_KERNEL;
        tj_model_layer_path(a->m, layer, rows, &path, NULL, NULL);
        if (!(e <= bound_at(a->m, layer, rows, path))) {
            fprintf(stderr, "thread %d call %d: layer %lld M %lld: relative error %g\n", a->id, i, (long long)layer,
                    (long long)rows, e);
            a->failures++;
        }
    }
    return NULL;
}

static void test_concurrency(const char *config)
{
    tj_context *c = context(NULL, config);
    tj_model *m = NULL;
    if (!c || tj_model_load(c, pat, wts, &m) != TJ_OK) {
        CHECKF(0, "load: %s", c ? tj_context_error(c) : tj_last_error());
        tj_context_destroy(c);
        return;
    }
    tj_rng r = {4242};
    tj_test_fill(&r, hot_x, 3 * 90);
    CHECK(hot_call(m, hot_want) && tj_test_all_finite(hot_want, 3 * 96));
    tj_path path;
    tj_model_layer_path(m, 0, 3, &path, NULL, NULL);
    printf("%s: the hot call runs %s\n", config ? config : "rule", path == TJ_PATH_DENSE ? "the dense path" : "the kernel");
    enum { T = 16, CALLS = 1600 };
    pthread_t tid[T];
    worker_arg args[T];
    for (int t = 0; t < T; t++) {
        args[t] = (worker_arg){m, t, CALLS, 0};
        CHECK(pthread_create(&tid[t], NULL, worker, &args[t]) == 0);
    }
    int failures = 0;
    for (int t = 0; t < T; t++) {
        pthread_join(tid[t], NULL);
        failures += args[t].failures;
    }
    CHECKF(failures == 0, "%s: %d of %d calls wrong", config ? config : "rule", failures, T * CALLS);
    tj_model_destroy(m);
    tj_context_destroy(c);
}

int main(int argc, char **argv)
{
    if (!TJ_HAVE_LLVM) {
        fprintf(stderr, "skip: the CPU backend (LLVM) is not built in\n");
        return 77;
    }
    snprintf(dir, sizeof dir, "/tmp/tj_dense_path_XXXXXX");
    if (!mkdtemp(dir) || !write_model()) return 1;
    printf("oneDNN: %s; OpenBLAS: %s\n", have_library() ? "see below" : "no", tj_openblas_built() ? "built" : "not built");
    if (argc > 1 && strcmp(argv[1], "concurrency") == 0) {
        test_concurrency(NULL);
        if (have_library()) test_concurrency(TJ_TUNE_DENSE_CONFIG);
    } else {
        tj_pattern *p = NULL;
        tj_st_file *f = NULL;
        tj_error err;
        CHECK_OK(tj_pattern_load(pat, &p, &err), &err);
        CHECK_OK(tj_st_open(wts, &f, &err), &err);
        if (p && f) {
            tj_layer_weights lw[NL];
            for (int i = 0; i < NL; i++) {
                char name[64];
                snprintf(name, sizeof name, "l%d.weight", i);
                const tj_st_tensor *t = tj_st_find(f, name);
                snprintf(name, sizeof name, "l%d.bias", i);
                const tj_st_tensor *b = tj_st_find(f, name);
                lw[i] = (tj_layer_weights){t->data, t->dtype, b ? b->data : NULL, b ? b->dtype : TJ_F32};
            }
            test_layers(p, lw);
        }
        tj_st_close(f);
        tj_pattern_destroy(p);
        test_rule();
        test_records();
        test_off();
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tj_test_end();
}
