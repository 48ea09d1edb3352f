/* Element types of weights and activations, and fp16/bf16 ↔ fp32 conversion. */
#ifndef TJ_DTYPE_H
#define TJ_DTYPE_H

#include <stdint.h>
#include <string.h>

typedef enum tj_dtype { TJ_F32 = 0, TJ_F16, TJ_BF16 } tj_dtype;

static inline size_t tj_dtype_size(tj_dtype d) { return d == TJ_F32 ? 4 : 2; }
const char *tj_dtype_name(tj_dtype d); /* "F32", "F16", "BF16" (safetensors spelling) */

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

float tj_f16_to_f32(uint16_t h);
uint16_t tj_f32_to_f16(float f); /* round to nearest even, overflow to inf */

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

/* Converts n elements to fp32. */
void tj_convert_to_f32(const void *src, tj_dtype d, int64_t n, float *dst);
void tj_convert_from_f32(const float *src, int64_t n, tj_dtype d, void *dst);

#endif
