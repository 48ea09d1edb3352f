/* Calibrated pruning (prune/calib.h) against small dense references: the rebuild of every tile
 * equals the solution of its normal equations (Gaussian elimination here), a sweep equals single
 * runs, tw2/tew keep their budgets and tew never loses to tw1, the knapsack equals brute force,
 * and bad inputs (statistics of another shape, singular H, densities outside [0, 1]) fail clearly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prune/calib.h"
#include "tj_test.h"

static char dir[256];

/* A random layer with calibration data: X [T × k] with column scales spread over 3 decades and
 * correlated columns, H = X̃ᵀX̃ with X̃ = [X, 1]. */
typedef struct rl {
    int64_t n, k, T;
    float *w, *b;
    double *x, *h;
    double *xr, *gc; /* optional: the dense model's inputs X_ref [T × k] and G = X̃ᵀX̃_ref */
    double *dr, *dres; /* optional: residual drift ΔR [T × n] and D = X̃ᵀΔR [(k+1) × n] */
    tj_prune_layer_in in;
    tj_calib_layer cl;
} rl;

static void rl_init(rl *r, int64_t n, int64_t k, int64_t T, uint64_t seed, double density)
{
    tj_rng g = {seed};
    memset(r, 0, sizeof *r);
    r->n = n, r->k = k, r->T = T;
    r->w = malloc((size_t)(n * k) * sizeof *r->w);
    r->b = malloc((size_t)n * sizeof *r->b);
    r->x = malloc((size_t)(T * k) * sizeof *r->x);
    r->h = calloc((size_t)((k + 1) * (k + 1)), sizeof *r->h);
    tj_test_fill(&g, r->w, n * k);
    tj_test_fill(&g, r->b, n);
    double *scale = malloc((size_t)k * sizeof *scale);
    for (int64_t i = 0; i < k; i++) scale[i] = pow(10.0, 1.5 * tj_rng_uniform(&g));
    for (int64_t t = 0; t < T; t++) {
        double common = tj_rng_uniform(&g);
        for (int64_t i = 0; i < k; i++)
            r->x[t * k + i] = scale[i] * (tj_rng_uniform(&g) + (i % 3 == 0 ? common : 0.0)) + 0.3;
    }
    free(scale);
    int64_t d = k + 1;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < d; i++) {
            double xi = i < k ? r->x[t * k + i] : 1.0;
            for (int64_t j = 0; j < d; j++) r->h[i * d + j] += xi * (j < k ? r->x[t * k + j] : 1.0);
        }
    r->in = (tj_prune_layer_in){"blk.0.lin", n, k, r->w, TJ_F32, NULL, TJ_F32};
    r->cl = (tj_calib_layer){&r->in, r->b, TJ_F32, {r->h, d, T, NULL, NULL}, density, NULL};
}

/* Dense-model inputs X_ref = X + a correlated perturbation (what the earlier pruned layers
 * changed) and the cross statistics G = X̃ᵀX̃_ref, attached to the layer. */
static void rl_add_cross(rl *r, uint64_t seed)
{
    tj_rng g = {seed};
    int64_t k = r->k, d = k + 1, T = r->T;
    r->xr = malloc((size_t)(T * k) * sizeof *r->xr);
    r->gc = calloc((size_t)(d * d), sizeof *r->gc);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < k; i++)
            r->xr[t * k + i] = r->x[t * k + i] * (1.0 + 0.2 * tj_rng_uniform(&g)) + 0.3 * r->x[t * k + (i + 1) % k];
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < d; i++) {
            double xi = i < k ? r->x[t * k + i] : 1.0;
            for (int64_t j = 0; j < d; j++) r->gc[i * d + j] += xi * (j < k ? r->xr[t * k + j] : 1.0);
        }
    r->cl.stats.cross = r->gc;
}

/* A drift of the residual stream the layer's output is added to, ΔR = R_ref − R (partly
 * explained by X, partly not), and its statistics D = X̃ᵀΔR, attached to the layer. */
static void rl_add_resid(rl *r, uint64_t seed)
{
    tj_rng g = {seed};
    int64_t k = r->k, n = r->n, d = k + 1, T = r->T;
    r->dr = malloc((size_t)(T * n) * sizeof *r->dr);
    r->dres = calloc((size_t)(d * n), sizeof *r->dres);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < n; j++)
            r->dr[t * n + j] = 0.5 * r->x[t * k + (j * 5) % k] + 2.0 * (tj_rng_uniform(&g) - 0.5);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < d; i++) {
            double xi = i < k ? r->x[t * k + i] : 1.0;
            for (int64_t j = 0; j < n; j++) r->dres[i * n + j] += xi * r->dr[t * n + j];
        }
    r->cl.stats.resid = r->dres;
}

static void rl_free(rl *r)
{
    free(r->w), free(r->b), free(r->x), free(r->h), free(r->xr), free(r->gc), free(r->dr), free(r->dres);
}

/* Solves A x = y (m × m) by Gaussian elimination with partial pivoting; A and y destroyed. */
static void gauss(double *a, double *y, int64_t m)
{
    for (int64_t c = 0; c < m; c++) {
        int64_t p = c;
        for (int64_t i = c + 1; i < m; i++)
            if (fabs(a[i * m + c]) > fabs(a[p * m + c])) p = i;
        for (int64_t j = 0; j < m; j++) {
            double t = a[c * m + j];
            a[c * m + j] = a[p * m + j];
            a[p * m + j] = t;
        }
        double t = y[c];
        y[c] = y[p];
        y[p] = t;
        for (int64_t i = c + 1; i < m; i++) {
            double f = a[i * m + c] / a[c * m + c];
            for (int64_t j = c; j < m; j++) a[i * m + j] -= f * a[c * m + j];
            y[i] -= f * y[c];
        }
    }
    for (int64_t c = m - 1; c >= 0; c--) {
        for (int64_t j = c + 1; j < m; j++) y[c] -= a[c * m + j] * y[j];
        y[c] /= a[c * m + c];
    }
}

/* Output error ‖X̃(w̃ − w̃')‖² summed over rows, from the data itself. */
static double out_err(const rl *r, const float *w, const float *b)
{
    double e = 0;
    for (int64_t row = 0; row < r->n; row++)
        for (int64_t t = 0; t < r->T; t++) {
            double y0 = r->b[row], y1 = b[row];
            for (int64_t i = 0; i < r->k; i++) {
                y0 += r->x[t * r->k + i] * r->w[row * r->k + i];
                y1 += r->x[t * r->k + i] * w[row * r->k + i];
            }
            e += (y0 - y1) * (y0 - y1);
        }
    return e;
}

/* Every kept row of every tile against the normal equations (Hd[K',K'] x = Hd[K',:] w̃, or with
 * cross statistics Hd[K',K'] x = Gd[K',:] w̃: min ‖X̃_K' x − X̃_ref w̃‖² + λ‖x − w̃_K'‖²; with
 * residual statistics D[K', row] is added to the right-hand side). */
static void check_rebuild(const rl *r, const tj_layer *l, const float *w, const float *b, double damp)
{
    int64_t d = r->k + 1;
    double mean = 0;
    for (int64_t i = 0; i < r->k; i++) mean += r->h[i * d + i];
    double lambda = damp * mean / (double)r->k; /* not on the bias column */
    double maxerr = 0, maxref = 0;
    int zeros_ok = 1;
    for (int64_t j = 0; j < l->ncols; j++) {
        int64_t row = tj_layer_col(l, j), t = j / l->g, nk = tj_tile_nrows(l, t), m = nk + 1;
        const int32_t *kr = l->tile_rows + l->tile_ptr[t];
        int64_t *idx = malloc((size_t)m * sizeof *idx);
        for (int64_t q = 0; q < nk; q++) idx[q] = kr[q];
        idx[nk] = r->k;
        double *a = malloc((size_t)(m * m) * sizeof *a), *y = malloc((size_t)m * sizeof *y);
        for (int64_t p = 0; p < m; p++) {
            y[p] = 0;
            for (int64_t c = 0; c < d; c++) {
                double wc = c < r->k ? r->w[row * r->k + c] : r->b[row];
                y[p] += ((r->gc ? r->gc : r->h)[idx[p] * d + c] + (idx[p] == c && c < r->k ? lambda : 0)) * wc;
            }
            if (r->dres) y[p] += r->dres[idx[p] * r->n + row];
            for (int64_t q = 0; q < m; q++) a[p * m + q] = r->h[idx[p] * d + idx[q]] + (p == q && p < nk ? lambda : 0);
        }
        gauss(a, y, m);
        for (int64_t q = 0; q < m; q++) {
            double got = q < nk ? w[row * r->k + idx[q]] : b[row];
            if (fabs(got - y[q]) > maxerr) maxerr = fabs(got - y[q]);
            if (fabs(y[q]) > maxref) maxref = fabs(y[q]);
        }
        unsigned char *in = calloc((size_t)r->k, 1);
        for (int64_t q = 0; q < nk; q++) in[kr[q]] = 1;
        for (int64_t i = 0; i < r->k; i++)
            if (!in[i] && w[row * r->k + i] != 0) zeros_ok = 0;
        free(in), free(a), free(y), free(idx);
    }
    CHECKF(maxerr <= 1e-4 * (maxref > 1 ? maxref : 1), "rebuild vs normal equations: max |Δ| %g (max |x| %g)", maxerr,
           maxref);
    CHECK(zeros_ok);
}

static void test_tw1_rebuild(void)
{
    const double damps[2] = {0.01, 0.0};
    for (int di = 0; di < 2; di++) {
        rl r;
        rl_init(&r, 10, 14, 60, 11 + (uint64_t)di, 0.5);
        tj_prune_options o = tj_prune_options_default();
        o.g = 4;
        tj_calib_options co = tj_calib_options_default();
        co.damp = damps[di];
        co.threads = 2;
        tj_pattern *p = NULL;
        float *w = NULL, *b = NULL;
        tj_error err = {0};
        CHECK_OK(tj_prune_calibrated(&r.cl, 1, &o, &co, &p, &w, &b, &err), &err);
        if (p) {
            const tj_layer *l = &p->layers[0];
            CHECK(l->ntiles == 3);
            for (int64_t t = 0; t < l->ntiles; t++) CHECK(tj_tile_nrows(l, t) == 7);
            check_rebuild(&r, l, w, b, damps[di]);
            /* OBS beats random kept sets of the same size (most of them) */
            tj_rng g = {99};
            int worse = 0;
            double e_obs = out_err(&r, w, b);
            for (int trial = 0; trial < 8; trial++) {
                int32_t *rows = malloc((size_t)(3 * 7) * sizeof *rows);
                for (int64_t t = 0; t < 3; t++) {
                    int32_t perm[14];
                    for (int i = 0; i < 14; i++) perm[i] = i;
                    for (int i = 13; i > 0; i--) {
                        int j = (int)tj_rng_below(&g, (uint64_t)i + 1);
                        int32_t tmp = perm[i];
                        perm[i] = perm[j];
                        perm[j] = tmp;
                    }
                    for (int i = 0; i < 7; i++) { /* sorted insert */
                        int32_t v = perm[i];
                        int q = i;
                        while (q > 0 && rows[t * 7 + q - 1] > v) rows[t * 7 + q] = rows[t * 7 + q - 1], q--;
                        rows[t * 7 + q] = v;
                    }
                }
                /* rebuild on the random set: solve per row with the reference */
                float *w2 = calloc((size_t)(r.n * r.k), sizeof *w2), *b2 = calloc((size_t)r.n, sizeof *b2);
                int64_t d = r.k + 1;
                double mean = 0;
                for (int64_t i = 0; i < r.k; i++) mean += r.h[i * d + i];
                double lambda = damps[di] * mean / (double)r.k;
                for (int64_t row = 0; row < r.n; row++) {
                    int64_t t = row / 4, m = 8, idx[8];
                    for (int q = 0; q < 7; q++) idx[q] = rows[t * 7 + q];
                    idx[7] = r.k;
                    double a[64], y[8];
                    for (int64_t pp = 0; pp < m; pp++) {
                        y[pp] = 0;
                        for (int64_t c = 0; c < d; c++)
                            y[pp] += (r.h[idx[pp] * d + c] + (idx[pp] == c && c < r.k ? lambda : 0)) *
                                     (c < r.k ? r.w[row * r.k + c] : r.b[row]);
                        for (int64_t q = 0; q < m; q++)
                            a[pp * m + q] = r.h[idx[pp] * d + idx[q]] + (pp == q && pp < 7 ? lambda : 0);
                    }
                    gauss(a, y, m);
                    for (int q = 0; q < 7; q++) w2[row * r.k + idx[q]] = (float)y[q];
                    b2[row] = (float)y[7];
                }
                worse += out_err(&r, w2, b2) < e_obs;
                free(w2), free(b2), free(rows);
            }
            CHECKF(worse <= 2, "%d of 8 random kept sets beat OBS", worse);
        }
        tj_pattern_destroy(p);
        free(w), free(b);
        rl_free(&r);
    }
}

/* Output error against the dense model: Σ ‖X̃ w̃' − X̃_ref w̃‖² from the data. */
static double out_err_ref(const rl *r, const float *w, const float *b)
{
    double e = 0;
    for (int64_t row = 0; row < r->n; row++)
        for (int64_t t = 0; t < r->T; t++) {
            double y0 = r->b[row], y1 = b[row];
            for (int64_t i = 0; i < r->k; i++) {
                y0 += r->xr[t * r->k + i] * r->w[row * r->k + i];
                y1 += r->x[t * r->k + i] * w[row * r->k + i];
            }
            e += (y0 - y1) * (y0 - y1);
        }
    return e;
}

/* Output error against the dense output plus the residual drift (what the next LayerNorm sees):
 * Σ ‖X̃ w̃' − (X̃_ref w̃ + ΔR)‖² from the data. */
static double out_err_resid(const rl *r, const float *w, const float *b)
{
    double e = 0;
    for (int64_t row = 0; row < r->n; row++)
        for (int64_t t = 0; t < r->T; t++) {
            double y0 = r->b[row] + r->dr[t * r->n + row], y1 = b[row];
            for (int64_t i = 0; i < r->k; i++) {
                y0 += r->xr[t * r->k + i] * r->w[row * r->k + i];
                y1 += r->x[t * r->k + i] * w[row * r->k + i];
            }
            e += (y0 - y1) * (y0 - y1);
        }
    return e;
}

/* The dense-output target (resid 0: without and then with cross statistics) and the residual
 * statistics on top of it (resid 1: cross statistics, then also NAME.residual): the rebuild
 * solves its normal equations, and its error to what it targets (the dense output, or the dense
 * output plus the residual drift) is below the rebuild's without the added statistics. */
static void test_tw1_targets(int resid)
{
    const double dens[3] = {1.0, 0.5, 0.25};
    for (int di = 0; di < 3; di++) {
        rl r;
        rl_init(&r, 10, 14, 60, (resid ? 41 : 31) + (uint64_t)di, dens[di]);
        if (resid) rl_add_cross(&r, 87 + (uint64_t)di);
        tj_prune_options o = tj_prune_options_default();
        o.g = 4;
        tj_calib_options co = tj_calib_options_default();
        co.damp = 0.01;
        co.threads = 2;
        tj_pattern *p0 = NULL, *p1 = NULL;
        float *w0 = NULL, *b0 = NULL, *w1 = NULL, *b1 = NULL;
        tj_error err = {0};
        CHECK_OK(tj_prune_calibrated(&r.cl, 1, &o, &co, &p0, &w0, &b0, &err), &err);
        if (resid) rl_add_resid(&r, 97 + (uint64_t)di);
        else rl_add_cross(&r, 77 + (uint64_t)di);
        CHECK_OK(tj_prune_calibrated(&r.cl, 1, &o, &co, &p1, &w1, &b1, &err), &err);
        if (p0 && p1) {
            check_rebuild(&r, &p1->layers[0], w1, b1, co.damp);
            double e0 = resid ? out_err_resid(&r, w0, b0) : out_err_ref(&r, w0, b0);
            double e1 = resid ? out_err_resid(&r, w1, b1) : out_err_ref(&r, w1, b1);
            CHECKF(e1 < 0.9 * e0, "density %g: error to the %s %g with the %s statistics, %g without", dens[di],
                   resid ? "dense output + drift" : "dense output", e1, resid ? "residual" : "cross", e0);
        }
        tj_pattern_destroy(p0), tj_pattern_destroy(p1);
        free(w0), free(b0), free(w1), free(b1);
        rl_free(&r);
    }
}

static void test_sweep(void)
{
    rl r;
    rl_init(&r, 9, 20, 50, 5, 0.5);
    const double dens[4] = {0.25, 0.5, 0.0, 1.0};
    float *ws[4], *bs[4];
    for (int j = 0; j < 4; j++) ws[j] = malloc(9 * 20 * sizeof(float)), bs[j] = malloc(9 * sizeof(float));
    tj_calib_options co = tj_calib_options_default();
    tj_error err = {0};
    double errs[4];
    CHECK_OK(tj_prune_calibrated_sweep(&r.cl, 4, dens, 4, &co, ws, bs, errs, &err), &err);
    CHECKF(errs[2] > errs[0] && errs[0] > errs[1] && errs[1] > errs[3] && errs[3] < 1e-9 && errs[2] <= 1.0,
           "sweep errors %g %g %g %g", errs[0], errs[1], errs[2], errs[3]);
    for (int j = 0; j < 3; j++) {
        r.cl.density = dens[j];
        tj_prune_options o = tj_prune_options_default();
        o.g = 4;
        tj_pattern *p = NULL;
        float *w = NULL, *b = NULL;
        CHECK_OK(tj_prune_calibrated(&r.cl, 1, &o, &co, &p, &w, &b, &err), &err);
        if (p) {
            CHECKF(tj_test_relerr(ws[j], w, 9 * 20) < 1e-5, "sweep d=%g vs single: %g", dens[j],
                   tj_test_relerr(ws[j], w, 9 * 20));
            CHECK(tj_test_relerr(bs[j], b, 9) < 1e-5);
            check_rebuild(&r, &p->layers[0], w, b, co.damp);
        }
        tj_pattern_destroy(p);
        free(w), free(b);
    }
    /* density 1 with the ridge toward the original weights gives them back */
    CHECK(tj_test_relerr(ws[3], r.w, 9 * 20) < 1e-5);
    CHECK(tj_test_relerr(bs[3], r.b, 9) < 1e-5);
    /* density 0: the bias is the mean output */
    double maxd = 0;
    for (int64_t row = 0; row < 9; row++) {
        double mean = r.b[row];
        for (int64_t t = 0; t < r.T; t++)
            for (int64_t i = 0; i < r.k; i++) mean += r.x[t * r.k + i] * r.w[row * r.k + i] / (double)r.T;
        double dd = fabs(mean - bs[2][row]) / (fabs(mean) + 1);
        if (dd > maxd) maxd = dd;
    }
    CHECKF(maxd < 1e-6, "density 0: bias vs mean output %g", maxd);
    for (int j = 0; j < 4; j++) free(ws[j]), free(bs[j]);
    rl_free(&r);
}

static void test_tw2_tew(void)
{
    rl r;
    rl_init(&r, 24, 30, 80, 7, 0.4);
    tj_calib_options co = tj_calib_options_default();
    tj_error err = {0};
    tj_prune_options o = tj_prune_options_default();
    o.g = 8;
    /* tw2 */
    o.mode = TJ_PRUNE_TW2;
    tj_pattern *p = NULL;
    float *w = NULL, *b = NULL;
    CHECK_OK(tj_prune_calibrated(&r.cl, 1, &o, &co, &p, &w, &b, &err), &err);
    if (p) {
        const tj_layer *l = &p->layers[0];
        double dens = (double)tj_layer_kept(l) / (24.0 * 30.0);
        CHECKF(fabs(dens - 0.4) < 0.05, "tw2 density %g", dens);
        CHECK(l->ncols == llround(sqrt(0.4) * 24));
        check_rebuild(&r, l, w, b, co.damp);
    }
    tj_pattern_destroy(p);
    free(w), free(b);
    /* tew at 0.4 with F = 0.05 vs tw1 at 0.35: same tiles, extra weights, less error */
    o.mode = TJ_PRUNE_TEW;
    o.tew_base = TJ_PRUNE_TW1;
    o.ew_fraction = 0.05;
    CHECK_OK(tj_prune_calibrated(&r.cl, 1, &o, &co, &p, &w, &b, &err), &err);
    tj_prune_options o1 = tj_prune_options_default();
    o1.g = 8;
    r.cl.density = 0.35;
    tj_pattern *p1 = NULL;
    float *w1 = NULL, *b1 = NULL;
    CHECK_OK(tj_prune_calibrated(&r.cl, 1, &o1, &co, &p1, &w1, &b1, &err), &err);
    if (p && p1) {
        CHECK(p->layers[0].ew_nnz == llround(0.05 * 24 * 30));
        CHECK(tj_layer_kept(&p->layers[0]) == tj_layer_kept(&p1->layers[0]) + p->layers[0].ew_nnz);
        double e = out_err(&r, w, b), e1 = out_err(&r, w1, b1);
        CHECKF(e < e1, "tew error %g, tw1 error %g", e, e1);
    }
    tj_pattern_destroy(p), tj_pattern_destroy(p1);
    free(w), free(b), free(w1), free(b1);
    rl_free(&r);
}

static void test_knapsack(void)
{
    tj_rng g = {123};
    tj_error err = {0};
    for (int trial = 0; trial < 200; trial++) {
        int64_t nl = 1 + (int64_t)tj_rng_below(&g, 4), nc = 1 + (int64_t)tj_rng_below(&g, 5);
        int64_t cost[20], choice[4];
        double loss[20];
        int64_t minsum = 0, maxsum = 0;
        for (int64_t l = 0; l < nl; l++) {
            int64_t mn = 1000, mx = 0;
            for (int64_t c = 0; c < nc; c++) {
                cost[l * nc + c] = (int64_t)tj_rng_below(&g, 12);
                loss[l * nc + c] = tj_rng_uniform(&g) + 1.0;
                if (cost[l * nc + c] < mn) mn = cost[l * nc + c];
                if (cost[l * nc + c] > mx) mx = cost[l * nc + c];
            }
            minsum += mn, maxsum += mx;
        }
        int64_t budget = (int64_t)tj_rng_below(&g, (uint64_t)maxsum + 3);
        /* brute force */
        double best = INFINITY;
        int64_t combos = 1;
        for (int64_t l = 0; l < nl; l++) combos *= nc;
        for (int64_t cb = 0; cb < combos; cb++) {
            int64_t x = cb, cs = 0;
            double ls = 0;
            for (int64_t l = 0; l < nl; l++, x /= nc) cs += cost[l * nc + x % nc], ls += loss[l * nc + x % nc];
            if (cs <= budget && ls < best) best = ls;
        }
        tj_status s = tj_knapsack_solve(cost, loss, nl, nc, budget, choice, &err);
        if (minsum > budget) {
            CHECK(s == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "cheapest"));
            continue;
        }
        CHECK_OK(s, &err);
        if (s != TJ_OK) continue;
        int64_t cs = 0;
        double ls = 0;
        for (int64_t l = 0; l < nl; l++) cs += cost[l * nc + choice[l]], ls += loss[l * nc + choice[l]];
        CHECKF(cs <= budget && fabs(ls - best) < 1e-12, "knapsack %g (cost %lld) vs brute force %g (budget %lld)", ls,
               (long long)cs, best, (long long)budget);
    }
}

static const char *write_file(const char *name, const char *text)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_allocate(void)
{
    tj_error err = {0};
    const char *good = write_file("profile.json",
        "{\"format\": \"tilejit-prune-profile\", \"version\": 1, \"densities\": [0, 0.5, 1],"
        " \"layers\": [{\"name\": \"a\", \"n\": 4, \"k\": 8, \"loss\": [0.9, 0.1, 0], \"time_ms\": [0, 1, 2]},"
        "             {\"name\": \"b\", \"n\": 4, \"k\": 8, \"loss\": [0.5, 0.3, 0], \"time_ms\": [0, 1, 2]}]}");
    tj_prune_profile *p = NULL;
    CHECK_OK(tj_prune_profile_load(good, &p, &err), &err);
    if (p) {
        double d[2];
        CHECK_OK(tj_prune_allocate(p, 0.5, 0, d, NULL, &err), &err); /* 32 of 64 weights: a at 0.5 and b at 0.5 (0.4) beats a 1, b 0 (0.5) */
        CHECK(d[0] == 0.5 && d[1] == 0.5);
        CHECK_OK(tj_prune_allocate(p, 0.75, 0, d, NULL, &err), &err); /* 16: a 0.5, b 0 (0.6) beats a 0, b 0.5 (1.2) */
        CHECK(d[0] == 0.5 && d[1] == 0);
        int64_t choice[2] = {-1, -1};
        CHECK_OK(tj_prune_allocate(p, 0, 3.01, d, choice, &err), &err); /* 3 ms: a 0.5 + b 1 (0.1) beats a 1 + b 0.5 (0.3) */
        CHECK(d[0] == 0.5 && d[1] == 1 && choice[0] == 1 && choice[1] == 2);
        CHECK_OK(tj_prune_allocate(p, 0, 2.99, d, NULL, &err), &err); /* < 3 ms: a 0.5 + b 0.5 (0.4) beats a 1 + b 0 (0.5) */
        CHECK(d[0] == 0.5 && d[1] == 0.5);
        CHECK(tj_prune_allocate(p, 0, 0.5, d, NULL, &err) == TJ_OK && d[0] == 0 && d[1] == 0);
        tj_prune_profile_destroy(p);
    }
    const char *bad = write_file("bad.json",
        "{\"format\": \"tilejit-prune-profile\", \"version\": 1, \"densities\": [0, 1.5],"
        " \"layers\": [{\"name\": \"a\", \"n\": 4, \"k\": 8, \"loss\": [0.9, 0]}]}");
    CHECK(tj_prune_profile_load(bad, &p, &err) == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "outside [0, 1]"));
    const char *short_loss = write_file("short.json",
        "{\"format\": \"tilejit-prune-profile\", \"version\": 1, \"densities\": [0, 1],"
        " \"layers\": [{\"name\": \"a\", \"n\": 4, \"k\": 8, \"loss\": [0.9]}]}");
    CHECK(tj_prune_profile_load(short_loss, &p, &err) == TJ_ERR_FORMAT && strstr(err.msg, "layers[0].loss"));
}

static void test_bad_inputs(void)
{
    tj_error err = {0};
    rl r;
    rl_init(&r, 6, 5, 20, 3, 0.5);
    /* a statistics file for a layer with another k */
    int64_t shape[2] = {7, 7}, one = 1, tokens = 20;
    double *h7 = calloc(49, sizeof *h7);
    h7[48] = 20;
    char path[512];
    snprintf(path, sizeof path, "%s/stats.safetensors", dir);
    tj_st_out_tensor t[2] = {{"blk.0.lin.hessian", "F64", 2, shape, h7, 49 * 8}, {"blk.0.lin.tokens", "I64", 1, &one, &tokens, 8}};
    CHECK_OK(tj_st_write(path, t, 2, NULL, &err), &err);
    tj_st_file *sf = NULL;
    CHECK_OK(tj_st_open(path, &sf, &err), &err);
    tj_calib_stats st;
    if (sf) {
        CHECK(tj_calib_stats_find(sf, &r.in, &st, &err) == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "another model"));
        tj_prune_layer_in other = r.in;
        other.name = "blk.9.other";
        CHECK(tj_calib_stats_find(sf, &other, &st, &err) == TJ_ERR_NOT_FOUND && strstr(err.msg, "another model"));
        other.name = "blk.0.lin";
        other.k = 6; /* matching shape: found */
        CHECK_OK(tj_calib_stats_find(sf, &other, &st, &err), &err);
        CHECK(st.dim == 7 && st.tokens == 20 && !st.cross);
        tj_st_close(sf);
    }
    /* cross statistics of the wrong shape, or whose token count disagrees */
    {
        tj_prune_layer_in l7 = r.in;
        l7.k = 6;
        int64_t bad_shape[2] = {6, 6};
        double *x7 = calloc(49, sizeof *x7);
        tj_st_out_tensor t3[3] = {t[0], t[1], {"blk.0.lin.cross", "F64", 2, bad_shape, x7, 36 * 8}};
        CHECK_OK(tj_st_write(path, t3, 3, NULL, &err), &err);
        sf = NULL;
        CHECK_OK(tj_st_open(path, &sf, &err), &err);
        if (sf) {
            tj_status s0 = tj_calib_stats_find(sf, &l7, &st, &err);
            CHECKF(s0 == TJ_ERR_FORMAT && strstr(err.msg, "cross"), "%s", err.msg);
            tj_st_close(sf);
        }
        t3[2].shape = shape;
        t3[2].nbytes = 49 * 8; /* right shape, but [k][k] is 0, not the 20 tokens */
        CHECK_OK(tj_st_write(path, t3, 3, NULL, &err), &err);
        sf = NULL;
        CHECK_OK(tj_st_open(path, &sf, &err), &err);
        if (sf) {
            tj_status s0 = tj_calib_stats_find(sf, &l7, &st, &err);
            CHECKF(s0 == TJ_ERR_FORMAT && strstr(err.msg, "cross") && strstr(err.msg, "tokens"), "%s", err.msg);
            tj_st_close(sf);
        }
        x7[48] = 20;
        CHECK_OK(tj_st_write(path, t3, 3, NULL, &err), &err);
        sf = NULL;
        CHECK_OK(tj_st_open(path, &sf, &err), &err);
        if (sf) {
            CHECK_OK(tj_calib_stats_find(sf, &l7, &st, &err), &err);
            CHECK(st.cross != NULL && st.resid == NULL);
            tj_st_close(sf);
        }
        /* residual statistics: [k + 1, n] F64, finite */
        int64_t rshape[2] = {7, l7.n};
        double *r7 = calloc((size_t)(7 * (l7.n + 1)), sizeof *r7);
        tj_st_out_tensor t4[4] = {t3[0], t3[1], t3[2], {"blk.0.lin.residual", "F64", 2, rshape, r7, 7 * l7.n * 8}};
        for (int bad = 0; bad < 3; bad++) {
            rshape[1] = bad == 1 ? l7.n + 1 : l7.n;
            t4[3].nbytes = 7 * rshape[1] * 8;
            r7[3] = bad == 2 ? NAN : 0.5;
            CHECK_OK(tj_st_write(path, t4, 4, NULL, &err), &err);
            sf = NULL;
            CHECK_OK(tj_st_open(path, &sf, &err), &err);
            if (sf) {
                tj_status s0 = tj_calib_stats_find(sf, &l7, &st, &err);
                if (bad == 0) CHECK(s0 == TJ_OK && st.resid != NULL);
                else CHECKF(s0 == TJ_ERR_FORMAT && strstr(err.msg, "residual"), "%s", err.msg);
                tj_st_close(sf);
            }
        }
        free(r7);
        free(x7);
    }
    free(h7);
    /* singular H: undamped, one input feature never active */
    int64_t d = r.k + 1;
    for (int64_t i = 0; i < d; i++) r.h[2 * d + i] = r.h[i * d + 2] = 0;
    tj_prune_options o = tj_prune_options_default();
    tj_calib_options co = tj_calib_options_default();
    co.damp = 0;
    tj_pattern *p = NULL;
    float *w = NULL, *b = NULL;
    tj_status s = tj_prune_calibrated(&r.cl, 1, &o, &co, &p, &w, &b, &err);
    CHECKF(s == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "singular") && strstr(err.msg, "input feature 2"), "%s", err.msg);
    co.damp = 0.01; /* damping makes it usable */
    CHECK_OK(tj_prune_calibrated(&r.cl, 1, &o, &co, &p, &w, &b, &err), &err);
    tj_pattern_destroy(p);
    free(w), free(b);
    p = NULL;
    /* densities outside [0, 1] */
    const double bads[3] = {-0.1, 1.5, NAN};
    for (int i = 0; i < 3; i++) {
        r.cl.density = bads[i];
        s = tj_prune_calibrated(&r.cl, 1, &o, &co, &p, &w, &b, &err);
        CHECK(s == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "outside [0, 1]") && !p);
        float *ws[1] = {NULL}, *bs[1] = {NULL};
        CHECK(tj_prune_calibrated_sweep(&r.cl, 4, &bads[i], 1, &co, ws, bs, NULL, &err) == TJ_ERR_INVALID_ARGUMENT);
    }
    rl_free(&r);
}

/* The in-memory API (tj_prune_calibrated_layers, tj_prune_calibrated_sweep_layer) against the
 * file path (tj_prune_calibrated_run on a weights and a statistics file) on the same two layers,
 * one with cross statistics: the same pattern, the same rebuilt weights and biases, the same sweep. */
static void test_in_memory(void)
{
    tj_error err = {0};
    rl r[2];
    rl_init(&r[0], 12, 10, 40, 91, 0.5);
    rl_init(&r[1], 7, 16, 40, 92, 0.5);
    rl_add_cross(&r[1], 93);
    r[0].in.name = "blk.0.lin";
    r[1].in.name = "blk.1.lin";
    char wpath[512], spath[512], ppath[512], opath[512], sweep[512];
    snprintf(wpath, sizeof wpath, "%s/mem-weights.safetensors", dir);
    snprintf(spath, sizeof spath, "%s/mem-stats.safetensors", dir);
    snprintf(ppath, sizeof ppath, "%s/mem-pattern.json", dir);
    snprintf(opath, sizeof opath, "%s/mem-pruned.safetensors", dir);
    snprintf(sweep, sizeof sweep, "%s/mem-sweep.safetensors", dir);
    int64_t ws[2][2], bs[2], hs[2][2], one = 1, tok[2] = {40, 40};
    tj_st_out_tensor wt[4], st[5];
    char names[9][32];
    for (int l = 0; l < 2; l++) {
        ws[l][0] = r[l].n, ws[l][1] = r[l].k, bs[l] = r[l].n, hs[l][0] = hs[l][1] = r[l].k + 1;
        snprintf(names[2 * l], 32, "blk.%d.lin.weight", l);
        snprintf(names[2 * l + 1], 32, "blk.%d.lin.bias", l);
        wt[2 * l] = (tj_st_out_tensor){names[2 * l], "F32", 2, ws[l], r[l].w, (uint64_t)(r[l].n * r[l].k) * 4};
        wt[2 * l + 1] = (tj_st_out_tensor){names[2 * l + 1], "F32", 1, &bs[l], r[l].b, (uint64_t)r[l].n * 4};
        snprintf(names[4 + 2 * l], 32, "blk.%d.lin.hessian", l);
        snprintf(names[5 + 2 * l], 32, "blk.%d.lin.tokens", l);
        uint64_t hb = (uint64_t)((r[l].k + 1) * (r[l].k + 1)) * 8;
        st[2 * l] = (tj_st_out_tensor){names[4 + 2 * l], "F64", 2, hs[l], r[l].h, hb};
        st[2 * l + 1] = (tj_st_out_tensor){names[5 + 2 * l], "I64", 1, &one, &tok[l], 8};
    }
    snprintf(names[8], 32, "blk.1.lin.cross");
    st[4] = (tj_st_out_tensor){names[8], "F64", 2, hs[1], r[1].gc, (uint64_t)(17 * 17) * 8};
    CHECK_OK(tj_st_write(wpath, wt, 4, NULL, &err), &err);
    CHECK_OK(tj_st_write(spath, st, 5, NULL, &err), &err);

    tj_prune_calibrated_options o = tj_prune_calibrated_options_default();
    o.prune.g = 4;
    o.prune.sparsity = 0.5;
    o.damp = 0.01;
    o.threads = 2;
    o.calibration = spath;
    o.pattern_out = ppath;
    o.pruned_out = opath;
    tj_st_file *wf = NULL, *of = NULL;
    tj_prune_layer_in *in = NULL;
    int64_t nl = 0;
    tj_pattern *pf = NULL, *pm = NULL;
    CHECK_OK(tj_st_open(wpath, &wf, &err), &err);
    if (wf) CHECK_OK(tj_prune_select(wf, NULL, NULL, &in, &nl, &err), &err);
    if (in && nl == 2) CHECK_OK(tj_prune_calibrated_run(wf, in, nl, &o, &pf, NULL, &err), &err);
    CHECK_OK(tj_st_open(opath, &of, &err), &err);

    tj_prune_calibrated_layer ml[2];
    float *mw[2], *mb[2];
    for (int l = 0; l < 2; l++) {
        ml[l] = (tj_prune_calibrated_layer){r[l].in, r[l].b, TJ_F32, r[l].h, r[l].gc, 40, 0.5, r[l].dres};
        mw[l] = malloc((size_t)(r[l].n * r[l].k) * sizeof(float));
        mb[l] = malloc((size_t)r[l].n * sizeof(float));
        for (int64_t i = 0; i < r[l].n * r[l].k; i++) mw[l][i] = NAN; /* poison: every element must be written */
        for (int64_t i = 0; i < r[l].n; i++) mb[l][i] = NAN;
    }
    CHECK_OK(tj_prune_calibrated_layers(ml, 2, &o, &pm, mw, mb, &err), &err);
    if (pf && pm && of) {
        char *jf = tj_pattern_to_json(pf), *jm = tj_pattern_to_json(pm);
        CHECK(jf && jm && strcmp(jf, jm) == 0);
        free(jf), free(jm);
        for (int l = 0; l < 2; l++) {
            const tj_st_tensor *tw = tj_st_find(of, names[2 * l]), *tb = tj_st_find(of, names[2 * l + 1]);
            CHECK(tw && tb && memcmp(tw->data, mw[l], (size_t)(r[l].n * r[l].k) * 4) == 0 &&
                  memcmp(tb->data, mb[l], (size_t)r[l].n * 4) == 0);
        }
    }
    /* the sweep of the layer with cross statistics... the file path sweeps with the file's
     * statistics, cross included */
    o.sweep_out = sweep;
    o.sweep_steps = 4;
    o.sweep_weights = "1,2";
    if (in && nl == 2) CHECK_OK(tj_prune_calibrated_run(wf, in, nl, &o, NULL, NULL, &err), &err);
    tj_st_file *sw = NULL;
    CHECK_OK(tj_st_open(sweep, &sw, &err), &err);
    const double dens[4] = {0, 0.25, 0.5, 0.75};
    for (int l = 0; l < 2 && sw; l++) {
        float *w4[4] = {NULL}, *b4[4] = {NULL};
        double e4[4];
        w4[2] = malloc((size_t)(r[l].n * r[l].k) * sizeof(float));
        b4[2] = malloc((size_t)r[l].n * sizeof(float));
        CHECK_OK(tj_prune_calibrated_sweep_layer(&ml[l], dens, 4, &o, w4, b4, e4, &err), &err);
        char nm[48];
        snprintf(nm, sizeof nm, "d2/blk.%d.lin.weight", l);
        const tj_st_tensor *tw = tj_st_find(sw, nm);
        snprintf(nm, sizeof nm, "blk.%d.lin.error", l);
        const tj_st_tensor *te = tj_st_find(sw, nm);
        CHECK(tw && memcmp(tw->data, w4[2], (size_t)(r[l].n * r[l].k) * 4) == 0);
        CHECK(te && memcmp(te->data, e4, sizeof e4) == 0 && e4[0] > e4[3]);
        free(w4[2]), free(b4[2]);
    }
    tj_st_close(sw);
    /* bad statistics and arguments */
    double corner = r[0].h[10 * 11 + 10];
    r[0].h[10 * 11 + 10] = 39; /* disagrees with the 40 tokens */
    tj_pattern *pb = NULL;
    tj_status s = tj_prune_calibrated_layers(ml, 2, &o, &pb, mw, mb, &err);
    CHECKF(s == TJ_ERR_FORMAT && strstr(err.msg, "tokens") && strstr(err.msg, "blk.0.lin") && !pb, "%s", err.msg);
    r[0].h[10 * 11 + 10] = corner;
    ml[1].cross = NULL;
    ml[1].hessian = NULL;
    CHECK(tj_prune_calibrated_layers(ml, 2, &o, &pb, mw, mb, &err) == TJ_ERR_INVALID_ARGUMENT && !pb);
    float *none[2] = {mw[0], NULL};
    CHECK(tj_prune_calibrated_layers(ml, 1, &o, &pb, none + 1, mb, &err) == TJ_ERR_INVALID_ARGUMENT);
    for (int l = 0; l < 2; l++) free(mw[l]), free(mb[l]), rl_free(&r[l]);
    tj_pattern_destroy(pf), tj_pattern_destroy(pm);
    free(in);
    tj_st_close(of);
    tj_st_close(wf);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tj_test_prune_calib_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_tw1_rebuild();
    test_tw1_targets(0);
    test_tw1_targets(1);
    test_sweep();
    test_tw2_tew();
    test_knapsack();
    test_allocate();
    test_bad_inputs();
    test_in_memory();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tj_test_end();
}
