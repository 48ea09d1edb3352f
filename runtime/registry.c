/* The backend registry: one const tj_backend_ops per backend file, listed here and nowhere else.
 * The context (context_create.c) reads it; the backends never see it. */
#include "runtime/registry.h"
#include "tj_config.h"

extern const tj_backend_ops tj_backend_reference_ops;
#if TJ_HAVE_LLVM
extern const tj_backend_ops tj_backend_cpu_ops;
#endif
#if TJ_HAVE_CUDA
extern const tj_backend_ops tj_backend_cuda_ops;
#endif

/* The order TJ_BACKEND_AUTO tries them in. */
static const tj_backend_ops *const registry[] = {
#if TJ_HAVE_CUDA
    &tj_backend_cuda_ops,
#endif
#if TJ_HAVE_LLVM
    &tj_backend_cpu_ops,
#endif
    &tj_backend_reference_ops,
};

const tj_backend_ops *const *tj_registry_all(size_t *n)
{
    *n = sizeof registry / sizeof *registry;
    return registry;
}

const tj_backend_ops *tj_registry_find(tj_backend b)
{
    for (size_t i = 0; i < sizeof registry / sizeof *registry; i++)
        if (registry[i]->kind == b) return registry[i];
    return NULL;
}

const char *tj_registry_missing_reason(tj_backend b)
{
    return b == TJ_BACKEND_CPU ? "configured without LLVM 19" : "configured without the CUDA toolkit";
}
