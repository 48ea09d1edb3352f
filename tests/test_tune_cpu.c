/* Autotuner on the CPU backend (suite cpu): a real sweep (JIT, check, timing) where one config is
 * rejected by the backend (compile_error), one computes wrongly and one hangs; then `tilejit run
 * --tuning-log -v` must load the tuned config and say so, and still match the reference. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "autotune/autotune.h"
#include "runtime/model.h"
#include "base/npy.h"
#include "gen/emit_llvm.h"
#include "cli_run.h"
#include "tj_model.h"


int main(void)
{
    const char *exe = getenv("TJ_TILEJIT");
    if (!exe) return 77;
    char dir[512], cfgs[600], logp[600], out[600], xin[600], yout[600];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tj_tune_cpu_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return 1;
    snprintf(cfgs, sizeof cfgs, "%s/c.json", dir);
    snprintf(logp, sizeof logp, "%s/log.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(xin, sizeof xin, "%s/x.npy", dir);
    snprintf(yout, sizeof yout, "%s/y.npy", dir);
    tj_error err;
    tj_test_model mdl;
    if (tj_test_model_make(&mdl, dir, 11, 9, TJ_ACT_RELU)) return 1;
    const char *pat = mdl.pat, *wts = mdl.wts;
    tj_rng rng = {10};

    /* mr 16 × nr 64 cannot fit the registers: the backend refuses it (compile_error) */
    FILE *f = fopen(cfgs, "w");
    /* the first config is sized to the host's vector registers (AVX-512: 32 zmm, AVX2: 16 ymm) */
    fputs(tj_cpu_host_vec() >= 16 ? "[{\"mb\":0,\"mr\":12,\"nr\":32,\"offsets\":\"table\",\"unroll\":4},"
                                  : "[{\"mb\":0,\"mr\":6,\"nr\":16,\"offsets\":\"table\",\"unroll\":4},", f);
    fputs(
          "{\"mb\":0,\"mr\":4,\"nr\":16,\"offsets\":\"unrolled\",\"unroll\":8},"
          "{\"mr\":16,\"nr\":64},{\"mr\":2,\"nr\":16,\"_inject\":\"wrong\"},{\"mr\":6,\"nr\":16,\"_inject\":\"hang\"}]", f);
    fclose(f);
    int rc = tj_test_sh("'%s' tune '%s' --weights '%s' --backend cpu --configs '%s' --m 40 --timeout 10 --min-time 0.02 "
                "--log '%s' > '%s' 2>&1", exe, pat, wts, cfgs, logp, out);
    CHECKF(rc == 0, "tune failed: see %s", out);
    /* the two good configs, then confirmed in 3 more rounds each */
    CHECK(tj_test_count_lines(logp, "\"status\":\"ok\"") == 8);
    CHECK(tj_test_count_lines(logp, "\"status\":\"compile_error\"") == 1 && tj_test_count_lines(logp, "vector registers") == 1);
    CHECK(tj_test_count_lines(logp, "\"status\":\"wrong_result\"") == 1);
    CHECK(tj_test_count_lines(logp, "\"status\":\"timeout\"") == 1);
    CHECK(tj_test_count_lines(logp, "\"compiler\":\"LLVM 19") == 11);

    /* run with the log: the tuned config is used (-v says which) and the result is right */
    float *x = malloc(40 * 192 * sizeof *x);
    tj_test_fill(&rng, x, 40 * 192);
    CHECK_OK(tj_npy_write(xin, TJ_F32, 40, 192, x, &err), &err);
    rc = tj_test_sh("'%s' run '%s' --weights '%s' --layer fc --input '%s' --output '%s' --backend cpu --tuning-log '%s' -v "
            "> '%s' 2>&1", exe, pat, wts, xin, yout, logp, out);
    CHECK(rc == 0);
    CHECKF(tj_test_count_lines(out, "tuning: layer 'fc'") == 1 && tj_test_count_lines(out, "match: device, pattern") == 1, "see %s", out);
    tj_npy y = {0};
    CHECK_OK(tj_npy_read(yout, &y, &err), &err);
    float *yref = malloc(40 * 256 * sizeof *yref);
    tj_layer_weights lw = {mdl.w, TJ_F32, mdl.bias, TJ_F32};
    tj_reference_linear(&mdl.layer, &lw, x, 40, yref);
    CHECK(y.data && y.rows == 40 && y.cols == 256 && tj_test_relerr(y.data, yref, 40 * 256) < 1e-5);
    tj_npy_free(&y);
    /* a missing log is one clear error */
    rc = tj_test_sh("'%s' run '%s' --weights '%s' --layer fc --input '%s' --output '%s' --backend cpu --tuning-log '%s/none' "
            "> '%s' 2>&1", exe, pat, wts, xin, yout, dir, out);
    CHECK(rc == 1 && tj_test_count_lines(out, "none") == 1);
    free(x);
    free(yref);
    tj_test_model_free(&mdl);
    if (!tj_test_failures) tj_test_sh("rm -rf '%s'", dir);
    return tj_test_end();
}
