/* NumPy .npy arrays for the command line: 2-D, C order, '<f4' or '<f2'. */
#ifndef TJ_NPY_H
#define TJ_NPY_H

#include <stdint.h>

#include "base/dtype.h"
#include "base/error.h"

typedef struct tj_npy {
    tj_dtype dtype;    /* TJ_F32 or TJ_F16 */
    int64_t rows, cols;
    void *data;        /* malloc'ed, rows·cols elements */
} tj_npy;

tj_status tj_npy_read(const char *path, tj_npy *out, tj_error *err);
tj_status tj_npy_write(const char *path, tj_dtype dtype, int64_t rows, int64_t cols,
                       const void *data, tj_error *err);
void tj_npy_free(tj_npy *a);

#endif
