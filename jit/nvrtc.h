/* NVRTC → CUBIN for one real sm_XX, through the kernel cache; layers compiled in parallel.
 * Sits after gen/emit_cuda.c (source) and before the CUDA backend (cuModuleLoadData). */
#ifndef TJ_NVRTC_H
#define TJ_NVRTC_H

#include <stddef.h>
#include <stdint.h>

#include "jit/cache.h"
#include "base/error.h"

/* Resources of one kernel, from ptxas's -v report. */
typedef struct tj_kernel_resources {
    char name[64];
    int registers;
    int64_t smem_static;  /* bytes of static shared memory (dynamic comes from the launch) */
    int64_t stack;        /* bytes of stack frame */
    int64_t spill_stores; /* bytes */
    int64_t spill_loads;
} tj_kernel_resources;

#define TJ_MAX_KERNELS 8

/* A compiled module. */
typedef struct tj_cubin {
    void *data;          /* CUBIN image (malloc'ed) */
    size_t size;
    char *log;           /* NVRTC's log (ptxas -v report), malloc'ed, may be "" */
    tj_kernel_resources kernels[TJ_MAX_KERNELS]; /* entry functions, in log order */
    int nkernels;
    int64_t spill_bytes; /* spill stores + loads over every function, noinline ones included */
    double seconds;      /* wall time of this compile (lookup included) */
    tj_cache_result cache; /* HIT, MISS, DISCARDED (rebuilt) or DISABLED */
} tj_cubin;

void tj_cubin_free(tj_cubin *b);

/* NVRTC's version, e.g. 13.0. */
tj_status tj_nvrtc_version(int *major, int *minor, tj_error *err);
/* The CUDA include directory found at run time ($CUDA_HOME/include, else the build's
 * TJ_CUDA_HOME/include), or NULL when neither exists. Static string. */
const char *tj_cuda_include_dir(void);

/* The NVRTC options used for `sm` (e.g. 90), written into opts; returns their count. They are
 * part of the cache key. */
#define TJ_NVRTC_MAX_OPTS 8
int tj_nvrtc_options(int sm, char opts[TJ_NVRTC_MAX_OPTS][512]);

/* Compiles `source` for sm_`sm` through cache `cache` (may be NULL). `label` names the unit in
 * messages and dump files (a layer name). On a compile error the message holds NVRTC's full log.
 * With $TILEJIT_DUMP_DIR set, writes <label>.sm_XX.cu, .options and .log there. */
tj_status tj_nvrtc_compile(tj_cache *cache, const char *source, const char *label, int sm, tj_cubin *out,
                           tj_error *err);

/* One unit of a parallel build. */
typedef struct tj_nvrtc_job {
    const char *source;
    const char *label;
    int sm;
    tj_cubin result;   /* out */
    tj_status status;  /* out */
    tj_error error;    /* out */
} tj_nvrtc_job;

/* Compiles every job on up to `threads` threads (0: one per online core). Returns the first
 * failing job's status (every job's own status and error are set). */
tj_status tj_nvrtc_compile_all(tj_cache *cache, tj_nvrtc_job *jobs, int64_t njobs, int threads, tj_error *err);

/* Parses a ptxas -v report into b->kernels / b->spill_bytes. */
void tj_ptxas_parse(const char *log, tj_cubin *b);

#endif
