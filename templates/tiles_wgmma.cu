/* ---- tiles_wgmma.cu: Hopper tile kernel (sm_90a: wgmma.mma_async, mbarrier, cp.async.bulk) ----
 * Block = one work item (64 features of one tile) x TJ_BM tokens, one warpgroup (128 threads).
 * Per chunk of TJ_BK kept rows a pipeline stage holds the packed weights [TJ_BK x 64] (wgmma
 * operand A, M-major) and the gathered kept rows of feature-major x [TJ_BK x TJ_BM] (operand B,
 * N-major), both in the 128-byte-swizzled canonical layout: one 128-byte line (64 elements) per
 * kept row, 8 lines per 1024-byte swizzle atom (SBO = 1024), groups of 64 tokens TJ_BK lines
 * apart (LBO). Weights arrive by 16-byte cp.async.bulk on the stage's mbarrier, x by 16-byte
 * cp.async; pieces past the tile's rows or columns are zero stores; fence.proxy.async hands the
 * generic-proxy bytes to wgmma. docs/kernels.md ("The wgmma kernel"). */
#define TJ_WG_LINE 128                                   /* bytes of one kept row per 64 elements */
#define TJ_WG_A_BYTES (TJ_BK * TJ_WG_LINE)               /* weights of one stage (64 features) */
#define TJ_WG_B_BYTES (TJ_BK * TJ_WG_LINE * (TJ_BM / 64)) /* gathered x of one stage */
#define TJ_WG_STAGE (TJ_WG_A_BYTES + TJ_WG_B_BYTES)
#define TJ_WG_SBO 1024                                   /* next 8 kept rows */
#define TJ_WG_LBO (TJ_BK * TJ_WG_LINE)                   /* next 64 tokens (operand B) */
#define TJ_WG_XSEG (TJ_BM / 8)                           /* 16-byte pieces per gathered row */
#define TJ_WG_XPASS (TJ_BK * TJ_WG_XSEG / 128)
#define TJ_WG_WPASS (TJ_BK * 8 / 128)

/* Byte offset of 16-byte piece `seg` (of 8) in line `line` of a 1024-byte-aligned swizzled tile:
 * the 128-byte swizzle exchanges pieces by the line's index within its 8-line atom. */
static __device__ __forceinline__ unsigned tj_wg_piece(int line, int seg)
{
    return (unsigned)(line * TJ_WG_LINE + ((seg ^ (line & 7)) << 4));
}

/* Issues chunk c (kept rows c*TJ_BK ...) into the stage at shared address sa (weights; x follows
 * at sa + TJ_WG_A_BYTES), its weight bytes completing on mbarrier bar. gp: tj_smem, s0 its
 * shared address (for the zero stores). */
static __device__ __forceinline__ void tj_wg_load(const tj_args &a, const tj_item &it, int m0, int c, unsigned sa,
                                                  unsigned bar, unsigned char *gp, unsigned s0, int tid)
{
    const int rows = it.nrows - c * TJ_BK < TJ_BK ? it.nrows - c * TJ_BK : TJ_BK;
    const int wsegs = (it.ld - it.wcol) / 8 < 8 ? (it.ld - it.wcol) / 8 : 8;
    if (tid == 0) tj_mbar_arrive_expect_tx(bar, (unsigned)(rows * wsegs * 16));
#pragma unroll
    for (int p = 0; p < TJ_WG_WPASS; ++p) {
        const int q = p * 128 + tid, lr = q / 8, seg = q % 8;
        const unsigned dst = sa + tj_wg_piece(lr, seg);
        if (lr < rows && seg < wsegs)
            tj_bulk_g2s(dst, a.w + it.wofs + (long long)(c * TJ_BK + lr) * it.ld + it.wcol + seg * 8, 16u, bar);
        else
            *(uint4 *)(gp + (dst - s0)) = make_uint4(0u, 0u, 0u, 0u);
    }
    const tj_rows rr = tj_chunk_rows(it.cbase + c);
    const unsigned sb = sa + TJ_WG_A_BYTES;
#pragma unroll
    for (int p = 0; p < TJ_WG_XPASS; ++p) {
        const int q = p * 128 + tid, lr = q / TJ_WG_XSEG, seg = q % TJ_WG_XSEG;
        const long long k = tj_row(rr, lr);
        const int mm = m0 + seg * 8, left = a.m - mm;
        const int bytes = lr < rows && left > 0 ? (left >= 8 ? 16 : 2 * left) : 0;
        tj_cp16_s(sb + tj_wg_piece((seg / 8) * TJ_BK + lr, seg % 8), a.x + (bytes ? k * a.ldx + mm : 0), bytes);
    }
}

extern "C" __global__ void __launch_bounds__(128, 1) tj_tiles(const tj_args a)
{
    extern __shared__ __align__(16) unsigned char tj_smem[];
    const unsigned s0 = tj_smem_base(tj_smem);
    const unsigned bar0 = s0;                              /* TJ_STAGES mbarriers, 8 bytes each */
    const unsigned st0 = (s0 + 8u * TJ_STAGES + 1023u) & ~1023u; /* stages, aligned to the swizzle atom */
    const int mblocks = (a.m + TJ_BM - 1) / TJ_BM;
    const tj_item it = tj_items[blockIdx.x / mblocks];
    const int m0 = (blockIdx.x % mblocks) * TJ_BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nch = (it.nrows + TJ_BK - 1) / TJ_BK;

    if (tid == 0) {
        for (int s = 0; s < TJ_STAGES; ++s) tj_mbar_init(bar0 + 8u * s, 1u);
        tj_fence_proxy_async(); /* the initialised barriers, visible to the bulk copies' complete_tx */
    }
    __syncthreads();

    float acc[TJ_BM / 2];
#pragma unroll
    for (int i = 0; i < TJ_BM / 2; ++i) acc[i] = 0.0f;

#pragma unroll
    for (int s = 0; s < TJ_STAGES - 1; ++s) {
        if (s < nch) tj_wg_load(a, it, m0, s, st0 + s * TJ_WG_STAGE, bar0 + 8u * s, tj_smem, s0, tid);
        tj_cp_commit();
    }
    int sc = 0, sn = TJ_STAGES - 1; /* stage of chunk c, and of chunk c + TJ_STAGES - 1 */
#pragma unroll 1
    for (int c = 0; c < nch; ++c) {
        tj_cp_wait<TJ_STAGES - 2>(); /* this thread's x pieces of chunk c landed */
        tj_fence_proxy_async();      /* ... and, with the zero stores, are visible to wgmma */
        tj_mbar_wait(bar0 + 8u * sc, (unsigned)(c / TJ_STAGES) & 1u); /* the weights of chunk c */
        __syncthreads(); /* everyone's pieces are in; the stage refilled below is no longer read */
        if (c + TJ_STAGES - 1 < nch)
            tj_wg_load(a, it, m0, c + TJ_STAGES - 1, st0 + sn * TJ_WG_STAGE, bar0 + 8u * sn, tj_smem, s0, tid);
        tj_cp_commit();
        const unsigned sa = st0 + sc * TJ_WG_STAGE, sb = sa + TJ_WG_A_BYTES;
        tj_wg_fence();
#pragma unroll
        for (int kk = 0; kk < TJ_BK; kk += 16)
            tj_wgmma(acc, tj_wg_desc(sa + kk * TJ_WG_LINE, TJ_WG_LBO, TJ_WG_SBO),
                     tj_wg_desc(sb + kk * TJ_WG_LINE, TJ_WG_LBO, TJ_WG_SBO), 1);
        tj_wg_commit();
        tj_wg_wait<0>();
#pragma unroll
        for (int i = 0; i < TJ_BM / 2; ++i) tj_wg_pin(acc[i]);
        sc = sc + 1 == TJ_STAGES ? 0 : sc + 1;
        sn = sn + 1 == TJ_STAGES ? 0 : sn + 1;
    }
    tj_cp_wait<0>();

    /* Epilogue: accumulator 4j + r = (feature 16 warp + lane/4 + 8 (r/2), token 8j + 2 (lane%4) + r%2). */
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int f = 16 * warp + (lane >> 2) + 8 * h;
        if (f >= it.width) continue;
        const int n = tj_col(a, it.fbase + f);
#pragma unroll
        for (int j = 0; j < TJ_BM / 8; ++j)
            tj_finish2(a, n, m0 + 8 * j + 2 * (lane & 3), acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
}
