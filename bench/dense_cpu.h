/* Dense CPU baselines for `tilejit bench` and `tilejit model`: oneDNN matmul (fp32 and bf16,
 * libdnnl.so.3 opened with dlopen at run time, so neither the build nor the library needs it),
 * OpenBLAS sgemm/sgemv (linked when the build found it, with the core kernel it picked), and a
 * measured FMA peak of the host so a weak baseline shows. Benchmark code only: never used to
 * compute a model's output. */
#ifndef TJ_BENCH_DENSE_CPU_H
#define TJ_BENCH_DENSE_CPU_H

#include <stdint.h>

#include "base/error.h"

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
tj_status tj_dense_create(tj_dense_kind kind, const float *x, const float *w, float *y, int64_t m, int64_t n,
                          int64_t k, int threads, tj_dense **out, tj_error *err);
/* One call. Returns 0, or -1 if the library reported a failure. */
int tj_dense_run(tj_dense *d);
/* "oneDNN 3.2.0 fp32 (brg:avx2)", "OpenBLAS 0.3.21 sgemm (core Haswell)": borrowed. */
const char *tj_dense_name(const tj_dense *d);
/* "onednn_f32", "onednn_bf16", "openblas": a single word for the speedup line. */
const char *tj_dense_kind_word(tj_dense_kind kind);
void tj_dense_destroy(tj_dense *d);

/* The host's fp32 FMA rate in GFLOP/s over `threads` threads running at once (the widest
 * vector FMA the host has, enough independent chains to cover latency), measured for about
 * `seconds`. Returns ≤ 0 when the host has no vector FMA. */
double tj_dense_fma_peak(int threads, double seconds);

#endif
