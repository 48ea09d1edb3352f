/* tilejit/prune.h — pruning: dense (or already pruned) weights → a tile-wise pattern with one
 * global threshold across layers (tw1, tw2, tew), the pruned weights file, and the pattern read
 * back from the zeros of pruned weights. docs/pruning.md explains the method. */
#include "tilejit.h"
#ifndef TILEJIT_PRUNE_H
#define TILEJIT_PRUNE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tj_prune_mode {
    TJ_PRUNE_TW1 = 1, /* per tile of g output features, whole input-feature rows are pruned */
    TJ_PRUNE_TW2 = 2, /* global output-feature (column) pruning first, re-tiling, then tw1 */
    TJ_PRUNE_TEW = 3  /* tw1 (or tw2) at S + F, then the top F of weights back as the ew residual */
} tj_prune_mode;

/* One layer to prune: W [n × k] and optional per-element scores of the same shape. Borrowed. */
typedef struct tj_prune_layer_in {
    const char *name;  /* layer name: the tensor name without ".weight" */
    int64_t n, k;
    const void *w;
    tj_dtype wdt;
    const void *score; /* NULL: the weights' magnitude |w| is the score */
    tj_dtype sdt;
} tj_prune_layer_in;

typedef struct tj_prune_options {
    size_t size;            /* sizeof(tj_prune_options); set by tj_prune_options_default */
    double sparsity;        /* S, the overall fraction of weights removed, in [0, 1) */
    int64_t g;              /* tile width (layers with n < g get g = n) */
    tj_prune_mode mode;
    tj_prune_mode tew_base; /* TW1 (default) or TW2: the tile-wise part of tew */
    double ew_fraction;     /* F for tew, in (0, 1) with S + F < 1: the residual, as a fraction of all weights */
} tj_prune_options;

/* S = 0.75, g = 128, tw1, F = 0.01. */
TJ_API tj_prune_options tj_prune_options_default(void);
TJ_API const char *tj_prune_mode_name(tj_prune_mode m);
TJ_API int tj_prune_mode_parse(const char *s, tj_prune_mode *out);

/* Prunes the layers together: one global threshold over all tile-rows (and, for tw2, over all
 * columns; for tew, over all removed weights), so per-layer sparsity comes out non-uniform.
 * Scores: a tile-row's is the L2 norm of its element scores divided by its length (a column's
 * likewise over k); ties are broken by position, so the result is deterministic. The layers of
 * *out are in the order given, with activation none. Caller frees *out (tj_pattern_destroy). */
TJ_API tj_status tj_prune_layers(const tj_prune_layer_in *in, int64_t nlayers, const tj_prune_options *opt,
                          tj_pattern **out, tj_error *err);

/* The layers of a weights file: tensors NAME.weight whose NAME matches the POSIX extended regex
 * (unanchored, like grep -E), or by default every 2-D floating-point NAME.weight except
 * embedding tables (names containing "embed": they are looked up, not multiplied). A selected
 * tensor that is not 2-D or not F32/F16/BF16 is an error, as is selecting nothing. With a scores
 * file, each layer's scores are its tensor NAME.weight there, else NAME.score (same shape as the
 * weights). Layers come in
 * natural name order (layer.2 before layer.10). *out points into the mapped files for data;
 * the caller frees the array (names included) with one free(). */
TJ_API tj_status tj_prune_select(const tj_st_file *weights, const char *regex, const tj_st_file *scores,
                          tj_prune_layer_in **out, int64_t *nlayers, tj_error *err);

/* Writes `path`: every tensor of `weights` in the same dtype and shape; for each layer of the
 * pattern, its NAME.weight with every weight outside the mask set to zero. Holds one layer's
 * output at a time (the input stays mapped). The file appears atomically (temp + rename). */
TJ_API tj_status tj_prune_write_weights(const tj_st_file *weights, const tj_pattern *p, const char *path,
                                 tj_error *err);

/* Reads a pattern back from zeros in pruned weights, per layer (g = n when n < g): an input
 * feature is kept in a tile iff some weight of the tile's output features is nonzero there. Two
 * tilings are weighed: over all n output features, and over only those with a nonzero weight
 * (the others becoming pruned `cols`); the second is chosen only when it keeps fewer weights.
 * So tw1 patterns come back unchanged even with empty tiles, and tw2 patterns come back
 * unchanged unless a tile lost every row (the mask is the same either way). No ew is recovered:
 * a weight outside full tile-rows makes its row kept in its tile. Caller frees *out. */
TJ_API tj_status tj_pattern_from_weights(const tj_prune_layer_in *in, int64_t nlayers, int64_t g, tj_pattern **out,
                                  tj_error *err);

/* ---- allocation of densities across layers (calibrated pruning, docs/pruning-calibrated.md):
 * a measured loss table (1 − output cosine with one layer pruned to density d_j) and a budget, in
 * kept weights or milliseconds. */

/* Multiple-choice knapsack: for each of nl layers pick one of nc choices (cost[l·nc + c] ≥ 0,
 * loss[l·nc + c] finite) minimising Σ loss with Σ cost ≤ budget. Costs are integers in units
 * (weights, or time quanta, see tj_prune_allocate); the dynamic program is exact over them.
 * choice[l] receives the index. An infeasible budget (the cheapest choices exceed it) is an
 * error that names the minimum. Ties go to the cheaper total, then to lower choice indices. */
TJ_API tj_status tj_knapsack_solve(const int64_t *cost, const double *loss, int64_t nl, int64_t nc, int64_t budget,
                            int64_t *choice, tj_error *err);

/* The loss table written by the profiling driver (JSON, format "tilejit-prune-profile", v1):
 *   {"format": "tilejit-prune-profile", "version": 1, "densities": [d_0, ...],
 *    "layers": [{"name": ..., "n": N, "k": K, "loss": [...], "time_ms": [...]}, ...]}
 * densities in [0, 1]; loss (1 − output cosine with that layer alone at d_j) one per density;
 * time_ms optional (needed for a latency budget). */
typedef struct tj_prune_profile {
    int64_t nd, nl;
    double *densities;
    char **names;
    int64_t *n, *k;
    double *loss;    /* [nl × nd] */
    double *time_ms; /* [nl × nd], or NULL when some layer has none */
} tj_prune_profile;

TJ_API tj_status tj_prune_profile_load(const char *path, tj_prune_profile **out, tj_error *err);
TJ_API void tj_prune_profile_destroy(tj_prune_profile *p);

/* Per-layer densities from a profile: with budget_ms ≤ 0, the kept weights of all profile
 * layers (round(d·k)·n each) stay within (1 − sparsity) of their total; with budget_ms > 0,
 * their summed time_ms stays within budget_ms (times quantised to budget/4096, rounded up, so
 * the budget is never exceeded). density[l] for profile layer l; choice (NULL, or nl entries)
 * gets the index of that density in p->densities (the knapsack's pick, so a caller needs no float
 * comparison to find its loss or time). */
TJ_API tj_status tj_prune_allocate(const tj_prune_profile *p, double sparsity, double budget_ms, double *density,
                                   int64_t *choice, tj_error *err);

/* ---- calibrated pruning (`tilejit prune --calibration ...`) ------------------------------- */

/* How much each layer keeps in tj_prune_calibrated_run. */
typedef enum tj_prune_allocation {
    TJ_PRUNE_ALLOC_UNIFORM = 0, /* every layer at 1 − sparsity */
    TJ_PRUNE_ALLOC_GLOBAL,      /* the plain pruner's global threshold decides (tw1: per tile too) */
    TJ_PRUNE_ALLOC_MEASURED     /* from a loss table (profile), within the sparsity or budget_ms */
} tj_prune_allocation;

typedef struct tj_prune_calibrated_options {
    size_t size;                    /* sizeof(tj_prune_calibrated_options); set by the _default */
    tj_prune_options prune;         /* mode, g, sparsity, ew_fraction, tew_base */
    const char *calibration;        /* calibration statistics (safetensors from python -m tilejit.calibrate) */
    tj_prune_allocation allocation; /* default uniform */
    const char *profile;            /* loss table (TJ_PRUNE_ALLOC_MEASURED) */
    double budget_ms;               /* > 0: latency budget instead of the sparsity (measured) */
    double damp;                    /* ridge λ = damp × mean(diag H); default 0.001 */
    int threads;                    /* tiles rebuilt in parallel; 0: one per online core */
    const char *sweep_out;          /* not NULL: write the sweep file instead of pruning */
    int64_t sweep_steps;            /* densities j/steps, j = 0 .. steps − 1; default 16 */
    const char *sweep_weights;      /* "j1,j2,...": the j whose weights the sweep file holds; NULL: all */
    const char *pattern_out;        /* the pattern written (not sweeping) */
    const char *pruned_out;         /* the rebuilt weights written, or NULL */
    /* Called after each layer (may be NULL). */
    void (*progress)(void *user, const char *layer, int64_t done, int64_t total);
    void *progress_user;
} tj_prune_calibrated_options;

TJ_API tj_prune_calibrated_options tj_prune_calibrated_options_default(void);

typedef struct tj_prune_calibrated_result {
    size_t size;       /* sizeof(tj_prune_calibrated_result) */
    double prune_s;    /* seconds pruning and rebuilding */
    double write_s;    /* seconds writing the pattern and weights */
    double latency_ms; /* with a budget and the loss table's times: the summed time of the chosen
                        * densities; else −1 */
} tj_prune_calibrated_result;

/* The calibrated pruner over the layers tj_prune_select picked from `weights` (OBS selection and
 * a least-squares rebuild against the calibration statistics): writes o->pattern_out (and
 * o->pruned_out), or with o->sweep_out the sweep file (tensors "d<j>/NAME.weight" and
 * "d<j>/NAME.bias", "NAME.error" and "densities"). *pattern (not sweeping; may be NULL) gets the
 * pattern, which the caller destroys. */
TJ_API tj_status tj_prune_calibrated_run(const tj_st_file *weights, const tj_prune_layer_in *in, int64_t nlayers,
                                         const tj_prune_calibrated_options *o, tj_pattern **pattern,
                                         tj_prune_calibrated_result *res, tj_error *err);

/* ---- calibrated pruning in memory (a driver that holds the model and collects the statistics
 * itself, as python -m tilejit.calibrate does): the same pruner, no files. */

/* One layer and the statistics of its inputs, as the statistics file holds them (NAME.hessian,
 * NAME.cross, NAME.tokens). All borrowed for the call. */
typedef struct tj_prune_calibrated_layer {
    tj_prune_layer_in layer; /* name, n, k, w, wdt (score ignored) */
    const void *bias;        /* [n] in bdt, or NULL (the original bias is 0) */
    tj_dtype bdt;
    const double *hessian;   /* [(k+1) × (k+1)] row-major: Σ over tokens of x̃ x̃ᵀ, x̃ = [x, 1] */
    const double *cross;     /* NULL (the target is the layer's own output), or [(k+1) × (k+1)]
                                Σ x̃ x̃_refᵀ (the target is the dense model's output) */
    int64_t tokens;          /* tokens summed: must equal hessian[k][k] (and cross[k][k]) */
    double density;          /* kept fraction of the layer's weights, in [0, 1] (tew: both parts) */
    const double *residual;  /* NULL, or [(k+1) × n] Σ x̃ (r_ref − r)ᵀ: the drift of the residual the
                                layer's output is added to (dense model's minus this model's); the
                                target then also makes up for it (docs/pruning-calibrated.md) */
} tj_prune_calibrated_layer;

/* Prunes and rebuilds the layers, each at its density: what tj_prune_calibrated_run does once it
 * has read the statistics and allocated the densities (the same code). Used from o: prune.mode,
 * prune.g, prune.ew_fraction, prune.tew_base, damp, threads, progress; the file and allocation
 * fields are ignored. w[l] ([n × k]) and b[l] ([n]) are the caller's float32 buffers: they
 * receive the rebuilt weights (zero outside the mask) and bias. *pattern gets the pattern (layers
 * in the order given, activation none; tj_pattern_destroy). Errors: statistics that fail the
 * checks a statistics file gets (token count, non-finite entries), a singular H, bad arguments. */
TJ_API tj_status tj_prune_calibrated_layers(const tj_prune_calibrated_layer *in, int64_t nlayers,
                                            const tj_prune_calibrated_options *o, tj_pattern **pattern,
                                            float *const *w, float *const *b, tj_error *err);

/* One layer's tw1 sweep, as --sweep-out computes it: for each j < nd, w[j] ([n × k], or NULL to
 * skip) and b[j] ([n], needed where w[j] is given) receive the rebuild at densities[j]; errors (nd
 * entries, or NULL) the relative output error at each density. Used from o: prune.g, damp,
 * threads; in->density is ignored. */
TJ_API tj_status tj_prune_calibrated_sweep_layer(const tj_prune_calibrated_layer *in, const double *densities,
                                                 int64_t nd, const tj_prune_calibrated_options *o, float *const *w,
                                                 float *const *b, double *errors, tj_error *err);

#ifdef __cplusplus
}
#endif
#endif
