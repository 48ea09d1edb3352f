/* The C interface between a kernel module built by the host executor (templates/host/cuda_host.h
 * compiled with the generated CUDA source) and the executor itself (tests/gpuexec/): built-in
 * variables, the memory-access hooks and one entry per PTX instruction the templates use.
 * Plain C, included by both sides; docs/gpu-executor.md describes the whole. */
#ifndef TJ_HX_API_H
#define TJ_HX_API_H

#include <stddef.h>

#define TJ_HX_API_VERSION 2
/* Dynamic shared memory a module provides: 227 KiB, sm_90's opt-in maximum per block. */
#define TJ_HX_SMEM_CAPACITY 232448

typedef struct tj_hx_dim3 {
    unsigned x, y, z;
} tj_hx_dim3;

/* threadIdx, blockIdx, blockDim, gridDim: one instance in the module, rewritten by the executor
 * before it resumes a thread (only one thread runs at a time). */
typedef struct tj_hx_builtins {
    tj_hx_dim3 thread_idx, block_idx, block_dim, grid_dim;
} tj_hx_builtins;

/* Kinds of an instrumented memory access. */
enum { TJ_HX_READ = 1, TJ_HX_WRITE = 2 };

/* Every entry takes the executor's state first and, where the executor may report or must
 * identify the instruction, the return address inside the kernel (`pc`): equal pcs are the same
 * instruction (the .aligned rule), and reports name the source line of the pc. */
typedef struct tj_hx_api {
    int version; /* TJ_HX_API_VERSION */
    void *ctx;
    /* a plain load or store of `size` bytes by kernel code */
    void (*access)(void *ctx, const void *addr, size_t size, int kind, const void *pc);
    /* memcpy / memmove / memset emitted by the host compiler for kernel code: checks, then does it */
    void (*copy)(void *ctx, void *dst, const void *src, size_t n, const void *pc);
    void (*fill)(void *ctx, void *dst, int c, size_t n, const void *pc);

    /* bar.sync 0 (__syncthreads) */
    void (*bar_sync)(void *ctx, const void *pc);
    /* cvta.to.shared.u64 + cvt.u32.u64: a generic pointer into the shared window */
    unsigned (*cvta_to_shared)(void *ctx, const void *p, const void *pc);
    /* cp.async.{ca,cg}.shared.global [dst], [src], cp_size, src_size */
    void (*cp_async)(void *ctx, unsigned dst, const void *src, int cp_size, int src_size, const void *pc);
    void (*cp_async_commit_group)(void *ctx, const void *pc);
    void (*cp_async_wait_group)(void *ctx, int n, const void *pc);
    /* ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16: num matrices into r[0 .. num) */
    void (*ldmatrix)(void *ctx, unsigned *r, int num, int trans, unsigned addr, const void *pc);
    /* mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 d, a, b, c (d = c in place) */
    void (*mma_m16n8k16)(void *ctx, float d[4], const unsigned a[4], const unsigned b[2], int bf16, const void *pc);

    /* Hopper (sm_90a): mbarrier.init.shared::cta.b64 [bar], count */
    void (*mbarrier_init)(void *ctx, unsigned bar, unsigned count, const void *pc);
    /* mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], tx (tx 0: a plain arrive) */
    void (*mbarrier_arrive_expect_tx)(void *ctx, unsigned bar, unsigned tx, const void *pc);
    /* mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity: 1 once the phase of that parity
     * has completed (the executor blocks the thread until then instead of returning 0) */
    int (*mbarrier_try_wait_parity)(void *ctx, unsigned bar, unsigned parity, const void *pc);
    /* cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size, [bar] */
    void (*cp_async_bulk)(void *ctx, unsigned dst, const void *src, unsigned size, unsigned bar, const void *pc);
    /* fence.proxy.async.shared::cta */
    void (*fence_proxy_async)(void *ctx, const void *pc);
    /* wgmma.fence / commit_group / wait_group n (.sync.aligned over the 128 threads of a warpgroup) */
    void (*wgmma_fence)(void *ctx, const void *pc);
    void (*wgmma_commit_group)(void *ctx, const void *pc);
    void (*wgmma_wait_group)(void *ctx, int n, const void *pc);
    /* wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} d, desc_a, desc_b, scale_d,
     * 1, 1, trans_a, trans_b: d[n / 2] accumulators per thread */
    void (*wgmma_mma_async)(void *ctx, float *d, int n, unsigned long long desc_a, unsigned long long desc_b, int scale_d,
                            int bf16, int trans_a, int trans_b, const void *pc);

    /* conversions (pure) */
    float (*cvt_f32_f16)(unsigned short h);
    unsigned short (*cvt_rn_f16_f32)(float f);
    unsigned short (*cvt_rn_bf16_f32)(float f);
    /* cvt.rn.{f16x2,bf16x2}.f32 d, a, b: a to the upper half of d, b to the lower */
    unsigned (*cvt_rn_f16x2_f32)(float a, float b);
    unsigned (*cvt_rn_bf16x2_f32)(float a, float b);
} tj_hx_api;

#endif
