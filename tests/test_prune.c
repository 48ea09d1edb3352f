/* Pruning on random multi-layer models: achieved density for every mode and S ∈ {0.5, 0.75, 0.9},
 * the global-threshold property (recomputed here independently), tw2's column re-tiling, tew's
 * residual, prune → pruned weights → pattern round trips, and bad inputs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prune/prune.h"
#include "tj_test.h"

static char dir[256];

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int next = 0;
    char *b = buf[next++ & 3];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

/* A random model: layers of odd shapes (n not a multiple of g, n < g), weights with per-row and
 * per-column scales so that scores differ by structure as in trained models. */
typedef struct model {
    int nl;
    tj_prune_layer_in in[5];
    char names[5][64];
    float *w[5];
    float *score[5];
} model;

static const int64_t shapes[5][2] = {{300, 200}, {256, 128}, {64, 96}, {512, 64}, {130, 257}};

static void model_init(model *m, uint64_t seed, int with_scores)
{
    memset(m, 0, sizeof *m);
    tj_rng r = {seed};
    m->nl = 5;
    for (int l = 0; l < m->nl; l++) {
        int64_t n = shapes[l][0], k = shapes[l][1];
        snprintf(m->names[l], sizeof m->names[l], "block.%d.linear", l);
        m->w[l] = malloc((size_t)(n * k) * sizeof(float));
        float *cs = malloc((size_t)k * sizeof(float));
        for (int64_t i = 0; i < k; i++) cs[i] = expf(tj_rng_uniform(&r));
        for (int64_t row = 0; row < n; row++) {
            float rs = expf(tj_rng_uniform(&r)) * (1.0f + 0.5f * (float)l);
            for (int64_t i = 0; i < k; i++) m->w[l][row * k + i] = tj_rng_uniform(&r) * rs * cs[i];
        }
        free(cs);
        m->in[l] = (tj_prune_layer_in){m->names[l], n, k, m->w[l], TJ_F32, NULL, TJ_F32};
        if (with_scores) {
            m->score[l] = malloc((size_t)(n * k) * sizeof(float));
            for (int64_t i = 0; i < n * k; i++) m->score[l][i] = (tj_rng_uniform(&r) + 1.0f) * 2.0f;
            m->in[l].score = m->score[l];
        }
    }
}

static void model_free(model *m)
{
    for (int l = 0; l < m->nl; l++) {
        free(m->w[l]);
        free(m->score[l]);
    }
}

static float elem_score(const tj_prune_layer_in *L, int64_t row, int64_t i)
{
    const float *p = L->score ? L->score : L->w;
    float v = p[row * L->k + i];
    return L->score ? v : fabsf(v);
}

/* mask[row·k + i] of a pattern layer: 1 TW-kept, 2 ew, 0 pruned. */
static unsigned char *layer_mask(const tj_layer *l)
{
    unsigned char *m = calloc((size_t)(l->n * l->k), 1);
    for (int64_t t = 0; t < l->ntiles; t++)
        for (int64_t c = 0; c < tj_tile_width(l, t); c++) {
            int64_t row = tj_layer_col(l, t * l->g + c);
            for (int64_t r = l->tile_ptr[t]; r < l->tile_ptr[t + 1]; r++) m[row * l->k + l->tile_rows[r]] = 1;
        }
    for (int64_t row = 0; l->ew_indptr && row < l->n; row++)
        for (int64_t e = l->ew_indptr[row]; e < l->ew_indptr[row + 1]; e++) m[row * l->k + l->ew_indices[e]] = 2;
    return m;
}

static double density(const tj_pattern *p)
{
    int64_t all = 0, kept = 0;
    for (int64_t i = 0; i < p->nlayers; i++) {
        all += p->layers[i].n * p->layers[i].k;
        kept += tj_layer_kept(&p->layers[i]);
    }
    return (double)kept / (double)all;
}

/* Tile-row scores recomputed from the pattern's own tiling (kept columns), compared across all
 * layers: min over kept rows ≥ max over removed rows. */
static void check_row_threshold(const model *m, const tj_pattern *p, const char *label)
{
    double min_kept = INFINITY, max_removed = -INFINITY;
    for (int l = 0; l < m->nl; l++) {
        const tj_layer *ly = &p->layers[l];
        const tj_prune_layer_in *L = &m->in[l];
        char *kept = malloc((size_t)L->k);
        for (int64_t t = 0; t < ly->ntiles; t++) {
            memset(kept, 0, (size_t)L->k);
            for (int64_t r = ly->tile_ptr[t]; r < ly->tile_ptr[t + 1]; r++) kept[ly->tile_rows[r]] = 1;
            int64_t w = tj_tile_width(ly, t);
            for (int64_t i = 0; i < L->k; i++) {
                double s = 0;
                for (int64_t c = 0; c < w; c++) {
                    double e = elem_score(L, tj_layer_col(ly, t * ly->g + c), i);
                    s += e * e;
                }
                s = sqrt(s) / (double)w;
                if (kept[i]) min_kept = s < min_kept ? s : min_kept;
                else max_removed = s > max_removed ? s : max_removed;
            }
        }
        free(kept);
    }
    CHECKF(max_removed <= min_kept * (1 + 1e-9), "%s: a removed tile-row scores %.9g > a kept one %.9g", label,
           max_removed, min_kept);
}

/* tw2: kept columns outscore removed ones across layers (score ‖·‖₂ / k over the full row). */
static void check_col_threshold(const model *m, const tj_pattern *p, const char *label)
{
    double min_kept = INFINITY, max_removed = -INFINITY;
    int any_removed = 0;
    for (int l = 0; l < m->nl; l++) {
        const tj_layer *ly = &p->layers[l];
        const tj_prune_layer_in *L = &m->in[l];
        char *kept = calloc((size_t)L->n, 1);
        for (int64_t j = 0; j < ly->ncols; j++) kept[tj_layer_col(ly, j)] = 1;
        for (int64_t row = 0; row < L->n; row++) {
            double s = 0;
            for (int64_t i = 0; i < L->k; i++) {
                double e = elem_score(L, row, i);
                s += e * e;
            }
            s = sqrt(s) / (double)L->k;
            if (kept[row]) min_kept = s < min_kept ? s : min_kept;
            else {
                max_removed = s > max_removed ? s : max_removed;
                any_removed = 1;
            }
        }
        free(kept);
        /* Re-tiling: every tile but the last holds exactly g kept columns. */
        for (int64_t t = 0; t + 1 < ly->ntiles; t++) CHECK(tj_tile_width(ly, t) == ly->g);
        if (ly->ntiles) CHECK(tj_tile_width(ly, ly->ntiles - 1) >= 1 && tj_tile_width(ly, ly->ntiles - 1) <= ly->g);
        CHECK(ly->ntiles == (ly->ncols + ly->g - 1) / ly->g);
    }
    CHECKF(any_removed, "%s: tw2 removed no column", label);
    CHECKF(max_removed <= min_kept * (1 + 1e-9), "%s: a removed column scores %.9g > a kept one %.9g", label,
           max_removed, min_kept);
}

static void test_modes(void)
{
    const double S[3] = {0.5, 0.75, 0.9};
    const tj_prune_mode modes[4] = {TJ_PRUNE_TW1, TJ_PRUNE_TW2, TJ_PRUNE_TEW, TJ_PRUNE_TEW};
    for (int with_scores = 0; with_scores < 2; with_scores++)
        for (int mi = 0; mi < 4; mi++)
            for (int si = 0; si < 3; si++)
                for (int gi = 0; gi < 2; gi++) {
                    model m;
                    model_init(&m, 1000 + (uint64_t)(si * 10 + mi), with_scores);
                    tj_prune_options o = tj_prune_options_default();
                    o.sparsity = S[si];
                    o.mode = modes[mi];
                    o.g = gi ? 32 : 128;
                    o.tew_base = mi == 3 ? TJ_PRUNE_TW2 : TJ_PRUNE_TW1;
                    o.ew_fraction = si == 2 ? 0.05 : 0.01;
                    char label[96];
                    snprintf(label, sizeof label, "%s%s S=%.2f g=%lld%s", tj_prune_mode_name(o.mode),
                             mi == 3 ? "(tw2)" : "", o.sparsity, (long long)o.g, with_scores ? " scores" : "");
                    tj_pattern *p = NULL;
                    tj_error err = {0};
                    CHECK_OK(tj_prune_layers(m.in, m.nl, &o, &p, &err), &err);
                    if (!p) {
                        model_free(&m);
                        continue;
                    }
                    double d = density(p);
                    CHECKF(fabs(d - (1 - o.sparsity)) <= 0.005, "%s: density %.5f, want %.5f", label, d, 1 - o.sparsity);
                    CHECK(p->nlayers == m.nl);
                    /* Layers keep their order, names, and g = min(g, n). */
                    for (int l = 0; l < m.nl; l++) {
                        CHECK(strcmp(p->layers[l].name, m.names[l]) == 0);
                        CHECK(p->layers[l].g == (o.g < m.in[l].n ? o.g : m.in[l].n));
                        tj_error e2 = {0};
                        CHECK_OK(tj_layer_validate(&p->layers[l], label, &e2), &e2);
                    }
                    /* Non-uniform: one global threshold gives layers different densities. */
                    double dmin = 1, dmax = 0;
                    for (int l = 0; l < m.nl; l++) {
                        double dl = (double)tj_layer_kept(&p->layers[l]) / (double)(m.in[l].n * m.in[l].k);
                        dmin = dl < dmin ? dl : dmin;
                        dmax = dl > dmax ? dl : dmax;
                    }
                    if (!with_scores) CHECKF(dmax - dmin > 0.02, "%s: layer densities all ~%.3f", label, dmin);
                    int base = o.mode == TJ_PRUNE_TEW ? o.tew_base : o.mode;
                    check_row_threshold(&m, p, label);
                    if (base == TJ_PRUNE_TW1)
                        for (int l = 0; l < m.nl; l++) CHECK(p->layers[l].cols == NULL && p->layers[l].ncols == m.in[l].n);
                    else
                        check_col_threshold(&m, p, label);
                    int64_t total = 0, ew = 0, tw_kept = 0;
                    for (int l = 0; l < m.nl; l++) {
                        total += m.in[l].n * m.in[l].k;
                        ew += p->layers[l].ew_nnz;
                        tw_kept += tj_layer_kept(&p->layers[l]) - p->layers[l].ew_nnz;
                    }
                    if (o.mode == TJ_PRUNE_TEW) {
                        /* Exactly the requested residual, none of it TW-kept, and the best of the rest. */
                        CHECKF(ew == llround(o.ew_fraction * (double)total), "%s: ew %lld, want %lld", label,
                               (long long)ew, (long long)llround(o.ew_fraction * (double)total));
                        double tw_d = (double)tw_kept / (double)total;
                        CHECKF(fabs(tw_d - (1 - o.sparsity - o.ew_fraction)) <= 0.005, "%s: TW density %.5f", label, tw_d);
                        float min_ew = INFINITY, max_out = -INFINITY;
                        int overlap = 0;
                        for (int l = 0; l < m.nl; l++) {
                            const tj_layer *ly = &p->layers[l];
                            unsigned char *mk = layer_mask(ly);
                            int64_t tw_here = 0;
                            for (int64_t i = 0; i < ly->n * ly->k; i++) tw_here += mk[i] == 1;
                            if (tw_here != tj_layer_kept(ly) - ly->ew_nnz) overlap++; /* an ew entry overwrote a TW one */
                            for (int64_t row = 0; row < ly->n; row++)
                                for (int64_t i = 0; i < ly->k; i++) {
                                    float s = elem_score(&m.in[l], row, i);
                                    if (mk[row * ly->k + i] == 2) min_ew = s < min_ew ? s : min_ew;
                                    else if (mk[row * ly->k + i] == 0) max_out = s > max_out ? s : max_out;
                                }
                            free(mk);
                        }
                        CHECKF(!overlap, "%s: ew repeats TW-kept weights", label);
                        CHECKF(max_out <= min_ew, "%s: a left-out weight scores %g > an ew one %g", label, max_out, min_ew);
                    } else {
                        CHECK(ew == 0);
                        for (int l = 0; l < m.nl; l++) CHECK(p->layers[l].ew_indptr == NULL);
                    }
                    tj_pattern_destroy(p);
                    model_free(&m);
                }
}

/* Deterministic, S = 0 keeps everything, and ties (all-equal scores) are handled. */
static void test_edges(void)
{
    model m;
    model_init(&m, 7, 0);
    tj_prune_options o = tj_prune_options_default();
    tj_error err = {0};
    tj_pattern *a = NULL, *b = NULL;
    CHECK_OK(tj_prune_layers(m.in, m.nl, &o, &a, &err), &err);
    CHECK_OK(tj_prune_layers(m.in, m.nl, &o, &b, &err), &err);
    if (a && b) {
        char *ja = tj_pattern_to_json(a), *jb = tj_pattern_to_json(b);
        CHECK(ja && jb && strcmp(ja, jb) == 0);
        free(ja);
        free(jb);
    }
    tj_pattern_destroy(a);
    tj_pattern_destroy(b);
    for (int mode = TJ_PRUNE_TW1; mode <= TJ_PRUNE_TW2; mode++) {
        o.sparsity = 0;
        o.mode = (tj_prune_mode)mode;
        CHECK_OK(tj_prune_layers(m.in, m.nl, &o, &a, &err), &err);
        if (a) CHECK(density(a) == 1.0);
        tj_pattern_destroy(a);
        a = NULL;
    }
    /* All-equal weights: every tile-row ties; the density still comes out right. */
    for (int l = 0; l < m.nl; l++)
        for (int64_t i = 0; i < m.in[l].n * m.in[l].k; i++) m.w[l][i] = 0.5f;
    o.sparsity = 0.75;
    for (int mode = TJ_PRUNE_TW1; mode <= TJ_PRUNE_TEW; mode++) {
        o.mode = (tj_prune_mode)mode;
        CHECK_OK(tj_prune_layers(m.in, m.nl, &o, &a, &err), &err);
        if (a) CHECKF(fabs(density(a) - 0.25) <= 0.005, "ties, mode %d: density %.4f", mode, density(a));
        if (a && mode == TJ_PRUNE_TEW) { /* the tie quota: exactly F of all weights */
            int64_t ew = 0, total = 0;
            for (int l = 0; l < m.nl; l++) {
                ew += a->layers[l].ew_nnz;
                total += m.in[l].n * m.in[l].k;
            }
            CHECKF(ew == llround(0.01 * (double)total), "ties: ew %lld", (long long)ew);
        }
        tj_pattern_destroy(a);
        a = NULL;
    }
    /* F16 and BF16 weights prune like their F32 values. */
    o.mode = TJ_PRUNE_TW1;
    model_free(&m);
    model_init(&m, 8, 0);
    tj_prune_layer_in in16[5];
    uint16_t *h[5];
    for (int l = 0; l < m.nl; l++) {
        int64_t n = m.in[l].n * m.in[l].k;
        h[l] = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) {
            h[l][i] = tj_f32_to_bf16(m.w[l][i]);
            m.w[l][i] = tj_bf16_to_f32(h[l][i]);
        }
        in16[l] = m.in[l];
        in16[l].w = h[l];
        in16[l].wdt = TJ_BF16;
    }
    CHECK_OK(tj_prune_layers(m.in, m.nl, &o, &a, &err), &err);
    CHECK_OK(tj_prune_layers(in16, m.nl, &o, &b, &err), &err);
    if (a && b) {
        char *ja = tj_pattern_to_json(a), *jb = tj_pattern_to_json(b);
        CHECK(ja && jb && strcmp(ja, jb) == 0);
        free(ja);
        free(jb);
    }
    tj_pattern_destroy(a);
    tj_pattern_destroy(b);
    for (int l = 0; l < m.nl; l++) free(h[l]);
    model_free(&m);
}

static void test_bad_inputs(void)
{
    model m;
    model_init(&m, 9, 0);
    tj_prune_options o = tj_prune_options_default();
    tj_error err = {0};
    tj_pattern *p = NULL;
    const double bad_s[] = {-0.1, 1.0, 1.5, NAN};
    for (int i = 0; i < 4; i++) {
        o.sparsity = bad_s[i];
        tj_status st = tj_prune_layers(m.in, m.nl, &o, &p, &err);
        CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "sparsity") && strstr(err.msg, "[0, 1)"), "%s", err.msg);
        CHECK(p == NULL);
    }
    o = tj_prune_options_default();
    o.mode = TJ_PRUNE_TEW;
    o.sparsity = 0.95;
    o.ew_fraction = 0.05;
    tj_status st = tj_prune_layers(m.in, m.nl, &o, &p, &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "ew fraction"), "%s", err.msg);
    o = tj_prune_options_default();
    o.g = 0;
    st = tj_prune_layers(m.in, m.nl, &o, &p, &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "g 0"), "%s", err.msg);
    o = tj_prune_options_default();
    st = tj_prune_layers(m.in, 0, &o, &p, &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "no layers"), "%s", err.msg);
    tj_prune_layer_in dup[2] = {m.in[0], m.in[0]};
    st = tj_prune_layers(dup, 2, &o, &p, &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "given twice"), "%s", err.msg);
    m.w[2][17] = NAN;
    for (int mode = TJ_PRUNE_TW1; mode <= TJ_PRUNE_TW2; mode++) {
        o.mode = (tj_prune_mode)mode;
        st = tj_prune_layers(m.in, m.nl, &o, &p, &err);
        CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "block.2.linear") && strstr(err.msg, "NaN"), "%s", err.msg);
        CHECK(p == NULL);
    }
    model_free(&m);
}

/* ---- through files: select, write pruned weights, read the pattern back ---- */

static void write_model_file(const model *m, const char *path, tj_dtype dt)
{
    tj_st_out_tensor ts[32];
    char names[32][96];
    void *bufs[32] = {0};
    int n = 0;
    int64_t one[1] = {4}, ids_shape[2] = {1, 3}, emb_shape[2] = {10, 8};
    static float bias[512], norm[4] = {1, 2, 3, 4}, emb[80];
    static int64_t ids[3] = {0, 1, 2};
    for (int i = 0; i < 512; i++) bias[i] = (float)i * 0.01f;
    for (int i = 0; i < 80; i++) emb[i] = (float)i;
    for (int l = 0; l < m->nl; l++) {
        int64_t cnt = m->in[l].n * m->in[l].k;
        bufs[n] = malloc((size_t)cnt * tj_dtype_size(dt));
        tj_convert_from_f32(m->w[l], cnt, dt, bufs[n]);
        snprintf(names[n], 96, "%s.weight", m->names[l]);
        ts[n] = (tj_st_out_tensor){names[n], tj_dtype_name(dt), 2, shapes[l], bufs[n], (uint64_t)cnt * tj_dtype_size(dt)};
        n++;
        snprintf(names[n], 96, "%s.bias", m->names[l]);
        ts[n] = (tj_st_out_tensor){names[n], "F32", 1, shapes[l], bias, (uint64_t)shapes[l][0] * 4};
        n++;
    }
    ts[n++] = (tj_st_out_tensor){"norm.weight", "F32", 1, one, norm, sizeof norm};
    ts[n++] = (tj_st_out_tensor){"embeddings.word_embeddings.weight", "F32", 2, emb_shape, emb, sizeof emb};
    ts[n++] = (tj_st_out_tensor){"position_ids", "I64", 2, ids_shape, ids, sizeof ids};
    tj_error err = {0};
    CHECK_OK(tj_st_write(path, ts, n, "{\"format\": \"pt\"}", &err), &err);
    for (int i = 0; i < n; i++) free(bufs[i]);
}

static void test_files(void)
{
    model m;
    model_init(&m, 21, 0);
    const tj_dtype dts[3] = {TJ_F32, TJ_F16, TJ_BF16};
    for (int di = 0; di < 3; di++)
        for (int mode = TJ_PRUNE_TW1; mode <= TJ_PRUNE_TEW; mode++)
            for (int si = 0; si < 2; si++) {
                const char *src = tmp_path("model.safetensors"), *dst = tmp_path("pruned.safetensors");
                write_model_file(&m, src, dts[di]);
                tj_error err = {0};
                tj_st_file *wf = NULL, *pf = NULL;
                tj_prune_layer_in *in = NULL, *pin = NULL;
                int64_t nl = 0, pnl = 0;
                tj_pattern *p = NULL, *q = NULL;
                char label[64];
                snprintf(label, sizeof label, "%s %s S=%s", tj_dtype_name(dts[di]), tj_prune_mode_name((tj_prune_mode)mode),
                         si ? "0.9" : "0.5");
                CHECK_OK(tj_st_open(src, &wf, &err), &err);
                if (!wf) continue;
                /* Default selection: the five 2-D *.weight layers, not the embedding, not the 1-D norm. */
                CHECK_OK(tj_prune_select(wf, NULL, NULL, &in, &nl, &err), &err);
                CHECKF(nl == 5, "%s: %lld layers selected", label, (long long)nl);
                tj_prune_options o = tj_prune_options_default();
                o.mode = (tj_prune_mode)mode;
                o.sparsity = si ? 0.9 : 0.5;
                CHECK_OK(tj_prune_layers(in, nl, &o, &p, &err), &err);
                if (p) CHECK_OK(tj_prune_write_weights(wf, p, dst, &err), &err);
                CHECK_OK(tj_st_open(dst, &pf, &err), &err);
                if (!p || !pf) goto next;
                /* Every other tensor is copied byte for byte, metadata too. */
                CHECK(pf->ntensors == wf->ntensors);
                for (int64_t i = 0; i < wf->ntensors && i < pf->ntensors; i++) {
                    const tj_st_tensor *a = &wf->tensors[i], *b = &pf->tensors[i];
                    CHECK(strcmp(a->name, b->name) == 0 && strcmp(a->dtype_str, b->dtype_str) == 0 && a->ndim == b->ndim);
                    CHECK(a->end - a->begin == b->end - b->begin);
                    if (!strstr(a->name, "block.") || !strstr(a->name, ".weight"))
                        CHECKF(memcmp(a->data, b->data, a->end - a->begin) == 0, "%s: %s changed", label, a->name);
                }
                CHECK(pf->metadata_json && strstr(pf->metadata_json, "\"format\":\"pt\""));
                /* Pruned weights: the original inside the mask, zero outside. */
                int bad = 0;
                for (int64_t li = 0; li < p->nlayers; li++) {
                    const tj_layer *l = &p->layers[li];
                    char name[96];
                    snprintf(name, sizeof name, "%s.weight", l->name);
                    const tj_st_tensor *a = tj_st_find(wf, name), *b = tj_st_find(pf, name);
                    unsigned char *mk = layer_mask(l);
                    size_t es = tj_dtype_size(a->dtype);
                    for (int64_t i = 0; i < l->n * l->k; i++) {
                        const char *pa = (const char *)a->data + (size_t)i * es, *pb = (const char *)b->data + (size_t)i * es;
                        static const char zero[4] = {0};
                        if (mk[i] ? memcmp(pa, pb, es) != 0 : memcmp(pb, zero, es) != 0) bad++;
                    }
                    free(mk);
                }
                CHECKF(bad == 0, "%s: %d pruned weights wrong", label, bad);
                /* The pattern read back: identical for tw1/tw2; for tew, the mask grows to whole rows. */
                CHECK_OK(tj_prune_select(pf, NULL, NULL, &pin, &pnl, &err), &err);
                if (pin) CHECK_OK(tj_pattern_from_weights(pin, pnl, 128, &q, &err), &err);
                if (!q) goto next;
                if (mode != TJ_PRUNE_TEW) {
                    char *ja = tj_pattern_to_json(p), *jb = tj_pattern_to_json(q);
                    CHECKF(ja && jb && strcmp(ja, jb) == 0, "%s: pattern from pruned weights differs", label);
                    free(ja);
                    free(jb);
                } else {
                    for (int64_t li = 0; li < p->nlayers; li++) {
                        unsigned char *ma = layer_mask(&p->layers[li]), *mb = layer_mask(&q->layers[li]);
                        int lost = 0;
                        for (int64_t i = 0; i < p->layers[li].n * p->layers[li].k; i++) lost += ma[i] && !mb[i];
                        CHECKF(lost == 0, "%s: recovered pattern drops %d kept weights", label, lost);
                        free(ma);
                        free(mb);
                    }
                }
            next:
                tj_pattern_destroy(p);
                tj_pattern_destroy(q);
                free(in);
                free(pin);
                tj_st_close(wf);
                tj_st_close(pf);
            }
    model_free(&m);
}

/* tw1 at high sparsity leaves empty tiles; pattern recovery keeps them as empty tiles (no cols). */
static void test_recover_empty_tiles(void)
{
    int64_t n = 300, k = 40, g = 64;
    float *w = calloc((size_t)(n * k), sizeof *w);
    tj_rng r = {5};
    for (int64_t row = 0; row < n; row++) {
        if (row >= 64 && row < 128) continue; /* tile 1 empty */
        for (int64_t i = 0; i < k; i += 3) w[row * k + i] = tj_rng_uniform(&r) + 2.0f;
    }
    tj_prune_layer_in in = {"x", n, k, w, TJ_F32, NULL, TJ_F32};
    tj_pattern *p = NULL;
    tj_error err = {0};
    CHECK_OK(tj_pattern_from_weights(&in, 1, g, &p, &err), &err);
    if (p) {
        const tj_layer *l = &p->layers[0];
        CHECK(l->cols == NULL && l->ntiles == 5 && tj_tile_nrows(l, 1) == 0 && tj_tile_nrows(l, 0) == 14);
    }
    tj_pattern_destroy(p);
    /* Scattered all-zero features: tiling only the nonzero ones (cols) keeps fewer weights. */
    memset(w, 0, (size_t)(n * k) * sizeof *w);
    for (int64_t row = 0; row < n; row += 2)
        for (int64_t i = 0; i < k; i++) w[row * k + i] = 1.0f;
    p = NULL;
    CHECK_OK(tj_pattern_from_weights(&in, 1, g, &p, &err), &err);
    if (p) {
        const tj_layer *l = &p->layers[0];
        CHECK(l->cols != NULL && l->ncols == 150 && l->cols[1] == 2 && l->ntiles == 3 && tj_layer_kept(l) == 150 * k);
    }
    tj_pattern_destroy(p);
    /* An all-zero layer: every tile empty. */
    memset(w, 0, (size_t)(n * k) * sizeof *w);
    p = NULL;
    CHECK_OK(tj_pattern_from_weights(&in, 1, g, &p, &err), &err);
    if (p) CHECK(tj_layer_kept(&p->layers[0]) == 0);
    tj_pattern_destroy(p);
    free(w);
}

static void test_select_errors(void)
{
    model m;
    model_init(&m, 33, 0);
    const char *src = tmp_path("sel.safetensors");
    write_model_file(&m, src, TJ_F32);
    tj_error err = {0};
    tj_st_file *wf = NULL;
    CHECK_OK(tj_st_open(src, &wf, &err), &err);
    if (!wf) return;
    tj_prune_layer_in *in = NULL;
    int64_t nl = 0;
    tj_status st = tj_prune_select(wf, "^nothing", NULL, &in, &nl, &err);
    CHECKF(st == TJ_ERR_NOT_FOUND && strstr(err.msg, "no layer matches --layers '^nothing'"), "%s", err.msg);
    st = tj_prune_select(wf, "norm", NULL, &in, &nl, &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "'norm.weight'") && strstr(err.msg, "1-D [4]"), "%s", err.msg);
    st = tj_prune_select(wf, "block.(", NULL, &in, &nl, &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "not a valid regular expression"), "%s", err.msg);
    CHECK(in == NULL);
    /* A regex picks layers explicitly, embeddings included if asked; order is natural. */
    CHECK_OK(tj_prune_select(wf, "block\\.[13]|embed", NULL, &in, &nl, &err), &err);
    CHECK(nl == 3 && in && strcmp(in[0].name, "block.1.linear") == 0 && strcmp(in[2].name, "embeddings.word_embeddings") == 0);
    free(in);
    in = NULL;
    /* Scores: the same tensor names and shapes in another file. */
    const char *sc = tmp_path("scores.safetensors");
    model m2;
    model_init(&m2, 34, 0);
    m2.nl = 4; /* block.4 missing */
    write_model_file(&m2, sc, TJ_F32);
    tj_st_file *sf = NULL;
    CHECK_OK(tj_st_open(sc, &sf, &err), &err);
    if (sf) {
        st = tj_prune_select(wf, NULL, sf, &in, &nl, &err);
        CHECKF(st == TJ_ERR_NOT_FOUND && strstr(err.msg, "no tensor 'block.4.linear.weight'"), "%s", err.msg);
        CHECK_OK(tj_prune_select(wf, "block\\.[0-3]", sf, &in, &nl, &err), &err);
        CHECK(nl == 4 && in && in[0].score != NULL);
        free(in);
        in = NULL;
        tj_st_close(sf);
    }
    /* Shape mismatch between scores and weights. */
    m2.nl = 5;
    tj_st_out_tensor bad[1] = {{"block.0.linear.weight", "F32", 2, (int64_t[]){200, 300}, m2.w[0], 300 * 200 * 4}};
    CHECK_OK(tj_st_write(sc, bad, 1, NULL, &err), &err);
    sf = NULL;
    CHECK_OK(tj_st_open(sc, &sf, &err), &err);
    if (sf) {
        st = tj_prune_select(wf, "block\\.0", sf, &in, &nl, &err);
        CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "[200, 300]") && strstr(err.msg, "[300, 200]"), "%s", err.msg);
        tj_st_close(sf);
    }
    /* NAME.score is accepted too (the method's name for Taylor scores, docs/pruning.md). */
    tj_st_out_tensor alt[1] = {{"block.0.linear.score", "F32", 2, shapes[0], m2.w[0], 300 * 200 * 4}};
    CHECK_OK(tj_st_write(sc, alt, 1, NULL, &err), &err);
    sf = NULL;
    CHECK_OK(tj_st_open(sc, &sf, &err), &err);
    if (sf) {
        CHECK_OK(tj_prune_select(wf, "block\\.0", sf, &in, &nl, &err), &err);
        CHECK(nl == 1 && in && in[0].score == tj_st_find(sf, "block.0.linear.score")->data);
        free(in);
        in = NULL;
        st = tj_prune_select(wf, "block\\.[01]", sf, &in, &nl, &err);
        CHECKF(st == TJ_ERR_NOT_FOUND && strstr(err.msg, "nor 'block.1.linear.score'"), "%s", err.msg);
        tj_st_close(sf);
    }
    /* A pattern whose layer is missing from the weights cannot be written. */
    tj_pattern *p = NULL;
    CHECK_OK(tj_pattern_from_weights(m.in, 1, 128, &p, &err), &err);
    if (p) {
        free(p->layers[0].name);
        p->layers[0].name = strdup("ghost");
        st = tj_prune_write_weights(wf, p, tmp_path("ghost.safetensors"), &err);
        CHECKF(st == TJ_ERR_NOT_FOUND && strstr(err.msg, "'ghost.weight'"), "%s", err.msg);
    }
    tj_pattern_destroy(p);
    tj_st_close(wf);
    model_free(&m);
    model_free(&m2);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tj_test_prune_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_modes();
    test_edges();
    test_bad_inputs();
    test_files();
    test_recover_empty_tiles();
    test_select_errors();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tj_test_end();
}
