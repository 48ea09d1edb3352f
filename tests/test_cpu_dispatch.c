/* Per-M dispatch on the CPU backend (suite cpu): a tuning log whose best config differs between
 * M = 1 and M = 64 (each tuned with a one-config space) makes `tilejit model --m` run, and
 * print, the config of the call's M bucket, and every M still matches the reference (the model
 * command checks each layer). Also the serial threshold: a config with "serial" runs the same
 * numbers as the parallel one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/safetensors.h"
#include "pattern/random.h"
#include "pattern/pattern.h"
#include "cli_run.h"
#include "tj_test.h"

int main(void)
{
    const char *exe = getenv("TJ_TILEJIT");
    if (!exe) return 77;
    char dir[512], pat[600], wts[600], c1[600], c2[600], logp[600], out[600];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tj_cpu_dispatch_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return 1;
    snprintf(pat, sizeof pat, "%s/p.json", dir);
    snprintf(wts, sizeof wts, "%s/w.safetensors", dir);
    snprintf(c1, sizeof c1, "%s/c1.json", dir);
    snprintf(c2, sizeof c2, "%s/c2.json", dir);
    snprintf(logp, sizeof logp, "%s/log.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);

    tj_error err;
    tj_layer l;
    tj_random_spec spec = {.n = 256, .k = 192, .g = 64, .sparsity = 0.75, .mode = 1, .seed = 21, .act = TJ_ACT_GELU};
    CHECK_OK(tj_random_layer(&spec, "fc", &l, &err), &err);
    tj_pattern p = {1, &l};
    CHECK_OK(tj_pattern_save(&p, pat, &err), &err);
    tj_rng rng = {17};
    float *w = malloc(256 * 192 * sizeof *w), bias[256];
    tj_test_fill(&rng, w, 256 * 192);
    tj_test_fill(&rng, bias, 256);
    int64_t sw[2] = {256, 192}, sb[1] = {256};
    tj_st_out_tensor t[2] = {{"fc.weight", "F32", 2, sw, w, sizeof(float) * 256 * 192},
                             {"fc.bias", "F32", 1, sb, bias, sizeof bias}};
    CHECK_OK(tj_st_write(wts, t, 2, NULL, &err), &err);

    /* two configs that fit any host (4 × 8 floats: AVX2 and AVX-512 alike), told apart by unroll */
    FILE *f = fopen(c1, "w");
    fputs("[{\"mr\":4,\"nr\":8,\"vec\":8,\"unroll\":3,\"serial\":-1}]", f);
    fclose(f);
    f = fopen(c2, "w");
    fputs("[{\"mr\":2,\"nr\":8,\"vec\":8,\"unroll\":5,\"serial\":1000000}]", f);
    fclose(f);
    int rc = tj_test_sh("'%s' tune '%s' --weights '%s' --backend cpu --configs '%s' --m 1 --confirm 0 --min-time 0.01 "
                        "--log '%s' > '%s' 2>&1 && '%s' tune '%s' --weights '%s' --backend cpu --configs '%s' --m 64 "
                        "--confirm 0 --min-time 0.01 --log '%s' >> '%s' 2>&1",
                        exe, pat, wts, c1, logp, out, exe, pat, wts, c2, logp, out);
    CHECKF(rc == 0, "tune failed: see %s", out);
    static const struct { int m; const char *want; } runs[] = {
        {1, "\"unroll\": 3"}, {2, "\"unroll\": 3"}, {16, "\"unroll\": 5"}, {100, "\"unroll\": 5"}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        rc = tj_test_sh("'%s' model '%s' --weights '%s' --backend cpu --m %d --min-time 0.01 --tuning-log '%s' "
                        "--cache-dir '%s/cache' > '%s' 2>&1",
                        exe, pat, wts, runs[i].m, logp, dir, out);
        CHECKF(rc == 0, "model --m %d failed: see %s", runs[i].m, out);
        CHECKF(tj_test_count_lines(out, runs[i].want) == 1 && tj_test_count_lines(out, "config at M =") == 1,
               "model --m %d did not run the config with %s: see %s", runs[i].m, runs[i].want, out);
    }
    free(w);
    tj_layer_free(&l);
    if (!tj_test_failures) tj_test_sh("rm -rf '%s'", dir);
    return tj_test_end();
}
