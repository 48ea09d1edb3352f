/* Helpers of the reliability tests (issue 8): a small random model on disk (pattern + safetensors
 * with cols, ew, empty tiles, bias, every weight dtype), the backend to test from the
 * environment, and the process's resident memory. */
#ifndef TJ_REL_COMMON_H
#define TJ_REL_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/model.h"
#include "pattern/random.h"
#include "base/safetensors.h"
#include "tj_test.h"

#define REL_LAYERS 3

/* Layer i of the test model: different shapes, dtypes, activations; ew on layer 1, cols on 2. */
static inline tj_random_spec rel_spec(int i)
{
    tj_random_spec s = {.n = 96 + 40 * i, .k = 64 + 24 * i, .g = i == 2 ? 16 : 32, .sparsity = 0.5,
                        .mode = 1 + (i == 2), .seed = 1000 + (uint64_t)i, .ew_fraction = i == 1 ? 0.02 : 0,
                        .empty_tile_fraction = i == 0 ? 0.25 : 0, .act = (tj_activation)(i % 3)};
    return s;
}

/* Writes a random model of n layers to pattern_path and weights_path: layer i is specs[i] named
 * printf(name_fmt, i), its weights random (also outside the mask) stored as dtypes[i], a random
 * F32 bias when bias[i]. Returns 1 on success. */
static inline int rel_write_layers(const char *pattern_path, const char *weights_path, const char *name_fmt,
                                   const tj_random_spec *specs, const tj_dtype *dtypes, const int *bias, int n)
{
    enum { MAXL = 16 };
    if (n > MAXL) return 0;
    tj_layer layers[MAXL];
    memset(layers, 0, sizeof layers);
    tj_st_out_tensor ts[2 * MAXL];
    void *bufs[2 * MAXL] = {0};
    int64_t shapes[MAXL][2], bshapes[MAXL][1];
    char names[2 * MAXL][64];
    int nt = 0, ok = 1;
    tj_error err;
    for (int i = 0; i < n && ok; i++) {
        tj_random_spec s = specs[i];
        char name[32];
        snprintf(name, sizeof name, name_fmt, i);
        if (tj_random_layer(&s, name, &layers[i], &err) != TJ_OK) { ok = 0; break; }
        tj_dtype d = dtypes[i];
        int64_t nk = s.n * s.k;
        float *w = malloc((size_t)nk * 4);
        void *raw = malloc((size_t)nk * 4);
        tj_rng r = {77 + (uint64_t)i};
        tj_test_fill(&r, w, nk);
        tj_convert_from_f32(w, nk, d, raw);
        free(w);
        bufs[nt] = raw;
        shapes[i][0] = s.n;
        shapes[i][1] = s.k;
        snprintf(names[nt], sizeof names[nt], "%s.weight", name);
        ts[nt] = (tj_st_out_tensor){names[nt], tj_dtype_name(d), 2, shapes[i], raw, (uint64_t)nk * tj_dtype_size(d)};
        nt++;
        if (bias[i]) {
            float *b = malloc((size_t)s.n * 4);
            tj_test_fill(&r, b, s.n);
            bufs[nt] = b;
            bshapes[i][0] = s.n;
            snprintf(names[nt], sizeof names[nt], "%s.bias", name);
            ts[nt] = (tj_st_out_tensor){names[nt], "F32", 1, bshapes[i], b, (uint64_t)s.n * 4};
            nt++;
        }
    }
    if (ok) {
        tj_pattern p = {.nlayers = n, .layers = layers};
        ok = tj_pattern_save(&p, pattern_path, &err) == TJ_OK && tj_st_write(weights_path, ts, nt, NULL, &err) == TJ_OK;
        if (!ok) fprintf(stderr, "rel_write_layers: %s\n", err.msg);
    }
    for (int i = 0; i < n; i++) tj_layer_free(&layers[i]);
    for (int i = 0; i < nt; i++) free(bufs[i]);
    return ok;
}

/* Writes dir/model.json and dir/model.safetensors (layer i: "blk.<i>.fc", dtype i % 3, bias on
 * even i). Returns 1 on success. */
static inline int rel_write_model(const char *dir, char *pattern_path, char *weights_path, size_t cap)
{
    snprintf(pattern_path, cap, "%s/model.json", dir);
    snprintf(weights_path, cap, "%s/model.safetensors", dir);
    tj_random_spec specs[REL_LAYERS];
    tj_dtype dtypes[REL_LAYERS];
    int bias[REL_LAYERS];
    for (int i = 0; i < REL_LAYERS; i++) {
        specs[i] = rel_spec(i);
        dtypes[i] = (tj_dtype)(i % 3);
        bias[i] = i % 2 == 0;
    }
    return rel_write_layers(pattern_path, weights_path, "blk.%d.fc", specs, dtypes, bias, REL_LAYERS);
}

/* The backend under test: $TJ_TEST_BACKEND (reference, cpu, cuda, auto); reference by default. */
static inline tj_backend rel_backend(void)
{
    const char *b = getenv("TJ_TEST_BACKEND");
    if (!b || !*b || strcmp(b, "reference") == 0) return TJ_BACKEND_REFERENCE;
    if (strcmp(b, "cpu") == 0) return TJ_BACKEND_CPU;
    if (strcmp(b, "cuda") == 0) return TJ_BACKEND_CUDA;
    return TJ_BACKEND_AUTO;
}

/* Resident set size in bytes (/proc/self/statm), or -1. */
static inline long rel_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = -1, rss = -1;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = -1;
        fclose(f);
    }
    return rss < 0 ? -1 : rss * sysconf(_SC_PAGESIZE);
}

/* Under a sanitizer (the asan/tsan test setups set TJ_SANITIZER) memory figures mean little. */
static inline int rel_sanitized(void)
{
    const char *s = getenv("TJ_SANITIZER");
    return s && *s;
}

#endif
