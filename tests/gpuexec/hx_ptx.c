/* PTX semantics for the host executor (hx_ptx.h): conversions, ldmatrix and mma.sync fragments,
 * and the table of inline-PTX statements that have a host twin. Written from the PTX ISA's own
 * definitions; independent of runtime/dtype.c, whose conversions the reference uses. */
#include "hx_ptx.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float tj_hx_ptx_cvt_f32_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13)); /* inf, NaN (payload kept) */
    double v = e == 0 ? ldexp((double)m, -24) : ldexp((double)(1024 + m), (int)e - 25);
    return sign ? -(float)v : (float)v;
}

uint16_t tj_hx_ptx_cvt_rn_f16_f32(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff; /* canonical NaN */
    double v = fabs((double)f);
    if (isinf(v)) return sign | 0x7c00u;
    if (v < ldexp(1.0, -14)) { /* subnormal (or rounds up to the smallest normal: 1024 = 0x400) */
        double q = rint(ldexp(v, 24)); /* exact scaling; rint rounds to nearest even */
        return (uint16_t)(sign | (uint16_t)q);
    }
    int E;
    (void)frexp(v, &E); /* v = m·2^E, m in [0.5, 1): exponent E − 1 */
    double q = rint(ldexp(v, 10 - (E - 1))); /* in [1024, 2048] */
    if (q == 2048.0) {
        q = 1024.0;
        E++;
    }
    int be = E - 1 + 15;
    if (be >= 31) return sign | 0x7c00u; /* overflow to infinity */
    return (uint16_t)(sign | (uint16_t)(be << 10) | (uint16_t)((uint32_t)q - 1024u));
}

uint16_t tj_hx_ptx_cvt_rn_bf16_f32(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff; /* canonical NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; carries into the exponent (to inf) */
    return (uint16_t)(u >> 16);
}

float tj_hx_ptx_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint32_t tj_hx_ptx_cvt_rn_f16x2_f32(float a, float b)
{
    return ((uint32_t)tj_hx_ptx_cvt_rn_f16_f32(a) << 16) | tj_hx_ptx_cvt_rn_f16_f32(b);
}

uint32_t tj_hx_ptx_cvt_rn_bf16x2_f32(float a, float b)
{
    return ((uint32_t)tj_hx_ptx_cvt_rn_bf16_f32(a) << 16) | tj_hx_ptx_cvt_rn_bf16_f32(b);
}

void tj_hx_ptx_ldmatrix(const uint16_t rows[4][8][8], int num, int trans, uint32_t out[32][4])
{
    for (int lane = 0; lane < 32; lane++)
        for (int j = 0; j < 4; j++) {
            if (j >= num) {
                out[lane][j] = 0;
                continue;
            }
            uint16_t lo, hi;
            if (trans) {
                lo = rows[j][2 * (lane % 4)][lane / 4];
                hi = rows[j][2 * (lane % 4) + 1][lane / 4];
            } else {
                lo = rows[j][lane / 4][2 * (lane % 4)];
                hi = rows[j][lane / 4][2 * (lane % 4) + 1];
            }
            out[lane][j] = (uint32_t)lo | ((uint32_t)hi << 16);
        }
}

static float in16(uint16_t h, int bf16) { return bf16 ? tj_hx_ptx_bf16_to_f32(h) : tj_hx_ptx_cvt_f32_f16(h); }

void tj_hx_ptx_mma_m16n8k16(const uint32_t a[32][4], const uint32_t b[32][2], float cd[32][4], int bf16)
{
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; lane++) {
        int g = lane / 4, t = lane % 4;
        for (int e = 0; e < 2; e++) {
            int sh = 16 * e; /* element e of a register: low half first */
            A[g][2 * t + e] = in16((uint16_t)(a[lane][0] >> sh), bf16);
            A[g + 8][2 * t + e] = in16((uint16_t)(a[lane][1] >> sh), bf16);
            A[g][2 * t + 8 + e] = in16((uint16_t)(a[lane][2] >> sh), bf16);
            A[g + 8][2 * t + 8 + e] = in16((uint16_t)(a[lane][3] >> sh), bf16);
            B[2 * t + e][g] = in16((uint16_t)(b[lane][0] >> sh), bf16);
            B[2 * t + 8 + e][g] = in16((uint16_t)(b[lane][1] >> sh), bf16);
            C[g][2 * t + e] = cd[lane][e];
            C[g + 8][2 * t + e] = cd[lane][2 + e];
        }
    }
    for (int lane = 0; lane < 32; lane++) {
        int g = lane / 4, t = lane % 4;
        for (int r = 0; r < 4; r++) {
            int row = g + (r >= 2 ? 8 : 0), col = 2 * t + (r & 1);
            float acc = C[row][col];
            for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
            cd[lane][r] = acc;
        }
    }
}

/* Every inline PTX statement of the templates (templates/, .cu files) and of gen/emit_cuda.c's unrolled offsets,
 * whitespace collapsed, with its twin. Editing a statement means editing its twin and this line. */
const tj_hx_ptx_form tj_hx_ptx_forms[] = {
    {"asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\" ::\"r\"(dst), \"l\"(src), \"r\"(bytes));",
     "tj_hx_cp_async_cg_16"},
    {"asm volatile(\"cp.async.commit_group;\\n\" ::);",
     "tj_hx_cp_async_commit_group"},
    {"asm volatile(\"cp.async.wait_group %0;\\n\" ::\"n\"(N));",
     "tj_hx_cp_async_wait_group"},
    {"asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\\n\" : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(addr));",
     "tj_hx_ldmatrix_x4_trans"},
    {"asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 \" \"{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n\" : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3]) : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));",
     "tj_hx_mma_m16n8k16_f32_bf16"},
    {"asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 \" \"{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n\" : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3]) : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));",
     "tj_hx_mma_m16n8k16_f32_f16"},
    {"asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));",
     "tj_hx_cvt_f32_f16"},
    {"asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v));",
     "tj_hx_cvt_rn_bf16_f32"},
    {"asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(u) : \"f\"(hi), \"f\"(lo));",
     "tj_hx_cvt_rn_bf16x2_f32"},
    {"asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v));",
     "tj_hx_cvt_rn_f16_f32"},
    {"asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(u) : \"f\"(hi), \"f\"(lo));",
     "tj_hx_cvt_rn_f16x2_f32"},
    {"asm(\"mov.b32 %0, \" #v \";\" : \"=r\"(o.base))",
     "TJ_BASE (emitter, assignment)"},
    {"asm(\"mov.b64 %0, \" #a \"; mov.b64 %1, \" #b \"; mov.b64 %2, \" #c \"; mov.b64 %3, \" #d \";\" : \"=l\"(o.w[i]), \"=l\"(o.w[i + 1]), \"=l\"(o.w[i + 2]), \"=l\"(o.w[i + 3]))",
     "TJ_IMM4 (emitter, assignments)"},
    {"asm(\"mov.b64 %0, \" #a \"; mov.b64 %1, \" #b \";\" : \"=l\"(o.w[i]), \"=l\"(o.w[i + 1]))",
     "TJ_IMM2 (emitter, assignments)"},
    {"asm(\"{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\" : \"=r\"(s) : \"l\"(p));",
     "tj_hx_cvta_to_shared"},
    {NULL, NULL},
};

/* The statement starting at p ("asm" ... ";"), line continuations dropped and whitespace
 * collapsed, into out; returns the end. Strings are copied as written. */
static const char *asm_statement(const char *p, char *out, size_t cap)
{
    size_t n = 0;
    int depth = 0, started = 0, space = 0;
    while (*p) {
        char ch = *p;
        if (ch == '\\' && p[1] == '\n') {
            p += 2;
            continue;
        }
        if (ch == '"') { /* a string literal, verbatim */
            const char *q = p + 1;
            while (*q && *q != '"') q += (*q == '\\' && q[1]) ? 2 : 1;
            if (space && n && n + 1 < cap) out[n++] = ' ';
            space = 0;
            for (const char *r = p; r <= q && *r; r++)
                if (n + 1 < cap) out[n++] = *r;
            p = *q ? q + 1 : q;
            continue;
        }
        if (ch == ' ' || ch == '\t' || ch == '\n') {
            space = 1;
            p++;
            continue;
        }
        if (space && n && n + 1 < cap) out[n++] = ' ';
        space = 0;
        if (n + 1 < cap) out[n++] = ch;
        p++;
        if (ch == '(') {
            depth++;
            started = 1;
        } else if (ch == ')' && --depth == 0 && started) {
            while (*p == ' ' || *p == '\t') p++;
            if (*p == ';' && n + 1 < cap) { /* a statement; without ';' the body of a macro */
                out[n++] = ';';
                p++;
            }
            break;
        }
    }
    out[n] = '\0';
    return p;
}

static int is_ident(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

int tj_hx_ptx_check_forms(const char *src, int *total, char *first_unknown, size_t cap)
{
    int bad = 0, all = 0;
    if (cap) first_unknown[0] = '\0';
    char stmt[2048];
    for (const char *p = src; (p = strstr(p, "asm")) != NULL;) {
        if ((p > src && is_ident(p[-1])) || is_ident(p[3])) {
            p += 3;
            continue;
        }
        const char *q = p + 3;
        while (*q == ' ') q++;
        if (strncmp(q, "volatile", 8) == 0) q += 8;
        while (*q == ' ') q++;
        if (*q != '(') {
            p += 3;
            continue;
        }
        p = asm_statement(p, stmt, sizeof stmt);
        all++;
        int known = 0;
        for (int i = 0; tj_hx_ptx_forms[i].asm_text && !known; i++) known = strcmp(stmt, tj_hx_ptx_forms[i].asm_text) == 0;
        if (!known && !bad++ && cap) snprintf(first_unknown, cap, "%s", stmt);
    }
    if (total) *total = all;
    return bad;
}
