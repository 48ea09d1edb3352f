/* Stage 4 (GPU) of parse → validate → plan → emit: fills the CUDA C templates of templates/ from a
 * layer, its plan and a tj_cuda_config. Also the config's JSON form, the launch geometry and the
 * host-side packing of the kernel ABI (gen/emit_cuda.h). */
#include "gen/emit_cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "templates/embedded.h"
#include "tj_config.h"

/* Unrolled offsets: chunks per generated function (bounds one function's size; NVRTC's time grows
 * faster than linearly with it), and __constant__ budget before tables move to global memory. */
#define UNROLL_CHUNKS_PER_FN 64
#define CONST_ITEMS_MAX 32768
#define CONST_TOTAL_MAX (65536 - 2048)

static int is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

static int pow2_ceil(int64_t v)
{
    int p = 1;
    while (p < v && p < (1 << 30)) p <<= 1;
    return p;
}

/* The templates, in tj_cuda_template order: the one table the config parser, the config writer
 * and `tilejit gen --help` (tj_gen_cuda_template) read. */
static const struct {
    const char *name, *what;
} templates[] = {
    [TJ_CUDA_TEMPLATE_SIMT] = {"simt", "plainly correct fp32 SIMT math, the GPU yardstick (sm_80 and later)"},
    [TJ_CUDA_TEMPLATE_MMA] = {"mma", "tensor cores: mma.sync m16n8k16 fed by ldmatrix, a cp.async multi-stage "
                                     "pipeline (sm_80 and later; the default)"},
    [TJ_CUDA_TEMPLATE_WGMMA] = {"wgmma", "Hopper: wgmma m64nNk16 from swizzled shared memory, an mbarrier and "
                                         "cp.async.bulk pipeline; sm_90a only, bn 64, 4 warps, bm 64 or 128, "
                                         "feature-major x"},
};
#define NTEMPLATES ((int)(sizeof templates / sizeof *templates))

static const char *template_name(tj_cuda_template t) { return templates[t].name; }

const char *tj_gen_cuda_template(int i, const char **what)
{
    if (i < 0 || i >= NTEMPLATES) return NULL;
    if (what) *what = templates[i].what;
    return templates[i].name;
}
static const char *offsets_name(tj_cuda_offsets o) { return o == TJ_CUDA_OFFSETS_UNROLLED ? "unrolled" : "table"; }
static const char *dtype_json(tj_dtype d) { return d == TJ_F32 ? "f32" : d == TJ_F16 ? "f16" : "bf16"; }

static const char *layout_name(const tj_cuda_config *c)
{
    if (c->x_fm && c->y_fm) return "fm";
    if (!c->x_fm && !c->y_fm) return "rm";
    return c->x_fm ? "fm_rm" : "rm_fm";
}

tj_cuda_config tj_cuda_config_default(const tj_layer *l)
{
    tj_cuda_config c;
    memset(&c, 0, sizeof c);
    c.tmpl = TJ_CUDA_TEMPLATE_MMA;
    c.bm = 128;
    int64_t g = l ? l->g : 128;
    c.bn = pow2_ceil(g < 16 ? 16 : g > 128 ? 128 : g);
    c.bk = 32;
    c.warps = c.bn >= 64 ? 8 : 4;
    c.stages = 3;
    c.offsets = TJ_CUDA_OFFSETS_TABLE;
    c.dtype = TJ_F16;
    c.out = TJ_F32;
    c.x_fm = c.y_fm = 1;
    return c;
}

void tj_cuda_warp_split(const tj_cuda_config *c, int *warps_n, int *warps_m)
{
    int best_n = 0, best_m = 0, best_d = -1;
    if (c->tmpl == TJ_CUDA_TEMPLATE_MMA && is_pow2(c->warps)) {
        for (int wn = 1; wn <= c->warps; wn *= 2) {
            int wm = c->warps / wn;
            if (c->bn % (16 * wn) || c->bm % (16 * wm)) continue;
            int a = c->bn / wn, b = c->bm / wm, d = a > b ? a - b : b - a;
            if (best_d < 0 || d <= best_d) { best_d = d; best_n = wn; best_m = wm; }
        }
    }
    *warps_n = best_n;
    *warps_m = best_m;
}

int64_t tj_cuda_smem_bytes(const tj_cuda_config *c)
{
    if (c->tmpl == TJ_CUDA_TEMPLATE_WGMMA) /* stages of 128-byte lines, mbarriers, 1024-byte alignment slack */
        return (int64_t)c->stages * c->bk * 128 * (1 + c->bm / 64) + 2048;
    if (c->tmpl != TJ_CUDA_TEMPLATE_MMA) return 0;
    return (int64_t)c->stages * c->bk * ((c->bn + 8) + (c->bm + 8)) * 2;
}

int64_t tj_cuda_arch_smem_limit(int sm)
{
    switch (sm) {
    case 80: case 87: return 163 * 1024;
    case 86: case 89: return 99 * 1024;
    case 90: case 100: return 227 * 1024;
    default: return 99 * 1024;
    }
}

tj_status tj_cuda_config_fits_arch(const tj_cuda_config *c, int sm, int64_t smem_limit, const char *target,
                                   tj_error *err)
{
    if (c->tmpl == TJ_CUDA_TEMPLATE_WGMMA && sm != 90)
        return target ? tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                                "cuda config: the wgmma kernel needs compute capability 9.0 (sm_90a); %s is sm_%d", target, sm)
                      : tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                                "cuda config: the wgmma kernel needs compute capability 9.0 (sm_90a), not sm_%d", sm);
    char arch[16];
    if (!target) target = tj_cuda_arch_name(sm, arch);
    if (tj_cuda_smem_bytes(c) > smem_limit)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "cuda config needs %lld bytes of shared memory per block; %s allows %lld (fewer stages or a smaller bk)",
                       (long long)tj_cuda_smem_bytes(c), target, (long long)smem_limit);
    return TJ_OK;
}

tj_status tj_cuda_config_check(const tj_cuda_config *c, tj_error *err)
{
    if (c->dtype != TJ_F16 && c->dtype != TJ_BF16)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config: dtype must be f16 or bf16");
    if (c->bk != 16 && c->bk != 32 && c->bk != 64)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config: bk %d must be 16, 32 or 64", c->bk);
    if (!is_pow2(c->warps) || c->warps > 16)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config: warps %d must be 1, 2, 4, 8 or 16", c->warps);
    if (!is_pow2(c->bn) || c->bn < 16 || c->bn > 256)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config: bn %d must be a power of 2 in [16, 256]", c->bn);
    int threads = 32 * c->warps;
    if (c->tmpl == TJ_CUDA_TEMPLATE_MMA) {
        if (!is_pow2(c->bm) || c->bm < 16 || c->bm > 256)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config (mma): bm %d must be a power of 2 in [16, 256]", c->bm);
        if (c->stages < 2 || c->stages > 6)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config (mma): stages %d must be in [2, 6]", c->stages);
        int wn, wm;
        tj_cuda_warp_split(c, &wn, &wm);
        if (!wn)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                           "cuda config (mma): %d warps cannot split %d features x %d tokens into warp tiles of multiples of 16",
                           c->warps, c->bn, c->bm);
        int acc = (c->bn / wn / 16) * (c->bm / wm / 8) * 4;
        if (acc > 128)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                           "cuda config (mma): %d accumulators per thread (bn %d x bm %d over %d warps) exceed 128; use more warps",
                           acc, c->bn, c->bm, c->warps);
        if (threads < c->bm / 8)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config (mma): bm %d needs at least %d threads", c->bm, c->bm / 8);
    } else if (c->tmpl == TJ_CUDA_TEMPLATE_WGMMA) {
        if (c->bn != 64 || c->warps != 4)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config (wgmma): bn must be 64 and warps 4 (one warpgroup)");
        if (c->bm != 64 && c->bm != 128)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config (wgmma): bm %d must be 64 or 128", c->bm);
        if (c->stages < 2 || c->stages > 6)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config (wgmma): stages %d must be in [2, 6]", c->stages);
        if (!c->x_fm)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config (wgmma): x must be feature-major (layout fm or fm_rm)");
    } else if (c->tmpl == TJ_CUDA_TEMPLATE_SIMT) {
        if (!is_pow2(c->bm) || c->bm > threads)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config (simt): bm %d must be a power of 2 <= %d threads", c->bm, threads);
        int fg = threads / c->bm;
        if (c->bn % fg || c->bn / fg > 64)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                           "cuda config (simt): bn %d must be a multiple of %d (threads / bm) and at most 64 of them", c->bn, fg);
    } else {
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config: unknown template %d", (int)c->tmpl);
    }
    return TJ_OK;
}

void tj_cuda_config_to_json(const tj_cuda_config *c, tj_strbuf *sb)
{
    tj_sb_printf(sb,
                 "{\"template\":\"%s\",\"bm\":%d,\"bn\":%d,\"bk\":%d,\"warps\":%d,\"stages\":%d,"
                 "\"offsets\":\"%s\",\"dtype\":\"%s\",\"out\":\"%s\",\"layout\":\"%s\"}",
                 template_name(c->tmpl), c->bm, c->bn, c->bk, c->warps, c->stages, offsets_name(c->offsets),
                 dtype_json(c->dtype), dtype_json(c->out), layout_name(c));
}

static tj_status json_int(json_t *v, const char *key, int *out, tj_error *err)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 4096)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config: '%s' must be an integer in [0, 4096]", key);
    *out = (int)json_integer_value(v);
    return TJ_OK;
}

static tj_status json_enum(json_t *v, const char *key, const char *const *names, int nnames, int *out, tj_error *err)
{
    const char *s = json_string_value(v);
    for (int i = 0; s && i < nnames; i++)
        if (strcmp(s, names[i]) == 0) { *out = i; return TJ_OK; }
    tj_strbuf sb;
    tj_sb_init(&sb);
    for (int i = 0; i < nnames; i++) tj_sb_printf(&sb, "%s%s", i ? ", " : "", names[i]);
    tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config: '%s' is %s%s%s; expected one of %s", key, s ? "'" : "",
            s ? s : "not a string", s ? "'" : "", sb.data ? sb.data : "");
    tj_sb_free(&sb);
    return TJ_ERR_INVALID_ARGUMENT;
}

tj_status tj_cuda_config_from_json(const char *text, tj_cuda_config *c, tj_error *err)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config: bad JSON at line %d column %d: %s", je.line, je.column, je.text);
    tj_status st = TJ_OK;
    if (!json_is_object(root)) {
        st = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cuda config: expected a JSON object");
        goto done;
    }
    const char *tnames[NTEMPLATES];
    for (int i = 0; i < NTEMPLATES; i++) tnames[i] = templates[i].name;
    static const char *const offsets[] = {"table", "unrolled"};
    static const char *const dtypes[] = {"f32", "f16", "bf16"};
    static const char *const layouts[] = {"fm", "rm", "rm_fm", "fm_rm"};
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int e = 0;
        if (strcmp(key, "template") == 0) { if ((st = json_enum(v, key, tnames, NTEMPLATES, &e, err))) goto done; c->tmpl = (tj_cuda_template)e; }
        else if (strcmp(key, "bm") == 0) st = json_int(v, key, &c->bm, err);
        else if (strcmp(key, "bn") == 0) st = json_int(v, key, &c->bn, err);
        else if (strcmp(key, "bk") == 0) st = json_int(v, key, &c->bk, err);
        else if (strcmp(key, "warps") == 0) st = json_int(v, key, &c->warps, err);
        else if (strcmp(key, "stages") == 0) st = json_int(v, key, &c->stages, err);
        else if (strcmp(key, "offsets") == 0) { if ((st = json_enum(v, key, offsets, 2, &e, err))) goto done; c->offsets = (tj_cuda_offsets)e; }
        else if (strcmp(key, "dtype") == 0) { if ((st = json_enum(v, key, dtypes + 1, 2, &e, err))) goto done; c->dtype = (tj_dtype)(e + 1); }
        else if (strcmp(key, "out") == 0) { if ((st = json_enum(v, key, dtypes, 3, &e, err))) goto done; c->out = (tj_dtype)e; }
        else if (strcmp(key, "layout") == 0) {
            if ((st = json_enum(v, key, layouts, 4, &e, err))) goto done;
            c->x_fm = e == 0 || e == 3;
            c->y_fm = e == 0 || e == 2;
        } else {
            st = tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                         "cuda config: unknown key '%s' (template, bm, bn, bk, warps, stages, offsets, dtype, out, layout)", key);
        }
        if (st) goto done;
    }
    st = tj_cuda_config_check(c, err);
done:
    json_decref(root);
    return st;
}

/* ---- layout: the items and packed kept-row words baked into the module ---- */

void tj_cuda_layout_free(tj_cuda_layout *lay)
{
    if (!lay) return;
    free(lay->items);
    free(lay->words);
    free(lay->bases);
    memset(lay, 0, sizeof *lay);
}

/* qsort order of work items: more kept rows first, then tile order (cbase; empty tiles share one),
 * then the first feature (unique): a total order, so the table is deterministic. */
static int item_heavier(const void *pa, const void *pb)
{
    const tj_cuda_item *a = pa, *b = pb;
    if (a->nrows != b->nrows) return a->nrows > b->nrows ? -1 : 1;
    if (a->cbase != b->cbase) return a->cbase < b->cbase ? -1 : 1;
    return (a->fbase > b->fbase) - (a->fbase < b->fbase);
}

tj_status tj_cuda_layout_build(const tj_layer *l, const tj_plan *p, const tj_cuda_config *c,
                               tj_cuda_layout *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    out->ofs_bits = l->k <= 65536 ? 16 : 32;
    out->words_per_chunk = c->bk / (64 / out->ofs_bits);
    int64_t nitems = 0, nchunks = 0;
    for (int64_t t = 0; t < l->ntiles; t++) {
        nitems += (tj_tile_width(l, t) + c->bn - 1) / c->bn;
        nchunks += (tj_tile_nrows(l, t) + c->bk - 1) / c->bk;
    }
    if (nitems > INT32_MAX / 2 || nchunks > INT32_MAX / 64 || l->ncols > INT32_MAX)
        return tj_fail(err, TJ_ERR_UNSUPPORTED, "layer '%s': too many tiles for the CUDA kernels", l->name);
    out->items = calloc((size_t)(nitems ? nitems : 1), sizeof *out->items);
    out->words = calloc((size_t)(nchunks ? nchunks : 1) * (size_t)out->words_per_chunk, sizeof *out->words);
    out->bases = malloc((size_t)(nchunks ? nchunks : 1) * sizeof *out->bases);
    if (!out->items || !out->words || !out->bases) {
        tj_cuda_layout_free(out);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory emitting CUDA", l->name);
    }
    int per = 64 / out->ofs_bits;
    int64_t ii = 0, cc = 0;
    for (int64_t oi = 0; oi < l->ntiles; oi++) {
        int64_t t = p->order[oi];
        int64_t nr = tj_tile_nrows(l, t), tw = tj_tile_width(l, t);
        const int32_t *rows = l->tile_rows + l->tile_ptr[t];
        for (int64_t part = 0; part * c->bn < tw; part++) {
            tj_cuda_item *it = &out->items[ii++];
            it->wofs = p->off[t];
            it->ld = (int32_t)p->ld[t];
            it->nrows = (int32_t)nr;
            it->fbase = (int32_t)(t * l->g + part * c->bn);
            it->width = (int32_t)(tw - part * c->bn < c->bn ? tw - part * c->bn : c->bn);
            it->wcol = (int32_t)(part * c->bn);
            it->cbase = (int32_t)cc;
            it->tile = (int32_t)t;
        }
        for (int64_t r0 = 0; r0 < nr; r0 += c->bk) {
            int64_t chunk = cc + r0 / c->bk, n = nr - r0 < c->bk ? nr - r0 : c->bk;
            uint64_t *w = &out->words[chunk * out->words_per_chunk];
            /* Rows increase: the span is last - first. */
            int narrow = c->offsets == TJ_CUDA_OFFSETS_UNROLLED && rows[r0 + n - 1] - rows[r0] < 256;
            out->bases[chunk] = narrow ? (uint32_t)rows[r0] : TJ_CUDA_OFS_WIDE;
            for (int64_t lr = 0; lr < n; lr++) {
                if (narrow) w[lr / 8] |= (uint64_t)(uint32_t)(rows[r0 + lr] - rows[r0]) << (8 * (lr % 8));
                else w[lr / per] |= (uint64_t)(uint32_t)rows[r0 + lr] << ((lr % per) * out->ofs_bits);
            }
        }
        cc += (nr + c->bk - 1) / c->bk;
    }
    /* Heaviest first by item, not by tile: an item's cost is its chunks (all BN features are
     * computed whatever its width), so a narrow tile with many rows goes before a wide one with
     * fewer. Ties keep tile order. This table is the persistent grid's static schedule. */
    qsort(out->items, (size_t)nitems, sizeof *out->items, item_heavier);
    out->nitems = nitems;
    out->nchunks = nchunks;
    return TJ_OK;
}

/* ---- geometry ---- */

static int64_t count_ew_rows(const tj_layer *l)
{
    int64_t rows = 0;
    if (l->ew_indptr)
        for (int64_t n = 0; n < l->n; n++) rows += l->ew_indptr[n + 1] > l->ew_indptr[n];
    return rows;
}

static int64_t count_items(const tj_layer *l, int bn)
{
    int64_t items = 0;
    for (int64_t t = 0; t < l->ntiles; t++) items += (tj_tile_width(l, t) + bn - 1) / bn;
    return items;
}

static tj_status add_launch(tj_cuda_launch *o, const char *kernel, int64_t blocks, int threads, int64_t smem,
                            tj_error *err)
{
    if (blocks > INT32_MAX)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: %lld blocks exceed the grid limit; use a larger bm or fewer tokens",
                       kernel, (long long)blocks);
    memset(o, 0, sizeof *o);
    o->kernel = kernel;
    o->grid[0] = (uint32_t)blocks;
    o->grid[1] = o->grid[2] = 1;
    o->block[0] = (uint32_t)threads;
    o->block[1] = o->block[2] = 1;
    o->smem = (uint32_t)smem;
    return TJ_OK;
}

int64_t tj_cuda_tiles_work(const tj_layer *l, const tj_cuda_config *c, int64_t m)
{
    return m > 0 ? count_items(l, c->bn) * ((m + c->bm - 1) / c->bm) : 0;
}

int tj_cuda_template_persistent(tj_cuda_template t) { return t == TJ_CUDA_TEMPLATE_MMA || t == TJ_CUDA_TEMPLATE_SIMT; }

uint32_t tj_cuda_persistent_grid(uint32_t work, int sm_count, int blocks_per_sm)
{
    int64_t slots = (int64_t)(sm_count > 0 ? sm_count : 1) * (blocks_per_sm > 0 ? blocks_per_sm : 1);
    return work < slots ? work : (uint32_t)slots;
}

tj_cuda_grid_mode tj_cuda_grid_mode_parse(const char *env)
{
    tj_cuda_grid_mode g = {0, 0};
    if (!env) return g;
    g.full = strcmp(env, "full") == 0;
    if (!g.full && atoi(env) > 0) g.cap = atoi(env);
    return g;
}

uint32_t tj_cuda_tiles_grid_limit(tj_cuda_template t, tj_cuda_grid_mode mode, int sm_count, int blocks_per_sm)
{
    if (!tj_cuda_template_persistent(t)) return 0;
    uint32_t limit = 0;
    if (!mode.full && blocks_per_sm > 0) limit = tj_cuda_persistent_grid(UINT32_MAX, sm_count, blocks_per_sm);
    if (mode.cap > 0) limit = tj_cuda_persistent_grid(limit ? limit : UINT32_MAX, mode.cap, 1);
    return limit;
}

tj_status tj_cuda_geometry(const tj_layer *l, const tj_cuda_config *c, int64_t m,
                           tj_cuda_launch out[TJ_CUDA_MAX_LAUNCHES], int *count, tj_error *err)
{
    *count = 0;
    TJ_TRY(tj_cuda_config_check(c, err));
    if (m < 0 || m > INT32_MAX) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "M = %lld is out of range", (long long)m);
    if (m == 0) return TJ_OK;
    int64_t nitems = count_items(l, c->bn), n_fill = l->n - l->ncols, n_ew = count_ew_rows(l);
    int64_t aux_mb = (m + TJ_CUDA_AUX_THREADS - 1) / TJ_CUDA_AUX_THREADS;
    if (nitems > 0)
        TJ_TRY(add_launch(&out[(*count)++], "tj_tiles", tj_cuda_tiles_work(l, c, m), 32 * c->warps,
                          tj_cuda_smem_bytes(c), err));
    if (n_fill > 0) TJ_TRY(add_launch(&out[(*count)++], "tj_fill", n_fill * aux_mb, TJ_CUDA_AUX_THREADS, 0, err));
    if (n_ew > 0) TJ_TRY(add_launch(&out[(*count)++], "tj_ew", n_ew * aux_mb, TJ_CUDA_AUX_THREADS, 0, err));
    return TJ_OK;
}

tj_status tj_cuda_args_check(const tj_layer *l, const tj_cuda_config *c, const tj_cuda_args *a, tj_error *err)
{
    const char *who = l->name ? l->name : "layer";
    if (a->m < 0) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: M = %d is negative", who, a->m);
    if (a->m == 0) return TJ_OK;
    if (!a->x || !a->y || (l->ntiles && l->tile_ptr[l->ntiles] && !a->w))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: x, y and the packed weights must be device pointers", who);
    int64_t need_x = c->x_fm ? a->m : l->k, need_y = c->y_fm ? a->m : l->n;
    if (a->ldx < need_x || a->ldy < need_y)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: ldx %lld / ldy %lld below %lld / %lld", who, (long long)a->ldx,
                       (long long)a->ldy, (long long)need_x, (long long)need_y);
    if (c->tmpl != TJ_CUDA_TEMPLATE_SIMT && c->x_fm && (((uintptr_t)a->x & 15) || a->ldx % 8))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "%s: the mma kernel gathers x in 16-byte pieces: x must be 16-byte aligned and ldx (%lld) a multiple of 8",
                       who, (long long)a->ldx);
    if ((uintptr_t)a->w & 15)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: the packed weights must be 16-byte aligned", who);
    size_t ysz = tj_dtype_size(c->out);
    if (((uintptr_t)a->x & 1) || ((uintptr_t)a->y & (ysz - 1)))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: x must be 2-byte and y %zu-byte (%s) aligned", who, ysz,
                       tj_dtype_name(c->out));
    if ((l->cols != NULL) != (a->cols != NULL))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: cols must be given exactly when the layer prunes columns", who);
    if (a->n_fill != l->n - l->ncols || (a->n_fill && !a->fill_rows))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: n_fill %d, expected %lld with fill_rows", who, a->n_fill,
                       (long long)(l->n - l->ncols));
    int64_t ew_rows = count_ew_rows(l);
    if (a->n_ew_rows != ew_rows || (ew_rows && (!a->ew_ptr || !a->ew_idx || !a->ew_val || !a->ew_rows)))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: n_ew_rows %d, expected %lld with the ew arrays", who,
                       a->n_ew_rows, (long long)ew_rows);
    return TJ_OK;
}

/* ---- host packing ---- */

void tj_cuda_host_data_free(tj_cuda_host_data *d)
{
    if (!d) return;
    free(d->w);
    free(d->bias);
    free(d->cols);
    free(d->fill_rows);
    free(d->ew_ptr);
    free(d->ew_idx);
    free(d->ew_rows);
    free(d->ew_val);
    memset(d, 0, sizeof *d);
}

static void *xcalloc(int64_t n, size_t size) { return calloc((size_t)(n > 0 ? n : 1), size); }

tj_status tj_cuda_pack(const tj_layer *l, const tj_cuda_config *c, const void *w, tj_dtype wdt,
                       const void *bias, tj_dtype bdt, tj_cuda_host_data *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    if (l->ew_nnz > INT32_MAX) return tj_fail(err, TJ_ERR_UNSUPPORTED, "layer '%s': too many ew entries for the CUDA kernels", l->name);
    tj_plan plan;
    TJ_TRY(tj_plan_build(l, TJ_CUDA_PACK_PAD, &plan, err));
    out->w_elems = plan.packed_elems;
    out->w = xcalloc(plan.packed_elems, sizeof *out->w);
    out->ncols = l->ncols;
    out->n_fill = l->n - l->ncols;
    if (bias) out->bias = xcalloc(l->n, sizeof *out->bias);
    if (l->cols) out->cols = xcalloc(l->ncols, sizeof *out->cols);
    if (out->n_fill) out->fill_rows = xcalloc(out->n_fill, sizeof *out->fill_rows);
    if (l->ew_indptr && l->ew_nnz) {
        out->ew_nnz = l->ew_nnz;
        out->n_ew_rows = count_ew_rows(l);
        out->ew_ptr = xcalloc(l->n + 1, sizeof *out->ew_ptr);
        out->ew_idx = xcalloc(l->ew_nnz, sizeof *out->ew_idx);
        out->ew_val = xcalloc(l->ew_nnz, sizeof *out->ew_val);
        out->ew_rows = xcalloc(out->n_ew_rows, sizeof *out->ew_rows);
    }
    if (!out->w || (bias && !out->bias) || (l->cols && !out->cols) || (out->n_fill && !out->fill_rows) ||
        (out->ew_nnz && (!out->ew_ptr || !out->ew_idx || !out->ew_val || !out->ew_rows))) {
        tj_plan_free(&plan);
        tj_cuda_host_data_free(out);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory packing weights", l->name);
    }
    tj_plan_pack_16(&plan, w, wdt, c->dtype, out->w);
    tj_plan_free(&plan);
    if (bias)
        for (int64_t n = 0; n < l->n; n++) out->bias[n] = tj_load_f32(bias, bdt, n);
    if (l->cols) {
        int64_t j = 0, f = 0;
        for (int64_t n = 0; n < l->n; n++) {
            if (j < l->ncols && l->cols[j] == n) out->cols[j++] = (int32_t)n;
            else out->fill_rows[f++] = (int32_t)n;
        }
    }
    if (out->ew_nnz) {
        int64_t r = 0;
        for (int64_t n = 0; n <= l->n; n++) out->ew_ptr[n] = (int32_t)l->ew_indptr[n];
        for (int64_t n = 0; n < l->n; n++) {
            if (l->ew_indptr[n + 1] > l->ew_indptr[n]) out->ew_rows[r++] = (int32_t)n;
            for (int64_t j = l->ew_indptr[n]; j < l->ew_indptr[n + 1]; j++) {
                out->ew_idx[j] = l->ew_indices[j];
                out->ew_val[j] = tj_load_f32(w, wdt, n * l->k + l->ew_indices[j]);
            }
        }
    }
    return TJ_OK;
}

/* ---- templates ---- */

tj_status tj_cuda_template_text(const char *name, char **out, tj_error *err)
{
    *out = NULL;
    const char *dir = getenv("TILEJIT_TEMPLATE_DIR");
    if (dir && *dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "rb");
        if (!f) return tj_fail(err, TJ_ERR_IO, "template '%s' (TILEJIT_TEMPLATE_DIR): %s", path, strerror(errno));
        tj_strbuf sb;
        tj_sb_init(&sb);
        char buf[8192];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) tj_sb_append(&sb, buf, n);
        int bad = ferror(f);
        fclose(f);
        if (bad) {
            tj_sb_free(&sb);
            return tj_fail(err, TJ_ERR_IO, "template '%s': read error", path);
        }
        *out = tj_sb_take(&sb);
        return *out ? TJ_OK : tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "template '%s': out of memory", path);
    }
    for (size_t i = 0; i < tj_embedded_template_count; i++) {
        if (strcmp(tj_embedded_templates[i].name, name) != 0) continue;
        *out = malloc(tj_embedded_templates[i].len + 1);
        if (!*out) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "template '%s': out of memory", name);
        memcpy(*out, tj_embedded_templates[i].text, tj_embedded_templates[i].len);
        (*out)[tj_embedded_templates[i].len] = '\0';
        return TJ_OK;
    }
    return tj_fail(err, TJ_ERR_INTERNAL, "template '%s' is not embedded in this build", name);
}

typedef struct hole {
    const char *name;
    const char *value;
} hole;

/* Appends template `name` with every {{HOLE}} replaced; an unknown hole is an error. */
static tj_status fill_template(tj_strbuf *sb, const char *name, const hole *holes, int nholes, tj_error *err)
{
    char *text;
    TJ_TRY(tj_cuda_template_text(name, &text, err));
    const char *p = text;
    tj_status st = TJ_OK;
    for (;;) {
        const char *open = strstr(p, "{{");
        if (!open) { tj_sb_puts(sb, p); break; }
        const char *close = strstr(open + 2, "}}");
        if (!close) { st = tj_fail(err, TJ_ERR_INTERNAL, "template '%s': unterminated '{{'", name); break; }
        tj_sb_append(sb, p, (size_t)(open - p));
        size_t len = (size_t)(close - open - 2);
        int found = 0;
        for (int i = 0; i < nholes; i++)
            if (strlen(holes[i].name) == len && strncmp(holes[i].name, open + 2, len) == 0) {
                tj_sb_puts(sb, holes[i].value);
                found = 1;
                break;
            }
        if (!found) {
            st = tj_fail(err, TJ_ERR_INTERNAL, "template '%s': unknown hole {{%.*s}}", name, (int)len, open + 2);
            break;
        }
        p = close + 2;
    }
    free(text);
    return st;
}

/* ---- emission of the generated blocks ---- */

static void emit_items(tj_strbuf *sb, const tj_cuda_layout *lay)
{
    int64_t bytes = lay->nitems * 32;
    const char *space = bytes <= CONST_ITEMS_MAX ? "__constant__" : "__device__ const";
    if (lay->nitems == 0) {
        tj_sb_line(sb, "static __constant__ tj_item tj_items[1] = {{0, 0, 0, 0, 0, 0, 0}}; /* no tiles */");
        return;
    }
    tj_sb_line(sb, "/* {wofs, ld, nrows, fbase, width, wcol, cbase} */");
    tj_sb_line(sb, "static %s tj_item tj_items[%lld] = {", space, (long long)lay->nitems);
    for (int64_t i = 0; i < lay->nitems; i++) {
        const tj_cuda_item *it = &lay->items[i];
        tj_sb_line(sb, "    {%lld, %d, %d, %d, %d, %d, %d}, /* tile %d */", (long long)it->wofs, it->ld, it->nrows,
                   it->fbase, it->width, it->wcol, it->cbase, it->tile);
    }
    tj_sb_line(sb, "};");
}

static void emit_table(tj_strbuf *sb, const tj_cuda_layout *lay)
{
    int wpc = lay->words_per_chunk;
    int64_t words = lay->nchunks * wpc;
    int64_t items_const = lay->nitems * 32 <= CONST_ITEMS_MAX ? lay->nitems * 32 : 0;
    const char *space = words * 8 + items_const <= CONST_TOTAL_MAX ? "__constant__" : "__device__ const";
    if (lay->nchunks == 0) {
        tj_sb_line(sb, "static __device__ __forceinline__ tj_ofs tj_chunk_ofs(int c)");
        tj_sb_line(sb, "{\n    (void)c;\n    tj_ofs o;\n#pragma unroll\n    for (int i = 0; i < TJ_OFS_WORDS; ++i) o.w[i] = 0ull;\n    o.base = TJ_OFS_WIDE;\n    return o;\n}");
        tj_sb_line(sb, "typedef int tj_rows;");
        tj_sb_line(sb, "static __device__ __forceinline__ tj_rows tj_chunk_rows(int c) { return c; }");
        tj_sb_line(sb, "static __device__ __forceinline__ int tj_row(tj_rows c, int r) { (void)c; (void)r; return 0; }");
        return;
    }
    tj_sb_line(sb, "/* chunk c: words [c * TJ_OFS_WORDS, (c + 1) * TJ_OFS_WORDS), read once per chunk */");
    tj_sb_line(sb, "static %s unsigned long long tj_ofs_tab[%lld] = {", space, (long long)words);
    for (int64_t c = 0; c < lay->nchunks; c++) {
        tj_sb_printf(sb, "    /* c%lld */", (long long)c);
        for (int i = 0; i < wpc; i++) tj_sb_printf(sb, " 0x%016llxull,", (unsigned long long)lay->words[c * wpc + i]);
        tj_sb_puts(sb, "\n");
    }
    tj_sb_line(sb, "};");
    tj_sb_line(sb, "static __device__ __forceinline__ tj_ofs tj_chunk_ofs(int c)");
    tj_sb_line(sb, "{");
    tj_sb_line(sb, "    tj_ofs o;");
    tj_sb_line(sb, "#pragma unroll");
    tj_sb_line(sb, "    for (int i = 0; i < TJ_OFS_WORDS; ++i) o.w[i] = tj_ofs_tab[c * TJ_OFS_WORDS + i];");
    tj_sb_line(sb, "    o.base = TJ_OFS_WIDE;");
    tj_sb_line(sb, "    return o;");
    tj_sb_line(sb, "}");
    tj_sb_line(sb, "/* One thread's row r of chunk c, straight from the table: the word it needs and nothing else");
    tj_sb_line(sb, " * (a warp's threads share a word, so the constant cache serves it in one access). */");
    tj_sb_line(sb, "typedef int tj_rows;");
    tj_sb_line(sb, "static __device__ __forceinline__ tj_rows tj_chunk_rows(int c) { return c; }");
    tj_sb_line(sb, "static __device__ __forceinline__ int tj_row(tj_rows c, int r)");
    tj_sb_line(sb, "{");
    tj_sb_line(sb, "    const unsigned long long w = tj_ofs_tab[c * TJ_OFS_WORDS + r / TJ_OFS_PER_WORD];");
    tj_sb_line(sb, "    return (int)((w >> ((r %% TJ_OFS_PER_WORD) * TJ_OFS_BITS)) & ((1ull << TJ_OFS_BITS) - 1ull));");
    tj_sb_line(sb, "}");
}

static void emit_unrolled(tj_strbuf *sb, const tj_cuda_layout *lay, int bk)
{
    int wpc = lay->words_per_chunk;
    int64_t nfn = (lay->nchunks + UNROLL_CHUNKS_PER_FN - 1) / UNROLL_CHUNKS_PER_FN;
    tj_sb_line(sb, "/* Kept-row indices as 64-bit immediates (inline asm keeps them out of data tables),");
    tj_sb_line(sb, " * %d chunks per function so that no function grows without bound. */", UNROLL_CHUNKS_PER_FN);
    tj_sb_line(sb, "/* Four words per asm statement: one statement per word costs NVRTC twice the time. */");
    tj_sb_line(sb, "#define TJ_IMM4(i, a, b, c, d) \\");
    tj_sb_line(sb, "    asm(\"mov.b64 %%0, \" #a \"; mov.b64 %%1, \" #b \"; mov.b64 %%2, \" #c \"; mov.b64 %%3, \" #d \";\" \\");
    tj_sb_line(sb, "        : \"=l\"(o.w[i]), \"=l\"(o.w[i + 1]), \"=l\"(o.w[i + 2]), \"=l\"(o.w[i + 3]))");
    tj_sb_line(sb, "#define TJ_IMM2(i, a, b) asm(\"mov.b64 %%0, \" #a \"; mov.b64 %%1, \" #b \";\" : \"=l\"(o.w[i]), \"=l\"(o.w[i + 1]))");
    tj_sb_line(sb, "/* TJ_BASE(TJ_OFS_WIDE): 16/32-bit indices follow; any other base: a narrow chunk, bytes follow. */");
    tj_sb_line(sb, "#define TJ_BASE(v) asm(\"mov.b32 %%0, \" #v \";\" : \"=r\"(o.base))");
    /* the host executor's twins (templates/host/cuda_host.h): the same immediates, as assignments */
    tj_sb_line(sb, "#ifdef TJ_HOST_EXEC");
    tj_sb_line(sb, "#undef TJ_IMM4");
    tj_sb_line(sb, "#undef TJ_IMM2");
    tj_sb_line(sb, "#undef TJ_BASE");
    tj_sb_line(sb, "#define TJ_IMM4(i, a, b, c, d) (o.w[i] = a##ull, o.w[i + 1] = b##ull, o.w[i + 2] = c##ull, o.w[i + 3] = d##ull)");
    tj_sb_line(sb, "#define TJ_IMM2(i, a, b) (o.w[i] = a##ull, o.w[i + 1] = b##ull)");
    tj_sb_line(sb, "#define TJ_BASE(v) (o.base = v##u)");
    tj_sb_line(sb, "#endif");
    for (int64_t f = 0; f < nfn; f++) {
        int64_t c0 = f * UNROLL_CHUNKS_PER_FN, c1 = c0 + UNROLL_CHUNKS_PER_FN;
        if (c1 > lay->nchunks) c1 = lay->nchunks;
        tj_sb_line(sb, "static __device__ __noinline__ tj_ofs tj_ofs_fn%lld(int c)", (long long)f);
        tj_sb_line(sb, "{");
        tj_sb_line(sb, "    tj_ofs o;");
        tj_sb_line(sb, "    switch (c) {");
        for (int64_t c = c0; c < c1; c++) {
            int narrow = lay->bases[c] != TJ_CUDA_OFS_WIDE;
            int nw = narrow ? bk / 8 : wpc;
            tj_sb_printf(sb, "    case %lld: TJ_BASE(0x%08x);", (long long)(c - c0), lay->bases[c]);
            for (int i = 0; i < nw; i += 4) {
                const uint64_t *w = &lay->words[c * wpc + i];
                if (nw - i >= 4)
                    tj_sb_printf(sb, "%s TJ_IMM4(%d, 0x%016llx, 0x%016llx, 0x%016llx, 0x%016llx);",
                                 i ? "\n           " : "", i, (unsigned long long)w[0], (unsigned long long)w[1],
                                 (unsigned long long)w[2], (unsigned long long)w[3]);
                else
                    tj_sb_printf(sb, " TJ_IMM2(%d, 0x%016llx, 0x%016llx);", i, (unsigned long long)w[0],
                                 (unsigned long long)w[1]);
            }
            tj_sb_puts(sb, " break;\n");
        }
        tj_sb_line(sb, "    default:");
        tj_sb_line(sb, "#pragma unroll");
        tj_sb_line(sb, "        for (int i = 0; i < TJ_OFS_WORDS; ++i) o.w[i] = 0ull;");
        tj_sb_line(sb, "        o.base = TJ_OFS_WIDE;");
        tj_sb_line(sb, "    }");
        tj_sb_line(sb, "    return o;");
        tj_sb_line(sb, "}");
    }
    tj_sb_line(sb, "static __device__ __forceinline__ tj_ofs tj_chunk_ofs(int c)");
    tj_sb_line(sb, "{");
    for (int64_t f = 0; f < nfn; f++)
        tj_sb_line(sb, "    if (c < %lld) return tj_ofs_fn%lld(c - %lld);", (long long)((f + 1) * UNROLL_CHUNKS_PER_FN),
                   (long long)f, (long long)(f * UNROLL_CHUNKS_PER_FN));
    tj_sb_line(sb, "    tj_ofs o;");
    tj_sb_line(sb, "#pragma unroll");
    tj_sb_line(sb, "    for (int i = 0; i < TJ_OFS_WORDS; ++i) o.w[i] = 0ull;");
    tj_sb_line(sb, "    o.base = TJ_OFS_WIDE;");
    tj_sb_line(sb, "    return o;");
    tj_sb_line(sb, "}");
    tj_sb_line(sb, "/* The chunk's words once (a call), each thread's rows picked from them. */");
    tj_sb_line(sb, "typedef tj_ofs tj_rows;");
    tj_sb_line(sb, "static __device__ __forceinline__ tj_rows tj_chunk_rows(int c) { return tj_chunk_ofs(c); }");
    tj_sb_line(sb, "static __device__ __forceinline__ int tj_row(const tj_rows &o, int r) { return tj_ofs_get(o, r); }");
}

static void emit_banner(tj_strbuf *sb, const tj_layer *l, const tj_cuda_config *c, const tj_cuda_layout *lay)
{
    tj_sb_printf(sb, "/* Generated by tilejit %s (%s, kernel ABI %d). Do not edit.\n", TJ_VERSION, TJ_CUDA_GEN_VERSION,
                 TJ_CUDA_ABI_VERSION);
    tj_sb_printf(sb, " * pattern hash 0x%016llx: n=%lld k=%lld g=%lld kept_cols=%lld tiles=%lld kept_rows=%lld ew=%lld act=%s\n",
                 (unsigned long long)l->hash, (long long)l->n, (long long)l->k, (long long)l->g, (long long)l->ncols,
                 (long long)l->ntiles, (long long)(l->ntiles ? l->tile_ptr[l->ntiles] : 0), (long long)l->ew_nnz,
                 tj_activation_name(l->act));
    tj_sb_puts(sb, " * config ");
    tj_cuda_config_to_json(c, sb);
    tj_sb_printf(sb, "\n * work items %lld, chunks %lld, %d-bit row indices */", (long long)lay->nitems,
                 (long long)lay->nchunks, lay->ofs_bits);
}

tj_status tj_cuda_emit(const tj_layer *l, const tj_cuda_config *c, char **out, tj_error *err)
{
    *out = NULL;
    TJ_TRY(tj_cuda_config_check(c, err));
    tj_plan plan;
    TJ_TRY(tj_plan_build(l, TJ_CUDA_PACK_PAD, &plan, err));
    tj_cuda_layout lay;
    tj_status st = tj_cuda_layout_build(l, &plan, c, &lay, err);
    tj_plan_free(&plan);
    if (st) return st;

    tj_strbuf banner, items, offs, sb, ew;
    tj_sb_init(&banner);
    tj_sb_init(&items);
    tj_sb_init(&offs);
    tj_sb_init(&sb);
    tj_sb_init(&ew);
    emit_banner(&banner, l, c, &lay);
    emit_items(&items, &lay);
    if (c->offsets == TJ_CUDA_OFFSETS_UNROLLED) emit_unrolled(&offs, &lay, c->bk);
    else emit_table(&offs, &lay);

    int wn = 1, wm = 1;
    if (c->tmpl == TJ_CUDA_TEMPLATE_MMA) tj_cuda_warp_split(c, &wn, &wm);
    char v_bm[16], v_bn[16], v_bk[16], v_st[16], v_th[16], v_wn[16], v_wm[16], v_ni[24], v_ob[8];
    snprintf(v_bm, sizeof v_bm, "%d", c->bm);
    snprintf(v_bn, sizeof v_bn, "%d", c->bn);
    snprintf(v_bk, sizeof v_bk, "%d", c->bk);
    snprintf(v_st, sizeof v_st, "%d", c->tmpl == TJ_CUDA_TEMPLATE_SIMT ? 1 : c->stages);
    snprintf(v_th, sizeof v_th, "%d", 32 * c->warps);
    snprintf(v_wn, sizeof v_wn, "%d", wn);
    snprintf(v_wm, sizeof v_wm, "%d", wm);
    snprintf(v_ni, sizeof v_ni, "%lld", (long long)lay.nitems);
    snprintf(v_ob, sizeof v_ob, "%d", lay.ofs_bits);
    const char *out_kind = c->out == TJ_F32 ? "0" : c->out == TJ_F16 ? "1" : "2";
    const char *act = l->act == TJ_ACT_RELU ? "1" : l->act == TJ_ACT_GELU ? "2" : "0";
    int has_ew = l->ew_indptr && l->ew_nnz > 0;
    hole holes[] = {
        {"BANNER", banner.data ? banner.data : ""},
        {"BM", v_bm}, {"BN", v_bn}, {"BK", v_bk}, {"STAGES", v_st}, {"THREADS", v_th},
        {"WARPS_N", v_wn}, {"WARPS_M", v_wm},
        {"IN_BF16", c->dtype == TJ_BF16 ? "1" : "0"}, {"OUT_KIND", out_kind},
        {"X_FM", c->x_fm ? "1" : "0"}, {"Y_FM", c->y_fm ? "1" : "0"},
        {"ACT", act}, {"HAS_COLS", l->cols ? "1" : "0"}, {"HAS_EW", has_ew ? "1" : "0"},
        {"NITEMS", v_ni}, {"OFS_BITS", v_ob}, {"OFFSET_MODE", offsets_name(c->offsets)},
        {"ITEMS", items.data ? items.data : ""}, {"OFFSETS", offs.data ? offs.data : ""},
        {"EW_KERNEL", ""},
    };
    int nholes = (int)(sizeof holes / sizeof *holes);
    if (banner.oom || items.oom || offs.oom) { st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory emitting CUDA"); goto done; }
    if ((st = fill_template(&sb, "prelude.cu", holes, nholes, err))) goto done;
    tj_sb_puts(&sb, "\n");
    const char *tiles = c->tmpl == TJ_CUDA_TEMPLATE_MMA     ? "tiles_mma.cu"
                        : c->tmpl == TJ_CUDA_TEMPLATE_WGMMA ? "tiles_wgmma.cu"
                                                            : "tiles_simt.cu";
    /* the sm_90a helpers only before the wgmma kernel: older archs never see them */
    if (c->tmpl == TJ_CUDA_TEMPLATE_WGMMA && (st = fill_template(&sb, "hopper.cu", holes, nholes, err))) goto done;
    if ((st = fill_template(&sb, tiles, holes, nholes, err)))
        goto done;
    tj_sb_puts(&sb, "\n");
    if (has_ew && (st = fill_template(&ew, "ew.cu", holes, nholes, err))) goto done;
    holes[nholes - 1].value = ew.data ? ew.data : "";
    if ((st = fill_template(&sb, "fill_ew.cu", holes, nholes, err))) goto done;
    *out = tj_sb_take(&sb);
    if (!*out) st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory emitting CUDA", l->name);
done:
    if (st) tj_error_prefix(err, "layer '%s'", l->name);
    tj_sb_free(&banner);
    tj_sb_free(&items);
    tj_sb_free(&offs);
    tj_sb_free(&sb);
    tj_sb_free(&ew);
    tj_cuda_layout_free(&lay);
    return st;
}
