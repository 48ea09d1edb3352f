/* ---- hopper.cu: sm_90a PTX helpers, emitted only before tiles_wgmma.cu (older archs never see
 * them): mbarrier, bulk copies, the async-proxy fence and wgmma on 32-bit shared addresses, each
 * with its host twin under TJ_HOST_EXEC (docs/gpu-executor.md, "Hopper"). ---- */
static __device__ __forceinline__ void tj_mbar_init(unsigned bar, unsigned count)
{
#ifdef TJ_HOST_EXEC
    tj_hx_mbarrier_init(bar, count);
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

/* One arrival that also expects `bytes` more transaction bytes in the current phase. */
static __device__ __forceinline__ void tj_mbar_arrive_expect_tx(unsigned bar, unsigned bytes)
{
#ifdef TJ_HOST_EXEC
    tj_hx_mbarrier_arrive_expect_tx(bar, bytes);
#else
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

/* 1 once the phase with parity `parity` has completed (the current phase has the other parity). */
static __device__ __forceinline__ unsigned tj_mbar_try_wait(unsigned bar, unsigned parity)
{
#ifdef TJ_HOST_EXEC
    return tj_hx_mbarrier_try_wait_parity(bar, parity);
#else
    unsigned ok;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
                 : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    return ok;
#endif
}

static __device__ __forceinline__ void tj_mbar_wait(unsigned bar, unsigned parity)
{
    while (!tj_mbar_try_wait(bar, parity)) {
    }
}

/* cp.async.bulk global -> shared of `bytes` (a multiple of 16, both ends 16-byte aligned); the
 * bytes count as transactions of the current phase of mbarrier `bar` and land when it completes. */
static __device__ __forceinline__ void tj_bulk_g2s(unsigned dst, const void *src, unsigned bytes, unsigned bar)
{
#ifdef TJ_HOST_EXEC
    tj_hx_cp_async_bulk(dst, src, bytes, bar);
#else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

/* Orders this thread's earlier generic-proxy shared-memory writes (stores, landed cp.async) before
 * later async-proxy reads (wgmma operands). */
static __device__ __forceinline__ void tj_fence_proxy_async()
{
#ifdef TJ_HOST_EXEC
    tj_hx_fence_proxy_async();
#else
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void tj_wg_fence()
{
#ifdef TJ_HOST_EXEC
    tj_hx_wgmma_fence();
#else
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ void tj_wg_commit()
{
#ifdef TJ_HOST_EXEC
    tj_hx_wgmma_commit_group();
#else
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N> static __device__ __forceinline__ void tj_wg_wait()
{
#ifdef TJ_HOST_EXEC
    tj_hx_wgmma_wait_group(N);
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

/* Keeps the compiler from moving reads of an accumulator above the wgmma.wait_group that lands it. */
static __device__ __forceinline__ void tj_wg_pin(float &r)
{
#ifdef TJ_HOST_EXEC
    (void)r;
#else
    asm volatile("" : "+f"(r)::"memory");
#endif
}

/* Shared-memory matrix descriptor: start address, leading (LBO) and stride (SBO) byte offsets,
 * each >> 4 in 14 bits, base offset 0, layout type in bits 62-63 (TJ_WG_SWIZZLE). */
#define TJ_WG_SWIZZLE 1 /* 128-byte swizzle */
static __device__ __forceinline__ unsigned long long tj_wg_desc(unsigned addr, unsigned lbo, unsigned sbo)
{
    return (unsigned long long)((addr & 0x3ffffu) >> 4) | ((unsigned long long)((lbo & 0x3ffffu) >> 4) << 16) |
           ((unsigned long long)((sbo & 0x3ffffu) >> 4) << 32) | ((unsigned long long)TJ_WG_SWIZZLE << 62);
}

/* The A and B element types of wgmma.mma_async. */
#if TJ_IN_BF16
#define TJ_WG_AB "bf16.bf16"
#else
#define TJ_WG_AB "f16.f16"
#endif

/* wgmma.mma_async m64nNk16 (N = TJ_BM) f32 += {f16,bf16}: A M-major and B N-major from shared
 * memory (imm-trans-a = imm-trans-b = 1); scale_d 0 ignores d's old value. */
static __device__ __forceinline__ void tj_wgmma(float d[TJ_BM / 2], unsigned long long desc_a, unsigned long long desc_b,
                                                int scale_d)
{
#ifdef TJ_HOST_EXEC
    tj_hx_wgmma_mma_async(d, TJ_BM, desc_a, desc_b, scale_d, TJ_IN_BF16, 1, 1);
#else
#if TJ_BM == 64
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TJ_WG_AB " "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 1, 1; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d)
                 : "memory");
#else
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TJ_WG_AB " "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, p, 1, 1, 1, 1; }\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d)
                 : "memory");
#endif
#endif
}
