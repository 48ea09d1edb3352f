/* Search spaces as data: per backend, a table of axes (the values each knob may take) and a
 * validity rule that drops impossible points before anything is built (the BLIS way: block
 * sizes are tables, not code). Also the analytic cost model that orders candidates. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "autotune/autotune.h"
#include "tj_config.h"
#include "gen/cpu_serial.h"
#include "gen/emit_cuda.h"
#if TJ_HAVE_LLVM
#include "gen/emit_llvm.h"
#endif

/* ---- CPU (gen/emit_llvm.h: mr, nr, offsets, unroll, mb, kc; vec resolved to the host's) --- */

static const int cpu_mr[] = {2, 4, 6, 8, 12, 14}; /* 16 was never competitive (bench/RESULTS.md) */
static const int cpu_nr[] = {16, 24, 32, 48, 64}; /* 24: AVX2 4 × 24 (3 ymm) */
static const char *const cpu_offsets[] = {"table", "unrolled"};
static const int cpu_unroll[] = {1, 4, 8};
static const int cpu_mb[] = {0, 32, 128}; /* tokens per work item; 0: the backend's ~96 */
static const int cpu_kc[] = {-1, 0, 384}; /* kept rows per k-block; -1: auto (the blocking table), 0: none */
static const int cpu_serial[] = {0, -1};  /* built-in small-call threshold, or always parallel */
static const char *const cpu_dtype[] = {"f32", "bf16"}; /* activations: bf16 only when asked for */
/* weight prefetch distance in bytes; -1: auto (the blocking table and host rules), 0: none */
static const int cpu_prefetch[] = {-1, 0, 2048};
/* Axis entries: the value count comes from the array itself (OMIT: the first value is left out
 * of the config JSON). */
#define AXIS_I(name, vals, omit) {name, (int)(sizeof vals / sizeof *vals), vals, NULL, omit}
#define AXIS_S(name, vals, omit) {name, (int)(sizeof vals / sizeof *vals), NULL, vals, omit}
enum { CPU_MR, CPU_NR, CPU_OFFSETS, CPU_UNROLL, CPU_MB, CPU_KC, CPU_SERIAL, CPU_DTYPE, CPU_PREFETCH, CPU_NAXES };
static const tj_tune_axis cpu_axes[CPU_NAXES] = {
    AXIS_I("mr", cpu_mr, 0),
    AXIS_I("nr", cpu_nr, 0),
    AXIS_S("offsets", cpu_offsets, 0),
    AXIS_I("unroll", cpu_unroll, 0),
    AXIS_I("mb", cpu_mb, 0),
    AXIS_I("kc", cpu_kc, 1),
    AXIS_I("serial", cpu_serial, 1),
    AXIS_S("dtype", cpu_dtype, 1),
    AXIS_I("prefetch", cpu_prefetch, 1),
};

/* The backend's built-in default must be a point of the space (the adaptive search measures it
 * first, so a tuned config is never slower than the default as measured). With LLVM it comes
 * from tj_cpu_config_default_vec() for the space's vector width; the values below mirror it
 * for builds without. */
static void cpu_default(const tj_tune_host *h, int v[CPU_NAXES])
{
    int vec = h->vec > 0 ? h->vec : 16;
#if TJ_HAVE_LLVM
    tj_cpu_config d = tj_cpu_config_default_vec(vec);
    int dv[CPU_NAXES] = {d.mr, d.nr, d.offsets == TJ_CPU_OFFSETS_UNROLLED, d.unroll, d.mb, d.kc, d.serial, 0 /* f32 */,
                         d.prefetch};
#else
    int dv[CPU_NAXES] = {vec <= 8 ? 4 : 6, vec == 16 ? 64 : vec == 8 ? 24 : 2 * vec, 0 /* table */, 4, 0, -1, 0, 0 /* f32 */,
                         -1 /* prefetch auto */};
#endif
    memcpy(v, dv, sizeof dv);
}

/* ---- CUDA (gen/emit_cuda.h: template, bm, bn, bk, warps, stages, offsets) ----------------- */

static const char *const cuda_template[] = {"mma", "simt", "wgmma"};
static const int cuda_bm[] = {32, 64, 128};
static const int cuda_bn[] = {32, 64, 128};
static const int cuda_bk[] = {16, 32, 64};
static const int cuda_warps[] = {2, 4, 8};
static const int cuda_stages[] = {2, 3, 4};
/* Only table offsets: `unrolled` (still accepted in a config, for comparison) reaches its
 * immediates through a call returning a struct (a 72-byte stack frame) and a longer main loop
 * (9.9 vs 4.1 SASS instructions per HMMA, BERT fc1 at 75 %, sm_80): nothing to search for. */
static const char *const cuda_offsets[] = {"table"};
enum { CU_TEMPLATE, CU_BM, CU_BN, CU_BK, CU_WARPS, CU_STAGES, CU_OFFSETS, CU_NAXES };
static const tj_tune_axis cuda_axes[CU_NAXES] = {
    AXIS_S("template", cuda_template, 0),
    AXIS_I("bm", cuda_bm, 0),
    AXIS_I("bn", cuda_bn, 0),
    AXIS_I("bk", cuda_bk, 0),
    AXIS_I("warps", cuda_warps, 0),
    AXIS_I("stages", cuda_stages, 0),
    AXIS_S("offsets", cuda_offsets, 0),
};

static int ival(const tj_tune_axis *axes, const int *p, int a) { return axes[a].ivals[p[a]]; }
static const char *sval(const tj_tune_axis *axes, const int *p, int a) { return axes[a].svals[p[a]]; }

/* The emitter's own rules have the last word (warp split of mma tiles, accumulators, simt
 * feature groups): a point it would refuse never reaches NVRTC. */
static const char *cuda_emitter_check(const tj_tune_axis *axes, const int *p)
{
    static _Thread_local tj_error e;
    tj_cuda_config c;
    memset(&c, 0, sizeof c);
    const char *t = sval(axes, p, CU_TEMPLATE);
    c.tmpl = strcmp(t, "mma") == 0 ? TJ_CUDA_TEMPLATE_MMA : strcmp(t, "wgmma") == 0 ? TJ_CUDA_TEMPLATE_WGMMA : TJ_CUDA_TEMPLATE_SIMT;
    c.bm = ival(axes, p, CU_BM);
    c.bn = ival(axes, p, CU_BN);
    c.bk = ival(axes, p, CU_BK);
    c.warps = ival(axes, p, CU_WARPS);
    c.stages = c.tmpl != TJ_CUDA_TEMPLATE_SIMT ? ival(axes, p, CU_STAGES) : 1;
    c.offsets = strcmp(sval(axes, p, CU_OFFSETS), "unrolled") == 0 ? TJ_CUDA_OFFSETS_UNROLLED : TJ_CUDA_OFFSETS_TABLE;
    c.dtype = TJ_F16;
    c.out = TJ_F32;
    c.x_fm = c.y_fm = 1;
    return tj_cuda_config_check(&c, &e) == TJ_OK ? "" : e.msg;
}

void tj_tune_host_for(const char *backend, const char *arch, const tj_layer *l, tj_tune_host *out)
{
    memset(out, 0, sizeof *out);
    out->g = l ? l->g : 128;
    out->kept_rows = l && l->tile_ptr ? l->tile_ptr[l->ntiles] : 0;
    out->kept = l && l->tile_ptr ? tj_layer_kept(l) : 0;
    if (backend && strcmp(backend, "cuda") == 0) {
        int sm = 90;
        if (arch && sscanf(arch, "sm_%d", &sm) != 1) sm = 90;
        out->sm = sm;
        out->smem_max = tj_cuda_arch_smem_limit(sm);
        out->regs_max = 255;
        return;
    }
    tj_tune_target t;
    tj_tune_host_target(&t);
    const char *isa = strrchr(t.arch, '-');
    out->vec = isa && strcmp(isa, "-avx512") == 0 ? 16 : isa && strcmp(isa, "-avx2") == 0 ? 8 : 4;
    out->vregs = out->vec == 16 ? 32 : 16;
}

const char *tj_tune_space_why_invalid(const char *backend, const tj_tune_host *h,
                                      const tj_tune_axis *axes, const int *p)
{
    static _Thread_local char why[160];
    if (strcmp(backend, "cpu") == 0) {
        int mr = ival(axes, p, CPU_MR), nr = ival(axes, p, CPU_NR), vec = h->vec > 0 ? h->vec : 16;
        if (nr % vec) return snprintf(why, sizeof why, "nr %d is not a multiple of the vector width %d", nr, vec), why;
        int nv = nr / vec, regs = h->vregs > 0 ? h->vregs : 32;
        /* accumulators + one row of weight vectors + the broadcast (tj_cpu_config_check's rule) */
        if (mr * nv + nv + 1 > regs)
            return snprintf(why, sizeof why, "mr %d x nr %d needs %d vector registers of %d", mr, nr, mr * nv + nv + 1,
                            regs), why;
        /* always parallel differs from the built-in only where some tuned M runs serially */
        if (ival(axes, p, CPU_SERIAL) < 0 && (h->min_m <= 0 || !tj_cpu_serial_call(0, h->min_m, h->kept)))
            return "serial -1: no tuned M is under the built-in serial threshold";
        /* the prefetch distance moved decode-sized calls only (bench/RESULTS.md, issue 25, round 10) */
        if (ival(axes, p, CPU_PREFETCH) >= 0 && (h->min_m <= 0 || h->min_m > 16))
            return "prefetch: only decode-sized calls (a tuned M ≤ 16) depend on the weight prefetch";
        if (strcmp(sval(axes, p, CPU_DTYPE), "bf16") == 0) {
            if (!h->act_bf16) return "dtype bf16: the activations are fp32 (tune with bf16 activations to search it)";
            if (strcmp(sval(axes, p, CPU_OFFSETS), "unrolled") == 0) return "dtype bf16 stages X: table offsets only";
            if (ival(axes, p, CPU_KC) != -1) return "dtype bf16 runs whole tiles: kc is ignored";
        }
        if (strcmp(sval(axes, p, CPU_OFFSETS), "unrolled") == 0) {
            if (ival(axes, p, CPU_KC) != -1) return "kc (k-blocking) applies to table offsets only";
            if (ival(axes, p, CPU_UNROLL) == 1) return "unrolled offsets: 1 row per chunk makes one basic block per kept row";
            int64_t instr = h->kept_rows * (nv + mr + mr * nv);
            if (instr > TJ_TUNE_UNROLLED_MAX_INSTR)
                return snprintf(why, sizeof why, "unrolled offsets: %lld straight-line instructions (limit %d) take too long to compile",
                                (long long)instr, TJ_TUNE_UNROLLED_MAX_INSTR), why;
        }
        return "";
    }
    if (strcmp(backend, "cuda") == 0) {
        int mma = strcmp(sval(axes, p, CU_TEMPLATE), "mma") == 0;
        int bm = ival(axes, p, CU_BM), bn = ival(axes, p, CU_BN), bk = ival(axes, p, CU_BK);
        int warps = ival(axes, p, CU_WARPS), stages = ival(axes, p, CU_STAGES), threads = 32 * warps;
        if (bn > h->g || h->g % bn) return snprintf(why, sizeof why, "bn %d does not divide the tile width g %lld", bn,
                                                    (long long)h->g), why;
        if (strcmp(sval(axes, p, CU_TEMPLATE), "wgmma") == 0) {
            /* wgmma.mma_async (sm_90a): compute capability 9.0 only; one warpgroup, 64 features */
            if (h->sm != 90) return "wgmma: needs compute capability 9.0 (sm_90a)";
            if (bn != 64 || warps != 4) return "wgmma: bn 64 and 4 warps (one warpgroup) only";
            int64_t smem = (int64_t)stages * bk * 128 * (1 + bm / 64) + 2048; /* tj_cuda_smem_bytes */
            if (smem > h->smem_max) return "wgmma: shared memory exceeds the arch's";
            return cuda_emitter_check(axes, p);
        }
        if (!mma) {
            /* simt ignores stages; keep one point per (bm, bn, bk, warps, offsets) */
            if (stages != cuda_stages[0]) return "simt has no pipeline: stages is ignored";
            if (bm > threads) return "simt: bm exceeds the block's threads";
            int fg = threads / bm; /* feature groups */
            if (bn % fg || bn / fg > 64) return "simt: bn is not a multiple of threads / bm, or more than 64 per thread";
            return cuda_emitter_check(axes, p);
        }
        /* mma.sync m16n8k16: warps split into warps_n x warps_m with warp tiles that are multiples
         * of 16 features x 8 tokens (tj_cuda_warp_split's rule, simplified to what is checkable
         * as data: every warp gets at least one 16 x 16 fragment) */
        if ((bm / 16) * (bn / 16) < warps) return "mma: fewer 16x16 fragments than warps";
        int64_t smem = (int64_t)stages * bk * ((bn + 8) + (bm + 8)) * 2; /* tj_cuda_smem_bytes */
        if (smem > h->smem_max)
            return snprintf(why, sizeof why, "mma: %lld bytes of shared memory exceed the %lld of sm_%d", (long long)smem,
                            (long long)h->smem_max, h->sm), why;
        int acc = bm * bn / threads; /* fp32 accumulators per thread */
        if (acc > 128) return snprintf(why, sizeof why, "mma: %d accumulators per thread exceed 128", acc), why;
        if (acc + 2 * (bk / 8) + 40 > h->regs_max) return "mma: register estimate exceeds the per-thread limit";
        if (stages > 2 && h->sm < 80) return "mma: cp.async pipelines need sm_80 or newer";
        return cuda_emitter_check(axes, p);
    }
    return "";
}

static char *point_json(const tj_tune_axis *axes, int naxes, const int *p)
{
    json_t *o = json_object();
    for (int a = 0; o && a < naxes; a++)
        if (!(axes[a].omit_first && p[a] == 0))
            json_object_set_new(o, axes[a].name, axes[a].ivals ? json_integer(axes[a].ivals[p[a]])
                                                           : json_string(axes[a].svals[p[a]]));
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    return s;
}

static tj_status space_alloc(tj_tune_space *s, int64_t n, int naxes, tj_error *err)
{
    s->json = calloc((size_t)(n ? n : 1), sizeof *s->json);
    s->points = naxes ? calloc((size_t)(n ? n : 1) * (size_t)naxes, sizeof *s->points) : NULL;
    if (!s->json || (naxes && !s->points)) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    return TJ_OK;
}

tj_status tj_tune_space_build(const char *backend, const tj_tune_host *h, tj_tune_space *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    out->default_index = -1;
    snprintf(out->backend, sizeof out->backend, "%s", backend);
    if (strcmp(backend, "reference") == 0) {
        TJ_TRY(space_alloc(out, 1, 0, err));
        if (!(out->json[0] = strdup("{}"))) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        out->count = 1;
        out->default_index = 0;
        return TJ_OK;
    }
    const tj_tune_axis *axes;
    int naxes;
    if (strcmp(backend, "cpu") == 0) {
        axes = cpu_axes;
        naxes = CPU_NAXES;
    } else if (strcmp(backend, "cuda") == 0) {
        axes = cuda_axes;
        naxes = CU_NAXES;
    } else {
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "no search space for backend '%s' (cpu, cuda, reference)", backend);
    }
    int64_t total = 1;
    for (int a = 0; a < naxes; a++) total *= axes[a].nvals;
    out->axes = axes;
    out->naxes = naxes;
    TJ_TRY(space_alloc(out, total, naxes, err));
    int p[16] = {0}, def[CPU_NAXES];
    cpu_default(h, def);
    for (int64_t i = 0; i < total; i++) {
        /* mixed-radix counter, last axis fastest: the canonical order */
        int64_t r = i;
        for (int a = naxes - 1; a >= 0; a--) {
            p[a] = (int)(r % axes[a].nvals);
            r /= axes[a].nvals;
        }
        if (*tj_tune_space_why_invalid(backend, h, axes, p)) {
            out->dropped++;
            continue;
        }
        int64_t k = out->count;
        memcpy(out->points + k * naxes, p, (size_t)naxes * sizeof *p);
        if (!(out->json[k] = point_json(axes, naxes, p))) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        int is_default = axes == cpu_axes;
        for (int a = 0; is_default && a < naxes; a++)
            is_default = !axes[a].ivals ? p[a] == def[a] : axes[a].ivals[p[a]] == def[a];
        if (is_default) out->default_index = k;
        out->count++;
    }
    return TJ_OK;
}

tj_status tj_tune_space_from_list(const char *backend, const char *json_array, tj_tune_space *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    out->default_index = -1;
    snprintf(out->backend, sizeof out->backend, "%s", backend);
    json_error_t je;
    json_t *a = json_loads(json_array, 0, &je);
    if (!a || !json_is_array(a) || json_array_size(a) == 0) {
        json_decref(a);
        return tj_fail(err, TJ_ERR_FORMAT, "configs: expected a non-empty JSON array of objects (%s)",
                       a ? "not an array" : je.text);
    }
    tj_status s = space_alloc(out, (int64_t)json_array_size(a), 0, err);
    for (size_t i = 0; s == TJ_OK && i < json_array_size(a); i++) {
        json_t *c = json_array_get(a, i);
        if (!json_is_object(c)) {
            s = tj_fail(err, TJ_ERR_FORMAT, "configs[%zu]: not a JSON object", i);
            break;
        }
        char *txt = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
        if (!txt) s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        for (int64_t j = 0; s == TJ_OK && j < out->count; j++)
            if (strcmp(out->json[j], txt) == 0) s = tj_fail(err, TJ_ERR_FORMAT, "configs[%zu]: duplicate of configs[%lld]", i, (long long)j);
        if (s != TJ_OK) {
            free(txt);
            break;
        }
        if (strcmp(txt, "{}") == 0) out->default_index = out->count;
        out->json[out->count++] = txt;
    }
    json_decref(a);
    return s;
}

void tj_tune_space_free(tj_tune_space *s)
{
    if (!s) return;
    for (int64_t i = 0; s->json && i < s->count; i++) free(s->json[i]);
    free(s->json);
    free(s->points);
    memset(s, 0, sizeof *s);
}

int64_t tj_tune_space_neighbours(const tj_tune_space *s, int64_t i, int64_t *out, int64_t max)
{
    if (!s->points) return 0;
    const int *p = s->points + i * s->naxes;
    int64_t n = 0;
    for (int64_t j = 0; j < s->count && n < max; j++) {
        const int *q = s->points + j * s->naxes;
        int diff = 0;
        for (int a = 0; a < s->naxes && diff < 2; a++) diff += p[a] != q[a];
        if (diff == 1) out[n++] = j;
    }
    return n;
}

/* The CPU model: cycles of the inner loop per kept row and register block, times the blocks,
 * with the waste of padding (nr vs the tile width, mr vs M), load imbalance across threads and
 * the loop overhead that unrolling removes. Crude, but it ranks the big effects right. */
static double cpu_cost(const tj_tune_space *s, const tj_tune_host *h, const int *p, const tj_tune_workload *w,
                       int threads)
{
    const tj_tune_axis *ax = s->axes;
    int mr = ival(ax, p, CPU_MR), nr = ival(ax, p, CPU_NR), unroll = ival(ax, p, CPU_UNROLL);
    int mb = ival(ax, p, CPU_MB), vec = h->vec > 0 ? h->vec : 16, nv = nr / vec;
    int unrolled = strcmp(sval(ax, p, CPU_OFFSETS), "unrolled") == 0;
    double m = (double)(w->m > 0 ? w->m : 1), g = (double)(w->g > 0 ? w->g : 128);
    /* per kept row of a block: mr·nv FMAs on 2 ports, nv loads + mr broadcasts on 2 ports,
     * and the FMA latency (4 cycles × 2 ports) that needs ≥ 8 independent accumulators */
    double fma = mr * nv / 2.0, ld = (nv + mr) / 2.0, lat = 4.0 * (mr * nv < 8 ? 8.0 / (mr * nv) : 1.0);
    double cyc = fmax(fmax(fma, ld), lat * mr * nv / 8.0);
    cyc += unrolled ? 0.0 : (1.0 + 2.0 / unroll) / 2.0; /* offset load + loop control */
    if (unrolled) cyc += 0.05 * (double)mr * nv;       /* instruction-cache pressure of long code */
    double pad_n = ceil(g / nr) * nr / g, pad_m = ceil(m / mr) * mr / m;
    double per_flop = cyc / (mr * nr);                  /* cycles per useful multiply-add */
    double chunk = mb > 0 ? ceil((double)mb / mr) * mr : mr * floor((96.0 + mr / 2) / mr);
    double tiles = w->n > 0 ? ceil((double)w->n / g) : 1;
    double items = tiles * ceil(m / chunk), t = threads > 0 ? threads : 1;
    double balance = ceil(items / t) * t / items;
    return per_flop * pad_n * pad_m * balance * (double)w->kept * m;
}

/* A CUDA placeholder model: tokens padded to bm, features to bn, occupancy from shared memory. */
static double cuda_cost(const tj_tune_space *s, const tj_tune_host *h, const int *p, const tj_tune_workload *w)
{
    const tj_tune_axis *ax = s->axes;
    double bm = ival(ax, p, CU_BM), bn = ival(ax, p, CU_BN), bk = ival(ax, p, CU_BK);
    double m = (double)(w->m > 0 ? w->m : 1), g = (double)(w->g > 0 ? w->g : 128);
    double pad = ceil(m / bm) * bm / m * ceil(g / bn) * bn / g;
    double simt = strcmp(sval(ax, p, CU_TEMPLATE), "simt") == 0 ? 8.0 : 1.0;
    double smem = (double)ival(ax, p, CU_STAGES) * bk * (bm + bn + 16) * 2;
    double occ = fmin(1.0, (double)(h->smem_max > 0 ? h->smem_max : 99 * 1024) / (2 * smem + 1));
    return pad * simt / (0.5 + 0.5 * occ) * (double)w->kept * m / (bm * bn / (bm + bn));
}

double tj_tune_model_cost(const tj_tune_space *s, const tj_tune_host *h, int64_t i, const tj_tune_workload *w,
                          int threads)
{
    if (!s->points) return (double)i; /* a list: keep its order */
    const int *p = s->points + i * s->naxes;
    if (s->axes == cpu_axes) return cpu_cost(s, h, p, w, threads);
    if (s->axes == cuda_axes) return cuda_cost(s, h, p, w);
    return (double)i;
}
