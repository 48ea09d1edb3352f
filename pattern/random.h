/* Random tile-wise patterns like the paper's benchmark harness: every tile keeps the same number
 * of random rows; tw2 first drops 1 − sqrt(1 − s) of the columns. Used by `bench`, tests, tuning. */
#ifndef TJ_RANDOM_PATTERN_H
#define TJ_RANDOM_PATTERN_H

#include "pattern/pattern.h"

typedef struct tj_random_spec {
    int64_t n, k, g;
    double sparsity;       /* overall, in [0, 1) */
    int mode;              /* 1: tw1, 2: tw2 */
    uint64_t seed;
    double ew_fraction;    /* extra unstructured weights as a fraction of n·k (0: no ew) */
    double empty_tile_fraction; /* fraction of tiles made empty (tests) */
    tj_activation act;
} tj_random_spec;

/* Fills *out (caller frees with tj_layer_free); name is copied. */
tj_status tj_random_layer(const tj_random_spec *spec, const char *name, tj_layer *out, tj_error *err);

#endif
