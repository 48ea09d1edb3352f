/* tilejit/io.h — element types and the files around a model: safetensors weights (memory-mapped,
 * validated before any tensor is touched), 2-D .npy activations, and one whole-file reader.
 * docs/formats.md describes each format as tilejit reads and writes it. */
#include "tilejit.h"
#ifndef TILEJIT_IO_H
#define TILEJIT_IO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element types ------------------------------------------------------------------------ */

typedef enum tj_dtype { TJ_F32 = 0, TJ_F16, TJ_BF16 } tj_dtype;

static inline size_t tj_dtype_size(tj_dtype d) { return d == TJ_F32 ? 4 : 2; }
TJ_API const char *tj_dtype_name(tj_dtype d); /* "F32", "F16", "BF16" (safetensors spelling) */

static inline float tj_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t tj_f32_to_bf16(float f) /* round to nearest even; NaN stays NaN */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

TJ_API float tj_f16_to_f32(uint16_t h);
TJ_API uint16_t tj_f32_to_f16(float f); /* round to nearest even, overflow to inf */

/* Element i of a 16-bit array. Weights in a safetensors file may sit at any byte offset (an
 * unpadded header), so typed loads go through memcpy (one plain load on x86). */
static inline uint16_t tj_load_u16(const void *p, int64_t i)
{
    uint16_t h;
    memcpy(&h, (const char *)p + 2 * i, 2);
    return h;
}

/* Element i of a typed array as fp32 (p need not be aligned). */
static inline float tj_load_f32(const void *p, tj_dtype d, int64_t i)
{
    switch (d) {
    case TJ_F16: return tj_f16_to_f32(tj_load_u16(p, i));
    case TJ_BF16: return tj_bf16_to_f32(tj_load_u16(p, i));
    default: {
        float f;
        memcpy(&f, (const char *)p + 4 * i, 4);
        return f;
    }
    }
}

/* Converts n elements to fp32, and back. */
TJ_API void tj_convert_to_f32(const void *src, tj_dtype d, int64_t n, float *dst);
TJ_API void tj_convert_from_f32(const float *src, int64_t n, tj_dtype d, void *dst);

/* ---- safetensors -------------------------------------------------------------------------- */

#define TJ_ST_MAX_DIMS 8

/* Only F32, F16 and BF16 tensors are usable; others are listed with dtype_ok = 0 so they can
 * still be copied through (the pruner does). */
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

TJ_API tj_status tj_st_open(const char *path, tj_st_file **out, tj_error *err);
TJ_API void tj_st_close(tj_st_file *f);
/* Borrowed pointer, or NULL when absent. O(log n). */
TJ_API const tj_st_tensor *tj_st_find(const tj_st_file *f, const char *name);

/* Writer: tensors given as name, dtype string, shape and bytes (copied as they are). */
typedef struct tj_st_out_tensor {
    const char *name;
    const char *dtype_str;    /* "F32", "F16", "BF16", or any dtype being copied through */
    int ndim;
    const int64_t *shape;
    const void *data;
    uint64_t nbytes;
} tj_st_out_tensor;

TJ_API tj_status tj_st_write(const char *path, const tj_st_out_tensor *tensors, int64_t n,
                             const char *metadata_json, tj_error *err);

/* Streaming writer: like tj_st_write, but a tensor whose data is NULL is produced on demand by
 * fill(user, index, buf, err), which must write its nbytes into buf (a scratch buffer owned by
 * the writer and reused from tensor to tensor), so a large model is written holding one
 * layer's output at a time. The file is written to a temporary name and renamed. */
typedef tj_status (*tj_st_fill_fn)(void *user, int64_t index, void *buf, tj_error *err);
TJ_API tj_status tj_st_write_stream(const char *path, const tj_st_out_tensor *tensors, int64_t n,
                                    const char *metadata_json, tj_st_fill_fn fill, void *user,
                                    tj_error *err);

/* ---- .npy ---------------------------------------------------------------------------------- */

/* 2-D, C order, '<f4' or '<f2'. */
typedef struct tj_npy {
    tj_dtype dtype;    /* TJ_F32 or TJ_F16 */
    int64_t rows, cols;
    void *data;        /* malloc'ed, rows·cols elements */
} tj_npy;

TJ_API tj_status tj_npy_read(const char *path, tj_npy *out, tj_error *err);
TJ_API tj_status tj_npy_write(const char *path, tj_dtype dtype, int64_t rows, int64_t cols,
                              const void *data, tj_error *err);
TJ_API void tj_npy_free(tj_npy *a);

/* ---- whole files ---------------------------------------------------------------------------- */

/* Reads a whole file into *out (malloc'ed, NUL-terminated; *len without the NUL, len may be
 * NULL). Files above max_bytes (0: no limit) are refused with TJ_ERR_FORMAT. */
TJ_API tj_status tj_file_read(const char *path, size_t max_bytes, char **out, size_t *len, tj_error *err);

#ifdef __cplusplus
}
#endif
#endif
