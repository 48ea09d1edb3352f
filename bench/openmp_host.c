/* openmp_host: a plain C program with its own OpenMP work, calling tilejit in between, as a
 * framework does: per layer of a model, one tj_linear call and then the program's own parallel
 * elementwise pass over the output (an activation-like x / (1 + |x|) with a row sum). Timed with
 * tilejit's loops on its own worker threads (threading POOL) and on the program's OpenMP runtime
 * (OPENMP), in blocks POOL, OPENMP, POOL, OPENMP 0.2 s apart (each after 0.2 s of warm-up); prints per threading the median ms of a pass
 * over all layers (min-max) and, of that, the tj_linear calls and the program's work. The first
 * pass of each is checked against the reference backend and against each other, bit for bit.
 * Public API only.
 * HOST 0 leaves the program's own work out (tilejit alone, the OpenMP runtime idle between calls).
 * usage: openmp_host PATTERN WEIGHTS [M 128] [THREADS 2] [PASSES 15] [HOST 1] */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tilejit.h"

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct layer_io {
    int64_t n, k;
    float *x, *y, *ref, *first_y; /* the reference's y and the first block's y, for the checks */
    double *rowsum;
} layer_io;

static int with_host;

/* The program's own parallel work on one layer's output. */
static void host_work(layer_io *l, int64_t m)
{
    if (!with_host) return;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++) {
        float *r = l->y + i * l->n;
        double s = 0;
        for (int64_t j = 0; j < l->n; j++) {
            r[j] = r[j] / (1.0f + fabsf(r[j]));
            s += r[j];
        }
        l->rowsum[i] = s;
    }
}

static int call(tj_model *model, int64_t i, layer_io *l, int64_t m)
{
    int64_t xs[2] = {m, l->k}, ys[2] = {m, l->n};
    DLTensor xt = {l->x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
    DLTensor yt = {l->y, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, ys, NULL, 0};
    return tj_linear_ex(model, i, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) == TJ_OK;
}

/* One pass over all layers; *t_tj: seconds inside tj_linear. 0 on a failed call. */
static int pass(tj_model *model, layer_io *ls, int64_t nl, int64_t m, double *t_all, double *t_tj)
{
    double t0 = tj_now(), tj = 0;
    for (int64_t i = 0; i < nl; i++) {
        double a = tj_now();
        if (!call(model, i, &ls[i], m)) return 0;
        tj += tj_now() - a;
        host_work(&ls[i], m);
    }
    *t_all = tj_now() - t0;
    *t_tj = tj;
    return 1;
}

static tj_model *load(const char *pat, const char *wts, tj_backend b, tj_threading th, int threads, tj_context **c)
{
    tj_options o = tj_options_default();
    o.backend = b;
    o.threading = th;
    o.threads = threads;
    tj_model *m = NULL;
    if (tj_context_create(&o, c) != TJ_OK) {
        fprintf(stderr, "openmp_host: %s\n", tj_last_error());
        return NULL;
    }
    if (tj_model_load(*c, pat, wts, &m) != TJ_OK) fprintf(stderr, "openmp_host: %s\n", tj_context_error(*c));
    return m;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: openmp_host PATTERN WEIGHTS [M 128] [THREADS 2] [PASSES 15] [HOST 1]\n");
        return 1;
    }
    int64_t m = argc > 3 ? atoll(argv[3]) : 128;
    int threads = argc > 4 ? atoi(argv[4]) : 2, passes = argc > 5 ? atoi(argv[5]) : 15;
    with_host = argc > 6 ? atoi(argv[6]) != 0 : 1;
    if (m < 1 || threads < 1 || passes < 1) {
        fprintf(stderr, "openmp_host: M, THREADS and PASSES must be >= 1\n");
        return 1;
    }
    omp_set_num_threads(threads);
    tj_context *rc = NULL;
    tj_model *ref = load(argv[1], argv[2], TJ_BACKEND_REFERENCE, TJ_THREADING_AUTO, 1, &rc);
    if (!ref) return 1;
    int64_t nl = tj_model_layer_count(ref);
    layer_io *ls = calloc((size_t)nl, sizeof *ls);
    double flops = 0;
    for (int64_t i = 0; i < nl; i++) {
        tj_layer_info li;
        tj_model_layer_info(ref, i, &li);
        ls[i].n = li.n;
        ls[i].k = li.k;
        flops += 2.0 * (double)m * (double)li.kept_weights;
        ls[i].x = malloc((size_t)(m * li.k) * sizeof(float));
        ls[i].y = malloc((size_t)(m * li.n) * sizeof(float));
        ls[i].ref = malloc((size_t)(m * li.n) * sizeof(float));
        ls[i].first_y = malloc((size_t)(m * li.n) * sizeof(float));
        ls[i].rowsum = malloc((size_t)m * sizeof(double));
        for (int64_t j = 0; j < m * li.k; j++) ls[i].x[j] = (float)((j * 7919 + i) % 1000) / 500.0f - 1.0f;
        if (!call(ref, i, &ls[i], m)) {
            fprintf(stderr, "openmp_host: reference: %s\n", tj_context_error(rc));
            return 1;
        }
        memcpy(ls[i].ref, ls[i].y, (size_t)(m * li.n) * sizeof(float));
    }
    tj_model_destroy(ref);
    tj_context_destroy(rc);
    printf("%s: %lld layers, M %lld, %d threads (omp_set_num_threads and tilejit), %.2f GFLOP kept per pass; "
           "%d passes per block, blocks pool, openmp, pool, openmp%s\n",
           argv[1], (long long)nl, (long long)m, threads, flops / 1e9, passes,
           with_host ? "" : "; without the program's own work");
    static const tj_threading kinds[2] = {TJ_THREADING_POOL, TJ_THREADING_OPENMP};
    static const char *names[2] = {"pool", "openmp"};
    double *t_all[2], *t_tj[2];
    int cnt[2] = {0, 0}, status = 0, checked[2] = {0, 0};
    for (int w = 0; w < 2; w++) {
        t_all[w] = malloc((size_t)(2 * passes) * sizeof(double));
        t_tj[w] = malloc((size_t)(2 * passes) * sizeof(double));
    }
    for (int block = 0; block < 4 && !status; block++) {
        int w = block % 2;
        tj_context *c = NULL;
        /* pool: THREADS own threads; openmp: as many as the program's omp_get_max_threads() */
        tj_model *model = load(argv[1], argv[2], TJ_BACKEND_CPU, kinds[w], w ? 0 : threads, &c);
        if (!model) return 1;
        double a, b;
        /* warm-up: 3 passes and at least 0.2 s (the first tens of milliseconds of a process ran
         * M = 1 passes 60 % slower here) */
        int warm = 3;
        double t_warm = tj_now();
        for (int p = 0; p < warm + passes && !status; p++) {
            if (p == warm - 1 && tj_now() - t_warm < 0.2) warm++;
            if (!checked[w]) { /* the tj_linear results of the first pass, before the program's work */
                for (int64_t i = 0; i < nl && !status; i++) {
                    int64_t len = m * ls[i].n;
                    if (!call(model, i, &ls[i], m)) status = 1;
                    double e = tj_rel_error(ls[i].y, ls[i].ref, len);
                    if (!status && !(e <= tj_check_bound(TJ_F32))) {
                        fprintf(stderr, "openmp_host: layer %lld (%s): relative error %.2e to the reference\n",
                                (long long)i, names[w], e);
                        status = 1;
                    }
                    if (block == 0) memcpy(ls[i].first_y, ls[i].y, (size_t)len * sizeof(float));
                    else if (!status && memcmp(ls[i].first_y, ls[i].y, (size_t)len * sizeof(float)) != 0) {
                        fprintf(stderr, "openmp_host: layer %lld: pool and openmp results differ\n", (long long)i);
                        status = 1;
                    }
                }
                checked[w] = 1;
            }
            if (!pass(model, ls, nl, m, &a, &b)) {
                fprintf(stderr, "openmp_host: %s\n", tj_context_error(c));
                status = 1;
            } else if (p >= warm) {
                t_all[w][cnt[w]] = a;
                t_tj[w][cnt[w]++] = b;
            }
        }
        tj_model_destroy(model);
        tj_context_destroy(c);
        /* let the idle threads of this block stop spinning (libgomp's spin outlasts its last region
         * by milliseconds) before the next block is timed */
        struct timespec pause = {0, 200000000};
        nanosleep(&pause, NULL);
    }
    for (int w = 0; w < 2 && !status; w++) {
        double *ts = malloc((size_t)cnt[w] * sizeof(double));
        for (int i = 0; i < cnt[w]; i++) ts[i] = t_all[w][i] - t_tj[w][i];
        qsort(ts, (size_t)cnt[w], sizeof *ts, cmp);
        double host = ts[cnt[w] / 2];
        qsort(t_all[w], (size_t)cnt[w], sizeof(double), cmp);
        qsort(t_tj[w], (size_t)cnt[w], sizeof(double), cmp);
        printf("threading %-6s pass %8.2f ms (%.2f-%.2f): tj_linear %8.2f ms (%.1f GFLOP/s kept), the program's own "
               "work %6.2f ms\n", names[w], 1e3 * t_all[w][cnt[w] / 2], 1e3 * t_all[w][0], 1e3 * t_all[w][cnt[w] - 1],
               1e3 * t_tj[w][cnt[w] / 2], flops / t_tj[w][cnt[w] / 2] / 1e9, 1e3 * host);
        free(ts);
    }
    for (int w = 0; w < 2; w++) {
        free(t_all[w]);
        free(t_tj[w]);
    }
    for (int64_t i = 0; i < nl; i++) {
        free(ls[i].x);
        free(ls[i].y);
        free(ls[i].ref);
        free(ls[i].first_y);
        free(ls[i].rowsum);
    }
    free(ls);
    return status;
}
