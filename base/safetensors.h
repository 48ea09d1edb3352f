/* safetensors files: a memory-mapped reader (header validated against the file size before any
 * tensor data is touched) and a writer. Only F32, F16 and BF16 tensors are usable; others are
 * listed with dtype_ok = 0 so they can still be copied through by the pruner. */
#ifndef TJ_SAFETENSORS_H
#define TJ_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/error.h"

#define TJ_ST_MAX_DIMS 8

typedef struct tj_st_tensor {
    char *name;
    char dtype_str[16];       /* as written in the header, e.g. "F32", "I64" */
    int dtype_ok;             /* 1 if F32/F16/BF16 */
    tj_dtype dtype;
    int ndim;
    int64_t shape[TJ_ST_MAX_DIMS];
    uint64_t begin, end;      /* byte offsets within the data section */
    const void *data;         /* points into the mapping */
} tj_st_tensor;

typedef struct tj_st_file {
    char *path;
    void *map;
    size_t map_size;
    int64_t ntensors;
    tj_st_tensor *tensors;    /* sorted by name */
    char *metadata_json;      /* the "__metadata__" object re-serialised, or NULL */
} tj_st_file;

tj_status tj_st_open(const char *path, tj_st_file **out, tj_error *err);
void tj_st_close(tj_st_file *f);
/* Borrowed pointer, or NULL when absent. O(log n). */
const tj_st_tensor *tj_st_find(const tj_st_file *f, const char *name);

/* Writer: tensors given as name, dtype string, shape and bytes (copied as they are). */
typedef struct tj_st_out_tensor {
    const char *name;
    const char *dtype_str;    /* "F32", "F16", "BF16", or any dtype being copied through */
    int ndim;
    const int64_t *shape;
    const void *data;
    uint64_t nbytes;
} tj_st_out_tensor;

tj_status tj_st_write(const char *path, const tj_st_out_tensor *tensors, int64_t n,
                      const char *metadata_json, tj_error *err);

/* Streaming writer: like tj_st_write, but a tensor whose data is NULL is produced on demand by
 * fill(user, index, buf, err), which must write its nbytes into buf (a scratch buffer owned by
 * the writer and reused from tensor to tensor). Lets the pruner write a large model holding
 * only one layer's output at a time. The file is written to a temporary name and renamed. */
typedef tj_status (*tj_st_fill_fn)(void *user, int64_t index, void *buf, tj_error *err);
tj_status tj_st_write_stream(const char *path, const tj_st_out_tensor *tensors, int64_t n,
                             const char *metadata_json, tj_st_fill_fn fill, void *user,
                             tj_error *err);

#endif
