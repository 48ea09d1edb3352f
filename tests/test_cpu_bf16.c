/* Suite 'cpu': bf16 activations on the CPU backend. Every dtype-bf16 config of the tuner's space
 * that the host can run, against the reference on fresh random data; the vdpbf16ps and AMX
 * kernels emitted for Sapphire Rapids and their object code disassembled (runs on any x86-64
 * host).
 *   test_cpu_bf16            fma configs, codegen, the model path; dpbf16/amx configs skipped
 *   test_cpu_bf16 dpbf16     the dpbf16 configs; exit 77 where the CPU lacks avx512bf16
 *   test_cpu_bf16 amx        the AMX configs (amx and amx_x), and the decode shapes (M = 1..8,
 *                            SmolLM2) through the default precision; exit 77 without AMX-BF16
 *                            (or its permission) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>
#include <llvm-c/Disassembler.h>
#include <llvm-c/Object.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

#include <unistd.h>

#include "runtime/backend_cpu.h"
#include "base/safetensors.h"
#include "pattern/random.h"
#include "tj_model.h"

/* Bounds (relative L2 error over the whole output):
 * - against the reference on the same bf16-rounded x and bf16 weights: the kernel's products
 *   are exact in fp32, so only the summation order differs: 1e-5 with fp32 y; bf16 y adds one
 *   rounding of at most 2^-9 per element: 2^-8;
 * - against the fp32 reference on the unrounded x (what a user compares with): x (and fp32
 *   weights) rounded to bf16, 2^-9 each per element: 1e-2, the project's bf16 bound. */
#define TIGHT_F32 1e-5
#define TIGHT_BF16 (1.0 / 256)
#define LOOSE 1e-2

typedef tj_test_case bcase;

static const bcase cases[] = {
    {"bert", 256, 192, 128, 0.75, 1, 0, 0, TJ_ACT_NONE, TJ_BF16, 1},
    {"odd rows", 203, 131, 64, 0.5, 1, 0, 0, TJ_ACT_RELU, TJ_BF16, 1},
    {"tw2 gelu", 300, 97, 32, 0.6, 2, 0, 0, TJ_ACT_GELU, TJ_BF16, 0},
    {"ew relu cols", 333, 150, 32, 0.75, 2, 0.02, 0.1, TJ_ACT_RELU, TJ_BF16, 1},
    {"empty tiles", 512, 200, 64, 0.5, 1, 0, 0.4, TJ_ACT_NONE, TJ_BF16, 1},
    {"fp32 weights", 256, 160, 64, 0.75, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1}, /* rounded at packing (no ew: ew stays fp32) */
    {"single", 1, 1, 1, 0.0, 1, 0, 0, TJ_ACT_NONE, TJ_BF16, 1},
};
static const int64_t ms[] = {1, 3, 13, 29, 100, 161};

/* One config × case × M: returns 0 when a bound fails. */
static void check(tj_cpu_jit *jit, tj_pool *pool, const tj_cpu_config *cfg, int *id)
{
    char cj[400];
    char *j = tj_cpu_config_to_json(cfg);
    snprintf(cj, sizeof cj, "%s", j ? j : "?");
    free(j);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const bcase *c = &cases[ci];
        tj_layer l;
        void *w = NULL, *b = NULL;
        if (!tj_test_case_make(c, 40 + ci, &l, &w, &b)) { CHECK(0); continue; }
        tj_layer_weights lw = {w, c->wdt, b, c->wdt};
        /* the weights the kernel multiplies with: bf16 (exact for bf16, rounded for fp32) */
        float *wr = malloc((size_t)(l.n * l.k) * sizeof *wr + 4), *br = b ? malloc((size_t)l.n * 4 + 4) : NULL;
        tj_convert_to_f32(w, c->wdt, l.n * l.k, wr);
        for (int64_t i = 0; i < l.n * l.k; i++) wr[i] = tj_bf16_to_f32(tj_f32_to_bf16(wr[i]));
        if (b) tj_convert_to_f32(b, c->wdt, l.n, br);
        tj_layer_weights lwr = {wr, TJ_F32, br, TJ_F32};
        tj_error err;
        tj_cpu_layer *cl = NULL;
        char pre[32];
        snprintf(pre, sizeof pre, "b%d", (*id)++);
        CHECK_OK(tj_cpu_layer_build(jit, &l, &lw, cfg, pre, &cl, &err), &err);
        for (size_t mi = 0; cl && mi < sizeof ms / sizeof *ms; mi++) {
            int64_t m = ms[mi], nx = m * l.k, ny = m * l.n;
            float *x = malloc((size_t)nx * 4 + 4), *xr = malloc((size_t)nx * 4 + 4);
            float *y = malloc((size_t)ny * 4 + 4), *ref = malloc((size_t)ny * 4 + 4), *ref32 = malloc((size_t)ny * 4 + 4);
            uint16_t *xb = malloc((size_t)nx * 2 + 2), *yb = malloc((size_t)ny * 2 + 2);
            tj_rng r = {900 + 31 * mi + ci};
            tj_test_fill(&r, x, nx);
            tj_convert_from_f32(x, nx, TJ_BF16, xb);
            tj_convert_to_f32(xb, TJ_BF16, nx, xr);
            for (int64_t i = 0; i < ny; i++) { y[i] = NAN; yb[i] = 0x7fc0; } /* poison */
            int ybf = cl->cfg.out == TJ_CPU_ACT_BF16;
            tj_cpu_layer_run(cl, pool, 0, xb, m, ybf ? (void *)yb : (void *)y);
            if (ybf) tj_convert_to_f32(yb, TJ_BF16, ny, y);
            tj_reference_linear(&l, &lwr, xr, m, ref);
            tj_reference_linear(&l, &lw, x, m, ref32);
            int fin = tj_test_all_finite(y, ny);
            double tight = fin ? tj_test_relerr(y, ref, ny) : 1e9, loose = fin ? tj_test_relerr(y, ref32, ny) : 1e9;
            double tb = ybf ? TIGHT_BF16 : TIGHT_F32;
            CHECKF(tight <= tb, "config %s case %s M=%lld: relerr %g vs the reference on the same bf16 inputs (bound %g)",
                   cj, c->what, (long long)m, tight, tb);
            CHECKF(loose <= LOOSE, "config %s case %s M=%lld: relerr %g vs the fp32 reference (bound %g)", cj, c->what,
                   (long long)m, loose, LOOSE);
            free(x); free(xr); free(y); free(ref); free(ref32); free(xb); free(yb);
        }
        tj_cpu_layer_free(cl);
        tj_layer_free(&l);
        free(w); free(b); free(wr); free(br);
    }
}

/* Disassembles every executable section of an object; counts instructions whose text has `mn`. */
static int count_mnemonic(LLVMMemoryBufferRef obj, const char *triple, const char *cpu, const char *mn)
{
    char *msg = NULL;
    LLVMBinaryRef bin = LLVMCreateBinary(obj, NULL, &msg);
    if (!bin) {
        fprintf(stderr, "object: %s\n", msg ? msg : "?");
        LLVMDisposeMessage(msg);
        return -1;
    }
    LLVMDisasmContextRef dc = LLVMCreateDisasmCPUFeatures(triple, cpu, "", NULL, 0, NULL, NULL);
    int count = 0;
    LLVMSectionIteratorRef it = LLVMObjectFileCopySectionIterator(bin);
    for (; dc && !LLVMObjectFileIsSectionIteratorAtEnd(bin, it); LLVMMoveToNextSection(it)) {
        const char *name = LLVMGetSectionName(it);
        if (!name || strncmp(name, ".text", 5) != 0) continue;
        const uint8_t *p = (const uint8_t *)LLVMGetSectionContents(it);
        uint64_t n = LLVMGetSectionSize(it), pc = 0;
        char text[256];
        while (pc < n) {
            size_t sz = LLVMDisasmInstruction(dc, (uint8_t *)(uintptr_t)(p + pc), n - pc, pc, text, sizeof text);
            if (sz == 0) { pc++; continue; }
            if (strstr(text, mn)) count++;
            pc += sz;
        }
    }
    LLVMDisposeSectionIterator(it);
    if (dc) LLVMDisasmDispose(dc);
    else count = -1;
    LLVMDisposeBinary(bin);
    return count;
}

/* The dpbf16 kernel for Sapphire Rapids: the object code must use vdpbf16ps, and the fma
 * kernel's must not (the check can fail). */
static void test_codegen(void)
{
    LLVMInitializeNativeTarget();
    LLVMInitializeNativeAsmPrinter();
    LLVMInitializeNativeDisassembler();
    char *triple = LLVMGetDefaultTargetTriple();
    if (strncmp(triple, "x86_64", 6) != 0) {
        fprintf(stderr, "codegen: not an x86-64 toolchain (%s), skipped\n", triple);
        LLVMDisposeMessage(triple);
        return;
    }
    bcase c = {"codegen", 256, 192, 64, 0.75, 1, 0, 0, TJ_ACT_GELU, TJ_BF16, 1};
    tj_layer l;
    void *w = NULL, *b = NULL;
    if (!tj_test_case_make(&c, 5, &l, &w, &b)) { CHECK(0); return; }
    /* fma; dpbf16 with the gather and with vpcompressw staging (VBMI2); amx; amx_x */
    static const struct { int dot; const char *features; } kinds[] = {{TJ_CPU_DOT_FMA, ""},
                                                                       {TJ_CPU_DOT_DPBF16, "-avx512vbmi2"},
                                                                       {TJ_CPU_DOT_DPBF16, ""},
                                                                       {TJ_CPU_DOT_AMX, ""},
                                                                       {TJ_CPU_DOT_AMX_X, ""}};
    for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
        int dot = kinds[ki].dot;
        tj_cpu_config cfg = tj_cpu_config_default();
        cfg.mr = 6, cfg.nr = 64, cfg.vec = 16, cfg.dtype = TJ_CPU_ACT_BF16, cfg.weights = TJ_CPU_WEIGHTS_BF16;
        cfg.dot = dot, cfg.out = TJ_CPU_ACT_BF16, cfg.order = 0;
        tj_cpu_config_resolve(&cfg, &l); /* amx, amx_x: their blocks */
        tj_error err;
        tj_plan plan;
        CHECK_OK(tj_cpu_plan_build(&l, &cfg, &plan, &err), &err);
        LLVMContextRef ctx = LLVMContextCreate();
        LLVMModuleRef mod = NULL;
        tj_cpu_emit_info info;
        /* the emitter reads the feature string for VBMI2: name Sapphire Rapids' own */
        const char *feat = kinds[ki].features[0] ? "+avx512f,+avx512bw,+avx512bf16,-avx512vbmi2" : "+avx512f,+avx512bw,+avx512bf16,+avx512vbmi2,+amx-tile,+amx-bf16";
        CHECK_OK(tj_cpu_emit_module_for(ctx, &l, &plan, &cfg, "tj", "sapphirerapids", feat, &mod, &info, &err), &err);
        CHECKF(!!info.prep_name[0] == (dot == TJ_CPU_DOT_AMX), "dot %d: prep '%s'", dot, info.prep_name);
        char *msg = NULL;
        LLVMTargetRef t = NULL;
        LLVMMemoryBufferRef obj = NULL;
        if (mod && LLVMGetTargetFromTriple(triple, &t, &msg) == 0) {
            LLVMTargetMachineRef tm = LLVMCreateTargetMachine(t, triple, "sapphirerapids", feat, LLVMCodeGenLevelDefault,
                                                              LLVMRelocPIC, LLVMCodeModelSmall);
            LLVMSetTarget(mod, triple);
            if (LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMObjectFile, &msg, &obj)) obj = NULL;
            LLVMDisposeTargetMachine(tm);
        }
        CHECKF(obj != NULL, "codegen for sapphirerapids: %s", msg ? msg : "no module");
        LLVMDisposeMessage(msg);
        if (obj) {
            int n = count_mnemonic(obj, triple, "sapphirerapids", "vdpbf16ps");
            int nt = count_mnemonic(obj, triple, "sapphirerapids", "tdpbf16ps");
            int ncfg = count_mnemonic(obj, triple, "sapphirerapids", "ldtilecfg");
            int nrel = count_mnemonic(obj, triple, "sapphirerapids", "tilerelease");
            int ncomp = count_mnemonic(obj, triple, "sapphirerapids", "vpcompressw");
            if (dot == TJ_CPU_DOT_DPBF16) CHECKF(n > 0, "dpbf16 kernel: %d vdpbf16ps in the object code", n);
            else CHECKF(n == 0, "%s kernel: %d vdpbf16ps in the object code (expected none)", tj_cpu_dot_name(dot), n);
            if (tj_cpu_dot_amx(dot))
                CHECKF(nt > 0 && ncfg > 0 && nrel > 0, "%s kernel: %d tdpbf16ps, %d ldtilecfg, %d tilerelease", tj_cpu_dot_name(dot), nt, ncfg, nrel);
            else CHECKF(nt == 0 && ncfg == 0, "%d tdpbf16ps, %d ldtilecfg outside the amx kernel", nt, ncfg);
            if (dot == TJ_CPU_DOT_DPBF16 || dot == TJ_CPU_DOT_AMX_X)
                CHECKF(!!ncomp == !kinds[ki].features[0], "%s %s VBMI2: %d vpcompressw", tj_cpu_dot_name(dot), kinds[ki].features[0] ? "without" : "with",
                       ncomp);
            fprintf(stderr, "codegen sapphirerapids dot %s%s: %d vdpbf16ps, %d tdpbf16ps, %d ldtilecfg, %d tilerelease, %d vpcompressw\n",
                    tj_cpu_dot_name(dot), kinds[ki].features, n, nt, ncfg, nrel, ncomp);
            LLVMDisposeMemoryBuffer(obj);
        }
        if (mod) LLVMDisposeModule(mod);
        LLVMContextDispose(ctx);
        tj_plan_free(&plan);
    }
    tj_layer_free(&l);
    free(w);
    free(b);
    LLVMDisposeMessage(triple);
}

/* tj_linear of the model's layer enc.fc1 (layer l with weights lw) on fresh random x [mm × k],
 * poisoned y first: its relative error to the reference (1e9 when a value is not finite). */
static double model_call_error(tj_model *m, const tj_layer *l, const tj_layer_weights *lw, int64_t mm, uint64_t seed)
{
    float *x = malloc((size_t)(mm * l->k) * 4), *y = malloc((size_t)(mm * l->n) * 4), *ref = malloc((size_t)(mm * l->n) * 4);
    tj_rng r = {seed};
    tj_test_fill(&r, x, mm * l->k);
    for (int64_t i = 0; i < mm * l->n; i++) y[i] = NAN;
    int64_t xs[2] = {mm, l->k}, ys[2] = {mm, l->n};
    DLTensor xt = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
    DLTensor yt = {y, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, ys, NULL, 0};
    CHECK(tj_linear(m, "enc.fc1", &xt, &yt, NULL) == TJ_OK);
    tj_reference_linear(l, lw, x, mm, ref);
    double e = tj_test_all_finite(y, mm * l->n) ? tj_test_relerr(y, ref, mm * l->n) : 1e9;
    free(x);
    free(y);
    free(ref);
    return e;
}

/* The model interface (fp32 tensors) over a bf16 layer: x rounded once, bf16 y widened back. */
static void test_model_path(void)
{
    char dir[] = "/tmp/tj_bf16_XXXXXX", pat[600], wts[600];
    if (!mkdtemp(dir)) { CHECK(0); return; }
    snprintf(pat, sizeof pat, "%s/p.json", dir);
    snprintf(wts, sizeof wts, "%s/w.safetensors", dir);
    bcase c = {"enc.fc1", 192, 96, 64, 0.75, 2, 0.02, 0, TJ_ACT_GELU, TJ_BF16, 1};
    tj_layer l;
    void *w = NULL, *b = NULL;
    if (!tj_test_case_make(&c, 77, &l, &w, &b)) { CHECK(0); return; }
    tj_error err;
    tj_pattern p = {.nlayers = 1, .layers = &l};
    CHECK_OK(tj_pattern_save(&p, pat, &err), &err);
    int64_t s0[2] = {c.n, c.k}, b0[1] = {c.n};
    tj_st_out_tensor t[2] = {{"enc.fc1.weight", "BF16", 2, s0, w, (uint64_t)(c.n * c.k) * 2},
                             {"enc.fc1.bias", "BF16", 1, b0, b, (uint64_t)c.n * 2}};
    CHECK_OK(tj_st_write(wts, t, 2, NULL, &err), &err);
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_CPU;
    o.threads = 2;
    tj_context *ctx = NULL;
    tj_model *m = NULL;
    CHECK(tj_context_create(&o, &ctx) == TJ_OK);
    if (ctx) CHECK_OK(tj_context_set_config(ctx, "{\"dtype\": \"bf16\", \"out\": \"bf16\"}", &err), &err);
    if (ctx && tj_model_load(ctx, pat, wts, &m) != TJ_OK) fprintf(stderr, "load: %s\n", tj_context_error(ctx));
    CHECK(m != NULL);
    const char *run_cfg = NULL;
    if (m) CHECK(tj_model_layer_config(m, 0, 16, &run_cfg) == TJ_OK);
    CHECKF(run_cfg && strstr(run_cfg, "\"dtype\": \"bf16\"") && strstr(run_cfg, "\"out\": \"bf16\""), "model runs %s",
           run_cfg ? run_cfg : "(null)");
    tj_layer_weights lw = {w, TJ_BF16, b, TJ_BF16};
    for (int64_t mm = 1; m && mm <= 64; mm *= 4) {
        double e = model_call_error(m, &l, &lw, mm, 500 + (uint64_t)mm);
        CHECKF(e <= LOOSE, "model path M=%lld: relerr %g (bound %g)", (long long)mm, e, LOOSE);
    }
    tj_model_destroy(m);
    tj_context_destroy(ctx);
    /* the precision option (no forced config): f32 on these bf16 weights, bf16 when asked; a
     * value out of range is refused */
    for (int pi = TJ_PRECISION_F32; pi <= TJ_PRECISION_BF16 + 1; pi++) {
        o.precision = (tj_precision)pi;
        ctx = NULL;
        m = NULL;
        tj_status cs = tj_context_create(&o, &ctx);
        if (pi > TJ_PRECISION_BF16) {
            CHECKF(cs == TJ_ERR_INVALID_ARGUMENT && !ctx, "precision %d accepted", pi);
            tj_context_destroy(ctx);
            break;
        }
        CHECK(cs == TJ_OK);
        if (ctx && tj_model_load(ctx, pat, wts, &m) != TJ_OK) fprintf(stderr, "load: %s\n", tj_context_error(ctx));
        CHECK(m != NULL);
        for (int64_t mm = 5; m && mm <= 40; mm += 35) {
            tj_precision got = TJ_PRECISION_AUTO;
            CHECK(tj_model_layer_precision(m, 0, mm, &got) == TJ_OK);
            CHECKF(got == (tj_precision)pi, "asked %s, layer runs %s at M=%lld", tj_precision_name((tj_precision)pi),
                   tj_precision_name(got), (long long)mm);
            double e = model_call_error(m, &l, &lw, mm, 800 + (uint64_t)mm + (uint64_t)pi);
            double bound = pi == TJ_PRECISION_F32 ? TIGHT_F32 : LOOSE; /* f32: the bf16 weights exactly */
            CHECKF(e <= bound, "precision %s M=%lld: relerr %g (bound %g)", tj_precision_name((tj_precision)pi), (long long)mm, e, bound);
        }
        tj_model_destroy(m);
        tj_context_destroy(ctx);
    }
    remove(pat);
    remove(wts);
    rmdir(dir);
    tj_layer_free(&l);
    free(w);
    free(b);
}

/* The decode case through the model and the default precision (auto): SmolLM2-135M's shapes
 * at 50 %, bf16 weights, M = 1..8 (and, with AMX, the tile path from fp32 x at M = 9..64). On a
 * CPU with bf16 instructions every layer must say bf16 and match the reference on the same
 * bf16-rounded x within 1e-5 (and the fp32 reference within 1e-2). */
static void test_decode(int amx)
{
    static const bcase shapes[] = {
        {"model.layers.0.self_attn.q_proj", 576, 576, 128, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_BF16, 0},
        {"model.layers.0.self_attn.k_proj", 192, 576, 64, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_BF16, 0},
        {"model.layers.0.mlp.up_proj", 1536, 576, 128, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_BF16, 1},
        {"model.layers.0.mlp.down_proj", 576, 1536, 128, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_BF16, 0},
    };
    enum { NS = sizeof shapes / sizeof *shapes };
    char dir[] = "/tmp/tj_decode_XXXXXX", pat[600], wts[600];
    if (!mkdtemp(dir)) { CHECK(0); return; }
    snprintf(pat, sizeof pat, "%s/p.json", dir);
    snprintf(wts, sizeof wts, "%s/w.safetensors", dir);
    tj_layer ls[NS];
    void *w[NS], *b[NS];
    tj_st_out_tensor t[2 * NS];
    int64_t shp[NS][2], bsh[NS][1];
    char names[2 * NS][128];
    int nt = 0, ok = 1;
    for (int i = 0; i < NS; i++) {
        ok &= tj_test_case_make(&shapes[i], 300 + (uint64_t)i, &ls[i], &w[i], &b[i]);
        shp[i][0] = shapes[i].n, shp[i][1] = shapes[i].k, bsh[i][0] = shapes[i].n;
        snprintf(names[nt], sizeof names[nt], "%s.weight", shapes[i].what);
        t[nt] = (tj_st_out_tensor){names[nt], "BF16", 2, shp[i], w[i], (uint64_t)(shapes[i].n * shapes[i].k) * 2};
        nt++;
        if (b[i]) {
            snprintf(names[nt], sizeof names[nt], "%s.bias", shapes[i].what);
            t[nt] = (tj_st_out_tensor){names[nt], "BF16", 1, bsh[i], b[i], (uint64_t)shapes[i].n * 2};
            nt++;
        }
    }
    CHECK(ok);
    tj_error err;
    tj_pattern p = {.nlayers = NS, .layers = ls};
    CHECK_OK(tj_pattern_save(&p, pat, &err), &err);
    CHECK_OK(tj_st_write(wts, t, nt, NULL, &err), &err);
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_CPU;
    o.threads = 2;
    tj_context *ctx = NULL;
    tj_model *m = NULL;
    CHECK(tj_context_create(&o, &ctx) == TJ_OK);
    if (ctx && tj_model_load(ctx, pat, wts, &m) != TJ_OK) fprintf(stderr, "load: %s\n", tj_context_error(ctx));
    CHECK(m != NULL);
    int want_bf16 = tj_cpu_host_bf16() || tj_cpu_host_amx();
    static const int64_t big[] = {9, 16, 33, 64};
    for (int i = 0; m && i < NS; i++) {
        const bcase *c = &shapes[i];
        tj_layer_weights lw = {w[i], TJ_BF16, b[i], TJ_BF16};
        for (int mi = 0; mi < 8 + (amx ? 4 : 0); mi++) {
            int64_t mm = mi < 8 ? mi + 1 : big[mi - 8];
            tj_precision pr = TJ_PRECISION_AUTO;
            CHECK(tj_model_layer_precision(m, i, mm, &pr) == TJ_OK);
            CHECKF(pr == (want_bf16 ? TJ_PRECISION_BF16 : TJ_PRECISION_F32), "%s M=%lld: precision %s", c->what, (long long)mm,
                   tj_precision_name(pr));
            float *x = malloc((size_t)(mm * c->k) * 4), *xr = malloc((size_t)(mm * c->k) * 4);
            float *y = malloc((size_t)(mm * c->n) * 4), *ref = malloc((size_t)(mm * c->n) * 4), *ref32 = malloc((size_t)(mm * c->n) * 4);
            tj_rng r = {7000 + 13 * (uint64_t)mm + (uint64_t)i};
            tj_test_fill(&r, x, mm * c->k);
            for (int64_t j = 0; j < mm * c->k; j++) xr[j] = want_bf16 ? tj_bf16_to_f32(tj_f32_to_bf16(x[j])) : x[j];
            for (int64_t j = 0; j < mm * c->n; j++) y[j] = NAN;
            int64_t xs[2] = {mm, c->k}, ys[2] = {mm, c->n};
            DLTensor xt = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
            DLTensor yt = {y, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, ys, NULL, 0};
            CHECK(tj_linear(m, c->what, &xt, &yt, NULL) == TJ_OK);
            tj_reference_linear(&ls[i], &lw, xr, mm, ref);
            tj_reference_linear(&ls[i], &lw, x, mm, ref32);
            int fin = tj_test_all_finite(y, mm * c->n);
            double tight = fin ? tj_test_relerr(y, ref, mm * c->n) : 1e9, loose = fin ? tj_test_relerr(y, ref32, mm * c->n) : 1e9;
            const char *cfg = NULL;
            tj_model_layer_config(m, i, mm, &cfg);
            CHECKF(tight <= TIGHT_F32, "decode %s M=%lld (%s): relerr %g vs the reference on the same bf16 x (bound %g)", c->what,
                   (long long)mm, cfg ? cfg : "default", tight, TIGHT_F32);
            CHECKF(loose <= LOOSE, "decode %s M=%lld: relerr %g vs the fp32 reference (bound %g)", c->what, (long long)mm, loose, LOOSE);
            free(x); free(xr); free(y); free(ref); free(ref32);
        }
    }
    tj_model_destroy(m);
    tj_context_destroy(ctx);
    remove(pat);
    remove(wts);
    rmdir(dir);
    for (int i = 0; i < NS; i++) {
        tj_layer_free(&ls[i]);
        free(w[i]);
        free(b[i]);
    }
}

int main(int argc, char **argv)
{
    int want = argc > 1 && strcmp(argv[1], "dpbf16") == 0 ? TJ_CPU_DOT_DPBF16
             : argc > 1 && strcmp(argv[1], "amx") == 0  ? TJ_CPU_DOT_AMX
                                                        : TJ_CPU_DOT_FMA;
    tj_error err;
    tj_cpu_jit *jit = NULL;
    tj_pool *pool = NULL;
    if (tj_cpu_jit_create(&jit, &err) != TJ_OK) {
        fprintf(stderr, "no LLVM JIT here: %s\n", err.msg);
        return 77;
    }
    if ((want == TJ_CPU_DOT_DPBF16 && !tj_cpu_host_bf16()) || (want == TJ_CPU_DOT_AMX && !tj_cpu_host_amx())) {
        char *cpu = LLVMGetHostCPUName();
        fprintf(stderr, "skipped: this CPU (%s) %s, so the %s kernels cannot run here (their object code is checked by test "
                        "cpu_bf16)\n", cpu, want == TJ_CPU_DOT_AMX ? "has no AMX-BF16, or Linux refused its tile state" : "has no avx512_bf16",
                want == TJ_CPU_DOT_AMX ? "AMX" : "vdpbf16ps");
        LLVMDisposeMessage(cpu);
        tj_cpu_jit_destroy(jit);
        return 77;
    }
    CHECK_OK(tj_pool_create(3, &pool, &err), &err);
    if (want == TJ_CPU_DOT_FMA) {
        test_codegen();
        test_model_path();
        if (!tj_cpu_host_bf16()) test_decode(0); /* here the default stays fp32 */
    } else {
        test_decode(want == TJ_CPU_DOT_AMX);
    }
    int nc, host = tj_cpu_host_vec(), id = 0, ran = 0, skipped = 0;
    const tj_cpu_config *space = tj_cpu_config_space(&nc);
    for (int ci = 0; ci < nc; ci++) {
        tj_cpu_config c = space[ci];
        if (c.dtype != TJ_CPU_ACT_BF16) continue;
        if (c.vec == 0) c.vec = host;
        if (c.dot != want && !(want == TJ_CPU_DOT_AMX && c.dot == TJ_CPU_DOT_AMX_X)) continue; /* "amx": both AMX dots */
        if (c.vec > host || tj_cpu_config_check(&c, NULL) != TJ_OK) {
            skipped++;
            continue;
        }
        check(jit, pool, &c, &id);
        ran++;
    }
    fprintf(stderr, "%d bf16-activation configs run, %d not for this host (vector width or avx512_bf16)\n", ran, skipped);
    CHECK(ran > 0);
    tj_pool_destroy(pool);
    tj_cpu_jit_destroy(jit);
    return tj_test_end();
}
