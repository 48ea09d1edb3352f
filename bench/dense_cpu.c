/* Dense CPU baselines (declared in tilejit/bench.h): oneDNN's matmul and OpenBLAS's sgemm through
 * base/dense.c (the one place that opens and calls them; the runtime's dense path uses it too),
 * and an FMA-peak loop per vector ISA. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dense.h"
#include "base/error.h"
#include "tilejit/bench.h"
#include "tilejit/io.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------- problems */

struct tj_dense {
    tj_dense_kind kind;
    const float *x, *w, *bias;
    tj_dense_act act;
    float *y;
    int64_t m, n, k;
    int threads;
    char name[200];
    tj_onednn_matmul *mm; /* oneDNN, x and y bound once */
    void *xb, *wb;        /* bf16 copies of x and w */
};

const char *tj_dense_kind_word(tj_dense_kind kind)
{
    static const char *w[] = {"onednn_f32", "onednn_bf16", "openblas"};
    return kind >= 0 && kind < TJ_DENSE_NKINDS ? w[kind] : "?";
}

static uint16_t *bf16_copy(const float *src, int64_t n)
{
    uint16_t *d = aligned_alloc(64, ((size_t)n * 2 + 63) / 64 * 64);
    if (d) tj_convert_from_f32(src, n, TJ_BF16, d);
    return d;
}

tj_status tj_dense_create(tj_dense_kind kind, const float *x, const float *w, float *y, int64_t m, int64_t n,
                          int64_t k, int threads, tj_dense **out, tj_error *err)
{
    return tj_dense_create_layer(kind, x, w, NULL, TJ_ACT_NONE, y, m, n, k, threads, out, err);
}

tj_status tj_dense_create_layer(tj_dense_kind kind, const float *x, const float *w, const float *bias, tj_activation act,
                                float *y, int64_t m, int64_t n, int64_t k, int threads, tj_dense **out, tj_error *err)
{
    *out = NULL;
    tj_dense *d = calloc(1, sizeof *d);
    if (!d) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    d->kind = kind;
    d->x = x;
    d->w = w;
    d->bias = bias;
    d->act = act == TJ_ACT_RELU ? TJ_DENSE_ACT_RELU : act == TJ_ACT_GELU ? TJ_DENSE_ACT_GELU : TJ_DENSE_ACT_NONE;
    d->y = y;
    d->m = m;
    d->n = n;
    d->k = k;
    d->threads = threads > 0 ? threads : 1;
    tj_status s = TJ_OK;
    switch (kind) {
    case TJ_DENSE_ONEDNN_F32:
    case TJ_DENSE_ONEDNN_BF16: {
        /* weights reordered once outside the timing, as an inference engine does with constant
         * weights; x and y bound once, so a timed call allocates nothing */
        int bf = kind == TJ_DENSE_ONEDNN_BF16;
        if ((s = tj_onednn_open(err)) != TJ_OK) break;
        if (bf && (!(d->xb = bf16_copy(x, m * k)) || !(d->wb = bf16_copy(w, n * k)))) {
            s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory for bf16 copies");
            break;
        }
        tj_onednn_matmul_desc md = {.m = m, .n = n, .k = k, .bf16 = bf, .bias = bias != NULL, .act = d->act,
                                    .threads = d->threads};
        s = tj_onednn_matmul_create(&md, bf ? d->wb : (const void *)w, bias, &d->mm, err);
        if (s == TJ_OK) s = tj_onednn_matmul_bind(d->mm, bf ? d->xb : (const void *)x, y, err);
        if (s == TJ_OK) snprintf(d->name, sizeof d->name, "%s", tj_onednn_matmul_name(d->mm));
        break;
    }
    case TJ_DENSE_OPENBLAS:
        if (!tj_openblas_built()) s = tj_fail(err, TJ_ERR_UNSUPPORTED, "%s", tj_openblas_name(m));
        else snprintf(d->name, sizeof d->name, "%s", tj_openblas_name(m));
        break;
    default: s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "unknown dense baseline %d", (int)kind);
    }
    if (s != TJ_OK) {
        tj_dense_destroy(d);
        return s;
    }
    *out = d;
    return TJ_OK;
}

int tj_dense_run(tj_dense *d)
{
    if (d->kind == TJ_DENSE_OPENBLAS) {
        tj_error err;
        return tj_openblas_gemm(d->x, d->w, d->bias, d->act, d->y, d->m, d->n, d->k, d->threads, &err) == TJ_OK ? 0 : -1;
    }
    return tj_onednn_matmul_run_bound(d->mm);
}

const char *tj_dense_name(const tj_dense *d) { return d->name; }

void tj_dense_destroy(tj_dense *d)
{
    if (!d) return;
    if (d->kind == TJ_DENSE_OPENBLAS) tj_openblas_quiesce(); /* its spinning workers would slow what runs next */
    tj_onednn_matmul_destroy(d->mm);
    free(d->xb);
    free(d->wb);
    free(d);
}

/* ---------------------------------------------------------------- FMA peak */

static volatile float peak_sink; /* keeps the FMA chains' results alive */

#if defined(__x86_64__)
/* 12 (AVX2) or 24 (AVX-512) independent chains: 2 FMA pipes × 4-5 cycles latency need ≥ 10 */
__attribute__((target("avx2,fma"))) static double peak_avx2(int64_t iters)
{
    __m256 a[12], b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    peak_sink = out[0];
    return (double)iters * 12 * 8 * 2;
}

__attribute__((target("avx512f"))) static double peak_avx512(int64_t iters)
{
    __m512 a[24], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 24; i++) a[i] = _mm512_set1_ps((float)i);
    for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    __m512 s = a[0];
    for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, a[i]);
    peak_sink = _mm512_reduce_add_ps(s);
    return (double)iters * 24 * 16 * 2;
}
#endif

static double peak_once(int64_t iters)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) return peak_avx512(iters);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return peak_avx2(iters);
#endif
    (void)iters;
    return 0;
}

typedef struct peak_arg {
    int64_t iters;
    double flops;
} peak_arg;

static void *peak_thread(void *vp)
{
    peak_arg *a = vp;
    a->flops = peak_once(a->iters);
    return NULL;
}

double tj_dense_fma_peak(int threads, double seconds)
{
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    if (peak_once(1) <= 0) return 0;
    /* size the loop on one thread: about seconds / 5 per run, best of 5 runs */
    int64_t iters = 1 << 12;
    double t0, dt;
    for (;;) {
        t0 = tj_now();
        peak_once(iters);
        dt = tj_now() - t0;
        if (dt >= 0.01 || iters >= (int64_t)1 << 40) break;
        iters *= 4;
    }
    iters = (int64_t)((double)iters * (seconds / 5) / dt) + 1;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        pthread_t tid[256];
        peak_arg pa[256];
        int started = 0;
        t0 = tj_now();
        for (int i = 1; i < threads; i++) {
            pa[i].iters = iters;
            if (pthread_create(&tid[i], NULL, peak_thread, &pa[i]) != 0) break;
            started = i;
        }
        pa[0].iters = iters;
        peak_thread(&pa[0]);
        double flops = pa[0].flops;
        for (int i = 1; i <= started; i++) {
            pthread_join(tid[i], NULL);
            flops += pa[i].flops;
        }
        dt = tj_now() - t0;
        if (dt > 0 && flops / dt > best) best = flops / dt;
    }
    return best * 1e-9;
}

/* ---------------------------------------------------------------- read bandwidth */

/* Sums a buffer with the widest vector loads (four independent sums), so the loop is bound by
 * the loads, not by the adds: STREAM's read kernel without the writes. */
static volatile float read_sink;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void read_avx512(const float *p, int64_t n, int64_t reps)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t r = 0; r < reps; r++)
        for (int64_t i = 0; i + 64 <= n; i += 64) {
            s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
            s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
            s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
            s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
        }
    read_sink = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

__attribute__((target("avx2"))) static void read_avx2(const float *p, int64_t n, int64_t reps)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t r = 0; r < reps; r++)
        for (int64_t i = 0; i + 32 <= n; i += 32) {
            s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
            s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
            s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
            s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
        }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    read_sink = out[0];
}
#endif

static void read_once(const float *p, int64_t n, int64_t reps)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) { read_avx512(p, n, reps); return; }
    if (__builtin_cpu_supports("avx2")) { read_avx2(p, n, reps); return; }
#endif
    float s = 0;
    for (int64_t r = 0; r < reps; r++)
        for (int64_t i = 0; i < n; i++) s += p[i];
    read_sink = s;
}

typedef struct read_arg {
    const float *p;
    int64_t n, reps;
} read_arg;

static void *read_thread(void *vp)
{
    read_arg *a = vp;
    read_once(a->p, a->n, a->reps);
    return NULL;
}

double tj_dense_read_bandwidth(int threads, double bytes, double seconds)
{
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    /* each thread its own 64-byte aligned part, a whole number of 256-byte steps */
    int64_t per = (int64_t)(bytes / threads / 256.0) * 64;
    if (per < 64) per = 64;
    float *buf = aligned_alloc(64, (size_t)per * (size_t)threads * sizeof(float));
    if (!buf) return 0;
    for (int64_t i = 0; i < per * threads; i++) buf[i] = 1.0f;
    double total = (double)per * threads * sizeof(float);
    /* repeats so one run takes about seconds / 5 (at an assumed 100 GB/s first, then measured) */
    int64_t reps = (int64_t)(1e11 * seconds / 5 / total) + 1;
    double best = 0;
    for (int r = 0; r < 6; r++) {
        pthread_t tid[256];
        read_arg ra[256];
        int started = 0;
        double t0 = tj_now();
        for (int i = 1; i < threads; i++) {
            ra[i] = (read_arg){buf + (size_t)i * (size_t)per, per, reps};
            if (pthread_create(&tid[i], NULL, read_thread, &ra[i]) != 0) break;
            started = i;
        }
        ra[0] = (read_arg){buf, per, reps};
        read_thread(&ra[0]);
        for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
        double dt = tj_now() - t0;
        double bw = dt > 0 ? total * (double)reps * (double)(started + 1) / threads / dt : 0;
        if (r > 0 && bw > best) best = bw; /* the first run warms the caches and sizes reps */
        if (r == 0 && dt > 0) reps = (int64_t)((double)reps * (seconds / 5) / dt) + 1;
    }
    free(buf);
    return best * 1e-9;
}

