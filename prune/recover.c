/* The pattern of already pruned weights (`tilejit pattern`): zeros → pruned columns and, per
 * tile, the input features with any nonzero weight. Two passes over each layer's weights. */
#include <stdlib.h>
#include <string.h>

#include "prune/prune.h"

/* Whether element i is nonzero (-0.0 counts as zero, NaN as nonzero). */
static inline int nonzero(const void *w, tj_dtype d, size_t i)
{
    if (d == TJ_F32) {
        uint32_t u;
        memcpy(&u, (const char *)w + 4 * i, 4);
        return (u & 0x7fffffffu) != 0;
    }
    uint16_t h;
    memcpy(&h, (const char *)w + 2 * i, 2);
    return (h & 0x7fffu) != 0;
}

/* Kept weights of tiles given by their row flags: Σ_t rows_t · width_t. */
static int64_t kept_weights(const unsigned char *any, int64_t ntiles, int64_t k, int64_t ncols, int64_t g)
{
    int64_t kept = 0;
    for (int64_t t = 0; t < ntiles; t++) {
        int64_t rows = 0, width = ncols - t * g < g ? ncols - t * g : g;
        for (int64_t i = 0; i < k; i++) rows += any[t * k + i];
        kept += rows * width;
    }
    return kept;
}

static tj_status recover_layer(const tj_prune_layer_in *L, int64_t g_opt, tj_layer *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    const int64_t n = L->n, k = L->k, g = g_opt < n ? g_opt : n;
    unsigned char *nz = calloc((size_t)n, 1), *anyA = NULL, *anyB = NULL;
    int64_t *rank = malloc((size_t)n * sizeof *rank);
    if (!nz || !rank) goto oom;
    int64_t ncolsB = 0;
    for (int64_t row = 0; row < n; row++) {
        for (int64_t i = 0; i < k; i++)
            if (nonzero(L->w, L->wdt, (size_t)(row * k + i))) {
                nz[row] = 1;
                break;
            }
        rank[row] = nz[row] ? ncolsB++ : -1;
    }
    const int64_t ntA = (n + g - 1) / g, ntB = (ncolsB + g - 1) / g;
    anyA = calloc((size_t)(ntA * k), 1);
    anyB = calloc((size_t)(ntB > 0 ? ntB * k : 1), 1);
    if (!anyA || !anyB) goto oom;
    for (int64_t row = 0; row < n; row++) {
        if (!nz[row]) continue;
        unsigned char *a = anyA + (row / g) * k, *b = anyB + (rank[row] / g) * k;
        for (int64_t i = 0; i < k; i++) {
            unsigned char v = (unsigned char)nonzero(L->w, L->wdt, (size_t)(row * k + i));
            a[i] |= v;
            b[i] |= v;
        }
    }
    /* Tiles over all n features unless tiles over the nonzero ones alone keep fewer weights. */
    int useB = ncolsB < n && kept_weights(anyB, ntB, k, ncolsB, g) < kept_weights(anyA, ntA, k, n, g);
    const unsigned char *any = useB ? anyB : anyA;
    out->name = strdup(L->name);
    out->n = n;
    out->k = k;
    out->g = g;
    out->ncols = useB ? ncolsB : n;
    out->ntiles = useB ? ntB : ntA;
    out->act = TJ_ACT_NONE;
    int64_t nkept = 0;
    for (int64_t i = 0; i < out->ntiles * k; i++) nkept += any[i];
    out->tile_ptr = malloc((size_t)(out->ntiles + 1) * sizeof *out->tile_ptr);
    out->tile_rows = malloc((size_t)(nkept ? nkept : 1) * sizeof *out->tile_rows);
    if (!out->name || !out->tile_ptr || !out->tile_rows) goto oom;
    if (useB) {
        if (!(out->cols = malloc((size_t)(ncolsB ? ncolsB : 1) * sizeof *out->cols))) goto oom;
        for (int64_t row = 0; row < n; row++)
            if (nz[row]) out->cols[rank[row]] = row;
    }
    int64_t pos = 0;
    out->tile_ptr[0] = 0;
    for (int64_t t = 0; t < out->ntiles; t++) {
        for (int64_t i = 0; i < k; i++)
            if (any[t * k + i]) out->tile_rows[pos++] = (int32_t)i;
        out->tile_ptr[t + 1] = pos;
    }
    free(nz);
    free(rank);
    free(anyA);
    free(anyB);
    TJ_TRY(tj_layer_validate(out, out->name, err));
    out->hash = tj_layer_hash(out);
    return TJ_OK;
oom:
    free(nz);
    free(rank);
    free(anyA);
    free(anyB);
    return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory", L->name);
}

tj_status tj_pattern_from_weights(const tj_prune_layer_in *in, int64_t nl, int64_t g, tj_pattern **out, tj_error *err)
{
    *out = NULL;
    if (g < 1 || g > TJ_MAX_DIM)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "pattern: g %lld is not in [1, %lld]", (long long)g,
                       (long long)TJ_MAX_DIM);
    if (nl < 1 || nl > TJ_MAX_LAYERS)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "pattern: %lld layers (need 1 to %d)", (long long)nl, TJ_MAX_LAYERS);
    tj_pattern *p = calloc(1, sizeof *p);
    if (!p || !(p->layers = calloc((size_t)nl, sizeof *p->layers))) {
        free(p);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "pattern: out of memory");
    }
    p->nlayers = nl;
    for (int64_t l = 0; l < nl; l++) {
        tj_status s = recover_layer(&in[l], g, &p->layers[l], err);
        if (s != TJ_OK) {
            tj_pattern_destroy(p);
            return s;
        }
    }
    *out = p;
    return TJ_OK;
}
