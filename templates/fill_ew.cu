/* ---- fill_ew.cu: pruned features and the element-wise residual ----
 * tj_fill writes act(bias) (or 0) for every pruned output feature (a.fill_rows). tj_ew runs last
 * and adds the ew residual into y for every feature that has ew entries (a.ew_rows); when the layer
 * has an activation, tj_tiles and tj_fill stored those features' pre-activation values, and tj_ew
 * applies the activation after adding. One thread per (feature, token); blocks of TJ_AUX_THREADS
 * tokens, 1-D grid: feature-major blocks, tokens fastest. */
#define TJ_AUX_THREADS 256

extern "C" __global__ void __launch_bounds__(TJ_AUX_THREADS) tj_fill(const tj_args a)
{
    const int mblocks = (a.m + TJ_AUX_THREADS - 1) / TJ_AUX_THREADS;
    const int i = blockIdx.x / mblocks;
    const long long m = (long long)(blockIdx.x % mblocks) * TJ_AUX_THREADS + threadIdx.x;
    if (i >= a.n_fill || m >= a.m) return;
    tj_finish(a, a.fill_rows[i], m, 0.0f);
}
{{EW_KERNEL}}
