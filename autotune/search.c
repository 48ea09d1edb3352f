/* The sweep: workloads (layer × M) in pattern order, configs in space order; exhaustive where the
 * space is small, else an adaptive search (model-ordered seeds, then hill-climbing over configs
 * that differ in one knob) that measures at most a fixed fraction of the space. Every
 * measurement is appended to the log at once, and a rerun resumes from it.
 *
 * Sharding (--shard I/N) is round-robin over a canonical order, so it needs no coordination:
 * exhaustive sweeps split the (workload, config) items; adaptive sweeps split whole workloads
 * (the search for one workload is sequential). Either way each workload's decisions depend only
 * on its own measurements, so merged shard logs choose what one unsharded run would. Each shard's
 * log begins with a header naming its I/N, written even when its share is empty
 * (docs/tuning-slurm.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autotune/autotune.h"
#include "runtime/model.h"
#include "tj_config.h"
#if TJ_HAVE_CUDA
#include "runtime/backend_cuda.h"
#endif

tj_tune_opts tj_tune_opts_default(void)
{
    tj_tune_opts o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.backend = "cpu";
    o.nshards = 1;
    o.timeout_s = 60;
    o.max_fraction = 0.3;
    o.confirm_top = 3;
    o.confirm_rounds = 3;
    o.mo = tj_tune_measure_defaults();
    return o;
}

typedef struct sweep {
    const tj_tune_opts *o;
    tj_tune_db *db;
    tj_tune_target target;
    tj_tune_summary *sum;
    tj_tune_progress pr;
    double t0;
    int64_t new_done;        /* new measurements, for the ETA */
    double new_seconds;
    int stop;                /* budget reached */
} sweep;

/* The best of a workload so far, for progress lines. Its candidates are the space's configs,
 * indices 0 .. sp->count - 1, and on the CPU the dense path (index sp->count, config
 * TJ_TUNE_DENSE_CONFIG: the runtime takes it where it beats the best kernel, docs/dense-path.md). */
typedef struct wl_state {
    const tj_tune_space *sp;
    int dense;               /* 1: the dense path is a candidate (index sp->count) */
    tj_tune_workload wl;
    const tj_layer *l;
    double best;
    int64_t best_i;
    int64_t looked;          /* configs of this workload measured or found in the log */
} wl_state;

static const char *cfg_of(const wl_state *ws, int64_t i)
{
    return i == ws->sp->count ? TJ_TUNE_DENSE_CONFIG : ws->sp->json[i];
}

/* Candidates of a workload: the space, plus the dense path where it is one. */
static int64_t candidates(const wl_state *ws) { return ws->sp->count + ws->dense; }

static void report(sweep *sw, const wl_state *ws, int64_t i, tj_tune_status st, double med, int resumed)
{
    sw->pr.done++;
    if (resumed) sw->pr.skipped++;
    sw->pr.layer = ws->wl.layer;
    sw->pr.m = ws->wl.m;
    sw->pr.config = cfg_of(ws, i);
    sw->pr.status = st;
    sw->pr.resumed = resumed;
    sw->pr.median = med;
    sw->pr.best_config = ws->best_i >= 0 ? cfg_of(ws, ws->best_i) : NULL;
    sw->pr.best_median = ws->best;
    sw->pr.elapsed_s = tj_now() - sw->t0;
    int64_t left = sw->pr.total - sw->pr.done;
    sw->pr.eta_s = sw->new_done > 0 ? left * (sw->new_seconds / (double)sw->new_done) : -1;
    if (sw->o->progress) sw->o->progress(sw->o->progress_user, &sw->pr);
}

/* Measures config i of the workload (or takes it from the log); *cost gets its first median or
 * INFINITY. Round r > 0 is a confirmation: a further measurement (fresh data, seed + r) unless
 * the log already holds r + 1 records of the config. Returns TJ_OK also for failed configs;
 * sw->stop when the budget is spent. */
static tj_status measure(sweep *sw, wl_state *ws, int64_t i, int round, double *cost, tj_error *err)
{
    const char *cfg = cfg_of(ws, i);
    tj_tune_status st = TJ_TUNE_OK, now_st = TJ_TUNE_OK;
    double med = INFINITY, now_med = INFINITY;
    int resumed = round == 0 ? tj_tune_db_find(sw->db, &sw->target, &ws->wl, cfg, &st, &med)
                             : tj_tune_db_records(sw->db, &sw->target, &ws->wl, cfg) >= 1 + round;
    if (resumed) {
        sw->sum->resumed++;
    } else {
        if (sw->o->budget_s > 0 && tj_now() - sw->t0 >= sw->o->budget_s) {
            sw->stop = 1;
            sw->sum->budget_hit = 1;
            *cost = INFINITY;
            return TJ_OK;
        }
        tj_tune_record r;
        memset(&r, 0, sizeof r);
        r.target = sw->target;
        r.wl = ws->wl;
        if (!(r.config = strdup(cfg))) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        double a = tj_now();
        tj_status s = TJ_OK;
        if (sw->o->dry_run) {
            r.status = TJ_TUNE_OK;
            r.median = 1;
        } else {
            tj_tune_child c = {sw->o->exe, sw->o->pattern_path, sw->o->weights_path, ws->l->name, sw->o->backend,
                               ws->wl.m, cfg, sw->o->timeout_s, sw->o->mo};
            c.mo.seed += (uint64_t)round;
            s = tj_tune_measure_child(&c, &r, err);
            if (s == TJ_OK) s = tj_tune_log_append(sw->o->log_path, &r, err);
        }
        /* What the log now says is what a resumed run will read: go through the text, so
         * decisions never depend on digits the file does not keep. */
        char *line = NULL;
        if (s == TJ_OK) s = tj_tune_record_to_json(&r, &line, err);
        tj_tune_record back;
        if (s == TJ_OK) s = tj_tune_record_parse(line, "record", &back, err);
        if (s == TJ_OK) {
            s = tj_tune_db_add(sw->db, &back, err);
            tj_tune_record_free(&back);
        }
        free(line);
        now_st = r.status;
        now_med = r.median;
        tj_tune_record_free(&r);
        TJ_TRY(s);
        sw->sum->measured++;
        if (now_st != TJ_TUNE_OK) sw->sum->failed++;
        sw->new_done++;
        sw->new_seconds += tj_now() - a;
    }
    tj_tune_db_find(sw->db, &sw->target, &ws->wl, cfg, &st, &med);
    *cost = st == TJ_TUNE_OK ? med : INFINITY;
    if (round > 0) { /* a confirmation reports its own measurement */
        report(sw, ws, i, resumed ? st : now_st, resumed ? *cost : now_med, resumed);
        return TJ_OK;
    }
    ws->looked++;
    if (*cost < ws->best || (*cost == ws->best && isfinite(*cost) && ws->best_i >= 0 &&
                             strcmp(cfg, cfg_of(ws, ws->best_i)) < 0)) {
        ws->best = *cost;
        ws->best_i = i;
    }
    report(sw, ws, i, st, *cost, resumed);
    return TJ_OK;
}

static int64_t adaptive_budget(const tj_tune_opts *o, int64_t count)
{
    int64_t b = (int64_t)floor(o->max_fraction * (double)count);
    return b < 1 ? 1 : b > count ? count : b;
}

static int use_exhaustive(const tj_tune_opts *o, const tj_tune_space *sp)
{
    return o->strategy == TJ_TUNE_EXHAUSTIVE || (o->strategy == TJ_TUNE_AUTO && sp->count <= 32) || !sp->points;
}

typedef struct ranked { double key; const char *cfg; int64_t i; } ranked;

static int ranked_cmp(const void *pa, const void *pb)
{
    const ranked *a = pa, *b = pb;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    int c = strcmp(a->cfg, b->cfg);
    return c ? c : (a->i < b->i ? -1 : a->i > b->i);
}

/* Adaptive search for one workload. Deterministic given the measured costs. */
static tj_status adaptive(sweep *sw, wl_state *ws, const tj_tune_host *h, tj_error *err)
{
    const tj_tune_space *sp = ws->sp;
    int64_t n = sp->count, budget = adaptive_budget(sw->o, n), done = 0;
    ranked *order = malloc((size_t)n * sizeof *order);
    ranked *meas = malloc((size_t)n * sizeof *meas);
    double *cost = malloc((size_t)n * sizeof *cost);
    char *seen = calloc((size_t)n, 1);
    int64_t *nb = malloc((size_t)n * sizeof *nb);
    double dense_cost = INFINITY;
    tj_status s = TJ_OK;
    if (!order || !meas || !cost || !seen || !nb) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    int threads = sw->o->mo.threads;
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (int)c : 1;
    }
    for (int64_t i = 0; i < n; i++) {
        order[i] = (ranked){tj_tune_model_cost(sp, h, i, &ws->wl, threads), sp->json[i], i};
        cost[i] = INFINITY;
    }
    qsort(order, (size_t)n, sizeof *order, ranked_cmp);
#define MEASURE(idx)                                                          \
    do {                                                                      \
        int64_t i_ = (idx);                                                   \
        seen[i_] = 1;                                                         \
        if ((s = measure(sw, ws, i_, 0, &cost[i_], err)) != TJ_OK) goto done; \
        if (sw->stop) goto done;                                              \
        done++;                                                               \
    } while (0)
    /* 1. seeds: the built-in default, then the model's favourites (a third of the budget); the
     *    dense path, outside the space and the budget, right after the default */
    if (sp->default_index >= 0 && done < budget) MEASURE(sp->default_index);
    if (ws->dense) {
        if ((s = measure(sw, ws, sp->count, 0, &dense_cost, err)) != TJ_OK || sw->stop) goto done;
    }
    int64_t seeds = (budget + 2) / 3, next = 0;
    for (; next < n && done < seeds; next++)
        if (!seen[order[next].i]) MEASURE(order[next].i);
    /* 2. hill-climb: the unmeasured neighbours (one knob changed) of the best measured config,
     *    in model order; when the best configs' neighbourhoods are exhausted, the next seed */
    while (done < budget) {
        int64_t nm = 0;
        for (int64_t i = 0; i < n; i++)
            if (seen[i]) meas[nm++] = (ranked){cost[i], sp->json[i], i};
        qsort(meas, (size_t)nm, sizeof *meas, ranked_cmp);
        int64_t pick = -1;
        for (int64_t r = 0; r < nm && pick < 0 && isfinite(meas[r].key); r++) {
            int64_t k = tj_tune_space_neighbours(sp, meas[r].i, nb, n);
            double pm = INFINITY;
            for (int64_t j = 0; j < k; j++) {
                double mc = tj_tune_model_cost(sp, h, nb[j], &ws->wl, threads);
                if (!seen[nb[j]] && (pick < 0 || mc < pm)) {
                    pick = nb[j];
                    pm = mc;
                }
            }
        }
        while (pick < 0 && next < n) {
            if (!seen[order[next].i]) pick = order[next].i;
            next++;
        }
        if (pick < 0) break;
        MEASURE(pick);
    }
#undef MEASURE
done:
    free(order);
    free(meas);
    free(cost);
    free(seen);
    free(nb);
    return s;
}

/* Confirmation: the top configs of a workload's search (by their first measurement) measured
 * again in interleaved rounds, so the final choice among near-equal configs compares
 * measurements taken close together in time, not one lucky run (the db's cost of a config is the
 * median of its records). */
static tj_status confirm(sweep *sw, wl_state *ws, tj_error *err)
{
    int top = sw->o->confirm_top;
    if (sw->o->confirm_rounds <= 0 || top < 2) return TJ_OK;
    ranked *r = malloc((size_t)(candidates(ws) + 1) * sizeof *r);
    if (!r) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    int64_t n = 0;
    for (int64_t i = 0; i < candidates(ws); i++) {
        tj_tune_status st;
        double med;
        if (tj_tune_db_find(sw->db, &sw->target, &ws->wl, cfg_of(ws, i), &st, &med) && st == TJ_TUNE_OK && isfinite(med))
            r[n++] = (ranked){med, cfg_of(ws, i), i};
    }
    qsort(r, (size_t)n, sizeof *r, ranked_cmp);
    if (n < top) top = (int)n;
    tj_status s = TJ_OK;
    for (int round = 1; top >= 2 && round <= sw->o->confirm_rounds && s == TJ_OK && !sw->stop; round++)
        for (int j = 0; j < top && s == TJ_OK && !sw->stop; j++) {
            double c;
            s = measure(sw, ws, r[j].i, round, &c, err);
        }
    /* the workload's choice is now the db's: lowest median over records, ties by text */
    for (int64_t j = 0; j < n && s == TJ_OK; j++) {
        double c = tj_tune_db_cost(sw->db, &sw->target, &ws->wl, r[j].cfg);
        if (j == 0 || c < ws->best || (c == ws->best && strcmp(r[j].cfg, cfg_of(ws, ws->best_i)) < 0)) {
            ws->best = c;
            ws->best_i = r[j].i;
        }
    }
    free(r);
    return s;
}

static int confirms(const tj_tune_opts *o, const tj_tune_space *sp, int exhaustive)
{
    /* exhaustive shards each hold a slice of the configs: confirm in a final unsharded pass */
    return o->confirm_rounds > 0 && o->confirm_top >= 2 && sp->count >= 2 && (!exhaustive || o->nshards == 1);
}

tj_status tj_tune_run(const tj_tune_opts *o, tj_tune_summary *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    tj_tune_opts known = tj_tune_opts_default(); /* fields the caller's size covers, over defaults */
    if (!o || !tj_options_in(&known, sizeof known, o))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tune: start the options from tj_tune_opts_default()");
    o = &known;
    if (!o->pattern_path || !o->weights_path || !o->log_path || !o->nms)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tune: pattern, weights, log and M values are required");
    if (o->nshards < 1 || o->shard < 0 || o->shard >= o->nshards)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tune: shard %d/%d is out of range", o->shard, o->nshards);
    sweep sw;
    memset(&sw, 0, sizeof sw);
    sw.o = o;
    sw.sum = out;
    sw.t0 = tj_now();
    tj_pattern *pat = NULL;
    tj_tune_space *spaces = NULL;
    wl_state *ws = NULL;
    int64_t nws = 0;
    tj_status s = tj_pattern_load(o->pattern_path, &pat, err);
    if (s != TJ_OK) return s;
    if ((s = tj_tune_db_create(&sw.db, err)) != TJ_OK) goto done;
    if (!o->dry_run && (s = tj_tune_db_load(sw.db, o->log_path, 1, err)) != TJ_OK) goto done;
    tj_tune_host_target(&sw.target);
    snprintf(sw.target.backend, sizeof sw.target.backend, "%s", o->backend);
    if (strcmp(o->backend, "cuda") == 0) {
        /* The GPU's name and sm_XX, as backend_cuda.c asks with; without a usable GPU (or in a
         * build without CUDA) the arch given stands for both. */
        snprintf(sw.target.device, sizeof sw.target.device, "%s", o->arch ? o->arch : "sm_90");
        snprintf(sw.target.arch, sizeof sw.target.arch, "%s", o->arch ? o->arch : "sm_90");
        snprintf(sw.target.compiler, sizeof sw.target.compiler, "NVRTC");
#if TJ_HAVE_CUDA
        tj_cuda_device *d = NULL;
        tj_error derr;
        if (!o->dry_run && tj_cuda_device_open(0, &d, &derr) == TJ_OK) {
            snprintf(sw.target.device, sizeof sw.target.device, "%.127s", d->name);
            snprintf(sw.target.arch, sizeof sw.target.arch, "sm_%d", d->sm);
            char desc[256];
            tj_cuda_device_describe(d, desc, sizeof desc);
            const char *drv = strstr(desc, "driver ");
            snprintf(sw.target.driver, sizeof sw.target.driver, "%.63s", drv ? drv + 7 : "");
            tj_cuda_device_close(d);
        }
#endif
    }
    const char *space_arch = strcmp(o->backend, "cuda") == 0 ? sw.target.arch : o->arch;

    /* workloads: layers in pattern order (one per distinct pattern hash) × M in option order */
    ws = calloc((size_t)(pat->nlayers * o->nms + 1), sizeof *ws);
    spaces = calloc((size_t)(pat->nlayers + 1), sizeof *spaces);
    tj_tune_host *hosts = calloc((size_t)(pat->nlayers + 1), sizeof *hosts);
    if (!ws || !spaces || !hosts) {
        free(hosts);
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    int64_t nspaces = 0;
    for (int64_t li = 0; li < pat->nlayers; li++) {
        const tj_layer *l = &pat->layers[li];
        if (o->layer_filter && strcmp(o->layer_filter, l->name) != 0) continue;
        int dup = 0;
        for (int64_t j = 0; j < li && !dup; j++) dup = pat->layers[j].hash == l->hash;
        if (dup) continue;
        tj_tune_host_for(o->backend, space_arch, l, &hosts[nspaces]);
        for (int mi = 0; mi < o->nms; mi++)
            if (hosts[nspaces].min_m == 0 || o->ms[mi] < hosts[nspaces].min_m) hosts[nspaces].min_m = o->ms[mi];
        hosts[nspaces].act_bf16 = o->act_bf16 && o->size >= sizeof *o;
        s = o->configs_json ? tj_tune_space_from_list(o->backend, o->configs_json, &spaces[nspaces], err)
                            : tj_tune_space_build(o->backend, &hosts[nspaces], &spaces[nspaces], err);
        if (s != TJ_OK) {
            free(hosts);
            goto done;
        }
        for (int mi = 0; mi < o->nms; mi++) {
            wl_state *w = &ws[nws++];
            w->sp = &spaces[nspaces];
            w->l = l;
            tj_tune_workload_of(l, o->ms[mi], &w->wl);
            w->best = INFINITY;
            w->best_i = -1;
            /* the dense path is the CPU's (a --configs list says exactly what to measure) */
            w->dense = strcmp(o->backend, "cpu") == 0 && !o->configs_json;
        }
        nspaces++;
    }
    if (o->layer_filter && nws == 0) {
        free(hosts);
        s = tj_fail(err, TJ_ERR_NOT_FOUND, "%s: no layer named '%s'", o->pattern_path, o->layer_filter);
        goto done;
    }
    /* every sweep leaves a log, even a shard whose share is empty: its header says which shard */
    if (!o->dry_run && (s = tj_tune_log_begin(o->log_path, o->backend, o->shard, o->nshards, err)) != TJ_OK) {
        free(hosts);
        goto done;
    }
    /* this shard's total, for progress */
    int64_t item = 0;
    for (int64_t w = 0; w < nws; w++) {
        const tj_tune_space *sp = ws[w].sp;
        int64_t nc = candidates(&ws[w]);
        int64_t top = o->confirm_top < nc ? o->confirm_top : nc;
        if (use_exhaustive(o, sp)) {
            for (int64_t i = 0; i < nc; i++, item++)
                if (tj_tune_shard_owns(item, o->shard, o->nshards)) sw.pr.total++;
            if (confirms(o, sp, 1)) sw.pr.total += top * o->confirm_rounds;
        } else if (tj_tune_shard_owns(w, o->shard, o->nshards)) {
            sw.pr.total += adaptive_budget(o, sp->count) + ws[w].dense;
            if (confirms(o, sp, 0)) sw.pr.total += top * o->confirm_rounds;
        }
        if (sp->count > out->space) out->space = sp->count;
    }
    item = 0;
    for (int64_t w = 0; w < nws && !sw.stop; w++) {
        wl_state *st = &ws[w];
        const tj_tune_host *h = &hosts[st->sp - spaces];
        int owned = 0;
        if (use_exhaustive(o, st->sp)) {
            for (int64_t i = 0; i < candidates(st) && !sw.stop; i++, item++) {
                if (!tj_tune_shard_owns(item, o->shard, o->nshards)) continue;
                owned = 1;
                double c;
                if ((s = measure(&sw, st, i, 0, &c, err)) != TJ_OK) break;
            }
            if (s == TJ_OK && !sw.stop && confirms(o, st->sp, 1)) s = confirm(&sw, st, err);
        } else if (tj_tune_shard_owns(w, o->shard, o->nshards)) {
            owned = 1;
            s = adaptive(&sw, st, h, err);
            if (s == TJ_OK && !sw.stop && confirms(o, st->sp, 0)) s = confirm(&sw, st, err);
        }
        if (s != TJ_OK) break;
        out->workloads += owned;
        if (owned && !sw.stop && o->workload_done)
            o->workload_done(o->progress_user, &st->wl, st->best_i >= 0 ? cfg_of(st, st->best_i) : NULL, st->best,
                             st->looked, candidates(st));
    }
    free(hosts);
done:
    out->seconds = tj_now() - sw.t0;
    for (int64_t i = 0; spaces && i < pat->nlayers; i++) tj_tune_space_free(&spaces[i]);
    free(spaces);
    free(ws);
    tj_tune_db_destroy(sw.db);
    tj_pattern_destroy(pat);
    return s;
}
