/* The GPU side of the `tilejit bench` and `tilejit model` commands (cli/bench_cuda.c): tilejit's
 * kernels timed with CUDA events against dense cuBLAS (cublasGemmEx, tensor cores) on the same
 * data. Built only with the CUDA toolkit; cuBLAS is linked into the CLI alone, never the library. */
#ifndef TJ_BENCH_CUDA_H
#define TJ_BENCH_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "tilejit.h"

/* `tilejit bench --backend cuda ...`: argv[0] is "bench"; every option of the command is parsed
 * here (see its --help). Returns the exit code; the last stdout line on success is
 * `speedup <ratio> tilejit_us <µs> dense_us <µs> kept_tflops <TFLOP/s>`. */
int bench_cuda(int argc, char **argv);

/* The hook of `tilejit model` (cli/cmd_model.c): times layer `layer` of a model loaded on the cuda
 * backend with device-resident fp16 X [M × k] and fp32 Y [M × n] (tj_linear_ex, row-major), and
 * cublasGemmEx on the same dense shape (fp16 in, fp32 accumulate and out). Medians in seconds per
 * call over at least min_time seconds. Returns 0, or nonzero with a message in err. */
int tj_cli_cuda_time_layer(tj_model *m, int64_t layer, int64_t M, double min_time, double *tilejit_s,
                           double *dense_s, char *err, size_t errlen);

#endif
