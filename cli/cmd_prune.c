/* `tilejit prune`: a dense checkpoint → a tile-wise pattern (tw1, tw2, tew; one global threshold
 * across layers) and optionally the pruned weights. Parses the options of both paths and holds
 * what the calibrated path (cmd_prune_calib.c) shares with the plain one; the summary printer is
 * shared with `tilejit pattern`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *help =
    "usage: tilejit prune --weights W.safetensors --sparsity S [--g 128] [--mode tw1|tw2|tew] [--ew F]\n"
    "                     [--tew-base tw1|tw2] [--layers REGEX] [--scores SCORES.safetensors] -o PATTERN\n"
    "                     [--pruned-weights OUT.safetensors]\n\n"
    "Prunes the linear layers of a checkpoint to a tile-wise pattern, all layers against one\n"
    "global threshold (so layers come out with different densities), and writes it to PATTERN.\n\n"
    "  --sparsity S     fraction of the selected layers' weights to remove, in [0, 1)\n"
    "  --g G            tile width: output features per tile (default 128; g = n when n < g)\n"
    "  --mode tw1       per tile, prune whole input-feature rows (default)\n"
    "         tw2       first prune whole output features (s' = 1 - sqrt(1 - S) of the weights),\n"
    "                   re-tile the kept ones, then prune rows per tile to reach S\n"
    "         tew       tw1 (or tw2, see --tew-base) at S + F, then add back the top F of the\n"
    "                   removed weights, by score, as the unstructured residual `ew`\n"
    "  --ew F           tew's residual as a fraction of all weights (default 0.01; tew only)\n"
    "  --tew-base M     tew's tile-wise part: tw1 (default) or tw2\n"
    "  --layers REGEX   prune the tensors NAME.weight whose NAME matches this POSIX extended\n"
    "                   regex (unanchored); default: every 2-D F32/F16/BF16 NAME.weight except\n"
    "                   embedding tables (NAME containing 'embed')\n"
    "  --scores FILE    per-weight scores (e.g. accumulated Taylor scores) as tensors NAME.weight\n"
    "                   (or NAME.score) of the weights' shapes; default: the weights' magnitudes\n"
    "  --pruned-weights OUT  also write the weights with every pruned weight set to zero; all\n"
    "                   other tensors (biases, embeddings, norms) are copied unchanged\n\n"
    "Calibrated pruning (docs/pruning-calibrated.md; `python -m tilejit.calibrate` drives it):\n"
    "  --calibration STATS  per-layer input statistics (safetensors: NAME.hessian F64 [k+1, k+1],\n"
    "                   NAME.tokens I64 [1], optional NAME.cross F64 [k+1, k+1] against the dense\n"
    "                   model's inputs: then the rebuild targets the dense output; optional\n"
    "                   NAME.residual F64 [k+1, n]: it also makes up for the residual's drift);\n"
    "                   each tile keeps the input features chosen by OBS and its weights and bias\n"
    "                   are rebuilt by ridge least squares; --pruned-weights then holds the rebuilt\n"
    "                   weights and biases\n"
    "  --allocation A   uniform: every layer at 1 - S (default with --calibration); global: the\n"
    "                   global threshold above decides each tile's size (default without);\n"
    "                   measured: a knapsack over --profile's loss table\n"
    "  --profile LOSS.json  loss table (format tilejit-prune-profile) for --allocation measured;\n"
    "                   the allocation covers every layer in it, the selected ones are pruned\n"
    "  --budget-ms X    with measured: a latency budget (the table's time_ms) instead of --sparsity\n"
    "  --damp D         ridge: D x mean(diag H) (default 0.001)\n"
    "  --threads N      tiles rebuilt in parallel (default: all cores)\n"
    "  --sweep-out FILE tw1 rebuilds of each selected layer at densities j/steps (j = 0..steps-1)\n"
    "                   as tensors d<j>/NAME.weight and d<j>/NAME.bias, for the profile\n"
    "  --sweep-steps N  (default 16)\n"
    "  --sweep-weights J,...  only these j get weights (the relative output error NAME.error\n"
    "                   [steps] is written for every j)\n"
    "  --quiet          no progress line on stderr\n\n"
    "A tile-row's score is the L2 norm of its weights' scores divided by its length (a column's\n"
    "likewise over k). Prints each layer's density and FLOP reduction, and the totals.\n";

void cli_print_pattern_summary(const tj_pattern *p)
{
    printf("%-52s %6s %6s %4s %6s %5s %8s %8s %7s\n", "layer", "n", "k", "g", "cols", "tiles", "ew", "density",
           "flops÷");
    int64_t all = 0, kept_all = 0, ew_all = 0;
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        int64_t dense = l->n * l->k, kept = tj_layer_kept(l);
        all += dense;
        kept_all += kept;
        ew_all += l->ew_nnz;
        printf("%-52s %6lld %6lld %4lld %6lld %5lld %8lld %7.2f%% %6.2fx\n", l->name, (long long)l->n, (long long)l->k,
               (long long)l->g, (long long)l->ncols, (long long)l->ntiles, (long long)l->ew_nnz,
               100.0 * (double)kept / (double)dense, kept ? (double)dense / (double)kept : 0.0);
    }
    printf("total: %lld layers, %lld of %lld weights kept (%lld ew), density %.2f%%, FLOP reduction %.2fx\n",
           (long long)p->nlayers, (long long)kept_all, (long long)all, (long long)ew_all,
           all ? 100.0 * (double)kept_all / (double)all : 0.0, kept_all ? (double)all / (double)kept_all : 0.0);
}

/* Every option of `tilejit prune`; the calibrated path's own only when that path is taken. Returns
 * cli_parse's 0, 1 or 2 (--help). */
static int prune_parse(int argc, char **argv, int calibrated, cli_prune_args *a)
{
    const cli_opt shared[] = {
        {"weights", 1, &a->weights, NULL},   {"sparsity", 1, &a->sparsity, NULL}, {"g", 1, &a->g, NULL},
        {"mode", 1, &a->mode, NULL},         {"ew", 1, &a->ew, NULL},             {"layers", 1, &a->layers, NULL},
        {"scores", 1, &a->scores, NULL},     {"o", 1, &a->out, NULL},             {"output", 1, &a->out, NULL},
        {"pruned-weights", 1, &a->pruned, NULL}, {"tew-base", 1, &a->tew_base, NULL}};
    const cli_opt calib[] = {
        {"calibration", 1, &a->calibration, NULL}, {"allocation", 1, &a->allocation, NULL},
        {"profile", 1, &a->profile, NULL},         {"budget-ms", 1, &a->budget_ms, NULL},
        {"damp", 1, &a->damp, NULL},               {"threads", 1, &a->threads, NULL},
        {"sweep-out", 1, &a->sweep_out, NULL},     {"sweep-steps", 1, &a->sweep_steps, NULL},
        {"sweep-weights", 1, &a->sweep_weights, NULL}, {"quiet", 0, NULL, &a->quiet}};
    enum { NSHARED = sizeof shared / sizeof *shared, NCALIB = sizeof calib / sizeof *calib };
    cli_opt opts[NSHARED + NCALIB + 1];
    memcpy(opts, shared, sizeof shared);
    memcpy(opts + NSHARED, calib, sizeof calib);
    opts[calibrated ? NSHARED + NCALIB : NSHARED] = (cli_opt){0};
    const char *pos[1];
    int npos;
    return cli_parse("prune", argc, argv, opts, pos, 0, &npos);
}

int cli_prune_sparsity(const char *s, double *out)
{
    if (cli_parse_double("prune", "sparsity", s, 0, 1, out)) return 1;
    if (*out >= 1) return cli_fail("prune", "--sparsity: '%s' is outside [0, 1)", s);
    return 0;
}

int cli_prune_shape(const cli_prune_args *a, tj_prune_options *opt)
{
    if (a->g && cli_parse_int("prune", "g", a->g, 1, TJ_MAX_DIM, &opt->g)) return 1;
    if (a->mode && !tj_prune_mode_parse(a->mode, &opt->mode))
        return cli_fail("prune", "--mode: unknown mode '%s' (expected tw1, tw2 or tew)", a->mode);
    if (a->ew) {
        if (opt->mode != TJ_PRUNE_TEW) return cli_fail("prune", "--ew applies only to --mode tew");
        if (cli_parse_double("prune", "ew", a->ew, 0, 1, &opt->ew_fraction)) return 1;
        if (!(opt->ew_fraction > 0 && opt->ew_fraction < 1))
            return cli_fail("prune", "--ew: '%s' is outside (0, 1)", a->ew);
    }
    if (a->tew_base) {
        if (opt->mode != TJ_PRUNE_TEW) return cli_fail("prune", "--tew-base applies only to --mode tew");
        if (!tj_prune_mode_parse(a->tew_base, &opt->tew_base) || opt->tew_base == TJ_PRUNE_TEW)
            return cli_fail("prune", "--tew-base: '%s' is not tw1 or tw2", a->tew_base);
    }
    return 0;
}

tj_status cli_prune_input_open(const cli_prune_args *a, cli_prune_input *in, tj_error *err)
{
    tj_status s = tj_st_open(a->weights, &in->weights, err);
    if (s == TJ_OK && a->scores && (s = tj_st_open(a->scores, &in->scores, err)) != TJ_OK)
        cli_error_prefix(err, "--scores");
    if (s == TJ_OK) s = tj_prune_select(in->weights, a->layers, in->scores, &in->layers, &in->nlayers, err);
    return s;
}

void cli_prune_input_close(cli_prune_input *in)
{
    free(in->layers);
    tj_st_close(in->scores);
    tj_st_close(in->weights);
    *in = (cli_prune_input){0};
}

int cli_prune_plain(const cli_prune_args *a, const tj_prune_options *opt, double *prune_s, double *write_s)
{
    double t0 = tj_now(), t1 = t0;
    tj_error err = {0};
    cli_prune_input in = {0};
    tj_pattern *p = NULL;
    int rc = 1;
    if (cli_prune_input_open(a, &in, &err) != TJ_OK) goto done;
    if (tj_prune_layers(in.layers, in.nlayers, opt, &p, &err) != TJ_OK) goto done;
    t1 = tj_now();
    if (tj_pattern_save(p, a->out, &err) != TJ_OK) goto done;
    if (a->pruned && tj_prune_write_weights(in.weights, p, a->pruned, &err) != TJ_OK) goto done;
    if (prune_s) *prune_s = t1 - t0;
    if (write_s) *write_s = tj_now() - t1;
    cli_print_pattern_summary(p);
    rc = 0;
done:
    if (rc) cli_fail("prune", "%s", err.msg);
    tj_pattern_destroy(p);
    cli_prune_input_close(&in);
    return rc;
}

int cmd_prune(int argc, char **argv)
{
    cli_prune_args a = {0};
    int calibrated = cli_prune_wants_calibrated(argc, argv);
    int r = prune_parse(argc, argv, calibrated, &a);
    if (r == 2) {
        fputs(help, stdout);
        return 0;
    }
    if (r) return 1;
    if (!a.weights) return cli_fail("prune", "--weights W.safetensors is required (see --help)");
    if (calibrated) return cmd_prune_calibrated(&a);
    if (!a.sparsity) return cli_fail("prune", "--sparsity S is required (see --help)");
    if (!a.out) return cli_fail("prune", "-o PATTERN is required (see --help)");

    tj_prune_options opt = tj_prune_options_default();
    if (cli_prune_sparsity(a.sparsity, &opt.sparsity) || cli_prune_shape(&a, &opt)) return 1;
    if (opt.mode == TJ_PRUNE_TEW && !(opt.sparsity + opt.ew_fraction < 1))
        return cli_fail("prune", "--sparsity %g plus --ew %g must stay below 1 (tew prunes tile-wise at S + F)",
                        opt.sparsity, opt.ew_fraction);

    double prune_s, write_s;
    if (cli_prune_plain(&a, &opt, &prune_s, &write_s)) return 1;
    printf("mode %s, sparsity %g, g %lld", tj_prune_mode_name(opt.mode), opt.sparsity, (long long)opt.g);
    if (opt.mode == TJ_PRUNE_TEW) printf(" over %s, ew %g", tj_prune_mode_name(opt.tew_base), opt.ew_fraction);
    printf("; pruned in %.2f s, wrote %s%s%s in %.2f s\n", prune_s, a.out, a.pruned ? " and " : "",
           a.pruned ? a.pruned : "", write_s);
    if (fflush(stdout) != 0) return cli_fail("prune", "cannot write the summary");
    return 0;
}
