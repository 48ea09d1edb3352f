/* `tilejit prune`: a dense checkpoint → a tile-wise pattern (tw1, tw2, tew; one global threshold
 * across layers) and optionally the pruned weights. Parses the options of both paths and runs
 * the plain one, or hands over to the calibrated one (cmd_prune_calib.c); what both share is
 * prune_shared.c's. */
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
