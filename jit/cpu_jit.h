/* jit/ for the host CPU: one ORC LLJIT per model, fed optimised object code. A module is
 * optimised and compiled to an ELF object here (tj_cpu_jit_compile), so the object can be kept
 * in the kernel cache (jit/cache.c) and a later load adds it straight back (tj_cpu_jit_add_object)
 * without LLVM's optimiser or code generator. The emitter (gen/emit_llvm.c) sits below. */
#ifndef TJ_JIT_CPU_JIT_H
#define TJ_JIT_CPU_JIT_H

#include <stddef.h>

#include "base/error.h"
#include "jit/cache.h"

struct LLVMOpaqueModule;

/* The pass pipeline the emitted IR gets ($TILEJIT_CPU_PASSES overrides it: an experiment knob). */
#define TJ_CPU_PASSES "function(instcombine,simplifycfg,early-cse)"

typedef struct tj_cpu_jit tj_cpu_jit;
/* TJ_OK when LLVM has a native target in this build (initialises it once). */
tj_status tj_cpu_jit_available(tj_error *err);
tj_status tj_cpu_jit_create(tj_cpu_jit **out, tj_error *err);
void tj_cpu_jit_destroy(tj_cpu_jit *j);
/* The on-disk cache the layers built on j use (borrowed; NULL: none, the default). */
void tj_cpu_jit_set_cache(tj_cpu_jit *j, tj_cache *cache);
tj_cache *tj_cpu_jit_cache(const tj_cpu_jit *j);

/* Adds what makes the host's object code differ to a cache key: LLVM's version, the target
 * triple, CPU name and features, the pass pipeline, the code and relocation models. */
void tj_cpu_jit_key_host(tj_cache_key *k);
/* The pass pipeline in use (TJ_CPU_PASSES or $TILEJIT_CPU_PASSES); borrowed. */
const char *tj_cpu_jit_passes(void);

/* Optimises m for the host and compiles it to an object file; consumes m. *obj: malloc'ed. */
tj_status tj_cpu_jit_compile(tj_cpu_jit *j, struct LLVMOpaqueModule *m, void **obj, size_t *len, tj_error *err);
/* Adds an object (copied) to the JIT and looks up `nnames` symbols in it (which links it);
 * addrs[i] receives each one. A broken object fails with TJ_ERR_COMPILE. Thread-safe. */
tj_status tj_cpu_jit_add_object(tj_cpu_jit *j, const void *obj, size_t len, const char *const *names, int nnames,
                                void **addrs, tj_error *err);

#endif
