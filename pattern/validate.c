/* Stage 2: the rules of docs/formats.md on one layer, whoever built it (parser, pruner, bench
 * generator), plus the canonical pattern hash. Linear in the size of the pattern. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pattern/pattern.h"

static tj_status verr(tj_error *err, const char *what, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static tj_status verr(tj_error *err, const char *what, const char *field, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return tj_fail(err, TJ_ERR_FORMAT, "%s: field '%s': %s", what, field, detail);
}

static int row_in_tile(const tj_layer *l, int64_t t, int32_t k)
{
    const int32_t *r = l->tile_rows + l->tile_ptr[t];
    int64_t lo = 0, hi = tj_tile_nrows(l, t);
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (r[mid] < k) lo = mid + 1;
        else hi = mid;
    }
    return lo < tj_tile_nrows(l, t) && r[lo] == k;
}

tj_status tj_layer_validate(const tj_layer *l, const char *what, tj_error *err)
{
    if (l->n <= 0 || l->n > TJ_MAX_DIM) return verr(err, what, "n", "value %lld is not in [1, %lld]", (long long)l->n, (long long)TJ_MAX_DIM);
    if (l->k <= 0 || l->k > TJ_MAX_DIM) return verr(err, what, "k", "value %lld is not in [1, %lld]", (long long)l->k, (long long)TJ_MAX_DIM);
    if (l->g <= 0 || l->g > l->n) return verr(err, what, "g", "value %lld is not in [1, n = %lld]", (long long)l->g, (long long)l->n);
    if (l->ncols < 0 || l->ncols > l->n) return verr(err, what, "cols", "%lld entries for n = %lld", (long long)l->ncols, (long long)l->n);
    if (!l->cols && l->ncols != l->n) return verr(err, what, "cols", "absent but %lld columns kept", (long long)l->ncols);
    for (int64_t j = 0; l->cols && j < l->ncols; j++) {
        if (l->cols[j] < 0 || l->cols[j] >= l->n)
            return verr(err, what, "cols", "entry %lld: value %lld is out of range [0, %lld)", (long long)j, (long long)l->cols[j], (long long)l->n);
        if (j > 0 && l->cols[j] <= l->cols[j - 1])
            return verr(err, what, "cols", "entry %lld: value %lld is not greater than the previous %lld (must be strictly increasing)",
                        (long long)j, (long long)l->cols[j], (long long)l->cols[j - 1]);
    }
    int64_t want = (l->ncols + l->g - 1) / l->g;
    if (l->ntiles != want)
        return verr(err, what, "tiles", "has %lld tiles, expected ceil(%lld / %lld) = %lld", (long long)l->ntiles, (long long)l->ncols, (long long)l->g, (long long)want);
    if (l->tile_ptr[0] != 0) return verr(err, what, "tiles", "tile offsets do not start at 0");
    for (int64_t t = 0; t < l->ntiles; t++) {
        int64_t nr = tj_tile_nrows(l, t);
        if (nr < 0 || nr > l->k) return verr(err, what, "tiles", "tile %lld has %lld rows (k = %lld)", (long long)t, (long long)nr, (long long)l->k);
        const int32_t *r = l->tile_rows + l->tile_ptr[t];
        for (int64_t i = 0; i < nr; i++) {
            if (r[i] < 0 || r[i] >= l->k)
                return verr(err, what, "tiles", "tiles[%lld] entry %lld: value %d is out of range [0, %lld)", (long long)t, (long long)i, r[i], (long long)l->k);
            if (i > 0 && r[i] <= r[i - 1])
                return verr(err, what, "tiles", "tiles[%lld] entry %lld: value %d is not greater than the previous %d (must be strictly increasing)",
                            (long long)t, (long long)i, r[i], r[i - 1]);
        }
    }
    if (!l->ew_indptr) {
        if (l->ew_nnz != 0) return verr(err, what, "ew", "entries without indptr");
        return TJ_OK;
    }
    if (l->ew_indptr[0] != 0) return verr(err, what, "ew.indptr", "entry 0: value %lld, expected 0", (long long)l->ew_indptr[0]);
    if (l->ew_indptr[l->n] != l->ew_nnz)
        return verr(err, what, "ew.indptr", "last entry %lld does not equal the number of indices %lld", (long long)l->ew_indptr[l->n], (long long)l->ew_nnz);
    /* Which tile (if any) each output feature belongs to, to reject ew entries TW already keeps. */
    int64_t *tile_of = malloc((size_t)l->n * sizeof *tile_of);
    if (!tile_of) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    for (int64_t i = 0; i < l->n; i++) tile_of[i] = -1;
    for (int64_t j = 0; j < l->ncols; j++) tile_of[tj_layer_col(l, j)] = j / l->g;
    tj_status s = TJ_OK;
    for (int64_t row = 0; row < l->n && s == TJ_OK; row++) {
        int64_t b = l->ew_indptr[row], e = l->ew_indptr[row + 1];
        if (e < b) {
            s = verr(err, what, "ew.indptr", "entry %lld: value %lld is smaller than the previous %lld (must not decrease)", (long long)row + 1, (long long)e, (long long)b);
            break;
        }
        if (e > l->ew_nnz) {
            s = verr(err, what, "ew.indptr", "entry %lld: value %lld exceeds the number of indices %lld", (long long)row + 1, (long long)e, (long long)l->ew_nnz);
            break;
        }
        for (int64_t i = b; i < e; i++) {
            int32_t kk = l->ew_indices[i];
            if (kk < 0 || kk >= l->k) {
                s = verr(err, what, "ew.indices", "entry %lld (row %lld): value %d is out of range [0, %lld)", (long long)i, (long long)row, kk, (long long)l->k);
                break;
            }
            if (i > b && kk <= l->ew_indices[i - 1]) {
                s = verr(err, what, "ew.indices", "entry %lld (row %lld): value %d is not greater than the previous %d (must be strictly increasing per row)",
                         (long long)i, (long long)row, kk, l->ew_indices[i - 1]);
                break;
            }
            if (tile_of[row] >= 0 && row_in_tile(l, tile_of[row], kk)) {
                s = verr(err, what, "ew.indices", "entry %lld: weight (%lld, %d) is already kept by tile %lld (ew must not repeat a tile-wise kept weight)",
                         (long long)i, (long long)row, kk, (long long)tile_of[row]);
                break;
            }
        }
    }
    free(tile_of);
    return s;
}

static uint64_t mix(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The tj_layer this walk was written against: a field added to tj_layer fails the build here
 * until it is walked below (when code depends on it) and added to the mirror. */
struct layer_seen {
    char *name;
    int64_t n, k, g, ncols, *cols, ntiles, *tile_ptr;
    int32_t *tile_rows;
    int64_t *ew_indptr;
    int32_t *ew_indices;
    int64_t ew_nnz;
    tj_activation act;
    uint64_t hash;
};
_Static_assert(sizeof(tj_layer) == sizeof(struct layer_seen), "tj_layer changed: does tj_layer_fields need the new field?");

void tj_layer_fields(const tj_layer *l, void (*add)(void *ctx, const void *data, size_t len), void *ctx)
{
    int64_t head[6] = {l->n, l->k, l->g, l->ncols, l->ntiles, (int64_t)l->act};
    add(ctx, head, sizeof head);
    add(ctx, l->cols, l->cols ? (size_t)l->ncols * sizeof *l->cols : 0);
    add(ctx, l->tile_ptr, (size_t)(l->ntiles + 1) * sizeof *l->tile_ptr);
    add(ctx, l->tile_rows, (size_t)l->tile_ptr[l->ntiles] * sizeof *l->tile_rows);
    int64_t ew = l->ew_indptr ? l->ew_nnz : -1;
    add(ctx, &ew, sizeof ew);
    add(ctx, l->ew_indptr, l->ew_indptr ? (size_t)(l->n + 1) * sizeof *l->ew_indptr : 0);
    add(ctx, l->ew_indices, l->ew_indptr ? (size_t)l->ew_nnz * sizeof *l->ew_indices : 0);
}

/* FNV-1a over the chunks' bytes (an empty chunk leaves h as it is) */
static void hash_add(void *ctx, const void *data, size_t len)
{
    uint64_t *h = ctx;
    *h = mix(*h, data, len);
}

uint64_t tj_layer_hash(const tj_layer *l)
{
    uint64_t h = 1469598103934665603ull;
    tj_layer_fields(l, hash_add, &h);
    return h;
}

int64_t tj_layer_kept(const tj_layer *l)
{
    int64_t kept = 0;
    for (int64_t t = 0; t < l->ntiles; t++) kept += tj_tile_nrows(l, t) * tj_tile_width(l, t);
    return kept + l->ew_nnz;
}

const char *tj_activation_name(tj_activation a)
{
    switch (a) {
    case TJ_ACT_RELU: return "relu";
    case TJ_ACT_GELU: return "gelu";
    default: return "none";
    }
}

int tj_activation_parse(const char *s, tj_activation *out)
{
    if (strcmp(s, "none") == 0) *out = TJ_ACT_NONE;
    else if (strcmp(s, "relu") == 0) *out = TJ_ACT_RELU;
    else if (strcmp(s, "gelu") == 0) *out = TJ_ACT_GELU;
    else return 0;
    return 1;
}

const tj_layer *tj_pattern_find(const tj_pattern *p, const char *name)
{
    for (int64_t i = 0; p && name && i < p->nlayers; i++)
        if (strcmp(p->layers[i].name, name) == 0) return &p->layers[i];
    return NULL;
}
