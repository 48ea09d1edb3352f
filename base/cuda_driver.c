/* The CUDA driver API through dlopen: one table of entry points per opener, one error wrapper.
 * Nothing here links against libcuda; the build needs only cuda.h for the types. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cuda_driver.h"

#define TJ_STR2_(x) #x
#define TJ_STR_(x) TJ_STR2_(x)

const char *tj_cu_library_name(void)
{
    const char *env = getenv("TILEJIT_LIBCUDA");
    return env && *env ? env : "libcuda.so.1";
}

void tj_cu_close(tj_cu_api *api)
{
    if (!api) return;
    if (api->lib) dlclose(api->lib);
    memset(api, 0, sizeof *api);
}

static tj_status resolve(tj_cu_api *api, const char *sym, const char *fallback, void **out, tj_error *err)
{
    dlerror();
    void *p = dlsym(api->lib, sym);
    if (!p && fallback && strcmp(fallback, sym) != 0) p = dlsym(api->lib, fallback);
    if (!p)
        return tj_fail(err, TJ_ERR_UNSUPPORTED,
                       "CUDA driver %s lacks entry point %s (driver too old for this tilejit, built with CUDA %d.%d headers)",
                       api->libname, sym, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
    *out = p;
    return TJ_OK;
}

tj_status tj_cu_open(tj_cu_api *api, tj_error *err)
{
    memset(api, 0, sizeof *api);
    const char *name = tj_cu_library_name();
    snprintf(api->libname, sizeof api->libname, "%s", name);
    api->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!api->lib) {
        const char *why = dlerror();
        tj_fail(err, TJ_ERR_UNSUPPORTED, "no NVIDIA driver: cannot load %s (%s)", name, why ? why : "unknown reason");
        tj_cu_close(api);
        return TJ_ERR_UNSUPPORTED;
    }
    tj_status s = TJ_OK;
    /* Only calls whose _v2 has the same signature as the old name may fall back to it. */
#define TJ_CU_RESOLVE_(name)                                                                    \
    if (s == TJ_OK) {                                                                           \
        void *p_ = NULL;                                                                        \
        const char *fb_ = strcmp(#name, "EventElapsedTime") == 0 ? "cuEventElapsedTime" : NULL; \
        s = resolve(api, TJ_STR_(cu##name), fb_, &p_, err);                                     \
        if (s == TJ_OK) memcpy(&api->name, &p_, sizeof p_);                                     \
    }
    TJ_CU_FUNCS(TJ_CU_RESOLVE_)
#undef TJ_CU_RESOLVE_
    if (s == TJ_OK) s = TJ_CU(api, err, Init(0));
    if (s == TJ_OK) s = TJ_CU(api, err, DriverGetVersion(&api->driver_version));
    if (s != TJ_OK) {
        tj_cu_close(api);
        return s;
    }
    return TJ_OK;
}

tj_status tj_cu_result(const tj_cu_api *api, CUresult r, const char *call, const char *file, int line,
                       tj_error *err)
{
    if (r == CUDA_SUCCESS) return TJ_OK;
    const char *name = NULL, *text = NULL;
    if (api && api->GetErrorName && api->GetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (api && api->GetErrorString && api->GetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
    size_t len = strcspn(call, "(");
    char codebuf[32];
    if (!name) {
        snprintf(codebuf, sizeof codebuf, "CUresult %d", (int)r);
        name = codebuf;
    }
    return tj_fail(err, r == CUDA_ERROR_OUT_OF_MEMORY ? TJ_ERR_OUT_OF_MEMORY : TJ_ERR_DEVICE,
                   "%.*s failed: %s (%s) at %s:%d", (int)len, call, name, text ? text : "no description", file,
                   line);
}
