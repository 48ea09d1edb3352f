/* safetensors files: a memory-mapped reader (header validated against the file size before any
 * tensor data is touched) and a writer. The types and calls are public (tilejit/io.h);
 * safetensors.c implements them. */
#ifndef TJ_SAFETENSORS_H
#define TJ_SAFETENSORS_H

#include "base/dtype.h"
#include "base/error.h"

#endif
