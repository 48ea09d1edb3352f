/* Element types of weights and activations, and fp16/bf16 ↔ fp32 conversion: the type and its
 * inline helpers are public (tilejit/io.h); dtype.c implements the rest. */
#ifndef TJ_DTYPE_H
#define TJ_DTYPE_H

#include "tilejit/io.h"

#endif
