/* CUDA C on the host: force-included (clang++ -include) before the exact source NVRTC compiles,
 * it turns one layer's kernels into a shared library that the host executor (tests/gpuexec/)
 * runs thread by thread. It supplies the CUDA keywords, built-in variables, vector types and
 * intrinsics, and the host twin of every PTX instruction the templates use; the twins and the
 * memory hooks forward to the executor through tj_hx_api (hx_api.h). docs/gpu-executor.md.
 *
 * How the module is built (tests/gpuexec/hx_module.c): -fsanitize=thread without its run-time
 * library, so the compiler calls __tsan_readN / __tsan_writeN before every load and store of
 * kernel code; this header defines those hooks (hidden), which report each access to the
 * executor: that is how shared- and global-memory accesses are bounds-, alignment- and
 * race-checked without touching the templates. Functions here carry TJ_HX_FN (no
 * instrumentation: they are the executor's side). */
#ifndef TJ_CUDA_HOST_H
#define TJ_CUDA_HOST_H

#ifndef __cplusplus
#error "cuda_host.h is C++ (the CUDA templates are)"
#endif

#define TJ_HOST_EXEC 1 /* the templates' switch between inline PTX and its host twin */

#include "hx_api.h" /* and nothing else: libstdc++'s <math.h> alone costs 0.3 s per module */

#define TJ_HX_FN static inline __attribute__((disable_sanitizer_instrumentation))
#define TJ_HX_EXPORT extern "C" __attribute__((visibility("default"), disable_sanitizer_instrumentation))
#define TJ_HX_HOOK extern "C" __attribute__((visibility("hidden"), disable_sanitizer_instrumentation, noinline))
#define TJ_HX_PC __builtin_return_address(0)

/* ---- keywords ---- */
#define __global__ __attribute__((visibility("default"), noinline))
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __constant__ const
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
/* Only `extern __shared__ T name[]` (dynamic shared memory) is supported: the executor links every
 * such name to tj_hx_dynamic_smem (--defsym). A block-scope `__shared__` variable would be an
 * automatic one here, so the section attribute makes it a compile error (-Werror=ignored-attributes). */
#define __shared__ __attribute__((section("tj_hx_shared")))

/* ---- built-in variables (one thread runs at a time; the executor rewrites them) ---- */
struct uint3 {
    unsigned x, y, z;
};
typedef uint3 dim3;
extern "C" tj_hx_builtins tj_hx_bi;
#define threadIdx (*(const uint3 *)&tj_hx_bi.thread_idx)
#define blockIdx (*(const uint3 *)&tj_hx_bi.block_idx)
#define blockDim (*(const dim3 *)&tj_hx_bi.block_dim)
#define gridDim (*(const dim3 *)&tj_hx_bi.grid_dim)
static const int warpSize = 32;

/* ---- vector types: as on the GPU, a vN of size S is S-byte aligned and moves in one access ---- */
typedef float float2 __attribute__((ext_vector_type(2)));
typedef float float4 __attribute__((ext_vector_type(4)));
typedef int int2 __attribute__((ext_vector_type(2)));
typedef int int4 __attribute__((ext_vector_type(4)));
typedef unsigned uint2 __attribute__((ext_vector_type(2)));
typedef unsigned uint4 __attribute__((ext_vector_type(4)));
static inline float2 make_float2(float a, float b) { return float2{a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline int2 make_int2(int a, int b) { return int2{a, b}; }
static inline int4 make_int4(int a, int b, int c, int d) { return int4{a, b, c, d}; }
static inline uint2 make_uint2(unsigned a, unsigned b) { return uint2{a, b}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }

/* ---- intrinsics and the math the templates call (host libm: glibc's erff is within 1 ulp,
 * CUDA's within 2; fmaf is the exact fused operation on both) ---- */
static inline float __uint_as_float(unsigned u) { return __builtin_bit_cast(float, u); }
static inline unsigned __float_as_uint(float f) { return __builtin_bit_cast(unsigned, f); }
extern "C" float erff(float);
extern "C" float fmaf(float, float, float);
extern "C" float expf(float);
extern "C" float tanhf(float);
extern "C" float sqrtf(float);
static inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
static inline int __float_as_int(float f) { return (int)__float_as_uint(f); }

/* ---- the executor's entry points, bound when the module is loaded ---- */
static const tj_hx_api *tj_hx;
tj_hx_builtins tj_hx_bi;
/* Dynamic shared memory (every `extern __shared__` array is an alias of it). 16-byte aligned as
 * on the GPU; 128 here so that an address's alignment modulo 128 is the same as there. */
extern "C" __attribute__((visibility("default"), aligned(128))) unsigned char tj_hx_dynamic_smem[TJ_HX_SMEM_CAPACITY];
unsigned char tj_hx_dynamic_smem[TJ_HX_SMEM_CAPACITY];

TJ_HX_EXPORT int tj_hx_module_bind(const tj_hx_api *api)
{
    if (!api || api->version != TJ_HX_API_VERSION) return -1;
    tj_hx = api;
    return TJ_HX_API_VERSION;
}

/* ---- synchronisation ---- */
TJ_HX_HOOK void __syncthreads(void) { tj_hx->bar_sync(tj_hx->ctx, TJ_HX_PC); }

/* ---- PTX twins: one per instruction, same operands in the same order (see each template's
 * #ifdef TJ_HOST_EXEC). The semantics live in tests/gpuexec/hx_ptx.c. ---- */
TJ_HX_FN float tj_hx_cvt_f32_f16(unsigned short h) { return tj_hx->cvt_f32_f16(h); }
TJ_HX_FN unsigned short tj_hx_cvt_rn_f16_f32(float f) { return tj_hx->cvt_rn_f16_f32(f); }
TJ_HX_FN unsigned short tj_hx_cvt_rn_bf16_f32(float f) { return tj_hx->cvt_rn_bf16_f32(f); }
TJ_HX_FN unsigned tj_hx_cvt_rn_f16x2_f32(float a, float b) { return tj_hx->cvt_rn_f16x2_f32(a, b); }
TJ_HX_FN unsigned tj_hx_cvt_rn_bf16x2_f32(float a, float b) { return tj_hx->cvt_rn_bf16x2_f32(a, b); }

TJ_HX_HOOK unsigned tj_hx_cvta_to_shared(const void *p) { return tj_hx->cvta_to_shared(tj_hx->ctx, p, TJ_HX_PC); }
TJ_HX_HOOK void tj_hx_cp_async_cg_16(unsigned dst, const void *src, int src_size)
{
    tj_hx->cp_async(tj_hx->ctx, dst, src, 16, src_size, TJ_HX_PC);
}
TJ_HX_HOOK void tj_hx_cp_async_ca(unsigned dst, const void *src, int cp_size, int src_size)
{
    tj_hx->cp_async(tj_hx->ctx, dst, src, cp_size, src_size, TJ_HX_PC);
}
TJ_HX_HOOK void tj_hx_cp_async_commit_group(void) { tj_hx->cp_async_commit_group(tj_hx->ctx, TJ_HX_PC); }
TJ_HX_HOOK void tj_hx_cp_async_wait_group(int n) { tj_hx->cp_async_wait_group(tj_hx->ctx, n, TJ_HX_PC); }
TJ_HX_HOOK void tj_hx_ldmatrix_x4_trans(unsigned r[4], unsigned addr)
{
    tj_hx->ldmatrix(tj_hx->ctx, r, 4, 1, addr, TJ_HX_PC);
}
TJ_HX_HOOK void tj_hx_ldmatrix_x4(unsigned r[4], unsigned addr) { tj_hx->ldmatrix(tj_hx->ctx, r, 4, 0, addr, TJ_HX_PC); }
TJ_HX_HOOK void tj_hx_mma_m16n8k16_f32_f16(float d[4], const unsigned a[4], const unsigned b[2])
{
    tj_hx->mma_m16n8k16(tj_hx->ctx, d, a, b, 0, TJ_HX_PC);
}
TJ_HX_HOOK void tj_hx_mma_m16n8k16_f32_bf16(float d[4], const unsigned a[4], const unsigned b[2])
{
    tj_hx->mma_m16n8k16(tj_hx->ctx, d, a, b, 1, TJ_HX_PC);
}

/* Hopper: mbarrier, bulk copies, the async-proxy fence and wgmma (templates/hopper.cu) */
TJ_HX_HOOK void tj_hx_mbarrier_init(unsigned bar, unsigned count) { tj_hx->mbarrier_init(tj_hx->ctx, bar, count, TJ_HX_PC); }
TJ_HX_HOOK void tj_hx_mbarrier_arrive_expect_tx(unsigned bar, unsigned tx)
{
    tj_hx->mbarrier_arrive_expect_tx(tj_hx->ctx, bar, tx, TJ_HX_PC);
}
TJ_HX_HOOK unsigned tj_hx_mbarrier_try_wait_parity(unsigned bar, unsigned parity)
{
    return (unsigned)tj_hx->mbarrier_try_wait_parity(tj_hx->ctx, bar, parity, TJ_HX_PC);
}
TJ_HX_HOOK void tj_hx_cp_async_bulk(unsigned dst, const void *src, unsigned size, unsigned bar)
{
    tj_hx->cp_async_bulk(tj_hx->ctx, dst, src, size, bar, TJ_HX_PC);
}
TJ_HX_HOOK void tj_hx_fence_proxy_async(void) { tj_hx->fence_proxy_async(tj_hx->ctx, TJ_HX_PC); }
TJ_HX_HOOK void tj_hx_wgmma_fence(void) { tj_hx->wgmma_fence(tj_hx->ctx, TJ_HX_PC); }
TJ_HX_HOOK void tj_hx_wgmma_commit_group(void) { tj_hx->wgmma_commit_group(tj_hx->ctx, TJ_HX_PC); }
TJ_HX_HOOK void tj_hx_wgmma_wait_group(int n) { tj_hx->wgmma_wait_group(tj_hx->ctx, n, TJ_HX_PC); }
TJ_HX_HOOK void tj_hx_wgmma_mma_async(float *d, int n, unsigned long long desc_a, unsigned long long desc_b, int scale_d,
                                      int bf16, int trans_a, int trans_b)
{
    tj_hx->wgmma_mma_async(tj_hx->ctx, d, n, desc_a, desc_b, scale_d, bf16, trans_a, trans_b, TJ_HX_PC);
}

/* ---- the instrumentation hooks (ThreadSanitizer's ABI, our meaning) ---- */
#define TJ_HX_ACCESS(name, n, kind) \
    TJ_HX_HOOK void name(void *p) { tj_hx->access(tj_hx->ctx, p, n, kind, TJ_HX_PC); }
#define TJ_HX_ACCESS_ALL(n)                                                  \
    TJ_HX_ACCESS(__tsan_read##n, n, TJ_HX_READ)                              \
    TJ_HX_ACCESS(__tsan_write##n, n, TJ_HX_WRITE)                            \
    TJ_HX_ACCESS(__tsan_unaligned_read##n, n, TJ_HX_READ)                    \
    TJ_HX_ACCESS(__tsan_unaligned_write##n, n, TJ_HX_WRITE)                  \
    TJ_HX_ACCESS(__tsan_volatile_read##n, n, TJ_HX_READ)                     \
    TJ_HX_ACCESS(__tsan_volatile_write##n, n, TJ_HX_WRITE)                   \
    TJ_HX_ACCESS(__tsan_unaligned_volatile_read##n, n, TJ_HX_READ)           \
    TJ_HX_ACCESS(__tsan_unaligned_volatile_write##n, n, TJ_HX_WRITE)
TJ_HX_ACCESS_ALL(1)
TJ_HX_ACCESS_ALL(2)
TJ_HX_ACCESS_ALL(4)
TJ_HX_ACCESS_ALL(8)
TJ_HX_ACCESS_ALL(16)
TJ_HX_HOOK void __tsan_read_range(void *p, size_t n) { tj_hx->access(tj_hx->ctx, p, n, TJ_HX_READ, TJ_HX_PC); }
TJ_HX_HOOK void __tsan_write_range(void *p, size_t n) { tj_hx->access(tj_hx->ctx, p, n, TJ_HX_WRITE, TJ_HX_PC); }
TJ_HX_HOOK void *__tsan_memcpy(void *d, const void *s, size_t n)
{
    tj_hx->copy(tj_hx->ctx, d, s, n, TJ_HX_PC);
    return d;
}
TJ_HX_HOOK void *__tsan_memmove(void *d, const void *s, size_t n)
{
    tj_hx->copy(tj_hx->ctx, d, s, n, TJ_HX_PC);
    return d;
}
TJ_HX_HOOK void *__tsan_memset(void *d, int c, size_t n)
{
    tj_hx->fill(tj_hx->ctx, d, c, n, TJ_HX_PC);
    return d;
}
TJ_HX_HOOK void __tsan_init(void) {}
TJ_HX_HOOK void __tsan_func_entry(void *pc) { (void)pc; }
TJ_HX_HOOK void __tsan_func_exit(void) {}
TJ_HX_HOOK void __tsan_ignore_thread_begin(void) {}
TJ_HX_HOOK void __tsan_ignore_thread_end(void) {}

#endif
