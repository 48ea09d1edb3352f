/* What a loaded model is inside: the pattern, the mapped weights, and the backend that runs it.
 * Backends implement tj_backend_ops (runtime/backend.h; one file each: backend_reference.c,
 * backend_cpu.c, backend_cuda.c); model.c validates the caller's tensors and dispatches. */
#ifndef TJ_MODEL_H
#define TJ_MODEL_H

#include <pthread.h>

#include "pattern/pattern.h"
#include "base/strbuf.h"
#include "base/dtype.h"
#include "base/error.h"
#include "base/safetensors.h"
#include "base/clock.h"
#include "jit/cache.h"
#include "runtime/backend.h"
#include "runtime/context.h"
#include "runtime/reference.h"
#include "runtime/dense_path.h"

struct tj_model {
    tj_context *ctx;
    tj_pattern *pattern;
    tj_st_file *weights;
    tj_layer_weights *lw;       /* pattern->nlayers entries */
    const tj_backend_ops *ops;
    void *state;                /* the backend's */
    double load_seconds;
    void **owned;               /* compact copies of strided in-memory tensors (model_tensors.c) */
    int64_t nowned;
    int64_t copied_bytes;
    tj_paths *paths;            /* which layers take the dense path at which M (dense_path.c), or NULL */
};

/* Prepares every layer of a model whose pattern and weights are bound (m->pattern, m->lw) on its
 * backend, chooses each layer's path per M (the backend's kernel or the dense path) and times it.
 * On failure everything is already released (m->ops is NULL). */
tj_status tj_model_prepare(tj_model *m, tj_error *err);
/* Releases what tj_model_prepare made (backend state, dense paths); m->ops becomes NULL. */
void tj_model_unprepare(tj_model *m);

/* DLTensor helpers shared by model.c, model_tensors.c and the backends: the element type (0 if
 * unsupported), the element strides of a 2-D tensor (compact row-major when strides is NULL),
 * and whether the CPU can read its memory (kDLCPU or kDLCUDAHost). */
int tj_dl_dtype(const DLTensor *t, tj_dtype *out);
void tj_dl_strides(const DLTensor *t, int64_t st[2]);
int tj_dl_is_host(const DLTensor *t);


#endif
