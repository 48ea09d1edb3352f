/* The calibrated pruner's drivers (tilejit/prune.h): tj_prune_calibrated_run behind `tilejit
 * prune --calibration ...` (the statistics per selected layer from a file, the allocation —
 * uniform, global or measured — then the pattern and rebuilt weights, or the sweep file), and
 * tj_prune_calibrated_layers / tj_prune_calibrated_sweep_layer, the same pruner and sweep on
 * arrays a caller holds in memory (python -m tilejit.calibrate). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "prune/calib.h"
#include "tilejit/io.h"
#include "tilejit/pattern.h"

tj_prune_calibrated_options tj_prune_calibrated_options_default(void)
{
    tj_calib_options co = tj_calib_options_default();
    tj_prune_calibrated_options o = {0};
    o.size = sizeof o;
    o.prune = tj_prune_options_default();
    o.allocation = TJ_PRUNE_ALLOC_UNIFORM;
    o.damp = co.damp;
    o.threads = co.threads;
    o.sweep_steps = 16;
    return o;
}

/* Writes every selected layer's tw1 rebuild at densities j/steps (j = 0 .. steps−1): tensors
 * "d<j>/NAME.weight" and "d<j>/NAME.bias" (F32) for the j in `which` (all when NULL), the
 * relative output error at every j as "NAME.error" (F64 [steps]), and "densities" (F64 [steps]). */
static tj_status write_sweep(const tj_calib_layer *cl, int64_t nl, int64_t g, int64_t steps, const unsigned char *which,
                             const tj_calib_options *co, const char *path, const tj_prune_calibrated_options *o,
                             tj_error *err)
{
    tj_status s = TJ_OK;
    int64_t nt = 1 + 3 * steps * nl;
    double *errs = calloc((size_t)(steps * nl), sizeof *errs);
    tj_st_out_tensor *outs = calloc((size_t)nt, sizeof *outs);
    char **names = calloc((size_t)nt, sizeof *names);
    int64_t *shapes = calloc((size_t)(3 * nl), sizeof *shapes);
    float **w = calloc((size_t)(steps * nl), sizeof *w), **b = calloc((size_t)(steps * nl), sizeof *b);
    double *dens = malloc((size_t)steps * sizeof *dens);
    if (!outs || !names || !shapes || !w || !b || !dens || !errs) goto oom;
    for (int64_t j = 0; j < steps; j++) dens[j] = (double)j / (double)steps;
    outs[0] = (tj_st_out_tensor){"densities", "F64", 1, &steps, dens, (uint64_t)steps * 8};
    int64_t no = 1;
    for (int64_t l = 0; l < nl; l++) {
        const tj_prune_layer_in *L = cl[l].in;
        shapes[3 * l] = L->n;
        shapes[3 * l + 1] = L->k;
        shapes[3 * l + 2] = steps;
        for (int64_t j = 0; j < steps; j++) {
            if (which && !which[j]) continue;
            w[l * steps + j] = malloc((size_t)(L->n * L->k) * sizeof(float));
            b[l * steps + j] = malloc((size_t)L->n * sizeof(float));
            if (!w[l * steps + j] || !b[l * steps + j]) goto oom;
            if (asprintf(&names[no], "d%lld/%s.weight", (long long)j, L->name) < 0) names[no] = NULL;
            if (asprintf(&names[no + 1], "d%lld/%s.bias", (long long)j, L->name) < 0) names[no + 1] = NULL;
            if (!names[no] || !names[no + 1]) goto oom;
            outs[no] = (tj_st_out_tensor){names[no], "F32", 2, &shapes[3 * l], w[l * steps + j], (uint64_t)(L->n * L->k) * 4};
            outs[no + 1] = (tj_st_out_tensor){names[no + 1], "F32", 1, &shapes[3 * l], b[l * steps + j], (uint64_t)L->n * 4};
            no += 2;
        }
        if (asprintf(&names[no], "%s.error", L->name) < 0) {
            names[no] = NULL;
            goto oom;
        }
        outs[no] = (tj_st_out_tensor){names[no], "F64", 1, &shapes[3 * l + 2], errs + l * steps, (uint64_t)steps * 8};
        no++;
        if ((s = tj_prune_calibrated_sweep(&cl[l], g, dens, steps, co, w + l * steps, b + l * steps, errs + l * steps,
                                           err)) != TJ_OK)
            goto done;
        if (o->progress) o->progress(o->progress_user, L->name, l + 1, nl);
    }
    s = tj_st_write(path, outs, no, "{\"format\":\"tilejit-prune-sweep\",\"version\":\"1\"}", err);
    goto done;
oom:
    s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "--sweep-out: out of memory");
done:
    for (int64_t i = 0; names && i < nt; i++) free(names[i]);
    for (int64_t i = 0; w && b && i < steps * nl; i++) free(w[i]), free(b[i]);
    free(outs), free(names), free(shapes), free(w), free(b), free(dens), free(errs);
    return s;
}

tj_status tj_prune_calibrated_run(const tj_st_file *wf, const tj_prune_layer_in *in, int64_t nl,
                                  const tj_prune_calibrated_options *o, tj_pattern **pattern,
                                  tj_prune_calibrated_result *res, tj_error *err)
{
    if (pattern) *pattern = NULL;
    if (res) {
        res->prune_s = res->write_s = 0;
        res->latency_ms = -1;
    }
    if (!wf || (!in && nl) || nl < 0 || !o || o->size < sizeof *o || !o->calibration)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tj_prune_calibrated_run: bad arguments");
    if (!o->sweep_out && !o->pattern_out)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tj_prune_calibrated_run: no pattern_out");
    const tj_prune_options opt = o->prune;
    const char *weights = wf->path ? wf->path : "weights";
    int64_t steps = o->sweep_steps;
    tj_calib_options co = tj_calib_options_default();
    co.damp = o->damp;
    co.threads = o->threads;
    tj_status s = TJ_OK;
    tj_st_file *cf = NULL;
    tj_calib_layer *cl = NULL;
    tj_pattern *p = NULL, *gp = NULL;
    tj_prune_profile *prof = NULL;
    float **nw = NULL, **nb = NULL;
    double *pd = NULL;
    int64_t *choice = NULL;
    int64_t **tile_keep = NULL;
    unsigned char *which = NULL;
    if ((s = tj_st_open(o->calibration, &cf, err)) != TJ_OK) {
        tj_error_prefix(err, "--calibration");
        goto done;
    }
    cl = calloc((size_t)nl, sizeof *cl);
    nw = calloc((size_t)nl, sizeof *nw);
    nb = calloc((size_t)nl, sizeof *nb);
    tile_keep = calloc((size_t)nl, sizeof *tile_keep);
    if (!cl || !nw || !nb || !tile_keep) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    for (int64_t l = 0; l < nl; l++) {
        cl[l].in = &in[l];
        cl[l].density = 1.0 - opt.sparsity;
        if ((s = tj_calib_stats_find(cf, &in[l], &cl[l].stats, err)) != TJ_OK) goto done;
        const tj_st_tensor *bt;
        if ((s = tj_prune_find_bias(wf, in[l].name, in[l].n, &bt, err)) != TJ_OK) goto done;
        if (bt) {
            cl[l].bias = bt->data;
            cl[l].bdt = bt->dtype;
        }
    }
    if (o->sweep_out) {
        if (o->sweep_weights) {
            if (!(which = calloc((size_t)steps, 1))) {
                s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
                goto done;
            }
            for (const char *q = o->sweep_weights; *q;) {
                char *end;
                long long j = strtoll(q, &end, 10);
                if (end == q || j < 0 || j >= steps || (*end && *end != ',')) {
                    s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "--sweep-weights: '%s' is not a list of j in [0, %lld)",
                                o->sweep_weights, (long long)steps);
                    goto done;
                }
                which[j] = 1;
                q = *end ? end + 1 : end;
            }
        }
        s = write_sweep(cl, nl, opt.g, steps, which, &co, o->sweep_out, o, err);
        goto done;
    }
    if (o->allocation == TJ_PRUNE_ALLOC_GLOBAL) {
        /* the plain pruner's global threshold decides how much each layer (tile) keeps */
        tj_prune_options go = opt;
        if ((s = tj_prune_layers(in, nl, &go, &gp, err)) != TJ_OK) goto done;
        for (int64_t l = 0; l < nl; l++) {
            const tj_layer *L = &gp->layers[l];
            cl[l].density = (double)tj_layer_kept(L) / ((double)L->n * (double)L->k);
            if (opt.mode == TJ_PRUNE_TW1) {
                if (!(tile_keep[l] = malloc((size_t)(L->ntiles ? L->ntiles : 1) * sizeof **tile_keep))) {
                    s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
                    goto done;
                }
                for (int64_t t = 0; t < L->ntiles; t++) tile_keep[l][t] = tj_tile_nrows(L, t);
                cl[l].tile_keep = tile_keep[l];
            }
        }
    } else if (o->allocation == TJ_PRUNE_ALLOC_MEASURED) {
        const char *profile_s = o->profile;
        if ((s = tj_prune_profile_load(profile_s, &prof, err)) != TJ_OK) goto done;
        pd = malloc((size_t)prof->nl * sizeof *pd);
        choice = malloc((size_t)prof->nl * sizeof *choice);
        if (!pd || !choice) {
            s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        if ((s = tj_prune_allocate(prof, opt.sparsity, o->budget_ms, pd, choice, err)) != TJ_OK) goto done;
        for (int64_t l = 0; l < nl; l++) {
            int64_t j = 0;
            while (j < prof->nl && strcmp(prof->names[j], in[l].name) != 0) j++;
            if (j == prof->nl) {
                s = tj_fail(err, TJ_ERR_NOT_FOUND, "%s: no entry for layer '%s' (a loss table for another model?)",
                            profile_s, in[l].name);
                goto done;
            }
            if (prof->n[j] != in[l].n || prof->k[j] != in[l].k) {
                s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: layer '%s' is %lld × %lld there but %lld × %lld in %s",
                            profile_s, in[l].name, (long long)prof->n[j], (long long)prof->k[j], (long long)in[l].n,
                            (long long)in[l].k, weights);
                goto done;
            }
            cl[l].density = pd[j];
            if (opt.mode == TJ_PRUNE_TEW && cl[l].density < opt.ew_fraction) cl[l].density = opt.ew_fraction;
        }
    }
    co.progress = o->progress;
    co.progress_user = o->progress_user;
    double t0 = tj_now();
    if ((s = tj_prune_calibrated(cl, nl, &opt, &co, &p, nw, nb, err)) != TJ_OK) goto done;
    double t1 = tj_now();
    if ((s = tj_pattern_save(p, o->pattern_out, err)) != TJ_OK) goto done;
    if (o->pruned_out &&
        (s = tj_prune_write_rebuilt(wf, p, (const float *const *)nw, (const float *const *)nb, o->pruned_out, err)) !=
            TJ_OK)
        goto done;
    double t2 = tj_now();
    if (res) {
        res->prune_s = t1 - t0;
        res->write_s = t2 - t1;
        if (o->budget_ms > 0 && prof && prof->time_ms) {
            double tsum = 0;
            for (int64_t j = 0; j < prof->nl; j++) tsum += prof->time_ms[j * prof->nd + choice[j]];
            res->latency_ms = tsum;
        }
    }
    if (pattern) {
        *pattern = p;
        p = NULL;
    }
done:
    for (int64_t l = 0; l < nl; l++) {
        if (nw) free(nw[l]);
        if (nb) free(nb[l]);
        if (tile_keep) free(tile_keep[l]);
    }
    free(nw), free(nb), free(tile_keep), free(cl), free(pd), free(choice), free(which);
    tj_prune_profile_destroy(prof);
    tj_pattern_destroy(p);
    tj_pattern_destroy(gp);
    tj_st_close(cf);
    return s;
}

/* ---- in memory: the same pruner and sweep for a driver that holds the model ---- */

/* The internal layer of one in-memory layer, its statistics checked as a file's would be. */
static tj_status calib_layer_of(const tj_prune_calibrated_layer *in, const char *where, tj_calib_layer *out,
                                tj_error *err)
{
    const tj_prune_layer_in *L = &in->layer;
    memset(out, 0, sizeof *out);
    if (!L->name || !L->w || L->n < 1 || L->k < 1 || L->n > TJ_MAX_DIM || L->k > TJ_MAX_DIM || !in->hessian)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: a layer without name, weights, statistics or a valid shape",
                       where);
    TJ_TRY(tj_calib_stats_check(where, L, in->hessian, in->cross, in->residual, in->tokens, err));
    out->in = L;
    out->bias = in->bias;
    out->bdt = in->bdt;
    out->stats = (tj_calib_stats){in->hessian, L->k + 1, in->tokens, in->cross, in->residual};
    out->density = in->density;
    return TJ_OK;
}

static tj_calib_options calib_options_of(const tj_prune_calibrated_options *o)
{
    tj_calib_options co = tj_calib_options_default();
    co.damp = o->damp;
    co.threads = o->threads;
    co.progress = o->progress;
    co.progress_user = o->progress_user;
    return co;
}

tj_status tj_prune_calibrated_layers(const tj_prune_calibrated_layer *in, int64_t nl,
                                     const tj_prune_calibrated_options *o, tj_pattern **pattern, float *const *w,
                                     float *const *b, tj_error *err)
{
    static const char where[] = "tj_prune_calibrated_layers";
    if (pattern) *pattern = NULL;
    if (!in || nl < 1 || !o || o->size < sizeof *o || !pattern || !w || !b)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: bad arguments", where);
    tj_calib_options co = calib_options_of(o);
    tj_calib_layer *cl = calloc((size_t)nl, sizeof *cl);
    float **nw = calloc((size_t)nl, sizeof *nw), **nb = calloc((size_t)nl, sizeof *nb);
    tj_pattern *p = NULL;
    tj_status s = TJ_OK;
    if (!cl || !nw || !nb) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", where);
        goto done;
    }
    for (int64_t l = 0; l < nl; l++) {
        if (!w[l] || !b[l]) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: no output buffers for layer %lld", where, (long long)l);
            goto done;
        }
        if ((s = calib_layer_of(&in[l], where, &cl[l], err)) != TJ_OK) goto done;
    }
    if ((s = tj_prune_calibrated(cl, nl, &o->prune, &co, &p, nw, nb, err)) != TJ_OK) goto done;
    for (int64_t l = 0; l < nl; l++) {
        memcpy(w[l], nw[l], (size_t)(in[l].layer.n * in[l].layer.k) * sizeof **w);
        memcpy(b[l], nb[l], (size_t)in[l].layer.n * sizeof **b);
    }
    *pattern = p;
    p = NULL;
done:
    for (int64_t l = 0; nw && nb && l < nl; l++) free(nw[l]), free(nb[l]);
    free(nw), free(nb), free(cl);
    tj_pattern_destroy(p);
    return s;
}

tj_status tj_prune_calibrated_sweep_layer(const tj_prune_calibrated_layer *in, const double *densities, int64_t nd,
                                          const tj_prune_calibrated_options *o, float *const *w, float *const *b,
                                          double *errors, tj_error *err)
{
    static const char where[] = "tj_prune_calibrated_sweep_layer";
    if (!in || !densities || nd < 1 || !o || o->size < sizeof *o || !w || !b)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: bad arguments", where);
    for (int64_t j = 0; j < nd; j++)
        if (w[j] && !b[j]) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: weights without a bias buffer", where);
    tj_calib_layer cl;
    TJ_TRY(calib_layer_of(in, where, &cl, err));
    cl.density = 1; /* unused by the sweep, but checked */
    tj_calib_options co = calib_options_of(o);
    co.progress = NULL;
    return tj_prune_calibrated_sweep(&cl, o->prune.g, densities, nd, &co, w, b, errors, err);
}
