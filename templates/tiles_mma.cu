/* ---- tiles_mma.cu: tensor-core tile kernel (mma.sync m16n8k16, ldmatrix, cp.async pipeline) ----
 * Block = one work item (TJ_BN features of one tile) x TJ_BM tokens. Per chunk of TJ_BK kept rows:
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

static __device__ __forceinline__ unsigned tj_smem_addr(const void *p)
{
#ifdef TJ_HOST_EXEC
    return tj_hx_cvta_to_shared(p);
#else
    unsigned s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(p));
    return s;
#endif
}

/* 16-byte global -> shared copy; bytes < 16 zero-fills the rest (0: all zeros, src unread). */
static __device__ __forceinline__ void tj_cp16(void *dst, const void *src, int bytes)
{
#ifdef TJ_HOST_EXEC
    tj_hx_cp_async_cg_16(tj_smem_addr(dst), src, bytes);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(tj_smem_addr(dst)), "l"(src), "r"(bytes));
#endif
}
static __device__ __forceinline__ void tj_cp_commit()
{
#ifdef TJ_HOST_EXEC
    tj_hx_cp_async_commit_group();
#else
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> static __device__ __forceinline__ void tj_cp_wait()
{
#ifdef TJ_HOST_EXEC
    tj_hx_cp_async_wait_group(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

static __device__ __forceinline__ void tj_ldsm_x4_t(unsigned r[4], const void *p)
{
#ifdef TJ_HOST_EXEC
    tj_hx_ldmatrix_x4_trans(r, tj_smem_addr(p));
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tj_smem_addr(p)));
#endif
}

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

/* Issues the copies of chunk c (kept rows c*TJ_BK ...) into pipeline stage `stage`. */
static __device__ __forceinline__ void tj_load_chunk(const tj_args &a, const tj_item &it, int m0, int c,
                                                     tj_raw16 *ws, tj_raw16 *xs, int tid)
{
    const tj_ofs o = tj_chunk_ofs(it.cbase + c);
    const int q = tid / TJ_XSEG, seg = tid % TJ_XSEG;
    if (TJ_XRP * TJ_XSEG == TJ_THREADS || tid < TJ_XRP * TJ_XSEG) {
#pragma unroll
        for (int p = 0; p < TJ_XPASS; ++p) {
            const int lr = p * TJ_XRP + q;
            const bool rok = c * TJ_BK + lr < it.nrows;
            const long long k = tj_ofs_get(o, lr);
            const int mm = m0 + seg * 8;
            tj_raw16 *dst = xs + lr * TJ_XS_LD + seg * 8;
#if TJ_X_FM
            const int left = a.m - mm;
            const int bytes = rok && left > 0 ? (left >= 8 ? 16 : 2 * left) : 0;
            tj_cp16(dst, a.x + (bytes ? k * a.ldx + mm : 0), bytes);
#else
            /* Row-major x: a fused transpose, eight 2-byte loads per 16-byte segment. */
            unsigned v[4];
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const unsigned lo = rok && mm + e < a.m ? a.x[(long long)(mm + e) * a.ldx + k] : 0u;
                const unsigned hi = rok && mm + e + 1 < a.m ? a.x[(long long)(mm + e + 1) * a.ldx + k] : 0u;
                v[e / 2] = lo | (hi << 16);
            }
            *(uint4 *)dst = make_uint4(v[0], v[1], v[2], v[3]);
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
            tj_cp16(ws + lr * TJ_WS_LD + wseg * 8, a.w + (bytes ? it.wofs + (long long)r * it.ld + col : 0), bytes);
        }
    }
}

extern "C" __global__ void __launch_bounds__(TJ_THREADS) tj_tiles(const tj_args a)
{
    extern __shared__ __align__(16) unsigned char tj_smem[];
    tj_raw16 *ws = (tj_raw16 *)tj_smem;
    tj_raw16 *xs = ws + TJ_STAGES * TJ_WS_STAGE;
    const int mblocks = (a.m + TJ_BM - 1) / TJ_BM;
    const tj_item it = tj_items[blockIdx.x / mblocks];
    const int m0 = (blockIdx.x % mblocks) * TJ_BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wn = warp % TJ_WARPS_N, wm = warp / TJ_WARPS_N;
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
        if (s < nch) tj_load_chunk(a, it, m0, s, ws + s * TJ_WS_STAGE, xs + s * TJ_XS_STAGE, tid);
        tj_cp_commit();
    }
#pragma unroll 1
    for (int c = 0; c < nch; ++c) {
        tj_cp_wait<TJ_STAGES - 2>();
        __syncthreads(); /* chunk c landed; every warp is done with the stage refilled below */
        const int cn = c + TJ_STAGES - 1;
        if (cn < nch) {
            const int sn = cn % TJ_STAGES;
            tj_load_chunk(a, it, m0, cn, ws + sn * TJ_WS_STAGE, xs + sn * TJ_XS_STAGE, tid);
        }
        tj_cp_commit();
        const int sc = c % TJ_STAGES;
        const tj_raw16 *wst = ws + sc * TJ_WS_STAGE;
        const tj_raw16 *xst = xs + sc * TJ_XS_STAGE;
#pragma unroll
        for (int kk = 0; kk < TJ_BK; kk += 16) {
            unsigned af[TJ_MI][4], bf[TJ_NI][2];
#pragma unroll
            for (int i = 0; i < TJ_MI; ++i) {
                /* matrices: (k 0-7, f 0-7) (k 0-7, f 8-15) (k 8-15, f 0-7) (k 8-15, f 8-15) = a0..a3 */
                const int kr = kk + (lane & 7) + ((lane >> 4) << 3);
                const int fc = wn * TJ_WTN + i * 16 + ((lane >> 3) & 1) * 8;
                tj_ldsm_x4_t(af[i], wst + kr * TJ_WS_LD + fc);
            }
#pragma unroll
            for (int j = 0; j < TJ_NI; j += 2) {
                /* matrices: (k 0-7, t 0-7) (k 8-15, t 0-7) (k 0-7, t 8-15) (k 8-15, t 8-15) = b of two n8 */
                unsigned r[4];
                const int kr = kk + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int tc = wm * TJ_WTM + j * 8 + (lane >> 4) * 8;
                tj_ldsm_x4_t(r, xst + kr * TJ_XS_LD + tc);
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
    }
    tj_cp_wait<0>();

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
