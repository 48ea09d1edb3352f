/* The backend interface: one backend per file (backend_reference.c, backend_cpu.c,
 * backend_cuda.c), each behind a const tj_backend_ops; registry.c lists the backends built in,
 * context_create.c picks one for a context, model.c dispatches to it. */
#ifndef TJ_BACKEND_H
#define TJ_BACKEND_H

#include <stdint.h>

#include "base/dtype.h"
#include "base/error.h"

/* One layer's weights, borrowed from the mapped safetensors file (or a caller's tensors). */
typedef struct tj_layer_weights {
    const void *w;      /* [n, k] row-major */
    tj_dtype wdt;
    const void *bias;   /* [n], or NULL */
    tj_dtype bdt;
} tj_layer_weights;

/* A dispatch, already checked by model.c. Host backends (ops->host_f32) get x32/y32: contiguous
 * fp32 row-major [M × K] / [M × N] in host memory, converted by model.c when the caller's
 * tensors are not. The CUDA backend reads x/y/layout/stream itself. */
typedef struct tj_linear_args {
    int64_t m;
    const DLTensor *x;
    DLTensor *y;
    int layout;
    void *stream;
    const float *x32;
    float *y32;
} tj_linear_args;

typedef struct tj_model tj_model;
typedef struct tj_context tj_context;

typedef struct tj_backend_ops {
    const char *name;
    tj_backend kind;
    int host_f32;  /* 1: wants x32/y32 */
    /* Whether this backend can run here; the message says why not. */
    tj_status (*available)(tj_context *c, tj_error *err);
    /* Once per model: pack weights and compile every layer (through the kernel cache). */
    tj_status (*load)(tj_model *m, tj_error *err);
    tj_status (*linear)(tj_model *m, int64_t layer, const tj_linear_args *a, tj_error *err);
    void (*unload)(tj_model *m); /* frees m->state */
    /* Optional: the config (JSON, borrowed) layer `layer` runs with at batch size M. */
    const char *(*config_at)(tj_model *m, int64_t layer, int64_t M);
    /* Optional: frees the backend's per-context state; tj_context_destroy calls it for every
     * registered backend, whichever the context used. */
    void (*release)(tj_context *c);
} tj_backend_ops;

#endif
