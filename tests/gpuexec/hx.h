/* The host executor: runs the real generated CUDA kernels on the CPU. A module is the exact source
 * NVRTC would compile, built as host C++ against templates/host/cuda_host.h into a shared
 * library (cached by content hash); a launch runs every block of the grid, each block's threads
 * as fibers that meet at every __syncthreads and warp collective, with PTX semantics for every
 * inline-PTX instruction and checks on every memory access (bounds, alignment, shared-memory
 * races, cp.async data read before its wait, uninitialised shared memory). Used by the tests
 * (tests/test_gpuexec*.c); docs/gpu-executor.md describes what it models and what it does not. */
#ifndef TJ_HX_H
#define TJ_HX_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "templates/host/hx_api.h"

/* ---- modules ---- */

typedef struct tj_hx_build_options {
    const char *cxx;       /* C++ compiler (clang++); NULL: $TJ_HX_CXX, else "clang++-19" */
    const char *host_dir;  /* templates/host; NULL: $TJ_HX_HOST_DIR */
    const char *cache_dir; /* where .cu/.so pairs are kept by hash; NULL: $TJ_HX_CACHE_DIR, else /tmp */
} tj_hx_build_options;

typedef struct tj_hx_module tj_hx_module;

/* Builds (or finds in the cache) and loads the module of `source`. The compile log is in err on
 * TJ_ERR_COMPILE. *compiled says whether a compile ran (NULL allowed). */
tj_status tj_hx_module_build(const tj_hx_build_options *o, const char *source, tj_hx_module **out, int *compiled,
                             tj_error *err);
void tj_hx_module_destroy(tj_hx_module *m);
/* A kernel of the module (an extern "C" __global__ function), or NULL. */
void (*tj_hx_module_kernel(const tj_hx_module *m, const char *name))(void);

/* ---- execution ---- */

typedef struct tj_hx_exec tj_hx_exec;

tj_status tj_hx_exec_create(tj_hx_exec **out, tj_error *err);
void tj_hx_exec_destroy(tj_hx_exec *e);

/* Device memory is host memory the caller owns, registered by range: an access by a kernel
 * outside every registered range (and outside its own stack, shared memory and the module's
 * constants) is an out-of-bounds error; a store into a read-only buffer is an error. */
tj_status tj_hx_buffer_add(tj_hx_exec *e, const char *name, const void *p, size_t bytes, int writable, tj_error *err);
void tj_hx_buffers_clear(tj_hx_exec *e);

/* Text files the module's source was made of (the templates), so that reports name
 * "tiles_mma.cu:158" rather than a line of the emitted text. Borrowed until cleared (NULL, 0). */
void tj_hx_exec_set_origins(tj_hx_exec *e, const char *const *names, const char *const *texts, int n);

/* Calls the kernel with its parameters: the caller knows the kernel's C signature, e.g.
 * ((void (*)(tj_cuda_args))kernel)(*(const tj_cuda_args *)params). */
typedef void (*tj_hx_invoke)(void (*kernel)(void), const void *params);

typedef struct tj_hx_launch_stats {
    int64_t blocks, threads, switches, collectives, barriers, accesses;
} tj_hx_launch_stats;

/* Runs `kernel` over the grid, one block after another. TJ_OK when it ran to the end with
 * nothing to report; otherwise TJ_ERR_DEVICE with the first reports in err (each naming the
 * kernel, block, thread and source line) and all of them in tj_hx_exec_report(). A fault (an
 * out-of-bounds or misaligned access, a deadlock, a diverged warp collective) ends the launch
 * at once, as it would on a GPU; races and reads of pending or uninitialised shared memory are
 * reported and the launch goes on. */
tj_status tj_hx_launch(tj_hx_exec *e, tj_hx_module *m, const char *kernel, tj_hx_dim3 grid, tj_hx_dim3 block,
                       unsigned smem_bytes, tj_hx_invoke invoke, const void *params, tj_hx_launch_stats *stats,
                       tj_error *err);
/* Every report of the last launch, one per line ("" when none). Borrowed. */
const char *tj_hx_exec_report(const tj_hx_exec *e);

#endif
