/* NumPy .npy arrays for the command line: 2-D, C order, '<f4' or '<f2'. The type and calls are
 * public (tilejit/io.h); npy.c implements them. */
#ifndef TJ_NPY_H
#define TJ_NPY_H

#include "base/dtype.h"
#include "base/error.h"

#endif
