/* `tilejit compile PATTERN [--arch sm_90] [--layer NAME] [--config JSON] [--threads N]`: generates
 * and compiles every layer's CUDA kernels with NVRTC through the kernel cache, in parallel, and
 * prints per layer the compile time, cache hit or miss, registers, shared memory and spills. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "gen/emit_cuda.h"
#include "pattern/pattern.h"
#include "tj_config.h"
#if TJ_HAVE_CUDA
#include "jit/nvrtc.h"
#endif

static const char *help =
    "usage: tilejit compile PATTERN [--arch sm_90[,sm_80...]] [--layer NAME] [--config JSON]\n"
    "                       [--threads N]\n\n"
    "Generates every layer's CUDA C (or one layer's) and compiles it with NVRTC to a CUBIN for each\n"
    "arch, through the kernel cache ($TILEJIT_CACHE_DIR, else $XDG_CACHE_HOME/tilejit, else\n"
    "~/.cache/tilejit). Needs no GPU. Prints per layer and arch: compile seconds, cache (hit, miss,\n"
    "rebuilt: a damaged entry was replaced), registers and static shared memory of tj_tiles, the\n"
    "dynamic shared memory it launches with, and spill bytes over all functions; then the total.\n\n"
    "  --arch LIST     real archs, comma-separated (default sm_90)\n"
    "  --layer NAME    only this layer\n"
    "  --config JSON   config JSON text or file, over each layer's default (see tilejit gen --help)\n"
    "  --threads N     parallel compiles (default: one per core)\n"
    "Exits 1 if any layer fails to compile (the message holds NVRTC's log).\n";

#if TJ_HAVE_CUDA
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_archs(const char *s, int *archs, int max)
{
    int n = 0;
    while (*s) {
        int v = 0, used = 0;
        if (sscanf(s, "sm_%d%n", &v, &used) != 1 || v < 50 || v > 200 || n >= max) return -1;
        archs[n++] = v;
        s += used;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

static const char *cache_word(tj_cache_result r)
{
    switch (r) {
    case TJ_CACHE_HIT: return "hit";
    case TJ_CACHE_MISS: return "miss";
    case TJ_CACHE_DISCARDED: return "rebuilt";
    default: return "off";
    }
}
#endif

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
#if !TJ_HAVE_CUDA
    (void)arch; (void)layer; (void)config; (void)threads_s;
    return cli_fail("compile", "this build has no NVRTC (CUDA toolkit not found at configure time)");
#else
    int archs[8];
    int narch = parse_archs(arch, archs, 8);
    if (narch <= 0) return cli_fail("compile", "--arch: '%s' is not a list like sm_80,sm_90", arch);
    int64_t threads = 0;
    if (threads_s && cli_parse_int("compile", "threads", threads_s, 1, 64, &threads)) return 1;
    char *cfg_text = NULL;
    if (config && !(cfg_text = cli_read_config("compile", config))) return 1;

    tj_error err;
    tj_pattern *p = NULL;
    tj_cache *cache = NULL;
    tj_nvrtc_job *jobs = NULL;
    tj_cuda_config *cfgs = NULL;
    char **sources = NULL;
    int64_t nl = 0, njobs = 0;
    int rc = 1;
    if (tj_pattern_load(pos[0], &p, &err) != TJ_OK) { cli_fail("compile", "%s", err.msg); goto done; }
    sources = calloc((size_t)p->nlayers + 1, sizeof *sources);
    cfgs = calloc((size_t)p->nlayers + 1, sizeof *cfgs);
    jobs = calloc((size_t)(p->nlayers * narch) + 1, sizeof *jobs);
    if (!sources || !cfgs || !jobs) { cli_fail("compile", "out of memory"); goto done; }
    if (tj_cache_open(NULL, &cache, &err) != TJ_OK) { cli_fail("compile", "%s", err.msg); goto done; }
    char *warning = tj_cache_take_warning(cache);
    if (warning) fprintf(stderr, "tilejit compile: warning: %s\n", warning);
    free(warning);

    double t0 = now_s();
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        if (layer && strcmp(l->name, layer) != 0) continue;
        cfgs[nl] = tj_cuda_config_default(l);
        if (cfg_text && tj_cuda_config_from_json(cfg_text, &cfgs[nl], &err) != TJ_OK) { cli_fail("compile", "%s", err.msg); goto done; }
        if (tj_cuda_emit(l, &cfgs[nl], &sources[nl], &err) != TJ_OK) { cli_fail("compile", "%s", err.msg); goto done; }
        for (int a = 0; a < narch; a++) {
            if (tj_cuda_smem_bytes(&cfgs[nl]) > tj_cuda_arch_smem_limit(archs[a])) {
                cli_fail("compile", "layer '%s': config needs %lld bytes of shared memory, sm_%d allows %lld", l->name,
                         (long long)tj_cuda_smem_bytes(&cfgs[nl]), archs[a], (long long)tj_cuda_arch_smem_limit(archs[a]));
                goto done;
            }
            jobs[njobs].source = sources[nl];
            jobs[njobs].label = l->name;
            jobs[njobs].sm = archs[a];
            njobs++;
        }
        nl++;
    }
    if (layer && nl == 0) { cli_fail("compile", "%s: no layer named '%s'", pos[0], layer); goto done; }
    double t_gen = now_s() - t0;
    tj_status st = tj_nvrtc_compile_all(cache, jobs, njobs, (int)threads, &err);
    double wall = now_s() - t0;

    printf("%-44s %11s %6s %8s %7s %5s %7s %7s %7s\n", "layer", "n x k", "arch", "seconds", "cache", "regs",
           "smem", "dynsmem", "spill");
    int64_t hits = 0, misses = 0, spills = 0, failed = 0;
    double sum = 0;
    for (int64_t j = 0; j < njobs; j++) {
        const tj_nvrtc_job *jb = &jobs[j];
        const tj_layer *l = NULL;
        for (int64_t i = 0; i < p->nlayers && !l; i++)
            if (p->layers[i].name == jb->label) l = &p->layers[i];
        char shape[32];
        snprintf(shape, sizeof shape, "%lldx%lld", (long long)l->n, (long long)l->k);
        if (jb->status != TJ_OK) {
            printf("%-44s %11s sm_%-3d  FAILED\n", jb->label, shape, jb->sm);
            failed++;
            continue;
        }
        const tj_kernel_resources *kr = NULL;
        for (int k = 0; k < jb->result.nkernels; k++)
            if (strcmp(jb->result.kernels[k].name, "tj_tiles") == 0) kr = &jb->result.kernels[k];
        const tj_cuda_config *cfg = &cfgs[j / narch];
        printf("%-44s %11s sm_%-3d %8.3f %7s %5d %7lld %7lld %7lld\n", jb->label, shape, jb->sm, jb->result.seconds,
               cache_word(jb->result.cache), kr ? kr->registers : -1, kr ? (long long)kr->smem_static : -1LL,
               (long long)tj_cuda_smem_bytes(cfg), (long long)jb->result.spill_bytes);
        hits += jb->result.cache == TJ_CACHE_HIT;
        misses += jb->result.cache != TJ_CACHE_HIT;
        spills += jb->result.spill_bytes;
        sum += jb->result.seconds;
    }
    printf("total: %lld kernels (%lld layers x %d archs), %.3f s wall (%.3f s generating), %.3f s summed over "
           "compiles, %lld cache hits, %lld compiled, %lld spill bytes, %lld failed\n",
           (long long)njobs, (long long)nl, narch, wall, t_gen, sum, (long long)hits, (long long)misses, (long long)spills,
           (long long)failed);
    warning = tj_cache_take_warning(cache);
    if (warning) fprintf(stderr, "tilejit compile: warning: %s\n", warning);
    free(warning);
    fflush(stdout);
    if (st != TJ_OK) {
        for (int64_t j = 0; j < njobs; j++)
            if (jobs[j].status != TJ_OK) {
                cli_fail("compile", "%s", jobs[j].error.msg);
                break;
            }
        goto done;
    }
    rc = 0;
done:
    for (int64_t j = 0; jobs && j < njobs; j++) tj_cubin_free(&jobs[j].result);
    for (int64_t i = 0; sources && i < nl; i++) free(sources[i]);
    free(sources);
    free(cfgs);
    free(jobs);
    free(cfg_text);
    tj_cache_close(cache);
    tj_pattern_destroy(p);
    return rc;
#endif
}
