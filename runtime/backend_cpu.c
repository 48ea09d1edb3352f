/* Backend `cpu`: plan → emit LLVM IR (gen/emit_llvm.c) → optimise for the host → ORC LLJIT →
 * dispatch work items (tile × token block) on the context's thread pool, then the ew/pruned
 * pass. One JIT per model; every layer is compiled at load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "runtime/backend_cpu.h"
#include "base/host.h"

/* Wraps one LLVM call returning LLVMErrorRef: keeps the call, file, line and LLVM's message. */
#define TJ_TRY_LLVM(call, err)                                                                  \
    do {                                                                                        \
        LLVMErrorRef tj_llvm_e_ = (call);                                                       \
        if (tj_llvm_e_) return llvm_fail((err), tj_llvm_e_, #call, __FILE__, __LINE__);         \
    } while (0)

static tj_status llvm_fail(tj_error *err, LLVMErrorRef e, const char *call, const char *file, int line)
{
    char *msg = LLVMGetErrorMessage(e);
    tj_status s = tj_fail(err, TJ_ERR_COMPILE, "%s:%d: %s: %s", file, line, call, msg ? msg : "(no message)");
    LLVMDisposeErrorMessage(msg);
    return s;
}

/* ---------------------------------------------------------------- JIT */

/* The emitted IR is already explicit vector code: it needs cleanup and loop-invariant code
 * motion, not the whole O2 pipeline. */
#define TJ_CPU_PASSES "function(instcombine,simplifycfg,early-cse)"

struct tj_cpu_jit {
    LLVMOrcLLJITRef jit;
    LLVMTargetMachineRef tm; /* for the optimisation pipeline */
    pthread_mutex_t lock;    /* adding modules and lookups are serialised per JIT */
};

static pthread_once_t llvm_once = PTHREAD_ONCE_INIT;
static int llvm_init_failed;

static void llvm_init(void)
{
    if (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter()) llvm_init_failed = 1;
}

static tj_status make_tm(LLVMTargetMachineRef *out, tj_error *err)
{
    char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
    char *msg = NULL;
    LLVMTargetRef target;
    tj_status s = TJ_OK;
    *out = NULL;
    if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "LLVM has no target for '%s': %s", triple, msg ? msg : "");
    } else {
        *out = LLVMCreateTargetMachine(target, triple, cpu, feat, LLVMCodeGenLevelAggressive, LLVMRelocDefault,
                                       LLVMCodeModelJITDefault);
        if (!*out) s = tj_fail(err, TJ_ERR_UNSUPPORTED, "LLVM cannot create a target machine for %s (%s)", triple, cpu);
    }
    LLVMDisposeMessage(msg);
    LLVMDisposeMessage(triple);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(feat);
    return s;
}

static tj_status jit_create(tj_cpu_jit *j, tj_error *err)
{
    LLVMTargetMachineRef jtm;
    TJ_TRY(make_tm(&j->tm, err));
    TJ_TRY(make_tm(&jtm, err));
    LLVMOrcLLJITBuilderRef b = LLVMOrcCreateLLJITBuilder();
    LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(b, LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(jtm));
    TJ_TRY_LLVM(LLVMOrcCreateLLJIT(&j->jit, b), err); /* takes the builder */
    LLVMOrcDefinitionGeneratorRef gen;
    TJ_TRY_LLVM(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(j->jit), NULL, NULL),
                err);
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(j->jit), gen);
    return TJ_OK;
}

tj_status tj_cpu_jit_create(tj_cpu_jit **out, tj_error *err)
{
    *out = NULL;
    pthread_once(&llvm_once, llvm_init);
    if (llvm_init_failed) return tj_fail(err, TJ_ERR_UNSUPPORTED, "LLVM has no native target in this build");
    tj_cpu_jit *j = calloc(1, sizeof *j);
    if (!j) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_init(&j->lock, NULL);
    tj_status s = jit_create(j, err);
    if (s != TJ_OK) {
        tj_cpu_jit_destroy(j);
        return s;
    }
    *out = j;
    return TJ_OK;
}

void tj_cpu_jit_destroy(tj_cpu_jit *j)
{
    if (!j) return;
    if (j->jit) {
        LLVMErrorRef e = LLVMOrcDisposeLLJIT(j->jit);
        if (e) LLVMConsumeError(e);
    }
    if (j->tm) LLVMDisposeTargetMachine(j->tm);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

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
    const char *passes = getenv("TILEJIT_CPU_PASSES");
    fprintf(f, "; layer %s, config %s\n; passes %s, host %s\n%s", l->name, cj ? cj : "?",
            passes && *passes ? passes : TJ_CPU_PASSES, tj_host_cpu_name(), ir ? ir : "");
    free(cj);
    LLVMDisposeMessage(ir);
    fclose(f);
}

/* Optimises m for the host and hands it to the JIT; looks up (and so compiles) the entries. */
static tj_status jit_add(tj_cpu_jit *j, LLVMOrcThreadSafeContextRef tsc, LLVMModuleRef m, tj_cpu_layer *cl,
                         tj_error *err)
{
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    const char *passes = getenv("TILEJIT_CPU_PASSES"); /* an experiment knob; the IR needs little */
    if (!passes || !*passes) passes = TJ_CPU_PASSES;
    LLVMErrorRef e = LLVMRunPasses(m, passes, j->tm, po);
    LLVMDisposePassBuilderOptions(po);
    if (e) {
        LLVMDisposeModule(m);
        return llvm_fail(err, e, "LLVMRunPasses", __FILE__, __LINE__);
    }
    LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(m, tsc);
    e = LLVMOrcLLJITAddLLVMIRModule(j->jit, LLVMOrcLLJITGetMainJITDylib(j->jit), tsm);
    if (e) {
        LLVMOrcDisposeThreadSafeModule(tsm);
        return llvm_fail(err, e, "LLVMOrcLLJITAddLLVMIRModule", __FILE__, __LINE__);
    }
    LLVMOrcExecutorAddress a = 0;
    TJ_TRY_LLVM(LLVMOrcLLJITLookup(j->jit, &a, cl->info.item_name), err);
    cl->item = (tj_cpu_item_fn)(uintptr_t)a;
    cl->post = NULL;
    if (cl->info.post_name[0]) {
        TJ_TRY_LLVM(LLVMOrcLLJITLookup(j->jit, &a, cl->info.post_name), err);
        cl->post = (tj_cpu_post_fn)(uintptr_t)a;
    }
    return TJ_OK;
}

/* ---------------------------------------------------------------- layers */

int tj_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void tj_cpu_layer_free(tj_cpu_layer *cl)
{
    if (!cl) return;
    tj_plan_free(&cl->plan);
    free(cl->wp);
    free(cl->bk);
    free(cl->bias);
    free(cl->ewv);
    free(cl);
}

static tj_status pack(tj_cpu_layer *cl, const tj_layer_weights *w, tj_error *err)
{
    const tj_layer *l = cl->l;
    size_t wbytes = ((size_t)(cl->plan.packed_elems + cl->cfg.vec) * sizeof(float) + 63) & ~(size_t)63;
    cl->wp = aligned_alloc(64, wbytes);
    cl->bk = calloc((size_t)cl->info.bk_elems + 1, sizeof(float));
    cl->ewv = malloc((size_t)(l->ew_nnz + 1) * sizeof(float));
    if (w->bias) cl->bias = malloc((size_t)l->n * sizeof(float));
    if (!cl->wp || !cl->bk || !cl->ewv || (w->bias && !cl->bias))
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory packing weights", l->name);
    tj_plan_pack_f32(&cl->plan, w->w, w->wdt, cl->wp);
    memset(cl->wp + cl->plan.packed_elems, 0, wbytes - (size_t)cl->plan.packed_elems * sizeof(float));
    if (w->bias) {
        tj_convert_to_f32(w->bias, w->bdt, l->n, cl->bias);
        for (int64_t j = 0; j < l->ncols; j++) cl->bk[j] = cl->bias[tj_layer_col(l, j)];
    }
    for (int64_t n = 0; n < l->n && l->ew_nnz; n++)
        for (int64_t e = l->ew_indptr[n]; e < l->ew_indptr[n + 1]; e++)
            cl->ewv[e] = tj_load_f32(w->w, w->wdt, n * l->k + l->ew_indices[e]);
    return TJ_OK;
}

tj_status tj_cpu_layer_build(tj_cpu_jit *jit, const tj_layer *l, const tj_layer_weights *w, const tj_cpu_config *cfg,
                             const char *prefix, tj_cpu_layer **out, tj_error *err)
{
    *out = NULL;
    tj_cpu_layer *cl = calloc(1, sizeof *cl);
    if (!cl) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    cl->l = l;
    cl->cfg = cfg ? *cfg : tj_cpu_config_default();
    tj_cpu_config_resolve(&cl->cfg, l);
    cl->mb = tj_cpu_config_mb(&cl->cfg);
    tj_status s = tj_cpu_config_check(&cl->cfg, err);
    if (s == TJ_OK) s = tj_plan_build(l, cl->cfg.vec, &cl->plan, err);
    if (s != TJ_OK) goto fail;

    double t0 = tj_now();
    LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
    LLVMModuleRef mod = NULL;
    s = tj_cpu_emit_module(LLVMOrcThreadSafeContextGetContext(tsc), l, &cl->plan, &cl->cfg, prefix, &mod, &cl->info, err);
    double t1 = tj_now();
    cl->emit_seconds = t1 - t0;
    if (s == TJ_OK) dump_ir(mod, l, &cl->cfg, prefix);
    if (s == TJ_OK) {
        pthread_mutex_lock(&jit->lock);
        s = jit_add(jit, tsc, mod, cl, err);
        pthread_mutex_unlock(&jit->lock);
    }
    LLVMOrcDisposeThreadSafeContext(tsc); /* the module keeps its own reference */
    cl->compile_seconds = tj_now() - t1;
    if (s != TJ_OK) goto fail;
    t0 = tj_now();
    s = pack(cl, w, err);
    cl->pack_seconds = tj_now() - t0;
    if (s != TJ_OK) goto fail;
    *out = cl;
    return TJ_OK;
fail:
    tj_cpu_layer_free(cl);
    return s;
}

typedef struct run_args {
    const tj_cpu_layer *cl;
    const float *x;
    float *y;
    int64_t m, nchunks, chunk;
} run_args;

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
    int64_t ntiles = a->cl->l->ntiles;
    int64_t slot = a->cl->cfg.order ? spread_slot(i % ntiles, ntiles) : i / a->nchunks,
            c = a->cl->cfg.order ? i / ntiles : i % a->nchunks;
    int64_t m0 = c * a->chunk, m1 = m0 + a->chunk < a->m ? m0 + a->chunk : a->m;
    a->cl->item(a->x, a->y, a->cl->wp, a->cl->bk, slot, m0, m1);
}

static void run_post(void *vp, int64_t i)
{
    const run_args *a = vp;
    int64_t m0 = i * a->chunk, m1 = m0 + a->chunk < a->m ? m0 + a->chunk : a->m;
    a->cl->post(a->x, a->y, a->cl->ewv, a->cl->bias, m0, m1);
}

void tj_cpu_layer_run(const tj_cpu_layer *cl, tj_pool *pool, int threads, const float *x, int64_t m, float *y)
{
    if (m <= 0) return;
    run_args a = {cl, x, y, m, 0, cl->mb};
    a.nchunks = (m + a.chunk - 1) / a.chunk;
    tj_pool_run(pool, threads, cl->l->ntiles * a.nchunks, run_item, &a);
    if (cl->post) {
        a.chunk = 16;
        tj_pool_run(pool, threads, (m + a.chunk - 1) / a.chunk, run_post, &a);
    }
}

/* ---------------------------------------------------------------- context state and ops */

typedef struct cpu_ctx {
    tj_pool *pool;
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
            int t = c->opt.threads > 0 ? c->opt.threads : tj_cpu_count();
            s = tj_pool_create(t, &cc->pool, err);
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
    if (!c || !c->cpu) return;
    cpu_ctx *cc = c->cpu;
    tj_pool_destroy(cc->pool);
    free(cc);
    c->cpu = NULL;
}

typedef struct cpu_model {
    tj_cpu_jit *jit;
    tj_pool *pool;
    int64_t nlayers;
    tj_cpu_layer **layers;
} cpu_model;

static tj_status cpu_available(tj_context *c, tj_error *err)
{
    (void)c;
    pthread_once(&llvm_once, llvm_init);
    if (llvm_init_failed) return tj_fail(err, TJ_ERR_UNSUPPORTED, "LLVM has no native target for this host");
    return TJ_OK;
}

static void cpu_unload(tj_model *m)
{
    cpu_model *cm = m->state;
    if (!cm) return;
    for (int64_t i = 0; i < cm->nlayers; i++) tj_cpu_layer_free(cm->layers[i]);
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
    double emit = 0, compile = 0;
    for (int64_t i = 0; i < n; i++) {
        const tj_layer *l = &m->pattern->layers[i];
        const char *json = tj_context_config_for(m->ctx, "cpu", tj_host_cpu_name(), "x86_64", l, 0);
        tj_cpu_config cfg;
        TJ_TRY(tj_cpu_config_from_json(json, &cfg, err));
        char prefix[32];
        snprintf(prefix, sizeof prefix, "tjl%lld", (long long)i);
        TJ_TRY(tj_cpu_layer_build(cm->jit, l, &m->lw[i], &cfg, prefix, &cm->layers[i], err));
        cm->nlayers = i + 1;
        emit += cm->layers[i]->emit_seconds;
        compile += cm->layers[i]->compile_seconds;
    }
    tj_context_note(m->ctx, "cpu: %lld layers for %s: emit %.3f s, optimise+JIT %.3f s", (long long)n,
                    tj_host_cpu_name(), emit, compile);
    return TJ_OK;
}

static tj_status cpu_linear(tj_model *m, int64_t layer, const tj_linear_args *a, tj_error *err)
{
    cpu_model *cm = m->state;
    if (!cm || layer < 0 || layer >= cm->nlayers)
        return tj_fail(err, TJ_ERR_INTERNAL, "cpu backend: layer %lld not loaded", (long long)layer);
    tj_cpu_layer_run(cm->layers[layer], cm->pool, 0, a->x32, a->m, a->y32);
    return TJ_OK;
}

const tj_backend_ops tj_backend_cpu_ops = {
    .name = "cpu",
    .kind = TJ_BACKEND_CPU,
    .host_f32 = 1,
    .available = cpu_available,
    .load = cpu_load,
    .linear = cpu_linear,
    .unload = cpu_unload,
};
