/* Backend `cpu`: plan → emit LLVM IR (gen/emit_llvm.c) → optimise for the host → ORC LLJIT →
 * dispatch work items (tile × token block) on the context's thread pool, then the ew/pruned
 * pass. One JIT per model; every layer is compiled at load. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llvm-c/Core.h>
#include <llvm-c/Orc.h>

#include "runtime/backend_cpu.h"
#include "jit/cpu_jit.h"
#include "tuning/tuning.h"
#include "base/host.h"
#include "pattern/pattern.h"

/* TILEJIT_DUMP_DIR: every emitted module as DIR/<prefix>.ll (before optimisation), with the
 * config and pass pipeline in a header comment. Best effort: a dump failure never fails a load. */
static void dump_ir(LLVMModuleRef m, const tj_layer *l, const tj_cpu_config *cfg, const char *prefix)
{
    const char *dir = getenv("TILEJIT_DUMP_DIR");
    if (!dir || !*dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.ll", dir, prefix);
    FILE *f = fopen(path, "w");
    if (!f) return;
    char *cj = tj_cpu_config_to_json(cfg), *ir = LLVMPrintModuleToString(m);
    fprintf(f, "; layer %s, config %s\n; passes %s, host %s\n%s", l->name, cj ? cj : "?", tj_cpu_jit_passes(),
            tj_host_cpu_name(), ir ? ir : "");
    free(cj);
    LLVMDisposeMessage(ir);
    fclose(f);
}

/* ---------------------------------------------------------------- the object cache */

/* Cache entry of one layer: "TJCO", a format number, sizeof(tj_cpu_emit_info), the info (entry
 * names, table sizes) and the ELF object. The key covers everything the object depends on. */
#define OBJ_MAGIC "TJCO"
#define OBJ_FORMAT 1u

static void key_add(void *ctx, const void *data, size_t len) { tj_cache_key_add(ctx, data, len); }

void tj_cpu_layer_key(tj_cache_key *k, const tj_layer *l, const tj_cpu_config *cfg, const char *prefix)
{
    tj_cache_key_begin(k);
    tj_cache_key_add_str(k, "tilejit cpu object");
    tj_cache_key_add_str(k, tj_cpu_gen_id());
    /* the pattern: the fields tj_layer_hash covers, each chunk length-prefixed (so the key stays
     * collision-safe where the 64-bit hash is not) */
    tj_layer_fields(l, key_add, k);
    char *cj = tj_cpu_config_to_json(cfg);
    tj_cache_key_add_str(k, cj ? cj : "?");
    free(cj);
    tj_cache_key_add_str(k, prefix);
    tj_cpu_jit_key_host(k);
    tj_cache_key_end(k);
}

static tj_status add_object(tj_cpu_jit *jit, tj_cpu_layer *cl, const void *obj, size_t len, tj_error *err)
{
    const char *names[4] = {cl->info.item_name, NULL, NULL, NULL};
    void *addr[4] = {NULL, NULL, NULL, NULL};
    int n = 1, ipost = 0, iprep = 0, iprepf = 0;
    if (cl->info.post_name[0]) names[ipost = n++] = cl->info.post_name;
    if (cl->info.prep_name[0]) names[iprep = n++] = cl->info.prep_name;
    if (cl->info.prepf_name[0]) names[iprepf = n++] = cl->info.prepf_name;
    TJ_TRY(tj_cpu_jit_add_object(jit, obj, len, names, n, addr, err));
    cl->item = (tj_cpu_item_fn)(uintptr_t)addr[0];
    cl->post = ipost ? (tj_cpu_post_fn)(uintptr_t)addr[ipost] : NULL;
    cl->prep = iprep ? (tj_cpu_prep_fn)(uintptr_t)addr[iprep] : NULL;
    cl->prepf = iprepf ? (tj_cpu_prep_fn)(uintptr_t)addr[iprepf] : NULL;
    return TJ_OK;
}

/* A cached object for the layer, added to the JIT: 1 on success, 0 when there is none (or it
 * failed its checks and has been removed), 2 when the JIT rejected it (removed too; its symbols
 * may stay defined in the JIT), -1 on an error that must fail the load. */
static int load_cached(tj_cpu_jit *jit, tj_cache *cache, const tj_cache_key *key, tj_cpu_layer *cl, tj_error *err)
{
    void *blob = NULL;
    size_t len = 0;
    tj_cache_result res;
    if (tj_cache_lookup(cache, key, &blob, &len, &res, err) != TJ_OK) return -1;
    if (res != TJ_CACHE_HIT) return 0;
    const uint8_t *p = blob;
    size_t hdr = 12 + sizeof cl->info;
    uint32_t fmt = 0, isz = 0;
    if (len > hdr) {
        memcpy(&fmt, p + 4, 4);
        memcpy(&isz, p + 8, 4);
    }
    int ok = len > hdr && memcmp(p, OBJ_MAGIC, 4) == 0 && fmt == OBJ_FORMAT && isz == sizeof cl->info;
    if (ok) {
        memcpy(&cl->info, p + 12, sizeof cl->info);
        cl->info.item_name[sizeof cl->info.item_name - 1] = '\0';
        cl->info.post_name[sizeof cl->info.post_name - 1] = '\0';
        cl->info.prep_name[sizeof cl->info.prep_name - 1] = '\0';
        cl->info.prepf_name[sizeof cl->info.prepf_name - 1] = '\0';
        tj_error aerr;
        if (add_object(jit, cl, p + hdr, len - hdr, &aerr) != TJ_OK) ok = 2;
    }
    free(blob);
    if (ok != 1) tj_cache_remove(cache, key);
    return ok;
}

/* Emits, optimises and compiles layer l to an object, through the JIT's cache when it has one,
 * and adds it to the JIT. */
static tj_status compile_layer(tj_cpu_jit *jit, const tj_layer *l, tj_cpu_layer *cl, const char *prefix, tj_error *err)
{
    tj_cache *cache = tj_cpu_jit_cache(jit);
    tj_cache_key key;
    char pfx[64];
    snprintf(pfx, sizeof pfx, "%s", prefix);
    if (cache && tj_cache_mode(cache) > 0) {
        tj_cpu_layer_key(&key, l, &cl->cfg, pfx);
        int r = load_cached(jit, cache, &key, cl, err);
        if (r < 0) return err->status;
        if (r == 1) {
            cl->from_cache = 1;
            return TJ_OK;
        }
        /* a cached object this JIT rejected may have left its symbols defined: build under
         * fresh names (a new key too) */
        if (r == 2) {
            snprintf(pfx, sizeof pfx, "%s_r", prefix);
            tj_cpu_layer_key(&key, l, &cl->cfg, pfx);
        }
    }
    double t0 = tj_now();
    LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
    LLVMModuleRef mod = NULL;
    tj_status s = tj_cpu_emit_module(LLVMOrcThreadSafeContextGetContext(tsc), l, &cl->pk->plan, &cl->cfg, pfx, &mod, &cl->info, err);
    cl->emit_seconds = tj_now() - t0;
    void *obj = NULL;
    size_t len = 0;
    if (s == TJ_OK) {
        dump_ir(mod, l, &cl->cfg, pfx);
        s = tj_cpu_jit_compile(jit, mod, &obj, &len, err); /* consumes mod */
    }
    LLVMOrcDisposeThreadSafeContext(tsc);
    if (s == TJ_OK && cache && tj_cache_mode(cache) == 2) {
        size_t hdr = 12 + sizeof cl->info;
        uint8_t *blob = malloc(hdr + len);
        if (!blob) s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        else {
            uint32_t fmt = OBJ_FORMAT, isz = (uint32_t)sizeof cl->info;
            memcpy(blob, OBJ_MAGIC, 4);
            memcpy(blob + 4, &fmt, 4);
            memcpy(blob + 8, &isz, 4);
            memcpy(blob + 12, &cl->info, sizeof cl->info);
            memcpy(blob + hdr, obj, len);
            s = tj_cache_store(cache, &key, blob, hdr + len, err);
            free(blob);
        }
    }
    if (s == TJ_OK) s = add_object(jit, cl, obj, len, err);
    free(obj);
    return s;
}

/* ---------------------------------------------------------------- layers */

int tj_cpu_layout_same(const tj_cpu_config *a, const tj_cpu_config *b)
{
    /* exactly what tj_cpu_plan_build (pad, row pad) and tj_cpu_pack_weights read; AMX's tiles
     * do not depend on nr */
    int amx = tj_cpu_dot_amx(a->dot);
    return a->vec == b->vec && (amx || a->nr == b->nr) && a->weights == b->weights &&
           (a->dot == TJ_CPU_DOT_DPBF16) == (b->dot == TJ_CPU_DOT_DPBF16) && (a->dot == TJ_CPU_DOT_AMX) == (b->dot == TJ_CPU_DOT_AMX) &&
           (a->dot == TJ_CPU_DOT_AMX_X) == (b->dot == TJ_CPU_DOT_AMX_X);
}

static void packed_release(tj_cpu_packed *pk)
{
    if (!pk || atomic_fetch_sub(&pk->refs, 1) != 1) return;
    tj_plan_free(&pk->plan);
    free(pk->wp);
    free(pk->bk);
    free(pk->bias);
    free(pk->ewv);
    free(pk);
}

void tj_cpu_layer_free(tj_cpu_layer *cl)
{
    if (!cl) return;
    packed_release(cl->pk);
    free(cl->cum);
    free(cl);
}

/* Fills pk's buffers (its plan is built) for layer l: the weights in pk->cfg's layout, bias in
 * kept-column order (bk_elems slots), ew values. */
static tj_status pack(tj_cpu_packed *pk, const tj_layer *l, const tj_layer_weights *w, int64_t bk_elems, tj_error *err)
{
    int bf = pk->cfg.weights == TJ_CPU_WEIGHTS_BF16;
    size_t esz = bf ? 2 : sizeof(float);
    size_t wbytes = ((size_t)(pk->plan.packed_elems + pk->cfg.vec) * esz + 63) & ~(size_t)63;
    pk->wp = aligned_alloc(64, wbytes);
    pk->wp_bytes = wbytes;
    pk->bk = calloc((size_t)bk_elems + 1, sizeof(float));
    pk->bk_elems = bk_elems;
    pk->ewv = malloc((size_t)(l->ew_nnz + 1) * sizeof(float));
    if (w->bias) pk->bias = malloc((size_t)l->n * sizeof(float));
    if (!pk->wp || !pk->bk || !pk->ewv || (w->bias && !pk->bias))
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory packing weights", l->name);
    tj_cpu_pack_weights(&pk->plan, &pk->cfg, w->w, w->wdt, pk->wp);
    memset((char *)pk->wp + (size_t)pk->plan.packed_elems * esz, 0, wbytes - (size_t)pk->plan.packed_elems * esz);
    if (w->bias) {
        tj_convert_to_f32(w->bias, w->bdt, l->n, pk->bias);
        for (int64_t j = 0; j < l->ncols; j++) pk->bk[j] = pk->bias[tj_layer_col(l, j)];
    }
    for (int64_t n = 0; n < l->n && l->ew_nnz; n++)
        for (int64_t e = l->ew_indptr[n]; e < l->ew_indptr[n + 1]; e++)
            pk->ewv[e] = tj_load_f32(w->w, w->wdt, n * l->k + l->ew_indices[e]);
    return TJ_OK;
}

tj_status tj_cpu_layer_build(tj_cpu_jit *jit, const tj_layer *l, const tj_layer_weights *w, const tj_cpu_config *cfg,
                             const char *prefix, tj_cpu_layer **out, tj_error *err)
{
    return tj_cpu_layer_build_shared(jit, l, w, cfg, prefix, NULL, 0, out, err);
}

tj_status tj_cpu_layer_build_shared(tj_cpu_jit *jit, const tj_layer *l, const tj_layer_weights *w,
                                    const tj_cpu_config *cfg, const char *prefix, tj_cpu_layer *const *peers,
                                    int npeers, tj_cpu_layer **out, tj_error *err)
{
    *out = NULL;
    tj_cpu_layer *cl = calloc(1, sizeof *cl);
    if (!cl) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    cl->l = l;
    cl->cfg = cfg ? *cfg : tj_cpu_config_default();
    tj_cpu_config_resolve(&cl->cfg, l);
    if (cl->cfg.weights == TJ_CPU_WEIGHTS_AUTO) /* bf16 checkpoints stay bf16: exact, half the bytes */
        cl->cfg.weights = w->wdt == TJ_BF16 ? TJ_CPU_WEIGHTS_BF16 : TJ_CPU_WEIGHTS_F32;
    cl->mb = tj_cpu_config_mb(&cl->cfg);
    cl->kept = tj_layer_kept(l);
    tj_status s = tj_cpu_config_check(&cl->cfg, err);
    if (s == TJ_OK && cl->cfg.dot == TJ_CPU_DOT_DPBF16 && !tj_cpu_host_bf16()) /* LLVM could not select it */
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "layer '%s': dot dpbf16 needs avx512_bf16, which this CPU (%s) lacks", l->name,
                    tj_host_cpu_name());
    if (s == TJ_OK && tj_cpu_dot_amx(cl->cfg.dot) && !tj_cpu_host_amx())
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "layer '%s': dot %s needs AMX-BF16 and the kernel's permission for its tile state, "
                    "which this CPU (%s) or system lacks", l->name, tj_cpu_dot_name(cl->cfg.dot), tj_host_cpu_name());
    if (s != TJ_OK) goto fail;
    for (int i = 0; i < npeers && !cl->pk; i++)
        if (peers[i] && peers[i]->l == l && peers[i]->pk->src == w->w && tj_cpu_layout_same(&peers[i]->cfg, &cl->cfg)) {
            cl->pk = peers[i]->pk;
            atomic_fetch_add(&cl->pk->refs, 1);
        }
    if (!cl->pk) {
        cl->pk = calloc(1, sizeof *cl->pk);
        if (!cl->pk) {
            s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
            goto fail;
        }
        atomic_init(&cl->pk->refs, 1);
        cl->pk->cfg = cl->cfg;
        cl->pk->src = w->w;
        cl->packed_here = 1;
        s = tj_cpu_plan_build(l, &cl->cfg, &cl->pk->plan, err);
        if (s != TJ_OK) goto fail;
    }

    double t0 = tj_now();
    s = compile_layer(jit, l, cl, prefix, err);
    cl->compile_seconds = tj_now() - t0 - cl->emit_seconds;
    if (s != TJ_OK) goto fail;
    /* the pieces' costs, for splitting decode-sized calls between threads */
    int64_t np = tj_cpu_pieces(&cl->pk->plan, &cl->cfg, NULL);
    tj_cpu_piece *pc = malloc((size_t)(np ? np : 1) * sizeof *pc);
    cl->cum = malloc((size_t)(np + 1) * sizeof *cl->cum);
    if (!pc || !cl->cum) {
        free(pc);
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    tj_cpu_pieces(&cl->pk->plan, &cl->cfg, pc);
    cl->cum[0] = 0;
    for (int64_t i = 0; i < np; i++) cl->cum[i + 1] = cl->cum[i] + pc[i].cost;
    free(pc);
    if (np != cl->info.nslots) { /* a cached object from another piece rule */
        s = tj_fail(err, TJ_ERR_INTERNAL, "layer '%s': the kernel has %lld work pieces, the plan %lld", l->name,
                    (long long)cl->info.nslots, (long long)np);
        goto fail;
    }
    if (cl->packed_here) {
        t0 = tj_now();
        s = pack(cl->pk, l, w, cl->info.bk_elems, err);
        cl->pack_seconds = tj_now() - t0;
    } else if (cl->pk->bk_elems != cl->info.bk_elems) { /* the same vec gives the same bias padding */
        s = tj_fail(err, TJ_ERR_INTERNAL, "layer '%s': shared packing has %lld bias slots, the kernel wants %lld", l->name,
                    (long long)cl->pk->bk_elems, (long long)cl->info.bk_elems);
    }
    if (s != TJ_OK) goto fail;
    *out = cl;
    return TJ_OK;
fail:
    tj_cpu_layer_free(cl);
    return s;
}

typedef struct run_args {
    const tj_cpu_layer *cl;
    tj_cpu_prep_fn prep;
    const void *x;   /* the caller's x: post and prep read it */
    const void *xin; /* what the items read: x, or prep's transpose of it */
    void *xt;
    atomic_int *ready; /* per 32-token block of xt: 0 not staged, 1 being staged, 2 ready */
    void *y;
    int64_t m, nchunks, chunk, nshares;
    size_t xt_bytes; /* > 0: each share transposes x into its own copy, xt + share · xt_bytes */
} run_args;

/* Transposes xt's 32-token block b unless another thread has (or is doing it: wait for it).
 * The first item that needs a block stages it, so the prep overlaps the items of other blocks
 * on other threads and costs no pool dispatch of its own. */
static void xt_block_ready(const run_args *a, int64_t b)
{
    int st = atomic_load_explicit(&a->ready[b], memory_order_acquire);
    if (st == 2) return;
    int expect = 0;
    if (st == 0 && atomic_compare_exchange_strong_explicit(&a->ready[b], &expect, 1, memory_order_acq_rel, memory_order_acquire)) {
        a->prep(a->x, a->xt, 32 * b, 32 * b + 32 < a->m ? 32 * b + 32 : a->m);
        atomic_store_explicit(&a->ready[b], 2, memory_order_release);
        return;
    }
    while (atomic_load_explicit(&a->ready[b], memory_order_acquire) != 2) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

/* Chunk-major items (order 1): position p of a chunk runs slot 2p for the first half, 2p' + 1
 * after, so the items two threads run at once are about ntiles/2 slots apart, not neighbours.
 * Neighbouring slots (the same cost: column neighbours) write neighbouring features of the
 * same token rows, and a y that is not 64-byte aligned (malloc: 16) shares a cache line per
 * row at every tile edge: run side by side, they bounced those lines between the cores. */
static int64_t spread_slot(int64_t p, int64_t ntiles)
{
    int64_t half = (ntiles + 1) / 2;
    return p < half ? 2 * p : 2 * (p - half) + 1;
}

static void run_item(void *vp, int64_t i)
{
    const run_args *a = vp;
    int64_t ntiles = a->cl->info.nslots;
    int64_t slot = a->cl->cfg.order ? spread_slot(i % ntiles, ntiles) : i / a->nchunks,
            c = a->cl->cfg.order ? i / ntiles : i % a->nchunks;
    int64_t m0 = c * a->chunk, m1 = m0 + a->chunk < a->m ? m0 + a->chunk : a->m;
    if (a->ready)
        for (int64_t b = m0 / 32; b * 32 < m1; b++) xt_block_ready(a, b);
    a->cl->item(a->xin, a->y, a->cl->pk->wp, a->cl->pk->bk, slot, m0, m1);
}

/* The first piece of share j of n: where the cumulative cost reaches j/n of the total. */
static int64_t share_begin(const int64_t *cum, int64_t npieces, int64_t j, int64_t n)
{
    if (j >= n) return npieces;
    double at = (double)cum[npieces] * (double)j / (double)n;
    int64_t lo = 0, hi = npieces; /* first s with cum[s] ≥ at */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if ((double)cum[mid] < at) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Share j of a call: a contiguous run of pieces, all tokens, a piece's token chunks in turn
 * (its weights stay in cache across them). */
static void run_share(void *vp, int64_t j)
{
    const run_args *a = vp;
    const tj_cpu_layer *cl = a->cl;
    int64_t s1 = share_begin(cl->cum, cl->info.nslots, j + 1, a->nshares);
    const void *xin = a->xin;
    if (a->xt_bytes) {
        char *xt = (char *)a->xt + (size_t)j * a->xt_bytes;
        for (int64_t b = 0; b * 32 < a->m; b++) a->prep(a->x, xt, 32 * b, 32 * b + 32 < a->m ? 32 * b + 32 : a->m);
        xin = xt;
    } else if (a->ready) {
        for (int64_t b = 0; b * 32 < a->m; b++) xt_block_ready(a, b);
    }
    for (int64_t s = share_begin(cl->cum, cl->info.nslots, j, a->nshares); s < s1; s++)
        for (int64_t m0 = 0; m0 < a->m; m0 += a->chunk)
            cl->item(xin, a->y, cl->pk->wp, cl->pk->bk, s, m0, m0 + a->chunk < a->m ? m0 + a->chunk : a->m);
}

/* Token share j of a dot amx call: a contiguous run of token chunks, every piece. Each thread
 * transposes only its own tokens' x blocks and reads only them: split by pieces, both threads
 * read every block, and the blocks one core wrote crossed to the other core's cache every call
 * (384 × 384 at 50 %, two threads: M = 128 19.2 → 15.9 µs, M = 512 80.9 → 54.5 µs). */
static void run_tokens(void *vp, int64_t j)
{
    const run_args *a = vp;
    const tj_cpu_layer *cl = a->cl;
    int64_t c0 = a->nchunks * j / a->nshares, c1 = a->nchunks * (j + 1) / a->nshares;
    int64_t m0 = c0 * a->chunk, m1 = c1 * a->chunk < a->m ? c1 * a->chunk : a->m;
    for (int64_t b = m0 / 32; b * 32 < m1; b++) xt_block_ready(a, b);
    for (int64_t s = 0; s < cl->info.nslots; s++)
        for (int64_t t = m0; t < m1; t += a->chunk)
            cl->item(a->xin, a->y, cl->pk->wp, cl->pk->bk, s, t, t + a->chunk < m1 ? t + a->chunk : m1);
}

/* Up to this many tokens, a call on several threads gives each thread one equal-cost share of
 * the pieces (all tokens) when the config leaves the split to the runtime (mb auto, tile-major
 * order, no AMX): measured on MiniLM's shapes at 50 % on 2 threads (bench/RESULTS.md, issue 25,
 * round 4), 96-token items claimed one by one were up to 20 % slower at M = 128 and 256 and
 * never faster up to M = 2048. */
#define SHARE_MAX_M 512

static int shares_pay(const tj_cpu_layer *cl, int64_t m, int64_t nchunks)
{
    const tj_cpu_config *c = &cl->cfg;
    return nchunks == 1 || (m <= SHARE_MAX_M && c->mb == 0 && c->order == 0 && c->dot != TJ_CPU_DOT_AMX);
}

static void run_post(void *vp, int64_t i)
{
    const run_args *a = vp;
    int64_t m0 = i * a->chunk, m1 = m0 + a->chunk < a->m ? m0 + a->chunk : a->m;
    a->cl->post(a->x, a->y, a->cl->pk->ewv, a->cl->pk->bias, m0, m1);
}

enum { SCRATCH_HOST, SCRATCH_XT, SCRATCH_SLOTS };
static void *scratch_get(int slot, size_t n, void **own);

/* x fp32 (x_f32, with cl->prepf: the prep rounds it) or as cfg.dtype says */
static tj_status layer_run(const tj_cpu_layer *cl, tj_pool *pool, int threads, const void *x, int x_f32, int64_t m, void *y)
{
    if (m <= 0) return TJ_OK;
    /* small calls on the calling thread alone: never slower on N threads than on 1 */
    if (tj_cpu_serial_call(cl->cfg.serial, m, cl->kept)) threads = 1;
    run_args a = {.cl = cl, .prep = x_f32 ? cl->prepf : cl->prep, .x = x, .xin = x, .y = y, .m = m, .chunk = cl->mb};
    void *own = NULL;
    if (a.prep) { /* dot amx: x transposed once into the caller's scratch, read by every tile */
        int64_t nblk = (m + 31) / 32;
        size_t xtb = ((size_t)tj_cpu_xt_elems(cl->l, m) * 2 + 63) & ~(size_t)63;
        int64_t ntp = threads > 0 ? threads : tj_pool_threads(pool);
        /* one token chunk on several threads: each share transposes x into a copy of its own,
         * as reading one thread's blocks from another core cost more than transposing them
         * again (384 × 384 at 50 %, M = 16, two threads: 10.6 µs shared, 4.2 µs with copies) */
        size_t copies = ntp > 1 && m <= cl->mb ? (size_t)(ntp < cl->info.nslots ? ntp : cl->info.nslots) : 1;
        a.xt_bytes = copies > 1 ? xtb : 0;
        char *buf = scratch_get(SCRATCH_XT, xtb * copies + (size_t)nblk * sizeof(atomic_int), &own);
        if (!buf) return TJ_ERR_OUT_OF_MEMORY;
        a.xt = buf;
        a.xin = a.xt;
        a.ready = (atomic_int *)(buf + xtb * copies);
        for (int64_t b = 0; b < nblk; b++) atomic_init(&a.ready[b], 0);
    }
    a.nchunks = (m + a.chunk - 1) / a.chunk;
    int64_t nt = threads > 0 ? threads : tj_pool_threads(pool);
    if (nt > 1 && a.prep && a.nchunks > 1) {
        a.nshares = nt < a.nchunks ? nt : a.nchunks;
        tj_pool_run(pool, (int)a.nshares, a.nshares, run_tokens, &a);
    } else if (nt > 1 && shares_pay(cl, m, a.nchunks)) {
        /* one token chunk (decode, small batches) or a mid-sized M: each thread takes an
         * equal-cost run of pieces, the same run every call, so it streams only its share of
         * the weights and a share that fits its core's cache stays there between calls
         * (claiming pieces one by one would mix them between the cores' caches) */
        a.nshares = nt < cl->info.nslots ? nt : cl->info.nslots;
        tj_pool_run(pool, (int)a.nshares, a.nshares, run_share, &a);
    } else {
        tj_pool_run(pool, threads, cl->info.nslots * a.nchunks, run_item, &a);
    }
    if (cl->post) {
        a.chunk = 16;
        tj_pool_run(pool, threads, (m + a.chunk - 1) / a.chunk, run_post, &a);
    }
    free(own);
    return TJ_OK;
}

tj_status tj_cpu_layer_run(const tj_cpu_layer *cl, tj_pool *pool, int threads, const void *x, int64_t m, void *y)
{
    return layer_run(cl, pool, threads, x, 0, m, y);
}

int tj_cpu_layer_takes_f32(const tj_cpu_layer *cl) { return cl->prepf && cl->l->ew_nnz == 0; /* only ew reads x in post */ }

tj_status tj_cpu_layer_run_f32(const tj_cpu_layer *cl, tj_pool *pool, int threads, const float *x, int64_t m, void *y)
{
    if (!tj_cpu_layer_takes_f32(cl)) return TJ_ERR_INTERNAL;
    return layer_run(cl, pool, threads, x, 1, m, y);
}

/* ---------------------------------------------------------------- per-thread scratch */

/* A bf16 layer behind the fp32 host interface rounds x into, and widens y out of, a buffer of
 * the calling thread: grown as needed and kept across calls (no allocation per call once it is
 * large enough), freed when the thread exits (the key's destructor), when the thread destroys a
 * context (tj_cpu_context_release) and, for the calling thread, when the library is unloaded.
 * Pool workers never touch it: the caller waits for them. */
typedef struct scratch {
    void *p[SCRATCH_SLOTS]; /* SCRATCH_HOST: bf16 x and y of cpu_linear; SCRATCH_XT: xt of a call */
    size_t cap[SCRATCH_SLOTS];
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static atomic_int scratch_state; /* 0: not yet, 1: the key works, 2: no key (failed or unloaded) */

static void scratch_destroy(void *vp)
{
    scratch *sc = vp;
    if (!sc) return;
    for (int i = 0; i < SCRATCH_SLOTS; i++) free(sc->p[i]);
    free(sc);
}

static void scratch_init(void) { atomic_store(&scratch_state, pthread_key_create(&scratch_key, scratch_destroy) == 0 ? 1 : 2); }

/* The library is going away: the key's destructor must not outlive its code (dlclose). Other
 * threads' buffers are left to the process. */
__attribute__((destructor)) static void scratch_unload(void)
{
    if (atomic_load(&scratch_state) != 1) return;
    tj_cpu_thread_scratch_release();
    atomic_store(&scratch_state, 2);
    pthread_key_delete(scratch_key);
}

/* n bytes of the calling thread's scratch buffer `slot`, 64-byte aligned; without a usable key
 * a fresh buffer the caller frees (*own). NULL when out of memory. */
static void *scratch_get(int slot, size_t n, void **own)
{
    *own = NULL;
    pthread_once(&scratch_once, scratch_init);
    if (atomic_load(&scratch_state) != 1) return *own = aligned_alloc(64, (n + 63) & ~(size_t)63);
    scratch *sc = pthread_getspecific(scratch_key);
    if (sc && sc->cap[slot] >= n) return sc->p[slot];
    if (!sc) {
        if (!(sc = calloc(1, sizeof *sc))) return NULL;
        if (pthread_setspecific(scratch_key, sc) != 0) {
            free(sc);
            return NULL;
        }
    }
    size_t cap = sc->cap[slot] + sc->cap[slot] / 2 > n ? sc->cap[slot] + sc->cap[slot] / 2 : n; /* M often grows in steps */
    cap = (cap + 63) & ~(size_t)63;
    free(sc->p[slot]);
    sc->p[slot] = aligned_alloc(64, cap);
    sc->cap[slot] = sc->p[slot] ? cap : 0;
    return sc->p[slot];
}

size_t tj_cpu_thread_scratch_bytes(void)
{
    if (atomic_load(&scratch_state) != 1) return 0;
    const scratch *sc = pthread_getspecific(scratch_key);
    size_t n = 0;
    for (int i = 0; sc && i < SCRATCH_SLOTS; i++) n += sc->cap[i];
    return n;
}

void tj_cpu_thread_scratch_release(void)
{
    if (atomic_load(&scratch_state) != 1) return;
    scratch *sc = pthread_getspecific(scratch_key);
    if (!sc) return;
    pthread_setspecific(scratch_key, NULL);
    scratch_destroy(sc);
}

/* ---------------------------------------------------------------- context state and ops */

typedef struct cpu_ctx {
    tj_pool *pool;
    tj_cache *cache; /* opened at the first model load */
    int cache_opened;
} cpu_ctx;

tj_status tj_cpu_context_pool(tj_context *c, tj_pool **out, tj_error *err)
{
    tj_status s = TJ_OK;
    pthread_mutex_lock(&c->lock);
    cpu_ctx *cc = c->cpu;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        else {
            if (c->threading == TJ_THREADING_OPENMP) s = tj_pool_create_openmp(c->opt.threads, &cc->pool, err);
            else s = tj_pool_create(c->opt.threads > 0 ? c->opt.threads : tj_cpu_count(), &cc->pool, err);
            if (s == TJ_OK) c->cpu = cc;
            else free(cc);
        }
    }
    *out = s == TJ_OK ? ((cpu_ctx *)c->cpu)->pool : NULL;
    pthread_mutex_unlock(&c->lock);
    return s;
}

void tj_cpu_context_release(tj_context *c)
{
    tj_cpu_thread_scratch_release();
    if (!c || !c->cpu) return;
    cpu_ctx *cc = c->cpu;
    tj_pool_destroy(cc->pool);
    tj_cache_close(cc->cache);
    free(cc);
    c->cpu = NULL;
}

/* Per-M dispatch: a layer is built once per distinct config that the tuning records pick for
 * the batch-size buckets M ≤ 1, 2, 4, ..., TJ_M_TOP and above (TJ_M_CLASSES, tuning/tuning.h); a
 * call runs the variant of its M's bucket. Without records (or with an override) there is one
 * variant, unless a size rule of tj_cpu_config_resolve_m picks another for some buckets. */

typedef struct cpu_layer_set {
    int nvar;
    tj_cpu_layer *var[TJ_M_CLASSES];
    char *json[TJ_M_CLASSES];      /* each variant's config, canonical JSON */
    unsigned char pick[TJ_M_CLASSES]; /* bucket → variant */
} cpu_layer_set;

typedef struct cpu_model {
    tj_cpu_jit *jit;
    tj_pool *pool;
    int64_t nlayers;
    cpu_layer_set *layers;
} cpu_model;

static int bucket_of(int64_t m)
{
    int b = tj_tune_m_bucket(m);
    return b < TJ_M_CLASSES - 1 ? b : TJ_M_CLASSES - 1;
}

static tj_status cpu_available(tj_context *c, tj_error *err)
{
    (void)c;
    return tj_cpu_jit_available(err);
}

/* The context's kernel cache (the same directory as the CUDA backend's), opened once. */
static tj_status open_cache(tj_context *c, tj_cache **out, tj_error *err)
{
    tj_pool *pool;
    TJ_TRY(tj_cpu_context_pool(c, &pool, err)); /* creates c->cpu */
    cpu_ctx *cc = c->cpu;
    TJ_TRY(tj_context_open_cache(c, "cpu", &cc->cache, &cc->cache_opened, err));
    *out = cc->cache;
    return TJ_OK;
}

static void cpu_unload(tj_model *m)
{
    cpu_model *cm = m->state;
    if (!cm) return;
    for (int64_t i = 0; i < cm->nlayers; i++)
        for (int v = 0; v < cm->layers[i].nvar; v++) {
            tj_cpu_layer_free(cm->layers[i].var[v]);
            free(cm->layers[i].json[v]);
        }
    free(cm->layers);
    tj_cpu_jit_destroy(cm->jit);
    free(cm);
    m->state = NULL;
}

static tj_status cpu_load(tj_model *m, tj_error *err)
{
    cpu_model *cm = calloc(1, sizeof *cm);
    if (!cm) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    m->state = cm;
    int64_t n = m->pattern->nlayers;
    cm->layers = calloc((size_t)(n ? n : 1), sizeof *cm->layers);
    if (!cm->layers) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    TJ_TRY(tj_cpu_context_pool(m->ctx, &cm->pool, err));
    TJ_TRY(tj_cpu_jit_create(&cm->jit, err));
    tj_cache *cache = NULL;
    TJ_TRY(open_cache(m->ctx, &cache, err));
    tj_cpu_jit_set_cache(cm->jit, cache);
    double emit = 0, compile = 0, packing = 0, t0 = tj_now();
    int64_t hits = 0;
    int64_t nvars = 0, packings = 0;
    double packed_bytes = 0;
    /* precision: bf16 x where asked, or by default where the CPU has bf16 instructions and the
     * checkpoint is bf16 (no rounding of weights: only x is rounded); a config's "dtype" wins */
    tj_precision prec = m->ctx->opt.precision;
    int host_bf16 = tj_cpu_host_bf16() || tj_cpu_host_amx();
    int64_t nbf16 = 0;
    for (int64_t i = 0; i < n; i++) {
        const tj_layer *l = &m->pattern->layers[i];
        cpu_layer_set *ls = &cm->layers[i];
        int want_bf16 = prec == TJ_PRECISION_BF16 || (prec == TJ_PRECISION_AUTO && host_bf16 && m->lw[i].wdt == TJ_BF16);
        const char *json0 = tj_context_config_for(m->ctx, "cpu", tj_host_cpu_name(), "x86_64", l, 0);
        for (int b = 0; b < TJ_M_CLASSES; b++) {
            int64_t mt = 0;
            const char *json = b == TJ_M_CLASSES - 1 ? json0 : tj_context_config_at(m->ctx, "cpu", tj_host_cpu_name(), "x86_64", l,
                                                                         (int64_t)1 << b, 0, &mt);
            if (b < TJ_M_CLASSES - 1 && mt == 0) json = json0;
            tj_cpu_config cfg;
            TJ_TRY(tj_cpu_config_from_json(json, &cfg, err));
            if (want_bf16 && !tj_cpu_config_json_has(json, "dtype")) {
                cfg.dtype = TJ_CPU_ACT_BF16;
                if (!tj_cpu_config_json_has(json, "dot")) cfg.dot = TJ_CPU_DOT_AUTO;
            }
            /* the bucket's largest M; the open class above TJ_M_TOP as the class below it */
            tj_cpu_config_resolve_m(&cfg, l, (int64_t)1 << (b < TJ_M_CLASSES - 1 ? b : TJ_M_CLASSES - 2));
            char *cj = tj_cpu_config_to_json(&cfg);
            if (!cj) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
            int v = 0;
            while (v < ls->nvar && strcmp(ls->json[v], cj) != 0) v++;
            ls->pick[b] = (unsigned char)v;
            if (v < ls->nvar) {
                free(cj);
                continue;
            }
            ls->json[v] = cj;
            ls->nvar = v + 1; /* owned by the set from here, also if the build fails */
            cm->nlayers = i + 1;
            char prefix[32];
            snprintf(prefix, sizeof prefix, "tjl%lld_%d", (long long)i, v);
            TJ_TRY(tj_cpu_layer_build_shared(cm->jit, l, &m->lw[i], &cfg, prefix, ls->var, v, &ls->var[v], err));
            nvars++;
            emit += ls->var[v]->emit_seconds;
            compile += ls->var[v]->compile_seconds;
            hits += ls->var[v]->from_cache;
            packing += ls->var[v]->pack_seconds;
            if (ls->var[v]->packed_here) {
                packings++;
                packed_bytes += (double)ls->var[v]->pk->wp_bytes;
            }
        }
        nbf16 += ls->var[ls->pick[TJ_M_CLASSES - 1]]->cfg.dtype == TJ_CPU_ACT_BF16;
        if (ls->nvar > 1) {
            char buf[2048];
            size_t o = 0;
            for (int b = 0; b < TJ_M_CLASSES && o < sizeof buf; b++)
                if (b == TJ_M_CLASSES - 1 || ls->pick[b + 1] != ls->pick[b])
                {
                    char upto[32] = "larger M";
                    if (b < TJ_M_CLASSES - 1) snprintf(upto, sizeof upto, "M ≤ %lld", (long long)1 << b);
                    o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s: %s", o ? "; " : "", upto, ls->json[ls->pick[b]]);
                }
            tj_context_note(m->ctx, "cpu: layer '%s' dispatches per M: %s", l->name, buf);
        }
    }
    tj_context_note(m->ctx, "cpu: precision %s: %lld of %lld layers compute in bf16 (%s), the rest in fp32",
                    tj_precision_name(prec), (long long)nbf16, (long long)n,
                    tj_cpu_host_amx() ? "AMX tiles, x as the A tile up to M = 16" : tj_cpu_host_bf16() ? "vdpbf16ps" : "bf16 widened to fp32");
    tj_context_note(m->ctx,
                    "cpu: %lld layers (%lld kernels) for %s in %.3f s: emit %.3f s, optimise+JIT %.3f s (%lld from the "
                    "kernel cache), packing weights %.3f s (packed layouts %lld, %.1f MB)",
                    (long long)n, (long long)nvars, tj_host_cpu_name(), tj_now() - t0, emit, compile, (long long)hits,
                    packing, (long long)packings, packed_bytes / 1e6);
    return TJ_OK;
}

static tj_status cpu_linear(tj_model *m, int64_t layer, const tj_linear_args *a, tj_error *err)
{
    cpu_model *cm = m->state;
    if (!cm || layer < 0 || layer >= cm->nlayers)
        return tj_fail(err, TJ_ERR_INTERNAL, "cpu backend: layer %lld not loaded", (long long)layer);
    const cpu_layer_set *ls = &cm->layers[layer];
    const tj_cpu_layer *cl = ls->var[ls->pick[bucket_of(a->m)]];
    if (!cl->cfg.dtype && !cl->cfg.out) {
        if (tj_cpu_layer_run(cl, cm->pool, 0, a->x32, a->m, a->y32) != TJ_OK)
            return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory for the call's scratch", cl->l->name);
        return TJ_OK;
    }
    /* a bf16 kernel behind the fp32 host interface: round x once, widen y back, in the calling
     * thread's scratch */
    size_t nx = (size_t)(a->m * cl->l->k), ny = (size_t)(a->m * cl->l->n);
    int x_f32 = tj_cpu_layer_takes_f32(cl); /* the AMX prep rounds fp32 x itself */
    size_t xbytes = cl->cfg.dtype && !x_f32 ? (nx * 2 + 2 + 63) & ~(size_t)63 : 0, ybytes = cl->cfg.out ? ny * 2 + 2 : 0;
    void *own;
    char *buf = scratch_get(SCRATCH_HOST, xbytes + ybytes, &own);
    if (!buf) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    uint16_t *xb = xbytes ? (uint16_t *)buf : NULL, *yb = cl->cfg.out ? (uint16_t *)(buf + xbytes) : NULL;
    if (xb) tj_convert_from_f32(a->x32, (int64_t)nx, TJ_BF16, xb);
    tj_status s = layer_run(cl, cm->pool, 0, xb ? (const void *)xb : a->x32, x_f32, a->m, yb ? (void *)yb : a->y32);
    if (s == TJ_OK && yb) tj_convert_to_f32(yb, TJ_BF16, (int64_t)ny, a->y32);
    free(own);
    if (s != TJ_OK) return tj_fail(err, s, "layer '%s': out of memory for the call's scratch", cl->l->name);
    return TJ_OK;
}

static const char *cpu_config_at(tj_model *m, int64_t layer, int64_t M)
{
    cpu_model *cm = m->state;
    if (!cm || layer < 0 || layer >= cm->nlayers) return NULL;
    const cpu_layer_set *ls = &cm->layers[layer];
    return ls->json[ls->pick[bucket_of(M)]];
}

const tj_backend_ops tj_backend_cpu_ops = {
    .name = "cpu",
    .kind = TJ_BACKEND_CPU,
    .host_f32 = 1,
    .available = cpu_available,
    .load = cpu_load,
    .linear = cpu_linear,
    .unload = cpu_unload,
    .config_at = cpu_config_at,
    .release = tj_cpu_context_release,
};
