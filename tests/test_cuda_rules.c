/* The CUDA launch rules that more than one place applies, each defined once in gen/emit_cuda.c:
 * - whether a config runs on an arch (tj_cuda_config_fits_arch: the runtime against its device,
 *   tj_compile_pattern against a named arch): the wgmma kernel needs sm_90, and the shared memory
 *   must fit;
 * - the persistent grid (tj_cuda_tiles_grid_limit, tj_cuda_tiles_grid: the runtime and the host
 *   executor) and TILEJIT_CUDA_GRID (tj_cuda_grid_mode_parse).
 * Needs neither a GPU nor NVRTC: every failure here comes before a compile. */
#include <string.h>

#include "gen/emit_cuda.h"
#include "pattern/random.h"
#include "tilejit/compile.h"
#include "tj_test.h"

static tj_cuda_config wgmma_config(void)
{
    tj_cuda_config c = tj_cuda_config_default(NULL);
    c.tmpl = TJ_CUDA_TEMPLATE_WGMMA;
    c.bm = 128;
    c.bn = 64;
    c.bk = 64;
    c.warps = 4;
    c.stages = 4;
    return c;
}

/* An mma config of 6 stages of 64 rows: 208896 bytes, more than sm_80 or sm_86 allow. */
static tj_cuda_config big_mma_config(void)
{
    tj_cuda_config c = tj_cuda_config_default(NULL);
    c.bk = 64;
    c.stages = 6;
    return c;
}

static void test_fits(void)
{
    tj_error err;
    tj_cuda_config w = wgmma_config(), big = big_mma_config(), def = tj_cuda_config_default(NULL);
    CHECK_OK(tj_cuda_config_check(&w, &err), &err);
    CHECK_OK(tj_cuda_config_check(&big, &err), &err);
    CHECK(tj_cuda_smem_bytes(&big) == 208896);

    CHECK_OK(tj_cuda_config_fits_arch(&w, 90, tj_cuda_arch_smem_limit(90), NULL, &err), &err);
    CHECK(tj_cuda_config_fits_arch(&w, 86, tj_cuda_arch_smem_limit(86), NULL, &err) == TJ_ERR_INVALID_ARGUMENT);
    CHECKF(strcmp(err.msg, "cuda config: the wgmma kernel needs compute capability 9.0 (sm_90a), not sm_86") == 0, "%s",
           err.msg);
    CHECK(tj_cuda_config_fits_arch(&w, 89, 1 << 30, "Fake GPU", &err) == TJ_ERR_INVALID_ARGUMENT);
    CHECKF(strcmp(err.msg, "cuda config: the wgmma kernel needs compute capability 9.0 (sm_90a); Fake GPU is sm_89") == 0,
           "%s", err.msg);
    /* wgmma's shared memory is checked too, after the arch */
    CHECK(tj_cuda_config_fits_arch(&w, 90, tj_cuda_smem_bytes(&w) - 1, "Fake GPU", &err) == TJ_ERR_INVALID_ARGUMENT &&
          strstr(err.msg, "Fake GPU allows"));

    CHECK_OK(tj_cuda_config_fits_arch(&big, 90, tj_cuda_arch_smem_limit(90), NULL, &err), &err);
    CHECK_OK(tj_cuda_config_fits_arch(&big, 90, 208896, "Fake GPU", &err), &err); /* exactly the limit */
    CHECK(tj_cuda_config_fits_arch(&big, 80, tj_cuda_arch_smem_limit(80), NULL, &err) == TJ_ERR_INVALID_ARGUMENT);
    CHECKF(strcmp(err.msg, "cuda config needs 208896 bytes of shared memory per block; sm_80 allows 166912 "
                           "(fewer stages or a smaller bk)") == 0, "%s", err.msg);
    CHECK(tj_cuda_config_fits_arch(&big, 90, 208895, "Fake GPU", &err) == TJ_ERR_INVALID_ARGUMENT &&
          strstr(err.msg, "; Fake GPU allows 208895 "));
    for (int sm = 80; sm <= 90; sm++)
        CHECKF(tj_cuda_config_fits_arch(&def, sm, tj_cuda_arch_smem_limit(sm), NULL, &err) == TJ_OK, "sm_%d: %s", sm,
               err.msg);
}

/* tj_compile_pattern applies the same check to every named arch before compiling anything. */
static void test_compile_rejects(void)
{
    tj_random_spec spec = {.n = 128, .k = 96, .g = 64, .sparsity = 0.5, .mode = 1, .seed = 3};
    tj_layer l;
    tj_error err;
    CHECK_OK(tj_random_layer(&spec, "fc", &l, &err), &err);
    tj_pattern p = {1, &l};
    static const struct {
        const char *config;
        int arch;
        const char *msg;
    } cases[] = {
        {"{\"template\":\"wgmma\",\"bm\":128,\"bn\":64,\"bk\":64,\"warps\":4,\"stages\":4}", 86,
         "layer 'fc': cuda config: the wgmma kernel needs compute capability 9.0 (sm_90a), not sm_86"},
        {"{\"bk\":64,\"stages\":6}", 86, /* bn 64 (g 64): 6 stages x 64 rows x (72 + 136) x 2 bytes */
         "layer 'fc': cuda config needs 159744 bytes of shared memory per block; sm_86 allows 101376"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int archs[2] = {90, cases[i].arch};
        tj_compile_options o = tj_compile_options_default();
        o.archs = archs;
        o.narchs = 2;
        o.config_json = cases[i].config;
        tj_compile_report *r = NULL;
        tj_status s = tj_compile_pattern(&p, &o, &r, &err);
        CHECKF(s == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, cases[i].msg), "case %zu: %d %s", i, (int)s, err.msg);
        tj_compile_report_destroy(r);
    }
    tj_layer_free(&l);
}

/* --arch sm_90a (issue 25): the arch-specific target parses, and a pattern compiles for it with the
 * default config and with the wgmma config (whose kernels need it); sm_80a is no target. */
static void test_arch_specific(void)
{
    int archs[4];
    CHECK(tj_arch_parse("sm_90a", archs, 4) == 1 && archs[0] == (90 | TJ_ARCH_SPECIFIC));
    CHECK(tj_arch_parse("sm_80,sm_90a,sm_90", archs, 4) == 3 && archs[0] == 80 && archs[1] == (90 | TJ_ARCH_SPECIFIC) &&
          archs[2] == 90);
    static const char *bad[] = {"sm_80a", "sm_90b", "sm_90aa", "sm_a", "sm_90 a"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECKF(tj_arch_parse(bad[i], archs, 4) == -1, "'%s'", bad[i]);
    if (!tj_backend_built(TJ_BACKEND_CUDA)) return; /* compiling needs NVRTC */
    tj_random_spec spec = {.n = 128, .k = 96, .g = 64, .sparsity = 0.5, .mode = 1, .seed = 4};
    tj_layer l;
    tj_error err;
    CHECK_OK(tj_random_layer(&spec, "fc", &l, &err), &err);
    tj_pattern p = {1, &l};
    static const char *configs[] = {NULL, "{\"template\":\"wgmma\",\"bm\":128,\"bn\":64,\"bk\":64,\"warps\":4,\"stages\":4}"};
    for (int i = 0; i < 2; i++) {
        int a = 90 | TJ_ARCH_SPECIFIC;
        tj_compile_options o = tj_compile_options_default();
        o.archs = &a;
        o.narchs = 1;
        o.config_json = configs[i];
        tj_compile_report *r = NULL;
        tj_status s = tj_compile_pattern(&p, &o, &r, &err);
        CHECKF(s == TJ_OK && r && r->count == 1 && r->kernels[0].sm == (90 | TJ_ARCH_SPECIFIC) && r->kernels[0].status == TJ_OK,
               "sm_90a, config %s: %s", configs[i] ? configs[i] : "default", err.msg);
        tj_compile_report_destroy(r);
    }
    tj_layer_free(&l);
}

static void test_grid(void)
{
    tj_cuda_grid_mode g = tj_cuda_grid_mode_parse(NULL);
    CHECK(!g.full && g.cap == 0);
    g = tj_cuda_grid_mode_parse("full");
    CHECK(g.full && g.cap == 0);
    g = tj_cuda_grid_mode_parse("3");
    CHECK(!g.full && g.cap == 3);
    static const char *none[] = {"", "0", "-2", "fu", "FULL"};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
        g = tj_cuda_grid_mode_parse(none[i]);
        CHECKF(!g.full && g.cap == 0, "'%s'", none[i]);
    }

    const tj_cuda_grid_mode persistent = {0, 0}, full = {1, 0}, cap3 = {0, 3}, cap500 = {0, 500}, full_cap5 = {1, 5};
    const tj_cuda_template mma = TJ_CUDA_TEMPLATE_MMA, simt = TJ_CUDA_TEMPLATE_SIMT, wgmma = TJ_CUDA_TEMPLATE_WGMMA;
    CHECK(tj_cuda_tiles_grid_limit(mma, persistent, 132, 2) == 264);  /* SMs x resident blocks */
    CHECK(tj_cuda_tiles_grid_limit(simt, persistent, 132, 3) == 396);
    CHECK(tj_cuda_tiles_grid_limit(mma, persistent, 0, 2) == 2);      /* an SM count <= 0 counts as 1 */
    CHECK(tj_cuda_tiles_grid_limit(mma, persistent, 132, 0) == 0);    /* occupancy 0: the full grid */
    CHECK(tj_cuda_tiles_grid_limit(mma, full, 132, 2) == 0);
    CHECK(tj_cuda_tiles_grid_limit(mma, cap3, 132, 2) == 3);
    CHECK(tj_cuda_tiles_grid_limit(mma, cap500, 132, 2) == 264);      /* a cap above the resident blocks */
    CHECK(tj_cuda_tiles_grid_limit(mma, cap3, 132, 0) == 3);
    CHECK(tj_cuda_tiles_grid_limit(mma, full_cap5, 132, 2) == 5);
    CHECK(tj_cuda_tiles_grid_limit(wgmma, persistent, 132, 2) == 0);  /* no work loop: always the full grid */
    CHECK(tj_cuda_tiles_grid_limit(wgmma, cap3, 132, 2) == 0);

    CHECK(tj_cuda_tiles_grid(100, 0) == 100);
    CHECK(tj_cuda_tiles_grid(100, 3) == 3);
    CHECK(tj_cuda_tiles_grid(2, 3) == 2);
    CHECK(tj_cuda_tiles_grid(264, 264) == 264);
}

int main(void)
{
    test_fits();
    test_compile_rejects();
    test_arch_specific();
    test_grid();
    return tj_test_end();
}
