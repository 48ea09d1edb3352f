/* runtime/: the one "check against the reference, then time" harness (tilejit/bench.h): the
 * error bound per compute dtype, the relative error, the reference on a loaded model's layer,
 * sampled-row checks, and the timing loop. Used by the tuner (autotune/measure.c), `tilejit
 * model`, the benchmark drivers (bench/) and the examples. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/rng.h"
#include "runtime/model.h"

double tj_check_bound(tj_dtype compute)
{
    switch (compute) {
    case TJ_F16: return 2e-3;
    case TJ_BF16: return 1e-2;
    default: return 1e-5;
    }
}

double tj_rel_error(const float *y, const float *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(y[i])) return INFINITY;
        double d = (double)y[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static tj_status layer_of(tj_model *m, int64_t layer)
{
    return m && layer >= 0 && layer < m->pattern->nlayers ? TJ_OK : TJ_ERR_INVALID_ARGUMENT;
}

tj_status tj_model_reference(tj_model *m, int64_t layer, const float *x, int64_t rows, float *y)
{
    TJ_TRY(layer_of(m, layer));
    if (!x || !y || rows < 0) return TJ_ERR_INVALID_ARGUMENT;
    tj_reference_linear(&m->pattern->layers[layer], &m->lw[layer], x, rows, y);
    return TJ_OK;
}

tj_status tj_model_dense_weights(tj_model *m, int64_t layer, float *w)
{
    TJ_TRY(layer_of(m, layer));
    if (!w) return TJ_ERR_INVALID_ARGUMENT;
    const tj_layer *l = &m->pattern->layers[layer];
    tj_convert_to_f32(m->lw[layer].w, m->lw[layer].wdt, l->n * l->k, w);
    return TJ_OK;
}

tj_status tj_model_dense_bias(tj_model *m, int64_t layer, float *bias)
{
    TJ_TRY(layer_of(m, layer));
    if (!bias) return TJ_ERR_INVALID_ARGUMENT;
    if (!m->lw[layer].bias) return TJ_ERR_NOT_FOUND;
    tj_convert_to_f32(m->lw[layer].bias, m->lw[layer].bdt, m->pattern->layers[layer].n, bias);
    return TJ_OK;
}

int64_t tj_check_rows(int64_t m, uint64_t seed, int64_t rows[64])
{
    if (m <= 64) {
        for (int64_t i = 0; i < m; i++) rows[i] = i;
        return m < 0 ? 0 : m;
    }
    tj_rng rng = {seed};
    int64_t n = 0;
    for (int64_t i = 0; i < 8; i++) rows[n++] = i;
    for (int64_t i = 0; i < 16; i++) rows[n++] = 8 + (int64_t)tj_rng_below(&rng, (uint64_t)(m - 16));
    for (int64_t i = m - 8; i < m; i++) rows[n++] = i;
    return n;
}

tj_status tj_model_check(tj_model *m, int64_t layer, const float *x, const float *y, int64_t rows_m, uint64_t seed,
                         double *rel_error)
{
    TJ_TRY(layer_of(m, layer));
    if (!x || !y || !rel_error || rows_m < 1) return TJ_ERR_INVALID_ARGUMENT;
    const tj_layer *l = &m->pattern->layers[layer];
    int64_t rows[64];
    int64_t nr = tj_check_rows(rows_m, seed, rows);
    float *xs = malloc((size_t)(nr * l->k) * sizeof *xs);
    float *ys = malloc((size_t)(nr * l->n) * sizeof *ys);
    float *yref = malloc((size_t)(nr * l->n) * sizeof *yref);
    tj_status s = TJ_OK;
    if (!xs || !ys || !yref) {
        s = TJ_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (int64_t i = 0; i < nr; i++) {
        memcpy(xs + i * l->k, x + rows[i] * l->k, (size_t)l->k * sizeof *x);
        memcpy(ys + i * l->n, y + rows[i] * l->n, (size_t)l->n * sizeof *y);
    }
    tj_reference_linear(l, &m->lw[layer], xs, nr, yref);
    *rel_error = tj_rel_error(ys, yref, nr * l->n);
done:
    free(xs);
    free(ys);
    free(yref);
    return s;
}

tj_time_options tj_time_options_default(void)
{
    tj_time_options o = {.size = sizeof o, .warmup_s = 0.05, .min_time_s = 0.2, .min_reps = 5, .max_reps = 10000,
                         .batch = 1};
    return o;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

tj_status tj_time_calls(tj_timed_fn fn, void *user, const tj_time_options *opt, tj_timing *out, double *times,
                        int max_times, int *ntimes)
{
    tj_time_options o = tj_time_options_default();
    if (!fn || !out || (opt && !tj_options_in(&o, sizeof o, opt)) || o.max_reps < 1) return TJ_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (ntimes) *ntimes = 0;
    /* warm-up: at least two calls (the first may pay page faults and lazy setup); the fastest
     * one sizes the batch when it is automatic */
    double est = INFINITY, w0 = tj_now();
    for (int calls = 0; calls < 2 || tj_now() - w0 < o.warmup_s; calls++) {
        double a = tj_now();
        if (fn(user)) return TJ_ERR_INTERNAL;
        est = fmin(est, tj_now() - a);
    }
    int64_t batch = o.batch;
    if (batch <= 0) {
        batch = est > 0 ? (int64_t)ceil(o.min_time_s / 10 / est) : 1000;
        if (batch < 1) batch = 1;
        if (batch > 1000000) batch = 1000000;
    }
    double *samples = malloc((size_t)o.max_reps * sizeof *samples);
    if (!samples) return TJ_ERR_OUT_OF_MEMORY;
    int64_t n = 0;
    double total = 0;
    while (n < o.max_reps && (n < o.min_reps || total < o.min_time_s)) {
        double a = tj_now();
        for (int64_t i = 0; i < batch; i++)
            if (fn(user)) {
                free(samples);
                return TJ_ERR_INTERNAL;
            }
        double dt = tj_now() - a;
        total += dt;
        samples[n++] = dt / (double)batch;
    }
    if (times && max_times > 0) { /* the last max_times samples, in order */
        int keep = n < max_times ? (int)n : max_times;
        memcpy(times, samples + n - keep, (size_t)keep * sizeof *times);
        if (ntimes) *ntimes = keep;
    }
    qsort(samples, (size_t)n, sizeof *samples, cmp_double);
    out->median_s = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
    out->samples = n;
    out->calls = n * batch;
    out->batch = batch;
    free(samples);
    return TJ_OK;
}
