/* `tilejit pattern`: the tile-wise pattern of an already pruned checkpoint, read from its zeros. */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"

static const char *help =
    "usage: tilejit pattern --weights PRUNED.safetensors [--g 128] [--layers REGEX] -o PATTERN\n\n"
    "Reads a tile-wise pattern back from the zeros of pruned weights (e.g. from `tilejit prune\n"
    "--pruned-weights` or another pruning tool) and writes it to PATTERN. Per layer, output\n"
    "features with no nonzero weight may become pruned columns (when that keeps fewer weights\n"
    "than tiles over all features), the kept features are cut into tiles of g, and each tile\n"
    "keeps every input feature with a nonzero weight in it. No ew residual is recovered.\n\n"
    "  --g G            tile width (default 128; g = n when n < g)\n"
    "  --layers REGEX   layers NAME whose tensor NAME.weight to read (POSIX extended regex,\n"
    "                   unanchored); default: every 2-D F32/F16/BF16 NAME.weight except\n"
    "                   embedding tables (NAME containing 'embed')\n";

int cmd_pattern(int argc, char **argv)
{
    const char *weights = NULL, *g_s = NULL, *layers = NULL, *out = NULL, *pos[1];
    int npos;
    cli_opt opts[] = {{"weights", 1, &weights, NULL}, {"g", 1, &g_s, NULL},      {"layers", 1, &layers, NULL},
                      {"o", 1, &out, NULL},           {"output", 1, &out, NULL}, {0}};
    int r = cli_parse("pattern", argc, argv, opts, pos, 0, &npos);
    if (r == 2) {
        fputs(help, stdout);
        return 0;
    }
    if (r) return 1;
    if (!weights) return cli_fail("pattern", "--weights PRUNED.safetensors is required (see --help)");
    if (!out) return cli_fail("pattern", "-o PATTERN is required (see --help)");
    int64_t g = 128;
    if (g_s && cli_parse_int("pattern", "g", g_s, 1, TJ_MAX_DIM, &g)) return 1;

    tj_error err = {0};
    tj_st_file *wf = NULL;
    tj_prune_layer_in *in = NULL;
    tj_pattern *p = NULL;
    int64_t nl = 0;
    int rc = 1;
    if (tj_st_open(weights, &wf, &err) != TJ_OK) goto fail;
    if (tj_prune_select(wf, layers, NULL, &in, &nl, &err) != TJ_OK) goto fail;
    if (tj_pattern_from_weights(in, nl, g, &p, &err) != TJ_OK) goto fail;
    if (tj_pattern_save(p, out, &err) != TJ_OK) goto fail;
    cli_print_pattern_summary(p);
    printf("wrote %s\n", out);
    rc = 0;
    if (fflush(stdout) != 0) rc = cli_fail("pattern", "cannot write the summary");
    goto done;
fail:
    cli_fail("pattern", "%s", err.msg);
done:
    tj_pattern_destroy(p);
    free(in);
    tj_st_close(wf);
    return rc;
}
