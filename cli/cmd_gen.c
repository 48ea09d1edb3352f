/* `tilejit gen PATTERN --layer NAME --target cuda|cpu [--config JSON] [-o FILE]`: writes the code
 * generated for one layer (CUDA C from gen/emit_cuda.c, or LLVM IR from gen/emit_llvm.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *help =
    "usage: tilejit gen PATTERN --layer NAME --target cuda|cpu [--config JSON] [-o FILE]\n\n"
    "Writes the source generated for one layer: CUDA C (the text NVRTC compiles; the kernel ABI is\n"
    "in gen/emit_cuda.h) or LLVM IR (the module the CPU backend JIT-compiles). The same pattern and\n"
    "config always give byte-identical output.\n\n"
    "  --layer NAME    the layer, by name\n"
    "  --target T      cuda or cpu\n"
    "  --config JSON   a config as JSON text, or a file holding it; keys not given keep the layer's\n"
    "                  defaults. cuda: {\"template\":T,\"bm\":128,\"bn\":128,\"bk\":32,\"warps\":8,\n"
    "                  \"stages\":3,\"offsets\":\"table\"|\"unrolled\",\"dtype\":\"f16\"|\"bf16\",\n"
    "                  \"out\":\"f32\"|\"f16\"|\"bf16\",\"layout\":\"fm\"|\"rm\"|\"rm_fm\"|\"fm_rm\"}, T one of the\n"
    "                  templates below\n"
    "  -o FILE         write there instead of standard output\n\n"
    "CUDA templates (templates/README.md):\n";

/* The template list of --help, from the emitter's own table (tj_gen_cuda_template). */
static void print_help(void)
{
    fputs(help, stdout);
    const char *what = NULL, *name;
    for (int i = 0; (name = tj_gen_cuda_template(i, &what)) != NULL; i++) printf("  %-8s %s\n", name, what);
}

/* The --config value: JSON text as given, or the content of the file it names (malloc'ed). */
char *cli_read_config(const char *cmd, const char *value)
{
    if (!value) return NULL;
    const char *p = value;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (*p == '{') return strdup(value);
    char *buf = NULL;
    tj_error err;
    tj_status s = tj_file_read(value, 0, &buf, NULL, &err);
    if (s == TJ_ERR_OUT_OF_MEMORY) cli_fail(cmd, "out of memory");
    else if (s != TJ_OK) cli_fail(cmd, "--config: '%s' is neither JSON text nor a readable file", value);
    return buf;
}

int cmd_gen(int argc, char **argv)
{
    const char *layer = NULL, *target = NULL, *config = NULL, *output = NULL, *pos[1];
    int npos;
    cli_opt opts[] = {{"layer", 1, &layer, NULL}, {"target", 1, &target, NULL}, {"config", 1, &config, NULL},
                      {"o", 1, &output, NULL}, {"output", 1, &output, NULL}, {0}};
    int r = cli_parse("gen", argc, argv, opts, pos, 1, &npos);
    if (r == 2) { print_help(); return 0; }
    if (r) return 1;
    if (npos != 1) return cli_fail("gen", "expected one PATTERN file (see --help)");
    if (!layer) return cli_fail("gen", "--layer NAME is required");
    if (!target) return cli_fail("gen", "--target cuda|cpu is required");
    int cuda = strcmp(target, "cuda") == 0;
    if (!cuda && strcmp(target, "cpu") != 0) return cli_fail("gen", "--target: '%s' is not cuda or cpu", target);
    if (!cuda && !tj_backend_built(TJ_BACKEND_CPU))
        return cli_fail("gen", "--target cpu: this build has no LLVM backend (configure with -Dllvm=enabled)");
    char *cfg_text = NULL;
    if (config && !(cfg_text = cli_read_config("gen", config))) return 1;

    tj_error err;
    tj_pattern *p = NULL;
    char *src = NULL;
    int rc = 1;
    if (tj_pattern_load(pos[0], &p, &err) != TJ_OK) { cli_fail("gen", "%s", err.msg); goto done; }
    const tj_layer *l = tj_pattern_find(p, layer);
    if (!l) { cli_fail("gen", "%s: no layer named '%s'", pos[0], layer); goto done; }
    if (tj_gen_source(l, cuda ? TJ_TARGET_CUDA : TJ_TARGET_CPU, cfg_text, &src, &err) != TJ_OK) {
        cli_fail("gen", "%s", err.msg);
        goto done;
    }
    FILE *f = output ? fopen(output, "wb") : stdout;
    if (!f) { cli_fail("gen", "cannot write '%s'", output); goto done; }
    size_t len = strlen(src);
    int ok = fwrite(src, 1, len, f) == len;
    if (output) ok = fclose(f) == 0 && ok;
    else ok = fflush(f) == 0 && ok;
    if (!ok) { cli_fail("gen", "error writing %s", output ? output : "standard output"); goto done; }
    rc = 0;
done:
    free(src);
    free(cfg_text);
    tj_pattern_destroy(p);
    return rc;
}
