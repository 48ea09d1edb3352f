/* What both paths of `tilejit prune` share (the plain one in cmd_prune.c, the calibrated one in
 * cmd_prune_calib.c): the checks of the shared options, opening the inputs, the plain pruner, and
 * the pattern summary (also `tilejit pattern`'s). Below both commands: it calls neither. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

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
