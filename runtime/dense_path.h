/* The dense path (docs/dense-path.md): where a layer's generated kernel would be slower than a
 * dense library on the layer's masked weights, the runtime runs the library instead, per layer and
 * M class. The same semantics, Y = act(X · (W ⊙ mask)ᵀ + bias): the weights are masked by the
 * pattern, upcast to fp32 and packed once at load. Libraries, in order: oneDNN (bias and
 * activation fused), else OpenBLAS (sgemm, then a bias and activation pass); with neither, every
 * layer keeps its kernel.
 *
 * Which path a layer takes at M: a forced config (the tuner's override) decides; else the tuning
 * records, when they hold both a dense-path record and a kernel record for the layer; else the
 * measured rule of dense_rule.c (the density above which dense wins, by M, k and threads). */
#ifndef TJ_DENSE_PATH_H
#define TJ_DENSE_PATH_H

#include "pattern/pattern.h"
#include "runtime/backend.h"
#include "runtime/context.h"
#include "tuning/tuning.h"

/* M classes of the choice: the runtime's (TJ_M_CLASSES in tuning/tuning.h), which the CPU
 * backend's per-M dispatch uses too. */
int tj_path_bucket(int64_t m);

/* ---- one layer on a dense library ---------------------------------------------------------- */

typedef struct tj_dense_layer tj_dense_layer;

/* Masks, upcasts and packs layer l's weights for the first library available, to run on
 * `threads` threads (0: oneDNN takes as many as the calling thread's OpenMP runtime gives,
 * omp_get_max_threads; OpenBLAS, all cores). TJ_ERR_UNSUPPORTED (and why) when no library can run it;
 * TJ_ERR_OUT_OF_MEMORY. */
tj_status tj_dense_layer_create(const tj_layer *l, const tj_layer_weights *w, int threads, tj_dense_layer **out,
                                tj_error *err);
/* y [m × n] = the layer on x [m × k] (fp32, row-major). Thread-safe. */
tj_status tj_dense_layer_run(const tj_dense_layer *d, const float *x, float *y, int64_t m, tj_error *err);
/* The library's full name ("oneDNN 3.2.0 fp32 matmul (brg:avx512_core)") and short word
 * ("onednn", "openblas"). Borrowed. */
const char *tj_dense_layer_name(const tj_dense_layer *d);
const char *tj_dense_layer_word(const tj_dense_layer *d);
void tj_dense_layer_free(tj_dense_layer *d);

/* W ⊙ mask as fp32 [n × k]: the pattern's kept weights, zeros elsewhere (weights outside the
 * mask are ignored, whatever they hold). */
void tj_dense_masked_weights(const tj_layer *l, const tj_layer_weights *w, float *out);

/* ---- a model's paths ----------------------------------------------------------------------- */

typedef struct tj_paths tj_paths;

/* The path of every layer of pattern p (weights lw) per M class on backend `backend` ("cpu"),
 * run on `threads` threads (the rule's), the dense layers on `dense_threads` (0: the calling
 * thread's OpenMP count, see tj_dense_layer_create): for each class, a forced config, else the tuning records (through c),
 * else the rule; kernel_bf16[layer·TJ_M_CLASSES + class] (may be NULL) marks classes whose kernel
 * computes in bf16, where the fp32 rule does not apply. Builds the dense layers the choice needs.
 * Notes each layer that takes the dense path anywhere (c's verbose log). *out is NULL when no
 * layer takes it. Fails when the dense path is forced and no library can run it, or when out of
 * memory. */
tj_status tj_paths_build(tj_context *c, const char *backend, const tj_pattern *p, const tj_layer_weights *lw,
                         int threads, int dense_threads, const unsigned char *kernel_bf16, tj_paths **out,
                         tj_error *err);
/* The dense layer that runs layer `layer` at M rows, or NULL: its kernel (ps may be NULL). */
const tj_dense_layer *tj_paths_dense(const tj_paths *ps, int64_t layer, int64_t m);
/* Why layer `layer` takes its path at M rows (one line). Borrowed from ps; "" when ps is NULL. */
const char *tj_paths_why(const tj_paths *ps, int64_t layer, int64_t m);
/* 1 when a kernel config (JSON; NULL: the default) computes in bf16 (activations, output or
 * stored weights): the fp32 rule then does not apply. */
int tj_paths_config_bf16(const char *json);
void tj_paths_free(tj_paths *ps);

#endif
