/* The CPU side of `tilejit bench` (cli/bench_cpu.c): the CPU backend's kernel against dense
 * OpenBLAS cblas_sgemm. Built only with LLVM. */
#ifndef TJ_BENCH_CPU_H
#define TJ_BENCH_CPU_H

/* `tilejit bench --backend cpu ...`: argv[0] is "bench"; parses every option itself (--help).
 * Returns the exit code; the last stdout line on success is
 * `speedup <ratio> tilejit_ms <ms> dense_ms <ms> kept_gflops <GFLOP/s>`. */
int bench_cpu(int argc, char **argv);

#endif
