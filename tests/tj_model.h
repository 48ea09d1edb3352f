/* Test helpers for random layers: a described random layer with typed weights and bias in memory
 * (tj_test_case), and a one-layer model on disk (suites cpu and unit): a random tw1 pattern 'fc'
 * (256 × 192, g 64, 75 %) in DIR/p.json and its weights and bias (random from a seed) in
 * DIR/w.safetensors, kept in memory for the reference. */
#ifndef TJ_TEST_MODEL_H
#define TJ_TEST_MODEL_H

#include <stdio.h>
#include <stdlib.h>

#include "base/safetensors.h"
#include "pattern/pattern.h"
#include "pattern/random.h"
#include "tj_test.h"

/* A random layer: shape, tile width, sparsity, mode (1 tw1, 2 tw2), ew fraction, fraction of
 * empty tiles, activation, weight dtype and whether it has a bias. */
typedef struct tj_test_case {
    const char *what;
    int64_t n, k, g;
    double s;
    int mode;
    double ew, empty;
    tj_activation act;
    tj_dtype wdt;
    int bias;
} tj_test_case;

/* Makes the case's pattern (seed) in *l and its weights (n × k) and bias (n, or NULL) in c->wdt,
 * random from one stream; the caller frees *w, *b and tj_layer_free(l). Returns 0 after a message. */
static inline int tj_test_case_make(const tj_test_case *c, uint64_t seed, tj_layer *l, void **w, void **b)
{
    tj_error err;
    tj_random_spec sp = {c->n, c->k, c->g, c->s, c->mode, seed, c->ew, c->empty, c->act};
    if (tj_random_layer(&sp, c->what, l, &err) != TJ_OK) {
        fprintf(stderr, "%s: %s\n", c->what, err.msg);
        return 0;
    }
    tj_rng r = {seed * 7 + 3};
    float *f = malloc((size_t)(c->n * c->k + c->n) * sizeof *f);
    size_t es = tj_dtype_size(c->wdt);
    *w = malloc((size_t)(c->n * c->k) * es + 4);
    *b = c->bias ? malloc((size_t)c->n * es + 4) : NULL;
    tj_test_fill(&r, f, c->n * c->k + c->n);
    tj_convert_from_f32(f, c->n * c->k, c->wdt, *w);
    if (*b) tj_convert_from_f32(f + c->n * c->k, c->n, c->wdt, *b);
    free(f);
    return 1;
}

enum { TJ_TEST_MODEL_N = 256, TJ_TEST_MODEL_K = 192 };

typedef struct tj_test_model {
    tj_layer layer;
    float *w, bias[TJ_TEST_MODEL_N];
    char pat[600], wts[600];
} tj_test_model;

/* pattern_seed draws the kept rows, data_seed the weights; returns 0, or -1 with a message. */
static inline int tj_test_model_make(tj_test_model *m, const char *dir, uint64_t pattern_seed,
                                     uint64_t data_seed, tj_activation act)
{
    enum { N = TJ_TEST_MODEL_N, K = TJ_TEST_MODEL_K };
    tj_error err;
    snprintf(m->pat, sizeof m->pat, "%s/p.json", dir);
    snprintf(m->wts, sizeof m->wts, "%s/w.safetensors", dir);
    tj_random_spec spec = {.n = N, .k = K, .g = 64, .sparsity = 0.75, .mode = 1, .seed = pattern_seed, .act = act};
    m->w = malloc(N * K * sizeof *m->w);
    if (!m->w || tj_random_layer(&spec, "fc", &m->layer, &err) != TJ_OK) {
        fprintf(stderr, "test model: %s\n", m->w ? err.msg : "out of memory");
        free(m->w);
        return -1;
    }
    tj_pattern p = {1, &m->layer};
    tj_rng rng = {data_seed};
    tj_test_fill(&rng, m->w, N * K);
    tj_test_fill(&rng, m->bias, N);
    int64_t sw[2] = {N, K}, sb[1] = {N};
    tj_st_out_tensor t[2] = {{"fc.weight", "F32", 2, sw, m->w, sizeof(float) * N * K},
                             {"fc.bias", "F32", 1, sb, m->bias, sizeof m->bias}};
    if (tj_pattern_save(&p, m->pat, &err) != TJ_OK || tj_st_write(m->wts, t, 2, NULL, &err) != TJ_OK) {
        fprintf(stderr, "test model: %s\n", err.msg);
        free(m->w);
        tj_layer_free(&m->layer);
        return -1;
    }
    return 0;
}

static inline void tj_test_model_free(tj_test_model *m)
{
    free(m->w);
    tj_layer_free(&m->layer);
}

#endif
