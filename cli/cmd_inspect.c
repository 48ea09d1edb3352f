/* `tilejit inspect PATTERN [--weights W]`: per-layer shape, tiles, density, FLOP reduction. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *help =
    "usage: tilejit inspect PATTERN [--weights W.safetensors]\n\n"
    "Prints, per layer: shape n×k, tile width g, kept columns, tiles, kept rows per tile\n"
    "(min/mean/max), ew entries, density (kept weights / n·k) and FLOP reduction (n·k / kept).\n"
    "With --weights, also checks each layer's tensors and counts the nonzero weights the\n"
    "pattern drops (weights outside the mask are ignored when running).\n";

static int nonzero(const void *p, tj_dtype d, int64_t i)
{
    if (d == TJ_F32) { /* ±0 are zero; p may be unaligned (mapped weights) */
        uint32_t u;
        memcpy(&u, (const char *)p + 4 * i, 4);
        return u << 1 != 0;
    }
    return (tj_load_u16(p, i) & 0x7fff) != 0;
}

/* Nonzeros of W outside the mask: per kept row, all nonzeros minus those at kept positions. */
static int64_t dropped_nonzeros(const tj_layer *l, const void *w, tj_dtype d)
{
    int64_t total = 0, kept = 0;
    for (int64_t i = 0; i < l->n * l->k; i++) total += nonzero(w, d, i);
    for (int64_t t = 0; t < l->ntiles; t++)
        for (int64_t c = 0; c < tj_tile_width(l, t); c++) {
            int64_t n = tj_layer_col(l, t * l->g + c);
            for (int64_t r = l->tile_ptr[t]; r < l->tile_ptr[t + 1]; r++) kept += nonzero(w, d, n * l->k + l->tile_rows[r]);
        }
    for (int64_t n = 0; l->ew_indptr && n < l->n; n++)
        for (int64_t e = l->ew_indptr[n]; e < l->ew_indptr[n + 1]; e++) kept += nonzero(w, d, n * l->k + l->ew_indices[e]);
    return total - kept;
}

int cmd_inspect(int argc, char **argv)
{
    const char *weights = NULL, *pos[1];
    int npos;
    cli_opt opts[] = {{"weights", 1, &weights, NULL}, {0}};
    int r = cli_parse("inspect", argc, argv, opts, pos, 1, &npos);
    if (r == 2) { fputs(help, stdout); return 0; }
    if (r) return 1;
    if (npos != 1) return cli_fail("inspect", "expected one PATTERN file (see --help)");
    tj_error err;
    tj_pattern *p = NULL;
    tj_st_file *st = NULL;
    if (tj_pattern_load(pos[0], &p, &err) != TJ_OK) return cli_fail("inspect", "%s", err.msg);
    if (weights && tj_st_open(weights, &st, &err) != TJ_OK) {
        tj_pattern_destroy(p);
        return cli_fail("inspect", "%s", err.msg);
    }
    int rc = 0;
    printf("%-48s %7s %7s %4s %6s %5s %17s %8s %8s %7s%s\n", "layer", "n", "k", "g", "cols", "tiles",
           "rows min/mean/max", "ew", "density", "flops÷", st ? "  dropped-nonzeros" : "");
    int64_t all = 0, all_kept = 0;
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        int64_t mn = l->k, mx = 0, sum = 0;
        for (int64_t t = 0; t < l->ntiles; t++) {
            int64_t nr = tj_tile_nrows(l, t);
            mn = nr < mn ? nr : mn;
            mx = nr > mx ? nr : mx;
            sum += nr;
        }
        if (!l->ntiles) mn = 0;
        int64_t kept = tj_layer_kept(l), dense = l->n * l->k;
        all += dense;
        all_kept += kept;
        char rows[64];
        snprintf(rows, sizeof rows, "%lld/%.1f/%lld", (long long)mn, l->ntiles ? (double)sum / (double)l->ntiles : 0.0, (long long)mx);
        printf("%-48s %7lld %7lld %4lld %6lld %5lld %17s %8lld %7.2f%% %6.2fx", l->name, (long long)l->n,
               (long long)l->k, (long long)l->g, (long long)l->ncols, (long long)l->ntiles, rows,
               (long long)l->ew_nnz, 100.0 * (double)kept / (double)dense,
               kept ? (double)dense / (double)kept : 0.0);
        if (st) {
            char name[1100];
            snprintf(name, sizeof name, "%s.weight", l->name);
            const tj_st_tensor *t = tj_st_find(st, name);
            if (!t) { rc = cli_fail("inspect", "%s: tensor '%s' not found (needed by layer '%s')", weights, name, l->name); break; }
            if (!t->dtype_ok) { rc = cli_fail("inspect", "%s: tensor '%s': dtype %s is not supported (expected F32, F16 or BF16)", weights, name, t->dtype_str); break; }
            if (t->ndim != 2 || t->shape[0] != l->n || t->shape[1] != l->k) {
                rc = cli_fail("inspect", "%s: tensor '%s' has the wrong shape for layer '%s' (expected [%lld, %lld])", weights, name, l->name, (long long)l->n, (long long)l->k);
                break;
            }
            printf("  %17lld", (long long)dropped_nonzeros(l, t->data, t->dtype));
        }
        printf("\n");
    }
    if (rc == 0)
        printf("total: %lld layers, %lld of %lld weights kept (density %.2f%%, FLOP reduction %.2fx)\n",
               (long long)p->nlayers, (long long)all_kept, (long long)all,
               all ? 100.0 * (double)all_kept / (double)all : 0.0, all_kept ? (double)all / (double)all_kept : 0.0);
    if (fflush(stdout) != 0) rc = cli_fail("inspect", "cannot write the output");
    tj_st_close(st);
    tj_pattern_destroy(p);
    return rc;
}
