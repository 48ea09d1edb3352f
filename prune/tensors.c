/* Pruning of in-memory weights (include/tilejit/tensors.h): named DLTensors in, a pattern as
 * JSON text out, through the same one-shot algorithm as `tilejit prune` (prune.c). */
#include <stdlib.h>
#include <string.h>

#include "prune/prune.h"
#include "runtime/model.h"
#include "tilejit/tensors.h"

tj_prune_params tj_prune_params_default(void)
{
    tj_prune_options o = tj_prune_options_default();
    tj_prune_params p = {sizeof p, o.sparsity, o.g, tj_prune_mode_name(o.mode), o.ew_fraction};
    return p;
}

/* One layer's weights as tj_prune_layers reads them: compact [n × k]; a strided tensor is
 * copied into *copy (freed by the caller). */
static tj_status layer_in(const tj_named_tensor *t, tj_prune_layer_in *in, void **copy, tj_error *err)
{
    const DLTensor *d = t->tensor;
    size_t nl = strlen(t->name) - strlen(".weight");
    if (!d || d->ndim != 2 || !d->shape)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tensor '%s': expected a 2-D weight", t->name);
    if (d->device.device_type != kDLCPU && d->device.device_type != kDLCUDAHost)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tensor '%s': weights must be host memory", t->name);
    if (!tj_dl_dtype(d, &in->wdt))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tensor '%s': dtype (code %d, %d bits) is not float32, float16 or bfloat16",
                       t->name, d->dtype.code, d->dtype.bits);
    char *name = malloc(nl + 1);
    if (!name) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    memcpy(name, t->name, nl);
    name[nl] = 0;
    in->name = name;
    in->n = d->shape[0];
    in->k = d->shape[1];
    int64_t st[2];
    tj_dl_strides(d, st);
    size_t es = tj_dtype_size(in->wdt);
    const char *base = (const char *)d->data + d->byte_offset;
    if ((in->n <= 1 || st[0] == in->k) && (in->k <= 1 || st[1] == 1)) {
        in->w = base;
        return TJ_OK;
    }
    char *buf = malloc((size_t)(in->n * in->k) * es + 1);
    if (!buf) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < in->n; i++)
        for (int64_t j = 0; j < in->k; j++)
            memcpy(buf + (size_t)(i * in->k + j) * es, base + (i * st[0] + j * st[1]) * (int64_t)es, es);
    in->w = buf;
    *copy = buf;
    return TJ_OK;
}

static int is_weight(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    return n > 7 && strcmp(name + n - 7, ".weight") == 0;
}

tj_status tj_prune_tensors(tj_context *c, const tj_named_tensor *tensors, int64_t ntensors,
                           const tj_prune_params *params, char **out_json)
{
    tj_error err;
    tj_error_clear(&err);
    if (!out_json) return TJ_ERR_INVALID_ARGUMENT;
    *out_json = NULL;
    if (!c || !params || ntensors < 0 || (!tensors && ntensors > 0)) {
        tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "tj_prune_tensors: NULL argument or negative count");
        return c ? tj_context_set_error(c, &err) : err.status;
    }
    tj_prune_params p = tj_prune_params_default();
    memcpy(&p, params, params->size < sizeof p ? params->size : sizeof p);
    tj_prune_options o = tj_prune_options_default();
    o.sparsity = p.sparsity;
    o.g = p.g;
    o.ew_fraction = p.ew_fraction;
    tj_prune_layer_in *in = calloc((size_t)(ntensors ? ntensors : 1), sizeof *in);
    void **copies = calloc((size_t)(ntensors ? ntensors : 1), sizeof *copies);
    tj_pattern *pat = NULL;
    int64_t nl = 0;
    tj_status s = TJ_OK;
    if (!in || !copies) {
        s = tj_fail(&err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    if (!p.mode || !tj_prune_mode_parse(p.mode, &o.mode)) {
        s = tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "prune: mode '%s' is not tw1, tw2 or tew", p.mode ? p.mode : "(null)");
        goto fail;
    }
    if (p.g < 1) {
        s = tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "prune: g = %lld must be positive", (long long)p.g);
        goto fail;
    }
    for (int64_t i = 0; i < ntensors; i++) {
        if (!is_weight(tensors[i].name)) continue;
        if ((s = layer_in(&tensors[i], &in[nl], &copies[nl], &err)) != TJ_OK) {
            nl++; /* its name, if any, is freed below */
            goto fail;
        }
        nl++;
    }
    if (nl == 0) {
        s = tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "prune: no tensor named NAME.weight among the %lld given", (long long)ntensors);
        goto fail;
    }
    if ((s = tj_prune_layers(in, nl, &o, &pat, &err)) != TJ_OK) goto fail;
    if (!(*out_json = tj_pattern_to_json(pat))) s = tj_fail(&err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
fail:
    for (int64_t i = 0; in && copies && i < nl; i++) {
        free((char *)in[i].name);
        free(copies[i]);
    }
    free(in);
    free(copies);
    tj_pattern_destroy(pat);
    return s == TJ_OK ? TJ_OK : tj_context_set_error(c, &err);
}
