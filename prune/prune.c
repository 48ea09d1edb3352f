/* One-shot tile-wise pruning (docs/pruning.md): element scores → column scores (tw2) → tile-row scores
 * → one global threshold each, found by weighted selection (expected linear time, no sort) →
 * tiles; tew then adds back the best removed weights, found by a two-pass radix select over
 * their scores. Memory: the scores of tile-rows and columns, never a copy of the weights. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "prune/prune.h"
#include "base/rng.h"

tj_prune_options tj_prune_options_default(void)
{
    tj_prune_options o = {.size = sizeof o, .sparsity = 0.75, .g = 128, .mode = TJ_PRUNE_TW1, .tew_base = TJ_PRUNE_TW1,
                          .ew_fraction = 0.01};
    return o;
}

const char *tj_prune_mode_name(tj_prune_mode m)
{
    switch (m) {
    case TJ_PRUNE_TW1: return "tw1";
    case TJ_PRUNE_TW2: return "tw2";
    case TJ_PRUNE_TEW: return "tew";
    }
    return "?";
}

int tj_prune_mode_parse(const char *s, tj_prune_mode *out)
{
    if (strcmp(s, "tw1") == 0) *out = TJ_PRUNE_TW1;
    else if (strcmp(s, "tw2") == 0) *out = TJ_PRUNE_TW2;
    else if (strcmp(s, "tew") == 0) *out = TJ_PRUNE_TEW;
    else return 0;
    return 1;
}

/* ---- weighted selection ---- */

/* A unit of pruning (a tile-row or a column): its score, how many weights it holds, and its
 * position, which breaks ties so the order is total and the result deterministic. */
typedef struct item {
    double s;
    int64_t id;
    int64_t w;
} item;

static inline int item_lt(const item *a, const item *b)
{
    return a->s < b->s || (a->s == b->s && a->id < b->id);
}

static inline void item_swap(item *a, item *b)
{
    item t = *a;
    *a = *b;
    *b = t;
}

/* Quickselect by weight: reorders a[0..n) and returns the item at which the running weight, in
 * increasing (score, id) order, first reaches target (0 < target <= total weight); *before gets
 * the weight of all items ordered before it. */
static item weighted_select(item *a, int64_t n, int64_t target, int64_t *before)
{
    tj_rng r = {0x7475696c656a6974ull};
    int64_t lo = 0, hi = n, acc = 0;
    for (;;) {
        if (hi - lo == 1) {
            *before = acc;
            return a[lo];
        }
        int64_t p = lo + (int64_t)tj_rng_below(&r, (uint64_t)(hi - lo));
        item_swap(&a[p], &a[hi - 1]);
        item piv = a[hi - 1];
        int64_t store = lo, wl = 0;
        for (int64_t i = lo; i < hi - 1; i++) {
            if (item_lt(&a[i], &piv)) {
                wl += a[i].w;
                item_swap(&a[i], &a[store]);
                store++;
            }
        }
        item_swap(&a[store], &a[hi - 1]);
        if (acc + wl >= target) {
            hi = store; /* weights are >= 1, so the left part is not empty */
        } else if (acc + wl + piv.w >= target) {
            *before = acc + wl;
            return piv;
        } else {
            acc += wl + piv.w;
            lo = store + 1;
        }
    }
}

/* Sets drop[id] for the lowest-scoring items whose total weight comes closest to target. */
static void select_drop(item *a, int64_t n, int64_t target, unsigned char *drop)
{
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += a[i].w;
    if (target <= 0 || n == 0) return;
    if (target >= total) {
        for (int64_t i = 0; i < n; i++) drop[a[i].id] = 1;
        return;
    }
    int64_t before;
    item b = weighted_select(a, n, target, &before);
    int include = 2 * target > 2 * before + b.w; /* closer to target with the boundary item */
    for (int64_t i = 0; i < n; i++)
        if (item_lt(&a[i], &b) || (include && a[i].id == b.id)) drop[a[i].id] = 1;
}

/* ---- per-layer state ---- */

typedef struct work {
    const tj_prune_layer_in *in;
    int64_t g;
    int64_t ncols;
    int64_t *cols;     /* kept output features, NULL when all are kept */
    int64_t ntiles;
    int64_t row0;      /* id of this layer's first tile-row item: tile t, row kk is row0 + t·k + kk */
    int64_t col0;      /* id of this layer's first column item (tw2) */
    int32_t *ew;       /* tew residual, CSR over n */
    int64_t *ew_ptr;
    int64_t ew_nnz, ew_cap;
} work;

static inline int64_t work_col(const work *w, int64_t j) { return w->cols ? w->cols[j] : j; }

/* Element scores of row `row` of a layer as fp32 in buf (k entries). */
static void score_row(const tj_prune_layer_in *L, int64_t row, float *buf)
{
    if (L->score) {
        tj_convert_to_f32((const char *)L->score + (size_t)(row * L->k) * tj_dtype_size(L->sdt), L->sdt, L->k, buf);
        return;
    }
    tj_convert_to_f32((const char *)L->w + (size_t)(row * L->k) * tj_dtype_size(L->wdt), L->wdt, L->k, buf);
    for (int64_t i = 0; i < L->k; i++) buf[i] = fabsf(buf[i]);
}

static tj_status nan_error(const tj_prune_layer_in *L, tj_error *err)
{
    return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "layer '%s': %s contain NaN; cannot rank them", L->name,
                   L->score ? "scores" : "weights");
}

/* Column scores (tw2): ‖scores of output feature n‖₂ / k. */
static tj_status column_items(work *ws, int64_t nl, item *items, float *buf, tj_error *err)
{
    int64_t id = 0;
    for (int64_t l = 0; l < nl; l++) {
        const tj_prune_layer_in *L = ws[l].in;
        ws[l].col0 = id;
        for (int64_t row = 0; row < L->n; row++) {
            score_row(L, row, buf);
            double s = 0;
            for (int64_t i = 0; i < L->k; i++) s += (double)buf[i] * buf[i];
            double v = sqrt(s) / (double)L->k;
            if (isnan(v)) return nan_error(L, err);
            items[id] = (item){v, id, L->k};
            id++;
        }
    }
    return TJ_OK;
}

/* Tile-row scores over each layer's kept columns: ‖scores of (tile t, row kk)‖₂ / tile width. */
static tj_status tile_row_items(work *ws, int64_t nl, item *items, float *buf, double *acc, tj_error *err)
{
    int64_t id = 0;
    for (int64_t l = 0; l < nl; l++) {
        work *w = &ws[l];
        const tj_prune_layer_in *L = w->in;
        w->row0 = id;
        for (int64_t t = 0; t < w->ntiles; t++) {
            int64_t j0 = t * w->g, j1 = j0 + w->g < w->ncols ? j0 + w->g : w->ncols, width = j1 - j0;
            memset(acc, 0, (size_t)L->k * sizeof *acc);
            for (int64_t j = j0; j < j1; j++) {
                score_row(L, work_col(w, j), buf);
                for (int64_t i = 0; i < L->k; i++) acc[i] += (double)buf[i] * buf[i];
            }
            for (int64_t i = 0; i < L->k; i++) {
                double v = sqrt(acc[i]) / (double)width;
                if (isnan(v)) return nan_error(L, err);
                items[id] = (item){v, id, width};
                id++;
            }
        }
    }
    return TJ_OK;
}

/* ---- tew: the top `count` removed weights, by a radix select on their scores ---- */

/* Order-preserving map of a float to an unsigned key (larger float, larger key). */
static inline uint32_t float_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

typedef struct ew_state {
    int pass;             /* 1: histogram of high 16 bits, 2: of low 16 bits under hi, 3: emit */
    uint64_t *hist;       /* 65536 */
    uint32_t hi;          /* pass 2 and 3: the threshold's high half */
    uint32_t thresh;      /* pass 3: the threshold key */
    int64_t tie_quota;    /* pass 3: how many weights with key == thresh still to take */
} ew_state;

static tj_status ew_push(work *w, int32_t kk, tj_error *err)
{
    if (w->ew_nnz == w->ew_cap) {
        int64_t cap = w->ew_cap ? 2 * w->ew_cap : 1024;
        int32_t *p = realloc(w->ew, (size_t)cap * sizeof *p);
        if (!p) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory for the ew residual", w->in->name);
        w->ew = p;
        w->ew_cap = cap;
    }
    w->ew[w->ew_nnz++] = kk;
    return TJ_OK;
}

/* One pass over every weight the tile-wise pattern removed, in layer, row, column order. */
static tj_status ew_pass(work *ws, int64_t nl, const unsigned char *drop, ew_state *st, float *buf,
                         unsigned char *kept, const unsigned char *none, int64_t *tile_of, tj_error *err)
{
    for (int64_t l = 0; l < nl; l++) {
        work *w = &ws[l];
        const tj_prune_layer_in *L = w->in;
        for (int64_t row = 0; row < L->n; row++) tile_of[row] = -1;
        for (int64_t j = 0; j < w->ncols; j++) tile_of[work_col(w, j)] = j / w->g;
        if (st->pass == 3) {
            w->ew_ptr = malloc((size_t)(L->n + 1) * sizeof *w->ew_ptr);
            if (!w->ew_ptr) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory", L->name);
            w->ew_ptr[0] = 0;
        }
        int64_t cur = -1; /* the tile whose kept rows are in `kept` */
        for (int64_t row = 0; row < L->n; row++) {
            int64_t t = tile_of[row];
            if (t >= 0 && t != cur) {
                for (int64_t i = 0; i < L->k; i++) kept[i] = !drop[w->row0 + t * L->k + i];
                cur = t;
            }
            const unsigned char *km = t >= 0 ? kept : none; /* a pruned column keeps nothing */
            score_row(L, row, buf);
            for (int64_t i = 0; i < L->k; i++) {
                if (km[i]) continue;
                uint32_t key = float_key(buf[i]);
                if (st->pass == 1) {
                    st->hist[key >> 16]++;
                } else if (st->pass == 2) {
                    if ((key >> 16) == st->hi) st->hist[key & 0xffff]++;
                } else if (key > st->thresh || (key == st->thresh && st->tie_quota > 0)) {
                    if (key == st->thresh) st->tie_quota--;
                    TJ_TRY(ew_push(w, (int32_t)i, err));
                }
            }
            if (st->pass == 3) w->ew_ptr[row + 1] = w->ew_nnz;
        }
    }
    return TJ_OK;
}

static tj_status add_residual(work *ws, int64_t nl, const unsigned char *drop, int64_t count, float *buf,
                              int64_t kmax, int64_t nmax, tj_error *err)
{
    tj_status s = TJ_OK;
    ew_state st = {0};
    st.hist = calloc(65536, sizeof *st.hist);
    unsigned char *kept = malloc((size_t)kmax), *none = calloc((size_t)kmax, 1);
    int64_t *tile_of = malloc((size_t)nmax * sizeof *tile_of);
    if (!st.hist || !kept || !none || !tile_of) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "prune: out of memory");
        goto done;
    }
    st.pass = 1;
    if ((s = ew_pass(ws, nl, drop, &st, buf, kept, none, tile_of, err)) != TJ_OK) goto done;
    uint64_t candidates = 0;
    for (int i = 0; i < 65536; i++) candidates += st.hist[i];
    if ((uint64_t)count > candidates) count = (int64_t)candidates;
    /* From the top: the high half holding the count-th largest key, then the low half. */
    uint64_t above = 0;
    int d1 = 65535;
    while (d1 > 0 && above + st.hist[d1] < (uint64_t)count) above += st.hist[d1--];
    memset(st.hist, 0, 65536 * sizeof *st.hist);
    st.pass = 2;
    st.hi = (uint32_t)d1;
    if ((s = ew_pass(ws, nl, drop, &st, buf, kept, none, tile_of, err)) != TJ_OK) goto done;
    int d2 = 65535;
    while (d2 > 0 && above + st.hist[d2] < (uint64_t)count) above += st.hist[d2--];
    st.thresh = ((uint32_t)d1 << 16) | (uint32_t)d2;
    st.tie_quota = count - (int64_t)above;
    if (count == 0) { /* nothing to add: a threshold above every key */
        st.thresh = UINT32_MAX;
        st.tie_quota = 0;
    }
    st.pass = 3;
    s = ew_pass(ws, nl, drop, &st, buf, kept, none, tile_of, err);
done:
    free(st.hist);
    free(kept);
    free(none);
    free(tile_of);
    return s;
}

/* ---- the pattern ---- */

static tj_status build_layer(const work *w, const unsigned char *drop, tj_layer *out, tj_error *err)
{
    const tj_prune_layer_in *L = w->in;
    memset(out, 0, sizeof *out);
    out->name = strdup(L->name);
    out->n = L->n;
    out->k = L->k;
    out->g = w->g;
    out->ncols = w->ncols;
    out->ntiles = w->ntiles;
    out->act = TJ_ACT_NONE;
    int64_t nkept = 0;
    for (int64_t i = 0; i < w->ntiles * L->k; i++) nkept += !drop[w->row0 + i];
    out->tile_ptr = malloc((size_t)(w->ntiles + 1) * sizeof *out->tile_ptr);
    out->tile_rows = malloc((size_t)(nkept ? nkept : 1) * sizeof *out->tile_rows);
    if (!out->name || !out->tile_ptr || !out->tile_rows) goto oom;
    if (w->cols) {
        out->cols = malloc((size_t)(w->ncols ? w->ncols : 1) * sizeof *out->cols);
        if (!out->cols) goto oom;
        memcpy(out->cols, w->cols, (size_t)w->ncols * sizeof *out->cols);
    }
    int64_t pos = 0;
    out->tile_ptr[0] = 0;
    for (int64_t t = 0; t < w->ntiles; t++) {
        const unsigned char *d = drop + w->row0 + t * L->k;
        for (int64_t i = 0; i < L->k; i++)
            if (!d[i]) out->tile_rows[pos++] = (int32_t)i;
        out->tile_ptr[t + 1] = pos;
    }
    if (w->ew_ptr) {
        out->ew_indptr = malloc((size_t)(L->n + 1) * sizeof *out->ew_indptr);
        out->ew_indices = malloc((size_t)(w->ew_nnz ? w->ew_nnz : 1) * sizeof *out->ew_indices);
        if (!out->ew_indptr || !out->ew_indices) goto oom;
        memcpy(out->ew_indptr, w->ew_ptr, (size_t)(L->n + 1) * sizeof *out->ew_indptr);
        if (w->ew_nnz) memcpy(out->ew_indices, w->ew, (size_t)w->ew_nnz * sizeof *out->ew_indices);
        out->ew_nnz = w->ew_nnz;
    }
    TJ_TRY(tj_layer_validate(out, out->name, err));
    out->hash = tj_layer_hash(out);
    return TJ_OK;
oom:
    return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory", L->name);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp((*(const tj_prune_layer_in *const *)a)->name, (*(const tj_prune_layer_in *const *)b)->name);
}

static tj_status check_inputs(const tj_prune_layer_in *in, int64_t nl, const tj_prune_options *o, tj_error *err)
{
    if (!(o->sparsity >= 0 && o->sparsity < 1))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: sparsity %g is outside [0, 1)", o->sparsity);
    if (o->g < 1 || o->g > TJ_MAX_DIM)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: g %lld is not in [1, %lld]", (long long)o->g,
                       (long long)TJ_MAX_DIM);
    if (o->mode != TJ_PRUNE_TW1 && o->mode != TJ_PRUNE_TW2 && o->mode != TJ_PRUNE_TEW)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: unknown mode %d", (int)o->mode);
    if (o->mode == TJ_PRUNE_TEW) {
        if (o->tew_base != TJ_PRUNE_TW1 && o->tew_base != TJ_PRUNE_TW2)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: tew's tile-wise part must be tw1 or tw2");
        if (!(o->ew_fraction > 0 && o->ew_fraction < 1) || !(o->sparsity + o->ew_fraction < 1))
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                           "prune: ew fraction %g must be in (0, 1) with sparsity + ew < 1 (sparsity %g)",
                           o->ew_fraction, o->sparsity);
    }
    if (nl < 1) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: no layers to prune");
    if (nl > TJ_MAX_LAYERS)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: %lld layers (at most %d)", (long long)nl, TJ_MAX_LAYERS);
    for (int64_t l = 0; l < nl; l++) {
        const tj_prune_layer_in *L = &in[l];
        if (!L->name || !L->w)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: layer %lld has no name or weights", (long long)l);
        if (L->n < 1 || L->n > TJ_MAX_DIM || L->k < 1 || L->k > TJ_MAX_DIM)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "layer '%s': shape [%lld, %lld] is not within [1, %lld] per side",
                           L->name, (long long)L->n, (long long)L->k, (long long)TJ_MAX_DIM);
    }
    const tj_prune_layer_in **sorted = malloc((size_t)nl * sizeof *sorted);
    if (!sorted) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "prune: out of memory");
    for (int64_t l = 0; l < nl; l++) sorted[l] = &in[l];
    qsort(sorted, (size_t)nl, sizeof *sorted, name_cmp);
    for (int64_t l = 1; l < nl; l++)
        if (strcmp(sorted[l - 1]->name, sorted[l]->name) == 0) {
            tj_status s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "prune: layer '%s' is given twice", sorted[l]->name);
            free(sorted);
            return s;
        }
    free(sorted);
    return TJ_OK;
}

tj_status tj_prune_layers(const tj_prune_layer_in *in, int64_t nl, const tj_prune_options *opt, tj_pattern **out,
                          tj_error *err)
{
    *out = NULL;
    tj_prune_options known = tj_prune_options_default(); /* fields the caller's size covers, over defaults */
    if (!opt || !tj_options_in(&known, sizeof known, opt))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tj_prune_options: start from tj_prune_options_default()");
    opt = &known;
    TJ_TRY(check_inputs(in, nl, opt, err));
    tj_status s = TJ_OK;
    const int tew = opt->mode == TJ_PRUNE_TEW;
    const tj_prune_mode base = tew ? opt->tew_base : opt->mode;
    const double s_tw = tew ? opt->sparsity + opt->ew_fraction : opt->sparsity;

    work *ws = calloc((size_t)nl, sizeof *ws);
    item *items = NULL;
    unsigned char *drop = NULL;
    float *buf = NULL;
    double *acc = NULL;
    tj_pattern *pat = NULL;
    int64_t total = 0, kmax = 1, nmax = 1, ncolitems = 0;
    for (int64_t l = 0; l < nl; l++) {
        total += in[l].n * in[l].k;
        if (in[l].k > kmax) kmax = in[l].k;
        if (in[l].n > nmax) nmax = in[l].n;
        ncolitems += in[l].n;
    }
    buf = malloc((size_t)kmax * sizeof *buf);
    acc = malloc((size_t)kmax * sizeof *acc);
    if (!ws || !buf || !acc) goto oom;
    for (int64_t l = 0; l < nl; l++) {
        ws[l].in = &in[l];
        ws[l].g = opt->g < in[l].n ? opt->g : in[l].n;
        ws[l].ncols = in[l].n;
    }

    int64_t row_target;
    if (base == TJ_PRUNE_TW2) {
        /* Columns first, at s' = 1 − sqrt(1 − S) of the weights; rows then take the rest. */
        double s1 = 1 - sqrt(1 - s_tw);
        items = malloc((size_t)ncolitems * sizeof *items);
        drop = calloc((size_t)ncolitems, 1);
        if (!items || !drop) goto oom;
        if ((s = column_items(ws, nl, items, buf, err)) != TJ_OK) goto fail;
        select_drop(items, ncolitems, llround(s1 * (double)total), drop);
        int64_t remaining = 0;
        for (int64_t l = 0; l < nl; l++) {
            work *w = &ws[l];
            int64_t kept = 0;
            for (int64_t row = 0; row < w->in->n; row++) kept += !drop[w->col0 + row];
            if (kept < w->in->n) {
                w->cols = malloc((size_t)(kept ? kept : 1) * sizeof *w->cols);
                if (!w->cols) goto oom;
                int64_t j = 0;
                for (int64_t row = 0; row < w->in->n; row++)
                    if (!drop[w->col0 + row]) w->cols[j++] = row;
            }
            w->ncols = kept;
            remaining += kept * w->in->k;
        }
        free(items);
        free(drop);
        items = NULL;
        drop = NULL;
        row_target = remaining - llround((1 - s_tw) * (double)total);
        if (row_target < 0) row_target = 0;
    } else {
        row_target = llround(s_tw * (double)total);
    }

    int64_t nrowitems = 0;
    for (int64_t l = 0; l < nl; l++) {
        ws[l].ntiles = (ws[l].ncols + ws[l].g - 1) / ws[l].g;
        nrowitems += ws[l].ntiles * ws[l].in->k;
    }
    items = malloc((size_t)(nrowitems ? nrowitems : 1) * sizeof *items);
    drop = calloc((size_t)(nrowitems ? nrowitems : 1), 1);
    if (!items || !drop) goto oom;
    if ((s = tile_row_items(ws, nl, items, buf, acc, err)) != TJ_OK) goto fail;
    select_drop(items, nrowitems, row_target, drop);
    free(items);
    items = NULL;

    if (tew && (s = add_residual(ws, nl, drop, llround(opt->ew_fraction * (double)total), buf, kmax, nmax, err)) != TJ_OK)
        goto fail;

    pat = calloc(1, sizeof *pat);
    if (!pat || !(pat->layers = calloc((size_t)nl, sizeof *pat->layers))) goto oom;
    pat->nlayers = nl;
    for (int64_t l = 0; l < nl; l++)
        if ((s = build_layer(&ws[l], drop, &pat->layers[l], err)) != TJ_OK) goto fail;
    *out = pat;
    pat = NULL;
    goto done;
oom:
    s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "prune: out of memory");
fail:
done:
    tj_pattern_destroy(pat);
    for (int64_t l = 0; ws && l < nl; l++) {
        free(ws[l].cols);
        free(ws[l].ew);
        free(ws[l].ew_ptr);
    }
    free(ws);
    free(items);
    free(drop);
    free(buf);
    free(acc);
    return s;
}
