/* Pruning: dense (or already pruned) weights → a tile-wise pattern with the paper's one-shot
 * algorithm (docs/pruning.md: tw1, tw2, tew with one global threshold across layers), the pruned
 * weights file, and the pattern read back from zeros in pruned weights. It sits before gen/:
 * its output is an ordinary pattern (pattern/pattern.h) that parse → validate → plan consume.
 *
 *   select.c   which tensors are layers (--layers REGEX), their weights and optional scores
 *   prune.c    scores → global thresholds → tiles (+ ew residual) → tj_pattern
 *   write.c    the pruned weights file: masked weights zeroed, every other tensor copied
 *   recover.c  pattern from the zeros of pruned weights (`tilejit pattern`)
 */
#ifndef TJ_PRUNE_H
#define TJ_PRUNE_H

#include <stdint.h>

#include "pattern/pattern.h"
#include "base/dtype.h"
#include "base/error.h"
#include "base/safetensors.h"

/* The types (modes, layer inputs, options) and calls are public: tilejit/prune.h. */

/* S = 0.75, g = 128, tw1, F = 0.01. */
tj_prune_options tj_prune_options_default(void);
const char *tj_prune_mode_name(tj_prune_mode m);
int tj_prune_mode_parse(const char *s, tj_prune_mode *out);

/* Prunes the layers together: one global threshold over all tile-rows (and, for tw2, over all
 * columns; for tew, over all removed weights), so per-layer sparsity comes out non-uniform.
 * Scores: a tile-row's is the L2 norm of its element scores divided by its length (a column's
 * likewise over k); ties are broken by position, so the result is deterministic. The layers of
 * *out are in the order given, with activation none. Caller frees *out (tj_pattern_destroy). */
tj_status tj_prune_layers(const tj_prune_layer_in *in, int64_t nlayers, const tj_prune_options *opt,
                          tj_pattern **out, tj_error *err);

/* The layers of a weights file: tensors NAME.weight whose NAME matches the POSIX extended regex
 * (unanchored, like grep -E), or by default every 2-D floating-point NAME.weight except
 * embedding tables (names containing "embed": they are looked up, not multiplied). A selected
 * tensor that is not 2-D or not F32/F16/BF16 is an error, as is selecting nothing. With a scores
 * file, each layer's scores are its tensor NAME.weight there, else NAME.score (same shape as the
 * weights). Layers come in
 * natural name order (layer.2 before layer.10). *out points into the mapped files for data;
 * the caller frees the array (names included) with one free(). */
tj_status tj_prune_select(const tj_st_file *weights, const char *regex, const tj_st_file *scores,
                          tj_prune_layer_in **out, int64_t *nlayers, tj_error *err);

/* Writes `path`: every tensor of `weights` in the same dtype and shape; for each layer of the
 * pattern, its NAME.weight with every weight outside the mask set to zero. Holds one layer's
 * output at a time (the input stays mapped). The file appears atomically (temp + rename). */
tj_status tj_prune_write_weights(const tj_st_file *weights, const tj_pattern *p, const char *path,
                                 tj_error *err);

/* The output tensor list of a weights file rewritten for a pattern (write.c, calib_write.c):
 * outs[i] is wf's tensor i as it is (data borrowed), layer_of[i] = -1, except that each pattern
 * layer's NAME.weight (checked: [n, k], F32/F16/BF16, no layer twice) gets layer_of = the layer
 * and data NULL (the caller's fill function produces it). outs and layer_of: ntensors entries. */
tj_status tj_prune_map_layers(const tj_st_file *wf, const tj_pattern *p, tj_st_out_tensor *outs, int64_t *layer_of,
                              tj_error *err);

/* A layer's NAME.bias in a weights file: *out NULL when there is none; an error when it is not
 * an F32/F16/BF16 vector of n. */
tj_status tj_prune_find_bias(const tj_st_file *wf, const char *layer, int64_t n, const tj_st_tensor **out,
                             tj_error *err);

/* Reads a pattern back from zeros in pruned weights, per layer (g = n when n < g): an input
 * feature is kept in a tile iff some weight of the tile's output features is nonzero there. Two
 * tilings are weighed: over all n output features, and over only those with a nonzero weight
 * (the others becoming pruned `cols`); the second is chosen only when it keeps fewer weights.
 * So tw1 patterns come back unchanged even with empty tiles, and tw2 patterns come back
 * unchanged unless a tile lost every row (the mask is the same either way). No ew is recovered:
 * a weight outside full tile-rows makes its row kept in its tile. Caller frees *out. */
tj_status tj_pattern_from_weights(const tj_prune_layer_in *in, int64_t nlayers, int64_t g, tj_pattern **out,
                                  tj_error *err);

#endif
