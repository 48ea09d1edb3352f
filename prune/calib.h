/* Calibrated tile-wise pruning: per-layer input statistics H = X̃ᵀX̃ (X̃ = [X, 1]) → greedy OBS
 * selection of each tile's kept input features with the tile's shared H⁻¹ → the exact ridge
 * least-squares rebuild of the tile's weights and bias → new weights, bias and pattern; plus the
 * allocation of densities across layers (multiple-choice knapsack over a measured loss table,
 * with a weight or a latency budget). Sits beside prune.c; its output is an ordinary pattern and
 * a weights file. The maths and the file formats are documented in docs/pruning-calibrated.md.
 *
 *   calib.c        statistics lookup and checks, OBS order, Cholesky rebuild, tw1/tw2/tew, sweeps
 *   alloc.c        the knapsack and the loss-table (profile) JSON reader
 *   calib_write.c  the weights file with rebuilt weights and biases
 *   calib_run.c    the drivers: tj_prune_calibrated_run (files) and the in-memory calls
 */
#ifndef TJ_PRUNE_CALIB_H
#define TJ_PRUNE_CALIB_H

#include <stddef.h>
#include <stdint.h>

#include "prune/prune.h"
#include "tilejit/prune.h"

/* ---- calibration statistics (a safetensors file) ----
 * For each layer NAME with k input features:
 *   NAME.hessian  F64 [k+1, k+1]  Σ over calibration tokens of x̃ x̃ᵀ, x̃ = [x_0 .. x_{k-1}, 1]
 *                                 (the last row/column belongs to the bias' ones column)
 *   NAME.tokens   I64 [1]         number of tokens summed (must equal NAME.hessian[k][k])
 *   NAME.cross    F64 [k+1, k+1]  optional: Σ over the same tokens of x̃ x̃_refᵀ, x̃_ref the input the
 *                                 DENSE model gives the layer for the same token (x̃ from the model
 *                                 being pruned). With it the rebuild targets the dense model's output
 *                                 W̃ x̃_ref instead of W̃ x̃ (see docs/pruning-calibrated.md).
 *   NAME.residual F64 [k+1, n]    optional: Σ over the same tokens of x̃ (r_ref − r)ᵀ, where r is the
 *                                 residual the layer's output is added to (before a LayerNorm) in
 *                                 the model being pruned and r_ref the dense model's: the rebuild
 *                                 then also makes up for the residual stream's drift.
 * __metadata__ {"format": "tilejit-calibration", "version": "1", ...}. */
typedef struct tj_calib_stats {
    const double *h; /* [(k+1) × (k+1)], borrowed from the mapped file (may be unaligned: see calib.c) */
    int64_t dim;     /* k + 1 */
    int64_t tokens;
    const double *cross; /* NULL, or [(k+1) × (k+1)] Σ x̃ x̃_refᵀ (row: pruned input, column: dense) */
    const double *resid; /* NULL, or [(k+1) × n] Σ x̃ (r_ref − r)ᵀ: the drift of the residual stream
                            that this layer's output is added to (see NAME.residual) */
} tj_calib_stats;

/* Finds and checks the statistics of layer L in a statistics file: both tensors present, the
 * shapes matching L's k (a mismatch names both: statistics for another model), the token count
 * positive and equal to the ones column's diagonal, every entry finite; NAME.cross, when present,
 * checked the same way (its [k][k] entry counts the tokens too); NAME.residual, when present,
 * must be F64 [k+1, n] with finite entries. */
tj_status tj_calib_stats_find(const tj_st_file *stats, const tj_prune_layer_in *L, tj_calib_stats *out,
                              tj_error *err);

/* The same checks for statistics given as arrays (h, and cross or NULL, [(k+1) × (k+1)] F64;
 * resid or NULL, [(k+1) × n] F64; all may be unaligned): the token count positive and equal to the
 * [k][k] entries, every entry finite. `where` starts the error message (a file, or the API call). */
tj_status tj_calib_stats_check(const char *where, const tj_prune_layer_in *L, const void *h, const void *cross,
                               const void *resid, int64_t tokens, tj_error *err);

typedef struct tj_calib_options {
    size_t size;     /* sizeof(tj_calib_options) */
    double damp;     /* ridge λ = damp × mean(diag H[0..k)), added to the k input features' diagonal
                        (not the bias column); default 0.001; 0 is allowed (then a
                        singular H is an error) */
    int threads;     /* tiles rebuilt in parallel; 0: one per online core */
    /* Called after each layer (may be NULL). Must not call back into the pruner. */
    void (*progress)(void *user, const char *layer, int64_t done, int64_t total);
    void *progress_user;
} tj_calib_options;

tj_calib_options tj_calib_options_default(void);

/* One layer to prune with calibration. Inputs borrowed; outputs owned by the caller. */
typedef struct tj_calib_layer {
    const tj_prune_layer_in *in; /* weights (score ignored) */
    const void *bias;            /* [n] or NULL (then the original bias is 0) */
    tj_dtype bdt;
    tj_calib_stats stats;
    double density;              /* kept fraction of this layer's weights, in [0, 1] */
    const int64_t *tile_keep;    /* optional, tw1 only: kept input features per tile (overrides
                                    density; used by the global allocation) */
} tj_calib_layer;

/* Prunes each layer to its density with OBS selection and the least-squares rebuild:
 *   tw1: tiles of g output features; each keeps round(density·k) input features.
 *   tw2: output features first, ranked by the variance of their output over the calibration
 *        tokens (a dropped one keeps its mean output as bias); sqrt(density) of them are kept,
 *        re-tiled, and each tile keeps round(sqrt(density)·k) input features.
 *   tew: tw1 at density − F, then per layer the F·n·k removed weights with the largest
 *        first-order gain on the remaining output error come back as ew, fitted by least
 *        squares with the tile-wise weights held.
 * out_w[l] gets [n × k] fp32 weights (zero outside the mask), out_b[l] the new bias [n]
 * (both malloc'ed, caller frees); *out the pattern (tj_pattern_destroy). */
tj_status tj_prune_calibrated(const tj_calib_layer *layers, int64_t nlayers, const tj_prune_options *opt,
                              const tj_calib_options *copt, tj_pattern **out, float **out_w, float **out_b,
                              tj_error *err);

/* tw1 sweep for the allocation profile: one OBS pass per tile gives nested kept sets, one
 * Cholesky of the tile's permuted H gives every density's rebuild. For each of nd densities,
 * w[d] ([n × k]) and b[d] ([n]) receive the rebuilt layer (caller-allocated; w[d] NULL: skip
 * that density's weights). errors (optional, nd entries) receives each density's relative
 * output error Σ (w̃−w̃')ᵀHd(w̃−w̃') / Σ w̃ᵀHd w̃ over all rows (w̃ = [w, bias]), read off the
 * factor without solving. */
tj_status tj_prune_calibrated_sweep(const tj_calib_layer *layer, int64_t g, const double *densities, int64_t nd,
                                    const tj_calib_options *copt, float *const *w, float *const *b, double *errors,
                                    tj_error *err);

/* The allocation (knapsack, loss table) is public: include/tilejit/prune.h. */

/* Writes `path`: every tensor of `weights` as it is, except each pattern layer's NAME.weight
 * (w[l], converted to the tensor's dtype) and NAME.bias (b[l]; added as F32 [n] when the file
 * has none). Streams one tensor at a time; temp file + rename. */
tj_status tj_prune_write_rebuilt(const tj_st_file *weights, const tj_pattern *p, const float *const *w,
                                 const float *const *b, const char *path, tj_error *err);

#endif
