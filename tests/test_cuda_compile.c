/* NVRTC compiles of the emitted CUDA C (no GPU needed): every template × a spread of configs for
 * sm_80, sm_86, sm_89 and sm_90 on odd-shaped layers; default configs of BERT-base shapes without
 * spills; deterministic source; the golden source of tests/fixtures/cuda_emit_tiny; compile
 * errors carry NVRTC's log. Suite 'cuda'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/emit_cuda.h"
#include "jit/nvrtc.h"
#include "pattern/random.h"
#include "tj_test.h"

static const int archs[] = {80, 86, 89, 90};
#define NARCH 4

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

static int write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(s, 1, strlen(s), f) == strlen(s);
    return fclose(f) == 0 && ok;
}

/* Compiles src for every arch in parallel; checks success, kernels present, spills if asked. */
static void compile_all_archs(const char *what, const char *src, int want_no_spills, int has_ew)
{
    tj_nvrtc_job jobs[NARCH];
    memset(jobs, 0, sizeof jobs);
    for (int a = 0; a < NARCH; a++) {
        jobs[a].source = src;
        jobs[a].label = what;
        jobs[a].sm = archs[a];
    }
    tj_error err = {0};
    tj_status st = tj_nvrtc_compile_all(NULL, jobs, NARCH, 0, &err);
    CHECKF(st == TJ_OK, "%s: %s", what, err.msg);
    for (int a = 0; a < NARCH; a++) {
        const tj_cubin *b = &jobs[a].result;
        if (jobs[a].status != TJ_OK) continue;
        int tiles = 0, fill = 0, ew = 0;
        for (int k = 0; k < b->nkernels; k++) {
            tiles += strcmp(b->kernels[k].name, "tj_tiles") == 0 && b->kernels[k].registers > 0;
            fill += strcmp(b->kernels[k].name, "tj_fill") == 0;
            ew += strcmp(b->kernels[k].name, "tj_ew") == 0;
        }
        CHECKF(b->size > 0 && tiles == 1 && fill == 1 && ew == has_ew, "%s sm_%d: kernels tiles %d fill %d ew %d; log:\n%s",
               what, archs[a], tiles, fill, ew, b->log);
        if (want_no_spills)
            CHECKF(b->spill_bytes == 0, "%s sm_%d: %lld spill bytes; log:\n%s", what, archs[a], (long long)b->spill_bytes,
                   b->log);
        tj_cubin_free(&jobs[a].result);
    }
}

static void test_config_spread(void)
{
    static const char *configs[] = {
        "{}",
        "{\"offsets\":\"unrolled\"}",
        "{\"dtype\":\"bf16\",\"out\":\"bf16\",\"layout\":\"rm\"}",
        "{\"bm\":64,\"bn\":32,\"bk\":16,\"warps\":2,\"stages\":2,\"out\":\"f16\",\"layout\":\"rm_fm\"}",
        "{\"bm\":16,\"bn\":64,\"bk\":64,\"warps\":4,\"stages\":4,\"offsets\":\"unrolled\",\"layout\":\"fm_rm\"}",
        "{\"bm\":256,\"bn\":64,\"bk\":32,\"warps\":16,\"stages\":2,\"dtype\":\"bf16\"}",
        "{\"template\":\"simt\",\"bm\":32,\"bn\":64,\"warps\":4}",
        "{\"template\":\"simt\",\"bm\":64,\"bn\":16,\"warps\":8,\"offsets\":\"unrolled\",\"dtype\":\"bf16\",\"out\":\"f16\",\"layout\":\"rm\"}",
    };
    /* Odd shapes: g not a power of 2, a short last tile, column pruning, ew, empty tiles. */
    tj_random_spec spec = {.n = 1000, .k = 333, .g = 96, .sparsity = 0.7, .mode = 2, .seed = 11, .ew_fraction = 0.01,
                           .empty_tile_fraction = 0.2, .act = TJ_ACT_GELU};
    tj_layer l;
    tj_error err = {0};
    CHECK_OK(tj_random_layer(&spec, "odd", &l, &err), &err);
    for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
        tj_cuda_config cfg = tj_cuda_config_default(&l);
        CHECK_OK(tj_cuda_config_from_json(configs[c], &cfg, &err), &err);
        char *src = NULL;
        CHECK_OK(tj_cuda_emit(&l, &cfg, &src, &err), &err);
        if (!src) continue;
        char what[256];
        snprintf(what, sizeof what, "odd layer %s", configs[c]);
        compile_all_archs(what, src, 0, 1);
        free(src);
    }
    tj_layer_free(&l);
}

/* Default configs of the BERT-base GEMM shapes at 75 %: no spills on any arch, and the default
 * config's shared memory fits every arch. */
static void test_defaults_no_spills(void)
{
    static const int shapes[][2] = {{3072, 768}, {768, 3072}, {768, 768}};
    for (int s = 0; s < 3; s++) {
        tj_random_spec spec = {.n = shapes[s][0], .k = shapes[s][1], .g = 128, .sparsity = 0.75, .mode = 1,
                               .seed = 5 + (uint64_t)s, .act = s == 0 ? TJ_ACT_GELU : TJ_ACT_NONE};
        tj_layer l;
        tj_error err = {0};
        CHECK_OK(tj_random_layer(&spec, "bert", &l, &err), &err);
        tj_cuda_config c = tj_cuda_config_default(&l);
        for (int a = 0; a < NARCH; a++) CHECK(tj_cuda_smem_bytes(&c) <= tj_cuda_arch_smem_limit(archs[a]));
        for (int mode = 0; mode < 2; mode++) {
            c.offsets = mode ? TJ_CUDA_OFFSETS_UNROLLED : TJ_CUDA_OFFSETS_TABLE;
            char *src = NULL;
            CHECK_OK(tj_cuda_emit(&l, &c, &src, &err), &err);
            if (!src) continue;
            char what[128];
            snprintf(what, sizeof what, "default %dx%d %s", shapes[s][0], shapes[s][1], mode ? "unrolled" : "table");
            compile_all_archs(what, src, 1, 0);
            free(src);
        }
        tj_layer_free(&l);
    }
}

static void test_deterministic(void)
{
    tj_random_spec spec = {.n = 300, .k = 200, .g = 64, .sparsity = 0.6, .mode = 2, .seed = 3, .ew_fraction = 0.02};
    tj_layer a, b;
    tj_error err = {0};
    CHECK_OK(tj_random_layer(&spec, "first.name", &a, &err), &err);
    CHECK_OK(tj_random_layer(&spec, "another.name", &b, &err), &err);
    for (int mode = 0; mode < 2; mode++) {
        tj_cuda_config c = tj_cuda_config_default(&a);
        c.offsets = mode ? TJ_CUDA_OFFSETS_UNROLLED : TJ_CUDA_OFFSETS_TABLE;
        char *s1 = NULL, *s2 = NULL, *s3 = NULL;
        CHECK_OK(tj_cuda_emit(&a, &c, &s1, &err), &err);
        CHECK_OK(tj_cuda_emit(&a, &c, &s2, &err), &err);
        CHECK_OK(tj_cuda_emit(&b, &c, &s3, &err), &err); /* same pattern, other name: same text */
        CHECK(s1 && s2 && s3 && strcmp(s1, s2) == 0 && strcmp(s1, s3) == 0);
        CHECK(s1 && strstr(s1, "pattern hash 0x") && strstr(s1, "config {\"template\":\"mma\""));
        free(s1);
        free(s2);
        free(s3);
    }
    /* A different config changes the text. */
    tj_cuda_config c1 = tj_cuda_config_default(&a), c2 = c1;
    c2.stages = 2;
    char *s1 = NULL, *s2 = NULL;
    CHECK_OK(tj_cuda_emit(&a, &c1, &s1, &err), &err);
    CHECK_OK(tj_cuda_emit(&a, &c2, &s2, &err), &err);
    CHECK(s1 && s2 && strcmp(s1, s2) != 0);
    free(s1);
    free(s2);
    /* The config round-trips through JSON. */
    tj_strbuf sb;
    tj_sb_init(&sb);
    c2.tmpl = TJ_CUDA_TEMPLATE_MMA;
    c2.dtype = TJ_BF16;
    c2.x_fm = 0;
    tj_cuda_config_to_json(&c2, &sb);
    tj_cuda_config c3 = tj_cuda_config_default(NULL);
    CHECK_OK(tj_cuda_config_from_json(sb.data, &c3, &err), &err);
    CHECK(memcmp(&c2, &c3, sizeof c2) == 0);
    tj_sb_free(&sb);
    /* Bad configs are clear errors. */
    CHECK(tj_cuda_config_from_json("{\"bm\":100}", &c3, &err) == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "bm 100"));
    c3 = tj_cuda_config_default(&a);
    CHECK(tj_cuda_config_from_json("{\"offsets\":\"baked\"}", &c3, &err) == TJ_ERR_INVALID_ARGUMENT &&
          strstr(err.msg, "unrolled"));
    CHECK(tj_cuda_config_from_json("{\"bmm\":1}", &c3, &err) == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "bmm"));
    CHECK(tj_cuda_config_from_json("{\"bm\":256,\"bn\":256,\"warps\":1}", &c3, &err) == TJ_ERR_INVALID_ARGUMENT);
    tj_layer_free(&a);
    tj_layer_free(&b);
}

static void test_golden(void)
{
    const char *fx = getenv("TJ_FIXTURES");
    char dir[2048], path[2300];
    snprintf(dir, sizeof dir, "%s/cuda_emit_tiny", fx ? fx : "tests/fixtures");
    snprintf(path, sizeof path, "%s/pattern.json", dir);
    tj_pattern *p = NULL;
    tj_error err = {0};
    CHECK_OK(tj_pattern_load(path, &p, &err), &err);
    if (!p) return;
    static const char *cases[] = {"table", "unrolled"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/config_%s.json", dir, cases[i]);
        char *cfg_text = read_text(path);
        CHECKF(cfg_text != NULL, "cannot read %s", path);
        if (!cfg_text) continue;
        tj_cuda_config c = tj_cuda_config_default(&p->layers[0]);
        CHECK_OK(tj_cuda_config_from_json(cfg_text, &c, &err), &err);
        char *src = NULL;
        CHECK_OK(tj_cuda_emit(&p->layers[0], &c, &src, &err), &err);
        snprintf(path, sizeof path, "%s/expected_%s.cu", dir, cases[i]);
        if (getenv("TJ_REGEN_GOLDEN") && src) CHECK(write_text(path, src));
        char *want = read_text(path);
        CHECKF(want && src && strcmp(want, src) == 0,
               "emitted source differs from %s (TJ_REGEN_GOLDEN=1 rewrites it after an intended change)", path);
        if (src) compile_all_archs(path, src, 1, 1);
        free(want);
        free(src);
        free(cfg_text);
    }
    tj_pattern_destroy(p);
}

static void test_compile_error_log(void)
{
    tj_cubin b;
    tj_error err = {0};
    tj_status st = tj_nvrtc_compile(NULL, "extern \"C\" __global__ void k() { this is not cuda; }\n", "broken", 90, &b, &err);
    CHECK(st == TJ_ERR_COMPILE);
    CHECKF(strstr(err.msg, "nvrtcCompileProgram") && strstr(err.msg, "broken") && strstr(err.msg, "error"),
           "message: %s", err.msg);
    /* A log longer than an error message: its head, and the way to get all of it. */
    tj_strbuf sb;
    tj_sb_init(&sb);
    for (int i = 0; i < 200; i++) tj_sb_printf(&sb, "extern \"C\" __global__ void k%d() { undefined_thing_%d(); }\n", i, i);
    st = tj_nvrtc_compile(NULL, sb.data, "long", 90, &b, &err);
    CHECK(st == TJ_ERR_COMPILE && strstr(err.msg, "undefined_thing_0") && strstr(err.msg, "log truncated") &&
          strstr(err.msg, "TILEJIT_DUMP_DIR"));
    tj_sb_free(&sb);
}

/* TILEJIT_DUMP_DIR: source, options and log of each compiled unit. */
static void test_dump_dir(void)
{
    char dir[] = "/tmp/tj-dump-test-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    setenv("TILEJIT_DUMP_DIR", dir, 1);
    tj_cubin b;
    tj_error err = {0};
    CHECK_OK(tj_nvrtc_compile(NULL, "extern \"C\" __global__ void k(float *p) { p[threadIdx.x] = 1.0f; }\n",
                              "dump/me", 80, &b, &err), &err);
    unsetenv("TILEJIT_DUMP_DIR");
    tj_cubin_free(&b);
    static const char *ext[] = {".cu", ".options", ".log"};
    for (int i = 0; i < 3; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/dump_me.sm_80%s", dir, ext[i]);
        char *text = read_text(path);
        CHECKF(text != NULL, "missing %s", path);
        if (text && i == 0) CHECK(strstr(text, "p[threadIdx.x]") != NULL);
        if (text && i == 1) CHECK(strstr(text, "--gpu-architecture=sm_80") != NULL);
        if (text && i == 2) CHECK(strstr(text, "Used") != NULL);
        free(text);
        unlink(path);
    }
    rmdir(dir);
}

static void test_ptxas_parse(void)
{
    const char *log =
        "ptxas info    : 0 bytes gmem, 64 bytes cmem[3]\n"
        "ptxas info    : Compiling entry function 'tj_tiles' for 'sm_90'\n"
        "ptxas info    : Function properties for tj_tiles\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 8 bytes cumulative stack size, 1024 bytes smem, 400 bytes cmem[0]\n"
        "ptxas info    : Function properties for tj_ofs_fn0\n"
        "    64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Compiling entry function 'tj_fill' for 'sm_90'\n"
        "ptxas info    : Function properties for tj_fill\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 15 registers, used 0 barriers, 400 bytes cmem[0]\n";
    tj_cubin b;
    memset(&b, 0, sizeof b);
    tj_ptxas_parse(log, &b);
    CHECK(b.nkernels == 2);
    CHECK(strcmp(b.kernels[0].name, "tj_tiles") == 0 && b.kernels[0].registers == 168 && b.kernels[0].smem_static == 1024);
    CHECK(b.kernels[0].spill_stores == 4 && b.kernels[0].spill_loads == 12 && b.kernels[0].stack == 8);
    CHECK(strcmp(b.kernels[1].name, "tj_fill") == 0 && b.kernels[1].registers == 15);
    CHECK(b.spill_bytes == 16);
}

int main(void)
{
    test_ptxas_parse();
    test_dump_dir();
    test_deterministic();
    test_golden();
    test_compile_error_log();
    test_defaults_no_spills();
    test_config_spread();
    return tj_test_end();
}
