/* fp16/bf16 conversion in plain C (no F16C dependency: the reference must run anywhere). */
#include "base/dtype.h"

const char *tj_dtype_name(tj_dtype d)
{
    switch (d) {
    case TJ_F16: return "F16";
    case TJ_BF16: return "BF16";
    default: return "F32";
    }
}

float tj_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t tj_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff);
    uint32_t man = u & 0x7fffff;
    if (exp == 255) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int32_t e = exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) { /* subnormal or zero */
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into the exponent: right */
    return (uint16_t)half;
}

void tj_convert_to_f32(const void *src, tj_dtype d, int64_t n, float *dst)
{
    if (d == TJ_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    if (d == TJ_F16) /* src may be unaligned (mapped weights): tj_load_u16 */
        for (int64_t i = 0; i < n; i++) dst[i] = tj_f16_to_f32(tj_load_u16(src, i));
    else
        for (int64_t i = 0; i < n; i++) dst[i] = tj_bf16_to_f32(tj_load_u16(src, i));
}

void tj_convert_from_f32(const float *src, int64_t n, tj_dtype d, void *dst)
{
    if (d == TJ_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    uint16_t *o = dst;
    if (d == TJ_F16)
        for (int64_t i = 0; i < n; i++) o[i] = tj_f32_to_f16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) o[i] = tj_f32_to_bf16(src[i]);
}
