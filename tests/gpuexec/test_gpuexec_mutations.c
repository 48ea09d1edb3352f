/* The mutation check of the host executor: known-bad edits to the CUDA templates (each a real
 * class of GPU bug), each run on a small case through the executor; every one must be caught
 * (a report of the executor, a wrong or missing output, a write into y's padding, or an inline
 * PTX statement without its host twin). The unedited templates must pass the same cases. An
 * edit whose text is no longer in the templates fails the test, so the list stays maintained.
 * Prints "N of N mutations caught". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hx_layer.h"
#include "hx_ptx.h"
#include "pattern/random.h"
#include "tj_test.h"

typedef struct mutation {
    const char *name;
    const char *file;
    const char *from, *to; /* the first occurrence of `from` becomes `to` */
    int kase;              /* index into cases[] */
} mutation;

typedef struct test_case {
    const char *config;
    tj_random_spec spec;
    tj_hx_layer_case k;
} test_case;

/* M = 37: a ragged second block of 32 tokens; ldy 38 (even: paired stores) and 37 (odd). */
static const test_case cases[] = {
    /* 0: mma, fp16 out, tw2 (scatter) + ew + relu, 3 stages */
    {"{\"template\":\"mma\",\"bm\":32,\"bn\":32,\"bk\":16,\"warps\":2,\"stages\":3,\"out\":\"f16\",\"layout\":\"fm\"}",
     {.n = 90, .k = 150, .g = 32, .sparsity = 0.7, .mode = 2, .seed = 11, .ew_fraction = 0.03, .act = TJ_ACT_RELU},
     {.m = 37, .seed = 5, .bias = 1, .ldx_pad = 0, .ldy_pad = 1}},
    /* 1: mma, fp32 out, bf16, 4 warps (2 x 2), tw1 + gelu, ldy = M (no padding: neighbours are outputs) */
    {"{\"template\":\"mma\",\"bm\":64,\"bn\":32,\"bk\":32,\"warps\":4,\"stages\":2,\"dtype\":\"bf16\",\"layout\":\"fm\"}",
     {.n = 70, .k = 200, .g = 32, .sparsity = 0.6, .mode = 1, .seed = 12, .act = TJ_ACT_GELU},
     {.m = 37, .seed = 6, .bias = 1, .ldx_pad = 0, .ldy_pad = 0}},
    /* 2: simt, row-major x and y, tw1 with empty tiles + ew */
    {"{\"template\":\"simt\",\"bm\":32,\"bn\":32,\"bk\":16,\"warps\":4,\"layout\":\"rm\"}",
     {.n = 75, .k = 90, .g = 32, .sparsity = 0.5, .mode = 1, .seed = 13, .ew_fraction = 0.03, .empty_tile_fraction = 0.3,
      .act = TJ_ACT_RELU},
     {.m = 37, .seed = 7, .bias = 1, .ldx_pad = 3, .ldy_pad = 1}},
    /* 3: mma, row-major x (the fused transpose), unrolled offsets, fp16 in and out */
    {"{\"template\":\"mma\",\"bm\":32,\"bn\":32,\"bk\":32,\"warps\":2,\"stages\":2,\"out\":\"f16\",\"layout\":\"rm_fm\","
     "\"offsets\":\"unrolled\"}",
     {.n = 64, .k = 120, .g = 32, .sparsity = 0.6, .mode = 2, .seed = 14, .act = TJ_ACT_NONE},
     {.m = 37, .seed = 8, .bias = 1, .ldx_pad = 5, .ldy_pad = 1}},
    /* 4: mma on a persistent grid of 3 blocks: 7 tiles x 2 M blocks = 14 work items, ~5 per block,
     * each reusing the pipeline stages of the one before */
    {"{\"template\":\"mma\",\"bm\":32,\"bn\":32,\"bk\":16,\"warps\":2,\"stages\":3,\"out\":\"f16\",\"layout\":\"fm\"}",
     {.n = 200, .k = 150, .g = 32, .sparsity = 0.6, .mode = 1, .seed = 15, .act = TJ_ACT_RELU},
     {.m = 37, .seed = 9, .bias = 1, .ldx_pad = 0, .ldy_pad = 1, .grid = 3}},
    /* 5: simt on a persistent grid of 2 blocks */
    {"{\"template\":\"simt\",\"bm\":32,\"bn\":32,\"bk\":16,\"warps\":4,\"layout\":\"fm\"}",
     {.n = 150, .k = 90, .g = 32, .sparsity = 0.5, .mode = 2, .seed = 16, .act = TJ_ACT_NONE},
     {.m = 37, .seed = 10, .bias = 1, .ldx_pad = 0, .ldy_pad = 1, .grid = 2}},
    /* 6: wgmma, two 64-token groups (LBO used), 3 stages over 5+ chunks (phases wrap), tw2 + ew + relu,
     * fp16 out; M = 150: a ragged second block */
    {"{\"template\":\"wgmma\",\"bm\":128,\"bn\":64,\"bk\":16,\"warps\":4,\"stages\":3,\"out\":\"f16\",\"layout\":\"fm\"}",
     {.n = 140, .k = 200, .g = 64, .sparsity = 0.6, .mode = 2, .seed = 21, .ew_fraction = 0.02, .act = TJ_ACT_RELU},
     {.m = 150, .seed = 9, .bias = 1, .ldx_pad = 0, .ldy_pad = 1}},
    /* 7: wgmma, bf16, tile width 96 (a 32-feature item: weight pieces past the tile are zero stores),
     * fp32 row-major out, gelu */
    {"{\"template\":\"wgmma\",\"bm\":64,\"bn\":64,\"bk\":32,\"warps\":4,\"stages\":2,\"dtype\":\"bf16\",\"layout\":\"fm_rm\"}",
     {.n = 190, .k = 150, .g = 96, .sparsity = 0.5, .mode = 1, .seed = 22, .act = TJ_ACT_GELU},
     {.m = 70, .seed = 10, .bias = 1, .ldx_pad = 0, .ldy_pad = 1}},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

static const mutation mutations[] = {
    {"ldmatrix lane-to-row mapping of A (weights)", "tiles_mma.cu",
     "(unsigned)((((lane & 7) + ((lane >> 4) << 3)) * TJ_WS_LD", "(unsigned)((((lane & 7) + (((lane >> 3) & 1) << 3)) * TJ_WS_LD", 0},
    {"ldmatrix lane-to-column mapping of B (tokens)", "tiles_mma.cu",
     "wm * TJ_WTM + (lane >> 4) * 8) * 2);", "wm * TJ_WTM + ((lane >> 3) & 1) * 8) * 2);", 1},
    {"cp.async.wait_group removed from the pipeline loop", "tiles_mma.cu", "        tj_cp_wait<TJ_STAGES - 2>();\n", "", 0},
    {"__syncthreads removed from the pipeline loop", "tiles_mma.cu", "        __syncthreads(); /* chunk c landed",
     "        /* chunk c landed", 0},
    {"__syncthreads in divergent code (warp 0 only)", "tiles_mma.cu", "        __syncthreads(); /* chunk c landed",
     "        if (warp == 0) __syncthreads(); /* chunk c landed", 1},
    {"ldmatrix skipped by one lane (a diverged .sync.aligned collective)", "tiles_mma.cu",
     "++i) tj_ldsm_x4_t_s(af[i], ", "++i) if (lane != 5) tj_ldsm_x4_t_s(af[i], ", 0},
    {"off by one on the ragged M edge of the epilogue", "prelude.cu", "    if (m + 1 < a.m) tj_finish(a, n, m + 1, acc1);",
     "    if (m + 1 <= a.m) tj_finish(a, n, m + 1, acc1);", 0},
    {"wrong pipeline stage read", "tiles_mma.cu", "int sc = 0, sn = TJ_STAGES - 1;", "int sc = 1, sn = TJ_STAGES - 1;", 0},
    {"prefetch distance one too far", "tiles_mma.cu", "tj_load_chunk(a, it, m0, c + TJ_STAGES - 1,", "tj_load_chunk(a, it, m0, c + TJ_STAGES,", 1},
    {"swapped operands of cvt.rn.f16x2 (tokens m, m+1 exchanged)", "prelude.cu", "tj_cvt_rn_f16x2(v1, v0)",
     "tj_cvt_rn_f16x2(v0, v1)", 0},
    {"cvt.rn.f16x2 PTX operands swapped without its host twin", "prelude.cu",
     "asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\"", "asm(\"cvt.rn.f16x2.f32 %0, %2, %1;\"", 0},
    {"zero-fill dropped: past-the-end rows skipped instead of zero-filled", "tiles_mma.cu",
     "tj_cp16_s(xs + (unsigned)(lr * TJ_XS_LD + seg * 8) * 2u, a.x + (bytes ? k * a.ldx + mm : 0), bytes);",
     "if (bytes) tj_cp16_s(xs + (unsigned)(lr * TJ_XS_LD + seg * 8) * 2u, a.x + k * a.ldx + mm, bytes);",
     0},
    {"wrong bias index", "prelude.cu", "float v = acc + (a.bias ? a.bias[n] : 0.0f);",
     "float v = acc + (a.bias ? a.bias[n + 1] : 0.0f);", 0},
    {"shared-memory row padding breaks 16-byte alignment", "tiles_mma.cu", "#define TJ_SPAD 8", "#define TJ_SPAD 4", 0},
    {"kept-row index decoded from the wrong slot", "prelude.cu",
     "return (int)((w >> ((r % TJ_OFS_PER_WORD) * TJ_OFS_BITS))",
     "return (int)((w >> (((r + 1) % TJ_OFS_PER_WORD) * TJ_OFS_BITS))", 2}, /* tj_ofs_get: the simt kernel's decoder */
    {"row-major x: transposed load past M not masked", "tiles_mma.cu",
     "const unsigned hi = rok && mm + e + 1 < a.m ?", "const unsigned hi = rok && mm + e + 1 <= a.m ?", 3},
    {"simt: feature index of the accumulation", "tiles_simt.cu", "if (col < it.width) acc[f] = fmaf(tj_in_to_f32(wr[col]), xv, acc[f]);",
     "if (col < it.width) acc[f] = fmaf(tj_in_to_f32(wr[col + 1]), xv, acc[f]);", 2},
    {"ew kernel: activation not applied after the residual", "ew.cu", "tj_store_out(a.y, yi, tj_act(v));",
     "tj_store_out(a.y, yi, v);", 2},
    {"persistent grid: work-item loop strides one past the grid (items skipped)", "tiles_mma.cu",
     "for (unsigned w = blockIdx.x; w < nwork; w += gridDim.x) {", "for (unsigned w = blockIdx.x; w < nwork; w += gridDim.x + 1) {", 4},
    {"persistent grid: no barrier between work items (the next prologue refills stages still read)", "tiles_mma.cu",
     "        __syncthreads(); /* every warp is done with the stages", "        /* every warp is done with the stages", 4},
    {"persistent grid: work item split by the wrong M-block count", "tiles_mma.cu",
     "const tj_item it = tj_items[w / umb];", "const tj_item it = tj_items[w / (umb + 1)];", 4},
    {"simt persistent grid: every block starts at work item 0", "tiles_simt.cu",
     "for (unsigned w = blockIdx.x; w < nwork; w += gridDim.x) {", "for (unsigned w = 0; w < nwork; w += gridDim.x) {", 5},
    {"fill kernel: token bound dropped", "fill_ew.cu", "if (i >= a.n_fill || m >= a.m) return;",
     "if (i >= a.n_fill) return;", 0},
    /* the wgmma path (sm_90a) */
    {"wgmma: descriptor swizzle mode 64-byte instead of 128-byte", "hopper.cu", "#define TJ_WG_SWIZZLE 1 /* 128-byte swizzle */",
     "#define TJ_WG_SWIZZLE 2 /* 128-byte swizzle */", 6},
    {"wgmma: tiles stored unswizzled", "tiles_wgmma.cu", "return (unsigned)(line * TJ_WG_LINE + ((seg ^ (line & 7)) << 4));",
     "return (unsigned)(line * TJ_WG_LINE + (seg << 4));", 7},
    {"wgmma: fence.proxy.async missing before the generic-proxy bytes are read", "tiles_wgmma.cu",
     "        tj_fence_proxy_async();      /* ... and", "        /* ... and", 6},
    {"wgmma: descriptor stride byte offset (SBO) wrong", "tiles_wgmma.cu", "#define TJ_WG_SBO 1024", "#define TJ_WG_SBO 2048", 7},
    {"wgmma: descriptor leading byte offset (LBO) wrong", "tiles_wgmma.cu", "#define TJ_WG_LBO (TJ_BK * TJ_WG_LINE) ",
     "#define TJ_WG_LBO (TJ_BK * TJ_WG_LINE / 2) ", 6},
    {"wgmma: mbarrier phase bit flipped", "tiles_wgmma.cu", "(unsigned)(c / TJ_STAGES) & 1u);",
     "(unsigned)(c / TJ_STAGES + 1) & 1u);", 6},
    {"wgmma: wgmma.wait_group removed", "tiles_wgmma.cu", "        tj_wg_wait<0>();\n", "", 7},
    {"wgmma: wait_group 1 (a group left in flight) while the next refill targets its stage", "tiles_wgmma.cu",
     "        tj_wg_wait<0>();\n", "        tj_wg_wait<1>();\n", 6},
    {"wgmma: expect_tx counts whole rows (bytes never arrive)", "tiles_wgmma.cu", "(unsigned)(rows * wsegs * 16)",
     "(unsigned)(rows * 8 * 16)", 7},
    {"wgmma: mbarrier.init not fenced for the async proxy", "tiles_wgmma.cu",
     "        tj_fence_proxy_async(); /* the initialised barriers", "        /* the initialised barriers", 6},
    {"wgmma: zero stores past the tile dropped", "tiles_wgmma.cu",
     "            *(uint4 *)(gp + (dst - s0)) = make_uint4(0u, 0u, 0u, 0u);", "            (void)gp;", 7},
};
#define NMUT ((int)(sizeof mutations / sizeof *mutations))

static const char *const files[] = {"prelude.cu", "tiles_mma.cu", "hopper.cu", "tiles_wgmma.cu", "tiles_simt.cu",
                                    "fill_ew.cu", "ew.cu"};
#define NFILES 7

static char *originals[NFILES];

static int write_text(const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    ok &= fclose(f) == 0;
    return ok ? 0 : -1;
}

/* Runs case k with the templates in dir. Returns 0 clean, 1 caught (why in `why`), -1 the case
 * could not run at all (a compile error: the mutation is broken, not caught). */
static int run_case(tj_hx_exec *e, int kase, char *why, size_t cap)
{
    const test_case *t = &cases[kase];
    tj_error err = {0};
    tj_layer l;
    if (tj_random_layer(&t->spec, "mutant", &l, &err)) {
        snprintf(why, cap, "pattern: %.300s", err.msg);
        return -1;
    }
    tj_cuda_config c = tj_cuda_config_default(&l);
    int rc = 0;
    char *src = NULL;
    if (tj_cuda_config_from_json(t->config, &c, &err) || tj_cuda_emit(&l, &c, &src, &err)) {
        snprintf(why, cap, "emit: %.300s", err.msg);
        rc = -1;
        goto done;
    }
    char first[256];
    int total = 0;
    if (tj_hx_ptx_check_forms(src, &total, first, sizeof first)) {
        snprintf(why, cap, "inline PTX without a host twin: %.200s", first);
        rc = 1;
        goto done;
    }
    tj_hx_layer_result res;
    tj_status st = tj_hx_layer_run(e, NULL, &l, &c, &t->k, &res, &err);
    if (st == TJ_ERR_COMPILE) {
        snprintf(why, cap, "does not compile: %.300s", err.msg);
        rc = -1;
        goto done;
    }
    if (st) {
        const char *nl = strchr(err.msg, '\n');
        snprintf(why, cap, "executor: %.300s", nl ? nl + 1 : err.msg);
        char *cut = strchr(why, '\n');
        if (cut) *cut = '\0';
        rc = 1;
        goto done;
    }
    double rel, max;
    tj_hx_layer_tolerance(&c, &rel, &max);
    if (res.nonfinite || res.pad_writes || res.rel_err > rel || res.max_err > max) {
        snprintf(why, cap, "output: %lld not finite, %lld padding elements written, rel err %.3g, max err %.3g",
                 (long long)res.nonfinite, (long long)res.pad_writes, res.rel_err, res.max_err);
        rc = 1;
    }
done:
    free(src);
    tj_layer_free(&l);
    return rc;
}

int main(void)
{
    const char *cxx = getenv("TJ_HX_CXX");
    const char *srcdir = getenv("TJ_TEMPLATES_SRC");
    if (!cxx || !*cxx || !srcdir) {
        printf("no clang++ or TJ_TEMPLATES_SRC: skipped\n");
        return 77;
    }
    tj_error err = {0};
    /* the templates as shipped, then a private copy to edit */
    for (int i = 0; i < NFILES; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", srcdir, files[i]);
        FILE *f = fopen(path, "rb");
        CHECKF(f != NULL, "%s: %s", path, strerror(errno));
        if (!f) return tj_test_end();
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        originals[i] = calloc((size_t)n + 1, 1);
        CHECK(originals[i] && fread(originals[i], 1, (size_t)n, f) == (size_t)n);
        fclose(f);
    }
    char dir[] = "/tmp/tj_mutants_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    for (int i = 0; i < NFILES; i++) CHECK(write_text(dir, files[i], originals[i]) == 0);
    setenv("TILEJIT_TEMPLATE_DIR", dir, 1);
    tj_hx_exec *e = NULL;
    CHECK_OK(tj_hx_exec_create(&e, &err), &err);
    if (!e) return tj_test_end();

    char why[1024];
    for (int k = 0; k < NCASES; k++) {
        int rc = run_case(e, k, why, sizeof why);
        CHECKF(rc == 0, "case %d fails on the unedited templates: %s", k, why);
    }

    int caught = 0;
    for (int i = 0; i < NMUT; i++) {
        const mutation *mu = &mutations[i];
        int fi = -1;
        for (int j = 0; j < NFILES; j++)
            if (strcmp(files[j], mu->file) == 0) fi = j;
        const char *at = fi >= 0 ? strstr(originals[fi], mu->from) : NULL;
        CHECKF(at != NULL, "mutation '%s': its text is no longer in %s: update the mutation", mu->name, mu->file);
        if (!at) continue;
        size_t pre = (size_t)(at - originals[fi]), fl = strlen(mu->from), tl = strlen(mu->to);
        size_t total = strlen(originals[fi]) - fl + tl;
        char *edited = malloc(total + 1);
        memcpy(edited, originals[fi], pre);
        memcpy(edited + pre, mu->to, tl);
        strcpy(edited + pre + tl, at + fl);
        CHECK(write_text(dir, mu->file, edited) == 0);
        tj_hx_layer_origins(e, &err);
        int rc = run_case(e, mu->kase, why, sizeof why);
        CHECK(write_text(dir, mu->file, originals[fi]) == 0);
        free(edited);
        if (rc == 1) caught++;
        printf("%s: %s\n    %s\n", rc == 1 ? "caught" : rc == 0 ? "MISSED" : "BROKEN", mu->name,
               rc == 0 ? "(every check passed)" : why);
        CHECKF(rc != -1, "mutation '%s' is broken (does not build): update it", mu->name);
        CHECKF(rc != 0, "mutation '%s' was not caught", mu->name);
    }
    printf("%d of %d mutations caught\n", caught, NMUT);
    CHECK(caught == NMUT && NMUT >= 8);
    for (int i = 0; i < NFILES; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
        free(originals[i]);
    }
    rmdir(dir);
    tj_hx_exec_destroy(e);
    return tj_test_end();
}
