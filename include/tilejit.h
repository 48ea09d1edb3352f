/* tilejit.h — the public API of tilejit: this umbrella holds the runtime (contexts, models,
 * tj_linear) and includes every topic header under tilejit/ (docs/c-api.md is the guide):
 *   tilejit/io.h       dtypes, safetensors and .npy files, the whole-file reader
 *   tilejit/pattern.h  tile-wise patterns: read, validate, inspect, write, random layers
 *   tilejit/gen.h      source generation for one layer and config (CUDA C, LLVM IR)
 *   tilejit/compile.h  ahead-of-time compilation into the kernel cache for a named arch
 *   tilejit/prune.h    pruning dense weights to a pattern, and pattern recovery from zeros
 *   tilejit/tune.h     tuning (sweeps, in-process measurement, logs, best configs)
 *   tilejit/bench.h    the clock, the reference check with its error bounds, timing a layer
 *   tilejit/tensors.h  models and layers from in-memory tensors; pruning in-memory weights
 *
 * tilejit runs tile-wise (TW) sparse linear layers, Y = act(X · (W ⊙ mask)ᵀ + bias), with code
 * generated per layer and compiled at load time (LLVM ORC JIT on the host CPU, NVRTC on GPUs).
 *
 * A short tour:
 *
 *     tj_context *ctx = NULL;
 *     tj_options opt = tj_options_default();        // backend AUTO, all cores
 *     if (tj_context_create(&opt, &ctx) != TJ_OK) { ... }
 *     tj_model *model = NULL;
 *     if (tj_model_load(ctx, "model.pattern.json", "model.safetensors", &model) != TJ_OK)
 *         fprintf(stderr, "%s\n", tj_context_error(ctx));
 *     // x: DLTensor float32 [M × K] in host memory; y: DLTensor float32 [M × N]
 *     if (tj_linear(model, "encoder.layer.0.intermediate.dense", &x, &y, NULL) != TJ_OK)
 *         fprintf(stderr, "%s\n", tj_context_error(ctx));
 *     tj_model_destroy(model);
 *     tj_context_destroy(ctx);
 *
 * Conventions:
 * - Every fallible call returns a tj_status; outputs come last. On failure, tj_context_error()
 *   gives the calling thread's last message for that context (file, layer, field and value
 *   where the cause is a file). Library code never prints, aborts or exits.
 * - _create/_load give ownership to the caller, who frees with the matching _destroy (which
 *   accepts NULL). Getters borrow: returned pointers live as long as the object they came from.
 * - Tensors cross the API as DLPack DLTensor. Activations are row-major [M × K] unless a call
 *   says feature-major ([K × M], the GPU's fast layout).
 * - Thread safety: many threads may call tj_linear on one loaded model at once. Creating and
 *   destroying objects must not race with their use.
 */
#ifndef TILEJIT_H
#define TILEJIT_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#include "tilejit/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TJ_VERSION_MAJOR 0
#define TJ_VERSION_MINOR 1
#define TJ_VERSION_PATCH 0

typedef enum tj_status {
    TJ_OK = 0,
    TJ_ERR_INVALID_ARGUMENT, /* a caller's argument is wrong (NULL, shape, dtype, device) */
    TJ_ERR_IO,               /* a file could not be opened, read, mapped or written */
    TJ_ERR_FORMAT,           /* a file's content breaks its format's rules */
    TJ_ERR_NOT_FOUND,        /* a named layer or tensor does not exist */
    TJ_ERR_OUT_OF_MEMORY,
    TJ_ERR_UNSUPPORTED,      /* a backend or feature is not available in this build or machine */
    TJ_ERR_COMPILE,          /* code generation or JIT compilation failed (log in the message) */
    TJ_ERR_DEVICE,           /* the GPU driver reported an error */
    TJ_ERR_INTERNAL
} tj_status;

/* A caller-owned error of the calls that work without a context (files, patterns, generation,
 * compilation, pruning, tuning): the status and one message naming file, layer, field, value. */
#define TJ_ERROR_MSG_MAX 4096
typedef struct tj_error {
    tj_status status;
    char msg[TJ_ERROR_MSG_MAX];
} tj_error;

typedef enum tj_backend {
    TJ_BACKEND_AUTO = 0,  /* CUDA if a usable GPU is present, else CPU if built, else reference */
    TJ_BACKEND_REFERENCE, /* plain loops: the yardstick every other backend is checked against */
    TJ_BACKEND_CPU,       /* LLVM-generated kernels, JIT-compiled for the host CPU */
    TJ_BACKEND_CUDA       /* NVRTC-compiled kernels on an NVIDIA GPU */
} tj_backend;

/* The precision a layer computes in: its activations x and weights (the accumulation is fp32
 * in every case, and y is fp32 through tj_linear). */
typedef enum tj_precision {
    TJ_PRECISION_AUTO = 0, /* options only: bf16 where the CPU has avx512_bf16 or AMX-BF16 and the
                            * layer's weights are BF16 in the checkpoint (exact), else fp32 */
    TJ_PRECISION_F32,      /* fp32 x; weights as stored (bf16 ones widened exactly) */
    TJ_PRECISION_BF16,     /* x rounded to bf16 once per call, weights bf16 (fp32 ones rounded at
                            * load): vdpbf16ps or AMX tiles where the CPU has them, else bf16
                            * widened to fp32 in registers */
    TJ_PRECISION_F16       /* fp16 x and weights (the CUDA backend's default) */
} tj_precision;

typedef enum tj_activation {
    TJ_ACT_NONE = 0,
    TJ_ACT_RELU,
    TJ_ACT_GELU /* exact erf form: x/2 · (1 + erf(x/√2)) */
} tj_activation;

/* Where the CPU backend runs its parallel loops (docs/threads.md). */
typedef enum tj_threading {
    TJ_THREADING_AUTO = 0, /* OPENMP when an OpenMP runtime is loaded in the process when the
                            * context is created (PyTorch, a program built with -fopenmp), else
                            * POOL; $TILEJIT_THREADING=pool|openmp overrides AUTO */
    TJ_THREADING_POOL,     /* tilejit's own worker threads (threads − 1 of them, per context) */
    TJ_THREADING_OPENMP    /* parallel regions of the process's OpenMP runtime (libgomp, libomp,
                            * libiomp5), on the same threads as the host's own OpenMP work;
                            * tj_context_create fails with TJ_ERR_UNSUPPORTED when none is loaded */
} tj_threading;

/* Options of a context. Start from tj_options_default(), which sets `size`: fields added later
 * go at the end, and the library reads only the first `size` bytes of a caller's struct. */
typedef struct tj_options {
    size_t size;            /* sizeof(tj_options) as the caller was compiled; set by tj_options_default */
    tj_backend backend;
    int threads;            /* CPU threads per call; 0: with OpenMP threading the calling thread's
                             * omp_get_max_threads() at each call (what the host set), with the
                             * own pool all cores */
    const char *cache_dir;  /* kernel cache; NULL: $TILEJIT_CACHE_DIR, $XDG_CACHE_HOME/tilejit, ~/.cache/tilejit */
    const char *tuning_log; /* JSON Lines tuning log; NULL: $TILEJIT_TUNING_LOG, else built-in defaults */
    int device;             /* CUDA device ordinal */
    int verbose;            /* 0 quiet; >0: tj_context_log() collects notes about choices made */
    tj_threading threading; /* where the CPU backend's parallel loops run */
    tj_precision precision; /* CPU backend: AUTO (default), F32 or BF16; a forced config's "dtype"
                             * (tj_context_set_config) wins */
} tj_options;

typedef struct tj_context tj_context;
typedef struct tj_model tj_model;

/* Facts about one layer, borrowed from its model. */
typedef struct tj_layer_info {
    const char *name;
    int64_t n, k, g;        /* out features, in features, tile width */
    int64_t kept_cols;      /* output features kept by the global column pruning (n when none) */
    int64_t tiles;
    int64_t kept_weights;   /* TW-kept weights plus ew entries */
    int64_t ew_nnz;
    tj_activation activation;
    int has_bias;
    uint64_t pattern_hash;  /* canonical hash of the layer's pattern (not its name) */
} tj_layer_info;

/* Layout flags for tj_linear_ex. */
enum {
    TJ_LAYOUT_ROW_MAJOR = 0,     /* X [M × K], Y [M × N] */
    TJ_LAYOUT_FEATURE_MAJOR = 1  /* X [K × M], Y [N × M]: chains on the GPU without transposes */
};

TJ_API const char *tj_version(void);
TJ_API const char *tj_status_string(tj_status s);
TJ_API const char *tj_backend_name(tj_backend b);

TJ_API tj_options tj_options_default(void);
TJ_API tj_status tj_context_create(const tj_options *opt, tj_context **out);
TJ_API void tj_context_destroy(tj_context *c);
/* The calling thread's message for its last failed tj_context_create (no context to hold it). */
TJ_API const char *tj_last_error(void);
/* The calling thread's last error message for this context; "" when none. Borrowed until the
 * thread's next call on the context. */
TJ_API const char *tj_context_error(const tj_context *c);
/* The backend the context resolved AUTO to, and why (verbose notes), borrowed. */
TJ_API tj_backend tj_context_backend(const tj_context *c);
TJ_API const char *tj_context_log(const tj_context *c);
/* What the context resolved opt.threading to: TJ_THREADING_POOL or TJ_THREADING_OPENMP. */
TJ_API tj_threading tj_context_threading(const tj_context *c);
/* The threads a CPU call made now from the calling thread would use: opt.threads, else with
 * OpenMP threading the calling thread's omp_get_max_threads(), else the online cores. (Calls whose
 * work is too small to share run on the calling thread alone.) */
TJ_API int tj_context_threads(const tj_context *c);

/* Loads a pattern file and a safetensors file, checks that every layer's weights exist with
 * shape [n, k] (and bias [n], if present) and prepares every layer on the context's backend
 * (compiling through the kernel cache). The weights file stays memory-mapped while the model
 * lives. */
TJ_API tj_status tj_model_load(tj_context *c, const char *pattern_path, const char *weights_path,
                        tj_model **out);
TJ_API void tj_model_destroy(tj_model *m);
TJ_API int64_t tj_model_layer_count(const tj_model *m);
TJ_API tj_status tj_model_find_layer(const tj_model *m, const char *name, int64_t *out_index);
TJ_API tj_status tj_model_layer_info(const tj_model *m, int64_t index, tj_layer_info *out);
/* Seconds spent in tj_model_load preparing layers (code generation and compilation). */
TJ_API double tj_model_load_seconds(const tj_model *m);
/* The kernel config (JSON, borrowed from the model) that layer `layer` runs at batch M:
 * TJ_OK with *config set (NULL: the backend's default config; {"path":"dense"} where the layer
 * takes the dense path at M, see tj_model_layer_path), or TJ_ERR_UNSUPPORTED when the model's
 * backend does not pick configs per M (then *config is NULL). */
TJ_API tj_status tj_model_layer_config(tj_model *m, int64_t layer, int64_t M, const char **config);
/* The precision layer `layer` computes in at batch M (never AUTO): TJ_OK with *out set. */
TJ_API tj_status tj_model_layer_precision(tj_model *m, int64_t layer, int64_t M, tj_precision *out);
/* "auto", "f32", "bf16", "f16"; "?" for other values. Static. */
TJ_API const char *tj_precision_name(tj_precision p);

/* The two ways a layer runs (docs/dense-path.md): the backend's kernel generated for the layer's
 * pattern, or the dense path, a dense library (oneDNN, else OpenBLAS) on the layer's masked
 * weights, taken per layer and M class where it is faster: by the tuning records, else by a
 * measured rule of density, M and k. The same semantics either way. */
typedef enum tj_path { TJ_PATH_KERNEL = 0, TJ_PATH_DENSE = 1 } tj_path;
/* Which path layer `layer` takes at batch M. library (may be NULL): "kernel", or the dense
 * library's name ("oneDNN 3.2.0 fp32 matmul (brg:avx512_core)"); why (may be NULL): one line on
 * what decided (records, rule, forced config). Both borrowed: *library from the model, *why
 * until the calling thread's next call. Backends without a dense path (reference; CUDA, whose
 * cuBLAS path is not built yet) always answer TJ_PATH_KERNEL. */
TJ_API tj_status tj_model_layer_path(const tj_model *m, int64_t layer, int64_t M, tj_path *path,
                                     const char **library, const char **why);

/* Y = act(X · (W ⊙ mask)ᵀ + bias) for one layer, row-major. x: float32 or float16 [M × K];
 * y: float32 [M × N], written in full. Host tensors on CPU backends; the CUDA backend takes
 * device tensors (and host tensors through a staging copy). stream: a CUstream or NULL. */
TJ_API tj_status tj_linear(tj_model *m, const char *layer, const DLTensor *x, DLTensor *y, void *stream);
/* The same by layer index and with a layout (TJ_LAYOUT_*). */
TJ_API tj_status tj_linear_ex(tj_model *m, int64_t layer, const DLTensor *x, DLTensor *y, int layout,
                       void *stream);

/* Whether this build has a backend (CPU needs LLVM, CUDA the CUDA toolkit; reference always). */
TJ_API int tj_backend_built(tj_backend b);
/* Forces one config (JSON text of the context's backend, as `tilejit gen --config` takes) on
 * every layer loaded on c afterwards, instead of tuned or default ones; NULL clears. */
TJ_API tj_status tj_context_set_config(tj_context *c, const char *json, tj_error *err);

#ifdef __cplusplus
}
#endif

/* The topic headers (each includes this one first). */
#include "tilejit/io.h"
#include "tilejit/pattern.h"
#include "tilejit/gen.h"
#include "tilejit/compile.h"
#include "tilejit/prune.h"
#include "tilejit/tune.h"
#include "tilejit/bench.h"
#include "tilejit/tensors.h"
#endif
