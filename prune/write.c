/* The pruned weights file: every tensor of the input copied as it is, except that each pattern
 * layer's NAME.weight gets zeros outside its mask. Streams one layer at a time through the
 * safetensors writer, so memory holds the mapped input plus one layer. */
#include <stdlib.h>
#include <string.h>

#include "prune/prune.h"

typedef struct write_ctx {
    const tj_st_file *wf;
    const tj_pattern *p;
    const tj_st_out_tensor *outs;
    const int64_t *layer_of; /* per output tensor: the pattern layer, or -1 */
    int64_t *tile_of;        /* scratch, n entries */
} write_ctx;

static tj_status fill_layer(void *user, int64_t index, void *buf, tj_error *err)
{
    write_ctx *c = user;
    const tj_layer *l = &c->p->layers[c->layer_of[index]];
    const tj_st_tensor *t = tj_st_find(c->wf, c->outs[index].name);
    size_t es = tj_dtype_size(t->dtype);
    (void)err;
    for (int64_t row = 0; row < l->n; row++) c->tile_of[row] = -1;
    for (int64_t j = 0; j < l->ncols; j++) c->tile_of[tj_layer_col(l, j)] = j / l->g;
    memset(buf, 0, (size_t)(l->n * l->k) * es);
    const char *src = t->data;
    char *dst = buf;
    for (int64_t row = 0; row < l->n; row++) {
        size_t base = (size_t)(row * l->k);
        int64_t tt = c->tile_of[row];
        if (tt >= 0) {
            const int32_t *r = l->tile_rows + l->tile_ptr[tt];
            int64_t nr = tj_tile_nrows(l, tt);
            if (es == 4)
                for (int64_t i = 0; i < nr; i++) memcpy(dst + (base + (size_t)r[i]) * 4, src + (base + (size_t)r[i]) * 4, 4);
            else
                for (int64_t i = 0; i < nr; i++) memcpy(dst + (base + (size_t)r[i]) * 2, src + (base + (size_t)r[i]) * 2, 2);
        }
        if (l->ew_indptr)
            for (int64_t i = l->ew_indptr[row]; i < l->ew_indptr[row + 1]; i++) {
                size_t off = (base + (size_t)l->ew_indices[i]) * es;
                memcpy(dst + off, src + off, es);
            }
    }
    return TJ_OK;
}

tj_status tj_prune_map_layers(const tj_st_file *wf, const tj_pattern *p, tj_st_out_tensor *outs, int64_t *layer_of,
                              tj_error *err)
{
    for (int64_t i = 0; i < wf->ntensors; i++) {
        const tj_st_tensor *t = &wf->tensors[i];
        outs[i] = (tj_st_out_tensor){t->name, t->dtype_str, t->ndim, t->shape, t->data, t->end - t->begin};
        layer_of[i] = -1;
    }
    char *name = NULL;
    tj_status s = TJ_OK;
    for (int64_t li = 0; li < p->nlayers; li++) {
        const tj_layer *l = &p->layers[li];
        size_t len = strlen(l->name);
        free(name);
        if (!(name = malloc(len + 8))) {
            s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", wf->path);
            break;
        }
        memcpy(name, l->name, len);
        memcpy(name + len, ".weight", 8);
        const tj_st_tensor *t = tj_st_find(wf, name);
        if (!t) {
            s = tj_fail(err, TJ_ERR_NOT_FOUND, "%s: no tensor '%s' for layer '%s'", wf->path, name, l->name);
            break;
        }
        if (t->ndim != 2 || t->shape[0] != l->n || t->shape[1] != l->k || !t->dtype_ok) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is not an F32/F16/BF16 [%lld, %lld] matrix as layer '%s' needs",
                        wf->path, name, (long long)l->n, (long long)l->k, l->name);
            break;
        }
        int64_t idx = t - wf->tensors;
        if (layer_of[idx] >= 0) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "pattern: layer '%s' appears twice", l->name);
            break;
        }
        layer_of[idx] = li;
        outs[idx].data = NULL; /* produced by the caller's fill function */
    }
    free(name);
    return s;
}

tj_status tj_prune_find_bias(const tj_st_file *wf, const char *layer, int64_t n, const tj_st_tensor **out,
                             tj_error *err)
{
    *out = NULL;
    size_t len = strlen(layer);
    char *name = malloc(len + 6);
    if (!name) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", wf->path);
    memcpy(name, layer, len);
    memcpy(name + len, ".bias", 6);
    const tj_st_tensor *bt = tj_st_find(wf, name);
    tj_status s = TJ_OK;
    if (bt && (bt->ndim != 1 || bt->shape[0] != n || !bt->dtype_ok))
        s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is not an F32/F16/BF16 vector of %lld", wf->path, name,
                    (long long)n);
    else
        *out = bt;
    free(name);
    return s;
}

tj_status tj_prune_write_weights(const tj_st_file *wf, const tj_pattern *p, const char *path, tj_error *err)
{
    tj_status s = TJ_OK;
    int64_t nt = wf->ntensors, nmax = 1;
    tj_st_out_tensor *outs = calloc((size_t)(nt ? nt : 1), sizeof *outs);
    int64_t *layer_of = malloc((size_t)(nt ? nt : 1) * sizeof *layer_of);
    int64_t *tile_of = NULL;
    if (!outs || !layer_of) goto oom;
    if ((s = tj_prune_map_layers(wf, p, outs, layer_of, err)) != TJ_OK) goto done;
    for (int64_t li = 0; li < p->nlayers; li++)
        if (p->layers[li].n > nmax) nmax = p->layers[li].n;
    if (!(tile_of = malloc((size_t)nmax * sizeof *tile_of))) goto oom;
    write_ctx c = {wf, p, outs, layer_of, tile_of};
    s = tj_st_write_stream(path, outs, nt, wf->metadata_json, fill_layer, &c, err);
    goto done;
oom:
    s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
done:
    free(outs);
    free(layer_of);
    free(tile_of);
    return s;
}
