/* The host executor's own checks: PTX semantics against the ISA's fragment figures and a plain
 * GEMM; conversions against an independent implementation; then small hand-written kernels, each
 * with one known defect (a race, a diverged warp collective, a deadlock, an out-of-bounds or
 * misaligned access, cp.async data read before its wait, ...), that must each be reported with
 * the right source line, next to their correct twins that must run clean. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/rng.h"
#include "hx.h"
#include "hx_ptx.h"
#include "tj_test.h"

/* ---- PTX semantics ---- */

static void test_conversions(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) { /* every fp16 value */
        float a = tj_hx_ptx_cvt_f32_f16((uint16_t)h), b = tj_f16_to_f32((uint16_t)h);
        if (!(a == b || (isnan(a) && isnan(b))) || (!isnan(a) && signbit(a) != signbit(b))) bad++;
        float c = tj_hx_ptx_bf16_to_f32((uint16_t)h), d = tj_bf16_to_f32((uint16_t)h);
        if (memcmp(&c, &d, 4) != 0) bad++;
    }
    CHECKF(bad == 0, "%d fp16/bf16 -> fp32 conversions differ", bad);
    tj_rng r = {42};
    bad = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)tj_rng_next(&r);
        if (i % 3 == 0) u = (u & 0x87ffffffu) | 0x38000000u; /* near fp16's range */
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        if (tj_hx_ptx_cvt_rn_f16_f32(f) != tj_f32_to_f16(f)) bad++;
        if (tj_hx_ptx_cvt_rn_bf16_f32(f) != tj_f32_to_bf16(f)) bad++;
    }
    CHECKF(bad == 0, "%d fp32 -> fp16/bf16 roundings differ from runtime/dtype.c", bad);
    /* ties to even, overflow, the smallest subnormal, NaN */
    CHECK(tj_hx_ptx_cvt_rn_f16_f32(1.0f + 1.0f / 2048) == 0x3c00);              /* tie: down to even */
    CHECK(tj_hx_ptx_cvt_rn_f16_f32(1.0f + 3.0f / 2048) == 0x3c02);              /* tie: up to even */
    CHECK(tj_hx_ptx_cvt_rn_f16_f32(65520.0f) == 0x7c00);                        /* rounds to infinity */
    CHECK(tj_hx_ptx_cvt_rn_f16_f32(65519.0f) == 0x7bff);
    CHECK(tj_hx_ptx_cvt_rn_f16_f32(ldexpf(1.0f, -24)) == 0x0001);
    CHECK(tj_hx_ptx_cvt_rn_f16_f32(ldexpf(1.0f, -25)) == 0x0000);               /* tie: to even (0) */
    CHECK(tj_hx_ptx_cvt_rn_f16_f32(-ldexpf(3.0f, -26)) == 0x8001);
    CHECK(tj_hx_ptx_cvt_rn_f16_f32(NAN) == 0x7fff && tj_hx_ptx_cvt_rn_bf16_f32(NAN) == 0x7fff);
    CHECK(tj_hx_ptx_cvt_rn_bf16_f32(1.0f + 1.0f / 256) == 0x3f80);
    CHECK(tj_hx_ptx_cvt_rn_bf16_f32(1.0f + 3.0f / 256) == 0x3f82);
    /* x2: a to the upper half, b to the lower */
    CHECK(tj_hx_ptx_cvt_rn_f16x2_f32(1.0f, 2.0f) == 0x3c004000u);
    CHECK(tj_hx_ptx_cvt_rn_bf16x2_f32(1.0f, 2.0f) == 0x3f804000u);
}

static void test_fragments(void)
{
    /* ldmatrix without .trans: "each thread receives 2 elements of one row" — lane l gets row l/4,
     * elements 2(l%4) and 2(l%4)+1 of each matrix (PTX ISA, ldmatrix fragment figure). */
    uint16_t rows[4][8][8];
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 8; i++)
            for (int c = 0; c < 8; c++) rows[j][i][c] = (uint16_t)(j * 64 + i * 8 + c);
    uint32_t out[32][4];
    tj_hx_ptx_ldmatrix(rows, 4, 0, out);
    CHECK(out[0][0] == (0u | 1u << 16));
    CHECK(out[5][0] == ((uint32_t)(1 * 8 + 2) | (uint32_t)(1 * 8 + 3) << 16));
    CHECK(out[31][3] == ((uint32_t)(3 * 64 + 7 * 8 + 6) | (uint32_t)(3 * 64 + 7 * 8 + 7) << 16));
    /* .trans: lane l gets column l/4, rows 2(l%4) and 2(l%4)+1 */
    tj_hx_ptx_ldmatrix(rows, 4, 1, out);
    CHECK(out[0][0] == (0u | (uint32_t)8 << 16));
    CHECK(out[5][1] == ((uint32_t)(64 + 2 * 8 + 1) | (uint32_t)(64 + 3 * 8 + 1) << 16));
    tj_hx_ptx_ldmatrix(rows, 2, 0, out);
    CHECK(out[9][2] == 0 && out[9][1] == ((uint32_t)(64 + 2 * 8 + 2) | (uint32_t)(64 + 2 * 8 + 3) << 16));

    /* mma.m16n8k16 against a plain GEMM, with operands loaded the way CUDA code does it: A row-major
     * through ldmatrix.x4 (lane l points at row l%16, column 8(l/16)), B stored k-major [16][8]
     * through ldmatrix.x2.trans (lane l points at row l%16). */
    tj_rng r = {7};
    for (int bf = 0; bf < 2; bf++) {
        float A[16][16], B[16][8], C[16][8];
        uint16_t Ah[16][16], Bh[16][8];
        for (int i = 0; i < 16; i++)
            for (int k = 0; k < 16; k++) {
                float v = tj_rng_uniform(&r);
                Ah[i][k] = bf ? tj_f32_to_bf16(v) : tj_f32_to_f16(v);
                A[i][k] = bf ? tj_bf16_to_f32(Ah[i][k]) : tj_f16_to_f32(Ah[i][k]);
            }
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8; n++) {
                float v = tj_rng_uniform(&r);
                Bh[k][n] = bf ? tj_f32_to_bf16(v) : tj_f32_to_f16(v);
                B[k][n] = bf ? tj_bf16_to_f32(Bh[k][n]) : tj_f16_to_f32(Bh[k][n]);
            }
        for (int i = 0; i < 16; i++)
            for (int n = 0; n < 8; n++) C[i][n] = tj_rng_uniform(&r);
        uint16_t ra[4][8][8], rb[4][8][8];
        memset(rb, 0, sizeof rb);
        for (int l = 0; l < 32; l++) { /* the row each lane's address points at */
            int j = l / 8, i = l % 8;
            memcpy(ra[j][i], &Ah[l % 16][8 * (l / 16)], 16);
            if (l < 16) memcpy(rb[j][i], &Bh[l % 16][0], 16);
        }
        uint32_t fa[32][4], fb4[32][4], fb[32][2];
        tj_hx_ptx_ldmatrix(ra, 4, 0, fa);
        tj_hx_ptx_ldmatrix(rb, 2, 1, fb4);
        float cd[32][4];
        for (int l = 0; l < 32; l++) {
            fb[l][0] = fb4[l][0];
            fb[l][1] = fb4[l][1];
            int g = l / 4, t = l % 4;
            cd[l][0] = C[g][2 * t];
            cd[l][1] = C[g][2 * t + 1];
            cd[l][2] = C[g + 8][2 * t];
            cd[l][3] = C[g + 8][2 * t + 1];
        }
        tj_hx_ptx_mma_m16n8k16(fa, fb, cd, bf);
        double err = 0;
        for (int l = 0; l < 32; l++) {
            int g = l / 4, t = l % 4;
            for (int e = 0; e < 4; e++) {
                int i = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
                double want = C[i][n];
                for (int k = 0; k < 16; k++) want += (double)A[i][k] * B[k][n];
                err = fmax(err, fabs(cd[l][e] - want));
            }
        }
        CHECKF(err < 1e-5, "mma %s: max error %g against the plain GEMM", bf ? "bf16" : "f16", err);
    }
}


/* Byte offset of element (mn, k) of a 16-bit MN-major operand in the 128-byte-swizzled layout,
 * stated as the ISA's figure draws it (not as hx_ptx.c computes it): the k-th 128-byte line of
 * the 64-element group mn / 64 (groups lbo bytes apart) holds elements mn % 64 as eight 16-byte
 * pieces, and piece j of line L sits in slot j ^ (L % 8) of that line. Tile 1024-byte aligned. */
static uint32_t sw128_mn(int mn, int k, uint32_t lbo)
{
    uint32_t line = (uint32_t)(mn / 64) * (lbo / 128) + (uint32_t)k, piece = (uint32_t)(mn % 64) / 8;
    return line * 128 + ((piece ^ (line % 8)) * 16) + (uint32_t)(mn % 8) * 2;
}

static uint64_t desc_of(uint32_t addr, uint32_t lbo, uint32_t sbo, int mode)
{
    return (uint64_t)(addr >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | (uint64_t)mode << 62;
}

static void test_wgmma(void)
{
    /* K-major, 128-byte swizzle: row mn is a 128-byte line (8 rows per 1024-byte atom, SBO
     * between atoms), k's 16-byte piece swizzled by the line: (mn 1, k 0) -> 128 + 16. */
    CHECK(tj_hx_ptx_wgmma_addr(desc_of(0, 16, 1024, 1), 0, 1, 0, NULL) == 144);
    CHECK(tj_hx_ptx_wgmma_addr(desc_of(0, 16, 1024, 1), 0, 9, 8, NULL) == 1024 + 128 + (1 ^ 1) * 16);
    /* no swizzle (interleave), MN-major: 8 x 16-byte core matrices, (mn 8) at SBO, (k 8) at LBO */
    CHECK(tj_hx_ptx_wgmma_addr(desc_of(2048, 256, 512, 0), 1, 9, 9, NULL) == 2048 + 2 + 512 + 16 + 256);
    tj_rng r = {15};
    static uint8_t smem[65536];
    for (int bf = 0; bf < 2; bf++)
        for (int n = 64; n <= 128; n += 64) {
            /* A: 64 x 16 (M-major) at 1024, B: 16 x n (N-major) at 8192; lbo = 16 lines per group */
            const uint32_t abase = 1024, bbase = 8192, lbo = 16 * 128;
            uint16_t A[64][16], B[16][256];
            memset(smem, 0xff, sizeof smem);
            for (int m = 0; m < 64; m++)
                for (int k = 0; k < 16; k++) {
                    float v = tj_rng_uniform(&r) * 2 - 1;
                    A[m][k] = bf ? tj_f32_to_bf16(v) : tj_f32_to_f16(v);
                    memcpy(smem + abase + sw128_mn(m, k, lbo), &A[m][k], 2);
                }
            for (int k = 0; k < 16; k++)
                for (int j = 0; j < n; j++) {
                    float v = tj_rng_uniform(&r) * 2 - 1;
                    B[k][j] = bf ? tj_f32_to_bf16(v) : tj_f32_to_f16(v);
                    memcpy(smem + bbase + sw128_mn(j, k, lbo), &B[k][j], 2);
                }
            static float C[64][128], cd[128][128];
            for (int m = 0; m < 64; m++)
                for (int j = 0; j < n; j++) C[m][j] = tj_rng_uniform(&r);
            for (int t = 0; t < 128; t++) /* the accumulator fragment, from the ISA's figure */
                for (int i = 0; i < n / 2; i++)
                    cd[t][i] = C[16 * (t / 32) + (t % 32) / 4 + 8 * (i % 4 / 2)][8 * (i / 4) + 2 * (t % 4) + i % 2];
            /* gather through the descriptors, as the executor does at a wgmma */
            for (int mode = 1; mode >= 0; mode--) {
                uint64_t da = desc_of(abase, lbo, 1024, mode), db = desc_of(bbase, lbo, 1024, mode);
                uint16_t ga[64][16], gb[16][256];
                for (int m = 0; m < 64; m++)
                    for (int k = 0; k < 16; k++) memcpy(&ga[m][k], smem + tj_hx_ptx_wgmma_addr(da, 1, m, k, NULL), 2);
                for (int k = 0; k < 16; k++)
                    for (int j = 0; j < n; j++) memcpy(&gb[k][j], smem + tj_hx_ptx_wgmma_addr(db, 1, j, k, NULL), 2);
                static float got[128][128];
                memcpy(got, cd, sizeof got);
                tj_hx_ptx_wgmma(ga, (const uint16_t (*)[256])gb, n, bf, got);
                double err = 0;
                for (int t = 0; t < 128; t++)
                    for (int i = 0; i < n / 2; i++) {
                        int m = 16 * (t / 32) + (t % 32) / 4 + 8 * (i % 4 / 2), j = 8 * (i / 4) + 2 * (t % 4) + i % 2;
                        double want = C[m][j];
                        for (int k = 0; k < 16; k++) {
                            double a = bf ? tj_bf16_to_f32(A[m][k]) : tj_f16_to_f32(A[m][k]);
                            double b = bf ? tj_bf16_to_f32(B[k][j]) : tj_f16_to_f32(B[k][j]);
                            want += a * b;
                        }
                        double d = fabs(got[t][i] - want);
                        err = d > err || isnan(d) ? (isnan(d) ? INFINITY : d) : err;
                    }
                if (mode == 1)
                    CHECKF(err < 1e-4, "wgmma m64n%dk16 %s, 128-byte swizzle: max error %g against the plain GEMM", n,
                           bf ? "bf16" : "f16", err);
                else /* the same bytes read without the swizzle must come out wrong */
                    CHECKF(err > 1e-2, "wgmma m64n%dk16 read with the wrong swizzle still matched (error %g)", n, err);
            }
        }
}

/* ---- hand-written kernels ---- */

typedef struct kparams {
    float *x;
    float *y;
    int n;
} kparams;

static void invoke(void (*kernel)(void), const void *params)
{
    void (*fn)(kparams);
    memcpy(&fn, &kernel, sizeof fn);
    fn(*(const kparams *)params);
}

/* Runs `body` (the text of a kernel `k(kparams p)`), 1 block of `threads`, smem bytes of dynamic
 * shared memory. want == NULL: must run clean; else the report must contain want (and, if line
 * > 0, "test.cu:<line>"). */
static void expect(tj_hx_exec *e, const char *what, const char *body, int threads, unsigned smem, const char *want, int line)
{
    static char src[8192];
    snprintf(src, sizeof src,
             "struct kparams { float *x; float *y; int n; };\n" /* line 1 */
             "extern \"C\" __global__ void k(kparams p)\n"      /* line 2 */
             "{\n"                                              /* line 3 */
             "    extern __shared__ __align__(16) unsigned char smem[];\n"
             "    const int t = threadIdx.x;\n" /* line 5; the body starts at line 6 */
             "%s"
             "}\n",
             body);
    tj_error err = {0};
    tj_hx_module *m = NULL;
    tj_status st = tj_hx_module_build(NULL, src, &m, NULL, &err);
    CHECKF(st == TJ_OK, "%s: build: %s", what, err.msg);
    if (st) return;
    const char *names[] = {"test.cu"};
    const char *texts[] = {src};
    tj_hx_exec_set_origins(e, names, texts, 1);
    _Alignas(16) float x[80]; /* 64 registered: x[64] is out of bounds, not y */
    _Alignas(16) float y[64];
    for (int i = 0; i < 80; i++) x[i] = (float)i;
    memset(y, 0, sizeof y);
    kparams p = {x, y, 64};
    tj_hx_buffers_clear(e);
    CHECK_OK(tj_hx_buffer_add(e, "x", x, 64 * sizeof *x, 0, &err), &err);
    CHECK_OK(tj_hx_buffer_add(e, "y", y, sizeof y, 1, &err), &err);
    tj_hx_dim3 grid = {1, 1, 1}, block = {(unsigned)threads, 1, 1};
    st = tj_hx_launch(e, m, "k", grid, block, smem, invoke, &p, NULL, &err);
    const char *rep = tj_hx_exec_report(e);
    if (!want) {
        CHECKF(st == TJ_OK, "%s: should run clean: %s", what, err.msg);
    } else {
        char place[32];
        snprintf(place, sizeof place, "test.cu:%d", line);
        CHECKF(st == TJ_ERR_DEVICE && strstr(rep, want) && (line <= 0 || strstr(rep, place)),
               "%s: expected a report with '%s' at %s; got status %d:\n%s", what, want, line > 0 ? place : "-", st, rep);
    }
    tj_hx_exec_set_origins(e, NULL, NULL, 0);
    tj_hx_module_destroy(m);
}

static void test_detectors(tj_hx_exec *e)
{
    /* the body's first line is line 6 of test.cu */
    expect(e, "barrier-separated shared memory", "    if (t == 0) smem[0] = 1;\n    __syncthreads();\n"
           "    p.y[t] = smem[0];\n", 64, 16, NULL, 0);
    expect(e, "race: read of another thread's write, no barrier", "    if (t == 0) smem[0] = 1;\n"
           "    p.y[t] = smem[0];\n", 64, 16, "race: reads shared byte 0 written by thread 0", 7);
    expect(e, "race: write after another thread's read", "    smem[t] = 1;\n    __syncthreads();\n"
           "    p.y[t] = smem[t == 0 ? 40 : t];\n    if (t == 5) smem[40] = 3;\n", 64, 64,
           "race: writes shared byte 40 read by thread 0", 9);
    expect(e, "uninitialised shared memory", "    p.y[t] = smem[t];\n", 32, 64, "that no thread of the block wrote", 6);
    expect(e, "deadlock: __syncthreads in divergent code", "    if (t < 32) __syncthreads();\n    p.y[t] = 1;\n", 64, 0,
           "thread exited while 32 thread(s) wait for it at __syncthreads", 0);
    expect(e, "out-of-bounds global read", "    p.y[t] = p.x[t + 1];\n", 64, 0,
           "out-of-bounds global read of 4 bytes at byte 256 of 'x'", 6);
    expect(e, "write to a read-only buffer", "    if (t == 3) p.x[0] = 1;\n", 32, 0, "read-only buffer 'x'", 6);
    expect(e, "misaligned vector store", "    if (t == 0) *(float2 *)(p.y + 1) = make_float2(1, 2);\n", 32, 0,
           "misaligned 8-byte store", 6);
    expect(e, "shared memory beyond the launch's size", "    if (t == 0) smem[64] = 1;\n", 32, 64,
           "outside the launch's 64 bytes of shared memory", 6);
    expect(e, "global write race", "    p.y[t % 2] = t;\n", 32, 0, "race: writes byte 0 of 'y'", 6);
    /* cp.async: data lands at the wait; the barrier makes it everyone's */
    expect(e, "cp.async, wait, barrier", "    if (t < 4) {\n    tj_hx_cp_async_cg_16(tj_hx_cvta_to_shared(smem + 16 * t), p.x + 4 * t, 16);\n"
           "    }\n    tj_hx_cp_async_commit_group();\n    tj_hx_cp_async_wait_group(0);\n    __syncthreads();\n"
           "    p.y[t] = ((float *)smem)[t % 16];\n", 32, 64, NULL, 0);
    expect(e, "cp.async read before its wait", "    if (t < 4) tj_hx_cp_async_cg_16(tj_hx_cvta_to_shared(smem + 16 * t), p.x + 4 * t, 16);\n"
           "    tj_hx_cp_async_commit_group();\n    __syncthreads();\n    p.y[t] = ((float *)smem)[t % 16];\n"
           "    tj_hx_cp_async_wait_group(0);\n", 32, 64, "cp.async to it is in flight", 9);
    expect(e, "cp.async waited, no barrier before other threads read",
           "    if (t < 4) tj_hx_cp_async_cg_16(tj_hx_cvta_to_shared(smem + 16 * t), p.x + 4 * t, 16);\n"
           "    tj_hx_cp_async_commit_group();\n    tj_hx_cp_async_wait_group(0);\n    p.y[t] = ((float *)smem)[(t + 4) % 16];\n",
           32, 64, "race: cp.async to shared byte 16 read by another thread", 6);
    expect(e, "cp.async zero fill (src-size 0) and wait_group 1 keeps the newest group in flight",
           "    tj_hx_cp_async_cg_16(tj_hx_cvta_to_shared(smem + 16 * t), p.x, 0);\n    tj_hx_cp_async_commit_group();\n"
           "    tj_hx_cp_async_cg_16(tj_hx_cvta_to_shared(smem + 512 + 16 * t), p.x + 4 * (t % 16), 8);\n"
           "    tj_hx_cp_async_commit_group();\n    tj_hx_cp_async_wait_group(1);\n    __syncthreads();\n"
           "    p.y[t] = ((float *)smem)[4 * t] + ((float *)smem)[128 + 4 * t];\n", 32, 1024,
           "cp.async to it is in flight", 12);
    expect(e, "misaligned cp.async", "    tj_hx_cp_async_cg_16(tj_hx_cvta_to_shared(smem + 8), p.x, 16);\n", 32, 64,
           "not 16-byte aligned", 6);
    expect(e, "cvta.to.shared of a global pointer", "    (void)tj_hx_cvta_to_shared(p.x);\n", 32, 64,
           "not a shared-memory address", 6);
    /* warp collectives */
    const char *ld_ok = "    for (int i = t; i < 256; i += blockDim.x) ((unsigned short *)smem)[i] = (unsigned short)i;\n"
                        "    __syncthreads();\n    unsigned r[4];\n"
                        "    tj_hx_ldmatrix_x4(r, tj_hx_cvta_to_shared(smem + 16 * (t % 32)));\n"
                        "    p.y[t] = (float)(r[0] & 0xffff) + (float)(r[3] >> 16);\n";
    expect(e, "ldmatrix by a whole warp", ld_ok, 64, 512, NULL, 0);
    expect(e, "ldmatrix skipped by one lane", "    for (int i = t; i < 256; i += 32) ((unsigned short *)smem)[i] = 1;\n"
           "    __syncthreads();\n    unsigned r[4] = {0, 0, 0, 0};\n"
           "    if (t != 7) tj_hx_ldmatrix_x4(r, tj_hx_cvta_to_shared(smem + 16 * (t % 32)));\n    p.y[t] = r[0];\n", 32,
           512, "lane(s) of its warp wait for it at ldmatrix", 0);
    expect(e, "ldmatrix at two call sites in one warp", "    for (int i = t; i < 256; i += 32) ((unsigned short *)smem)[i] = 1;\n"
           "    __syncthreads();\n    unsigned r[4];\n"
           "    if (t < 16) tj_hx_ldmatrix_x4(r, tj_hx_cvta_to_shared(smem + 16 * t));\n"
           "    else tj_hx_ldmatrix_x4(r, tj_hx_cvta_to_shared(smem + 16 * t));\n    p.y[t] = r[0];\n", 32, 512,
           "warp divergence at a .sync.aligned instruction", 10);
    expect(e, "ldmatrix with a misaligned row address", "    for (int i = t; i < 256; i += 32) ((unsigned short *)smem)[i] = 1;\n"
           "    __syncthreads();\n    unsigned r[4];\n"
           "    tj_hx_ldmatrix_x4(r, tj_hx_cvta_to_shared(smem + 16 * t + (t == 9 ? 8 : 0)));\n    p.y[t] = r[0];\n", 32, 512,
           "lane 9's row address", 9);
    expect(e, "mma.sync with a warp at __syncthreads", "    unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};\n"
           "    float d[4] = {0, 0, 0, 0};\n    if (t == 3) __syncthreads();\n"
           "    else tj_hx_mma_m16n8k16_f32_f16(d, a, b);\n    p.y[t] = d[0];\n", 32, 0, "deadlock", 0);
    /* Hopper: mbarrier phases and bulk copies (bytes land when the phase completes) */
    const char *mb_head = "    const unsigned s = tj_hx_cvta_to_shared(smem);\n"
                          "    if (t == 0) { tj_hx_mbarrier_init(s, %d); tj_hx_fence_proxy_async(); }\n    __syncthreads();\n" /* 6-8 */
                          "    if (t == 0) tj_hx_mbarrier_arrive_expect_tx(s, 64);\n"
                          "    if (t < 4) tj_hx_cp_async_bulk(s + 1024 + 16 * t, p.x + 4 * t, 16, s);\n"; /* 9-10 */
    char body[1024];
    snprintf(body, sizeof body, mb_head, 1);
    strcat(body, "    while (!tj_hx_mbarrier_try_wait_parity(s, 0)) {\n    }\n    p.y[t] = ((float *)(smem + 1024))[t % 16];\n");
    expect(e, "bulk copy, mbarrier wait, read", body, 32, 2048, NULL, 0);
    snprintf(body, sizeof body, mb_head, 1);
    strcat(body, "    __syncthreads();\n    p.y[t] = ((float *)(smem + 1024))[t % 16];\n");
    expect(e, "bulk-copy data read with no mbarrier wait", body, 32, 2048, "which this thread has not waited for", 12);
    snprintf(body, sizeof body, mb_head, 1);
    strcat(body, "    while (!tj_hx_mbarrier_try_wait_parity(s, 1)) {\n    }\n    p.y[t] = ((float *)(smem + 1024))[t % 16];\n");
    expect(e, "mbarrier wait on the wrong parity passes early", body, 32, 2048, "is in flight", 13);
    snprintf(body, sizeof body, mb_head, 2);
    strcat(body, "    while (!tj_hx_mbarrier_try_wait_parity(s, 0)) {\n    }\n    p.y[t] = ((float *)(smem + 1024))[t % 16];\n");
    expect(e, "mbarrier expecting two arrivals gets one", body, 32, 2048, "phase that never completes", 0);
    snprintf(body, sizeof body, mb_head, 1);
    char *fence = strstr(body, " tj_hx_fence_proxy_async();");
    if (fence) memmove(fence, fence + 27, strlen(fence + 27) + 1);
    strcat(body, "    while (!tj_hx_mbarrier_try_wait_parity(s, 0)) {\n    }\n    p.y[t] = ((float *)(smem + 1024))[t % 16];\n");
    expect(e, "bulk copy on an mbarrier whose init was not fenced", body, 32, 2048, "no fence.proxy.async made visible", 10);
    /* wgmma: a warpgroup collective reading shared memory through descriptors (A at 0, B at 4096,
     * M-/N-major, 128-byte swizzle, LBO 2048, SBO 1024) */
    const char *wg = "    const unsigned s = tj_hx_cvta_to_shared(smem);\n"
                     "    for (int i = t; i < 4096; i += 128) ((unsigned short *)smem)[i] = 0x3c00;\n"
                     "    %s\n    __syncthreads();\n    float d[32];\n" /* lines 6-10 */
                     "    for (int i = 0; i < 32; i++) d[i] = 0;\n    %s\n" /* 11-12 */
                     "    tj_hx_wgmma_mma_async(d, 64, 0x4000004000800000ull | (s >> 4), 0x4000004000800000ull | ((s + 4096) >> 4), 1, 0, 1, 1);\n"
                     "    tj_hx_wgmma_commit_group();\n    %s\n    if (t < 64) p.y[t] = d[0];\n"; /* 13-16 */
    snprintf(body, sizeof body, wg, "tj_hx_fence_proxy_async();", "tj_hx_wgmma_fence();", "tj_hx_wgmma_wait_group(0);");
    expect(e, "wgmma after fence.proxy.async, waited", body, 128, 16384, NULL, 0);
    snprintf(body, sizeof body, wg, "", "tj_hx_wgmma_fence();", "tj_hx_wgmma_wait_group(0);");
    expect(e, "wgmma reading generic stores with no fence.proxy.async", body, 128, 16384, "written through the generic proxy", 13);
    snprintf(body, sizeof body, wg, "tj_hx_fence_proxy_async();", "tj_hx_wgmma_fence();", "");
    expect(e, "wgmma results never waited for", body, 128, 16384, "no wgmma.wait_group landed", 0);
    snprintf(body, sizeof body, wg, "tj_hx_fence_proxy_async();", "tj_hx_wgmma_fence();",
             "if (t == 0) smem[4096] = 0;\n    tj_hx_wgmma_wait_group(0);");
    expect(e, "operand overwritten while its wgmma is in flight", body, 128, 16384, "may still be reading", 15);
    snprintf(body, sizeof body, wg, "tj_hx_fence_proxy_async();", "", "tj_hx_wgmma_wait_group(0);");
    expect(e, "wgmma.mma_async without wgmma.fence", body, 128, 16384, "without a wgmma.fence", 13);
    snprintf(body, sizeof body, wg, "tj_hx_fence_proxy_async();", "if (t != 5) tj_hx_wgmma_fence();", "tj_hx_wgmma_wait_group(0);");
    expect(e, "a thread of the warpgroup skips wgmma.fence", body, 128, 16384, "warpgroup divergence", 0);
}

int main(void)
{
    test_conversions();
    test_fragments();
    test_wgmma();
    const char *cxx = getenv("TJ_HX_CXX");
    if (cxx && *cxx) {
        tj_error err = {0};
        tj_hx_exec *e = NULL;
        CHECK_OK(tj_hx_exec_create(&e, &err), &err);
        if (e) test_detectors(e);
        tj_hx_exec_destroy(e);
    } else {
        printf("no clang++: the kernel checks are skipped\n");
    }
    return tj_test_end();
}
