/* What a loaded model is inside: the pattern, the mapped weights, and the backend that runs it.
 * Backends implement tj_backend_ops (one file each: backend_reference.c, backend_cpu.c,
 * backend_cuda.c); model.c validates the caller's tensors and dispatches. */
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

/* One layer's weights, borrowed from the mapped safetensors file. */
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
} tj_backend_ops;

extern const tj_backend_ops tj_backend_reference_ops;
extern const tj_backend_ops tj_backend_cpu_ops;   /* only when TJ_HAVE_LLVM */
extern const tj_backend_ops tj_backend_cuda_ops;  /* only when TJ_HAVE_CUDA */

struct tj_context {
    tj_options opt;
    char *cache_dir;
    char *tuning_log;
    tj_backend backend;         /* resolved from opt.backend */
    tj_threading threading;     /* resolved from opt.threading: POOL or OPENMP */
    const tj_backend_ops *ops;
    pthread_mutex_t lock;       /* guards log and lazily created backend state */
    tj_strbuf log;
    char *config_override;      /* a config JSON every layer uses (tuner, --config), or NULL */
    void *tuning;               /* autotune/'s loaded tuning records, or NULL */
    void *cpu;                  /* backend_cpu.c's per-context state (thread pool, JIT) */
    void *cuda;                 /* backend_cuda.c's per-context state (driver, device) */
};

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
};

/* Prepares every layer of a model whose pattern and weights are bound (m->pattern, m->lw) on its
 * backend and times it. On failure the backend state is already released (m->ops is NULL). */
tj_status tj_model_prepare(tj_model *m, tj_error *err);

/* Thread-local last error for the public tj_context_error (context.c). */
tj_status tj_context_set_error(const tj_context *c, const tj_error *err);
/* Appends a verbose note (when opt.verbose) to the context log. */
void tj_context_note(tj_context *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A backend's handle on the context's kernel cache directory (c->cache_dir), opened at its first
 * model load: under c->lock, when *opened is 0, opens it into *cache and sets *opened; its warning
 * (an unusable directory) becomes the note "BACKEND: kernel cache: ...". Fails only when out of
 * memory; the backend closes *cache when it releases its context state. */
tj_status tj_context_open_cache(tj_context *c, const char *backend, tj_cache **cache, int *opened, tj_error *err);

/* The yardstick (reference.c): plain loops over the semantics of docs/architecture.md, fp32 accumulation.
 * x: [m × k] fp32 row-major, y: [m × n] fp32 row-major, fully written. Needs no memory. */
void tj_reference_linear(const tj_layer *l, const tj_layer_weights *w, const float *x, int64_t m,
                         float *y);
/* Bias and activation for a whole row-major [m × n] block (reference and host epilogues). */
void tj_reference_epilogue(const tj_layer *l, const tj_layer_weights *w, float *y, int64_t m);
/* Activation on one value (shared by reference and host epilogues). */
float tj_activate(tj_activation a, float v);

/* The config a backend should use for layer l at batch size m: the override if set, else the
 * best tuning record (exact device, then arch family), else NULL for the backend's built-in
 * default. `device`/`arch` name the target as the tuning records do. Borrowed from c. */
const char *tj_context_config_for(tj_context *c, const char *backend, const char *device,
                                  const char *arch, const tj_layer *l, int64_t m);
/* The same without a note, for probing many M (per-M dispatch); *m_tuned (optional): the M the
 * chosen record was measured at (0: no record). */
const char *tj_context_config_at(tj_context *c, const char *backend, const char *device, const char *arch,
                                 const tj_layer *l, int64_t m, int note, int64_t *m_tuned);

/* DLTensor helpers shared by model.c, model_tensors.c and the backends: the element type (0 if
 * unsupported), the element strides of a 2-D tensor (compact row-major when strides is NULL),
 * and whether the CPU can read its memory (kDLCPU or kDLCUDAHost). */
int tj_dl_dtype(const DLTensor *t, tj_dtype *out);
void tj_dl_strides(const DLTensor *t, int64_t st[2]);
int tj_dl_is_host(const DLTensor *t);


#endif
