/* Models: pattern + mapped weights + the context's backend. Checks every tensor a caller hands
 * over, converts host tensors for host backends, and dispatches one layer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "runtime/model.h"
#include "tuning/tuning.h"

static tj_status bind_weights(tj_model *m, const char *wpath, tj_error *err)
{
    const tj_pattern *p = m->pattern;
    m->lw = calloc((size_t)(p->nlayers ? p->nlayers : 1), sizeof *m->lw);
    if (!m->lw) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        char name[1024];
        /* A truncated name could bind another tensor: refuse (the parser limits names anyway). */
        if ((size_t)snprintf(name, sizeof name, "%s.weight", l->name) >= sizeof name)
            return tj_fail(err, TJ_ERR_FORMAT, "layer '%.64s...': name too long", l->name);
        const tj_st_tensor *t = tj_st_find(m->weights, name);
        if (!t)
            return tj_fail(err, TJ_ERR_NOT_FOUND, "%s: tensor '%s' not found (needed by layer '%s')", wpath, name, l->name);
        if (!t->dtype_ok)
            return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': dtype %s is not supported (expected F32, F16 or BF16)",
                           wpath, name, t->dtype_str);
        if (t->ndim != 2 || t->shape[0] != l->n || t->shape[1] != l->k)
            return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': shape %s%lld%s%lld%s does not match the pattern's [n = %lld, k = %lld]",
                           wpath, name, "[", (long long)(t->ndim > 0 ? t->shape[0] : 0),
                           t->ndim > 1 ? ", " : "", (long long)(t->ndim > 1 ? t->shape[1] : 0),
                           t->ndim > 2 ? ", ...]" : "]", (long long)l->n, (long long)l->k);
        m->lw[i].w = t->data;
        m->lw[i].wdt = t->dtype;
        snprintf(name, sizeof name, "%s.bias", l->name);
        t = tj_st_find(m->weights, name);
        if (t) {
            if (!t->dtype_ok)
                return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': dtype %s is not supported (expected F32, F16 or BF16)",
                               wpath, name, t->dtype_str);
            if (t->ndim != 1 || t->shape[0] != l->n)
                return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': expected shape [%lld]", wpath, name, (long long)l->n);
            m->lw[i].bias = t->data;
            m->lw[i].bdt = t->dtype;
        }
    }
    return TJ_OK;
}

/* The dense path (dense_path.c) where the backend has one: host fp32 kernels (the CPU backend). */
static tj_status prepare_paths(tj_model *m, tj_error *err)
{
    if (m->ops->kind != TJ_BACKEND_CPU) return TJ_OK;
    const tj_pattern *p = m->pattern;
    int64_t nb;
    if (!tj_mul_ok(p->nlayers, TJ_M_CLASSES, &nb)) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "too many layers");
    /* classes whose kernel computes in bf16: the fp32 rule does not speak for them */
    unsigned char *bf = calloc((size_t)(nb ? nb : 1), 1);
    if (!bf) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; m->ops->config_at && i < p->nlayers; i++) {
        const char *last = NULL;
        int last_bf = 0;
        for (int b = 0; b < TJ_M_CLASSES; b++) { /* classes mostly share a variant: parse each once */
            const char *cfg = m->ops->config_at(m, i, (int64_t)1 << b);
            if (b == 0 || cfg != last) last_bf = tj_paths_config_bf16(cfg);
            last = cfg;
            bf[i * TJ_M_CLASSES + b] = (unsigned char)last_bf;
        }
    }
    /* the rule's thread count is the context's; a dense call follows the calling thread's OpenMP
     * count where the context runs on the host's OpenMP runtime (0), else uses the context's */
    const tj_context *c = m->ctx;
    int follow = c->threading == TJ_THREADING_OPENMP && c->opt.threads == 0;
    tj_status s = tj_paths_build(m->ctx, m->ops->name, p, m->lw, tj_context_threads(c), follow ? 0 : tj_context_threads(c),
                                 bf, &m->paths, err);
    free(bf);
    return s;
}

tj_status tj_model_prepare(tj_model *m, tj_error *err)
{
    double t0 = tj_now();
    tj_status s = m->ops->load(m, err);
    if (s == TJ_OK) s = prepare_paths(m, err);
    m->load_seconds = tj_now() - t0;
    if (s != TJ_OK) tj_model_unprepare(m);
    return s;
}

void tj_model_unprepare(tj_model *m)
{
    if (m->ops) m->ops->unload(m);
    m->ops = NULL;
    tj_paths_free(m->paths);
    m->paths = NULL;
}

tj_status tj_model_load(tj_context *c, const char *pattern_path, const char *weights_path,
                        tj_model **out)
{
    tj_error err;
    tj_error_clear(&err);
    if (!out) return TJ_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!c || !pattern_path || !weights_path) {
        tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "tj_model_load: NULL argument");
        return c ? tj_context_set_error(c, &err) : err.status;
    }
    tj_model *m = calloc(1, sizeof *m);
    if (!m) return tj_context_set_error(c, &(tj_error){TJ_ERR_OUT_OF_MEMORY, "out of memory"});
    m->ctx = c;
    m->ops = c->ops;
    tj_status s = tj_pattern_load(pattern_path, &m->pattern, &err);
    if (s == TJ_OK) s = tj_st_open(weights_path, &m->weights, &err);
    if (s == TJ_OK) s = bind_weights(m, weights_path, &err);
    if (s == TJ_OK) s = tj_model_prepare(m, &err);
    else m->ops = NULL; /* never loaded */
    if (s != TJ_OK) {
        tj_model_destroy(m);
        return tj_context_set_error(c, &err);
    }
    tj_context_note(c, "loaded %lld layers on backend %s in %.3f s", (long long)m->pattern->nlayers,
                    m->ops->name, m->load_seconds);
    *out = m;
    return TJ_OK;
}

void tj_model_destroy(tj_model *m)
{
    if (!m) return;
    tj_model_unprepare(m);
    free(m->lw);
    for (int64_t i = 0; i < m->nowned; i++) free(m->owned[i]);
    free(m->owned);
    tj_st_close(m->weights);
    tj_pattern_destroy(m->pattern);
    free(m);
}

int64_t tj_model_layer_count(const tj_model *m) { return m ? m->pattern->nlayers : 0; }
double tj_model_load_seconds(const tj_model *m) { return m ? m->load_seconds : 0; }

tj_status tj_model_find_layer(const tj_model *m, const char *name, int64_t *out_index)
{
    if (!m || !name || !out_index) return TJ_ERR_INVALID_ARGUMENT;
    for (int64_t i = 0; i < m->pattern->nlayers; i++)
        if (strcmp(m->pattern->layers[i].name, name) == 0) {
            *out_index = i;
            return TJ_OK;
        }
    tj_error err;
    tj_fail(&err, TJ_ERR_NOT_FOUND, "no layer named '%s' in the model", name);
    return tj_context_set_error(m->ctx, &err);
}

tj_status tj_model_layer_info(const tj_model *m, int64_t index, tj_layer_info *out)
{
    if (!m || !out || index < 0 || index >= m->pattern->nlayers) return TJ_ERR_INVALID_ARGUMENT;
    const tj_layer *l = &m->pattern->layers[index];
    out->name = l->name;
    out->n = l->n;
    out->k = l->k;
    out->g = l->g;
    out->kept_cols = l->ncols;
    out->tiles = l->ntiles;
    out->kept_weights = tj_layer_kept(l);
    out->ew_nnz = l->ew_nnz;
    out->activation = l->act;
    out->has_bias = m->lw[index].bias != NULL;
    out->pattern_hash = l->hash;
    return TJ_OK;
}

tj_status tj_model_layer_config(tj_model *m, int64_t layer, int64_t M, const char **config)
{
    if (config) *config = NULL;
    if (!m || !config || layer < 0 || layer >= m->pattern->nlayers) return TJ_ERR_INVALID_ARGUMENT;
    if (!m->ctx->ops->config_at) return TJ_ERR_UNSUPPORTED;
    *config = tj_paths_dense(m->paths, layer, M) ? TJ_TUNE_DENSE_CONFIG : m->ctx->ops->config_at(m, layer, M);
    return TJ_OK;
}

tj_status tj_model_layer_path(const tj_model *m, int64_t layer, int64_t M, tj_path *path, const char **library,
                              const char **why)
{
    if (path) *path = TJ_PATH_KERNEL;
    if (!m || !path || layer < 0 || layer >= m->pattern->nlayers || M < 1) return TJ_ERR_INVALID_ARGUMENT;
    const tj_dense_layer *d = tj_paths_dense(m->paths, layer, M);
    *path = d ? TJ_PATH_DENSE : TJ_PATH_KERNEL;
    if (library) *library = d ? tj_dense_layer_name(d) : "kernel";
    if (why) *why = m->paths ? tj_paths_why(m->paths, layer, M) : "kernel: this backend has no dense path";
    return TJ_OK;
}

const char *tj_precision_name(tj_precision p)
{
    switch (p) {
    case TJ_PRECISION_AUTO: return "auto";
    case TJ_PRECISION_F32: return "f32";
    case TJ_PRECISION_BF16: return "bf16";
    case TJ_PRECISION_F16: return "f16";
    default: return "?";
    }
}

tj_status tj_model_layer_precision(tj_model *m, int64_t layer, int64_t M, tj_precision *out)
{
    if (out) *out = TJ_PRECISION_F32;
    if (!m || !out || layer < 0 || layer >= m->pattern->nlayers) return TJ_ERR_INVALID_ARGUMENT;
    if (!m->ctx->ops->config_at) return TJ_OK; /* the reference: fp32 */
    /* the config's "dtype" names it (the CPU's x, the CUDA kernels' inputs); without one, the
     * backend's default: fp32 on the CPU, fp16 on the GPU */
    const char *cfg = m->ctx->ops->config_at(m, layer, M);
    json_t *o = cfg ? json_loads(cfg, 0, NULL) : NULL;
    const char *d = json_string_value(json_object_get(o, "dtype"));
    if (!d) *out = m->ctx->ops->kind == TJ_BACKEND_CUDA ? TJ_PRECISION_F16 : TJ_PRECISION_F32;
    else *out = strcmp(d, "bf16") == 0 ? TJ_PRECISION_BF16 : strcmp(d, "f16") == 0 ? TJ_PRECISION_F16 : TJ_PRECISION_F32;
    json_decref(o);
    return TJ_OK;
}

/* --- host tensors ------------------------------------------------------------------------- */

int tj_dl_dtype(const DLTensor *t, tj_dtype *out)
{
    if (t->dtype.lanes != 1) return 0;
    if (t->dtype.code == kDLFloat && t->dtype.bits == 32) *out = TJ_F32;
    else if (t->dtype.code == kDLFloat && t->dtype.bits == 16) *out = TJ_F16;
    else if (t->dtype.code == kDLBfloat && t->dtype.bits == 16) *out = TJ_BF16;
    else return 0;
    return 1;
}

void tj_dl_strides(const DLTensor *t, int64_t st[2])
{
    if (t->strides) {
        st[0] = t->strides[0];
        st[1] = t->strides[1];
    } else {
        st[0] = t->shape[1];
        st[1] = 1;
    }
}

int tj_dl_is_host(const DLTensor *t)
{
    return t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost;
}

static tj_status check_tensor(const DLTensor *t, const char *what, int64_t r, int64_t c, int out,
                              tj_error *err)
{
    tj_dtype d = TJ_F32;
    if (!t || !t->data) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: NULL tensor or data", what);
    if (t->ndim != 2) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: expected a 2-D tensor, got %d-D", what, t->ndim);
    if (!tj_dl_dtype(t, &d) || (out && d == TJ_BF16))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: unsupported dtype (code %d, %d bits, %d lanes); expected float32%s",
                       what, t->dtype.code, t->dtype.bits, t->dtype.lanes, out ? " or float16" : ", float16 or bfloat16");
    if (t->shape[0] != r || t->shape[1] != c)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld], expected [%lld, %lld]", what,
                       (long long)t->shape[0], (long long)t->shape[1], (long long)r, (long long)c);
    return TJ_OK;
}

/* Copies a host tensor (any supported dtype and strides) into contiguous fp32 row-major
 * [rows × cols]; transposed when the tensor is [cols × rows] (feature-major). */
static void gather_f32(const DLTensor *t, int transposed, int64_t rows, int64_t cols, float *dst)
{
    tj_dtype d = TJ_F32;
    tj_dl_dtype(t, &d);
    int64_t st[2];
    tj_dl_strides(t, st);
    const char *base = (const char *)t->data + t->byte_offset;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t e = transposed ? j * st[0] + i * st[1] : i * st[0] + j * st[1];
            dst[i * cols + j] = tj_load_f32(base, d, e);
        }
}

static void scatter_f32(const float *src, int transposed, int64_t rows, int64_t cols, DLTensor *t)
{
    tj_dtype d = TJ_F32;
    tj_dl_dtype(t, &d);
    int64_t st[2];
    tj_dl_strides(t, st);
    char *base = (char *)t->data + t->byte_offset;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t e = transposed ? j * st[0] + i * st[1] : i * st[0] + j * st[1];
            float v = src[i * cols + j];
            if (d == TJ_F32) memcpy(base + 4 * e, &v, 4);
            else {
                uint16_t h = tj_f32_to_f16(v);
                memcpy(base + 2 * e, &h, 2);
            }
        }
}

static int direct_f32(const DLTensor *t, int transposed)
{
    tj_dtype d = TJ_F32;
    int64_t st[2];
    tj_dl_strides(t, st);
    return !transposed && tj_dl_dtype(t, &d) && d == TJ_F32 && st[1] == 1 && st[0] == t->shape[1];
}

static tj_status linear_host(tj_model *m, int64_t layer, tj_linear_args *a, tj_error *err)
{
    const tj_layer *l = &m->pattern->layers[layer];
    int fm = a->layout == TJ_LAYOUT_FEATURE_MAJOR;
    if (!tj_dl_is_host(a->x) || !tj_dl_is_host(a->y))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "backend %s takes host tensors (kDLCPU)", m->ops->name);
    float *xbuf = NULL, *ybuf = NULL;
    int64_t xn, yn;
    if (!tj_mul_ok(a->m, l->k, &xn) || !tj_mul_ok(a->m, l->n, &yn) || xn > INT64_MAX / 4 || yn > INT64_MAX / 4)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "M = %lld is too large", (long long)a->m);
    if (direct_f32(a->x, fm)) {
        a->x32 = (const float *)((const char *)a->x->data + a->x->byte_offset);
    } else {
        xbuf = malloc((size_t)(xn ? xn : 1) * sizeof *xbuf);
        if (!xbuf) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory converting X");
        gather_f32(a->x, fm, a->m, l->k, xbuf);
        a->x32 = xbuf;
    }
    int ydirect = direct_f32(a->y, fm);
    if (ydirect) {
        a->y32 = (float *)((char *)a->y->data + a->y->byte_offset);
    } else {
        ybuf = malloc((size_t)(yn ? yn : 1) * sizeof *ybuf);
        if (!ybuf) {
            free(xbuf);
            return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory for Y");
        }
        a->y32 = ybuf;
    }
    const tj_dense_layer *dense = tj_paths_dense(m->paths, layer, a->m);
    tj_status s = dense ? tj_dense_layer_run(dense, a->x32, a->y32, a->m, err) : m->ops->linear(m, layer, a, err);
    if (s == TJ_OK && !ydirect) scatter_f32(ybuf, fm, a->m, l->n, a->y);
    free(xbuf);
    free(ybuf);
    return s;
}

tj_status tj_linear_ex(tj_model *m, int64_t layer, const DLTensor *x, DLTensor *y, int layout,
                       void *stream)
{
    if (!m) return TJ_ERR_INVALID_ARGUMENT;
    tj_error err;
    tj_error_clear(&err);
    if (layer < 0 || layer >= m->pattern->nlayers) {
        tj_fail(&err, TJ_ERR_NOT_FOUND, "layer index %lld out of range [0, %lld)", (long long)layer,
                (long long)m->pattern->nlayers);
        return tj_context_set_error(m->ctx, &err);
    }
    if (layout != TJ_LAYOUT_ROW_MAJOR && layout != TJ_LAYOUT_FEATURE_MAJOR) {
        tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "unknown layout %d", layout);
        return tj_context_set_error(m->ctx, &err);
    }
    const tj_layer *l = &m->pattern->layers[layer];
    int fm = layout == TJ_LAYOUT_FEATURE_MAJOR;
    int64_t mm = x && x->ndim == 2 ? x->shape[fm ? 1 : 0] : 0;
    tj_status s = check_tensor(x, "x", fm ? l->k : mm, fm ? mm : l->k, 0, &err);
    if (s == TJ_OK) s = check_tensor(y, "y", fm ? l->n : mm, fm ? mm : l->n, 1, &err);
    if (s != TJ_OK) {
        tj_error_prefix(&err, "layer '%s'", l->name);
        return tj_context_set_error(m->ctx, &err);
    }
    tj_linear_args a = {.m = mm, .x = x, .y = y, .layout = layout, .stream = stream};
    if (mm == 0) return TJ_OK;
    s = m->ops->host_f32 ? linear_host(m, layer, &a, &err) : m->ops->linear(m, layer, &a, &err);
    if (s != TJ_OK) {
        tj_error_prefix(&err, "layer '%s'", l->name);
        return tj_context_set_error(m->ctx, &err);
    }
    return TJ_OK;
}

tj_status tj_linear(tj_model *m, const char *layer, const DLTensor *x, DLTensor *y, void *stream)
{
    int64_t idx;
    if (!m || !layer) return TJ_ERR_INVALID_ARGUMENT;
    TJ_TRY(tj_model_find_layer(m, layer, &idx));
    return tj_linear_ex(m, idx, x, y, TJ_LAYOUT_ROW_MAJOR, stream);
}
