/* The host JIT (see cpu_jit.h): LLVM's optimiser and code generator to an in-memory object,
 * then ORC LLJIT links objects into the process. Every LLVM call that can fail goes through
 * TJ_TRY_LLVM, which keeps the call, file, line and LLVM's message. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "jit/cpu_jit.h"

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

struct tj_cpu_jit {
    LLVMOrcLLJITRef jit;
    LLVMTargetMachineRef tm; /* optimisation and object emission (position independent, small code model) */
    pthread_mutex_t lock;    /* compiling, adding objects and lookups are serialised per JIT */
    tj_cache *cache;
    unsigned long nobj;
};

static pthread_once_t llvm_once = PTHREAD_ONCE_INIT;
static int llvm_init_failed;

static void llvm_init(void)
{
    if (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter()) llvm_init_failed = 1;
}

/* Objects are linked by JITLink at addresses unknown when they were compiled, and maybe by
 * another process (the cache): PIC and the small code model, so calls and data go through
 * PC-relative references and the GOT JITLink builds. */
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
        *out = LLVMCreateTargetMachine(target, triple, cpu, feat, LLVMCodeGenLevelAggressive, LLVMRelocPIC,
                                       LLVMCodeModelSmall);
        if (!*out) s = tj_fail(err, TJ_ERR_UNSUPPORTED, "LLVM cannot create a target machine for %s (%s)", triple, cpu);
    }
    LLVMDisposeMessage(msg);
    LLVMDisposeMessage(triple);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(feat);
    return s;
}

void tj_cpu_jit_key_host(tj_cache_key *k)
{
    unsigned maj = 0, min = 0, pat = 0;
    LLVMGetVersion(&maj, &min, &pat);
    char buf[64];
    snprintf(buf, sizeof buf, "llvm %u.%u.%u pic small O3", maj, min, pat);
    tj_cache_key_add_str(k, buf);
    char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *feat = LLVMGetHostCPUFeatures();
    tj_cache_key_add_str(k, triple);
    tj_cache_key_add_str(k, cpu);
    tj_cache_key_add_str(k, feat);
    LLVMDisposeMessage(triple);
    LLVMDisposeMessage(cpu);
    LLVMDisposeMessage(feat);
    tj_cache_key_add_str(k, tj_cpu_jit_passes());
}

const char *tj_cpu_jit_passes(void)
{
    const char *p = getenv("TILEJIT_CPU_PASSES");
    return p && *p ? p : TJ_CPU_PASSES;
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

tj_status tj_cpu_jit_available(tj_error *err)
{
    pthread_once(&llvm_once, llvm_init);
    if (llvm_init_failed) return tj_fail(err, TJ_ERR_UNSUPPORTED, "LLVM has no native target in this build");
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

void tj_cpu_jit_set_cache(tj_cpu_jit *j, tj_cache *cache) { j->cache = cache; }
tj_cache *tj_cpu_jit_cache(const tj_cpu_jit *j) { return j ? j->cache : NULL; }

tj_status tj_cpu_jit_compile(tj_cpu_jit *j, LLVMModuleRef m, void **obj, size_t *len, tj_error *err)
{
    *obj = NULL;
    *len = 0;
    tj_status s = TJ_OK;
    LLVMMemoryBufferRef buf = NULL;
    char *msg = NULL;
    pthread_mutex_lock(&j->lock);
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMErrorRef e = LLVMRunPasses(m, tj_cpu_jit_passes(), j->tm, po);
    LLVMDisposePassBuilderOptions(po);
    if (e) {
        s = llvm_fail(err, e, "LLVMRunPasses", __FILE__, __LINE__);
    } else if (LLVMTargetMachineEmitToMemoryBuffer(j->tm, m, LLVMObjectFile, &msg, &buf)) {
        s = tj_fail(err, TJ_ERR_COMPILE, "%s:%d: LLVMTargetMachineEmitToMemoryBuffer: %s", __FILE__, __LINE__,
                    msg ? msg : "(no message)");
    }
    pthread_mutex_unlock(&j->lock);
    LLVMDisposeMessage(msg);
    LLVMDisposeModule(m);
    if (s != TJ_OK) return s;
    size_t n = LLVMGetBufferSize(buf);
    *obj = malloc(n ? n : 1);
    if (!*obj) {
        LLVMDisposeMemoryBuffer(buf);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory copying a compiled object (%zu bytes)", n);
    }
    memcpy(*obj, LLVMGetBufferStart(buf), n);
    *len = n;
    LLVMDisposeMemoryBuffer(buf);
    return TJ_OK;
}

static tj_status add_locked(tj_cpu_jit *j, const void *obj, size_t len, const char *const *names, int nnames,
                            void **addrs, tj_error *err)
{
    char label[64];
    snprintf(label, sizeof label, "tilejit-object-%lu", ++j->nobj);
    LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRangeCopy(obj, len, label);
    if (!mb) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory adding an object to the JIT");
    /* takes the buffer, also on failure */
    TJ_TRY_LLVM(LLVMOrcLLJITAddObjectFile(j->jit, LLVMOrcLLJITGetMainJITDylib(j->jit), mb), err);
    for (int i = 0; i < nnames; i++) {
        LLVMOrcExecutorAddress a = 0;
        TJ_TRY_LLVM(LLVMOrcLLJITLookup(j->jit, &a, names[i]), err);
        addrs[i] = (void *)(uintptr_t)a;
    }
    return TJ_OK;
}

tj_status tj_cpu_jit_add_object(tj_cpu_jit *j, const void *obj, size_t len, const char *const *names, int nnames,
                                void **addrs, tj_error *err)
{
    pthread_mutex_lock(&j->lock);
    tj_status s = add_locked(j, obj, len, names, nnames, addrs, err);
    pthread_mutex_unlock(&j->lock);
    return s;
}
