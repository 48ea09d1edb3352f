/* tilejit/gen.h — source generation for one layer under one config: the CUDA C that NVRTC
 * compiles (kernel ABI in docs/kernels.md) or the LLVM IR module the CPU backend JIT-compiles.
 * The same layer and config always give byte-identical text. */
#include "tilejit.h"
#ifndef TILEJIT_GEN_H
#define TILEJIT_GEN_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tj_target {
    TJ_TARGET_CUDA = 0, /* CUDA C for NVRTC */
    TJ_TARGET_CPU = 1   /* LLVM IR for the host CPU (needs a build with LLVM) */
} tj_target;

/* The source of layer l for target under config_json (a config object as JSON text; keys not
 * given keep the layer's defaults; NULL: all defaults). *out is malloc'ed. CUDA keys: template
 * (tj_gen_cuda_template: "simt"|"mma"|"wgmma"), bm, bn, bk, warps, stages, offsets ("table"|"unrolled"), dtype ("f16"|"bf16"),
 * out ("f32"|"f16"|"bf16"), layout ("fm"|"rm"|"rm_fm"|"fm_rm"). CPU keys: mr, nr, offsets,
 * unroll, mb, kc, pack, order (docs/kernels.md), serial, weights, dtype ("f32"|"bf16"), out,
 * dot ("auto"|"fma"|"dpbf16") (docs/cpu-baselines-cache-dispatch.md). */
TJ_API tj_status tj_gen_source(const tj_layer *l, tj_target target, const char *config_json, char **out,
                               tj_error *err);
/* The CUDA templates, i = 0, 1, ...: the name a config's "template" takes, and (what, may be
 * NULL) one line on what it is and which archs it needs; NULL past the last. Borrowed, static. */
TJ_API const char *tj_gen_cuda_template(int i, const char **what);
/* The canonical JSON of the config tj_gen_source would use for l under config_json (defaults
 * filled in), malloc'ed in *out. */
TJ_API tj_status tj_gen_config(const tj_layer *l, tj_target target, const char *config_json, char **out,
                               tj_error *err);

#ifdef __cplusplus
}
#endif
#endif
