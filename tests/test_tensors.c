/* Models from in-memory tensors (tilejit/tensors.h): compact weights used in place, strided ones
 * copied, float16 weights, one layer from its JSON object, every error path, and pruning of
 * in-memory weights; outputs checked against the reference loops on fresh random data. */
#include <jansson.h>
#include <time.h>

#include "tilejit/tensors.h"
#include "tj_test.h"
#include "base/dtype.h"
#include "pattern/pattern.h"
#include "pattern/random.h"
#include "runtime/model.h"

typedef struct {
    DLTensor t;
    int64_t shape[2], strides[2];
} dl2;

static void dl_make(dl2 *d, void *data, int ndim, int64_t r, int64_t c, int code, int bits, const int64_t *strides)
{
    memset(d, 0, sizeof *d);
    d->shape[0] = r;
    d->shape[1] = c;
    d->t.data = data;
    d->t.device = (DLDevice){kDLCPU, 0};
    d->t.ndim = ndim;
    d->t.dtype = (DLDataType){(uint8_t)code, (uint8_t)bits, 1};
    d->t.shape = d->shape;
    if (strides) {
        d->strides[0] = strides[0];
        d->strides[1] = strides[1];
        d->t.strides = d->strides;
    }
}

/* y from the model vs the reference loops on weights w (dtype wdt) and bias b. */
static double run_vs_reference(tj_model *m, const tj_layer *l, const void *w, tj_dtype wdt, const float *b,
                               int64_t rows, tj_rng *r)
{
    float *x = malloc(sizeof(float) * (size_t)(rows * l->k)), *y = malloc(sizeof(float) * (size_t)(rows * l->n));
    float *ref = malloc(sizeof(float) * (size_t)(rows * l->n));
    tj_test_fill(r, x, rows * l->k);
    for (int64_t i = 0; i < rows * l->n; i++) y[i] = NAN; /* poison: unwritten elements show */
    dl2 xd, yd;
    dl_make(&xd, x, 2, rows, l->k, kDLFloat, 32, NULL);
    dl_make(&yd, y, 2, rows, l->n, kDLFloat, 32, NULL);
    tj_status s = tj_linear_ex(m, 0, &xd.t, &yd.t, TJ_LAYOUT_ROW_MAJOR, NULL);
    CHECKF(s == TJ_OK, "tj_linear_ex: %s", tj_context_error(m->ctx));
    tj_layer_weights lw = {w, wdt, b, TJ_F32};
    tj_reference_linear(l, &lw, x, rows, ref);
    double e = s == TJ_OK && tj_test_all_finite(y, rows * l->n) ? tj_test_relerr(y, ref, rows * l->n) : INFINITY;
    free(x);
    free(y);
    free(ref);
    return e;
}

static void check_backend(tj_backend be, const tj_layer *l, const char *json, tj_rng *r)
{
    tj_options o = tj_options_default();
    o.backend = be;
    o.threads = 2;
    tj_context *c = NULL;
    if (tj_context_create(&o, &c) != TJ_OK) {
        printf("backend %s unavailable (%s): skipped\n", tj_backend_name(be), tj_last_error());
        return;
    }
    int64_t n = l->n, k = l->k;
    float *w = malloc(sizeof(float) * (size_t)(n * k)), *wt = malloc(sizeof(float) * (size_t)(n * k));
    float *b = malloc(sizeof(float) * (size_t)n);
    uint16_t *wh = malloc(2 * (size_t)(n * k));
    tj_test_fill(r, w, n * k);
    tj_test_fill(r, b, n);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++)
            wh[i * k + j] = tj_f32_to_f16(w[i * k + j]);
    char wname[256], bname[256];
    snprintf(wname, sizeof wname, "%s.weight", l->name);
    snprintf(bname, sizeof bname, "%s.bias", l->name);
    dl2 wd, bd, wtd, whd;
    dl_make(&wd, w, 2, n, k, kDLFloat, 32, NULL);
    dl_make(&bd, b, 1, n, 0, kDLFloat, 32, NULL);
    int64_t tstr[2] = {1, n}; /* [n × k] view of a [k × n] buffer: a transposed view */
    dl_make(&wtd, wt, 2, n, k, kDLFloat, 32, tstr);
    dl_make(&whd, wh, 2, n, k, kDLFloat, 16, NULL);
    tj_named_tensor extra = {"unrelated.weight", &bd.t};

    /* compact float32: used in place */
    tj_named_tensor t1[] = {extra, {wname, &wd.t}, {bname, &bd.t}};
    tj_model *m = NULL;
    tj_status s = tj_model_load_tensors(c, json, strlen(json), t1, 3, &m);
    CHECKF(s == TJ_OK, "%s: load compact: %s", tj_backend_name(be), tj_context_error(c));
    if (s == TJ_OK) {
        CHECK(tj_model_copied_bytes(m) == 0);
        double e = run_vs_reference(m, l, w, TJ_F32, b, 7, r);
        CHECKF(e < 1e-5, "%s compact: relerr %g", tj_backend_name(be), e);
        if (be == TJ_BACKEND_REFERENCE) {
            /* The reference backend reads weights at every call: a change to the caller's tensor
             * shows, which proves it was borrowed, not copied. */
            for (int64_t i = 0; i < n * k; i++) w[i] = -2 * w[i];
            e = run_vs_reference(m, l, w, TJ_F32, b, 3, r);
            CHECKF(e < 1e-5, "reference: borrowed weights changed, relerr %g", e);
        }
        tj_model_destroy(m);
    }

    /* transposed view: copied once into a compact buffer, same results */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++) wt[j * n + i] = w[i * k + j];
    tj_named_tensor t2[] = {{wname, &wtd.t}, {bname, &bd.t}};
    m = NULL;
    s = tj_model_load_tensors(c, json, strlen(json), t2, 2, &m);
    CHECKF(s == TJ_OK, "%s: load strided: %s", tj_backend_name(be), tj_context_error(c));
    if (s == TJ_OK) {
        CHECKF(tj_model_copied_bytes(m) == 4 * n * k, "copied %lld bytes", (long long)tj_model_copied_bytes(m));
        for (int64_t i = 0; i < n * k; i++) wt[i] = 1e30f; /* the model must not read the view again */
        double e = run_vs_reference(m, l, w, TJ_F32, b, 5, r);
        CHECKF(e < 1e-5, "%s strided: relerr %g", tj_backend_name(be), e);
        tj_model_destroy(m);
    }

    /* float16 weights, no bias, through tj_model_load_layer with the layer's object alone */
    json_error_t je;
    json_t *doc = json_loads(json, 0, &je);
    char *obj = doc ? json_dumps(json_array_get(json_object_get(doc, "layers"), 0), JSON_COMPACT) : NULL;
    CHECK(obj != NULL);
    m = NULL;
    s = obj ? tj_model_load_layer(c, obj, &whd.t, NULL, &m) : TJ_ERR_INTERNAL;
    CHECKF(s == TJ_OK, "%s: load_layer f16: %s", tj_backend_name(be), tj_context_error(c));
    if (s == TJ_OK) {
        CHECK(tj_model_copied_bytes(m) == 0);
        double e = run_vs_reference(m, l, wh, TJ_F16, NULL, 4, r);
        CHECKF(e < 1e-5, "%s f16: relerr %g", tj_backend_name(be), e);
        tj_model_destroy(m);
    }
    /* the whole one-layer document works too */
    m = NULL;
    s = tj_model_load_layer(c, json, &wd.t, &bd.t, &m);
    CHECKF(s == TJ_OK, "load_layer document: %s", tj_context_error(c));
    tj_model_destroy(m);
    free(obj);
    json_decref(doc);

    /* errors: a clear status and message, never a model */
    struct {
        const char *what;
        tj_status want;
        const char *needle;
    } cases[] = {{"missing weight", TJ_ERR_NOT_FOUND, "not found"},
                 {"wrong shape", TJ_ERR_FORMAT, "pattern needs"},
                 {"device tensor", TJ_ERR_INVALID_ARGUMENT, "host memory"},
                 {"int32 dtype", TJ_ERR_FORMAT, "not supported"},
                 {"bad bias", TJ_ERR_FORMAT, "expected shape"},
                 {"bad JSON", TJ_ERR_FORMAT, ""}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dl2 bad = wd, badb = bd;
        bad.t.shape = bad.shape;
        badb.t.shape = badb.shape;
        tj_named_tensor t[] = {{wname, &bad.t}, {bname, &bd.t}};
        const char *js = json;
        if (i == 0) t[0].name = "nope.weight";
        if (i == 1) bad.shape[1] = k + 1;
        if (i == 2) bad.t.device.device_type = kDLCUDA;
        if (i == 3) bad.t.dtype = (DLDataType){kDLInt, 32, 1};
        if (i == 4) {
            badb.shape[0] = n - 1;
            t[1].tensor = &badb.t;
        }
        if (i == 5) js = "{\"format\": \"tilejit-pattern\", \"version\": 1, \"layers\": [";
        m = (tj_model *)1;
        s = tj_model_load_tensors(c, js, strlen(js), t, 2, &m);
        CHECKF(s == cases[i].want && m == NULL && strstr(tj_context_error(c), cases[i].needle),
               "%s: status %d, message '%s'", cases[i].what, s, tj_context_error(c));
    }
    CHECK(tj_model_load_tensors(c, NULL, 0, t1, 3, &m) == TJ_ERR_INVALID_ARGUMENT);
    CHECK(tj_model_load_layer(c, "[1, 2]", &wd.t, NULL, &m) == TJ_ERR_FORMAT);
    free(w);
    free(wt);
    free(wh);
    free(b);
    tj_context_destroy(c);
}

static void check_prune(tj_rng *r)
{
    tj_context *c = NULL;
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_REFERENCE;
    CHECK(tj_context_create(&o, &c) == TJ_OK);
    if (!c) return;
    int64_t n1 = 256, k1 = 128, n2 = 128, k2 = 256;
    float *w1 = malloc(sizeof(float) * (size_t)(n1 * k1)), *w2 = malloc(sizeof(float) * (size_t)(n2 * k2));
    float *w2t = malloc(sizeof(float) * (size_t)(n2 * k2));
    tj_test_fill(r, w1, n1 * k1);
    tj_test_fill(r, w2, n2 * k2);
    for (int64_t i = 0; i < n2; i++)
        for (int64_t j = 0; j < k2; j++) w2t[j * n2 + i] = w2[i * k2 + j];
    dl2 d1, d2, d2t;
    int64_t tstr[2] = {1, n2};
    dl_make(&d1, w1, 2, n1, k1, kDLFloat, 32, NULL);
    dl_make(&d2, w2, 2, n2, k2, kDLFloat, 32, NULL);
    dl_make(&d2t, w2t, 2, n2, k2, kDLFloat, 32, tstr);
    tj_prune_params p = tj_prune_params_default();
    p.sparsity = 0.5;
    p.g = 64;
    char *json = NULL, *json_t = NULL;
    tj_named_tensor t[] = {{"a.weight", &d1.t}, {"a.bias", &d1.t}, {"b.weight", &d2.t}};
    tj_status s = tj_prune_tensors(c, t, 3, &p, &json);
    CHECKF(s == TJ_OK, "prune: %s", tj_context_error(c));
    t[2].tensor = &d2t.t; /* the same weights through a strided view give the same pattern */
    CHECK(tj_prune_tensors(c, t, 3, &p, &json_t) == TJ_OK);
    CHECK(json && json_t && strcmp(json, json_t) == 0);
    tj_pattern *pat = NULL;
    tj_error err;
    tj_error_clear(&err);
    if (json && tj_pattern_parse(json, strlen(json), "pruned", &pat, &err) == TJ_OK) {
        CHECK(pat->nlayers == 2 && strcmp(pat->layers[0].name, "a") == 0 && strcmp(pat->layers[1].name, "b") == 0);
        double kept = (double)(tj_layer_kept(&pat->layers[0]) + tj_layer_kept(&pat->layers[1]));
        double frac = kept / (double)(n1 * k1 + n2 * k2);
        CHECKF(frac > 0.45 && frac < 0.55, "kept fraction %g at sparsity 0.5", frac);
        CHECK(pat->layers[0].g == 64);
        tj_pattern_destroy(pat);
        tj_named_tensor lt[] = {{"a.weight", &d1.t}, {"b.weight", &d2.t}};
        tj_model *m = NULL;
        CHECKF(tj_model_load_tensors(c, json, strlen(json), lt, 2, &m) == TJ_OK, "%s", tj_context_error(c));
        tj_model_destroy(m);
    } else {
        CHECKF(0, "pruned pattern does not parse: %s", err.msg);
    }
    tj_free(json);
    tj_free(json_t);
    p.mode = "bogus";
    json = (char *)1;
    CHECK(tj_prune_tensors(c, t, 3, &p, &json) == TJ_ERR_INVALID_ARGUMENT && json == NULL);
    CHECK(strstr(tj_context_error(c), "bogus") != NULL);
    p = tj_prune_params_default();
    p.sparsity = 1.5;
    CHECK(tj_prune_tensors(c, t, 3, &p, &json) == TJ_ERR_INVALID_ARGUMENT);
    p.sparsity = 0.5;
    CHECK(tj_prune_tensors(c, t + 1, 1, &p, &json) == TJ_ERR_INVALID_ARGUMENT); /* no NAME.weight */
    free(w1);
    free(w2);
    free(w2t);
    tj_context_destroy(c);
}

int main(void)
{
    tj_rng r = {0x5eed7e75u ^ (uint64_t)time(NULL)};
    printf("seed %llu\n", (unsigned long long)r.s);
    tj_random_spec spec = {.n = 300, .k = 96, .g = 128, .sparsity = 0.6, .mode = 2, .seed = tj_rng_next(&r),
                           .ew_fraction = 0.02, .act = TJ_ACT_GELU};
    tj_layer l;
    tj_error err;
    tj_error_clear(&err);
    if (tj_random_layer(&spec, "blk.0.fc", &l, &err) != TJ_OK) {
        fprintf(stderr, "random layer: %s\n", err.msg);
        return 1;
    }
    tj_pattern p = {1, &l};
    char *json = tj_pattern_to_json(&p);
    CHECK(json != NULL);
    if (json) {
        check_backend(TJ_BACKEND_REFERENCE, &l, json, &r);
        check_backend(TJ_BACKEND_CPU, &l, json, &r);
    }
    check_prune(&r);
    free(json);
    tj_layer_free(&l);
    return tj_test_end();
}
