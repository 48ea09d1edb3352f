/* `tilejit run`: one layer on a .npy input, Y written as <f4 [M × N]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *help =
    "usage: tilejit run PATTERN --weights W.safetensors --layer NAME --input X.npy --output Y.npy\n"
    "                   [--backend auto|cpu|cuda|reference] [--threads T] [--tuning-log LOG]\n"
    "                   [--precision auto|f32|bf16] [-v]\n\n"
    "Computes Y = act(X · (W ⊙ mask)ᵀ + bias) for one layer. X is a 2-D .npy array [M × k]\n"
    "('<f4' or '<f2', C order); Y is written as '<f4' [M × n]. --backend auto uses a GPU when\n"
    "one is usable, else the CPU backend (-v says which and why, which path the layer took at this\n"
    "M: its kernel or the dense path, docs/dense-path.md, and the precision and config that ran).\n"
    "--precision (CPU backend): auto (default) computes in bf16 where the CPU has avx512_bf16 or\n"
    "AMX and the layer's weights are BF16, else fp32; bf16 rounds X (and fp32 weights) to bf16,\n"
    "accumulates in fp32.\n";

int cmd_run(int argc, char **argv)
{
    const char *weights = NULL, *layer = NULL, *input = NULL, *output = NULL, *backend = "auto";
    const char *threads = NULL, *tlog = NULL, *prec = "auto", *pos[1];
    int verbose = 0, npos;
    cli_opt opts[] = {{"weights", 1, &weights, NULL}, {"layer", 1, &layer, NULL}, {"input", 1, &input, NULL},
                      {"output", 1, &output, NULL}, {"backend", 1, &backend, NULL}, {"threads", 1, &threads, NULL},
                      {"tuning-log", 1, &tlog, NULL}, {"precision", 1, &prec, NULL}, {"v", 0, NULL, &verbose},
                      {"verbose", 0, NULL, &verbose}, {0}};
    int r = cli_parse("run", argc, argv, opts, pos, 1, &npos);
    if (r == 2) { fputs(help, stdout); return 0; }
    if (r) return 1;
    if (npos != 1) return cli_fail("run", "expected one PATTERN file (see --help)");
    if (!weights) return cli_fail("run", "--weights is required");
    if (!layer) return cli_fail("run", "--layer is required");
    if (!input) return cli_fail("run", "--input is required");
    if (!output) return cli_fail("run", "--output is required");
    tj_options opt = tj_options_default();
    if (cli_parse_backend("run", backend, &opt.backend) || cli_parse_precision("run", prec, &opt.precision)) return 1;
    if (threads) {
        int64_t t;
        if (cli_parse_int("run", "threads", threads, 0, 1024, &t)) return 1;
        opt.threads = (int)t;
    }
    opt.tuning_log = tlog;
    opt.verbose = verbose;

    tj_error err;
    tj_npy x = {0};
    tj_context *ctx = NULL;
    tj_model *model = NULL;
    float *y = NULL;
    int rc = 1;
    if (tj_npy_read(input, &x, &err) != TJ_OK) { cli_fail("run", "%s", err.msg); goto done; }
    if (tj_context_create(&opt, &ctx) != TJ_OK) { cli_fail("run", "%s", tj_last_error()); goto done; }
    if (tj_model_load(ctx, pos[0], weights, &model) != TJ_OK) { cli_fail("run", "%s", tj_context_error(ctx)); goto done; }
    if (verbose) fputs(tj_context_log(ctx), stderr);
    int64_t idx;
    if (tj_model_find_layer(model, layer, &idx) != TJ_OK) { cli_fail("run", "%s", tj_context_error(ctx)); goto done; }
    tj_layer_info info;
    tj_model_layer_info(model, idx, &info);
    if (x.cols != info.k) {
        cli_fail("run", "%s: X has %lld columns but layer '%s' has k = %lld input features", input,
                 (long long)x.cols, layer, (long long)info.k);
        goto done;
    }
    y = malloc((size_t)(x.rows * info.n + 1) * sizeof *y);
    if (!y) { cli_fail("run", "out of memory"); goto done; }
    int64_t xs[2] = {x.rows, x.cols}, ys[2] = {x.rows, info.n};
    DLTensor xt = {.data = x.data, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs,
                   .dtype = {kDLFloat, x.dtype == TJ_F16 ? 16 : 32, 1}};
    DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
    double t0 = tj_now();
    if (tj_linear_ex(model, idx, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) != TJ_OK) {
        cli_fail("run", "%s", tj_context_error(ctx));
        goto done;
    }
    if (verbose) {
        tj_path path = TJ_PATH_KERNEL;
        const char *lib = "kernel", *why = "", *cfg = NULL;
        tj_precision ran = TJ_PRECISION_F32;
        tj_model_layer_path(model, idx, x.rows, &path, &lib, &why);
        tj_model_layer_precision(model, idx, x.rows, &ran);
        tj_model_layer_config(model, idx, x.rows, &cfg);
        fprintf(stderr, "tilejit run: layer '%s' on backend %s, M = %lld, precision %s: %.3f ms (load %.3f s)\n", layer,
                tj_backend_name(tj_context_backend(ctx)), (long long)x.rows, tj_precision_name(ran), 1e3 * (tj_now() - t0),
                tj_model_load_seconds(model));
        fprintf(stderr, "tilejit run: path %s%s%s; %s%s%s\n", path == TJ_PATH_DENSE ? "dense (" : "kernel",
                path == TJ_PATH_DENSE ? lib : "", path == TJ_PATH_DENSE ? ")" : "", why,
                cfg && path != TJ_PATH_DENSE ? "; config " : "", cfg && path != TJ_PATH_DENSE ? cfg : "");
    }
    if (tj_npy_write(output, TJ_F32, x.rows, info.n, y, &err) != TJ_OK) { cli_fail("run", "%s", err.msg); goto done; }
    rc = 0;
done:
    free(y);
    tj_model_destroy(model);
    tj_context_destroy(ctx);
    tj_npy_free(&x);
    return rc;
}
