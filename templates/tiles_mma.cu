/* ---- tiles_mma.cu: tensor-core tile kernel (mma.sync m16n8k16, ldmatrix, cp.async pipeline) ----
 * Work item = TJ_BN features of one tile x TJ_BM tokens; a block loops over work items (persistent
 * grid, the loop in tj_tiles). Per chunk of TJ_BK kept rows:
 * packed weights [TJ_BK x TJ_BN] and the gathered rows of x [TJ_BK x TJ_BM] go to shared memory
 * (k-major, rows padded by 8 halves so ldmatrix is bank-conflict free); warps compute
 * features x tokens with mma A = weights (ldmatrix.trans), B = activations (ldmatrix.trans). */
#define TJ_SPAD 8
#define TJ_WS_LD (TJ_BN + TJ_SPAD)
#define TJ_XS_LD (TJ_BM + TJ_SPAD)
#define TJ_WS_STAGE (TJ_BK * TJ_WS_LD)
#define TJ_XS_STAGE (TJ_BK * TJ_XS_LD)
#define TJ_WTN (TJ_BN / TJ_WARPS_N) /* features per warp */
#define TJ_WTM (TJ_BM / TJ_WARPS_M) /* tokens per warp */
#define TJ_MI (TJ_WTN / 16)
#define TJ_NI (TJ_WTM / 8)
#define TJ_XSEG (TJ_BM / 8)         /* 16-byte segments per gathered row */
#define TJ_WSEG (TJ_BN / 8)         /* 16-byte segments per weight row */
#define TJ_XRP (TJ_THREADS / TJ_XSEG < TJ_BK ? TJ_THREADS / TJ_XSEG : TJ_BK) /* rows per copy pass */
#define TJ_WRP (TJ_THREADS / TJ_WSEG < TJ_BK ? TJ_THREADS / TJ_WSEG : TJ_BK)
#define TJ_XPASS (TJ_BK / TJ_XRP)
#define TJ_WPASS (TJ_BK / TJ_WRP)

static __device__ __forceinline__ void tj_mma(float c[4], const unsigned a[4], const unsigned b[2])
{
#if defined(TJ_HOST_EXEC) && TJ_IN_BF16
    tj_hx_mma_m16n8k16_f32_bf16(c, a, b);
#elif defined(TJ_HOST_EXEC)
    tj_hx_mma_m16n8k16_f32_f16(c, a, b);
#elif TJ_IN_BF16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* Issues the copies of chunk c (kept rows c*TJ_BK ...) into the pipeline stage whose weights start
 * at shared address ws and whose gathered x rows start at xs (xsp: the same, as a pointer, for the
 * row-major transpose). Each thread fetches only its own kept-row indices (tj_row). */
static __device__ __forceinline__ void tj_load_chunk(const tj_args &a, const tj_item &it, int m0, int c,
                                                     unsigned ws, unsigned xs, tj_raw16 *xsp, int tid)
{
    const tj_rows rows = tj_chunk_rows(it.cbase + c);
    const int q = tid / TJ_XSEG, seg = tid % TJ_XSEG;
    if (TJ_XRP * TJ_XSEG == TJ_THREADS || tid < TJ_XRP * TJ_XSEG) {
#pragma unroll
        for (int p = 0; p < TJ_XPASS; ++p) {
            const int lr = p * TJ_XRP + q;
            const bool rok = c * TJ_BK + lr < it.nrows;
            const long long k = tj_row(rows, lr);
            const int mm = m0 + seg * 8;
#if TJ_X_FM
            (void)xsp;
            const int left = a.m - mm;
            const int bytes = rok && left > 0 ? (left >= 8 ? 16 : 2 * left) : 0;
            tj_cp16_s(xs + (unsigned)(lr * TJ_XS_LD + seg * 8) * 2u, a.x + (bytes ? k * a.ldx + mm : 0), bytes);
#else
            /* Row-major x: a fused transpose, eight 2-byte loads per 16-byte segment. */
            (void)xs;
            unsigned v[4];
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const unsigned lo = rok && mm + e < a.m ? a.x[(long long)(mm + e) * a.ldx + k] : 0u;
                const unsigned hi = rok && mm + e + 1 < a.m ? a.x[(long long)(mm + e + 1) * a.ldx + k] : 0u;
                v[e / 2] = lo | (hi << 16);
            }
            *(uint4 *)(xsp + lr * TJ_XS_LD + seg * 8) = make_uint4(v[0], v[1], v[2], v[3]);
#endif
        }
    }
    const int wq = tid / TJ_WSEG, wseg = tid % TJ_WSEG;
    if (TJ_WRP * TJ_WSEG == TJ_THREADS || tid < TJ_WRP * TJ_WSEG) {
#pragma unroll
        for (int p = 0; p < TJ_WPASS; ++p) {
            const int lr = p * TJ_WRP + wq;
            const int r = c * TJ_BK + lr;
            const int col = it.wcol + wseg * 8;
            const int bytes = r < it.nrows && col < it.ld ? 16 : 0;
            tj_cp16_s(ws + (unsigned)(lr * TJ_WS_LD + wseg * 8) * 2u, a.w + (bytes ? it.wofs + (long long)r * it.ld + col : 0),
                      bytes);
        }
    }
}

/* At most 128 registers per thread whatever the block size (two 256-thread blocks per SM), unless
 * a thread holds more than 64 accumulators: then capping would only make ptxas spill. */
#define TJ_ACC_PER_THREAD (TJ_BM * TJ_BN / TJ_THREADS)
#define TJ_MIN_BLOCKS (TJ_ACC_PER_THREAD <= 64 ? 512 / TJ_THREADS : 1)

extern "C" __global__ void __launch_bounds__(TJ_THREADS, TJ_MIN_BLOCKS) tj_tiles(const tj_args a)
{
    extern __shared__ __align__(16) unsigned char tj_smem[];
    const unsigned ws0 = tj_smem_base(tj_smem);
    const unsigned xs0 = ws0 + TJ_STAGES * TJ_WS_STAGE * 2;
    tj_raw16 *const xsp0 = (tj_raw16 *)tj_smem + TJ_STAGES * TJ_WS_STAGE;
    const int mblocks = (a.m + TJ_BM - 1) / TJ_BM;
    const unsigned nwork = (unsigned)(TJ_NITEMS * mblocks), umb = (unsigned)mblocks;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wn = warp % TJ_WARPS_N, wm = warp / TJ_WARPS_N;
    /* This lane's ldmatrix row addresses inside a stage (bytes), fixed for the whole kernel:
     * A matrices (k 0-7, f 0-7) (k 0-7, f 8-15) (k 8-15, f 0-7) (k 8-15, f 8-15) = a0..a3;
     * B matrices (k 0-7, t 0-7) (k 8-15, t 0-7) (k 0-7, t 8-15) (k 8-15, t 8-15) = b of two n8. */
    const unsigned a_lane =
        (unsigned)((((lane & 7) + ((lane >> 4) << 3)) * TJ_WS_LD + wn * TJ_WTN + ((lane >> 3) & 1) * 8) * 2);
    const unsigned b_lane =
        (unsigned)((((lane & 7) + ((lane >> 3) & 1) * 8) * TJ_XS_LD + wm * TJ_WTM + (lane >> 4) * 8) * 2);

    /* Persistent grid: work item w = (item w / mblocks, tokens (w % mblocks)·BM), heaviest first;
     * block b takes w = b, b + gridDim.x, ... (a grid of nwork blocks is the one-item-per-block
     * launch). Unsigned: w + gridDim.x cannot overflow. The loop condition is uniform in the block. */
#pragma unroll 1
    for (unsigned w = blockIdx.x; w < nwork; w += gridDim.x) {
        const tj_item it = tj_items[w / umb];
        const int m0 = (int)(w % umb) * TJ_BM;
        const int nch = (it.nrows + TJ_BK - 1) / TJ_BK;

        float acc[TJ_MI][TJ_NI][4];
#pragma unroll
        for (int i = 0; i < TJ_MI; ++i)
#pragma unroll
            for (int j = 0; j < TJ_NI; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
        for (int s = 0; s < TJ_STAGES - 1; ++s) {
            if (s < nch)
                tj_load_chunk(a, it, m0, s, ws0 + s * TJ_WS_STAGE * 2, xs0 + s * TJ_XS_STAGE * 2, xsp0 + s * TJ_XS_STAGE, tid);
            tj_cp_commit();
        }
        int sc = 0, sn = TJ_STAGES - 1; /* stage of chunk c, and of chunk c + TJ_STAGES - 1 */
#pragma unroll 1
        for (int c = 0; c < nch; ++c) {
            tj_cp_wait<TJ_STAGES - 2>();
            __syncthreads(); /* chunk c landed; every warp is done with the stage refilled below */
            if (c + TJ_STAGES - 1 < nch)
                tj_load_chunk(a, it, m0, c + TJ_STAGES - 1, ws0 + sn * (TJ_WS_STAGE * 2), xs0 + sn * (TJ_XS_STAGE * 2),
                              xsp0 + sn * TJ_XS_STAGE, tid);
            tj_cp_commit();
            const unsigned wst = ws0 + sc * (TJ_WS_STAGE * 2) + a_lane;
            const unsigned xst = xs0 + sc * (TJ_XS_STAGE * 2) + b_lane;
#pragma unroll
            for (int kk = 0; kk < TJ_BK; kk += 16) {
                unsigned af[TJ_MI][4], bf[TJ_NI][2];
#pragma unroll
                for (int i = 0; i < TJ_MI; ++i) tj_ldsm_x4_t_s(af[i], wst + (unsigned)(kk * TJ_WS_LD + i * 16) * 2u);
#pragma unroll
                for (int j = 0; j < TJ_NI; j += 2) {
                    unsigned r[4];
                    tj_ldsm_x4_t_s(r, xst + (unsigned)(kk * TJ_XS_LD + j * 8) * 2u);
                    bf[j][0] = r[0];
                    bf[j][1] = r[1];
                    bf[j + 1][0] = r[2];
                    bf[j + 1][1] = r[3];
                }
#pragma unroll
                for (int i = 0; i < TJ_MI; ++i)
#pragma unroll
                    for (int j = 0; j < TJ_NI; ++j) tj_mma(acc[i][j], af[i], bf[j]);
            }
            sc = sc + 1 == TJ_STAGES ? 0 : sc + 1;
            sn = sn + 1 == TJ_STAGES ? 0 : sn + 1;
        }
        tj_cp_wait<0>();
        __syncthreads(); /* every warp is done with the stages before the next item's prologue refills them */

        /* Epilogue: c0,c1 = (feature g, tokens 2t, 2t+1), c2,c3 = (feature g+8, same tokens). */
#pragma unroll
        for (int i = 0; i < TJ_MI; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int f = wn * TJ_WTN + i * 16 + (lane >> 2) + h * 8;
                if (f >= it.width) continue;
                const int n = tj_col(a, it.fbase + f);
#pragma unroll
                for (int j = 0; j < TJ_NI; ++j) {
                    const int m = m0 + wm * TJ_WTM + j * 8 + (lane & 3) * 2;
                    tj_finish2(a, n, m, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                }
            }
        }
    }
}
