/* One layer through the host executor (hx_layer.h): emit, build, pack, launch as the CUDA
 * runtime does, and compare with the reference. */
#include "hx_layer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/rng.h"
#include "runtime/model.h"

static const char *const template_names[] = {"prelude.cu", "tiles_mma.cu", "hopper.cu", "tiles_wgmma.cu", "tiles_simt.cu", "fill_ew.cu",
                                                    "ew.cu"};
#define NTEMPLATES 7
static char *template_texts[NTEMPLATES];

tj_status tj_hx_layer_origins(tj_hx_exec *e, tj_error *err)
{
    for (int i = 0; i < NTEMPLATES; i++) {
        free(template_texts[i]);
        template_texts[i] = NULL;
        TJ_TRY(tj_cuda_template_text(template_names[i], &template_texts[i], err));
    }
    tj_hx_exec_set_origins(e, template_names, (const char *const *)template_texts, NTEMPLATES);
    return TJ_OK;
}

void tj_hx_layer_tolerance(const tj_cuda_config *c, double *rel, double *max)
{
    /* fp32 accumulation in another order than the reference; 16-bit outputs add one rounding
     * (2^-11 fp16, 2^-8 bf16 relative), and with ew + an activation a second one. */
    *rel = c->out == TJ_F32 ? 1e-5 : c->out == TJ_F16 ? 2e-3 : 1.5e-2;
    *max = c->out == TJ_F32 ? 1e-4 : c->out == TJ_F16 ? 4e-3 : 3e-2;
}

static void invoke_args(void (*kernel)(void), const void *params)
{
    void (*fn)(tj_cuda_args);
    memcpy(&fn, &kernel, sizeof fn);
    fn(*(const tj_cuda_args *)params);
}

/* 16-byte aligned, exactly `bytes` registered (the rest of the last 16 bytes is not). */
static void *alloc16(size_t bytes)
{
    return aligned_alloc(16, (bytes + 15) / 16 * 16 + 16);
}

static uint16_t to16(float v, tj_dtype d) { return d == TJ_BF16 ? tj_f32_to_bf16(v) : tj_f32_to_f16(v); }
static float from16(uint16_t h, tj_dtype d) { return d == TJ_BF16 ? tj_bf16_to_f32(h) : tj_f16_to_f32(h); }

tj_status tj_hx_layer_run(tj_hx_exec *e, const tj_hx_build_options *bo, const tj_layer *l, const tj_cuda_config *c,
                          const tj_hx_layer_case *k, tj_hx_layer_result *res, tj_error *err)
{
    memset(res, 0, sizeof *res);
    tj_status st = TJ_OK;
    char *src = NULL;
    tj_hx_module *mod = NULL;
    tj_cuda_host_data h;
    memset(&h, 0, sizeof h);
    uint16_t *w16 = NULL, *x = NULL;
    float *bias = NULL, *x32 = NULL, *ref = NULL, *got = NULL;
    void *y = NULL;
    int m = k->m;
    int64_t n = l->n, kk = l->k;

    double t0 = tj_now();
    if ((st = tj_cuda_emit(l, c, &src, err))) goto done;
    if ((st = tj_hx_module_build(bo, src, &mod, &res->compiled, err))) goto done;
    res->compile_s = tj_now() - t0;

    /* data, exactly representable in the input dtype */
    tj_rng rng = {k->seed};
    w16 = malloc((size_t)(n * kk) * 2);
    bias = malloc((size_t)n * 4);
    x32 = malloc((size_t)m * (size_t)kk * 4);
    int64_t ldx = c->x_fm ? ((m + k->ldx_pad + 7) / 8 * 8) : kk + k->ldx_pad;
    int64_t ldy = c->y_fm ? m + k->ldy_pad : n + k->ldy_pad;
    size_t xbytes = (size_t)(c->x_fm ? kk * ldx : (int64_t)m * ldx) * 2;
    size_t ybytes = (size_t)(c->y_fm ? n * ldy : (int64_t)m * ldy) * tj_dtype_size(c->out);
    x = alloc16(xbytes);
    y = alloc16(ybytes);
    ref = malloc((size_t)m * (size_t)n * 4);
    got = malloc((size_t)m * (size_t)n * 4);
    if (!w16 || !bias || !x32 || !x || !y || !ref || !got) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n * kk; i++) w16[i] = to16(tj_rng_uniform(&rng), c->dtype);
    for (int64_t i = 0; i < n; i++) bias[i] = tj_rng_uniform(&rng);
    /* x's padding (past M or K in each row) is NaN: a kernel that lets it into an output is wrong */
    for (size_t i = 0; i < xbytes / 2; i++) x[i] = 0x7fff;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < kk; j++) {
            uint16_t v = to16(tj_rng_uniform(&rng) * 4.0f, c->dtype);
            x[c->x_fm ? j * ldx + i : i * ldx + j] = v;
            x32[i * kk + j] = from16(v, c->dtype);
        }
    memset(y, 0xff, ybytes); /* NaN in every output dtype: unwritten elements show */
    if ((st = tj_cuda_pack(l, c, w16, c->dtype, k->bias ? bias : NULL, TJ_F32, &h, err))) goto done;

    tj_cuda_args a = {x, y, h.w, h.bias, h.cols, h.fill_rows, h.ew_ptr, h.ew_idx, h.ew_val, h.ew_rows,
                      ldx, ldy, m, (int32_t)h.n_fill, (int32_t)h.n_ew_rows, 0};
    if ((st = tj_cuda_args_check(l, c, &a, err))) goto done;
    tj_hx_buffers_clear(e);
    if ((st = tj_hx_buffer_add(e, "x", x, xbytes, 0, err)) || (st = tj_hx_buffer_add(e, "y", y, ybytes, 1, err)) ||
        (st = tj_hx_buffer_add(e, "w", h.w, (size_t)h.w_elems * 2, 0, err)) ||
        (st = tj_hx_buffer_add(e, "bias", h.bias, h.bias ? (size_t)n * 4 : 0, 0, err)) ||
        (st = tj_hx_buffer_add(e, "cols", h.cols, (size_t)h.ncols * 4, 0, err)) ||
        (st = tj_hx_buffer_add(e, "fill_rows", h.fill_rows, (size_t)h.n_fill * 4, 0, err)) ||
        (st = tj_hx_buffer_add(e, "ew_ptr", h.ew_ptr, h.ew_ptr ? (size_t)(n + 1) * 4 : 0, 0, err)) ||
        (st = tj_hx_buffer_add(e, "ew_idx", h.ew_idx, (size_t)h.ew_nnz * 4, 0, err)) ||
        (st = tj_hx_buffer_add(e, "ew_val", h.ew_val, (size_t)h.ew_nnz * 4, 0, err)) ||
        (st = tj_hx_buffer_add(e, "ew_rows", h.ew_rows, (size_t)h.n_ew_rows * 4, 0, err)))
        goto done;

    tj_cuda_launch ln[TJ_CUDA_MAX_LAUNCHES];
    int count = 0;
    if ((st = tj_cuda_geometry(l, c, m, ln, &count, err))) goto done;
    /* k->grid as TILEJIT_CUDA_GRID=N; no occupancy figure on the host: N blocks, or the full grid */
    uint32_t grid_limit = tj_cuda_tiles_grid_limit(c->tmpl, (tj_cuda_grid_mode){.full = 1, .cap = k->grid}, 0, 0);
    double t1 = tj_now();
    for (int i = 0; i < count; i++) {
        tj_hx_dim3 grid = {ln[i].grid[0], ln[i].grid[1], ln[i].grid[2]};
        if (strcmp(ln[i].kernel, "tj_tiles") == 0) grid.x = tj_cuda_tiles_grid(ln[i].grid[0], grid_limit);
        tj_hx_dim3 block = {ln[i].block[0], ln[i].block[1], ln[i].block[2]};
        tj_hx_launch_stats s;
        st = tj_hx_launch(e, mod, ln[i].kernel, grid, block, ln[i].smem, invoke_args, &a, &s, err);
        res->stats.blocks += s.blocks;
        res->stats.threads += s.threads;
        res->stats.switches += s.switches;
        res->stats.collectives += s.collectives;
        res->stats.barriers += s.barriers;
        res->stats.accesses += s.accesses;
        if (st) goto done;
    }
    res->run_s = tj_now() - t1;

    tj_layer_weights lw = {w16, c->dtype, k->bias ? bias : NULL, TJ_F32};
    tj_reference_linear(l, &lw, x32, m, ref);
    double ss = 0;
    for (int64_t i = 0; i < (int64_t)m * n; i++) ss += (double)ref[i] * ref[i];
    double rms = sqrt(ss / (double)((int64_t)m * n > 0 ? (int64_t)m * n : 1));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t yi = c->y_fm ? j * ldy + i : i * ldy + j;
            float v = c->out == TJ_F32 ? ((float *)y)[yi] : from16(((uint16_t *)y)[yi], c->out);
            got[i * n + j] = v;
            if (!isfinite(v)) {
                res->nonfinite++;
                continue;
            }
            double d = fabs((double)v - ref[i * n + j]) / (fabs(ref[i * n + j]) + rms);
            if (d > res->max_err) res->max_err = d;
        }
    /* y's padding is not the layer's: another tensor may live there (a strided view) */
    size_t es = tj_dtype_size(c->out);
    int64_t rows = c->y_fm ? n : m, used = c->y_fm ? m : n;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = used; j < ldy; j++) {
            const unsigned char *b = (const unsigned char *)y + (size_t)(r * ldy + j) * es;
            for (size_t q = 0; q < es; q++)
                if (b[q] != 0xff) {
                    res->pad_writes++;
                    break;
                }
        }
    double num = 0;
    for (int64_t i = 0; i < (int64_t)m * n; i++)
        if (isfinite(got[i])) num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
    res->rel_err = ss > 0 ? sqrt(num / ss) : sqrt(num);
done:
    if (e) tj_hx_buffers_clear(e);
    tj_cuda_host_data_free(&h);
    tj_hx_module_destroy(mod);
    free(src);
    free(w16);
    free(bias);
    free(x32);
    free(x);
    free(y);
    free(ref);
    free(got);
    return st;
}
