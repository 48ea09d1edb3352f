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

static const rule_row rule[] = {
    {1 << 30, INT64_MAX, INT64_MAX, 0.80},
};

double tj_dense_rule_crossover(int64_t m, int64_t n, int64_t k, int threads)
{
    (void)n;
    for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++)
        if (threads <= rule[i].threads_max && m <= rule[i].m_max && k <= rule[i].k_max) return rule[i].crossover;
    return 2.0;
}
