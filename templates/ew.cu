extern "C" __global__ void __launch_bounds__(TJ_AUX_THREADS) tj_ew(const tj_args a)
{
    const int mblocks = (a.m + TJ_AUX_THREADS - 1) / TJ_AUX_THREADS;
    const int i = blockIdx.x / mblocks;
    const long long m = (long long)(blockIdx.x % mblocks) * TJ_AUX_THREADS + threadIdx.x;
    if (i >= a.n_ew_rows || m >= a.m) return;
    const int n = a.ew_rows[i];
    const long long yi = tj_y_index(a, n, m);
    float v = tj_load_out(a.y, yi);
    for (int j = a.ew_ptr[n]; j < a.ew_ptr[n + 1]; ++j)
        v = fmaf(a.ew_val[j], tj_in_to_f32(a.x[tj_x_index(a, a.ew_idx[j], m)]), v);
    tj_store_out(a.y, yi, tj_act(v)); /* the activation was deferred to here (tj_defer_act) */
}
