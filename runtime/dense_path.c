/* The dense path (dense_path.h, docs/dense-path.md): a layer's masked weights on oneDNN or
 * OpenBLAS (base/dense.c), and the choice per layer and M class between it and the backend's
 * kernel. model.c builds the choice after the backend's load and dispatches by it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "runtime/dense_path.h"
#include "runtime/dense_rule.h"
#include "base/dense.h"
#include "base/host.h"
#include "base/threadpool.h"
#include "tuning/tuning.h"

int tj_path_bucket(int64_t m)
{
    int b = tj_tune_m_bucket(m);
    return b < TJ_M_CLASSES - 1 ? b : TJ_M_CLASSES - 1;
}

/* The M a class stands for in the rule and the records: its upper end; the open last class the
 * next power of two. */
static int64_t bucket_m(int b) { return (int64_t)1 << b; }

/* ---------------------------------------------------------------- one layer */

enum { LIB_ONEDNN, LIB_OPENBLAS };

struct tj_dense_layer {
    int lib;
    tj_onednn_matmul *mm;       /* oneDNN: packed weights, bias and activation inside */
    float *w;                   /* OpenBLAS: W ⊙ mask, fp32 [n × k] */
    float *bias;                /* OpenBLAS: fp32 [n], or NULL */
    tj_dense_act act;
    int64_t n, k;
    int threads;
    char name[200];
};

void tj_dense_masked_weights(const tj_layer *l, const tj_layer_weights *w, float *out)
{
    memset(out, 0, (size_t)(l->n * l->k) * sizeof *out);
    for (int64_t t = 0; t < l->ntiles; t++) {
        const int32_t *rows = l->tile_rows + l->tile_ptr[t];
        for (int64_t c = 0; c < tj_tile_width(l, t); c++) {
            int64_t n = tj_layer_col(l, t * l->g + c);
            for (int64_t r = 0; r < tj_tile_nrows(l, t); r++)
                out[n * l->k + rows[r]] = tj_load_f32(w->w, w->wdt, n * l->k + rows[r]);
        }
    }
    for (int64_t n = 0; l->ew_nnz > 0 && n < l->n; n++)
        for (int64_t e = l->ew_indptr[n]; e < l->ew_indptr[n + 1]; e++)
            out[n * l->k + l->ew_indices[e]] = tj_load_f32(w->w, w->wdt, n * l->k + l->ew_indices[e]);
}

void tj_dense_layer_free(tj_dense_layer *d)
{
    if (!d) return;
    tj_onednn_matmul_destroy(d->mm);
    free(d->w);
    free(d->bias);
    free(d);
}

tj_status tj_dense_layer_create(const tj_layer *l, const tj_layer_weights *w, int threads, tj_dense_layer **out,
                                tj_error *err)
{
    *out = NULL;
    int64_t nk;
    if (!tj_mul_ok(l->n, l->k, &nk) || nk > INT64_MAX / 4)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "layer '%s': too large for the dense path", l->name);
    tj_dense_layer *d = calloc(1, sizeof *d);
    if (!d) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    d->act = l->act == TJ_ACT_RELU ? TJ_DENSE_ACT_RELU : l->act == TJ_ACT_GELU ? TJ_DENSE_ACT_GELU : TJ_DENSE_ACT_NONE;
    d->n = l->n;
    d->k = l->k;
    d->threads = threads; /* 0: oneDNN follows the caller's OpenMP count */
    tj_status s = TJ_OK;
    d->w = malloc((size_t)(nk ? nk : 1) * sizeof *d->w);
    if (w->bias) d->bias = malloc((size_t)l->n * sizeof *d->bias);
    if (!d->w || (w->bias && !d->bias)) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory for the dense path's weights", l->name);
        goto fail;
    }
    tj_dense_masked_weights(l, w, d->w);
    if (w->bias) tj_convert_to_f32(w->bias, w->bdt, l->n, d->bias);
    tj_onednn_matmul_desc md = {.m = 0, .n = l->n, .k = l->k, .bias = w->bias != NULL, .act = d->act,
                                .threads = d->threads};
    tj_error oerr;
    tj_error_clear(&oerr);
    s = tj_onednn_matmul_create(&md, d->w, d->bias, &d->mm, &oerr);
    if (s == TJ_OK) { /* oneDNN holds its own packed copies */
        d->lib = LIB_ONEDNN;
        snprintf(d->name, sizeof d->name, "%s", tj_onednn_matmul_name(d->mm));
        free(d->w);
        free(d->bias);
        d->w = d->bias = NULL;
    } else if (s == TJ_ERR_UNSUPPORTED && tj_openblas_built()) {
        s = TJ_OK;
        d->lib = LIB_OPENBLAS;
        snprintf(d->name, sizeof d->name, "%s", tj_openblas_name(2));
    } else if (s == TJ_ERR_UNSUPPORTED) {
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "no dense library: %s; %s", oerr.msg, tj_openblas_name(2));
    } else {
        s = tj_fail(err, s, "layer '%s': %s", l->name, oerr.msg);
    }
fail:
    if (s != TJ_OK) {
        tj_dense_layer_free(d);
        return s;
    }
    *out = d;
    return TJ_OK;
}

tj_status tj_dense_layer_run(const tj_dense_layer *d, const float *x, float *y, int64_t m, tj_error *err)
{
    if (d->lib == LIB_ONEDNN) return tj_onednn_matmul_run(d->mm, x, y, m, err);
    return tj_openblas_gemm(x, d->w, d->bias, d->act, y, m, d->n, d->k, d->threads > 0 ? d->threads : tj_cpu_count(), err);
}

const char *tj_dense_layer_name(const tj_dense_layer *d) { return d->name; }
const char *tj_dense_layer_word(const tj_dense_layer *d) { return d->lib == LIB_ONEDNN ? "onednn" : "openblas"; }

/* ---------------------------------------------------------------- a model's paths */

enum { SRC_FORCED = 1, SRC_RECORDS, SRC_RULE, SRC_BF16, SRC_OFF };

typedef struct path_layer {
    tj_dense_layer *dense;                 /* NULL: the kernel at every M */
    unsigned char dense_at[TJ_M_CLASSES]; /* 1: the dense path at this class */
    unsigned char src[TJ_M_CLASSES];      /* what decided */
    char *records_why[TJ_M_CLASSES];      /* SRC_RECORDS: the records' line */
    int wanted;                            /* the choice wanted the dense path somewhere */
} path_layer;

struct tj_paths {
    const tj_pattern *p;
    int threads;
    path_layer *l;
    char nolib[600];                       /* why no dense library could run a layer ("" if none failed) */
    int off;                               /* TILEJIT_DENSE_PATH=off */
};

void tj_paths_free(tj_paths *ps)
{
    if (!ps) return;
    for (int64_t i = 0; i < ps->p->nlayers; i++) {
        tj_dense_layer_free(ps->l[i].dense);
        for (int b = 0; b < TJ_M_CLASSES; b++) free(ps->l[i].records_why[b]);
    }
    free(ps->l);
    free(ps);
}

static double density_of(const tj_layer *l)
{
    return l->n > 0 && l->k > 0 ? (double)tj_layer_kept(l) / ((double)l->n * (double)l->k) : 0;
}

tj_status tj_paths_build(tj_context *c, const char *backend, const tj_pattern *p, const tj_layer_weights *lw,
                         int threads, int dense_threads, const unsigned char *kernel_bf16, tj_paths **out,
                         tj_error *err)
{
    *out = NULL;
    tj_paths *ps = calloc(1, sizeof *ps);
    if (!ps) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    ps->p = p;
    ps->threads = threads;
    ps->l = calloc((size_t)(p->nlayers ? p->nlayers : 1), sizeof *ps->l);
    if (!ps->l) {
        free(ps);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    }
    tj_status s = TJ_OK;
    const char *device = tj_host_cpu_name(), *arch = "x86_64";
    /* TILEJIT_DENSE_PATH=off: kernels only (a forced dense path still runs; docs/dense-path.md) */
    const char *env = getenv("TILEJIT_DENSE_PATH");
    ps->off = env && (strcmp(env, "off") == 0 || strcmp(env, "0") == 0);
    for (int64_t i = 0; i < p->nlayers && s == TJ_OK; i++) {
        const tj_layer *l = &p->layers[i];
        path_layer *pl = &ps->l[i];
        double dens = density_of(l);
        for (int b = 0; b < TJ_M_CLASSES; b++) {
            char why[1024];
            int r = tj_context_path_at(c, backend, device, arch, l, bucket_m(b), why, sizeof why);
            if (ps->off && !c->override_dense) {
                pl->src[b] = SRC_OFF;
                r = 0;
            } else if (r >= 0) {
                pl->src[b] = c->config_override ? SRC_FORCED : SRC_RECORDS;
                if (pl->src[b] == SRC_RECORDS && !(pl->records_why[b] = strdup(why))) {
                    s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
                    break;
                }
            } else if (kernel_bf16 && kernel_bf16[i * TJ_M_CLASSES + b]) {
                pl->src[b] = SRC_BF16;
                r = 0;
            } else {
                pl->src[b] = SRC_RULE;
                r = dens >= tj_dense_rule_crossover(bucket_m(b), l->n, l->k, threads);
            }
            pl->dense_at[b] = (unsigned char)r;
            pl->wanted |= r;
        }
        if (s != TJ_OK || !pl->wanted) continue;
        tj_error derr;
        tj_error_clear(&derr);
        tj_status ds = tj_dense_layer_create(l, &lw[i], dense_threads, &pl->dense, &derr);
        if (ds == TJ_ERR_UNSUPPORTED && !c->override_dense) { /* no library: the kernel everywhere */
            snprintf(ps->nolib, sizeof ps->nolib, "%.590s", derr.msg);
            memset(pl->dense_at, 0, sizeof pl->dense_at);
            tj_context_note(c, "path: layer '%s': the dense path would be faster at some M, but %s; kernel", l->name,
                            derr.msg);
            continue;
        }
        if (ds != TJ_OK) {
            s = tj_fail(err, ds, "layer '%s': dense path: %s", l->name, derr.msg);
            break;
        }
        char at[512];
        size_t o = 0;
        for (int b = 0; b < TJ_M_CLASSES && o < sizeof at; b++)
            if (pl->dense_at[b] && (b == 0 || !pl->dense_at[b - 1])) {
                int e = b;
                while (e + 1 < TJ_M_CLASSES && pl->dense_at[e + 1]) e++;
                char lo[32] = "1", hi[32] = "any";
                if (b > 0) snprintf(lo, sizeof lo, "%lld", (long long)bucket_m(b - 1) + 1);
                if (e < TJ_M_CLASSES - 1) snprintf(hi, sizeof hi, "%lld", (long long)bucket_m(e));
                o += (size_t)snprintf(at + o, sizeof at - o, "%sM %s..%s", o ? ", " : "", lo, hi);
            }
        int first = 0;
        while (!pl->dense_at[first]) first++;
        tj_context_note(c, "path: layer '%s' (density %.4f): dense path (%s) at %s; %s", l->name, dens,
                        tj_dense_layer_name(pl->dense), at, tj_paths_why(ps, i, bucket_m(first)));
    }
    if (s != TJ_OK) {
        tj_paths_free(ps);
        return s;
    }
    *out = ps;
    return TJ_OK;
}

int tj_paths_config_bf16(const char *json)
{
    if (!json) return 0;
    json_t *o = json_loads(json, 0, NULL);
    int bf = 0;
    static const char *const keys[] = {"dtype", "out", "weights"};
    for (int i = 0; i < 3 && json_is_object(o); i++) {
        const json_t *v = json_object_get(o, keys[i]);
        bf |= json_is_string(v) && strcmp(json_string_value(v), "bf16") == 0;
    }
    json_decref(o);
    return bf;
}

const tj_dense_layer *tj_paths_dense(const tj_paths *ps, int64_t layer, int64_t m)
{
    if (!ps) return NULL;
    const path_layer *pl = &ps->l[layer];
    return pl->dense && pl->dense_at[tj_path_bucket(m)] ? pl->dense : NULL;
}

const char *tj_paths_why(const tj_paths *ps, int64_t layer, int64_t m)
{
    static _Thread_local char buf[1200];
    if (!ps) return "";
    const tj_layer *l = &ps->p->layers[layer];
    const path_layer *pl = &ps->l[layer];
    int b = tj_path_bucket(m);
    const char *path = pl->dense && pl->dense_at[b] ? "dense" : "kernel";
    switch (pl->src[b]) {
    case SRC_FORCED: snprintf(buf, sizeof buf, "%s: forced by the config", path); break;
    case SRC_RECORDS: snprintf(buf, sizeof buf, "%s: %s", path, pl->records_why[b]); break;
    case SRC_BF16: snprintf(buf, sizeof buf, "kernel: it computes in bf16 at this M (the rule is fp32's)"); break;
    case SRC_OFF: snprintf(buf, sizeof buf, "kernel: the dense path is off (TILEJIT_DENSE_PATH)"); break;
    default: {
        double x = tj_dense_rule_crossover(bucket_m(b), l->n, l->k, ps->threads);
        char mclass[48];
        snprintf(mclass, sizeof mclass, "M %s %lld", b == TJ_M_CLASSES - 1 ? ">" : "≤",
                 (long long)bucket_m(b == TJ_M_CLASSES - 1 ? b - 1 : b));
        if (x > 1)
            snprintf(buf, sizeof buf, "%s: rule (dense_rule.c): the kernel wins at every density at %s, k %lld, %d thread(s)",
                     path, mclass, (long long)l->k, ps->threads);
        else
            snprintf(buf, sizeof buf, "%s: rule (dense_rule.c): density %.4f %s %.3f, from which the dense path wins at %s, k %lld, %d thread(s)%s%s",
                     path, density_of(l), density_of(l) >= x ? "≥" : "<", x, mclass, (long long)l->k,
                     ps->threads, pl->wanted && !pl->dense ? "; no dense library: " : "",
                     pl->wanted && !pl->dense ? ps->nolib : "");
    }
    }
    return buf;
}
