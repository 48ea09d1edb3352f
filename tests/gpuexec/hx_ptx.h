/* PTX semantics for the host executor, as pure functions over whole warps: the conversions, the
 * ldmatrix lane-to-row mapping and the mma.sync m16n8k16 fragment layouts of the PTX ISA. The
 * executor (hx_exec.c) gathers a warp's operands at the rendezvous and calls these; tests call
 * them directly against independent definitions (tests/test_gpuexec_ptx.c). */
#ifndef TJ_HX_PTX_H
#define TJ_HX_PTX_H

#include <stddef.h>
#include <stdint.h>

/* cvt.f32.f16 (exact) */
float tj_hx_ptx_cvt_f32_f16(uint16_t h);
/* cvt.rn.f16.f32: round to nearest even, overflow to infinity, NaN to the canonical 0x7fff */
uint16_t tj_hx_ptx_cvt_rn_f16_f32(float f);
/* cvt.rn.bf16.f32: the same for bf16 */
uint16_t tj_hx_ptx_cvt_rn_bf16_f32(float f);
float tj_hx_ptx_bf16_to_f32(uint16_t h);
/* cvt.rn.{f16x2,bf16x2}.f32 d, a, b: a goes to the upper half of d, b to the lower half */
uint32_t tj_hx_ptx_cvt_rn_f16x2_f32(float a, float b);
uint32_t tj_hx_ptx_cvt_rn_bf16x2_f32(float a, float b);

/* ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.b16 for one warp. rows[j][i][c] is element c of
 * row i of matrix j, read from the 16 bytes at the address lane 8j + i gave. out[lane][j] is the
 * lane's register j: without .trans, elements (row lane/4, cols 2(lane%4), 2(lane%4)+1); with
 * .trans, elements (rows 2(lane%4), 2(lane%4)+1, col lane/4); the first in the low half. */
void tj_hx_ptx_ldmatrix(const uint16_t rows[4][8][8], int num, int trans, uint32_t out[32][4]);

/* mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 for one warp: d = a·b + c
 * with a 16×16 (row), b 16×8 (col), c and d 16×8 fp32, spread over the lanes as the ISA's
 * fragment layouts say (g = lane/4, t = lane%4):
 *   a: reg 0 = (g, 2t..2t+1), reg 1 = (g+8, 2t..), reg 2 = (g, 2t+8..), reg 3 = (g+8, 2t+8..)
 *   b: reg 0 = (k 2t..2t+1, n g), reg 1 = (k 2t+8..2t+9, n g)
 *   c, d: [0],[1] = (g, 2t..2t+1), [2],[3] = (g+8, 2t..2t+1)
 * Products are exact in fp32; they are summed in k order onto c, each add rounded to fp32 (the
 * hardware's internal rounding of this sum is not specified by the ISA). */
void tj_hx_ptx_mma_m16n8k16(const uint32_t a[32][4], const uint32_t b[32][2], float cd[32][4], int bf16);

/* wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start
 * address >> 4, 16-29 leading dimension byte offset (LBO) >> 4, 32-45 stride dimension byte
 * offset (SBO) >> 4, 49-51 base offset, 62-63 layout: 0 interleave (no swizzle), 1 128-byte,
 * 2 64-byte, 3 32-byte swizzle. Returns the shared-memory byte address of element (mn, k) of a
 * 16-bit operand: trans = 1 for an MN-major operand (imm-trans 1: M-major A, N-major B), 0 for
 * K-major. Canonical layouts in 16-byte units (W = 1, 2, 4, 8 for interleave, 32, 64, 128 B):
 *   MN-major: mn unit u = mn / 8 -> (u % W) * 16 + (u / W) * LBO, k -> (k % 8) * 16W + (k / 8) * SBO
 *             (interleave: u -> u * SBO, k -> (k % 8) * 16 + (k / 8) * LBO)
 *   K-major:  mn -> (mn % 8) * 16W + (mn / 8) * SBO, k unit k / 8 -> (k / 8) * 16 (interleave: LBO)
 * then the swizzle of the absolute address: bits [4, 4 + log2 W) ^= bits [7, 7 + log2 W).
 * *base_offset receives bits 49-51 (the executor requires 0: tiles aligned to the swizzle atom). */
uint32_t tj_hx_ptx_wgmma_addr(uint64_t desc, int trans, int mn, int k, int *base_offset);

/* wgmma.mma_async m64nNk16 with f32 accumulators for one warpgroup: d = a·b + d, a[64][16]
 * (m, k), b[16][n] (k, n) as 16-bit bits (fp16 or bf16), cd[thread][i] for the 128 threads with
 * the accumulator fragment of the ISA: warp w = thread / 32, g = lane / 4, q = lane % 4; register
 * i = 4j + r holds row 16w + g + 8 (r / 2), column 8j + 2q + r % 2. Products exact in fp32,
 * summed in k order onto d (each add rounded). n: a multiple of 8 up to 256. */
void tj_hx_ptx_wgmma(const uint16_t a[64][16], const uint16_t (*b)[256], int n, int bf16, float cd[128][128]);

/* The inline PTX the templates and the emitter may contain, each statement exactly as written
 * there (whitespace collapsed), with its host twin: tests check that every asm statement of every
 * emitted source is one of these, so a PTX edit without its twin fails. NULL-terminated. */
typedef struct tj_hx_ptx_form {
    const char *asm_text;
    const char *twin;
} tj_hx_ptx_form;
extern const tj_hx_ptx_form tj_hx_ptx_forms[];

/* Checks every asm statement of src against tj_hx_ptx_forms: the number of statements without a
 * twin (0: all known); the first of them, whitespace-collapsed, in first_unknown. *total: all. */
int tj_hx_ptx_check_forms(const char *src, int *total, char *first_unknown, size_t cap);

#endif
