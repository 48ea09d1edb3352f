/* base/: the dense GEMM libraries, one implementation for every stage that uses them: the
 * runtime's dense path (runtime/dense.c) and the benchmarks' baselines (bench/dense_cpu.c).
 *
 *   oneDNN 3.x   libdnnl.so.3 opened with dlopen at first use ($TILEJIT_ONEDNN: another path),
 *                its C API declared here (no header needed to build); a matmul whose weights are
 *                reordered once into the layout the implementation prefers, with bias and
 *                activation fused (post-ops)
 *   OpenBLAS     linked when the build found it (TJ_HAVE_OPENBLAS): cblas_sgemm / sgemv
 *
 * Neither is needed to build or run tilejit: without them every call here fails with
 * TJ_ERR_UNSUPPORTED and a line saying why. */
#ifndef TJ_DENSE_H
#define TJ_DENSE_H

#include <stdint.h>

#include "base/error.h"

/* Activations the dense libraries fuse (the pattern's: none, relu, exact-erf gelu). */
typedef enum tj_dense_act { TJ_DENSE_ACT_NONE = 0, TJ_DENSE_ACT_RELU, TJ_DENSE_ACT_GELU } tj_dense_act;

/* ---- oneDNN ----------------------------------------------------------------------------- */

/* Opens oneDNN once per process (thread-safe); TJ_ERR_UNSUPPORTED with the reason when it is
 * missing or not 3.x. */
tj_status tj_onednn_open(tj_error *err);

/* Stops OpenBLAS's worker threads now (its next call starts them again). After a call they spin
 * for a while (OPENBLAS_THREAD_TIMEOUT, 2^28 cycles by default), and at real-time priority a
 * spinning worker keeps another library's OpenMP threads off the cores: oneDNN calls right after
 * an OpenBLAS one then take milliseconds. The benchmarks call it after timing OpenBLAS. */
void tj_openblas_quiesce(void);
/* Y [m × n] = act(X [m × k] · W [n × k]ᵀ + bias), fp32 Y. */
typedef struct tj_onednn_matmul_desc {
    int64_t m;          /* rows of X; 0: any, given per call (oneDNN's runtime dimension) */
    int64_t n, k;
    int bf16;           /* X and W bf16 (uint16), else fp32 */
    int bias;           /* 1: a bias [n] fp32 is added */
    tj_dense_act act;
    int threads;        /* OpenMP threads of each call; 0: the calling thread's (omp_get_max_threads) */
} tj_onednn_matmul_desc;

typedef struct tj_onednn_matmul tj_onednn_matmul;

/* Creates the primitive and reorders w ([n × k] row-major, bf16 or fp32 as d->bf16 says) and
 * bias (fp32 [n], when d->bias) into memory it owns: w and bias may be freed after. Refuses
 * (TJ_ERR_UNSUPPORTED) when oneDNN has only its reference implementation for the problem. */
tj_status tj_onednn_matmul_create(const tj_onednn_matmul_desc *d, const void *w, const float *bias,
                                  tj_onednn_matmul **out, tj_error *err);
/* One call on m rows (m == d->m when that was fixed). Thread-safe: many threads may run one
 * matmul at once. Runs on d->threads OpenMP threads (0: as many as the caller's OpenMP runtime
 * gives); the calling thread's OpenMP thread count is restored afterwards (oneDNN may share the
 * OpenMP runtime with the caller, e.g. PyTorch).
 * Allocates a few small objects per call (the memory descriptors of x and y). */
tj_status tj_onednn_matmul_run(const tj_onednn_matmul *mm, const void *x, float *y, int64_t m, tj_error *err);
/* Binds x and y once, for a fixed-M matmul timed in a loop (the benchmarks' baseline, where a
 * call costs microseconds): tj_onednn_matmul_run_bound then allocates nothing. Not thread-safe. */
tj_status tj_onednn_matmul_bind(tj_onednn_matmul *mm, const void *x, float *y, tj_error *err);
int tj_onednn_matmul_run_bound(tj_onednn_matmul *mm);
/* Frees the calling thread's oneDNN stream and memory objects (made by its first run; also freed
 * when the thread exits). tj_context_destroy calls it, as it frees the thread's other scratch. */
void tj_onednn_thread_release(void);
/* "oneDNN 3.2.0 fp32 matmul (brg:avx512_core)". Borrowed. */
const char *tj_onednn_matmul_name(const tj_onednn_matmul *mm);
/* Bytes of the reordered weights (and bias) it holds. */
int64_t tj_onednn_matmul_bytes(const tj_onednn_matmul *mm);
void tj_onednn_matmul_destroy(tj_onednn_matmul *mm);

/* ---- OpenBLAS --------------------------------------------------------------------------- */

/* 1 when this build links OpenBLAS. */
int tj_openblas_built(void);
/* "OpenBLAS 0.3.21 sgemm (core SkylakeX)" (sgemv for m == 1), or why not ("this tilejit was built
 * without OpenBLAS ..."). Borrowed, static per m == 1 / m > 1. */
const char *tj_openblas_name(int64_t m);
/* Y [m × n] = act(X [m × k] · W [n × k]ᵀ + bias) (fp32, row-major; bias [n] or NULL), on `threads`
 * threads (OpenBLAS's process-wide setting, set before the call when it differs); bias and
 * activation in a pass after the sgemm. TJ_ERR_UNSUPPORTED without OpenBLAS. */
tj_status tj_openblas_gemm(const float *x, const float *w, const float *bias, tj_dense_act act, float *y, int64_t m,
                           int64_t n, int64_t k, int threads, tj_error *err);

#endif
