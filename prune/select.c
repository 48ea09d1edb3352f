/* Which tensors of a weights file are the layers to prune (or to read a pattern from): NAME.weight
 * tensors picked by a POSIX regex or by default, checked to be 2-D floating point, with their
 * scores from an optional second file. */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prune/prune.h"

static int natural_cmp(const void *a, const void *b)
{
    return strverscmp(((const tj_prune_layer_in *)a)->name, ((const tj_prune_layer_in *)b)->name);
}

static int is_weight(const char *name, size_t *stem)
{
    size_t len = strlen(name);
    if (len <= 7 || strcmp(name + len - 7, ".weight") != 0) return 0;
    *stem = len - 7;
    return 1;
}

static void shape_str(const tj_st_tensor *t, char *buf, size_t cap)
{
    size_t pos = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && pos < cap; d++)
        pos += (size_t)snprintf(buf + pos, cap - pos, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (pos < cap) snprintf(buf + pos, cap - pos, "]");
}

tj_status tj_prune_select(const tj_st_file *wf, const char *regex, const tj_st_file *sf, tj_prune_layer_in **out,
                          int64_t *nlayers, tj_error *err)
{
    *out = NULL;
    *nlayers = 0;
    regex_t re;
    int have_re = 0;
    tj_status s = TJ_OK;
    char *stem = NULL;
    tj_prune_layer_in *layers = NULL;
    int64_t n = 0, nweights = 0;
    if (regex) {
        int rc = regcomp(&re, regex, REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            char msg[256];
            regerror(rc, &re, msg, sizeof msg);
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "--layers '%s' is not a valid regular expression: %s", regex, msg);
        }
        have_re = 1;
    }
    layers = calloc((size_t)(wf->ntensors ? wf->ntensors : 1), sizeof *layers);
    if (!layers) goto oom;
    for (int64_t i = 0; i < wf->ntensors; i++) {
        const tj_st_tensor *t = &wf->tensors[i];
        size_t len;
        if (!is_weight(t->name, &len)) continue;
        nweights++;
        free(stem);
        if (!(stem = strndup(t->name, len))) goto oom;
        if (have_re) {
            if (regexec(&re, stem, 0, NULL, 0) != 0) continue;
        } else if (t->ndim != 2 || !t->dtype_ok || strstr(stem, "embed")) {
            continue;
        }
        char shape[128];
        shape_str(t, shape, sizeof shape);
        if (t->ndim != 2) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                        "%s: tensor '%s' selected by --layers '%s' is %d-D %s; only 2-D weights [n, k] of linear layers can be pruned",
                        wf->path, t->name, regex, t->ndim, shape);
            goto fail;
        }
        if (!t->dtype_ok) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has dtype %s; only F32, F16 and BF16 weights can be pruned",
                        wf->path, t->name, t->dtype_str);
            goto fail;
        }
        if (t->shape[0] < 1 || t->shape[1] < 1 || t->shape[0] > TJ_MAX_DIM || t->shape[1] > TJ_MAX_DIM) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has shape %s; each side must be in [1, %lld]",
                        wf->path, t->name, shape, (long long)TJ_MAX_DIM);
            goto fail;
        }
        tj_prune_layer_in *L = &layers[n];
        L->name = stem;
        stem = NULL;
        n++;
        L->n = t->shape[0];
        L->k = t->shape[1];
        L->w = t->data;
        L->wdt = t->dtype;
        if (sf) {
            /* NAME.weight, or NAME.score as the pruning method names Taylor-score tensors (docs/pruning.md). */
            const tj_st_tensor *st = tj_st_find(sf, t->name);
            if (!st) {
                size_t nlen = strlen(L->name);
                char *alt = malloc(nlen + 7);
                if (!alt) goto oom;
                memcpy(alt, L->name, nlen);
                memcpy(alt + nlen, ".score", 7);
                st = tj_st_find(sf, alt);
                free(alt);
            }
            if (!st) {
                s = tj_fail(err, TJ_ERR_NOT_FOUND, "%s: scores file has no tensor '%s' (nor '%s.score') for layer '%s'",
                            sf->path, t->name, L->name, L->name);
                goto fail;
            }
            char sshape[128];
            shape_str(st, sshape, sizeof sshape);
            if (st->ndim != 2 || st->shape[0] != L->n || st->shape[1] != L->k) {
                s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has shape %s but the weights are %s", sf->path,
                            st->name, sshape, shape);
                goto fail;
            }
            if (!st->dtype_ok) {
                s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has dtype %s; scores must be F32, F16 or BF16",
                            sf->path, st->name, st->dtype_str);
                goto fail;
            }
            L->score = st->data;
            L->sdt = st->dtype;
        }
    }
    free(stem);
    stem = NULL;
    if (n == 0) {
        if (have_re)
            s = tj_fail(err, TJ_ERR_NOT_FOUND, "%s: no layer matches --layers '%s' (the file has %lld *.weight tensors)",
                        wf->path, regex, (long long)nweights);
        else
            s = tj_fail(err, TJ_ERR_NOT_FOUND, "%s: no 2-D F32/F16/BF16 *.weight tensor to prune (the file has %lld *.weight tensors)",
                        wf->path, (long long)nweights);
        goto fail;
    }
    qsort(layers, (size_t)n, sizeof *layers, natural_cmp);
    /* One block holds the entries and their names, so the caller frees both with free(). */
    size_t names = 0;
    for (int64_t i = 0; i < n; i++) names += strlen(layers[i].name) + 1;
    tj_prune_layer_in *packed = malloc((size_t)n * sizeof *packed + names);
    if (!packed) goto oom;
    char *p = (char *)(packed + n);
    for (int64_t i = 0; i < n; i++) {
        packed[i] = layers[i];
        size_t len = strlen(layers[i].name) + 1;
        memcpy(p, layers[i].name, len);
        packed[i].name = p;
        p += len;
        free((char *)layers[i].name);
    }
    free(layers);
    if (have_re) regfree(&re);
    *out = packed;
    *nlayers = n;
    return TJ_OK;
oom:
    s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", wf->path);
fail:
    for (int64_t i = 0; layers && i < n; i++) free((char *)layers[i].name);
    free(layers);
    free(stem);
    if (have_re) regfree(&re);
    return s;
}
