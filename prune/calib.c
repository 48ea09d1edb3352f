/* Calibrated tile-wise pruning (calib.h): per layer, the damped statistics Hd = H + λI and its
 * inverse; per tile (in parallel), greedy OBS removal of input features in small groups with the
 * tile's own copy of Hd⁻¹ (saliency Σ_rows w²/[Hd⁻¹]_cc, exact group update of W and Hd⁻¹), then
 * the ridge least-squares rebuild on the kept features plus the bias column from one Cholesky
 * factor of Hd permuted into "most important first" order, whose leading blocks serve every
 * density of a sweep at once. Everything in double. See docs/pruning-calibrated.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prune/calib.h"
#include "base/threadpool.h"

/* ---- dense kernels (double, row-major) ---- */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define TJ_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TJ_HOT
#endif

typedef double v4d __attribute__((vector_size(32)));

/* Unaligned 4-double loads and stores (macros: a vector argument would change the ABI). */
#define V4_LOAD(p) __extension__({ v4d v4_; memcpy(&v4_, (p), sizeof v4_); v4_; })
#define V4_STORE(p, v) __extension__({ v4d v4s_ = (v); memcpy((p), &v4s_, sizeof v4s_); })

TJ_HOT static double dot(const double *a, const double *b, int64_t n)
{
    v4d s0 = {0, 0, 0, 0}, s1 = s0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += V4_LOAD(a + i) * V4_LOAD(b + i);
        s1 += V4_LOAD(a + i + 4) * V4_LOAD(b + i + 4);
    }
    s0 += s1;
    double s = (s0[0] + s0[1]) + (s0[2] + s0[3]);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y[0..n) -= a · x[0..n) */
TJ_HOT static void axpy_sub(double *restrict y, double a, const double *restrict x, int64_t n)
{
    v4d va = {a, a, a, a};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) V4_STORE(y + i, V4_LOAD(y + i) - va * V4_LOAD(x + i));
    for (; i < n; i++) y[i] -= a * x[i];
}

/* y[0..n) -= Σ_q u[q] · v[q·ldv + 0..n), q < nu: one pass over y for the whole group. */
TJ_HOT static void rank_sub(double *restrict y, const double *restrict u, const double *restrict v, int64_t ldv,
                            int64_t nu, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v4d a0 = V4_LOAD(y + i), a1 = V4_LOAD(y + i + 4);
        for (int64_t q = 0; q < nu; q++) {
            v4d uq = {u[q], u[q], u[q], u[q]};
            a0 -= uq * V4_LOAD(v + q * ldv + i);
            a1 -= uq * V4_LOAD(v + q * ldv + i + 4);
        }
        V4_STORE(y + i, a0);
        V4_STORE(y + i + 4, a1);
    }
    for (; i < n; i++) {
        double a = y[i];
        for (int64_t q = 0; q < nu; q++) a -= u[q] * v[q * ldv + i];
        y[i] = a;
    }
}

/* Unblocked Crout Cholesky of rows/columns [0, n) of a (row stride lda), assuming the
 * contributions of any earlier columns were already subtracted. */
static int64_t cholesky_small(double *a, int64_t n, int64_t lda)
{
    for (int64_t i = 0; i < n; i++) {
        double *ri = a + i * lda;
        for (int64_t j = 0; j < i; j++) {
            const double *rj = a + j * lda;
            ri[j] = (ri[j] - dot(ri, rj, j)) / rj[j];
        }
        double d = ri[i] - dot(ri, ri, i);
        if (!(d > 0) || !isfinite(d)) return i;
        ri[i] = sqrt(d);
    }
    return -1;
}

/* In-place lower Cholesky of the leading n × n block of a (row stride lda); the strict upper
 * triangle is left alone. Returns -1, or the index of the first pivot that is not positive.
 * Right-looking in panels of CHOL_NB columns: factor the diagonal block, solve the panel below
 * it, then subtract the panel's rank-CHOL_NB product from the trailing lower triangle (the bulk
 * of the work, as fused row updates against the panel transposed into cache). */
#define CHOL_NB 32
typedef struct trail_job {
    double *a;
    const double *pt;
    int64_t n, lda, kb, nb, t0;
} trail_job;

/* Row t0 + item of the trailing update (one row is one item: the rows are independent). */
static void trail_run(void *arg, int64_t item)
{
    const trail_job *j = arg;
    int64_t i = j->t0 + item;
    rank_sub(j->a + i * j->lda + j->t0, j->a + i * j->lda + j->kb, j->pt + j->t0, j->n, j->nb, i - j->t0 + 1);
}

/* pool (may be NULL) shares the trailing updates; it must not be running a job already. */
static int64_t cholesky_pool(double *a, int64_t n, int64_t lda, tj_pool *pool)
{
    double *pt = n > 2 * CHOL_NB ? malloc((size_t)(CHOL_NB * n) * sizeof *pt) : NULL;
    if (!pt) return cholesky_small(a, n, lda);
    for (int64_t kb = 0; kb < n; kb += CHOL_NB) {
        int64_t nb = n - kb < CHOL_NB ? n - kb : CHOL_NB;
        int64_t bad = cholesky_small(a + kb * lda + kb, nb, lda);
        if (bad >= 0) {
            free(pt);
            return kb + bad;
        }
        for (int64_t i = kb + nb; i < n; i++) { /* L[i, kb:kb+nb] = A[i, kb:kb+nb] L_kk⁻ᵀ */
            double *ri = a + i * lda + kb;
            for (int64_t j = 0; j < nb; j++) {
                const double *rj = a + (kb + j) * lda + kb;
                ri[j] = (ri[j] - dot(ri, rj, j)) / rj[j];
            }
        }
        int64_t t0 = kb + nb;
        if (t0 >= n) break;
        for (int64_t j = t0; j < n; j++)
            for (int64_t t = 0; t < nb; t++) pt[t * n + j] = a[j * lda + kb + t];
        trail_job tj = {a, pt, n, lda, kb, nb, t0};
        if (pool && n - t0 >= 64) tj_pool_run(pool, 0, n - t0, trail_run, &tj);
        else
            for (int64_t i = 0; i < n - t0; i++) trail_run(&tj, i);
    }
    free(pt);
    return -1;
}

static int64_t cholesky(double *a, int64_t n, int64_t lda) { return cholesky_pool(a, n, lda, NULL); }

typedef struct utu_job {
    const double *u;
    double *inv;
    int64_t n;
} utu_job;

/* inv[i][0..i] = Σ_{m ≥ i} U[m][i] U[m][0..i] for row i = item. */
static void utu_run(void *arg, int64_t i)
{
    const utu_job *j = arg;
    const int64_t n = j->n;
    const double *u = j->u;
    double coef[8], *row = j->inv + i * n;
    int64_t m = i;
    for (; m + 8 <= n; m += 8) {
        for (int q = 0; q < 8; q++) coef[q] = -u[(m + q) * n + i];
        rank_sub(row, coef, u + m * n, n, 8, i + 1);
    }
    for (; m < n; m++)
        if (u[m * n + i] != 0) axpy_sub(row, -u[m * n + i], u + m * n, i + 1);
}

/* inv (n × n, full) = (L Lᵀ)⁻¹ from the lower factor L (stride n); u is n × n scratch; pool (may
 * be NULL) shares the rows of UᵀU. */
static void chol_inverse(const double *l, int64_t n, double *inv, double *u, tj_pool *pool)
{
    /* U = L⁻¹ (lower) row by row: U[i] = (e_i − Σ_{m<i} L[i][m] U[m]) / L[i][i], eight rows of U
     * at a time (their entries beyond the diagonal are zero). */
    memset(u, 0, (size_t)(n * n) * sizeof *u);
    for (int64_t i = 0; i < n; i++) {
        double *ui = u + i * n;
        const double *li = l + i * n;
        ui[i] = 1.0;
        int64_t m = 0;
        for (; m + 8 <= i; m += 8) rank_sub(ui, li + m, u + m * n, n, 8, m + 8);
        for (; m < i; m++)
            if (li[m] != 0) axpy_sub(ui, li[m], u + m * n, m + 1);
        double s = 1.0 / li[i];
        for (int64_t j = 0; j <= i; j++) ui[j] *= s;
    }
    /* inv = Uᵀ U: inv[i][0..i] = Σ_{m ≥ i} U[m][i] U[m][0..i] (rows independent), then mirrored. */
    memset(inv, 0, (size_t)(n * n) * sizeof *inv);
    utu_job job = {u, inv, n};
    if (pool && n >= 64) tj_pool_run(pool, 0, n, utu_run, &job);
    else
        for (int64_t i = 0; i < n; i++) utu_run(&job, i);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < i; j++) inv[j * n + i] = inv[i * n + j];
}

/* ---- statistics ---- */

/* Entry i of a mapped F64 array (the mapping may be unaligned). */
static double load_f64(const void *a, int64_t i)
{
    double v;
    memcpy(&v, (const char *)a + (size_t)i * sizeof v, sizeof v);
    return v;
}

tj_calib_options tj_calib_options_default(void)
{
    tj_calib_options o = {sizeof(tj_calib_options), 0.001, 0, NULL, NULL};
    return o;
}

/* A statistics matrix of layer L: its [k][k] entry counts the tokens, every entry finite. */
static tj_status check_square(const char *where, const tj_prune_layer_in *L, const void *h, const char *what,
                              int64_t tokens, tj_error *err)
{
    int64_t dim = L->k + 1;
    double corner;
    memcpy(&corner, (const char *)h + (size_t)(dim * dim - 1) * 8, 8);
    if (tokens < 1 || corner != (double)tokens)
        return tj_fail(err, TJ_ERR_FORMAT,
                       "%s: layer '%s': %lld tokens, but the bias column's diagonal %s[k][k] is %g (it counts the tokens)",
                       where, L->name, (long long)tokens, what, corner);
    for (int64_t i = 0; i < dim * dim; i++) {
        double v;
        memcpy(&v, (const char *)h + (size_t)i * 8, 8);
        if (!isfinite(v))
            return tj_fail(err, TJ_ERR_FORMAT, "%s: '%s.%s' has a non-finite entry at [%lld, %lld]", where, L->name,
                           what, (long long)(i / dim), (long long)(i % dim));
    }
    return TJ_OK;
}

/* Residual statistics of layer L ([k+1] × n): every entry finite. */
static tj_status check_resid(const char *where, const tj_prune_layer_in *L, const void *r, tj_error *err)
{
    for (int64_t i = 0; i < (L->k + 1) * L->n; i++)
        if (!isfinite(load_f64(r, i)))
            return tj_fail(err, TJ_ERR_FORMAT, "%s: '%s.residual' has a non-finite entry at [%lld, %lld]", where, L->name,
                           (long long)(i / L->n), (long long)(i % L->n));
    return TJ_OK;
}

tj_status tj_calib_stats_check(const char *where, const tj_prune_layer_in *L, const void *h, const void *cross,
                               const void *resid, int64_t tokens, tj_error *err)
{
    TJ_TRY(check_square(where, L, h, "hessian", tokens, err));
    if (cross) TJ_TRY(check_square(where, L, cross, "cross", tokens, err));
    if (resid) TJ_TRY(check_resid(where, L, resid, err));
    return TJ_OK;
}

/* Tensor "LAYER.suffix" of the statistics file, or NULL; *oom set when the name could not be made. */
static const tj_st_tensor *find_stat(const tj_st_file *sf, const char *layer, const char *suffix, int *oom)
{
    size_t len = strlen(layer), sl = strlen(suffix);
    char *name = malloc(len + sl + 1);
    if (!name) {
        *oom = 1;
        return NULL;
    }
    memcpy(name, layer, len);
    memcpy(name + len, suffix, sl + 1);
    const tj_st_tensor *t = tj_st_find(sf, name);
    free(name);
    return t;
}

tj_status tj_calib_stats_find(const tj_st_file *sf, const tj_prune_layer_in *L, tj_calib_stats *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    int oom = 0;
    const tj_st_tensor *h = find_stat(sf, L->name, ".hessian", &oom), *t = find_stat(sf, L->name, ".tokens", &oom);
    const tj_st_tensor *x = find_stat(sf, L->name, ".cross", &oom), *rs = find_stat(sf, L->name, ".residual", &oom);
    if (oom) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    if (!h || !t)
        return tj_fail(err, TJ_ERR_NOT_FOUND,
                       "%s: no statistics for layer '%s' (tensors '%s.hessian' and '%s.tokens'): a statistics file for another model or other layers?",
                       sf->path, L->name, L->name, L->name);
    int64_t dim = L->k + 1;
    if (strcmp(h->dtype_str, "F64") != 0 || h->ndim != 2 || h->shape[0] != h->shape[1])
        return tj_fail(err, TJ_ERR_FORMAT, "%s: '%s.hessian' must be a square F64 matrix (it is %s, %d-D)", sf->path,
                       L->name, h->dtype_str, h->ndim);
    if (h->shape[0] != dim)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "%s: '%s.hessian' is [%lld, %lld] but layer '%s' has k = %lld input features, so it must be [%lld, %lld] (k + 1 with the bias column): statistics for another model?",
                       sf->path, L->name, (long long)h->shape[0], (long long)h->shape[1], L->name, (long long)L->k,
                       (long long)dim, (long long)dim);
    if (strcmp(t->dtype_str, "I64") != 0 || t->ndim != 1 || t->shape[0] != 1)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: '%s.tokens' must be an I64 tensor of shape [1]", sf->path, L->name);
    if ((int64_t)(h->end - h->begin) != dim * dim * 8 || t->end - t->begin != 8)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: the statistics of '%s' have the wrong byte size", sf->path, L->name);
    int64_t tokens;
    memcpy(&tokens, t->data, 8);
    TJ_TRY(check_square(sf->path, L, h->data, "hessian", tokens, err));
    if (x) {
        if (strcmp(x->dtype_str, "F64") != 0 || x->ndim != 2 || x->shape[0] != dim || x->shape[1] != dim ||
            (int64_t)(x->end - x->begin) != dim * dim * 8)
            return tj_fail(err, TJ_ERR_FORMAT, "%s: '%s.cross' must be an F64 matrix [%lld, %lld] like '%s.hessian'",
                           sf->path, L->name, (long long)dim, (long long)dim, L->name);
        TJ_TRY(check_square(sf->path, L, x->data, "cross", tokens, err));
        out->cross = x->data;
    }
    if (rs) {
        if (strcmp(rs->dtype_str, "F64") != 0 || rs->ndim != 2 || rs->shape[0] != dim || rs->shape[1] != L->n ||
            (int64_t)(rs->end - rs->begin) != dim * L->n * 8)
            return tj_fail(err, TJ_ERR_FORMAT, "%s: '%s.residual' must be an F64 matrix [%lld, %lld] (k + 1, n)",
                           sf->path, L->name, (long long)dim, (long long)L->n);
        TJ_TRY(check_resid(sf->path, L, rs->data, err));
        out->resid = rs->data;
    }
    out->h = h->data;
    out->dim = dim;
    out->tokens = tokens;
    return TJ_OK;
}

/* ---- per layer ---- */

typedef struct lctx {
    const tj_calib_layer *cl;
    int64_t n, k, dim;
    double *hd;   /* damped H, dim × dim */
    double *hinv; /* Hd⁻¹ */
    double *bias; /* original bias, n (zeros when absent) */
    double *tgt;  /* with cross statistics: per output feature the weights [w, b] whose output on the
                     pruned model's inputs best matches the dense model's, Hd⁻¹ Gd w̃ (n × dim);
                     NULL: the target is the layer's own w̃ */
} lctx;

/* Output feature row's target weights with the bias last (dim entries): see lctx.tgt. */
static void row_target(const lctx *c, int64_t row, float *wrow, double *dst)
{
    if (c->tgt) {
        memcpy(dst, c->tgt + row * c->dim, (size_t)c->dim * sizeof *dst);
        return;
    }
    const tj_prune_layer_in *L = c->cl->in;
    tj_convert_to_f32((const char *)L->w + (size_t)(row * c->k) * tj_dtype_size(L->wdt), L->wdt, c->k, wrow);
    for (int64_t q = 0; q < c->k; q++) dst[q] = wrow[q];
    dst[c->k] = c->bias[row];
}

static void lctx_free(lctx *c)
{
    free(c->tgt);
    free(c->hd);
    free(c->hinv);
    free(c->bias);
}

/* The dense-output targets of rows [item·TGT_ROWS, …) (see lctx_init), one pool item each. */
enum { TGT_ROWS = 16 };

typedef struct tgt_job {
    const lctx *c;
    const double *gd; /* Gd, dim × dim */
    double *tg;       /* n × dim */
    char *failed;     /* per item: 1 when out of memory */
} tgt_job;

static void tgt_run(void *arg, int64_t item)
{
    const tgt_job *j = arg;
    const lctx *c = j->c;
    const int64_t d = c->dim, r0 = item * TGT_ROWS, nr = (r0 + TGT_ROWS < c->n ? r0 + TGT_ROWS : c->n) - r0;
    double *gw = malloc((size_t)(nr * d) * sizeof *gw), *wt = malloc((size_t)(nr * d) * sizeof *wt);
    float *wrow = malloc((size_t)c->k * sizeof *wrow);
    if (!gw || !wt || !wrow) {
        j->failed[item] = 1;
    } else {
        /* row by row the same dot products; the rows inner, so that each row of Gd and Hd⁻¹ is
         * read once for the item's rows rather than once per row (both are d × d, up to 19 MB) */
        for (int64_t r = 0; r < nr; r++) row_target(c, r0 + r, wrow, wt + r * d);
        for (int64_t i = 0; i < d; i++)
            for (int64_t r = 0; r < nr; r++) gw[r * d + i] = dot(j->gd + i * d, wt + r * d, d);
        if (c->cl->stats.resid)
            for (int64_t i = 0; i < d; i++)
                for (int64_t r = 0; r < nr; r++) gw[r * d + i] += load_f64(c->cl->stats.resid, i * c->n + r0 + r);
        for (int64_t i = 0; i < d; i++)
            for (int64_t r = 0; r < nr; r++) j->tg[(r0 + r) * d + i] = dot(c->hinv + i * d, gw + r * d, d);
    }
    free(gw), free(wt), free(wrow);
}

static tj_status lctx_init(lctx *c, const tj_calib_layer *cl, double damp, int need_inv, tj_pool *pool,
                           tj_error *err)
{
    const tj_prune_layer_in *L = cl->in;
    memset(c, 0, sizeof *c);
    c->cl = cl;
    c->n = L->n;
    c->k = L->k;
    c->dim = L->k + 1;
    if (cl->stats.dim != c->dim || !cl->stats.h)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "layer '%s': statistics of dimension %lld, but k + 1 = %lld",
                       L->name, (long long)cl->stats.dim, (long long)c->dim);
    if (!(damp >= 0) || !isfinite(damp))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "damp %g must be finite and ≥ 0", damp);
    int64_t d = c->dim;
    c->hd = malloc((size_t)(d * d) * sizeof *c->hd);
    c->bias = calloc((size_t)c->n, sizeof *c->bias);
    if (need_inv) c->hinv = malloc((size_t)(d * d) * sizeof *c->hinv);
    double *tmp = need_inv ? malloc((size_t)(d * d) * sizeof *tmp) : NULL;
    if (!c->hd || !c->bias || (need_inv && (!c->hinv || !tmp))) {
        free(tmp);
        lctx_free(c);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory for its statistics", L->name);
    }
    memcpy(c->hd, cl->stats.h, (size_t)(d * d) * sizeof *c->hd);
    double mean = 0;
    for (int64_t i = 0; i < c->k; i++) mean += c->hd[i * d + i];
    mean /= (double)c->k;
    double lambda = damp * mean;
    for (int64_t i = 0; i < c->k; i++) c->hd[i * d + i] += lambda; /* not the bias column */
    if (cl->bias)
        for (int64_t i = 0; i < c->n; i++) c->bias[i] = tj_load_f32(cl->bias, cl->bdt, i);
    if (need_inv) {
        memcpy(tmp, c->hd, (size_t)(d * d) * sizeof *tmp);
        int64_t bad = cholesky_pool(tmp, d, d, pool);
        if (bad >= 0) {
            free(tmp);
            lctx_free(c);
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                           "layer '%s': the statistics H + %gI are singular (not positive definite at input feature %lld%s); "
                           "use more calibration tokens or a larger damping",
                           L->name, lambda, (long long)bad, bad == c->k ? ", the bias column" : "");
        }
        double *u = malloc((size_t)(d * d) * sizeof *u);
        if (!u) {
            free(tmp);
            lctx_free(c);
            return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory for H⁻¹", L->name);
        }
        chol_inverse(tmp, d, c->hinv, u, pool);
        free(u);
        free(tmp);
    }
    if (cl->stats.cross || cl->stats.resid) {
        /* tgt = Hd⁻¹ (Gd w̃ + D) with Gd = G + λI_k (G = Σ x̃ x̃_refᵀ; Hd without cross
         * statistics) and D = Σ x̃ (r_ref − r) this row's column of NAME.residual (0 without): the
         * minimiser over x of ‖X̃ x − (X̃_ref w̃ + R_ref − R)‖² + λ‖x − w̃‖² (bias undamped); that
         * equals (x − tgt)ᵀ Hd (x − tgt) + const, so selection and rebuild proceed with tgt as w̃. */
        int64_t nitems = (c->n + TGT_ROWS - 1) / TGT_ROWS;
        double *gd = malloc((size_t)(d * d) * sizeof *gd);
        char *failed = calloc((size_t)nitems, 1);
        c->tgt = malloc((size_t)(c->n * d) * sizeof *c->tgt);
        if (!gd || !failed || !c->tgt || !c->hinv) {
            free(gd), free(failed);
            lctx_free(c);
            return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory for the dense-output target", L->name);
        }
        if (cl->stats.cross) {
            memcpy(gd, cl->stats.cross, (size_t)(d * d) * sizeof *gd);
            for (int64_t i = 0; i < c->k; i++) gd[i * d + i] += lambda;
        } else {
            memcpy(gd, c->hd, (size_t)(d * d) * sizeof *gd);
        }
        tgt_job job = {c, gd, c->tgt, failed};
        c->tgt = NULL; /* row_target reads the layer's own weights meanwhile */
        if (pool) tj_pool_run(pool, 0, nitems, tgt_run, &job);
        else
            for (int64_t i = 0; i < nitems; i++) tgt_run(&job, i);
        c->tgt = job.tg;
        int oom = 0;
        for (int64_t i = 0; i < nitems; i++) oom |= failed[i];
        free(gd), free(failed);
        if (oom) {
            lctx_free(c);
            return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory for the dense-output target", L->name);
        }
    }
    return TJ_OK;
}

/* ---- one tile: OBS order, then the rebuild at one or more kept counts ---- */

typedef struct tile_job {
    const lctx *c;
    const int64_t *rows; /* the tile's output features */
    int64_t nrows;
    int64_t nd;
    const int64_t *keep; /* kept input features per output (each in [0, k]) */
    float *const *w;     /* per output: [n × k] layer weights (rows of this tile written) */
    float *const *b;     /* per output: [n] */
    int32_t *kept;       /* optional: output 0's kept features, increasing (keep[0] entries) */
    double *err;         /* optional, nd entries: Σ_rows (w̃−w̃')ᵀHd(w̃−w̃') per output, and err[nd]
                            the tile's Σ_rows w̃ᵀHdw̃ (the error with nothing kept, bias aside) */
    tj_status status;
    char msg[256];
} tile_job;

typedef struct sal_item {
    double s;
    int64_t orig, pos;
} sal_item;

static int sal_cmp(const void *pa, const void *pb)
{
    const sal_item *a = pa, *b = pb;
    if (a->s != b->s) return a->s < b->s ? -1 : 1;
    return (a->orig > b->orig) - (a->orig < b->orig);
}

static int i64_cmp(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return (a > b) - (a < b);
}

/* Removes rows and columns listed (increasing) in g[0..nb) from the r × r matrix a in place
 * (rows only when square is 0: then a is nrow × r and only columns go). */
static void compact(double *a, int64_t nrow, int64_t r, const int64_t *g, int64_t nb, int square)
{
    int64_t r2 = r - nb, out = 0;
    for (int64_t i = 0, gi = 0; i < nrow; i++) {
        if (square && gi < nb && g[gi] == i) {
            gi++;
            continue;
        }
        const double *src = a + i * r;
        double *dst = a + out * r2;
        int64_t j0 = 0, pos = 0;
        for (int64_t q = 0; q <= nb; q++) {
            int64_t j1 = q < nb ? g[q] : r;
            memmove(dst + pos, src + j0, (size_t)(j1 - j0) * sizeof *dst);
            pos += j1 - j0;
            j0 = j1 + 1;
        }
        out++;
    }
}

/* Group size of the greedy OBS removal: about 96 steps per tile whatever k is. */
static int64_t obs_group(int64_t k) { return k / 96 > 32 ? 32 : k / 96 > 1 ? k / 96 : 1; }

static void tile_run(void *arg, int64_t item)
{
    tile_job *job = (tile_job *)arg + item;
    const lctx *c = job->c;
    const int64_t k = c->k, dim = c->dim, nr = job->nrows;
    const tj_prune_layer_in *L = c->cl->in;
    int64_t minkeep = k, maxkeep = 0;
    for (int64_t j = 0; j < job->nd; j++) {
        if (job->keep[j] < minkeep) minkeep = job->keep[j];
        if (job->keep[j] > maxkeep) maxkeep = job->keep[j];
    }
    const int64_t nremove = k - minkeep, pmax = 1 + maxkeep, b0 = obs_group(k);
    double *a = malloc((size_t)(dim * dim) * sizeof *a);
    double *wc = malloc((size_t)(nr * dim) * sizeof *wc);
    double *wt = malloc((size_t)(nr * dim) * sizeof *wt);
    double *v = malloc((size_t)(b0 * dim) * sizeof *v);
    double *acc = malloc((size_t)dim * sizeof *acc);
    double *small = malloc((size_t)(4 * b0 * b0) * sizeof *small);
    sal_item *sal = malloc((size_t)dim * sizeof *sal);
    int64_t *pos2orig = malloc((size_t)dim * sizeof *pos2orig);
    int64_t *order = malloc((size_t)dim * sizeof *order);
    int64_t *grp = malloc((size_t)b0 * sizeof *grp);
    double *m = malloc((size_t)(pmax * pmax) * sizeof *m);
    double *y = malloc((size_t)(pmax * nr) * sizeof *y), *x = malloc((size_t)(pmax * nr) * sizeof *x);
    float *wrow = malloc((size_t)k * sizeof *wrow);
    if (!a || !wc || !wt || !v || !acc || !small || !sal || !pos2orig || !order || !grp || !m || !y || !x || !wrow) {
        job->status = TJ_ERR_OUT_OF_MEMORY;
        snprintf(job->msg, sizeof job->msg, "layer '%s': out of memory for a tile", L->name);
        goto done;
    }
    /* The tile's weights with the bias as the last column. */
    for (int64_t i = 0; i < nr; i++) row_target(c, job->rows[i], wrow, wt + i * dim);
    memcpy(wc, wt, (size_t)(nr * dim) * sizeof *wc);
    memcpy(a, c->hinv, (size_t)(dim * dim) * sizeof *a);
    for (int64_t p = 0; p < dim; p++) pos2orig[p] = p;

    /* Greedy OBS: removed features go to order[dim-1], order[dim-2], ... (least important last). */
    int64_t r = dim, nrem = 0;
    while (nrem < nremove) {
        int64_t nb = nremove - nrem < b0 ? nremove - nrem : b0;
        memset(acc, 0, (size_t)r * sizeof *acc);
        for (int64_t i = 0; i < nr; i++) {
            const double *wi = wc + i * r;
            for (int64_t p = 0; p < r; p++) acc[p] += wi[p] * wi[p];
        }
        int64_t ns = 0;
        for (int64_t p = 0; p < r; p++)
            if (pos2orig[p] != k) sal[ns++] = (sal_item){acc[p] / a[p * r + p], pos2orig[p], p};
        qsort(sal, (size_t)ns, sizeof *sal, sal_cmp);
        for (int64_t q = 0; q < nb; q++) {
            grp[q] = sal[q].pos;
            order[dim - 1 - nrem - q] = sal[q].orig;
        }
        qsort(grp, (size_t)nb, sizeof *grp, i64_cmp);
        /* C = (A[G,G])⁻¹ */
        double *sgg = small, *cinv = small + b0 * b0, *scratch = small + 2 * b0 * b0;
        for (int64_t p = 0; p < nb; p++)
            for (int64_t q = 0; q < nb; q++) sgg[p * nb + q] = a[grp[p] * r + grp[q]];
        if (cholesky(sgg, nb, nb) >= 0) {
            job->status = TJ_ERR_INVALID_ARGUMENT;
            snprintf(job->msg, sizeof job->msg,
                     "layer '%s': H⁻¹ lost positive definiteness while removing input features (statistics nearly singular: raise the damping)",
                     L->name);
            goto done;
        }
        chol_inverse(sgg, nb, cinv, scratch, NULL);
        /* V = C · A[G,:] */
        for (int64_t p = 0; p < nb; p++) {
            double *vp = v + p * r;
            memset(vp, 0, (size_t)r * sizeof *vp);
            for (int64_t q = 0; q < nb; q++) axpy_sub(vp, -cinv[p * nb + q], a + grp[q] * r, r);
        }
        /* W -= W[:,G] V; A -= A[:,G] V (rows G are dropped next, so skip them). */
        for (int64_t i = 0; i < nr; i++) {
            double *wi = wc + i * r, u[64];
            for (int64_t q = 0; q < nb; q++) u[q] = wi[grp[q]];
            rank_sub(wi, u, v, r, nb, r);
        }
        for (int64_t i = 0, gi = 0; i < r; i++) {
            if (gi < nb && grp[gi] == i) {
                gi++;
                continue;
            }
            double *ai = a + i * r, u[64];
            for (int64_t q = 0; q < nb; q++) u[q] = ai[grp[q]];
            rank_sub(ai, u, v, r, nb, r);
        }
        compact(a, r, r, grp, nb, 1);
        compact(wc, nr, r, grp, nb, 0);
        for (int64_t p = 0, out = 0, gi = 0; p < r; p++) {
            if (gi < nb && grp[gi] == p) {
                gi++;
                continue;
            }
            pos2orig[out++] = pos2orig[p];
        }
        r -= nb;
        nrem += nb;
    }
    /* order = [bias, survivors (increasing), removed, most recently removed first]. */
    order[0] = k;
    for (int64_t p = 0, q = 1; p < r; p++)
        if (pos2orig[p] != k) order[q++] = pos2orig[p];

    /* One Cholesky of Hd[P,P] (leading pmax); its leading p × p block factors every prefix. */
    for (int64_t i = 0; i < pmax; i++)
        for (int64_t j = 0; j <= i; j++) m[i * pmax + j] = c->hd[order[i] * dim + order[j]];
    int64_t bad = cholesky(m, pmax, pmax);
    if (bad >= 0) {
        job->status = TJ_ERR_INVALID_ARGUMENT;
        snprintf(job->msg, sizeof job->msg,
                 "layer '%s': the statistics of the kept features are singular (at input feature %lld): raise the damping",
                 L->name, (long long)order[bad]);
        goto done;
    }
    /* R = Hd[P,:] W̃ᵀ and Y = L⁻¹ R with the tile's rows as right-hand sides ([pmax × nr]):
     * forward substitution is prefix-consistent, so Y serves every density. */
    for (int64_t q = 0; q < pmax; q++) {
        const double *hq = c->hd + order[q] * dim;
        double *yq = y + q * nr;
        for (int64_t i = 0; i < nr; i++) yq[i] = dot(hq, wt + i * dim, dim);
        for (int64_t j = 0; j < q; j++)
            if (m[q * pmax + j] != 0) axpy_sub(yq, m[q * pmax + j], y + j * nr, nr);
        double inv = 1.0 / m[q * pmax + q];
        for (int64_t i = 0; i < nr; i++) yq[i] *= inv;
    }
    if (job->err) {
        /* The least-squares residual of prefix p is w̃ᵀHd w̃ − ‖Y[0..p)‖² per row. */
        double total = 0;
        for (int64_t i = 0; i < nr; i++)
            for (int64_t q = 0; q < dim; q++) total += wt[i * dim + q] * dot(c->hd + q * dim, wt + i * dim, dim);
        for (int64_t j = 0; j < job->nd; j++) {
            double expl = 0;
            for (int64_t q = 0; q < 1 + job->keep[j]; q++)
                for (int64_t i = 0; i < nr; i++) expl += y[q * nr + i] * y[q * nr + i];
            job->err[j] = total - expl > 0 ? total - expl : 0;
        }
        job->err[job->nd] = total;
    }
    for (int64_t j = 0; j < job->nd; j++) {
        int64_t p = 1 + job->keep[j];
        if (!job->w[j]) continue;
        memcpy(x, y, (size_t)(p * nr) * sizeof *x);
        for (int64_t q = p - 1; q >= 0; q--) { /* Lᵀ X = Y: column q of Lᵀ is row q of L */
            double *xq = x + q * nr, inv = 1.0 / m[q * pmax + q];
            for (int64_t i = 0; i < nr; i++) xq[i] *= inv;
            for (int64_t t = 0; t < q; t++)
                if (m[q * pmax + t] != 0) axpy_sub(x + t * nr, m[q * pmax + t], xq, nr);
        }
        for (int64_t i = 0; i < nr; i++) {
            int64_t row = job->rows[i];
            float *wo = job->w[j] + row * k;
            memset(wo, 0, (size_t)k * sizeof *wo);
            for (int64_t q = 1; q < p; q++) wo[order[q]] = (float)x[q * nr + i];
            job->b[j][row] = (float)x[i];
        }
    }
    if (job->kept) {
        int64_t p = job->keep[0];
        memcpy(pos2orig, order + 1, (size_t)p * sizeof *pos2orig);
        qsort(pos2orig, (size_t)p, sizeof *pos2orig, i64_cmp);
        for (int64_t q = 0; q < p; q++) job->kept[q] = (int32_t)pos2orig[q];
    }
    job->status = TJ_OK;
done:
    free(a);
    free(wc);
    free(wt);
    free(v);
    free(acc);
    free(small);
    free(sal);
    free(pos2orig);
    free(order);
    free(grp);
    free(m);
    free(y);
    free(x);
    free(wrow);
}

/* ---- layers ---- */

static tj_status run_tiles(tj_pool *pool, tile_job *jobs, int64_t n, tj_error *err)
{
    if (pool) tj_pool_run(pool, 0, n, tile_run, jobs);
    else
        for (int64_t i = 0; i < n; i++) tile_run(jobs, i);
    for (int64_t i = 0; i < n; i++)
        if (jobs[i].status != TJ_OK) return tj_fail(err, jobs[i].status, "%s", jobs[i].msg);
    return TJ_OK;
}

static tj_status make_pool(const tj_calib_options *o, tj_pool **pool, tj_error *err)
{
    int threads = o->threads;
    if (threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc > 0 ? (int)nc : 1;
    }
    *pool = NULL;
    if (threads == 1) return TJ_OK;
    return tj_pool_create(threads, pool, err);
}

static int64_t keep_of(double density, int64_t k)
{
    int64_t q = llround(density * (double)k);
    return q < 0 ? 0 : q > k ? k : q;
}

/* The variance of each output feature over the calibration tokens (tw2's column score) and its
 * mean: var = w̃ᵀHw̃/T − (H[k,:]·w̃/T)². */
static tj_status column_stats(const lctx *c, double *var, double *mean, tj_error *err)
{
    const tj_prune_layer_in *L = c->cl->in;
    const double *h = c->cl->stats.h;
    double T = (double)c->cl->stats.tokens;
    double *w = malloc((size_t)c->dim * sizeof *w), *hw = malloc((size_t)c->dim * sizeof *hw);
    float *wrow = malloc((size_t)c->k * sizeof *wrow);
    double *hrow = malloc((size_t)c->dim * sizeof *hrow);
    if (!w || !hw || !wrow || !hrow) {
        free(w), free(hw), free(wrow), free(hrow);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory", L->name);
    }
    for (int64_t row = 0; row < c->n; row++) {
        tj_convert_to_f32((const char *)L->w + (size_t)(row * c->k) * tj_dtype_size(L->wdt), L->wdt, c->k, wrow);
        for (int64_t q = 0; q < c->k; q++) w[q] = wrow[q];
        w[c->k] = c->bias[row];
        double quad = 0;
        for (int64_t i = 0; i < c->dim; i++) {
            memcpy(hrow, h + i * c->dim, (size_t)c->dim * sizeof *hrow); /* the mapping may be unaligned */
            hw[i] = dot(hrow, w, c->dim);
            quad += w[i] * hw[i];
        }
        mean[row] = hw[c->k] / T;
        var[row] = quad / T - mean[row] * mean[row];
    }
    free(w), free(hw), free(wrow), free(hrow);
    return TJ_OK;
}

typedef struct gain_item {
    double gain;
    int64_t row, col;
} gain_item;

static int gain_cmp(const void *pa, const void *pb)
{
    const gain_item *a = pa, *b = pb;
    if (a->gain != b->gain) return a->gain > b->gain ? -1 : 1;
    if (a->row != b->row) return a->row < b->row ? -1 : 1;
    return (a->col > b->col) - (a->col < b->col);
}

static int gain_pos_cmp(const void *pa, const void *pb)
{
    const gain_item *a = pa, *b = pb;
    if (a->row != b->row) return a->row < b->row ? -1 : 1;
    return (a->col > b->col) - (a->col < b->col);
}

/* tew: the `count` removed weights with the largest gain (Hd δ)_c² / Hd_cc on the remaining
 * error δ = w̃ − w̃_new, fitted jointly per row (Hd[E,E] β = (Hd δ)[E]) with the rest held. */
static tj_status add_ew(const lctx *c, tj_layer *out, float *w, float *b, int64_t count, tj_error *err)
{
    const tj_prune_layer_in *L = c->cl->in;
    const int64_t n = c->n, k = c->k, dim = c->dim;
    tj_status s = TJ_OK;
    double *grad = malloc((size_t)(n * dim) * sizeof *grad), *delta = malloc((size_t)dim * sizeof *delta);
    float *wrow = malloc((size_t)k * sizeof *wrow);
    unsigned char *kept = malloc((size_t)k);
    int64_t *tile_of = malloc((size_t)n * sizeof *tile_of);
    gain_item *cand = NULL;
    double *sys = NULL, *rhs = NULL;
    int64_t ncand = 0;
    if (!grad || !delta || !wrow || !kept || !tile_of) goto oom;
    for (int64_t row = 0; row < n; row++) tile_of[row] = -1;
    for (int64_t j = 0; j < out->ncols; j++) tile_of[tj_layer_col(out, j)] = j / out->g;
    int64_t removed = 0;
    for (int64_t row = 0; row < n; row++)
        removed += tile_of[row] < 0 ? k : k - tj_tile_nrows(out, tile_of[row]);
    if (count > removed) count = removed;
    if (!(cand = malloc((size_t)(removed ? removed : 1) * sizeof *cand))) goto oom;
    for (int64_t row = 0; row < n; row++) {
        row_target(c, row, wrow, delta);
        for (int64_t q = 0; q < k; q++) delta[q] -= (double)w[row * k + q];
        delta[k] -= (double)b[row];
        double *g = grad + row * dim;
        for (int64_t i = 0; i < dim; i++) g[i] = dot(c->hd + i * dim, delta, dim);
        memset(kept, 0, (size_t)k);
        int64_t t = tile_of[row];
        if (t >= 0)
            for (int64_t q = out->tile_ptr[t]; q < out->tile_ptr[t + 1]; q++) kept[out->tile_rows[q]] = 1;
        for (int64_t q = 0; q < k; q++)
            if (!kept[q]) cand[ncand++] = (gain_item){g[q] * g[q] / c->hd[q * dim + q], row, q};
    }
    qsort(cand, (size_t)ncand, sizeof *cand, gain_cmp);
    qsort(cand, (size_t)count, sizeof *cand, gain_pos_cmp);
    out->ew_indptr = malloc((size_t)(n + 1) * sizeof *out->ew_indptr);
    out->ew_indices = malloc((size_t)(count ? count : 1) * sizeof *out->ew_indices);
    if (!out->ew_indptr || !out->ew_indices) goto oom;
    out->ew_nnz = count;
    int64_t maxe = 0;
    for (int64_t i = 0, row = 0; row <= n; row++) {
        out->ew_indptr[row] = i;
        int64_t i0 = i;
        while (row < n && i < count && cand[i].row == row) i++;
        if (i - i0 > maxe) maxe = i - i0;
    }
    for (int64_t i = 0; i < count; i++) out->ew_indices[i] = (int32_t)cand[i].col;
    sys = malloc((size_t)(maxe * maxe + 1) * sizeof *sys);
    rhs = malloc((size_t)(maxe + 1) * sizeof *rhs);
    if (!sys || !rhs) goto oom;
    for (int64_t row = 0; row < n; row++) {
        int64_t e0 = out->ew_indptr[row], ne = out->ew_indptr[row + 1] - e0;
        if (!ne) continue;
        const int32_t *e = out->ew_indices + e0;
        for (int64_t p = 0; p < ne; p++) {
            rhs[p] = grad[row * dim + e[p]];
            for (int64_t q = 0; q <= p; q++) sys[p * ne + q] = c->hd[(int64_t)e[p] * dim + e[q]];
        }
        if (cholesky(sys, ne, ne) >= 0) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "layer '%s': singular statistics for the ew weights of row %lld",
                        L->name, (long long)row);
            goto done;
        }
        for (int64_t p = 0; p < ne; p++) rhs[p] = (rhs[p] - dot(sys + p * ne, rhs, p)) / sys[p * ne + p];
        for (int64_t p = ne - 1; p >= 0; p--) {
            rhs[p] /= sys[p * ne + p];
            axpy_sub(rhs, rhs[p], sys + p * ne, p);
        }
        for (int64_t p = 0; p < ne; p++) w[row * k + e[p]] = (float)rhs[p];
    }
    goto done;
oom:
    s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory for the ew residual", L->name);
done:
    free(grad);
    free(delta);
    free(wrow);
    free(kept);
    free(tile_of);
    free(cand);
    free(sys);
    free(rhs);
    return s;
}

static tj_status check_layer(const tj_calib_layer *cl, tj_error *err)
{
    const tj_prune_layer_in *L = cl->in;
    if (!L || !L->name || !L->w || L->n < 1 || L->k < 1 || L->n > TJ_MAX_DIM || L->k > TJ_MAX_DIM)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: a layer without name, weights or a valid shape");
    if (!(cl->density >= 0 && cl->density <= 1))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "layer '%s': density %g is outside [0, 1]", L->name, cl->density);
    if (cl->stats.dim != L->k + 1 || !cl->stats.h || cl->stats.tokens < 1)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "layer '%s': statistics of dimension %lld (%lld tokens), but the layer needs k + 1 = %lld",
                       L->name, (long long)cl->stats.dim, (long long)cl->stats.tokens, (long long)(L->k + 1));
    return TJ_OK;
}

/* One layer: tiles (over all n, or over tw2's kept columns), jobs, pattern, ew. */
static tj_status prune_layer(const tj_calib_layer *cl, const tj_prune_options *opt, const tj_calib_options *co,
                             tj_pool *pool, tj_layer *out, float *w, float *b, tj_error *err)
{
    const tj_prune_layer_in *L = cl->in;
    const int64_t n = L->n, k = L->k, g = opt->g < n ? opt->g : n;
    tj_status s = TJ_OK;
    lctx c;
    TJ_TRY(lctx_init(&c, cl, co->damp, 1, pool, err));
    tj_prune_mode base = opt->mode == TJ_PRUNE_TEW ? opt->tew_base : opt->mode;
    double d = cl->density, dtile = d;
    if (opt->mode == TJ_PRUNE_TEW) d = dtile = d - opt->ew_fraction > 0 ? d - opt->ew_fraction : 0;
    int64_t ncols = n, *cols = NULL;
    double *var = NULL, *mean = NULL;
    tile_job *jobs = NULL;
    int64_t *keep = NULL;
    sal_item *rank = NULL;
    memset(out, 0, sizeof *out);
    memset(w, 0, (size_t)(n * k) * sizeof *w);
    if (base == TJ_PRUNE_TW2) {
        double dc = sqrt(d);
        ncols = llround(dc * (double)n);
        dtile = dc;
        var = malloc((size_t)n * sizeof *var);
        mean = malloc((size_t)n * sizeof *mean);
        rank = malloc((size_t)n * sizeof *rank);
        cols = malloc((size_t)(n ? n : 1) * sizeof *cols);
        if (!var || !mean || !rank || !cols) goto oom;
        if ((s = column_stats(&c, var, mean, err)) != TJ_OK) goto done;
        for (int64_t i = 0; i < n; i++) rank[i] = (sal_item){var[i], i, i};
        qsort(rank, (size_t)n, sizeof *rank, sal_cmp);
        /* the lowest-variance n − ncols features become their mean */
        for (int64_t i = 0; i < n - ncols; i++) b[rank[i].orig] = (float)mean[rank[i].orig];
        for (int64_t i = n - ncols; i < n; i++) cols[i - (n - ncols)] = rank[i].orig;
        qsort(cols, (size_t)ncols, sizeof *cols, i64_cmp);
    }
    int64_t ntiles = (ncols + g - 1) / g;
    out->name = strdup(L->name);
    out->n = n;
    out->k = k;
    out->g = g;
    out->ncols = ncols;
    out->ntiles = ntiles;
    out->act = TJ_ACT_NONE;
    out->tile_ptr = malloc((size_t)(ntiles + 1) * sizeof *out->tile_ptr);
    keep = malloc((size_t)(ntiles ? ntiles : 1) * sizeof *keep);
    jobs = calloc((size_t)(ntiles ? ntiles : 1), sizeof *jobs);
    if (!out->name || !out->tile_ptr || !keep || !jobs) goto oom;
    if (base == TJ_PRUNE_TW2) {
        out->cols = cols;
        cols = NULL;
    } else {
        if (!(cols = malloc((size_t)n * sizeof *cols))) goto oom;
        for (int64_t i = 0; i < n; i++) cols[i] = i;
    }
    const int64_t *colv = out->cols ? out->cols : cols;
    out->tile_ptr[0] = 0;
    for (int64_t t = 0; t < ntiles; t++) {
        keep[t] = cl->tile_keep && base == TJ_PRUNE_TW1 ? cl->tile_keep[t] : keep_of(dtile, k);
        if (keep[t] < 0 || keep[t] > k) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "layer '%s': tile %lld keeps %lld of %lld input features", L->name,
                        (long long)t, (long long)keep[t], (long long)k);
            goto done;
        }
        out->tile_ptr[t + 1] = out->tile_ptr[t] + keep[t];
    }
    if (!(out->tile_rows = malloc((size_t)(out->tile_ptr[ntiles] ? out->tile_ptr[ntiles] : 1) * sizeof *out->tile_rows)))
        goto oom;
    for (int64_t t = 0; t < ntiles; t++) {
        int64_t j0 = t * g, j1 = j0 + g < ncols ? j0 + g : ncols;
        jobs[t] = (tile_job){&c, colv + j0, j1 - j0, 1, &keep[t], &w, &b, out->tile_rows + out->tile_ptr[t], NULL,
                             TJ_OK, ""};
    }
    if ((s = run_tiles(pool, jobs, ntiles, err)) != TJ_OK) goto done;
    if (opt->mode == TJ_PRUNE_TEW) {
        int64_t count = llround(opt->ew_fraction * (double)n * (double)k);
        if ((s = add_ew(&c, out, w, b, count, err)) != TJ_OK) goto done;
    }
    if ((s = tj_layer_validate(out, out->name, err)) != TJ_OK) goto done;
    out->hash = tj_layer_hash(out);
    goto done;
oom:
    s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory", L->name);
done:
    lctx_free(&c);
    free(var);
    free(mean);
    free(rank);
    free(cols);
    free(keep);
    free(jobs);
    return s;
}

tj_status tj_prune_calibrated(const tj_calib_layer *layers, int64_t nl, const tj_prune_options *opt,
                              const tj_calib_options *copt, tj_pattern **out, float **out_w, float **out_b, tj_error *err)
{
    *out = NULL;
    tj_calib_options co = copt ? *copt : tj_calib_options_default();
    if (nl < 1 || nl > TJ_MAX_LAYERS)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: %lld layers (need 1 to %d)", (long long)nl, TJ_MAX_LAYERS);
    if (opt->g < 1 || opt->g > TJ_MAX_DIM)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: g %lld is not in [1, %lld]", (long long)opt->g,
                       (long long)TJ_MAX_DIM);
    if (opt->mode != TJ_PRUNE_TW1 && opt->mode != TJ_PRUNE_TW2 && opt->mode != TJ_PRUNE_TEW)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: unknown mode %d", (int)opt->mode);
    if (opt->mode == TJ_PRUNE_TEW && (opt->tew_base != TJ_PRUNE_TW1 && opt->tew_base != TJ_PRUNE_TW2))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: tew's tile-wise part must be tw1 or tw2");
    if (opt->mode == TJ_PRUNE_TEW && !(opt->ew_fraction > 0 && opt->ew_fraction < 1))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: ew fraction %g is outside (0, 1)", opt->ew_fraction);
    for (int64_t l = 0; l < nl; l++) {
        out_w[l] = out_b[l] = NULL;
        TJ_TRY(check_layer(&layers[l], err));
    }
    tj_pool *pool = NULL;
    TJ_TRY(make_pool(&co, &pool, err));
    tj_status s = TJ_OK;
    tj_pattern *p = calloc(1, sizeof *p);
    if (!p || !(p->layers = calloc((size_t)nl, sizeof *p->layers))) {
        free(p);
        p = NULL;
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "prune: out of memory");
        goto fail;
    }
    for (int64_t l = 0; l < nl; l++) {
        const tj_prune_layer_in *L = layers[l].in;
        out_w[l] = malloc((size_t)(L->n * L->k) * sizeof **out_w);
        out_b[l] = calloc((size_t)L->n, sizeof **out_b);
        if (!out_w[l] || !out_b[l]) {
            s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory for its new weights", L->name);
            goto fail;
        }
        p->nlayers = l + 1;
        if ((s = prune_layer(&layers[l], opt, &co, pool, &p->layers[l], out_w[l], out_b[l], err)) != TJ_OK) goto fail;
        if (co.progress) co.progress(co.progress_user, L->name, l + 1, nl);
    }
    tj_pool_destroy(pool);
    *out = p;
    return TJ_OK;
fail:
    tj_pool_destroy(pool);
    tj_pattern_destroy(p);
    for (int64_t l = 0; l < nl; l++) {
        free(out_w[l]);
        free(out_b[l]);
        out_w[l] = out_b[l] = NULL;
    }
    return s;
}

tj_status tj_prune_calibrated_sweep(const tj_calib_layer *cl, int64_t g, const double *dens, int64_t nd,
                                    const tj_calib_options *copt, float *const *w, float *const *b, double *errors,
                                    tj_error *err)
{
    tj_calib_options co = copt ? *copt : tj_calib_options_default();
    TJ_TRY(check_layer(cl, err));
    const tj_prune_layer_in *L = cl->in;
    if (nd < 1) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "sweep: no densities");
    if (g < 1) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "sweep: g %lld < 1", (long long)g);
    for (int64_t j = 0; j < nd; j++)
        if (!(dens[j] >= 0 && dens[j] <= 1))
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "sweep: density %g is outside [0, 1]", dens[j]);
    if (g > L->n) g = L->n;
    int64_t ntiles = (L->n + g - 1) / g;
    int64_t *keep = malloc((size_t)nd * sizeof *keep), *rows = malloc((size_t)L->n * sizeof *rows);
    tile_job *jobs = calloc((size_t)ntiles, sizeof *jobs);
    double *terr = errors ? calloc((size_t)(ntiles * (nd + 1)), sizeof *terr) : NULL;
    tj_pool *pool = NULL;
    tj_status s = TJ_OK;
    lctx c;
    int have_c = 0;
    if (!keep || !rows || !jobs || (errors && !terr)) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "sweep: out of memory");
        goto done;
    }
    for (int64_t j = 0; j < nd; j++) keep[j] = keep_of(dens[j], L->k);
    for (int64_t i = 0; i < L->n; i++) rows[i] = i;
    if ((s = make_pool(&co, &pool, err)) != TJ_OK) goto done;
    if ((s = lctx_init(&c, cl, co.damp, 1, pool, err)) != TJ_OK) goto done;
    have_c = 1;
    for (int64_t t = 0; t < ntiles; t++) {
        int64_t j0 = t * g, j1 = j0 + g < L->n ? j0 + g : L->n;
        jobs[t] = (tile_job){&c, rows + j0, j1 - j0, nd, keep, w, b, NULL, terr ? terr + t * (nd + 1) : NULL,
                             TJ_OK, ""};
    }
    if ((s = run_tiles(pool, jobs, ntiles, err)) != TJ_OK || !errors) goto done;
    double total = 0;
    for (int64_t t = 0; t < ntiles; t++) total += terr[t * (nd + 1) + nd];
    for (int64_t j = 0; j < nd; j++) {
        double e = 0;
        for (int64_t t = 0; t < ntiles; t++) e += terr[t * (nd + 1) + j];
        errors[j] = total > 0 ? e / total : 0;
    }
done:
    if (have_c) lctx_free(&c);
    tj_pool_destroy(pool);
    free(keep);
    free(rows);
    free(jobs);
    free(terr);
    return s;
}
