/* Backend `cuda`: NVRTC-compiled kernels launched through the driver API (opened with dlopen). */
#ifndef TJ_BACKEND_CUDA_H
#define TJ_BACKEND_CUDA_H

#include "model.h"

/* Frees the context's CUDA state (driver handle, device context); safe when none was made. */
void tj_cuda_context_release(tj_context *c);

#endif
