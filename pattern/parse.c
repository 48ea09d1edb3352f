/* Stage 1 of the pipeline: pattern JSON (docs/formats.md) → tj_pattern, with Jansson.
 * Every layer is validated (validate.c) as it is read; names are checked for uniqueness. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pattern/pattern.h"
#include "base/file.h"

typedef struct parser {
    const char *what;   /* file name for messages */
    const char *layer;  /* current layer name, or NULL */
    int64_t index;      /* current layer index */
    tj_error *err;
} parser;

static tj_status perr(parser *p, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tj_status perr(parser *p, const char *field, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (p->layer)
        return tj_fail(p->err, TJ_ERR_FORMAT, "%s: layer '%s' (#%lld): field '%s': %s", p->what,
                       p->layer, (long long)p->index, field, detail);
    if (p->index >= 0)
        return tj_fail(p->err, TJ_ERR_FORMAT, "%s: layer #%lld: field '%s': %s", p->what,
                       (long long)p->index, field, detail);
    return tj_fail(p->err, TJ_ERR_FORMAT, "%s: field '%s': %s", p->what, field, detail);
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static tj_status get_dim(parser *p, json_t *obj, const char *key, int64_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) return perr(p, key, "missing (required)");
    if (!json_is_integer(v)) return perr(p, key, "expected a positive integer, got %s", json_kind(v));
    json_int_t x = json_integer_value(v);
    if (x <= 0) return perr(p, key, "value %lld is not positive", (long long)x);
    if (x > TJ_MAX_DIM)
        return perr(p, key, "value %lld exceeds the limit %lld", (long long)x, (long long)TJ_MAX_DIM);
    *out = x;
    return TJ_OK;
}

/* Reads an array of integers in [0, limit) into a fresh int64 or int32 array. Order rules are
 * validate.c's; only type and range are checked here so the message can point at the value. */
static tj_status get_index_array(parser *p, json_t *arr, const char *field, int64_t limit,
                                 int64_t *out64, int32_t *out32)
{
    size_t len = json_array_size(arr);
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v))
            return perr(p, field, "entry %zu: expected an integer, got %s", i, json_kind(v));
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= limit)
            return perr(p, field, "entry %zu: value %lld is out of range [0, %lld)", i,
                        (long long)x, (long long)limit);
        if (out64) out64[i] = x;
        else out32[i] = (int32_t)x;
    }
    return TJ_OK;
}

static tj_status parse_layer(parser *p, json_t *obj, tj_layer *l)
{
    if (!json_is_object(obj)) return perr(p, "layers", "expected an object, got %s", json_kind(obj));
    json_t *name = json_object_get(obj, "name");
    if (!name) return perr(p, "name", "missing (required)");
    if (!json_is_string(name)) return perr(p, "name", "expected a string, got %s", json_kind(name));
    if (json_string_length(name) == 0) return perr(p, "name", "empty name");
    if (json_string_length(name) > TJ_MAX_NAME)
        return perr(p, "name", "is %zu bytes long, over the limit of %d", json_string_length(name), TJ_MAX_NAME);
    if (strlen(json_string_value(name)) != json_string_length(name))
        return perr(p, "name", "contains a NUL character");
    l->name = strdup(json_string_value(name));
    if (!l->name) return tj_fail(p->err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->what);
    p->layer = l->name;

    TJ_TRY(get_dim(p, obj, "n", &l->n));
    TJ_TRY(get_dim(p, obj, "k", &l->k));
    TJ_TRY(get_dim(p, obj, "g", &l->g));
    if (l->g > l->n) return perr(p, "g", "value %lld is larger than n = %lld", (long long)l->g, (long long)l->n);

    json_t *cols = json_object_get(obj, "cols");
    if (cols && !json_is_null(cols)) {
        if (!json_is_array(cols)) return perr(p, "cols", "expected an array, got %s", json_kind(cols));
        size_t nc = json_array_size(cols);
        if ((int64_t)nc > l->n)
            return perr(p, "cols", "has %zu entries, more than n = %lld", nc, (long long)l->n);
        l->ncols = (int64_t)nc;
        l->cols = malloc((nc ? nc : 1) * sizeof *l->cols);
        if (!l->cols) return tj_fail(p->err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->what);
        TJ_TRY(get_index_array(p, cols, "cols", l->n, l->cols, NULL));
    } else {
        l->ncols = l->n;
    }

    json_t *tiles = json_object_get(obj, "tiles");
    if (!tiles) return perr(p, "tiles", "missing (required)");
    if (!json_is_array(tiles)) return perr(p, "tiles", "expected an array of arrays, got %s", json_kind(tiles));
    int64_t want = (l->ncols + l->g - 1) / l->g;
    if ((int64_t)json_array_size(tiles) != want)
        return perr(p, "tiles", "has %zu tiles, expected ceil(%lld kept columns / g = %lld) = %lld",
                    json_array_size(tiles), (long long)l->ncols, (long long)l->g, (long long)want);
    l->ntiles = want;
    int64_t total = 0;
    for (int64_t t = 0; t < want; t++) {
        json_t *rows = json_array_get(tiles, (size_t)t);
        if (!json_is_array(rows)) {
            char f[64];
            snprintf(f, sizeof f, "tiles[%lld]", (long long)t);
            return perr(p, f, "expected an array, got %s", json_kind(rows));
        }
        if ((int64_t)json_array_size(rows) > l->k) {
            char f[64];
            snprintf(f, sizeof f, "tiles[%lld]", (long long)t);
            return perr(p, f, "has %zu rows, more than k = %lld", json_array_size(rows), (long long)l->k);
        }
        total += (int64_t)json_array_size(rows);
    }
    l->tile_ptr = malloc((size_t)(want + 1) * sizeof *l->tile_ptr);
    l->tile_rows = malloc((size_t)(total ? total : 1) * sizeof *l->tile_rows);
    if (!l->tile_ptr || !l->tile_rows) return tj_fail(p->err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->what);
    l->tile_ptr[0] = 0;
    for (int64_t t = 0; t < want; t++) {
        json_t *rows = json_array_get(tiles, (size_t)t);
        char f[64];
        snprintf(f, sizeof f, "tiles[%lld]", (long long)t);
        TJ_TRY(get_index_array(p, rows, f, l->k, NULL, l->tile_rows + l->tile_ptr[t]));
        l->tile_ptr[t + 1] = l->tile_ptr[t] + (int64_t)json_array_size(rows);
    }

    json_t *ew = json_object_get(obj, "ew");
    if (ew && !json_is_null(ew)) {
        if (!json_is_object(ew)) return perr(p, "ew", "expected an object with indptr and indices, got %s", json_kind(ew));
        json_t *indptr = json_object_get(ew, "indptr"), *indices = json_object_get(ew, "indices");
        if (!indptr) return perr(p, "ew.indptr", "missing (required in ew)");
        if (!indices) return perr(p, "ew.indices", "missing (required in ew)");
        if (!json_is_array(indptr)) return perr(p, "ew.indptr", "expected an array, got %s", json_kind(indptr));
        if (!json_is_array(indices)) return perr(p, "ew.indices", "expected an array, got %s", json_kind(indices));
        if ((int64_t)json_array_size(indptr) != l->n + 1)
            return perr(p, "ew.indptr", "has %zu entries, expected n + 1 = %lld",
                        json_array_size(indptr), (long long)(l->n + 1));
        int64_t nnz = (int64_t)json_array_size(indices);
        if (nnz > l->n * l->k) return perr(p, "ew.indices", "has %lld entries, more than n·k", (long long)nnz);
        l->ew_nnz = nnz;
        l->ew_indptr = malloc((size_t)(l->n + 1) * sizeof *l->ew_indptr);
        l->ew_indices = malloc((size_t)(nnz ? nnz : 1) * sizeof *l->ew_indices);
        if (!l->ew_indptr || !l->ew_indices) return tj_fail(p->err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->what);
        TJ_TRY(get_index_array(p, indptr, "ew.indptr", nnz + 1, l->ew_indptr, NULL));
        TJ_TRY(get_index_array(p, indices, "ew.indices", l->k, NULL, l->ew_indices));
    }

    json_t *act = json_object_get(obj, "activation");
    l->act = TJ_ACT_NONE;
    if (act && !json_is_null(act)) {
        if (!json_is_string(act)) return perr(p, "activation", "expected a string, got %s", json_kind(act));
        if (!tj_activation_parse(json_string_value(act), &l->act))
            return perr(p, "activation", "unknown activation '%s' (expected none, relu or gelu)",
                        json_string_value(act));
    }

    char what[1200];
    snprintf(what, sizeof what, "%s: layer '%s' (#%lld)", p->what, l->name, (long long)p->index);
    TJ_TRY(tj_layer_validate(l, what, p->err));
    l->hash = tj_layer_hash(l);
    return TJ_OK;
}

/* Unique names in linear expected time: an open-addressing set of layer indices. */
static tj_status check_unique_names(parser *p, const tj_pattern *pat)
{
    size_t cap = 16;
    while (cap < (size_t)pat->nlayers * 2) cap *= 2;
    int64_t *slots = malloc(cap * sizeof *slots);
    if (!slots) return tj_fail(p->err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->what);
    for (size_t i = 0; i < cap; i++) slots[i] = -1;
    tj_status s = TJ_OK;
    for (int64_t i = 0; i < pat->nlayers && s == TJ_OK; i++) {
        const char *name = pat->layers[i].name;
        uint64_t h = 1469598103934665603ull;
        for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
        for (size_t j = h & (cap - 1);; j = (j + 1) & (cap - 1)) {
            if (slots[j] < 0) { slots[j] = i; break; }
            if (strcmp(pat->layers[slots[j]].name, name) == 0) {
                p->layer = name;
                p->index = i;
                s = perr(p, "name", "duplicate name (also layer #%lld)", (long long)slots[j]);
                break;
            }
        }
    }
    free(slots);
    return s;
}

tj_status tj_pattern_parse(const char *text, size_t len, const char *what, tj_pattern **out,
                           tj_error *err)
{
    *out = NULL;
    parser p = {.what = what, .layer = NULL, .index = -1, .err = err};
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s", what,
                       jerr.line, jerr.column, jerr.text);
    tj_status s = TJ_OK;
    tj_pattern *pat = calloc(1, sizeof *pat);
    if (!pat) { s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", what); goto fail; }
    if (!json_is_object(root)) { s = perr(&p, "(top level)", "expected an object, got %s", json_kind(root)); goto fail; }
    json_t *fmt = json_object_get(root, "format");
    if (!fmt || !json_is_string(fmt) || strcmp(json_string_value(fmt), "tilejit-pattern") != 0) {
        s = perr(&p, "format", "expected \"tilejit-pattern\"%s", fmt ? "" : " (missing)");
        goto fail;
    }
    json_t *ver = json_object_get(root, "version");
    if (!ver || !json_is_integer(ver) || json_integer_value(ver) != 1) {
        s = ver && json_is_integer(ver)
                ? perr(&p, "version", "unsupported version %lld (this tilejit reads version 1)",
                       (long long)json_integer_value(ver))
                : perr(&p, "version", "expected the integer 1%s", ver ? "" : " (missing)");
        goto fail;
    }
    json_t *layers = json_object_get(root, "layers");
    if (!layers) { s = perr(&p, "layers", "missing (required)"); goto fail; }
    if (!json_is_array(layers)) { s = perr(&p, "layers", "expected an array, got %s", json_kind(layers)); goto fail; }
    size_t nl = json_array_size(layers);
    if (nl > TJ_MAX_LAYERS) { s = perr(&p, "layers", "%zu layers exceed the limit %d", nl, TJ_MAX_LAYERS); goto fail; }
    pat->layers = calloc(nl ? nl : 1, sizeof *pat->layers);
    if (!pat->layers) { s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", what); goto fail; }
    for (size_t i = 0; i < nl; i++) {
        p.index = (int64_t)i;
        p.layer = NULL;
        pat->nlayers = (int64_t)i + 1;
        s = parse_layer(&p, json_array_get(layers, i), &pat->layers[i]);
        if (s != TJ_OK) goto fail;
    }
    p.layer = NULL;
    s = check_unique_names(&p, pat);
    if (s != TJ_OK) goto fail;
    json_decref(root);
    *out = pat;
    return TJ_OK;
fail:
    json_decref(root);
    tj_pattern_destroy(pat);
    return s;
}

tj_status tj_pattern_load(const char *path, tj_pattern **out, tj_error *err)
{
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    tj_status s = tj_file_read(path, 0, &buf, &len, err);
    if (s == TJ_OK) s = tj_pattern_parse(buf, len, path, out, err);
    free(buf);
    return s;
}

void tj_layer_free(tj_layer *l)
{
    if (!l) return;
    free(l->name);
    free(l->cols);
    free(l->tile_ptr);
    free(l->tile_rows);
    free(l->ew_indptr);
    free(l->ew_indices);
    memset(l, 0, sizeof *l);
}

void tj_pattern_destroy(tj_pattern *p)
{
    if (!p) return;
    for (int64_t i = 0; i < p->nlayers; i++) tj_layer_free(&p->layers[i]);
    free(p->layers);
    free(p);
}
