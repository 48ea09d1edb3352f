/* Stage 3 of the pipeline (parse → validate → plan → emit): tile order and packed weights. */
#include <stdlib.h>
#include <string.h>

#include "gen/plan.h"


static int64_t tile_cost(const tj_layer *l, int64_t t) { return tj_tile_nrows(l, t) * tj_tile_width(l, t); }

static void sort_heaviest_first(const tj_layer *l, int64_t *order)
{
    /* Insertion into a counting order would need bounded costs; a merge sort keeps it
     * O(T log T) and stable (ties by index) without global state. */
    int64_t n = l->ntiles;
    int64_t *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
    if (!tmp) { /* fall back to index order: still correct, only less balanced */
        for (int64_t i = 0; i < n; i++) order[i] = i;
        return;
    }
    for (int64_t i = 0; i < n; i++) order[i] = i;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi)
                tmp[o++] = tile_cost(l, order[b]) > tile_cost(l, order[a]) ? order[b++] : order[a++];
            while (a < mid) tmp[o++] = order[a++];
            while (b < hi) tmp[o++] = order[b++];
        }
        memcpy(order, tmp, (size_t)n * sizeof *order);
    }
    free(tmp);
}

tj_status tj_plan_build(const tj_layer *l, int64_t pad, tj_plan *out, tj_error *err)
{
    return tj_plan_build_rows(l, pad, 1, out, err);
}

int64_t tj_plan_rows(const tj_plan *p, int64_t t)
{
    int64_t r = tj_tile_nrows(p->layer, t);
    return (r + p->rpad - 1) / p->rpad * p->rpad;
}

tj_status tj_plan_build_rows(const tj_layer *l, int64_t pad, int64_t rpad, tj_plan *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    if (pad <= 0) pad = 1;
    if (rpad <= 0) rpad = 1;
    int64_t nt = l->ntiles ? l->ntiles : 1;
    out->layer = l;
    out->pad = pad;
    out->rpad = rpad;
    out->order = malloc((size_t)nt * sizeof *out->order);
    out->off = malloc((size_t)nt * sizeof *out->off);
    out->ld = malloc((size_t)nt * sizeof *out->ld);
    if (!out->order || !out->off || !out->ld) {
        tj_plan_free(out);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory planning", l->name);
    }
    sort_heaviest_first(l, out->order);
    int64_t total = 0;
    for (int64_t t = 0; t < l->ntiles; t++) {
        int64_t w = tj_tile_width(l, t);
        out->ld[t] = (w + pad - 1) / pad * pad;
        out->off[t] = total;
        int64_t sz;
        if (!tj_mul_ok(out->ld[t], tj_plan_rows(out, t), &sz) || !tj_add_ok(total, sz, &total)) {
            tj_plan_free(out);
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "layer '%s': packed weights too large", l->name);
        }
    }
    out->packed_elems = total;
    return TJ_OK;
}

void tj_plan_free(tj_plan *p)
{
    if (!p) return;
    free(p->order);
    free(p->off);
    free(p->ld);
    memset(p, 0, sizeof *p);
}

void tj_plan_pack_f32(const tj_plan *p, const void *w, tj_dtype wdt, float *dst)
{
    const tj_layer *l = p->layer;
    memset(dst, 0, (size_t)p->packed_elems * sizeof *dst);
    for (int64_t t = 0; t < l->ntiles; t++) {
        const int32_t *rows = l->tile_rows + l->tile_ptr[t];
        int64_t nr = tj_tile_nrows(l, t), width = tj_tile_width(l, t);
        /* 16 columns at a time: each packed row segment is one cache line written whole, and
         * the 16 weight rows it reads from stay in cache as r advances (a plain column loop
         * wrote one float per cache line, the transposition's worst case) */
        for (int64_t c0 = 0; c0 < width; c0 += 16) {
            int64_t cw = width - c0 < 16 ? width - c0 : 16;
            int64_t base[16];
            for (int64_t c = 0; c < cw; c++) base[c] = tj_layer_col(l, t * l->g + c0 + c) * l->k;
            float *d = dst + p->off[t] + c0;
            if (wdt == TJ_F32) {
                const char *wb = w;
                for (int64_t r = 0; r < nr; r++, d += p->ld[t])
                    for (int64_t c = 0; c < cw; c++) memcpy(&d[c], wb + 4 * (base[c] + rows[r]), 4);
            } else {
                for (int64_t r = 0; r < nr; r++, d += p->ld[t])
                    for (int64_t c = 0; c < cw; c++) d[c] = tj_load_f32(w, wdt, base[c] + rows[r]);
            }
        }
    }
}

void tj_plan_pack_16(const tj_plan *p, const void *w, tj_dtype wdt, tj_dtype out, uint16_t *dst)
{
    const tj_layer *l = p->layer;
    memset(dst, 0, (size_t)p->packed_elems * sizeof *dst);
    for (int64_t t = 0; t < l->ntiles; t++) {
        const int32_t *rows = l->tile_rows + l->tile_ptr[t];
        int64_t nr = tj_tile_nrows(l, t), width = tj_tile_width(l, t);
        for (int64_t c = 0; c < width; c++) {
            int64_t n = tj_layer_col(l, t * l->g + c);
            for (int64_t r = 0; r < nr; r++) {
                int64_t i = n * l->k + rows[r];
                uint16_t v;
                if (wdt == out) v = tj_load_u16(w, i); /* w may be unaligned (mapped file) */
                else {
                    float f = tj_load_f32(w, wdt, i);
                    v = out == TJ_F16 ? tj_f32_to_f16(f) : tj_f32_to_bf16(f);
                }
                dst[p->off[t] + r * p->ld[t] + c] = v;
            }
        }
    }
}
