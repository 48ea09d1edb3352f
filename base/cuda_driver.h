/* The CUDA driver API, opened at run time with dlopen("libcuda.so.1") so that tilejit builds,
 * loads and runs its other backends on machines without a driver. Every call goes through one
 * wrapper (TJ_CU / TJ_TRY_CU) that keeps the call's name, file, line and the driver's own message.
 * Used by backend_cuda.c, the `bench --backend cuda` command and the GPU tests. */
#ifndef TJ_CUDA_DRIVER_H
#define TJ_CUDA_DRIVER_H

#include <cuda.h> /* types and enums only: nothing is linked against libcuda */

#include "base/error.h"

/* One function pointer per driver entry point used. The pointer types come from cuda.h, and the
 * symbol looked up is the header's own name for the call (cuMemAlloc → cuMemAlloc_v2 and so on),
 * so the ABI of each pointer is the one the header declares. */
#define TJ_CU_FUNCS(X)          \
    X(GetErrorName)             \
    X(GetErrorString)           \
    X(Init)                     \
    X(DriverGetVersion)         \
    X(DeviceGetCount)           \
    X(DeviceGet)                \
    X(DeviceGetName)            \
    X(DeviceGetAttribute)       \
    X(DeviceTotalMem)           \
    X(DevicePrimaryCtxRetain)   \
    X(DevicePrimaryCtxRelease)  \
    X(CtxSetCurrent)            \
    X(CtxGetCurrent)            \
    X(CtxSynchronize)           \
    X(MemAlloc)                 \
    X(MemFree)                  \
    X(MemGetInfo)               \
    X(MemcpyHtoD)               \
    X(MemcpyDtoH)               \
    X(MemcpyHtoDAsync)          \
    X(MemcpyDtoHAsync)          \
    X(MemsetD8)                 \
    X(MemsetD16Async)           \
    X(MemsetD32Async)           \
    X(PointerGetAttribute)      \
    X(ModuleLoadData)           \
    X(ModuleUnload)             \
    X(ModuleGetFunction)        \
    X(FuncSetAttribute)         \
    X(FuncGetAttribute)         \
    X(OccupancyMaxActiveBlocksPerMultiprocessor) \
    X(LaunchKernel)             \
    X(StreamCreate)             \
    X(StreamDestroy)            \
    X(StreamSynchronize)        \
    X(EventCreate)              \
    X(EventDestroy)             \
    X(EventRecord)              \
    X(EventSynchronize)         \
    X(EventElapsedTime)         \
    X(StreamBeginCapture)       \
    X(StreamEndCapture)         \
    X(GraphInstantiate)         \
    X(GraphLaunch)              \
    X(GraphExecDestroy)         \
    X(GraphDestroy)

typedef struct tj_cu_api {
    void *lib;               /* dlopen handle */
    char libname[256];       /* what was opened */
    int driver_version;      /* e.g. 13000 */
#define TJ_CU_FIELD_(name) __typeof__(cu##name) *name;
    TJ_CU_FUNCS(TJ_CU_FIELD_)
#undef TJ_CU_FIELD_
} tj_cu_api;

/* The library name opened: $TILEJIT_LIBCUDA when set (tests point it at a missing or fake
 * library), else "libcuda.so.1". */
const char *tj_cu_library_name(void);

/* dlopen, resolve every entry point, cuInit(0) and cuDriverGetVersion. On failure *api is left
 * closed and err says why in one line (no driver, a missing symbol, cuInit's error). */
tj_status tj_cu_open(tj_cu_api *api, tj_error *err);
/* dlclose; accepts a zeroed or already closed api. */
void tj_cu_close(tj_cu_api *api);

/* TJ_OK when r is CUDA_SUCCESS; otherwise fills err with
 * "<call> failed: CUDA_ERROR_X (the driver's text) at file:line" and returns TJ_ERR_DEVICE
 * (TJ_ERR_OUT_OF_MEMORY for CUDA_ERROR_OUT_OF_MEMORY). `call` may hold the argument list: only
 * the name up to '(' is kept. */
tj_status tj_cu_result(const tj_cu_api *api, CUresult r, const char *call, const char *file, int line,
                       tj_error *err);

/* TJ_CU(api, err, MemAlloc(&p, n)) calls api->MemAlloc(&p, n) and evaluates to its tj_status;
 * TJ_TRY_CU returns it from the enclosing function on failure. */
#define TJ_CU(api, err, call) tj_cu_result((api), (api)->call, "cu" #call, __FILE__, __LINE__, (err))
#define TJ_TRY_CU(api, err, call) TJ_TRY(TJ_CU(api, err, call))

#endif
