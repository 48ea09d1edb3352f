/* Backend `cpu`: layers emitted as LLVM IR (gen/emit_llvm.c), compiled by ORC LLJIT for the host
 * CPU's name and features (one JIT per model, every layer compiled at load), run on a persistent
 * thread pool kept per context. The internal API below is what the backend ops, `tilejit bench`
 * and the tests share. */
#ifndef TJ_BACKEND_CPU_H
#define TJ_BACKEND_CPU_H

#include <stdatomic.h>

#include "gen/emit_llvm.h"
#include "jit/cpu_jit.h"
#include "gen/plan.h"
#include "runtime/model.h"
#include "base/threadpool.h"


typedef void (*tj_cpu_item_fn)(const void *x, void *y, const void *wp, const float *bk, int64_t slot,
                               int64_t m0, int64_t m1);
typedef void (*tj_cpu_post_fn)(const void *x, void *y, const float *ewv, const float *bias, int64_t m0,
                               int64_t m1);
typedef void (*tj_cpu_prep_fn)(const void *x, void *xt, int64_t m0, int64_t m1);

/* A layer's packed weights in one layout, with its bias and ew values: built once and shared
 * by every variant (per-M config) of the layer whose config packs the same way
 * (tj_cpu_layout_same); freed with the last variant that holds it. */
typedef struct tj_cpu_packed {
    atomic_int refs;
    tj_cpu_config cfg;    /* the config it was packed for (only the layout fields matter) */
    tj_plan plan;         /* tile order and block offsets, padded to cfg.vec */
    void *wp;             /* packed weights (fp32, or bf16 with cfg.weights bf16; row pairs with
                           * cfg.dot dpbf16), 64-byte aligned */
    size_t wp_bytes;      /* bytes of wp (padded) */
    float *bk;            /* bias in kept-column order (zeros without bias), bk_elems */
    int64_t bk_elems;
    float *bias;          /* fp32 [n] or NULL */
    float *ewv;           /* ew weights in CSR order */
    const void *src;      /* the weights it was packed from (identity only, never read) */
} tj_cpu_packed;

/* 1 when configs a and b (resolved) give the same packed layout: the same plan padding (vec),
 * column blocks (nr; not for dot amx's 1 KB tiles), stored type (weights) and row pairing (dot
 * dpbf16) or AMX tiles (dot amx). Whatever else differs (mr, unroll, offsets, mb, kc, pack,
 * order, serial, dtype, out) only changes the code. */
int tj_cpu_layout_same(const tj_cpu_config *a, const tj_cpu_config *b);

/* One compiled layer: its config, the packed weights it reads (possibly shared) and the JIT'ed
 * entry points. Borrows l (and the jit). */
typedef struct tj_cpu_layer {
    const tj_layer *l;
    tj_cpu_config cfg;    /* vec resolved */
    tj_cpu_packed *pk;    /* holds one reference */
    tj_cpu_emit_info info;
    tj_cpu_item_fn item;
    tj_cpu_post_fn post;
    tj_cpu_prep_fn prep;  /* dot amx: x → its transpose, before the items; else NULL */
    tj_cpu_prep_fn prepf; /* the same from fp32 x (rounded to bf16 on the way); else NULL */
    int64_t mb;           /* tokens per work item */
    int64_t *cum;         /* cumulative cost of the work pieces (tj_cpu_pieces), info.nslots + 1 */
    int64_t kept;         /* kept weights (tj_layer_kept), for the serial rule */
    double emit_seconds, compile_seconds, pack_seconds;
    int from_cache;       /* the object came from the on-disk cache (no emit, no LLVM codegen) */
    int packed_here;      /* 1: this build packed pk; 0: it took pk from a peer */
} tj_cpu_layer;

/* Emits, optimises and JIT-compiles layer l with config cfg (NULL: the default; vec 0: the
 * host's), packing weights w (F32/F16/BF16, upcast to fp32). prefix: unique symbol prefix
 * inside jit. */
tj_status tj_cpu_layer_build(tj_cpu_jit *jit, const tj_layer *l, const tj_layer_weights *w,
                             const tj_cpu_config *cfg, const char *prefix, tj_cpu_layer **out,
                             tj_error *err);
/* The same, taking the packed weights of the first of peers[0..npeers) (built for the same l
 * and w; NULL entries skipped) whose layout is the same, instead of packing another copy. */
tj_status tj_cpu_layer_build_shared(tj_cpu_jit *jit, const tj_layer *l, const tj_layer_weights *w,
                                    const tj_cpu_config *cfg, const char *prefix,
                                    tj_cpu_layer *const *peers, int npeers, tj_cpu_layer **out,
                                    tj_error *err);
void tj_cpu_layer_free(tj_cpu_layer *cl);
/* The object-cache key of layer l compiled with config cfg (resolved) under symbol prefix: the
 * emitter build, the pattern (tj_layer_fields), the config's canonical JSON, the prefix and the
 * host (tj_cpu_jit_key_host). */
void tj_cpu_layer_key(tj_cache_key *k, const tj_layer *l, const tj_cpu_config *cfg, const char *prefix);
/* y [m × n] = layer(x [m × k]), row-major, on at most `threads` threads of pool (NULL pool or
 * threads 1: the calling thread). x is fp32, or raw bf16 with cfg.dtype bf16; y fp32, or bf16
 * with cfg.out bf16. Results do not depend on the thread count. A layer with a prep pass (dot
 * amx) transposes x into the calling thread's scratch first: TJ_ERR_OUT_OF_MEMORY when that
 * cannot grow (y untouched); else TJ_OK. */
tj_status tj_cpu_layer_run(const tj_cpu_layer *cl, tj_pool *pool, int threads, const void *x, int64_t m,
                           void *y);
/* 1 when a bf16 layer also takes fp32 x (rounded to bf16 in its prep pass: dot amx without ew
 * entries, which its post pass would read as bf16). */
int tj_cpu_layer_takes_f32(const tj_cpu_layer *cl);
/* tj_cpu_layer_run with fp32 x for such a layer (TJ_ERR_INTERNAL for others). */
tj_status tj_cpu_layer_run_f32(const tj_cpu_layer *cl, tj_pool *pool, int threads, const float *x, int64_t m,
                               void *y);

/* The context's pool, created on first use under c->lock: the kind c->threading resolved to,
 * opt.threads threads (0: all cores for own threads, the host's count for OpenMP). */
tj_status tj_cpu_context_pool(tj_context *c, tj_pool **out, tj_error *err);
/* Frees the context's CPU state and the calling thread's scratch; tj_context_destroy calls it
 * (the ops' release). */
void tj_cpu_context_release(tj_context *c);
/* The calling thread's scratch for bf16 layers behind the fp32 interface (x rounded to bf16, y
 * widened back): its size in bytes (0: none), and freeing it now (it is also freed at thread
 * exit). */
size_t tj_cpu_thread_scratch_bytes(void);
void tj_cpu_thread_scratch_release(void);
/* tj_cpu_count (online cores) is in base/threadpool.h. */

#endif
