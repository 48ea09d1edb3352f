/* The measured rule of the dense path (dense_rule.c; docs/dense-path.md). */
#ifndef TJ_DENSE_RULE_H
#define TJ_DENSE_RULE_H

#include <stdint.h>

/* The density from which the dense path is faster than the kernel at M rows, for a layer of k
 * inputs and n outputs on `threads` threads: a measured table. Above 1: never. */
double tj_dense_rule_crossover(int64_t m, int64_t n, int64_t k, int threads);

#endif
