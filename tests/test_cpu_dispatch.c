/* Per-M dispatch on the CPU backend (suite cpu): a tuning log whose best config differs between
 * M = 1 and M = 64 (each tuned with a one-config space) makes `tilejit model --m` run, and
 * print, the config of the call's M bucket, and every M still matches the reference (the model
 * command checks each layer). Also the serial threshold: a config with "serial" runs the same
 * numbers as the parallel one; and the two variants, which differ only in code, share one packed
 * copy of the weights (the load note of -v). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "tj_model.h"

int main(void)
{
    const char *exe = getenv("TJ_TILEJIT");
    if (!exe) return 77;
    char dir[512], c1[600], c2[600], logp[600], out[600];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tj_cpu_dispatch_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return 1;
    snprintf(c1, sizeof c1, "%s/c1.json", dir);
    snprintf(c2, sizeof c2, "%s/c2.json", dir);
    snprintf(logp, sizeof logp, "%s/log.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    tj_test_model mdl;
    if (tj_test_model_make(&mdl, dir, 21, 17, TJ_ACT_GELU)) return 1;
    const char *pat = mdl.pat, *wts = mdl.wts;

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
    /* the two configs differ only in code (mr, unroll, serial): one packed copy of the weights */
    rc = tj_test_sh("'%s' model '%s' --weights '%s' --backend cpu --m 3 --min-time 0.01 --tuning-log '%s' "
                    "--cache-dir '%s/cache' -v > '%s' 2>&1",
                    exe, pat, wts, logp, dir, out);
    CHECKF(rc == 0 && tj_test_count_lines(out, "(2 kernels)") >= 1 && tj_test_count_lines(out, "packed layouts 1,") >= 1 &&
               tj_test_count_lines(out, "packed layouts 2,") == 0,
           "model -v did not share the packing between its two variants: see %s", out);
    tj_test_model_free(&mdl);
    if (!tj_test_failures) tj_test_sh("rm -rf '%s'", dir);
    return tj_test_end();
}
