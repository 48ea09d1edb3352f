/* call_latency: the time of one direct tj_linear_ex call from C (DLTensors built once, output
 * reused), the yardstick bench/torch_overhead.py subtracts from a PyTorch call of the same layer.
 * Public API only. usage: call_latency PATTERN WEIGHTS LAYER M [BACKEND] [THREADS]
 * Prints: "c_call_ns median <ns> min <ns> calls <per repeat> repeats <n>". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tilejit.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: call_latency PATTERN WEIGHTS LAYER M [cpu|reference|cuda] [THREADS]\n");
        return 1;
    }
    int64_t m = atoll(argv[4]);
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_CPU;
    if (argc > 5 && strcmp(argv[5], "reference") == 0) o.backend = TJ_BACKEND_REFERENCE;
    if (argc > 6) o.threads = atoi(argv[6]);
    tj_context *c = NULL;
    tj_model *model = NULL;
    float *x = NULL, *y = NULL;
    int rc = 1;
    if (tj_context_create(&o, &c) != TJ_OK) {
        fprintf(stderr, "call_latency: %s\n", tj_last_error());
        return 1;
    }
    int64_t idx = 0;
    tj_layer_info li;
    if (tj_model_load(c, argv[1], argv[2], &model) != TJ_OK || tj_model_find_layer(model, argv[3], &idx) != TJ_OK ||
        tj_model_layer_info(model, idx, &li) != TJ_OK || m < 1) {
        fprintf(stderr, "call_latency: %s\n", m < 1 ? "M must be >= 1" : tj_context_error(c));
        goto fail;
    }
    x = calloc((size_t)(m * li.k), sizeof *x);
    y = calloc((size_t)(m * li.n), sizeof *y);
    if (!x || !y) goto fail;
    for (int64_t i = 0; i < m * li.k; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    int64_t xs[2] = {m, li.k}, ys[2] = {m, li.n};
    DLTensor xt = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
    DLTensor yt = {y, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, ys, NULL, 0};
    for (int i = 0; i < 200; i++)
        if (tj_linear_ex(model, idx, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) != TJ_OK) {
            fprintf(stderr, "call_latency: %s\n", tj_context_error(c));
            goto fail;
        }
    /* calls per repeat: about 20 ms each */
    double t0 = now();
    int64_t calls = 0;
    while (now() - t0 < 0.02) {
        tj_linear_ex(model, idx, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL);
        calls++;
    }
    enum { REPEATS = 21 };
    double t[REPEATS];
    for (int r = 0; r < REPEATS; r++) {
        double a = now();
        for (int64_t i = 0; i < calls; i++) tj_linear_ex(model, idx, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL);
        t[r] = (now() - a) / (double)calls * 1e9;
    }
    qsort(t, REPEATS, sizeof *t, cmp);
    printf("c_call_ns median %.1f min %.1f calls %lld repeats %d\n", t[REPEATS / 2], t[0], (long long)calls, REPEATS);
    rc = 0;
fail:
    free(x);
    free(y);
    tj_model_destroy(model);
    tj_context_destroy(c);
    return rc;
}
