/* tilejit/pattern.h — the tile-wise pattern in memory: read and validate a pattern file, inspect
 * its layers, write it back, make random layers. The file format is in docs/formats.md; the
 * rules a valid layer obeys are listed at tj_layer_validate. */
#include "tilejit.h"
#ifndef TILEJIT_PATTERN_H
#define TILEJIT_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Hard limits that keep a hostile file from asking for absurd allocations. */
#define TJ_MAX_DIM ((int64_t)1 << 24)       /* n, k, g */
#define TJ_MAX_LAYERS 100000
#define TJ_MAX_NAME 1000                    /* bytes of a layer name (tensor names add ".weight") */

/* One layer: W is n × k (out × in features). The kept output features (all n, or the
 * increasing list cols) are cut into tiles of g consecutive kept features; each tile keeps a
 * sorted set of input-feature rows; an optional unstructured residual `ew` (CSR over the n
 * output rows) adds single weights. Borrowed from its pattern. */
typedef struct tj_layer {
    char *name;
    int64_t n, k, g;
    int64_t ncols;        /* kept output features */
    int64_t *cols;        /* increasing, ncols entries; NULL when all n are kept (then ncols == n) */
    int64_t ntiles;       /* ceil(ncols / g) */
    int64_t *tile_ptr;    /* ntiles + 1 offsets into tile_rows */
    int32_t *tile_rows;   /* each tile's kept input features, increasing */
    int64_t *ew_indptr;   /* CSR over n output rows (n + 1 entries); NULL when no ew */
    int32_t *ew_indices;
    int64_t ew_nnz;
    tj_activation act;
    uint64_t hash;        /* tj_layer_hash, set by the parser / builders */
} tj_layer;

typedef struct tj_pattern {
    int64_t nlayers;
    tj_layer *layers;
} tj_pattern;

/* Width of tile t: g, except the last tile may be shorter. */
static inline int64_t tj_tile_width(const tj_layer *l, int64_t t)
{
    int64_t w = l->ncols - t * l->g;
    return w < l->g ? w : l->g;
}
static inline int64_t tj_tile_nrows(const tj_layer *l, int64_t t)
{
    return l->tile_ptr[t + 1] - l->tile_ptr[t];
}
/* Output feature of the j-th kept column. */
static inline int64_t tj_layer_col(const tj_layer *l, int64_t j) { return l->cols ? l->cols[j] : j; }

/* Reads and validates a pattern file. On error, err names file, layer, field, value. */
TJ_API tj_status tj_pattern_load(const char *path, tj_pattern **out, tj_error *err);
/* The same from a buffer; `what` names the source in messages. */
TJ_API tj_status tj_pattern_parse(const char *text, size_t len, const char *what, tj_pattern **out,
                                  tj_error *err);
TJ_API void tj_pattern_destroy(tj_pattern *p);
/* The layer named `name`, borrowed, or NULL. */
TJ_API const tj_layer *tj_pattern_find(const tj_pattern *p, const char *name);

/* Checks one layer against every rule of the format (docs/formats.md): dimensions within
 * limits, cols increasing and below n, tile_ptr monotone, rows of a tile increasing and below
 * k, ew CSR well formed. `what` prefixes messages. */
TJ_API tj_status tj_layer_validate(const tj_layer *l, const char *what, tj_error *err);
/* Canonical content hash (independent of name and JSON formatting). */
TJ_API uint64_t tj_layer_hash(const tj_layer *l);
/* Kept weights: TW-kept plus ew. */
TJ_API int64_t tj_layer_kept(const tj_layer *l);
/* Frees a layer's arrays (for layers a caller filled, e.g. tj_random_layer). */
TJ_API void tj_layer_free(tj_layer *l);

/* Serialises to the JSON format. */
TJ_API tj_status tj_pattern_save(const tj_pattern *p, const char *path, tj_error *err);
TJ_API char *tj_pattern_to_json(const tj_pattern *p); /* malloc'ed; NULL if out of memory */

TJ_API const char *tj_activation_name(tj_activation a);
TJ_API int tj_activation_parse(const char *s, tj_activation *out); /* 1 on success */

/* Random tile-wise layers like the benchmark harness's: every tile keeps the same number of
 * random rows; tw2 first drops 1 − sqrt(1 − s) of the columns. */
typedef struct tj_random_spec {
    int64_t n, k, g;
    double sparsity;       /* overall, in [0, 1) */
    int mode;              /* 1: tw1, 2: tw2 */
    uint64_t seed;
    double ew_fraction;    /* extra unstructured weights as a fraction of n·k (0: no ew) */
    double empty_tile_fraction; /* fraction of tiles made empty (tests) */
    tj_activation act;
} tj_random_spec;

/* Fills *out (caller frees with tj_layer_free); name is copied. */
TJ_API tj_status tj_random_layer(const tj_random_spec *spec, const char *name, tj_layer *out, tj_error *err);

#ifdef __cplusplus
}
#endif
#endif
