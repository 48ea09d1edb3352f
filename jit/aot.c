/* jit/: ahead-of-time compilation of a pattern's CUDA kernels into the kernel cache for named
 * archs (tilejit/compile.h): generate each layer's source (gen/), check its shared memory
 * against each arch, compile all with NVRTC in parallel (nvrtc.c), report per kernel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/strbuf.h"
#include "gen/emit_cuda.h"
#include "jit/cache.h"
#include "tj_config.h"
#if TJ_HAVE_CUDA
#include "jit/nvrtc.h"
#endif

tj_compile_options tj_compile_options_default(void)
{
    tj_compile_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    return o;
}

int tj_arch_parse(const char *s, int *archs, int max)
{
    int n = 0;
    if (!s) return -1;
    while (*s) {
        int v = 0, used = 0;
        if (sscanf(s, "sm_%d%n", &v, &used) != 1 || v < 50 || v > 200 || n >= max) return -1;
        s += used;
        if (*s == 'a') { /* arch-specific: sm_90a and later only */
            if (v < 90) return -1;
            v |= TJ_ARCH_SPECIFIC;
            s++;
        }
        archs[n++] = v;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

void tj_compile_report_destroy(tj_compile_report *r)
{
    if (!r) return;
    for (int64_t i = 0; i < r->count; i++)
        if (r->kernels[i].error && r->kernels[i].error[0]) free((char *)r->kernels[i].error);
    free(r->kernels);
    free(r->warnings);
    free(r);
}

#if TJ_HAVE_CUDA
static void take_warning(tj_cache *cache, tj_strbuf *sb)
{
    char *w = tj_cache_take_warning(cache);
    if (w) tj_sb_printf(sb, "%s%s", sb->len ? "\n" : "", w);
    free(w);
}

static tj_cache_use cache_use(tj_cache_result r)
{
    switch (r) {
    case TJ_CACHE_HIT: return TJ_CACHE_USE_HIT;
    case TJ_CACHE_MISS: return TJ_CACHE_USE_MISS;
    case TJ_CACHE_DISCARDED: return TJ_CACHE_USE_REBUILT;
    default: return TJ_CACHE_USE_OFF;
    }
}
#endif

tj_status tj_compile_pattern(const tj_pattern *p, const tj_compile_options *opt, tj_compile_report **out,
                             tj_error *err)
{
    if (!p || !out) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tj_compile_pattern: NULL pattern or output");
    *out = NULL;
    tj_compile_options o = tj_compile_options_default();
    if (opt && !tj_options_in(&o, sizeof o, opt))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tj_compile_options.size is %zu: start from tj_compile_options_default()",
                       opt->size);
#if !TJ_HAVE_CUDA
    return tj_fail(err, TJ_ERR_UNSUPPORTED, "this build has no NVRTC (CUDA toolkit not found at configure time)");
#else
    static const int sm90 = 90;
    const int *archs = o.narchs > 0 ? o.archs : &sm90;
    int narch = o.narchs > 0 ? o.narchs : 1;
    tj_cache *cache = NULL;
    tj_nvrtc_job *jobs = NULL;
    tj_cuda_config *cfgs = NULL;
    char **sources = NULL;
    int64_t *layer_of = NULL;
    int64_t nl = 0, njobs = 0;
    tj_compile_report *rep = NULL;
    tj_strbuf warn;
    tj_sb_init(&warn);
    tj_status s = TJ_OK;
    sources = calloc((size_t)p->nlayers + 1, sizeof *sources);
    cfgs = calloc((size_t)p->nlayers + 1, sizeof *cfgs);
    layer_of = calloc((size_t)p->nlayers + 1, sizeof *layer_of);
    jobs = calloc((size_t)(p->nlayers * narch) + 1, sizeof *jobs);
    rep = calloc(1, sizeof *rep);
    if (!sources || !cfgs || !jobs || !layer_of || !rep) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    if ((s = tj_cache_open(o.cache_dir, &cache, err)) != TJ_OK) goto done;
    take_warning(cache, &warn);

    double t0 = tj_now();
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        if (o.layer && strcmp(l->name, o.layer) != 0) continue;
        cfgs[nl] = tj_cuda_config_default(l);
        if (o.config_json && (s = tj_cuda_config_from_json(o.config_json, &cfgs[nl], err)) != TJ_OK) goto done;
        for (int a = 0; a < narch; a++) {
            int real = archs[a] & ~TJ_ARCH_SPECIFIC;
            s = tj_cuda_config_fits_arch(&cfgs[nl], real, tj_cuda_arch_smem_limit(real), NULL, err);
            if (s != TJ_OK) {
                tj_error_prefix(err, "layer '%s'", l->name);
                goto done;
            }
        }
        if ((s = tj_cuda_emit(l, &cfgs[nl], &sources[nl], err)) != TJ_OK) goto done;
        layer_of[nl] = i;
        for (int a = 0; a < narch; a++) {
            jobs[njobs].source = sources[nl];
            jobs[njobs].label = l->name;
            jobs[njobs].sm = tj_cuda_target_sm(&cfgs[nl], archs[a]); /* wgmma: sm_90a */
            njobs++;
        }
        nl++;
    }
    if (o.layer && nl == 0) {
        s = tj_fail(err, TJ_ERR_NOT_FOUND, "no layer named '%s'", o.layer);
        goto done;
    }
    rep->gen_s = tj_now() - t0;
    s = tj_nvrtc_compile_all(cache, jobs, njobs, o.threads, err);
    rep->wall_s = tj_now() - t0;
    rep->kernels = calloc((size_t)njobs + 1, sizeof *rep->kernels);
    if (!rep->kernels) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    rep->count = njobs;
    rep->layers = nl;
    int first_failure = 1;
    for (int64_t j = 0; j < njobs; j++) {
        const tj_nvrtc_job *jb = &jobs[j];
        const tj_layer *l = &p->layers[layer_of[j / narch]];
        tj_compiled *k = &rep->kernels[j];
        k->layer = l->name;
        k->n = l->n;
        k->k = l->k;
        k->sm = jb->sm; /* the target: sm_90a (the wgmma kernels, or asked for) keeps its flag */
        k->status = jb->status;
        k->error = "";
        k->registers = -1;
        k->smem_static = -1;
        if (jb->status != TJ_OK) {
            k->error = strdup(jb->error.msg);
            if (!k->error) k->error = "";
            if (first_failure) { /* the call's message: the first failure, with NVRTC's log */
                tj_fail(err, jb->status, "%s", jb->error.msg);
                first_failure = 0;
            }
            continue;
        }
        for (int q = 0; q < jb->result.nkernels; q++)
            if (strcmp(jb->result.kernels[q].name, "tj_tiles") == 0) {
                k->registers = jb->result.kernels[q].registers;
                k->smem_static = jb->result.kernels[q].smem_static;
            }
        k->seconds = jb->result.seconds;
        k->cache = cache_use(jb->result.cache);
        k->smem_dynamic = tj_cuda_smem_bytes(&cfgs[j / narch]);
        k->spill_bytes = jb->result.spill_bytes;
    }
    take_warning(cache, &warn);
done:
    if (rep) {
        rep->warnings = tj_sb_take(&warn);
        if (!rep->warnings) rep->warnings = calloc(1, 1);
    } else {
        tj_sb_free(&warn);
    }
    if (rep && rep->kernels) *out = rep;
    else tj_compile_report_destroy(rep);
    for (int64_t j = 0; jobs && j < njobs; j++) tj_cubin_free(&jobs[j].result);
    for (int64_t i = 0; sources && i < nl; i++) free(sources[i]);
    free(sources);
    free(cfgs);
    free(layer_of);
    free(jobs);
    tj_cache_close(cache);
    return s;
#endif
}
