/* pattern/: the tile-wise pattern in memory: what parse.c reads from JSON, validate.c checks,
 * plan and the emitters consume, and write.c writes back. The types and calls are public
 * (tilejit/pattern.h); the format is docs/formats.md. */
#ifndef TJ_PATTERN_H
#define TJ_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

/* Feeds the content of l that generated code depends on to add(ctx, data, len), as a fixed
 * sequence of chunks, one per field, a chunk empty when its field is absent: the shape and
 * activation {n, k, g, ncols, ntiles, act}, cols, tile_ptr, tile_rows, ew_nnz (-1 without ew),
 * ew_indptr, ew_indices. Not the name (nor the hash). The one definition behind tj_layer_hash
 * and the CPU backend's kernel cache key: a field added to tj_layer that changes code goes here. */
void tj_layer_fields(const tj_layer *l, void (*add)(void *ctx, const void *data, size_t len), void *ctx);

#endif
