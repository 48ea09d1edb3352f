/* The tile-wise pattern in memory: what parse.c reads from JSON, validate.c checks, plan and the
 * emitters consume, and pattern_write.c writes back. Notation of DESIGN.md §1. */
#ifndef TJ_PATTERN_H
#define TJ_PATTERN_H

#include <stdint.h>

#include "base/error.h"

/* Hard limits that keep a hostile file from asking for absurd allocations. */
#define TJ_MAX_DIM ((int64_t)1 << 24)       /* n, k, g */
#define TJ_MAX_LAYERS 100000
#define TJ_MAX_NAME 1000                    /* bytes of a layer name (tensor names add ".weight") */

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

/* Reads and validates a pattern file (parse.c). On error, err names file, layer, field, value. */
tj_status tj_pattern_load(const char *path, tj_pattern **out, tj_error *err);
/* The same from a buffer; `what` names the source in messages. */
tj_status tj_pattern_parse(const char *text, size_t len, const char *what, tj_pattern **out,
                           tj_error *err);
void tj_pattern_destroy(tj_pattern *p);

/* Checks one layer against every rule of DESIGN.md §2 (validate.c). `what` prefixes messages. */
tj_status tj_layer_validate(const tj_layer *l, const char *what, tj_error *err);
/* Canonical content hash (independent of name and JSON formatting). */
uint64_t tj_layer_hash(const tj_layer *l);
/* Kept weights: TW-kept plus ew. */
int64_t tj_layer_kept(const tj_layer *l);
void tj_layer_free(tj_layer *l);

/* Serialises to the JSON format (pattern_write.c). */
tj_status tj_pattern_save(const tj_pattern *p, const char *path, tj_error *err);
char *tj_pattern_to_json(const tj_pattern *p); /* malloc'ed; NULL if out of memory */

const char *tj_activation_name(tj_activation a);
int tj_activation_parse(const char *s, tj_activation *out);

#endif
