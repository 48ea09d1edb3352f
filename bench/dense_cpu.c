/* Dense CPU baselines (declared in tilejit/bench.h): oneDNN's C API through dlopen (the prototypes of the
 * dozen calls used are declared here, from oneDNN 3.x's dnnl.h, so no header is needed to
 * build), OpenBLAS through its CBLAS interface, and an FMA-peak loop per vector ISA. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "tilejit/bench.h"
#include "tilejit/io.h"
#include "tj_config.h"
#if TJ_HAVE_OPENBLAS
#include <cblas.h>
void openblas_set_num_threads(int);
char *openblas_get_corename(void);
char *openblas_get_config(void);
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------- oneDNN 3.x C API subset */

typedef int dnnl_status;
typedef void *dnnl_handle; /* engine, stream, memory, primitive, primitive_desc, memory_desc */
typedef int64_t dnnl_dims[12];
typedef struct dnnl_exec_arg {
    int arg;
    dnnl_handle memory;
} dnnl_exec_arg;
typedef struct dnnl_version_t {
    int major, minor, patch;
    const char *hash;
    unsigned cpu_runtime, gpu_runtime;
} dnnl_version_t;

enum {
    DNNL_CPU = 1,
    DNNL_STREAM_IN_ORDER = 1,
    DNNL_DT_BF16 = 2,
    DNNL_DT_F32 = 3,
    DNNL_TAG_ANY = 1,
    DNNL_TAG_AB = 3,
    DNNL_QUERY_IMPL_INFO_STR = 8,
    DNNL_QUERY_WEIGHTS_MD = 131,
    DNNL_ARG_SRC = 1,
    DNNL_ARG_DST = 17,
    DNNL_ARG_WEIGHTS = 33,
};
#define DNNL_MEMORY_ALLOCATE ((void *)(size_t)-1)

typedef struct dnnl_api {
    void *lib;
    void (*omp_set_num_threads)(int);
    const dnnl_version_t *(*version)(void);
    dnnl_status (*engine_create)(dnnl_handle *, int, size_t);
    dnnl_status (*engine_destroy)(dnnl_handle);
    dnnl_status (*stream_create)(dnnl_handle *, dnnl_handle, unsigned);
    dnnl_status (*stream_wait)(dnnl_handle);
    dnnl_status (*stream_destroy)(dnnl_handle);
    dnnl_status (*md_with_tag)(dnnl_handle *, int, const dnnl_dims, int, int);
    dnnl_status (*md_with_strides)(dnnl_handle *, int, const dnnl_dims, int, const dnnl_dims);
    dnnl_status (*md_destroy)(dnnl_handle);
    int (*md_equal)(dnnl_handle, dnnl_handle);
    dnnl_status (*matmul_pd_create)(dnnl_handle *, dnnl_handle, dnnl_handle, dnnl_handle, dnnl_handle, dnnl_handle,
                                    dnnl_handle);
    dnnl_status (*reorder_pd_create)(dnnl_handle *, dnnl_handle, dnnl_handle, dnnl_handle, dnnl_handle, dnnl_handle);
    dnnl_status (*pd_query)(dnnl_handle, int, int, void *);
    dnnl_handle (*pd_query_md)(dnnl_handle, int, int);
    dnnl_status (*pd_destroy)(dnnl_handle);
    dnnl_status (*prim_create)(dnnl_handle *, dnnl_handle);
    dnnl_status (*prim_execute)(dnnl_handle, dnnl_handle, int, const dnnl_exec_arg *);
    dnnl_status (*prim_destroy)(dnnl_handle);
    dnnl_status (*mem_create)(dnnl_handle *, dnnl_handle, dnnl_handle, void *);
    dnnl_status (*mem_destroy)(dnnl_handle);
} dnnl_api;

static dnnl_api dnnl;
static char dnnl_why[512];
static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;

static void dnnl_open(void)
{
    /* TILEJIT_ONEDNN: an explicit path (e.g. a PyPI wheel's lib/libdnnl.so.3) */
    const char *path = getenv("TILEJIT_ONEDNN");
    const char *name = path && *path ? path : "libdnnl.so.3";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(dnnl_why, sizeof dnnl_why, "oneDNN not found (%s); scripts/install-deps installs it", dlerror());
        return;
    }
    dnnl_api a = {.lib = h};
#define SYM(field, sym)                                                                              \
    do {                                                                                             \
        *(void **)&a.field = dlsym(h, sym);                                                          \
        if (!a.field) {                                                                              \
            snprintf(dnnl_why, sizeof dnnl_why, "%s has no symbol %s (not oneDNN 3.x?)", name, sym); \
            dlclose(h);                                                                              \
            return;                                                                                  \
        }                                                                                            \
    } while (0)
    SYM(version, "dnnl_version");
    SYM(engine_create, "dnnl_engine_create");
    SYM(engine_destroy, "dnnl_engine_destroy");
    SYM(stream_create, "dnnl_stream_create");
    SYM(stream_wait, "dnnl_stream_wait");
    SYM(stream_destroy, "dnnl_stream_destroy");
    SYM(md_with_tag, "dnnl_memory_desc_create_with_tag");
    SYM(md_with_strides, "dnnl_memory_desc_create_with_strides");
    SYM(md_destroy, "dnnl_memory_desc_destroy");
    SYM(md_equal, "dnnl_memory_desc_equal");
    SYM(matmul_pd_create, "dnnl_matmul_primitive_desc_create");
    SYM(reorder_pd_create, "dnnl_reorder_primitive_desc_create");
    SYM(pd_query, "dnnl_primitive_desc_query");
    SYM(pd_query_md, "dnnl_primitive_desc_query_md");
    SYM(pd_destroy, "dnnl_primitive_desc_destroy");
    SYM(prim_create, "dnnl_primitive_create");
    SYM(prim_execute, "dnnl_primitive_execute");
    SYM(prim_destroy, "dnnl_primitive_destroy");
    SYM(mem_create, "dnnl_memory_create");
    SYM(mem_destroy, "dnnl_memory_destroy");
#undef SYM
    if (a.version()->major != 3) {
        snprintf(dnnl_why, sizeof dnnl_why, "%s is oneDNN %d.%d; the baseline needs 3.x", name, a.version()->major,
                 a.version()->minor);
        dlclose(h);
        return;
    }
    /* the OpenMP runtime oneDNN was built with (GOMP in the PyPI cpu-gomp build), if any */
    *(void **)&a.omp_set_num_threads = dlsym(h, "omp_set_num_threads");
    dnnl = a;
}

/* ---------------------------------------------------------------- problems */

struct tj_dense {
    tj_dense_kind kind;
    const float *x, *w;
    float *y;
    int64_t m, n, k;
    int threads;
    char name[200];
    /* oneDNN */
    dnnl_handle eng, strm, pd, prim, mx, mw, my;
    void *xb, *wb; /* bf16 copies of x and w */
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

#define DNNL_TRY(call, what)                                                                              \
    do {                                                                                                  \
        dnnl_status st_ = (call);                                                                         \
        if (st_ != 0) {                                                                                   \
            s = tj_fail(err, TJ_ERR_UNSUPPORTED, "oneDNN: %s failed (status %d)", what, st_);              \
            goto fail;                                                                                    \
        }                                                                                                 \
    } while (0)

static tj_status onednn_create(tj_dense *d, tj_error *err)
{
    pthread_once(&dnnl_once, dnnl_open);
    if (!dnnl.lib) return tj_fail(err, TJ_ERR_UNSUPPORTED, "%s", dnnl_why);
    tj_status s = TJ_OK;
    int bf = d->kind == TJ_DENSE_ONEDNN_BF16, dt = bf ? DNNL_DT_BF16 : DNNL_DT_F32;
    dnnl_handle md_x = NULL, md_w = NULL, md_wany = NULL, md_y = NULL, rpd = NULL, rprim = NULL, mwplain = NULL;
    if (dnnl.omp_set_num_threads) dnnl.omp_set_num_threads(d->threads);
    if (bf) {
        d->xb = bf16_copy(d->x, d->m * d->k);
        d->wb = bf16_copy(d->w, d->n * d->k);
        if (!d->xb || !d->wb) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory for bf16 copies");
    }
    DNNL_TRY(dnnl.engine_create(&d->eng, DNNL_CPU, 0), "engine_create");
    DNNL_TRY(dnnl.stream_create(&d->strm, d->eng, DNNL_STREAM_IN_ORDER), "stream_create");
    dnnl_dims xd = {d->m, d->k}, wd = {d->k, d->n}, yd = {d->m, d->n}, ws = {1, d->k};
    DNNL_TRY(dnnl.md_with_tag(&md_x, 2, xd, dt, DNNL_TAG_AB), "memory_desc(src)");
    DNNL_TRY(dnnl.md_with_strides(&md_w, 2, wd, dt, ws), "memory_desc(weights)"); /* Wᵀ of [n × k] */
    DNNL_TRY(dnnl.md_with_tag(&md_wany, 2, wd, dt, DNNL_TAG_ANY), "memory_desc(weights any)");
    DNNL_TRY(dnnl.md_with_tag(&md_y, 2, yd, DNNL_DT_F32, DNNL_TAG_AB), "memory_desc(dst)");
    /* weights in the layout the implementation prefers, reordered once outside the timing, as
     * an inference engine does with constant weights */
    dnnl_status st = dnnl.matmul_pd_create(&d->pd, d->eng, md_x, md_wany, NULL, md_y, NULL);
    if (st == 3) { /* dnnl_unimplemented */
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "oneDNN has no %s matmul for this CPU%s", bf ? "bf16" : "fp32",
                    bf ? " (no avx512_bf16, AMX or AVX2-VNNI-2 instructions)" : "");
        goto fail;
    }
    DNNL_TRY(st, "matmul primitive_desc");
    const char *impl = "?";
    dnnl.pd_query(d->pd, DNNL_QUERY_IMPL_INFO_STR, 0, &impl);
    if (strstr(impl, "ref")) {
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "oneDNN has only its reference %s matmul on this CPU (%s)",
                    bf ? "bf16" : "fp32", impl);
        goto fail;
    }
    const dnnl_version_t *v = dnnl.version();
    snprintf(d->name, sizeof d->name, "oneDNN %d.%d.%d %s matmul (%s)", v->major, v->minor, v->patch,
             bf ? "bf16" : "fp32", impl);
    dnnl_handle md_wbest = dnnl.pd_query_md(d->pd, DNNL_QUERY_WEIGHTS_MD, 0);
    void *xh = bf ? d->xb : (void *)d->x, *wh = bf ? d->wb : (void *)d->w;
    DNNL_TRY(dnnl.mem_create(&d->mx, md_x, d->eng, xh), "memory(src)");
    DNNL_TRY(dnnl.mem_create(&d->my, md_y, d->eng, d->y), "memory(dst)");
    if (dnnl.md_equal(md_wbest, md_w)) {
        DNNL_TRY(dnnl.mem_create(&d->mw, md_w, d->eng, wh), "memory(weights)");
    } else {
        DNNL_TRY(dnnl.mem_create(&mwplain, md_w, d->eng, wh), "memory(weights)");
        DNNL_TRY(dnnl.mem_create(&d->mw, md_wbest, d->eng, DNNL_MEMORY_ALLOCATE), "memory(packed weights)");
        DNNL_TRY(dnnl.reorder_pd_create(&rpd, md_w, d->eng, md_wbest, d->eng, NULL), "reorder primitive_desc");
        DNNL_TRY(dnnl.prim_create(&rprim, rpd), "reorder primitive");
        dnnl_exec_arg ra[2] = {{DNNL_ARG_SRC, mwplain}, {DNNL_ARG_DST, d->mw}};
        DNNL_TRY(dnnl.prim_execute(rprim, d->strm, 2, ra), "reorder");
        DNNL_TRY(dnnl.stream_wait(d->strm), "stream_wait");
    }
    DNNL_TRY(dnnl.prim_create(&d->prim, d->pd), "matmul primitive");
fail:
    if (rprim) dnnl.prim_destroy(rprim);
    if (rpd) dnnl.pd_destroy(rpd);
    if (mwplain) dnnl.mem_destroy(mwplain);
    if (md_x) dnnl.md_destroy(md_x);
    if (md_w) dnnl.md_destroy(md_w);
    if (md_wany) dnnl.md_destroy(md_wany);
    if (md_y) dnnl.md_destroy(md_y);
    return s;
}

tj_status tj_dense_create(tj_dense_kind kind, const float *x, const float *w, float *y, int64_t m, int64_t n,
                          int64_t k, int threads, tj_dense **out, tj_error *err)
{
    *out = NULL;
    tj_dense *d = calloc(1, sizeof *d);
    if (!d) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    d->kind = kind;
    d->x = x;
    d->w = w;
    d->y = y;
    d->m = m;
    d->n = n;
    d->k = k;
    d->threads = threads > 0 ? threads : 1;
    tj_status s = TJ_OK;
    switch (kind) {
    case TJ_DENSE_ONEDNN_F32:
    case TJ_DENSE_ONEDNN_BF16: s = onednn_create(d, err); break;
    case TJ_DENSE_OPENBLAS:
#if TJ_HAVE_OPENBLAS
        openblas_set_num_threads(d->threads);
        {
            /* openblas_get_config: "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64" */
            char ver[32] = "";
            const char *cfg = openblas_get_config();
            if (cfg && strncmp(cfg, "OpenBLAS ", 9) == 0) sscanf(cfg + 9, "%31s", ver);
            snprintf(d->name, sizeof d->name, "OpenBLAS %s %s (core %s)", ver, m == 1 ? "sgemv" : "sgemm",
                     openblas_get_corename());
        }
#else
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "this tilejit was built without OpenBLAS (Debian libopenblas-dev)");
#endif
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
#if TJ_HAVE_OPENBLAS
        if (d->m == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)d->n, (blasint)d->k, 1.0f, d->w, (blasint)d->k, d->x, 1,
                        0.0f, d->y, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)d->m, (blasint)d->n, (blasint)d->k, 1.0f,
                        d->x, (blasint)d->k, d->w, (blasint)d->k, 0.0f, d->y, (blasint)d->n);
        return 0;
#else
        return -1;
#endif
    }
    dnnl_exec_arg a[3] = {{DNNL_ARG_SRC, d->mx}, {DNNL_ARG_WEIGHTS, d->mw}, {DNNL_ARG_DST, d->my}};
    if (dnnl.prim_execute(d->prim, d->strm, 3, a) != 0) return -1;
    return dnnl.stream_wait(d->strm) != 0 ? -1 : 0;
}

const char *tj_dense_name(const tj_dense *d) { return d->name; }

void tj_dense_destroy(tj_dense *d)
{
    if (!d) return;
    if (dnnl.lib) {
        if (d->prim) dnnl.prim_destroy(d->prim);
        if (d->pd) dnnl.pd_destroy(d->pd);
        if (d->mx) dnnl.mem_destroy(d->mx);
        if (d->mw) dnnl.mem_destroy(d->mw);
        if (d->my) dnnl.mem_destroy(d->my);
        if (d->strm) dnnl.stream_destroy(d->strm);
        if (d->eng) dnnl.engine_destroy(d->eng);
    }
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

