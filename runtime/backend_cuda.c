/* Backend `cuda`: opens libcuda.so.1 at run time so tilejit works on machines without a driver.
 * The dispatch path is built in runtime/cuda_*.c; this file is the backend's entry points. */
#include <dlfcn.h>
#include <stdlib.h>

#include "backend_cuda.h"

static tj_status cuda_available(tj_context *c, tj_error *err)
{
    (void)c;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return tj_fail(err, TJ_ERR_UNSUPPORTED, "CUDA backend unavailable: cannot load the driver (%s)", dlerror());
    dlclose(h);
    return tj_fail(err, TJ_ERR_UNSUPPORTED, "CUDA backend unavailable: kernel dispatch is not implemented in this build");
}

static tj_status cuda_load(tj_model *m, tj_error *err)
{
    (void)m;
    return tj_fail(err, TJ_ERR_UNSUPPORTED, "CUDA backend unavailable");
}

static tj_status cuda_linear(tj_model *m, int64_t layer, const tj_linear_args *a, tj_error *err)
{
    (void)m;
    (void)layer;
    (void)a;
    return tj_fail(err, TJ_ERR_UNSUPPORTED, "CUDA backend unavailable");
}

static void cuda_unload(tj_model *m) { (void)m; }

void tj_cuda_context_release(tj_context *c) { (void)c; }

const tj_backend_ops tj_backend_cuda_ops = {
    .name = "cuda",
    .kind = TJ_BACKEND_CUDA,
    .host_f32 = 0,
    .available = cuda_available,
    .load = cuda_load,
    .linear = cuda_linear,
    .unload = cuda_unload,
};
