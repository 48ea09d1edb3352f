/* `tilejit prune` with calibration statistics or a per-layer allocation (--calibration,
 * --allocation, --profile, --budget-ms, --sweep-out): the calibrated path of the prune command.
 * cmd_prune.c hands over when one of these options is present; without them it prunes as before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

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
    fprintf(stderr, "\rprune: %lld/%lld layers, %.1f s: %-60s", (long long)done, (long long)total, tj_now() - p->t0, layer);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
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

    tj_prune_calibrated_options co = tj_prune_calibrated_options_default();
    tj_prune_options opt = co.prune;
    double budget_ms = 0;
    int64_t steps = co.sweep_steps, threads = 0;
    enum { UNIFORM = TJ_PRUNE_ALLOC_UNIFORM, GLOBAL = TJ_PRUNE_ALLOC_GLOBAL, MEASURED = TJ_PRUNE_ALLOC_MEASURED } alloc =
        calib ? UNIFORM : GLOBAL;
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

    progress_state ps = {tj_now(), quiet};
    tj_error err = {0};
    tj_st_file *wf = NULL, *sf = NULL;
    tj_prune_layer_in *in = NULL;
    tj_pattern *p = NULL;
    int64_t nl = 0;
    int rc = 1;
    if (tj_st_open(weights, &wf, &err) != TJ_OK) goto fail;
    if (scores && tj_st_open(scores, &sf, &err) != TJ_OK) {
        cli_error_prefix(&err, "--scores");
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
    co.prune = opt;
    co.calibration = calib;
    co.allocation = (tj_prune_allocation)alloc;
    co.profile = profile_s;
    co.budget_ms = budget_ms;
    co.sweep_out = sweep;
    co.sweep_steps = steps;
    co.sweep_weights = which_s;
    co.pattern_out = out;
    co.pruned_out = pruned;
    co.progress = progress;
    co.progress_user = &ps;
    tj_prune_calibrated_result res = {sizeof res, 0, 0, -1};
    if (tj_prune_calibrated_run(wf, in, nl, &co, sweep ? NULL : &p, &res, &err) != TJ_OK) goto fail;
    if (sweep) {
        printf("wrote %s: %lld layers at densities j/%lld, j = 0..%lld, in %.2f s\n", sweep, (long long)nl,
               (long long)steps, (long long)(steps - 1), tj_now() - ps.t0);
        rc = 0;
        goto done;
    }
    cli_print_pattern_summary(p);
    printf("mode %s, allocation %s", tj_prune_mode_name(opt.mode), alloc == UNIFORM ? "uniform" : alloc == GLOBAL ? "global" : "measured");
    if (budget_ms > 0) printf(" (latency budget %g ms)", budget_ms);
    else printf(", sparsity %g", opt.sparsity);
    printf(", g %lld, calibrated (OBS + least squares, damp %g); pruned in %.2f s, wrote %s%s%s in %.2f s\n",
           (long long)opt.g, co.damp, res.prune_s, out, pruned ? " and " : "", pruned ? pruned : "", res.write_s);
    if (res.latency_ms >= 0) printf("latency: %.3f ms of the %.3f ms budget (the loss table's times)\n", res.latency_ms, budget_ms);
    rc = 0;
    goto done;
fail:
    cli_fail("prune", "%s", err.msg);
done:
    if (rc == 0 && fflush(stdout) != 0) rc = cli_fail("prune", "cannot write the summary");
    tj_pattern_destroy(p);
    free(in);
    tj_st_close(sf);
    tj_st_close(wf);
    return rc;
}
