/* libFuzzer target: a whole model load on the reference backend (pattern + safetensors + binding
 * each layer's tensors, runtime/model.c) followed by one tj_linear per layer. Input layout: a
 * 4-byte little-endian length L, L bytes of pattern JSON, then the safetensors file. Hostile
 * weights (odd offsets, wrong shapes or dtypes) must fail cleanly or compute without touching
 * memory outside the tensors. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "runtime/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tj_context *ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx) {
        tj_options opt = tj_options_default();
        opt.backend = TJ_BACKEND_REFERENCE;
        if (tj_context_create(&opt, &ctx) != TJ_OK) __builtin_trap();
    }
    if (size < 4) return 0;
    uint32_t plen = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    if (plen > size - 4) return 0;
    char ppath[64], wpath[64];
    int pfd = fuzz_memfile(data + 4, plen, ppath, sizeof ppath);
    int wfd = fuzz_memfile(data + 4 + plen, size - 4 - plen, wpath, sizeof wpath);
    tj_model *m = NULL;
    if (pfd >= 0 && wfd >= 0 && tj_model_load(ctx, ppath, wpath, &m) == TJ_OK) {
        for (int64_t i = 0; i < tj_model_layer_count(m); i++) {
            tj_layer_info info;
            FUZZ_ASSERT(tj_model_layer_info(m, i, &info) == TJ_OK);
            if (info.n * info.k > (1 << 20)) continue; /* keep each run fast */
            int64_t M = 2, xs[2] = {M, info.k}, ys[2] = {M, info.n};
            float *x = malloc((size_t)(M * info.k) * sizeof *x), *y = malloc((size_t)(M * info.n) * sizeof *y);
            FUZZ_ASSERT(x && y);
            for (int64_t j = 0; j < M * info.k; j++) x[j] = (float)(j % 7) - 3.0f;
            DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
            DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
            FUZZ_ASSERT(tj_linear_ex(m, i, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) == TJ_OK);
            free(x);
            free(y);
        }
        tj_model_destroy(m);
    } else if (pfd >= 0 && wfd >= 0) {
        FUZZ_ASSERT(tj_context_error(ctx)[0] != '\0');
    }
    if (pfd >= 0) close(pfd);
    if (wfd >= 0) close(wfd);
    return 0;
}
