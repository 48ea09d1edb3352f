/* tilejit/bench.h — the one "check against the reference, then time" harness that the
 * benchmarks, `tilejit model`, the tuner and the examples use: the clock, the error bound per
 * compute dtype, the reference on a loaded model's layer, and the timing loop. And the GPU
 * benchmark driver (bench/cuda.c) behind `tilejit bench --backend cuda`. docs/c-api.md. */
#include "tilejit.h"
#ifndef TILEJIT_BENCH_H
#define TILEJIT_BENCH_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic seconds (CLOCK_MONOTONIC): the one clock of tilejit. */
TJ_API double tj_now(void);

/* ---- the check ---------------------------------------------------------------------------- */

/* The bound on the relative error ‖y − y_ref‖₂ / ‖y_ref‖₂ a backend's output must meet, by the
 * element type its products are computed in (inputs rounded to it, fp32 accumulation):
 *   TJ_F32  1e-5  (CPU and reference backends; sums in another order)
 *   TJ_F16  2e-3  (GPU tensor-core path: x and w rounded to fp16, 11-bit mantissa)
 *   TJ_BF16 1e-2  (x and w rounded to bf16, 8-bit mantissa)
 * docs/architecture.md says why these values. */
TJ_API double tj_check_bound(tj_dtype compute);
/* ‖y − ref‖₂ / ‖ref‖₂ over n values (‖y − ref‖₂ when ref is all zero); INFINITY when any y is
 * not finite (unwritten outputs poisoned with NaN show up). */
TJ_API double tj_rel_error(const float *y, const float *ref, int64_t n);
/* The reference result of layer `layer` of a loaded model (whatever its backend): plain loops,
 * fp32 accumulation. x: fp32 row-major [rows × k]; y: fp32 row-major [rows × n], fully written. */
TJ_API tj_status tj_model_reference(tj_model *m, int64_t layer, const float *x, int64_t rows, float *y);
/* The layer's weights as stored in the file (unmasked), converted to fp32 row-major [n × k]:
 * what a dense baseline multiplies by. */
TJ_API tj_status tj_model_dense_weights(tj_model *m, int64_t layer, float *w);
/* The layer's bias as fp32 [n]: TJ_OK, or TJ_ERR_NOT_FOUND when it has none (bias untouched). */
TJ_API tj_status tj_model_dense_bias(tj_model *m, int64_t layer, float *bias);
/* The rows a check samples from a batch of m: all of them up to 64, else the first and last 8
 * and 16 in between drawn from seed. Writes at most 64 indices; returns the count. */
TJ_API int64_t tj_check_rows(int64_t m, uint64_t seed, int64_t rows[64]);
/* Checks y (fp32 row-major [m × n], the output of tj_linear on x, fp32 row-major [m × k])
 * against the reference on the rows tj_check_rows(m, seed) picks; *rel_error gets the relative
 * error (INFINITY if any checked output is not finite). Returns TJ_OK if it was computed. */
TJ_API tj_status tj_model_check(tj_model *m, int64_t layer, const float *x, const float *y, int64_t rows_m,
                                uint64_t seed, double *rel_error);

/* ---- the timing loop ---------------------------------------------------------------------- */

typedef struct tj_time_options {
    size_t size;        /* sizeof(tj_time_options); set by tj_time_options_default */
    double warmup_s;    /* warm-up calls until this much time (at least 2 calls); default 0.05 */
    double min_time_s;  /* keep sampling until this much timed time; default 0.2 */
    int min_reps;       /* and at least this many samples; default 5 */
    int max_reps;       /* at most this many samples; default 10000 */
    int64_t batch;      /* calls per sample; 0: sized from the warm-up so a sample takes about
                         * min_time_s / 10 (for calls too short to time one by one); default 1 */
} tj_time_options;

TJ_API tj_time_options tj_time_options_default(void);

/* One call of the timed work; nonzero stops the loop as a failure. */
typedef int (*tj_timed_fn)(void *user);

typedef struct tj_timing {
    double median_s;    /* median over samples of seconds per call */
    int64_t samples;    /* samples taken */
    int64_t calls;      /* timed calls made (samples × batch) */
    int64_t batch;
} tj_timing;

/* Warms up, then takes samples; each sample is the mean seconds per call of `batch` calls. If
 * times is not NULL, the last max_times samples are kept there in order (*ntimes of them).
 * Returns TJ_ERR_INTERNAL if a call failed (fn's own error tells why). */
TJ_API tj_status tj_time_calls(tj_timed_fn fn, void *user, const tj_time_options *o, tj_timing *out,
                               double *times, int max_times, int *ntimes);

/* ---- the GPU benchmark driver ------------------------------------------------------------- */

/* `tilejit bench --backend cuda ...`: argv[0] is "bench"; parses every option (see its --help),
 * writes the report to out and messages to errs. Returns the exit code; the last line on
 * success is `speedup <ratio> tilejit_us <µs> dense_us <µs> kept_tflops <TFLOP/s>`. Needs a
 * build with the CUDA toolkit (else prints why and returns 1). */
TJ_API int tj_bench_cuda_main(int argc, char **argv, FILE *out, FILE *errs);

/* Times layer `layer` of a model loaded on the cuda backend with device-resident fp16 X [M × k]
 * and fp32 Y [M × n] (tj_linear_ex, row-major), and cublasGemmEx on the same dense shape (fp16
 * in, fp32 accumulate and out). Medians in seconds per call over at least min_time seconds. */
TJ_API tj_status tj_bench_cuda_time_layer(tj_model *m, int64_t layer, int64_t M, double min_time,
                                          double *tilejit_s, double *dense_s, tj_error *err);

/* ---- the CPU benchmark driver and its dense baselines --------------------------------------- */

/* `tilejit bench --backend cpu ...` (bench/cpu.c): argv[0] is "bench"; parses every option (see
 * its --help), writes the report to out and messages to errs. Returns the exit code; the last
 * line on success is `speedup <ratio> tilejit_ms <ms> dense_ms <ms> kept_gflops <GFLOP/s> ...`.
 * Needs a build with LLVM (else prints why and returns 1). */
TJ_API int tj_bench_cpu_main(int argc, char **argv, FILE *out, FILE *errs);

/* Dense CPU baselines for `tilejit bench` and `tilejit model` (bench/dense_cpu.c): oneDNN matmul
 * (fp32 and bf16, libdnnl.so.3 opened with dlopen at run time, so neither the build nor the
 * library needs it), OpenBLAS sgemm/sgemv (linked when the build found it, with the core kernel
 * it picked), and a measured FMA peak of the host so a weak baseline shows. The libraries are
 * called through the same code as the runtime's dense path (docs/dense-path.md); these objects
 * are the benchmarks' own (x and y bound once, nothing allocated per call). */
typedef enum tj_dense_kind {
    TJ_DENSE_ONEDNN_F32 = 0, /* oneDNN matmul, fp32, weights reordered once to its preferred layout */
    TJ_DENSE_ONEDNN_BF16,    /* oneDNN matmul, bf16 X and W, fp32 Y (X and W converted once) */
    TJ_DENSE_OPENBLAS,       /* cblas_sgemm (cblas_sgemv at M = 1) straight on X and W */
    TJ_DENSE_NKINDS
} tj_dense_kind;

/* One prepared dense problem Y [m × n] = X [m × k] · W [n × k]ᵀ on `threads` threads.
 * Borrows x, w and y (fp32 row-major) until destroyed. */
typedef struct tj_dense tj_dense;

/* TJ_ERR_UNSUPPORTED (with the reason in err) when the library is missing, or when oneDNN has
 * only its reference implementation for the kind on this CPU (no bf16 instructions): a
 * baseline that slow would flatter tilejit, so it is not offered. */
TJ_API tj_status tj_dense_create(tj_dense_kind kind, const float *x, const float *w, float *y, int64_t m, int64_t n,
                                 int64_t k, int threads, tj_dense **out, tj_error *err);
/* The same problem with a layer's epilogue, Y = act(X · Wᵀ + bias): bias fp32 [n] (NULL: none;
 * borrowed like x, w and y), act the pattern's activation. oneDNN fuses both into the matmul (post-ops); OpenBLAS
 * adds them in a pass after the sgemm. `tilejit model` compares each layer with this. */
TJ_API tj_status tj_dense_create_layer(tj_dense_kind kind, const float *x, const float *w, const float *bias,
                                       tj_activation act, float *y, int64_t m, int64_t n, int64_t k, int threads,
                                       tj_dense **out, tj_error *err);
/* One call. Returns 0, or -1 if the library reported a failure. */
TJ_API int tj_dense_run(tj_dense *d);
/* "oneDNN 3.2.0 fp32 (brg:avx2)", "OpenBLAS 0.3.21 sgemm (core Haswell)": borrowed. */
TJ_API const char *tj_dense_name(const tj_dense *d);
/* "onednn_f32", "onednn_bf16", "openblas": a single word for the speedup line. */
TJ_API const char *tj_dense_kind_word(tj_dense_kind kind);
TJ_API void tj_dense_destroy(tj_dense *d);

/* The host's fp32 FMA rate in GFLOP/s over `threads` threads running at once (the widest
 * vector FMA the host has, enough independent chains to cover latency), measured for about
 * `seconds`. Returns <= 0 when the host has no vector FMA. */
TJ_API double tj_dense_fma_peak(int threads, double seconds);
/* The host's streaming read bandwidth in GB/s over `threads` threads, each summing its own part
 * of a buffer of `bytes` in all (so the figure is that of the cache level or memory a working
 * set of that size lives in, warm: what a kernel re-reading `bytes` of weights can reach),
 * best of 5 runs of about seconds / 5 each. Returns 0 when out of memory. */
TJ_API double tj_dense_read_bandwidth(int threads, double bytes, double seconds);

#ifdef __cplusplus
}
#endif
#endif
