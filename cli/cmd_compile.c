/* `tilejit compile PATTERN [--arch sm_90] [--layer NAME] [--config JSON] [--threads N]`: generates
 * and compiles every layer's CUDA kernels with NVRTC through the kernel cache, in parallel, and
 * prints per layer the compile time, cache hit or miss, registers, shared memory and spills. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *help =
    "usage: tilejit compile PATTERN [--arch sm_90[,sm_80...]] [--layer NAME] [--config JSON]\n"
    "                       [--threads N]\n\n"
    "Generates every layer's CUDA C (or one layer's) and compiles it with NVRTC to a CUBIN for each\n"
    "arch, through the kernel cache ($TILEJIT_CACHE_DIR, else $XDG_CACHE_HOME/tilejit, else\n"
    "~/.cache/tilejit). Needs no GPU. Prints per layer and arch: compile seconds, cache (hit, miss,\n"
    "rebuilt: a damaged entry was replaced), registers and static shared memory of tj_tiles, the\n"
    "dynamic shared memory it launches with, and spill bytes over all functions; then the total.\n\n"
    "  --arch LIST     real archs, comma-separated (default sm_90); sm_90a: the arch-specific\n"
    "                  target of the wgmma kernels (a wgmma config compiles for it anyway), runs\n"
    "                  only on compute capability 9.0\n"
    "  --layer NAME    only this layer\n"
    "  --config JSON   config JSON text or file, over each layer's default (see tilejit gen --help)\n"
    "  --threads N     parallel compiles (default: one per core)\n"
    "Exits 1 if any layer fails to compile (the message holds NVRTC's log).\n";

static const char *cache_word(tj_cache_use u)
{
    switch (u) {
    case TJ_CACHE_USE_HIT: return "hit";
    case TJ_CACHE_USE_MISS: return "miss";
    case TJ_CACHE_USE_REBUILT: return "rebuilt";
    default: return "off";
    }
}

static void print_warnings(const char *w)
{
    while (w && *w) {
        size_t n = strcspn(w, "\n");
        fprintf(stderr, "tilejit compile: warning: %.*s\n", (int)n, w);
        w += n + (w[n] == '\n');
    }
}

int cmd_compile(int argc, char **argv)
{
    const char *arch = "sm_90", *layer = NULL, *config = NULL, *threads_s = NULL, *pos[1];
    int npos;
    cli_opt opts[] = {{"arch", 1, &arch, NULL}, {"layer", 1, &layer, NULL}, {"config", 1, &config, NULL},
                      {"threads", 1, &threads_s, NULL}, {0}};
    int r = cli_parse("compile", argc, argv, opts, pos, 1, &npos);
    if (r == 2) { fputs(help, stdout); return 0; }
    if (r) return 1;
    if (npos != 1) return cli_fail("compile", "expected one PATTERN file (see --help)");
    if (!tj_backend_built(TJ_BACKEND_CUDA))
        return cli_fail("compile", "this build has no NVRTC (CUDA toolkit not found at configure time)");
    int archs[8];
    int narch = tj_arch_parse(arch, archs, 8);
    if (narch <= 0) return cli_fail("compile", "--arch: '%s' is not a list like sm_80,sm_90a", arch);
    int64_t threads = 0;
    if (threads_s && cli_parse_int("compile", "threads", threads_s, 1, 64, &threads)) return 1;
    char *cfg_text = NULL;
    if (config && !(cfg_text = cli_read_config("compile", config))) return 1;

    tj_error err;
    tj_pattern *p = NULL;
    tj_compile_report *rep = NULL;
    int rc = 1;
    if (tj_pattern_load(pos[0], &p, &err) != TJ_OK) { cli_fail("compile", "%s", err.msg); goto done; }
    if (layer && !tj_pattern_find(p, layer)) { cli_fail("compile", "%s: no layer named '%s'", pos[0], layer); goto done; }
    tj_compile_options co = tj_compile_options_default();
    co.archs = archs;
    co.narchs = narch;
    co.layer = layer;
    co.config_json = cfg_text;
    co.threads = (int)threads;
    tj_status st = tj_compile_pattern(p, &co, &rep, &err);
    if (!rep) { cli_fail("compile", "%s", err.msg); goto done; }
    /* the cache's warnings: any from opening it first (as before compiling), then the rest */
    print_warnings(rep->warnings);

    printf("%-44s %11s %6s %8s %7s %5s %7s %7s %7s\n", "layer", "n x k", "arch", "seconds", "cache", "regs",
           "smem", "dynsmem", "spill");
    int64_t hits = 0, misses = 0, spills = 0, failed = 0;
    double sum = 0;
    for (int64_t j = 0; j < rep->count; j++) {
        const tj_compiled *k = &rep->kernels[j];
        char shape[32];
        snprintf(shape, sizeof shape, "%lldx%lld", (long long)k->n, (long long)k->k);
        char sm[16];
        snprintf(sm, sizeof sm, "sm_%d%s", k->sm & ~TJ_ARCH_SPECIFIC, (k->sm & TJ_ARCH_SPECIFIC) ? "a" : "");
        if (k->status != TJ_OK) {
            printf("%-44s %11s %-6s  FAILED\n", k->layer, shape, sm);
            failed++;
            continue;
        }
        printf("%-44s %11s %-6s %8.3f %7s %5d %7lld %7lld %7lld\n", k->layer, shape, sm, k->seconds,
               cache_word(k->cache), k->registers, (long long)k->smem_static, (long long)k->smem_dynamic,
               (long long)k->spill_bytes);
        hits += k->cache == TJ_CACHE_USE_HIT;
        misses += k->cache != TJ_CACHE_USE_HIT;
        spills += k->spill_bytes;
        sum += k->seconds;
    }
    printf("total: %lld kernels (%lld layers x %d archs), %.3f s wall (%.3f s generating), %.3f s summed over "
           "compiles, %lld cache hits, %lld compiled, %lld spill bytes, %lld failed\n",
           (long long)rep->count, (long long)rep->layers, narch, rep->wall_s, rep->gen_s, sum, (long long)hits,
           (long long)misses, (long long)spills, (long long)failed);
    fflush(stdout);
    if (st != TJ_OK) {
        cli_fail("compile", "%s", err.msg);
        goto done;
    }
    rc = 0;
done:
    tj_compile_report_destroy(rep);
    free(cfg_text);
    tj_pattern_destroy(p);
    return rc;
}
