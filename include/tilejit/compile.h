/* tilejit/compile.h — ahead-of-time compilation: every layer's CUDA kernels of a pattern,
 * generated and compiled with NVRTC for named archs (sm_80, sm_90, ...) into the kernel cache,
 * in parallel. Needs no GPU: a later tj_model_load on a GPU of that arch finds them cached. */
#include "tilejit.h"
#ifndef TILEJIT_COMPILE_H
#define TILEJIT_COMPILE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tj_compile_options {
    size_t size;              /* sizeof(tj_compile_options); set by tj_compile_options_default */
    const int *archs;         /* real archs as compute capability × 10 (90 = sm_90) */
    int narchs;               /* 0: sm_90 */
    const char *layer;        /* NULL: every layer; else only this one */
    const char *config_json;  /* a config over each layer's default (tilejit/gen.h), or NULL */
    int threads;              /* parallel compiles; 0: one per core */
    const char *cache_dir;    /* NULL: the default cache directory (see tj_cache_default_dir) */
} tj_compile_options;

TJ_API tj_compile_options tj_compile_options_default(void);

typedef enum tj_cache_use {
    TJ_CACHE_USE_MISS = 0,    /* compiled and stored */
    TJ_CACHE_USE_HIT,         /* found in the cache */
    TJ_CACHE_USE_REBUILT,     /* a damaged entry was replaced */
    TJ_CACHE_USE_OFF          /* no usable cache directory */
} tj_cache_use;

/* An arch-specific target: sm_90a is 90 | TJ_ARCH_SPECIFIC. Code built for it uses features of
 * that exact arch (wgmma on 9.0) and runs only there. */
#define TJ_ARCH_SPECIFIC 0x10000

/* One (layer, arch) kernel module. */
typedef struct tj_compiled {
    const char *layer;        /* borrowed from the pattern */
    int64_t n, k;
    int sm;                   /* the target compiled for: 90, or 90 | TJ_ARCH_SPECIFIC (sm_90a) */
    tj_status status;         /* TJ_OK, or why it failed (message in error) */
    const char *error;        /* NVRTC's log on failure; "" otherwise */
    double seconds;           /* compile (or cache lookup) wall time */
    tj_cache_use cache;
    int registers;            /* of the main kernel tj_tiles; -1 unknown */
    int64_t smem_static;      /* its static shared memory, bytes; -1 unknown */
    int64_t smem_dynamic;     /* the dynamic shared memory it launches with */
    int64_t spill_bytes;      /* spill stores + loads over every function */
} tj_compiled;

typedef struct tj_compile_report {
    int64_t count;            /* kernels: layers × archs */
    tj_compiled *kernels;     /* layer-major, archs in the order given */
    int64_t layers;
    double wall_s, gen_s;     /* whole call, and the part generating source */
    char *warnings;           /* cache warnings ("" when none), e.g. a cache that cannot be used */
} tj_compile_report;

/* Compiles p's kernels. Returns TJ_OK when every kernel compiled; when some failed, the report
 * (always filled once generation succeeded) says which, and err holds the first failure. A
 * config that needs more shared memory than an arch allows fails before compiling. Without the
 * CUDA toolkit in the build: TJ_ERR_UNSUPPORTED. Free *out with tj_compile_report_destroy. */
TJ_API tj_status tj_compile_pattern(const tj_pattern *p, const tj_compile_options *o, tj_compile_report **out,
                                    tj_error *err);
TJ_API void tj_compile_report_destroy(tj_compile_report *r);
/* Parses "sm_90" or a comma-separated list "sm_80,sm_90a" into archs (at most max); returns the
 * count, or -1 when the text is not such a list. An "a" suffix (sm_90 and later) is the
 * arch-specific target, TJ_ARCH_SPECIFIC set: the target the wgmma kernels need; the other
 * kernels compile for it too. Without it, a wgmma config still compiles for sm_90a. */
TJ_API int tj_arch_parse(const char *text, int *archs, int max);
/* The kernel cache directory used when none is given: $TILEJIT_CACHE_DIR, else
 * $XDG_CACHE_HOME/tilejit, else ~/.cache/tilejit; NULL when none can be named. malloc'ed. */
TJ_API char *tj_cache_default_dir(void);

#ifdef __cplusplus
}
#endif
#endif
