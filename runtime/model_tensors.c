/* Models from in-memory tensors (include/tilejit/tensors.h): pattern JSON text plus a framework's
 * own weights as DLTensors, bound in place when compact, else copied once; then the same backend
 * preparation and kernel cache as a model loaded from files (model.c). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model.h"
#include "tilejit/tensors.h"

static const DLTensor *find_tensor(const tj_named_tensor *t, int64_t n, const char *name)
{
    for (int64_t i = 0; i < n; i++)
        if (t[i].name && strcmp(t[i].name, name) == 0) return t[i].tensor;
    return NULL;
}

/* Element strides of a 1-D ([rows]) or 2-D ([rows × cols]) tensor; compact when strides is NULL. */
static void strides_of(const DLTensor *t, int64_t st[2])
{
    if (t->ndim == 2) {
        tj_dl_strides(t, st);
    } else {
        st[0] = t->strides ? t->strides[0] : 1;
        st[1] = 1;
    }
}

/* Binds one weight ([rows × cols]) or bias ([rows], cols = 0) to *data: the caller's memory when
 * it is compact row-major, else a compact copy the model owns. Dimensions of size 1 may have
 * any stride (frameworks report arbitrary ones there). */
static tj_status bind_tensor(tj_model *m, const DLTensor *t, const char *name, int64_t rows,
                             int64_t cols, const void **data, tj_dtype *dt, tj_error *err)
{
    int nd = cols ? 2 : 1;
    if (!t) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tensor '%s': NULL DLTensor", name);
    if (!tj_dl_is_host(t))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "tensor '%s': device type %d; weights must be host memory (kDLCPU), copy them to the host first",
                       name, (int)t->device.device_type);
    if (!tj_dl_dtype(t, dt))
        return tj_fail(err, TJ_ERR_FORMAT, "tensor '%s': dtype (code %d, %d bits, %d lanes) is not supported (expected float32, float16 or bfloat16)",
                       name, t->dtype.code, t->dtype.bits, t->dtype.lanes);
    if (t->ndim != nd || !t->shape || t->shape[0] != rows || (nd == 2 && t->shape[1] != cols)) {
        long long d0 = t->ndim >= 1 && t->shape ? (long long)t->shape[0] : -1;
        long long d1 = t->ndim >= 2 && t->shape ? (long long)t->shape[1] : -1;
        if (nd == 2)
            return tj_fail(err, TJ_ERR_FORMAT, "tensor '%s': %d-D with shape [%lld, %lld%s], the pattern needs [n = %lld, k = %lld]",
                           name, t->ndim, d0, d1, t->ndim > 2 ? ", ..." : "", (long long)rows, (long long)cols);
        return tj_fail(err, TJ_ERR_FORMAT, "tensor '%s': %d-D with first dimension %lld, expected shape [%lld]",
                       name, t->ndim, d0, (long long)rows);
    }
    int64_t c = cols ? cols : 1, st[2];
    strides_of(t, st);
    size_t es = tj_dtype_size(*dt);
    const char *base = (const char *)t->data + t->byte_offset;
    int compact = (rows <= 1 || st[0] == c) && (c <= 1 || st[1] == 1);
    if (rows * c != 0 && !t->data) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tensor '%s': NULL data", name);
    if (rows * c == 0 || compact) {
        *data = base;
        return TJ_OK;
    }
    /* Strided (a transposed or sliced view): one compact copy, kept until tj_model_destroy. */
    void **owned = realloc(m->owned, (size_t)(m->nowned + 1) * sizeof *owned);
    if (!owned) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    m->owned = owned;
    char *buf = malloc((size_t)(rows * c) * es);
    if (!buf) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "tensor '%s': out of memory for a compact copy", name);
    m->owned[m->nowned++] = buf;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < c; j++)
            memcpy(buf + (size_t)(i * c + j) * es, base + (i * st[0] + j * st[1]) * (int64_t)es, es);
    m->copied_bytes += rows * c * (int64_t)es;
    *data = buf;
    return TJ_OK;
}

static tj_status bind_all(tj_model *m, const tj_named_tensor *tensors, int64_t n, tj_error *err)
{
    const tj_pattern *p = m->pattern;
    m->lw = calloc((size_t)(p->nlayers ? p->nlayers : 1), sizeof *m->lw);
    if (!m->lw) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        char name[1024];
        if ((size_t)snprintf(name, sizeof name, "%s.weight", l->name) >= sizeof name)
            return tj_fail(err, TJ_ERR_FORMAT, "layer '%.64s...': name too long", l->name);
        const DLTensor *t = find_tensor(tensors, n, name);
        if (!t)
            return tj_fail(err, TJ_ERR_NOT_FOUND, "tensor '%s' not found among the %lld given (needed by layer '%s')",
                           name, (long long)n, l->name);
        TJ_TRY(bind_tensor(m, t, name, l->n, l->k, &m->lw[i].w, &m->lw[i].wdt, err));
        snprintf(name, sizeof name, "%s.bias", l->name);
        if ((t = find_tensor(tensors, n, name)))
            TJ_TRY(bind_tensor(m, t, name, l->n, 0, &m->lw[i].bias, &m->lw[i].bdt, err));
    }
    return TJ_OK;
}

tj_status tj_model_load_tensors(tj_context *c, const char *pattern_json, size_t len,
                                const tj_named_tensor *tensors, int64_t ntensors, tj_model **out)
{
    tj_error err;
    tj_error_clear(&err);
    if (!out) return TJ_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!c || !pattern_json || ntensors < 0 || (!tensors && ntensors > 0)) {
        tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "tj_model_load_tensors: NULL argument or negative count");
        return c ? tj_context_set_error(c, &err) : err.status;
    }
    tj_model *m = calloc(1, sizeof *m);
    if (!m) return tj_context_set_error(c, &(tj_error){TJ_ERR_OUT_OF_MEMORY, "out of memory"});
    m->ctx = c;
    m->ops = c->ops;
    tj_status s = tj_pattern_parse(pattern_json, len, "pattern", &m->pattern, &err);
    if (s == TJ_OK) s = bind_all(m, tensors, ntensors, &err);
    if (s == TJ_OK) s = tj_model_prepare(m, &err);
    else m->ops = NULL; /* never loaded */
    if (s != TJ_OK) {
        tj_model_destroy(m);
        return tj_context_set_error(c, &err);
    }
    tj_context_note(c, "loaded %lld layers from memory (%lld bytes copied)", (long long)m->pattern->nlayers,
                    (long long)m->copied_bytes);
    *out = m;
    return TJ_OK;
}

tj_status tj_model_load_layer(tj_context *c, const char *layer_json, const DLTensor *weight,
                              const DLTensor *bias, tj_model **out)
{
    tj_error err;
    tj_error_clear(&err);
    if (!out) return TJ_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (!c || !layer_json || !weight) {
        tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "tj_model_load_layer: NULL argument");
        return c ? tj_context_set_error(c, &err) : err.status;
    }
    json_error_t jerr;
    json_t *doc = json_loads(layer_json, 0, &jerr), *layer = NULL;
    char *text = NULL;
    tj_status s = TJ_OK;
    if (!doc || !json_is_object(doc)) {
        s = doc ? tj_fail(&err, TJ_ERR_FORMAT, "layer JSON: expected an object")
                : tj_fail(&err, TJ_ERR_FORMAT, "layer JSON: line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        goto done;
    }
    json_t *layers = json_object_get(doc, "layers");
    if (layers) {
        if (!json_is_array(layers) || json_array_size(layers) != 1) {
            s = tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "layer JSON: a pattern with exactly one layer is expected, got %lld",
                        json_is_array(layers) ? (long long)json_array_size(layers) : -1LL);
            goto done;
        }
        layer = json_array_get(layers, 0);
        text = json_dumps(doc, JSON_COMPACT);
    } else {
        layer = doc;
        json_t *wrap = json_pack("{s:s, s:i, s:[O]}", "format", "tilejit-pattern", "version", 1, "layers", doc);
        if (wrap) text = json_dumps(wrap, JSON_COMPACT);
        json_decref(wrap);
    }
    if (!text) {
        s = tj_fail(&err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    const char *lname = json_string_value(json_object_get(layer, "name"));
    if (!lname) lname = ""; /* the parser names the missing field */
    char wname[1024], bname[1024];
    if ((size_t)snprintf(wname, sizeof wname, "%s.weight", lname) >= sizeof wname) {
        s = tj_fail(&err, TJ_ERR_FORMAT, "layer '%.64s...': name too long", lname);
        goto done;
    }
    snprintf(bname, sizeof bname, "%s.bias", lname);
    tj_named_tensor t[2] = {{wname, weight}, {bname, bias}};
    json_decref(doc);
    doc = NULL;
    s = tj_model_load_tensors(c, text, strlen(text), t, bias ? 2 : 1, out);
    free(text);
    return s;
done:
    json_decref(doc);
    free(text);
    return tj_context_set_error(c, &err);
}

int64_t tj_model_copied_bytes(const tj_model *m) { return m ? m->copied_bytes : 0; }

void tj_free(void *p) { free(p); }
