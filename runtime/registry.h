/* The backends built into this library (registry.c): what the context reads to resolve
 * tj_options.backend and to release each backend's per-context state. */
#ifndef TJ_REGISTRY_H
#define TJ_REGISTRY_H

#include <stddef.h>

#include "runtime/backend.h"

/* The backend of kind b, or NULL when it is not built in (or b is TJ_BACKEND_AUTO). */
const tj_backend_ops *tj_registry_find(tj_backend b);
/* Every backend built in (CUDA, CPU, reference, where built);
 * *n receives the count. Borrowed, static. */
const tj_backend_ops *const *tj_registry_all(size_t *n);
/* Why kind b is not built in ("configured without ..."), for the error of an explicit choice. */
const char *tj_registry_missing_reason(tj_backend b);

#endif
