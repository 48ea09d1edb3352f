/* `tilejit prune` with calibration statistics or a per-layer allocation (--calibration,
 * --allocation, --profile, --budget-ms, --sweep-out): the calibrated path of the prune command.
 * cmd_prune.c hands over when one of these options is present; without them it prunes as before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "prune/calib.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const calib_options[] = {"calibration", "allocation", "profile", "budget-ms", "sweep-out", NULL};

int cli_prune_wants_calibrated(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0) continue;
        for (int j = 0; calib_options[j]; j++) {
            size_t len = strlen(calib_options[j]);
            if (strncmp(argv[i] + 2, calib_options[j], len) == 0 && (argv[i][2 + len] == 0 || argv[i][2 + len] == '='))
                return 1;
        }
    }
    return 0;
}

typedef struct progress_state {
    double t0;
    int quiet;
} progress_state;

static void progress(void *user, const char *layer, int64_t done, int64_t total)
{
    progress_state *p = user;
    if (p->quiet) return;
    fprintf(stderr, "\rprune: %lld/%lld layers, %.1f s: %-60s", (long long)done, (long long)total, now_s() - p->t0, layer);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

/* Writes every selected layer's tw1 rebuild at densities j/steps (j = 0 .. steps−1): tensors
 * "d<j>/NAME.weight" and "d<j>/NAME.bias" (F32) for the j in `which` (all when NULL), the
 * relative output error at every j as "NAME.error" (F64 [steps]), and "densities" (F64 [steps]). */
static tj_status write_sweep(const tj_calib_layer *cl, int64_t nl, int64_t g, int64_t steps, const unsigned char *which,
                             const tj_calib_options *co, const char *path, progress_state *ps, tj_error *err)
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
        progress(ps, L->name, l + 1, nl);
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

int cmd_prune_calibrated(int argc, char **argv)
{
    const char *weights = NULL, *sparsity = NULL, *g_s = NULL, *mode_s = NULL, *ew_s = NULL, *layers = NULL,
               *scores = NULL, *out = NULL, *pruned = NULL, *base_s = NULL, *calib = NULL, *alloc_s = NULL,
               *profile_s = NULL, *budget_s = NULL, *damp_s = NULL, *threads_s = NULL, *sweep = NULL,
               *steps_s = NULL, *which_s = NULL, *pos[1];
    int npos, quiet = 0;
    cli_opt opts[] = {{"weights", 1, &weights, NULL},  {"sparsity", 1, &sparsity, NULL}, {"g", 1, &g_s, NULL},
                      {"mode", 1, &mode_s, NULL},      {"ew", 1, &ew_s, NULL},             {"layers", 1, &layers, NULL},
                      {"scores", 1, &scores, NULL},    {"o", 1, &out, NULL},               {"output", 1, &out, NULL},
                      {"pruned-weights", 1, &pruned, NULL}, {"tew-base", 1, &base_s, NULL},
                      {"calibration", 1, &calib, NULL}, {"allocation", 1, &alloc_s, NULL},
                      {"profile", 1, &profile_s, NULL}, {"budget-ms", 1, &budget_s, NULL},
                      {"damp", 1, &damp_s, NULL},      {"threads", 1, &threads_s, NULL},
                      {"sweep-out", 1, &sweep, NULL},  {"sweep-steps", 1, &steps_s, NULL},
                      {"sweep-weights", 1, &which_s, NULL},
                      {"quiet", 0, NULL, &quiet},      {0}};
    int r = cli_parse("prune", argc, argv, opts, pos, 0, &npos);
    if (r) return r == 2 ? 2 : 1;
    if (!weights) return cli_fail("prune", "--weights W.safetensors is required (see --help)");

    tj_prune_options opt = tj_prune_options_default();
    tj_calib_options co = tj_calib_options_default();
    double budget_ms = 0;
    int64_t steps = 16, threads = 0;
    enum { UNIFORM, GLOBAL, MEASURED } alloc = calib ? UNIFORM : GLOBAL;
    if (alloc_s) {
        if (strcmp(alloc_s, "uniform") == 0) alloc = UNIFORM;
        else if (strcmp(alloc_s, "global") == 0) alloc = GLOBAL;
        else if (strcmp(alloc_s, "measured") == 0) alloc = MEASURED;
        else return cli_fail("prune", "--allocation: unknown '%s' (expected uniform, global or measured)", alloc_s);
    }
    if (g_s && cli_parse_int("prune", "g", g_s, 1, TJ_MAX_DIM, &opt.g)) return 1;
    if (mode_s && !tj_prune_mode_parse(mode_s, &opt.mode))
        return cli_fail("prune", "--mode: unknown mode '%s' (expected tw1, tw2 or tew)", mode_s);
    if (ew_s) {
        if (opt.mode != TJ_PRUNE_TEW) return cli_fail("prune", "--ew applies only to --mode tew");
        if (cli_parse_double("prune", "ew", ew_s, 0, 1, &opt.ew_fraction)) return 1;
        if (!(opt.ew_fraction > 0 && opt.ew_fraction < 1)) return cli_fail("prune", "--ew: '%s' is outside (0, 1)", ew_s);
    }
    if (base_s) {
        if (opt.mode != TJ_PRUNE_TEW) return cli_fail("prune", "--tew-base applies only to --mode tew");
        if (!tj_prune_mode_parse(base_s, &opt.tew_base) || opt.tew_base == TJ_PRUNE_TEW)
            return cli_fail("prune", "--tew-base: '%s' is not tw1 or tw2", base_s);
    }
    if (damp_s && cli_parse_double("prune", "damp", damp_s, 0, 1e6, &co.damp)) return 1;
    if (threads_s && cli_parse_int("prune", "threads", threads_s, 0, 1024, &threads)) return 1;
    co.threads = (int)threads;
    if (steps_s && cli_parse_int("prune", "sweep-steps", steps_s, 1, 1024, &steps)) return 1;
    if (budget_s) {
        if (cli_parse_double("prune", "budget-ms", budget_s, 0, 1e12, &budget_ms)) return 1;
        if (!(budget_ms > 0)) return cli_fail("prune", "--budget-ms: '%s' must be positive", budget_s);
        if (alloc != MEASURED) return cli_fail("prune", "--budget-ms needs --allocation measured (and --profile)");
    }
    if (sweep) {
        if (!calib) return cli_fail("prune", "--sweep-out needs --calibration STATS");
    } else {
        if (!out) return cli_fail("prune", "-o PATTERN is required (see --help)");
        if (!sparsity && !budget_s) return cli_fail("prune", "--sparsity S (or --budget-ms) is required (see --help)");
        if (sparsity) {
            if (cli_parse_double("prune", "sparsity", sparsity, 0, 1, &opt.sparsity)) return 1;
            if (opt.sparsity >= 1) return cli_fail("prune", "--sparsity: '%s' is outside [0, 1)", sparsity);
        }
        if (alloc == MEASURED && !profile_s)
            return cli_fail("prune", "--allocation measured needs --profile LOSS.json (written by python -m tilejit.calibrate)");
        if (profile_s && alloc != MEASURED) return cli_fail("prune", "--profile applies only to --allocation measured");
        if (!calib && alloc != GLOBAL)
            return cli_fail("prune", "--allocation %s needs --calibration STATS (without it, only global)", alloc_s);
        if (opt.mode == TJ_PRUNE_TEW && alloc == UNIFORM && !(opt.sparsity + opt.ew_fraction < 1))
            return cli_fail("prune", "--sparsity %g plus --ew %g must stay below 1", opt.sparsity, opt.ew_fraction);
    }

    progress_state ps = {now_s(), quiet};
    tj_error err = {0};
    tj_st_file *wf = NULL, *sf = NULL, *cf = NULL;
    tj_prune_layer_in *in = NULL;
    tj_calib_layer *cl = NULL;
    tj_pattern *p = NULL, *gp = NULL;
    tj_prune_profile *prof = NULL;
    float **nw = NULL, **nb = NULL;
    double *pd = NULL;
    int64_t **tile_keep = NULL;
    int64_t nl = 0;
    int rc = 1;
    char *bname = NULL;
    unsigned char *which = NULL;
    if (tj_st_open(weights, &wf, &err) != TJ_OK) goto fail;
    if (scores && tj_st_open(scores, &sf, &err) != TJ_OK) {
        tj_error_prefix(&err, "--scores");
        goto fail;
    }
    if (tj_prune_select(wf, layers, sf, &in, &nl, &err) != TJ_OK) goto fail;
    if (!calib) {
        /* global without statistics is the plain pruner (cmd_prune.c's path) */
        if (tj_prune_layers(in, nl, &opt, &p, &err) != TJ_OK) goto fail;
        if (tj_pattern_save(p, out, &err) != TJ_OK) goto fail;
        if (pruned && tj_prune_write_weights(wf, p, pruned, &err) != TJ_OK) goto fail;
        cli_print_pattern_summary(p);
        rc = 0;
        goto done;
    }
    if (tj_st_open(calib, &cf, &err) != TJ_OK) {
        tj_error_prefix(&err, "--calibration");
        goto fail;
    }
    cl = calloc((size_t)nl, sizeof *cl);
    nw = calloc((size_t)nl, sizeof *nw);
    nb = calloc((size_t)nl, sizeof *nb);
    tile_keep = calloc((size_t)nl, sizeof *tile_keep);
    if (!cl || !nw || !nb || !tile_keep) {
        tj_fail(&err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    for (int64_t l = 0; l < nl; l++) {
        cl[l].in = &in[l];
        cl[l].density = 1.0 - opt.sparsity;
        if (tj_calib_stats_find(cf, &in[l], &cl[l].stats, &err) != TJ_OK) goto fail;
        free(bname);
        if (asprintf(&bname, "%s.bias", in[l].name) < 0) {
            bname = NULL;
            tj_fail(&err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        const tj_st_tensor *bt = tj_st_find(wf, bname);
        if (bt) {
            if (bt->ndim != 1 || bt->shape[0] != in[l].n || !bt->dtype_ok) {
                tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "%s: '%s' is not an F32/F16/BF16 vector of %lld", weights, bname,
                        (long long)in[l].n);
                goto fail;
            }
            cl[l].bias = bt->data;
            cl[l].bdt = bt->dtype;
        }
    }
    if (sweep) {
        if (which_s) {
            if (!(which = calloc((size_t)steps, 1))) {
                tj_fail(&err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
                goto fail;
            }
            for (const char *q = which_s; *q;) {
                char *end;
                long long j = strtoll(q, &end, 10);
                if (end == q || j < 0 || j >= steps || (*end && *end != ',')) {
                    tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "--sweep-weights: '%s' is not a list of j in [0, %lld)", which_s,
                            (long long)steps);
                    goto fail;
                }
                which[j] = 1;
                q = *end ? end + 1 : end;
            }
        }
        if (write_sweep(cl, nl, opt.g, steps, which, &co, sweep, &ps, &err) != TJ_OK) goto fail;
        printf("wrote %s: %lld layers at densities j/%lld, j = 0..%lld, in %.2f s\n", sweep, (long long)nl,
               (long long)steps, (long long)(steps - 1), now_s() - ps.t0);
        rc = 0;
        goto done;
    }
    if (alloc == GLOBAL) {
        /* the plain pruner's global threshold decides how much each layer (tile) keeps */
        tj_prune_options go = opt;
        if (tj_prune_layers(in, nl, &go, &gp, &err) != TJ_OK) goto fail;
        for (int64_t l = 0; l < nl; l++) {
            const tj_layer *L = &gp->layers[l];
            cl[l].density = (double)tj_layer_kept(L) / ((double)L->n * (double)L->k);
            if (opt.mode == TJ_PRUNE_TW1) {
                if (!(tile_keep[l] = malloc((size_t)(L->ntiles ? L->ntiles : 1) * sizeof **tile_keep))) {
                    tj_fail(&err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
                    goto fail;
                }
                for (int64_t t = 0; t < L->ntiles; t++) tile_keep[l][t] = tj_tile_nrows(L, t);
                cl[l].tile_keep = tile_keep[l];
            }
        }
    } else if (alloc == MEASURED) {
        if (tj_prune_profile_load(profile_s, &prof, &err) != TJ_OK) goto fail;
        if (!(pd = malloc((size_t)prof->nl * sizeof *pd))) {
            tj_fail(&err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        if (tj_prune_allocate(prof, opt.sparsity, budget_ms, pd, &err) != TJ_OK) goto fail;
        for (int64_t l = 0; l < nl; l++) {
            int64_t j = 0;
            while (j < prof->nl && strcmp(prof->names[j], in[l].name) != 0) j++;
            if (j == prof->nl) {
                tj_fail(&err, TJ_ERR_NOT_FOUND, "%s: no entry for layer '%s' (a loss table for another model?)", profile_s,
                        in[l].name);
                goto fail;
            }
            if (prof->n[j] != in[l].n || prof->k[j] != in[l].k) {
                tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "%s: layer '%s' is %lld × %lld there but %lld × %lld in %s", profile_s,
                        in[l].name, (long long)prof->n[j], (long long)prof->k[j], (long long)in[l].n, (long long)in[l].k,
                        weights);
                goto fail;
            }
            cl[l].density = pd[j];
            if (opt.mode == TJ_PRUNE_TEW && cl[l].density < opt.ew_fraction) cl[l].density = opt.ew_fraction;
        }
    }
    co.progress = progress;
    co.progress_user = &ps;
    double t0 = now_s();
    if (tj_prune_calibrated(cl, nl, &opt, &co, &p, nw, nb, &err) != TJ_OK) goto fail;
    double t1 = now_s();
    if (tj_pattern_save(p, out, &err) != TJ_OK) goto fail;
    if (pruned && tj_prune_write_rebuilt(wf, p, (const float *const *)nw, (const float *const *)nb, pruned, &err) != TJ_OK)
        goto fail;
    double t2 = now_s();
    cli_print_pattern_summary(p);
    printf("mode %s, allocation %s", tj_prune_mode_name(opt.mode), alloc == UNIFORM ? "uniform" : alloc == GLOBAL ? "global" : "measured");
    if (budget_ms > 0) printf(" (latency budget %g ms)", budget_ms);
    else printf(", sparsity %g", opt.sparsity);
    printf(", g %lld, calibrated (OBS + least squares, damp %g); pruned in %.2f s, wrote %s%s%s in %.2f s\n",
           (long long)opt.g, co.damp, t1 - t0, out, pruned ? " and " : "", pruned ? pruned : "", t2 - t1);
    if (budget_ms > 0 && prof && prof->time_ms) {
        double tsum = 0;
        for (int64_t j = 0; j < prof->nl; j++) {
            int64_t c = 0;
            while (c < prof->nd && prof->densities[c] != pd[j]) c++;
            if (c < prof->nd) tsum += prof->time_ms[j * prof->nd + c];
        }
        printf("latency: %.3f ms of the %.3f ms budget (the loss table's times)\n", tsum, budget_ms);
    }
    rc = 0;
    goto done;
fail:
    cli_fail("prune", "%s", err.msg);
done:
    if (rc == 0 && fflush(stdout) != 0) rc = cli_fail("prune", "cannot write the summary");
    for (int64_t l = 0; l < nl; l++) {
        if (nw) free(nw[l]);
        if (nb) free(nb[l]);
        if (tile_keep) free(tile_keep[l]);
    }
    free(nw), free(nb), free(tile_keep), free(cl), free(pd), free(bname), free(which);
    tj_prune_profile_destroy(prof);
    tj_pattern_destroy(p);
    tj_pattern_destroy(gp);
    free(in);
    tj_st_close(cf);
    tj_st_close(sf);
    tj_st_close(wf);
    return rc;
}
