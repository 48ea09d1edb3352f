/* The yardstick (reference.c): plain loops over the semantics of docs/architecture.md, fp32
 * accumulation. Every other path is checked against it, so it shares nothing with them. */
#ifndef TJ_REFERENCE_H
#define TJ_REFERENCE_H

#include "pattern/pattern.h"
#include "runtime/backend.h"

/* x: [m × k] fp32 row-major, y: [m × n] fp32 row-major, fully written. Needs no memory. */
void tj_reference_linear(const tj_layer *l, const tj_layer_weights *w, const float *x, int64_t m,
                         float *y);
/* Bias and activation for a whole row-major [m × n] block (reference and host epilogues). */
void tj_reference_epilogue(const tj_layer *l, const tj_layer_weights *w, float *y, int64_t m);
/* Activation on one value (shared by reference and host epilogues). */
float tj_activate(tj_activation a, float v);

#endif
