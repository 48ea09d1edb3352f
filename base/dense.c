/* The dense GEMM libraries (base/dense.h): oneDNN 3.x through dlopen (the prototypes of the calls
 * used are declared below, from oneDNN 3.x's dnnl.h and dnnl_types.h, whose C ABI is stable
 * within the major version) and OpenBLAS through its CBLAS interface. */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dense.h"
#include "tj_config.h"
#if TJ_HAVE_OPENBLAS
#include <cblas.h>
void openblas_set_num_threads(int);
int openblas_get_num_threads(void);
char *openblas_get_corename(void);
char *openblas_get_config(void);
#endif

/* ---------------------------------------------------------------- oneDNN 3.x C API subset */

typedef int dnnl_status;
typedef void *dnnl_handle; /* engine, stream, memory, primitive, primitive_desc, memory_desc, attr, post_ops */
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
    DNNL_SUCCESS = 0,
    DNNL_UNIMPLEMENTED = 3,
    DNNL_CPU = 1,
    DNNL_STREAM_IN_ORDER = 1,
    DNNL_DT_BF16 = 2,
    DNNL_DT_F32 = 3,
    DNNL_DT_U8 = 6,
    DNNL_SCRATCHPAD_USER = 1,
    DNNL_TAG_ANY = 1,
    DNNL_TAG_A = 2,
    DNNL_TAG_AB = 3,
    DNNL_QUERY_IMPL_INFO_STR = 8,
    DNNL_QUERY_WEIGHTS_MD = 131,
    DNNL_QUERY_SCRATCHPAD_MD = 136,
    DNNL_ARG_SRC = 1,
    DNNL_ARG_DST = 17,
    DNNL_ARG_WEIGHTS = 33,
    DNNL_ARG_BIAS = 41,
    DNNL_ARG_SCRATCHPAD = 80,
    DNNL_ELTWISE_RELU = 0x20,
    DNNL_ELTWISE_GELU_ERF = 0x31,
};
#define DNNL_MEMORY_ALLOCATE ((void *)(size_t)-1)
#define DNNL_RUNTIME_DIM_VAL INT64_MIN

typedef struct dnnl_api {
    void *lib;
    void (*omp_set_num_threads)(int);
    int (*omp_get_max_threads)(void);
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
    size_t (*md_get_size)(dnnl_handle);
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
    dnnl_status (*mem_set_data)(dnnl_handle, void *);
    dnnl_status (*md_clone)(dnnl_handle *, dnnl_handle);
    dnnl_status (*attr_create)(dnnl_handle *);
    dnnl_status (*attr_destroy)(dnnl_handle);
    dnnl_status (*attr_set_post_ops)(dnnl_handle, dnnl_handle);
    dnnl_status (*attr_set_scratchpad_mode)(dnnl_handle, int);
    dnnl_status (*post_ops_create)(dnnl_handle *);
    dnnl_status (*post_ops_destroy)(dnnl_handle);
    dnnl_status (*post_ops_append_eltwise)(dnnl_handle, int, float, float);
} dnnl_api;

static dnnl_api dnnl;
static char dnnl_why[512];
static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;
/* One CPU engine for the process, made with the library and never destroyed: the per-thread
 * streams and memory objects below outlive every matmul, so they must not hang on one's engine. */
static dnnl_handle engine;

static void dnnl_load(void)
{
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
    SYM(md_get_size, "dnnl_memory_desc_get_size");
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
    SYM(mem_set_data, "dnnl_memory_set_data_handle");
    SYM(md_clone, "dnnl_memory_desc_clone");
    SYM(attr_create, "dnnl_primitive_attr_create");
    SYM(attr_destroy, "dnnl_primitive_attr_destroy");
    SYM(attr_set_post_ops, "dnnl_primitive_attr_set_post_ops");
    SYM(attr_set_scratchpad_mode, "dnnl_primitive_attr_set_scratchpad_mode");
    SYM(post_ops_create, "dnnl_post_ops_create");
    SYM(post_ops_destroy, "dnnl_post_ops_destroy");
    SYM(post_ops_append_eltwise, "dnnl_post_ops_append_eltwise");
#undef SYM
    if (a.version()->major != 3) {
        snprintf(dnnl_why, sizeof dnnl_why, "%s is oneDNN %d.%d; tilejit needs 3.x", name, a.version()->major,
                 a.version()->minor);
        dlclose(h);
        return;
    }
    /* the OpenMP runtime oneDNN was built with (GOMP in the PyPI cpu-gomp build), if any */
    *(void **)&a.omp_set_num_threads = dlsym(h, "omp_set_num_threads");
    *(void **)&a.omp_get_max_threads = dlsym(h, "omp_get_max_threads");
    if (!a.omp_get_max_threads) a.omp_set_num_threads = NULL; /* never set what cannot be restored */
    dnnl_status st = a.engine_create(&engine, DNNL_CPU, 0);
    if (st != DNNL_SUCCESS) {
        snprintf(dnnl_why, sizeof dnnl_why, "oneDNN: engine_create failed (status %d)", st);
        dlclose(h);
        return;
    }
    dnnl = a;
}

tj_status tj_onednn_open(tj_error *err)
{
    pthread_once(&dnnl_once, dnnl_load);
    return dnnl.lib ? TJ_OK : tj_fail(err, TJ_ERR_UNSUPPORTED, "%s", dnnl_why);
}

/* A primitive for one M, shared by the calls at that M (refs: the table's own reference while it
 * is in the table, plus one per call running it). */
typedef struct prim_entry {
    int64_t m;
    dnnl_handle pd, prim;
    int64_t scratch;           /* bytes of scratchpad a call needs (the caller's: user mode) */
    atomic_int refs;
    uint64_t used;             /* the table's clock at its last lookup (eviction: least recent) */
} prim_entry;

/* Distinct M a matmul keeps a primitive for; beyond, the least recently used is replaced. */
#define PRIMS_MAX 32

struct tj_onednn_matmul {
    tj_onednn_matmul_desc d;
    dnnl_handle eng;
    dnnl_handle md_w;           /* the packed weights' layout (the implementation's choice) */
    dnnl_handle md_b;           /* bias [1 × n] or NULL */
    dnnl_handle attr;           /* user-mode scratchpad, post-ops */
    dnnl_handle mw, mb;         /* packed weights, bias (owned copies) */
    void *bias_copy;
    int64_t bytes;
    char name[200];
    pthread_mutex_t lock;       /* guards prims, nprims, clock */
    prim_entry *prims[PRIMS_MAX];
    int nprims;
    uint64_t clock;
    /* tj_onednn_matmul_bind (fixed M) */
    dnnl_handle strm, mx, my, ms;
    void *scratch;
    prim_entry *bound;
};

#define DNNL_TRY(call, what)                                                                 \
    do {                                                                                     \
        dnnl_status st_ = (call);                                                            \
        if (st_ != DNNL_SUCCESS) {                                                           \
            s = st_ == 1 /* dnnl_out_of_memory */                                            \
                    ? tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "oneDNN: %s: out of memory", what)   \
                    : tj_fail(err, TJ_ERR_UNSUPPORTED, "oneDNN: %s failed (status %d)", what, st_); \
            goto fail;                                                                       \
        }                                                                                    \
    } while (0)

/* Runs the calling thread's next parallel regions on `threads` OpenMP threads; returns what to
 * restore (0: nothing was changed). */
static int omp_enter(int threads)
{
    if (!dnnl.omp_set_num_threads || threads < 1) return 0;
    int prev = dnnl.omp_get_max_threads();
    if (prev == threads) return 0;
    dnnl.omp_set_num_threads(threads);
    return prev;
}

static void omp_leave(int prev)
{
    if (prev > 0) dnnl.omp_set_num_threads(prev);
}

static void entry_release(prim_entry *e)
{
    if (!e || atomic_fetch_sub(&e->refs, 1) != 1) return;
    if (e->prim) dnnl.prim_destroy(e->prim);
    if (e->pd) dnnl.pd_destroy(e->pd);
    free(e);
}

/* The matmul's primitive descriptor at M rows; weights `md_w` (NULL: the implementation's
 * choice). Refuses oneDNN's reference implementation. */
static tj_status make_pd(tj_onednn_matmul *mm, int64_t m, dnnl_handle md_w, dnnl_handle *pd, tj_error *err)
{
    tj_status s = TJ_OK;
    const tj_onednn_matmul_desc *d = &mm->d;
    dnnl_handle md_x = NULL, md_y = NULL, md_wany = NULL;
    dnnl_dims xd = {m, d->k}, wd = {d->k, d->n}, yd = {m, d->n};
    *pd = NULL;
    DNNL_TRY(dnnl.md_with_tag(&md_x, 2, xd, d->bf16 ? DNNL_DT_BF16 : DNNL_DT_F32, DNNL_TAG_AB), "memory_desc(src)");
    DNNL_TRY(dnnl.md_with_tag(&md_y, 2, yd, DNNL_DT_F32, DNNL_TAG_AB), "memory_desc(dst)");
    if (!md_w) DNNL_TRY(dnnl.md_with_tag(&md_wany, 2, wd, d->bf16 ? DNNL_DT_BF16 : DNNL_DT_F32, DNNL_TAG_ANY),
                        "memory_desc(weights any)");
    dnnl_status st = dnnl.matmul_pd_create(pd, mm->eng, md_x, md_w ? md_w : md_wany, mm->md_b, md_y, mm->attr);
    if (st == DNNL_UNIMPLEMENTED) {
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "oneDNN has no %s matmul for this CPU at M = %lld%s", d->bf16 ? "bf16" : "fp32",
                    (long long)m, d->bf16 ? " (no avx512_bf16, AMX or AVX2-VNNI-2 instructions?)" : "");
        goto fail;
    }
    DNNL_TRY(st, "matmul primitive_desc");
    const char *impl = "?";
    dnnl.pd_query(*pd, DNNL_QUERY_IMPL_INFO_STR, 0, &impl);
    if (strstr(impl, "ref")) {
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "oneDNN has only its reference %s matmul on this CPU (%s)",
                    d->bf16 ? "bf16" : "fp32", impl);
        goto fail;
    }
    if (!mm->name[0]) {
        const dnnl_version_t *v = dnnl.version();
        snprintf(mm->name, sizeof mm->name, "oneDNN %d.%d.%d %s matmul (%s)", v->major, v->minor, v->patch,
                 d->bf16 ? "bf16" : "fp32", impl);
    }
fail:
    if (s != TJ_OK && *pd) {
        dnnl.pd_destroy(*pd);
        *pd = NULL;
    }
    if (md_x) dnnl.md_destroy(md_x);
    if (md_y) dnnl.md_destroy(md_y);
    if (md_wany) dnnl.md_destroy(md_wany);
    return s;
}

/* A new entry for M whose primitive reads the packed weights as they are. */
static tj_status make_entry(tj_onednn_matmul *mm, int64_t m, prim_entry **out, tj_error *err)
{
    tj_status s = TJ_OK;
    prim_entry *e = calloc(1, sizeof *e);
    if (!e) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    e->m = m;
    atomic_init(&e->refs, 1);
    int omp = omp_enter(mm->d.threads);
    if ((s = make_pd(mm, m, mm->md_w, &e->pd, err)) != TJ_OK) goto fail;
    dnnl_handle smd = dnnl.pd_query_md(e->pd, DNNL_QUERY_SCRATCHPAD_MD, 0);
    e->scratch = smd ? (int64_t)dnnl.md_get_size(smd) : 0;
    DNNL_TRY(dnnl.prim_create(&e->prim, e->pd), "matmul primitive");
fail:
    omp_leave(omp);
    if (s != TJ_OK) {
        entry_release(e);
        return s;
    }
    *out = e;
    return TJ_OK;
}

/* The entry for M with a reference for the caller (entry_release after the call). */
static tj_status get_entry(tj_onednn_matmul *mm, int64_t m, prim_entry **out, tj_error *err)
{
    tj_status s = TJ_OK;
    pthread_mutex_lock(&mm->lock);
    prim_entry *e = NULL;
    for (int i = 0; i < mm->nprims && !e; i++)
        if (mm->prims[i]->m == m) e = mm->prims[i];
    if (!e) {
        s = make_entry(mm, m, &e, err);
        if (s == TJ_OK) {
            int slot = mm->nprims;
            if (slot == PRIMS_MAX) { /* replace the least recently used; calls running it keep it alive */
                slot = 0;
                for (int i = 1; i < PRIMS_MAX; i++)
                    if (mm->prims[i]->used < mm->prims[slot]->used) slot = i;
                entry_release(mm->prims[slot]);
            } else {
                mm->nprims++;
            }
            mm->prims[slot] = e;
        }
    }
    if (e) {
        e->used = ++mm->clock;
        atomic_fetch_add(&e->refs, 1);
    }
    pthread_mutex_unlock(&mm->lock);
    *out = e;
    return s;
}

tj_status tj_onednn_matmul_create(const tj_onednn_matmul_desc *d, const void *w, const float *bias,
                                  tj_onednn_matmul **out, tj_error *err)
{
    *out = NULL;
    TJ_TRY(tj_onednn_open(err));
    if (d->m < 0 || d->n < 1 || d->k < 1 || d->threads < 0)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "oneDNN matmul: bad shape m %lld n %lld k %lld or threads %d",
                       (long long)d->m, (long long)d->n, (long long)d->k, d->threads);
    tj_onednn_matmul *mm = calloc(1, sizeof *mm);
    if (!mm) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    mm->d = *d;
    pthread_mutex_init(&mm->lock, NULL);
    tj_status s = TJ_OK;
    int dt = d->bf16 ? DNNL_DT_BF16 : DNNL_DT_F32;
    dnnl_handle md_w = NULL, po = NULL, rpd = NULL, rprim = NULL, mwplain = NULL, strm = NULL, pd = NULL;
    prim_entry *first = NULL;
    int omp = omp_enter(d->threads);
    mm->eng = engine;
    dnnl_dims wd = {d->k, d->n}, ws = {1, d->k}, bd = {1, d->n};
    DNNL_TRY(dnnl.md_with_strides(&md_w, 2, wd, dt, ws), "memory_desc(weights)"); /* Wᵀ of [n × k] */
    if (d->bias) DNNL_TRY(dnnl.md_with_tag(&mm->md_b, 2, bd, DNNL_DT_F32, DNNL_TAG_AB), "memory_desc(bias)");
    /* the scratchpad is the caller's (user mode): one primitive runs on many threads at once, and
     * a library-owned scratchpad is not made for that */
    DNNL_TRY(dnnl.attr_create(&mm->attr), "primitive_attr");
    DNNL_TRY(dnnl.attr_set_scratchpad_mode(mm->attr, DNNL_SCRATCHPAD_USER), "scratchpad mode");
    if (d->act != TJ_DENSE_ACT_NONE) {
        DNNL_TRY(dnnl.post_ops_create(&po), "post_ops");
        DNNL_TRY(dnnl.post_ops_append_eltwise(po, d->act == TJ_DENSE_ACT_RELU ? DNNL_ELTWISE_RELU : DNNL_ELTWISE_GELU_ERF,
                                              0.0f, 0.0f),
                 "post_ops eltwise");
        DNNL_TRY(dnnl.attr_set_post_ops(mm->attr, po), "set_post_ops");
    }
    /* the weights in the layout the implementation prefers (asked at the fixed M, or at a
     * typical batch when M is per call: the blocking follows n and k), reordered once here */
    if ((s = make_pd(mm, d->m ? d->m : 128, NULL, &pd, err)) != TJ_OK) goto fail;
    dnnl_handle best = dnnl.pd_query_md(pd, DNNL_QUERY_WEIGHTS_MD, 0); /* owned by pd: cloned */
    DNNL_TRY(dnnl.md_clone(&mm->md_w, best), "memory_desc clone");
    DNNL_TRY(dnnl.mem_create(&mm->mw, mm->md_w, mm->eng, DNNL_MEMORY_ALLOCATE), "memory(packed weights)");
    mm->bytes = (int64_t)dnnl.md_get_size(mm->md_w);
    DNNL_TRY(dnnl.reorder_pd_create(&rpd, md_w, mm->eng, mm->md_w, mm->eng, NULL), "reorder primitive_desc");
    DNNL_TRY(dnnl.stream_create(&strm, mm->eng, DNNL_STREAM_IN_ORDER), "stream_create");
    DNNL_TRY(dnnl.mem_create(&mwplain, md_w, mm->eng, (void *)w), "memory(weights)");
    DNNL_TRY(dnnl.prim_create(&rprim, rpd), "reorder primitive");
    dnnl_exec_arg ra[2] = {{DNNL_ARG_SRC, mwplain}, {DNNL_ARG_DST, mm->mw}};
    DNNL_TRY(dnnl.prim_execute(rprim, strm, 2, ra), "reorder");
    DNNL_TRY(dnnl.stream_wait(strm), "stream_wait");
    if (d->bias) {
        mm->bias_copy = malloc((size_t)d->n * sizeof(float));
        if (!mm->bias_copy) {
            s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        memcpy(mm->bias_copy, bias, (size_t)d->n * sizeof(float));
        mm->bytes += d->n * (int64_t)sizeof(float);
        DNNL_TRY(dnnl.mem_create(&mm->mb, mm->md_b, mm->eng, mm->bias_copy), "memory(bias)");
    }
    /* the first primitive now: a problem oneDNN cannot run fails here, not at the first call */
    omp_leave(omp);
    omp = 0;
    s = get_entry(mm, d->m ? d->m : 128, &first, err);
    entry_release(first);
fail:
    omp_leave(omp);
    if (pd) dnnl.pd_destroy(pd);
    if (strm) dnnl.stream_destroy(strm);
    if (rprim) dnnl.prim_destroy(rprim);
    if (rpd) dnnl.pd_destroy(rpd);
    if (mwplain) dnnl.mem_destroy(mwplain);
    if (md_w) dnnl.md_destroy(md_w);
    if (po) dnnl.post_ops_destroy(po);
    if (s != TJ_OK) {
        tj_onednn_matmul_destroy(mm);
        return s;
    }
    *out = mm;
    return TJ_OK;
}

static tj_status exec(const tj_onednn_matmul *mm, const prim_entry *e, dnnl_handle strm, dnnl_handle mx,
                      dnnl_handle my, dnnl_handle mscratch, tj_error *err)
{
    tj_status s = TJ_OK;
    dnnl_exec_arg a[5] = {{DNNL_ARG_SRC, mx}, {DNNL_ARG_WEIGHTS, mm->mw}, {DNNL_ARG_DST, my}};
    int na = 3;
    if (mm->mb) a[na++] = (dnnl_exec_arg){DNNL_ARG_BIAS, mm->mb};
    if (mscratch) a[na++] = (dnnl_exec_arg){DNNL_ARG_SCRATCHPAD, mscratch};
    int omp = omp_enter(mm->d.threads);
    DNNL_TRY(dnnl.prim_execute(e->prim, strm, na, a), "matmul");
    DNNL_TRY(dnnl.stream_wait(strm), "stream_wait");
fail:
    omp_leave(omp);
    return s;
}

/* Memory objects of x [m × k] and y [m × n] for one call. */
static tj_status bind_xy(const tj_onednn_matmul *mm, int64_t m, const void *x, float *y, dnnl_handle *mx,
                         dnnl_handle *my, tj_error *err)
{
    tj_status s = TJ_OK;
    dnnl_handle mdx = NULL, mdy = NULL;
    dnnl_dims xd = {m, mm->d.k}, yd = {m, mm->d.n};
    *mx = *my = NULL;
    DNNL_TRY(dnnl.md_with_tag(&mdx, 2, xd, mm->d.bf16 ? DNNL_DT_BF16 : DNNL_DT_F32, DNNL_TAG_AB), "memory_desc(src)");
    DNNL_TRY(dnnl.md_with_tag(&mdy, 2, yd, DNNL_DT_F32, DNNL_TAG_AB), "memory_desc(dst)");
    DNNL_TRY(dnnl.mem_create(mx, mdx, mm->eng, (void *)x), "memory(src)");
    DNNL_TRY(dnnl.mem_create(my, mdy, mm->eng, y), "memory(dst)");
fail:
    if (mdx) dnnl.md_destroy(mdx);
    if (mdy) dnnl.md_destroy(mdy);
    return s;
}

/* ---- the calling thread's stream and memory objects ------------------------------------
 * A call needs a stream (not to be shared between threads) and memory objects over x and y.
 * Made per call they cost about 1.5 µs (a third of an M = 1 call), so each thread keeps its own:
 * one stream and a few memory objects by shape, repointed at each call's x and y. Freed when the
 * thread exits (the key's destructor) or the library is unloaded (the calling thread's). */
#define TLS_MEMS 8

typedef struct tls_mem {
    int64_t rows, cols;
    int dt, role;              /* role 0: a call's x, 1: its y (never the same object) */
    dnnl_handle mem;
    uint64_t used;
} tls_mem;

typedef struct tls_state {
    dnnl_handle strm;
    tls_mem mem[TLS_MEMS];
    uint64_t clock;
    void *scratch;             /* the thread's scratchpad (user mode), grown as needed */
    int64_t scratch_cap;
} tls_state;

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;
static atomic_int tls_ok; /* 1: the key works; 0: not made (or failed), 2: unloaded */

static void tls_destroy(void *vp)
{
    tls_state *t = vp;
    if (!t) return;
    for (int i = 0; i < TLS_MEMS; i++)
        if (t->mem[i].mem) dnnl.mem_destroy(t->mem[i].mem);
    if (t->strm) dnnl.stream_destroy(t->strm);
    free(t->scratch);
    free(t);
}

static void tls_init(void) { atomic_store(&tls_ok, pthread_key_create(&tls_key, tls_destroy) == 0 ? 1 : 2); }

/* The key's destructor must not outlive this code (dlclose of libtilejit). */
__attribute__((destructor)) static void tls_unload(void)
{
    if (atomic_load(&tls_ok) != 1) return;
    tls_state *t = pthread_getspecific(tls_key);
    pthread_setspecific(tls_key, NULL);
    tls_destroy(t);
    atomic_store(&tls_ok, 2);
    pthread_key_delete(tls_key);
}

void tj_onednn_thread_release(void)
{
    if (atomic_load(&tls_ok) != 1) return;
    tls_state *t = pthread_getspecific(tls_key);
    if (!t) return;
    pthread_setspecific(tls_key, NULL);
    tls_destroy(t);
}

static tls_state *tls_get(void)
{
    pthread_once(&tls_once, tls_init);
    if (atomic_load(&tls_ok) != 1) return NULL;
    tls_state *t = pthread_getspecific(tls_key);
    if (t) return t;
    if (!(t = calloc(1, sizeof *t))) return NULL;
    if (dnnl.stream_create(&t->strm, engine, DNNL_STREAM_IN_ORDER) != DNNL_SUCCESS || pthread_setspecific(tls_key, t) != 0) {
        tls_destroy(t);
        return NULL;
    }
    return t;
}

/* A memory object of the thread for a [rows × cols] row-major array of dt at p, as a call's x
 * (role 0), y (role 1) or scratchpad (role 2: a 1-D u8 array of rows bytes, cols 1). */
static tj_status tls_mem_at(tls_state *t, int role, int64_t rows, int64_t cols, int dt, void *p, dnnl_handle *out,
                            tj_error *err)
{
    tj_status s = TJ_OK;
    tls_mem *e = NULL, *old = &t->mem[0];
    for (int i = 0; i < TLS_MEMS && !e; i++) {
        tls_mem *c = &t->mem[i];
        if (c->mem && c->rows == rows && c->cols == cols && c->dt == dt && c->role == role) e = c;
        if (!c->mem || (old->mem && c->used < old->used)) old = c;
    }
    if (!e) { /* a new shape: replace the least recently used */
        dnnl_handle md = NULL;
        dnnl_dims d = {rows, cols};
        if (old->mem) dnnl.mem_destroy(old->mem);
        old->mem = NULL;
        if (role == 2) DNNL_TRY(dnnl.md_with_tag(&md, 1, d, dt, DNNL_TAG_A), "memory_desc");
        else DNNL_TRY(dnnl.md_with_tag(&md, 2, d, dt, DNNL_TAG_AB), "memory_desc");
        dnnl_status st = dnnl.mem_create(&old->mem, md, engine, p);
        dnnl.md_destroy(md);
        if (st != DNNL_SUCCESS) {
            old->mem = NULL;
            s = tj_fail(err, TJ_ERR_UNSUPPORTED, "oneDNN: memory_create failed (status %d)", st);
            goto fail;
        }
        old->rows = rows;
        old->cols = cols;
        old->dt = dt;
        old->role = role;
        e = old;
    } else {
        DNNL_TRY(dnnl.mem_set_data(e->mem, p), "memory set_data_handle");
    }
    e->used = ++t->clock;
    *out = e->mem;
fail:
    return s;
}

tj_status tj_onednn_matmul_run(const tj_onednn_matmul *cmm, const void *x, float *y, int64_t m, tj_error *err)
{
    tj_onednn_matmul *mm = (tj_onednn_matmul *)cmm; /* the primitive table is the mutable part (locked) */
    if (m < 1 || (mm->d.m && m != mm->d.m))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "oneDNN matmul for M = %lld called with M = %lld",
                       (long long)mm->d.m, (long long)m);
    tj_status s = TJ_OK;
    prim_entry *e = NULL;
    dnnl_handle mx = NULL, my = NULL;
    tls_state *t = tls_get();
    if (!t) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory for the thread's oneDNN stream");
    TJ_TRY(get_entry(mm, m, &e, err));
    dnnl_handle ms = NULL;
    if (e->scratch > t->scratch_cap) { /* grown (by half again) and kept for the thread's next calls */
        int64_t cap = e->scratch + t->scratch_cap / 2;
        free(t->scratch);
        t->scratch = aligned_alloc(64, (size_t)(cap + 63) / 64 * 64);
        t->scratch_cap = t->scratch ? cap : 0;
        if (!t->scratch) s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory for a oneDNN scratchpad");
    }
    if (s == TJ_OK && e->scratch > 0)
        s = tls_mem_at(t, 2, e->scratch, 1, DNNL_DT_U8, t->scratch, &ms, err);
    if (s == TJ_OK && (s = tls_mem_at(t, 0, m, mm->d.k, mm->d.bf16 ? DNNL_DT_BF16 : DNNL_DT_F32, (void *)x, &mx, err)) == TJ_OK &&
        (s = tls_mem_at(t, 1, m, mm->d.n, DNNL_DT_F32, y, &my, err)) == TJ_OK)
        s = exec(mm, e, t->strm, mx, my, ms, err);
    entry_release(e);
    return s;
}

tj_status tj_onednn_matmul_bind(tj_onednn_matmul *mm, const void *x, float *y, tj_error *err)
{
    tj_status s = TJ_OK;
    if (!mm->d.m) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "oneDNN matmul: binding needs a fixed M");
    if (!mm->bound) TJ_TRY(get_entry(mm, mm->d.m, &mm->bound, err));
    if (!mm->strm) DNNL_TRY(dnnl.stream_create(&mm->strm, mm->eng, DNNL_STREAM_IN_ORDER), "stream_create");
    if (!mm->ms && mm->bound->scratch > 0) {
        dnnl_handle smd = dnnl.pd_query_md(mm->bound->pd, DNNL_QUERY_SCRATCHPAD_MD, 0);
        if (!(mm->scratch = aligned_alloc(64, (size_t)(mm->bound->scratch + 63) / 64 * 64)))
            return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory for a oneDNN scratchpad");
        DNNL_TRY(dnnl.mem_create(&mm->ms, smd, mm->eng, mm->scratch), "memory(scratchpad)");
    }
    if (mm->mx) dnnl.mem_destroy(mm->mx);
    if (mm->my) dnnl.mem_destroy(mm->my);
    s = bind_xy(mm, mm->d.m, x, y, &mm->mx, &mm->my, err);
fail:
    return s;
}

int tj_onednn_matmul_run_bound(tj_onednn_matmul *mm)
{
    tj_error err;
    return mm->mx && exec(mm, mm->bound, mm->strm, mm->mx, mm->my, mm->ms, &err) == TJ_OK ? 0 : -1;
}

const char *tj_onednn_matmul_name(const tj_onednn_matmul *mm) { return mm->name; }
int64_t tj_onednn_matmul_bytes(const tj_onednn_matmul *mm) { return mm->bytes; }

void tj_onednn_matmul_destroy(tj_onednn_matmul *mm)
{
    if (!mm) return;
    if (dnnl.lib) {
        entry_release(mm->bound);
        for (int i = 0; i < mm->nprims; i++) entry_release(mm->prims[i]);
        if (mm->mx) dnnl.mem_destroy(mm->mx);
        if (mm->my) dnnl.mem_destroy(mm->my);
        if (mm->ms) dnnl.mem_destroy(mm->ms);
        if (mm->mw) dnnl.mem_destroy(mm->mw);
        if (mm->mb) dnnl.mem_destroy(mm->mb);
        if (mm->md_w) dnnl.md_destroy(mm->md_w);
        if (mm->md_b) dnnl.md_destroy(mm->md_b);
        if (mm->attr) dnnl.attr_destroy(mm->attr);
        if (mm->strm) dnnl.stream_destroy(mm->strm);
    }
    pthread_mutex_destroy(&mm->lock);
    free(mm->scratch);
    free(mm->bias_copy);
    free(mm);
}

/* ---------------------------------------------------------------- OpenBLAS */

int tj_openblas_built(void) { return TJ_HAVE_OPENBLAS; }

static char blas_name[2][200];
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_names(void)
{
#if TJ_HAVE_OPENBLAS
    /* openblas_get_config: "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64" */
    char ver[32] = "";
    const char *cfg = openblas_get_config();
    if (cfg && strncmp(cfg, "OpenBLAS ", 9) == 0) sscanf(cfg + 9, "%31s", ver);
    for (int i = 0; i < 2; i++)
        snprintf(blas_name[i], sizeof blas_name[i], "OpenBLAS %s %s (core %s)", ver, i ? "sgemv" : "sgemm",
                 openblas_get_corename());
#else
    for (int i = 0; i < 2; i++)
        snprintf(blas_name[i], sizeof blas_name[i], "this tilejit was built without OpenBLAS (Debian libopenblas-dev)");
#endif
}

#if TJ_HAVE_OPENBLAS
int blas_thread_shutdown_(void);
#endif

void tj_openblas_quiesce(void)
{
#if TJ_HAVE_OPENBLAS
    blas_thread_shutdown_();
#endif
}

const char *tj_openblas_name(int64_t m)
{
    pthread_once(&blas_once, blas_names);
    return blas_name[m == 1];
}

tj_status tj_openblas_gemm(const float *x, const float *w, const float *bias, tj_dense_act act, float *y, int64_t m,
                           int64_t n, int64_t k, int threads, tj_error *err)
{
#if TJ_HAVE_OPENBLAS
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "OpenBLAS: %lld × %lld × %lld exceeds its 32-bit sizes",
                       (long long)m, (long long)n, (long long)k);
    if (openblas_get_num_threads() != threads) openblas_set_num_threads(threads);
    if (m == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)n, (blasint)k, 1.0f, w, (blasint)k, x, 1, 0.0f, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)n, (blasint)k, 1.0f, x, (blasint)k, w,
                    (blasint)k, 0.0f, y, (blasint)n);
    if (!bias && act == TJ_DENSE_ACT_NONE) return TJ_OK;
    for (int64_t i = 0; i < m; i++) {
        float *yi = y + i * n;
        for (int64_t j = 0; j < n; j++) {
            float v = yi[j] + (bias ? bias[j] : 0.0f);
            if (act == TJ_DENSE_ACT_RELU) v = v > 0 ? v : 0;
            else if (act == TJ_DENSE_ACT_GELU) v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
            yi[j] = v;
        }
    }
    return TJ_OK;
#else
    (void)x, (void)w, (void)bias, (void)act, (void)y, (void)n, (void)k, (void)threads;
    return tj_fail(err, TJ_ERR_UNSUPPORTED, "%s", tj_openblas_name(m));
#endif
}
