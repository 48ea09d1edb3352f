/* ---- tiles_simt.cu: the plainly correct tile kernel (fp32 SIMT math, no shared memory) ----
 * A work item = TJ_BN features of one tile x TJ_BM tokens; in each, thread (tx, ty) owns token
 * m0 + tx and features ty, ty + FG, ... of the item. Every other variant is checked against it. */
#define TJ_FG (TJ_THREADS / TJ_BM)   /* feature groups */
#define TJ_FPT (TJ_BN / TJ_FG)       /* features per thread */

extern "C" __global__ void __launch_bounds__(TJ_THREADS) tj_tiles(const tj_args a)
{
    const int mblocks = (a.m + TJ_BM - 1) / TJ_BM;
    const unsigned nwork = (unsigned)(TJ_NITEMS * mblocks), umb = (unsigned)mblocks;
    const int tx = threadIdx.x % TJ_BM, ty = threadIdx.x / TJ_BM;
    /* Persistent grid, as the mma kernel: block b takes work items b, b + gridDim.x, ... */
#pragma unroll 1
    for (unsigned w = blockIdx.x; w < nwork; w += gridDim.x) {
        const tj_item it = tj_items[w / umb];
        const long long m = (long long)(w % umb) * TJ_BM + tx;
        const bool mok = m < a.m;
        const int nch = (it.nrows + TJ_BK - 1) / TJ_BK;
        float acc[TJ_FPT];
#pragma unroll
        for (int f = 0; f < TJ_FPT; ++f) acc[f] = 0.0f;

#pragma unroll 1
        for (int c = 0; c < nch; ++c) {
            const tj_ofs o = tj_chunk_ofs(it.cbase + c);
            const int rend = it.nrows - c * TJ_BK;
#pragma unroll
            for (int rr = 0; rr < TJ_BK; ++rr) {
                if (rr < rend) {
                    const long long k = tj_ofs_get(o, rr);
                    const float xv = mok ? tj_in_to_f32(a.x[tj_x_index(a, k, m)]) : 0.0f;
                    const tj_raw16 *wr = a.w + it.wofs + (long long)(c * TJ_BK + rr) * it.ld + it.wcol;
#pragma unroll
                    for (int f = 0; f < TJ_FPT; ++f) {
                        const int col = ty + f * TJ_FG;
                        if (col < it.width) acc[f] = fmaf(tj_in_to_f32(wr[col]), xv, acc[f]);
                    }
                }
            }
        }
        if (!mok) continue;
#pragma unroll
        for (int f = 0; f < TJ_FPT; ++f) {
            const int col = ty + f * TJ_FG;
            if (col < it.width) tj_finish(a, tj_col(a, it.fbase + col), m, acc[f]);
        }
    }
}
