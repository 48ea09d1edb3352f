/* The reference backend's arithmetic: the semantics of docs/architecture.md ("What a layer computes") written as plainly as possible. Every other
 * backend is checked against this, so it stays simple and shares nothing with the fast paths. */
#include <math.h>

#include "runtime/reference.h"

float tj_activate(tj_activation a, float v)
{
    switch (a) {
    case TJ_ACT_RELU: return v > 0 ? v : 0;
    case TJ_ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    default: return v;
    }
}

void tj_reference_epilogue(const tj_layer *l, const tj_layer_weights *w, float *y, int64_t m)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t n = 0; n < l->n; n++) {
            float b = w->bias ? tj_load_f32(w->bias, w->bdt, n) : 0.0f;
            y[i * l->n + n] = tj_activate(l->act, y[i * l->n + n] + b);
        }
}

void tj_reference_linear(const tj_layer *l, const tj_layer_weights *w, const float *x, int64_t m,
                         float *y)
{
    for (int64_t i = 0; i < m * l->n; i++) y[i] = 0.0f;
    for (int64_t i = 0; i < m; i++) {
        const float *xi = x + i * l->k;
        float *yi = y + i * l->n;
        /* Tile-wise part: output feature cols[t·g + c] sees the tile's kept rows. */
        for (int64_t t = 0; t < l->ntiles; t++) {
            const int32_t *rows = l->tile_rows + l->tile_ptr[t];
            for (int64_t c = 0; c < tj_tile_width(l, t); c++) {
                int64_t n = tj_layer_col(l, t * l->g + c);
                float acc = 0.0f;
                for (int64_t r = 0; r < tj_tile_nrows(l, t); r++)
                    acc += xi[rows[r]] * tj_load_f32(w->w, w->wdt, n * l->k + rows[r]);
                yi[n] += acc;
            }
        }
        /* Element-wise residual. */
        for (int64_t n = 0; l->ew_indptr && n < l->n; n++)
            for (int64_t e = l->ew_indptr[n]; e < l->ew_indptr[n + 1]; e++)
                yi[n] += xi[l->ew_indices[e]] * tj_load_f32(w->w, w->wdt, n * l->k + l->ew_indices[e]);
    }
    tj_reference_epilogue(l, w, y, m);
}
