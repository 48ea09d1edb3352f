/* Random patterns for benchmarks and tests (not for pruning real models: see prune/). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pattern/random.h"
#include "base/rng.h"

/* Picks `count` distinct values of [0, range) in increasing order (selection sampling). */
static void pick_sorted(tj_rng *r, int64_t range, int64_t count, int64_t *out64, int32_t *out32)
{
    int64_t chosen = 0;
    for (int64_t i = 0; i < range && chosen < count; i++) {
        if ((int64_t)tj_rng_below(r, (uint64_t)(range - i)) < count - chosen) {
            if (out64) out64[chosen] = i;
            else out32[chosen] = (int32_t)i;
            chosen++;
        }
    }
}

tj_status tj_random_layer(const tj_random_spec *spec, const char *name, tj_layer *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    if (spec->n <= 0 || spec->k <= 0 || spec->g <= 0 || spec->g > spec->n || spec->n > TJ_MAX_DIM || spec->k > TJ_MAX_DIM)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "random pattern: need 0 < g <= n and positive n, k (got n=%lld k=%lld g=%lld)",
                       (long long)spec->n, (long long)spec->k, (long long)spec->g);
    if (!(spec->sparsity >= 0 && spec->sparsity < 1))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "random pattern: sparsity %g is outside [0, 1)", spec->sparsity);
    tj_rng rng = {spec->seed * 0x2545f4914f6cdd1dull + 1};
    double keep_rows = 1 - spec->sparsity;
    out->name = strdup(name);
    out->n = spec->n;
    out->k = spec->k;
    out->g = spec->g;
    out->act = spec->act;
    out->ncols = spec->n;
    if (!out->name) goto oom;
    if (spec->mode == 2) {
        double keep = sqrt(1 - spec->sparsity);
        keep_rows = keep;
        int64_t nc = llround(keep * (double)spec->n);
        if (nc < 1) nc = 1;
        out->ncols = nc;
        out->cols = malloc((size_t)nc * sizeof *out->cols);
        if (!out->cols) goto oom;
        pick_sorted(&rng, spec->n, nc, out->cols, NULL);
    }
    out->ntiles = (out->ncols + spec->g - 1) / spec->g;
    int64_t rows = llround(keep_rows * (double)spec->k);
    if (rows > spec->k) rows = spec->k;
    out->tile_ptr = malloc((size_t)(out->ntiles + 1) * sizeof *out->tile_ptr);
    out->tile_rows = malloc((size_t)(out->ntiles * rows + 1) * sizeof *out->tile_rows);
    if (!out->tile_ptr || !out->tile_rows) goto oom;
    out->tile_ptr[0] = 0;
    for (int64_t t = 0; t < out->ntiles; t++) {
        int64_t nr = rows;
        if (spec->empty_tile_fraction > 0 && (double)(tj_rng_next(&rng) >> 11) / 9007199254740992.0 < spec->empty_tile_fraction)
            nr = 0;
        pick_sorted(&rng, spec->k, nr, NULL, out->tile_rows + out->tile_ptr[t]);
        out->tile_ptr[t + 1] = out->tile_ptr[t] + nr;
    }
    if (spec->ew_fraction > 0) {
        /* Per output row, a few random weights outside the row's tile. */
        int64_t per_row = llround(spec->ew_fraction * (double)spec->k);
        if (per_row < 1) per_row = 1;
        int64_t *tile_of = malloc((size_t)spec->n * sizeof *tile_of);
        char *kept = malloc((size_t)spec->k);
        out->ew_indptr = malloc((size_t)(spec->n + 1) * sizeof *out->ew_indptr);
        out->ew_indices = malloc((size_t)(spec->n * per_row + 1) * sizeof *out->ew_indices);
        if (!tile_of || !kept || !out->ew_indptr || !out->ew_indices) { free(tile_of); free(kept); goto oom; }
        for (int64_t i = 0; i < spec->n; i++) tile_of[i] = -1;
        for (int64_t j = 0; j < out->ncols; j++) tile_of[tj_layer_col(out, j)] = j / spec->g;
        int64_t nnz = 0;
        out->ew_indptr[0] = 0;
        for (int64_t row = 0; row < spec->n; row++) {
            memset(kept, 0, (size_t)spec->k);
            if (tile_of[row] >= 0)
                for (int64_t i = out->tile_ptr[tile_of[row]]; i < out->tile_ptr[tile_of[row] + 1]; i++) kept[out->tile_rows[i]] = 1;
            int64_t want = per_row;
            for (int64_t kk = 0; kk < spec->k && want > 0; kk++) {
                if (kept[kk]) continue;
                if (tj_rng_below(&rng, (uint64_t)(spec->k - kk)) < (uint64_t)want) {
                    out->ew_indices[nnz++] = (int32_t)kk;
                    want--;
                }
            }
            out->ew_indptr[row + 1] = nnz;
        }
        out->ew_nnz = nnz;
        free(tile_of);
        free(kept);
    }
    TJ_TRY(tj_layer_validate(out, "random pattern", err));
    out->hash = tj_layer_hash(out);
    return TJ_OK;
oom:
    tj_layer_free(out);
    return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "random pattern: out of memory");
}
