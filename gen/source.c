/* gen/: the public entry to source generation (tilejit/gen.h): one layer, one config, one
 * target, dispatched to the CUDA emitter (emit_cuda.c) or the LLVM emitter (emit_llvm.c). */
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "gen/emit_cuda.h"
#include "tj_config.h"
#if TJ_HAVE_LLVM
#include "gen/emit_llvm.h"
#endif

static tj_status cuda_config(const tj_layer *l, const char *json, tj_cuda_config *c, tj_error *err)
{
    *c = tj_cuda_config_default(l);
    return json ? tj_cuda_config_from_json(json, c, err) : TJ_OK;
}

tj_status tj_gen_source(const tj_layer *l, tj_target target, const char *config_json, char **out, tj_error *err)
{
    if (!l || !out) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tj_gen_source: NULL layer or output");
    *out = NULL;
    if (target == TJ_TARGET_CUDA) {
        tj_cuda_config c;
        TJ_TRY(cuda_config(l, config_json, &c, err));
        return tj_cuda_emit(l, &c, out, err);
    }
    if (target != TJ_TARGET_CPU) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "unknown target %d", (int)target);
#if TJ_HAVE_LLVM
    return tj_cpu_emit_ir_text(l, config_json, out, err);
#else
    return tj_fail(err, TJ_ERR_UNSUPPORTED, "this build has no LLVM backend (configure with -Dllvm=enabled)");
#endif
}

tj_status tj_gen_config(const tj_layer *l, tj_target target, const char *config_json, char **out, tj_error *err)
{
    if (!l || !out) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tj_gen_config: NULL layer or output");
    *out = NULL;
    if (target == TJ_TARGET_CUDA) {
        tj_cuda_config c;
        TJ_TRY(cuda_config(l, config_json, &c, err));
        tj_strbuf sb;
        tj_sb_init(&sb);
        tj_cuda_config_to_json(&c, &sb);
        *out = tj_sb_take(&sb);
        return *out ? TJ_OK : tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (target != TJ_TARGET_CPU) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "unknown target %d", (int)target);
#if TJ_HAVE_LLVM
    tj_cpu_config c = tj_cpu_config_default();
    if (config_json) TJ_TRY(tj_cpu_config_from_json(config_json, &c, err));
    tj_cpu_config_resolve(&c, l);
    *out = tj_cpu_config_to_json(&c);
    return *out ? TJ_OK : tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
#else
    return tj_fail(err, TJ_ERR_UNSUPPORTED, "this build has no LLVM backend (configure with -Dllvm=enabled)");
#endif
}
