/* The measured rule of the dense path (dense_path.c): from which density a layer runs faster on
 * the dense library than with its generated kernel, by M class, k and threads. A data table,
 * derived from `tilejit bench --sweep` on this machine kind by scripts/dense-rule, which prints
 * these rows; the measurements are in bench/RESULTS.md ("Issue 25: the dense path"). Re-derive
 * it when the kernels or the machine change; a layer with tuning records (the tuner measures the
 * dense path too) is decided by its records instead. */
#include <stddef.h>
#include <stdint.h>

#include "runtime/dense_rule.h"

/* Rows in order; the first that matches decides: threads ≤ threads_max, M ≤ m_max, k ≤ k_max.
 * crossover > 1: the kernel at every density. */
typedef struct rule_row {
    int threads_max;
    int64_t m_max, k_max;
    double crossover;
} rule_row;

/* Measured on an Intel Xeon (Sapphire Rapids class), 2 cores, AVX-512, oneDNN 3.2.0 (brg:avx512_core),
 * 2026-12-03 (bench/RESULTS.md, "Issue 25: the dense path"): MiniLM, BERT-base and LLaMA-7B shapes,
 * M = 1, 16, 128, 512 (LLaMA 1 and 16), 1 and 2 threads; per class the lowest crossover over n. */
static const rule_row rule[] = {
    {1, 3, 384, 2.00},
    {1, 3, 768, 2.00},
    {1, 3, 1536, 1.00},
    {1, 3, 3072, 2.00},
    {1, 3, 4096, 2.00},
    {1, 3, INT64_MAX, 2.00},
    {1, 45, 384, 2.00},
    {1, 45, 768, 1.00},
    {1, 45, 1536, 2.00},
    {1, 45, 3072, 0.96},
    {1, 45, 4096, 0.86},
    {1, 45, INT64_MAX, 0.70},
    {1, 255, 384, 0.98},
    {1, 255, 768, 0.99},
    {1, 255, 1536, 2.00},
    {1, 255, INT64_MAX, 0.95},
    {1, INT64_MAX, 384, 0.93},
    {1, INT64_MAX, 768, 1.00},
    {1, INT64_MAX, 1536, 2.00},
    {1, INT64_MAX, INT64_MAX, 0.94},
    {1 << 30, 3, 384, 0.28},
    {1 << 30, 3, 768, 0.26},
    {1 << 30, 3, 1536, 0.55},
    {1 << 30, 3, 3072, 0.89},
    {1 << 30, 3, 4096, 2.00},
    {1 << 30, 3, INT64_MAX, 2.00},
    {1 << 30, 45, 384, 0.46},
    {1 << 30, 45, 768, 0.77},
    {1 << 30, 45, 1536, 0.66},
    {1 << 30, 45, 3072, 2.00},
    {1 << 30, 45, 4096, 0.87},
    {1 << 30, 45, INT64_MAX, 0.67},
    /* 2 threads, M > 45: re-derived on an AMD EPYC (Zen 4 class), 2 cores, 2026-12-04, after
     * mid-sized calls moved to per-thread shares (bench/RESULTS.md, "Issue 25, round 4"): the
     * kernel then keeps its 1/density speed up to density 0.98-1.0 on every MiniLM and BERT-base
     * shape (none: the kernel at every density, written 1.00 so a fully dense layer still takes
     * the library); k > 1536 takes the lowest of 3072's crossover and the LLaMA shapes' kernel
     * at density 1.0 (0.98 of oneDNN at M = 128, 1.00 at 512) */
    {1 << 30, 255, 384, 1.00},
    {1 << 30, 255, 768, 1.00},
    {1 << 30, 255, 1536, 1.00},
    {1 << 30, 255, INT64_MAX, 0.98},
    {1 << 30, INT64_MAX, 384, 0.98},
    {1 << 30, INT64_MAX, 768, 1.00},
    {1 << 30, INT64_MAX, 1536, 0.99},
    {1 << 30, INT64_MAX, INT64_MAX, 0.99},
};

double tj_dense_rule_crossover(int64_t m, int64_t n, int64_t k, int threads)
{
    (void)n;
    for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++)
        if (threads <= rule[i].threads_max && m <= rule[i].m_max && k <= rule[i].k_max) return rule[i].crossover;
    return 2.0;
}
