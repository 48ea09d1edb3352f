/* `tilejit prune`: a dense checkpoint → a tile-wise pattern (tw1, tw2, tew; one global threshold
 * across layers) and optionally the pruned weights. The summary printer is shared with
 * `tilejit pattern`. */
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
    "                   model's inputs: then the rebuild targets the dense output); each tile keeps\n"
    "                   the input features chosen by OBS and its weights and bias are rebuilt by\n"
    "                   ridge least squares; --pruned-weights then holds the rebuilt weights and biases\n"
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

int cmd_prune(int argc, char **argv)
{
    const char *weights = NULL, *sparsity = NULL, *g_s = NULL, *mode_s = NULL, *ew_s = NULL, *layers = NULL,
               *scores = NULL, *out = NULL, *pruned = NULL, *base_s = NULL, *pos[1];
    int npos;
    cli_opt opts[] = {{"weights", 1, &weights, NULL}, {"sparsity", 1, &sparsity, NULL}, {"g", 1, &g_s, NULL},
                      {"mode", 1, &mode_s, NULL},      {"ew", 1, &ew_s, NULL},             {"layers", 1, &layers, NULL},
                      {"scores", 1, &scores, NULL},    {"o", 1, &out, NULL},               {"output", 1, &out, NULL},
                      {"pruned-weights", 1, &pruned, NULL}, {"tew-base", 1, &base_s, NULL}, {0}};
    if (cli_prune_wants_calibrated(argc, argv)) {
        int rc = cmd_prune_calibrated(argc, argv);
        if (rc != 2) return rc;
        fputs(help, stdout);
        return 0;
    }
    int r = cli_parse("prune", argc, argv, opts, pos, 0, &npos);
    if (r == 2) {
        fputs(help, stdout);
        return 0;
    }
    if (r) return 1;
    if (!weights) return cli_fail("prune", "--weights W.safetensors is required (see --help)");
    if (!sparsity) return cli_fail("prune", "--sparsity S is required (see --help)");
    if (!out) return cli_fail("prune", "-o PATTERN is required (see --help)");

    tj_prune_options opt = tj_prune_options_default();
    if (cli_parse_double("prune", "sparsity", sparsity, 0, 1, &opt.sparsity)) return 1;
    if (opt.sparsity >= 1) return cli_fail("prune", "--sparsity: '%s' is outside [0, 1)", sparsity);
    if (g_s && cli_parse_int("prune", "g", g_s, 1, TJ_MAX_DIM, &opt.g)) return 1;
    if (mode_s && !tj_prune_mode_parse(mode_s, &opt.mode))
        return cli_fail("prune", "--mode: unknown mode '%s' (expected tw1, tw2 or tew)", mode_s);
    if (ew_s) {
        if (opt.mode != TJ_PRUNE_TEW) return cli_fail("prune", "--ew applies only to --mode tew");
        if (cli_parse_double("prune", "ew", ew_s, 0, 1, &opt.ew_fraction)) return 1;
        if (!(opt.ew_fraction > 0 && opt.ew_fraction < 1))
            return cli_fail("prune", "--ew: '%s' is outside (0, 1)", ew_s);
    }
    if (base_s) {
        if (opt.mode != TJ_PRUNE_TEW) return cli_fail("prune", "--tew-base applies only to --mode tew");
        if (!tj_prune_mode_parse(base_s, &opt.tew_base) || opt.tew_base == TJ_PRUNE_TEW)
            return cli_fail("prune", "--tew-base: '%s' is not tw1 or tw2", base_s);
    }
    if (opt.mode == TJ_PRUNE_TEW && !(opt.sparsity + opt.ew_fraction < 1))
        return cli_fail("prune", "--sparsity %g plus --ew %g must stay below 1 (tew prunes tile-wise at S + F)",
                        opt.sparsity, opt.ew_fraction);

    double t0 = tj_now();
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
    if (tj_prune_layers(in, nl, &opt, &p, &err) != TJ_OK) goto fail;
    double t1 = tj_now();
    if (tj_pattern_save(p, out, &err) != TJ_OK) goto fail;
    if (pruned && tj_prune_write_weights(wf, p, pruned, &err) != TJ_OK) goto fail;
    double t2 = tj_now();
    cli_print_pattern_summary(p);
    printf("mode %s, sparsity %g, g %lld", tj_prune_mode_name(opt.mode), opt.sparsity, (long long)opt.g);
    if (opt.mode == TJ_PRUNE_TEW) printf(" over %s, ew %g", tj_prune_mode_name(opt.tew_base), opt.ew_fraction);
    printf("; pruned in %.2f s, wrote %s%s%s in %.2f s\n", t1 - t0, out, pruned ? " and " : "", pruned ? pruned : "",
           t2 - t1);
    rc = 0;
    if (fflush(stdout) != 0) rc = cli_fail("prune", "cannot write the summary");
    goto done;
fail:
    cli_fail("prune", "%s", err.msg);
done:
    tj_pattern_destroy(p);
    free(in);
    tj_st_close(sf);
    tj_st_close(wf);
    return rc;
}
