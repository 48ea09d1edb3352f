/* bench/: the GPU benchmark's entry points in a build without the CUDA toolkit: they say so. */
#include <stdio.h>

#include "base/error.h"

int tj_bench_cuda_main(int argc, char **argv, FILE *out, FILE *errs)
{
    (void)argc;
    (void)argv;
    (void)out;
    fprintf(errs, "tilejit bench: the cuda backend is not built into this tilejit (configured without the CUDA toolkit)\n");
    return 1;
}

tj_status tj_bench_cuda_time_layer(tj_model *m, int64_t layer, int64_t M, double min_time, double *tilejit_s,
                                   double *dense_s, tj_error *err)
{
    (void)m;
    (void)layer;
    (void)M;
    (void)min_time;
    if (tilejit_s) *tilejit_s = -1;
    if (dense_s) *dense_s = -1;
    return tj_fail(err, TJ_ERR_UNSUPPORTED, "this build has no CUDA toolkit");
}
