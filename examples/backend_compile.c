/* backend_compile: tilejit as a compiler back end would use it, through the public API alone
 * (tilejit.h, libtilejit.so). Given a pattern and its weights (or, without arguments, a small
 * random two-layer model it writes itself), it
 *   1. reads and validates the pattern and prints each layer's shape and density,
 *   2. generates each layer's source for both targets: CUDA C (for NVRTC) and LLVM IR (CPU),
 *   3. compiles every layer's CUDA kernels ahead of time for a named arch (default sm_90) into
 *      the kernel cache with NVRTC, which needs no GPU,
 *   4. runs one layer on the CPU backend (LLVM ORC JIT; the reference backend in a build
 *      without LLVM), checks it against the reference with the bound for fp32, and times it.
 *
 * usage: backend_compile [PATTERN WEIGHTS] [--arch sm_90[,sm_80]] [--layer NAME] [--m 64]
 * Exits 0 when every step succeeded and the layer is within the bound, else 1 with a message. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tilejit.h>

static int fail(const char *what, const char *msg)
{
    fprintf(stderr, "backend_compile: %s: %s\n", what, msg);
    return 1;
}

/* A random two-layer model (pattern + safetensors) in dir: the input of step 1 when none is
 * given. Weights are uniform in [-1, 1) from a fixed seed. */
static int write_model(const char *dir, char *pattern, char *weights, size_t cap)
{
    static const tj_random_spec specs[2] = {
        {.n = 256, .k = 128, .g = 64, .sparsity = 0.75, .mode = 1, .seed = 7, .act = TJ_ACT_GELU},
        {.n = 128, .k = 256, .g = 64, .sparsity = 0.5, .mode = 2, .seed = 8, .act = TJ_ACT_NONE}};
    static const char *names[2] = {"block.ffn_in", "block.ffn_out"};
    tj_layer layers[2] = {{0}};
    tj_pattern p = {2, layers};
    float *w[2] = {NULL, NULL};
    tj_error err;
    int rc = 1;
    snprintf(pattern, cap, "%s/model.pattern.json", dir);
    snprintf(weights, cap, "%s/model.safetensors", dir);
    tj_st_out_tensor t[2];
    int64_t shapes[2][2];
    uint64_t s = 12345;
    for (int i = 0; i < 2; i++) {
        if (tj_random_layer(&specs[i], names[i], &layers[i], &err) != TJ_OK) { fail("random layer", err.msg); goto done; }
        int64_t n = specs[i].n * specs[i].k;
        if (!(w[i] = malloc((size_t)n * sizeof *w[i]))) { fail("weights", "out of memory"); goto done; }
        for (int64_t j = 0; j < n; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            w[i][j] = (float)((double)(s >> 40) / 8388608.0 - 1.0);
        }
        shapes[i][0] = specs[i].n;
        shapes[i][1] = specs[i].k;
        static char tname[2][64];
        snprintf(tname[i], sizeof tname[i], "%s.weight", names[i]);
        t[i] = (tj_st_out_tensor){tname[i], "F32", 2, shapes[i], w[i], (uint64_t)n * 4};
    }
    if (tj_pattern_save(&p, pattern, &err) != TJ_OK) { fail("write pattern", err.msg); goto done; }
    if (tj_st_write(weights, t, 2, NULL, &err) != TJ_OK) { fail("write weights", err.msg); goto done; }
    rc = 0;
done:
    for (int i = 0; i < 2; i++) {
        tj_layer_free(&layers[i]);
        free(w[i]);
    }
    return rc;
}

typedef struct call {
    tj_model *model;
    int64_t layer;
    DLTensor *x, *y;
} call;

static int run_once(void *user)
{
    call *c = user;
    return tj_linear_ex(c->model, c->layer, c->x, c->y, TJ_LAYOUT_ROW_MAJOR, NULL) != TJ_OK;
}

/* Step 4: one layer on the CPU backend, checked against the reference, then timed. */
static int run_layer(const char *pattern, const char *weights, const char *name, int64_t m)
{
    tj_options opt = tj_options_default();
    opt.backend = tj_backend_built(TJ_BACKEND_CPU) ? TJ_BACKEND_CPU : TJ_BACKEND_REFERENCE;
    tj_context *ctx = NULL;
    tj_model *model = NULL;
    float *x = NULL, *y = NULL;
    int rc = 1;
    if (tj_context_create(&opt, &ctx) != TJ_OK) return fail("context", tj_last_error());
    if (tj_model_load(ctx, pattern, weights, &model) != TJ_OK) { fail("load", tj_context_error(ctx)); goto done; }
    int64_t idx = 0;
    if (name && tj_model_find_layer(model, name, &idx) != TJ_OK) { fail("layer", tj_context_error(ctx)); goto done; }
    tj_layer_info li;
    tj_model_layer_info(model, idx, &li);
    x = malloc((size_t)(m * li.k) * sizeof *x);
    y = malloc((size_t)(m * li.n) * sizeof *y);
    if (!x || !y) { fail("run", "out of memory"); goto done; }
    uint64_t s = 99;
    for (int64_t i = 0; i < m * li.k; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / 8388608.0 - 1.0);
    }
    int64_t xs[2] = {m, li.k}, ys[2] = {m, li.n};
    DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
    DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
    call c = {model, idx, &xt, &yt};
    if (run_once(&c)) { fail("tj_linear", tj_context_error(ctx)); goto done; }
    double rel = 0, bound = tj_check_bound(TJ_F32);
    if (tj_model_check(model, idx, x, y, m, 1, &rel) != TJ_OK) { fail("check", "out of memory"); goto done; }
    tj_time_options to = tj_time_options_default();
    to.min_time_s = 0.05;
    to.batch = 0;
    tj_timing tm;
    if (tj_time_calls(run_once, &c, &to, &tm, NULL, 0, NULL) != TJ_OK) { fail("timing", tj_context_error(ctx)); goto done; }
    printf("run    %s on %s, M %lld: relative error %.2e (bound %.0e) %s, %.4f ms per call (median of %lld)\n",
           li.name, tj_backend_name(tj_context_backend(ctx)), (long long)m, rel, bound, rel <= bound ? "ok" : "FAILED",
           1e3 * tm.median_s, (long long)tm.samples);
    rc = rel <= bound ? 0 : fail("check", "the layer's output is outside the bound");
done:
    free(x);
    free(y);
    tj_model_destroy(model);
    tj_context_destroy(ctx);
    return rc;
}

int main(int argc, char **argv)
{
    const char *pattern = NULL, *weights = NULL, *arch = "sm_90", *layer = NULL;
    int64_t m = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--arch") && i + 1 < argc) arch = argv[++i];
        else if (!strcmp(argv[i], "--layer") && i + 1 < argc) layer = argv[++i];
        else if (!strcmp(argv[i], "--m") && i + 1 < argc) m = atoll(argv[++i]);
        else if (argv[i][0] != '-' && !pattern) pattern = argv[i];
        else if (argv[i][0] != '-' && !weights) weights = argv[i];
        else return fail("usage", "backend_compile [PATTERN WEIGHTS] [--arch sm_90] [--layer NAME] [--m 64]");
    }
    if (m < 1 || (pattern && !weights)) return fail("usage", "give both PATTERN and WEIGHTS, and --m >= 1");
    char dir[] = "/tmp/tj_backend_compile_XXXXXX", pbuf[512], wbuf[512];
    int own = 0;
    if (!pattern) {
        if (!mkdtemp(dir)) return fail("mkdtemp", "cannot create a temporary directory");
        own = 1;
        if (write_model(dir, pbuf, wbuf, sizeof pbuf)) return 1;
        pattern = pbuf;
        weights = wbuf;
    }

    tj_error err;
    tj_pattern *p = NULL;
    tj_compile_report *rep = NULL;
    int rc = 1;
    /* 1. read and inspect */
    if (tj_pattern_load(pattern, &p, &err) != TJ_OK) { fail("pattern", err.msg); goto done; }
    if (layer && !tj_pattern_find(p, layer)) { fail("pattern", "no such layer"); goto done; }
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        printf("layer  %s: %lld x %lld, g %lld, %lld tiles, density %.3f, %s\n", l->name, (long long)l->n,
               (long long)l->k, (long long)l->g, (long long)l->ntiles, (double)tj_layer_kept(l) / (double)(l->n * l->k),
               tj_activation_name(l->act));
        /* 2. source for both targets */
        for (int t = 0; t < 2; t++) {
            tj_target target = t ? TJ_TARGET_CPU : TJ_TARGET_CUDA;
            if (target == TJ_TARGET_CPU && !tj_backend_built(TJ_BACKEND_CPU)) continue;
            char *src = NULL, *cfg = NULL;
            if (tj_gen_config(l, target, NULL, &cfg, &err) != TJ_OK || tj_gen_source(l, target, cfg, &src, &err) != TJ_OK) {
                free(cfg);
                fail("gen", err.msg);
                goto done;
            }
            printf("gen    %-4s %zu bytes, config %s\n", t ? "cpu" : "cuda", strlen(src), cfg);
            free(src);
            free(cfg);
        }
    }
    /* 3. ahead-of-time CUDA compile for the named arch, into the kernel cache */
    if (tj_backend_built(TJ_BACKEND_CUDA)) {
        int archs[4];
        int narch = tj_arch_parse(arch, archs, 4);
        if (narch <= 0) { fail("--arch", "not a list like sm_80,sm_90"); goto done; }
        tj_compile_options co = tj_compile_options_default();
        co.archs = archs;
        co.narchs = narch;
        co.layer = layer;
        tj_status s = tj_compile_pattern(p, &co, &rep, &err);
        for (int64_t j = 0; rep && j < rep->count; j++) {
            const tj_compiled *k = &rep->kernels[j];
            printf("cubin  %s sm_%d%s: %s, %.3f s, %d registers, %lld spill bytes\n", k->layer, k->sm & ~TJ_ARCH_SPECIFIC,
                   (k->sm & TJ_ARCH_SPECIFIC) ? "a" : "",
                   k->status == TJ_OK ? (k->cache == TJ_CACHE_USE_HIT ? "cached" : "compiled") : "FAILED", k->seconds,
                   k->registers, (long long)k->spill_bytes);
        }
        if (s != TJ_OK) { fail("compile", err.msg); goto done; }
    } else {
        printf("cubin  skipped: this build has no CUDA toolkit\n");
    }
    /* 4. run one layer */
    rc = run_layer(pattern, weights, layer ? layer : p->layers[0].name, m);
done:
    tj_compile_report_destroy(rep);
    tj_pattern_destroy(p);
    if (own) {
        unlink(pbuf);
        unlink(wbuf);
        rmdir(dir);
    }
    return rc;
}
