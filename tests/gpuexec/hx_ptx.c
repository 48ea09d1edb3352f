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
uint32_t tj_hx_ptx_wgmma_addr(uint64_t desc, int trans, int mn, int k, int *base_offset)
{
    uint32_t start = (uint32_t)(desc & 0x3fffu) << 4, lbo = (uint32_t)((desc >> 16) & 0x3fffu) << 4,
             sbo = (uint32_t)((desc >> 32) & 0x3fffu) << 4;
    int mode = (int)(desc >> 62) & 3, bits = mode == 1 ? 3 : mode == 2 ? 2 : mode == 3 ? 1 : 0, w = 1 << bits;
    if (base_offset) *base_offset = (int)((desc >> 49) & 7u);
    uint32_t off;
    if (trans) {
        uint32_t u = (uint32_t)mn / 8, e = (uint32_t)mn % 8;
        if (mode == 0)
            off = e * 2 + u * sbo + (uint32_t)(k % 8) * 16 + (uint32_t)(k / 8) * lbo;
        else
            off = e * 2 + (u % (uint32_t)w) * 16 + (u / (uint32_t)w) * lbo + (uint32_t)(k % 8) * 16u * (uint32_t)w +
                  (uint32_t)(k / 8) * sbo;
    } else {
        uint32_t e = (uint32_t)k % 8, u = (uint32_t)k / 8;
        off = e * 2 + (uint32_t)(mn % 8) * 16u * (uint32_t)w + (uint32_t)(mn / 8) * sbo + u * (mode == 0 ? lbo : 16u);
    }
    uint32_t addr = start + off;
    if (bits) addr ^= ((addr >> 7) & (uint32_t)(w - 1)) << 4;
    return addr;
}

void tj_hx_ptx_wgmma(const uint16_t a[64][16], const uint16_t (*b)[256], int n, int bf16, float cd[128][128])
{
    for (int t = 0; t < 128; t++) {
        int w = t / 32, g = (t % 32) / 4, q = t % 4;
        for (int i = 0; i < n / 2; i++) {
            int j = i / 4, r = i % 4, row = 16 * w + g + 8 * (r / 2), col = 8 * j + 2 * q + r % 2;
            float acc = cd[t][i];
            for (int k = 0; k < 16; k++) {
                float x = bf16 ? tj_hx_ptx_bf16_to_f32(a[row][k]) : tj_hx_ptx_cvt_f32_f16(a[row][k]);
                float y = bf16 ? tj_hx_ptx_bf16_to_f32(b[k][col]) : tj_hx_ptx_cvt_f32_f16(b[k][col]);
                acc += x * y;
            }
            cd[t][i] = acc;
        }
    }
}

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
    {"asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\\n\" ::\"r\"(bar), \"r\"(count) : \"memory\");",
     "tj_hx_mbarrier_init"},
    {"asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n\" ::\"r\"(bar), \"r\"(bytes) : \"memory\");",
     "tj_hx_mbarrier_arrive_expect_tx"},
    {"asm volatile(\"{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\\n\" : \"=r\"(ok) : \"r\"(bar), \"r\"(parity) : \"memory\");",
     "tj_hx_mbarrier_try_wait_parity"},
    {"asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\\n\" ::\"r\"(dst), \"l\"(src), \"r\"(bytes), \"r\"(bar) : \"memory\");",
     "tj_hx_cp_async_bulk"},
    {"asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\");",
     "tj_hx_fence_proxy_async"},
    {"asm volatile(\"wgmma.fence.sync.aligned;\\n\" ::: \"memory\");",
     "tj_hx_wgmma_fence"},
    {"asm volatile(\"wgmma.commit_group.sync.aligned;\\n\" ::: \"memory\");",
     "tj_hx_wgmma_commit_group"},
    {"asm volatile(\"wgmma.wait_group.sync.aligned %0;\\n\" ::\"n\"(N) : \"memory\");",
     "tj_hx_wgmma_wait_group"},
    {"asm volatile(\"\" : \"+f\"(r)::\"memory\");",
     "tj_wg_pin (no instruction: a register constraint, nothing on the host)"},
    {"asm volatile(\"{ .reg .pred p; setp.ne.b32 p, %34, 0;\\n\" \"wgmma.mma_async.sync.aligned.m64n64k16.f32.\" TJ_WG_AB \" \" \"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, \" \"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, \" \"%32, %33, p, 1, 1, 1, 1; }\\n\" : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3]), \"+f\"(d[4]), \"+f\"(d[5]), \"+f\"(d[6]), \"+f\"(d[7]), \"+f\"(d[8]), \"+f\"(d[9]), \"+f\"(d[10]), \"+f\"(d[11]), \"+f\"(d[12]), \"+f\"(d[13]), \"+f\"(d[14]), \"+f\"(d[15]), \"+f\"(d[16]), \"+f\"(d[17]), \"+f\"(d[18]), \"+f\"(d[19]), \"+f\"(d[20]), \"+f\"(d[21]), \"+f\"(d[22]), \"+f\"(d[23]), \"+f\"(d[24]), \"+f\"(d[25]), \"+f\"(d[26]), \"+f\"(d[27]), \"+f\"(d[28]), \"+f\"(d[29]), \"+f\"(d[30]), \"+f\"(d[31]) : \"l\"(desc_a), \"l\"(desc_b), \"r\"(scale_d) : \"memory\");",
     "tj_hx_wgmma_mma_async"},
    {"asm volatile(\"{ .reg .pred p; setp.ne.b32 p, %66, 0;\\n\" \"wgmma.mma_async.sync.aligned.m64n128k16.f32.\" TJ_WG_AB \" \" \"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, \" \"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, \" \"%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, \" \"%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, \" \"%64, %65, p, 1, 1, 1, 1; }\\n\" : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3]), \"+f\"(d[4]), \"+f\"(d[5]), \"+f\"(d[6]), \"+f\"(d[7]), \"+f\"(d[8]), \"+f\"(d[9]), \"+f\"(d[10]), \"+f\"(d[11]), \"+f\"(d[12]), \"+f\"(d[13]), \"+f\"(d[14]), \"+f\"(d[15]), \"+f\"(d[16]), \"+f\"(d[17]), \"+f\"(d[18]), \"+f\"(d[19]), \"+f\"(d[20]), \"+f\"(d[21]), \"+f\"(d[22]), \"+f\"(d[23]), \"+f\"(d[24]), \"+f\"(d[25]), \"+f\"(d[26]), \"+f\"(d[27]), \"+f\"(d[28]), \"+f\"(d[29]), \"+f\"(d[30]), \"+f\"(d[31]), \"+f\"(d[32]), \"+f\"(d[33]), \"+f\"(d[34]), \"+f\"(d[35]), \"+f\"(d[36]), \"+f\"(d[37]), \"+f\"(d[38]), \"+f\"(d[39]), \"+f\"(d[40]), \"+f\"(d[41]), \"+f\"(d[42]), \"+f\"(d[43]), \"+f\"(d[44]), \"+f\"(d[45]), \"+f\"(d[46]), \"+f\"(d[47]), \"+f\"(d[48]), \"+f\"(d[49]), \"+f\"(d[50]), \"+f\"(d[51]), \"+f\"(d[52]), \"+f\"(d[53]), \"+f\"(d[54]), \"+f\"(d[55]), \"+f\"(d[56]), \"+f\"(d[57]), \"+f\"(d[58]), \"+f\"(d[59]), \"+f\"(d[60]), \"+f\"(d[61]), \"+f\"(d[62]), \"+f\"(d[63]) : \"l\"(desc_a), \"l\"(desc_b), \"r\"(scale_d) : \"memory\");",
     "tj_hx_wgmma_mma_async"},
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
