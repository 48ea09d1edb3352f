/* Every CUDA kernel configuration the tuner may choose (the "cuda" search space of autotune/ on
 * sm_90, its largest), executed on the CPU by the host executor and compared with the reference:
 * each config on a ragged random layer (M, n, k not multiples of the tile sizes, empty tiles,
 * kept counts not multiples of 16; tw1, tw2 with column scatter, tew with the ew kernel; bias or
 * none; no activation, relu, gelu) with input dtype, output dtype, x/y layouts and offset mode
 * spread over the configs, at two token counts (below one block on the full grid, and a ragged
 * second block on a persistent grid of 1-3 blocks, so every block runs several work items).
 * Usage: test_gpuexec_kernels [--shard I/N] [--limit K]   (shards split the configs) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autotune/autotune.h"
#include "hx_layer.h"
#include "hx_ptx.h"
#include "pattern/random.h"
#include "tj_test.h"

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The pattern kinds, each made ragged for tile width g. */
static tj_random_spec pattern_for(int kind, int64_t g, uint64_t seed)
{
    tj_random_spec s = {0};
    s.g = g;
    s.seed = seed;
    switch (kind) {
    case 0: /* tw1, a third of the tiles empty, no activation */
        s.n = 2 * g + g / 2 + 5, s.k = 77, s.sparsity = 0.55, s.mode = 1, s.empty_tile_fraction = 0.34;
        s.act = TJ_ACT_NONE;
        break;
    case 1: /* tw2: pruned output features scattered through cols; many chunks */
        s.n = 3 * g - 7, s.k = 300, s.sparsity = 0.75, s.mode = 2, s.act = TJ_ACT_RELU;
        break;
    case 2: /* tew: tw1 + ew entries, gelu deferred to the ew kernel */
        s.n = 2 * g + 3, s.k = 73, s.sparsity = 0.6, s.mode = 1, s.ew_fraction = 0.03, s.act = TJ_ACT_GELU;
        break;
    default: /* tw2 + ew + relu, empty tiles */
        s.n = 2 * g - 3, s.k = 130, s.sparsity = 0.7, s.mode = 2, s.ew_fraction = 0.02, s.act = TJ_ACT_RELU;
        s.empty_tile_fraction = 0.25;
        break;
    }
    return s;
}

static const char *const out_names[] = {"f32", "f16", "bf16"};
static const char *const layout_names[] = {"fm", "rm", "rm_fm", "fm_rm"};

int main(int argc, char **argv)
{
    int shard = 0, nshards = 1, limit = -1;
    const char *only = NULL; /* --only TEXT: the configs whose JSON contains TEXT (by hand) */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--shard") == 0 && i + 1 < argc) sscanf(argv[++i], "%d/%d", &shard, &nshards);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
        else if (strcmp(argv[i], "--limit") == 0 && i + 1 < argc) limit = atoi(argv[++i]);
    }
    const char *cxx = getenv("TJ_HX_CXX");
    if (!cxx || !*cxx) {
        printf("no clang++ for the host executor: skipped\n");
        return 77;
    }
    tj_error err = {0};
    tj_hx_exec *e = NULL;
    CHECK_OK(tj_hx_exec_create(&e, &err), &err);
    if (!e) return tj_test_end();
    CHECK_OK(tj_hx_layer_origins(e, &err), &err);

    tj_tune_host host;
    tj_tune_host_for("cuda", "sm_90", NULL, &host);
    host.g = 128; /* bn in {32, 64, 128}: the union of every tile width's space */
    tj_tune_space space;
    CHECK_OK(tj_tune_space_build("cuda", &host, &space, &err), &err);
    printf("cuda space (sm_90, g 128): %lld configs; shard %d/%d\n", (long long)space.count, shard, nshards);

    /* dtype, out and layout: the configs of each (template, offsets) class take the 24
     * combinations in turn, so that the whole space covers every combination (and each shard
     * knows the assignment without running the others' configs) */
    int cover[3][2][2][3][4]; /* template (simt, mma, wgmma), offsets, dtype, out, layout */
    memset(cover, 0, sizeof cover);
    int *combo = calloc((size_t)(space.count ? space.count : 1), sizeof *combo);
    int turn[3][2] = {{0, 0}, {0, 0}, {0, 0}};
    for (int64_t i = 0; combo && i < space.count; i++) {
        int tm = strstr(space.json[i], "\"wgmma\"") ? 2 : strstr(space.json[i], "\"mma\"") != NULL;
        int unrolled = strstr(space.json[i], "\"unrolled\"") != NULL;
        /* wgmma gathers feature-major x only: layouts fm and fm_rm (12 combinations) */
        combo[i] = tm == 2 ? (turn[tm][unrolled]++ * 5) % 12 : (turn[tm][unrolled]++ * 7) % 24; /* prime to 24, 12 */
        if (tm == 2 && combo[i] >= 6) combo[i] += 12; /* layout index 3: fm_rm */
        cover[tm][unrolled][combo[i] % 2][combo[i] / 2 % 3][combo[i] / 6]++;
    }
    int missing = 0;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 2; b++)
            for (int d = 0; d < 2; d++)
                for (int o = 0; o < 3; o++)
                    for (int y = 0; y < 4; y++)
                        missing += turn[a][b] > 0 && (a < 2 || y == 0 || y == 3) && cover[a][b][d][o][y] == 0;
    /* (the CUDA space has no unrolled offsets: autotune/space.c says why) */
    CHECKF(combo && missing == 0, "%d template/offsets/dtype/out/layout combinations of the space not in the sweep", missing);
    int configs = 0, runs = 0, compiled = 0, persistent_runs = 0;
    double compile_s = 0, run_s = 0;
    int64_t collectives = 0, barriers = 0, accesses = 0;
    for (int64_t i = shard; combo && i < space.count && (limit < 0 || configs < limit); i += nshards) {
        if (only && !strstr(space.json[i], only)) continue;
        uint64_t h = mix((uint64_t)i * 7919u + 17u);
        tj_cuda_config c;
        memset(&c, 0, sizeof c);
        c = tj_cuda_config_default(NULL);
        char json[512];
        int dt = combo[i] % 2, out = combo[i] / 2 % 3, lay = combo[i] / 6;
        /* the space's point plus what the runtime decides: dtype, out, layout */
        snprintf(json, sizeof json, "%.*s,\"dtype\":\"%s\",\"out\":\"%s\",\"layout\":\"%s\"}",
                 (int)strlen(space.json[i]) - 1, space.json[i], dt ? "bf16" : "f16", out_names[out], layout_names[lay]);
        tj_status st = tj_cuda_config_from_json(json, &c, &err);
        CHECKF(st == TJ_OK, "%s: %s", json, err.msg);
        if (st) continue;
        /* the tile width: bn itself, twice bn, 3·32 = 96 (not a power of 2) or 128 */
        int64_t gs[4] = {c.bn, 2 * c.bn <= 256 ? 2 * c.bn : c.bn, c.bn == 32 ? 96 : c.bn, 128};
        int64_t g = gs[h >> 25 & 3];
        if (g % c.bn) g = c.bn;
        int kind = (int)(h >> 27 & 3);
        tj_random_spec spec = pattern_for(kind, g, h >> 32 | 1);
        tj_layer l;
        CHECK_OK(tj_random_layer(&spec, "sweep", &l, &err), &err);
        configs++;

        /* every asm statement of the source has a host twin */
        char *src = NULL;
        CHECK_OK(tj_cuda_emit(&l, &c, &src, &err), &err);
        if (src) {
            char first[512];
            int total = 0, bad = tj_hx_ptx_check_forms(src, &total, first, sizeof first);
            CHECKF(bad == 0 && total > 0, "%s: %d of %d asm statements have no host twin, first: %s", json, bad, total, first);
            free(src);
        }

        int ms[2] = {1 + (int)(h >> 40 & 0xffff) % c.bm, c.bm + 1 + (int)(h >> 48 & 0xff) % (c.bm / 2 + 1)};
        for (int r = 0; r < 2; r++) {
            /* the second run, 2 M blocks, on a persistent grid of 1-3 blocks: each block loops over
             * several work items through the same shared memory */
            tj_hx_layer_case k = {.m = ms[r], .seed = h + (uint64_t)r, .bias = (h >> 56 & 3) != 0,
                                  .ldx_pad = (int)(h >> 58 & 3) * 3, .ldy_pad = (int)(h >> 60 & 1),
                                  .grid = r ? 1 + (int)(h >> 20 & 0xff) % 3 : 0};
            tj_hx_layer_result res;
            st = tj_hx_layer_run(e, NULL, &l, &c, &k, &res, &err);
            runs++;
            compiled += res.compiled;
            compile_s += res.compile_s;
            run_s += res.run_s;
            collectives += res.stats.collectives;
            barriers += res.stats.barriers;
            accesses += res.stats.accesses;
            double rel, max;
            tj_hx_layer_tolerance(&c, &rel, &max);
            persistent_runs += k.grid > 0 && tj_cuda_template_persistent(c.tmpl);
            CHECKF(st == TJ_OK, "%s g%lld kind %d M=%d grid %d: %s", json, (long long)g, kind, k.m, k.grid, err.msg);
            if (st) break;
            CHECKF(res.nonfinite == 0 && res.pad_writes == 0 && res.rel_err <= rel && res.max_err <= max,
                   "%s g%lld kind %d M=%d: %lld outputs not finite, %lld padding elements written, rel err %.3g "
                   "(bound %.3g), max err %.3g (bound %.3g), grid %d", json, (long long)g, kind, k.m, (long long)res.nonfinite,
                   (long long)res.pad_writes, res.rel_err, rel, res.max_err, max, k.grid);
        }
        tj_layer_free(&l);
    }
    printf("%d configs, %d runs (%d on a persistent grid of 1-3 blocks; %d modules compiled, %.1f s compiling and loading, %.1f s running); %lld warp "
           "collectives, %lld barriers, %lld checked accesses; every template/offsets/dtype/out/layout combination of the space "
           "are in the whole sweep\n",
           configs, runs, persistent_runs, compiled, compile_s, run_s, (long long)collectives, (long long)barriers, (long long)accesses);
    CHECK(configs > 0);
    free(combo);
    tj_tune_space_free(&space);
    tj_hx_exec_destroy(e);
    return tj_test_end();
}
