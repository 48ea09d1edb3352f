/* The weights file of a calibrated prune: every tensor copied as it is, except each pattern
 * layer's NAME.weight and NAME.bias, which take the rebuilt values (converted to the tensor's
 * dtype; a missing bias is added as F32). Streams through the safetensors writer. */
#include <stdlib.h>
#include <string.h>

#include "prune/calib.h"

typedef struct rebuilt_ctx {
    const tj_st_out_tensor *outs;
    const int64_t *layer_of; /* per output tensor: the layer, or -1 */
    const int *is_bias;
    const float *const *w, *const *b;
    const tj_pattern *p;
} rebuilt_ctx;

static tj_status fill_rebuilt(void *user, int64_t index, void *buf, tj_error *err)
{
    const rebuilt_ctx *c = user;
    const tj_layer *l = &c->p->layers[c->layer_of[index]];
    const char *ds = c->outs[index].dtype_str;
    tj_dtype d = strcmp(ds, "F16") == 0 ? TJ_F16 : strcmp(ds, "BF16") == 0 ? TJ_BF16 : TJ_F32;
    (void)err;
    if (c->is_bias[index]) tj_convert_from_f32(c->b[c->layer_of[index]], l->n, d, buf);
    else tj_convert_from_f32(c->w[c->layer_of[index]], l->n * l->k, d, buf);
    return TJ_OK;
}

tj_status tj_prune_write_rebuilt(const tj_st_file *wf, const tj_pattern *p, const float *const *w,
                                 const float *const *b, const char *path, tj_error *err)
{
    tj_status s = TJ_OK;
    int64_t nt = wf->ntensors, cap = nt + p->nlayers;
    tj_st_out_tensor *outs = calloc((size_t)(cap ? cap : 1), sizeof *outs);
    int64_t *layer_of = malloc((size_t)(cap ? cap : 1) * sizeof *layer_of);
    int64_t *nshape = malloc((size_t)(p->nlayers ? p->nlayers : 1) * sizeof *nshape);
    int *is_bias = calloc((size_t)(cap ? cap : 1), sizeof *is_bias);
    char **extra = calloc((size_t)(p->nlayers ? p->nlayers : 1), sizeof *extra);
    if (!outs || !layer_of || !nshape || !is_bias || !extra) goto oom;
    if ((s = tj_prune_map_layers(wf, p, outs, layer_of, err)) != TJ_OK) goto done;
    int64_t nout = nt;
    for (int64_t li = 0; li < p->nlayers; li++) {
        const tj_layer *l = &p->layers[li];
        const tj_st_tensor *bt;
        if ((s = tj_prune_find_bias(wf, l->name, l->n, &bt, err)) != TJ_OK) goto done;
        if (bt) {
            int64_t idx = bt - wf->tensors;
            layer_of[idx] = li;
            is_bias[idx] = 1;
            outs[idx].data = NULL;
        } else {
            size_t len = strlen(l->name);
            if (!(extra[li] = malloc(len + 6))) goto oom;
            memcpy(extra[li], l->name, len);
            memcpy(extra[li] + len, ".bias", 6);
            nshape[li] = l->n;
            outs[nout] = (tj_st_out_tensor){extra[li], "F32", 1, &nshape[li], NULL, (uint64_t)l->n * 4};
            layer_of[nout] = li;
            is_bias[nout] = 1;
            nout++;
        }
    }
    rebuilt_ctx c = {outs, layer_of, is_bias, w, b, p};
    s = tj_st_write_stream(path, outs, nout, wf->metadata_json, fill_rebuilt, &c, err);
    goto done;
oom:
    s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
done:
    for (int64_t li = 0; extra && li < p->nlayers; li++) free(extra[li]);
    free(extra);
    free(outs);
    free(layer_of);
    free(nshape);
    free(is_bias);
    return s;
}
