/* Stage 4 (CPU): emits LLVM IR for one layer under one tj_cpu_config, through the LLVM 19 C API.
 *
 *   item(x, y, wp, bk, slot, m0, m1)       one work item: piece `slot` (tj_cpu_pieces: a tile's
 *                                           column blocks, or the whole tile), tokens [m0, m1)
 *     for each column block of nr features of the piece:
 *      for each chunk of kc kept rows (k-blocking; partial sums kept in a scratch buffer):
 *       for each block of mr tokens:  mk[mr'][nv'](...)   or, unrolled mode, tile_<slot>(...)
 *   mk: acc[mr × nv] <V x float> = 0
 *       for each kept row r of the tile:                    (offset = rows_t[r], baked)
 *         w[j] = load <V x float> wb[r·bw + j·V]            (column block's rows, contiguous)
 *         for i < mr: acc[i][j] = fmuladd(splat(x[i·K + offset]), w[j], acc[i][j])
 *       epilogue: + bias, activation (when no ew), store or scatter to cols
 *   post(x, y, ewv, bias, m0, m1)          second pass: pruned features (act(bias)) and the ew
 *                                           residual, then the activation for those features
 *
 * dot amx (AMX tiles) replaces item: prep(x, xt, m0, m1) transposes x once per call, and
 * item(xt, ...) computes each tile's Yᵀ block with tdpbf16ps (emit_item_amx; the AMX section
 * below and docs/cpu-baselines-cache-dispatch.md).
 *
 * x: fp32 (or bf16, dtype) [M × K] row-major, y: fp32 (or bf16, out) [M × N], wp: the weights
 * packed by tj_cpu_pack_weights (fp32 or bf16, 64-byte aligned), bk: bias in kept-column order padded to bk_elems (zeros without bias), ewv: ew
 * weights in CSR order, bias: fp32 [N] or NULL. Offsets are baked as a constant i32 table read
 * by a rolled loop unrolled `unroll` times (table mode) or as immediates in straight-line code,
 * one function per tile (unrolled mode, capped at TJ_CPU_UNROLLED_MAX_STEPS row steps). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>

#include "gen/emit_llvm.h"
#include "base/host.h"
#include "tj_config.h"

/* Unrolled mode's bound: kept-row steps × 24-FMA blocks. Straight-line code costs LLVM about
 * 3 ms of CPU per row step (768×768 at s = 0.75, 1152 steps: 3.6 s), so only small layers. */
#define TJ_CPU_UNROLLED_MAX_STEPS 512
#define TJ_CPU_MAX_MR 16
/* Token blocks up to this many tokens get a kernel of their own (see emit_item). */
#define TJ_CPU_EXACT_TOKENS 8
/* AMX: tokens per tile row block (A and C tiles are 16 rows), the k-step (one A tile row: 32
 * bf16, 16 pairs) and the default kept rows per k-chunk */
#define TJ_AMX_ROWS 16
#define TJ_AMX_K 32
#define TJ_AMX_KC 256

/* ---------------------------------------------------------------- configs */

const char *tj_cpu_gen_id(void) { return "tilejit " TJ_VERSION " cpu-gen 1 built " __DATE__ " " __TIME__; }

tj_cpu_config tj_cpu_config_default(void) { return tj_cpu_config_default_vec(tj_cpu_host_vec()); }

/* Block sizes per vector width, as data (BLIS's blocksize tables): the register block
 * mr × nr and the k-blocking that kc "auto" (-1) resolves to: tiles keeping more than kc_rows
 * rows run in chunks of kc kept rows, so a chunk's weight slice (kc × nr floats) and the
 * gathered X it meets stay in L2 across the token blocks instead of streaming the whole tile's
 * rows from L3 or memory once per block of mr tokens.
 *   AVX-512 (32 registers of 16 floats): 6 × 64 beat 12 × 32 and 8 × 48 on BERT-base shapes
 *     (fewer broadcasts of gathered X per FMA). kc 384 above 1024 kept rows (a 256 KB slice):
 *     measured on Sapphire Rapids (2 MB L2), 4096 × 11008 at M = 16-512 (bench/RESULTS.md,
 *     issue 25), and what a 240 s tune found on Zen 4/5 (1 MB L2).
 *   AVX2 (16 registers of 8): 4 × 24, 12 accumulators with 7 loads per 12 FMAs (6 × 16 needs 8),
 *     5-10 % faster on Zen 3 (issue 17 round 2). k-blocking from the same 256 KB slice bound
 *     (24 floats a row: 2730 rows), chunks of 384 rows (36 KB).
 *   Narrower hosts: 4 rows × two vectors, no k-blocking.
 * prefetch: bytes ahead in a column block's weight stream that each kept row prefetches (every
 *   64-byte line of the row, into L1): 1024 (4 rows of 64 floats) took decode calls (M = 1-16)
 *   on 4096 × 11008 from 3.9 to 3.5 ms (M = 1) and 9.9 to 6.7 ms (M = 8) on Sapphire Rapids,
 *   and changed nothing where the weights sit in L2 or the call is compute-bound
 *   (bench/RESULTS.md, issue 25). AMD Zen 4 differs: where the kept weights fit its 32 MB L3,
 *   the prefetches cost 20-40 % at M = 1 (768 × 3072 at s = 0.5: 66 → 89 GB/s without them;
 *   4096 × 4096: 30 → 43 GB/s), and beyond it they win or lose under 15 % (issue 25, round 6),
 *   so hosts in cpu_prefetch_rule prefetch only layers whose kept weights exceed the L3 there.
 * pack_x_mb, pack_mb: pack -1 (auto) is 1 with mb pack_mb (when mb is auto) for calls whose X
 *   takes more than pack_x_mb MB, else 0 (tj_cpu_config_resolve_m). With pack 0 a work item is
 *   one column block, so each of a tile's column blocks gathers its X rows again; once X no
 *   longer fits the last-level cache those gathers come from memory, a line per few floats.
 *   Pack 1 gathers a tile's X once per item into a buffer the column blocks share, and mb 32
 *   keeps that buffer in L2. AVX2, Zen 3 (32 MB L3, 512 KB L2), 4096 × 11008 at s = 0.75, M =
 *   512 (X 22.5 MB): 1 thread 231-382 → 195-209 ms, 2 threads 153-211 → 104-118 ms; at M = 256
 *   (X 11 MB) both 96 ms (bench/RESULTS.md, issue 25, round 9). Not measured with AVX-512: off.
 * order1_kept, order1_mb: order -1 (auto) runs work items token-chunk-major (order 1: a chunk
 *   of gathered X stays in L2 while every tile passes by) when tiles keep under order1_kept of
 *   k and the kept weights take at most order1_mb MB (each chunk streams them all again), else
 *   tile-major (a tile's weights stay in cache across the chunks). AVX-512, on Sapphire Rapids
 *   at s = 0.75: M = 512 4096 × 4096 41 → 34 ms, 768 × 3072 5.4 → 4.8 ms, 384 × 1536 1.26 →
 *   1.02 ms, M = 128 4096 × 4096 10.7 → 8.7 ms; 11008 × 4096 (45 MB) 111 → 118 ms, so the cap;
 *   at s = 0.5 tile-major stays ahead. AVX2 keeps the older rule (Zen 3, BERT-base at M = 512:
 *   chunk-major won by ~30 % at s = 0.9 and lost 5-10 % at s ≤ 0.75). */
static const struct cpu_blocking {
    int vec, mr, nr, kc, kc_rows, prefetch;
    double order1_kept, order1_mb, pack_x_mb;
    int pack_mb;
} cpu_blocking[] = {
    {16, 6, 64, 384, 1024, 1024, 0.3, 24, 0, 0},
    {8, 4, 24, 384, 2730, 1024, 0.2, 1e9, 16, 32},
    {4, 4, 8, 0, 0, 0, 0.2, 1e9, 0, 0},
    {1, 4, 2, 0, 0, 0, 0.2, 1e9, 0, 0},
};

/* The blocking table's row for hosts of vec floats per vector. */
static const struct cpu_blocking *blocking_for(int vec)
{
    size_t i = 0;
    while (i + 1 < sizeof cpu_blocking / sizeof *cpu_blocking && cpu_blocking[i].vec > vec) i++;
    return &cpu_blocking[i];
}

/* Hosts (LLVM CPU names, by prefix) whose prefetch pays only on one side of an L3 of l3_mb MB
 * of kept weights. Zen 4 (Zen 5 keeps its cache sizes per core complex): layers inside the L3
 * go without it, at every M. Zen 3: calls of at most beyond_m tokens on layers beyond the L3 go
 * without it; one core streaming from memory at M = 1-2 ran 15-25 % faster on the hardware
 * prefetcher alone (4096 × 11008 and 11008 × 4096 at s = 0.5, M = 1: 6.1-6.8 → 4.6-5.7 ms), while
 * from M = 4 it measured within the noise and at M = 8 the prefetch won, and inside the L3 it won
 * or tied at M = 1 (bench/RESULTS.md, issue 25, round 10). */
static const struct {
    const char *cpu;
    double l3_mb;
    int inside;   /* 1: no prefetch for layers inside the L3 */
    int beyond_m; /* > 0: no prefetch for calls of at most this many tokens beyond it */
} cpu_prefetch_rule[] = {{"znver4", 32, 1, 0}, {"znver5", 32, 1, 0}, {"znver3", 32, 0, 2}};

/* Hosts (LLVM CPU names, by prefix) whose work order departs from the blocking table's rule.
 * Zen 5 (1 MB L2 per core, full-width AVX-512): token-chunk-major order keeps a chunk of X
 * (48 tokens × k values of x) in L2 only while it takes at most x_l2_kb KB, so a longer k goes
 * tile-major (4096 × 4096 at s = 0.75: M = 128 7.8-8.7 → 6.0-6.6 ms, M = 512 27-34 → 22-24 ms, two
 * threads 15-25 → 11.6-11.7 ms); and calls whose whole X exceeds x_mb MB, beyond what the L3
 * holds beside the weights, go chunk-major, so X streams from memory once rather than once per
 * tile (4096 × 11008, M = 512, X 22.5 MB: s = 0.75 118-134 → 67-81 ms, s = 0.5 153-182 →
 * 138-143 ms; at M = 128, X 5.6 MB, tile-major stays ahead: 16-17 against 18.5-20.7 ms)
 * (bench/RESULTS.md, issue 25, round 11). Zen 4 has the same L2 but was not measured. */
static const struct {
    const char *cpu;
    double x_l2_kb; /* order 1 needs 48 · k values of x within this */
    double x_mb;    /* calls with more X than this go order 1 */
} cpu_order_rule[] = {{"znver5", 512, 16}};

int tj_cpu_order_for(const char *cpu, const tj_layer *l, int x_bytes, int64_t m)
{
    for (size_t i = 0; i < sizeof cpu_order_rule / sizeof *cpu_order_rule; i++) {
        if (strncmp(cpu, cpu_order_rule[i].cpu, strlen(cpu_order_rule[i].cpu))) continue;
        double k = (double)l->k;
        if (m > 0 && (double)x_bytes * (double)m * k > cpu_order_rule[i].x_mb * 1024.0 * 1024.0) return 1;
        if (48.0 * x_bytes * k > cpu_order_rule[i].x_l2_kb * 1024.0) return 0;
    }
    return -1;
}

/* Bytes per element of x as the kernel reads it. */
static int x_bytes(const tj_cpu_config *c)
{
    return c->dtype == TJ_CPU_ACT_BF16 ? 2 : 4;
}

int tj_cpu_prefetch_for(const char *cpu, int vec, const tj_layer *l, int weight_bytes, int64_t m)
{
    double mb = (double)tj_layer_kept(l) * weight_bytes / (1024.0 * 1024.0);
    for (size_t i = 0; i < sizeof cpu_prefetch_rule / sizeof *cpu_prefetch_rule; i++) {
        if (strncmp(cpu, cpu_prefetch_rule[i].cpu, strlen(cpu_prefetch_rule[i].cpu))) continue;
        int inside = mb <= cpu_prefetch_rule[i].l3_mb;
        if (inside && cpu_prefetch_rule[i].inside) return 0;
        if (!inside && m > 0 && m <= cpu_prefetch_rule[i].beyond_m) return 0;
    }
    return blocking_for(vec)->prefetch;
}

tj_cpu_config tj_cpu_config_default_vec(int vec)
{
    const struct cpu_blocking *b = blocking_for(vec);
    tj_cpu_config c = {.mr = b->mr, .nr = b->nr, .offsets = TJ_CPU_OFFSETS_TABLE, .unroll = 4, .mb = 0, .vec = 0, .kc = -1,
                       .pack = -1, .order = -1, .serial = 0, .prefetch = -1};
    return c;
}

static const tj_cpu_config config_space[] = {
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 48, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 48, 0, 0, 0, 1, 0, 0, 0, 0, 0, -1},
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 24, 0, 0, 0, 1, 0, 0, 0, 0, 0, -1},
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 0, 0, 192, 0, 0, 0, 0, 0, 0, 0, -1},
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, -1},
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 48, 0, 0, 1, 0, 0, 0, 0, 0, 0, -1},
    {12, 32, TJ_CPU_OFFSETS_TABLE, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, -1},
    {12, 32, TJ_CPU_OFFSETS_TABLE, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {12, 32, TJ_CPU_OFFSETS_TABLE, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {14, 32, TJ_CPU_OFFSETS_TABLE, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {8, 48, TJ_CPU_OFFSETS_TABLE, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {4, 64, TJ_CPU_OFFSETS_TABLE, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {12, 32, TJ_CPU_OFFSETS_TABLE, 4, 48, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {12, 32, TJ_CPU_OFFSETS_UNROLLED, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {6, 64, TJ_CPU_OFFSETS_UNROLLED, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    /* AVX2-sized blocks (12 accumulators of 16 registers) */
    {6, 16, TJ_CPU_OFFSETS_TABLE, 4, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {4, 24, TJ_CPU_OFFSETS_TABLE, 4, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, -1},
    {6, 16, TJ_CPU_OFFSETS_TABLE, 4, 0, 8, 0, 2, 0, 0, 0, 0, 0, 0, -1}, /* X in mr-token panels */
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, -1},
    /* bf16-stored weights (fp32 accumulation), AVX-512 and AVX2 blocks */
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 0, 0, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, 0, 0, 0, -1},
    {6, 16, TJ_CPU_OFFSETS_TABLE, 4, 0, 8, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, 0, 0, 0, -1},
    {4, 24, TJ_CPU_OFFSETS_TABLE, 4, 0, 8, 0, 0, 1, 0, TJ_CPU_WEIGHTS_BF16, 0, 0, 0, -1},
    /* bf16 activations (x bf16, fp32 accumulation; y fp32 or bf16): fp32 FMA on widened values
     * (AVX2 and AVX-512 blocks), and vdpbf16ps on row pairs (avx512_bf16 hosts only) */
    {6, 16, TJ_CPU_OFFSETS_TABLE, 4, 0, 8, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, 0, TJ_CPU_DOT_FMA, -1},
    {4, 24, TJ_CPU_OFFSETS_TABLE, 4, 0, 8, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, TJ_CPU_ACT_BF16, TJ_CPU_DOT_FMA, -1},
    {4, 24, TJ_CPU_OFFSETS_TABLE, 4, 0, 8, 0, 2, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, TJ_CPU_ACT_BF16, TJ_CPU_DOT_FMA, -1},
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 0, 16, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, 0, TJ_CPU_DOT_FMA, -1},
    {6, 64, TJ_CPU_OFFSETS_TABLE, 4, 0, 16, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, 0, TJ_CPU_DOT_DPBF16, -1},
    {12, 32, TJ_CPU_OFFSETS_TABLE, 4, 0, 16, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, TJ_CPU_ACT_BF16, TJ_CPU_DOT_DPBF16, -1},
    /* AMX tiles (CPUs with AMX-BF16): 32 tokens × 32 features (the default above 16 tokens),
     * 16 × 64 (16 tokens and fewer), smaller k-chunks and items, bf16 y */
    {32, 32, TJ_CPU_OFFSETS_TABLE, 4, 0, 16, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, 0, TJ_CPU_DOT_AMX, -1},
    {16, 64, TJ_CPU_OFFSETS_TABLE, 4, 0, 16, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, 0, TJ_CPU_DOT_AMX, -1},
    {32, 32, TJ_CPU_OFFSETS_TABLE, 4, 32, 16, 64, 0, 1, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, 0, TJ_CPU_DOT_AMX, -1},
    {32, 16, TJ_CPU_OFFSETS_TABLE, 4, 128, 16, 128, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, TJ_CPU_ACT_BF16, TJ_CPU_DOT_AMX, -1},
    {16, 32, TJ_CPU_OFFSETS_TABLE, 4, 16, 16, 32, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, TJ_CPU_ACT_BF16, TJ_CPU_DOT_AMX, -1},
    /* AMX with x as the A operand (the default up to 16 tokens): 16 × 64, 16 × 32, bf16 y */
    {16, 64, TJ_CPU_OFFSETS_TABLE, 4, 0, 16, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, 0, TJ_CPU_DOT_AMX_X, -1},
    {16, 32, TJ_CPU_OFFSETS_TABLE, 4, 32, 16, 0, 0, 0, 0, TJ_CPU_WEIGHTS_BF16, TJ_CPU_ACT_BF16, TJ_CPU_ACT_BF16, TJ_CPU_DOT_AMX_X, -1},
};

const tj_cpu_config *tj_cpu_config_space(int *count)
{
    *count = (int)(sizeof config_space / sizeof *config_space);
    return config_space;
}

/* The host's vector width and avx512_bf16, probed once (LLVM's feature string never changes). */
static int host_vec = 1, host_bf16, host_amx;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

static void host_probe(void)
{
    char *f = LLVMGetHostCPUFeatures();
    if (f) {
        if (strstr(f, "+avx512f")) host_vec = 16;
        else if (strstr(f, "+avx2") && strstr(f, "+fma")) host_vec = 8;
        host_bf16 = strstr(f, "+avx512bf16") && strstr(f, "+avx512f");
        /* the staging of X uses AVX-512 BW/VBMI2 (every AMX CPU has them); the tile state
         * needs the kernel's permission first */
        host_amx = host_bf16 && strstr(f, "+amx-tile") && strstr(f, "+amx-bf16") && strstr(f, "+avx512bw") &&
                   strstr(f, "+avx512vbmi2") && tj_host_amx_permit();
        LLVMDisposeMessage(f);
    }
}

int tj_cpu_host_bf16(void)
{
    pthread_once(&host_once, host_probe);
    return host_bf16;
}

int tj_cpu_host_amx(void)
{
    pthread_once(&host_once, host_probe);
    return host_amx;
}

/* AMX tile budget of a block of mr tokens × nr features: accumulators, X tiles, weight tiles. */
static int amx_tiles_c(const tj_cpu_config *c) { return (c->mr / TJ_AMX_ROWS) * (c->nr / 16); }
static int amx_tiles_b(const tj_cpu_config *c) { return 8 - amx_tiles_c(c) - c->mr / TJ_AMX_ROWS; }
static int amx_block_ok(const tj_cpu_config *c)
{
    if (c->dot == TJ_CPU_DOT_AMX_X) return c->mr >= 1 && c->mr <= TJ_AMX_ROWS && c->nr >= 16 && c->nr <= 64 && c->nr % 16 == 0;
    return (c->mr == 16 || c->mr == 32) && c->nr >= 16 && c->nr <= 64 && c->nr % 16 == 0 && amx_tiles_b(c) >= 1;
}

int tj_cpu_dot_amx(int dot) { return dot == TJ_CPU_DOT_AMX || dot == TJ_CPU_DOT_AMX_X; }

/* config key "dot", by TJ_CPU_DOT_* */
static const char *const dot_names[] = {"auto", "fma", "dpbf16", "amx", "amx_x", NULL};

const char *tj_cpu_dot_name(int dot) { return dot >= 0 && dot <= TJ_CPU_DOT_AMX_X ? dot_names[dot] : "?"; }

int tj_cpu_host_vec(void)
{
    pthread_once(&host_once, host_probe);
    return host_vec;
}

int64_t tj_cpu_config_mb(const tj_cpu_config *c)
{
    int mr = c->mr < 1 ? 1 : c->mr;
    int base = tj_cpu_dot_amx(c->dot) ? 64 : c->order == 1 ? 48 : 96;
    return c->mb > 0 ? (c->mb + mr - 1) / mr * mr : mr * ((base + mr / 2) / mr);
}

void tj_cpu_config_resolve(tj_cpu_config *c, const tj_layer *l)
{
    if (c->vec == 0) c->vec = tj_cpu_host_vec();
    if (c->pack < 0) c->pack = 0; /* auto without a call size (tj_cpu_config_resolve_m decides for one) */
    if (c->order < 0) { /* the blocking table's rule: chunk-major for sparse enough layers */
        const struct cpu_blocking *b = blocking_for(c->vec);
        double kept = l->ntiles ? (double)l->tile_ptr[l->ntiles] / ((double)l->ntiles * (double)l->k) : 1.0;
        double bytes = 4.0 * (double)tj_layer_kept(l);
        c->order = kept < b->order1_kept && bytes <= b->order1_mb * 1e6 ? 1 : 0;
        int host = tj_cpu_order_for(tj_host_cpu_name(), l, x_bytes(c), 0);
        if (host >= 0) c->order = host;
    }
    if (c->dtype == TJ_CPU_ACT_BF16) {
        c->weights = TJ_CPU_WEIGHTS_BF16; /* both dot products read bf16 weights */
        if (c->dot == TJ_CPU_DOT_AUTO) {
            c->dot = c->vec != 16 ? TJ_CPU_DOT_FMA
                     : tj_cpu_host_amx() ? TJ_CPU_DOT_AMX
                     : tj_cpu_host_bf16() ? TJ_CPU_DOT_DPBF16 : TJ_CPU_DOT_FMA;
        }
        /* the register-block defaults (6 × 64, 4 × 24) are no AMX block */
        if (c->dot == TJ_CPU_DOT_AMX && !amx_block_ok(c)) c->mr = 32, c->nr = 32;
        if (c->dot == TJ_CPU_DOT_AMX_X && !amx_block_ok(c)) c->mr = 16, c->nr = 32; /* resolve_m's block */
    }
    if (c->kc < 0) { /* auto: the blocking table, for configs that can k-block at all */
        const struct cpu_blocking *b = blocking_for(c->vec);
        int64_t rows = 0;
        for (int64_t t = 0; t < l->ntiles; t++)
            if (tj_tile_nrows(l, t) > rows) rows = tj_tile_nrows(l, t);
        int can = c->offsets == TJ_CPU_OFFSETS_TABLE && c->pack <= 0 && c->dtype != TJ_CPU_ACT_BF16;
        c->kc = can && b->kc > 0 && rows > b->kc_rows ? b->kc : 0;
    }
}

/* Bytes per stored weight: bf16 where asked for, and for bf16 activations (which read bf16
 * weights, also before tj_cpu_config_resolve sets `weights`), else fp32. */
static int weight_bytes(const tj_cpu_config *c)
{
    return c->weights == TJ_CPU_WEIGHTS_BF16 || c->dtype == TJ_CPU_ACT_BF16 ? 2 : 4;
}

void tj_cpu_config_resolve_m(tj_cpu_config *c, const tj_layer *l, int64_t m)
{
    int vec = c->vec ? c->vec : tj_cpu_host_vec();
    if (c->dtype == TJ_CPU_ACT_BF16 && c->dot == TJ_CPU_DOT_AUTO && vec == 16 && tj_cpu_host_amx() && m > 0) {
        /* measured (bench/RESULTS.md, issue 25, round 6): up to 16 tokens amx_x 16 × 32 beats
         * vdpbf16ps (M = 8: 2.6-5.5×; M = 1: 1.0-1.2×) and amx (M = 16: up to 1.7×; 16 × 64 lost
         * up to 1.8× to it: four feature tiles share three B tile registers); above, amx 32 × 32
         * wins on every shape but 384 × 384 (4096 × 4096, M = 32: 1.5×) */
        if (m <= 16) c->dot = TJ_CPU_DOT_AMX_X, c->mr = 16, c->nr = 32;
    }
    if (c->order < 0 && tj_cpu_order_for(tj_host_cpu_name(), l, x_bytes(c), m) == 1)
        c->order = 1; /* the host's rule for calls whose X outgrows its L3 */
    if (c->pack < 0) { /* the blocking table's rule for calls whose X outgrows the cache */
        const struct cpu_blocking *b = blocking_for(vec);
        int fp32 = c->dtype != TJ_CPU_ACT_BF16 && c->offsets == TJ_CPU_OFFSETS_TABLE;
        int big = m > 0 && b->pack_x_mb > 0 && 4.0 * (double)m * (double)l->k > b->pack_x_mb * 1024.0 * 1024.0;
        c->pack = fp32 && big && c->mb == 0 ? 1 : 0;
        if (c->pack) c->mb = b->pack_mb;
    }
    if (c->prefetch < 0 && m > 0) { /* pinned only where the call's size changes the host's rule */
        int wb = weight_bytes(c);
        int pf = tj_cpu_prefetch_for(tj_host_cpu_name(), vec, l, wb, m);
        if (pf != tj_cpu_prefetch_for(tj_host_cpu_name(), vec, l, wb, 0)) c->prefetch = pf;
    }
    tj_cpu_config_resolve(c, l);
}

int tj_cpu_config_json_has(const char *json, const char *key)
{
    json_t *o = json && *json ? json_loads(json, 0, NULL) : NULL;
    int has = json_object_get(o, key) != NULL;
    json_decref(o);
    return has;
}

int64_t tj_cpu_xt_elems(const tj_layer *l, int64_t m)
{
    return (m + 31) / 32 * ((l->k + TJ_AMX_K - 1) / TJ_AMX_K * TJ_AMX_K) * 32;
}

tj_status tj_cpu_plan_build(const tj_layer *l, const tj_cpu_config *cfg, tj_plan *out, tj_error *err)
{
    return tj_plan_build_rows(l, cfg->vec, tj_cpu_dot_amx(cfg->dot) ? TJ_AMX_K : 1, out, err);
}

int64_t tj_cpu_config_kc(const tj_cpu_config *c)
{
    /* AMX: X is staged per k-chunk (its stack buffer stays bounded for long k); whole k-steps */
    if (c->dot == TJ_CPU_DOT_AMX) return c->kc > 0 ? (c->kc + TJ_AMX_K - 1) / TJ_AMX_K * TJ_AMX_K : TJ_AMX_KC;
    if (c->offsets == TJ_CPU_OFFSETS_UNROLLED || c->pack > 0 || c->dtype == TJ_CPU_ACT_BF16) return INT32_MAX; /* whole tiles */
    /* 0: no k-blocking (-1, auto, is resolved by tj_cpu_config_resolve from the blocking table) */
    return c->kc > 0 ? c->kc : INT32_MAX;
}

static int vec_regs(int vec) { return vec >= 16 ? 32 : 16; }

tj_status tj_cpu_config_check(const tj_cpu_config *c, tj_error *err)
{
    if (c->vec != 1 && c->vec != 4 && c->vec != 8 && c->vec != 16)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: vec %d is not 1, 4, 8 or 16", c->vec);
    if (tj_cpu_dot_amx(c->dot)) {
        const char *dn = tj_cpu_dot_name(c->dot);
        if (c->vec != 16)
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: dot %s needs vec 16 (AVX-512), not %d", dn, c->vec);
        if (!amx_block_ok(c))
            return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: dot %s takes mr %s and nr 16, 32, 48 or 64%s (mr %d × nr %d)", dn,
                           c->dot == TJ_CPU_DOT_AMX ? "16 or 32" : "1 to 16", c->dot == TJ_CPU_DOT_AMX ? " within 8 tiles" : "", c->mr,
                           c->nr);
    } else if (c->mr < 1 || c->mr > TJ_CPU_MAX_MR) {
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: mr %d is outside [1, %d]", c->mr, TJ_CPU_MAX_MR);
    }
    if (c->nr < c->vec || c->nr % c->vec || c->nr > 256)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: nr %d is not a multiple of the vector width %d (at most 256)",
                       c->nr, c->vec);
    int nv = c->nr / c->vec;
    if (!tj_cpu_dot_amx(c->dot) && c->mr * nv + nv + 1 > vec_regs(c->vec))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "cpu config: mr %d × nr %d needs %d vector registers, the host has %d", c->mr, c->nr,
                       c->mr * nv + nv + 1, vec_regs(c->vec));
    if (c->unroll < 1 || c->unroll > 64)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: unroll %d is outside [1, 64]", c->unroll);
    if (c->order < -1 || c->order > 1)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: order %d is not -1 (auto), 0 or 1", c->order);
    if (c->pack < -1 || c->pack > 2)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: pack %d is not -1 (auto), 0, 1 or 2", c->pack);
    if (c->pack == 2 && (c->dot == TJ_CPU_DOT_DPBF16 || tj_cpu_dot_amx(c->dot)))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: dot %s reads X as row pairs (pack 0 or 1, not the pack 2 panels)",
                       tj_cpu_dot_name(c->dot));
    if (c->pack > 0 && c->offsets == TJ_CPU_OFFSETS_UNROLLED)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: pack needs \"offsets\": \"table\" (packed rows need no offsets)");
    if (c->kc < -1 || c->kc > 1 << 24)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: kc %d is outside [-1 (auto), 2^24]", c->kc);
    if (c->weights < 0 || c->weights > 2)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: weights %d is not auto, f32 or bf16", c->weights);
    if (c->serial < -1)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: serial %d is not -1 (always parallel), 0 (built-in) or a kFLOP threshold", c->serial);
    if (c->dtype < 0 || c->dtype > 1 || c->out < 0 || c->out > 1 || c->dot < 0 || c->dot > TJ_CPU_DOT_AMX_X)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: dtype/out/dot out of range");
    if (c->dtype == TJ_CPU_ACT_BF16 && c->offsets == TJ_CPU_OFFSETS_UNROLLED)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: dtype bf16 needs \"offsets\": \"table\" (bf16 X is staged like pack 1)");
    if (c->dtype == TJ_CPU_ACT_BF16 && c->weights == TJ_CPU_WEIGHTS_F32)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: dtype bf16 reads bf16 weights (\"weights\": \"bf16\" or \"auto\")");
    if (c->dot != TJ_CPU_DOT_AUTO && c->dtype != TJ_CPU_ACT_BF16)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: dot applies to dtype bf16 only");
    if (c->dot == TJ_CPU_DOT_DPBF16 && c->vec != 16)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: dot dpbf16 (vdpbf16ps) needs vec 16 (AVX-512), not %d", c->vec);
    if (c->mb < 0 || c->mb > 1 << 20)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: mb %d is outside [0, 2^20]", c->mb);
    if (c->prefetch < -1 || c->prefetch > 1 << 16 || (c->prefetch > 0 && c->prefetch % 64))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "cpu config: prefetch %d is not -1 (auto), 0 (none) or a multiple of 64 bytes up to 65536", c->prefetch);
    return TJ_OK;
}

static tj_status json_int(json_t *o, const char *key, int lo, int hi, int *out, tj_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v) return TJ_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: '%s' must be an integer in [%d, %d]", key, lo, hi);
    *out = (int)json_integer_value(v);
    return TJ_OK;
}

static tj_status json_enum(json_t *o, const char *key, const char *const *names, int *out, tj_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v) return TJ_OK;
    const char *m = json_string_value(v);
    for (int i = 0; m && names[i]; i++)
        if (strcmp(m, names[i]) == 0) {
            *out = i;
            return TJ_OK;
        }
    char list[160];
    size_t at = 0;
    for (int i = 0; names[i] && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s\"%s\"", i ? ", " : "", names[i]);
    return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: '%s' must be one of %s", key, list);
}

tj_status tj_cpu_config_from_json(const char *json, tj_cpu_config *out, tj_error *err)
{
    *out = tj_cpu_config_default();
    if (!json || !*json) return TJ_OK;
    json_error_t je;
    json_t *o = json_loads(json, 0, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: not a JSON object: %s", o ? json : je.text);
    }
    tj_status s = TJ_OK;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (strcmp(key, "mr") && strcmp(key, "nr") && strcmp(key, "offsets") && strcmp(key, "unroll") &&
            strcmp(key, "mb") && strcmp(key, "kc") && strcmp(key, "pack") && strcmp(key, "order") && strcmp(key, "vec") && strcmp(key, "serial") && strcmp(key, "prefetch") && strcmp(key, "weights") && strcmp(key, "backend") &&
            strcmp(key, "dtype") && strcmp(key, "out") && strcmp(key, "dot")) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: unknown key '%s' (mr, nr, offsets, unroll, mb, kc, pack, order, vec, serial, prefetch, weights, dtype, out, dot)", key);
            goto done;
        }
    }
    if ((s = json_int(o, "mr", 1, 2 * TJ_AMX_ROWS, &out->mr, err))) goto done; /* above 16: amx only (checked) */
    if ((s = json_int(o, "nr", 1, 256, &out->nr, err))) goto done;
    if ((s = json_int(o, "unroll", 1, 64, &out->unroll, err))) goto done;
    if ((s = json_int(o, "mb", 0, 1 << 20, &out->mb, err))) goto done;
    if ((s = json_int(o, "vec", 0, 16, &out->vec, err))) goto done;
    if ((s = json_int(o, "kc", -1, 1 << 24, &out->kc, err))) goto done;
    if ((s = json_int(o, "pack", -1, 2, &out->pack, err))) goto done;
    if ((s = json_int(o, "order", -1, 1, &out->order, err))) goto done;
    if ((s = json_int(o, "serial", -1, 1 << 30, &out->serial, err))) goto done;
    if ((s = json_int(o, "prefetch", -1, 1 << 16, &out->prefetch, err))) goto done;
    v = json_object_get(o, "weights");
    if (v) {
        const char *m = json_string_value(v);
        if (m && strcmp(m, "auto") == 0) out->weights = TJ_CPU_WEIGHTS_AUTO;
        else if (m && strcmp(m, "f32") == 0) out->weights = TJ_CPU_WEIGHTS_F32;
        else if (m && strcmp(m, "bf16") == 0) out->weights = TJ_CPU_WEIGHTS_BF16;
        else {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: 'weights' must be \"auto\", \"f32\" or \"bf16\"");
            goto done;
        }
    }
    static const char *const act_names[] = {"f32", "bf16", NULL};
    if ((s = json_enum(o, "dtype", act_names, &out->dtype, err))) goto done;
    if ((s = json_enum(o, "out", act_names, &out->out, err))) goto done;
    if ((s = json_enum(o, "dot", dot_names, &out->dot, err))) goto done;
    v = json_object_get(o, "offsets");
    if (v) {
        const char *m = json_string_value(v);
        if (m && strcmp(m, "table") == 0) out->offsets = TJ_CPU_OFFSETS_TABLE;
        else if (m && strcmp(m, "unrolled") == 0) out->offsets = TJ_CPU_OFFSETS_UNROLLED;
        else {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "cpu config: 'offsets' must be \"table\" or \"unrolled\"");
            goto done;
        }
    }
done:
    json_decref(o);
    return s;
}

char *tj_cpu_config_to_json(const tj_cpu_config *c)
{
    char buf[400], ser[160] = "";
    size_t o = 0;
    if (c->serial) o += (size_t)snprintf(ser, sizeof ser, ", \"serial\": %d", c->serial); /* defaults left out */
    if (c->prefetch >= 0) o += (size_t)snprintf(ser + o, sizeof ser - o, ", \"prefetch\": %d", c->prefetch);
    if (c->weights)
        o += (size_t)snprintf(ser + o, sizeof ser - o, ", \"weights\": \"%s\"", c->weights == TJ_CPU_WEIGHTS_BF16 ? "bf16" : "f32");
    if (c->dtype) o += (size_t)snprintf(ser + o, sizeof ser - o, ", \"dtype\": \"bf16\"");
    if (c->out) o += (size_t)snprintf(ser + o, sizeof ser - o, ", \"out\": \"bf16\"");
    if (c->dot)
        snprintf(ser + o, sizeof ser - o, ", \"dot\": \"%s\"", tj_cpu_dot_name(c->dot));
    snprintf(buf, sizeof buf,
             "{\"mr\": %d, \"nr\": %d, \"offsets\": \"%s\", \"unroll\": %d, \"mb\": %d, \"kc\": %d, \"pack\": %d, \"order\": %d, \"vec\": %d%s}",
             c->mr, c->nr, c->offsets == TJ_CPU_OFFSETS_UNROLLED ? "unrolled" : "table", c->unroll, c->mb, c->kc, c->pack,
             c->order, c->vec, ser);
    return strdup(buf);
}

void tj_cpu_pack_weights(const tj_plan *p, const tj_cpu_config *cfg, const void *w, tj_dtype wdt, void *dst)
{
    const tj_layer *l = p->layer;
    int bf = cfg->weights == TJ_CPU_WEIGHTS_BF16, amx = tj_cpu_dot_amx(cfg->dot), amx_x = cfg->dot == TJ_CPU_DOT_AMX_X;
    int pairs = cfg->dot == TJ_CPU_DOT_DPBF16;
    int64_t nrb = cfg->nr;
    memset(dst, 0, (size_t)p->packed_elems * (bf ? 2 : 4));
    if (amx) { /* 1 KB tiles per 16 features and 32 kept rows: amx, A tiles (16 features × 32
                * kept rows); amx_x, B tiles (16 kept-row pairs × 16 features × 2) */
        for (int64_t t = 0; t < l->ntiles; t++) {
            const int32_t *rows = l->tile_rows + l->tile_ptr[t];
            int64_t nr = tj_tile_nrows(l, t), width = tj_tile_width(l, t), steps = tj_plan_rows(p, t) / 32;
            for (int64_t c = 0; c < width; c++) {
                int64_t base = tj_layer_col(l, t * l->g + c) * l->k;
                uint16_t *d = (uint16_t *)dst + p->off[t] + c / 16 * steps * 512 + c % 16 * (amx_x ? 2 : 32);
                for (int64_t r = 0; r < nr; r++)
                    d[r / 32 * 512 + (amx_x ? r % 32 / 2 * 32 + r % 2 : r % 32)] = wdt == TJ_BF16 ? tj_load_u16(w, base + rows[r])
                                                               : tj_f32_to_bf16(tj_load_f32(w, wdt, base + rows[r]));
            }
        }
        return;
    }
    for (int64_t t = 0; t < l->ntiles; t++) {
        const int32_t *rows = l->tile_rows + l->tile_ptr[t];
        int64_t nr = tj_tile_nrows(l, t), width = tj_tile_width(l, t), ld = p->ld[t];
        /* 16 columns at a time, rows outer: the 16 weight rows read stay in cache as r
         * advances, and each packed row segment is written in one or two runs */
        for (int64_t c0 = 0; c0 < width; c0 += 16) {
            int64_t cw = width - c0 < 16 ? width - c0 : 16, base[16];
            for (int64_t c = 0; c < cw; c++) base[c] = tj_layer_col(l, t * l->g + c0 + c) * l->k;
            int64_t blk[16], bw[16], cb[16];
            for (int64_t c = 0; c < cw; c++) { /* column block of feature c0 + c: start, (padded) width */
                int64_t cc = c0 + c, b0 = cc / nrb * nrb;
                bw[c] = ld - b0 < nrb ? ld - b0 : nrb;
                cb[c] = cc - b0;
                blk[c] = p->off[t] + b0 * nr;
            }
            for (int64_t r = 0; r < nr; r++) {
                for (int64_t c = 0; c < cw; c++) {
                    int64_t i = base[c] + rows[r];
                    int64_t at = !pairs || (r == nr - 1 && nr % 2) ? blk[c] + r * bw[c] + cb[c]
                                                                   : blk[c] + r / 2 * 2 * bw[c] + 2 * cb[c] + (r & 1);
                    if (!bf) {
                        if (wdt == TJ_F32) memcpy((float *)dst + at, (const char *)w + 4 * i, 4);
                        else ((float *)dst)[at] = tj_load_f32(w, wdt, i);
                    } else {
                        ((uint16_t *)dst)[at] = wdt == TJ_BF16 ? tj_load_u16(w, i) : tj_f32_to_bf16(tj_load_f32(w, wdt, i));
                    }
                }
            }
        }
    }
}

int64_t tj_cpu_config_piece(const tj_cpu_config *c)
{
    if (c->offsets == TJ_CPU_OFFSETS_UNROLLED || c->pack > 0 || c->dtype == TJ_CPU_ACT_BF16) return INT32_MAX;
    return c->nr;
}

int64_t tj_cpu_pieces(const tj_plan *p, const tj_cpu_config *c, tj_cpu_piece *out)
{
    const tj_layer *l = p->layer;
    int64_t step = tj_cpu_config_piece(c), n = 0;
    for (int64_t s = 0; s < l->ntiles; s++) {
        int64_t t = p->order[s], w = tj_tile_width(l, t), rows = tj_tile_nrows(l, t);
        for (int64_t b0 = 0; b0 == 0 || b0 < w; b0 += step) {
            int64_t pw = w - b0 < step ? w - b0 : step;
            if (out) out[n] = (tj_cpu_piece){s, b0, pw, (rows + 1) * pw};
            n++;
        }
    }
    return n;
}

/* ---------------------------------------------------------------- emitter state */

typedef struct em {
    LLVMContextRef c;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    const tj_layer *l;
    const tj_plan *p;
    const tj_cpu_config *cfg;
    const char *prefix;
    int V, NV;
    int fused_act;
    LLVMTypeRef f32, i1, i8, i32, i64, ptr, vf, vi32, vmask, vptr, voidt;
    LLVMTypeRef i16, vi16, wty; /* packed weight element: f32, or i16 holding bf16 */
    LLVMTypeRef mk_ty;          /* micro-kernel signature */
    LLVMValueRef fma, fma_s;    /* llvm.fmuladd on <V x float> and float */
    LLVMTypeRef fma_ty, fma_s_ty;
    LLVMValueRef g_offs, g_cols, g_tab[7];
    LLVMValueRef xs;            /* packed micro-kernels: the x token stride parameter */
    int packed;                 /* emitting a packed micro-kernel (offsets are r itself) */
    int packed_item;            /* X staging of the item: 0 none, 1 token rows, 2 mr-token panels */
    int xbf, ybf, dp;           /* x bf16, y bf16, vdpbf16ps inner product */
    int pf;                     /* weight prefetch distance in bytes (0: none) */
    int amx;                    /* AMX tiles (TDPBF16PS), the weights as A */
    int amx_x;                  /* AMX tiles, x as A */
    int compress;               /* stage bf16 X with vpcompressw (AVX512-VBMI2) */
    LLVMValueRef g_win, g_wptr; /* staging windows (emit_win_tables) */
    LLVMTypeRef xty, yty, xpty; /* element types of x, y and the staged X (f32 or i16) */
    char *cpu, *features;
    int oom;                    /* sticky: a table could not be built (out of memory) */
} em;

static LLVMValueRef ci64(em *e, int64_t v) { return LLVMConstInt(e->i64, (unsigned long long)v, 1); }
static LLVMValueRef ci32(em *e, int64_t v) { return LLVMConstInt(e->i32, (unsigned long long)v, 1); }

static LLVMValueRef intrinsic(em *e, const char *name, LLVMTypeRef *tys, size_t n, LLVMTypeRef *fty)
{
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    *fty = LLVMIntrinsicGetType(e->c, id, tys, n);
    return LLVMGetIntrinsicDeclaration(e->m, id, tys, n);
}

static LLVMValueRef call(em *e, LLVMTypeRef fty, LLVMValueRef fn, LLVMValueRef *args, unsigned n)
{
    return LLVMBuildCall2(e->b, fty, fn, args, n, "");
}

static void set_fn_attrs(em *e, LLVMValueRef fn)
{
    LLVMAttributeRef a = LLVMCreateStringAttribute(e->c, "target-cpu", 10, e->cpu, (unsigned)strlen(e->cpu));
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, a);
    a = LLVMCreateStringAttribute(e->c, "target-features", 15, e->features, (unsigned)strlen(e->features));
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, a);
    unsigned nounwind = LLVMGetEnumAttributeKindForName("nounwind", 8);
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(e->c, nounwind, 0));
}

static LLVMValueRef new_fn(em *e, const char *name, LLVMTypeRef ty, int internal)
{
    LLVMValueRef fn = LLVMAddFunction(e->m, name, ty);
    if (internal) LLVMSetLinkage(fn, LLVMInternalLinkage);
    set_fn_attrs(e, fn);
    return fn;
}

static LLVMValueRef const_global(em *e, const char *suffix, LLVMValueRef init)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", e->prefix, suffix);
    if (!init) { /* i32_array/i64_array ran out of memory: keep emitting, fail at the end */
        e->oom = 1;
        init = LLVMConstNull(e->i64);
    }
    LLVMValueRef g = LLVMAddGlobal(e->m, LLVMTypeOf(init), name);
    LLVMSetInitializer(g, init);
    LLVMSetGlobalConstant(g, 1);
    LLVMSetLinkage(g, LLVMInternalLinkage);
    LLVMSetUnnamedAddr(g, 1);
    LLVMSetAlignment(g, 64);
    return g;
}

static LLVMValueRef gep(em *e, LLVMTypeRef ty, LLVMValueRef base, LLVMValueRef idx)
{
    return LLVMBuildInBoundsGEP2(e->b, ty, base, &idx, 1, "");
}

static LLVMValueRef load(em *e, LLVMTypeRef ty, LLVMValueRef p, unsigned align)
{
    LLVMValueRef v = LLVMBuildLoad2(e->b, ty, p, "");
    LLVMSetAlignment(v, align);
    return v;
}

static void store(em *e, LLVMValueRef v, LLVMValueRef p, unsigned align)
{
    LLVMSetAlignment(LLVMBuildStore(e->b, v, p), align);
}

static LLVMValueRef splat_f(em *e, LLVMTypeRef ty, double v)
{
    LLVMValueRef s = LLVMConstReal(e->f32, v);
    if (ty == e->f32) return s;
    LLVMValueRef el[16];
    for (int i = 0; i < e->V; i++) el[i] = s;
    return LLVMConstVector(el, (unsigned)e->V);
}

static LLVMValueRef splat_v(em *e, LLVMValueRef s)
{
    LLVMValueRef v = LLVMBuildInsertElement(e->b, LLVMGetPoison(e->vf), s, ci32(e, 0), "");
    if (e->V == 1) return v;
    return LLVMBuildShuffleVector(e->b, v, LLVMGetPoison(e->vf), LLVMConstNull(LLVMVectorType(e->i32, (unsigned)e->V)), "");
}

/* An integer constant of type ty (scalar or vector). */
static LLVMValueRef cint(em *e, LLVMTypeRef ty, int64_t v)
{
    (void)e;
    if (LLVMGetTypeKind(ty) != LLVMVectorTypeKind) return LLVMConstInt(ty, (unsigned long long)v, 0);
    LLVMValueRef el[32], s = LLVMConstInt(LLVMGetElementType(ty), (unsigned long long)v, 0);
    unsigned n = LLVMGetVectorSize(ty);
    for (unsigned i = 0; i < n; i++) el[i] = s;
    return LLVMConstVector(el, n);
}

/* bf16 (i16 or <V x i16>) → fp32, exact: the high half of an fp32. */
static LLVMValueRef bf16_widen(em *e, LLVMValueRef h)
{
    int vec = LLVMGetTypeKind(LLVMTypeOf(h)) == LLVMVectorTypeKind;
    LLVMTypeRef it = vec ? e->vi32 : e->i32;
    LLVMValueRef z = LLVMBuildShl(e->b, LLVMBuildZExt(e->b, h, it, ""), cint(e, it, 16), "");
    return LLVMBuildBitCast(e->b, z, vec ? e->vf : e->f32, "");
}

/* fp32 → bf16, rounded to nearest even; NaN stays a (quiet) NaN. */
static LLVMValueRef bf16_round(em *e, LLVMValueRef v)
{
    int vec = LLVMGetTypeKind(LLVMTypeOf(v)) == LLVMVectorTypeKind;
    LLVMTypeRef it = vec ? e->vi32 : e->i32;
    LLVMValueRef bits = LLVMBuildBitCast(e->b, v, it, "");
    LLVMValueRef hi = LLVMBuildLShr(e->b, bits, cint(e, it, 16), "");
    LLVMValueRef lsb = LLVMBuildAnd(e->b, hi, cint(e, it, 1), "");
    LLVMValueRef r = LLVMBuildLShr(e->b, LLVMBuildAdd(e->b, LLVMBuildAdd(e->b, bits, cint(e, it, 0x7fff), ""), lsb, ""), cint(e, it, 16), "");
    LLVMValueRef nan = LLVMBuildFCmp(e->b, LLVMRealUNO, v, v, "");
    r = LLVMBuildSelect(e->b, nan, LLVMBuildOr(e->b, hi, cint(e, it, 0x40), ""), r, "");
    return LLVMBuildTrunc(e->b, r, vec ? e->vi16 : e->i16, "");
}

/* erf(v) for |v| ≤ 4 by a rational minimax fit (Eigen's/XLA's float erf), clamped outside:
 * absolute error < 5e-7, vectorises with no calls. ty: float or <V x float>. */
static LLVMValueRef emit_erf(em *e, LLVMTypeRef ty, LLVMValueRef x)
{
    static const double alpha[] = {-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                                   -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                                   -1.60960333262415e-02};
    static const double beta[] = {-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                                  -7.37332916720468e-03, -1.42647390514189e-02};
    LLVMTypeRef fty;
    LLVMValueRef mn = intrinsic(e, "llvm.minnum", &ty, 1, &fty);
    LLVMValueRef mx = intrinsic(e, "llvm.maxnum", &ty, 1, &fty);
    LLVMValueRef fm = ty == e->f32 ? e->fma_s : e->fma;
    LLVMTypeRef fmty = ty == e->f32 ? e->fma_s_ty : e->fma_ty;
    LLVMValueRef a[3] = {x, splat_f(e, ty, 4.0)};
    x = call(e, fty, mn, a, 2);
    a[0] = x;
    a[1] = splat_f(e, ty, -4.0);
    x = call(e, fty, mx, a, 2);
    LLVMValueRef x2 = LLVMBuildFMul(e->b, x, x, "");
    LLVMValueRef pn = splat_f(e, ty, alpha[0]);
    for (int i = 1; i < 7; i++) {
        LLVMValueRef f[3] = {pn, x2, splat_f(e, ty, alpha[i])};
        pn = call(e, fmty, fm, f, 3);
    }
    pn = LLVMBuildFMul(e->b, pn, x, "");
    LLVMValueRef q = splat_f(e, ty, beta[0]);
    for (int i = 1; i < 5; i++) {
        LLVMValueRef f[3] = {q, x2, splat_f(e, ty, beta[i])};
        q = call(e, fmty, fm, f, 3);
    }
    return LLVMBuildFDiv(e->b, pn, q, "");
}

static LLVMValueRef emit_act(em *e, LLVMTypeRef ty, LLVMValueRef v)
{
    switch (e->l->act) {
    case TJ_ACT_RELU: {
        LLVMTypeRef fty;
        LLVMValueRef mx = intrinsic(e, "llvm.maxnum", &ty, 1, &fty);
        LLVMValueRef a[2] = {v, splat_f(e, ty, 0.0)};
        return call(e, fty, mx, a, 2);
    }
    case TJ_ACT_GELU: {
        LLVMValueRef t = emit_erf(e, ty, LLVMBuildFMul(e->b, v, splat_f(e, ty, 0.70710678118654752440), ""));
        t = LLVMBuildFAdd(e->b, t, splat_f(e, ty, 1.0), "");
        return LLVMBuildFMul(e->b, LLVMBuildFMul(e->b, v, splat_f(e, ty, 0.5), ""), t, "");
    }
    default: return v;
    }
}

/* ---------------------------------------------------------------- micro-kernels */

/* Micro-kernel arguments. SCR/FLAGS: k-blocking — a call covers one chunk of the tile's kept rows;
 * bit 0 of FLAGS (first chunk) starts from zero instead of the partial sums in SCR, bit 1 (last
 * chunk) runs the epilogue instead of storing the partial sums back to SCR. */
enum { MK_X, MK_Y, MK_W, MK_OFFS, MK_NROWS, MK_LD, MK_BK, MK_COLS, MK_VALID, MK_SCR, MK_FLAGS, MK_XS, MK_NARGS };
enum { MK_FIRST = 1, MK_LAST = 2 };

/* One kept row: acc[i][j] += x[i·K + off] · w[j]. off: i64 value (table) or constant. */
static void emit_row(em *e, int mr, int nv, LLVMValueRef x, LLVMValueRef wrow, LLVMValueRef off, LLVMValueRef *acc)
{
    LLVMValueRef xs = e->xs ? e->xs : ci64(e, e->l->k); /* token stride of x: K, or packed */
    LLVMValueRef w[16];
    if (e->pf > 0) {
        /* the weights of a column block are one sequential stream: prefetch its lines a fixed
         * distance ahead (decode-sized calls are bound by this stream; the hardware prefetcher
         * alone left 10-30 % of the bandwidth unused, bench/RESULTS.md, issue 25) */
        LLVMTypeRef pty;
        LLVMValueRef pf = intrinsic(e, "llvm.prefetch", &e->ptr, 1, &pty);
        int row_bytes = nv * e->V * (e->wty == e->f32 ? 4 : 2);
        for (int at = 0; at < row_bytes; at += 64) {
            LLVMValueRef a[4] = {gep(e, e->i8, wrow, ci64(e, e->pf + at)), ci32(e, 0), ci32(e, 3), ci32(e, 1)};
            call(e, pty, pf, a, 4);
        }
    }
    for (int j = 0; j < nv; j++) {
        if (e->wty == e->f32) {
            w[j] = load(e, e->vf, gep(e, e->f32, wrow, ci64(e, j * e->V)), (unsigned)(4 * e->V));
        } else { /* bf16: the high half of an fp32, widened exactly in registers */
            w[j] = bf16_widen(e, load(e, e->vi16, gep(e, e->i16, wrow, ci64(e, j * e->V)), (unsigned)(2 * e->V)));
        }
    }
    for (int i = 0; i < mr; i++) {
        LLVMValueRef idx = i ? LLVMBuildAdd(e->b, off, LLVMBuildMul(e->b, ci64(e, i), xs, ""), "") : off;
        LLVMValueRef b = splat_v(e, load(e, e->f32, gep(e, e->f32, x, idx), 4));
        for (int j = 0; j < nv; j++) {
            LLVMValueRef a[3] = {b, w[j], acc[i * nv + j]};
            acc[i * nv + j] = call(e, e->fma_ty, e->fma, a, 3);
        }
    }
}

/* Leaves an epilogue: return, or branch to cont. */
static void epi_exit(em *e, LLVMBasicBlockRef cont)
{
    if (cont) LLVMBuildBr(e->b, cont);
    else LLVMBuildRetVoid(e->b);
}

/* + bias, activation, store (contiguous) or scatter (cols) of the first `valid` features of mr
 * token rows (y: the first row, at the block's first feature, or at feature 0 with cols; bk,
 * cols: at the block's first kept column), then return (cont NULL) or branch to cont. */
static void emit_epilogue_at(em *e, int mr, int nv, LLVMValueRef fn, LLVMValueRef *acc, LLVMValueRef y, LLVMValueRef bk,
                             LLVMValueRef cols, LLVMValueRef valid64, LLVMBasicBlockRef cont)
{
    LLVMValueRef valid = LLVMBuildTrunc(e->b, valid64, e->i32, "");
    LLVMValueRef iota_el[16];
    for (int i = 0; i < e->V; i++) iota_el[i] = ci32(e, i);
    LLVMValueRef iota = LLVMConstVector(iota_el, (unsigned)e->V);
    LLVMTypeRef st_ty, sc_ty = NULL;
    LLVMTypeRef vy = e->ybf ? e->vi16 : e->vf;
    unsigned yal = e->ybf ? 2 : 4;
    LLVMTypeRef st_ov[2] = {vy, e->ptr}, sc_ov[2] = {vy, e->vptr};
    LLVMValueRef mstore = intrinsic(e, "llvm.masked.store", st_ov, 2, &st_ty);
    LLVMValueRef mscatter = e->l->cols ? intrinsic(e, "llvm.masked.scatter", sc_ov, 2, &sc_ty) : NULL;
    LLVMValueRef bias[16], mask[16], colidx[16];
    for (int j = 0; j < nv; j++) {
        /* zeros without bias; bk NULL: the accumulators hold the bias already */
        bias[j] = bk ? load(e, e->vf, gep(e, e->f32, bk, ci64(e, j * e->V)), 4) : LLVMConstNull(e->vf);
        LLVMValueRef lim = LLVMBuildSub(e->b, valid, ci32(e, j * e->V), "");
        LLVMValueRef lv = LLVMBuildInsertElement(e->b, LLVMGetPoison(e->vi32), lim, ci32(e, 0), "");
        if (e->V > 1)
            lv = LLVMBuildShuffleVector(e->b, lv, LLVMGetPoison(e->vi32), LLVMConstNull(e->vi32), "");
        mask[j] = LLVMBuildICmp(e->b, LLVMIntSLT, iota, lv, "");
        colidx[j] = e->l->cols ? load(e, e->vi32, gep(e, e->i32, cols, ci64(e, j * e->V)), 4) : NULL;
    }
    LLVMValueRef vals[TJ_CPU_MAX_MR * 16];
    for (int i = 0; i < mr * nv; i++) {
        LLVMValueRef v = bk ? LLVMBuildFAdd(e->b, acc[i], bias[i % nv], "") : acc[i];
        if (e->fused_act) v = emit_act(e, e->vf, v);
        vals[i] = e->ybf ? bf16_round(e, v) : v;
    }
    if (!e->l->cols) {
        /* whole blocks (all but a tile's last one) take plain stores: AVX2's masked stores
         * (vmaskmovps) cost several times a store on Zen */
        LLVMBasicBlockRef full = LLVMAppendBasicBlockInContext(e->c, fn, "store.full");
        LLVMBasicBlockRef part = LLVMAppendBasicBlockInContext(e->c, fn, "store.masked");
        LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSGE, valid, ci32(e, nv * e->V), ""), full, part);
        LLVMPositionBuilderAtEnd(e->b, full);
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nv; j++)
                store(e, vals[i * nv + j], gep(e, e->yty, y, ci64(e, i * e->l->n + j * e->V)), yal);
        epi_exit(e, cont);
        LLVMPositionBuilderAtEnd(e->b, part);
    }
    for (int i = 0; i < mr; i++) {
        LLVMValueRef yrow = gep(e, e->yty, y, ci64(e, i * e->l->n));
        for (int j = 0; j < nv; j++) {
            LLVMValueRef v = vals[i * nv + j];
            if (!e->l->cols) {
                LLVMValueRef a[4] = {v, gep(e, e->yty, yrow, ci64(e, j * e->V)), ci32(e, yal), mask[j]};
                call(e, st_ty, mstore, a, 4);
            } else {
                LLVMValueRef ptrs = LLVMBuildInBoundsGEP2(e->b, e->yty, yrow, &colidx[j], 1, "");
                LLVMValueRef a[4] = {v, ptrs, ci32(e, yal), mask[j]};
                call(e, sc_ty, mscatter, a, 4);
            }
        }
    }
    epi_exit(e, cont);
}

/* The epilogue of a micro-kernel (mk_ty): its own y, bias, cols and valid; returns. */
static void emit_epilogue(em *e, int mr, int nv, LLVMValueRef fn, LLVMValueRef *acc)
{
    emit_epilogue_at(e, mr, nv, fn, acc, LLVMGetParam(fn, MK_Y), LLVMGetParam(fn, MK_BK), LLVMGetParam(fn, MK_COLS),
                     LLVMGetParam(fn, MK_VALID), NULL);
}

static void zero_acc(em *e, int n, LLVMValueRef *acc)
{
    for (int i = 0; i < n; i++) acc[i] = LLVMConstNull(e->vf);
}

/* Table mode: a loop over the tile's offsets, `unroll` rows per iteration plus a remainder loop.
 * Small blocks (decode: mr' = 1) would be bound by the FMA latency chain, so their main loop
 * spreads rows over `sets` independent accumulator sets, summed in the epilogue. */
static LLVMValueRef emit_mk_table(em *e, int mr, int nv)
{
    char name[128];
    snprintf(name, sizeof name, "%s.mk%s_%d_%d", e->prefix, e->packed ? "p" : "", mr, nv);
    LLVMValueRef fn = new_fn(e, name, e->mk_ty, 1);
    LLVMValueRef x = LLVMGetParam(fn, MK_X), w = LLVMGetParam(fn, MK_W), offs = LLVMGetParam(fn, MK_OFFS);
    /* packed X: token stride MK_XS (pack 1), or mr-token panels (pack 2): x[r·mr + i] */
    e->xs = e->packed == 2 ? ci64(e, 1) : e->packed ? LLVMGetParam(fn, MK_XS) : NULL;
    LLVMValueRef rs = ci64(e, e->packed == 2 ? e->cfg->mr : 1);
    LLVMValueRef nrows = LLVMGetParam(fn, MK_NROWS), ld = LLVMGetParam(fn, MK_LD);
    int na = mr * nv, U = e->cfg->unroll;
    int sets = 8 / na < 1 ? 1 : 8 / na;
    if (sets > U) sets = U;
    int nt = na * sets; /* accumulators in all sets */
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(e->c, fn, "entry");
    LLVMBasicBlockRef main = LLVMAppendBasicBlockInContext(e->c, fn, "main");
    LLVMBasicBlockRef remh = LLVMAppendBasicBlockInContext(e->c, fn, "rem.head");
    LLVMBasicBlockRef rem = LLVMAppendBasicBlockInContext(e->c, fn, "rem");
    LLVMBasicBlockRef epi = LLVMAppendBasicBlockInContext(e->c, fn, "epilogue");
    enum { MAXACC = 32 };
    LLVMValueRef zero[MAXACC], acc[MAXACC], phis[MAXACC], main_out[MAXACC], hacc[MAXACC], rphis[MAXACC], fin[MAXACC];
    zero_acc(e, nt, zero);

    LLVMPositionBuilderAtEnd(e->b, entry);
    {
        LLVMValueRef flags = LLVMGetParam(fn, MK_FLAGS), scr = LLVMGetParam(fn, MK_SCR);
        LLVMValueRef first = LLVMBuildICmp(e->b, LLVMIntNE, LLVMBuildAnd(e->b, flags, ci64(e, MK_FIRST), ""), ci64(e, 0), "first");
        for (int a = 0; a < na; a++) {
            LLVMValueRef part = load(e, e->vf, gep(e, e->f32, scr, ci64(e, a * e->V)), 4);
            zero[a] = LLVMBuildSelect(e->b, first, zero[a], part, "");
        }
    }
    LLVMValueRef nmain = U > 1 ? LLVMBuildSub(e->b, nrows, LLVMBuildSRem(e->b, nrows, ci64(e, U), ""), "nmain") : ci64(e, 0);
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSGT, nmain, ci64(e, 0), ""), main, remh);

    /* main: U rows per iteration, row u into set u % sets */
    LLVMPositionBuilderAtEnd(e->b, main);
    LLVMValueRef r = LLVMBuildPhi(e->b, e->i64, "r");
    for (int a = 0; a < nt; a++) acc[a] = phis[a] = LLVMBuildPhi(e->b, e->vf, "");
    for (int u = 0; u < U; u++) {
        LLVMValueRef ru = u ? LLVMBuildAdd(e->b, r, ci64(e, u), "") : r;
        LLVMValueRef off = e->packed ? LLVMBuildMul(e->b, ru, rs, "") : LLVMBuildSExt(e->b, load(e, e->i32, gep(e, e->i32, offs, ru), 4), e->i64, "");
        LLVMValueRef wrow = gep(e, e->wty, w, LLVMBuildMul(e->b, ru, ld, ""));
        emit_row(e, mr, nv, x, wrow, off, acc + (u % sets) * na);
    }
    LLVMValueRef rn = LLVMBuildAdd(e->b, r, ci64(e, U), "");
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, rn, nmain, ""), main, remh);
    LLVMBasicBlockRef main_end = LLVMGetInsertBlock(e->b);
    LLVMValueRef inc_v[2];
    LLVMBasicBlockRef inc_b[2] = {entry, main_end};
    inc_v[0] = ci64(e, 0);
    inc_v[1] = rn;
    LLVMAddIncoming(r, inc_v, inc_b, 2);
    for (int a = 0; a < nt; a++) {
        inc_v[0] = zero[a];
        inc_v[1] = acc[a];
        LLVMAddIncoming(phis[a], inc_v, inc_b, 2);
    }
    memcpy(main_out, acc, sizeof(LLVMValueRef) * (size_t)nt);

    /* remainder head */
    LLVMPositionBuilderAtEnd(e->b, remh);
    LLVMValueRef rh = LLVMBuildPhi(e->b, e->i64, "rh");
    inc_v[0] = ci64(e, 0);
    inc_v[1] = rn;
    LLVMAddIncoming(rh, inc_v, inc_b, 2);
    for (int a = 0; a < nt; a++) {
        hacc[a] = LLVMBuildPhi(e->b, e->vf, "");
        inc_v[0] = zero[a];
        inc_v[1] = main_out[a];
        LLVMAddIncoming(hacc[a], inc_v, inc_b, 2);
    }
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, rh, nrows, ""), rem, epi);

    /* remainder: one row per iteration, into set 0 (remh dominates the epilogue, so the other
     * sets need no phis) */
    LLVMPositionBuilderAtEnd(e->b, rem);
    LLVMValueRef r1 = LLVMBuildPhi(e->b, e->i64, "r1");
    for (int a = 0; a < na; a++) acc[a] = rphis[a] = LLVMBuildPhi(e->b, e->vf, "");
    {
        LLVMValueRef off = e->packed ? LLVMBuildMul(e->b, r1, rs, "") : LLVMBuildSExt(e->b, load(e, e->i32, gep(e, e->i32, offs, r1), 4), e->i64, "");
        emit_row(e, mr, nv, x, gep(e, e->wty, w, LLVMBuildMul(e->b, r1, ld, "")), off, acc);
    }
    LLVMValueRef r1n = LLVMBuildAdd(e->b, r1, ci64(e, 1), "");
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, r1n, nrows, ""), rem, epi);
    LLVMBasicBlockRef rem_end = LLVMGetInsertBlock(e->b);
    LLVMBasicBlockRef rinc_b[2] = {remh, rem_end};
    inc_v[0] = rh;
    inc_v[1] = r1n;
    LLVMAddIncoming(r1, inc_v, rinc_b, 2);
    for (int a = 0; a < na; a++) {
        inc_v[0] = hacc[a];
        inc_v[1] = acc[a];
        LLVMAddIncoming(rphis[a], inc_v, rinc_b, 2);
    }

    LLVMPositionBuilderAtEnd(e->b, epi);
    for (int a = 0; a < na; a++) {
        fin[a] = LLVMBuildPhi(e->b, e->vf, "");
        inc_v[0] = hacc[a];
        inc_v[1] = acc[a];
        LLVMAddIncoming(fin[a], inc_v, rinc_b, 2);
    }
    for (int a = 0; a < na; a++)
        for (int st = 1; st < sets; st++) fin[a] = LLVMBuildFAdd(e->b, fin[a], hacc[st * na + a], "");
    LLVMBasicBlockRef out = LLVMAppendBasicBlockInContext(e->c, fn, "out");
    LLVMBasicBlockRef keep = LLVMAppendBasicBlockInContext(e->c, fn, "partial");
    LLVMValueRef last = LLVMBuildAnd(e->b, LLVMGetParam(fn, MK_FLAGS), ci64(e, MK_LAST), "");
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntNE, last, ci64(e, 0), "last"), out, keep);
    LLVMPositionBuilderAtEnd(e->b, keep);
    for (int a = 0; a < na; a++) store(e, fin[a], gep(e, e->f32, LLVMGetParam(fn, MK_SCR), ci64(e, a * e->V)), 4);
    LLVMBuildRetVoid(e->b);
    LLVMPositionBuilderAtEnd(e->b, out);
    emit_epilogue(e, mr, nv, fn, fin);
    e->xs = NULL;
    return fn;
}

/* dot dpbf16 (avx512_bf16): acc[i][j] += x pair · w pair per pair of kept rows, vdpbf16ps
 * summing both products into each fp32 lane. x: the staged bf16 X (token stride MK_XS, pairs
 * at even positions); w: the column block's pair-packed weights (tj_cpu_pack_weights), pair p
 * at w + p·2·ld and an odd last row, widened to fp32, at w + (nrows−1)·ld. */
static LLVMValueRef emit_mk_dp(em *e, int mr, int nv)
{
    char name[128];
    snprintf(name, sizeof name, "%s.mkd_%d_%d", e->prefix, mr, nv);
    LLVMValueRef fn = new_fn(e, name, e->mk_ty, 1);
    LLVMValueRef x = LLVMGetParam(fn, MK_X), w = LLVMGetParam(fn, MK_W), nrows = LLVMGetParam(fn, MK_NROWS);
    LLVMValueRef ld = LLVMGetParam(fn, MK_LD), xs = LLVMGetParam(fn, MK_XS);
    LLVMValueRef flags = LLVMGetParam(fn, MK_FLAGS), scr = LLVMGetParam(fn, MK_SCR);
    int na = mr * nv;
    unsigned id = LLVMLookupIntrinsicID("llvm.x86.avx512bf16.dpbf16ps.512", 32);
    LLVMTypeRef dty = LLVMIntrinsicGetType(e->c, id, NULL, 0);
    LLVMValueRef dpf = LLVMGetIntrinsicDeclaration(e->m, id, NULL, 0);
    LLVMTypeRef pty[3];
    LLVMGetParamTypes(dty, pty); /* <32 x bfloat> in LLVM 17+, <16 x i32> before */
    LLVMTypeRef vi32 = e->vi32;
    enum { MAXACC = 32 };
    LLVMValueRef init[MAXACC], acc[MAXACC], phis[MAXACC], hphis[MAXACC], fin[MAXACC];
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(e->c, fn, "entry");
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(e->c, fn, "pairs");
    LLVMBasicBlockRef th = LLVMAppendBasicBlockInContext(e->c, fn, "tail.head");
    LLVMBasicBlockRef tail = LLVMAppendBasicBlockInContext(e->c, fn, "tail");
    LLVMBasicBlockRef epi = LLVMAppendBasicBlockInContext(e->c, fn, "epilogue");
    LLVMPositionBuilderAtEnd(e->b, entry);
    LLVMValueRef first = LLVMBuildICmp(e->b, LLVMIntNE, LLVMBuildAnd(e->b, flags, ci64(e, MK_FIRST), ""), ci64(e, 0), "");
    for (int a = 0; a < na; a++)
        init[a] = LLVMBuildSelect(e->b, first, LLVMConstNull(e->vf), load(e, e->vf, gep(e, e->f32, scr, ci64(e, a * e->V)), 4), "");
    LLVMValueRef npairs = LLVMBuildLShr(e->b, nrows, ci64(e, 1), "npairs");
    LLVMValueRef wpair = w;
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSGT, npairs, ci64(e, 0), ""), body, th);

    LLVMPositionBuilderAtEnd(e->b, body);
    LLVMValueRef pp = LLVMBuildPhi(e->b, e->i64, "p");
    for (int a = 0; a < na; a++) acc[a] = phis[a] = LLVMBuildPhi(e->b, e->vf, "");
    LLVMValueRef wrow = gep(e, e->i16, wpair, LLVMBuildMul(e->b, pp, LLVMBuildShl(e->b, ld, ci64(e, 1), ""), ""));
    LLVMValueRef wv[16];
    for (int j = 0; j < nv; j++) wv[j] = load(e, pty[2], gep(e, e->i16, wrow, ci64(e, j * 2 * e->V)), 2);
    for (int i = 0; i < mr; i++) {
        LLVMValueRef xi = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, ci64(e, i), xs, ""), LLVMBuildShl(e->b, pp, ci64(e, 1), ""), "");
        LLVMValueRef pair = load(e, e->i32, gep(e, e->i16, x, xi), 4);
        LLVMValueRef v = LLVMBuildInsertElement(e->b, LLVMGetPoison(vi32), pair, ci32(e, 0), "");
        v = LLVMBuildShuffleVector(e->b, v, LLVMGetPoison(vi32), LLVMConstNull(vi32), "");
        v = LLVMBuildBitCast(e->b, v, pty[1], "");
        for (int j = 0; j < nv; j++) {
            LLVMValueRef a3[3] = {acc[i * nv + j], v, wv[j]};
            acc[i * nv + j] = call(e, dty, dpf, a3, 3);
        }
    }
    LLVMValueRef pn = LLVMBuildAdd(e->b, pp, ci64(e, 1), "");
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, pn, npairs, ""), body, th);
    LLVMBasicBlockRef body_end = LLVMGetInsertBlock(e->b);
    LLVMValueRef iv[2];
    LLVMBasicBlockRef ib[2] = {entry, body_end};
    iv[0] = ci64(e, 0);
    iv[1] = pn;
    LLVMAddIncoming(pp, iv, ib, 2);
    for (int a = 0; a < na; a++) {
        iv[0] = init[a];
        iv[1] = acc[a];
        LLVMAddIncoming(phis[a], iv, ib, 2);
    }

    LLVMPositionBuilderAtEnd(e->b, th);
    for (int a = 0; a < na; a++) {
        hphis[a] = LLVMBuildPhi(e->b, e->vf, "");
        iv[0] = init[a];
        iv[1] = acc[a];
        LLVMAddIncoming(hphis[a], iv, ib, 2);
    }
    LLVMValueRef odd = LLVMBuildICmp(e->b, LLVMIntNE, LLVMBuildAnd(e->b, nrows, ci64(e, 1), ""), ci64(e, 0), "");
    LLVMBuildCondBr(e->b, odd, tail, epi);

    /* the odd last row: plain bf16 row, widened, fp32 FMA */
    LLVMPositionBuilderAtEnd(e->b, tail);
    LLVMValueRef rl = LLVMBuildSub(e->b, nrows, ci64(e, 1), "");
    LLVMValueRef wl = gep(e, e->i16, w, LLVMBuildMul(e->b, rl, ld, ""));
    for (int j = 0; j < nv; j++) wv[j] = bf16_widen(e, load(e, e->vi16, gep(e, e->i16, wl, ci64(e, j * e->V)), 2));
    for (int i = 0; i < mr; i++) {
        LLVMValueRef xi = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, ci64(e, i), xs, ""), rl, "");
        LLVMValueRef b = splat_v(e, bf16_widen(e, load(e, e->i16, gep(e, e->i16, x, xi), 2)));
        for (int j = 0; j < nv; j++) {
            LLVMValueRef a3[3] = {b, wv[j], hphis[i * nv + j]};
            acc[i * nv + j] = call(e, e->fma_ty, e->fma, a3, 3);
        }
    }
    LLVMBuildBr(e->b, epi);

    LLVMPositionBuilderAtEnd(e->b, epi);
    LLVMBasicBlockRef eb[2] = {th, tail};
    for (int a = 0; a < na; a++) {
        fin[a] = LLVMBuildPhi(e->b, e->vf, "");
        iv[0] = hphis[a];
        iv[1] = acc[a];
        LLVMAddIncoming(fin[a], iv, eb, 2);
    }
    LLVMBasicBlockRef out = LLVMAppendBasicBlockInContext(e->c, fn, "out");
    LLVMBasicBlockRef keep = LLVMAppendBasicBlockInContext(e->c, fn, "partial");
    LLVMValueRef last = LLVMBuildAnd(e->b, flags, ci64(e, MK_LAST), "");
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntNE, last, ci64(e, 0), ""), out, keep);
    LLVMPositionBuilderAtEnd(e->b, keep);
    for (int a = 0; a < na; a++) store(e, fin[a], gep(e, e->f32, scr, ci64(e, a * e->V)), 4);
    LLVMBuildRetVoid(e->b);
    LLVMPositionBuilderAtEnd(e->b, out);
    emit_epilogue(e, mr, nv, fn, fin);
    return fn;
}

/* Unrolled mode: straight-line code over tile t's kept rows, offsets and ld as immediates. */
static LLVMValueRef emit_mk_unrolled(em *e, int64_t t)
{
    char name[128];
    snprintf(name, sizeof name, "%s.tile_%lld", e->prefix, (long long)t);
    int mr = e->cfg->mr, nv = e->NV, na = mr * nv;
    LLVMValueRef fn = new_fn(e, name, e->mk_ty, 1);
    LLVMValueRef x = LLVMGetParam(fn, MK_X), w = LLVMGetParam(fn, MK_W);
    LLVMPositionBuilderAtEnd(e->b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    LLVMValueRef acc[TJ_CPU_MAX_MR * 16];
    zero_acc(e, na, acc);
    const int32_t *rows = e->l->tile_rows + e->l->tile_ptr[t];
    int64_t nr = tj_tile_nrows(e->l, t), ld = e->cfg->nr; /* full blocks only: row stride nr */
    for (int64_t r = 0; r < nr; r++) {
        if (r && r % e->cfg->unroll == 0) { /* chunk boundary: a new block keeps blocks small */
            LLVMBasicBlockRef nb = LLVMAppendBasicBlockInContext(e->c, fn, "chunk");
            LLVMBuildBr(e->b, nb);
            LLVMPositionBuilderAtEnd(e->b, nb);
        }
        emit_row(e, mr, nv, x, gep(e, e->wty, w, ci64(e, r * ld)), ci64(e, rows[r]), acc);
    }
    emit_epilogue(e, mr, nv, fn, acc);
    return fn;
}

/* ---------------------------------------------------------------- item and post */

/* per-slot tile tables; T_LDK: the packed block's row count (tj_plan_rows: AMX's row stride) */
enum { T_ROWBEG, T_NROWS, T_WOFF, T_LD, T_WIDTH, T_COLBASE, T_LDK, T_NTAB };

static LLVMValueRef i64_array(em *e, const int64_t *v, int64_t n)
{
    LLVMValueRef *el = malloc((size_t)(n ? n : 1) * sizeof *el);
    if (!el) return NULL;
    for (int64_t i = 0; i < n; i++) el[i] = ci64(e, v[i]);
    LLVMValueRef a = LLVMConstArray2(e->i64, el, (uint64_t)n);
    free(el);
    return a;
}

static LLVMValueRef i32_array(em *e, const int32_t *v, int64_t n, int64_t pad)
{
    LLVMValueRef *el = malloc((size_t)(n + pad ? n + pad : 1) * sizeof *el);
    if (!el) return NULL;
    for (int64_t i = 0; i < n + pad; i++) el[i] = ci32(e, i < n ? v[i] : 0);
    LLVMValueRef a = LLVMConstArray2(e->i32, el, (uint64_t)(n + pad));
    free(el);
    return a;
}

/* Per work piece (tj_cpu_pieces): its tile's rows, and its features as a tile of their own:
 * the weights from its first column block on (blocks are contiguous, off + b0·nrows), the
 * padded width left from b0, its width and first kept column. */
static tj_status emit_tables(em *e, tj_cpu_emit_info *info, tj_error *err)
{
    const tj_layer *l = e->l;
    int64_t tot = l->tile_ptr[l->ntiles];
    int64_t nt = tj_cpu_pieces(e->p, e->cfg, NULL);
    tj_cpu_piece *pc = malloc((size_t)(nt ? nt : 1) * sizeof *pc);
    int64_t *t6 = malloc((size_t)(nt ? nt : 1) * T_NTAB * sizeof *t6);
    if (!t6 || !pc) {
        free(t6);
        free(pc);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory emitting IR", l->name);
    }
    tj_cpu_pieces(e->p, e->cfg, pc);
    info->nslots = nt;
    for (int64_t s = 0; s < nt; s++) {
        int64_t t = e->p->order[pc[s].tslot], b0 = pc[s].b0;
        t6[T_ROWBEG * nt + s] = l->tile_ptr[t];
        t6[T_NROWS * nt + s] = tj_tile_nrows(l, t);
        t6[T_WOFF * nt + s] = e->p->off[t] + b0 * tj_plan_rows(e->p, t);
        t6[T_LD * nt + s] = e->p->ld[t] - b0;
        t6[T_WIDTH * nt + s] = pc[s].width;
        t6[T_COLBASE * nt + s] = t * l->g + b0;
        t6[T_LDK * nt + s] = tj_plan_rows(e->p, t);
    }
    free(pc);
    static const char *names[T_NTAB] = {"rowbeg", "nrows", "woff", "ld", "width", "colbase", "ldk"};
    for (int i = 0; i < T_NTAB; i++) {
        LLVMValueRef a = i64_array(e, t6 + i * nt, nt);
        if (!a) { free(t6); return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory emitting IR"); }
        e->g_tab[i] = const_global(e, names[i], a);
    }
    free(t6);
    /* packing reads whole vectors; AMX staging reads a whole k-step of offsets (then zeros
     * what lies past the tile's rows) */
    LLVMValueRef a = i32_array(e, l->tile_rows, tot, e->V > TJ_AMX_K ? e->V : TJ_AMX_K);
    if (!a) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory emitting IR");
    e->g_offs = const_global(e, "offsets", a);
    if (l->cols) {
        int32_t *c32 = malloc((size_t)l->ncols * sizeof *c32 + 4);
        if (!c32) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory emitting IR");
        for (int64_t j = 0; j < l->ncols; j++) c32[j] = (int32_t)l->cols[j];
        a = i32_array(e, c32, l->ncols, e->V);
        free(c32);
        if (!a) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory emitting IR");
        e->g_cols = const_global(e, "cols", a);
    }
    return TJ_OK;
}

/* A counted loop skeleton: returns the induction phi; the caller emits the body and calls
 * loop_end. */
typedef struct loop { LLVMBasicBlockRef head, body, exit; LLVMValueRef iv, end, step; } loop;

static void loop_begin(em *e, LLVMValueRef fn, loop *lp, LLVMValueRef begin, LLVMValueRef end, LLVMValueRef step)
{
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
    lp->body = LLVMAppendBasicBlockInContext(e->c, fn, "loop");
    lp->exit = LLVMAppendBasicBlockInContext(e->c, fn, "loop.exit");
    lp->end = end;
    lp->step = step;
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, begin, end, ""), lp->body, lp->exit);
    LLVMPositionBuilderAtEnd(e->b, lp->body);
    lp->iv = LLVMBuildPhi(e->b, e->i64, "");
    LLVMAddIncoming(lp->iv, &begin, &pre, 1);
}

static void loop_end(em *e, loop *lp)
{
    LLVMValueRef nx = LLVMBuildAdd(e->b, lp->iv, lp->step, "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(e->b);
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, nx, lp->end, ""), lp->body, lp->exit);
    LLVMAddIncoming(lp->iv, &nx, &latch, 1);
    LLVMPositionBuilderAtEnd(e->b, lp->exit);
}

static LLVMValueRef smin(em *e, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, a, b, ""), a, b, "");
}

/* Staging windows of bf16 X (dot dpbf16 on CPUs with AVX512-VBMI2): each tile's kept rows as
 * the 32-feature windows of x they fall in, i64 entries (window's first feature << 32 | mask of
 * its kept features); slot s's windows are win[wptr[s] .. wptr[s + 1]). */
static tj_status emit_win_tables(em *e, tj_error *err)
{
    const tj_layer *l = e->l;
    int64_t nt = l->ntiles, nwin = 0;
    for (int64_t t = 0; t < nt; t++) {
        int64_t nr = tj_tile_nrows(l, t);
        nwin += nr < l->k / 32 + 1 ? nr : l->k / 32 + 1; /* windows ≤ rows, and ≤ the windows of k */
    }
    int64_t *win = malloc((size_t)(nwin + 1) * sizeof *win), *wptr = malloc((size_t)(nt + 1) * sizeof *wptr);
    if (!win || !wptr) {
        free(win);
        free(wptr);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory emitting IR", l->name);
    }
    int64_t nw = 0;
    for (int64_t s = 0; s < nt; s++) {
        int64_t t = e->p->order[s], nr = tj_tile_nrows(l, t);
        const int32_t *rows = l->tile_rows + l->tile_ptr[t];
        wptr[s] = nw;
        for (int64_t r = 0; r < nr;) {
            int64_t w0 = rows[r] / 32 * 32;
            uint32_t mask = 0;
            for (; r < nr && rows[r] < w0 + 32; r++) mask |= 1u << (rows[r] - w0);
            win[nw++] = (int64_t)((uint64_t)w0 << 32 | mask);
        }
    }
    wptr[nt] = nw;
    e->g_win = const_global(e, "win", i64_array(e, win, nw ? nw : 1));
    e->g_wptr = const_global(e, "wptr", i64_array(e, wptr, nt + 1));
    free(win);
    free(wptr);
    return TJ_OK;
}

/* Stages bf16 X for tokens [m0, m1) of the item's tile: xp[(m − m0)·xs + r] = x[m][rows_t[r]],
 * one vpcompressw per window of kept features; a masked load reads only kept features (nothing
 * past x's end). Each window's 64-byte store spills up to 31 elements past its own: the next
 * window or token row overwrites them, and xp has 32 elements of slack at its end. */
static void emit_stage_x(em *e, LLVMValueRef fn, LLVMValueRef x, LLVMValueRef m0, LLVMValueRef m1, LLVMValueRef slot,
                         LLVMValueRef xp, LLVMValueRef xs)
{
    const tj_layer *l = e->l;
    LLVMTypeRef v32 = LLVMVectorType(e->i16, 32), m32 = LLVMVectorType(e->i1, 32);
    LLVMValueRef eb = load(e, e->i64, gep(e, e->i64, e->g_wptr, slot), 8);
    LLVMValueRef ee = load(e, e->i64, gep(e, e->i64, e->g_wptr, LLVMBuildAdd(e->b, slot, ci64(e, 1), "")), 8);
    LLVMTypeRef ld_ov[2] = {v32, e->ptr}, ld_ty, cp_ty, pc_ty;
    LLVMValueRef mload = intrinsic(e, "llvm.masked.load", ld_ov, 2, &ld_ty);
    LLVMValueRef comp = intrinsic(e, "llvm.x86.avx512.mask.compress", &v32, 1, &cp_ty);
    LLVMValueRef popc = intrinsic(e, "llvm.ctpop", &e->i32, 1, &pc_ty);
    loop pi;
    loop_begin(e, fn, &pi, m0, m1, ci64(e, 1));
    LLVMValueRef xrow = gep(e, e->i16, x, LLVMBuildMul(e->b, pi.iv, ci64(e, l->k), ""));
    LLVMValueRef dst = gep(e, e->i16, xp, LLVMBuildMul(e->b, LLVMBuildSub(e->b, pi.iv, m0, ""), xs, ""));
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
    loop wl;
    loop_begin(e, fn, &wl, eb, ee, ci64(e, 1));
    LLVMValueRef pos = LLVMBuildPhi(e->b, e->i64, "pos");
    LLVMValueRef zero64 = ci64(e, 0);
    LLVMAddIncoming(pos, &zero64, &pre, 1);
    LLVMValueRef ent = load(e, e->i64, gep(e, e->i64, e->g_win, wl.iv), 8);
    LLVMValueRef mask = LLVMBuildTrunc(e->b, ent, e->i32, "");
    LLVMValueRef mv = LLVMBuildBitCast(e->b, mask, m32, "");
    LLVMValueRef src = gep(e, e->i16, xrow, LLVMBuildLShr(e->b, ent, ci64(e, 32), ""));
    LLVMValueRef la[4] = {src, ci32(e, 2), mv, LLVMConstNull(v32)};
    LLVMValueRef ca[3] = {call(e, ld_ty, mload, la, 4), LLVMConstNull(v32), mv};
    store(e, call(e, cp_ty, comp, ca, 3), gep(e, e->i16, dst, pos), 2);
    LLVMValueRef posn = LLVMBuildAdd(e->b, pos, LLVMBuildZExt(e->b, call(e, pc_ty, popc, &mask, 1), e->i64, ""), "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(e->b);
    loop_end(e, &wl);
    LLVMAddIncoming(pos, &posn, &latch, 1);
    loop_end(e, &pi);
}

/* Which column-block widths occur, in units of `unit` features: need[n] = 1 for the full block
 * (n = nb units) and for each tile's last, partial one (need: nb + 1 entries). */
static void block_widths(const tj_layer *l, int unit, int nb, int *need)
{
    memset(need, 0, (size_t)(nb + 1) * sizeof *need);
    for (int64_t t = 0; t < l->ntiles; t++) {
        int64_t w = tj_tile_width(l, t), rest = w % ((int64_t)nb * unit);
        if (w >= (int64_t)nb * unit) need[nb] = 1;
        if (rest) need[(rest + unit - 1) / unit] = 1;
    }
}

static tj_status emit_item(em *e, tj_cpu_emit_info *info, tj_error *err)
{
    const tj_layer *l = e->l;
    int mr = e->cfg->mr, nv = e->NV, V = e->V;
    int need_nv[17];
    block_widths(l, V, nv, need_nv);
    /* Token-block variants: mr itself, every count up to TJ_CPU_EXACT_TOKENS (so a decode-sized
     * call, or tail, of t ≤ 8 tokens is one block: each weight streams once), and the powers of
     * two below mr beyond that; a longer tail runs the largest variant ≤ t and loops
     * (14 → 14, 8 + 5, ...: ten kernels, not fourteen). */
    LLVMValueRef *mk = calloc((size_t)mr * (size_t)nv, sizeof *mk);
    int64_t *step = calloc((size_t)mr, sizeof *step);
    if (!mk || !step) { free(mk); free(step); return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory emitting IR"); }
    LLVMValueRef variant[TJ_CPU_MAX_MR + 1][17];
    memset(variant, 0, sizeof variant);
    for (int a = 1; a <= mr; a++) {
        int v = 1;
        while (v * 2 <= a) v *= 2;
        if (a == mr || a <= TJ_CPU_EXACT_TOKENS) v = a;
        step[a - 1] = v;
        for (int b = 1; b <= nv; b++) {
            if (!need_nv[b]) { mk[(a - 1) * nv + (b - 1)] = LLVMConstNull(e->ptr); continue; }
            if (!variant[v][b]) {
                e->packed = e->packed_item;
                variant[v][b] = e->dp ? emit_mk_dp(e, v, b) : emit_mk_table(e, v, b);
                e->packed = 0;
            }
            mk[(a - 1) * nv + (b - 1)] = variant[v][b];
        }
    }
    LLVMValueRef mk_tab = const_global(e, "mk", LLVMConstArray2(e->ptr, mk, (uint64_t)mr * (uint64_t)nv));
    LLVMValueRef step_tab = const_global(e, "mstep", i64_array(e, step, mr));
    free(mk);
    free(step);
    LLVMValueRef unr_tab = NULL;
    info->rows_emitted = 0;
    if (e->cfg->offsets == TJ_CPU_OFFSETS_UNROLLED) {
        int64_t steps = l->tile_ptr[l->ntiles] * mr * nv;
        if (steps > TJ_CPU_UNROLLED_MAX_STEPS * 24)
            return tj_fail(err, TJ_ERR_UNSUPPORTED,
                           "layer '%s': unrolled offsets would emit %lld kept-row steps × %d×%d blocks (limit %d × 24); use \"offsets\": \"table\"",
                           l->name, (long long)l->tile_ptr[l->ntiles], mr, nv, TJ_CPU_UNROLLED_MAX_STEPS);
        LLVMValueRef *fns = malloc((size_t)(l->ntiles ? l->ntiles : 1) * sizeof *fns);
        if (!fns) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory emitting IR");
        for (int64_t s = 0; s < l->ntiles; s++) {
            fns[s] = emit_mk_unrolled(e, e->p->order[s]);
            info->rows_emitted += tj_tile_nrows(l, e->p->order[s]);
        }
        unr_tab = const_global(e, "tiles", LLVMConstArray2(e->ptr, fns, (uint64_t)l->ntiles));
        free(fns);
    }

    LLVMTypeRef ps[7] = {e->ptr, e->ptr, e->ptr, e->ptr, e->i64, e->i64, e->i64};
    int64_t rpmax = 0; /* packed x: the widest tile's rows, padded to vectors */
    for (int64_t t = 0; t < l->ntiles; t++) {
        int64_t rp = (tj_tile_nrows(l, t) + V - 1) / V * V;
        if (rp > rpmax) rpmax = rp;
    }
    LLVMValueRef fn = new_fn(e, info->item_name, LLVMFunctionType(e->voidt, ps, 7, 0), 0);
    LLVMValueRef x = LLVMGetParam(fn, 0), y = LLVMGetParam(fn, 1), wp = LLVMGetParam(fn, 2), bk = LLVMGetParam(fn, 3);
    LLVMValueRef slot = LLVMGetParam(fn, 4), m0 = LLVMGetParam(fn, 5), m1 = LLVMGetParam(fn, 6);
    LLVMPositionBuilderAtEnd(e->b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    /* partial sums of one token chunk × column block between k chunks */
    int64_t mbmax = tj_cpu_config_mb(e->cfg);
    LLVMValueRef scr = LLVMBuildArrayAlloca(e->b, e->f32, ci64(e, mbmax * nv * V), "scratch");
    LLVMSetAlignment(scr, 64);
    LLVMValueRef xp = NULL;
    if (e->cfg->pack > 0 || e->xbf) {
        xp = LLVMBuildArrayAlloca(e->b, e->xpty, ci64(e, mbmax * (rpmax > 0 ? rpmax : 1) + 32), "xpacked"); /* + staging's spill */
        LLVMSetAlignment(xp, 64);
    }
    LLVMValueRef tv[T_NTAB];
    for (int i = 0; i < T_NTAB; i++) tv[i] = load(e, e->i64, gep(e, e->i64, e->g_tab[i], slot), 8);
    LLVMValueRef offs = gep(e, e->i32, e->g_offs, tv[T_ROWBEG]);
    LLVMValueRef nrv = ci64(e, (int64_t)nv * V);
    LLVMValueRef rp = NULL;
    if (xp && e->packed_item == 2) {
        /* pack 2: mr-token panels, xp[p][r][i] = x[m0 + p·mr + i][rows_t[r]] (BLIS's packed A):
         * a register block's broadcasts then read one contiguous, sequential stream */
        rp = tv[T_NROWS];
        LLVMValueRef mrc = ci64(e, e->cfg->mr);
        loop pi;
        loop_begin(e, fn, &pi, m0, m1, ci64(e, 1));
        LLVMValueRef t = LLVMBuildSub(e->b, pi.iv, m0, "");
        LLVMValueRef pofs = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, LLVMBuildSDiv(e->b, t, mrc, ""), LLVMBuildMul(e->b, mrc, rp, ""), ""),
                                         LLVMBuildSRem(e->b, t, mrc, ""), "");
        LLVMValueRef xrow = gep(e, e->xty, x, LLVMBuildMul(e->b, pi.iv, ci64(e, l->k), ""));
        LLVMValueRef dst = gep(e, e->xpty, xp, pofs);
        loop pr;
        loop_begin(e, fn, &pr, ci64(e, 0), rp, ci64(e, 1));
        LLVMValueRef idx = LLVMBuildSExt(e->b, load(e, e->i32, gep(e, e->i32, offs, pr.iv), 4), e->i64, "");
        LLVMValueRef v = load(e, e->xty, gep(e, e->xty, xrow, idx), e->xbf ? 2 : 4);
        if (e->xbf) v = bf16_widen(e, v);
        store(e, v, gep(e, e->f32, dst, LLVMBuildMul(e->b, pr.iv, mrc, "")), 4);
        loop_end(e, &pr);
        loop_end(e, &pi);
    } else if (xp && e->dp && e->compress) {
        rp = LLVMBuildMul(e->b, LLVMBuildSDiv(e->b, LLVMBuildAdd(e->b, tv[T_NROWS], ci64(e, V - 1), ""), ci64(e, V), ""), ci64(e, V), "rp");
        emit_stage_x(e, fn, x, m0, m1, slot, xp, rp);
    } else if (xp) {
        /* pack: xp[i][r] = x[m0 + i][rows_t[r]] with vector gathers, once per item for all
         * column blocks: the micro-kernels then read contiguous, L1-resident rows */
        rp = LLVMBuildMul(e->b, LLVMBuildSDiv(e->b, LLVMBuildAdd(e->b, tv[T_NROWS], ci64(e, V - 1), ""), ci64(e, V), ""), ci64(e, V), "rp");
        LLVMTypeRef g_ov[2] = {e->xbf ? e->vi16 : e->vf, e->vptr}, g_ty;
        LLVMValueRef gather = intrinsic(e, "llvm.masked.gather", g_ov, 2, &g_ty);
        LLVMValueRef ones[16];
        for (int i = 0; i < V; i++) ones[i] = LLVMConstInt(e->i1, 1, 0);
        LLVMValueRef all = LLVMConstVector(ones, (unsigned)V);
        loop pi;
        loop_begin(e, fn, &pi, m0, m1, ci64(e, 1));
        LLVMValueRef xrow = gep(e, e->xty, x, LLVMBuildMul(e->b, pi.iv, ci64(e, l->k), ""));
        LLVMValueRef dst = gep(e, e->xpty, xp, LLVMBuildMul(e->b, LLVMBuildSub(e->b, pi.iv, m0, ""), rp, ""));
        loop pr;
        loop_begin(e, fn, &pr, ci64(e, 0), rp, ci64(e, V));
        LLVMValueRef idx = load(e, e->vi32, gep(e, e->i32, offs, pr.iv), 4);
        LLVMValueRef ptrs = LLVMBuildInBoundsGEP2(e->b, e->xty, xrow, &idx, 1, "");
        LLVMValueRef ga[4] = {ptrs, ci32(e, e->xbf ? 2 : 4), all, LLVMGetPoison(e->xbf ? e->vi16 : e->vf)};
        LLVMValueRef gv = call(e, g_ty, gather, ga, 4);
        if (e->xbf && !e->dp) gv = bf16_widen(e, gv); /* fma: staged as fp32, widened once here */
        store(e, gv, gep(e, e->xpty, dst, pr.iv), (unsigned)(e->xpty == e->f32 ? 4 * V : 2 * V));
        loop_end(e, &pr);
        loop_end(e, &pi);
    }
    loop cb;
    loop_begin(e, fn, &cb, ci64(e, 0), tv[T_WIDTH], nrv);
    LLVMValueRef valid = smin(e, nrv, LLVMBuildSub(e->b, tv[T_WIDTH], cb.iv, ""));
    LLVMValueRef nvb = LLVMBuildSDiv(e->b, LLVMBuildAdd(e->b, valid, ci64(e, V - 1), ""), ci64(e, V), "");
    /* weights column-block-major (tj_cpu_pack_weights): the block's rows are contiguous, nr
     * (or the tile's padded rest) apart, so they never alias in L1's sets */
    LLVMValueRef wblk = gep(e, e->wty, wp, LLVMBuildAdd(e->b, tv[T_WOFF], LLVMBuildMul(e->b, cb.iv, tv[T_NROWS], ""), ""));
    LLVMValueRef bld = smin(e, nrv, LLVMBuildSub(e->b, tv[T_LD], cb.iv, ""));
    LLVMValueRef colstart = LLVMBuildAdd(e->b, tv[T_COLBASE], cb.iv, "");
    LLVMValueRef bkb = gep(e, e->f32, bk, colstart);
    LLVMValueRef colsb = e->g_cols ? gep(e, e->i32, e->g_cols, colstart) : LLVMConstNull(e->ptr);
    LLVMValueRef unr_fn = unr_tab ? load(e, e->ptr, gep(e, e->ptr, unr_tab, slot), 8) : NULL;
    /* k-blocking: chunks of kc kept rows keep the weight slice in L1 across the token blocks;
     * at least one chunk, so empty tiles still run the epilogue */
    int64_t kc = tj_cpu_config_kc(e->cfg);
    loop kl;
    LLVMValueRef kend = LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSGT, tv[T_NROWS], ci64(e, 0), ""), tv[T_NROWS], ci64(e, 1), "");
    loop_begin(e, fn, &kl, ci64(e, 0), kend, ci64(e, kc));
    LLVMValueRef kn = smin(e, ci64(e, kc), LLVMBuildSub(e->b, tv[T_NROWS], kl.iv, ""));
    LLVMValueRef kflags = LLVMBuildOr(
        e->b, LLVMBuildZExt(e->b, LLVMBuildICmp(e->b, LLVMIntEQ, kl.iv, ci64(e, 0), ""), e->i64, ""),
        LLVMBuildShl(e->b, LLVMBuildZExt(e->b, LLVMBuildICmp(e->b, LLVMIntSGE, LLVMBuildAdd(e->b, kl.iv, ci64(e, kc), ""), tv[T_NROWS], ""), e->i64, ""), ci64(e, 1), ""), "");
    LLVMValueRef kw = gep(e, e->wty, wblk, LLVMBuildMul(e->b, kl.iv, bld, ""));
    LLVMValueRef koffs = gep(e, e->i32, offs, kl.iv);
    loop mb;
    loop_begin(e, fn, &mb, m0, m1, ci64(e, mr));
    LLVMValueRef mrb = smin(e, ci64(e, mr), LLVMBuildSub(e->b, m1, mb.iv, ""));
    LLVMValueRef k = LLVMBuildMul(e->b, LLVMBuildSub(e->b, mrb, ci64(e, 1), ""), ci64(e, nv), "");
    k = LLVMBuildAdd(e->b, k, LLVMBuildSub(e->b, nvb, ci64(e, 1), ""), "");
    LLVMValueRef f = load(e, e->ptr, gep(e, e->ptr, mk_tab, k), 8);
    mb.step = load(e, e->i64, gep(e, e->i64, step_tab, LLVMBuildSub(e->b, mrb, ci64(e, 1), "")), 8);
    if (unr_fn) {
        LLVMValueRef full = LLVMBuildAnd(e->b, LLVMBuildICmp(e->b, LLVMIntEQ, mrb, ci64(e, mr), ""),
                                         LLVMBuildICmp(e->b, LLVMIntEQ, nvb, ci64(e, nv), ""), "");
        f = LLVMBuildSelect(e->b, full, unr_fn, f, "");
    }
    LLVMValueRef args[MK_NARGS];
    LLVMValueRef tb = LLVMBuildSub(e->b, mb.iv, m0, "");
    if (xp && e->packed_item == 2) /* panel of token tb, at its position inside the panel */
        args[MK_X] = gep(e, e->f32, xp, LLVMBuildAdd(e->b, LLVMBuildMul(e->b, LLVMBuildSDiv(e->b, tb, ci64(e, mr), ""), LLVMBuildMul(e->b, ci64(e, mr), rp, ""), ""),
                                                     LLVMBuildSRem(e->b, tb, ci64(e, mr), ""), ""));
    else args[MK_X] = xp ? gep(e, e->xpty, xp, LLVMBuildMul(e->b, tb, rp, ""))
                    : gep(e, e->f32, x, LLVMBuildMul(e->b, mb.iv, ci64(e, l->k), ""));
    args[MK_XS] = rp ? rp : ci64(e, l->k);
    /* contiguous stores address y at the block's first feature; scatters use absolute cols */
    LLVMValueRef yoff = LLVMBuildMul(e->b, mb.iv, ci64(e, l->n), "");
    if (!l->cols) yoff = LLVMBuildAdd(e->b, yoff, colstart, "");
    args[MK_Y] = gep(e, e->yty, y, yoff);
    args[MK_W] = kw;
    args[MK_OFFS] = koffs;
    args[MK_NROWS] = kn;
    args[MK_SCR] = gep(e, e->f32, scr, LLVMBuildMul(e->b, LLVMBuildSub(e->b, mb.iv, m0, ""), ci64(e, nv * V), ""));
    args[MK_FLAGS] = kflags;
    args[MK_LD] = bld;
    args[MK_BK] = bkb;
    args[MK_COLS] = colsb;
    args[MK_VALID] = valid;
    LLVMBuildCall2(e->b, e->mk_ty, f, args, MK_NARGS, "");
    loop_end(e, &mb);
    loop_end(e, &kl);
    loop_end(e, &cb);
    LLVMBuildRetVoid(e->b);
    return TJ_OK;
}

/* ---------------------------------------------------------------- AMX */

/* dot amx computes each tile's Yᵀ block = W_tile · Xᵀ with TDPBF16PS: the weights are the A
 * operand (16 features × 32 kept rows per tile register, feature-major rows of the packed
 * block), X the B operand (16 VNNI pair rows × 16 tokens). B wants X feature-major, so a call
 * first transposes x once (prep, shared by every tile); an item then gathers its kept rows as
 * whole 64-byte lines of that transpose. C tiles are features × tokens: the epilogue transposes
 * them back into y's rows. */

typedef struct amx_fns {
    LLVMValueRef load, store, zero, dp;
    LLVMTypeRef load_ty, store_ty, zero_ty, dp_ty;
} amx_fns;

static amx_fns amx_intrinsics(em *e)
{
    amx_fns a;
    a.load = intrinsic(e, "llvm.x86.tileloadd64", NULL, 0, &a.load_ty);
    a.store = intrinsic(e, "llvm.x86.tilestored64", NULL, 0, &a.store_ty);
    a.zero = intrinsic(e, "llvm.x86.tilezero", NULL, 0, &a.zero_ty);
    a.dp = intrinsic(e, "llvm.x86.tdpbf16ps", NULL, 0, &a.dp_ty);
    return a;
}

static LLVMValueRef ci8(em *e, int v) { return LLVMConstInt(e->i8, (unsigned long long)v, 0); }

/* The token of column c of B tile j (and so of C's column c) in a staged block of tw tokens.
 * 32 tokens: the interleave is vpunpck{l,h}wd (one cheap shuffle per tile row, within 128-bit
 * lanes), so tile 0 holds tokens 0-3, 8-11, 16-19, 24-27 and tile 1 the others; 16 tokens: in
 * order. */
static int amx_token(int tw, int j, int c) { return tw == 32 ? 8 * (c / 4) + 4 * j + c % 4 : 16 * j + c; }

/* tileloadd / tilestored of tile register t at p, rows `stride` bytes apart */
static void tile_mem(em *e, const amx_fns *a, int store_it, int t, LLVMValueRef p, LLVMValueRef stride)
{
    LLVMValueRef args[3] = {ci8(e, t), p, stride};
    if (store_it) call(e, a->store_ty, a->store, args, 3);
    else call(e, a->load_ty, a->load, args, 3);
}

/* Rounds s = smax, smax/2, .., 1 of an in-register transpose of `count` vectors of `lanes`
 * elements: each swaps the off-diagonal s × s blocks of each 2s × 2s block (vectors i and i + s).
 * All rounds with count = lanes = n (transpose_square) give v[i][j] → v[j][i]; the rounds commute,
 * so a caller may do some of them another way (emit_amx_prep_loop's loads do the first). */
static void transpose_rounds(em *e, LLVMValueRef *v, int count, int lanes, int smax)
{
    LLVMValueRef lo[32], hi[32];
    for (int s = smax; s >= 1; s /= 2) {
        for (int j = 0; j < lanes; j++) {
            lo[j] = ci32(e, (j & s) ? lanes + j - s : j); /* [A, C]: b's s-block below a's */
            hi[j] = ci32(e, (j & s) ? lanes + j : j + s); /* [B, D] */
        }
        LLVMValueRef ml = LLVMConstVector(lo, (unsigned)lanes), mh = LLVMConstVector(hi, (unsigned)lanes);
        for (int i = 0; i < count; i++) {
            if (i & s) continue;
            LLVMValueRef a = v[i], b = v[i + s];
            v[i] = LLVMBuildShuffleVector(e->b, a, b, ml, "");
            v[i + s] = LLVMBuildShuffleVector(e->b, a, b, mh, "");
        }
    }
}

static void transpose_square(em *e, LLVMValueRef *v, int n) { transpose_rounds(e, v, n, n, n / 2); }

/* A vector of n i1 lanes: lane < lim (lim an i64 value). */
static LLVMValueRef lanes_below(em *e, int n, LLVMValueRef lim)
{
    LLVMValueRef el[32];
    for (int i = 0; i < n; i++) el[i] = ci64(e, i);
    LLVMTypeRef vt = LLVMVectorType(e->i64, (unsigned)n);
    LLVMValueRef lv = LLVMBuildInsertElement(e->b, LLVMGetPoison(vt), lim, ci32(e, 0), "");
    lv = LLVMBuildShuffleVector(e->b, lv, LLVMGetPoison(vt), LLVMConstNull(LLVMVectorType(e->i32, (unsigned)n)), "");
    return LLVMBuildICmp(e->b, LLVMIntSLT, LLVMConstVector(el, (unsigned)n), lv, "");
}

/* One k-loop of prep over the block at blk: rows m0 + t, t < 32, a row at or past ntok read as
 * nothing (full: all 32 rows are tokens, so row t is x + t·K with no per-row selects, which
 * LLVM otherwise lowers to a branch and a spilled row pointer per row). A 32 × 32 block is done
 * as two halves of 16 k: the transpose's first round (swapping 16 × 16 quarters) is the loads
 * themselves (vector i of half h: tokens i and i + 16 at k + 16h), so each half needs only 16
 * vectors in registers for the other four rounds and stores its 16 lines. */
static void emit_amx_prep_loop(em *e, LLVMValueRef fn, int f32, int full, LLVMValueRef x, LLVMValueRef blk, LLVMValueRef m0,
                               LLVMValueRef ntok)
{
    const tj_layer *l = e->l;
    int64_t kp = (l->k + TJ_AMX_K - 1) / TJ_AMX_K * TJ_AMX_K;
    LLVMTypeRef xe = f32 ? e->f32 : e->i16, v16 = LLVMVectorType(e->i16, 16), ld_ov[2] = {f32 ? e->vf : v16, e->ptr}, ld_ty;
    LLVMValueRef mload = intrinsic(e, "llvm.masked.load", ld_ov, 2, &ld_ty);
    LLVMValueRef cat[32];
    for (int i = 0; i < 32; i++) cat[i] = ci32(e, i);
    LLVMValueRef x0 = gep(e, xe, x, LLVMBuildMul(e->b, m0, ci64(e, l->k), ""));
    loop kl;
    loop_begin(e, fn, &kl, ci64(e, 0), ci64(e, kp), ci64(e, 32));
    LLVMValueRef dst = gep(e, e->i16, blk, LLVMBuildMul(e->b, kl.iv, ci64(e, 32), ""));
    for (int h = 0; h < 2; h++) {
        LLVMValueRef kmask = lanes_below(e, 16, LLVMBuildSub(e->b, ci64(e, l->k - 16 * h), kl.iv, ""));
        LLVMValueRef xk = gep(e, xe, x0, LLVMBuildAdd(e->b, kl.iv, ci64(e, 16 * h), ""));
        LLVMValueRef v[16];
        for (int i = 0; i < 16; i++) {
            LLVMValueRef part[2];
            for (int q = 0; q < 2; q++) {
                int t = i + 16 * q;
                LLVMValueRef src = gep(e, xe, xk, ci64(e, t * l->k)), m = kmask;
                if (!full) {
                    LLVMValueRef ok = LLVMBuildICmp(e->b, LLVMIntSLT, ci64(e, t), ntok, "");
                    src = gep(e, xe, xk, LLVMBuildSelect(e->b, ok, ci64(e, t * l->k), ci64(e, 0), ""));
                    m = LLVMBuildSelect(e->b, ok, kmask, LLVMConstNull(LLVMTypeOf(kmask)), "");
                }
                LLVMValueRef a[4] = {src, ci32(e, f32 ? 4 : 2), m, LLVMConstNull(f32 ? e->vf : v16)};
                part[q] = call(e, ld_ty, mload, a, 4);
                if (f32) part[q] = bf16_round(e, part[q]);
            }
            v[i] = LLVMBuildShuffleVector(e->b, part[0], part[1], LLVMConstVector(cat, 32), "");
        }
        transpose_rounds(e, v, 16, 32, 8);
        for (int i = 0; i < 16; i++) store(e, v[i], gep(e, e->i16, dst, ci64(e, 32 * (16 * h + i))), 64);
    }
    loop_end(e, &kl);
}

/* prep(x, xt, m0, m1): tokens [m0, m1) (m0 a multiple of 32, m1 − m0 ≤ 32) of x [M × K] into
 * block m0/32 of xt: xt[b·Kp·32 + k·32 + t] = x[32b + t][k], Kp = K rounded up to 32, zeros
 * past K and past m1, 32 × 32 blocks at a time (emit_amx_prep_loop; a block of 32 tokens takes
 * the loop without per-row checks). x is bf16; with f32 (the prepf entry) fp32, rounded to bf16
 * on the way (the fp32 host interface then needs no separate rounding pass). */
static void emit_amx_prep(em *e, char *name, size_t name_len, int f32)
{
    int64_t kp = (e->l->k + TJ_AMX_K - 1) / TJ_AMX_K * TJ_AMX_K;
    snprintf(name, name_len, "%s_prep%s", e->prefix, f32 ? "f" : "");
    LLVMTypeRef ps[4] = {e->ptr, e->ptr, e->i64, e->i64};
    LLVMValueRef fn = new_fn(e, name, LLVMFunctionType(e->voidt, ps, 4, 0), 0);
    LLVMValueRef x = LLVMGetParam(fn, 0), xt = LLVMGetParam(fn, 1), m0 = LLVMGetParam(fn, 2), m1 = LLVMGetParam(fn, 3);
    LLVMPositionBuilderAtEnd(e->b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    LLVMValueRef blk = gep(e, e->i16, xt, LLVMBuildMul(e->b, LLVMBuildSDiv(e->b, m0, ci64(e, 32), ""), ci64(e, kp * 32), ""));
    LLVMValueRef ntok = LLVMBuildSub(e->b, m1, m0, "");
    LLVMBasicBlockRef bfull = LLVMAppendBasicBlockInContext(e->c, fn, "full");
    LLVMBasicBlockRef bpart = LLVMAppendBasicBlockInContext(e->c, fn, "partial");
    LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSGE, ntok, ci64(e, 32), ""), bfull, bpart);
    for (int full = 1; full >= 0; full--) {
        LLVMPositionBuilderAtEnd(e->b, full ? bfull : bpart);
        emit_amx_prep_loop(e, fn, f32, full, x, blk, m0, ntok);
        LLVMBuildRetVoid(e->b);
    }
}

/* Stages pairs [pa, pb) of a B panel (tw tokens: 16, or 32 in two token tiles pj apart): pair p
 * of token tile j is the 64-byte row dst + j·pj + 32·p, the VNNI interleave of the xt lines of
 * kept rows 2p and 2p + 1 (offs: the chunk's first kept row's offset; zeros past kn rows). */
static void emit_stage_pairs(em *e, LLVMValueRef fn, int tw, int64_t pj, LLVMValueRef xtb, LLVMValueRef offs, LLVMValueRef kn,
                             LLVMValueRef dst, LLVMValueRef pa, LLVMValueRef pb)
{
    LLVMTypeRef lt = LLVMVectorType(e->i16, (unsigned)tw);
    loop pl;
    loop_begin(e, fn, &pl, pa, pb, ci64(e, 1));
    LLVMValueRef line[2];
    for (int h = 0; h < 2; h++) {
        LLVMValueRef ri = LLVMBuildAdd(e->b, LLVMBuildShl(e->b, pl.iv, ci64(e, 1), ""), ci64(e, h), "");
        LLVMValueRef ok = LLVMBuildICmp(e->b, LLVMIntSLT, ri, kn, "");
        LLVMValueRef k = LLVMBuildSExt(e->b, load(e, e->i32, gep(e, e->i32, offs, ri), 4), e->i64, "");
        k = LLVMBuildSelect(e->b, ok, k, ci64(e, 0), "");
        LLVMValueRef v = load(e, lt, gep(e, e->i16, xtb, LLVMBuildMul(e->b, k, ci64(e, 32), "")), (unsigned)(2 * tw));
        line[h] = LLVMBuildSelect(e->b, ok, v, LLVMConstNull(lt), "");
    }
    for (int j = 0; j < tw / 16; j++) {
        LLVMValueRef mk[32];
        for (int q = 0; q < 32; q++) mk[q] = ci32(e, amx_token(tw, j, q / 2) + (q & 1) * tw);
        LLVMValueRef row = LLVMBuildShuffleVector(e->b, line[0], line[1], LLVMConstVector(mk, 32), "");
        store(e, row, gep(e, e->i16, dst, LLVMBuildAdd(e->b, ci64(e, j * pj), LLVMBuildMul(e->b, pl.iv, ci64(e, 32), ""), "")), 64);
    }
    loop_end(e, &pl);
}

/* C tile u of a block stored at cs (16 feature rows × 16 tokens, fp32), transposed: v[c] holds
 * the 16 features of the tile's token column c */
static void c_tile_rows(em *e, LLVMValueRef cs, int u, LLVMValueRef *v)
{
    for (int r = 0; r < 16; r++) v[r] = load(e, e->vf, gep(e, e->f32, cs, ci64(e, u * 256 + 16 * r)), 64);
    transpose_square(e, v, 16);
}

/* Block micro-kernel: fa × 16 features × tb × 16 tokens over `steps` k-steps of 32 kept rows.
 * Tile registers: C[i][j] = i·tb + j (feature tile i, token tile j), B[j] (tokens) after them,
 * A (weights) in the rest, A[i] in A0 + i % nA (loads rotate when fewer than fa).
 *   B[j]: xb + j·pj + 512·s, 16 pair rows of 64 bytes (the staged panel, contiguous)
 *   A[i]: w + i·gs + 512·s, 16 feature rows of 64 bytes (the packed A tiles, contiguous)
 * First chunk: C = 0, else C from `part` (features × 32 tokens, fp32). Last chunk: C through a
 * stack buffer, transposed back to token rows, into the epilogue (bias, activation, rounding,
 * masks or scatter) for the first `mrows` tokens: a whole block straight from the transposed
 * registers, an edge block (fewer tokens or features) through a token-row buffer; other chunks
 * store C back to `part`.
 * Each k-step, after its TDPBF16PS are issued, also stages up to SU pairs of the item's next B
 * panel (pairs SP0.., below SP1; emit_stage_pairs with SXT, SOFF, SKN, SDST): that work runs on
 * the vector ports while the tile unit computes. */
enum { AB_XB, AB_W, AB_GS, AB_STEPS, AB_PART, AB_FLAGS, AB_Y, AB_BK, AB_COLS, AB_VALID, AB_MROWS,
       AB_SXT, AB_SOFF, AB_SKN, AB_SDST, AB_SP0, AB_SP1, AB_SU, AB_NARGS };

static LLVMValueRef emit_amx_block(em *e, int fa, int tb, int tw, int64_t pj, LLVMTypeRef fty)
{
    char name[128];
    snprintf(name, sizeof name, "%s.amx_%d_%d", e->prefix, fa, tb);
    LLVMValueRef fn = new_fn(e, name, fty, 1);
    amx_fns a = amx_intrinsics(e);
    LLVMValueRef xb = LLVMGetParam(fn, AB_XB), w = LLVMGetParam(fn, AB_W), gs = LLVMGetParam(fn, AB_GS);
    LLVMValueRef steps = LLVMGetParam(fn, AB_STEPS), part = LLVMGetParam(fn, AB_PART), flags = LLVMGetParam(fn, AB_FLAGS);
    int nc = fa * tb, b0 = nc, a0 = nc + tb, na = 8 - a0;
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(e->c, fn, "entry");
    LLVMBasicBlockRef bz = LLVMAppendBasicBlockInContext(e->c, fn, "zero");
    LLVMBasicBlockRef bl = LLVMAppendBasicBlockInContext(e->c, fn, "partial.load");
    LLVMBasicBlockRef pre = LLVMAppendBasicBlockInContext(e->c, fn, "k.pre");
    LLVMBasicBlockRef keep = LLVMAppendBasicBlockInContext(e->c, fn, "partial.store");
    LLVMBasicBlockRef out = LLVMAppendBasicBlockInContext(e->c, fn, "out");
    LLVMPositionBuilderAtEnd(e->b, entry);
    LLVMValueRef cs = LLVMBuildArrayAlloca(e->b, e->f32, ci64(e, nc * 256), "c");
    LLVMSetAlignment(cs, 64);
    int64_t ctw = (int64_t)fa * 16; /* a token row of the transposed block, floats */
    LLVMValueRef ct = LLVMBuildArrayAlloca(e->b, e->f32, ci64(e, tb * 16 * ctw), "ct");
    LLVMSetAlignment(ct, 64);
    LLVMValueRef pstride = ci64(e, 32 * 4);
    LLVMValueRef first = LLVMBuildICmp(e->b, LLVMIntNE, LLVMBuildAnd(e->b, flags, ci64(e, MK_FIRST), ""), ci64(e, 0), "");
    LLVMBuildCondBr(e->b, first, bz, bl);
    LLVMPositionBuilderAtEnd(e->b, bz);
    for (int c = 0; c < nc; c++) {
        LLVMValueRef t = ci8(e, c);
        call(e, a.zero_ty, a.zero, &t, 1);
    }
    LLVMBuildBr(e->b, pre);
    LLVMPositionBuilderAtEnd(e->b, bl);
    for (int i = 0; i < fa; i++)
        for (int j = 0; j < tb; j++)
            tile_mem(e, &a, 0, i * tb + j, gep(e, e->f32, part, ci64(e, 16 * i * 32 + 16 * j)), pstride);
    LLVMBuildBr(e->b, pre);
    LLVMPositionBuilderAtEnd(e->b, pre);
    loop kl;
    loop_begin(e, fn, &kl, ci64(e, 0), steps, ci64(e, 1));
    LLVMValueRef sv = kl.iv;
    LLVMValueRef xk = gep(e, e->i16, xb, LLVMBuildMul(e->b, sv, ci64(e, 16 * 32), ""));
    LLVMValueRef wk = gep(e, e->i16, w, LLVMBuildMul(e->b, sv, ci64(e, 16 * 32), ""));
    for (int j = 0; j < tb; j++) tile_mem(e, &a, 0, b0 + j, gep(e, e->i16, xk, ci64(e, j * pj)), ci64(e, 64));
    for (int i = 0; i < fa; i++) {
        int at = a0 + i % na;
        tile_mem(e, &a, 0, at, gep(e, e->i16, wk, LLVMBuildMul(e->b, gs, ci64(e, i), "")), ci64(e, 64));
        for (int j = 0; j < tb; j++) {
            LLVMValueRef d[3] = {ci8(e, i * tb + j), ci8(e, at), ci8(e, b0 + j)};
            call(e, a.dp_ty, a.dp, d, 3);
        }
    }
    {   /* this step's share of the next panel */
        LLVMValueRef su = LLVMGetParam(fn, AB_SU), sp1 = LLVMGetParam(fn, AB_SP1);
        LLVMValueRef pa = LLVMBuildAdd(e->b, LLVMGetParam(fn, AB_SP0), LLVMBuildMul(e->b, sv, su, ""), "");
        emit_stage_pairs(e, fn, tw, pj, LLVMGetParam(fn, AB_SXT), LLVMGetParam(fn, AB_SOFF), LLVMGetParam(fn, AB_SKN),
                         LLVMGetParam(fn, AB_SDST), pa, smin(e, sp1, LLVMBuildAdd(e->b, pa, su, "")));
    }
    loop_end(e, &kl);

    LLVMValueRef last = LLVMBuildICmp(e->b, LLVMIntNE, LLVMBuildAnd(e->b, flags, ci64(e, MK_LAST), ""), ci64(e, 0), "");
    LLVMBuildCondBr(e->b, last, out, keep);
    LLVMPositionBuilderAtEnd(e->b, keep);
    for (int i = 0; i < fa; i++)
        for (int j = 0; j < tb; j++)
            tile_mem(e, &a, 1, i * tb + j, gep(e, e->f32, part, ci64(e, 16 * i * 32 + 16 * j)), pstride);
    LLVMBuildRetVoid(e->b);

    LLVMPositionBuilderAtEnd(e->b, out);
    for (int c = 0; c < nc; c++) tile_mem(e, &a, 1, c, gep(e, e->f32, cs, ci64(e, c * 256)), ci64(e, 64));
    /* A whole block (every token and feature valid): each transposed row of C goes through the
     * epilogue straight from its register, one token's 16 features at a time */
    LLVMBasicBlockRef whole = LLVMAppendBasicBlockInContext(e->c, fn, "out.whole");
    LLVMBasicBlockRef edge = LLVMAppendBasicBlockInContext(e->c, fn, "out.edge");
    LLVMValueRef valid_all = LLVMBuildICmp(e->b, LLVMIntEQ, LLVMGetParam(fn, AB_VALID), ci64(e, 16 * fa), "");
    LLVMValueRef rows_all = LLVMBuildICmp(e->b, LLVMIntEQ, LLVMGetParam(fn, AB_MROWS), ci64(e, 16 * tb), "");
    LLVMBuildCondBr(e->b, LLVMBuildAnd(e->b, valid_all, rows_all, ""), whole, edge);
    LLVMPositionBuilderAtEnd(e->b, whole);
    for (int i = 0; i < fa; i++) {
        /* feature tile i: its bias and cols; y at feature 16·i (or at 0 with cols) */
        LLVMValueRef yi = gep(e, e->yty, LLVMGetParam(fn, AB_Y), ci64(e, e->l->cols ? 0 : 16 * i));
        LLVMValueRef bki = gep(e, e->f32, LLVMGetParam(fn, AB_BK), ci64(e, 16 * i));
        LLVMValueRef colsi = e->l->cols ? gep(e, e->i32, LLVMGetParam(fn, AB_COLS), ci64(e, 16 * i)) : LLVMGetParam(fn, AB_COLS);
        for (int j = 0; j < tb; j++) {
            LLVMValueRef v[16];
            c_tile_rows(e, cs, i * tb + j, v);
            for (int c = 0; c < 16; c++) {
                LLVMValueRef yr = gep(e, e->yty, yi, ci64(e, amx_token(16 * tb, j, c) * e->l->n));
                LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(e->c, fn, "whole.next");
                emit_epilogue_at(e, 1, 1, fn, &v[c], yr, bki, colsi, ci64(e, 16), next);
                LLVMPositionBuilderAtEnd(e->b, next);
            }
        }
    }
    LLVMBuildRetVoid(e->b);
    LLVMPositionBuilderAtEnd(e->b, edge);
    /* C[i][j] is features × tokens: transposed into ct's token rows, feature tile i at 16·i */
    for (int i = 0; i < fa; i++)
        for (int j = 0; j < tb; j++) {
            LLVMValueRef v[16];
            c_tile_rows(e, cs, i * tb + j, v);
            for (int c = 0; c < 16; c++) store(e, v[c], gep(e, e->f32, ct, ci64(e, amx_token(16 * tb, j, c) * ctw + 16 * i)), 64);
        }
    /* the epilogue, one token row at a time: only the block's valid tokens are stored */
    loop rl;
    loop_begin(e, fn, &rl, ci64(e, 0), LLVMGetParam(fn, AB_MROWS), ci64(e, 1));
    LLVMValueRef vals[4];
    LLVMValueRef crow = gep(e, e->f32, ct, LLVMBuildMul(e->b, rl.iv, ci64(e, ctw), ""));
    for (int i = 0; i < fa; i++) vals[i] = load(e, e->vf, gep(e, e->f32, crow, ci64(e, 16 * i)), 64);
    LLVMValueRef yrow = gep(e, e->yty, LLVMGetParam(fn, AB_Y), LLVMBuildMul(e->b, rl.iv, ci64(e, e->l->n), ""));
    LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(e->c, fn, "row.next");
    emit_epilogue_at(e, 1, fa, fn, vals, yrow, LLVMGetParam(fn, AB_BK), LLVMGetParam(fn, AB_COLS), LLVMGetParam(fn, AB_VALID), next);
    LLVMPositionBuilderAtEnd(e->b, next);
    loop_end(e, &rl);
    LLVMBuildRetVoid(e->b);
    return fn;
}

/* xt's line of token t (block t/32, lane t % 32), and k-steps of kn kept rows */
static LLVMValueRef amx_xt_block(em *e, LLVMValueRef xt, LLVMValueRef t, int64_t kp)
{
    return gep(e, e->i16, xt, LLVMBuildAdd(e->b, LLVMBuildMul(e->b, LLVMBuildSDiv(e->b, t, ci64(e, 32), ""), ci64(e, kp * 32), ""),
                                           LLVMBuildSRem(e->b, t, ci64(e, 32), ""), ""));
}

/* The tile configuration (a 64-byte constant): palette 1, tiles 0..7 of 16 rows × 64 bytes */
static LLVMValueRef amx_tilecfg(em *e)
{
    LLVMValueRef cel[64];
    for (int i = 0; i < 64; i++) cel[i] = LLVMConstInt(e->i8, i == 0 ? 1 : i >= 16 && i < 32 && i % 2 == 0 ? 64 : i >= 48 && i < 56 ? TJ_AMX_ROWS : 0, 0);
    return const_global(e, "tilecfg", LLVMConstArray2(e->i8, cel, 64));
}

static LLVMValueRef amx_steps(em *e, LLVMValueRef kn)
{
    return LLVMBuildLShr(e->b, LLVMBuildAdd(e->b, kn, ci64(e, TJ_AMX_K - 1), ""), ci64(e, 5), "steps");
}

/* item(xt, y, wp, bk, slot, m0, m1) with AMX tiles (xt: prep's transpose of x):
 *   ldtilecfg (every tile 16 rows × 64 bytes: this thread's configuration, set per item)
 *   for each block of mr tokens:
 *     for each k-chunk of kc kept rows:
 *       stage the chunk's B panels: pair p of token tile j = the 64-byte lines of xt's kept rows
 *         2p and 2p + 1, interleaved (VNNI); zero pairs past the chunk's rows
 *       for each column block of nr features:  amx_<fa>_<tb>(...)   (weights stream from L2)
 *   tilerelease (the thread leaves no tile state behind: no 8 KB XSAVE area per switch, and the
 *   core leaves AMX's power state) */
static tj_status emit_item_amx(em *e, tj_cpu_emit_info *info, tj_error *err)
{
    const tj_layer *l = e->l;
    int mr = e->cfg->mr, nb = e->cfg->nr / 16, tbn = mr / TJ_AMX_ROWS;
    int64_t kc = tj_cpu_config_kc(e->cfg), kp = (l->k + TJ_AMX_K - 1) / TJ_AMX_K * TJ_AMX_K;
    int need_nb[5];
    block_widths(l, 16, nb, need_nb);
    int64_t pw = 16, chunked = 0, kmax = 0;
    for (int64_t t = 0; t < l->ntiles; t++) {
        int64_t nr = tj_tile_nrows(l, t);
        if (e->p->ld[t] > pw) pw = e->p->ld[t];
        if (nr > kc) chunked = 1;
        if ((nr < kc ? nr : kc) > kmax) kmax = nr < kc ? nr : kc;
    }
    int64_t pj = (kmax + TJ_AMX_K - 1) / TJ_AMX_K * TJ_AMX_K / 2 * 32; /* a token tile's panel, bf16 */
    if (pj == 0) pj = 16 * 32;
    LLVMTypeRef bp[AB_NARGS] = {e->ptr, e->ptr, e->i64, e->i64, e->ptr, e->i64, e->ptr, e->ptr, e->ptr, e->i64, e->i64,
                                e->ptr, e->ptr, e->i64, e->ptr, e->i64, e->i64, e->i64};
    LLVMTypeRef bty = LLVMFunctionType(e->voidt, bp, AB_NARGS, 0);
    /* every block covers mr tokens (a 32-token block's tokens are spread over both B tiles:
     * amx_token), so the variants differ in feature tiles only */
    LLVMValueRef blk[4];
    for (int i = 1; i <= nb; i++) blk[i - 1] = need_nb[i] ? emit_amx_block(e, i, tbn, mr == 32 ? 32 : 16, pj, bty) : LLVMConstNull(e->ptr);
    LLVMValueRef blk_tab = const_global(e, "amx", LLVMConstArray2(e->ptr, blk, (uint64_t)nb));
    LLVMValueRef g_tcfg = amx_tilecfg(e);
    LLVMTypeRef cfg_ty, rel_ty;
    LLVMValueRef ldcfg = intrinsic(e, "llvm.x86.ldtilecfg", NULL, 0, &cfg_ty);
    LLVMValueRef release = intrinsic(e, "llvm.x86.tilerelease", NULL, 0, &rel_ty);

    LLVMTypeRef ps[7] = {e->ptr, e->ptr, e->ptr, e->ptr, e->i64, e->i64, e->i64};
    LLVMValueRef fn = new_fn(e, info->item_name, LLVMFunctionType(e->voidt, ps, 7, 0), 0);
    LLVMValueRef xt = LLVMGetParam(fn, 0), y = LLVMGetParam(fn, 1), wp = LLVMGetParam(fn, 2), bk = LLVMGetParam(fn, 3);
    LLVMValueRef slot = LLVMGetParam(fn, 4), m0 = LLVMGetParam(fn, 5), m1 = LLVMGetParam(fn, 6);
    LLVMPositionBuilderAtEnd(e->b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    LLVMValueRef xb = LLVMBuildArrayAlloca(e->b, e->i16, ci64(e, 2 * tbn * pj), "panels");
    LLVMSetAlignment(xb, 64);
    LLVMValueRef part = LLVMBuildArrayAlloca(e->b, e->f32, ci64(e, chunked ? pw * 32 : 1), "partial");
    LLVMSetAlignment(part, 64);
    LLVMValueRef tv[T_NTAB];
    for (int i = 0; i < T_NTAB; i++) tv[i] = load(e, e->i64, gep(e, e->i64, e->g_tab[i], slot), 8);
    LLVMValueRef offs = gep(e, e->i32, e->g_offs, tv[T_ROWBEG]);
    LLVMValueRef nrows = tv[T_NROWS];
    LLVMValueRef nch = LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSGT, nrows, ci64(e, 0), ""),
                                       LLVMBuildSDiv(e->b, LLVMBuildAdd(e->b, nrows, ci64(e, kc - 1), ""), ci64(e, kc), ""), ci64(e, 1), "nch");
    LLVMValueRef nrv = ci64(e, 16 * nb);
    LLVMValueRef nblk = LLVMBuildSDiv(e->b, LLVMBuildAdd(e->b, tv[T_WIDTH], ci64(e, 16 * nb - 1), ""), nrv, "nblk");
    int tw = mr == 32 ? 32 : 16; /* tokens read per xt line */
    call(e, cfg_ty, ldcfg, &g_tcfg, 1);
    /* the first panel (tokens m0, chunk 0); each chunk's blocks then stage the next one */
    LLVMValueRef kn0 = smin(e, ci64(e, kc), nrows);
    emit_stage_pairs(e, fn, tw, pj, amx_xt_block(e, xt, m0, kp), offs, kn0, xb, ci64(e, 0),
                     LLVMBuildMul(e->b, amx_steps(e, kn0), ci64(e, 16), ""));
    loop tl;
    loop_begin(e, fn, &tl, m0, m1, ci64(e, mr));
    LLVMValueRef mrows = smin(e, ci64(e, mr), LLVMBuildSub(e->b, m1, tl.iv, ""));
    LLVMValueRef yt = gep(e, e->yty, y, LLVMBuildMul(e->b, tl.iv, ci64(e, l->n), ""));
    loop cl;
    loop_begin(e, fn, &cl, ci64(e, 0), nch, ci64(e, 1));
    LLVMValueRef r0 = LLVMBuildMul(e->b, cl.iv, ci64(e, kc), "r0");
    LLVMValueRef kn = smin(e, ci64(e, kc), LLVMBuildSub(e->b, nrows, r0, ""));
    LLVMValueRef steps = amx_steps(e, kn);
    /* panels alternate: this chunk's and the next's (the next chunk, or the next token block's
     * first) */
    LLVMValueRef idx = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, LLVMBuildSDiv(e->b, LLVMBuildSub(e->b, tl.iv, m0, ""), ci64(e, mr), ""), nch, ""), cl.iv, "");
    LLVMValueRef par = LLVMBuildAnd(e->b, idx, ci64(e, 1), "");
    LLVMValueRef cur = gep(e, e->i16, xb, LLVMBuildMul(e->b, par, ci64(e, tbn * pj), ""));
    LLVMValueRef nxt = gep(e, e->i16, xb, LLVMBuildMul(e->b, LLVMBuildXor(e->b, par, ci64(e, 1), ""), ci64(e, tbn * pj), ""));
    LLVMValueRef more_c = LLVMBuildICmp(e->b, LLVMIntSLT, LLVMBuildAdd(e->b, cl.iv, ci64(e, 1), ""), nch, "");
    LLVMValueRef tl2 = LLVMBuildSelect(e->b, more_c, tl.iv, LLVMBuildAdd(e->b, tl.iv, ci64(e, mr), ""), "");
    LLVMValueRef r02 = LLVMBuildSelect(e->b, more_c, LLVMBuildAdd(e->b, r0, ci64(e, kc), ""), ci64(e, 0), "");
    LLVMValueRef kn2 = smin(e, ci64(e, kc), LLVMBuildSub(e->b, nrows, r02, ""));
    LLVMValueRef has2 = LLVMBuildOr(e->b, more_c, LLVMBuildICmp(e->b, LLVMIntSLT, tl2, m1, ""), "");
    LLVMValueRef np2 = LLVMBuildSelect(e->b, has2, LLVMBuildMul(e->b, amx_steps(e, kn2), ci64(e, 16), ""), ci64(e, 0), "np2");
    LLVMValueRef xtb2 = amx_xt_block(e, xt, LLVMBuildSelect(e->b, has2, tl2, m0, ""), kp);
    LLVMValueRef offs2 = gep(e, e->i32, offs, r02);
    /* pairs per k-step: the next panel spread over this chunk's k-steps */
    LLVMValueRef tot = LLVMBuildMul(e->b, nblk, steps, "");
    LLVMValueRef su = LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSGT, tot, ci64(e, 0), ""),
                                      LLVMBuildSDiv(e->b, LLVMBuildAdd(e->b, np2, LLVMBuildSub(e->b, tot, ci64(e, 1), ""), ""),
                                                    LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSGT, tot, ci64(e, 0), ""), tot, ci64(e, 1), ""), ""),
                                      ci64(e, 0), "su");
    LLVMValueRef flags = LLVMBuildOr(
        e->b, LLVMBuildZExt(e->b, LLVMBuildICmp(e->b, LLVMIntEQ, cl.iv, ci64(e, 0), ""), e->i64, ""),
        LLVMBuildShl(e->b, LLVMBuildZExt(e->b, LLVMBuildICmp(e->b, LLVMIntEQ, LLVMBuildAdd(e->b, cl.iv, ci64(e, 1), ""), nch, ""), e->i64, ""),
                     ci64(e, 1), ""), "flags");
    loop cb;
    loop_begin(e, fn, &cb, ci64(e, 0), tv[T_WIDTH], nrv);
    LLVMValueRef valid = smin(e, nrv, LLVMBuildSub(e->b, tv[T_WIDTH], cb.iv, ""));
    LLVMValueRef fa = LLVMBuildLShr(e->b, LLVMBuildAdd(e->b, valid, ci64(e, 15), ""), ci64(e, 4), "");
    LLVMValueRef colstart = LLVMBuildAdd(e->b, tv[T_COLBASE], cb.iv, "");
    LLVMValueRef bi = LLVMBuildSub(e->b, fa, ci64(e, 1), "");
    LLVMValueRef args[AB_NARGS];
    args[AB_XB] = cur;
    /* feature group cb/16's A tiles (gs apart), from k-step r0/32 */
    LLVMValueRef gsv = LLVMBuildMul(e->b, tv[T_LDK], ci64(e, 16), "gs");
    args[AB_W] = gep(e, e->i16, wp, LLVMBuildAdd(e->b, LLVMBuildAdd(e->b, tv[T_WOFF], LLVMBuildMul(e->b, cb.iv, tv[T_LDK], ""), ""),
                                                LLVMBuildMul(e->b, r0, ci64(e, 16), ""), ""));
    args[AB_GS] = gsv;
    args[AB_STEPS] = steps;
    args[AB_PART] = chunked ? gep(e, e->f32, part, LLVMBuildMul(e->b, cb.iv, ci64(e, 32), "")) : part;
    args[AB_FLAGS] = flags;
    args[AB_Y] = l->cols ? yt : gep(e, e->yty, yt, colstart);
    args[AB_BK] = gep(e, e->f32, bk, colstart);
    args[AB_COLS] = e->g_cols ? gep(e, e->i32, e->g_cols, colstart) : LLVMConstNull(e->ptr);
    args[AB_VALID] = valid;
    args[AB_MROWS] = mrows;
    args[AB_SXT] = xtb2;
    args[AB_SOFF] = offs2;
    args[AB_SKN] = kn2;
    args[AB_SDST] = nxt;
    args[AB_SP0] = LLVMBuildMul(e->b, LLVMBuildSDiv(e->b, cb.iv, nrv, ""), LLVMBuildMul(e->b, steps, su, ""), "");
    args[AB_SP1] = np2;
    args[AB_SU] = su;
    LLVMBuildCall2(e->b, bty, load(e, e->ptr, gep(e, e->ptr, blk_tab, bi), 8), args, AB_NARGS, "");
    loop_end(e, &cb);
    /* what the blocks left of the next panel */
    emit_stage_pairs(e, fn, tw, pj, xtb2, offs2, kn2, nxt, smin(e, np2, LLVMBuildMul(e->b, tot, su, "")), np2);
    loop_end(e, &cl);
    loop_end(e, &tl);
    call(e, rel_ty, release, NULL, 0);
    LLVMBuildRetVoid(e->b);
    info->rows_emitted = 0;
    emit_amx_prep(e, info->prep_name, sizeof info->prep_name, 0);
    emit_amx_prep(e, info->prepf_name, sizeof info->prepf_name, 1);
    (void)err;
    return TJ_OK;
}

/* dot amx_x: x as the A operand, as oneDNN's AMX matmul has it. A block of r ≤ 16 tokens is
 * one A tile of r rows (the staged panel: each token's kept features, contiguous; emit_stage_x),
 * each 16 features one B tile (16 kept-row pairs × 16 features × 2, packed once) and one C tile
 * of r rows × 16 features, y's own layout: no transposes, and the tile unit works on r rows
 * only, so a decode call (r = 1) streams the weights at the rate tileloadd brings them in.
 * Tile registers, fixed for every block: A = 0, C[i] = 1 + i (i < 4), B = 5..7 (rotating when
 * there are four feature tiles); the configuration gives tiles 0..4 r rows. */
enum { XB_X, XB_XS, XB_W, XB_GS, XB_STEPS, XB_Y, XB_BK, XB_COLS, XB_VALID, XB_ROWS, XB_NARGS };

/* Block: r tokens × fa × 16 features over `steps` k-steps of 32 kept rows; C starts as the bias
 * (a stride-0 tile load), and leaves straight into y (fp32 y, no activation, whole block) or
 * through a stack buffer into the epilogue. */
static LLVMValueRef emit_amx_x_block(em *e, int fa, LLVMTypeRef fty)
{
    char name[128];
    snprintf(name, sizeof name, "%s.amxx_%d", e->prefix, fa);
    LLVMValueRef fn = new_fn(e, name, fty, 1);
    amx_fns a = amx_intrinsics(e);
    LLVMValueRef xb = LLVMGetParam(fn, XB_X), xs = LLVMGetParam(fn, XB_XS), w = LLVMGetParam(fn, XB_W), gs = LLVMGetParam(fn, XB_GS);
    LLVMValueRef y = LLVMGetParam(fn, XB_Y), bk = LLVMGetParam(fn, XB_BK), rows = LLVMGetParam(fn, XB_ROWS);
    LLVMPositionBuilderAtEnd(e->b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    int64_t ctw = (int64_t)fa * 16; /* a token row of C, floats */
    LLVMValueRef ct = LLVMBuildArrayAlloca(e->b, e->f32, ci64(e, TJ_AMX_ROWS * ctw), "ct");
    LLVMSetAlignment(ct, 64);
    for (int i = 0; i < fa; i++) tile_mem(e, &a, 0, 1 + i, gep(e, e->f32, bk, ci64(e, 16 * i)), ci64(e, 0));
    LLVMValueRef xstride = LLVMBuildMul(e->b, xs, ci64(e, 2), "");
    loop kl;
    loop_begin(e, fn, &kl, ci64(e, 0), LLVMGetParam(fn, XB_STEPS), ci64(e, 1));
    tile_mem(e, &a, 0, 0, gep(e, e->i16, xb, LLVMBuildMul(e->b, kl.iv, ci64(e, 32), "")), xstride);
    LLVMValueRef wk = gep(e, e->i16, w, LLVMBuildMul(e->b, kl.iv, ci64(e, 16 * 32), ""));
    for (int i = 0; i < fa; i++) {
        int bt = 5 + i % 3;
        tile_mem(e, &a, 0, bt, gep(e, e->i16, wk, LLVMBuildMul(e->b, gs, ci64(e, i), "")), ci64(e, 64));
        LLVMValueRef d[3] = {ci8(e, 1 + i), ci8(e, 0), ci8(e, bt)};
        call(e, a.dp_ty, a.dp, d, 3);
    }
    loop_end(e, &kl);
    if (!e->fused_act && !e->ybf && !e->l->cols) {
        LLVMBasicBlockRef direct = LLVMAppendBasicBlockInContext(e->c, fn, "store.direct");
        LLVMBasicBlockRef via = LLVMAppendBasicBlockInContext(e->c, fn, "store.rows");
        LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntEQ, LLVMGetParam(fn, XB_VALID), ci64(e, 16 * fa), ""), direct, via);
        LLVMPositionBuilderAtEnd(e->b, direct);
        for (int i = 0; i < fa; i++) tile_mem(e, &a, 1, 1 + i, gep(e, e->f32, y, ci64(e, 16 * i)), ci64(e, 4 * e->l->n));
        LLVMBuildRetVoid(e->b);
        LLVMPositionBuilderAtEnd(e->b, via);
    }
    for (int i = 0; i < fa; i++) tile_mem(e, &a, 1, 1 + i, gep(e, e->f32, ct, ci64(e, 16 * i)), ci64(e, 4 * ctw));
    loop rl; /* the epilogue (bias already in C), one token row at a time */
    loop_begin(e, fn, &rl, ci64(e, 0), rows, ci64(e, 1));
    LLVMValueRef vals[4];
    LLVMValueRef crow = gep(e, e->f32, ct, LLVMBuildMul(e->b, rl.iv, ci64(e, ctw), ""));
    for (int i = 0; i < fa; i++) vals[i] = load(e, e->vf, gep(e, e->f32, crow, ci64(e, 16 * i)), 64);
    LLVMValueRef yrow = gep(e, e->yty, y, LLVMBuildMul(e->b, rl.iv, ci64(e, e->l->n), ""));
    LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(e->c, fn, "row.next");
    emit_epilogue_at(e, 1, fa, fn, vals, yrow, NULL, LLVMGetParam(fn, XB_COLS), LLVMGetParam(fn, XB_VALID), next);
    LLVMPositionBuilderAtEnd(e->b, next);
    loop_end(e, &rl);
    LLVMBuildRetVoid(e->b);
    return fn;
}

/* item(x, y, wp, bk, slot, m0, m1) for dot amx_x (x bf16):
 *   for each block of r ≤ mr tokens:
 *     ldtilecfg (tiles 0..4 r rows, the B tiles 16; every tile 64 bytes wide)
 *     stage the block's kept features of x (token rows xs apart, xs = the tile's kept rows
 *       rounded up to 32; zeros past them: padded weights are zero, and 0 · NaN would not be)
 *     for each column block of nr features:  amxx_<fa>(...)
 *   tilerelease (the thread leaves no tile state behind between items) */
static tj_status emit_item_amx_x(em *e, tj_cpu_emit_info *info, tj_error *err)
{
    const tj_layer *l = e->l;
    int mr = e->cfg->mr, nb = e->cfg->nr / 16;
    if (!e->compress)
        return tj_fail(err, TJ_ERR_UNSUPPORTED, "layer '%s': dot amx_x needs AVX512-VBMI2 (vpcompressw) in the target features", l->name);
    int need_nb[5];
    block_widths(l, 16, nb, need_nb);
    int64_t xsmax = 32;
    for (int64_t t = 0; t < l->ntiles; t++)
        if ((tj_tile_nrows(l, t) + 31) / 32 * 32 > xsmax) xsmax = (tj_tile_nrows(l, t) + 31) / 32 * 32;
    LLVMTypeRef bp[XB_NARGS] = {e->ptr, e->i64, e->ptr, e->i64, e->i64, e->ptr, e->ptr, e->ptr, e->i64, e->i64};
    LLVMTypeRef bty = LLVMFunctionType(e->voidt, bp, XB_NARGS, 0);
    LLVMValueRef blk[4];
    for (int i = 1; i <= nb; i++) blk[i - 1] = need_nb[i] ? emit_amx_x_block(e, i, bty) : LLVMConstNull(e->ptr);
    LLVMValueRef blk_tab = const_global(e, "amxx", LLVMConstArray2(e->ptr, blk, (uint64_t)nb));
    LLVMTypeRef cfg_arr = LLVMArrayType2(e->i8, 64);
    LLVMValueRef g_tcfg = amx_tilecfg(e); /* copied to the stack: the rows are set per block */
    LLVMTypeRef cfg_ty, rel_ty, st_ty, v32 = LLVMVectorType(e->i16, 32), st_ov[2] = {v32, e->ptr};
    LLVMValueRef ldcfg = intrinsic(e, "llvm.x86.ldtilecfg", NULL, 0, &cfg_ty);
    LLVMValueRef release = intrinsic(e, "llvm.x86.tilerelease", NULL, 0, &rel_ty);
    LLVMValueRef mstore = intrinsic(e, "llvm.masked.store", st_ov, 2, &st_ty);

    LLVMTypeRef ps[7] = {e->ptr, e->ptr, e->ptr, e->ptr, e->i64, e->i64, e->i64};
    LLVMValueRef fn = new_fn(e, info->item_name, LLVMFunctionType(e->voidt, ps, 7, 0), 0);
    LLVMValueRef x = LLVMGetParam(fn, 0), y = LLVMGetParam(fn, 1), wp = LLVMGetParam(fn, 2), bk = LLVMGetParam(fn, 3);
    LLVMValueRef slot = LLVMGetParam(fn, 4), m0 = LLVMGetParam(fn, 5), m1 = LLVMGetParam(fn, 6);
    LLVMPositionBuilderAtEnd(e->b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    LLVMValueRef xp = LLVMBuildArrayAlloca(e->b, e->i16, ci64(e, mr * xsmax + 32), "xpanel"); /* + staging's spill */
    LLVMSetAlignment(xp, 64);
    LLVMValueRef tcfg = LLVMBuildAlloca(e->b, cfg_arr, "tilecfg");
    LLVMSetAlignment(tcfg, 64);
    store(e, load(e, cfg_arr, g_tcfg, 64), tcfg, 64);
    LLVMValueRef tv[T_NTAB];
    for (int i = 0; i < T_NTAB; i++) tv[i] = load(e, e->i64, gep(e, e->i64, e->g_tab[i], slot), 8);
    LLVMValueRef nrows = tv[T_NROWS], steps = amx_steps(e, nrows);
    LLVMValueRef xs = LLVMBuildMul(e->b, steps, ci64(e, 32), "xs");
    /* the lanes of a token row's last k-step past its kept rows, zeroed after staging */
    LLVMValueRef npad = LLVMBuildTrunc(e->b, LLVMBuildSub(e->b, xs, nrows, ""), e->i32, "");
    LLVMValueRef padm = LLVMBuildBitCast(
        e->b, LLVMBuildSub(e->b, LLVMBuildShl(e->b, ci32(e, 1), npad, ""), ci32(e, 1), ""), LLVMVectorType(e->i1, 32), "padmask");
    LLVMValueRef nrv = ci64(e, 16 * nb);
    loop tl;
    loop_begin(e, fn, &tl, m0, m1, ci64(e, mr));
    LLVMValueRef r = smin(e, ci64(e, mr), LLVMBuildSub(e->b, m1, tl.iv, ""));
    LLVMValueRef r8 = LLVMBuildTrunc(e->b, r, e->i8, "");
    for (int t = 0; t < 5; t++) store(e, r8, gep(e, e->i8, tcfg, ci64(e, 48 + t)), 1);
    call(e, cfg_ty, ldcfg, &tcfg, 1);
    emit_stage_x(e, fn, x, tl.iv, LLVMBuildAdd(e->b, tl.iv, r, ""), slot, xp, xs);
    {   /* npad < 32 lanes from kept row nrows on, inside the row (a later row's staging has
         * overwritten this row's spill) */
        loop zl;
        loop_begin(e, fn, &zl, ci64(e, 0), r, ci64(e, 1));
        LLVMValueRef at = gep(e, e->i16, xp, LLVMBuildAdd(e->b, LLVMBuildMul(e->b, zl.iv, xs, ""), nrows, ""));
        LLVMValueRef sa[4] = {LLVMConstNull(v32), at, ci32(e, 2), padm};
        call(e, st_ty, mstore, sa, 4);
        loop_end(e, &zl);
    }
    LLVMValueRef yt = gep(e, e->yty, y, LLVMBuildMul(e->b, tl.iv, ci64(e, l->n), ""));
    loop cb;
    loop_begin(e, fn, &cb, ci64(e, 0), tv[T_WIDTH], nrv);
    LLVMValueRef valid = smin(e, nrv, LLVMBuildSub(e->b, tv[T_WIDTH], cb.iv, ""));
    LLVMValueRef fa = LLVMBuildLShr(e->b, LLVMBuildAdd(e->b, valid, ci64(e, 15), ""), ci64(e, 4), "");
    LLVMValueRef colstart = LLVMBuildAdd(e->b, tv[T_COLBASE], cb.iv, "");
    LLVMValueRef args[XB_NARGS];
    args[XB_X] = xp;
    args[XB_XS] = xs;
    /* feature group cb/16's B tiles (gs apart) */
    args[XB_W] = gep(e, e->i16, wp, LLVMBuildAdd(e->b, tv[T_WOFF], LLVMBuildMul(e->b, cb.iv, tv[T_LDK], ""), ""));
    args[XB_GS] = LLVMBuildMul(e->b, tv[T_LDK], ci64(e, 16), "gs");
    args[XB_STEPS] = steps;
    args[XB_Y] = l->cols ? yt : gep(e, e->yty, yt, colstart);
    args[XB_BK] = gep(e, e->f32, bk, colstart);
    args[XB_COLS] = e->g_cols ? gep(e, e->i32, e->g_cols, colstart) : LLVMConstNull(e->ptr);
    args[XB_VALID] = valid;
    args[XB_ROWS] = r;
    LLVMBuildCall2(e->b, bty, load(e, e->ptr, gep(e, e->ptr, blk_tab, LLVMBuildSub(e->b, fa, ci64(e, 1), "")), 8), args, XB_NARGS, "");
    loop_end(e, &cb);
    loop_end(e, &tl);
    call(e, rel_ty, release, NULL, 0);
    LLVMBuildRetVoid(e->b);
    info->rows_emitted = 0;
    return TJ_OK;
}

/* post: features outside the tiles' fused epilogue — pruned ones (act(bias) or 0) and, with
 * ew, every feature that has ew entries (or all features when an activation must follow). */
static tj_status emit_post(em *e, tj_cpu_emit_info *info, tj_error *err)
{
    const tj_layer *l = e->l;
    char *kept = calloc((size_t)l->n + 1, 1);
    int32_t *prow = malloc(((size_t)l->n + 1) * sizeof *prow);
    int32_t *pflag = malloc(((size_t)l->n + 1) * sizeof *pflag);
    if (!kept || !prow || !pflag) {
        free(kept); free(prow); free(pflag);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory emitting IR");
    }
    for (int64_t j = 0; j < l->ncols; j++) kept[tj_layer_col(l, j)] = 1;
    int64_t np = 0;
    for (int64_t n = 0; n < l->n; n++) {
        int has_ew = l->ew_indptr && l->ew_indptr[n + 1] > l->ew_indptr[n];
        int want = !kept[n] || has_ew || (l->ew_nnz && l->act != TJ_ACT_NONE);
        if (want) {
            prow[np] = (int32_t)n;
            pflag[np] = !kept[n];
            np++;
        }
    }
    free(kept);
    info->post_name[0] = '\0';
    if (np == 0) { free(prow); free(pflag); return TJ_OK; }
    snprintf(info->post_name, sizeof info->post_name, "%s_post", e->prefix);
    LLVMValueRef g_prow = const_global(e, "post_rows", i32_array(e, prow, np, 0));
    LLVMValueRef g_pflag = const_global(e, "post_pruned", i32_array(e, pflag, np, 0));
    free(prow);
    free(pflag);
    LLVMValueRef g_indptr = NULL, g_idx = NULL;
    if (l->ew_nnz) {
        g_indptr = const_global(e, "ew_indptr", i64_array(e, l->ew_indptr, l->n + 1));
        g_idx = const_global(e, "ew_indices", i32_array(e, l->ew_indices, l->ew_nnz, 0));
    }
    LLVMTypeRef ps[6] = {e->ptr, e->ptr, e->ptr, e->ptr, e->i64, e->i64};
    LLVMValueRef fn = new_fn(e, info->post_name, LLVMFunctionType(e->voidt, ps, 6, 0), 0);
    LLVMValueRef x = LLVMGetParam(fn, 0), y = LLVMGetParam(fn, 1), ewv = LLVMGetParam(fn, 2), bias = LLVMGetParam(fn, 3);
    LLVMPositionBuilderAtEnd(e->b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    LLVMValueRef has_bias = LLVMBuildICmp(e->b, LLVMIntNE, bias, LLVMConstNull(e->ptr), "");
    loop ml;
    loop_begin(e, fn, &ml, LLVMGetParam(fn, 4), LLVMGetParam(fn, 5), ci64(e, 1));
    LLVMValueRef xr = gep(e, e->xty, x, LLVMBuildMul(e->b, ml.iv, ci64(e, l->k), ""));
    LLVMValueRef yr = gep(e, e->yty, y, LLVMBuildMul(e->b, ml.iv, ci64(e, l->n), ""));
    loop pl;
    loop_begin(e, fn, &pl, ci64(e, 0), ci64(e, np), ci64(e, 1));
    LLVMValueRef n = LLVMBuildSExt(e->b, load(e, e->i32, gep(e, e->i32, g_prow, pl.iv), 4), e->i64, "");
    LLVMValueRef pr = LLVMBuildICmp(e->b, LLVMIntNE, load(e, e->i32, gep(e, e->i32, g_pflag, pl.iv), 4), ci32(e, 0), "");
    /* bias[n] only when a bias exists: a select on a loaded value would read through NULL */
    LLVMBasicBlockRef cur = LLVMGetInsertBlock(e->b);
    LLVMBasicBlockRef bb_bias = LLVMAppendBasicBlockInContext(e->c, fn, "bias");
    LLVMBasicBlockRef bb_join = LLVMAppendBasicBlockInContext(e->c, fn, "join");
    LLVMValueRef yv = load(e, e->yty, gep(e, e->yty, yr, n), e->ybf ? 2 : 4);
    if (e->ybf) yv = bf16_widen(e, yv);
    LLVMValueRef pruned_zero_or_y = LLVMBuildSelect(e->b, pr, LLVMConstReal(e->f32, 0.0), yv, "");
    LLVMBuildCondBr(e->b, LLVMBuildAnd(e->b, pr, has_bias, ""), bb_bias, bb_join);
    LLVMPositionBuilderAtEnd(e->b, bb_bias);
    LLVMValueRef bv = load(e, e->f32, gep(e, e->f32, bias, n), 4);
    LLVMBuildBr(e->b, bb_join);
    LLVMPositionBuilderAtEnd(e->b, bb_join);
    LLVMValueRef base = LLVMBuildPhi(e->b, e->f32, "");
    {
        LLVMValueRef vals[2] = {pruned_zero_or_y, bv};
        LLVMBasicBlockRef bbs[2] = {cur, bb_bias};
        LLVMAddIncoming(base, vals, bbs, 2);
    }
    LLVMValueRef v = base;
    if (l->ew_nnz) {
        LLVMValueRef e0 = load(e, e->i64, gep(e, e->i64, g_indptr, n), 8);
        LLVMValueRef e1 = load(e, e->i64, gep(e, e->i64, g_indptr, LLVMBuildAdd(e->b, n, ci64(e, 1), "")), 8);
        LLVMBasicBlockRef pre = LLVMGetInsertBlock(e->b);
        LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(e->c, fn, "ew");
        LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(e->c, fn, "ew.done");
        LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, e0, e1, ""), body, done);
        LLVMPositionBuilderAtEnd(e->b, body);
        LLVMValueRef ei = LLVMBuildPhi(e->b, e->i64, ""), acc = LLVMBuildPhi(e->b, e->f32, "");
        LLVMValueRef kk = LLVMBuildSExt(e->b, load(e, e->i32, gep(e, e->i32, g_idx, ei), 4), e->i64, "");
        LLVMValueRef xv = load(e, e->xty, gep(e, e->xty, xr, kk), e->xbf ? 2 : 4);
        if (e->xbf) xv = bf16_widen(e, xv);
        LLVMValueRef a[3] = {xv, load(e, e->f32, gep(e, e->f32, ewv, ei), 4), acc};
        LLVMValueRef acc2 = call(e, e->fma_s_ty, e->fma_s, a, 3);
        LLVMValueRef en = LLVMBuildAdd(e->b, ei, ci64(e, 1), "");
        LLVMBuildCondBr(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, en, e1, ""), body, done);
        LLVMAddIncoming(ei, &e0, &pre, 1);
        LLVMAddIncoming(ei, &en, &body, 1);
        LLVMAddIncoming(acc, &base, &pre, 1);
        LLVMAddIncoming(acc, &acc2, &body, 1);
        LLVMPositionBuilderAtEnd(e->b, done);
        v = LLVMBuildPhi(e->b, e->f32, "");
        LLVMAddIncoming(v, &base, &pre, 1);
        LLVMAddIncoming(v, &acc2, &body, 1);
    }
    v = emit_act(e, e->f32, v);
    if (e->ybf) v = bf16_round(e, v);
    store(e, v, gep(e, e->yty, yr, n), e->ybf ? 2 : 4);
    loop_end(e, &pl);
    loop_end(e, &ml);
    LLVMBuildRetVoid(e->b);
    return TJ_OK;
}

/* ---------------------------------------------------------------- module */

tj_status tj_cpu_emit_module(LLVMContextRef llctx, const tj_layer *l, const tj_plan *plan, const tj_cpu_config *cfg,
                             const char *prefix, LLVMModuleRef *out, tj_cpu_emit_info *info, tj_error *err)
{
    return tj_cpu_emit_module_for(llctx, l, plan, cfg, prefix, NULL, NULL, out, info, err);
}

tj_status tj_cpu_emit_module_for(LLVMContextRef llctx, const tj_layer *l, const tj_plan *plan, const tj_cpu_config *cfg,
                                 const char *prefix, const char *cpu, const char *features, LLVMModuleRef *out,
                                 tj_cpu_emit_info *info, tj_error *err)
{
    *out = NULL;
    memset(info, 0, sizeof *info);
    TJ_TRY(tj_cpu_config_check(cfg, err));
    if (cfg->dtype == TJ_CPU_ACT_BF16 && (cfg->weights != TJ_CPU_WEIGHTS_BF16 || cfg->dot == TJ_CPU_DOT_AUTO))
        return tj_fail(err, TJ_ERR_INTERNAL, "layer '%s': dtype bf16 config not resolved (weights, dot)", l->name);
    if (plan->pad != cfg->vec || plan->rpad != (tj_cpu_dot_amx(cfg->dot) ? TJ_AMX_K : 1))
        return tj_fail(err, TJ_ERR_INTERNAL, "layer '%s': plan padded to %lld features and %lld rows, not config's", l->name,
                       (long long)plan->pad, (long long)plan->rpad);
    em e;
    memset(&e, 0, sizeof e);
    e.c = llctx;
    e.l = l;
    e.p = plan;
    e.cfg = cfg;
    e.prefix = prefix;
    e.V = cfg->vec;
    e.NV = cfg->nr / cfg->vec;
    e.fused_act = l->ew_nnz == 0;
    e.cpu = cpu ? LLVMCreateMessage(cpu) : LLVMGetHostCPUName();
    e.features = cpu ? LLVMCreateMessage(features ? features : "") : LLVMGetHostCPUFeatures();
    char modname[160];
    snprintf(modname, sizeof modname, "tilejit.%s", prefix);
    e.m = LLVMModuleCreateWithNameInContext(modname, llctx);
    e.b = LLVMCreateBuilderInContext(llctx);
    e.f32 = LLVMFloatTypeInContext(llctx);
    e.i1 = LLVMInt1TypeInContext(llctx);
    e.i8 = LLVMInt8TypeInContext(llctx);
    e.i32 = LLVMInt32TypeInContext(llctx);
    e.i64 = LLVMInt64TypeInContext(llctx);
    e.ptr = LLVMPointerTypeInContext(llctx, 0);
    e.voidt = LLVMVoidTypeInContext(llctx);
    e.vf = LLVMVectorType(e.f32, (unsigned)e.V);
    e.vi32 = LLVMVectorType(e.i32, (unsigned)e.V);
    e.i16 = LLVMInt16TypeInContext(llctx);
    e.vi16 = LLVMVectorType(e.i16, (unsigned)e.V);
    e.wty = cfg->weights == TJ_CPU_WEIGHTS_BF16 ? e.i16 : e.f32;
    e.xbf = cfg->dtype == TJ_CPU_ACT_BF16;
    e.ybf = cfg->out == TJ_CPU_ACT_BF16;
    e.dp = e.xbf && cfg->dot == TJ_CPU_DOT_DPBF16;
    e.amx = e.xbf && cfg->dot == TJ_CPU_DOT_AMX;
    e.amx_x = e.xbf && cfg->dot == TJ_CPU_DOT_AMX_X;
    e.compress = (e.dp || e.amx_x) && strstr(e.features, "+avx512vbmi2") && strstr(e.features, "+avx512bw");
    e.xty = e.xbf ? e.i16 : e.f32;
    e.yty = e.ybf ? e.i16 : e.f32;
    e.xpty = e.dp || e.amx || e.amx_x ? e.i16 : e.f32;
    e.packed_item = cfg->pack > 0 ? cfg->pack : e.xbf;
    e.pf = cfg->prefetch >= 0 ? cfg->prefetch
                              : tj_cpu_prefetch_for(e.cpu, cfg->vec, l, weight_bytes(cfg), 0);
    e.vptr = LLVMVectorType(e.ptr, (unsigned)e.V);
    LLVMTypeRef mkp[MK_NARGS] = {e.ptr, e.ptr, e.ptr, e.ptr, e.i64, e.i64, e.ptr, e.ptr, e.i64, e.ptr, e.i64, e.i64};
    e.mk_ty = LLVMFunctionType(e.voidt, mkp, MK_NARGS, 0);
    e.fma = intrinsic(&e, "llvm.fmuladd", &e.vf, 1, &e.fma_ty);
    e.fma_s = intrinsic(&e, "llvm.fmuladd", &e.f32, 1, &e.fma_s_ty);
    /* banner: version, pattern hash, config */
    char *cj = tj_cpu_config_to_json(cfg);
    char banner[512];
    snprintf(banner, sizeof banner, "tilejit %s cpu kernel; layer %s n=%lld k=%lld g=%lld hash=%016llx; config %s", TJ_VERSION,
             l->name, (long long)l->n, (long long)l->k, (long long)l->g, (unsigned long long)l->hash, cj ? cj : "?");
    free(cj);
    {
        LLVMValueRef md = LLVMMDStringInContext(llctx, banner, (unsigned)strlen(banner));
        LLVMAddNamedMetadataOperand(e.m, "tilejit.banner", LLVMMDNodeInContext(llctx, &md, 1));
    }
    snprintf(info->item_name, sizeof info->item_name, "%s_item", prefix);
    info->bk_elems = l->ncols + e.V;
    info->ewv_elems = l->ew_nnz;
    info->fused_act = e.fused_act;
    tj_status s = emit_tables(&e, info, err);
    if (s == TJ_OK && e.compress) s = emit_win_tables(&e, err);
    if (s == TJ_OK) s = e.amx ? emit_item_amx(&e, info, err) : e.amx_x ? emit_item_amx_x(&e, info, err) : emit_item(&e, info, err);
    if (s == TJ_OK) s = emit_post(&e, info, err);
    if (s == TJ_OK && e.oom) s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "layer '%s': out of memory emitting IR", l->name);
    if (s == TJ_OK) {
        char *msg = NULL;
        if (LLVMVerifyModule(e.m, LLVMReturnStatusAction, &msg)) {
            s = tj_fail(err, TJ_ERR_INTERNAL, "layer '%s': emitted IR does not verify: %s", l->name, msg ? msg : "");
        }
        LLVMDisposeMessage(msg);
    }
    LLVMDisposeBuilder(e.b);
    LLVMDisposeMessage(e.cpu);
    LLVMDisposeMessage(e.features);
    if (s != TJ_OK) {
        LLVMDisposeModule(e.m);
        return s;
    }
    *out = e.m;
    return TJ_OK;
}

tj_status tj_cpu_emit_ir_text(const tj_layer *l, const char *config_json, char **out, tj_error *err)
{
    *out = NULL;
    tj_cpu_config cfg;
    TJ_TRY(tj_cpu_config_from_json(config_json, &cfg, err));
    tj_cpu_config_resolve(&cfg, l);
    if (cfg.weights == TJ_CPU_WEIGHTS_AUTO) cfg.weights = TJ_CPU_WEIGHTS_F32; /* no weights to look at */
    TJ_TRY(tj_cpu_config_check(&cfg, err));
    tj_plan plan;
    TJ_TRY(tj_cpu_plan_build(l, &cfg, &plan, err));
    LLVMContextRef c = LLVMContextCreate();
    LLVMModuleRef m = NULL;
    tj_cpu_emit_info info;
    tj_status s = tj_cpu_emit_module(c, l, &plan, &cfg, "tj", &m, &info, err);
    if (s == TJ_OK) {
        char *txt = LLVMPrintModuleToString(m);
        *out = txt ? strdup(txt) : NULL;
        LLVMDisposeMessage(txt);
        if (!*out) s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory printing IR");
        LLVMDisposeModule(m);
    }
    LLVMContextDispose(c);
    tj_plan_free(&plan);
    return s;
}
