/* `tilejit prune` with calibration statistics or a per-layer allocation (--calibration,
 * --allocation, --profile, --budget-ms, --sweep-out): the calibrated path of the prune command.
 * cmd_prune.c parses the options and hands over when one of these is present; the checks of the
 * options and the opening of the inputs both paths share are prune_shared.c's. */
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

int cmd_prune_calibrated(const cli_prune_args *a)
{
    tj_prune_calibrated_options co = tj_prune_calibrated_options_default();
    tj_prune_options opt = co.prune;
    double budget_ms = 0;
    int64_t steps = co.sweep_steps, threads = 0;
    enum { UNIFORM = TJ_PRUNE_ALLOC_UNIFORM, GLOBAL = TJ_PRUNE_ALLOC_GLOBAL, MEASURED = TJ_PRUNE_ALLOC_MEASURED } alloc =
        a->calibration ? UNIFORM : GLOBAL;
    if (a->allocation) {
        if (strcmp(a->allocation, "uniform") == 0) alloc = UNIFORM;
        else if (strcmp(a->allocation, "global") == 0) alloc = GLOBAL;
        else if (strcmp(a->allocation, "measured") == 0) alloc = MEASURED;
        else return cli_fail("prune", "--allocation: unknown '%s' (expected uniform, global or measured)", a->allocation);
    }
    if (cli_prune_shape(a, &opt)) return 1;
    if (a->damp && cli_parse_double("prune", "damp", a->damp, 0, 1e6, &co.damp)) return 1;
    if (a->threads && cli_parse_int("prune", "threads", a->threads, 0, 1024, &threads)) return 1;
    co.threads = (int)threads;
    if (a->sweep_steps && cli_parse_int("prune", "sweep-steps", a->sweep_steps, 1, 1024, &steps)) return 1;
    if (a->budget_ms) {
        if (cli_parse_double("prune", "budget-ms", a->budget_ms, 0, 1e12, &budget_ms)) return 1;
        if (!(budget_ms > 0)) return cli_fail("prune", "--budget-ms: '%s' must be positive", a->budget_ms);
        if (alloc != MEASURED) return cli_fail("prune", "--budget-ms needs --allocation measured (and --profile)");
    }
    if (a->sweep_out) {
        if (!a->calibration) return cli_fail("prune", "--sweep-out needs --calibration STATS");
    } else {
        if (!a->out) return cli_fail("prune", "-o PATTERN is required (see --help)");
        if (!a->sparsity && !a->budget_ms)
            return cli_fail("prune", "--sparsity S (or --budget-ms) is required (see --help)");
        if (a->sparsity && cli_prune_sparsity(a->sparsity, &opt.sparsity)) return 1;
        if (alloc == MEASURED && !a->profile)
            return cli_fail("prune", "--allocation measured needs --profile LOSS.json (written by python -m tilejit.calibrate)");
        if (a->profile && alloc != MEASURED) return cli_fail("prune", "--profile applies only to --allocation measured");
        if (!a->calibration && alloc != GLOBAL)
            return cli_fail("prune", "--allocation %s needs --calibration STATS (without it, only global)", a->allocation);
        if (opt.mode == TJ_PRUNE_TEW && alloc == UNIFORM && !(opt.sparsity + opt.ew_fraction < 1))
            return cli_fail("prune", "--sparsity %g plus --ew %g must stay below 1", opt.sparsity, opt.ew_fraction);
    }
    if (!a->calibration) {
        /* global without statistics is the plain pruner, without the plain path's closing line */
        int rc = cli_prune_plain(a, &opt, NULL, NULL);
        if (rc == 0 && fflush(stdout) != 0) rc = cli_fail("prune", "cannot write the summary");
        return rc;
    }

    progress_state ps = {tj_now(), a->quiet};
    tj_error err = {0};
    cli_prune_input in = {0};
    tj_pattern *p = NULL;
    int rc = 1;
    if (cli_prune_input_open(a, &in, &err) != TJ_OK) goto fail;
    co.prune = opt;
    co.calibration = a->calibration;
    co.allocation = (tj_prune_allocation)alloc;
    co.profile = a->profile;
    co.budget_ms = budget_ms;
    co.sweep_out = a->sweep_out;
    co.sweep_steps = steps;
    co.sweep_weights = a->sweep_weights;
    co.pattern_out = a->out;
    co.pruned_out = a->pruned;
    co.progress = progress;
    co.progress_user = &ps;
    tj_prune_calibrated_result res = {sizeof res, 0, 0, -1};
    if (tj_prune_calibrated_run(in.weights, in.layers, in.nlayers, &co, a->sweep_out ? NULL : &p, &res, &err) != TJ_OK)
        goto fail;
    if (a->sweep_out) {
        printf("wrote %s: %lld layers at densities j/%lld, j = 0..%lld, in %.2f s\n", a->sweep_out, (long long)in.nlayers,
               (long long)steps, (long long)(steps - 1), tj_now() - ps.t0);
        rc = 0;
        goto done;
    }
    cli_print_pattern_summary(p);
    printf("mode %s, allocation %s", tj_prune_mode_name(opt.mode), alloc == UNIFORM ? "uniform" : alloc == GLOBAL ? "global" : "measured");
    if (budget_ms > 0) printf(" (latency budget %g ms)", budget_ms);
    else printf(", sparsity %g", opt.sparsity);
    printf(", g %lld, calibrated (OBS + least squares, damp %g); pruned in %.2f s, wrote %s%s%s in %.2f s\n",
           (long long)opt.g, co.damp, res.prune_s, a->out, a->pruned ? " and " : "", a->pruned ? a->pruned : "",
           res.write_s);
    if (res.latency_ms >= 0) printf("latency: %.3f ms of the %.3f ms budget (the loss table's times)\n", res.latency_ms, budget_ms);
    rc = 0;
    goto done;
fail:
    cli_fail("prune", "%s", err.msg);
done:
    if (rc == 0 && fflush(stdout) != 0) rc = cli_fail("prune", "cannot write the summary");
    tj_pattern_destroy(p);
    cli_prune_input_close(&in);
    return rc;
}
