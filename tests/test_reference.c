/* The reference backend against a hand-computed case and against an independent float64 dense
 * computation with an explicit mask, on random data: cols, ew, empty tiles, bias, activations,
 * F32/F16/BF16 weights, odd sizes, M from 1 to 1000. */
#include "runtime/model.h"
#include "pattern/random.h"
#include "tj_test.h"

static void test_hand_computed(void)
{
    int64_t tile_ptr[3] = {0, 2, 5};
    int32_t rows[5] = {0, 2, 1, 3, 4};
    tj_layer l = {.name = "fc", .n = 4, .k = 5, .g = 2, .ncols = 4, .ntiles = 2, .tile_ptr = tile_ptr,
                  .tile_rows = rows, .act = TJ_ACT_RELU};
    float w[20], bias[4] = {1, 0, 0, -100}, x[5] = {1, 2, 3, 4, 5}, y[4];
    for (int n = 0; n < 4; n++)
        for (int k = 0; k < 5; k++) w[n * 5 + k] = (float)(n * 10 + k);
    tj_layer_weights lw = {.w = w, .wdt = TJ_F32, .bias = bias, .bdt = TJ_F32};
    tj_reference_linear(&l, &lw, x, 1, y);
    CHECK(y[0] == 7.0f);
    CHECK(y[1] == 46.0f);
    CHECK(y[2] == 254.0f);
    CHECK(y[3] == 264.0f);
    bias[3] = -1000; /* relu clamps */
    tj_reference_linear(&l, &lw, x, 1, y);
    CHECK(y[3] == 0.0f);
}

static double act64(tj_activation a, double v)
{
    if (a == TJ_ACT_RELU) return v > 0 ? v : 0;
    if (a == TJ_ACT_GELU) return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    return v;
}

/* Dense float64 Y = act(X · (W ⊙ mask)ᵀ + b) with the mask spelt out element by element. */
static void dense64(const tj_layer *l, const float *wf, const float *bias, const float *x, int64_t m, double *y)
{
    char *mask = calloc((size_t)(l->n * l->k), 1);
    for (int64_t j = 0; j < l->ncols; j++) {
        int64_t t = j / l->g, n = l->cols ? l->cols[j] : j;
        for (int64_t r = l->tile_ptr[t]; r < l->tile_ptr[t + 1]; r++) mask[n * l->k + l->tile_rows[r]] = 1;
    }
    for (int64_t n = 0; l->ew_indptr && n < l->n; n++)
        for (int64_t e = l->ew_indptr[n]; e < l->ew_indptr[n + 1]; e++) mask[n * l->k + l->ew_indices[e]] = 1;
    for (int64_t i = 0; i < m; i++)
        for (int64_t n = 0; n < l->n; n++) {
            double acc = bias ? bias[n] : 0;
            for (int64_t k = 0; k < l->k; k++)
                if (mask[n * l->k + k]) acc += (double)x[i * l->k + k] * wf[n * l->k + k];
            y[i * l->n + n] = act64(l->act, acc);
        }
    free(mask);
}

static void test_random(void)
{
    static const int64_t shapes[][4] = {
        /* n, k, g, m */
        {300, 200, 128, 1}, {300, 200, 128, 17}, {64, 64, 32, 1000}, {129, 77, 64, 5}, {7, 3, 7, 2},
        {256, 96, 256, 33}, {100, 300, 16, 64},
    };
    tj_rng rng = {12345};
    int cases = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int variant = 0; variant < 6; variant++) {
            tj_random_spec spec = {.n = shapes[si][0], .k = shapes[si][1], .g = shapes[si][2],
                                   .sparsity = (double)(variant % 3) * 0.35, .mode = 1 + variant % 2,
                                   .seed = si * 31 + (uint64_t)variant, .ew_fraction = variant >= 3 ? 0.03 : 0,
                                   .empty_tile_fraction = variant == 2 || variant == 5 ? 0.3 : 0,
                                   .act = (tj_activation)(variant % 3)};
            int64_t m = shapes[si][3];
            tj_layer l;
            tj_error err;
            CHECK_OK(tj_random_layer(&spec, "rand", &l, &err), &err);
            int64_t nk = l.n * l.k;
            float *wf = malloc((size_t)nk * 4), *bias = malloc((size_t)l.n * 4), *x = malloc((size_t)(m * l.k) * 4);
            uint16_t *w16 = malloc((size_t)nk * 2);
            float *y = malloc((size_t)(m * l.n) * 4), *yref = malloc((size_t)(m * l.n) * 4);
            double *y64 = malloc((size_t)(m * l.n) * 8);
            tj_test_fill(&rng, x, m * l.k);
            tj_test_fill(&rng, bias, l.n);
            for (int dt = 0; dt < 3; dt++) {
                tj_dtype d = (tj_dtype)dt;
                tj_test_fill(&rng, wf, nk);
                if (d != TJ_F32) { /* the float64 side sees the same rounded weights */
                    tj_convert_from_f32(wf, nk, d, w16);
                    tj_convert_to_f32(w16, d, nk, wf);
                }
                int with_bias = (variant + dt) % 2;
                tj_layer_weights lw = {.w = d == TJ_F32 ? (const void *)wf : (const void *)w16, .wdt = d,
                                       .bias = with_bias ? bias : NULL, .bdt = TJ_F32};
                for (int64_t i = 0; i < m * l.n; i++) y[i] = NAN; /* poison: unwritten elements show */
                tj_reference_linear(&l, &lw, x, m, y);
                dense64(&l, wf, with_bias ? bias : NULL, x, m, y64);
                for (int64_t i = 0; i < m * l.n; i++) yref[i] = (float)y64[i];
                double rel = tj_test_relerr(y, yref, m * l.n);
                CHECKF(tj_test_all_finite(y, m * l.n), "shape %zu variant %d dtype %d: unwritten output", si, variant, dt);
                CHECKF(rel <= 1e-5, "shape %zu variant %d dtype %d: relative error %g", si, variant, dt, rel);
                cases++;
            }
            free(wf); free(bias); free(x); free(w16); free(y); free(yref); free(y64);
            tj_layer_free(&l);
        }
    CHECK(cases == 7 * 6 * 3);
}

int main(void)
{
    test_hand_computed();
    test_random();
    return tj_test_end();
}
